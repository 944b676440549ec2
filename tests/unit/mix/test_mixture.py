"""Mixture math: position -> (source, index) is pure, exact at every prefix, and continues
every source across stages (appended at resume too) without a repeat or a skip."""

from __future__ import annotations

import json
import math
import pickle
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.errors import MixtureError, SourceExhaustedError
from zephon_store.order import Order, OrderOptions
from zephon_store.order.mixture import MixtureSchedule, sample_weights

# Integer weight vectors (normalised by the schedule) with at least one positive entry.
int_weights = st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=9).filter(
    lambda w: sum(w) > 0)


def schedule(*stages, **kw) -> MixtureSchedule:
    return MixtureSchedule(list(stages), normalize=True, **kw)


def replay_counts(src: np.ndarray, k: int) -> np.ndarray:
    """counts[n] = how many of the first n positions went to each source (an O(n) replay)."""
    onehot = np.zeros((len(src) + 1, k), dtype=np.int64)
    onehot[np.arange(1, len(src) + 1), src] = 1
    return np.cumsum(onehot, axis=0)


def check_sources_exactly_once(src: np.ndarray, idx: np.ndarray, k: int) -> None:
    for s in range(k):
        got = np.sort(idx[src == s])
        assert np.array_equal(got, np.arange(len(got))), f"source {s} repeats or skips"


# --------------------------------------------------------------------------- one stage


@settings(max_examples=120, deadline=None)
@given(w=int_weights, n=st.integers(min_value=1, max_value=3000))
def test_every_prefix_is_within_the_bound(w: list[int], n: int) -> None:
    s = schedule((0, w))
    src, idx = s.locate(np.arange(n))
    counts = replay_counts(src, len(w))
    # the closed form equals the replay at every prefix
    assert np.array_equal(s.consumed(np.arange(n + 1)), counts)
    active = sum(1 for x in w if x)
    assert s.bound == Fraction(math.ceil(math.log2(active)), 2)
    # in integers: 2 * S * (count - n*w_k) = 2 * (S*count - n*x_k) for weights x / S
    total = sum(w)
    dev2 = 2 * (counts * total - np.arange(n + 1)[:, None] * np.array(w)[None, :])
    limit2 = int(2 * s.bound * total)          # the bound, times 2*S (an integer)
    assert np.abs(dev2).max() <= limit2
    # any window of consecutive positions: strictly within 2*bound of its share
    for b in (1, 7, 64):
        if b <= n:
            win = dev2[b:] - dev2[:-b]
            assert np.all((np.abs(win) < 2 * limit2) | (win == 0))
    check_sources_exactly_once(src, idx, len(w))
    for k, x in enumerate(w):
        if x == 0:
            assert not np.any(src == k)


@settings(max_examples=60, deadline=None)
@given(w=int_weights, n=st.integers(min_value=1, max_value=2000),
       seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_locate_is_a_pure_function_of_its_inputs(w: list[int], n: int, seed: int) -> None:
    a = schedule((0, w), (n, w[::-1]))
    b = schedule((0, list(w)), (n, list(w[::-1])))
    pos = np.random.default_rng(seed).integers(0, 3 * n, size=200)
    sa, ia = a.locate(pos)
    sb, ib = b.locate(pos.copy())
    assert np.array_equal(sa, sb) and np.array_equal(ia, ib)
    # element by element, in any order, the same answer as in bulk
    for i in range(0, 200, 37):
        s1, i1 = a.locate(pos[i:i + 1])
        assert (s1[0], i1[0]) == (sa[i], ia[i])
    assert a.identity() == b.identity()


@settings(max_examples=80, deadline=None)
@given(w=int_weights, seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_position_of_inverts_locate(w: list[int], seed: int) -> None:
    s = schedule((0, w), (500, w[1:] + w[:1]), (900, w))
    pos = np.sort(np.random.default_rng(seed).choice(5000, size=300, replace=False))
    src, idx = s.locate(pos)
    for k in range(len(w)):
        sel = src == k
        assert np.array_equal(s.position_of(k, idx[sel]), pos[sel])


def test_prefixes_up_to_1e12_stay_within_the_bound() -> None:
    """Closed-form counts make prefixes of 10**9 and 10**12 cheap; each is checked exactly."""
    rng = np.random.default_rng(16)
    for w in ([5, 3, 2], [1] * 7, [1, 10**6, 3, 0, 17], [2**29, 1, 2**29 - 1]):
        s = schedule((0, w))
        exact = [Fraction(x, sum(w)) for x in w]
        for top in (10**9, 10**12):
            ns = rng.integers(0, top, size=400)
            c = s.consumed(ns)
            assert np.array_equal(c.sum(axis=1), ns)
            for n, row in zip(ns.tolist(), c.tolist()):
                assert all(abs(x - n * e) <= s.bound for x, e in zip(row, exact))
            # consumed(n + 1) - consumed(n) is the one source locate(n) names
            src, idx = s.locate(ns)
            step = s.consumed(ns + 1) - c
            assert np.array_equal(step.argmax(axis=1), src)
            assert np.array_equal(c[np.arange(len(ns)), src], idx)
            back = np.empty_like(ns)
            for k in range(len(w)):
                back[src == k] = s.position_of(k, idx[src == k])
            assert np.array_equal(back, ns)


def test_extreme_and_zero_weights() -> None:
    s = MixtureSchedule([(0, [1e-9, 1 - 1e-9, 0.0])])
    assert s.stages[0][1] == (Fraction(1, 10**9), Fraction(10**9 - 1, 10**9), Fraction(0))
    for n in (10**9, 10**12, 10**12 + 12345):
        c = s.consumed(n)
        assert abs(Fraction(int(c[0])) - Fraction(n, 10**9)) <= s.bound and c[2] == 0
    first = s.position_of(0, np.arange(3))
    assert s.locate(first)[0].tolist() == [0, 0, 0]
    assert np.all(np.diff(first) == 10**9)       # evenly spread, not bunched
    src, _ = s.locate(np.arange(10**5))
    assert set(src.tolist()) <= {0, 1}
    single = MixtureSchedule([(0, [0, 1])])
    assert single.locate(np.arange(5))[1].tolist() == [0, 1, 2, 3, 4]
    assert single.bound == 0


def test_batches_hold_each_source_in_proportion() -> None:
    """A global batch of B positions holds each source within 2*bound of B*w (not bunched)."""
    s = MixtureSchedule([(0, ["1/2", "1/4", "1/8", "1/16", "1/32", "1/32"])])
    b = 96
    src, _ = s.locate(np.arange(b * 200))
    per_batch = np.stack([np.bincount(src[i:i + b], minlength=6) for i in range(0, len(src), b)])
    expected = b * np.array([1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 32])
    assert np.abs(per_batch - expected).max() < 2 * float(s.bound)
    assert (per_batch[:, 5] >= 1).all()   # even a 1/32 source shows in every batch of 96


# ------------------------------------------------------------------------------ stages


@settings(max_examples=80, deadline=None)
@given(w0=int_weights, w1=st.lists(st.integers(min_value=0, max_value=30), min_size=1,
                                      max_size=9),
       cursor=st.integers(min_value=1, max_value=1500),
       gap=st.integers(min_value=0, max_value=50),
       extra=st.integers(min_value=0, max_value=2))
def test_appending_a_stage_at_resume_neither_repeats_nor_skips(w0, w1, cursor, gap, extra):
    """Counting every sample's exposures: each source's samples (via its own Order) appear
    once per source epoch before and after the appended stage, as if planned from the start."""
    k0 = len(w0)
    w1 = (w1 + [1] * (k0 + extra))[:k0 + extra]     # may add `extra` new sources
    if sum(w1) == 0:
        w1[-1] = 1
    base = schedule((0, w0))
    start = cursor + gap
    grown = base.append_stage(start, w1, cursor=cursor, normalize=True)
    assert grown.num_sources == k0 + extra
    total = start + 1200
    before_src, before_idx = base.locate(np.arange(start))
    src, idx = grown.locate(np.arange(total))
    assert np.array_equal(src[:start], before_src) and np.array_equal(idx[:start], before_idx)
    assert np.array_equal(grown.consumed(start)[:k0], base.consumed(start))
    planned = MixtureSchedule([(0, w0 + [0] * extra), (start, w1)], normalize=True)
    ps, pi = planned.locate(np.arange(total))
    assert np.array_equal(ps, src) and np.array_equal(pi, idx)
    # exposures of each source's samples through its own order: per epoch exactly once
    for k in range(k0 + extra):
        rows = np.full(3 + k, 5, dtype=np.int64)        # source k: (3+k)*5 samples
        order = Order(rows, OrderOptions(seed=k, window_blocks=2))
        n = order.num_samples
        ids = order.sample_at(idx[src == k])
        seen = np.bincount(ids, minlength=n)
        full, part = divmod(int((src == k).sum()), n)
        assert sorted(seen.tolist()) == [full] * (n - part) + [full + 1] * part


def test_stage_offsets_are_the_consumed_counts() -> None:
    s = MixtureSchedule([(0, [0.5, 0.5, 0]), (101, [0, 0.25, 0.75]), (333, [1, 0, 0])],
                        names=["web", "code", "math"])
    d = s.to_dict()
    assert [st["consumed"] for st in d["stages"]] == [
        [0, 0, 0], s.consumed(101).tolist(), s.consumed(333).tolist()]
    assert s.consumed(101).tolist() == [51, 50, 0]
    src, idx = s.locate(np.arange(400))
    check_sources_exactly_once(src, idx, 3)
    assert not np.any(src[333:] != 0) and not np.any(src[:101] == 2)   # drop and add a source
    assert s.realized(0, 400)[1]["counts"] == (s.consumed(333) - s.consumed(101)).tolist()


def test_append_by_name_adds_a_source() -> None:
    s = MixtureSchedule([(0, {"web": 0.6, "code": 0.4})], names=["web", "code"])
    t = s.append_stage(50, {"code": 0.5, "math": 0.5}, cursor=40)
    assert t.names == ("web", "code", "math")
    assert t.consumed(50).tolist() == [30, 20, 0]
    assert t.stages[0][1] == (Fraction(3, 5), Fraction(2, 5), Fraction(0))
    assert s.names == ("web", "code")     # the original is unchanged


# -------------------------------------------------------------------------- exhaustion


def test_error_policy_names_the_source_and_position() -> None:
    s = MixtureSchedule([(0, [0.75, 0.25])], names=["web", "books"], max_epochs=[None, 2],
                        epoch_sizes=[None, 10])
    end = s.exhausted_at()[1]
    assert s.end == end
    assert s.consumed(end).tolist()[1] == 20             # exactly two epochs, then stop
    assert s.locate(np.array([end - 1]))[0].size == 1
    with pytest.raises(SourceExhaustedError, match=rf"'books' runs out at mixture position {end}"
                       ) as info:
        s.locate(np.arange(end + 1))
    assert info.value.source == "books" and info.value.position == end
    # the exhaustion point is the first position that would need books' sample 20
    unc = MixtureSchedule([(0, [0.75, 0.25])])
    assert unc.position_of(1, np.array([20])).tolist() == [end]


@settings(max_examples=60, deadline=None)
@given(w=st.lists(st.integers(min_value=1, max_value=9), min_size=2, max_size=5),
       caps=st.lists(st.one_of(st.none(), st.integers(min_value=1, max_value=3)), min_size=5,
                     max_size=5),
       sizes=st.lists(st.integers(min_value=1, max_value=60), min_size=5, max_size=5))
def test_renormalize_serves_each_capped_source_exactly_its_cap(w, caps, sizes) -> None:
    k = len(w)
    caps, sizes = caps[:k], sizes[:k]
    if all(c is not None for c in caps):
        caps[0] = None      # keep one source endless so the mixture never ends
    s = MixtureSchedule([(0, w), (150, w[::-1])], max_epochs=caps, epoch_sizes=sizes,
                        policy="renormalize", normalize=True)
    n = 3000
    src, idx = s.locate(np.arange(n))
    check_sources_exactly_once(src, idx, k)
    gone = s.exhausted_at()
    for j, cap in enumerate(caps):
        if cap is None:
            continue
        served = int((src == j).sum())
        assert served <= cap * sizes[j]
        if gone[j] is not None and gone[j] < n:
            assert served == cap * sizes[j]
            assert not np.any(src[gone[j]:] == j)
            assert s.position_of(j, np.array([cap * sizes[j]])).tolist() == [-1]
    assert s.end is None
    # derived boundaries are deterministic: the same schedule from its dict
    again = MixtureSchedule.from_dict(json.loads(json.dumps(s.to_dict())))
    assert np.array_equal(again.locate(np.arange(n))[1], idx)


def test_renormalize_ends_when_every_source_is_exhausted() -> None:
    s = MixtureSchedule([(0, [0.5, 0.5])], max_epochs=[1, 1], epoch_sizes=[3, 5],
                        policy="renormalize")
    assert s.end == 8
    assert s.locate(np.arange(8))[0].tolist().count(1) == 5
    with pytest.raises(SourceExhaustedError, match="every source"):
        s.locate(np.array([8]))


# ------------------------------------------------------------------------- state, inputs


def test_to_dict_is_small_json_and_checked_on_load() -> None:
    s = MixtureSchedule([(0, [0.7, 0.2, 0.1]), (1000, ["1/3", "1/3", "1/3"])],
                        names=["web", "code", "math"], stage_names=["warmup", "main"],
                        max_epochs=[None, 4, None], epoch_sizes=[None, 900, None])
    d = json.loads(json.dumps(s.to_dict()))
    assert len(json.dumps(d)) < 1000
    t = MixtureSchedule.from_dict(d)
    assert t == s and t.identity() == s.identity()
    assert t.stages[1][1] == (Fraction(1, 3),) * 3
    d["stages"][1]["consumed"][0] += 1
    with pytest.raises(MixtureError, match=r"stages\[1\].*recorded consumed counts"):
        MixtureSchedule.from_dict(d)
    bad = s.to_dict() | {"extra": 1}
    with pytest.raises(MixtureError, match="unknown key 'extra'"):
        MixtureSchedule.from_dict(bad)
    other = s.append_stage(2000, [0, 0, 1])
    assert other.identity() != s.identity()
    copy = pickle.loads(pickle.dumps(other))          # process workers receive it pickled
    assert copy == other and np.array_equal(copy.locate(np.arange(3000))[1],
                                            other.locate(np.arange(3000))[1])


def test_golden_positions() -> None:
    """The mapping itself is versioned (MIXTURE_ALGORITHM); these values must never move."""
    s = MixtureSchedule([(0, [0.5, 0.3, 0.2]), (10, [0.2, 0.3, 0.5])])
    src, idx = s.locate(np.arange(16))
    assert src.tolist() == [0, 1, 2, 0, 0, 1, 0, 2, 1, 0, 1, 2, 0, 2, 1, 2]
    assert idx.tolist() == [0, 0, 0, 1, 2, 1, 3, 1, 2, 4, 3, 2, 5, 3, 4, 4]


@pytest.mark.parametrize("stages,kw,match", [
    ([(0, [0.5, 0.4])], {}, "sum to 0.9, not 1"),
    ([(0, [0.5, -0.5, 1.0])], {}, "source 1: weight -0.5 is negative"),
    ([(0, [float("nan"), 1.0])], {}, "not a finite number"),
    ([(0, [0.0, 0.0])], {"normalize": True}, "every weight is 0"),
    ([(0, ["x", 1])], {}, "not a number"),
    ([(5, [1.0])], {}, "must start at 0"),
    ([(0, [1.0]), (10, [1.0]), (10, [1.0])], {}, "stage 2 starts at 10, not after"),
    ([(0, [1.0]), (-1, [1.0])], {}, "start must be an int >= 0"),
    ([(0, [0.5, 0.5]), (10, [1.0])], {}, "1 weights for 2 sources"),
    ([(0, {"web": 1.0, "cod": 0})], {"names": ["web", "code"]}, "unknown source 'cod'"),
    ([(0, [1.0])], {"policy": "wrap"}, "policy must be one of"),
    ([(0, [0.5, 0.5])], {"max_epochs": [1, None]}, "max_epochs=1 but no epoch size"),
    ([(0, [1e-12, 1 - 1e-12])], {}, "below the mixture's resolution"),
    ([0.5, 0.5], {}, "stages must be a sequence of .start, weights. pairs"),
    ([(0, "ab")], {}, "weights must be a sequence"),
    ([(0,)], {}, "stage 0 must be a pair"),
])
def test_bad_inputs_are_clear_errors(stages, kw, match) -> None:
    with pytest.raises(MixtureError, match=match):
        MixtureSchedule(stages, **kw)


def test_bad_appends_and_positions() -> None:
    s = MixtureSchedule([(0, [0.5, 0.5]), (100, [0.2, 0.8])])
    with pytest.raises(MixtureError, match="before the cursor 120"):
        s.append_stage(110, [1, 0], cursor=120)
    with pytest.raises(MixtureError, match="not after the previous stage's start 100"):
        s.append_stage(100, [1, 0])
    with pytest.raises(MixtureError, match="negative"):
        s.locate(np.array([-1]))
    with pytest.raises(MixtureError, match="integers"):
        s.locate(np.array([1.5]))
    # sums within 1e-9 of 1 are float rounding: normalised exactly, not refused
    third = MixtureSchedule([(0, [1 / 3, 1 / 3, 1 / 3])])
    assert third.stages[0][1] == (Fraction(1, 3),) * 3


def test_token_weights_become_sample_weights() -> None:
    w = sample_weights([0.3, 0.7, 0], [1000.0, 250.0, 0.0])
    assert w == [Fraction(3, 31), Fraction(28, 31), Fraction(0)]
    s = MixtureSchedule([(0, w)])
    c = s.consumed(31 * 1000)
    tokens = c[:2] * np.array([1000, 250])
    assert tokens[0] / tokens.sum() == pytest.approx(0.3, abs=1e-4)
    with pytest.raises(MixtureError, match="mean size of source 1 must be > 0"):
        sample_weights([0.5, 0.5], [10, 0])


@settings(max_examples=40, deadline=None)
@given(w=st.lists(st.integers(min_value=1, max_value=9), min_size=2, max_size=4),
       cap=st.integers(min_value=1, max_value=40), cursor=st.integers(min_value=1, max_value=400),
       policy=st.sampled_from(["error", "renormalize"]))
def test_appending_to_a_capped_schedule_keeps_the_past_and_each_cap(w, cap, cursor, policy):
    k = len(w)
    s = MixtureSchedule([(0, w)], max_epochs=[None] * (k - 1) + [1],
                        epoch_sizes=[None] * (k - 1) + [cap], policy=policy, normalize=True)
    if s.end is not None and cursor >= s.end:
        cursor = s.end
    t = s.append_stage(cursor, w[::-1], cursor=cursor, normalize=True)
    n = cursor + 500 if t.end is None else t.end
    src, idx = t.locate(np.arange(n))
    assert np.array_equal(src[:cursor], s.locate(np.arange(cursor))[0])
    check_sources_exactly_once(src, idx, k)
    assert (src == k - 1).sum() <= cap
    if policy == "error" and t.end is not None:
        assert t.consumed(t.end)[k - 1] == cap


def test_far_indices_have_no_position() -> None:
    s = MixtureSchedule([(0, [1e-9, 1 - 1e-9])])
    far, near = s.position_of(0, np.array([10**13, 5])).tolist()
    assert far == -1 and abs(near - 5.5e9) <= 1      # centred: item i near (i + 1/2) / w
    assert [a.tolist() for a in s.locate(np.array([near]))] == [[0], [5]]


def test_the_same_schedule_in_another_process_maps_the_same() -> None:
    """Nothing depends on the process (hash seeds, dict order): another interpreter agrees."""
    import subprocess
    import sys

    s = MixtureSchedule([(0, {"b": "1/3", "a": "2/3"}), (77, [0.25, 0.75])], names=["a", "b"])
    code = ("import json, sys, numpy as np\n"
            "from zephon_store.order.mixture import MixtureSchedule\n"
            "s = MixtureSchedule.from_dict(json.loads(sys.stdin.read()))\n"
            "src, idx = s.locate(np.arange(10**12, 10**12 + 50))\n"
            "print(json.dumps([s.identity(), src.tolist(), idx.tolist()]))\n")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(s.to_dict()),
                         capture_output=True, text=True, env={"PYTHONHASHSEED": "123"},
                         check=True).stdout
    src, idx = s.locate(np.arange(10**12, 10**12 + 50))
    assert json.loads(out) == [s.identity(), src.tolist(), idx.tolist()]


def test_a_stage_start_past_2_62_is_a_mixture_error() -> None:
    """No OverflowError: a schedule (or a checkpoint's) with a start past the positions the
    interleave serves is refused naming the stage."""
    with pytest.raises(MixtureError, match=r"stage 1: start must be .* below 2\*\*62"):
        MixtureSchedule([(0, [1]), (2**70, [1])])
    with pytest.raises(MixtureError, match="below 2"):
        MixtureSchedule([(0, [1])]).append_stage(2**63, [1])
    d = MixtureSchedule([(0, [1]), (10, [1])]).to_dict()
    d["stages"][1]["start"] = 2**64
    with pytest.raises(MixtureError, match="below 2"):
        MixtureSchedule.from_dict(d)


def test_normalize_has_one_spelling_and_the_old_one_warns() -> None:
    """``normalize``, as the mixture file spells it (issue 41 item 7); ``normalise=`` still
    works for one release, with a DeprecationWarning."""
    new = MixtureSchedule([(0, [1, 3])], normalize=True)
    with pytest.warns(DeprecationWarning, match="normalize="):
        old = MixtureSchedule([(0, [1, 3])], normalise=True)
    assert old.stages == new.stages
    with pytest.warns(DeprecationWarning, match="normalize="):
        grown = new.append_stage(10, [2, 2], normalise=True)
    assert grown.stages == new.append_stage(10, [2, 2], normalize=True).stages
