"""Audit answers computed from the loader's own inputs (issue 29, items 1 and 4).

Over a mixture file with a ``seed`` and stages that start in ``steps``: ``zephon where``
without a log, ``zephon plan --mixture``, ``zephon trace`` and a real ``ZephonLoader`` agree
on the position of every sample of a random draw of 1,000; a ``--seed`` or
``--global-batch`` that disagrees with the file or the log is refused in one line, as the
loader refuses it; ``where`` and ``audit`` read such a mixture's log without any flag.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import small_dataset
from zephon_store import BatchOptions, StopOptions, Topology
from zephon_store.cli.main import main

STEPS = 160          # 1,280 positions: web (100 samples) and math (60) wrap several epochs
B = 8
NAMES = ["web", "math"]


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("order_inputs")
    web = small_dataset(str(d / "web"), files=1, records=100, row_group_rows=10)
    math = small_dataset(str(d / "math"), files=1, records=60, row_group_rows=10)
    path = d / "mix.toml"
    # docs/mixtures.md's own shape: a file seed, stages starting in steps.
    path.write_text(f'''seed = 5
[[stages]]
name = "warmup"
start = {{ steps = 0 }}
[[stages]]
name = "main"
start = {{ steps = 40 }}
[[sources]]
name = "web"
url = "{web}"
weights = {{ warmup = 0.8, main = 0.3 }}
[[sources]]
name = "math"
url = "{math}"
weights = {{ warmup = 0.2, main = 0.7 }}
''')
    return str(path)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def loader_stream(mix: str, world_size: int, *, run_log: str | None = None) -> dict:
    """``{(step, rank): [(source name, id), ...]}`` as a real ZephonLoader reads them."""
    from zephon_store.torch import ZephonLoader

    got = {}
    for rank in range(world_size):
        loader = ZephonLoader(mix, topology=Topology(B, world_size=world_size, rank=rank),
                              batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=STEPS),
                              run_log=run_log if rank == 0 else None)
        for s, batch in enumerate(loader):
            got[s, rank] = [(NAMES[k], i) for k, i in zip(batch["_source"].tolist(),
                                                         batch["_seq"].tolist())]
    return got


def positions(mix: str, world_size: int) -> dict:
    """``{(step, rank): positions}`` by the loader's rank rule over the mixture's order."""
    from zephon_store.load.source import open_mixture
    from zephon_store.mix.mixed import MixedOrder
    from zephon_store.order import OrderOptions
    from zephon_store.order.assign import positions_for_rank

    lanes = MixedOrder(open_mixture(mix, global_batch=B), OrderOptions(seed=5)).effective_lanes
    return {(s, r): positions_for_rank(s * B, B, world_size, r, lanes=lanes).tolist()
            for s in range(STEPS) for r in range(world_size)}


@pytest.mark.parametrize("world_size", [1, 2])
def test_where_plan_trace_and_the_loader_agree_on_1000_samples(mix, capsys,
                                                                world_size) -> None:
    stream = loader_stream(mix, world_size)
    pos = positions(mix, world_size)
    # Every sample the loader read, with its mixture position.
    read = [(pos[key][j], src, i) for key, pairs in stream.items()
            for j, (src, i) in enumerate(pairs)]
    rng = np.random.default_rng(world_size)
    draw = [read[k] for k in rng.choice(len(read), 1000, replace=False)]

    # zephon where, no log, no --seed: the file's seed and the batch's stage starts.
    code, out, err = run_cli(capsys, "where", mix, *[f"{s}:{i}" for _, s, i in draw],
                             "--global-batch", B, "--epochs", 20, "--json")
    assert code == 0, err
    at: dict = {}
    for rec in json.loads(out)["where"]:
        at.setdefault((rec["source"], rec["id"]), set()).add(rec["global_position"])
    assert all(p in at[s, i] for p, s, i in draw)

    # zephon plan --mixture: every step and rank the loader read, in the loader's order.
    code, out, err = run_cli(capsys, "plan", "--mixture", mix, "--world-size", world_size,
                             "--global-batch", B, "--steps", f"0:{STEPS}",
                             "--simulate-steps", 1, "--json")
    assert code == 0, err
    plan = {(st["step"], r): [tuple(x) for x in ranks]
            for st in json.loads(out)["steps"] for r, ranks in enumerate(st["ranks"])}
    assert plan == stream

    # zephon trace without a log: the same, step by step.
    code, out, err = run_cli(capsys, "trace", mix, "--steps", f"0:{STEPS}", "--global-batch",
                             B, "--world-size", world_size, "--json")
    assert code == 0, err
    traced = {(t["step"], r["rank"]): list(zip(r["sources"], r["ids"]))
              for t in json.loads(out)["steps"] for r in t["ranks"]}
    assert traced == stream


def test_a_seed_that_disagrees_with_the_file_is_refused_in_one_line(mix, capsys) -> None:
    from zephon_store.errors import MixtureError
    from zephon_store.torch import ZephonLoader

    with pytest.raises(MixtureError, match="sets seed 5 but seed 3 was given"):
        ZephonLoader(mix, topology=Topology(B, world_size=1, rank=0), seed=3)
    for argv in (["where", mix, "web:1", "--global-batch", B],
                 ["trace", mix, "--step", 0, "--global-batch", B],
                 ["plan", "--mixture", mix, "--world-size", 1, "--global-batch", B]):
        code, out, err = run_cli(capsys, *argv, "--seed", 3)
        assert code == 2, (argv, err)
        assert "sets seed 5 but seed 3 was given" in err and err.count("\n") == 1
        # The file's own seed given again is fine.
        code, _, err = run_cli(capsys, *argv, "--seed", 5)
        assert code == 0, (argv, err)


def test_a_mixture_in_steps_is_audited_from_its_log_alone(mix, tmp_path, capsys) -> None:
    log = str(tmp_path / "run.jsonl")
    stream = loader_stream(mix, 1, run_log=log)
    code, out, err = run_cli(capsys, "audit", mix, "--log", log, "--end-step", STEPS,
                             "--json")
    assert code == 0 and json.loads(out)["ok"], err
    code, out, err = run_cli(capsys, "where", mix, "math:7", "--log", log, "--end-step",
                             STEPS, "--json")
    assert code == 0, err
    for rec in json.loads(out)["where"]:
        for hit in rec["consumed"]:
            assert ("math", 7) in stream[hit["step"], hit["rank"]]
    code, out, err = run_cli(capsys, "trace", mix, "--log", log, "--step", 50, "--json")
    assert code == 0, err
    (t,) = json.loads(out)["steps"]
    assert list(zip(t["ranks"][0]["sources"], t["ranks"][0]["ids"])) == stream[50, 0]
    # The log's own batch given again is accepted; another is refused naming the line.
    code, _, err = run_cli(capsys, "audit", mix, "--log", log, "--global-batch", B,
                           "--end-step", STEPS)
    assert code == 0, err
    for cmd in (["audit", mix], ["where", mix, "math:7"], ["trace", mix, "--step", 1]):
        code, _, err = run_cli(capsys, *cmd, "--log", log, "--global-batch", 16)
        assert code == 2, (cmd, err)
        assert f"--global-batch 16 disagrees with {log} line 1" in err
        assert err.count("\n") == 1


def test_without_a_log_a_mixture_in_steps_asks_for_the_global_batch(mix, capsys) -> None:
    for cmd in (["where", mix, "web:3"], ["trace", mix, "--step", 0]):
        code, _, err = run_cli(capsys, *cmd)
        assert code == 2, (cmd, err)
        assert "--global-batch" in err and err.count("\n") == 1


def test_a_mixture_log_with_a_cursor_gap_is_audited_in_bounded_time(mix, tmp_path) -> None:
    """Item 13 for a mixture: whole source epochs inside the gap are counted, not listed
    (each listed epoch costs 2 bytes per sample); the audit answers in about a second."""
    import subprocess
    import sys

    from zephon_store.load.runlog import append_segment, read_run_log

    # Stages in samples, so that only the gap is under test.
    text = open(mix).read().replace("{ steps = 0 }", "{ samples = 0 }")
    mix = str(tmp_path / "mix.toml")
    with open(mix, "w") as f:
        f.write(text.replace("{ steps = 40 }", "{ samples = 320 }"))
    log = str(tmp_path / "run.jsonl")
    loader_stream(mix, 1, run_log=log)
    (seg,) = read_run_log(log)
    append_segment(log, seg.replace(first_step=STEPS, cursor=8 * 10**14))
    try:
        r = subprocess.run([sys.executable, "-m", "zephon_store.cli", "audit", mix, "--log",
                            log, "--end-step", str(STEPS + 10), "--json"],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("zephon audit of a mixture log with a cursor gap still running after 60 s")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert [e["kind"] for e in report["events"] if e["failure"]] == ["gap"]
    assert report["unlisted_skipped_epochs"] > 10**12 and len(report["epochs"]) < 400
