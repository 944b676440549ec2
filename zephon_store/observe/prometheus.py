"""Prometheus metrics of a loader's account, through ``prometheus_client`` (the
``prometheus`` extra: ``pip install 'zephon_store[prometheus]'``).

Worker processes: ``prometheus_client`` documents a multi-process mode
(``PROMETHEUS_MULTIPROC_DIR``, one mmap file per process, a ``MultiProcessCollector``), which
exists because each process would otherwise serve only its own counters. Zephon's workers
already send their counters to the main process with every batch (the hand-over note,
:mod:`zephon_store.observe.account`), so the main process holds the rank's totals, and one
collector there serves them: no folder to set before any import, no files of dead workers
to clean up, and the same numbers ``loader.stats()`` returns.

>>> server, port = serve(loader, port=0)      # doctest: +SKIP
>>> # curl http://127.0.0.1:{port}/metrics  ->  zephon_data_wait_seconds_total{cause="fetch"} ...
"""

from __future__ import annotations

from ..errors import MissingExtraError

__all__ = ["ZephonCollector", "serve"]

_PREFIX = "zephon_"


def _client():
    try:
        import prometheus_client
    except ImportError as exc:
        raise MissingExtraError(
            "Prometheus metrics need prometheus_client: pip install 'zephon_store[prometheus]'"
        ) from exc
    return prometheus_client


def _name(key: str) -> str:
    return _PREFIX + key.replace(".", "_").replace("/", "_")


class ZephonCollector:
    """A ``prometheus_client`` collector of one loader's :meth:`stats` (read at each
    scrape): ``zephon_data_wait_seconds_total{cause=...}`` (the loop's wait in ``next()``
    by cause), ``zephon_steps_total``, ``zephon_requests_total{kind=...}``,
    ``zephon_bytes_total{kind=...}``, ``zephon_retries_total``, ``zephon_refusals_total``,
    ``zephon_cache_hits_total`` and the other counters, and the gauges
    ``zephon_prefetch_lead_steps`` and ``zephon_last_step_wait_seconds``. ``rank`` is a
    label on every metric."""

    def __init__(self, loader, *, rank: int | None = None) -> None:
        self.loader = loader
        self.rank = str(loader.topology.rank if rank is None else rank)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.loader.stats()
        wait = CounterMetricFamily(_PREFIX + "data_wait_seconds",
                                   "seconds the training loop waited in next(), by cause",
                                   labels=["rank", "cause"])
        requests = CounterMetricFamily(_PREFIX + "requests", "storage requests by kind",
                                       labels=["rank", "kind"])
        nbytes = CounterMetricFamily(_PREFIX + "bytes", "bytes fetched by request kind",
                                     labels=["rank", "kind"])
        steps = CounterMetricFamily(_PREFIX + "steps", "steps handed to the loop",
                                    labels=["rank"])
        steps.add_metric([self.rank], st["steps"])
        out = [wait, requests, nbytes, steps]
        for key, value in st.items():
            if key.startswith("wait_total_s/"):
                wait.add_metric([self.rank, key.split("/", 1)[1]], value)
            elif key.startswith("requests."):
                requests.add_metric([self.rank, key.split(".", 1)[1]], value)
            elif key.startswith("bytes."):
                nbytes.add_metric([self.rank, key.split(".", 1)[1]], value)
            elif key in ("prefetch_lead_steps", "fetch_MBps"):
                g = GaugeMetricFamily(_name(key), key, labels=["rank"])
                g.add_metric([self.rank], value)
                out.append(g)
            elif key in ("retries", "refusals", "cache_hits", "cache_misses",
                         "decoded_cache_hits", "decoded_cache_misses", "fetch_busy_s"):
                c = CounterMetricFamily(_name(key), key.replace("_", " "), labels=["rank"])
                c.add_metric([self.rank], value)
                out.append(c)
        last = GaugeMetricFamily(_PREFIX + "last_step_wait_seconds",
                                 "the last step's wait in next()", labels=["rank"])
        last.add_metric([self.rank], st["wait_s"])
        out.append(last)
        return out


def serve(loader, *, port: int = 0, addr: str = "127.0.0.1", registry=None):
    """Serve ``loader``'s metrics over HTTP at ``http://addr:port/metrics`` (``port=0``:
    a free one); returns ``(server, port)``: ``server.shutdown()`` stops it. ``registry``:
    a ``CollectorRegistry`` to register into instead of a new one."""
    client = _client()
    registry = registry or client.CollectorRegistry()
    registry.register(ZephonCollector(loader))
    server, thread = client.start_http_server(port, addr=addr, registry=registry)
    return server, server.server_port
