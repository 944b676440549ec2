"""``zephon plan --bandwidth``: the loader's stall forecast before launch, from the same code
(its coming steps' bytes by ``step_need``, the wait by ``Stall.first``)."""

from __future__ import annotations

import json

from zephon_store import open_dataset
from zephon_store.cli.main import main
from zephon_store.io.cache import ChunkCache
from zephon_store.load.share_reader import ShareReader
from zephon_store.observe.stall import forecast_of
from zephon_store.order import OrderOptions, Topology


def _plan(ds, capsys, *extra):
    assert main(["plan", ds, "--world-size", "2", "--global-batch", "32", "--json",
                 "--simulate-steps", "30", *extra]) == 0
    return json.loads(capsys.readouterr().out)["bandwidth"]


def test_enough_bandwidth_keeps_up_and_too_little_names_the_step(ds, capsys):
    fast = _plan(ds, capsys, "--bandwidth", "100", "--step-time", "0.1")
    assert fast["stall"] is None and "keeps up" in fast["message"]
    slow = _plan(ds, capsys, "--bandwidth", "0.01", "--step-time", "0.1",
                 "--prefetch-bytes", "16KiB")
    assert slow["stall"]["step"] >= 1 and slow["stall"]["wait_s"] > 0
    assert "raise prefetch_bytes (now 0.0156 MiB)" in slow["message"]


def test_the_plan_counts_the_bytes_the_loaders_forecast_counts(ds, tmp_path):
    """Before launch (an empty cache) the loader's forecast and the plan see the same bytes
    per step."""
    from zephon_store.cli.plan_cmd import rank0_need

    options, topo = OrderOptions(seed=0), Topology(32, 2, 0)
    remote_like = open_dataset(ds, cache=ChunkCache(str(tmp_path / "c")))
    need, _, _ = forecast_of(ShareReader(remote_like, options, topo, start_cursor=64), 64 << 20,
                             0)(0, 30)
    with open_dataset(ds) as plain:
        planned = rank0_need(plain, options, topo, cursor=64, steps=30)
    assert need == planned and sum(need) > 0


def test_bandwidth_needs_a_step_time(ds, capsys):
    assert main(["plan", ds, "--world-size", "1", "--global-batch", "8",
                 "--bandwidth", "10"]) == 2
    err = capsys.readouterr().err
    assert "--step-time" in err and err.count("\n") == 1
