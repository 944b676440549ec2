"""The exactly-once audit: did a job consume exactly the stream its order defines?

A job's log is a list of global steps, each ``(cursor, global_batch, world_size, ids per
rank)``, across restarts with other world sizes, batch sizes or worker counts. The audit
recomputes the reference stream (the ids at positions ``[0, total)``; by default from the
order itself) and checks, without torch:

- per step, the multiset of ids over all ranks equals the reference at
  ``[cursor, cursor + global_batch)``;
- the cursors chain from ``start`` with no gap (a lost step) and no overlap (a step read twice);
- over the whole job, no id repeats and none is dropped (multiset difference with the
  reference);
- per complete epoch ``[e*N, (e+1)*N)``, the ids at its positions (placed by the rank rule of
  :func:`~zephon_store.order.assign.positions_for_rank`) are each id exactly once.

>>> import numpy as np
>>> from zephon_store.order import Order, OrderOptions
>>> from zephon_store.order.assign import positions_for_rank
>>> order = Order(np.array([4, 4, 4]), OrderOptions(seed=3))
>>> def step(cursor, world):
...     ids = [order.sample_at(positions_for_rank(cursor, 6, world, r)).tolist()
...            for r in range(world)]
...     return ConsumedStep(cursor, 6, world, ids)
>>> audit_stream([step(0, 2), step(6, 3)], order).ok          # W=2, restart, W=3
True
>>> r = audit_stream([step(0, 2), step(0, 3)], order)          # resumed one step early
>>> r.ok, r.overlaps, r.repeats, r.drops
(False, 6, 6, 0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..order.assign import positions_for_rank
from ..order.order import Order


@dataclass(frozen=True)
class ConsumedStep:
    """One global step as the job consumed it: the cursor before it, its global batch and
    world size, and ``ids[rank]``, the sample ids rank ``rank`` got, in its order."""

    cursor: int
    global_batch: int
    world_size: int
    ids: Sequence[Sequence[int]]


@dataclass(frozen=True)
class AuditReport:
    """What :func:`audit_stream` found; every count is 0 when the job consumed exactly the
    reference stream (``ok``)."""

    steps: int
    samples: int                   # ids consumed, over all steps and ranks
    expected_samples: int          # positions [start, end of the last step)
    mismatched_steps: int          # steps whose ids differ from the reference's
    first_mismatch_cursor: int | None
    repeats: int                   # ids consumed more often than the reference holds them
    drops: int                     # reference ids never consumed
    gaps: int                      # positions skipped between consecutive steps
    overlaps: int                  # positions consumed again by a later step
    epochs_crossed: int
    complete_epochs_checked: int
    complete_epochs_bad: tuple[int, ...]  # epochs whose positions are not each id once

    @property
    def ok(self) -> bool:
        return (self.steps > 0 and self.mismatched_steps == 0 and self.repeats == 0
                and self.drops == 0 and self.gaps == 0 and self.overlaps == 0
                and not self.complete_epochs_bad)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready), ``ok`` included."""
        d = asdict(self)
        d["complete_epochs_bad"] = list(self.complete_epochs_bad)
        d["ok"] = self.ok
        return d


def audit_stream(steps: Iterable[ConsumedStep], order: Order, *,
                 reference: Sequence[int] | None = None, start: int = 0) -> AuditReport:
    """Compare the consumed ``steps`` (in the order they ran) with the reference stream.

    ``order`` gives the epoch size, the lane count of the rank rule and, unless
    ``reference`` is passed (the ids at positions ``[0, total)``, e.g. from an
    uninterrupted single-process run of the real loader), the reference itself.
    ``start`` is the cursor the job began at. See the module docstring for the checks.
    """
    steps = list(steps)
    n, lanes = order.num_samples, order.effective_lanes
    expected = start
    gaps = overlaps = 0
    for s in steps:
        gaps += max(0, s.cursor - expected)
        overlaps += max(0, expected - s.cursor)
        expected = s.cursor + s.global_batch
    total = expected
    if reference is None:
        reference = order.sample_at(np.arange(total, dtype=np.int64)).tolist()
    elif len(reference) < total:
        raise ValueError(f"reference holds {len(reference)} ids, the steps reach position "
                         f"{total}")

    mismatched: list[int] = []
    consumed: Counter = Counter()
    ids_at: dict[int, int] = {}
    for s in steps:
        c, b = s.cursor, s.global_batch
        got = Counter(int(i) for ids in s.ids for i in ids)
        consumed += got
        if got != Counter(reference[c:c + b]):
            mismatched.append(c)
        for rank, ids in enumerate(s.ids):
            pos = positions_for_rank(c, b, s.world_size, rank, lanes=lanes, epoch_size=n)
            for p, i in zip(pos.tolist(), ids):
                ids_at[p] = int(i)
    want = Counter(reference[start:total])

    bad, checked = [], 0
    for epoch in range(-(-start // n), total // n):
        checked += 1
        ids = [ids_at.get(p) for p in range(epoch * n, (epoch + 1) * n)]
        if sorted(i for i in ids if i is not None) != list(range(n)):
            bad.append(epoch)
    return AuditReport(
        steps=len(steps), samples=sum(consumed.values()), expected_samples=total - start,
        mismatched_steps=len(mismatched),
        first_mismatch_cursor=mismatched[0] if mismatched else None,
        repeats=sum((consumed - want).values()), drops=sum((want - consumed).values()),
        gaps=gaps, overlaps=overlaps,
        epochs_crossed=(total - 1) // n - start // n if total > start else 0,
        complete_epochs_checked=checked, complete_epochs_bad=tuple(bad))
