"""The one read of a small local file given by a user: regular files only, never blocking.

A deny list, a run log or a mixture file named by a user could be a FIFO (opening it blocks
until a writer comes), a device (it reads without end) or a folder. The file is opened with
``O_NONBLOCK`` (a FIFO's open returns at once; nothing changes for a regular file) and its
type is checked on the descriptor, so nothing can swap it between the check and the read.
Callers turn :class:`NotRegularFileError` into their own one-line error.

>>> import os
>>> p = os.path.join(tmp, "deny.txt")
>>> _ = open(p, "w").write("1\\n2\\n")
>>> read_regular(p)
b'1\\n2\\n'
>>> os.mkfifo(os.path.join(tmp, "fifo"))
>>> read_regular(os.path.join(tmp, "fifo"))
Traceback (most recent call last):
    ...
zephon_store._util.regular.NotRegularFileError: ... is a FIFO, not a regular file
"""

from __future__ import annotations

import os
import stat

__all__ = ["NotRegularFileError", "read_regular"]


class NotRegularFileError(OSError):
    """The path names a FIFO, socket, device or folder where a regular file was expected;
    ``str()`` says which."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def read_regular(path: str, *, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes + 1`` of them, so a caller
    can tell a file over its limit without reading it all). Raises
    :class:`NotRegularFileError` for anything but a regular file (symlinks to one are fine)
    and ``OSError`` as ``open`` does."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{path} is {_kind(mode)}, not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read() if max_bytes is None else f.read(max_bytes + 1)
    finally:
        os.close(fd)
