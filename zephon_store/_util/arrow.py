"""Arrow <-> numpy without pyarrow's pandas path.

``pa.array(...)`` and ``Array.to_numpy()`` import pandas when it is installed (about half a
second in every fresh process: converter workers, DataLoader workers, CLI calls). These
helpers build and read plain arrays straight from buffers instead.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def i64(values) -> pa.Array:
    """int64 Arrow array from a sequence or numpy array (no nulls).

    >>> i64([1, 2]).to_pylist()
    [1, 2]
    """
    return numbers(values, pa.int64())


def numbers(values, type_: pa.DataType) -> pa.Array:
    """Arrow array of a fixed-width integer or float ``type_`` from a sequence or numpy
    array (no nulls; values are cast to the type's numpy dtype).

    >>> numbers([1, 2], pa.uint16()).type, numbers([1, 2], pa.uint16()).to_pylist()
    (DataType(uint16), [1, 2])
    """
    arr = np.ascontiguousarray(np.asarray(values, dtype=type_.to_pandas_dtype()))
    return pa.Array.from_buffers(type_, len(arr), [None, pa.py_buffer(arr)])


def strings(values: list[str]) -> pa.Array:
    """utf8 Arrow array from a list of str (no nulls)."""
    data = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    if offsets[-1] < 2**31:
        return pa.StringArray.from_buffers(len(data), pa.py_buffer(offsets.astype(np.int32)),
                                           pa.py_buffer(b"".join(data)))
    raise ValueError("string column too large for 32-bit offsets")


def binary16(values: list[bytes]) -> pa.Array:
    """fixed_size_binary(16) Arrow array from 16-byte values."""
    if any(len(v) != 16 for v in values):
        raise ValueError("every value must be exactly 16 bytes")
    return pa.Array.from_buffers(pa.binary(16), len(values), [None, pa.py_buffer(b"".join(values))])


def np_view(arr: pa.Array) -> np.ndarray:
    """Zero-copy numpy view of a primitive (integer/float) array's values buffer.

    Null slots hold whatever the buffer holds; see :func:`valid_mask`.
    """
    t = arr.type
    if pa.types.is_integer(t):
        dtype = np.dtype(f"{'u' if pa.types.is_unsigned_integer(t) else 'i'}{t.bit_width // 8}")
    elif pa.types.is_floating(t):
        dtype = np.dtype(f"f{t.bit_width // 8}")
    else:
        raise TypeError(f"np_view needs an integer or float array, got {t}")
    if len(arr) == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr),
                         offset=arr.offset * dtype.itemsize)


def column_np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """numpy values of a primitive column without nulls (zero-copy when single-chunk)."""
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return np_view(col.chunk(0))
        return np.concatenate([np_view(c) for c in col.chunks]) if col.num_chunks else \
            np.zeros(0, dtype=np.int64)
    return np_view(col)


def valid_mask(arr: pa.Array) -> np.ndarray:
    """Boolean numpy mask of the non-null slots, read from the validity bitmap."""
    n = len(arr)
    bitmap = arr.buffers()[0]
    if bitmap is None:
        return np.ones(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[arr.offset:arr.offset + n].astype(bool)


def is_flat_binary(t: pa.DataType) -> bool:
    """True for string, large_string, binary and large_binary (what :func:`gather_pylist` takes)."""
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


def gather_pylist(columns: list[pa.ChunkedArray | pa.Array], inverse: np.ndarray,
                  rows: np.ndarray) -> list:
    """Row ``rows[j]`` of ``columns[inverse[j]]`` for every j, as Python ``str``/``bytes``.

    For string and binary columns (:func:`is_flat_binary`). Each value is made straight
    from the column's data buffer: one copy, where ``take``, ``concat`` and ``to_pylist``
    made three (a shuffled text pass spent 0.24-0.37 s in those against 0.13 s here,
    ``tools/bench/peers`` read_shuffled).

    >>> a = pa.array(["a", None, "c"]); b = pa.array(["x", "y"])
    >>> gather_pylist([a, b], np.array([1, 0, 0, 1]), np.array([1, 2, 1, 0]))
    ['y', 'c', None, 'x']
    """
    out: list = [None] * len(rows)
    inverse = np.asarray(inverse)
    rows = np.asarray(rows)
    by_col = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[by_col], np.arange(len(columns) + 1))
    for k, col in enumerate(columns):
        at = by_col[bounds[k]:bounds[k + 1]]
        if not at.size:
            continue
        if isinstance(col, pa.ChunkedArray):
            col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        want = rows[at]
        valid = valid_mask(col)[want] if col.null_count else None
        bufs = col.buffers()
        wide = pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type)
        offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32,
                                count=len(col) + 1, offset=col.offset * (8 if wide else 4))
        starts = offsets[want].tolist()
        ends = offsets[want + 1].tolist()
        data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
        text = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
        for j, (pos, s, e) in enumerate(zip(at.tolist(), starts, ends)):
            if valid is not None and not valid[j]:
                continue
            out[pos] = str(data[s:e], "utf-8") if text else bytes(data[s:e])
    return out
