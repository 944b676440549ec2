#!/usr/bin/env python3
"""Benchmark: what a rank pays before its first ``gs://`` byte, zephon's client vs gcsfs.

Starts fake-gcs-server on 127.0.0.1 (``zephon_store.testing.gcs_server``), writes one 4 MiB
object, then runs each case in a fresh Python process, ``--runs`` times, interleaved:

- ``zephon``: ``Storage("gs://...").read_range`` of 1 MiB (io/gcs.py over ``http.client``);
- ``gcsfs``: ``gcsfs.GCSFileSystem(token="anon", endpoint_url=...).cat_file`` of the same
  range (the ``gcs`` fsspec filesystem: aiohttp, google-auth, google-cloud-storage).

Reported per case (medians): CPU seconds of the process from start to the first range
(imports, client construction, the request), wall seconds, the peak RSS, and the requests
the server saw (counted by a proxy in front of it). Each rank of a node pays this at the
start, on the path to its first batch.

    python -m benchmarks.bench_gcs_client --runs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

_CHILD = r"""
import json, resource, sys, time
t0 = time.monotonic()
endpoint, case = sys.argv[1], sys.argv[2]
if case == "zephon":
    from zephon_store.io.storage import Storage
    st = Storage("gs://bench/obj", storage_options={"endpoint_url": endpoint, "token": "anon"})
    data = st.read_range("data.bin", 1 << 20, 2 << 20)
else:
    import gcsfs
    fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=endpoint, skip_instance_cache=True)
    data = fs.cat_file("bench/obj/data.bin", start=1 << 20, end=2 << 20)
assert len(data) == 1 << 20
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": time.monotonic() - t0,
                  "rss_mb": ru.ru_maxrss / 1024}))
"""


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print a JSON report (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    from tests.helpers.faultproxy import FaultProxy
    from zephon_store.io.storage import Storage
    from zephon_store.testing.gcs_server import GCSServer

    results: dict[str, list[dict]] = {"zephon": [], "gcsfs": []}
    with GCSServer() as server, FaultProxy(server.port) as proxy:
        server.create_bucket("bench")
        Storage("gs://bench/obj", storage_options=server.storage_options()).write_atomic(
            "data.bin", bytes(4 << 20))
        for _ in range(args.runs):
            for case in results:
                proxy.reset_counters()
                out = subprocess.run([sys.executable, "-c", _CHILD, proxy.endpoint_url, case],
                                     capture_output=True, text=True, check=True)
                results[case].append({**json.loads(out.stdout), "requests": proxy.requests})
    report = {case: {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
              for case, runs in results.items()}
    print(json.dumps({"runs": args.runs, "median": report}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
