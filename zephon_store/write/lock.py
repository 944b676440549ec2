"""The output lock: one convert (or gc) at a time per dataset root.

Two converts into one output would share receipts and shard names and pull files from under
each other; a gc during a convert would delete shards the coming manifest names. Both take
this lock first, before any other work (so an S3 output without credentials fails before any
input is parsed).

- **Local** roots: ``ROOT/.zephon-lock`` held with ``flock``. The kernel drops the lock when
  its process dies, even by SIGKILL, so a lock file left by a killed convert is simply taken
  over (with a warning naming the old holder); nothing stale ever blocks.
- **Object stores**: a ``.zephon-lock`` object created with a conditional PUT
  (``If-None-Match: *``; AWS S3 and SeaweedFS honour it) and read back to check its owner
  token. A lock left by a convert that died on *this* host (its pid is gone) is taken over;
  one from another host is reported and must be removed by hand once that host's process is
  known to be gone (an object store cannot tell whether a remote process is alive). Taking
  over is best effort: two processes of one host taking over the same dead lock in the same
  few milliseconds could both succeed (S3 has no conditional DELETE).

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


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


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
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        previous = os.pread(fd, 4096, 0)
        if previous:
            _warn_takeover(out, _parse(previous))
        data = json.dumps(holder).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return fd


def _release_local(out: Storage, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(out.root_url, LOCK_NAME))
    os.close(fd)


# -- object stores: conditional PUT + read back ------------------------------------------------

def _read_remote(out: Storage) -> tuple[bool, dict | None]:
    """(exists, holder) of the lock object."""
    try:
        return True, _parse(out.read_file(LOCK_NAME))
    except FileNotFoundError:
        return False, None


def _acquire_remote(out: Storage, holder: dict) -> None:
    data = json.dumps(holder).encode()
    for _ in range(3):
        out.create_exclusive(LOCK_NAME, data)
        # Read back even after a 201: a store that ignores If-None-Match lets the last writer
        # win, and a retried PUT whose first try landed answers 412 although the lock is ours.
        exists, held = _read_remote(out)
        if not exists:
            continue  # released between our PUT and the read; try again
        if held is not None and held.get("token") == holder["token"]:
            return
        if (held is not None and held.get("host") == holder["host"]
                and not _pid_alive(held.get("pid"))):
            # Delete only the very lock found stale: another process of this host may have
            # taken it over since (S3 has no conditional DELETE; this narrows the window).
            if _read_remote(out)[1] == held:
                _warn_takeover(out, held)
                out.delete(LOCK_NAME)
            continue
        raise _locked_error(out, held)
    raise _locked_error(out, _read_remote(out)[1])


def _release_remote(out: Storage, holder: dict) -> None:
    exists, held = _read_remote(out)
    if exists and held is not None and held.get("token") == holder["token"]:
        out.delete(LOCK_NAME)


@contextlib.contextmanager
def output_lock(out: Storage, *, command: str = "convert") -> Iterator[dict]:
    """Hold the exclusive lock of the dataset root ``out`` for the ``with`` block.

    Raises :class:`~zephon_store.errors.OutputLockedError` at once (no waiting) when another
    process holds it. Yields the holder record written into the lock.

    >>> from zephon_store.io.storage import Storage
    >>> with output_lock(Storage(tmp)) as holder:
    ...     sorted(holder)
    ['command', 'host', 'pid', 'since', 'token']
    >>> with output_lock(Storage(tmp)), output_lock(Storage(tmp)):
    ...     pass
    Traceback (most recent call last):
    ...
    zephon_store.errors.OutputLockedError: another convert (pid ...) holds ...
    """
    holder = _holder(command)
    if out.local:
        fd = _acquire_local(out, holder)
        try:
            yield holder
        finally:
            _release_local(out, fd)
        return
    _acquire_remote(out, holder)
    try:
        yield holder
    finally:
        try:
            _release_remote(out, holder)
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


__all__ = ["LOCK_NAME", "is_locked", "output_lock"]
