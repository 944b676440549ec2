"""Run the format grid and write its report: ``python -m benchmarks.format`` (``make bench-format``).

Every cell is converted three times, each in a fresh process (``cell.py --what convert``),
and measured three times, each in a fresh process (``--what reads``); the report shows the
median of the three. Results are kept in ``.bench/format/results.json`` per (corpus, cell),
so an interrupted run continues where it stopped (``--fresh`` starts over). The raw-pyarrow
conversion and LitData's reads (when ``litdata`` is installed: ``make bench`` installs it)
are measured in the same run as baselines.

    python -m benchmarks.format                       # 50 MB text and tokens, 40 MB code
    python -m benchmarks.format --corpus text --cells "auto (new default)" --reps 1
    python -m benchmarks.format --corpus text,tokens --rerun   # measure these corpora again
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import time

from ..harness import run_child
from ..peers.corpus import du
from . import corpus, report
from .grid import BASELINE, CELLS, CODE_CELLS, CORPORA

RESULTS = os.path.join(corpus.BENCH, "results.json")
# Per column kind, each codec alone (codecs.py): one file, so it can be measured apart.
CODEC_RESULTS = os.path.join(corpus.BENCH, "codecs.json")
MB = {"text": 50, "tokens": 50, "code": 40}
RESUME_BATCH = {"text": 256, "tokens": 32, "code": 256}


def _median(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def _warm(path: str) -> None:
    """Read every file once, so each cell reads from the page cache alike."""
    for dirpath, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                while fh.read(8 << 20):
                    pass


def _conversions(what: str, kind: str, inp: str, out: str, reps: int, *args: str) -> list:
    """``reps`` conversions into ``out``, each from a warm input in a fresh process."""
    runs = []
    for _ in range(reps):
        shutil.rmtree(out, ignore_errors=True)
        _warm(inp)
        runs.append(run_child("format.cell", "--what", what, "--kind", kind, "--inp", inp,
                              "--out", out, *args))
    return runs


def _cell(kind: str, meta: dict, options: dict, reps: int, work: str) -> dict:
    out = os.path.join(work, "ds")
    conv = _conversions("convert", kind, meta["input"], out, reps,
                        "--options", json.dumps(options))
    reads = []
    for _ in range(reps):
        _warm(out)
        reads.append(run_child("format.cell", "--what", "reads", "--kind", kind, "--out", out,
                               "--resume-batch", str(RESUME_BATCH[kind])))
    with open(os.path.join(out, "manifest.json")) as f:
        doc = json.load(f)
    res = {"options": options, "disk_bytes": du(out), "codecs": doc.get("codecs", {}),
           "convert": _median(conv), "reads": _median(reads),
           "convert_runs": [c["seconds"] for c in conv]}
    shutil.rmtree(out, ignore_errors=True)
    return res


def _baselines(kind: str, meta: dict, reps: int, work: str) -> dict:
    out = os.path.join(work, "pyarrow")
    runs = _conversions("pyarrow", kind, meta["input"], out, reps)
    res = {"pyarrow": {**_median(runs), "disk_bytes": du(out)}}
    if kind != "code" and _have("litdata"):
        res["litdata"] = _litdata(kind, meta, reps, work)
    return res


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _litdata(kind: str, meta: dict, reps: int, work: str) -> dict:
    out = os.path.join(work, "litdata")
    shutil.rmtree(out, ignore_errors=True)
    run_child("peers.child", "--system", "litdata", "--metric", "convert", "--kind", kind,
              "--path", out, "--inp", meta["input"])
    res = {"disk_bytes": du(out)}
    for metric in ("read_seq", "read_shuffled"):
        runs = []
        for _ in range(reps):
            _warm(out)
            runs.append(run_child("peers.child", "--system", "litdata", "--metric", metric,
                                  "--kind", kind, "--path", out))
        res[metric + "_s"] = statistics.median(r["seconds"] for r in runs)
        res[metric + "_cpu_s"] = statistics.median(r["cpu_s"] for r in runs)
    shutil.rmtree(out, ignore_errors=True)
    return res


def _load(path: str = RESULTS) -> dict:
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def _save(results: dict, path: str = RESULTS) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def measure_codecs(kinds, *, fresh: bool = False) -> dict:
    """Each corpus's per-column codec figures (codecs.py), one fresh process per corpus."""
    out = {} if fresh else _load(CODEC_RESULTS)
    for kind in kinds:
        if kind not in out:
            meta = corpus.ensure(kind, MB[kind])
            _warm(meta["input"])
            out[kind] = run_child("format.cell", "--what", "codecs", "--kind", kind,
                                  "--inp", meta["input"], "--out", "-")
            _save(out, CODEC_RESULTS)
    return out


def _machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(RESULTS)).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "load": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=",".join(CORPORA))
    ap.add_argument("--cells", default=None, help="comma-separated cell names (default: all)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fresh", action="store_true", help="discard kept results")
    ap.add_argument("--rerun", action="store_true",
                    help="discard the kept results of --corpus only (cells and baselines), "
                         "keeping the other corpora's and the per-codec figures")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--doc", default=report.DOC)
    a = ap.parse_args(argv)
    results = {} if a.fresh else _load()
    if a.rerun:
        for kind in a.corpus.split(","):
            results.pop(kind, None)
    cells = a.cells.split(",") if a.cells else list(CELLS)
    work = os.path.join(corpus.BENCH, "work")
    for kind in ([] if a.report_only else a.corpus.split(",")):
        meta = corpus.ensure(kind, MB[kind])
        slot = results.setdefault(kind, {"meta": {k: meta[k] for k in (
            "num_samples", "payload_bytes")}, "cells": {}})
        if "baselines" not in slot:
            slot["baselines"] = _baselines(kind, meta, a.reps, work)
            slot["machine"] = _machine()
            _save(results)
        for name in [BASELINE] + [c for c in cells if c != BASELINE]:
            if name in slot["cells"] or (kind == "code" and name not in CODE_CELLS):
                continue
            print(f"{kind}: {name}", flush=True)
            slot["cells"][name] = _cell(kind, meta, CELLS[name], a.reps, work)
            _save(results)
    kinds = [] if a.report_only else a.corpus.split(",")
    report.write(results, a.doc, measure_codecs(kinds, fresh=a.fresh))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
