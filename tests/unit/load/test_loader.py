"""ZephonLoader iteration: what a rank gets, what counts as consumed, workers vs threads."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import opened, small_dataset
from tests.helpers.stateful import Segment, assert_matches_reference, run_segments
from zephon_store import (
    BatchOptions,
    SourceOptions,
    StopOptions,
    Topology,
    WorkerOptions,
    as_numpy,
)
from zephon_store.load.stream import RankStream
from zephon_store.order import Order, OrderOptions
from zephon_store.torch import ZephonLoader

B = 12
N = 303
OPTIONS = OrderOptions(seed=3, window_blocks=2, lanes=12)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return opened(small_dataset(str(tmp_path_factory.mktemp("loader")), files=3, records=101,
                                row_group_rows=10), samples=N)


@pytest.fixture(scope="module")
def order(ds) -> Order:
    return Order(ds.manifest.rg_rows, OPTIONS)


WITH_SEQ = BatchOptions(with_seq=True)


def loader(ds, *, world_size=1, rank=0, global_batch=B, batch=WITH_SEQ,
           **groups) -> ZephonLoader:
    return ZephonLoader(ds, topology=Topology(global_batch, world_size, rank), order=OPTIONS,
                        batch=batch, **groups)


def seqs(batches) -> list[list[int]]:
    return [b["_seq"].tolist() for b in batches]


def take(it, n: int) -> list[dict]:
    return [next(it) for _ in range(n)]


def test_batches_hold_the_ordered_rows_with_int64_seq(ds, order) -> None:
    batches = take(iter(loader(ds, world_size=3, rank=2)), 3)
    for k, batch in enumerate(batches):
        seq = batch["_seq"]
        assert isinstance(seq, torch.Tensor) and seq.dtype == torch.int64
        assert seq.shape == (B // 3,)
        # The corpus writes id == global sequence number, so the rows are the right rows.
        assert batch["id"].tolist() == seq.tolist()
        assert isinstance(batch["text"], list) and len(batch["text"]) == B // 3
        step = set(order.sample_at(range(k * B, (k + 1) * B)).tolist())
        assert set(seq.tolist()) <= step


def test_ranks_partition_each_step(ds, order) -> None:
    for world in (2, 3, 4):
        per_rank = [seqs(take(iter(loader(ds, world_size=world, rank=r)), 30))
                    for r in range(world)]
        for k in range(30):
            union = sorted(i for r in range(world) for i in per_rank[r][k])
            assert union == sorted(order.sample_at(range(k * B, (k + 1) * B)).tolist())


def test_columns_and_collate(ds) -> None:
    batch = next(iter(loader(ds, batch=BatchOptions(columns=["text"], with_seq=True,
                                                  collate=as_numpy))))
    assert set(batch) == {"text", "_seq"}
    assert batch["_seq"].dtype.name == "int64"  # numpy without the tensor conversion


def test_cursor_counts_consumed_batches_not_prefetched_ones(ds, order) -> None:
    lo = loader(ds, workers=WorkerOptions(prefetch=8))
    it = iter(lo)
    got = seqs(take(it, 3))
    assert lo.state_dict()["cursor"] == 3 * B  # 8 more are being prepared meanwhile
    it.close()
    assert lo.state_dict()["cursor"] == 3 * B
    # Breaking out of a for loop and iterating again loses nothing.
    for k, batch in enumerate(lo):
        got.append(batch["_seq"].tolist())
        if k == 1:
            break
    assert lo.state_dict()["cursor"] == 5 * B
    # A new loader from the state (another world size) continues at position 5B.
    resumed = [loader(ds, world_size=2, rank=r, workers=WorkerOptions(prefetch=8))
               for r in range(2)]
    for r in resumed:
        r.load_state_dict(lo.state_dict())
    nxt = [next(iter(r))["_seq"].tolist() for r in resumed]
    got.append(sorted(nxt[0] + nxt[1]))
    want = order.sample_at(range(6 * B)).reshape(6, B).tolist()
    assert got[:5] == want[:5]
    assert got[5] == sorted(want[5])


def test_cursor_counts_consumed_batches_with_process_workers(ds, order) -> None:
    lo = loader(ds, workers=WorkerOptions(num_workers=2, prefetch=4))
    it = iter(lo)
    got = seqs(take(it, 3))
    assert lo.state_dict()["cursor"] == 3 * B
    del it
    got += seqs(take(iter(lo), 2))
    assert lo.state_dict()["cursor"] == 5 * B
    assert got == order.sample_at(range(5 * B)).reshape(5, B).tolist()


@pytest.mark.parametrize("world,workers", [(2, 2), (3, 1), (4, 2)])
def test_process_workers_give_the_thread_path_sequence(ds, world, workers) -> None:
    for rank in range(world):
        threads = seqs(loader(ds, world_size=world, rank=rank, stop=StopOptions(max_steps=40)))
        procs = seqs(loader(ds, world_size=world, rank=rank,
                            workers=WorkerOptions(num_workers=workers),
                            stop=StopOptions(max_steps=40)))
        assert len(procs) == 40 and procs == threads  # 40 steps: crosses an epoch


def test_multiprocessing_context_spawn(ds) -> None:
    # spawn pickles the dataset (manifest, no threads) instead of inheriting it.
    threads = seqs(loader(ds, world_size=2, rank=1, stop=StopOptions(max_steps=6)))
    procs = seqs(loader(ds, world_size=2, rank=1, stop=StopOptions(max_steps=6),
                        workers=WorkerOptions(num_workers=2, multiprocessing_context="spawn")))
    assert procs == threads


def test_resume_near_the_end_reads_only_what_it_consumes(ds, order, monkeypatch) -> None:
    # Two epochs of steps; resume at ~99% of them. The first batch must not depend on
    # iterating (or reading) the earlier positions: count the reads.
    total_steps = 2 * N // B
    cursor = (total_steps - 1) * B
    assert cursor > 0.98 * 2 * N - B
    calls: list[int] = []
    real_ids = RankStream.ids

    def counting_ids(self, cursor, **kw):
        ids = real_ids(self, cursor, **kw)
        calls.append(len(ids))
        return ids

    monkeypatch.setattr(RankStream, "ids", counting_ids)
    src = loader(ds, world_size=1, rank=0)
    src.cursor = cursor
    state = src.state_dict()
    for world in (1, 3):
        calls.clear()
        parts = []
        for rank in range(world):
            lo = loader(ds, world_size=world, rank=rank, workers=WorkerOptions(prefetch=1),
                        stop=StopOptions(max_steps=2))
            lo.load_state_dict(state)
            parts.append(seqs(lo))
        assert len(calls) == 2 * world  # one step planned per consumed batch per rank, no more
        assert all(n == B // world for n in calls)
        for k in range(2):
            union = sorted(i for p in parts for i in p[k])
            want = order.sample_at(range(cursor + k * B, cursor + (k + 1) * B)).tolist()
            assert union == sorted(want)


def test_epochs_and_max_steps_bound_the_stream(ds) -> None:
    lo = loader(ds, stop=StopOptions(epochs=2))
    assert len(lo) == 2 * N // B
    batches = seqs(lo)
    assert len(batches) == 2 * N // B
    assert lo.state_dict()["cursor"] == len(batches) * B
    assert seqs(lo) == []  # the cursor is past the bound: nothing more
    lo = loader(ds, stop=StopOptions(max_steps=3))
    assert len(lo) == 3 and len(seqs(lo)) == 3


def test_endless_loader_has_no_len(ds) -> None:
    with pytest.raises(TypeError, match="max_steps or epochs"):
        len(loader(ds))


@pytest.mark.parametrize("kw,match", [
    ({"world_size": 5, "rank": 0}, "world_size must divide global_batch"),
    ({"rank": 2, "world_size": 2}, "rank must be in"),
    ({"workers": {"num_workers": -1}}, "num_workers"),
    ({"workers": {"prefetch": 0}}, "prefetch"),
    ({"stop": {"max_steps": 3, "epochs": 1}}, "max_steps or epochs"),
    ({"stop": {"max_steps": -1}}, "max_steps"),
    ({"stop": {"max_steps": 1.5}}, "max_steps"),
    ({"stop": {"max_steps": True}}, "max_steps"),
    ({"stop": {"epochs": -1}}, "epochs"),
    ({"stop": {"epochs": float("nan")}}, "epochs"),
    ({"stop": {"epochs": float("inf")}}, "epochs"),
    ({"stop": {"epochs": "2"}}, "epochs"),
])
def test_bad_arguments(ds, kw, match) -> None:
    # A group's fields are checked when the group is made, inside the raises block.
    groups = {"workers": WorkerOptions, "stop": StopOptions}
    with pytest.raises(ValueError, match=match):
        loader(ds, **{k: groups[k](**v) if k in groups else v for k, v in kw.items()})


def test_world_size_and_rank_come_from_the_torchrun_environment(ds, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    lo = ZephonLoader(ds, global_batch=B, order=OPTIONS)
    assert (lo.topology.world_size, lo.topology.rank) == (3, 1)


def test_thread_and_worker_paths_agree_over_a_restart_schedule(ds) -> None:
    ref = Order(ds.manifest.rg_rows, OPTIONS).sample_at(range(40 * B)).tolist()

    def make(*, world_size, rank, num_workers, global_batch):
        return loader(ds, world_size=world_size, rank=rank,
                      workers=WorkerOptions(num_workers=num_workers), global_batch=global_batch)

    run = run_segments(make, [Segment(2, 7, num_workers=2), Segment(4, 11),
                              Segment(3, 9, num_workers=1)], global_batch=B)
    assert_matches_reference(run.steps, ref)


def test_epochs_drop_the_last_partial_batch_by_default_and_warn_once(ds, caplog) -> None:
    lo = loader(ds, stop=StopOptions(epochs=1))
    with caplog.at_level("WARNING", logger="zephon_store"):
        batches = seqs(lo)
        seqs(lo)
    assert len(batches) == N // B
    dropped = [r for r in caplog.records if "drop" in r.getMessage()]
    assert len(dropped) == 1 and str(N % B) in dropped[0].getMessage()


@pytest.mark.parametrize("world,workers", [(1, 0), (2, 0), (4, 0), (3, 0), (2, 2)])
def test_drop_last_false_yields_every_sample_exactly_once(ds, world, workers) -> None:
    """The final step holds the N % B remaining positions, split exactly among the ranks
    (some ranks may get fewer or none), and the cursor ends at exactly N."""
    per_rank = []
    for rank in range(world):
        lo = loader(ds, stop=StopOptions(epochs=1, drop_last=False), world_size=world,
                    rank=rank, workers=WorkerOptions(num_workers=workers))
        assert len(lo) == -(-N // B)
        per_rank.append(seqs(lo))
        assert lo.state_dict()["cursor"] == N
        assert seqs(lo) == []     # nothing after the end
    steps = len(per_rank[0])
    assert all(len(p) == steps for p in per_rank)    # every rank takes the same steps
    ids = [i for p in per_rank for batch in p for i in batch]
    assert sorted(ids) == list(range(N))
    last = [len(p[-1]) for p in per_rank]
    assert sum(last) == N % B and max(last) - min(last) <= 1


def test_drop_last_false_resumes_exactly_into_the_partial_step(ds, order) -> None:
    lo = loader(ds, stop=StopOptions(epochs=1.5, drop_last=False))
    it = iter(lo)
    first = [next(it)["_seq"].tolist() for _ in range(10)]
    state = lo.state_dict()
    rest = seqs(_resumed(ds, state))
    got = [i for b in first + rest for i in b]
    assert got == order.sample_at(range(int(1.5 * N))).tolist()


def _resumed(ds, state):
    lo = loader(ds, stop=StopOptions(epochs=1.5, drop_last=False))
    lo.load_state_dict(state)
    return lo


def test_expect_dataset_id_on_the_loader(ds) -> None:
    from zephon_store import ManifestError

    url = ds.url
    one = Topology(B, world_size=1, rank=0)
    pinned = SourceOptions(expect_dataset_id=ds.dataset_id)
    assert ZephonLoader(url, topology=one, source=pinned).dataset_id == ds.dataset_id
    other = SourceOptions(expect_dataset_id="xxh3:" + "0" * 32)
    with pytest.raises(ManifestError, match="xxh3:0000"):
        ZephonLoader(url, topology=one, source=other)
    with pytest.raises(ManifestError, match="xxh3:0000"):
        ZephonLoader(ds, topology=one, source=other)
