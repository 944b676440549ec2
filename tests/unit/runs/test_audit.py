"""The exactly-once audit (zephon_store.runs.audit) on synthetic streams: it passes the
stream the order defines, across a restart with another world size and lane-aligned steps,
and catches a repeat, a drop, a lost step, a step read twice and a swapped id."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zephon_store.order import Order, OrderOptions
from zephon_store.order.assign import positions_for_rank
from zephon_store.runs.audit import AuditReport, ConsumedStep, audit_stream

B = 12
# 10 blocks of 10: lanes=5040 with window_blocks=1 gives 10 lanes, so W=2 reads whole lanes
# (residue rule) and W=3 plain slices; both rules must place ids at the right positions.
ORDER = Order(np.full(10, 10), OrderOptions(seed=5, window_blocks=1, lanes=5040))
N = ORDER.num_samples


def step(cursor: int, world: int, batch: int = B) -> ConsumedStep:
    lanes = ORDER.effective_lanes
    return ConsumedStep(cursor, batch, world, [
        ORDER.sample_at(positions_for_rank(cursor, batch, world, r, lanes=lanes,
                                           epoch_size=N)).tolist() for r in range(world)])


def job(*segments: tuple[int, int]) -> list[ConsumedStep]:
    """Consecutive steps from cursor 0: ``(world_size, steps)`` per segment."""
    out, c = [], 0
    for world, n in segments:
        for _ in range(n):
            out.append(step(c, world))
            c += B
    return out


def test_the_stream_the_order_defines_passes_across_restarts_and_epochs() -> None:
    steps = job((2, 7), (3, 6), (1, 4))  # 17 steps, 204 positions: two epochs of 100
    assert ORDER.effective_lanes == 10
    r = audit_stream(steps, ORDER)
    assert r.ok, r
    assert (r.steps, r.samples, r.expected_samples) == (17, 204, 204)
    assert (r.epochs_crossed, r.complete_epochs_checked, r.complete_epochs_bad) == (2, 2, ())
    # A reference passed in (e.g. from a real single-process run) is used as given.
    ref = ORDER.sample_at(np.arange(204)).tolist()
    assert audit_stream(steps, ORDER, reference=ref) == r
    assert json.loads(json.dumps(r.to_dict()))["ok"] is True


def test_a_repeated_sample_is_caught() -> None:
    steps = job((2, 10))
    bad = steps[3]
    ids = [list(x) for x in bad.ids]
    dup = ids[0][0]
    ids[1][-1] = dup  # rank 1 got rank 0's first id instead of its own last one
    steps[3] = ConsumedStep(bad.cursor, B, 2, ids)
    r = audit_stream(steps, ORDER)
    assert not r.ok
    assert (r.repeats, r.drops, r.mismatched_steps) == (1, 1, 1)
    assert r.first_mismatch_cursor == 3 * B
    assert (r.gaps, r.overlaps) == (0, 0)
    assert r.complete_epochs_bad == (0,)


def test_a_dropped_sample_is_caught() -> None:
    steps = job((3, 10))
    bad = steps[5]
    steps[5] = ConsumedStep(bad.cursor, B, 3, [list(bad.ids[0]), list(bad.ids[1][:-1]),
                                                list(bad.ids[2])])
    r = audit_stream(steps, ORDER)
    assert not r.ok
    assert (r.repeats, r.drops, r.mismatched_steps, r.samples) == (0, 1, 1, 10 * B - 1)
    assert r.complete_epochs_bad == (0,)


def test_a_lost_step_and_a_step_read_twice_are_caught() -> None:
    gap = job((2, 3)) + [step(c, 3) for c in (48, 60)]  # the step at 36 was lost
    r = audit_stream(gap, ORDER)
    assert not r.ok and (r.gaps, r.drops, r.repeats, r.overlaps) == (B, B, 0, 0)
    overlap = job((2, 3)) + [step(c, 3) for c in (24, 36)]  # resumed one step early
    r = audit_stream(overlap, ORDER)
    assert not r.ok and (r.overlaps, r.repeats, r.drops, r.gaps) == (B, B, 0, 0)


def test_a_swap_between_positions_is_caught_per_step() -> None:
    # Same multiset over the job, but an id moved to another step: both steps mismatch.
    steps = job((1, 4))
    a, b = list(steps[1].ids[0]), list(steps[2].ids[0])
    a[0], b[0] = b[0], a[0]
    steps[1] = ConsumedStep(steps[1].cursor, B, 1, [a])
    steps[2] = ConsumedStep(steps[2].cursor, B, 1, [b])
    r = audit_stream(steps, ORDER)
    assert not r.ok and r.mismatched_steps == 2 and (r.repeats, r.drops) == (0, 0)


def test_a_job_resumed_from_a_later_start_and_a_short_reference() -> None:
    steps = [step(c, 2) for c in range(96, 96 + 5 * B, B)]
    r = audit_stream(steps, ORDER, start=96)
    assert r.ok and r.expected_samples == 5 * B and r.complete_epochs_checked == 0
    assert not audit_stream(steps, ORDER).ok  # from 0, positions [0, 96) are a gap
    with pytest.raises(ValueError, match="reference holds 10 ids"):
        audit_stream(steps, ORDER, reference=list(range(10)))


def test_an_empty_log_is_not_a_proof() -> None:
    r = audit_stream([], ORDER)
    assert isinstance(r, AuditReport) and not r.ok and r.steps == 0
