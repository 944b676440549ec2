"""A killed rank's loader workers end with it, whatever they are doing (issue 31).

A rank is a fresh process running a loader with 2 process workers; the test SIGKILLs it (a
preempted rank: no shutdown code runs) while its workers are in one of the states a real start
leaves them in, then polls until every worker process is gone. Without
``_util/parent_watch.py`` each case left its workers running: batches bigger than the result
pipe's 64 KiB block the exit of a worker that noticed (torch's DataLoader and the live
loader's; Grain's workers never look), and a worker whose read waits on S3 (a slow request, a
throttled one backing off) or on the node cache's per-object lock never reaches torch's
parent check.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import convert
from zephon_store._util.process import process_alive
from zephon_store.testing.s3_proxy import CountingProxy
from zephon_store.write.shardwriter import WriteOptions

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]
pytest.importorskip("torch")

GONE_WITHIN = 20.0    # seconds: a bound for a hang, not a speed claim (the watch polls at 0.5 s)

RANK = """
import json, sys
a = json.loads(sys.argv[1])
kw = dict(global_batch=a["batch"], seed=3, storage_options=a["so"], cache=a["cache"])
if a["front"] == "grain":
    from zephon_store.grain import ZephonIterDataset
    from zephon_store.load.options import StopOptions, WorkerOptions
    from zephon_store.order import Topology
    loader = ZephonIterDataset(a["url"], topology=Topology(a["batch"]), seed=3,
                               workers=WorkerOptions(num_workers=2), storage_options=a["so"],
                               cache=a["cache"])
elif a["front"] == "live":
    from zephon_store.torch import LiveZephonLoader
    loader = LiveZephonLoader(a["url"], participants=lambda: (0, 1), num_workers=2, **kw)
else:
    from zephon_store.torch import ZephonLoader
    loader = ZephonLoader(a["url"], num_workers=2, world_size=1, rank=0, **kw)
batches = iter(loader)
next(batches)
print("first", flush=True)
sys.stdin.readline()      # killed while waiting here
"""


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, ValueError):
                continue
    return out


def _lock_waiters() -> set[int]:
    """Processes blocked on a file lock (the ``->`` lines of /proc/locks)."""
    with open("/proc/locks") as f:
        return {int(line.split()[5]) for line in f if "->" in line.split()[1:2]}


def _wait(cond, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def _kill_rank_and_check_workers(rank: subprocess.Popen, workers: list[int]) -> None:
    """SIGKILL ``rank``; every one of its ``workers`` must be gone within GONE_WITHIN s."""
    assert len(workers) >= 2, workers
    rank.send_signal(signal.SIGKILL)
    rank.wait(30)
    deadline = time.monotonic() + GONE_WITHIN
    while any(map(process_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in workers if process_alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, (f"worker processes {left} of a SIGKILLed rank were still running "
                      f"{GONE_WITHIN:g} s later")


def _start_rank(url: str, *, front: str = "torch", batch: int = 16, so=None,
                cache=None) -> subprocess.Popen:
    args = json.dumps({"url": url, "front": front, "batch": batch, "so": so, "cache": cache})
    return subprocess.Popen([sys.executable, "-c", RANK, args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_batch(rank: subprocess.Popen) -> list[int]:
    line = rank.stdout.readline()
    if line.strip() != "first":
        rank.kill()
        pytest.fail(f"the rank did not make its first batch: {rank.stderr.read()[-3000:]}")
    return _children(rank.pid)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("orphans")
    write_jsonl_corpus(d / "src", files=2, records=2000, seed=6)
    return d / "src"


@pytest.fixture(scope="module")
def local_ds(corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("orphans_ds") / "ds")
    convert([str(corpus)], out, options=WriteOptions(row_group_rows=50))
    return out


@pytest.mark.parametrize("front", ["torch", "live", "grain"])
def test_workers_blocked_on_a_full_result_pipe_end_with_their_rank(local_ds, front):
    # 512 rows of text a batch (~100 KB pickled) fill the result pipe: a worker that noticed
    # its parent's death still hung in its exit, joining the queue's feeder thread.
    rank = _start_rank(local_ds, front=front, batch=512)
    workers = _first_batch(rank)
    time.sleep(1.0)      # the workers make their next batches and block on the full pipe
    _kill_rank_and_check_workers(rank, workers)


@pytest.fixture(scope="module")
def remote_ds(corpus, s3_server):
    """The corpus converted once to a bucket of this module: the tests only read it (each
    through its own proxy, with its own node cache)."""
    import s3fs

    bucket = f"t-{uuid.uuid4().hex[:16]}"
    fs = s3fs.S3FileSystem(**s3_server.storage_options(), skip_instance_cache=True)
    fs.mkdir(bucket)
    url = f"s3://{bucket}/ds"
    convert([str(corpus)], url, options=WriteOptions(target_shard_bytes=40 << 10,
                                                     row_group_bytes=6 << 10),
            storage_options=s3_server.storage_options())
    yield url
    with contextlib.suppress(Exception):
        fs.rm(bucket, recursive=True)


@pytest.fixture()
def remote(remote_ds, s3_server, tmp_path):
    with CountingProxy(s3_server.ports["s3"]) as proxy:
        so = s3_server.storage_options(proxy.endpoint_url(), read_timeout=120)
        yield remote_ds, so, str(tmp_path / "cache"), proxy


def test_workers_mid_request_end_with_their_rank(remote):
    url, so, cache, proxy = remote
    rank = _start_rank(url, so=so, cache=cache)
    workers = _first_batch(rank)
    proxy.latency(60.0)      # every request from now on is held a minute
    _wait(lambda: any(t > 0 for t, *_ in proxy.in_flight()), "a request held by the proxy")
    _kill_rank_and_check_workers(rank, workers)
    proxy.latency(0.0)


def test_workers_backing_off_under_throttling_end_with_their_rank(remote):
    url, so, cache, proxy = remote
    rank = _start_rank(url, so=so, cache=cache)
    workers = _first_batch(rank)
    proxy.reset()
    proxy.throttle(0.001)    # every request from now on answered 503 SlowDown
    _wait(lambda: any(r.status == 503 for r in proxy.snapshot()), "a request refused")
    _kill_rank_and_check_workers(rank, workers)


def test_workers_waiting_on_the_node_cache_lock_end_with_their_rank(remote):
    from zephon_store import open_dataset
    from zephon_store.io.cache import ChunkCache

    url, so, cache, proxy = remote
    m = open_dataset(url, storage_options=so, cache=False).manifest
    keys = {m.rg_xxh3(rg) for rg in range(len(m.rg_shard))}
    # A neighbour holds every row group's lock (as a rank fetching them would): the workers
    # wait for it before their first batch, and the rank is killed meanwhile.
    with ChunkCache(cache).claim_keys(keys) as held:
        assert held == keys
        rank = _start_rank(url, so=so, cache=cache)
        _wait(lambda: len(set(_children(rank.pid)) & _lock_waiters()) >= 2,
              "both workers waiting on a row group's lock")
        _kill_rank_and_check_workers(rank, _children(rank.pid))
