#!/usr/bin/env python3
"""Zephon against MosaicML Streaming, LitData, HF datasets and raw pyarrow, side by side.

Run it with the benchmark environment (``bash benchmarks/peers/setup_env.sh`` makes it)::

    .venv-bench/bin/python -m benchmarks.peers.run --quick     # 40 MB corpora, ~10 min
    .venv-bench/bin/python -m benchmarks.peers.run             # 300 MB corpora
    .venv-bench/bin/python -m benchmarks.peers.run --report-only   # redraw from the JSON
    .venv-bench/bin/python -m benchmarks.peers.run --report-only --doc /tmp/q/peers.md

Zephon runs as two systems: ``zephon`` (default ``WriteOptions``, zstd) and ``zephonraw``
(``compression="none"``, the local-NVMe profile; ``sys_zephonraw.py``); only their
conversion differs. System keys have no "_": a case ``zephon_w2`` is system ``zephon``.

For each corpus (``corpus.py``: real text, and 2049-token int32 windows), every system
converts the same input; then every measurement runs in a fresh subprocess (``child.py``),
``--runs`` times, the systems interleaved round-robin within each run so background load
hits them alike; median, min and max are reported, and ratios against raw pyarrow measured
in the same run. Results go to ``.bench/peers/results.json``, the page to
``docs/benchmarks_peers.md`` and the plots to ``docs/img/peers_*.png`` (``report.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from ..harness import BENCH_DIR, child_env
from . import corpus as corpus_mod
from .common import BATCH, BENCH, ROOT, SMALL_BATCH, SYSTEMS, ZEPHONS

QUICK_MB, FULL_MB = 40, 300
METRICS = ("convert", "read_seq", "read_shuffled", "read_seq_b8", "read_shuffled_b8", "random",
           "resume", "resume_seq", "resume_0", "resume_99", "loader_w0", "loader_w2", "s3_seq")
# Resumes and where their checkpoints sit, as a fraction of the samples (rounded down to a
# batch): "resume" and "resume_seq" at 50%, the default order also at the first and the last
# batch ("resume_0", "resume_99"); "resume_seq" alone in sequential order.
RESUMES = {"resume": 0.5, "resume_seq": 0.5, "resume_0": 0.0, "resume_99": 0.99}
RESULTS = os.path.join(BENCH, "results.json")
# Which systems a metric runs for, when not every one. Raw pyarrow and HF have no shuffled
# resume, so their "resume" is sequential and resume_seq would repeat it.
ONLY = {"resume_seq": ("zephon", "zephonraw", "mosaic", "litdata"),
        "resume_0": ("zephon", "zephonraw", "litdata"),
        "resume_99": ("zephon", "zephonraw", "litdata")}


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, file=sys.stderr, flush=True)


def spawn(system: str, metric: str, kind: str, path: str, timeout: float, *, root: str = ROOT,
          **kw) -> dict:
    """One measurement in a fresh ``child.py`` process; ``root``: the checkout whose
    zephon_store it imports."""
    args = [sys.executable, "-m", "benchmarks.peers.child", "--system", system,
            "--metric", metric, "--kind", kind, "--path", path]
    for k, v in kw.items():
        if v is not None:
            args += ["--" + k.replace("_", "-"), str(v)]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                             cwd=BENCH_DIR, env=child_env(root))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = "\n".join(out.stderr.strip().splitlines()[-6:])
        return {"error": f"exit {out.returncode}: {tail}"}
    res = json.loads(lines[-1])
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    return res


# ----------------------------------------------------------------------------- stats


def _stats(vals: list[float]) -> dict:
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def summarize(metric: str, runs: list[dict], meta: dict) -> dict:
    ok = [r for r in runs if "error" not in r]
    out: dict = {"runs": runs}
    if not ok:
        out["error"] = runs[-1]["error"] if runs else "not run"
        return out
    if "peak_rss_mb" in ok[0]:
        out["peak_rss_mb"] = statistics.median(r["peak_rss_mb"] for r in ok)
        out["rss_start_mb"] = statistics.median(r["rss_start_mb"] for r in ok)
    n, payload = meta["num_samples"], meta["payload_bytes"]
    if "seconds" in ok[0]:
        secs = [r["seconds"] for r in ok]
        samples = ok[0].get("samples", n)
        out["seconds"] = _stats(secs)
        out["samples"] = samples
        rate = [samples / s for s in secs]
        out["samples_per_s"] = _stats(rate)
        out["MB_per_s"] = _stats([payload * samples / n / s / 1e6 for s in secs])
        if "bytes_on_disk" in ok[0]:
            out["bytes_on_disk"] = ok[0]["bytes_on_disk"]
    if "p50_us" in ok[0]:
        out["p50_us"] = _stats([r["p50_us"] for r in ok])
        out["p99_us"] = _stats([r["p99_us"] for r in ok])
        out["open_s"] = statistics.median(r["open_s"] for r in ok)
    if "warm_first_ms" in ok[0]:
        for key in ("warm_first_ms", "cold_first_ms", "warm_open_ms", "cold_open_ms"):
            out[key] = _stats([r[key] for r in ok])
    if len(ok) < len(runs):
        out["failed_runs"] = [r["error"] for r in runs if "error" in r]
    return out


def ratios(block: dict) -> None:
    """Add ``vs_pyarrow`` to every system's summary of one metric, in place."""
    base = block.get("pyarrow", {})
    for _name, s in block.items():
        if "error" in s:
            continue
        for key in ("samples_per_s", "p50_us", "warm_first_ms"):
            if key in s and key in base:
                s["vs_pyarrow"] = round(s[key]["median"] / base[key]["median"], 3)
                break


# ----------------------------------------------------------------------------- phases


def cases_for(metric: str, systems: list[str]) -> list[str]:
    cases = [s for s in systems if s in ONLY.get(metric, SYSTEMS)]
    if metric == "convert" and "zephon" in systems:
        cases.append("zephon_w2")
    if metric == "random" and "zephon" in systems:
        cases.append("zephon_take")
    return cases


def _spawn_case(case: str, metric: str, kind: str, meta: dict, fmt: dict, timeout: float,
                extra: dict | None = None) -> dict:
    system = case.split("_")[0]
    m, batch = metric, BATCH[kind]
    if case == "zephon_take":
        m = "random_take"
    if metric.endswith("_b8"):   # the same read at a per-rank batch of SMALL_BATCH
        m, batch = metric.removesuffix("_b8"), SMALL_BATCH
    return spawn(system, m, kind, fmt[system], timeout, num_samples=meta["num_samples"],
                 batch=batch, **(extra or {}))


def run_convert(kind, meta, fmt, work, runs, systems, timeout) -> dict:
    raw: dict[str, list] = {c: [] for c in cases_for("convert", systems)}
    for r in range(runs):
        for case in raw:
            system, workers = case.split("_")[0], 2 if case.endswith("_w2") else 1
            out = os.path.join(work, "tmp", f"{case}-{r}")
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            warm(meta["input"])
            res = spawn(system, "convert", kind, out, timeout, inp=meta["input"],
                        workers=workers)
            if "error" not in res:
                res["bytes_on_disk"] = corpus_mod.du(out)
            raw[case].append(res)
            log(f"  {kind} convert run {r} {case}: {res.get('seconds', res.get('error'))}")
            if case == system and "error" not in res and not os.path.exists(fmt[system]):
                os.makedirs(os.path.dirname(fmt[system]), exist_ok=True)
                os.replace(out, fmt[system])
            else:
                shutil.rmtree(out, ignore_errors=True)
    return raw


def ensure_formats(kind, meta, fmt, systems, timeout) -> None:
    for system in systems:
        if not os.path.exists(fmt[system]):
            log(f"  {kind}: converting {system} (untimed, its copy was missing)")
            os.makedirs(os.path.dirname(fmt[system]), exist_ok=True)
            shutil.rmtree(fmt[system] + ".tmp", ignore_errors=True)
            res = spawn(system, "convert", kind, fmt[system] + ".tmp", timeout,
                        inp=meta["input"])
            if "error" in res:
                raise RuntimeError(f"{system} could not convert {kind}: {res['error']}")
            os.replace(fmt[system] + ".tmp", fmt[system])


def drop_stale(fmt: dict, systems: list[str]) -> None:
    """Remove a Zephon copy written by an older format version or other write options.

    Such a copy would be read as is; the reads must measure what this checkout writes
    (its default options, or ``compression="none"`` for ``zephonraw``).
    """
    from zephon_store.format.manifest import FORMAT_VERSION, MANIFEST_NAME
    from zephon_store.write.shardwriter import WriteOptions

    for system in systems:
        path = os.path.join(fmt[system], MANIFEST_NAME)
        if system not in ZEPHONS or not os.path.exists(path):
            continue
        with open(path) as f:
            doc = json.load(f)
        version = doc.get("format_version")
        want = (WriteOptions(compression="none") if system == "zephonraw"
                else WriteOptions()).to_dict()
        if version != FORMAT_VERSION:
            log(f"  {system}: its copy is format v{version}, not v{FORMAT_VERSION}: removed")
            shutil.rmtree(fmt[system])
        elif doc.get("writer") != want:
            diff = {k: v for k, v in want.items() if doc.get("writer", {}).get(k) != v}
            log(f"  {system}: its copy was written with other options (now {diff}): removed")
            shutil.rmtree(fmt[system])


def format_bytes(system: str, path: str) -> int:
    """Bytes the converter wrote (not MosaicML's decompressed ``.mds`` copies of its shards)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files if not (system == "mosaic" and f.endswith(".mds")))


def warm(*paths: str) -> None:
    """Read every file under ``paths`` once, so the next child finds them in the page cache.

    Done right before every child, not once: this VM runs DAMON with a ``pageout`` scheme,
    which evicts page-cache pages a few seconds after their last access, so a single warm-up
    at the start left later measurements reading from disk.
    """
    for path in paths:
        for d, _, files in os.walk(path):
            for name in files:
                with open(os.path.join(d, name), "rb") as f:
                    while f.read(8 << 20):
                        pass


def make_states(kind, meta, fmt, work, systems, timeout, metrics) -> dict:
    """One checkpoint per system and resume metric (at its place in ``RESUMES``), untimed."""
    def cursor_of(metric: str) -> int:
        # Never past the start of the last whole batch: a first batch must be a whole one.
        n, b = meta["num_samples"], BATCH[kind]
        return min(int(n * RESUMES[metric]) // b * b, max(0, n // b - 1) * b)

    states, cursors = {}, {}
    for metric in [m for m in RESUMES if m in metrics]:
        cursors[metric] = cursor = cursor_of(metric)
        for system in cases_for(metric, systems):
            path = os.path.join(work, "states", f"{system}-{metric}.pkl")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # The state of a sequential run comes from the same code with shuffle off.
            res = spawn(system, "resume_state", kind, fmt[system], timeout, cursor=cursor,
                        state=path, seq=int(metric == "resume_seq"))
            if "error" in res:
                log(f"  {kind}: {system} {metric} state failed: {res['error']}")
                continue
            states[(system, metric)] = path
    return {"cursor": cursor_of("resume"), "cursors": cursors, "paths": states}


def run_metric(metric, kind, meta, fmt, runs, systems, timeout, states=None, s3=None,
               work=None) -> dict:
    raw: dict[str, list] = {c: [] for c in cases_for(metric, systems)}
    for r in range(runs):
        for case in raw:
            system = case.split("_")[0]
            extra = {}
            if metric in RESUMES:
                path = states["paths"].get((system, metric))
                if path is None:
                    raw[case].append({"error": "no checkpoint could be made"})
                    continue
                extra = {"state": path, "seq": int(metric == "resume_seq")}
            if metric != "s3_seq":
                warm(fmt[system])
            res = (_spawn_s3(case, kind, meta, s3, work, r, timeout) if metric == "s3_seq"
                   else _spawn_case(case, "resume" if metric in RESUMES else metric,
                                    kind, meta, fmt, timeout, extra))
            raw[case].append(res)
            short = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()
                     if k in ("seconds", "p50_us", "warm_first_ms", "error")}
            log(f"  {kind} {metric} run {r} {case}: {short}")
    return raw


# ----------------------------------------------------------------------------- S3


def _s3_url(system: str, kind: str) -> str:
    # HF streams Parquet, so it reads raw pyarrow's file (see sys_hf.s3_read).
    return f"s3://peers/{kind}/{'pyarrow' if system == 'hf' else system}"


def _spawn_s3(case, kind, meta, s3, work, r, timeout) -> dict:
    cache = os.path.join(work, "s3cache", f"{case}-{r}")
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(cache)
    try:
        return spawn(case, "s3_seq", kind, _s3_url(case, kind), timeout,
                     num_samples=meta["num_samples"], s3=json.dumps(s3), cache_dir=cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def upload(server, kind: str, fmt: dict, systems: list[str]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(key=server.key, secret=server.secret,
                           endpoint_url=server.endpoint_url, skip_instance_cache=True)
    if not fs.exists("peers"):
        fs.mkdir("peers")
    for system in systems:
        if system == "hf":
            continue
        dest = _s3_url(system, kind).removeprefix("s3://")
        if fs.exists(dest):
            fs.rm(dest, recursive=True)
        for d, _, files in os.walk(fmt[system]):
            for name in sorted(files):
                if system == "mosaic" and name.endswith(".mds"):
                    continue   # the decompressed copies prepare() made; remote has .zstd only
                local = os.path.join(d, name)
                fs.put_file(local, dest + "/" + os.path.relpath(local, fmt[system]))


# ----------------------------------------------------------------------------- main


def bench_corpus(kind, mb, runs, systems, metrics, timeout, server) -> dict:
    meta = corpus_mod.ensure(kind, mb, log=log)
    work = os.path.join(meta["dir"], "work")
    fmt = {s: os.path.join(meta["dir"], "formats", s) for s in SYSTEMS}
    out: dict = {}
    drop_stale(fmt, systems)
    if "convert" in metrics:
        out["convert"] = run_convert(kind, meta, fmt, work, runs, systems, timeout)
    ensure_formats(kind, meta, fmt, systems, timeout)
    out["bytes_on_disk"] = {s: format_bytes(s, fmt[s]) for s in systems}
    if "mosaic" in systems:
        res = spawn("mosaic", "prepare", kind, fmt["mosaic"], timeout)
        if "error" in res:
            log(f"  {kind}: mosaic prepare failed: {res['error']}")
    states = None
    if set(RESUMES) & set(metrics):
        states = make_states(kind, meta, fmt, work, systems, timeout, metrics)
        out["resume_cursor"] = states["cursor"]
        out["resume_cursors"] = states["cursors"]
    for metric in metrics:
        if metric in ("convert", "s3_seq"):
            continue
        out[metric] = run_metric(metric, kind, meta, fmt, runs, systems, timeout, states)
    if "s3_seq" in metrics and server is not None:
        upload(server, kind, fmt, systems)
        out["s3_seq"] = run_metric("s3_seq", kind, meta, fmt, runs, systems, timeout,
                                   s3=server_options(server), work=work)
    return {"meta": {k: v for k, v in meta.items() if k not in ("dir", "input")}, "raw": out}


def server_options(server) -> dict:
    return {"key": server.key, "secret": server.secret, "endpoint_url": server.endpoint_url,
            "config_kwargs": {"read_timeout": 60, "connect_timeout": 5}}


def summarize_all(raw: dict) -> dict:
    out = {}
    for kind, block in raw.items():
        meta = block["meta"]
        res = {}
        for metric, per_case in block["raw"].items():
            if not isinstance(per_case, dict) or metric in ("bytes_on_disk", "resume_cursors"):
                continue
            res[metric] = {case: summarize(metric, runs, meta) for case, runs in per_case.items()}
            ratios(res[metric])
        out[kind] = {"meta": meta, "results": res,
                     "bytes_on_disk": block["raw"].get("bytes_on_disk", {}),
                     "resume_cursor": block["raw"].get("resume_cursor"),
                     "resume_cursors": block["raw"].get("resume_cursors", {})}
    return out


def check_env() -> None:
    try:
        from .common import import_streaming

        import_streaming()
        import datasets  # noqa: F401
        import litdata  # noqa: F401
        import matplotlib  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        sys.exit(f"run.py needs the benchmark environment ({exc!r}); make it with\n"
                 f"  bash benchmarks/peers/setup_env.sh\nand run\n"
                 f"  .venv-bench/bin/python -m benchmarks.peers.run")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_MB} MB corpora")
    ap.add_argument("--mb", type=int, default=FULL_MB)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--corpus", default="text,tokens")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--metrics", default=",".join(METRICS))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--doc", default=None,
                    help="write the page here, its plots in img/ beside it (default: "
                         "docs/benchmarks_peers.md and docs/img/)")
    a = ap.parse_args(argv)
    from . import report

    if a.report_only:
        with open(a.results) as f:
            report.write(json.load(f), a.doc or report.DOC)
        return 0
    check_env()
    mb = QUICK_MB if a.quick else a.mb
    systems = [s for s in a.systems.split(",") if s]
    metrics = [m for m in a.metrics.split(",") if m]
    bad = [s for s in systems if s not in SYSTEMS] + [m for m in metrics if m not in METRICS]
    if bad:
        ap.error(f"unknown systems/metrics: {bad}")
    if "pyarrow" not in systems:
        ap.error("pyarrow is the baseline of every ratio; keep it in --systems")
    t0 = time.perf_counter()
    # The environment (commit included) as the run starts: others may commit meanwhile.
    env = report.environment(argv if argv is not None else sys.argv[1:], mb, a.runs, 0.0)
    server = None
    if "s3_seq" in metrics:
        from zephon_store.testing.s3_server import SeaweedServer

        try:
            server = SeaweedServer().start()
        except Exception as exc:  # noqa: BLE001
            log(f"no S3 server, skipping s3_seq: {exc}")
    try:
        raw = {kind: bench_corpus(kind, mb, a.runs, systems, metrics, a.timeout, server)
               for kind in a.corpus.split(",") if kind}
    finally:
        if server is not None:
            server.stop()
    env["wall_s"] = round(time.perf_counter() - t0, 1)
    results = {"meta": env, **summarize_all(raw)}
    os.makedirs(os.path.dirname(a.results), exist_ok=True)
    with open(a.results + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(a.results + ".tmp", a.results)
    log(f"wrote {a.results} ({results['meta']['wall_s']:.0f} s)")
    if not a.no_report:
        report.write(results, a.doc or report.DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
