"""The per-step account behind the counting proxy, against a real S3 server (issue 43).

Faults are injected by tests/helpers/faultproxy.py: latency on every request, 503 SlowDown
(the store's refusal), bodies cut mid-stream (a retry), and a slow user transform. Each run's
largest cause of waiting must be the one injected; the counters must equal the proxy's own;
the Prometheus endpoint scraped over HTTP from a run with two worker processes shows them;
the stall warning fires before the first slow step and never in a run that keeps up. In
ZephonLoader (threads and 2 process workers), Grain and TorchTitan.
"""

from __future__ import annotations

import logging
import time
import urllib.request

import pytest

import zephon_store as z
from tests.helpers import write_jsonl_corpus
from tests.helpers.faultproxy import FaultProxy
from zephon_store.observe.causes import CAUSES

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
from zephon_store.torch import ZephonLoader  # noqa: E402

B = 16   # samples a step


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """2,400 JSONL records (about 150 steps of 16)."""
    d = tmp_path_factory.mktemp("observe")
    write_jsonl_corpus(d / "src", files=4, records=600, seed=3)
    return d


@pytest.fixture()
def remote(corpus, s3_bucket):
    url = f"{s3_bucket.url}/ds"
    z.convert([str(corpus / "src")], url, storage_options=s3_bucket.storage_options,
            options=z.WriteOptions(target_shard_bytes=40 << 10, row_group_bytes=6 << 10))
    port = int(s3_bucket.server.endpoint_url.rsplit(":", 1)[1])
    with FaultProxy(port) as proxy:
        yield url, s3_bucket, proxy


def _slow(batch):
    time.sleep(0.05)
    return batch


def _loader(url, so, cache, *, workers=0, steps=12, transform=None, prefetch_bytes=None,
            order=None, **kw):
    # A small budget also bounds the decode-ahead, which fetches what it decodes.
    read_ahead = z.ReadAheadOptions() if prefetch_bytes is None else z.ReadAheadOptions(
        prefetch_bytes=prefetch_bytes, decode_ahead_bytes=2 * prefetch_bytes)
    return ZephonLoader(url, topology=z.Topology(B), order=order or z.OrderOptions(seed=1),
                        source=z.SourceOptions(storage_options=so, cache=z.ChunkCache(str(cache))),
                        batch=z.BatchOptions(transform=transform), read_ahead=read_ahead,
                        stop=z.StopOptions(max_steps=steps),
                        workers=z.WorkerOptions(num_workers=workers), **kw)


def _largest(stats) -> str:
    return max(CAUSES, key=lambda c: stats[f"wait_total_s/{c}"])


FAULTS = {
    "fetch": (lambda p: p.latency(0.15), None),
    "throttle": (lambda p: p.http503_next(3), None),
    "retry": (lambda p: p.truncate_next(3), None),   # a body cut mid-stream: retried
    "transform": (lambda p: None, _slow),
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("cause", list(FAULTS))
def test_each_stall_is_attributed_to_its_true_cause(remote, tmp_path, cause, workers):
    url, bucket, proxy = remote
    so = dict(bucket.options_via(proxy.endpoint_url, read_timeout=2.0, connect_timeout=1.0),
              retry={"base_delay": 0.3, "max_delay": 0.6, "jitter": False, "deadline": 30})
    inject, transform = FAULTS[cause]
    loader = _loader(url, so, tmp_path / "cache", workers=workers, transform=transform)
    inject(proxy)
    for _ in loader:
        pass
    st = loader.stats()
    assert st["steps"] == 12
    assert _largest(st) == cause, {c: round(st[f"wait_total_s/{c}"], 3) for c in CAUSES}
    assert st[f"wait_total_s/{cause}"] >= 0.4 * st["wait_total_s"]
    if cause == "throttle":
        assert st["refusals"] == 3
    if cause in ("throttle", "retry"):
        assert st["retries"] == proxy.injected == 3


@pytest.mark.parametrize("workers", [0, 2])
def test_the_counters_equal_the_proxys_own(remote, tmp_path, workers):
    url, bucket, proxy = remote
    so = dict(bucket.options_via(proxy.endpoint_url, read_timeout=2.0, connect_timeout=1.0),
              retry={"base_delay": 0.05, "max_delay": 0.1})
    loader = _loader(url, so, tmp_path / "cache", workers=workers, steps=20)
    proxy.reset_counters()
    proxy.http503_next(2)
    for _ in loader:
        pass
    st = loader.stats()
    requests = sum(v for k, v in st.items() if k.startswith("requests."))
    assert requests == proxy.requests > 2
    fetched = sum(v for k, v in st.items() if k.startswith("bytes."))
    slowdown = proxy.bytes_down - fetched      # the two 503 bodies are not data
    assert 0 < slowdown < 2 * 400
    assert st["refusals"] == st["retries"] == proxy.injected == 2
    assert st["cache_misses"] >= 1


def test_the_prometheus_endpoint_of_a_two_worker_run(remote, tmp_path):
    pytest.importorskip("prometheus_client")
    from zephon_store.observe.prometheus import serve

    url, bucket, proxy = remote
    so = bucket.options_via(proxy.endpoint_url, read_timeout=2.0, connect_timeout=1.0)
    loader = _loader(url, so, tmp_path / "cache", workers=2, steps=10)
    proxy.reset_counters()
    server, port = serve(loader, port=0)
    try:
        for _ in loader:
            pass
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        server.shutdown()
    text = text.decode()
    st = loader.stats()
    got = {}
    for line in text.splitlines():
        if line.startswith("zephon_requests_total{"):
            got[line.split('kind="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    assert sum(got.values()) == proxy.requests > 0
    assert got["get_range"] == st["requests.get_range"]
    assert 'zephon_data_wait_seconds_total{cause="fetch",rank="0"}' in text
    assert 'zephon_steps_total{rank="0"} 10.0' in text


SLOW_STEPS = 30     # the loop's first steps take 0.1 s each, then it speeds up


@pytest.mark.parametrize("latency", [0.3, 0.0])
def test_the_stall_warning_fires_before_the_first_slow_step_and_only_then(
        remote, tmp_path, caplog, latency):
    """Every request through the proxy takes ``latency`` more. The loop spends 0.1 s on each
    of its first steps (storage keeps up, the prefetch budget fills), then almost none: the
    steps then need more bytes per second than storage delivers, and once the prefetched
    lead is used up they wait. The warning must come before the first of them; without the
    latency, nothing waits and nothing is said."""
    url, bucket, proxy = remote
    so = bucket.options_via(proxy.endpoint_url, read_timeout=5.0, connect_timeout=1.0)
    loader = _loader(url, so, tmp_path / "cache", steps=SLOW_STEPS + 100,
                     prefetch_bytes=32 << 10, order=z.OrderOptions(seed=0, shuffle=False))
    proxy.latency(latency)
    waits = []
    warned_at = None
    with caplog.at_level(logging.WARNING, logger="zephon_store"):
        for step, _ in enumerate(loader):
            waits.append(loader.stats()["wait_s"])
            if warned_at is None and any("will wait" in r.message for r in caplog.records):
                warned_at = step
            time.sleep(0.1 if step < SLOW_STEPS else 0.001)      # the training step
    warnings = [r.message for r in caplog.records if "will wait" in r.message]
    slow = [s for s, w in enumerate(waits) if w > 0.1 and s >= SLOW_STEPS]
    if latency:
        assert slow, waits
        assert len(warnings) == 1, warnings
        assert warned_at is not None and warned_at < slow[0], (warned_at, slow[:3], warnings)
        assert "raise prefetch_bytes" in warnings[0]
    else:
        assert not slow, waits
        assert warnings == []


# -- the same account through TorchTitan and Grain ---------------------------------------
SEQ_LEN = 16


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from tests.integration.torchtitan_worker import make_packed_dataset

    return make_packed_dataset(str(tmp_path_factory.mktemp("packed")), seq_len=SEQ_LEN,
                               windows=400)


def _front(front, url, so, cache, workers):
    """A TorchTitan or Grain loader over ``url`` (one rank, 24 windows a step); ``stats``:
    its account."""
    if front == "titan":
        import json

        from zephon_store.integrations.torchtitan import ZephonDataLoader

        return ZephonDataLoader.Config(
            dataset=url, storage_options=json.dumps(so), cache_dir=str(cache),
            num_workers=workers, seed=1, infinite=False).build(
            dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ_LEN, local_batch_size=24)
    from zephon_store.grain import ZephonIterDataset

    return ZephonIterDataset(url, topology=z.Topology(24), order=z.OrderOptions(seed=1),
                             source=z.SourceOptions(storage_options=so,
                                                  cache=z.ChunkCache(str(cache))),
                             stop=z.StopOptions(max_steps=16),
                             workers=z.WorkerOptions(num_workers=workers))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("front", ["titan", "grain"])
def test_titan_and_grain_attribute_latency_to_fetch_and_count_what_the_proxy_does(
        packed, s3_bucket, tmp_path, front, workers):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_bucket.storage_options, skip_instance_cache=True)
    fs.put(packed.rstrip("/") + "/", f"{s3_bucket.name}/ds/", recursive=True)
    url = f"{s3_bucket.url}/ds"
    port = int(s3_bucket.server.endpoint_url.rsplit(":", 1)[1])
    with FaultProxy(port) as proxy:
        so = s3_bucket.options_via(proxy.endpoint_url, read_timeout=2.0, connect_timeout=1.0)
        loader = _front(front, url, so, tmp_path / "cache", workers)
        proxy.reset_counters()
        proxy.latency(0.15)
        it = iter(loader)
        for _ in it:
            pass
        st = (it if front == "grain" else loader).stats()
    assert st["steps"] == 16      # 400 windows, 24 a step: one epoch
    assert _largest(st) == "fetch", {c: round(st[f"wait_total_s/{c}"], 3) for c in CAUSES}
    requests = sum(v for k, v in st.items() if k.startswith("requests."))
    fetched = sum(v for k, v in st.items() if k.startswith("bytes."))
    assert requests == proxy.requests > 0
    assert fetched == proxy.bytes_down


def test_a_profile_names_the_waits_and_the_fetches_of_the_loops_thread(remote, tmp_path):
    """torch's profiler records the ranges of the thread it runs in: the loop's wait per
    step, its waits for row groups decoding elsewhere, and what it fetches itself (the first
    step's footers and row groups)."""
    url, bucket, proxy = remote
    so = bucket.options_via(proxy.endpoint_url, read_timeout=2.0, connect_timeout=1.0)
    loader = _loader(url, so, tmp_path / "cache", steps=4)
    proxy.latency(0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in loader:
            pass
    names = {e.key for e in prof.key_averages()}
    assert {f"zephon: waiting for step {s}" for s in range(4)} <= names
    fetched = [n for n in names if n.startswith("zephon: shard ") and n.endswith(" (fetch)")]
    waits = [n for n in names if n.startswith("zephon: waiting for row group ")]
    assert fetched and waits, sorted(names)
