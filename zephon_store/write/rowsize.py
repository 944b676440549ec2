"""Deterministic per-row byte sizes of Arrow data.

Row groups and shards are cut by size *before* compression, as a pure function of the
values (MosaicML's ``size_limit`` is also measured before compression). Computing the size
per row from the values, never from how a reader happened to chunk them, is what keeps the
cut points, and so every shard's bytes, identical for any number of conversion workers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._util.arrow import np_view, valid_mask


def table_row_nbytes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Return the approximate uncompressed size of every row, as int64.

    >>> t = pa.table({"a": [1, 2], "s": ["x", "yyy"]})
    >>> table_row_nbytes(t).tolist()
    [13, 15]
    """
    total = np.zeros(table.num_rows, dtype=np.int64)
    for column in table.columns:
        total += array_row_nbytes(column)
    return total


def array_row_nbytes(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per-row byte size of one column (recursing into nested types)."""
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([_sizes(c) for c in arr.chunks])
    return _sizes(arr)


def _ints_or_zero(arr: pa.Array) -> np.ndarray:
    """Integer array -> int64 numpy, nulls as 0.

    Deliberately not ``fill_null``: it builds a Python scalar, which makes pyarrow import
    pandas (about half a second) in every conversion process.
    """
    values = np_view(arr).astype(np.int64, copy=False)
    if arr.null_count == 0:
        return values
    return np.where(valid_mask(arr), values, 0)


def _sizes(arr: pa.Array) -> np.ndarray:
    t = arr.type
    n = len(arr)
    if pa.types.is_null(t):
        return np.zeros(n, dtype=np.int64)
    if pa.types.is_boolean(t):
        return np.ones(n, dtype=np.int64)
    if pa.types.is_dictionary(t):
        value_sizes = _sizes(arr.dictionary)
        idx = _ints_or_zero(arr.indices)
        out = value_sizes[idx] if len(value_sizes) else np.zeros(n, dtype=np.int64)
        return out + t.index_type.bit_width // 8
    if (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t) or pa.types.is_string_view(t)
            or pa.types.is_binary_view(t)):
        lengths = _ints_or_zero(pc.binary_length(arr))
        offset_width = 8 if (pa.types.is_large_string(t) or pa.types.is_large_binary(t)) else 4
        return lengths + offset_width
    if pa.types.is_fixed_size_list(t):
        if t.list_size == 0 or n == 0:
            return np.zeros(n, dtype=np.int64)
        width = _fixed_width(t.value_type)
        if width:
            # Token windows: list_size * width per valid row, without a size per element
            # (2049 int64 per window was most of the parse stage's own time).
            return np.where(valid_mask(arr), t.list_size * width, 0).astype(np.int64) \
                if arr.null_count else np.full(n, t.list_size * width, dtype=np.int64)
        child = _sizes(arr.flatten())
        # flatten() drops the values of null slots; rebuild per-row sums over valid rows.
        valid = valid_mask(arr)
        out = np.zeros(n, dtype=np.int64)
        out[valid] = child.reshape(-1, t.list_size).sum(axis=1)
        return out
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        offsets = np_view(arr.offsets).astype(np.int64)
        child = _sizes(arr.values)
        csum = np.concatenate([[0], np.cumsum(child)])
        width = 8 if pa.types.is_large_list(t) else 4
        return csum[offsets[1:]] - csum[offsets[:-1]] + width
    if pa.types.is_struct(t):
        out = np.zeros(n, dtype=np.int64)
        for child in arr.flatten():
            out += _sizes(child)
        return out
    width = _fixed_width(t)
    if width > 0:
        return np.full(n, width, dtype=np.int64)
    # Types without a fixed width that are not handled above (unions, extension types):
    # spread the buffer size evenly, which is still a pure function of the values.
    per = (arr.nbytes // n) if n else 0
    return np.full(n, per, dtype=np.int64)


def _fixed_width(t: pa.DataType) -> int:
    """Bytes per value of a fixed-width, non-nested, non-boolean type; else 0."""
    if pa.types.is_boolean(t) or pa.types.is_nested(t) or pa.types.is_dictionary(t):
        return 0
    try:
        return max(t.bit_width // 8, 0)
    except ValueError:
        return 0
