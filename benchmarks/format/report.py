"""``docs/benchmarks_format.md``'s generated part: one table per corpus and a plot.

Every rate is payload MB/s (UTF-8 bytes of path + text, or 4 bytes per token); every ratio
is against the old default (``zstd-3``) of the same corpus in the same run, or, for
conversion, against raw pyarrow's ``write_table`` of the same input.
"""

from __future__ import annotations

import os

from ..peers.common import ROOT
from .grid import BASELINE, CELLS

DOC = os.path.join(ROOT, "docs", "benchmarks_format.md")
PLOT = os.path.join(ROOT, "docs", "img", "benchmarks_format.png")
BEGIN, END = "<!-- grid:begin -->", "<!-- grid:end -->"
READS = ("seq_b8", "shuf_b8", "seq_b256", "shuf_b256")


def _rates(slot: dict, name: str) -> dict:
    cell = slot["cells"][name]
    mb = slot["meta"]["payload_bytes"] / 1e6
    r, c = cell["reads"], cell["convert"]
    out = {"disk": cell["disk_bytes"] / 1e6, "convert": mb / c["seconds"],
           "convert_cpu": c.get("cpu_s", c["seconds"]), "rss": c["peak_rss_mb"]}
    for k in READS:
        out[k] = mb / r[k + "_s"]
        out[k + "_cpu"] = r.get(k + "_cpu_s", r[k + "_s"])
    out.update({k: r[k] for k in ("resume0_ms", "resume50_ms", "resume99_ms", "get_p50_us")})
    out["resume_cpu"] = ([r[f"resume{p}_cpu_ms"] for p in (0, 50, 99)]
                         if "resume50_cpu_ms" in r else None)   # not in older results
    out["first_kb"] = (r["first_batch_rg_bytes"] + r["first_batch_meta_bytes"]) / 1e3
    return out


def _cpu(ms: list[float] | None) -> str:
    """The resumes' CPU milliseconds, in brackets after their wall times."""
    return "" if ms is None else " (" + " / ".join(f"{v:.1f}" for v in ms) + ")"


def _codecs(cell: dict) -> str:
    return ", ".join(f"{c}: {'/'.join(v)}" for c, v in cell.get("codecs", {}).items()) or "-"


def _order(name: str) -> int:
    """Cells in the grid's order (the baseline first), unknown names last."""
    names = list(CELLS)
    return names.index(name) if name in names else len(names)


def table(kind: str, slot: dict) -> str:
    """One corpus: a row per cell, then the raw-pyarrow and LitData baselines.

    Read cells: wall MB/s, then in brackets the CPU-time ratio against the old default
    (> 1: this cell spends less CPU on the same pass)."""
    base = _rates(slot, BASELINE)
    pa = slot["baselines"]["pyarrow"]
    mb = slot["meta"]["payload_bytes"] / 1e6
    pa_rate, pa_cpu = mb / pa["seconds"], pa.get("cpu_s", pa["seconds"])
    m = slot["machine"]
    cpu_note = " (CPU ms)" if base["resume_cpu"] is not None else ""
    lines = [f"### {kind} ({slot['meta']['num_samples']:,} samples, {mb:.0f} MB payload; "
             f"{m['date']}, commit {m['commit']}, load average {m['load']:.1f} at the start)",
             "",
             "| cell | on disk MB (× old) | convert MB/s (× pyarrow wall / CPU) | peak RSS MB | "
             f"seq b8 | shuf b8 | seq b256 | shuf b256 | resume 0/50/99 % ms{cpu_note} | "
             "get p50 µs | "
             "cold first batch KB | codecs chosen |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in sorted(slot["cells"], key=_order):
        cell = slot["cells"][name]
        x = _rates(slot, name)
        reads = " | ".join(f"{x[k]:.0f} ({base[k + '_cpu'] / x[k + '_cpu']:.2f}×)"
                           for k in READS)
        lines.append(
            f"| {name} | {x['disk']:.1f} ({x['disk'] / base['disk']:.2f}×) | "
            f"{x['convert']:.1f} ({x['convert'] / pa_rate:.2f}× / "
            f"{pa_cpu / x['convert_cpu']:.2f}×) | {x['rss']:.0f} | {reads} | "
            f"{x['resume0_ms']:.1f} / {x['resume50_ms']:.1f} / {x['resume99_ms']:.1f}"
            f"{_cpu(x['resume_cpu'])} | "
            f"{x['get_p50_us']:.0f} | {x['first_kb']:.0f} | {_codecs(cell)} |")
    lines.append(f"| raw pyarrow (zstd, Arrow's default level) | {pa['disk_bytes'] / 1e6:.1f} | "
                 f"{pa_rate:.1f} (1.00×) | {pa['peak_rss_mb']:.0f} | | | | | | | | |")
    lit = slot["baselines"].get("litdata")
    if lit:
        seq, shuf = mb / lit["read_seq_s"], mb / lit["read_shuffled_s"]
        lines.append(f"| LitData (uncompressed 64 MB chunks; per sample, any batch; CPU s) | "
                     f"{lit['disk_bytes'] / 1e6:.1f} | | | {seq:.0f} "
                     f"({lit.get('read_seq_cpu_s', 0):.2f} s) | {shuf:.0f} "
                     f"({lit.get('read_shuffled_cpu_s', 0):.2f} s) | {seq:.0f} | {shuf:.0f} "
                     f"| | | | |")
    return "\n".join(lines)


def plot(results: dict, path: str = PLOT) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(results)
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        slot = results[kind]
        base = _rates(slot, BASELINE)
        for name in sorted(slot["cells"], key=_order):
            x = _rates(slot, name)
            speed = sum(base[k + "_cpu"] / x[k + "_cpu"] for k in READS) / len(READS)
            ax.scatter(x["disk"] / base["disk"], speed, s=20 + 30 * x["convert"] / base["convert"])
            ax.annotate(name, (x["disk"] / base["disk"], speed), fontsize=7)
        ax.set_title(f"{kind}: vs zstd-3 (marker size: convert rate)")
        ax.set_xlabel("on-disk size ÷ old default")
        ax.set_ylabel("full-pass reads: old default's CPU s ÷ this cell's (mean of 4)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)


def codec_table(codecs: dict) -> str:
    """Per corpus and column: the auto rule's sample ratio, then each codec's ratio and
    CPU MB/s (of Arrow bytes) writing and reading the column, fastest of the rounds."""
    from zephon_store.write.shardwriter import auto_codec

    names = ("none", "lz4", "snappy", "zstd-1", "zstd-3", "zstd-6")
    lines = ["| corpus: column (storage type) | auto's sample ratio → choice | "
             + " | ".join(f"{n}: ratio, write / read MB/s" for n in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for kind, res in codecs.items():
        for col, c in res["columns"].items():
            mb = c["arrow_bytes"] / 1e6
            text = c["type"] in ("string", "large_string", "binary", "large_binary")
            # The writer's rule: zstd-1 on the sample's ratio, LZ4 against zstd-1 on the
            # column's whole-file sizes here (the writer compares them on its 1 MiB sample).
            lz4_vs_zstd1 = c["codecs"]["zstd-1"]["bytes"] / c["codecs"]["lz4"]["bytes"]
            choice = auto_codec(text, c["auto_ratio"],
                                lambda c=c, r=lz4_vs_zstd1: c["auto_ratio"] * r)
            cells = " | ".join(
                f"{c['arrow_bytes'] / x['bytes']:.2f}, {mb / max(x['write_s'], 1e-9):.0f} / "
                f"{mb / max(x['read_s'], 1e-9):.0f}" for x in (c["codecs"][n] for n in names))
            lines.append(f"| {kind}: {col} ({c['type']}) | {c['auto_ratio']:.2f} → {choice} | "
                         f"{cells} |")
    return "\n".join(lines)


def write(results: dict, doc: str = DOC, codecs: dict | None = None) -> None:
    """Replace the generated part of ``doc`` (between the grid markers) and redraw the plot."""
    body = "\n\n".join(table(k, s) for k, s in results.items() if s.get("cells"))
    if codecs:
        body = ("### Each codec alone, per column (CPU time, one process per corpus)\n\n"
                + codec_table(codecs) + "\n\n" + body)
    try:
        plot({k: s for k, s in results.items() if s.get("cells")})
    except ImportError:
        body += "\n\n(plot skipped: matplotlib is not installed)"
    text = open(doc).read() if os.path.exists(doc) else f"{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    with open(doc, "w") as f:
        f.write(f"{head}{BEGIN}\n{body}\n{END}{tail}")
