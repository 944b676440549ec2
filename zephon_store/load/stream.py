"""One rank's positions and sample ids as a pure function of the cursor (no torch needed).

``RankStream`` ties the order (which sample at which position), the assignment (which rank
reads which position) and the reader (the bytes) together: local batch ``i`` after a start
cursor ``c`` is the rank's share of global step ``[c + i*B, c + (i+1)*B)``. The reader
(:mod:`zephon_store.load.share_reader`), and through it the torch and TorchTitan loaders, build
on it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..order.assign import positions_for_rank, step_cursor, tail_positions_for_rank
from ..order.order import Order, OrderOptions
from ..order.topology import Topology
from .plan import SEQ_KEY
from .source import plan_of

__all__ = ["RankStream", "SEQ_KEY", "make_order"]

_IDS_BLOCK_POSITIONS = 1 << 14  # positions per sample_at call when computing ids ahead


def make_order(source, order_options: OrderOptions) -> Order:
    """The order a run reads a source (or a plan) in: a dataset's over its row groups (its
    blocks), a mixture's mixed order (:func:`~zephon_store.load.plan.plan_of`)."""
    return plan_of(source).order(order_options)


class RankStream:
    """Positions, sample ids and row groups for one rank.

    >>> from zephon_store import open_dataset
    >>> ds = open_dataset(tiny_dataset)
    >>> RankStream(ds, OrderOptions(seed=7), Topology(global_batch=8)).ids(cursor=0)
    array([79, 41, 78, 45, 68, 97, 30, 33])
    >>> rs = RankStream(ds, OrderOptions(seed=7), Topology(global_batch=8, world_size=2, rank=1))
    >>> rs.ids(cursor=0)           # rank 1 of 2: the second half of the same step
    array([68, 97, 30, 33])

    Batches are made by :class:`~zephon_store.load.pipeline.BatchPipeline` over a stream.
    ``dataset``: a source, or the plan a run reads it by
    (:func:`~zephon_store.load.plan.plan_of`); ``dataset`` is then the source.
    """

    def __init__(self, dataset, order_options: OrderOptions, topology: Topology, *,
                 columns: list[str] | None = None, with_seq: bool = False,
                 end: int | None = None, split=None) -> None:
        self.plan = plan_of(dataset)
        self.dataset = dataset = self.plan.source
        # Another rule for this process's share of a step than the topology's rank rule:
        # an object whose positions(cursor, global_batch, lanes=, epoch_size=, end=) gives
        # it (a live run's participant, load/live.py). None: the rank rule.
        self.split = split
        # Positions at or past ``end`` are never read: a step that would cross it is the
        # short last step (assign.tail_positions_for_rank). None: no end, full steps only.
        self.end = end
        self.order = self.plan.order(order_options)
        self.topology = topology
        self.columns = columns
        self.with_seq = with_seq
        self._ids_memo: dict[int, np.ndarray] = {}
        if columns is not None:
            missing = [c for c in columns if c not in dataset.schema.names]
            if missing:
                raise ValueError(f"columns {missing} are not in the dataset; it has "
                                 f"{dataset.schema.names}")

    def positions(self, cursor: int) -> np.ndarray:
        """Positions this rank consumes in the global step starting at ``cursor``."""
        t = self.topology
        if self.split is not None:
            return self.split.positions(cursor, t.global_batch, lanes=self.order.effective_lanes,
                                        epoch_size=self.order.num_samples, end=self.end)
        rule = {"lanes": self.order.effective_lanes, "epoch_size": self.order.num_samples,
                "ranks_per_node": t.ranks_per_node}
        if self.end is not None and cursor + t.global_batch > self.end:
            return tail_positions_for_rank(min(cursor, self.end), self.end, t.world_size,
                                           t.rank, **rule)
        return positions_for_rank(cursor, t.global_batch, t.world_size, t.rank, **rule)

    def ids(self, cursor: int, *, ahead: bool | None = None) -> np.ndarray:
        """Sample ids (global sequence numbers) of this rank's share of the step.

        ``ahead``: also compute (and memoise) the ids of many following steps in one call;
        ``None`` does so unless nothing was computed ahead yet. The first step after a start
        or resume should be computed alone (``ahead=False``): a start or resume waits only
        for its own step's ids.
        """
        ids = self._ids_memo.pop(cursor, None)  # the batch takes them: one owner per array
        if ids is not None:
            return ids
        if ahead is None:
            ahead = bool(self._ids_memo)
        if not ahead:
            return self.order.sample_at(self.positions(cursor))
        block = self._ids_ahead(cursor)
        self._ids_memo.pop(cursor, None)
        return block[cursor]

    def _ids_ahead(self, cursor: int) -> dict[int, np.ndarray]:
        """Ids of the steps from ``cursor`` on, many steps per ``sample_at`` call, memoised.

        A shuffled ``sample_at`` for one small batch is mostly per-call numpy overhead, and
        the prefetcher asks for every step before its batch does. Dict operations are atomic, so threads
        share the memo without a lock; a race only computes a step twice.
        """
        t = self.topology
        steps = max(1, _IDS_BLOCK_POSITIONS // t.local_batch)
        cursors = [step_cursor(cursor, j, t.global_batch) for j in range(steps)]
        if self.end is not None:
            cursors = [c for c in cursors if c < self.end] or [cursor]
        if self.plan.end is not None:
            # Not past a capped source's end: looking ahead must not fail a step before it.
            cursors = [c for c in cursors if c + t.global_batch <= self.plan.end] or [cursor]
        parts = [self.positions(c) for c in cursors]
        ids = self.order.sample_at(np.concatenate(parts))
        # Steps hold local_batch ids each, except a short last step.
        bounds = np.cumsum([0] + [p.size for p in parts]).tolist()
        block = {c: ids[bounds[j]:bounds[j + 1]].copy() for j, c in enumerate(cursors)}
        if len(self._ids_memo) > 4 * steps:
            self._ids_memo.clear()  # steps nobody came for (e.g. another worker's)
        self._ids_memo.update(block)
        return block

    def row_groups(self, cursor: int) -> np.ndarray:
        """Row groups the step starting at ``cursor`` reads, in order of first use."""
        ids = self._ids_memo.get(cursor)
        if ids is None:
            ids = self._ids_ahead(cursor)[cursor]
        rg = self.dataset.row_group_of(ids)
        if rg.size <= 512:     # on a small step a dict beats np.unique (docs/benchmarks.md)
            return np.fromiter(dict.fromkeys(rg.tolist()), dtype=np.int64)
        _, first = np.unique(rg, return_index=True)
        return rg[np.sort(first)]

    def working_set_row_groups(self) -> int:
        """Row groups this rank reads from at the same time, in steady state (each must stay
        decoded until its last sample is read, or it is decoded again): the plan's answer
        for this order and topology."""
        return self.plan.working_set_row_groups(self.order, self.topology)

    def seq_fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """What ``with_seq`` adds to a batch of sample ``ids``: ``_seq``, the ids; for a
        mixture ``_seq`` is each source's own id and ``_source`` the source index."""
        return self.plan.seq_fields(ids)

    def select(self, table: pa.Table) -> pa.Table:
        """``table`` with only the stream's ``columns`` (all when none were chosen)."""
        return table if self.columns is None else table.select(self.columns)
