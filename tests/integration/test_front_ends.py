"""Every feature in every front end (issue 30 item 3): the cells of the table in
docs/loader.md, "Every feature in every front end", for ``ZephonLoader`` (``torch``), the
TorchTitan integration (``titan``) and Grain's ``ZephonIterDataset`` (``grain``); the live
column's and Grain's random-access source's tests are named in the table.

Each test runs one feature through a front end's public API over one small dataset of
packed token windows (every window distinct) and compares the windows each rank was handed,
step by step, with the ones the library's run accounting places there
(:class:`~zephon_store.runs.accounting.RunContext`'s ``trace``: the loader's own order
code with the run's inputs), so a front end that silently dropped a feature (another
order, unmasked denied rows, no run log, no prefetch, no decoded cache) fails here.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.helpers import two_stage_mixture
from tests.integration.torchtitan_worker import make_packed_dataset
from zephon_store.runs.accounting import RunContext

pytestmark = pytest.mark.integration

SEQ_LEN = 16
SEED = 11
WINDOW_BLOCKS, LANES = 2, 6
FRONT_ENDS = ["torch", "titan", "grain"]


def _windows(url: str) -> np.ndarray:
    from zephon_store.read.dataset import open_dataset

    with open_dataset(url) as ds:
        return np.array(ds.take(range(ds.num_samples)).column("tokens").to_pylist())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``(url, {source name: windows}, mixture file)``: a packed dataset and a mixture of it
    and a second one, with a stage that changes the weights at step 3."""
    root = tmp_path_factory.mktemp("front-ends")
    url = make_packed_dataset(str(root / "a"), seq_len=SEQ_LEN, windows=60)
    other = make_packed_dataset(str(root / "b"), seq_len=SEQ_LEN, windows=30)
    mix = two_stage_mixture(root / "mix.json", {"big": (url, [0.9, 0.3]),
                                                "small": (other, [0.1, 0.7])})
    windows = {"big": _windows(url), "small": _windows(other)}
    assert len({tuple(w) for w in windows["big"]}) == len(windows["big"]) > 40
    return url, windows, mix


class _GrainRank:
    """One host of a Grain pipeline over :class:`~zephon_store.grain.ZephonIterDataset`, seen
    as a loader: ``iter`` is its iterator, the state is the iterator's ``get_state``."""

    def __init__(self, ds) -> None:
        self.ds, self.it = ds, None

    def __iter__(self):
        if self.it is None:
            self.it = iter(self.ds)
        return self.it

    def state_dict(self) -> dict:
        return iter(self).get_state()

    def load_state_dict(self, state: dict) -> None:
        iter(self).set_state(state)

    @property
    def dataset(self):
        return iter(self).loader.dataset


# -- the front ends, as a test sees them --------------------------------------------------
def make(front: str, dataset: str, *, world_size: int, rank: int, global_batch: int, **kw):
    """A loader of ``front`` over ``dataset`` (a URL or a mixture file); ``kw``: the
    feature's keywords, spelled as ZephonLoader's (translated to TorchTitan's config, and to
    Grain's option groups)."""
    if front == "grain":
        from zephon_store import (
            BatchOptions,
            OrderOptions,
            ReadAheadOptions,
            Topology,
            WorkerOptions,
        )
        from zephon_store.grain import ZephonIterDataset

        ahead = {"prefetch_bytes": kw.pop("prefetch_bytes")} if "prefetch_bytes" in kw else {}
        return _GrainRank(ZephonIterDataset(
            dataset, topology=Topology(global_batch, world_size, rank),
            order=OrderOptions(seed=SEED, window_blocks=WINDOW_BLOCKS, lanes=LANES),
            batch=BatchOptions(columns=("tokens",)), read_ahead=ReadAheadOptions(**ahead),
            workers=WorkerOptions(num_workers=kw.pop("num_workers", 0)), **kw))
    if front == "torch":
        from zephon_store import OrderOptions
        from zephon_store.torch import ZephonLoader

        return ZephonLoader(dataset, global_batch=global_batch, world_size=world_size,
                            rank=rank, order=OrderOptions(seed=SEED, window_blocks=WINDOW_BLOCKS,
                                                          lanes=LANES),
                            columns=["tokens"], collate=None, **kw)
    from zephon_store.integrations.torchtitan import ZephonDataLoader

    cfg = {"storage_options": json.dumps(kw.pop("storage_options")) if "storage_options" in kw
           else "", "cache_dir": str(kw.pop("cache", "") or ""),
           "decoded_cache_dir": str(kw.pop("decoded_cache", "") or "")}
    for key in ("run_log", "deny_list"):
        cfg[key] = str(kw.pop(key, "") or "")
    cfg["num_workers"] = kw.pop("num_workers", 0)
    assert not kw, f"no TorchTitan spelling for {sorted(kw)}"
    where = {"mixture": dataset} if dataset.endswith(".json") else {"dataset": dataset}
    return ZephonDataLoader.Config(**where, seed=SEED, window_blocks=WINDOW_BLOCKS, lanes=LANES,
                                   **cfg).build(
        dp_world_size=world_size, dp_rank=rank, tokenizer=None, seq_len=SEQ_LEN,
        local_batch_size=global_batch // world_size)


def rows(front: str, batch) -> list[list[int] | None]:
    """The windows a batch handed over, ``None`` for a masked (deny-listed) one."""
    if front in ("torch", "grain"):
        masked = batch.get("_masked", np.zeros(len(batch["tokens"]), dtype=bool))
        return [None if m else w.tolist() for w, m in zip(batch["tokens"], masked)]
    inputs, labels = batch
    from zephon_store.integrations.torchtitan import IGNORE_INDEX

    return [None if (y == IGNORE_INDEX).all() else x.tolist() + [int(y[-1])]
            for x, y in zip(inputs["input"], labels)]


def run(loaders, steps: int, front: str) -> list[list[list]]:
    """``steps`` global steps of a job whose ranks are ``loaders``: ``[step][rank]`` rows."""
    its = [iter(loader) for loader in loaders]
    out = [[rows(front, next(it)) for it in its] for _ in range(steps)]
    for it in its:
        it.close()
    return out


def job(front, dataset, *, world_size, global_batch, **kw):
    return [make(front, dataset, world_size=world_size, rank=r, global_batch=global_batch, **kw)
            for r in range(world_size)]


def expected(ctx: RunContext, windows: dict, steps, *, segments=None, end_step=None,
             denied=()) -> list[list[list]]:
    """``[step][rank]`` windows the run accounting places (``None`` where denied)."""
    out = []
    for t in ctx.trace(steps, segments=segments, end_step=end_step):
        step = []
        for r, ids in enumerate(t.ranks):
            names = t.sources[r] if t.sources else ["big"] * len(ids)
            step.append([None if (k, i) in denied else windows[k][i].tolist()
                         for k, i in zip(names, ids)])
        out.append(step)
    return out


def planned(dataset: str, *, global_batch: int, world_size: int, cursor: int = 0,
            first_step: int = 0):
    ctx = RunContext(dataset, seed=SEED, window_blocks=WINDOW_BLOCKS, lanes=LANES,
                     global_batch=global_batch)
    seg = ctx.planned_segment(global_batch=global_batch, world_size=world_size, cursor=cursor)
    return ctx, seg.replace(first_step=first_step)


# -- the rows of the table ------------------------------------------------------------------
@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_single_dataset(front, data) -> None:
    url, windows, _ = data
    ctx, seg = planned(url, global_batch=6, world_size=2)
    got = run(job(front, url, world_size=2, global_batch=6), 12, front)   # past an epoch
    assert got == expected(ctx, windows, range(12), segments=[seg])


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_mixture_with_stages(front, data) -> None:
    _, windows, mix = data
    ctx, seg = planned(mix, global_batch=6, world_size=2)
    got = run(job(front, mix, world_size=2, global_batch=6), 8, front)
    want = expected(ctx, windows, range(8), segments=[seg])
    assert got == want
    small = [sum(w in windows["small"].tolist() for r in step for w in r) for step in want]
    assert sum(small[:3]) < sum(small[3:6])       # the second stage's weights apply


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_deny_list(front, data, tmp_path) -> None:
    url, windows, _ = data
    ctx, seg = planned(url, global_batch=6, world_size=2)
    ids = [i for t in ctx.trace(range(4), segments=[seg]) for r in t.ranks for i in r]
    denied = ids[1:24:5]
    (tmp_path / "deny.txt").write_text("\n".join(map(str, denied)))
    got = run(job(front, url, world_size=2, global_batch=6,
                  deny_list=str(tmp_path / "deny.txt")), 4, front)
    assert got == expected(ctx, windows, range(4), segments=[seg],
                           denied={("big", i) for i in denied})
    assert sum(w is None for step in got for r in step for w in r) == len(denied)


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_deny_list_on_a_mixture(front, data, tmp_path) -> None:
    """A takedown in each source of a mixture with stages: a file naming each source's own
    ids (docs/audit.md)."""
    _, windows, mix = data
    ctx, seg = planned(mix, global_batch=6, world_size=2)
    pairs = [p for t in ctx.trace(range(6), segments=[seg])
             for names, ids in zip(t.sources, t.ranks) for p in zip(names, ids)]
    denied = set(pairs[1:36:4])
    assert {k for k, _ in denied} == {"big", "small"}
    (tmp_path / "deny.json").write_text(json.dumps({"sources": {
        k: {"ids": sorted(i for n, i in denied if n == k)} for k in ("big", "small")}}))
    got = run(job(front, mix, world_size=2, global_batch=6,
                  deny_list=str(tmp_path / "deny.json")), 6, front)
    assert got == expected(ctx, windows, range(6), segments=[seg], denied=denied)
    assert sum(w is None for step in got for r in step for w in r) == sum(
        p in denied for p in pairs)


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_the_run_log_and_zephon_audit(front, data, tmp_path) -> None:
    """A run in two segments (W=2, then a resume at W=3) logs both; ``zephon audit``
    passes on the log and its trace is what every rank was handed."""
    from zephon_store.cli.main import main as zephon

    url, windows, _ = data
    log = str(tmp_path / "run.jsonl")
    first = job(front, url, world_size=2, global_batch=6, run_log=log)
    got = run(first, 5, front)
    state = first[0].state_dict()
    second = job(front, url, world_size=3, global_batch=6, run_log=log)
    for loader in second:
        loader.load_state_dict(state)
    got += run(second, 6, front)                      # 66 positions: past an epoch
    ctx = RunContext(url, log)
    assert [(s.first_step, s.cursor, s.world_size) for s in ctx.segments] == [(0, 0, 2),
                                                                              (5, 30, 3)]
    assert got == expected(ctx, windows, range(11), end_step=11)
    assert ctx.audit(end_step=11).ok
    assert zephon(["audit", url, "--log", log, "--end-step", "11"]) == 0


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_byte_prefetch_into_the_disk_cache(front, data, s3_bucket, tmp_path) -> None:
    """A remote dataset behind a disk cache: the coming steps' row groups are fetched ahead
    in ranged GETs (the prefetcher's; a loader without a prefetch budget fetches none);
    the windows are the local copy's."""
    from zephon_store import WriteOptions, convert

    url, windows, _ = data
    remote = f"{s3_bucket.url}/ds"
    raw = os.path.join(os.path.dirname(url), "raw")
    from zephon_store.write.packing import PackingOptions, packing_convert_kwargs

    kw = packing_convert_kwargs(PackingOptions(
        tokenizer=os.path.join(os.path.dirname(url), "tokenizer.json"), seq_len=SEQ_LEN,
        strategy="concat"))
    convert([raw], remote, storage_options=s3_bucket.storage_options,
            options=WriteOptions(row_group_rows=4, row_group_bytes=None,
                                 target_shard_bytes=16 << 10), **kw)
    (loader,) = job(front, remote, world_size=1, global_batch=4,
                    storage_options=s3_bucket.storage_options, cache=tmp_path / "cache")
    got = run([loader], 6, front)
    ctx, seg = planned(url, global_batch=4, world_size=1)
    assert got == expected(ctx, windows, range(6), segments=[seg])
    assert loader.dataset.row_groups.range_fetcher().row_groups > 0
    if front != "titan":   # the control: the same loader without a prefetch budget
        (none,) = job(front, remote, world_size=1, global_batch=4, prefetch_bytes=0,
                      storage_options=s3_bucket.storage_options, cache=tmp_path / "other")
        assert run([none], 6, front) == got
        assert none.dataset.row_groups.range_fetcher().row_groups == 0


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_the_decoded_cache(front, data, tmp_path) -> None:
    """A later run over the same decoded cache decodes nothing and hands out the same
    windows."""
    url, windows, _ = data
    ctx, seg = planned(url, global_batch=4, world_size=1)
    want = expected(ctx, windows, range(15), segments=[seg])     # a whole epoch
    stats = []
    for _ in range(2):
        (loader,) = job(front, url, world_size=1, global_batch=4,
                        decoded_cache=tmp_path / "decoded")
        assert run([loader], 15, front) == want
        stats.append(loader.dataset.decoded_cache.stats)
    assert stats[0].misses > 0 and stats[1].misses == 0 and stats[1].hits > 0


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_process_workers(front, data) -> None:
    url, windows, _ = data
    ctx, seg = planned(url, global_batch=6, world_size=2)
    got = run(job(front, url, world_size=2, global_batch=6, num_workers=2), 5, front)
    assert got == expected(ctx, windows, range(5), segments=[seg])


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_an_elastic_resume(front, data) -> None:
    """The state after 4 steps at W=2 resumes at W=3 with another global batch: the stream
    continues at the cursor, rank by rank as the rank rule splits it."""
    url, windows, _ = data
    first = job(front, url, world_size=2, global_batch=6)
    got = run(first, 4, front)
    state = first[0].state_dict()
    assert all(loader.state_dict() == state for loader in first)
    second = job(front, url, world_size=3, global_batch=9)
    for loader in second:
        loader.load_state_dict(state)
    got += run(second, 4, front)
    ctx, seg = planned(url, global_batch=6, world_size=2)
    _, later = planned(url, global_batch=9, world_size=3, cursor=24, first_step=4)
    assert got == expected(ctx, windows, range(8), segments=[seg, later])
