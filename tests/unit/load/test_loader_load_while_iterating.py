"""``load_state_dict`` while an iterator is live (STYLE 13, issue 15).

The loaded state applies at the next ``iter()``; the open iterator is closed, so it can
neither hand out another batch of the old stream nor write its cursor over the loaded one.
"""

from __future__ import annotations

import pytest

from tests.helpers import opened, small_dataset
from zephon_store import BatchOptions, Topology, WorkerOptions
from zephon_store.order import Order, OrderOptions
from zephon_store.order.assign import positions_for_rank
from zephon_store.torch import ZephonLoader

B = 12
OPTIONS = OrderOptions(seed=5, window_blocks=2, lanes=12)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return opened(small_dataset(str(tmp_path_factory.mktemp("live_load")), files=3, records=101,
                                row_group_rows=10))


WITH_SEQ = BatchOptions(with_seq=True)


def _loader(ds, batch=WITH_SEQ, **groups) -> ZephonLoader:
    return ZephonLoader(ds, topology=Topology(B, world_size=2, rank=1), order=OPTIONS,
                        batch=batch, **groups)


def _expected(ds, cursor: int) -> list[int]:
    order = Order(ds.manifest.rg_rows, OPTIONS)
    pos = positions_for_rank(cursor, B, 2, 1, lanes=order.effective_lanes,
                             epoch_size=order.num_samples)
    return order.sample_at(pos).tolist()


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("transform", [None, lambda b: b])
def test_a_state_loaded_mid_iteration_applies_at_the_next_iter(ds, workers, transform) -> None:
    source = _loader(ds)
    it = iter(source)
    for _ in range(3):
        next(it)
    saved = source.state_dict()            # cursor 36
    assert saved["cursor"] == 3 * B
    for _ in range(2):
        next(it)
    loader = _loader(ds, workers=WorkerOptions(num_workers=workers),
                     batch=BatchOptions(with_seq=True, transform=transform))
    live = iter(loader)
    for _ in range(5):
        next(live)
    loader.load_state_dict(saved)
    # The loaded cursor reads back at once, and the old iterator cannot undo it.
    assert loader.state_dict()["cursor"] == 3 * B
    with pytest.raises(StopIteration):
        next(live)
    assert loader.state_dict()["cursor"] == 3 * B
    # The next iter() resumes at the loaded cursor.
    fresh = iter(loader)
    batch = next(fresh)
    assert batch["_seq"].tolist() == _expected(ds, 3 * B)
    assert loader.state_dict()["cursor"] == 4 * B


def test_loading_a_later_cursor_is_never_lost(ds) -> None:
    """The issue's case: a cursor loaded as 200 must not read back as the live one's 30."""
    loader = _loader(ds)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    next(it)
    loader.load_state_dict({**state, "cursor": 200})
    assert loader.state_dict()["cursor"] == 200
    assert next(it, None) is None         # closed: no batch of the old stream, no cursor write
    assert loader.state_dict()["cursor"] == 200
    assert next(iter(loader))["_seq"].tolist() == _expected(ds, 200)
    assert loader.state_dict()["cursor"] == 200 + B


def test_loading_before_any_iteration_and_between_iterators(ds) -> None:
    loader = _loader(ds)
    state = loader.state_dict()
    loader.load_state_dict({**state, "cursor": 24})
    assert next(iter(loader))["_seq"].tolist() == _expected(ds, 24)
    loader.load_state_dict({**state, "cursor": 60})
    assert next(iter(loader))["_seq"].tolist() == _expected(ds, 60)
