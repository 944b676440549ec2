"""What the tests share, imported one way: ``from tests.helpers import ...``.

Here: the repository's ``ROOT``; synthetic corpora and the small datasets converted from
them; mixture files and a takedown's two sources; directory digests and resealed manifests;
the CLI as a test calls it; a JSON Lines parse that fails once; a forked call. The heavier
parts are modules beside this one, imported as ``from tests.helpers.<module> import``:
``stateful`` (the one save/load check of every stateful loader), ``faultproxy`` (an S3 proxy
that injects faults), ``gate`` (a parse that waits at a FIFO) and ``node_start`` (a simulated
node start against S3).

This module imports only the standard library at the top: spawned worker processes import
``tests.helpers.gate`` through it.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import pathlib
import random
from collections.abc import Callable, Iterator

# The repository's root (this file is tests/helpers/__init__.py): what tests read docs,
# package sources and golden files from, and what subprocesses get as PYTHONPATH.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def small_dataset(directory: str, *, files: int, records: int, row_group_rows: int,
                  target_shard_bytes: int = 1 << 14, seed: int = 0) -> str:
    """Convert a synthetic JSONL corpus (record ``id`` == global sequence number)."""
    import zephon_store as z

    raw = os.path.join(directory, "raw")
    out = os.path.join(directory, "ds")
    write_jsonl_corpus(raw, files=files, records=records, seed=seed)
    z.convert(sorted(glob.glob(os.path.join(raw, "*.jsonl"))), out,
              options=z.WriteOptions(target_shard_bytes=target_shard_bytes,
                                     row_group_rows=row_group_rows, row_group_bytes=None))
    return out


def opened(url: str, *, samples: int | None = None, row_groups: int | None = None):
    """``open_dataset(url)``, checked to hold ``samples`` samples and ``row_groups`` row
    groups (each when given): a fixture's guard that the data is the shape its tests assume."""
    from zephon_store.read.dataset import open_dataset

    dataset = open_dataset(url)
    if samples is not None:
        assert dataset.num_samples == samples
    if row_groups is not None:
        assert dataset.manifest.num_row_groups == row_groups
    return dataset


def sequential_steps(manifest, per_step: int = 2):
    """``step -> row groups`` reading ``manifest``'s row groups in order, ``per_step`` a
    step: the plan a prefetcher is given in the tests that count what it fetches."""
    import numpy as np

    rgs = np.arange(manifest.num_row_groups)
    return lambda i: rgs[i * per_step:(i + 1) * per_step]


def converted(directory, *, files: int, records: int, seed: int = 0, **options) -> str:
    """Write a corpus (:func:`write_jsonl_corpus`) to ``directory/src`` and convert it to
    ``directory/ds`` with ``WriteOptions(**options)``; returns the dataset's path."""
    from zephon_store import convert
    from zephon_store.write.shardwriter import WriteOptions

    src, out = os.path.join(str(directory), "src"), os.path.join(str(directory), "ds")
    write_jsonl_corpus(src, files=files, records=records, seed=seed)
    convert([src], out, options=WriteOptions(**options))
    return out


# A takedown over two sources: the ids denied in each, and the text a denied record carries,
# so that a leak shows in any column.
DENY = {"web": [3, 17, 40], "code": [0, 5]}
MARK = "SECRET"


def takedown_sources(root) -> tuple[str, str]:
    """The URLs of ``web`` (60 records) and ``code`` (30) converted under ``root`` (shards of
    4 KiB, row groups of 8 rows): record ``i`` is ``{"text": "<name> <i>", "n": i}``, except
    that a denied one (``DENY``) has ``MARK`` in its text and ``n`` -1."""
    import zephon_store as z

    small = z.WriteOptions(target_shard_bytes=1 << 12, row_group_rows=8, row_group_bytes=None)
    urls = []
    for name, n in (("web", 60), ("code", 30)):
        src = root / f"{name}.jsonl"
        with open(src, "w") as f:
            for i in range(n):
                bad = i in DENY[name]
                f.write(json.dumps({"text": f"{MARK} {name} {i}" if bad else f"{name} {i}",
                                    "n": -1 if bad else i}) + "\n")
        urls.append(z.convert([str(src)], str(root / name), options=small).url)
    return urls[0], urls[1]


def two_stage_mixture(path, sources: dict[str, tuple[str, list[float]]]) -> str:
    """Write a JSON mixture file of ``sources`` (``{name: (url, [warm weight, main
    weight])}``) in two stages, ``warm`` from sample 0 and ``main`` from step 3; returns its
    path."""
    pathlib.Path(path).write_text(json.dumps({
        "stages": [{"name": "warm", "start": {"samples": 0}},
                   {"name": "main", "start": {"steps": 3}}],
        "sources": [{"name": name, "url": url, "weights": weights}
                    for name, (url, weights) in sources.items()]}))
    return str(path)


def _toml(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return str(value)


def mixture_toml(*, stages: dict[str, dict], sources: list[dict], **top) -> str:
    """The text of a TOML mixture file: the ``top`` keys (``seed = 5``), then a
    ``[[stages]]`` table per ``{name: start}`` and a ``[[sources]]`` table per dict, one
    ``key = value`` line per key, in order (inline tables for dicts)."""
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    for name, start in stages.items():
        lines += ["[[stages]]", f'name = "{name}"', f"start = {_toml(start)}"]
    for source in sources:
        lines += ["[[sources]]", *(f"{k} = {_toml(v)}" for k, v in source.items())]
    return "\n".join(lines) + "\n"


def reseal(ds, edit: Callable[[dict], None]) -> None:
    """Edit ``ds``'s manifest.json and recompute ``dataset_id``: a consistent manifest that
    lies."""
    from zephon_store.format.manifest import compute_dataset_id

    doc = json.loads((ds / "manifest.json").read_text())
    edit(doc)
    doc["dataset_id"] = compute_dataset_id(doc)
    (ds / "manifest.json").write_text(json.dumps(doc))


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``zephon *argv`` through ``main()`` (each argument as ``str``): exit code, stdout,
    stderr."""
    from zephon_store.cli.main import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@contextlib.contextmanager
def first_parse_fails(message: str) -> Iterator[list[int]]:
    """JSON Lines' fast parse raises ``ArrowInvalid(message)`` on its first call only, so
    the fallback path builds that table; yields the list of calls (one entry each)."""
    from unittest import mock

    import pyarrow as pa

    from zephon_store.ingest import jsonl as jsonl_mod

    real, calls = jsonl_mod.parse_lines, []

    def fail_first(data: bytes) -> pa.Table:
        calls.append(1)
        if len(calls) == 1:
            raise pa.ArrowInvalid(message)
        return real(data)

    with mock.patch.object(jsonl_mod, "parse_lines", fail_first):
        yield calls


class CrashOnSecond:
    """A stand-in for a conversion task function that records each task's input index
    (``task[0]``) in ``calls`` and, while ``crash`` is set, raises KeyboardInterrupt at the
    second call: a conversion killed part way through its tasks."""

    def __init__(self, real: Callable) -> None:
        self.real, self.calls, self.crash = real, [], False

    def __call__(self, task):
        self.calls.append(task[0])
        if self.crash and len(self.calls) == 2:
            raise KeyboardInterrupt("simulated crash")
        return self.real(task)
