"""Elastic restarts under real ``torchrun`` + gloo, checkpointed with DCP.

One job over a shuffled dataset (2,000 samples, 40 row groups, global batch 12):

- phase 1: ``--nproc_per_node=2``, thread path, 40 steps, ``dcp.save``;
- phase 2: ``--nproc_per_node=3``, ``num_workers=2``, ``dcp.load``, 140 steps (crosses the
  epoch boundary at position 2,000), ``dcp.save``;
- phase 3: from phase 2's checkpoint, once at ``--nproc_per_node=1`` and once at
  ``--nproc_per_node=4`` (the two launches run side by side), 30 steps each.

Every phase appends its segment to the run log (``zephon_store.testing.elastic_worker``,
the module the demo runs), the one record of what the job consumed: the library's audit of
it (``RunContext.audit``, what ``zephon audit`` runs) proves each sample exactly once per
epoch, with no gap or overlap at either restart. The run log records positions, not the
ids the batches actually held, so every rank also logs each step's delivered ``_seq`` ids:
they must equal the run log's trace rank by rank, and, step by step, the same step of an
uninterrupted single-process run computed here (the proof compares the actual consumed
sequence, not only the log's account of it). A second test runs ``scripts/elastic_demo.py``
against a dataset on a real S3 server.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, opened, small_dataset
from tests.helpers.stateful import Step, assert_matches_reference, reference_ids
from zephon_store.order import Order, OrderOptions
from zephon_store.read.dataset import open_dataset
from zephon_store.runs.accounting import RunContext
from zephon_store.torch import ZephonLoader

pytestmark = pytest.mark.integration

WORKER = "zephon_store.testing.elastic_worker"
DEMO = os.path.join(ROOT, "scripts", "elastic_demo.py")
B = 12
N = 2000
SEED = 7
# lanes=5040 with window_blocks=2 over 40 blocks gives 20 lanes: W=2 and W=4 read whole
# lanes, W=1 and W=3 plain slices, so both assignment modes cross a restart.
WINDOW_BLOCKS = 2
LANES = 5040
OPTIONS = OrderOptions(seed=SEED, window_blocks=WINDOW_BLOCKS, lanes=LANES)
LAUNCH_TIMEOUT = 150


def env() -> dict:
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, e.get("PYTHONPATH")]))
    return e


def launch(nproc: int, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", WORKER, *args]
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc: subprocess.Popen) -> None:
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"torchrun timed out after {LAUNCH_TIMEOUT} s:\n{out[-6000:]}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{out[-6000:]}"


def run_phase(nproc: int, *args: str) -> None:
    finish(launch(nproc, *args))


def read_log(log_dir: str, tag: str) -> tuple[list[Step], list[dict], list[dict]]:
    """(steps, loaded events, saved events) of one phase, from every rank's JSONL."""
    per_cursor: dict[int, dict[int, list[int]]] = {}
    meta: dict[int, dict] = {}
    loaded, saved = [], []
    paths = sorted(glob.glob(os.path.join(log_dir, f"{tag}.rank*.jsonl")))
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for rec in map(json.loads, f):
                if rec.get("event") == "loaded":
                    loaded.append(rec)
                elif rec.get("event") == "saved":
                    saved.append(rec)
                else:
                    assert rec["ids"] and len(rec["ids"]) == B // rec["world_size"]
                    per_cursor.setdefault(rec["cursor"], {})[rec["rank"]] = rec["ids"]
                    meta[rec["cursor"]] = rec
    steps = []
    for cursor in sorted(per_cursor):
        rec, ranks = meta[cursor], per_cursor[cursor]
        assert sorted(ranks) == list(range(rec["world_size"])), \
            f"{tag}: step at cursor {cursor} logged by ranks {sorted(ranks)}"
        steps.append(Step(cursor, rec["global_batch"], rec["world_size"], rec["num_workers"],
                          [ranks[r] for r in range(rec["world_size"])]))
    assert len(paths) == (steps[0].world_size if steps else len(paths))
    return steps, loaded, saved


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory) -> str:
    url = small_dataset(str(tmp_path_factory.mktemp("elastic")), files=4, records=500,
                        row_group_rows=50)
    opened(url, samples=N, row_groups=40)
    return url


def test_restarts_across_world_sizes_and_workers_consume_the_single_process_stream(
        dataset_url, tmp_path) -> None:
    logs, ck1, ck2 = str(tmp_path / "logs"), str(tmp_path / "ck1"), str(tmp_path / "ck2")
    run_log = str(tmp_path / "run.jsonl")
    common = [dataset_url, "--global-batch", str(B), "--seed", str(SEED), "--window-blocks",
              str(WINDOW_BLOCKS), "--lanes", str(LANES), "--log-dir", logs]
    run_phase(2, *common, "--steps", "40", "--save", ck1, "--tag", "p1", "--run-log", run_log)
    run_phase(3, *common, "--steps", "140", "--num-workers", "2", "--load", ck1,
              "--save", ck2, "--tag", "p2", "--run-log", run_log)
    # The two phase-3 launches run side by side from one checkpoint: each continues its
    # own copy of the run log.
    tails = {}
    for tag in ("p3w1", "p3w4"):
        tails[tag] = str(tmp_path / f"{tag}.jsonl")
        shutil.copyfile(run_log, tails[tag])
    p3 = [launch(1, *common, "--steps", "30", "--load", ck2, "--tag", "p3w1",
                 "--run-log", tails["p3w1"]),
          launch(4, *common, "--steps", "30", "--load", ck2, "--tag", "p3w4",
                 "--run-log", tails["p3w4"])]
    for proc in p3:
        finish(proc)

    # DCP stored each replicated value once (no per-rank keys) and every rank of every
    # later world size loaded the same state.
    from torch.distributed.checkpoint import FileSystemReader

    keys = set(FileSystemReader(ck1).read_metadata().state_dict_metadata)
    assert keys == {f"loader.{k}" for k in ("version", "dataset_id", "seed", "cursor",
                                            "step")} | {
        f"loader.order.{k}" for k in OPTIONS.to_dict()}

    p1, _, saved1 = read_log(logs, "p1")
    p2, loaded2, saved2 = read_log(logs, "p2")
    p3w1, loaded3w1, _ = read_log(logs, "p3w1")
    p3w4, loaded3w4, _ = read_log(logs, "p3w4")
    assert [len(p1), len(p2), len(p3w1), len(p3w4)] == [40, 140, 30, 30]
    assert {s.world_size for s in p2} == {3} and {s.num_workers for s in p2} == {2}
    assert {r["state"]["cursor"] for r in saved1} == {40 * B} and len(saved1) == 2
    assert [r["state"] for r in loaded2] == [saved1[0]["state"]] * 3
    assert {r["state"]["cursor"] for r in saved2} == {180 * B}
    assert [r["state"] for r in loaded3w1] == [saved2[0]["state"]]
    assert [r["state"] for r in loaded3w4] == [saved2[0]["state"]] * 4

    ds = open_dataset(dataset_url)

    def make(*, world_size, rank, num_workers, global_batch):
        return ZephonLoader(ds, global_batch=global_batch, order=OPTIONS,
                            world_size=world_size, rank=rank, num_workers=num_workers,
                            with_seq=True)

    reference = reference_ids(make, global_batch=B, samples=210 * B)
    assert Order(ds.manifest.rg_rows, OPTIONS).effective_lanes == 20

    for tag, tail in (("p3w1", p3w1), ("p3w4", p3w4)):
        job = p1 + p2 + tail
        # The run log is the record: three segments, and the library's audit of it finds
        # each sample once in the complete epoch, nothing repeated or skipped at a restart.
        ctx = RunContext(dataset_url, tails[tag])
        assert [(s.first_step, s.cursor, s.world_size, s.num_workers)
                for s in ctx.segments] == [(0, 0, 2, 0), (40, 40 * B, 3, 2),
                                           (180, 180 * B, tail[0].world_size, 0)]
        report = ctx.audit(end_step=210)
        assert report.ok, report.to_dict()
        assert report.positions == 210 * B and not [e for e in report.events if e.failure]
        complete = [e for e in report.epochs if e.complete]
        assert [(e.epoch, e.once) for e in complete] == [(0, N)]
        # What the batches held: rank by rank, the run log's trace; step by step, the
        # uninterrupted single-process run; the cursors chain across both restarts.
        traced = ctx.trace(range(210), end_step=210)
        assert [(t.cursor, t.ranks) for t in traced] == [(s.cursor, s.ids) for s in job]
        assert_matches_reference(job, reference)
        assert job[0].cursor == 0 and job[-1].cursor == 209 * B
        consumed = [i for s in job for r in s.ids for i in r]
        assert sorted(consumed) == sorted(reference)  # no repeat, no drop
    # The epoch boundary (position 2000) fell inside phase 2, with worker processes.
    assert p2[0].cursor < N < p2[-1].cursor


def test_elastic_demo_proves_the_resume_on_s3(s3_bucket, tmp_path) -> None:
    import zephon_store as z
    from tests.helpers import write_jsonl_corpus

    write_jsonl_corpus(tmp_path / "raw", files=2, records=150)
    url = f"{s3_bucket.url}/ds"
    z.convert(sorted(glob.glob(str(tmp_path / "raw" / "*.jsonl"))), url,
              options=z.WriteOptions(target_shard_bytes=1 << 14, row_group_rows=20,
                                     row_group_bytes=None),
              storage_options=s3_bucket.storage_options)
    e = env()
    e["ZEPHON_CACHE_DIR"] = str(tmp_path / "cache")
    cmd = [sys.executable, DEMO, url, "--storage-options", json.dumps(s3_bucket.storage_options),
           "--steps1", "8", "--workdir", str(tmp_path / "work"), "--json"]
    proc = subprocess.run(cmd, env=e, capture_output=True, text=True,
                          timeout=2 * LAUNCH_TIMEOUT + 60)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    proof = json.loads(proc.stdout)
    assert proof["ok"] and proof["repeats"] == 0 and proof["drops"] == 0
    assert proof["mismatched_steps"] == 0 and proof["loaded_cursors"] == [8 * B]
    assert proof["epochs_crossed"] >= 1 and proof["complete_epochs_checked"] >= 1
    assert proof["samples"] == proof["expected_samples"] == proof["steps"] * B
