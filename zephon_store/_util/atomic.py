"""The one atomic local write: readers see the old file or the whole new one, never a part.

A temp file beside the target (same directory, so ``os.replace`` is a rename on one file
system), written and fsynced, renamed over the target, then the directory fsynced so the
rename itself survives a crash. The file gets the mode ``open()`` would give it (0o666 less
the umask), never mkstemp's private 0600, so a shared dataset stays readable by its users.
Temp names are ``.<target name>.<random>.tmp``: hidden, and recognisable as debris.

>>> import os
>>> atomic_write(os.path.join(tmp, "a.json"), b"{}")
>>> open(os.path.join(tmp, "a.json"), "rb").read(), os.listdir(tmp)
(b'{}', ['a.json'])
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading

__all__ = ["atomic_write", "file_mode", "fsync_dir", "publish_file", "temp_beside"]

_UMASK_LOCK = threading.Lock()


def fsync_dir(directory: str) -> None:
    """Make the entries of ``directory`` (a rename into it) durable; a no-op where directories
    cannot be opened."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_mode() -> int:
    """The mode ``open()`` gives a new file here: 0o666 less the process umask (0644 under
    022). Published files get it; mkstemp's 0600 would hide a shared dataset from its users."""
    try:
        with open("/proc/self/status") as f:   # Linux: read the umask without changing it
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:   # elsewhere the only way to read it is to set it
        mask = os.umask(0o077)
        os.umask(mask)
    return 0o666 & ~mask


def temp_beside(target: str) -> tuple[int, str]:
    """An open temp file ``(fd, path)`` beside ``target`` with the mode a normal file gets."""
    parent = os.path.dirname(target) or "."
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(target)}.",
                               suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def _replace_from(fd: int, tmp: str, target: str, write) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(target))


def atomic_write(target: str, data: bytes | bytearray | memoryview) -> None:
    """Put ``data`` at ``target`` all at once (temp beside, fsync, rename, directory fsync)."""
    fd, tmp = temp_beside(target)
    _replace_from(fd, tmp, target, lambda f: f.write(data))


def publish_file(src: str, target: str, *, move: bool) -> None:
    """Put the file ``src`` at ``target`` all at once.

    ``move``: rename ``src`` into place (given the published mode), or copy then remove it
    when ``src`` lies on another device; otherwise copy into a temp file beside ``target``.
    """
    if move:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        try:
            os.chmod(src, file_mode())   # staged files may be private (mkstemp: 0600)
            os.replace(src, target)
            fsync_dir(os.path.dirname(target))
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:  # another device: copy below
                raise
    def copy(out) -> None:
        with open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, 8 << 20)

    fd, tmp = temp_beside(target)
    _replace_from(fd, tmp, target, copy)
    if move:
        os.unlink(src)
