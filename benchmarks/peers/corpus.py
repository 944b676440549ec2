"""The peer benchmark's input corpora, built once and cached under ``.bench/peers/corpora/``.

- ``text``: real text found on every Debian/Ubuntu machine: the running Python's standard
  library sources (``zephon_store.testing.corpus.stdlib_sources``), then every UTF-8 file under
  ``/usr/share/doc`` (``*.gz`` decompressed; symlinks, binary files and non-UTF-8 files
  skipped), in sorted path order. Documents longer than 64 KiB are cut at line boundaries
  into parts of at most 16 KiB, so a sample is a document-sized record (~9 KB on average;
  the largest doc files are 7-13 MB changelogs and manuals). The documents are put in a
  seeded random order, so any prefix (``--quick``) mixes code and prose, and the sequence
  is repeated (``copyN/`` path prefix) until the JSONL reaches the target size. Records
  ``{"path": str, "text": str}``, written as JSONL parts of ~16 MB. Deterministic for a given machine (its Python and
  installed docs); ``meta.json`` records what went in.
- ``tokens``: windows of 2049 int32 token ids from ``benchmarks/corpora.token_windows``
  (seeded Zipf-Mandelbrot over a 50,257-id vocabulary), as one zstd Parquet file with a
  ``tokens: fixed_size_list<int32>[2049]`` column, 1024 windows per row group.

"Payload bytes" are what a consumer gets: UTF-8 bytes of path + text, or 4 * 2049 per window.
Every MB/s figure divides payload bytes by seconds.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys

from ..corpora import WINDOW, token_windows
from .common import BENCH

VERSION = 1
DOC_ROOT = "/usr/share/doc"
MAX_DOC = 16 << 10
ORDER_SEED = 20261130
PART_BYTES = 16_000_000


def corpus_dir(kind: str, mb: int) -> str:
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return os.path.join(BENCH, "corpora", f"{kind}-{mb}mb-{py}-v{VERSION}")


def _split(text: str, limit: int = MAX_DOC) -> list[str]:
    if len(text.encode()) <= limit:
        return [text]
    parts, cur, size = [], [], 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode())
        if cur and size + n > limit:
            parts.append("".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += n
    if cur:
        parts.append("".join(cur))
    return parts


def doc_texts(root: str = DOC_ROOT) -> list[tuple[str, str]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read()
                if name.endswith(".gz"):
                    data = gzip.decompress(data)
                text = data.decode("utf-8")
            except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
                continue
            if "\x00" in text or not text.strip():
                continue
            out.append((os.path.relpath(path, root).removesuffix(".gz"), text))
    return out


def text_documents() -> tuple[list[tuple[str, str]], dict]:
    from zephon_store.testing.corpus import stdlib_sources

    src = [("stdlib/" + p, t) for p, t in stdlib_sources()]
    doc = [("doc/" + p, t) for p, t in doc_texts()]
    docs = []
    for path, text in src + doc:
        parts = _split(text)
        for k, part in enumerate(parts):
            docs.append((path if len(parts) == 1 else f"{path}#{k}", part))
    import numpy as np

    docs = [docs[i] for i in np.random.default_rng(ORDER_SEED).permutation(len(docs))]
    info = {"stdlib_files": len(src), "stdlib_bytes": sum(len(t.encode()) for _, t in src),
            "doc_files": len(doc), "doc_bytes": sum(len(t.encode()) for _, t in doc),
            "documents_after_split": len(docs)}
    return docs, info


def _write_text(inp: str, mb: int) -> dict:
    docs, info = text_documents()
    target = mb * 1_000_000
    written = records = payload = 0
    part, lines, part_bytes, copy = 0, [], 0, 0

    def flush():
        nonlocal part, lines, part_bytes
        if lines:
            with open(os.path.join(inp, f"part-{part:04d}.jsonl"), "w") as f:
                f.write("".join(lines))
            part += 1
            lines, part_bytes = [], 0

    while written < target:
        for path, text in docs:
            if written >= target:
                break
            p = f"copy{copy}/{path}"
            line = json.dumps({"path": p, "text": text}) + "\n"
            n = len(line.encode())
            lines.append(line)
            written += n
            part_bytes += n
            records += 1
            payload += len(p.encode()) + len(text.encode())
            if part_bytes >= PART_BYTES:
                flush()
        copy += 1
    flush()
    return {"num_samples": records, "payload_bytes": payload, "copies": copy, **info}


def _write_tokens(inp: str, mb: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    n = max(1, round(mb * 1_000_000 / (WINDOW * 4)))
    schema = pa.schema([("tokens", pa.list_(pa.int32(), WINDOW))])
    with pq.ParquetWriter(os.path.join(inp, "tokens.parquet"), schema,
                          compression="zstd") as w:
        for arr in token_windows(n):
            col = pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1)), WINDOW)
            w.write_table(pa.Table.from_arrays([col], schema=schema), row_group_size=1024)
    return {"num_samples": n, "payload_bytes": n * WINDOW * 4}


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def ensure(kind: str, mb: int, *, log=print) -> dict:
    """Build the corpus input if not cached; return its meta (with ``dir`` and ``input``)."""
    if kind not in ("text", "tokens"):
        raise ValueError(f"kind must be 'text' or 'tokens', got {kind!r}")
    return cached(corpus_dir(kind, mb), _write_text if kind == "text" else _write_tokens,
                  kind, mb, version=VERSION, log=log)


def cached(d: str, write, kind: str, mb: int, *, version: int, log=print) -> dict:
    """The corpus in folder ``d``: ``write(input_dir, mb) -> meta`` runs once, then its
    meta (with ``dir`` and ``input``) is read back from ``d/meta.json``."""
    meta_path = os.path.join(d, "meta.json")
    if not os.path.exists(meta_path):
        shutil.rmtree(d, ignore_errors=True)
        inp = os.path.join(d, "input")
        os.makedirs(inp)
        log(f"building the {kind} corpus ({mb} MB) in {d}")
        meta = write(inp, mb)
        meta.update(kind=kind, mb=mb, version=version, input_bytes=du(inp))
        with open(meta_path + ".tmp", "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(meta_path + ".tmp", meta_path)  # written last: present means complete
    with open(meta_path) as f:
        meta = json.load(f)
    return {**meta, "dir": d, "input": os.path.join(d, "input")}
