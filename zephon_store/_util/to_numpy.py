"""Arrow columns to what a batch hands the caller: numpy where Arrow allows, else lists.

Batches are converted per batch, never per sample: fixed-size list columns (token windows)
become one 2-D numpy array, primitive columns one 1-D array; only string/binary and nested
variable-length columns become Python lists.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .arrow import np_view


def table_to_numpy(table: pa.Table) -> dict:
    """Arrow columns to numpy arrays (batch-level, zero-copy where Arrow allows) or lists.

    - fixed-size lists of numbers (e.g. ``tokens: fixed_size_list<int32>[2049]``) -> 2-D array;
    - numbers and booleans without nulls -> 1-D array;
    - anything else (strings, variable lists, structs, nullable numbers) -> Python list.

    >>> table_to_numpy(pa.table({"x": [1, 2]}))["x"].tolist()
    [1, 2]
    """
    out = {}
    for name, col in zip(table.column_names, table.columns):
        out[name] = column_to_numpy(col)
    return out


def array_type(t: pa.DataType) -> bool:
    """True if :func:`column_to_numpy` may give a numpy array for a column of type ``t``.

    (It still gives a list when the column holds nulls.) Other types always become lists.
    """
    return _is_numeric(t) or pa.types.is_boolean(t) or pa.types.is_fixed_size_list(t)


def column_to_numpy(col: pa.ChunkedArray):
    """One column as :func:`table_to_numpy` gives it: a numpy array where it can, else a list."""
    if not array_type(col.type):
        # Python objects either way; chunk by chunk skips the copy combine_chunks makes.
        return col.to_pylist()
    arr = array_view(col)
    return arr if arr is not None else col.to_pylist()


def array_view(col: pa.ChunkedArray) -> np.ndarray | None:
    """``col`` as numpy (zero-copy for one chunk of numbers), or None if it holds nulls.

    Numbers -> 1-D, fixed-size lists of numbers -> 2-D (rows x list size), booleans -> 1-D
    (a copy); ``None`` for other types and for columns with nulls.
    """
    t = col.type
    if not array_type(t):
        return None
    if col.num_chunks != 1:
        col = col.combine_chunks() if col.num_chunks else pa.array([], type=t)
    else:
        col = col.chunk(0)
    if col.null_count:
        return None
    if pa.types.is_fixed_size_list(t):
        if not _is_numeric(t.value_type):
            return None
        # The child values of the rows, by slicing: flatten() would copy them (one copy per
        # batch saved; docs/benchmarks.md, "Why the code is shaped this way").
        values = col.values.slice(col.offset * t.list_size, len(col) * t.list_size)
        if values.null_count:
            return None
        return np_view(values).reshape(len(col), t.list_size)
    if _is_numeric(t):
        return np_view(col)
    return col.to_numpy(zero_copy_only=False)   # booleans


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)
