#!/usr/bin/env python3
"""Benchmark: the per-document attention data (``BatchOptions(documents=True)``), no data read.

The time :func:`zephon_store.load.documents.document_fields` adds to a batch of ``B`` windows
of ``L + 1`` tokens with ``D`` documents starting in each (drawn once from a fixed seed),
with and without a blank run (best-fit padding: the last 1% of each window), and the flat
merge TorchTitan main's layout takes (:func:`~zephon_store.load.documents.flat_cu_seqlens`).
Every figure is the median of ``--runs`` repetitions in this process, after a warm-up call.

    python -m benchmarks.bench_documents --json
"""

from __future__ import annotations

import argparse

import numpy as np

from zephon_store.load.documents import document_fields, flat_cu_seqlens

from .harness import median_seconds, print_results

SHAPES = ((8, 2048, 10), (8, 8192, 40), (32, 8192, 40))


def measure(rows: int, seq_len: int, docs: int, runs: int) -> dict:
    rng = np.random.default_rng(seq_len + docs)
    tokens = rng.integers(0, 50_000, (rows, seq_len + 1), dtype=np.int32)
    starts = [sorted(rng.choice(seq_len, docs, replace=False).tolist()) for _ in range(rows)]
    blank = np.zeros(tokens.shape, dtype=bool)
    blank[:, -(seq_len // 100 + 1):] = True
    out: dict = {"rows": rows, "seq_len": seq_len, "docs_per_window": docs}
    for name, b in (("fields", None), ("fields_with_padding", blank)):
        out[f"{name}_ms"] = median_seconds(
            lambda b=b: document_fields(tokens, starts, blank=b), runs) * 1e3
    cu = document_fields(tokens, starts)["cu_seqlens"]
    out["flat_merge_ms"] = median_seconds(lambda: flat_cu_seqlens(cu), runs) * 1e3
    out["ns_per_token"] = out["fields_ms"] * 1e6 / (rows * seq_len)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    print_results("documents", [measure(b, n, d, args.runs) for b, n, d in SHAPES], args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
