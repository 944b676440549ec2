"""Assign: ranks and workers partition the stream exactly once, for any schedule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.order import Order, OrderOptions, Topology
from zephon_store.order.assign import (
    batch_owner,
    batches_for_worker,
    lane_order,
    positions_for_participant,
    positions_for_rank,
    step_cursor,
    step_owners,
    step_ranks,
    tail_positions_for_rank,
)
from zephon_store.runs.simulate import rank_of_positions


@st.composite
def segment(draw: st.DrawFn) -> tuple[int, int, int]:
    world = draw(st.integers(1, 8))
    batch = world * draw(st.integers(1, 6))
    return world, batch, draw(st.integers(1, 5))


schedules = st.lists(segment(), min_size=1, max_size=6)


def _ranks(cursor: int, batch: int, world: int, **kw: object) -> list[np.ndarray]:
    return [positions_for_rank(cursor, batch, world, r, **kw) for r in range(world)]


@settings(max_examples=150, deadline=None)
@given(schedule=schedules, lanes=st.sampled_from([1, 2, 6, 12, 24, 840, 7]),
       epoch_size=st.one_of(st.none(), st.integers(1, 60)), start=st.integers(0, 100))
def test_any_schedule_consumes_every_position_exactly_once(
        schedule: list[tuple[int, int, int]], lanes: int, epoch_size: int | None,
        start: int) -> None:
    cursor = start
    consumed = []
    for world, batch, steps in schedule:  # a restart with a new (W, B) between segments
        for _ in range(steps):
            per_rank = _ranks(cursor, batch, world, lanes=lanes, epoch_size=epoch_size)
            for pos in per_rank:
                assert pos.dtype == np.int64
                assert pos.size == batch // world
                assert (np.diff(pos) > 0).all()
            union = np.sort(np.concatenate(per_rank))
            assert np.array_equal(union, np.arange(cursor, cursor + batch))
            consumed.append(union)
            cursor += batch
    everything = np.concatenate(consumed)
    assert np.array_equal(everything, np.arange(start, cursor))


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.integers(1, 30), min_size=1, max_size=30), seed=st.integers(0, 2**32),
       cursor=st.integers(0, 2000), k=st.integers(1, 8), lanes=st.sampled_from([1, 4, 24]))
def test_ids_of_a_step_do_not_depend_on_world_size(
        rows: list[int], seed: int, cursor: int, k: int, lanes: int) -> None:
    o = Order(np.array(rows), OrderOptions(seed=seed, window_blocks=1, lanes=lanes))
    batch = 24 * k
    reference = None
    for world in (1, 2, 3, 4, 6, 8, 12, 24):
        ids = np.concatenate([o.sample_at(p) for p in _ranks(
            cursor, batch, world, lanes=o.effective_lanes, epoch_size=o.num_samples)])
        multiset = np.sort(ids)
        if reference is None:
            reference = multiset
        assert np.array_equal(multiset, reference)


@settings(max_examples=60, deadline=None)
@given(world=st.sampled_from([1, 2, 3, 4, 6, 12]), per_rank=st.integers(1, 5),
       cursor=st.integers(0, 5000), epoch_size=st.integers(1, 500))
def test_ranks_read_the_same_contiguous_lanes_every_step(
        world: int, per_rank: int, cursor: int, epoch_size: int) -> None:
    p = 12
    batch = world * per_rank * p     # P | B: every key occurs B / P times per step
    for step in range(4):
        c = cursor + step * batch
        for rank in range(world):
            keys = positions_for_rank(c, batch, world, rank, lanes=p,
                                      epoch_size=epoch_size) % p
            # W | P here: rank r reads exactly the keys [r*P/W, (r+1)*P/W) (epoch crossings
            # too), i.e. a fixed set of lanes within each epoch (lane = (key - e*N) % P).
            assert sorted(set(keys.tolist())) == list(range(rank * p // world,
                                                            (rank + 1) * p // world))


def test_epoch_crossing_steps_stay_balanced() -> None:
    # N = 102, W = 4: the step [96, 104) crosses into epoch 1. The key is p % P, so the
    # step is still 8 consecutive keys: each rank takes two keys, as in any other step.
    per_rank = [positions_for_rank(96, 8, 4, r, lanes=8, epoch_size=102) for r in range(4)]
    assert sorted(np.concatenate(per_rank).tolist()) == list(range(96, 104))
    assert per_rank[1].tolist() == [98, 99]


def test_one_lane_is_contiguous_slices() -> None:
    assert positions_for_rank(10, 12, 3, 2, lanes=1).tolist() == [18, 19, 20, 21]
    assert positions_for_participant(10, 12, 5, 4).tolist() == [19, 20, 21]
    assert tail_positions_for_rank(100, 105, 2, 1, lanes=1).tolist() == [102, 103, 104]


@settings(max_examples=300, deadline=None)
@given(cursor=st.integers(0, 10_000), batch=st.integers(1, 300), participants=st.integers(1, 40),
       lanes=st.one_of(st.integers(1, 64), st.sampled_from([840, 5040])),
       epoch_size=st.one_of(st.none(), st.integers(1, 500)), per_node=st.integers(1, 9))
def test_any_participant_count_partitions_every_step(
        cursor: int, batch: int, participants: int, lanes: int, epoch_size: int | None,
        per_node: int) -> None:
    """Uneven splits too (n need not divide B): every position exactly once (issue 21)."""
    kw = {"lanes": lanes, "epoch_size": epoch_size, "ranks_per_node": per_node}
    pieces = [positions_for_participant(cursor, batch, participants, i, **kw)
              for i in range(participants)]
    for i, piece in enumerate(pieces):
        assert piece.dtype == np.int64
        assert piece.size == (i + 1) * batch // participants - i * batch // participants
        assert (np.diff(piece) > 0).all()
    assert np.array_equal(np.sort(np.concatenate(pieces)), np.arange(cursor, cursor + batch))
    owners = step_owners(cursor, batch, participants, **kw)
    for i, piece in enumerate(pieces):
        assert np.array_equal(cursor + np.flatnonzero(owners == i), piece)
    # The rule: pieces are contiguous runs of the step sorted by the key's place in
    # lane_order (sizes from the cut), so consecutive pieces meet in at most one key.
    place = np.argsort(lane_order(lanes, batch, -(-participants // per_node)))
    places = [np.unique(place[p_ % lanes]) for p_ in pieces]
    nonempty = [pl for pl in places if pl.size]
    for a, b in zip(nonempty, nonempty[1:]):
        assert a.max() <= b.min()


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="global_batch=10 is not a multiple of world_size=4"):
        positions_for_rank(0, 10, 4, 0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 4\), got 4"):
        positions_for_rank(0, 8, 4, 4)
    with pytest.raises(ValueError, match="cursor must be >= 0"):
        positions_for_rank(-1, 8, 4, 0)
    with pytest.raises(ValueError, match="epoch_size must be > 0"):
        positions_for_rank(0, 8, 4, 0, lanes=4, epoch_size=0)
    with pytest.raises(ValueError, match="lanes must be > 0"):
        step_ranks(0, 8, 4, lanes=0)
    with pytest.raises(ValueError, match=r"index must be in \[0, 3\), got 3"):
        positions_for_participant(0, 8, 3, 3)
    with pytest.raises(ValueError, match="participants must be > 0"):
        positions_for_participant(0, 8, 0, 0)


@settings(max_examples=150, deadline=None)
@given(world=st.integers(1, 12), per_rank=st.integers(1, 8), cursor=st.integers(0, 3000),
       lanes=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 24, 840, 5040, 7]),
       rows=st.lists(st.integers(1, 20), min_size=1, max_size=40),
       window_blocks=st.integers(1, 4), steps=st.integers(1, 6))
def test_the_simulator_ranks_every_position_as_assign_does(
        world: int, per_rank: int, cursor: int, lanes: int, rows: list[int],
        window_blocks: int, steps: int) -> None:
    """zephon plan's simulator and the loader share one rank rule (issue 15)."""
    order = Order(np.array(rows), OrderOptions(seed=1, window_blocks=window_blocks,
                                               lanes=lanes))
    batch = world * per_rank
    cursors = [step_cursor(cursor, j, batch) for j in range(steps)]
    simulated = rank_of_positions(order, Topology(batch, world), cursors)
    assert simulated.shape == (steps, batch)
    for c, ranks in zip(cursors, simulated):
        for rank in range(world):
            pos = positions_for_rank(c, batch, world, rank, lanes=order.effective_lanes,
                                     epoch_size=order.num_samples)
            assert np.array_equal(c + np.flatnonzero(ranks == rank), pos)


def test_step_cursor() -> None:
    assert step_cursor(100, 0, 32) == 100
    assert step_cursor(100, 5, 32) == 260
    with pytest.raises(ValueError):
        step_cursor(0, -1, 32)


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("start", [0, 7])
def test_round_robin_over_workers_reproduces_batch_order(num_workers: int, start: int) -> None:
    stop = start + 23
    iters = [batches_for_worker(k, num_workers, start=start, stop=stop)
             for k in range(max(1, num_workers))]
    active = list(range(len(iters)))
    seen = []
    # torch's DataLoader asks workers in turn and drops a worker once it is exhausted.
    while active:
        for k in list(active):
            nxt = next(iters[k], None)
            if nxt is None:
                active.remove(k)
            else:
                seen.append(nxt)
                assert batch_owner(nxt - start, num_workers) == k
    assert seen == list(range(start, stop))


def test_worker_iterators_are_endless_without_stop() -> None:
    it = batches_for_worker(2, 4)
    assert [next(it) for _ in range(3)] == [2, 6, 10]
    assert [batch_owner(i, 0) for i in range(3)] == [0, 0, 0]
    with pytest.raises(ValueError, match="worker_id"):
        batches_for_worker(1, 0)
    with pytest.raises(ValueError, match="num_workers"):
        batch_owner(0, -1)
