"""One rank of a start measurement; run by ``run.py``, not by hand.

Protocol on stdin/stdout, so that imports (torch alone takes seconds on a loaded machine) and
process start are outside every timing and every rank of a node starts at the same moment:
the child imports its system, prints ``ready``, waits for a ``go`` line, then builds its
loader (opening the dataset, and for a resume loading the state), takes the first batch
and prints one JSON line ``{"first_s": ..., "t_first": ...}`` (``t_first``: wall-clock time of
the first batch, for the node's "every rank has its first batch"). It then waits for any
line or EOF and exits without tearing the loader down (``os._exit``), so nothing it does
after the first batch depends on teardown code.

A failure prints ``{"error": ...}`` instead (a rank that failed, e.g. on throttling).

With ``START_BENCH_TRACE=1`` in its environment the line also holds ``trace``: wall-clock
times of the loader built (``t_built``) and iterated (``t_iter``), and the CPU seconds the
rank and its worker processes had used by the first batch (``cpu_rank``, ``cpu_workers``),
for finding where a node start's time goes (``run.py --trace``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from ..peers.common import SEED, import_streaming


def _preimport(system: str, a) -> None:
    import pyarrow as pa
    import torch  # noqa: F401

    pa.array([1]).to_numpy()
    if a.world > 1:
        # A node's ranks have their process group before the loader starts, as in training
        # (LitData takes world size and rank from it only; MosaicML would make one itself).
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.dist_port}",
                                world_size=a.world, rank=a.rank)
    if system == "zephon":
        import zephon_store.load.stream  # noqa: F401
        import zephon_store.torch  # noqa: F401
    elif system == "mosaic":
        import_streaming()
    elif system == "litdata":
        import litdata  # noqa: F401
    elif system == "hf":
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()


# ----------------------------------------------------------------------------- systems
# Each returns (keep-alive object, first batch). The batch is this rank's: ``a.batch`` samples.


def _cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0.0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return out


TRACE: dict = {}


def _mark(name: str) -> None:
    if os.environ.get("START_BENCH_TRACE"):
        TRACE[name] = time.time()


def zephon(a, creds: dict):
    from zephon_store import BatchOptions, SourceOptions, Topology, WorkerOptions, as_numpy
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    so = {"key": creds["key"], "secret": creds["secret"], "endpoint_url": a.endpoint}
    loader = ZephonLoader(a.url, topology=Topology(a.batch * a.world, a.world, a.rank,
                                                   ranks_per_node=a.world),
                          workers=WorkerOptions(num_workers=a.workers),
                          order=OrderOptions(seed=SEED, shuffle=True),
                          source=SourceOptions(storage_options=so, cache=a.cache),
                          batch=BatchOptions(collate=as_numpy))
    _mark("t_built")
    if a.cursor:
        loader.load_state_dict(dict(loader.state_dict(), cursor=a.cursor))
    it = iter(loader)
    _mark("t_iter")
    return (loader, it), next(it)


def litdata(a, creds: dict):
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader

    # As in benchmarks/peers/sys_litdata.py: obstore needs allow_http for an http endpoint.
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS,
                                          "allow_http": True}
    opts = {"endpoint_url": a.endpoint, "aws_access_key_id": creds["key"],
            "aws_secret_access_key": creds["secret"], "region_name": "us-east-1"}
    ds = StreamingDataset(a.url, cache_dir=a.cache, storage_options=opts, shuffle=True,
                          seed=SEED)
    dl = StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers)
    if a.cursor:
        dl.load_state_dict(litdata_state(dl, a.cursor))
    it = iter(dl)
    return (ds, dl, it), next(it)


def litdata_state(dl, cursor: int) -> dict:
    """What ``StreamingDataLoader.state_dict()`` returns after ``cursor`` samples of the
    first epoch, on one rank with this loader's workers and batch (checked against a real
    one: for litdata 0.2.76, the state a real loader saves after 7,808 samples of this
    corpus is equal to it, and both resume at the same batch)."""
    state = dl.state_dict()
    state["current_epoch"] = state["dataset"]["current_epoch"] = 1
    state["num_samples_yielded"] = state["dataset"]["num_samples_yielded"] = cursor
    state["dataset"]["sample_in_epoch"] = cursor
    state["latest_worker_idx"] = (cursor // dl.batch_size - 1) % max(1, dl.num_workers)
    return state


def mosaic(a, creds: dict):
    # MosaicML builds its boto3 client from the environment (as benchmarks/peers does).
    os.environ.update(S3_ENDPOINT_URL=a.endpoint, AWS_ACCESS_KEY_ID=creds["key"],
                      AWS_SECRET_ACCESS_KEY=creds["secret"])
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    streaming = import_streaming()
    ds = streaming.StreamingDataset(remote=a.url, local=a.cache, batch_size=a.batch,
                                    shuffle=True, shuffle_seed=SEED)
    dl = streaming.StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers)
    _mark("t_built")
    if a.cursor:
        dl.load_state_dict(ds.state_dict(a.cursor, True))
    it = iter(dl)
    _mark("t_iter")
    return (ds, dl, it), next(it)


def hf(a, creds: dict):
    """HF datasets streaming the Parquet file (shuffle: shard order plus a 1,000-sample
    buffer, its streaming shuffle; a node: ``split_dataset_by_node``)."""
    import datasets
    from datasets.distributed import split_dataset_by_node
    from torch.utils.data import DataLoader

    so = {"key": creds["key"], "secret": creds["secret"], "endpoint_url": a.endpoint}
    ids = datasets.load_dataset("parquet", data_files=a.url, split="train", streaming=True,
                                storage_options=so, cache_dir=a.cache)
    ids = ids.shuffle(seed=SEED, buffer_size=1000).with_format("numpy")
    if a.world > 1:
        ids = split_dataset_by_node(ids, rank=a.rank, world_size=a.world)
    dl = DataLoader(ids, batch_size=a.batch, num_workers=a.workers)
    it = iter(dl)
    return (ids, dl, it), next(it)


SYSTEMS = {"zephon": zephon, "litdata": litdata, "mosaic": mosaic, "hf": hf}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    ap.add_argument("--url", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cursor", type=int, default=0)
    ap.add_argument("--dist-port", type=int, default=0)
    a = ap.parse_args()
    creds = json.loads(os.environ["START_BENCH_S3"])
    try:
        _preimport(a.system, a)
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"error": f"import: {exc!r}"}), flush=True)
        os._exit(1)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        os._exit(2)
    t0 = time.perf_counter()
    _mark("t_go")
    cpu0 = _cpu(os.getpid())
    try:
        keep, batch = SYSTEMS[a.system](a, creds)
        first = time.perf_counter() - t0
        t_first = time.time()
        n = len(next(iter(batch.values()))) if isinstance(batch, dict) else len(batch)
        out = {"first_s": round(first, 4), "t_first": t_first, "samples": n}
        if os.environ.get("START_BENCH_TRACE"):
            kids = _children(os.getpid())
            out["trace"] = {**TRACE, "cpu_rank": round(_cpu(os.getpid()) - cpu0, 3),
                            "cpu_workers": [round(_cpu(k), 3) for k in kids]}
    except Exception as exc:  # noqa: BLE001
        tb = traceback.format_exc().strip().splitlines()
        out = {"error": f"{type(exc).__name__}: {exc}"[:400], "trace": tb[-3:],
               "t_first": time.time()}
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
