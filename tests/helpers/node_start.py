"""A simulated node start against S3 behind the counting proxy, shared by the start tests.

A node is ``ranks`` fresh processes (from a fork server that has imported torch) sharing one cache folder, each a
``ZephonLoader`` with ``workers`` DataLoader workers talking to the proxy on its own port (the
proxy's label ``r`` is rank ``r``), all released at once after they have imported; the node is
done when every rank has its first batch. The proxy's log is reset at that release, so what it
holds afterwards is the node's start and nothing of the imports.

>>> start = node_start(url, bucket, proxy, cache, ranks=4, workers=2)   # doctest: +SKIP
>>> sorted(start.firsts), len(start.requests)                            # doctest: +SKIP
([0, 1, 2, 3], 7)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.helpers import write_jsonl_corpus
from zephon_store import convert
from zephon_store.testing.s3_proxy import CountingProxy
from zephon_store.write.shardwriter import WriteOptions

OPTS = WriteOptions(target_shard_bytes=40 << 10, row_group_bytes=6 << 10)
BATCH = 4            # samples per rank per step
METADATA = re.compile(r"/(manifest\.json|index/[0-9a-f]{32}\.arrow)$")


def start_corpus(directory):
    """The start tests' corpus (2 files of 400 records) in ``directory / "src"``, its path."""
    write_jsonl_corpus(directory / "src", files=2, records=400, seed=4)
    return directory / "src"


@contextlib.contextmanager
def behind_proxy(corpus, bucket, *, labels: int) -> Iterator[tuple[str, CountingProxy]]:
    """``corpus`` converted with ``OPTS`` to ``<bucket>/ds`` (``bucket``: the ``s3_bucket``
    fixture), and a counting proxy with ``labels`` labels in front of its server; yields
    ``(url, proxy)``."""
    url = f"{bucket.url}/ds"
    convert([str(corpus)], url, options=OPTS, storage_options=bucket.storage_options)
    server = bucket.server
    port = server.ports["s3"] if hasattr(server, "ports") else server.port   # S3 or GCS
    with CountingProxy(port, labels=labels) as proxy:
        yield url, proxy


@dataclass
class NodeStart:
    """What a node start left: per rank, when it had its first batch (on the proxy's clock)
    and that batch's sample ids (``with_seq`` loaders only, else None); the proxy's requests
    until the last rank had its batch; the seconds that took (printed, never asserted)."""

    firsts: dict[int, float] = field(default_factory=dict)
    ids: dict[int, list[int] | None] = field(default_factory=dict)
    requests: list = field(default_factory=list)
    seconds: float = 0.0


def _context():
    """Fresh rank processes, forked from a server that has imported torch and the loader once.

    A rank under torchrun is a new interpreter; what it does before its first request is import
    torch and zephon_store, which is no part of what these tests count (the proxy's log starts
    after every rank has imported). Spawned, each of 8 ranks imported torch on its own: ~30 s
    of a 2-core machine per node start (test_start_s3's three node shapes took 34-87 s; from
    the server, 5 s). The server holds no S3 client, thread or cache state: each rank builds
    its own after the fork, as a spawned one did.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "zephon_store.torch"])
    return ctx


def _rank(url: str, so: dict, cache: str, rank: int, ranks: int, workers: int, cursor: int,
          loader_kwargs: dict, barrier, results) -> None:
    """One rank of the node: import, wait for the others, then take the first batch."""
    try:
        from zephon_store.order import OrderOptions
        from zephon_store.torch import ZephonLoader

        barrier.wait(120)
        loader = ZephonLoader(url, global_batch=BATCH * ranks, world_size=ranks, rank=rank,
                              ranks_per_node=ranks, num_workers=workers,
                              order=OrderOptions(seed=3), storage_options=so, cache=cache,
                              collate=None, **loader_kwargs)
        if cursor:
            loader.load_state_dict(dict(loader.state_dict(), cursor=cursor))
        batch = next(iter(loader))
        ids = sorted(int(s) for s in batch["_seq"]) if loader_kwargs.get("with_seq") else None
        results.put((rank, time.monotonic(), ids, None))
        barrier.wait(120)   # keep every rank (and its workers) alive until all are done
    except Exception as exc:   # noqa: BLE001 - reported to the test, which fails on it
        results.put((rank, None, None, f"{type(exc).__name__}: {exc}"))
        barrier.abort()


def node_start(url: str, bucket, proxy: CountingProxy, cache: str, *, ranks: int, workers: int,
               cursor: int = 0, **loader_kwargs) -> NodeStart:
    """Start a node of ``ranks`` x ``workers`` on ``url`` (``bucket``: the ``s3_bucket``
    fixture) through ``proxy`` (one label per rank), from ``cursor``; ``loader_kwargs`` go to
    every rank's ``ZephonLoader``. Fails the test naming every rank that raised."""
    ctx = _context()
    barrier, results = ctx.Barrier(ranks + 1), ctx.Queue()
    procs = [ctx.Process(target=_rank, daemon=False, args=(
        url, bucket.options_via(proxy.endpoint_url(r), read_timeout=10), cache, r, ranks,
        workers, cursor, loader_kwargs, barrier, results)) for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        barrier.wait(180)   # every rank has imported torch and zephon_store
        proxy.reset()
        t0 = time.monotonic()
        got = [results.get(timeout=180) for _ in range(ranks)]
        seconds = time.monotonic() - t0
        reqs = proxy.snapshot()
        errors = [f"rank {r}: {err}" for r, _, _, err in got if err]
        assert not errors, errors
        barrier.wait(60)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return NodeStart(firsts={r: proxy.clock(t) for r, t, _, _ in got},
                     ids={r: ids for r, _, ids, _ in got}, requests=reqs, seconds=seconds)
