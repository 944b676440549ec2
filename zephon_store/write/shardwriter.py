"""Write one shard and describe it: file hash, row-group byte ranges and their hashes.

A shard is a plain Parquet file any reader opens. Zephon adds what the manifest records
about it: the xxh3-128 of the whole file (which is also its name), and for every row group
the byte range ``[offset, offset + length)`` holding its column chunks plus the xxh3 of
those bytes, so a ranged read from object storage can be verified before it is decoded.
The footer (``[footer_offset, size)``) gets a hash too.

Rows arrive in their logical types (cuts are computed on those, see :mod:`rowsize`); the
writer re-types them to the storage types of :mod:`encoding` just before Parquet sees them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from .._util.arrow import is_flat_binary
from .._util.hashing import xxh3_ranges
from .._util.sizes import parse_size
from ..format.encoding import (
    FIXED_SIZE_BINARY_SPLIT,
    FIXED_SIZE_LIST_MODES,
    storage_encodings,
    storage_schema,
    to_storage,
)
from ..format.footer import row_group_byte_range
from .stage_times import stage

#: ``WriteOptions.compression`` values; ``"lz4"`` is Parquet's LZ4_RAW (pyarrow's name for it).
COMPRESSIONS = ("auto", "zstd", "lz4", "snappy", "gzip", "brotli", "none")
#: What ``compression_level=None`` becomes for a named codec: the field's default before
#: ``"auto"`` (used by zstd, gzip and brotli only, recorded for every codec as it was then).
_LEGACY_LEVEL = 3


@dataclass(frozen=True)
class WriteOptions:
    """How shards are written. Every field is recorded in the manifest.

    The three byte sizes also take a string read by
    :func:`~zephon_store._util.sizes.parse_size` (``"128MiB"``; ``"128M"`` is 128,000,000).
    ``target_shard_bytes`` and ``row_group_bytes`` are measured on the values before
    compression (see :mod:`zephon_store.write.rowsize`), so cuts are a pure function of the data.
    ``fixed_size_lists``: ``"split"`` (the default from format v5) stores fixed-size lists of
    numbers as fixed-size binary (decoded without Parquet's list levels; docs/benchmarks.md,
    "Storage encodings") with each value's bytes in byte planes, which a codec packs
    tighter than values back to back (:mod:`zephon_store.format.encoding`; with
    ``compression="none"`` the values stay back to back: no codec, no gain); ``"binary"`` keeps
    the v2-v4 layout (elements back to back, decoded without a copy); ``"list"`` keeps
    Parquet's list layout, which can hold null elements.
    ``compression``: ``"auto"`` (the default) picks a codec per column from a sample of the
    shard's own values (:func:`choose_codecs`; the rule and the grid behind it are in
    formats/SPEC.md, "Compression"); any other value (``"zstd"``, ``"lz4"`` = Parquet's
    LZ4_RAW, ``"snappy"``, ``"gzip"``, ``"brotli"``, ``"none"``) applies to every column.
    ``compression_level``: used by zstd, gzip and brotli; ``None`` with a named codec becomes
    3, the field's default before ``"auto"``, so ``WriteOptions(compression="zstd")`` writes
    and records what it always did; ``"auto"`` picks its own levels and takes none.
    ``use_dictionary``: ``"auto"`` (the default) dictionary-encodes every column except
    top-level string and binary columns whose values are mostly distinct in the shard
    (documents, URLs, ids; see :func:`dictionary_columns`): there a dictionary saves no
    bytes and costs a second copy on every read. ``True`` and ``False`` apply to every
    column.

    >>> WriteOptions(target_shard_bytes=0)
    Traceback (most recent call last):
    ...
    ValueError: target_shard_bytes must be > 0, got 0
    """

    target_shard_bytes: int = 128 << 20
    row_group_bytes: int | None = 1 << 20
    row_group_rows: int | None = None
    compression: str = "auto"
    compression_level: int | None = None
    use_dictionary: bool | str = "auto"
    write_statistics: bool = True
    data_page_size: int = 1 << 20
    parquet_version: str = "2.6"
    fixed_size_lists: str = "split"

    def __post_init__(self) -> None:
        for name in ("target_shard_bytes", "row_group_bytes", "data_page_size"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, parse_size(getattr(self, name)))
        if self.target_shard_bytes <= 0:
            raise ValueError(f"target_shard_bytes must be > 0, got {self.target_shard_bytes}")
        if self.row_group_bytes is None and self.row_group_rows is None:
            raise ValueError("set row_group_bytes or row_group_rows (got neither)")
        if self.row_group_bytes is not None and self.row_group_bytes <= 0:
            raise ValueError(f"row_group_bytes must be > 0, got {self.row_group_bytes}")
        if self.row_group_rows is not None and self.row_group_rows <= 0:
            raise ValueError(f"row_group_rows must be > 0, got {self.row_group_rows}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}; "
                             f"got {self.compression!r}")
        if self.compression == "auto" and self.compression_level is not None:
            raise ValueError(f"compression='auto' chooses its own levels; got compression_level="
                             f"{self.compression_level} (name a codec, e.g. compression='zstd', "
                             "to set a level)")
        if self.compression_level is None and self.compression != "auto":
            # Recorded as the number, so explicit options keep the writer record (and the
            # dataset_id) of every dataset written when 3 was the field's default.
            object.__setattr__(self, "compression_level", _LEGACY_LEVEL)
        if self.use_dictionary not in (True, False, "auto"):
            raise ValueError(f"use_dictionary must be True, False or 'auto'; "
                             f"got {self.use_dictionary!r}")
        if self.data_page_size <= 0:
            raise ValueError(f"data_page_size must be > 0, got {self.data_page_size}")
        if self.fixed_size_lists not in FIXED_SIZE_LIST_MODES:
            raise ValueError(f"fixed_size_lists must be one of "
                             f"{', '.join(FIXED_SIZE_LIST_MODES)}; got {self.fixed_size_lists!r}")

    def to_dict(self) -> dict:
        """The options as the manifest records them."""
        return asdict(self)


@dataclass
class RowGroupInfo:
    rows: int
    offset: int
    length: int
    xxh3: str


@dataclass
class ShardInfo:
    """What the manifest records about one written shard."""

    name: str            # xxh3-128 of the file = its name without ".parquet"
    bytes: int
    rows: int
    footer_offset: int
    footer_xxh3: str
    row_groups: list[RowGroupInfo] = field(default_factory=list)
    # compression="auto": what choose_codecs picked per top-level column; empty otherwise.
    codecs: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ShardInfo:
        rgs = [RowGroupInfo(**r) for r in d["row_groups"]]
        return cls(**{**d, "row_groups": rgs})


def write_shard(table: pa.Table, row_group_rows: list[int], path: str,
                options: WriteOptions) -> ShardInfo:
    """Write ``table`` to ``path`` with exactly the given row-group sizes; describe it.

    The file is written at ``path`` as given (callers pass a temp name and rename it to
    ``shards/<name>.parquet`` afterwards). ``table`` holds logical types; columns that
    :func:`~zephon_store.format.encoding.storage_encodings` names are written in their storage
    type, without dictionary encoding (each value is a whole window: a dictionary only
    costs time, then falls back to plain); with ``use_dictionary="auto"`` the columns
    :func:`dictionary_columns` leaves out are plain too. Raises
    :class:`~zephon_store.format.encoding.ElementNullError` for a null list element.
    """
    if sum(row_group_rows) != table.num_rows:
        raise ValueError(f"row groups hold {sum(row_group_rows)} rows, table has {table.num_rows}")
    with stage("encode"):
        encodings = storage_encodings(table.schema, options.fixed_size_lists,
                                      options.compression)
        schema, writer_options, codecs = _writer_plan(table, encodings, options)
    try:
        with stage("compress"), pq.ParquetWriter(path, schema, **writer_options) as writer:
            start = 0
            for n in row_group_rows:
                # One row group in storage types at a time, just before it is compressed:
                # a buffer the size of a row group, still in cache, where a whole shard in
                # byte planes was a second copy of it and its page faults (docs/benchmarks.md,
                # "Conversion (local engine)"). Parquet sees the same values in the same chunks.
                with stage("encode"):
                    part = to_storage(table.slice(start, n), encodings, row0=start)
                writer.write_table(part, row_group_size=n)
                start += n
    except BaseException:
        with contextlib.suppress(OSError):   # no half-written shard left behind
            os.remove(path)
        raise
    with stage("hash"):
        info = describe_shard(path)
    info.codecs = codecs
    return info


def _writer_plan(table: pa.Table, encodings: dict[str, str],
                 options: WriteOptions) -> tuple[pa.Schema, dict, dict]:
    """The storage schema of the logical ``table``, the ``pq.ParquetWriter`` keyword arguments
    that write it as ``options`` say, and the codecs ``compression="auto"`` chose (else
    empty): decided from the shard's first rows, so the shard is never converted whole."""
    schema = storage_schema(table.schema, encodings)
    codecs: dict[str, str] = {}
    if options.compression == "auto":
        codecs = _codecs_of(schema, _storage_samples(table, encodings, schema))
        compression, level = _per_leaf(schema, codecs)
    else:
        compression = options.compression
        level = options.compression_level if compression in ("zstd", "gzip", "brotli") else None
    use_dictionary: bool | list[str] = options.use_dictionary is not False
    if options.use_dictionary == "auto":
        head = to_storage(table.slice(0, DICTIONARY_SAMPLE_ROWS), encodings)
        use_dictionary = dictionary_columns(head, exclude=encodings)
    elif use_dictionary and encodings:
        use_dictionary = [p for p in _leaf_paths(schema) if p not in encodings]
    kwargs = dict(compression=compression, compression_level=level,
                  use_dictionary=use_dictionary, write_statistics=options.write_statistics,
                  data_page_size=options.data_page_size, version=options.parquet_version,
                  store_schema=True, write_page_index=False)
    return schema, kwargs, codecs


def _storage_samples(table: pa.Table, encodings: dict[str, str],
                     schema: pa.Schema) -> list[bytes]:
    """Per column, the bytes :func:`choose_codecs` samples of ``to_storage(table,
    encodings)`` (whose schema is ``schema``), converting only the rows it samples.

    A column in byte planes without nulls has ``rows * width`` bytes of storage buffers,
    so the sampled rows are known before converting; any other encoded column (back to
    back, a zero-copy view; or holding nulls, whose validity buffer counts) is converted
    whole, as :func:`choose_codecs` would see it.
    """
    out = []
    for i, f in enumerate(table.schema):
        col = table.column(i)
        if f.name not in encodings:
            out.append(_sample(col, f))
            continue
        rows = len(col)
        if encodings[f.name] == FIXED_SIZE_BINARY_SPLIT and not col.null_count:
            nbytes = rows * schema.field(i).type.byte_width
            if nbytes > AUTO_SAMPLE_BYTES:
                rows = max(1, rows * AUTO_SAMPLE_BYTES // nbytes)
        stored = to_storage(table.select([i]).slice(0, rows), {f.name: encodings[f.name]})
        out.append(_sample(stored.column(0), stored.schema.field(0)))
    return out


#: ``compression="auto"``, per top-level column of each shard (formats/SPEC.md, "Compression";
#: the grid behind the numbers: docs/benchmarks_format.md). The sample is the column's first
#: rows, about this many bytes of Arrow buffers, compressed with zstd level 1.
AUTO_SAMPLE_BYTES = 1 << 20
#: A column whose sample shrinks less than this (raw / compressed) is stored uncompressed.
AUTO_MIN_RATIO = 1.25
#: The codec and level of every other column ...
AUTO_CODEC, AUTO_LEVEL = "zstd", 1
#: ... except variable-length strings and binaries (documents, code, URLs), from format v5
#: (smaller text for a little more read and conversion CPU) ...
AUTO_TEXT_LEVEL = 6
#: ... and, from format v5, any other column whose sample LZ4 (Parquet's LZ4_RAW) packs to
#: at least this share of zstd-1's ratio (token windows in byte planes do; scalars, ids and
#: windows back to back do not). The measurements: docs/benchmarks_format.md, "The rule".
AUTO_FAST_SHARE = 0.90


def choose_codecs(table: pa.Table) -> dict[str, str]:
    """Top-level column -> codec, by the ``compression="auto"`` rule: a pure function of rows.

    Each column's first rows (about :data:`AUTO_SAMPLE_BYTES` of their Arrow buffers) are
    compressed with zstd level 1. A column that shrinks by less than
    :data:`AUTO_MIN_RATIO` (random-looking ids, hashes, floats) is stored ``"none"``: a
    codec would cost every read and the conversion time and save little. A variable-length
    string or binary column that compresses gets ``"zstd-6"`` (:data:`AUTO_TEXT_LEVEL`).
    Any other column is compressed with LZ4 too: ``"lz4"`` (Parquet's LZ4_RAW) when LZ4's
    ratio is at least :data:`AUTO_FAST_SHARE` of zstd-1's, else ``"zstd-1"``
    (:data:`AUTO_CODEC` at :data:`AUTO_LEVEL`).

    >>> import numpy as np
    >>> t = pa.table({"text": ["the same words again and again"] * 500,
    ...               "n": np.arange(500), "h": np.random.default_rng(0).integers(0, 2**63, 500)})
    >>> choose_codecs(t)
    {'text': 'zstd-6', 'n': 'zstd-1', 'h': 'none'}
    """
    return _codecs_of(table.schema, [_sample(table.column(i), f)
                                     for i, f in enumerate(table.schema)])


def _codecs_of(schema: pa.Schema, samples: list[bytes]) -> dict[str, str]:
    """:func:`choose_codecs` on each storage column's sampled bytes."""
    out = {}
    for f, raw in zip(schema, samples, strict=True):
        out[f.name] = auto_codec(
            _variable_bytes(f.type), len(raw) / pa.Codec("zstd", 1).compress(raw).size,
            lambda raw=raw: len(raw) / pa.Codec("lz4_raw").compress(raw).size)
    return out


def auto_codec(text: bool, zstd1_ratio: float, lz4_ratio: Callable[[], float]) -> str:
    """The ``"auto"`` rule on one column's measured ratios (raw / compressed): ``text`` for
    a variable-length string or binary column, ``lz4_ratio`` called only when LZ4 is a
    candidate (what :func:`choose_codecs` applies to each column's sample).

    >>> auto_codec(False, 2.07, lambda: 1.98), auto_codec(False, 1.74, lambda: 1.32)
    ('lz4', 'zstd-1')
    >>> auto_codec(True, 3.3, lambda: 2.4), auto_codec(False, 1.0, lambda: 1.0)
    ('zstd-6', 'none')
    """
    if zstd1_ratio < AUTO_MIN_RATIO:
        return "none"
    if text:
        return f"{AUTO_CODEC}-{AUTO_TEXT_LEVEL}"
    if lz4_ratio() >= AUTO_FAST_SHARE * zstd1_ratio:
        return "lz4"
    return f"{AUTO_CODEC}-{AUTO_LEVEL}"


def _variable_bytes(t: pa.DataType) -> bool:
    """A string or binary type of variable length (plain, large or view)."""
    return is_flat_binary(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t)


def _sample(col: pa.ChunkedArray, f: pa.Field) -> bytes:
    """The buffers (values, offsets, validity) of the column's first rows, about
    :data:`AUTO_SAMPLE_BYTES`: what Parquet's pages will hold, without any framing that
    would make random bytes look compressible."""
    rows = len(col)
    if rows and col.nbytes > AUTO_SAMPLE_BYTES:
        rows = max(1, rows * AUTO_SAMPLE_BYTES // col.nbytes)
    # concat_arrays copies the slice into fresh buffers that start at offset 0.
    head = pa.concat_arrays(col.slice(0, rows).chunks) if rows else pa.array([], f.type)
    return b"".join(b.to_pybytes() for b in head.buffers() if b is not None)


def _per_leaf(schema: pa.Schema, codecs: dict[str, str]) -> tuple[dict, dict]:
    """pyarrow's per-leaf ``compression`` and ``compression_level`` for column codecs."""
    compression, level = {}, {}
    for path in _leaf_paths(schema):
        top = path if path in codecs else max(
            (n for n in schema.names if path.startswith(n + ".")), key=len)
        name, _, level_str = codecs[top].partition("-")
        compression[path] = name
        if level_str:
            level[path] = int(level_str)
    return compression, level


#: Rows of a shard that :func:`dictionary_columns` looks at (its first rows).
DICTIONARY_SAMPLE_ROWS = 1024


def dictionary_columns(table: pa.Table, exclude=()) -> list[str]:
    """The leaf columns of ``table`` worth a dictionary: what ``use_dictionary="auto"`` picks.

    Every leaf except those in ``exclude`` and the top-level string or binary columns
    whose first :data:`DICTIONARY_SAMPLE_ROWS` non-null values are more than half
    distinct. For such a column (documents, URLs, ids) a dictionary holds every value
    once anyway: the file is no smaller, and a reader decodes the dictionary and then
    copies every value out of it again (1.3-2.2x the decode time of plain pages for
    text; ``tools/bench/bench_dictionary.py``). The choice is a pure function of the
    shard's rows, so shard bytes stay deterministic.

    >>> t = pa.table({"text": ["a", "b", "c", "d"], "lang": ["en", "en", "de", "en"],
    ...               "n": [1, 1, 1, 1]})
    >>> dictionary_columns(t)
    ['lang', 'n']
    """
    import pyarrow.compute as pc

    plain = set(exclude)
    head = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    for i, f in enumerate(table.schema):
        if not is_flat_binary(f.type):
            continue
        col = head.column(i)
        valid = len(col) - col.null_count
        if valid and pc.count_distinct(col).as_py() * 2 > valid:
            plain.add(f.name)
    return [p for p in _leaf_paths(table.schema) if p not in plain]


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """Parquet's dotted leaf-column paths for ``schema`` (what per-column options name)."""
    if not any(pa.types.is_nested(f.type) for f in schema):
        return list(schema.names)  # flat: one leaf per field, named after it
    sink = pa.BufferOutputStream()
    # Not schema.empty_table(): that imports pandas (about half a second per process).
    pq.write_table(pa.Table.from_batches([], schema=schema), sink, store_schema=False)
    md = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    return [md.schema.column(i).path for i in range(md.num_columns)]


def describe_shard(path: str) -> ShardInfo:
    """Read back a local Parquet file's layout and hash every range the manifest records.

    One pass over the file in blocks of a few MiB (never the whole file in memory): each
    block feeds the file's hash and the hash of the range (row group or footer) it falls in.
    """
    size = os.path.getsize(path)
    md = pq.read_metadata(path)
    bounds = []  # (start, end) of each row group, then the footer
    prev_end = 4  # after the leading "PAR1" magic
    for i in range(md.num_row_groups):
        start, end = row_group_byte_range(md.row_group(i))
        if start != prev_end:
            raise RuntimeError(f"{path}: row group {i} starts at {start}, expected {prev_end}")
        bounds.append((start, end))
        prev_end = end
    bounds.append((prev_end, size))
    file_hash, range_hashes = xxh3_ranges(path, bounds)
    rgs = [RowGroupInfo(md.row_group(i).num_rows, a, b - a, range_hashes[i])
           for i, (a, b) in enumerate(bounds[:-1])]
    return ShardInfo(
        name=file_hash, bytes=size, rows=md.num_rows, footer_offset=prev_end,
        footer_xxh3=range_hashes[-1], row_groups=rgs,
    )
