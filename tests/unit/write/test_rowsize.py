"""Row sizes (the cuts' input) of fixed-size lists: per row, the sizes of its elements."""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.write.rowsize import array_row_nbytes, table_row_nbytes

CHILD_TYPES = [pa.int32(), pa.int8(), pa.float16(), pa.float64(), pa.bool_(), pa.string(),
               pa.binary(3), pa.decimal128(5, 2), pa.date32(), pa.timestamp("ms")]


def _value(t: pa.DataType, i: int):
    if i % 7 == 3:
        return None
    if pa.types.is_boolean(t):
        return i % 2 == 0
    if pa.types.is_string(t):
        return "x" * (i % 5)
    if pa.types.is_fixed_size_binary(t):
        return b"abc"
    if pa.types.is_decimal(t):
        return decimal.Decimal(i % 100)
    if pa.types.is_floating(t):
        return float(i % 50)
    return i % 100


@settings(max_examples=40, deadline=None)
@given(child=st.sampled_from(CHILD_TYPES), size=st.integers(1, 6), rows=st.integers(1, 12),
       nulls=st.lists(st.booleans(), min_size=12, max_size=12), cut=st.integers(0, 12))
def test_fixed_size_list_rows_are_the_sum_of_their_elements(child, size, rows, nulls, cut):
    values = pa.array([_value(child, i) for i in range(rows * size)], type=child)
    arr = pa.FixedSizeListArray.from_arrays(values, size, mask=pa.array(nulls[:rows]))
    got = array_row_nbytes(arr)
    element = array_row_nbytes(values)
    want = [0 if nulls[r] else int(element[r * size:(r + 1) * size].sum()) for r in range(rows)]
    assert got.tolist() == want
    # A pure function of the values: the same sizes however the rows are chunked or sliced.
    cut = min(cut, rows)
    chunked = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], type=arr.type)
    assert array_row_nbytes(chunked).tolist() == want
    assert array_row_nbytes(arr.slice(cut)).tolist() == want[cut:]


@pytest.mark.parametrize("window", [1, 2049])
def test_token_windows_are_4_bytes_per_token(window):
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(3 * window, dtype=np.int32)),
                                               window)
    assert table_row_nbytes(pa.table({"tokens": tokens})).tolist() == [4 * window] * 3
