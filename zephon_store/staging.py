"""The converter's staging folder and worker pool.

A conversion stages parsed inputs and per-shard receipts in a folder keyed by a hash of
its inputs and options (the "job"), so rerunning the same command after a crash reuses
them; a different input or option is a different job and never reuses stale work.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, is_dataclass

from . import __version__
from .hashing import xxh3_hex
from .manifest import canonical_json
from .storage import Storage

STAGING_DIRNAME = ".zephon-staging"


def _stamp(url: str) -> int | None:
    """Modification time (ns) of a local input, so an edited input is never taken for done."""
    path = url.removeprefix("file://")
    if "://" in path:
        return None  # object stores: the size (part of the key) and a rerun's listing
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def job_key(files, options, input_options, parse_fn, extra) -> str:
    desc = {
        "inputs": [[f.url, f.size, f.kind, f.compression, _stamp(f.url)] for f in files],
        "write": options.to_dict(),
        "input": asdict(input_options) if is_dataclass(input_options) else repr(input_options),
        "parse": f"{parse_fn.__module__}.{getattr(parse_fn, '__qualname__', repr(parse_fn))}",
        "extra": extra,
        "zephon": __version__,
    }
    return xxh3_hex(canonical_json(desc))[:16]


def job_dir(output: str, out: Storage, job: str, base: str | None) -> str:
    """Where a job stages: ``base/<job>``, else inside a local output, else the user cache."""
    if base:
        return os.path.join(base, job)
    if out.local:
        return os.path.join(out.root_url, STAGING_DIRNAME, job)
    from .cache import default_cache_dir

    return os.path.join(default_cache_dir(), "staging", job)


def atomic_write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _die_with_parent() -> None:
    """Pool worker initializer: exit when the converter dies, even by SIGKILL.

    Otherwise a killed conversion leaves idle workers behind forever. Linux only (prctl
    PR_SET_PDEATHSIG); elsewhere the workers exit when their task queue closes.
    """
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            return
        if os.getppid() == 1:  # the parent already died before prctl took effect
            os._exit(1)


class Pool:
    """A process pool, or threads of the current process when ``workers == 1``.

    With one worker, inputs are parsed and shards written by ``threads`` threads (default:
    two, or one on a one-core host): pyarrow parses JSON, compresses and writes without the
    GIL, so a second thread overlaps one shard's compression with the next one's (and one
    input's parse with the next), where one thread left the second core idle. Results come
    back in task order either way, so the output is the same byte for byte.
    """

    def __init__(self, workers: int, *, threads: int | None = None) -> None:
        self.workers = workers
        self.threads = threads if threads is not None else min(2, os.cpu_count() or 1)
        self._ex = None

    def __enter__(self) -> Pool:
        if self.workers > 1:
            # spawn, not fork: forking a process that already runs pyarrow/fsspec threads can
            # deadlock.
            self._ex = ProcessPoolExecutor(self.workers, initializer=_die_with_parent,
                                           mp_context=multiprocessing.get_context("spawn"))
        elif self.threads > 1:
            self._ex = ThreadPoolExecutor(self.threads, thread_name_prefix="zephon-convert")
        return self

    def __exit__(self, *exc) -> None:
        if self._ex is not None:
            self._ex.shutdown(cancel_futures=True)

    def map(self, fn, items: list) -> Iterator:
        if self._ex is None:
            return map(fn, items)
        return self._ex.map(fn, items)
