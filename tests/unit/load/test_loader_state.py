"""ZephonLoader's checkpoint: one cursor, exact across any schedule of restarts.

Every test simulates all ranks of a job in this process (one loader per rank) and compares
what the job consumed with an uninterrupted single-process run (tests/helpers/stateful.py).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import opened, small_dataset
from tests.helpers.stateful import (
    Segment,
    assert_exactly_once_per_epoch,
    assert_matches_reference,
    assert_resumes_everywhere,
    by_position,
    reference_ids,
    run_segments,
)
from zephon_store import BatchOptions, Topology, WorkerOptions
from zephon_store.errors import StateMismatchError
from zephon_store.order import Order, OrderOptions
from zephon_store.order.assign import positions_for_rank
from zephon_store.torch import ZephonLoader

B = 12  # divisible by every world size 1..4
# N = 303 (odd, not a multiple of B): steps straddle epoch boundaries, and the straddling
# step of W=2 has unbalanced residues, so assign falls back to plain slicing for it.
N = 303
# lanes=10 over 31 blocks: W=2 reads whole lanes, W=3 and W=4 use plain slices.
OPTIONS = OrderOptions(seed=7, window_blocks=2, lanes=10)
TOTAL_STEPS = 64  # 768 positions: two epoch boundaries


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return opened(small_dataset(str(tmp_path_factory.mktemp("loader_state")), files=3,
                                records=101, row_group_rows=10), samples=N)


@pytest.fixture(scope="module")
def other_ds(tmp_path_factory):
    return opened(small_dataset(str(tmp_path_factory.mktemp("loader_state_other")), files=3,
                                records=101, row_group_rows=10, seed=1))


def maker(dataset, options=OPTIONS, **fixed):
    def make(*, world_size, rank, num_workers, global_batch):
        return ZephonLoader(dataset, topology=Topology(global_batch, world_size, rank),
                            order=options, workers=WorkerOptions(num_workers=num_workers),
                            batch=BatchOptions(with_seq=True), **fixed)
    return make


@pytest.fixture(scope="module")
def reference(ds):
    # Long enough for the longest schedule batch_schedules draws (4 segments of 12 steps of
    # 24), which is longer than TOTAL_STEPS steps of B: hypothesis finds it now and then.
    ref = reference_ids(maker(ds), global_batch=B,
                        samples=max(TOTAL_STEPS * B, 4 * 12 * 24) + 4 * 24)
    # W=1 reads positions in order, so the single-process run is the order itself.
    order = Order(ds.manifest.rg_rows, OPTIONS)
    assert ref == order.sample_at(range(len(ref))).tolist()
    assert_exactly_once_per_epoch(ref, N)
    return ref


def positions_for(ds):
    order = Order(ds.manifest.rg_rows, OPTIONS)
    return lambda c, b, w, r: positions_for_rank(c, b, w, r, lanes=order.effective_lanes,
                                                 epoch_size=order.num_samples)


# ---------------------------------------------------------------- schedules


@st.composite
def schedules(draw: st.DrawFn) -> list[Segment]:
    """1-4 segments of world sizes 1..4 covering TOTAL_STEPS steps (cuts anywhere)."""
    cuts = sorted(draw(st.lists(st.integers(0, TOTAL_STEPS), max_size=3)))
    bounds = [0, *cuts, TOTAL_STEPS]
    return [Segment(world_size=draw(st.integers(1, 4)), steps=hi - lo)
            for lo, hi in zip(bounds, bounds[1:])]


@settings(max_examples=30, deadline=None)
@given(segments=schedules())
def test_any_schedule_of_world_sizes_consumes_the_single_process_stream(
        ds, reference, segments: list[Segment]) -> None:
    run = run_segments(maker(ds), segments, global_batch=B)
    assert len(run.steps) == TOTAL_STEPS
    assert run.final_state["cursor"] == TOTAL_STEPS * B
    # Same step, same multiset, whatever the world size and restarts ...
    assert_matches_reference(run.steps, reference)
    # ... each rank read exactly the positions assign gives it ...
    ids_at = by_position(run.steps, positions_for(ds))
    assert ids_at == dict(enumerate(reference[:TOTAL_STEPS * B]))
    # ... and every complete epoch holds each id once (two boundaries crossed).
    assert assert_exactly_once_per_epoch(ids_at, N) == 2


@pytest.mark.parametrize("segments", [
    [Segment(2, 20, num_workers=2), Segment(3, 10), Segment(1, 8, num_workers=1)],
    [Segment(4, 9), Segment(3, 25, num_workers=2), Segment(2, 4, num_workers=1)],
], ids=["w2nw2-w3-w1nw1", "w4-w3nw2-w2nw1"])
def test_schedules_with_process_workers(ds, reference, segments) -> None:
    run = run_segments(maker(ds), segments, global_batch=B)
    assert_matches_reference(run.steps, reference)
    assert run.steps[-1].cursor + B > N  # crossed the first epoch boundary


@st.composite
def batch_schedules(draw: st.DrawFn) -> list[Segment]:
    """Segments that change the global batch too (W divides each B)."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        batch = draw(st.sampled_from([4, 6, 12, 24]))
        world = draw(st.sampled_from([w for w in (1, 2, 3, 4) if batch % w == 0]))
        out.append(Segment(world_size=world, steps=draw(st.integers(0, 12)),
                           global_batch=batch))
    return out


@settings(max_examples=20, deadline=None)
@given(segments=batch_schedules())
def test_changing_the_global_batch_keeps_the_cursor_exact(
        ds, reference, segments: list[Segment]) -> None:
    run = run_segments(maker(ds), segments, global_batch=B)
    consumed = sum(s.steps * s.global_batch for s in segments)
    assert (run.final_state["cursor"] if run.steps else 0) == consumed
    assert_matches_reference(run.steps, reference)
    ids_at = by_position(run.steps, positions_for(ds))
    assert ids_at == dict(enumerate(reference[:consumed]))
    assert_exactly_once_per_epoch(ids_at, N)


def test_checkpoint_after_every_step_restores_at_other_world_sizes(ds, reference) -> None:
    checked = assert_resumes_everywhere(maker(ds), global_batch=B, steps=30,
                                        restore=[(2, 0), (3, 0), (4, 0)], reference=reference)
    assert checked == 90


def test_checkpoint_restores_with_process_workers(ds, reference) -> None:
    checked = assert_resumes_everywhere(maker(ds), global_batch=B, steps=30,
                                        restore=[(3, 2)], reference=reference, every=10)
    assert checked == 3


# ---------------------------------------------------------------- the state itself


def test_state_has_exactly_the_five_keys_and_is_identical_on_every_rank(ds) -> None:
    loaders = [ZephonLoader(ds, topology=Topology(B, world_size=3, rank=r), order=OPTIONS)
               for r in range(3)]
    for loader in loaders:
        it = iter(loader)
        next(it)
        next(it)
        it.close()
    states = [loader.state_dict() for loader in loaders]
    assert set(states[0]) == {"version", "dataset_id", "seed", "order", "cursor", "step"}
    assert all(s == states[0] for s in states)
    assert states[0]["cursor"] == 2 * B
    assert states[0]["dataset_id"] == ds.dataset_id
    assert states[0]["seed"] == OPTIONS.seed
    assert states[0]["order"] == OPTIONS.to_dict()
    assert json.loads(json.dumps(states[0])) == states[0]


def _state(ds, cursor: int = 5 * B) -> dict:
    loader = ZephonLoader(ds, topology=Topology(B, world_size=1, rank=0), order=OPTIONS)
    loader.cursor = cursor
    return loader.state_dict()


def _loader(ds, options=OPTIONS) -> ZephonLoader:
    return ZephonLoader(ds, topology=Topology(B, world_size=2, rank=1), order=options)


def test_loading_into_another_dataset_raises(ds, other_ds) -> None:
    assert other_ds.dataset_id != ds.dataset_id
    with pytest.raises(StateMismatchError, match="dataset") as exc:
        _loader(other_ds).load_state_dict(_state(ds))
    assert ds.dataset_id in str(exc.value) and other_ds.dataset_id in str(exc.value)


@pytest.mark.parametrize("change", [{"seed": 8}, {"window_blocks": 3}, {"lanes": 12},
                                    {"shuffle": False}], ids=lambda c: next(iter(c)))
def test_loading_with_other_order_options_raises_naming_the_key(ds, change) -> None:
    key = next(iter(change))
    with pytest.raises(StateMismatchError, match=key):
        _loader(ds, OPTIONS.replace(**change)).load_state_dict(_state(ds))


@pytest.mark.parametrize("edit", ["missing", "extra"])
def test_missing_or_extra_keys_raise(ds, edit) -> None:
    state = _state(ds)
    if edit == "missing":
        del state["cursor"]
    else:
        state["epoch"] = 0
    with pytest.raises(StateMismatchError, match="cursor" if edit == "missing" else "epoch"):
        _loader(ds).load_state_dict(state)


@pytest.mark.parametrize("key,value,match", [
    ("version", 2, "version"),
    ("cursor", -1, "cursor"),
    ("cursor", 1.5, "cursor"),
    ("cursor", True, "cursor"),
    ("cursor", 10**30, "cursor"),
    ("cursor", 2**63, "cursor"),
    ("cursor", 2**63 - 1, "cursor"),     # no room left for one step of positions
    ("cursor", "12", "cursor"),
    ("seed", 8, "seed"),
    ("order", {"seed": 7}, "order"),
])
def test_bad_values_raise_naming_the_key(ds, key, value, match) -> None:
    state = _state(ds)
    state[key] = value
    with pytest.raises(StateMismatchError, match=match):
        _loader(ds).load_state_dict(state)


def test_a_failed_load_leaves_the_cursor_alone(ds) -> None:
    loader = _loader(ds)
    loader.load_state_dict(_state(ds, cursor=7 * B))
    bad = _state(ds)
    bad["seed"] = 99
    with pytest.raises(StateMismatchError):
        loader.load_state_dict(bad)
    assert loader.state_dict()["cursor"] == 7 * B


def test_tensor_scalars_from_a_checkpointer_are_accepted(ds) -> None:
    import torch

    state = _state(ds, cursor=3 * B)
    state["cursor"] = torch.tensor(3 * B)
    state["version"] = torch.tensor(1)
    loader = _loader(ds)
    loader.load_state_dict(state)
    assert loader.state_dict() == _state(ds, cursor=3 * B)
    assert type(loader.state_dict()["cursor"]) is int


def test_cursor_not_a_multiple_of_the_global_batch_resumes_exactly(ds, reference) -> None:
    # A job at B=4 stopped at cursor 8; the next one runs at B=12: it starts at position 8.
    run = run_segments(maker(ds), [Segment(1, 2, global_batch=4), Segment(3, 5)],
                       global_batch=B)
    assert [s.cursor for s in run.steps] == [0, 4, 8, 20, 32, 44, 56]
    assert_matches_reference(run.steps, reference)


def test_step_is_a_field_of_the_state_checked_with_the_rest() -> None:
    """One owner for the checkpoint (issue 30 item 5): ``step`` is parsed and validated by
    check_state; a state saved before steps were counted still loads (no step)."""
    from zephon_store.load.state import LoaderState, check_state

    state = LoaderState("xxh3:00", OPTIONS, 24, step=2).to_dict()
    assert list(state) == ["version", "dataset_id", "seed", "order", "cursor", "step"]
    st_ = check_state(state, dataset_id="xxh3:00", order=OPTIONS)
    assert (st_.cursor, st_.step, st_.step_or(B)) == (24, 2, 2)
    old = {k: v for k, v in state.items() if k != "step"}
    st_ = check_state(old, dataset_id="xxh3:00", order=OPTIONS)
    assert (st_.step, st_.step_or(B)) == (None, 2)
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(StateMismatchError, match="'step' must be an int >= 0"):
            check_state({**state, "step": bad}, dataset_id="xxh3:00", order=OPTIONS)
