"""The loader's pipeline: planned decode-ahead gives the stream's batches, decoding once."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import converted
from zephon_store import convert, open_dataset
from zephon_store._util.to_numpy import table_to_numpy
from zephon_store.load.pipeline import BatchPipeline, plan_steps, step_rows
from zephon_store.load.stream import RankStream
from zephon_store.order import OrderOptions, Topology
from zephon_store.write.shardwriter import WriteOptions


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return open_dataset(converted(tmp_path_factory.mktemp("pipeline"), files=3, records=300,
                                  seed=11, target_shard_bytes=20 << 10, row_group_rows=23))


def decoded_batch(stream: RankStream, cursor: int) -> dict:
    """The reference batch of a step, made without the pipeline: ``Dataset.take`` of the
    step's ids, decoded by ``table_to_numpy``, with ``_seq`` when the stream has it."""
    ids = stream.ids(cursor, ahead=False)
    out = table_to_numpy(stream.select(stream.dataset.take(ids)))
    if stream.with_seq:
        out["_seq"] = ids
    return out


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world,rank,workers,worker", [(1, 0, 0, 0), (3, 2, 2, 1)])
def test_pipeline_batches_equal_the_streams(ds, shuffle, world, rank, workers, worker):
    order = OrderOptions(seed=3, shuffle=shuffle, window_blocks=3)
    stream = RankStream(ds, order, Topology(12 * world, world, rank), with_seq=True)
    ref = RankStream(ds, order, Topology(12 * world, world, rank), with_seq=True)
    steps = ds.num_samples // (12 * world)
    indices = range(worker, steps, max(1, workers))
    got = list(BatchPipeline(stream, 36, indices))
    assert [i for i, _ in got] == list(indices)
    for i, batch in got:
        want = decoded_batch(ref, 36 + i * 12 * world)
        assert batch["_seq"].tolist() == want["_seq"].tolist()
        assert batch["text"] == want["text"]


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_row_group_is_decoded_once_per_epoch(ds, shuffle, monkeypatch):
    ds = open_dataset(ds.url)   # an empty decode cache
    calls: list[int] = []
    real = type(ds.row_groups)._decode

    def counting(self, rg):
        calls.append(rg)
        return real(self, rg)

    monkeypatch.setattr(type(ds.row_groups), "_decode", counting)
    stream = RankStream(ds, OrderOptions(seed=9, shuffle=shuffle, window_blocks=4), Topology(10))
    pipe = BatchPipeline(stream, 0, range(ds.num_samples // 10))
    n = sum(len(b["text"]) for _, b in pipe)
    assert n == ds.num_samples // 10 * 10
    assert sorted(calls) == sorted(set(calls))          # none twice
    assert len(calls) == pipe.decodes == ds.manifest.num_row_groups


def test_a_small_budget_bounds_what_is_held(ds):
    stream = RankStream(ds, OrderOptions(seed=1, shuffle=False), Topology(5))
    pipe = BatchPipeline(stream, 0, range(ds.num_samples // 5), ahead_bytes=1)
    for _ in pipe:
        pass
    # One step of 5 rows spans at most 2 row groups of 23; with no budget nothing else is held.
    assert pipe.max_held <= 2


def test_an_endless_pipeline_stops_when_closed(ds):
    before = threading.active_count()
    earlier = set(threading.enumerate())   # other tests' threads: not this pipeline's to end
    stream = RankStream(ds, OrderOptions(seed=1), Topology(8))
    it = iter(BatchPipeline(stream, 0, itertools.count()))
    seen = [next(it)[0] for _ in range(3 * ds.num_samples // 8)]   # three epochs
    assert seen == list(range(len(seen)))
    it.close()
    for t in set(threading.enumerate()) - earlier:
        if t.name.startswith("zephon-decode"):
            t.join(timeout=5)
    assert threading.active_count() <= before


def test_a_decode_error_reaches_the_caller(ds, monkeypatch):
    ds = open_dataset(ds.url)

    def broken(self, rg):
        raise OSError(f"row group {rg} unreadable")

    monkeypatch.setattr(type(ds.row_groups), "_decode", broken)
    stream = RankStream(ds, OrderOptions(seed=1), Topology(8))
    with pytest.raises(OSError, match="unreadable"):
        list(BatchPipeline(stream, 0, range(3)))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_step_rows_points_at_the_located_rows(ds, data):
    n = ds.num_samples
    if data.draw(st.booleans()):
        lo = data.draw(st.integers(0, n - 1))
        ids = np.arange(lo, data.draw(st.integers(lo + 1, min(n, lo + 80))), dtype=np.int64)
    elif data.draw(st.booleans()):
        ids = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=60)),
                       dtype=np.int64)
    else:   # past the small-batch path
        seed = data.draw(st.integers(0, 2**32 - 1))
        ids = np.random.default_rng(seed).integers(0, n, data.draw(st.integers(513, 900)))
    rgs, runs, inverse, rows = step_rows(ds.manifest, ids)
    loc = ds.locate(ids)
    if runs is not None:
        got = [(rg, b + k) for rg, (b, cnt) in zip(rgs, runs) for k in range(cnt)]
    else:
        got = [(rgs[g], int(r)) for g, r in zip(inverse, rows)]
        firsts = [rgs[g] for g in inverse]
        assert rgs == list(dict.fromkeys(firsts))   # listed in order of first use
    assert got == list(zip(loc.row_group.tolist(), loc.row_in_group.tolist()))


def _same_plan(a: tuple, b: tuple) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None
               and np.array_equal(np.asarray(x), np.asarray(y))) for x, y in zip(a, b))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_plan_steps_equals_step_rows_per_step(ds, data):
    """Planning many steps at once gives each step exactly what step_rows gives it alone,
    also where consecutive ids run across step boundaries or a step is empty."""
    n = ds.num_samples
    blocks = []
    for _ in range(data.draw(st.integers(1, 12))):
        kind = data.draw(st.sampled_from(["run", "ids", "empty"]))
        if kind == "run":
            lo = data.draw(st.integers(0, n - 1))
            blocks.append(np.arange(lo, data.draw(st.integers(lo + 1, min(n, lo + 30)))))
        elif kind == "ids":
            blocks.append(np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1,
                                                      max_size=20)), dtype=np.int64))
        else:
            blocks.append(np.zeros(0, dtype=np.int64))
    planned = plan_steps(ds.manifest, blocks)
    assert len(planned) == len(blocks)
    for block, plan in zip(blocks, planned):
        assert _same_plan(plan, step_rows(ds.manifest, block))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Token windows, a number column with nulls in some row groups only, text (with nulls),
    large text and bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("mixed")
    n = 230
    windows = np.arange(n * 6, dtype=np.int32).reshape(n, 6)
    x = [None if 40 <= i < 45 else i * 10 for i in range(n)]
    pq.write_table(pa.table({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(windows.reshape(-1)), 6),
        "x": pa.array(x, pa.int64()),
        "w": pa.FixedSizeListArray.from_arrays(                  # rows of 1.2 KB
            pa.array(np.arange(n * 300, dtype=np.int32)), 300),
        "s": [None if i % 17 == 0 else f"doc {i} ü" for i in range(n)],
        "L": pa.array([f"large {i}" * (i % 4) for i in range(n)], pa.large_string()),
        "b": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.binary()),
    }), d / "in.parquet")
    convert([str(d / "in.parquet")], str(d / "ds"), options=WriteOptions(row_group_rows=19))
    return str(d / "ds")


@pytest.mark.parametrize("shuffle", [False, True])
def test_mixed_columns_match_decode_table(mixed, shuffle):
    order = OrderOptions(seed=5, shuffle=shuffle, window_blocks=3)
    stream = RankStream(open_dataset(mixed), order, Topology(13), with_seq=True)
    ref = RankStream(open_dataset(mixed), order, Topology(13), with_seq=True)
    for i, batch in BatchPipeline(stream, 0, range(3 * 230 // 13)):   # three epochs
        want = decoded_batch(ref, i * 13)
        assert list(batch) == list(want)
        assert batch["_seq"].tolist() == want["_seq"].tolist()
        assert isinstance(batch["tokens"], np.ndarray) and batch["tokens"].shape == (13, 6)
        assert batch["tokens"].tolist() == want["tokens"].tolist()
        assert type(batch["x"]) is type(want["x"])   # a list where nulls are, else numpy
        assert list(batch["x"]) == list(want["x"]) and batch["s"] == want["s"]
        assert batch["L"] == want["L"] and batch["b"] == want["b"]
        assert batch["w"].shape == (13, 300) and (batch["w"] == want["w"]).all()
        assert all(type(v) is bytes for v in batch["b"])


def _same_batch(a: dict, b: dict) -> bool:
    if list(a) != list(b):
        return False
    for k in a:
        if type(a[k]) is not type(b[k]):
            return False
        if isinstance(a[k], np.ndarray):
            if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or (a[k] != b[k]).any():
                return False
        elif a[k] != b[k]:
            return False
    return True


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch,world,rank,workers,worker,start", [
    (4, 1, 0, 0, 0, 0), (3, 1, 0, 0, 0, 5), (2, 3, 1, 0, 0, 7), (5, 2, 1, 3, 2, 0)])
def test_groups_give_the_step_by_step_batches(mixed, shuffle, batch, world, rank, workers,
                                              worker, start):
    """Small steps gathered in groups (runs of token windows across row groups, numbers with
    nulls in some steps only, text, bytes) give each step the batch it gets alone, and the
    transform sees one step at a time."""
    order = OrderOptions(seed=6, shuffle=shuffle, window_blocks=3)
    topo = Topology(batch * world, world, rank)
    indices = range(worker, 3 * 230 // (batch * world), max(1, workers))   # three epochs
    seen = []

    def transform(b):
        seen.append(len(b["_seq"]))
        return dict(b, n=len(b["_seq"]))

    alone = list(BatchPipeline(RankStream(open_dataset(mixed), order, topo, with_seq=True),
                               start, indices, group=1))
    grouped = BatchPipeline(RankStream(open_dataset(mixed), order, topo, with_seq=True),
                            start, indices, transform=transform)
    assert grouped.group > 1
    got = list(grouped)
    assert [i for i, _ in got] == [i for i, _ in alone] == list(indices)
    for (_, a), (_, g) in zip(alone, got):
        assert g.pop("n") == len(a["_seq"])
        assert _same_batch(g, a)
    assert seen == [len(a["_seq"]) for _, a in alone]


def test_an_endless_pipeline_queues_a_bounded_number_of_steps(ds):
    """Groups count as their steps against MAX_AHEAD_STEPS: on a tiny dataset the byte
    budget never binds, and counting groups queued 32x more steps (a hang in practice)."""
    from zephon_store.load import pipeline

    stream = RankStream(ds, OrderOptions(seed=1), Topology(8))
    calls = []
    real = stream.ids

    def counting(cursor, ahead=False):
        calls.append(cursor)
        return real(cursor, ahead=ahead)

    stream.ids = counting
    pipe = BatchPipeline(stream, 0, itertools.count())
    it = iter(pipe)
    next(it), next(it)
    assert pipe.group == 32
    planned_at_once = pipeline.PLAN_AHEAD_IDS // 8
    assert len(calls) <= pipeline.MAX_AHEAD_STEPS + planned_at_once + 1
    it.close()


def test_a_group_closed_midway_stops_at_once(ds):
    stream = RankStream(ds, OrderOptions(seed=1, shuffle=False), Topology(4))
    pipe = BatchPipeline(stream, 0, range(ds.num_samples // 4))
    assert pipe.group > 2
    it = iter(pipe)
    next(it), next(it)
    pipe.cancel()
    assert list(it) == []


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_gather_pylist_equals_take_and_to_pylist(data):
    """The one-copy text gather against Arrow's take, for every flat binary type and nulls."""
    import pyarrow as pa

    from zephon_store._util.arrow import gather_pylist

    typ = data.draw(st.sampled_from([pa.string(), pa.large_string(), pa.binary(),
                                     pa.large_binary()]))
    text = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    value = st.text(max_size=6) if text else st.binary(max_size=6)
    cols = []
    for _ in range(data.draw(st.integers(1, 4))):
        vals = data.draw(st.lists(st.none() | value, min_size=1, max_size=12))
        arr = pa.array(vals, typ)
        cut = data.draw(st.integers(0, len(vals) - 1))
        cols.append(pa.chunked_array([arr.slice(cut)]) if cut else arr)  # offsets too
    n = data.draw(st.integers(0, 20))
    inverse = np.array([data.draw(st.integers(0, len(cols) - 1)) for _ in range(n)], np.int64)
    rows = np.array([data.draw(st.integers(0, len(cols[k]) - 1)) for k in inverse], np.int64)
    want = [cols[k][r].as_py() for k, r in zip(inverse.tolist(), rows.tolist())]
    assert gather_pylist(cols, inverse, rows) == want


@pytest.fixture(scope="module")
def long_docs(tmp_path_factory):
    """Documents and bytes with nulls, over several pages per column chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("docs")
    n = 200
    text = [None if i % 11 == 0 else f"document {i} ü " + "w" * (i % 150) for i in range(n)]
    blob = [None if t is None else t.encode()[::-1] for t in text]
    pq.write_table(pa.table({"text": text, "blob": pa.array(blob, pa.binary()),
                             "k": pa.array(range(n), pa.int64())}), d / "in.parquet")
    convert([str(d / "in.parquet")], str(d / "ds"),
            options=WriteOptions(row_group_rows=19, data_page_size=1024))
    return str(d / "ds")


@pytest.mark.parametrize("start", [0, 57])
@pytest.mark.parametrize("shuffle", [False, True])
def test_documents_match_decode_table(long_docs, shuffle, start):
    """Text gathered for shuffled steps (row by row for the first step, from whole-row-group
    lists after it) and cut for sequential ones equals table_to_numpy's."""
    order = OrderOptions(seed=2, shuffle=shuffle, window_blocks=3)
    stream = RankStream(open_dataset(long_docs), order, Topology(17))
    ref = RankStream(open_dataset(long_docs), order, Topology(17))
    for i, batch in BatchPipeline(stream, start, range(2 * 200 // 17)):   # two epochs
        want = decoded_batch(ref, start + i * 17)
        assert batch["text"] == want["text"] and batch["blob"] == want["blob"]
        assert all(v is None or type(v) is bytes for v in batch["blob"])
        assert batch["k"].tolist() == want["k"].tolist()


@pytest.mark.parametrize("world,rank,workers,worker,converts_whole", [
    (1, 0, 1, 0, True),      # one rank, one worker: reads every row of its row groups
    (4, 1, 1, 0, False),     # a quarter of each row group: only its own rows
    (1, 0, 3, 2, False),     # a third (worker 2 of 3)
])
def test_whole_row_group_text_only_when_this_pipeline_reads_most_of_it(
        long_docs, monkeypatch, world, rank, workers, worker, converts_whole):
    from zephon_store.load import pipeline

    whole = []
    real = pipeline._Decoded.pylist

    def counting(self, name):
        whole.append(name)
        return real(self, name)

    monkeypatch.setattr(pipeline._Decoded, "pylist", counting)
    order = OrderOptions(seed=4, shuffle=True, window_blocks=3)
    topo = Topology(8 * world, world, rank)
    stream = RankStream(open_dataset(long_docs), order, topo)
    ref = RankStream(open_dataset(long_docs), order, topo)
    indices = range(worker, 200 // (8 * world), workers)
    for i, batch in BatchPipeline(stream, 0, indices):
        want = decoded_batch(ref, i * 8 * world)
        assert batch["text"] == want["text"] and batch["blob"] == want["blob"]
    assert bool(whole) == converts_whole


def test_decode_threads_are_shared_among_process_workers(ds, monkeypatch):
    from zephon_store.load.pipeline import default_decode_threads

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert default_decode_threads(ds) == 4
    assert default_decode_threads(ds, workers=2) == 4
    assert default_decode_threads(ds, workers=3) == 2
    assert default_decode_threads(ds, workers=16) == 1
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert default_decode_threads(ds) == 2 and default_decode_threads(ds, workers=2) == 1


def _first_step_threads(ds, monkeypatch, *, decode_threads: int) -> tuple[list, list]:
    """(row groups, names of the threads that decoded them) of one pipeline's first step.

    A pool thread waits (at most 10 s) until the caller's thread has decoded one, so that on
    a busy machine the pool cannot take every row group before the caller starts.
    """
    ds = open_dataset(ds.url)     # nothing decoded yet, in memory
    calls: list[tuple[int, str]] = []
    real = type(ds.row_groups)._decode
    me = threading.current_thread()
    caller_decoded = threading.Event()

    def recording(self, rg):
        if threading.current_thread() is me:
            caller_decoded.set()
        else:
            caller_decoded.wait(10)
        calls.append((rg, threading.current_thread().name))
        return real(self, rg)

    monkeypatch.setattr(type(ds.row_groups), "_decode", recording)
    stream = RankStream(ds, OrderOptions(seed=5), Topology(60))
    it = iter(BatchPipeline(stream, 0, range(3), decode_threads=decode_threads))
    next(it)
    step_rgs = stream.row_groups(0).tolist()
    it.close()
    return step_rgs, calls


def test_the_callers_thread_decodes_the_first_step_too(ds, monkeypatch):
    # A start or resume waits for the first step's row groups: the caller decodes some of
    # them itself beside the pool, rather than idling while each waits for a thread.
    step_rgs, calls = _first_step_threads(ds, monkeypatch, decode_threads=2)
    assert len(step_rgs) >= 3
    firsts = calls[:len(step_rgs)]
    assert sorted(rg for rg, _ in firsts) == sorted(step_rgs)          # each once
    assert threading.current_thread().name in {name for _, name in firsts}


def test_one_decode_thread_leaves_the_first_step_to_the_caller(ds, monkeypatch):
    step_rgs, calls = _first_step_threads(ds, monkeypatch, decode_threads=1)
    me = threading.current_thread().name
    assert [name for _, name in calls[:len(step_rgs)]] == [me] * len(step_rgs)


def test_a_pipeline_cancelled_in_its_first_step_skips_its_other_decodes(ds, monkeypatch):
    ds = open_dataset(ds.url)
    stream = RankStream(ds, OrderOptions(seed=5), Topology(60))
    pipe = BatchPipeline(stream, 0, range(3), decode_threads=1)
    real = type(ds.row_groups)._decode
    calls: list[int] = []

    def cancelling(self, rg):
        calls.append(rg)
        pipe.cancel()          # as a loader closed from another thread would
        return real(self, rg)

    monkeypatch.setattr(type(ds.row_groups), "_decode", cancelling)
    assert list(pipe) == []
    assert len(calls) == 1 and len(stream.row_groups(0)) >= 3
