#!/usr/bin/env python3
"""The main job, end to end, on an embedded default (``make demo``).

1. corpus: the Python standard library's sources as JSONL.zst (present on every machine);
2. convert (2 workers), verify --deep, info, get: on local disk;
3. a local S3 server (SeaweedFS on 127.0.0.1): convert to it, verify it, stream the loader
   from it and check it yields exactly what the local copy yields;
4. elastic resume: torchrun W=4 consumes steps and checkpoints (DCP), resumes with W=3 and
   another num_workers, and proves it exactly-once with the audit of the run log both
   phases appended (``zephon audit``; ``zephon trace`` equals what every rank logged).

Exits non-zero if any step fails. Work files go to ``.demo/`` (or ``--workdir``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as a script from a checkout without an installed package

from zephon_store.cli.main import main as zephon  # noqa: E402


def step(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def run_cli(*args: str) -> None:
    print("$ zephon " + " ".join(args), flush=True)
    code = zephon(list(args))
    if code != 0:
        raise SystemExit(f"demo: 'zephon {' '.join(args)}' exited {code}")


def stream_ids_and_bytes(url: str, storage_options=None, steps: int = 6):
    """(ids, digest of the text bytes) of a shuffled single-process stream."""
    import hashlib

    import numpy as np

    from zephon_store import BatchOptions, SourceOptions, StopOptions, Topology
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    loader = ZephonLoader(url, topology=Topology(32), order=OrderOptions(seed=11),
                          source=SourceOptions(storage_options=storage_options),
                          batch=BatchOptions(columns=("path", "text"), with_seq=True),
                          stop=StopOptions(max_steps=steps))
    ids, h = [], hashlib.sha256()
    for batch in loader:
        ids.append(batch["_seq"].numpy())
        for t in batch["text"]:
            h.update(t.encode())
    return np.concatenate(ids).tolist(), h.hexdigest(), loader.dataset.storage.stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=os.path.join(ROOT, ".demo"))
    ap.add_argument("--skip-s3", action="store_true")
    ap.add_argument("--skip-elastic", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    work = a.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    raw, local = os.path.join(work, "raw"), os.path.join(work, "ds")
    # A fresh node-local cache, so the S3 step shows real fetches (the cache is keyed by
    # content hash and would otherwise serve a previous demo's identical bytes).
    os.environ["ZEPHON_CACHE_DIR"] = os.path.join(work, "cache")

    step("1. corpus: the Python standard library as JSONL.zst")
    from zephon_store.testing.corpus import write_corpus

    paths = write_corpus(raw, files=8)
    print(f"{len(paths)} files, {sum(os.path.getsize(p) for p in paths) / 1e6:.1f} MB compressed")

    step("2. convert, verify, info, get (local)")
    run_cli("convert", raw, "--output", local, "--workers", "2", "--target-shard-size", "8MiB")
    run_cli("verify", local, "--deep")
    run_cli("info", local)
    print("$ zephon get", local, "0 1000 --json  (text cut to 60 chars)", flush=True)
    from zephon_store import open_dataset

    ds = open_dataset(local)
    for row in ds.take([0, 1000]).to_pylist():
        print(json.dumps({**row, "text": row["text"][:60] + "..."}))

    s3_url = so = None
    if not a.skip_s3:
        step("3. a local S3 server: convert to it, verify it, stream from it")
        from zephon_store.testing.s3_server import SeaweedServer

        server = SeaweedServer().start()
        try:
            so = server.storage_options()
            import s3fs

            s3fs.S3FileSystem(**so).mkdir("zephon-demo")
            print(f"SeaweedFS S3 at {server.endpoint_url} (127.0.0.1 only)")
            s3_url = "s3://zephon-demo/ds"
            so_json = json.dumps(so)
            run_cli("convert", raw, "--output", s3_url, "--workers", "2", "--target-shard-size",
                    "8MiB", "--storage-options", so_json, "--json")
            run_cli("verify", s3_url, "--storage-options", so_json)
            local_ids, local_digest, _ = stream_ids_and_bytes(local)
            s3_ids, s3_digest, stats = stream_ids_and_bytes(s3_url, so)
            same = local_ids == s3_ids and local_digest == s3_digest
            print(f"streamed {len(s3_ids)} samples from S3 in {stats.requests} ranged GETs "
                  f"({stats.bytes_fetched / 1e6:.1f} MB); identical to local: {same}")
            if not same:
                raise SystemExit("demo: S3 stream differs from the local stream")
            if not a.skip_elastic:
                elastic(local, s3_url, so, work)
        finally:
            server.stop()
    elif not a.skip_elastic:
        elastic(local, None, None, work)
    step(f"done in {time.time() - t0:.0f} s: every step passed")
    return 0


def elastic(local: str, s3_url: str | None, so: dict | None, work: str) -> None:
    step("4. elastic resume: torchrun W=4 -> checkpoint -> W=3 with 2 workers")
    url = s3_url or local
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "elastic_demo.py"), url,
           "--workdir", os.path.join(work, "elastic")]
    if so:
        cmd += ["--storage-options", json.dumps(so)]
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


if __name__ == "__main__":
    sys.exit(main())
