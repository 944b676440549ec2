"""The output lock: one convert (or gc) at a time per dataset root.

Two converts into one output would share receipts and shard names and pull files from under
each other; a gc during a convert would delete shards the coming manifest names. Both take
this lock first, before any other work (so an S3 output without credentials fails before any
input is parsed), and re-check it (:meth:`HeldLock.check`) right before they publish a
manifest or delete anything: a holder that lost its lock fails instead of acting.

- **Local** roots: ``ROOT/.zephon-lock`` held with ``flock``. The kernel drops the lock when
  its process dies, even by SIGKILL, so a lock file left by a killed convert is simply taken
  over (with a warning naming the old holder); nothing stale ever blocks. The re-check makes
  sure the file at that path is still the one this process locked, holding its token (the
  file removed by hand and taken by another process is a lost lock).
- **Object stores**: a ``.zephon-lock`` object created with a conditional PUT
  (``If-None-Match: *``) and read back to check its owner token. A lock left by a convert
  that died on *this* host (its pid is gone) is taken over with a PUT conditional on the
  stale lock's ETag (``If-Match``), so of any number of processes taking over one dead
  lock at once exactly one wins and the others see a live holder; nobody ever deletes a lock
  to take it over. Release is a DELETE conditional on the holder's own ETag, so it never
  removes another's lock. AWS S3 and SeaweedFS honour both headers. A lock from another host
  is reported and must be removed by hand once that host's process is known to be gone (an
  object store cannot tell whether a remote process is alive).

The lock holds ``{"pid", "host", "since", "token", "command"}``; the error a second convert
gets names them: ``another convert (pid P on host H, since T) holds OUT; wait for it, or
remove OUT/.zephon-lock if that process is gone``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from .._util.process import is_pid, process_alive
from ..errors import OutputLockedError
from ..io.storage import Storage

LOCK_NAME = ".zephon-lock"
_log = logging.getLogger(__name__)


def _holder(command: str) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "token": uuid.uuid4().hex}


def _parse(data: bytes) -> dict | None:
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _describe(held: dict | None) -> str:
    if not held:
        return "(holder not recorded yet)"
    return (f"(pid {held.get('pid')} on host {held.get('host')}, since {held.get('since')})")


def _locked_error(out: Storage, held: dict | None) -> OutputLockedError:
    what = (held or {}).get("command") or "convert"
    return OutputLockedError(
        f"another {what} {_describe(held)} holds {out.root_url}; wait for it, or remove "
        f"{out.url(LOCK_NAME)} if that process is gone")


def _warn_takeover(out: Storage, held: dict | None) -> None:
    _log.warning("taking over the lock of %s at %s: the convert %s is gone (killed or "
                 "crashed); its staged work is reused", out.root_url, out.url(LOCK_NAME),
                 _describe(held))


# -- local: flock --------------------------------------------------------------------------

def _acquire_local(out: Storage, holder: dict) -> int:
    import fcntl

    path = os.path.join(out.root_url, LOCK_NAME)
    os.makedirs(out.root_url, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = _parse(os.pread(fd, 4096, 0))
            os.close(fd)
            raise _locked_error(out, held) from None
        # The holder unlinks the file before it unlocks: if ours is no longer the file at
        # ``path``, we locked a released inode; start again on the current one.
        if not _same_file(path, fd):
            os.close(fd)
            continue
        previous = os.pread(fd, 4096, 0)
        if previous:
            _warn_takeover(out, _parse(previous))
        data = json.dumps(holder).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return fd


def _same_file(path: str, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _release_local(out: Storage, fd: int) -> None:
    path = os.path.join(out.root_url, LOCK_NAME)
    # Unlink only our own file: after a lost lock, the file there is another holder's.
    if _same_file(path, fd):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    os.close(fd)


# -- object stores: conditional PUT + read back ------------------------------------------------

def _read_remote(out: Storage) -> tuple[dict | None, str | None]:
    """(holder, etag) of the lock object; (None, None) when there is none."""
    try:
        data, etag = out.read_with_etag(LOCK_NAME)
    except FileNotFoundError:
        return None, None
    return (_parse(data) or {}), etag


def _stale_here(held: dict, holder: dict) -> bool:
    """Whether ``held`` is the lock of a process of this host that is gone (a zombie too).

    A record whose pid is no process id was not written by a convert or gc (another tool, a
    hand edit): whoever holds it may be alive, so it is never stale; the error names the
    object to remove.
    """
    pid = held.get("pid")
    return held.get("host") == holder["host"] and is_pid(pid) and not process_alive(pid)


def _acquire_remote(out: Storage, holder: dict) -> str:
    """Take the lock; return its ETag (what release and the re-check compare)."""
    data = json.dumps(holder).encode()
    for _ in range(5):
        out.create_exclusive(LOCK_NAME, data)
        # Read back even after a 201: a store that ignores If-None-Match lets the last writer
        # win, and a retried PUT whose first try landed answers 412 although the lock is ours.
        held, etag = _read_remote(out)
        if held is None:
            continue  # released between our PUT and the read; try again
        if held.get("token") == holder["token"]:
            return etag
        if _stale_here(held, holder):
            # Conditional on the very lock judged stale: of several processes taking it over
            # at once, one PUT lands and the others get 412, then find a live holder.
            if out.replace_if_match(LOCK_NAME, data, etag):
                _warn_takeover(out, held)
            continue
        raise _locked_error(out, held)
    raise _locked_error(out, _read_remote(out)[0])


def _release_remote(out: Storage, lock: HeldLock) -> None:
    if not out.delete_if_match(LOCK_NAME, lock.etag):
        held, _ = _read_remote(out)
        if held is not None and held.get("token") == lock.holder["token"]:
            _log.warning("could not remove the lock %s (it changed under this process); the "
                         "next convert on this host takes it over, or remove it by hand",
                         out.url(LOCK_NAME))


@dataclass
class HeldLock:
    """A held output lock: ``holder`` is the record written into it (pid, host, since, token,
    command). :meth:`check` raises unless it is still this process's lock."""

    storage: Storage
    holder: dict
    fd: int | None = None
    etag: str | None = None

    def check(self, before: str = "publishing the manifest (nothing was published)") -> None:
        """Raise :class:`~zephon_store.errors.OutputLockedError` when this lock is no longer
        ours (removed by hand, taken over by another process): called right before a manifest
        is published or anything is deleted, so a holder that lost its lock never acts.
        ``before`` names what it stopped before, for the message."""
        out = self.storage
        if out.local:
            path = os.path.join(out.root_url, LOCK_NAME)
            ours = _same_file(path, self.fd)
            held = _parse(os.pread(self.fd, 4096, 0)) if ours else _read_local(path)
            ours = ours and (held or {}).get("token") == self.holder["token"]
        else:
            held, _ = _read_remote(out)
            ours = held is not None and held.get("token") == self.holder["token"]
        if not ours:
            now = f"another process {_describe(held)} holds it now" if held else "it is gone"
            raise OutputLockedError(
                f"{out.root_url}: this {self.holder['command']} lost its lock "
                f"{out.url(LOCK_NAME)} ({now}: removed by hand or taken over) and stopped "
                f"before {before}; once no other convert or gc runs there, rerun the same "
                "command")


def _read_local(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            return _parse(f.read(4096))
    except OSError:
        return None


@contextlib.contextmanager
def output_lock(out: Storage, *, command: str = "convert") -> Iterator[HeldLock]:
    """Hold the exclusive lock of the dataset root ``out`` for the ``with`` block.

    Raises :class:`~zephon_store.errors.OutputLockedError` at once (no waiting) when another
    process holds it. Yields the :class:`HeldLock`; call its ``check()`` right before
    publishing or deleting.

    >>> from zephon_store.io.storage import Storage
    >>> with output_lock(Storage(tmp)) as lock:
    ...     lock.check()
    ...     sorted(lock.holder)
    ['command', 'host', 'pid', 'since', 'token']
    >>> with output_lock(Storage(tmp)), output_lock(Storage(tmp)):
    ...     pass
    Traceback (most recent call last):
    ...
    zephon_store.errors.OutputLockedError: another convert (pid ...) holds ...
    """
    holder = _holder(command)
    if out.local:
        lock = HeldLock(out, holder, fd=_acquire_local(out, holder))
        try:
            yield lock
        finally:
            _release_local(out, lock.fd)
        return
    lock = HeldLock(out, holder, etag=_acquire_remote(out, holder))
    try:
        yield lock
    finally:
        try:
            _release_remote(out, lock)
        except OSError as exc:
            # Never mask the block's own outcome; a lock left behind on this host is taken
            # over by the next run (its pid is gone).
            _log.warning("could not remove the lock %s (%s); the next convert on this host "
                         "takes it over, or remove it by hand", out.url(LOCK_NAME), exc)


def is_locked(path: str) -> bool:
    """True when a local file ``path`` is ``flock``-ed by a live process (staging's marker)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


__all__ = ["LOCK_NAME", "HeldLock", "is_locked", "output_lock"]
