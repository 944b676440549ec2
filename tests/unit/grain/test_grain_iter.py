"""ZephonIterDataset: Zephon's order and rank rule in a real Grain pipeline, its state the one
cursor, exact across restarts on other numbers of hosts and of Grain worker processes.

Hosts are simulated in this process (one pipeline per host, tests/helpers/stateful.py);
tests/integration/test_grain_elastic.py runs them as separate processes.
"""

from __future__ import annotations

import json

import grain
import pytest

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
from zephon_store import (
    BatchOptions,
    Order,
    OrderOptions,
    StopOptions,
    Topology,
    WorkerOptions,
)
from zephon_store.errors import StateMismatchError
from zephon_store.grain import ZephonIterDataset
from zephon_store.load.runlog import read_run_log
from zephon_store.load.state import STATE_KEYS
from zephon_store.order.assign import positions_for_rank

B = 12
N = 303
OPTIONS = OrderOptions(seed=7, window_blocks=2, lanes=10)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return opened(small_dataset(str(tmp_path_factory.mktemp("grain_iter")), files=3,
                                records=101, row_group_rows=10), samples=N)


class _Pipeline:
    """A host's Grain pipeline (ZephonIterDataset, then Grain's own ``map``) seen through the
    loader protocol the shared helper drives: its state is the pipeline's ``get_state()``."""

    def __init__(self, ds: ZephonIterDataset) -> None:
        self.it = iter(ds.map(lambda batch: batch))

    def __iter__(self):
        return self.it

    def state_dict(self) -> dict:
        return self.it.get_state()

    def load_state_dict(self, state: dict) -> None:
        self.it.set_state(state)


def maker(dataset, options=OPTIONS):
    def make(*, world_size, rank, num_workers, global_batch):
        return _Pipeline(ZephonIterDataset(
            dataset, topology=Topology(global_batch, world_size, rank), order=options,
            batch=BatchOptions(with_seq=True), workers=WorkerOptions(num_workers=num_workers)))
    return make


@pytest.fixture(scope="module")
def reference(ds):
    ref = reference_ids(maker(ds), global_batch=B, samples=60 * B)
    assert ref == Order(ds.manifest.rg_rows, OPTIONS).sample_at(range(len(ref))).tolist()
    return ref


def positions_for(ds):
    order = Order(ds.manifest.rg_rows, OPTIONS)
    return lambda c, b, w, r: positions_for_rank(c, b, w, r, lanes=order.effective_lanes,
                                                 epoch_size=order.num_samples)


def test_two_then_three_then_one_hosts_consume_the_uninterrupted_stream(ds, reference):
    run = run_segments(maker(ds), [Segment(2, 12), Segment(3, 14), Segment(1, 8),
                                   Segment(4, 6, global_batch=24)], global_batch=B)
    assert_matches_reference(run.steps, reference)
    ids_at = by_position(run.steps, positions_for(ds))
    assert ids_at == dict(enumerate(reference[:len(ids_at)]))
    assert assert_exactly_once_per_epoch(ids_at, N) == 1


def test_checkpoint_after_every_step_restores_on_other_host_counts(ds, reference):
    checked = assert_resumes_everywhere(maker(ds), global_batch=B, steps=12,
                                        restore=[(2, 0), (3, 0)], reference=reference,
                                        every=3)
    assert checked == 8


def test_grain_worker_processes_resume_on_another_worker_count(ds, reference):
    # Two Grain workers, then three hosts with none, then one host with three workers.
    run = run_segments(maker(ds), [Segment(1, 5, num_workers=2), Segment(3, 3),
                                   Segment(1, 4, num_workers=3)], global_batch=B)
    assert_matches_reference(run.steps, reference)


def test_the_state_is_the_loaders_one_cursor(ds):
    it = iter(ZephonIterDataset(ds, topology=Topology(B, 2, 1), order=OPTIONS)
              .map(lambda b: b).filter(lambda b: True))
    next(it)
    state = it.get_state()
    assert set(STATE_KEYS) <= set(state) <= set(STATE_KEYS) | {"step"}
    assert (state["cursor"], state["step"], state["dataset_id"]) == (B, 1, ds.dataset_id)
    assert json.loads(json.dumps(state)) == state


def test_a_state_of_other_data_is_refused_naming_the_key(ds, tmp_path):
    other = small_dataset(str(tmp_path), files=1, records=50, row_group_rows=10, seed=3)
    it = iter(ZephonIterDataset(other, topology=Topology(B), order=OPTIONS))
    state = iter(ZephonIterDataset(ds, topology=Topology(B), order=OPTIONS)).get_state()
    with pytest.raises(StateMismatchError, match="checkpoint is for dataset"):
        it.set_state(state)


def test_set_state_applies_at_the_next_batch(ds, reference):
    it = iter(ZephonIterDataset(ds, topology=Topology(B), order=OPTIONS,
                                batch=BatchOptions(with_seq=True)))
    first = next(it)["_seq"].tolist()
    saved = it.get_state()
    next(it)
    it.set_state(saved)
    assert it.get_state()["cursor"] == B
    assert first == reference[:B]
    assert next(it)["_seq"].tolist() == reference[B:2 * B]


def test_the_loaders_run_log_and_deny_list_reach_grain(ds, tmp_path):
    log, deny = str(tmp_path / "run.jsonl"), tmp_path / "deny.json"
    denied = reference_ids(maker(ds), global_batch=B, samples=2 * B)[3:20:4]
    deny.write_text(json.dumps({"ids": denied}))
    hosts = [iter(ZephonIterDataset(ds, topology=Topology(B, 2, r), order=OPTIONS,
                                    batch=BatchOptions(with_seq=True), run_log=log,
                                    deny_list=str(deny))) for r in range(2)]
    masked = []
    for _ in range(2):
        for it in hosts:
            b = next(it)
            masked += b["_seq"][b["_masked"]].tolist()
    assert sorted(masked) == sorted(denied)
    (segment,) = read_run_log(log)
    assert (segment.world_size, segment.cursor, segment.dataset_id) == (2, 0, ds.dataset_id)


def test_mp_prefetch_after_it_is_refused_with_what_to_do(ds):
    pipeline = ZephonIterDataset(ds, topology=Topology(B), order=OPTIONS,
                                 stop=StopOptions(max_steps=2))
    it = iter(pipeline.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    with pytest.raises(Exception, match="workers=WorkerOptions"):
        next(it)
    it.close()


def test_torch_dataloader_options_are_refused(ds):
    with pytest.raises(ValueError, match="torch DataLoader options"):
        ZephonIterDataset(ds, topology=Topology(B),
                          workers=WorkerOptions(num_workers=1, pin_memory=True))
