"""A read-only file object over a few byte ranges of a larger file.

Lets pyarrow decode one row group of a remote shard from exactly the bytes fetched for it
(the row group's range, plus the cached footer metadata), with no other I/O. A read outside
the ranges raises, so a layout bug can never turn into silently reading zeros.
"""

from __future__ import annotations

import io


class RangeFile(io.RawIOBase):
    """File-like view of ``size`` bytes of which only ``ranges`` ({offset: bytes}) are known.

    >>> f = RangeFile(10, {2: b"abc"})
    >>> _ = f.seek(3); f.read(2)
    b'bc'
    """

    def __init__(self, size: int, ranges: dict[int, bytes], *, name: str = "<ranges>") -> None:
        super().__init__()
        self._size = size
        self._ranges = sorted((o, memoryview(b)) for o, b in ranges.items())
        self._pos = 0
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = offset
        elif whence == io.SEEK_CUR:
            self._pos += offset
        elif whence == io.SEEK_END:
            self._pos = self._size + offset
        else:
            raise ValueError(f"bad whence {whence}")
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._size - self._pos
        n = min(n, self._size - self._pos)
        if n <= 0:
            return b""
        for off, buf in self._ranges:
            if off <= self._pos and self._pos + n <= off + len(buf):
                s = self._pos - off
                self._pos += n
                return bytes(buf[s:s + n])
        raise OSError(
            f"{self.name}: read of [{self._pos}, {self._pos + n}) is outside the fetched ranges "
            f"{[(o, o + len(b)) for o, b in self._ranges]}; this is a bug in zephon_store")

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)
