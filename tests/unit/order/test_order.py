"""Order: position -> sample id is a per-epoch bijection, pure, and local by lanes/windows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from zephon_store.order import Order, OrderOptions, derive_key, permute, shuffle_quality

U64 = st.integers(min_value=0, max_value=2**64 - 1)

block_rows = st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=50)
options = st.builds(
    OrderOptions,
    seed=U64,
    shuffle=st.booleans(),
    window_blocks=st.integers(min_value=1, max_value=10),
    lanes=st.integers(min_value=1, max_value=64),
)


def make(rows: list[int], opts: OrderOptions) -> Order:
    return Order(np.array(rows, dtype=np.int64), opts)


# ---------------------------------------------------------------- permute


@settings(max_examples=150, deadline=None)
@given(n=st.integers(min_value=1, max_value=5000), key=U64)
def test_permute_is_a_bijection(n: int, key: int) -> None:
    out = permute(np.arange(n), n, key)
    assert out.dtype == np.int64
    assert np.array_equal(np.sort(out), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=12),
       seed=U64)
def test_permute_with_per_element_n_and_key_is_a_bijection_per_domain(
        sizes: list[int], seed: int) -> None:
    # Many windows of different sizes and keys in one call, shuffled together: each window
    # must still be a bijection, and equal to permuting it alone.
    n = np.repeat(sizes, sizes)
    idx = np.concatenate([np.arange(s) for s in sizes])
    keys = derive_key(seed, np.repeat(np.arange(len(sizes)), sizes))
    mix = np.random.default_rng(0).permutation(idx.size)
    out = np.empty_like(idx)
    out[mix] = permute(idx[mix], n[mix], keys[mix])
    start = 0
    for w, s in enumerate(sizes):
        part = out[start:start + s]
        assert np.array_equal(np.sort(part), np.arange(s))
        assert np.array_equal(part, permute(np.arange(s), s, derive_key(seed, w)))
        start += s


def test_permute_small_domains_and_errors() -> None:
    assert permute(np.array([0]), 1, 5).tolist() == [0]
    seen = {tuple(permute(np.arange(2), 2, k).tolist()) for k in range(64)}
    assert seen == {(0, 1), (1, 0)}
    seen3 = {tuple(permute(np.arange(3), 3, k).tolist()) for k in range(400)}
    assert len(seen3) == 6  # every permutation of 3 is reachable
    assert permute(np.array([], dtype=np.int64), 7, 1).shape == (0,)
    with pytest.raises(ValueError, match="n must be >= 1"):
        permute(np.array([0]), 0, 1)
    with pytest.raises(ValueError, match=r"\[0, n\)"):
        permute(np.array([5]), 5, 1)
    with pytest.raises(ValueError, match=r"\[0, n\)"):
        permute(np.array([-1]), 5, 1)


def test_permute_large_chunked_input_matches_small_calls() -> None:
    n = 300_000  # above the internal chunk size
    full = permute(np.arange(n), n, 99)
    assert np.array_equal(np.sort(full), np.arange(n))
    assert np.array_equal(full[123_456:123_500], permute(np.arange(123_456, 123_500), n, 99))


def test_permute_positions_are_roughly_uniform() -> None:
    # Where index 0 lands over many keys: uniform over [0, n) within a loose chi-square bound.
    n, trials = 10, 20_000
    keys = derive_key(np.arange(trials))
    landed = permute(np.zeros(trials, dtype=np.int64), n, keys)
    counts = np.bincount(landed, minlength=n)
    expected = trials / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 40  # 9 degrees of freedom; p ~ 1e-5


# ---------------------------------------------------------------- options


def test_options_validate_and_round_trip() -> None:
    opts = OrderOptions(seed=7, shuffle=False, window_blocks=3, lanes=12)
    assert OrderOptions.from_dict(opts.to_dict()) == opts
    assert opts.to_dict() == {"seed": 7, "shuffle": False, "window_blocks": 3, "lanes": 12,
                              "algorithm": 1}
    with pytest.raises(ValueError, match="order algorithm 2 is not known"):
        OrderOptions(algorithm=2)
    with pytest.raises(ValueError, match="window_blocks must be > 0, got 0"):
        OrderOptions(window_blocks=0)
    with pytest.raises(ValueError, match="lanes must be > 0, got -1"):
        OrderOptions(lanes=-1)
    with pytest.raises(ValueError, match="seed"):
        OrderOptions(seed=-1)
    with pytest.raises(ValueError, match="shuffle"):
        OrderOptions(shuffle=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown order option key 'colour'"):
        OrderOptions.from_dict({**opts.to_dict(), "colour": 1})
    with pytest.raises(ValueError, match="missing order option key 'lanes'"):
        OrderOptions.from_dict({"seed": 1, "shuffle": True, "window_blocks": 2})
    # numpy scalars are normalised, so a dict from to_dict() is plain JSON
    assert type(OrderOptions(seed=np.int64(3)).to_dict()["seed"]) is int


def test_order_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="no samples"):
        Order(np.array([0, 0]), OrderOptions())
    with pytest.raises(ValueError, match=">= 0"):
        Order(np.array([3, -1]), OrderOptions())
    o = Order(np.array([3, 4]), OrderOptions())
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        o.sample_at(np.array([0, -1]))
    with pytest.raises(ValueError, match="integers"):
        o.sample_at(np.array([0.5]))


# ---------------------------------------------------------------- order: bijection, purity


@settings(max_examples=120, deadline=None)
@given(rows=block_rows, opts=options)
def test_every_epoch_is_a_permutation(rows: list[int], opts: OrderOptions) -> None:
    o = make(rows, opts)
    n = o.num_samples
    assert n == sum(rows)
    assert 1 <= o.effective_lanes <= max(1, opts.lanes)
    for e in (0, 1, 5):
        ids = o.sample_at(np.arange(e * n, (e + 1) * n))
        assert ids.dtype == np.int64
        assert np.array_equal(np.sort(ids), np.arange(n))
        assert (o.epoch_of(np.arange(e * n, (e + 1) * n)) == e).all()


@settings(max_examples=60, deadline=None)
@given(rows=block_rows, seed=U64, k=st.integers(1, 4), lanes=st.integers(1, 16))
def test_epochs_differ_when_shuffled(rows: list[int], seed: int, k: int, lanes: int) -> None:
    assume(sum(rows) >= 20)
    o = make(rows, OrderOptions(seed=seed, window_blocks=k, lanes=lanes))
    n = o.num_samples
    e0 = o.sample_at(np.arange(n))
    e1 = o.sample_at(np.arange(n, 2 * n))
    e5 = o.sample_at(np.arange(5 * n, 6 * n))
    assert not np.array_equal(e0, e1)
    assert not np.array_equal(e1, e5)


@settings(max_examples=80, deadline=None)
@given(rows=block_rows, opts=options, data=st.data())
def test_sample_at_is_pure(rows: list[int], opts: OrderOptions, data: st.DataObject) -> None:
    # The id at a position does not depend on how positions are requested: in chunks,
    # as random subsets, reversed, one by one, or from a fresh object.
    o = make(rows, opts)
    n = o.num_samples
    positions = np.arange(3 * n + 7, dtype=np.int64)
    full = o.sample_at(positions)

    cuts = sorted(data.draw(st.lists(st.integers(0, positions.size), max_size=6)))
    pieces = np.split(positions, cuts)
    assert np.array_equal(np.concatenate([o.sample_at(p) for p in pieces]), full)

    subset = data.draw(st.lists(st.integers(0, positions.size - 1), max_size=40))
    sub = np.array(subset, dtype=np.int64)
    assert np.array_equal(o.sample_at(sub), full[sub])
    assert np.array_equal(o.sample_at(positions[::-1]), full[::-1])
    assert np.array_equal(make(rows, opts).sample_at(positions[::-1])[::-1], full)
    if sub.size:
        assert int(o.sample_at(int(sub[0]))) == full[sub[0]]
    assert np.array_equal(o.sample_at(positions.reshape(-1, 1))[:, 0], full)


def test_epoch_boundary_crossing_in_one_call() -> None:
    o = Order(np.full(37, 11), OrderOptions(seed=5, window_blocks=2, lanes=6))
    n = o.num_samples
    lo, hi = 2 * n - 50, 2 * n + 50
    mixed = o.sample_at(np.arange(lo, hi))
    separate = np.concatenate([o.sample_at(np.arange(lo, 2 * n)),
                               o.sample_at(np.arange(2 * n, hi))])
    assert np.array_equal(mixed, separate)
    assert o.epoch_of(np.array([2 * n - 1, 2 * n])).tolist() == [1, 2]


def test_many_epochs_of_a_tiny_dataset_in_one_call() -> None:
    # window_blocks=3 makes one window of the whole epoch: a full shuffle, all 3! orders.
    o = Order(np.array([1, 0, 2]), OrderOptions(seed=4, window_blocks=3, lanes=2))
    together = o.sample_at(np.arange(3 * 500))
    one_by_one = np.concatenate([o.sample_at(np.arange(3 * e, 3 * e + 3)) for e in range(500)])
    assert np.array_equal(together, one_by_one)
    assert (np.sort(together.reshape(500, 3), axis=1) == np.arange(3)).all()
    assert len({tuple(row) for row in together.reshape(500, 3).tolist()}) == 6


@settings(max_examples=40, deadline=None)
@given(rows=block_rows, seed=U64)
def test_sequential_mode_is_the_identity(rows: list[int], seed: int) -> None:
    o = make(rows, OrderOptions(seed=seed, shuffle=False))
    n = o.num_samples
    p = np.arange(3 * n)
    assert np.array_equal(o.sample_at(p), p % n)
    assert o.effective_lanes == 1


def test_zero_row_blocks_are_skipped() -> None:
    o = Order(np.array([0, 3, 0, 0, 2, 0]), OrderOptions(seed=1, window_blocks=1, lanes=2))
    ids = o.sample_at(np.arange(5))
    assert sorted(ids.tolist()) == [0, 1, 2, 3, 4]
    assert o.block_of(np.array([0, 2, 3, 4])).tolist() == [1, 1, 4, 4]


# ---------------------------------------------------------------- order: lanes and windows


def test_effective_lanes_is_a_capped_divisor() -> None:
    # cap = num_blocks // window_blocks = 1000 -> the largest divisor of 5040 <= 1000
    o = Order(np.full(8000, 2), OrderOptions(window_blocks=8, lanes=5040))
    assert o.effective_lanes == 840
    assert Order(np.full(10, 2), OrderOptions(window_blocks=8)).effective_lanes == 1
    assert Order(np.full(64, 1), OrderOptions(window_blocks=1, lanes=7)).effective_lanes == 7
    assert Order(np.full(6, 1), OrderOptions(window_blocks=1, lanes=7)).effective_lanes == 1


def _sequence_s(o: Order, rows: np.ndarray, epoch: int) -> np.ndarray:
    """The epoch's block-permuted sample sequence S, rebuilt from the public block order."""
    starts = np.concatenate([[0], np.cumsum(rows)])
    return np.concatenate([np.arange(starts[b], starts[b + 1])
                           for b in o.block_order(epoch)])


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.integers(1, 40), min_size=4, max_size=50), seed=U64,
       k=st.integers(1, 3), lanes=st.sampled_from([2, 3, 4, 6, 12, 60]),
       epoch=st.integers(0, 3))
def test_lanes_and_windows_are_contiguous_runs_of_the_block_order(
        rows: list[int], seed: int, k: int, lanes: int, epoch: int) -> None:
    r = np.array(rows)
    o = Order(r, OrderOptions(seed=seed, window_blocks=k, lanes=lanes))
    n, p, w = o.num_samples, o.effective_lanes, o.window_samples
    s = _sequence_s(o, r, epoch)
    ids = o.sample_at(epoch * n + np.arange(n))
    lo = 0
    for lane in range(p):
        lane_ids = ids[lane::p]  # positions q with q % P == lane, in order
        span = s[lo:lo + lane_ids.size]
        assert np.array_equal(np.sort(lane_ids), np.sort(span))
        for j in range(0, lane_ids.size, w):
            assert np.array_equal(np.sort(lane_ids[j:j + w]), np.sort(span[j:j + w]))
        lo += lane_ids.size
    assert lo == n
    # Locality: lanes share only the blocks cut at lane boundaries.
    blocks_per_lane = [np.unique(o.block_of(ids[lane::p])).size for lane in range(p)]
    assert sum(blocks_per_lane) <= o.num_blocks + p - 1


def test_lane_touches_about_its_share_of_blocks() -> None:
    o = Order(np.full(2000, 50), OrderOptions(seed=3, window_blocks=4, lanes=120))
    p, n = o.effective_lanes, o.num_samples
    assert p == 120
    ids = o.sample_at(np.arange(n))
    touched = [np.unique(o.block_of(ids[lane::p])).size for lane in range(p)]
    assert max(touched) <= o.num_blocks // p + 2


def test_one_million_positions_over_ten_thousand_blocks() -> None:
    # Sizing run (timing is not asserted): 1M samples, 10k blocks, many lanes.
    o = Order(np.full(10_000, 100), OrderOptions(seed=11, lanes=5040))
    ids = o.sample_at(np.arange(1_000_000))
    assert np.unique(ids).size == 1_000_000
    assert o.effective_lanes == 1008
    # the default keeps a rank's working set small: one lane
    assert Order(np.full(10_000, 100), OrderOptions(seed=11)).effective_lanes == 1


# ---------------------------------------------------------------- quality figures


def test_shuffle_quality_figures() -> None:
    rows = np.full(400, 25)
    shuffled = Order(rows, OrderOptions(seed=2, window_blocks=4, lanes=20))
    q = shuffle_quality(shuffled, 256, num_batches=8, shard_of_block=np.arange(400) // 40)
    assert all(isinstance(v, float) for v in q.values())
    assert q["mean_distinct_blocks_per_batch"] > 20
    assert 1 <= q["mean_distinct_shards_per_batch"] <= 10
    assert abs(q["spearman_position_vs_id"]) < 0.1

    seq = Order(rows, OrderOptions(shuffle=False))
    qs = shuffle_quality(seq, 256, seq.block_of, num_batches=8, max_positions=1000)
    assert qs["spearman_position_vs_id"] == pytest.approx(1.0)
    assert qs["mean_distinct_blocks_per_batch"] <= 12
    table = shuffle_quality(seq, 256, np.repeat(np.arange(400), 25), num_batches=8)
    assert table["mean_distinct_blocks_per_batch"] == qs["mean_distinct_blocks_per_batch"]
