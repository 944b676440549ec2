"""Compressed containers (gzip, bz2, xz, zstd) decoded member by member, so that a truncated
or damaged file is always an error, never a shorter file.

The stdlib file wrappers and zstandard's ``stream_reader`` differ here: ``stream_reader`` ends
quietly at a cut inside a frame (a third of a ``.zst`` file read as the whole), and none of them
says how far decoding got. One reader over the four incremental decompressors does both: at the
end of the compressed bytes the current member (gzip member, bz2/xz stream, zstd frame) must be
complete, and every error names the compressed and decompressed byte offsets.

A cut exactly between two members cannot be seen by any reader: the shorter file is a valid
file. Zero bytes after the last member are padding (gzip and xz allow it); anything else there
must be another valid member.
"""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from typing import BinaryIO

from ..errors import InputError
from .options import InputFile

# Compressed bytes per read of the underlying file, and the most decompressed bytes one
# decoder step may return: both bound memory, neither is large enough to matter for speed.
RAW_READ = 1 << 20
STEP_OUT = 1 << 20
# zstandard's decompressobj has no output bound; a smaller input slice keeps a highly
# compressible frame from expanding into one huge step.
_ZSTD_IN = 1 << 18
# A zstd frame written with --long=31 needs a 2 GiB window; zstd's default limit (128 MiB)
# would refuse it, and the window is only allocated when a frame asks for it.
ZSTD_MAX_WINDOW = 1 << 31

_MAGIC = {"gzip": (b"\x1f\x8b",), "bz2": (b"BZh",), "xz": (b"\xfd7zXZ\x00",),
          "zstd": (b"\x28\xb5\x2f\xfd",)}
_UNIT = {"gzip": "gzip member", "bz2": "bz2 stream", "xz": "xz stream", "zstd": "zstd frame"}


class _Member:
    """One member's incremental decoder: ``step(data)`` returns at most about STEP_OUT bytes
    and keeps what it did not consume; ``needs_input``, ``eof`` and ``unused`` (the bytes after
    the member's end) as in the stdlib decompressors."""

    def __init__(self, compression: str) -> None:
        self._kind = compression
        self._tail = b""
        if compression == "gzip":
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif compression == "bz2":
            self._d = bz2.BZ2Decompressor()
        elif compression == "xz":
            self._d = lzma.LZMADecompressor()
        else:
            import zstandard

            self._d = zstandard.ZstdDecompressor(
                max_window_size=ZSTD_MAX_WINDOW).decompressobj()

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def needs_input(self) -> bool:
        if self._kind in ("bz2", "xz"):
            return self._d.needs_input
        return not self._tail

    @property
    def unused(self) -> bytes:
        return self._d.unused_data + self._tail

    def step(self, data: bytes) -> bytes:
        if self._kind in ("bz2", "xz"):
            return self._d.decompress(data, STEP_OUT)
        buf = self._tail + data if self._tail else data
        if self._kind == "gzip":
            out = self._d.decompress(buf, STEP_OUT)
            self._tail = self._d.unconsumed_tail
            return out
        self._tail = buf[_ZSTD_IN:]
        return self._d.decompress(buf[:_ZSTD_IN])


def decompress_errors(compression: str) -> tuple[type[BaseException], ...]:
    """What the decompressor of ``compression`` raises on damaged data."""
    if compression == "zstd":
        import zstandard

        return (zstandard.ZstdError,)
    return {"gzip": (zlib.error,), "bz2": (OSError, EOFError), "xz": (lzma.LZMAError, EOFError)}[
        compression]


class DecompressedReader(io.RawIOBase):
    """The decompressed bytes of ``raw`` (a binary file), for ``file.compression``.

    ``read`` raises :class:`~zephon_store.errors.InputError` ("truncated compressed stream",
    or "corrupt ... stream") naming the file and offsets; such errors are never record errors,
    so ``on_error="skip"`` does not apply to them.
    """

    def __init__(self, raw: BinaryIO, file: InputFile) -> None:
        assert file.compression is not None
        self._raw, self._file = raw, file
        self._kind = file.compression
        self._errors = decompress_errors(self._kind)
        self._member: _Member | None = None
        self._members = 0
        self._pending = b""  # compressed bytes read from raw but not yet given to a member
        self._out, self._pos = b"", 0
        self.consumed = 0  # compressed bytes read from raw
        self.produced = 0  # decompressed bytes returned by read

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(STEP_OUT), b""))
        while self._pos >= len(self._out):
            if not self._fill():
                return b""
        if self._pos == 0 and size >= len(self._out):
            data = self._out
        else:
            data = self._out[self._pos:self._pos + size]
        self._pos += len(data)
        self.produced += len(data)
        return data

    def _raw_read(self) -> bytes:
        data = self._raw.read(RAW_READ)
        self.consumed += len(data)
        return data

    def _fill(self) -> bool:
        """Decode until some output is ready (True) or the input ends cleanly (False)."""
        while True:
            if self._member is None and not self._start_member():
                return False
            member = self._member
            assert member is not None
            data = b""
            if member.needs_input:
                data, self._pending = (self._pending or self._raw_read()), b""
                if not data:
                    self._fail("truncated")
            try:
                out = member.step(data)
            except self._errors as exc:
                self._fail("corrupt", exc)
            if member.eof:
                self._pending, self._member = member.unused, None
            if out:
                self._out, self._pos = out, 0
                return True

    def _start_member(self) -> bool:
        while True:
            if self._members:  # zero bytes after a complete member are padding
                self._pending = self._pending.lstrip(b"\0")
            if len(self._pending) < 6:
                more = self._raw_read()
                if more:
                    self._pending += more
                    continue
            if not self._pending:
                return False
            break
        head = self._pending[:6]
        skippable = self._kind == "zstd" and len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" \
            and 0x50 <= head[0] <= 0x5F
        if not skippable and not any(head.startswith(m) or m.startswith(head)
                                     for m in _MAGIC[self._kind]):
            self._fail("magic")
        self._member = _Member(self._kind)
        self._members += 1
        return True

    def _fail(self, what: str, exc: BaseException | None = None) -> None:
        url, kind = self._file.url, self._kind
        at = f"after {self.produced} decompressed bytes"
        redo = "re-create or re-download it"
        if what == "truncated":
            msg = (f"{url}: truncated compressed stream: the {kind} data ends after "
                   f"{self.consumed} of its bytes, inside {_UNIT[kind]} {self._members} ({at}); "
                   f"the file is incomplete (an interrupted download or copy?): {redo}")
        elif what == "magic":
            where = self.consumed - len(self._pending)
            found = self._pending[:6].hex(" ")
            expected = _MAGIC[kind][0].hex(" ")
            if self._members == 0:
                msg = (f"{url}: not a {kind} file: it starts with the bytes {found}, not "
                       f"{expected}; the name says {kind} but the content is not: rename the "
                       f"file to match its content, or {redo}")
            else:
                msg = (f"{url}: corrupt {kind} stream: after {_UNIT[kind]} {self._members} ends "
                       f"at compressed byte {where} ({at}) come bytes that start no new one "
                       f"({found}); the file is damaged or has data appended: {redo}")
        else:
            msg = (f"{url}: corrupt {kind} stream in {_UNIT[kind]} {self._members}, within "
                   f"compressed bytes {max(self.consumed - RAW_READ, 0)}-{self.consumed} ({at}): "
                   f"{type(exc).__name__}: {exc}; the file is damaged: {redo}")
        raise InputError(msg, path=url) from exc
