"""Fixed-size binary column chunks read straight from their Parquet pages (zero-copy).

A fixed-size binary column written with PLAIN pages and no nulls (token windows in format
v2, see :mod:`zephon_store.format.encoding`) holds its values back to back in each data page. So
once the row group's bytes have passed their xxh3 check, the values of an uncompressed page
*are* the column: :func:`read_fixed_chunk` returns them as an Arrow ``fixed_size_binary``
array over the very same buffer (the memory-mapped shard, or the fetched range), with no
copy; a compressed page is decompressed once, into the buffer that becomes the array.
pyarrow's reader copies every value into a fresh array after decompressing: about half of
an uncompressed token pass (``docs/benchmarks.md``).

Only what this module can prove it reads exactly takes this path: a top-level leaf with
no repetition, no dictionary, PLAIN values, version 1 or 2 data pages, a codec
:class:`pyarrow.Codec` decompresses, no nulls (the definition levels are decoded and
checked), and value and page sizes that add up to the column chunk exactly. For anything
else :func:`read_fixed_chunk` returns ``None`` and the caller decodes with pyarrow; the
result is the same either way (``tests/unit/read/test_pages.py`` compares them).

Strings are left to pyarrow. Reading PLAIN string pages here (a Python scan of each value's
4-byte length, then one ``str`` per value straight from the page) was built and measured:
the scan holds the GIL where pyarrow's copy does not, and the loader's text pass got slower
(``docs/benchmarks.md``).

The page headers are Thrift compact-protocol structs (the Parquet format's
``PageHeader``); :class:`_Compact` reads the few fields needed and skips the rest.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# Parquet's page types and encodings (parquet.thrift).
DATA_PAGE, DATA_PAGE_V2 = 0, 3
PLAIN, RLE = 0, 3
# Parquet codec names (as pyarrow's metadata spells them) -> pyarrow.Codec names. "LZ4" is
# left out: pyarrow's metadata spells both the framed (Hadoop) codec and the raw one so,
# and decoding one as the other would not always fail.
_CODECS = {"ZSTD": "zstd", "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli",
           "LZ4_RAW": "lz4_raw"}


class _Unsupported(Exception):
    """A page this module does not read; the caller falls back to pyarrow."""


class _Compact:
    """A reader of Thrift compact-protocol structs over ``buf`` from ``pos``."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def _byte(self) -> int:
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self._byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise _Unsupported("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def struct(self) -> dict:
        """Fields of one struct: id -> int, bool, bytes, or dict (nested struct)."""
        out: dict = {}
        last = 0
        while True:
            head = self._byte()
            if head == 0:
                return out
            kind, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self.zigzag()
            out[last] = self._value(kind)

    def _value(self, kind: int):
        if kind == 1:
            return True
        if kind == 2:
            return False
        if kind == 3:
            return self._byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.pos += 8
            return None
        if kind == 8:
            n = self.varint()
            self.pos += n
            return bytes(self.buf[self.pos - n:self.pos])
        if kind in (9, 10):
            head = self._byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                if elem in (1, 2):   # booleans in a list are one byte each
                    self.pos += 1
                else:
                    self._value(elem)
            return None
        if kind == 11:
            size = self.varint()
            if size:
                types = self._byte()
                for _ in range(size):
                    self._value(types >> 4)
                    self._value(types & 0x0F)
            return None
        if kind == 12:
            return self.struct()
        raise _Unsupported(f"thrift type {kind}")


def _all_valid(levels, n: int) -> bool:
    """Whether all ``n`` definition levels in ``levels`` (RLE/bit-packed hybrid, bit width 1:
    a top-level optional leaf) are 1, i.e. the page holds no null."""
    r = _Compact(levels, 0)
    seen = 0
    while seen < n:
        head = r.varint()
        if head & 1:                         # bit-packed: (head >> 1) groups of 8 levels
            nbytes = head >> 1
            raw = np.frombuffer(bytes(levels[r.pos:r.pos + nbytes]), dtype=np.uint8)
            if raw.size != nbytes or not nbytes:
                raise _Unsupported("truncated definition levels")
            r.pos += nbytes
            take = min(8 * nbytes, n - seen)
            if not np.unpackbits(raw, bitorder="little")[:take].all():
                return False
        else:                                # a run of one level, in one byte
            take = min(head >> 1, n - seen)
            if take == 0:
                raise _Unsupported("empty RLE run")
            if levels[r.pos] != 1:
                return False
            r.pos += 1
        seen += take
    return True


def _pages(buf: pa.Buffer, base: int, column, max_def: int):
    """Yield ``(n, values)`` per data page of a PLAIN, dictionary-free, null-free chunk.

    ``n``: values in the page; ``values``: its PLAIN value bytes (decompressed; a slice of
    ``buf`` when uncompressed). Raises :class:`_Unsupported` for anything else (nulls
    included); the caller then uses pyarrow.
    """
    if column.has_dictionary_page or max_def > 1:
        raise _Unsupported("dictionary or nested")
    comp = column.compression
    codec = None
    if comp != "UNCOMPRESSED":
        if comp not in _CODECS or not pa.Codec.is_available(_CODECS[comp]):
            raise _Unsupported(f"codec {comp}")
        codec = pa.Codec(_CODECS[comp])
    start = column.data_page_offset - base
    end = start + column.total_compressed_size
    if start < 0 or end > buf.size:
        raise _Unsupported("column chunk outside the buffer")
    view = memoryview(buf)
    pos = start
    while pos < end:
        r = _Compact(view, pos)
        head = r.struct()
        body = r.pos
        kind, usize, csize = head.get(1), head.get(2), head.get(3)
        if kind not in (DATA_PAGE, DATA_PAGE_V2) or usize is None or csize is None:
            raise _Unsupported(f"page type {kind}")
        if body + csize > end:
            raise _Unsupported("page runs past its column chunk")
        page = buf.slice(body, csize)
        if kind == DATA_PAGE:
            dp = head.get(5) or {}
            n = dp.get(1)
            if n is None or dp.get(2) != PLAIN:
                raise _Unsupported("not a PLAIN page")
            if codec is not None:
                page = codec.decompress(page, decompressed_size=usize)
            elif csize != usize:
                raise _Unsupported("page sizes differ without compression")
            skip = 0
            if max_def:
                if dp.get(3) != RLE:
                    raise _Unsupported("definition levels not RLE")
                skip = 4 + int.from_bytes(bytes(memoryview(page)[:4]), "little")
                if not _all_valid(memoryview(page)[4:skip], n):
                    raise _Unsupported("nulls")
            values = page.slice(skip)
        else:
            dp = head.get(8) or {}
            n, nulls, enc = dp.get(1), dp.get(2), dp.get(4)
            dlen, rlen = dp.get(5, 0), dp.get(6, 0)
            if n is None or enc != PLAIN or rlen:
                raise _Unsupported("not a PLAIN page")
            if nulls or (max_def and not _all_valid(memoryview(page)[:dlen], n)):
                raise _Unsupported("nulls")
            values = page.slice(dlen)
            if codec is not None and dp.get(7, True):
                values = codec.decompress(values, decompressed_size=usize - dlen)
        yield n, values
        pos = body + csize
    if pos != end:
        raise _Unsupported("pages do not add up to the column chunk")


def read_fixed_chunk(buf: pa.Buffer, base: int, column, max_def: int, max_rep: int,
                     width: int) -> pa.ChunkedArray | None:
    """The values of one fixed-size binary column chunk, or None to let pyarrow decode it.

    ``buf`` holds the shard's bytes from file offset ``base`` on (the whole mapped shard
    with ``base=0``, or one fetched row-group range); ``column`` is pyarrow's
    ``ColumnChunkMetaData``; ``max_def``/``max_rep`` the leaf's definition and repetition
    levels; ``width`` the value size in bytes. Uncompressed pages come back as views of
    ``buf``; one chunk per data page.

    >>> import io, pyarrow.parquet as pq
    >>> sink = io.BytesIO()
    >>> pq.write_table(pa.table({"v": pa.array([b"ab", b"cd"], pa.binary(2))}), sink,
    ...                compression="none", use_dictionary=False)
    >>> buf = pa.py_buffer(sink.getvalue())
    >>> md = pq.ParquetFile(pa.BufferReader(buf)).metadata
    >>> read_fixed_chunk(buf, 0, md.row_group(0).column(0), 1, 0, 2).to_pylist()
    [b'ab', b'cd']
    """
    try:
        return _read_fixed_chunk(buf, base, column, max_def, max_rep, width)
    except (_Unsupported, IndexError, ValueError, OverflowError, MemoryError, RecursionError,
            pa.ArrowException):
        return None


def _read_fixed_chunk(buf, base, column, max_def, max_rep, width):
    if max_rep or column.physical_type != "FIXED_LEN_BYTE_ARRAY" or width <= 0:
        return None
    chunks, rows = [], 0
    for n, values in _pages(buf, base, column, max_def):
        if values.size != n * width:
            return None
        chunks.append(pa.Array.from_buffers(pa.binary(width), n, [None, values]))
        rows += n
    if rows != column.num_values:
        return None
    return pa.chunked_array(chunks, type=pa.binary(width))
