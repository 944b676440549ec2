"""Small helpers shared by the tests: corpora and directory digests."""

from __future__ import annotations

import hashlib
import json
import os
import random


def write_jsonl_corpus(directory, *, files: int = 4, records: int = 500, seed: int = 0,
                       suffix: str = ".jsonl") -> list[dict]:
    """Write ``files`` JSONL files of synthetic records; return all records in order."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "ünïcødé", "∑"]
    os.makedirs(directory, exist_ok=True)
    out = []
    n = 0
    for k in range(files):
        lines = []
        for _ in range(records):
            rec = {"id": n, "text": " ".join(rng.choice(words) for _ in range(rng.randint(1, 60))),
                   "score": round(rng.random(), 6), "tags": [rng.choice(words)
                                                            for _ in range(rng.randint(0, 3))]}
            lines.append(json.dumps(rec, ensure_ascii=False))
            out.append(rec)
            n += 1
        data = ("\n".join(lines) + "\n").encode()
        path = os.path.join(str(directory), f"part-{k:03d}{suffix}")
        if suffix.endswith(".zst"):
            import zstandard

            data = zstandard.ZstdCompressor().compress(data)
        elif suffix.endswith(".gz"):
            import gzip

            data = gzip.compress(data, mtime=0)
        with open(path, "wb") as f:
            f.write(data)
    return out


def tree_digest(directory) -> dict[str, str]:
    """{relative path: md5} of every file under ``directory`` (staging excluded)."""
    out = {}
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != ".zephon-staging"]
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, directory)] = hashlib.md5(f.read()).hexdigest()
    return out


def in_fork(fn) -> str:
    """Run ``fn()`` in a forked child and return what it returned, as ``str`` (the child
    exits at once after, without running the parent's cleanup; an exception in the child
    returns its repr)."""
    import os

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                out = str(fn())
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = f"raised {exc!r}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()
