"""A three-source mixture under real ``torchrun`` (gloo, CPU), across restarts, with DCP.

Sources: ``web`` and ``code`` local, ``books`` on the local SeaweedFS S3 server (its own
storage options in the mixture file). The run starts with two stages and appends a third
at the second restart; world size, global batch and ``num_workers`` change at each restart:

- phase 1: 2 ranks, global batch 12, threads, 10 steps (cursor 0 -> 120), ``dcp.save``;
- phase 2: 3 ranks, global batch 18, 2 worker processes, the three-stage mixture file (the
  new stage starts at sample 200, after the checkpoint's cursor), 8 steps (-> 264);
- phase 3: 1 rank, global batch 8, threads, 6 steps (-> 312).

Every rank logs each step's ``_source`` and ``_seq`` (``zephon_store.testing.elastic_worker``).
The job's (source, id) sequence, ranks concatenated in rank order, must equal the
uninterrupted single-process run with the final three-stage schedule, position by position.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

import zephon_store as z
from tests.helpers import ROOT, write_jsonl_corpus
from zephon_store.torch import ZephonLoader

pytestmark = pytest.mark.integration

WORKER = "zephon_store.testing.elastic_worker"
SEED = 3
TIMEOUT = 150
STAGES = [("warm", 0, {"web": 0.5, "code": 0.25, "books": 0.25}),
          ("main", 60, {"web": "1/3", "code": "1/3", "books": "1/3"})]
APPENDED = ("anneal", 200, {"web": 0.1, "code": 0.3, "books": 0.6})


def _convert(root: str, url: str, records: int, storage_options=None) -> str:
    raw = os.path.join(root, f"raw-{records}")
    write_jsonl_corpus(raw, files=1, records=records, seed=records)
    z.convert(sorted(glob.glob(os.path.join(raw, "*.jsonl"))), url,
              options=z.WriteOptions(row_group_rows=20, target_shard_bytes=1 << 14,
                                     row_group_bytes=None),
              storage_options=storage_options, progress=False)
    return url


def _mixture_file(path: str, urls: dict, stages, storage_options: dict) -> str:
    doc = {"stages": [{"name": n, "start": {"samples": s}} for n, s, _ in stages],
           "sources": [{"name": k, "url": u, "weights": {n: w.get(k, 0) for n, _, w in stages},
                        **({"storage_options": storage_options} if k == "books" else {})}
                       for k, u in urls.items()]}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def _env(cache: str) -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", ZEPHON_CACHE_DIR=cache)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, e.get("PYTHONPATH")]))
    return e


def _phase(env: dict, nproc: int, mix: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", WORKER, mix, "--seed", str(SEED), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"


def _read(log_dir: str, tag: str):
    """(the phase's (source, id) sequence, its step cursors, its loaded and saved states)."""
    steps: dict[int, dict[int, list[tuple[int, int]]]] = {}
    loaded, saved = [], []
    paths = sorted(glob.glob(os.path.join(log_dir, f"{tag}.rank*.jsonl")))
    for path in paths:
        with open(path) as f:
            for rec in map(json.loads, f):
                if rec.get("event") == "loaded":
                    loaded.append(rec["state"])
                elif rec.get("event") == "saved":
                    saved.append(rec["state"])
                elif "ids" in rec:
                    steps.setdefault(rec["cursor"], {})[rec["rank"]] = list(
                        zip(rec["sources"], rec["ids"]))
    seq = []
    for cursor in sorted(steps):
        ranks = steps[cursor]
        assert sorted(ranks) == list(range(len(paths))), (tag, cursor, sorted(ranks))
        seq += [p for r in range(len(paths)) for p in ranks[r]]
    return seq, sorted(steps), loaded, saved


def test_mixture_restarts_with_an_appended_stage_consume_the_uninterrupted_stream(
        s3_bucket, tmp_path) -> None:
    root = str(tmp_path)
    urls = {"web": _convert(root, os.path.join(root, "web"), 300),
            "code": _convert(root, os.path.join(root, "code"), 90),
            "books": _convert(root, f"{s3_bucket.url}/books", 200, s3_bucket.storage_options)}
    so = s3_bucket.storage_options
    mix2 = _mixture_file(os.path.join(root, "mix2.json"), urls, STAGES, so)
    mix3 = _mixture_file(os.path.join(root, "mix3.json"), urls, [*STAGES, APPENDED], so)
    env, logs = _env(os.path.join(root, "cache")), os.path.join(root, "logs")
    ck1, ck2 = os.path.join(root, "ck1"), os.path.join(root, "ck2")
    _phase(env, 2, mix2, "--global-batch", "12", "--steps", "10", "--save", ck1,
           "--log-dir", logs, "--tag", "p1")
    _phase(env, 3, mix3, "--global-batch", "18", "--steps", "8", "--num-workers", "2",
           "--load", ck1, "--save", ck2, "--log-dir", logs, "--tag", "p2")
    _phase(env, 1, mix3, "--global-batch", "8", "--steps", "6", "--load", ck2,
           "--log-dir", logs, "--tag", "p3")

    p1, c1, _, saved1 = _read(logs, "p1")
    p2, c2, loaded2, saved2 = _read(logs, "p2")
    p3, c3, loaded3, _ = _read(logs, "p3")
    assert (c1[0], c2[0], c3[0], c3[-1] + 8) == (0, 120, 264, 312)

    def stages(state):
        return json.loads(state["mixture"])["schedule"]["stages"]

    # Phase 1 saved two stages; phase 2 loaded them and appended the third from the
    # consumed counts at sample 200; phase 3 resumed that three-stage schedule unchanged.
    # Every rank of a phase held the same replicated state.
    assert [len(stages(s)) for s in saved1] == [2, 2]
    for states in (loaded2, saved2, loaded3):
        assert all(s == states[0] for s in states) and states[0]["version"] == 2
        assert [st["name"] for st in stages(states[0])] == ["warm", "main", "anneal"]
    assert stages(loaded2[0])[:2] == stages(saved1[0])
    assert stages(loaded3[0]) == stages(saved2[0])
    job = p1 + p2 + p3

    ref_loader = ZephonLoader(mix3, global_batch=8, seed=SEED, world_size=1, rank=0,
                              max_steps=39, with_seq=True)
    ref = [p for b in ref_loader for p in zip(b["_source"].tolist(), b["_seq"].tolist())]
    assert len(job) == len(ref) == 312
    assert job == ref
    # All three sources, the S3 one included, were read in every phase.
    for part in (p1, p2, p3):
        assert {k for k, _ in part} == {0, 1, 2}
    # The S3 source's row groups went through the node's disk cache (local sources are
    # read in place).
    cached = [f for _, _, fs in os.walk(os.path.join(root, "cache")) for f in fs]
    assert cached
