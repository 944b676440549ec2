"""Cut points depend only on row sizes and options, never on how rows arrive."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.write.layout import Cutter


def _cut(sizes, chunks, **kw):
    c = Cutter(**kw)
    for part in np.array_split(sizes, chunks):
        c.feed(part)
    return [(p.index, p.row_start, p.row_group_rows) for p in c.finish()]


options = st.fixed_dictionaries({
    "row_group_rows": st.one_of(st.none(), st.integers(1, 50)),
    "row_group_bytes": st.one_of(st.none(), st.integers(1, 2000)),
    "target_shard_bytes": st.integers(1, 20000),
}).filter(lambda d: d["row_group_rows"] or d["row_group_bytes"])


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 500), min_size=1, max_size=400), kw=options,
       chunks=st.integers(1, 50))
def test_cuts_are_independent_of_chunking(sizes, kw, chunks):
    sizes = np.array(sizes, dtype=np.int64)
    whole = _cut(sizes, 1, **kw)
    assert _cut(sizes, min(chunks, len(sizes)), **kw) == whole
    # every row lands in exactly one row group, shards are contiguous
    assert sum(sum(rgs) for _, _, rgs in whole) == len(sizes)
    start = 0
    for i, (index, row_start, rgs) in enumerate(whole):
        assert index == i and row_start == start and all(r > 0 for r in rgs)
        if kw["row_group_rows"]:
            assert all(r <= kw["row_group_rows"] for r in rgs)
        start += sum(rgs)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 100), min_size=1, max_size=300),
       limit=st.integers(1, 1000))
def test_byte_limit_rule(sizes, limit):
    sizes = np.array(sizes, dtype=np.int64)
    c = Cutter(row_group_rows=None, row_group_bytes=limit, target_shard_bytes=1 << 60)
    c.feed(sizes)
    (plan,) = c.finish()
    start = 0
    for k, n in enumerate(plan.row_group_rows):
        group = sizes[start:start + n]
        last = k == len(plan.row_group_rows) - 1
        # a group closes exactly when it reaches the limit (the last one may fall short)
        assert group[:-1].sum() < limit
        if not last:
            assert group.sum() >= limit
        start += n


def test_requires_a_row_group_rule():
    with pytest.raises(ValueError, match="row_group_rows or row_group_bytes"):
        Cutter(row_group_rows=None, row_group_bytes=None, target_shard_bytes=1)
