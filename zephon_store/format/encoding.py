"""Storage encodings: how a column's logical Arrow type is laid out inside the shards.

Format v2 stores every top-level ``fixed_size_list<T>[n]`` column, ``T`` an integer or
floating type and ``n >= 1``, as ``fixed_size_binary(n * sizeof(T))``. Parquet then stores
one opaque value per row instead of ``n`` values with repetition and definition levels, so
a packed token window decodes without any level decoding (measured in
``docs/benchmarks.md``). The manifest keeps the logical schema as ``schema`` and names
every encoded column in ``storage``, so a reader never guesses; :func:`to_logical` turns a
decoded row group back into the logical types. Two layouts of the value's bytes exist:

- ``fixed_size_binary_le`` (v2): the list's ``n`` elements, little-endian, back to back.
  Both directions are zero-copy: the list's child values buffer is the binary data buffer.
- ``fixed_size_binary_split`` (v5, for elements of 2 bytes or more): the same bytes split
  into ``sizeof(T)`` planes per value, plane ``k`` holding byte ``k`` of every element in
  order (Parquet's BYTE_STREAM_SPLIT, applied inside each value). Token ids below 2**16
  in int32 leave two planes of zeros and a plane of slowly varying high bytes, so a fast
  codec packs a window smaller than zstd level 3 packs the ``le`` layout (formats/SPEC.md
  3.1; measured in docs/benchmarks.md, "token windows in byte planes"). Each direction
  costs one strided copy.

Arrow's buffers are in host byte order and the on-disk order is little-endian, so both
directions refuse to run on a big-endian host rather than misread. A null *row* keeps its
validity bit; a null *element* inside a valid row has no place in the binary layout and is
an error (write such data with ``WriteOptions(fixed_size_lists="list")``).

>>> import pyarrow as pa
>>> t = pa.table({"tokens": pa.array([[1, 2], [3, 4]], pa.list_(pa.int32(), 2))})
>>> enc = storage_encodings(t.schema)
>>> enc
{'tokens': 'fixed_size_binary_split'}
>>> s = to_storage(t, enc)
>>> s.column("tokens").to_pylist()[0]   # byte 0 of both elements, then bytes 1, 2, 3
b'\\x01\\x02\\x00\\x00\\x00\\x00\\x00\\x00'
>>> s.schema.field("tokens").type
FixedSizeBinaryType(fixed_size_binary[8])
>>> to_logical(s, t.schema, enc).equals(t)
True
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from ..errors import ZephonError

__all__ = [
    "FIXED_SIZE_BINARY_LE",
    "FIXED_SIZE_BINARY_SPLIT",
    "FIXED_SIZE_LIST_MODES",
    "ElementNullError",
    "encodable",
    "storage_encodings",
    "storage_schema",
    "to_storage",
    "to_logical",
]

FIXED_SIZE_BINARY_LE = "fixed_size_binary_le"
FIXED_SIZE_BINARY_SPLIT = "fixed_size_binary_split"
# WriteOptions.fixed_size_lists: "split" (the default from v5) stores eligible columns of
# elements wider than a byte in byte planes and the rest as "binary" does; "binary" stores
# every eligible column little-endian back to back (v2-v4); "list" keeps the v1 layout.
FIXED_SIZE_LIST_MODES = ("split", "binary", "list")
ENCODINGS = (FIXED_SIZE_BINARY_LE, FIXED_SIZE_BINARY_SPLIT)


class ElementNullError(ZephonError, ValueError):
    """A fixed-size list holds a null element, which the binary storage cannot represent.

    ``column`` names the column, ``row`` the first offending row of the table given, and
    ``detail`` says what to do (the message without the column and row).
    """

    # Defaults so the error survives pickling back from a conversion worker process.
    def __init__(self, message: str, *, column: str | None = None, row: int = 0,
                 detail: str = "") -> None:
        super().__init__(message)
        self.column = column
        self.row = row
        self.detail = detail or message


_ELEMENT_NULL = ("a fixed_size_list element is null, which the fixed_size_binary storage "
                 "cannot hold; fill or drop the nulls, or write with "
                 "WriteOptions(fixed_size_lists='list') (zephon convert --fixed-size-lists list)")


def encodable(type_: pa.DataType) -> bool:
    """True if a column of this type is stored as fixed-size binary in format v2.

    >>> encodable(pa.list_(pa.int32(), 2049)), encodable(pa.list_(pa.int32()))
    (True, False)
    """
    return (pat.is_fixed_size_list(type_) and type_.list_size >= 1
            and (pat.is_integer(type_.value_type) or pat.is_floating(type_.value_type)))


def storage_encodings(schema: pa.Schema, mode: str = "split",
                      compression: str | None = None) -> dict[str, str]:
    """Column name -> storage encoding for a logical schema (what the manifest records).

    ``mode`` is ``WriteOptions.fixed_size_lists``: ``"split"`` stores elements of 2 bytes
    or more in byte planes and single bytes back to back (planes of one byte are the same
    bytes), ``"binary"`` stores every eligible column back to back, ``"list"`` encodes
    nothing. ``compression`` is ``WriteOptions.compression``: with ``"none"`` no codec
    runs, so planes would only cost every read a copy (2x the CPU of an uncompressed pass
    over token windows), and ``"split"`` stores them back to back as ``"binary"`` does.

    >>> schema = pa.schema([("x", pa.list_(pa.float32(), 3)), ("b", pa.list_(pa.uint8(), 4)),
    ...                     ("y", pa.string())])
    >>> storage_encodings(schema)
    {'x': 'fixed_size_binary_split', 'b': 'fixed_size_binary_le'}
    >>> storage_encodings(schema, "binary") == storage_encodings(schema, "split", "none")
    True
    """
    if mode not in FIXED_SIZE_LIST_MODES:
        raise ValueError(f"fixed_size_lists must be one of {', '.join(FIXED_SIZE_LIST_MODES)}; "
                         f"got {mode!r}")
    if mode == "list":
        return {}
    split = mode == "split" and compression != "none"
    return {f.name: FIXED_SIZE_BINARY_SPLIT if split and _item(f.type) > 1
            else FIXED_SIZE_BINARY_LE for f in schema if encodable(f.type)}


def _item(type_: pa.DataType) -> int:
    return type_.value_type.bit_width // 8


def _width(type_: pa.DataType) -> int:
    return type_.list_size * _item(type_)


def _check_encodings(schema: pa.Schema, encodings: dict[str, str]) -> None:
    for name, enc in encodings.items():
        if enc not in ENCODINGS:
            raise ValueError(f"column {name!r}: unknown storage encoding {enc!r} (this "
                             f"zephon_store knows {', '.join(ENCODINGS)}); upgrade zephon_store")
        i = schema.get_field_index(name)
        if i < 0:
            raise ValueError(f"storage encoding names column {name!r}, which the schema "
                             f"{schema.names} lacks; the manifest is inconsistent, re-convert")
        if not encodable(schema.field(i).type):
            raise ValueError(f"column {name!r}: encoding {enc!r} needs a fixed_size_list of "
                             f"integers or floats, the schema says {schema.field(i).type}")
        if enc == FIXED_SIZE_BINARY_SPLIT and _item(schema.field(i).type) < 2:
            raise ValueError(f"column {name!r}: encoding {enc!r} needs elements of 2 bytes or "
                             f"more, the schema says {schema.field(i).type}; the manifest is "
                             "inconsistent, re-convert")


def storage_schema(schema: pa.Schema, encodings: dict[str, str]) -> pa.Schema:
    """The schema the shards hold for a logical ``schema`` and its ``encodings``.

    Encoded fields keep their name, nullability and metadata; other fields are unchanged.

    >>> storage_schema(pa.schema([("x", pa.list_(pa.int16(), 3))]), {"x": FIXED_SIZE_BINARY_LE})
    x: fixed_size_binary[6]
    """
    _check_encodings(schema, encodings)
    if not encodings:
        return schema
    return pa.schema([f.with_type(pa.binary(_width(f.type))) if f.name in encodings else f
                      for f in schema], metadata=schema.metadata)


def _require_little_endian() -> None:
    if sys.byteorder != "little":
        raise ZephonError(
            "fixed_size_binary_le columns are stored little-endian and this host is "
            f"{sys.byteorder}-endian; zephon_store does not byte-swap them: read on a "
            "little-endian host, or write with WriteOptions(fixed_size_lists='list')")


def _element_nulls(arr: pa.FixedSizeListArray, values: pa.Array) -> int:
    """Index of the first valid row holding a null element, or -1."""
    if values.null_count == 0:
        return -1
    bad = np.asarray(values.is_null()).reshape(len(arr), arr.type.list_size).any(axis=1)
    if arr.null_count:
        bad &= np.asarray(arr.is_valid())
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else -1


def _planes(data: pa.Buffer | None, byte_offset: int, rows: int, n: int, item: int,
            split: bool) -> pa.Buffer:
    """``rows`` values of ``n`` elements of ``item`` bytes from ``data`` (starting at
    ``byte_offset``), their bytes moved into planes (``split``) or back out of them."""
    if data is None:   # no values buffer (every row null): zeros, like the decoder's
        return pa.py_buffer(np.zeros(rows * n * item, np.uint8))
    # From Arrow's pool (where the Parquet decoder's buffers come from), not numpy's malloc:
    # the pool keeps freed memory, where a fresh mmap per row group costs page faults.
    buf = pa.allocate_buffer(rows * n * item)
    out = np.frombuffer(buf, np.uint8)
    if rows:
        src = np.frombuffer(data, np.uint8, rows * n * item, byte_offset)
        if split:
            src, dst = src.reshape(rows, n, item), out.reshape(rows, item, n)
            for k in range(item):   # a strided copy per plane (faster than one transpose())
                dst[:, k, :] = src[:, :, k]
        else:
            src, dst = src.reshape(rows, item, n), out.reshape(rows, n, item)
            for k in range(item):
                dst[:, :, k] = src[:, k, :]
    return buf


def _validity_from_row0(arr: pa.Array) -> pa.Buffer | None:
    """``arr``'s validity bitmap rebased to its first row (None when it has no nulls)."""
    if not arr.null_count:
        return None
    valid = arr.is_valid()
    if valid.offset:
        valid = pa.concat_arrays([valid])
    return valid.buffers()[1]


def _chunk_to_storage(arr: pa.FixedSizeListArray, name: str, row0: int,
                      encoding: str = FIXED_SIZE_BINARY_LE) -> pa.Array:
    n = arr.type.list_size
    item = _item(arr.type)
    # The rows' elements: the child array sliced to this (possibly offset) list array.
    values = arr.values.slice(arr.offset * n, len(arr) * n)
    bad = _element_nulls(arr, values)
    if bad >= 0:
        raise ElementNullError(f"column {name!r} row {row0 + bad}: {_ELEMENT_NULL}",
                               column=name, row=row0 + bad, detail=_ELEMENT_NULL)
    child = arr.values
    if encoding == FIXED_SIZE_BINARY_SPLIT:
        data = _planes(child.buffers()[1], (child.offset + arr.offset * n) * item, len(arr), n,
                       item, split=True)
        return pa.Array.from_buffers(pa.binary(n * item), len(arr),
                                     [_validity_from_row0(arr), data], null_count=arr.null_count)
    # Zero-copy: the binary array keeps the list array's offset (in rows), so its validity
    # bitmap is the list's own and its data buffer is the child's from the list's row 0.
    data = child.buffers()[1]
    if data is None:
        data = pa.py_buffer(b"")
    else:
        data = data.slice(child.offset * item, (arr.offset + len(arr)) * n * item)
    return pa.Array.from_buffers(pa.binary(n * item), len(arr), [arr.buffers()[0], data],
                                 null_count=arr.null_count, offset=arr.offset)


def to_storage(table: pa.Table, encodings: dict[str, str], *, row0: int = 0) -> pa.Table:
    """Re-type the encoded columns of a logical ``table`` into their storage types.

    Zero-copy for the values of ``fixed_size_binary_le`` columns (the child buffer becomes
    the binary data buffer), one copy for ``fixed_size_binary_split``; raises
    :class:`ElementNullError` naming the column and row if an element inside a valid row
    is null (``row0``: the number of the table's first row, for a slice of a larger one).

    >>> t = pa.table({"x": pa.array([[1, 2]], pa.list_(pa.uint16(), 2))})
    >>> to_storage(t, {"x": FIXED_SIZE_BINARY_LE}).column("x").to_pylist()
    [b'\\x01\\x00\\x02\\x00']
    >>> to_storage(t, {"x": FIXED_SIZE_BINARY_SPLIT}).column("x").to_pylist()
    [b'\\x01\\x02\\x00\\x00']
    """
    if not encodings:
        return table
    _require_little_endian()
    target = storage_schema(table.schema, encodings)
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.name not in encodings:
            columns.append(column)
            continue
        chunks, first = [], row0
        for chunk in column.chunks:
            chunks.append(_chunk_to_storage(chunk, field.name, first, encodings[field.name]))
            first += len(chunk)
        columns.append(pa.chunked_array(chunks, type=target.field(field.name).type))
    return pa.Table.from_arrays(columns, schema=target)


def _chunk_to_logical(arr: pa.Array, type_: pa.DataType, name: str,
                      encoding: str = FIXED_SIZE_BINARY_LE) -> pa.Array:
    n = type_.list_size
    item = _item(type_)
    if arr.type != pa.binary(n * item):
        raise ZephonError(
            f"column {name!r}: shard holds {arr.type}, the manifest's {type_} is stored as "
            f"fixed_size_binary[{n * item}]; the shard does not belong to this manifest, "
            "run 'zephon verify' and re-convert")
    validity, data = arr.buffers()
    if encoding == FIXED_SIZE_BINARY_SPLIT:
        data = _planes(data, arr.offset * n * item, len(arr), n, item, split=False)
        values = pa.Array.from_buffers(type_.value_type, len(arr) * n, [None, data], null_count=0)
        return pa.Array.from_buffers(type_, len(arr), [_validity_from_row0(arr)],
                                     null_count=arr.null_count, children=[values])
    if data is None:
        data = pa.py_buffer(b"")
    # The values keep the binary array's offset (in rows), so the bitmap needs no rebasing.
    values = pa.Array.from_buffers(type_.value_type, (arr.offset + len(arr)) * n, [None, data],
                                   null_count=0)
    return pa.Array.from_buffers(type_, len(arr), [validity], null_count=arr.null_count,
                                 offset=arr.offset, children=[values])


def to_logical(table: pa.Table, logical_schema: pa.Schema,
               encodings: dict[str, str]) -> pa.Table:
    """Turn a decoded shard table back into the logical types (zero-copy for
    ``fixed_size_binary_le``, one strided copy for ``fixed_size_binary_split``).

    Only the columns named in ``encodings`` change; the result carries the
    ``logical_schema`` fields of the columns present (a column projection is fine).

    >>> s = pa.table({"x": pa.array([b"\\x01\\x00\\x02\\x00"], pa.binary(4))})
    >>> to_logical(s, pa.schema([("x", pa.list_(pa.uint16(), 2))]),
    ...            {"x": FIXED_SIZE_BINARY_LE}).column("x").to_pylist()
    [[1, 2]]
    """
    if not encodings:
        return table
    _require_little_endian()
    columns, fields = [], []
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.name in encodings:
            field = logical_schema.field(field.name)
            column = pa.chunked_array(
                [_chunk_to_logical(c, field.type, field.name, encodings[field.name])
                 for c in column.chunks],
                type=field.type)
        fields.append(field)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))
