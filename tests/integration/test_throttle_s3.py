"""A node's shared request rate under a throttling store, counted in refusals (issue 31,
Done-when; on S3, GCS and Azure since issue 44).

``READERS`` processes share one node cache folder, as the ranks and workers of a node do, and
each reads ``READS`` objects one after the other through the storage layer the loader reads
with (``Storage.read_range``: one ranged GET per attempt, retried under ``RetryPolicy``,
waiting on and reporting to the node's ``NodeThrottle``), all released at once, against
SeaweedFS behind a proxy that serves ``RATE`` requests per second, at most one at a time (a
token bucket of one), and answers every request beyond that 503 SlowDown. Each read has an
object of its own, so the proxy's records say how often each read was refused.

A node start makes too few requests (~13) to tell a shared rate from a broken one; this
makes 16 at once, each process's next one right after its last. What separates them here is
the number of refusals: processes backing off alone each retry after their own ~0.1 s and
keep the node's request rate far above the store's, so they are refused several times per
request served; a node whose processes take send slots at one shared, adaptive rate is
refused for its first burst and about once per probe of the rate afterwards (numbers at
``MAX_REFUSED_PER_SERVED``). Time is printed, not asserted (the machine's load changes it);
the time the schedule itself takes is asserted on a simulated clock in
tests/unit/io/test_throttle_rate.py, which also covers a rate decreased by every refusal.

To see the test fail, set ``ZEPHON_BROKEN_BACKOFF`` to one of ``BROKEN``: ``alone`` (no node
throttle: each process backs off alone, as without a cache folder), ``alone-unjittered`` (the
same, its retries without jitter) or ``unpaced`` (the node's rate is kept, but its requests
are not spaced by it: they go together, as the old shared pause's did without its jitter).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter

import pytest

from zephon_store.io.retry import RetryPolicy
from zephon_store.io.throttle import AdaptiveRate
from zephon_store.testing.s3_proxy import CountingProxy, summarize

pytestmark = pytest.mark.integration

READERS = 8          # the processes of the node
READS = 2            # objects each reads, one after the other
RATE = 4.0           # requests per second the store serves
SIZE = 4096          # bytes per object
BROKEN = ("alone", "alone-unjittered", "unpaced")
# Refusals per read (each served once). Measured on this 2-core host under load, 2026-12-03,
# 8 readers x 2 reads at 4/s, bucket of 1: the shared rate 0.31-0.75 (5-12 of 16, 7 of them
# the first burst's) in 5.1-5.6 s (requests / rate: 4 s; the shared pause before it, 10-11 in
# 20-23 s); alone 4.3 (68) in 7.3 s, its retries unjittered 4.1 (65) in 27 s; unpaced 3.8
# (61). The bound sits 2.7x above the working node and 1.9x below the broken ones.
MAX_REFUSED_PER_SERVED = 2.0
# RetryPolicy's documented schedule (docs/storage.md): about 25 attempts in its 60 s deadline.
MAX_ATTEMPTS_PER_READ = 25


class _Unpaced(AdaptiveRate):
    """Broken: the node's rate drops, but its requests are not spaced by it."""

    def interval(self, rate: float) -> float:
        return 0.0


def _reader(url: str, so: dict, cache: str, mode: str, keys: list[str], barrier,
            results) -> None:
    """One process of the node: make its client, wait for the others, read its objects."""
    try:
        from zephon_store.io.storage import Storage
        from zephon_store.io.throttle import NodeThrottle

        policy = _Unpaced() if mode == "unpaced" else None
        throttle = None if mode.startswith("alone") else NodeThrottle(cache, policy=policy)
        retry = RetryPolicy(jitter=mode != "alone-unjittered")
        storage = Storage(url, storage_options=so, retry=retry, throttle=throttle)
        storage.fs   # noqa: B018 - the client is made before the start, as a rank's is
        barrier.wait(120)
        got = [storage.read_range(k, 0, SIZE, what=k) for k in keys]
        decreases = throttle.decreases if throttle is not None else 0
        results.put(([bytes(b[:1]) * len(b) == b for b in got], None, decreases))
    except Exception as exc:   # noqa: BLE001 - reported to the test, which fails on it
        results.put((None, f"{type(exc).__name__}: {exc}", 0))
        barrier.abort()


def _node(url: str, so: dict, cache: str, proxy: CountingProxy, mode: str) -> tuple[list, list]:
    """Run the node's readers, released together; returns (what each reported, the proxy's
    records from the release on)."""
    # Forked: the readers start in milliseconds (spawning 8 costs seconds of imports); each
    # makes its own S3 client (Storage.fs is per process).
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(READERS + 1), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(
        url, so, cache, mode, [f"obj/{p}-{i}" for i in range(READS)], barrier, results))
        for p in range(READERS)]
    for p in procs:
        p.start()
    try:
        proxy.reset()       # before the release: the readers' first requests are in the log
        barrier.wait(120)
        got = [results.get(timeout=300) for _ in range(READERS)]
        reqs = proxy.snapshot()
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return got, reqs


@pytest.fixture(params=["s3", "gcs", "az"])
def bucket(request):
    """A fresh bucket on each object store: the shared rate knows no store (429/503 are
    throttles wherever they come from)."""
    return request.getfixturevalue(f"{request.param}_bucket")


def test_throttled_node_is_refused_less_than_served(bucket, tmp_path):
    from zephon_store.io.storage import Storage

    mode = os.environ.get("ZEPHON_BROKEN_BACKOFF", "shared")
    assert mode in ("shared", *BROKEN), f"ZEPHON_BROKEN_BACKOFF={mode!r}: use one of {BROKEN}"
    st = Storage(f"{bucket.url}/ds", storage_options=bucket.storage_options)
    for p in range(READERS):
        for i in range(READS):
            st.write_atomic(f"obj/{p}-{i}", bytes([p * READS + i]) * SIZE)
    server = bucket.server
    with CountingProxy(server.ports["s3"] if hasattr(server, "ports") else server.port) as proxy:
        proxy.throttle(RATE, burst=1)
        got, reqs = _node(f"{bucket.url}/ds",
                          bucket.options_via(proxy.endpoint_url(), read_timeout=10),
                          str(tmp_path / "cache"), proxy, mode)
    s = summarize(reqs)
    refused = Counter(r.key for r in reqs if r.status == 503)
    served = Counter(r.key for r in reqs if r.status == 206)
    decreases = sum(d for *_, d in got)
    print(f"{mode}: {sum(served.values())} served, {s['throttled_503']} refused, most per "
          f"read {max(refused.values(), default=0)}, span {max(r.t for r in reqs):.1f} s, "
          f"{decreases} decreases")
    # No error: every read came back whole, each with one served GET.
    assert not [err for _, err, _ in got if err], got
    assert all(ok == [True] * READS for ok, _, _ in got), got
    assert s["errors"] == 0 and len(served) == READERS * READS, s
    assert set(served.values()) == {1}, served
    # No read retried beyond the policy, and the node refused less often than served.
    assert max(refused.values(), default=0) < MAX_ATTEMPTS_PER_READ, refused
    assert s["throttled_503"] <= MAX_REFUSED_PER_SERVED * READERS * READS, (
        f"{s['throttled_503']} refusals for {READERS * READS} reads: the node's processes "
        f"back off alone instead of together (io/throttle.py)")
