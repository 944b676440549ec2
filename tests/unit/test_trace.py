"""Trace, where and audit: the inverse of the order, and questions answered from a run log.

- ``Order.positions_of`` inverts ``Order.sample_at`` for random orders and epochs
  (hypothesis), and ``unpermute`` inverts ``permute``;
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.order.order import Order, OrderOptions, permute, unpermute


@st.composite
def orders(draw):
    rows = draw(st.lists(st.integers(0, 40), min_size=1, max_size=24))
    if sum(rows) == 0:
        rows[0] = 1
    options = OrderOptions(seed=draw(st.integers(0, 2**64 - 1)),
                           shuffle=draw(st.booleans()),
                           window_blocks=draw(st.integers(1, 6)),
                           lanes=draw(st.sampled_from([1, 2, 3, 4, 6, 12, 5040])))
    return Order(np.array(rows), options)


@settings(max_examples=150, deadline=None)
@given(orders(), st.data())
def test_positions_of_inverts_sample_at(order, data) -> None:
    n = order.num_samples
    positions = np.array(data.draw(st.lists(st.integers(0, 50 * n), min_size=1, max_size=64)))
    ids = order.sample_at(positions)
    assert order.positions_of(ids, positions // n).tolist() == positions.tolist()
    # And the other way round: every id of a random epoch lands on a position holding it.
    epoch = data.draw(st.integers(0, 10**6))
    back = order.positions_of(np.arange(n), epoch)
    assert order.sample_at(back).tolist() == list(range(n))
    assert sorted(back.tolist()) == list(range(epoch * n, (epoch + 1) * n))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2**40), st.integers(0, 2**64 - 1), st.data())
def test_unpermute_inverts_permute(n, key, data) -> None:
    x = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=32)))
    assert unpermute(permute(x, n, key), n, key).tolist() == x.tolist()
    assert permute(unpermute(x, n, key), n, key).tolist() == x.tolist()


def test_unpermute_with_many_domains_and_keys_at_once() -> None:
    rng = np.random.default_rng(3)
    n = rng.integers(1, 5000, 20_000)
    x = (rng.random(n.size) * n).astype(np.int64)
    keys = rng.integers(0, 2**63, n.size)
    assert (unpermute(permute(x, n, keys), n, keys) == x).all()
