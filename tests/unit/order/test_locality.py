"""Locality at scale (issue 21): one node-aware rank rule, "auto" lanes, and the bounds.

The simulator (``zephon plan``) and the loader's rank stream must give every rank the same
positions; the default order must keep each node's read amplification near 1 at the node
count it starts on, and within the stated bound at any other.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import opened, small_dataset
from zephon_store.load.stream import RankStream
from zephon_store.order import AUTO_LANES, Order, OrderOptions, Topology, auto_lanes
from zephon_store.order.assign import positions_for_participant, step_cursor
from zephon_store.runs.simulate import rank_of_positions, simulate

ROWS = 20   # rows per row group, as in the datasets


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return opened(small_dataset(str(tmp_path_factory.mktemp("locality")), files=3, records=211,
                                row_group_rows=5))


def _manifest(num_row_groups: int, rg_bytes: int = 10_000) -> SimpleNamespace:
    """The few manifest accessors the simulator reads, for equal row groups of ROWS rows."""
    rows = np.full(num_row_groups, ROWS, dtype=np.int64)
    return SimpleNamespace(rg_rows=rows, rg_row_start=np.arange(num_row_groups) * ROWS,
                           rg_length=np.full(num_row_groups, rg_bytes),
                           num_row_groups=num_row_groups,
                           rg_shard=np.arange(num_row_groups) // 64)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), per_node=st.integers(1, 4), nodes=st.integers(1, 5),
       per_rank=st.integers(1, 4), lanes=st.sampled_from([1, 2, 3, 5, 6, 12, 5040, AUTO_LANES]),
       cursor=st.integers(0, 1000))
def test_the_simulator_gives_every_rank_the_loaders_positions(
        ds, data, per_node: int, nodes: int, per_rank: int, lanes, cursor: int) -> None:
    world = per_node * nodes
    batch = world * per_rank
    options = OrderOptions(seed=3, window_blocks=1, lanes=lanes)
    order = Order(ds.manifest.rg_rows, options)
    cursors = [step_cursor(cursor, j, batch) for j in range(3)]
    simulated = rank_of_positions(order, Topology(batch, world, ranks_per_node=per_node),
                                  cursors)
    rank = data.draw(st.integers(0, world - 1))
    stream = RankStream(ds, options, Topology(batch, world, rank, ranks_per_node=per_node))
    for c, ranks in zip(cursors, simulated):
        assert np.array_equal(stream.positions(c), c + np.flatnonzero(ranks == rank))


@settings(max_examples=200, deadline=None)
@given(blocks=st.integers(1, 50_000), window=st.integers(1, 16), nodes=st.integers(1, 2000),
       node_batch=st.one_of(st.none(), st.integers(1, 512)))
def test_auto_lanes_fit_the_data_and_the_nodes(blocks: int, window: int, nodes: int,
                                               node_batch: int | None) -> None:
    p = auto_lanes(blocks, blocks * ROWS, window_blocks=window, nodes=nodes,
                   node_batch=node_batch)
    cap = max(1, blocks // window)
    assert 1 <= p <= max(1, cap)
    if nodes == 1:
        assert p == 1
    elif nodes <= cap:
        assert p % nodes == 0 and p // nodes <= 8     # k lanes per node
        if node_batch is not None and node_batch % (p // nodes):
            # k does not divide the node batch only when no fitting k does
            assert all(node_batch % k for k in range(1, min(8, cap // nodes) + 1))
    # The order keeps it: an explicit P under the cap is its own effective lane count.
    assert Order(np.full(blocks, ROWS), OrderOptions(window_blocks=window, lanes=p)
                 ).effective_lanes == p


def test_unresolved_auto_is_a_one_node_order() -> None:
    o = Order(np.full(100, ROWS), OrderOptions(seed=1))
    assert o.options.lanes == "auto" and o.effective_lanes == 1
    resolved = o.options.resolved(100, 100 * ROWS, nodes=3, node_batch=16)
    assert resolved.lanes == 12 and resolved.seed == 1    # k = 4: the largest <= 12 / 3
    assert OrderOptions(lanes=5).resolved(100, 2000, nodes=3).lanes == 5
    with pytest.raises(ValueError, match="lanes must be an int or 'auto', got 'many'"):
        OrderOptions(lanes="many")  # type: ignore[arg-type]


@pytest.mark.parametrize("row_groups", [2000, 20_000])
@pytest.mark.parametrize("world", [8, 64, 512, 1000, 1024])
def test_default_order_reads_what_each_node_consumes(row_groups: int, world: int) -> None:
    """The issue's acceptance: plan's figures with default options, 8 ranks per node and
    8 samples per rank per step, every node <= 1.2 over one epoch."""
    m = _manifest(row_groups)
    t = Topology(8 * world, world, ranks_per_node=8)
    options = OrderOptions(seed=0).resolved(row_groups, row_groups * ROWS, nodes=t.num_nodes,
                                            node_batch=64)
    sim = simulate(m, options, t)
    assert sim["read_amplification_max_node"] <= 1.2, sim["read_amplification_max_node"]


@settings(max_examples=25, deadline=None)
@given(start_nodes=st.sampled_from([2, 3, 5, 8, 12, 16, 25]), nodes=st.integers(1, 40))
def test_another_node_count_stays_within_the_bound(start_nodes: int, nodes: int) -> None:
    """Started on ``start_nodes`` nodes, resumed on ``nodes``: per-node amplification stays
    within ``1 + M'/P + 1/K`` (docs/order.md, "Locality at scale")."""
    row_groups = 2000
    options = OrderOptions(seed=0).resolved(row_groups, row_groups * ROWS, nodes=start_nodes,
                                            node_batch=64)
    sim = simulate(_manifest(row_groups), options,
                   Topology(64 * nodes, 8 * nodes, ranks_per_node=8))
    bound = 1 + nodes / options.lanes + 1 / options.window_blocks
    assert sim["read_amplification"] <= bound, (sim["read_amplification"], bound)


def test_uneven_participants_read_neighbouring_lanes() -> None:
    # 3 replica groups over 10 positions of 4 lanes: sizes 3, 3, 4 and at most one key
    # shared between neighbours.
    pieces = [positions_for_participant(0, 10, 3, i, lanes=5) for i in range(3)]
    assert [p.size for p in pieces] == [3, 3, 4]
    keys = [set((p % 5).tolist()) for p in pieces]
    assert len(keys[0] & keys[2]) == 0


def test_the_loader_resolves_auto_once_and_a_resume_keeps_it(ds) -> None:
    from zephon_store import StopOptions
    from zephon_store.torch import ZephonLoader

    first = ZephonLoader(ds, topology=Topology(32, world_size=16, rank=9, ranks_per_node=8),
                         seed=2, stop=StopOptions(max_steps=2))
    assert first.topology.num_nodes == 2
    lanes = auto_lanes(ds.manifest.num_row_groups, ds.num_samples, nodes=2, node_batch=16)
    assert first.order.lanes == lanes > 1
    for _ in first:
        pass
    state = first.state_dict()
    assert state["order"]["lanes"] == lanes               # the number, never "auto"
    # Resumed on one node: "auto" would now mean 1 lane, but the checkpoint's order holds.
    again = ZephonLoader(ds, topology=Topology(32, world_size=4, rank=1, ranks_per_node=4),
                         seed=2, stop=StopOptions(max_steps=1))
    assert again.order.lanes == 1
    again.load_state_dict(state)
    assert again.order.lanes == lanes
    stream = RankStream(ds, again.order, again.topology)
    [batch] = list(again)
    assert batch["id"].tolist() == stream.ids(64, ahead=False).tolist()
