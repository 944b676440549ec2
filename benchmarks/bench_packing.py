#!/usr/bin/env python3
"""Benchmark: concat against best-fit packing on the demo's corpus, tokenized.

Corpus: the Python standard library's sources as JSONL.zst, exactly as ``make demo`` writes
it (``zephon_store.testing.corpus.write_corpus``, ``--files`` inputs, one record per source
file). Tokenizer: a byte-level BPE of ``--vocab`` tokens trained on that corpus with the HF
``tokenizers`` library (BOS/EOS added as special tokens), cached beside it. For each
``--seq-len`` and strategy (best-fit once per ``--buffers`` size), ``zephon_store.convert``
with ``--workers`` processes, in this process after its imports, ``--runs`` times (median
seconds); the figures come from the manifest's ``packing`` entry:

- windows, and tokens per window that are padding (``padded_tokens``) or dropped with the
  final partial window (``dropped_tail_tokens``);
- documents split across windows (``documents_split``: under concat, every document a window
  border cuts; under best-fit, only those longer than a window) and their pieces.

    python -m benchmarks.bench_packing --seq-len 2048,8192 --runs 3 --json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import time

from .harness import BENCH_DIR


def corpus(folder: str, files: int) -> list[str]:
    """The demo's corpus (stdlib sources as JSONL.zst), written once into ``folder``."""
    from zephon_store.testing.corpus import write_corpus

    raw = os.path.join(folder, f"raw-{files}")
    if not glob.glob(os.path.join(raw, "*.jsonl.zst")):
        write_corpus(raw, files=files)
    return sorted(glob.glob(os.path.join(raw, "*.jsonl.zst")))


def tokenizer(folder: str, inputs: list[str], vocab: int) -> str:
    """A byte-level BPE of ``vocab`` tokens trained on ``inputs``' texts (cached)."""
    path = os.path.join(folder, f"tok-{vocab}", "tokenizer.json")
    if os.path.exists(path):
        return path
    import zstandard
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        for f in inputs:
            with open(f, "rb") as fh:
                for line in zstandard.ZstdDecompressor().stream_reader(fh).read().splitlines():
                    yield json.loads(line)["text"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts(), trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tok.save(path)
    return path


def measure(inputs: list[str], tok: str, out: str, seq_len: int, strategy: str,
            buffer_windows: int | None, workers: int, runs: int) -> dict:
    """One configuration: median convert seconds over ``runs`` and the packing figures."""
    from zephon_store import convert, open_dataset
    from zephon_store.write.packing import PackingOptions, packing_convert_kwargs

    opts = {"buffer_windows": buffer_windows} if buffer_windows else {}
    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok, seq_len=seq_len,
                                               strategy=strategy, **opts))
    times = []
    for _ in range(runs):
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        res = convert(inputs, out, workers=workers, progress=False, **kw)
        times.append(time.perf_counter() - t)
    p = open_dataset(out).manifest.packing
    w = p["window"]
    row = {
        "seq_len": seq_len, "strategy": strategy, "buffer_windows": p.get("buffer_windows"),
        "documents": p["num_documents"], "tokens": p["num_tokens"],
        "windows": p["num_windows"], "documents_split": p["documents_split"],
        "split_share": round(p["documents_split"] / p["num_documents"], 4),
        "split_pieces": p["split_pieces"], "padded_tokens": p["padded_tokens"],
        "dropped_tail_tokens": p["dropped_tail_tokens"],
        "padding_share": round(p["padded_tokens"] / (p["num_windows"] * w), 4),
        "dataset_bytes": res.total_bytes, "convert_s_median": round(statistics.median(times), 2),
        "convert_s": [round(t, 2) for t in times],
    }
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", default="2048", help="comma-separated (default 2048)")
    ap.add_argument("--buffers", default="4096", help="best-fit buffer_windows, comma-separated")
    ap.add_argument("--files", type=int, default=8, help="corpus inputs (the demo's: 8)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    folder = os.path.join(BENCH_DIR, "packing")
    inputs = corpus(folder, a.files)
    tok = tokenizer(folder, inputs, a.vocab)
    out = os.path.join(folder, "out")
    rows = []
    for seq_len in (int(x) for x in a.seq_len.split(",")):
        rows.append(measure(inputs, tok, out, seq_len, "concat", None, a.workers, a.runs))
        for b in (int(x) for x in a.buffers.split(",")):
            rows.append(measure(inputs, tok, out, seq_len, "best-fit", b, a.workers, a.runs))
    result = {"corpus_files": len(inputs),
              "corpus_bytes": sum(os.path.getsize(f) for f in inputs), "vocab": a.vocab,
              "workers": a.workers, "rows": rows}
    if a.json:
        print(json.dumps(result))
        return
    for r in rows:
        print(f"L={r['seq_len']:>5} {r['strategy']:>8} buf={r['buffer_windows']!s:>5} "
              f"windows={r['windows']:>7} split={r['documents_split']:>6} "
              f"({r['split_share']:.1%}) pad={r['padding_share']:.2%} "
              f"tail={r['dropped_tail_tokens']} {r['convert_s_median']:.1f}s")


if __name__ == "__main__":
    main()
