"""The grid's corpora: the peer benchmark's text and tokens, and a code corpus.

``text`` and ``tokens`` are :func:`benchmarks.peers.corpus.ensure`'s (real documents from
the stdlib and ``/usr/share/doc``; 2049-token int32 windows). ``code`` is the Python
environment's own installed packages (``site-packages``: ``.py``, ``.pyi``, ``.md``,
``.txt``, ``.json``, ``.toml``, ``.cfg`` files, sorted by path), as JSONL records
``{"path", "text", "lang", "n_lines", "n_bytes"}``: web/code-like text beside small
scalar columns (a short repeated string and two integers), the third column kind the grid
rules on. Files over 64 KiB are skipped. Built once under ``.bench/format/corpora/``.
"""

from __future__ import annotations

import json
import os
import sysconfig

from ..peers import corpus as peers_corpus
from ..peers.common import ROOT

VERSION = 1
BENCH = os.path.join(ROOT, ".bench", "format")
EXTENSIONS = (".py", ".pyi", ".md", ".txt", ".json", ".toml", ".cfg")
MAX_FILE = 64 << 10
PART_BYTES = 16_000_000


def _code_files(root: str):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if not name.endswith(EXTENSIONS) or os.path.islink(path):
                continue
            try:
                if os.path.getsize(path) > MAX_FILE:
                    continue
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                continue
            if text.strip() and "\x00" not in text:
                yield os.path.relpath(path, root), text


def _write_code(inp: str, mb: int) -> dict:
    root = sysconfig.get_paths()["purelib"]
    target = mb * 1_000_000
    written = records = payload = part = 0
    lines: list[str] = []
    part_bytes = 0
    for rel, text in _code_files(root):
        if written >= target:
            break
        rec = {"path": rel, "text": text, "lang": os.path.splitext(rel)[1][1:],
               "n_lines": text.count("\n"), "n_bytes": len(text.encode())}
        line = json.dumps(rec) + "\n"
        lines.append(line)
        written += len(line.encode())
        part_bytes += len(line.encode())
        records += 1
        payload += len(rel.encode()) + rec["n_bytes"]
        if part_bytes >= PART_BYTES:
            with open(os.path.join(inp, f"part-{part:04d}.jsonl"), "w") as f:
                f.write("".join(lines))
            part, lines, part_bytes = part + 1, [], 0
    if lines:
        with open(os.path.join(inp, f"part-{part:04d}.jsonl"), "w") as f:
            f.write("".join(lines))
    return {"num_samples": records, "payload_bytes": payload, "source": root}


def ensure(kind: str, mb: int, *, log=print) -> dict:
    """The corpus's meta (``dir``, ``input``, ``num_samples``, ``payload_bytes``), built if
    absent."""
    if kind != "code":
        return peers_corpus.ensure(kind, mb, log=log)
    d = os.path.join(BENCH, "corpora", f"code-{mb}mb-v{VERSION}")
    return peers_corpus.cached(d, _write_code, "code", mb, version=VERSION, log=log)
