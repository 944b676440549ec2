#!/usr/bin/env python3
"""Write a real text corpus that exists on every machine: the Python standard library.

Every ``*.py`` file under the running interpreter's stdlib becomes one JSONL record
``{"path", "text", "bytes"}``; records are spread over ``--files`` zstd-compressed JSONL
files in sorted path order, so the output is deterministic for a given Python.

    python -m zephon_store.testing.corpus --out .demo/raw --files 8
"""

from __future__ import annotations

import argparse
import json
import os
import sysconfig

import zstandard


def stdlib_sources(limit_bytes: int | None = None) -> list[tuple[str, str]]:
    root = sysconfig.get_paths()["stdlib"]
    out, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__",
                                                             "dist-packages"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):
                continue
            out.append((os.path.relpath(path, root), text))
            total += len(text)
            if limit_bytes and total >= limit_bytes:
                return sorted(out)
    return sorted(out)


def write_corpus(out_dir: str, *, files: int = 8, limit_bytes: int | None = None) -> list[str]:
    """Write the corpus; return the written paths."""
    os.makedirs(out_dir, exist_ok=True)
    docs = stdlib_sources(limit_bytes)
    per = -(-len(docs) // files)
    paths = []
    cctx = zstandard.ZstdCompressor(level=3)
    for k in range(files):
        chunk = docs[k * per:(k + 1) * per]
        if not chunk:
            break
        path = os.path.join(out_dir, f"stdlib-{k:03d}.jsonl.zst")
        body = "".join(json.dumps({"path": p, "text": t, "bytes": len(t.encode())}) + "\n"
                       for p, t in chunk).encode()
        with open(path, "wb") as f:
            f.write(cctx.compress(body))
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--limit-mb", type=float, default=None)
    a = ap.parse_args()
    paths = write_corpus(a.out, files=a.files,
                         limit_bytes=int(a.limit_mb * 1e6) if a.limit_mb else None)
    print(json.dumps({"files": paths, "bytes": sum(os.path.getsize(p) for p in paths)}))


if __name__ == "__main__":
    main()
