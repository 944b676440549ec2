"""The per-step account through ZephonLoader on a local dataset: a slow transform is the
cause in threads and in worker processes (whose batches cross a hand-over), the step log is
written and read back by ``zephon stats`` (text, JSON, PNG), and a torch profile shows the
loader's ranges."""

from __future__ import annotations

import json
import time

import pytest

from zephon_store import BatchOptions, StopOptions, WorkerOptions
from zephon_store.cli.main import main
from zephon_store.observe.causes import CAUSES
from zephon_store.observe.options import ObserveOptions
from zephon_store.order import OrderOptions, Topology

torch = pytest.importorskip("torch")
from zephon_store.torch import ZephonLoader  # noqa: E402


def _slow(batch):
    time.sleep(0.03)
    return batch


def _loader(ds, workers, **kw):
    return ZephonLoader(ds, topology=Topology(16), order=OrderOptions(seed=3),
                        batch=BatchOptions(transform=_slow), stop=StopOptions(max_steps=12),
                        workers=WorkerOptions(num_workers=workers), **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_transform_is_the_cause_and_the_step_log_reads_back(ds, tmp_path, workers,
                                                                    capsys):
    log = tmp_path / "steps-{rank}.jsonl"
    loader = _loader(ds, workers)
    loader.observe = ObserveOptions(step_log=str(log))   # ZephonLoader takes no observe=
    for _ in loader:
        pass
    st = loader.stats()
    assert st["steps"] == 12 and st["step"] == 11
    total = st["wait_total_s"]
    assert max(CAUSES, key=lambda c: st[f"wait_total_s/{c}"]) == "transform"
    assert sum(st[f"wait_total_s/{c}"] for c in CAUSES) == pytest.approx(total, rel=1e-6)
    if workers:
        assert st["wait_total_s/handover"] > 0
    path = str(tmp_path / "steps-0.jsonl")
    png = str(tmp_path / "waits.png")
    assert main(["stats", path, "--json", "--png", png]) == 0
    got = json.loads(capsys.readouterr().out)["ranks"]["0"]
    assert got["steps"] == 12
    assert got["wait_s"] == pytest.approx(total, abs=0.02)
    assert max(got["causes"], key=got["causes"].get) == "transform"
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert main(["stats", path]) == 0
    text = capsys.readouterr().out
    assert text.startswith("rank 0: 12 steps, waited ") and "transform" in text


def test_observe_takes_observe_options_only(ds):
    with pytest.raises(TypeError, match="observe must be an ObserveOptions"):
        _loader(ds, 0).observe = {"step_log": "x"}


def test_stats_refuses_a_file_that_is_not_a_step_log(tmp_path, capsys):
    bad = tmp_path / "run.jsonl"
    bad.write_text('{"kind": "zephon-runlog"}\n')
    assert main(["stats", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "line 1" in err and "step log" in err and "\n" not in err.rstrip("\n")


def test_a_profile_shows_the_wait_for_each_step(ds):
    loader = ZephonLoader(ds, topology=Topology(16), order=OrderOptions(seed=3),
                          stop=StopOptions(max_steps=3))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in loader:
            pass
    names = {e.key for e in prof.key_averages()}
    assert {"zephon: waiting for step 0", "zephon: waiting for step 2"} <= names


def test_a_users_own_dataloader_over_the_iterable_dataset_still_gets_pairs(ds):
    """Only the loader's own workers send a note with each batch; ZephonIterableDataset in
    a DataLoader a user builds yields ``(i, batch)`` as documented."""
    from torch.utils.data import DataLoader

    from zephon_store import open_dataset
    from zephon_store.torch import ZephonIterableDataset

    it = ZephonIterableDataset(open_dataset(ds), order=OrderOptions(seed=3), topology=Topology(16),
                               num_batches=4)
    got = list(DataLoader(it, batch_size=None, num_workers=2, collate_fn=lambda x: x))
    assert sorted(i for i, _ in got) == [0, 1, 2, 3]
    assert all(len(item) == 2 for item in got)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_live_loader_accounts_its_steps_as_the_loader_does(ds, workers):
    """LiveZephonLoader's stats() (issue 43 item 1, every front end): each served step's
    wait, a slow transform its cause; with process workers their notes cross the hand-over."""
    from zephon_store.torch import LiveZephonLoader, ReplicaOptions

    quorum = [(0, 2)]
    loader = LiveZephonLoader(ds, global_batch=16, order=OrderOptions(seed=3),
                              batch=BatchOptions(transform=_slow),
                              workers=WorkerOptions(num_workers=workers),
                              replica=ReplicaOptions(participants=lambda: quorum[0]))
    batches = iter(loader)
    for k in range(8):
        quorum[0] = (k % 2, 2) if k < 4 else (0, 1)   # shapes change: new readers
        next(batches)
        loader.commit(True)
    batches.close()
    st = loader.stats()
    assert st["steps"] == 8 and st["step"] == 7
    assert max(CAUSES, key=lambda c: st[f"wait_total_s/{c}"]) == "transform"
    assert st["wait_total_s/transform"] >= 8 * 0.03 * 0.9
    assert sum(st[f"wait_total_s/{c}"] for c in CAUSES) == pytest.approx(st["wait_total_s"],
                                                                         rel=1e-6)
    if workers:
        assert st["wait_total_s/handover"] > 0
