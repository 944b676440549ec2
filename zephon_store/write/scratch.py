"""Local scratch files of conversions into remote outputs, in the system temp folder.

A stage writing into a remote staging area writes each file locally first, then publishes it
with one PUT that moves it (:meth:`~zephon_store.write.staging.StagingArea.put`). A run
killed in between leaves the file behind. So each process writes into a folder of its own,
``<temp>/zephon-scratch/<pid>-<random>/``, holding ``.lock`` ``flock``-ed for as long as the
process lives: the kernel lets go at its death, ``kill -9`` included, and whatever process
reuses the pid holds no lock on it. That makes a stale folder decidable without guessing:

- ``zephon cache info`` counts the scratch files and those of live processes
  (:func:`scratch_info`); ``zephon cache clear`` removes every folder whose lock it can take
  (:func:`scratch_clear`), never one a live process holds;
- a process making its own folder removes the stale ones it finds, so a killed run's
  scratch goes with the next conversion on the host;
- a process removes its own folder at exit.

A folder is removed under its own lock: taken, the folder renamed to ``.trash-...`` (one
atomic step), then deleted. A process making a folder locks it only if that still names the
folder it made, so a clear racing a new folder makes the maker pick another name, never
write into a folder being deleted.

Files in the top folder itself (``<name>.<pid>.<random>.tmp...``) come from the first layout,
which had no lock: they are removed by ``clear`` once no process has their pid.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import threading
import uuid

from .._util.process import process_alive

SCRATCH_DIRNAME = "zephon-scratch"
_LOCK = ".lock"
_TRASH = ".trash-"
# The first layout's names: temp_name()'s "<path>.<pid>.<8 hex>.tmp", then maybe ".npy"...
_FIRST_LAYOUT = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.tmp(\.[A-Za-z0-9]+)?$")

_mutex = threading.Lock()
_own: tuple[int, str, int] | None = None     # (pid, folder, fd of its held lock)


def scratch_root() -> str:
    """``<system temp folder>/zephon-scratch`` (``$TMPDIR`` moves it)."""
    return os.path.join(tempfile.gettempdir(), SCRATCH_DIRNAME)


def scratch_dir() -> str:
    """This process's scratch folder, made and locked on first use (and again if it was
    removed from under it).

    >>> os.path.isdir(scratch_dir()) and scratch_dir() == scratch_dir()
    True
    """
    global _own
    with _mutex:
        own = _own
        if own is not None and own[0] == os.getpid() and os.path.isdir(own[1]):
            return own[1]
        if own is not None and own[0] == os.getpid():
            os.close(own[2])      # its folder went away: its lock guards nothing
        root = scratch_root()
        _own = _make(root)
        reclaimed = _own[1]
    _reclaim_stale(root, keep=reclaimed)
    return reclaimed


def _make(root: str) -> tuple[int, str, int]:
    os.makedirs(root, exist_ok=True)
    while True:
        path = os.path.join(root, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.mkdir(path)
        fd = _take(path)
        if fd is not None:
            return os.getpid(), path, fd
        # A clear took the fresh folder for a stale one: it removes it; use another name.


def _take(folder: str) -> int | None:
    """``folder``'s lock if no one holds it now and the folder is still there, else None."""
    lock = os.path.join(folder, _LOCK)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The lock of a file another remover already unlinked guards nothing.
        if os.stat(lock).st_ino == os.fstat(fd).st_ino:
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


def _remove_locked(folder: str, fd: int) -> None:
    """Delete ``folder``, whose lock ``fd`` holds: renamed out of the way, then removed."""
    parent, name = os.path.split(folder)
    trash = os.path.join(parent, f"{_TRASH}{name}-{uuid.uuid4().hex[:6]}")
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        trash = None
    finally:
        os.close(fd)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def _files(folder: str) -> list[tuple[str, int]]:
    """``(path, bytes)`` of the scratch files under ``folder`` (its lock file not counted)."""
    out = []
    for dirpath, _, names in os.walk(folder):
        for n in names:
            if dirpath == folder and n == _LOCK:
                continue
            p = os.path.join(dirpath, n)
            with contextlib.suppress(OSError):
                out.append((p, os.lstat(p).st_size))
    return out


def _entries(root: str):
    try:
        with os.scandir(root) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _reclaim_stale(root: str, *, keep: str | None = None) -> tuple[int, int, int]:
    """Remove the scratch of dead processes under ``root``: ``(files, bytes, in_use)``."""
    files = freed = busy = 0
    for e in _entries(root):
        if e.name.startswith(_TRASH):      # a remover killed mid-delete
            shutil.rmtree(e.path, ignore_errors=True)
            continue
        if e.path == keep:
            continue
        if e.is_dir(follow_symlinks=False):
            fd = _take(e.path)
            if fd is None:
                busy += len(_files(e.path))
                continue
            found = _files(e.path)
            _remove_locked(e.path, fd)
            files, freed = files + len(found), freed + sum(n for _, n in found)
        elif e.is_file(follow_symlinks=False):
            m = _FIRST_LAYOUT.search(e.name)
            if m is None:
                continue        # not ours: never touched
            if process_alive(int(m.group(1))):
                busy += 1
                continue
            with contextlib.suppress(OSError):
                size = e.stat(follow_symlinks=False).st_size
                os.unlink(e.path)
                files, freed = files + 1, freed + size
    return files, freed, busy


def scratch_info() -> dict:
    """``{"scratch_dir", "scratch_files", "scratch_bytes", "scratch_in_use"}``: every
    scratch file on this host and, of them, those of live processes (kept by a clear)."""
    from .lock import is_locked

    root = scratch_root()
    files = size = busy = 0
    for e in _entries(root):
        if e.name.startswith(_TRASH):
            continue
        found: list[tuple[str, int]] = []
        if e.is_dir(follow_symlinks=False):
            found = _files(e.path)
            if is_locked(os.path.join(e.path, _LOCK)):
                busy += len(found)
        elif e.is_file(follow_symlinks=False) and (m := _FIRST_LAYOUT.search(e.name)):
            with contextlib.suppress(OSError):
                found = [(e.path, e.stat(follow_symlinks=False).st_size)]
            busy += process_alive(int(m.group(1)))
        else:
            continue
        files, size = files + len(found), size + sum(n for _, n in found)
    return {"scratch_dir": root, "scratch_files": files, "scratch_bytes": size,
            "scratch_in_use": busy}


def scratch_clear() -> dict:
    """Remove the scratch files of processes no longer alive; keep those of live ones.

    Returns ``{"cleared_scratch_files", "cleared_scratch_bytes", "scratch_in_use"}``.
    """
    with _mutex:       # this process's own folder is live: never taken for stale
        own = _own[1] if _own is not None and _own[0] == os.getpid() else None
    files, freed, busy = _reclaim_stale(scratch_root(), keep=own)
    if own is not None:
        busy += len(_files(own))
    return {"cleared_scratch_files": files, "cleared_scratch_bytes": freed,
            "scratch_in_use": busy}


@atexit.register
def _remove_own() -> None:
    global _own
    own, _own = _own, None
    if own is not None and own[0] == os.getpid():
        _remove_locked(own[1], own[2])


def _after_fork_in_child() -> None:
    # The parent's folder stays the parent's: the child closes its copy of the lock's
    # descriptor (a flock lasts while any copy is open, so the parent keeps it) and makes
    # its own folder on first use. A mutex held by a parent thread at the fork is replaced.
    global _mutex, _own
    _mutex = threading.Lock()
    own, _own = _own, None
    if own is not None:
        with contextlib.suppress(OSError):
            os.close(own[2])


os.register_at_fork(after_in_child=_after_fork_in_child)
