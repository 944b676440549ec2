"""The converter's staging folder and worker pool.

A conversion stages parsed inputs and per-shard receipts in a folder keyed by a hash of
its output, inputs and options (the "job"), so rerunning the same command after a crash
reuses them; a different input or option is a different job and never reuses stale work.

Where: ``OUT/.zephon-staging/<job>`` for a local output, else
``$ZEPHON_CACHE_DIR/staging/<job>`` (or ``staging_dir/<job>``). A job folder is only used
under the output's lock (:mod:`zephon_store.write.lock`) and holds ``.active`` flock-ed while a
convert runs in it, so ``zephon cache clear`` never removes a live one. Every temp file in it
carries the writing process's pid and a random part. A finished job's folder is first renamed
to ``.<job>.trash.<pid>`` and then removed, so a crash during cleanup never leaves a
half-deleted folder that a rerun would take for staged work.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, is_dataclass

from .. import __version__
from .._util.atomic import atomic_write
from .._util.hashing import xxh3_hex
from ..format.manifest import canonical_json
from ..io.storage import Storage

STAGING_DIRNAME = ".zephon-staging"
_ACTIVE = ".active"
_OWNER = "output.json"
_TRASH = ".trash."


def _stamp(url: str) -> int | None:
    """Modification time (ns) of a local input, so an edited input is never taken for done."""
    path = url.removeprefix("file://")
    if "://" in path:
        return None  # object stores: the size (part of the key) and a rerun's listing
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def job_key(files, options, input_options, parse_fn, extra, output: str = "") -> str:
    desc = {
        # Two outputs of the same inputs stage apart (S3 outputs share the user cache).
        "output": output,
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
    return os.path.join(staging_root(), job)


def temp_name(path: str) -> str:
    """A name beside ``path`` no other process or thread uses: ``path.<pid>.<random>.tmp``."""
    return f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


def read_json(path: str):
    """The staged JSON at ``path``, or None when it is absent or unreadable (redo the work)."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def atomic_write_json(path: str, obj) -> None:
    """``obj`` as sorted-key JSON at ``path``, written by :func:`~zephon_store._util.atomic.atomic_write`."""
    atomic_write(path, json.dumps(obj, sort_keys=True).encode())


# -- the job folder -------------------------------------------------------------------------

def open_job(path: str, output: str) -> int:
    """Create the job folder ``path`` for ``output`` and mark it active; returns the marker's
    fd (its ``flock`` lasts as long as this process holds it: :func:`finish_job` or death)."""
    import fcntl

    for sub in ("parsed", "done", "tmp"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    owner = os.path.join(path, _OWNER)
    if not os.path.exists(owner):
        atomic_write_json(owner, {"output": output})
    fd = os.open(os.path.join(path, _ACTIVE), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _owner_of(job: str) -> str | None:
    doc = read_json(os.path.join(job, _OWNER))
    return doc.get("output") if isinstance(doc, dict) else None


def _remove_tree(path: str) -> None:
    """Rename ``path`` out of the way (one atomic step), then delete it."""
    parent, name = os.path.split(path)
    trash = os.path.join(parent, f".{name.lstrip('.')}{_TRASH}{os.getpid()}.{uuid.uuid4().hex[:6]}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _rmdir_if_empty(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def remove_stale_jobs(job_path: str, output: str) -> int:
    """Delete the other job folders of ``output`` (other option sets, killed cleanups) beside
    ``job_path``; only call it under the output's lock. Returns how many were removed."""
    from .lock import is_locked

    parent = os.path.dirname(job_path)
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return 0
    in_output = os.path.basename(parent) == STAGING_DIRNAME  # OUT/.zephon-staging: all ours
    removed = 0
    for name in names:
        path = os.path.join(parent, name)
        if path == job_path or not os.path.isdir(path):
            continue
        if is_locked(os.path.join(path, _ACTIVE)):
            continue  # a live process: another output's job, or a cleanup still running
        if in_output or _TRASH in name or _owner_of(path) == output:
            _remove_tree(path)
            removed += 1
    return removed


def finish_job(job_path: str, fd: int | None) -> None:
    """Remove a finished job's folder (and ``.zephon-staging/`` itself once it is empty)."""
    _remove_tree(job_path)
    if fd is not None:
        os.close(fd)
    parent = os.path.dirname(job_path)
    if os.path.basename(parent) == STAGING_DIRNAME:
        _rmdir_if_empty(parent)


def staging_root(directory: str | None = None) -> str:
    """Where jobs of remote outputs stage: ``<cache dir>/staging``."""
    from ..io.cache import default_cache_dir

    return os.path.join(directory or default_cache_dir(), "staging")


def staging_info(directory: str | None = None) -> dict:
    """``{"staging_dir", "staging_jobs", "staging_bytes"}`` of the cache's staging folder."""
    root = staging_root(directory)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        names = []
    return {"staging_dir": root, "staging_jobs": len(names),
            "staging_bytes": sum(_tree_bytes(os.path.join(root, n)) for n in names)}


def staging_clear(directory: str | None = None) -> dict:
    """Remove every staged job in the cache not in use by a running convert.

    Returns ``{"cleared_staging_jobs", "cleared_staging_bytes", "staging_in_use"}``.
    """
    from .lock import is_locked

    root = staging_root(directory)
    cleared, freed, busy = 0, 0, 0
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if is_locked(os.path.join(path, _ACTIVE)):
                busy += 1
                continue
            freed += _tree_bytes(path)
            _remove_tree(path)
            cleared += 1
    return {"cleared_staging_jobs": cleared, "cleared_staging_bytes": freed,
            "staging_in_use": busy}


def _tree_bytes(path: str) -> int:
    size = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(dirpath, f)).st_size
    return size


def _die_with_parent() -> None:
    """Pool worker initializer: exit when the converter dies, even by SIGKILL; ignore SIGINT.

    Otherwise a killed conversion leaves idle workers behind forever. Linux only (prctl
    PR_SET_PDEATHSIG); elsewhere the workers exit when their task queue closes. A terminal's
    Ctrl-C reaches the whole process group: the parent alone handles it (one line, exit 130)
    and stops the workers, which would otherwise each print a KeyboardInterrupt traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

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
            self._start_workers()
        elif self.threads > 1:
            self._ex = ThreadPoolExecutor(self.threads, thread_name_prefix="zephon-convert")
        return self

    def _start_workers(self) -> None:
        """Start every worker now, with SIGINT ignored: the disposition survives fork + exec,
        so a Ctrl-C that lands while a worker is still importing cannot print its traceback
        (the initializer's own SIG_IGN comes only after the imports)."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for _ in range(self.workers):  # each submit without an idle worker spawns one
                self._ex.submit(int)
        finally:
            signal.signal(signal.SIGINT, previous)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._ex is None:
            return
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) and self.workers > 1:
            # Do not wait for running tasks (a large input can take minutes): stop now.
            processes = list((getattr(self._ex, "_processes", None) or {}).values())
            self._ex.shutdown(wait=False, cancel_futures=True)
            for p in processes:
                with contextlib.suppress(Exception):
                    p.kill()
            return
        self._ex.shutdown(cancel_futures=True)

    def map(self, fn, items: list) -> Iterator:
        if self._ex is None:
            return map(fn, items)
        return self._ex.map(fn, items)
