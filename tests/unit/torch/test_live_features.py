"""Every loader feature through the live front end (issue 30 item 3, the live column).

``LiveZephonLoader`` is the shared ``Loader`` plus the per-step participants and the commit
rule, so each feature of the Loader must reach a live run through the public API. Each test
plays a live run in one process: several replicas (one ``LiveZephonLoader`` each) share a
commit counter, the test sets each step's quorum (who takes part, who only watches), some
steps fail to commit and are served again, replicas leave, and joining replicas take the
state of a present one (torchft's state transfer). Checked against the single-process
stream: a single dataset, a mixture with stages, a deny list, the run log with the library
audit (``RunContext.audit``, what ``zephon audit`` runs), byte prefetch into the disk cache
(real S3), the decoded cache, process workers and an elastic resume.
"""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path

import numpy as np
import pytest

import zephon_store as z
from tests.helpers import small_dataset
from zephon_store import (
    BatchOptions,
    ReadAheadOptions,
    SourceOptions,
    StopOptions,
    Topology,
    WorkerOptions,
    as_numpy,
)
from zephon_store.cli.main import main
from zephon_store.io.cache import ChunkCache
from zephon_store.load.denylist import MASK_KEY
from zephon_store.load.runlog import RunSegment, read_run_log
from zephon_store.order import Order, OrderOptions
from zephon_store.read.dataset import open_dataset
from zephon_store.read.decoded_disk import DecodedDiskCache
from zephon_store.runs.accounting import RunContext
from zephon_store.torch import LiveZephonLoader, ReplicaOptions, ZephonLoader

B = 10
OPTIONS = OrderOptions(seed=3, window_blocks=2, lanes=7)
# (participants of the step, whether it commits); replicas not listed watch (index None).
PLAN = [([0, 1, 2], True), ([0, 1, 2], False), ([0, 2], True), ([2, 0, 1], True),
        ([1], False), ([1], True), ([0, 1], True), ([1, 0], True), ([0, 1, 2], True)]
DENIED = [3, 17, 40, 41, 99, 150, 151]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("live_features")), files=3, records=70,
                         row_group_rows=10)


@pytest.fixture(scope="module")
def reference(url) -> list[int]:
    ds = open_dataset(url)
    order = Order(ds.manifest.rg_rows, OPTIONS)
    return order.sample_at(np.arange(3 * ds.num_samples, dtype=np.int64)).tolist()


class Job:
    """Replicas of one live run in this process, sharing a commit counter (torchft's step).

    ``make(replica)`` builds a replica's loader from its ``ReplicaOptions``; a replica that
    joins a running job loads the state of a present one (or ``state``).
    """

    def __init__(self, make) -> None:
        self.make = make
        self.counter = 0
        self.replicas: dict[int, list] = {}
        self.quorum: dict[int, tuple[int | None, int]] = {}

    def join(self, r: int, *, state: dict | None = None) -> None:
        # The callables see the job through a weak proxy: a loader holding its job strongly
        # made a cycle, so a test's replicas (decode pools, DataLoader workers) outlived it
        # until a garbage collection in a later test, which then waited 5 s per worker
        # (torch's queues were finalized before its iterator asked the workers to stop).
        job = weakref.proxy(self)
        loader = self.make(ReplicaOptions(participants=lambda: job.quorum[r],
                                          commits=lambda: job.counter))
        if self.replicas:
            loader.load_state_dict(state or next(iter(self.replicas.values()))[0].state_dict())
        self.replicas[r] = [loader, iter(loader)]

    def leave(self, r: int) -> None:
        self.replicas.pop(r)[1].close()

    def step(self, participants: list[int], commit: bool, *,
             before_commit=None) -> dict[int, dict]:
        """Every present replica draws the step; returns the participants' batches."""
        for r in self.replicas:
            self.quorum[r] = ((participants.index(r), len(participants)) if r in participants
                              else (None, len(participants)))
        drawn = {r: next(it) for r, (_, it) in self.replicas.items()}
        if before_commit is not None:
            before_commit()
        if commit:
            self.counter += 1
        return {r: drawn[r] for r in participants}

    def play(self, plan=PLAN, *, churn: bool = True, replicas: int = 3):
        """Run ``plan`` with ``replicas`` replicas (with ``churn``, 1 leaves after step 2
        and rejoins at step 3); yields ``(cursor, batches, committed)`` per step."""
        for r in range(replicas):
            self.join(r)
        for k, (participants, commit) in enumerate(plan):
            if churn and k == 2:
                self.leave(1)
            if churn and k == 3:
                self.join(1)
            got = self.step(participants, commit)
            yield next(iter(self.replicas.values()))[0].last_step.cursor, got, commit


NUMPY_SEQ = BatchOptions(with_seq=True, collate=as_numpy)


def _live(url, batch=NUMPY_SEQ, **kw):
    def make(replica: ReplicaOptions):
        return LiveZephonLoader(url, global_batch=B, order=OPTIONS, batch=batch,
                                replica=replica, **kw)
    return make


def _committed_ids(job: Job) -> list[tuple[int, list[int]]]:
    return [(cursor, sorted(i for b in got.values() for i in b["_seq"].tolist()))
            for cursor, got, ok in job.play() if ok]


def test_a_single_dataset_live_run_consumes_the_single_process_stream(url, reference) -> None:
    steps = _committed_ids(Job(_live(url)))
    assert [c for c, _ in steps] == list(range(0, 7 * B, B))
    for cursor, ids in steps:
        assert ids == sorted(reference[cursor:cursor + B])


def _mixture(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("live_mix")
    urls = {}
    for name, n in {"web": 60, "code": 27}.items():
        src = root / f"{name}.jsonl"
        src.write_text("".join(json.dumps({"id": i, "text": f"{name} {i}"}) + "\n"
                               for i in range(n)))
        urls[name] = str(root / name)
        z.convert([str(src)], urls[name], options=z.WriteOptions(row_group_rows=10),
                  progress=False)
    stages = [("warm", 0, {"web": 0.75, "code": 0.25}), ("code", 40, {"web": 0.25, "code": 0.75})]
    return {"seed": 5,
            "stages": [{"name": n, "start": {"samples": s}} for n, s, _ in stages],
            "sources": [{"name": k, "url": u, "weights": {n: w[k] for n, _, w in stages}}
                        for k, u in urls.items()]}


def _pairs(batch: dict) -> list[tuple[int, int]]:
    return list(zip(batch["_source"].tolist(), batch["_seq"].tolist()))


def test_a_mixture_with_stages_live_and_its_resume(tmp_path_factory, tmp_path) -> None:
    mix = str(tmp_path / "mix.json")
    with open(mix, "w") as f:
        json.dump(_mixture(tmp_path_factory), f)
    plain = ZephonLoader(mix, topology=Topology(B, world_size=1, rank=0), batch=NUMPY_SEQ,
                         stop=StopOptions(max_steps=10))
    want = [sorted(_pairs(b)) for b in plain]
    log = str(tmp_path / "run.jsonl")

    def make(replica: ReplicaOptions):
        return LiveZephonLoader(mix, global_batch=B, batch=NUMPY_SEQ, run_log=log,
                                replica=replica)

    job = Job(make)
    got = [(c, sorted(p for b in bs.values() for p in _pairs(b)))
           for c, bs, ok in job.play() if ok]
    assert [c for c, _ in got] == list(range(0, 7 * B, B))     # across the stage at 40
    assert [p for _, p in got] == want[:7]
    state = job.replicas[0][0].state_dict()
    assert state["cursor"] == 70 and "mixture" in state
    assert RunContext(mix, log).audit(end_step=7).ok       # each source's epochs checked
    # The live state carries the schedule: a live loader with another quorum and a
    # ZephonLoader on two ranks resume it.
    again = make(ReplicaOptions(participants=lambda: (1, 2)))
    again.load_state_dict(state)
    half = _pairs(next(iter(again)))
    ranks = []
    for rank in range(2):
        other = ZephonLoader(mix, topology=Topology(B, world_size=2, rank=rank),
                             batch=NUMPY_SEQ, stop=StopOptions(max_steps=1))
        other.load_state_dict(state)
        ranks += _pairs(next(iter(other)))
    assert sorted(ranks) == want[7] and set(half) < set(want[7]) and len(half) == B // 2


def test_a_deny_list_blanks_denied_rows_live(url, tmp_path) -> None:
    deny = tmp_path / "deny.json"
    deny.write_text(json.dumps({"ids": DENIED}))
    job = Job(_live(url, deny_list=str(deny)))
    masked_seen = []
    for _, batches, ok in job.play():
        for batch in batches.values():
            seq, masked = batch["_seq"].tolist(), batch[MASK_KEY].tolist()
            assert masked == [s in DENIED for s in seq]
            for j, m in enumerate(masked):
                row = (batch["text"][j], float(batch["score"][j]), list(batch["tags"][j]))
                assert (row == ("", 0.0, [])) == m
            if ok:
                masked_seen += [s for s, m in zip(seq, masked) if m]
    assert masked_seen and set(masked_seen) <= set(DENIED)


def test_the_run_log_of_a_live_run_passes_the_audit(url, reference, tmp_path) -> None:
    """Participants change every step, steps fail and are served again, a replica leaves
    and one heals in: the log's live segments recompute exactly what was committed."""
    log = str(tmp_path / "run.jsonl")
    deny = tmp_path / "deny.json"
    deny.write_text(json.dumps({"ids": DENIED}))
    job = Job(_live(url, run_log=log, deny_list=str(deny)))
    committed = [c for c, _, ok in job.play() if ok]
    segments = read_run_log(log)
    assert all(s.live and s.world_size == 1 for s in segments)
    # Where the run was taken up (step 0; the heal at step 2, after 2 committed steps: the
    # second plan step did not commit) and where the participant count changed, each once
    # (tests/unit/runs/test_live_trace.py: what trace and where make of it).
    assert [(s.first_step, s.cursor, s.participants) for s in segments] == [
        (0, 0, 3), (1, 10, 2), (2, 20, 3), (3, 30, 1), (4, 40, 2), (6, 60, 3)]
    report = RunContext(url, log).audit(end_step=job.counter)
    assert report.ok, report.to_dict()
    assert report.positions == len(committed) * B == job.replicas[0][0].state_dict()["cursor"]
    exposed = set(reference[:len(committed) * B])
    assert sum(e.masked for e in report.epochs) == len(exposed & set(DENIED))
    assert main(["audit", url, "--log", log, "--end-step", str(job.counter), "--json"]) == 0


def test_a_replica_healing_asynchronously_logs_once_its_state_arrived(url, tmp_path) -> None:
    """torchft's asynchronous quorum: a fresh replica sits a step out (present, reading
    nothing) and loads the state sent to it before that step commits. It must not log the
    cursor it started with (0, which would overlap the segments already logged)."""
    log = str(tmp_path / "run.jsonl")
    job = Job(_live(url, run_log=log))
    list(job.play())                                   # 7 committed steps, one heal
    ref = weakref.proxy(job)                           # no cycle: see Job.join
    fresh = job.make(ReplicaOptions(participants=lambda: ref.quorum[3],
                                    commits=lambda: ref.counter))
    job.replicas[3] = [fresh, iter(fresh)]
    sent = job.replicas[0][0].state_dict()             # the state before this step
    got = job.step([0, 1, 2], True, before_commit=lambda: fresh.load_state_dict(sent))
    assert 3 not in got
    job.step([3, 0], True)
    segments = read_run_log(log)
    assert [(s.first_step, s.cursor) for s in segments] == [
        (0, 0), (1, 10), (2, 20), (3, 30), (4, 40), (6, 60), (8, 80)]
    assert RunContext(url, log).audit(end_step=job.counter).ok


def test_the_audit_catches_a_replica_that_took_the_run_up_at_a_wrong_cursor(url,
                                                                           tmp_path) -> None:
    """A replica heals from a state whose cursor is a step behind its step count (edited by
    hand, or a bug): its log line does not continue the run's cursor, and the audit says
    where the overlap entered."""
    log = str(tmp_path / "run.jsonl")
    job = Job(_live(url, run_log=log))
    run = job.play(churn=False)
    for _ in range(3):
        next(run)                     # two steps committed, one served again
    job.leave(1)
    state = job.replicas[0][0].state_dict()
    job.join(1, state={**state, "cursor": state["cursor"] - B})
    job.step([1], True)
    report = RunContext(url, log).audit(end_step=job.counter)
    assert not report.ok
    assert [(e.step, e.kind) for e in report.events if e.failure] == [(2, "overlap")]
    assert main(["audit", url, "--log", log, "--end-step", str(job.counter), "--json"]) == 1


@pytest.mark.integration
def test_live_bytes_are_prefetched_into_the_disk_cache(url, s3_bucket, tmp_path) -> None:
    """A remote dataset behind a disk cache: the engine's prefetcher fetches the coming
    steps' row groups in ranged GETs (none without a prefetch budget); the batches are the
    local copy's."""
    remote = f"{s3_bucket.url}/ds"
    raw = sorted(str(p) for p in (Path(url).parent / "raw").glob("*.jsonl"))
    z.convert(raw, remote, storage_options=s3_bucket.storage_options,
              options=z.WriteOptions(target_shard_bytes=1 << 14, row_group_rows=10,
                                     row_group_bytes=None))

    def run(ds, **kw) -> list[list[int]]:
        quorum = [(0, 2)]
        loader = LiveZephonLoader(ds, global_batch=B, order=OPTIONS, batch=NUMPY_SEQ,
                                  replica=ReplicaOptions(participants=lambda: quorum[0]),
                                  **kw)
        batches, ids = iter(loader), []
        for k in range(6):
            quorum[0] = (k % 2, 2) if k < 3 else (0, 1)     # the shape changes: new engines
            ids.append(next(batches)["_seq"].tolist())
            loader.commit(True)
        batches.close()
        return ids

    def remote_run(name: str, **kw) -> tuple[list[list[int]], int]:
        ds = open_dataset(remote, storage_options=s3_bucket.storage_options,
                          cache=ChunkCache(str(tmp_path / name)))
        return run(ds, **kw), ds.row_groups.range_fetcher().row_groups

    ids, prefetched = remote_run("cache")
    same, none = remote_run("other", read_ahead=ReadAheadOptions(prefetch_bytes=0))
    assert ids == same == run(url)
    assert prefetched > 0 and none == 0


def test_the_decoded_cache_serves_a_live_run(url, tmp_path) -> None:
    def run():
        cache = DecodedDiskCache(str(tmp_path / "decoded"))
        ids = [(c, ids) for c, ids in _committed_ids(
            Job(_live(url, source=SourceOptions(decoded_cache=cache))))]
        return ids, cache.stats

    cold, cold_stats = run()
    warm, warm_stats = run()
    assert cold == warm
    assert cold_stats.misses > 0                           # decoded once, then shared
    assert warm_stats.hits > 0 and warm_stats.misses == 0   # a later run decodes nothing


def test_an_elastic_resume_of_a_live_state(url, reference) -> None:
    job = Job(_live(url))
    list(job.play())
    state = job.replicas[0][0].state_dict()
    assert (state["cursor"], state["step"]) == (70, 7)
    alone = _live(url)(ReplicaOptions(participants=lambda: (0, 1)))
    alone.load_state_dict(state)
    assert next(iter(alone))["_seq"].tolist() == reference[70:80]
    ranks = []
    for rank in range(2):
        plain = ZephonLoader(url, topology=Topology(B, world_size=2, rank=rank), order=OPTIONS,
                             batch=NUMPY_SEQ, stop=StopOptions(max_steps=1))
        plain.load_state_dict(state)
        ranks += next(iter(plain))["_seq"].tolist()
    assert sorted(ranks) == sorted(reference[70:80])


def _pid(batch: dict) -> dict:
    return {**batch, "pid": np.full(len(batch["_seq"]), os.getpid())}


def test_process_workers_make_each_quorum_shapes_batches(url, reference) -> None:
    """num_workers=2: each quorum shape's batches come from a DataLoader of 2 workers (the
    transform runs there; a replica that only watches a step starts none); the committed
    steps are the reference's, a step served again is the same batch."""
    plan = [([0, 1], True), ([0, 1], False), ([0, 1], True), ([1], True), ([1, 0], True)]
    job = Job(_live(url, batch=BatchOptions(with_seq=True, collate=as_numpy, transform=_pid),
                    workers=WorkerOptions(num_workers=2)))
    steps = list(job.play(plan, churn=False, replicas=2))
    committed = [(c, sorted(i for b in bs.values() for i in b["_seq"].tolist()))
                 for c, bs, ok in steps if ok]
    assert committed == [(c, sorted(reference[c:c + B])) for c in range(0, 4 * B, B)]
    pids = {int(p) for _, bs, _ in steps for b in bs.values() for p in b["pid"]}
    assert os.getpid() not in pids and len(pids) >= 2
    assert steps[1][1][1]["pid"] is steps[2][1][1]["pid"]          # served again: reused


def test_the_run_log_field_is_compatible_both_ways() -> None:
    seg = RunSegment(0, 0, B, 1, 0, "xxh3:00", OPTIONS, live=True)
    d = seg.to_dict()
    assert d["live"] is True and RunSegment.from_dict(d).live
    plain = seg.replace(live=False).to_dict()
    assert "live" not in plain and not RunSegment.from_dict(plain).live
    with pytest.raises(ValueError, match="live segment's world_size 1"):
        seg.replace(world_size=2)
    with pytest.raises(ValueError, match="live must be true or false"):
        seg.replace(live="yes")
