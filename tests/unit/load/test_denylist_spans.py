"""A deny list's document spans (issue 42 item 5): which tokens of a batch's windows they
blank, against a brute-force reference, and the identity of lists without documents."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.load.denylist import DenyList
from zephon_store.load.documents import DocumentColumns, blank_spans

WIDTH = 9


@st.composite
def lists_and_batches(draw):
    spans = draw(st.lists(st.tuples(st.integers(0, 12), st.integers(0, WIDTH - 1),
                                    st.integers(1, WIDTH)), max_size=12))
    spans = [(w, o, min(n, WIDTH - o)) for w, o, n in spans]
    ids = draw(st.lists(st.integers(0, 14), max_size=8))
    return spans, np.array(ids, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(lists_and_batches())
def test_blanked_tokens_equal_a_token_by_token_reference(case) -> None:
    spans, ids = case
    deny = DenyList([], "xxh3:x", spans=spans or None, documents=[(-1, 0)] if spans else ())
    tokens = np.arange(1, 1 + ids.size * WIDTH, dtype=np.int32).reshape(ids.size, WIDTH)
    out, blank = blank_spans({"tokens": tokens}, DocumentColumns(pad_id=-7),
                             deny.spans_in(ids))
    want = np.zeros(tokens.shape, dtype=bool)
    for r, w in enumerate(ids.tolist()):
        for sw, o, n in spans:
            if sw == w:
                want[r, o:o + n] = True
    got = np.zeros(tokens.shape, dtype=bool) if blank is None else blank
    assert (got == want).all()
    assert (out["tokens"][want] == -7).all() and (out["tokens"][~want] == tokens[~want]).all()
    assert deny.blanked_tokens(ids).tolist() == [
        sum(n for sw, _, n in set(spans) if sw == w) for w in ids.tolist()]


def test_a_list_without_documents_keeps_its_identity() -> None:
    """The identity of a list of ids is what it was before documents could be named (a log
    written then still verifies); naming a document changes it."""
    from zephon_store._util.hashing import xxh3_hex

    ids = np.array([3, 5], dtype=np.int64)
    old = "xxh3:" + xxh3_hex(b"xxh3:d" + b"\0" + ids.tobytes())
    assert DenyList([5, 3, 5], "xxh3:d").identity == old
    assert DenyList([5, 3], "xxh3:d", spans=[[4, 0, 2]], documents=[(-1, 9)]).identity != old
