"""Questions a run log answers exactly: trace, where, and the exactly-once audit.

The run log (:mod:`zephon_store.load.runlog`) records, per segment of a run, its first
step, cursor, global batch, world size and order. With the dataset that places every step:

- :func:`trace` -- the sample ids each rank consumed at given steps (the order's
  ``sample_at`` at the positions the rank rule gives each rank);
- :func:`where` -- for sample ids, their position in each epoch (the order's inverse,
  ``positions_of``: no scan) and the step and rank that consumed each;
- :func:`audit_run` -- recomputes every exposure of the run, vectorised and chunked, and
  reports per epoch how many samples were seen exactly once, repeated or skipped, and the
  steps where a discrepancy entered (a cursor that does not continue the one before, a
  changed order or dataset).

Each answer is bounded by what the log's steps reach: a question beyond it (a step past
any position, a rank outside the world, more than ``MAX_TRACE_IDS`` ids or
``MAX_WHERE_ANSWERS`` answers) raises :class:`AuditRequestError` before any work.

Everything is over a *stream order*: an object with ``num_samples``, ``effective_lanes``,
``sample_at(positions)`` and ``positions_of(ids, epochs)``
(:class:`~zephon_store.order.Order`).

:func:`audit_stream` checks what a job actually consumed (ids logged per step and rank)
with the same exposure counting (:class:`Exposures`) that :func:`audit_run` uses: one
implementation of "each id exactly once per epoch".

>>> import numpy as np
>>> from zephon_store.order import Order, OrderOptions
>>> from zephon_store.load.runlog import RunSegment
>>> order = Order(np.array([4, 4, 4]), OrderOptions(seed=3))
>>> s0 = RunSegment(0, 0, 6, 2, 0, "xxh3:00", order.options)
>>> log = [s0, s0.replace(first_step=1, cursor=6, world_size=3)]     # W=2, then W=3
>>> audit_run(log, lambda seg: order, end_step=4).ok
True
>>> bad = [s0, s0.replace(first_step=1, cursor=0, world_size=3)]     # resumed a step early
>>> r = audit_run(bad, lambda seg: order, end_step=4)
>>> r.ok, [(e.step, e.kind) for e in r.events if e.failure]
(False, [(1, 'overlap')])
>>> trace(log, lambda seg: order, [1])[0].ranks == [order.sample_at(np.arange(6, 12))[
...     2 * r:2 * r + 2].tolist() for r in range(3)]
True
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import ZephonError
from ..load.runlog import MAX_POSITION, RunLogError, RunSegment, segment_steps
from ..order.assign import positions_for_participant, positions_for_rank, step_owners, step_ranks
from ..order.order import Order

__all__ = ["AuditReport", "AuditRequestError", "ConsumedStep", "EpochExposure", "ExposureTally",
           "Exposures",
           "RunAudit", "RunEvent", "TraceStep", "audit_run", "audit_stream", "trace", "where",
           "MAX_LISTED_SKIPPED_EPOCHS", "MAX_TRACE_IDS", "MAX_WHERE_ANSWERS"]

# Positions per sample_at call in the audit: large enough to amortise numpy's per-call cost,
# small enough that a chunk's ids and positions stay a few tens of MB.
_AUDIT_CHUNK = 1 << 22
# Answers are bounded by what a caller can read, so a question answers in bounded time or
# is refused: ids one trace returns (over its steps and ranks), (id, epoch) pairs one where
# returns, and whole epochs never read (in a gap of the cursor) listed one by one; more of
# those are counted in one note instead (each listed epoch costs 2 bytes per sample).
MAX_TRACE_IDS = 1 << 20
MAX_WHERE_ANSWERS = 1 << 20
MAX_LISTED_SKIPPED_EPOCHS = 64


class AuditRequestError(ZephonError, ValueError):
    """A question the run log cannot answer as asked: a step before the log or beyond any
    position, a rank outside the world size, more ids or epochs than one answer holds."""

OrderFor = Callable[[RunSegment], Any]


# --------------------------------------------------------------------------- exposures


@dataclass(frozen=True)
class EpochExposure:
    """How often the samples of one epoch were consumed.

    ``expected``: samples the run should have seen in this epoch (all ``N`` for a complete
    epoch; for the epoch the run started or stopped in, those at the positions it covered).
    ``once``: expected samples seen exactly once; ``repeated``: samples seen more than once
    (``extra_exposures`` counts the surplus); ``skipped``: expected samples never seen;
    ``unexpected``: samples seen that the covered positions do not hold; ``masked``:
    exposures of denied samples (they took their positions, flagged ``_masked``);
    ``masked_tokens``: tokens of denied documents blanked in the windows read (a deny list
    naming documents).
    """

    epoch: int
    complete: bool
    expected: int
    exposures: int
    once: int
    repeated: int
    extra_exposures: int
    skipped: int
    unexpected: int
    masked: int = 0
    masked_tokens: int = 0
    source: str | None = None      # a mixture's source (its own epochs), None for a dataset

    @property
    def ok(self) -> bool:
        return self.repeated == 0 and self.skipped == 0 and self.unexpected == 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


class Exposures:
    """Per-epoch exposure counts of sample ids, fed ``(positions, ids)`` in any chunks.

    The one place that decides "each id exactly once per epoch": :func:`audit_run` feeds
    it ids recomputed from a run log, :func:`audit_stream` ids a job logged. An exposure
    belongs to the epoch of its position. Memory: 2 bytes per sample per open epoch.

    >>> e = Exposures(4)
    >>> e.add(np.arange(8), np.array([2, 0, 3, 1, 1, 1, 0, 2]))
    >>> [(x.epoch, x.once, x.repeated, x.skipped) for x in (e.close(0), e.close(1))]
    [(0, 4, 0, 0), (1, 2, 1, 1)]
    """

    def __init__(self, num_samples: int, *, tally: ExposureTally | None = None) -> None:
        self.n = int(num_samples)
        self._counts: dict[int, np.ndarray] = {}
        self._masked: Counter = Counter()
        self._masked_tokens: Counter = Counter()
        # Exposures per id over every epoch, for the consumption report (runs/consumption.py):
        # counted here, from the same parts, so the report is the audit's own count.
        self.tally = tally

    def add(self, positions: np.ndarray, ids: np.ndarray,
            masked: np.ndarray | None = None, *, distinct: bool = False,
            masked_tokens: np.ndarray | None = None) -> None:
        """Count one exposure of ``ids[j]`` in the epoch of ``positions[j]``
        (``masked_tokens[j]``: its tokens a deny list blanked, a document takedown's).

        ``distinct``: the caller knows each epoch's part holds each id at most once (ids an
        order's bijection gave for distinct positions), which skips the check for repeats.
        """
        positions = np.asarray(positions, dtype=np.int64)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.n):
            raise ValueError(f"sample ids must lie in [0, {self.n})")
        epochs = positions // self.n
        lo, hi = (int(epochs.min()), int(epochs.max())) if epochs.size else (0, -1)
        for e in range(lo, hi + 1):
            sel = epochs == e if lo != hi else slice(None)
            part = ids[sel]
            counts = self._counts.get(e)
            if counts is None:
                counts = self._counts[e] = np.zeros(self.n, dtype=np.uint16)
            # np.add.at is exact for repeated ids; a plain fancy += is faster when the part
            # holds each id once (a bijection's output, the common case).
            unique = distinct or part.size <= 1 or np.unique(part).size == part.size
            if not unique:
                np.add.at(counts, part, 1)
            else:
                counts[part] += 1
            part_masked = None if masked is None else np.asarray(masked)[sel]
            if part_masked is not None:
                self._masked[e] += int(np.count_nonzero(part_masked))
            if masked_tokens is not None:
                self._masked_tokens[e] += int(np.asarray(masked_tokens)[sel].sum())
            if self.tally is not None:
                self.tally.add(part, part_masked, unique=unique)

    def open_epochs(self) -> list[int]:
        return sorted(self._counts)

    def close(self, epoch: int, expected: np.ndarray | None = None) -> EpochExposure:
        """The epoch's figures; its counts are freed. ``expected``: the ids the covered
        positions hold when the epoch was not covered whole (None: complete epoch)."""
        counts = self._counts.pop(epoch, None)
        if counts is None:
            counts = np.zeros(self.n, dtype=np.uint16)
        seen = counts > 0
        rep = counts > 1
        if expected is None:
            want = np.ones(self.n, dtype=bool)
        else:
            want = np.zeros(self.n, dtype=bool)
            want[np.asarray(expected, dtype=np.int64)] = True
        return EpochExposure(
            epoch=epoch, complete=expected is None, expected=int(want.sum()),
            exposures=int(counts.sum(dtype=np.int64)),
            once=int(np.count_nonzero(want & (counts == 1))),
            repeated=int(np.count_nonzero(rep)),
            extra_exposures=int((counts[rep].astype(np.int64) - 1).sum()),
            skipped=int(np.count_nonzero(want & ~seen)),
            unexpected=int(np.count_nonzero(~want & seen)),
            masked=int(self._masked.pop(epoch, 0)),
            masked_tokens=int(self._masked_tokens.pop(epoch, 0)))


class ExposureTally:
    """Exposures per sample id over all epochs: ``seen`` (the model got the sample) and
    ``masked`` (a deny list blanked it), fed by :class:`Exposures` as it counts. uint32:
    4 bytes per sample each.

    >>> t = ExposureTally(3)
    >>> e = Exposures(3, tally=t)
    >>> e.add(np.arange(6), np.array([0, 1, 2, 2, 1, 0]), np.array([0, 0, 1, 0, 0, 0], bool))
    >>> t.seen.tolist(), t.masked.tolist()
    ([2, 2, 1], [0, 0, 1])
    """

    def __init__(self, num_samples: int) -> None:
        self.seen = np.zeros(int(num_samples), dtype=np.uint32)
        self.masked = np.zeros(int(num_samples), dtype=np.uint32)

    def add(self, ids: np.ndarray, masked: np.ndarray | None, *, unique: bool) -> None:
        """Count ``ids`` (``unique``: each at most once here) as seen, or as masked where
        ``masked`` is true."""
        if masked is None or not masked.any():
            parts = ((self.seen, ids),)
        else:
            parts = ((self.seen, ids[~masked]), (self.masked, ids[masked]))
        for counts, part in parts:
            if unique:
                counts[part] += 1
            else:
                np.add.at(counts, part, 1)


# --------------------------------------------------------------------------- run log


@dataclass(frozen=True)
class RunEvent:
    """Something at a segment boundary: where a discrepancy entered, or a change the audit
    allows (``deny_list_changed``, ``resumed``). ``failure`` says which."""

    step: int
    line: int
    kind: str
    detail: str
    failure: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunAudit:
    """What :func:`audit_run` found: per epoch exposures, and the segment-boundary events."""

    steps: int
    first_step: int
    end_step: int
    positions: int
    epochs: tuple[EpochExposure, ...]
    events: tuple[RunEvent, ...]
    segments: int
    notes: tuple[str, ...] = field(default=())
    # Whole epochs inside the run's span that no segment read (a cursor gap), beyond the
    # MAX_LISTED_SKIPPED_EPOCHS listed in ``epochs``: counted, not listed.
    unlisted_skipped_epochs: int = 0

    @property
    def ok(self) -> bool:
        """Exactly once: every epoch clean and no failing event, over at least one step."""
        return (self.steps > 0 and all(e.ok for e in self.epochs)
                and self.unlisted_skipped_epochs == 0
                and not any(ev.failure for ev in self.events))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "steps": self.steps, "first_step": self.first_step,
                "end_step": self.end_step, "positions": self.positions,
                "segments": self.segments, "epochs": [e.to_dict() for e in self.epochs],
                "events": [e.to_dict() for e in self.events], "notes": list(self.notes),
                "unlisted_skipped_epochs": self.unlisted_skipped_epochs}


def _boundary_events(prev: RunSegment, seg: RunSegment, stop_prev: int) -> list[RunEvent]:
    events = []
    s, ln = seg.first_step, seg.line
    expected = prev.cursor_at(stop_prev)
    if seg.cursor > expected:
        events.append(RunEvent(s, ln, "gap", f"cursor {seg.cursor}, but the segment of line "
                               f"{prev.line} leaves it at {expected}: positions "
                               f"[{expected}, {seg.cursor}) were skipped", True))
    elif seg.cursor < expected:
        events.append(RunEvent(s, ln, "overlap", f"cursor {seg.cursor}, but the segment of "
                               f"line {prev.line} leaves it at {expected}: positions "
                               f"[{seg.cursor}, {expected}) are read again", True))
    if prev.mixture is not None and seg.mixture is not None:
        # A mixture's id changes when a resume appends a stage; its sources must stay.
        a = [x.get("dataset_id") for x in prev.mixture.get("sources", [])]
        b = [x.get("dataset_id") for x in seg.mixture.get("sources", [])]
        if b[:len(a)] != a:
            events.append(RunEvent(s, ln, "mixture_changed", f"sources {a} -> {b}", True))
        elif prev.mixture.get("schedule") != seg.mixture.get("schedule"):
            events.append(RunEvent(s, ln, "schedule_changed", "the mixture's schedule changed "
                                   "(a stage appended at the resume); exposures are counted "
                                   "with each segment's own schedule", False))
    elif seg.dataset_id != prev.dataset_id:
        events.append(RunEvent(s, ln, "dataset_changed", f"dataset {prev.dataset_id} -> "
                               f"{seg.dataset_id}", True))
    if seg.order != prev.order:
        a, b = prev.order.to_dict(), seg.order.to_dict()
        diff = ", ".join(f"{k} {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k])
        events.append(RunEvent(s, ln, "order_changed", diff, True))
    da, db = (prev.deny_list or {}).get("id"), (seg.deny_list or {}).get("id")
    if da != db:
        events.append(RunEvent(s, ln, "deny_list_changed", f"deny list {da} -> {db} (mode "
                               f"{(seg.deny_list or {}).get('mode')})", False))
    readers_of = (f"world_size {seg.world_size}" if not seg.live else
                  f"live, participants {seg.participants}")
    events.append(RunEvent(s, ln, "resumed", f"{readers_of}, global_batch "
                           f"{seg.global_batch}, num_workers {seg.num_workers}, cursor "
                           f"{seg.cursor}", False))
    return events


def audit_run(segments: Sequence[RunSegment], order_for: OrderFor, *,
              end_step: int | None = None, dataset_id: str | None = None,
              deny_for: Callable[[RunSegment], Any] | None = None,
              chunk: int = _AUDIT_CHUNK, workers: int | None = None,
              tallies: Sequence[ExposureTally] | None = None) -> RunAudit:
    """Recompute every exposure of the run the log describes and check it, per epoch.

    ``order_for(segment)`` gives the stream order a segment read (built from the dataset
    and ``segment.order``). ``end_step``: where the last segment stopped (the log does not
    record it; None audits up to the last segment's first step). ``dataset_id``: the
    dataset being audited; segments that read another dataset cannot be recomputed and
    count as a failing ``dataset_changed`` event, their positions as skipped.
    ``deny_for(segment)``: the segment's :class:`~zephon_store.load.denylist.DenyList` (or
    None) to count masked exposures. The reference for "what a covered position holds" is
    the first segment's order. ``chunk`` positions are recomputed per pass, ``workers``
    passes at once in threads (default: the CPU count). ``tallies``: one
    :class:`ExposureTally` per source (one dataset: one) that the count also fills.
    """
    segs = list(segments)
    spans = segment_steps(segs, end_step)
    first = segs[0]
    ref = order_for(first)
    events: list[RunEvent] = []
    notes: list[str] = []
    if (first.first_step, first.cursor) != (0, 0):
        notes.append(f"the log begins at step {first.first_step}, cursor {first.cursor} (line "
                     f"{first.line}); earlier steps are not audited")
    if dataset_id is not None and first.dataset_id != dataset_id:
        raise RunLogError(f"line {first.line}: the log is for dataset {first.dataset_id}, "
                          f"not {dataset_id}")
    for k in range(1, len(segs)):
        events += _boundary_events(segs[k - 1], segs[k], spans[k - 1][2])
    intervals = _segment_intervals(spans, order_for, deny_for, dataset_id, _epoch_sizes(ref))
    last_seg, _, last_stop = spans[-1]
    start, end = first.cursor, last_seg.cursor_at(last_stop)
    if end_step is None:
        notes.append(f"the last segment (line {last_seg.line}, from step "
                     f"{last_seg.first_step}) has no recorded end: pass end_step (--end-step) "
                     "to audit its steps")
    epochs_out: list[EpochExposure] = []
    unlisted = 0
    if intervals and ref.source_orders[0] is ref:
        # One source whose stream positions are the positions: the same count as
        # _source_epochs, with an epoch held at a time and chunks recomputed in threads.
        epochs_out, unlisted = _dataset_epochs(intervals, ref, start, end, chunk, workers,
                                               tallies)
    elif intervals:
        epochs_out, unlisted = _source_epochs(intervals, ref, start, end, chunk, tallies)
    if unlisted:
        notes.append(f"{unlisted} more whole epochs (of the dataset, or of a mixture's "
                     "sources) were never read by any segment (a cursor gap): every sample "
                     "of each skipped; not listed one by one")
    total_steps = sum(b - a for _, a, b in spans)
    return RunAudit(steps=total_steps, first_step=first.first_step,
                    end_step=spans[-1][2], positions=sum(hi - lo for lo, hi, _, _ in intervals),
                    epochs=tuple(epochs_out), events=tuple(events), segments=len(segs),
                    notes=tuple(notes), unlisted_skipped_epochs=unlisted)


def _epoch_sizes(order) -> list[int]:
    """The epoch size of each source's own stream (one dataset: its own)."""
    return [int(o.num_samples) for o in order.source_orders]


def _segment_intervals(spans, order_for: OrderFor, deny_for, dataset_id: str | None,
                       sizes: list[int]) -> list[tuple[int, int, Any, Any]]:
    """``(lo, hi, order, deny)``: the positions each segment consumed, with the order it read
    (None for a segment of another dataset) and its deny list (or None). Every source's
    epoch size must be the first segment's ``sizes``."""
    intervals = []
    for seg, a, b in spans:
        if b <= a:
            continue
        lo, hi = seg.cursor_at(a), seg.cursor_at(b)
        readable = dataset_id is None or seg.dataset_id == dataset_id
        order = order_for(seg) if readable else None
        for got, want in zip(_epoch_sizes(order) if order is not None else [], sizes):
            if got != want:
                raise RunLogError(f"line {seg.line}: its order has {got} samples per epoch, "
                                  f"the first segment's {want}")
        deny = deny_for(seg) if deny_for is not None and readable else None
        intervals.append((lo, hi, order, deny))
    return intervals


def _dataset_epochs(intervals, ref, start: int, end: int, chunk: int, workers: int | None,
                    tallies=None) -> tuple[list[EpochExposure], int]:
    """``(epochs, whole epochs not listed)`` of a single dataset's run: each listed epoch's
    exposures recomputed from the intervals that reach it, checked against ``ref`` where the
    run's span ``[start, end)`` covers only part of the epoch."""
    n = int(ref.num_samples)
    epochs_out: list[EpochExposure] = []
    # The epochs a segment read, and those of the run's span [start, end): the time is
    # bounded by the positions the log's steps reach, whatever its cursors say.
    read = [(lo, hi) for lo, hi, order, _ in intervals if order is not None and hi > lo]
    listed, unlisted = _epochs_to_list(read, start, end, n)
    exp = Exposures(n, tally=tallies[0] if tallies else None)
    pool = ThreadPoolExecutor(max(1, workers or os.cpu_count() or 1),
                              thread_name_prefix="zephon-audit")
    try:
        for e in listed:
            e_lo, e_hi = e * n, (e + 1) * n
            for lo, hi, order, deny in intervals:
                a, b = max(lo, e_lo), min(hi, e_hi)
                if order is None or a >= b:
                    continue

                def ids_of(c: int, order=order, b=b) -> tuple[np.ndarray, np.ndarray]:
                    pos = np.arange(c, min(c + chunk, b), dtype=np.int64)
                    return pos, order.sample_at(pos)

                # numpy releases the GIL in sample_at's passes: chunks run side by side.
                for pos, ids in pool.map(ids_of, range(a, b, chunk)):
                    # One order, one epoch, distinct positions: distinct ids.
                    exp.add(pos, ids, None if deny is None else deny.masked(ids),
                            distinct=True, masked_tokens=_blanked(deny, ids))
            cov_lo, cov_hi = max(e_lo, start), min(e_hi, end)
            expected = None
            if (cov_lo, cov_hi) != (e_lo, e_hi):
                expected = (ref.sample_at(np.arange(cov_lo, cov_hi, dtype=np.int64))
                            if cov_hi > cov_lo else np.zeros(0, dtype=np.int64))
            epochs_out.append(exp.close(e, expected))
    finally:
        pool.shutdown()
    return epochs_out, unlisted


def _blanked(deny, ids: np.ndarray) -> np.ndarray | None:
    """Tokens of ``deny``'s documents in each window ``ids`` (None: it names none)."""
    if deny is None or getattr(deny, "spans", None) is None:
        return None
    return deny.blanked_tokens(ids)


def _epochs_to_list(read: Sequence[tuple[int, int]], start: int, end: int, n: int, *,
                    also: Iterable[int] = ()) -> tuple[list[int], int]:
    """``(epochs to report, whole epochs not listed)`` for epochs of ``n`` positions.

    Reported: every epoch a ``read`` interval touches, the epochs holding ``start`` and the
    last position before ``end``, and up to MAX_LISTED_SKIPPED_EPOCHS of the whole epochs
    between them that nothing read; the others are only counted. O(intervals + listed).
    """
    touched: set[int] = set(also)
    for lo, hi in read:
        # An interval spans at most hi - lo positions: its epochs are the positions' reach.
        touched.update(range(lo // n, -(-hi // n)))
    if end > start:
        touched.update((start // n, (end - 1) // n))
    span = range(-(-start // n), end // n)           # whole epochs inside [start, end)
    listed = sorted(touched)
    # The whole epochs of the span that nothing read: listed while there are few.
    gaps, extra = [], 0
    prev = span.start - 1
    for e in [x for x in listed if span.start <= x < span.stop] + [span.stop]:
        if e - prev > 1:
            room = MAX_LISTED_SKIPPED_EPOCHS - len(gaps)
            k = min(room, e - prev - 1)
            gaps += range(prev + 1, prev + 1 + k)
            extra += e - prev - 1 - k
        prev = e
    return sorted(touched.union(gaps)), extra


def _source_epochs(intervals, ref, start: int, end: int, chunk: int,
                   tallies=None) -> tuple[list[EpochExposure], int]:
    """Per source and source epoch: a position is (source k, index i in k's own stream),
    and exposures count in k's epoch ``i // N_k`` (one dataset: source 0, i the position).
    Every source epoch touched is held until the end (2 bytes per sample of each). Also
    returns the count of whole source epochs never read and not listed
    (:func:`_epochs_to_list`)."""
    names = ref.source_names
    sizes = _epoch_sizes(ref)
    exps = [Exposures(nk, tally=tallies[k] if tallies else None)
            for k, nk in enumerate(sizes)]
    for lo, hi, order, deny in intervals:
        if order is None:
            continue
        for c in range(lo, hi, chunk):
            pos = np.arange(c, min(c + chunk, hi), dtype=np.int64)
            src, index = order.source_positions(pos)
            for k in np.unique(src).tolist():
                idx = index[src == k]
                ids = order.source_orders[k].sample_at(idx)
                # A bijection onto (source, index): distinct indices, distinct ids.
                gids = order.global_ids(k, ids)
                masked = None if deny is None else deny.masked(gids)
                exps[k].add(idx, ids, masked, distinct=True,
                            masked_tokens=_blanked(deny, gids))
    # A resume may append stages: the schedule the run ended on keeps every stage before its
    # cursor, so it gives what each source consumed by the end (the first one would not).
    last = next((o for _, _, o, _ in reversed(intervals) if o is not None), ref)
    if list(last.source_names) != list(names):   # mixture_changed: already a failure
        last = ref
    lo_k, hi_k = ref.consumed(start), last.consumed(end)
    out = []
    unlisted = 0
    for k, (exp, nk) in enumerate(zip(exps, sizes)):
        a, b = int(lo_k[k]), int(hi_k[k])
        epochs, extra = _epochs_to_list([], a, b, nk, also=exp.open_epochs())
        unlisted += extra
        for e in epochs:
            cov_lo, cov_hi = max(e * nk, a), min((e + 1) * nk, b)
            expected = None
            if (cov_lo, cov_hi) != (e * nk, (e + 1) * nk):
                expected = (ref.source_orders[k].sample_at(
                    np.arange(cov_lo, cov_hi, dtype=np.int64)) if cov_hi > cov_lo
                    else np.zeros(0, dtype=np.int64))
            out.append(dataclasses.replace(exp.close(e, expected), source=names[k]))
    return out, unlisted


# --------------------------------------------------------------------------- trace / where


@dataclass(frozen=True)
class TraceStep:
    """One step as the log places it: ``ranks[r]`` are the ids rank ``r`` consumed (for a
    mixture, each source's own ids, and ``sources[r]`` the source of each). A live step
    (``live``): ``ranks[i]`` are participant ``i``'s, ``world_size`` the participant count;
    None when its log line does not record it (``ranks`` then holds the whole step)."""

    step: int
    cursor: int
    global_batch: int
    world_size: int | None
    line: int
    ranks: list[list[int]]
    masked: list[list[bool]] | None = None
    sources: list[list[str]] | None = None
    # Whether the log shows the run consumed this step: a later segment starts after it,
    # or it lies before ``end_step``; False for a step of the last segment when the log
    # does not say how far that went (or beyond ``end_step``).
    reached: bool = True
    live: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("masked", "sources"):
            if d[key] is None:
                d.pop(key)
        if not self.live:
            d.pop("live")
        return d


def segment_at(segments: Sequence[RunSegment], step: int) -> RunSegment:
    """The segment that consumed ``step`` (the last one starting at or before it)."""
    found = None
    for seg in segments:
        if seg.first_step <= step:
            found = seg
    if found is None:
        raise RunLogError(f"step {step} is before the log's first segment (step "
                          f"{segments[0].first_step}, line {segments[0].line})")
    return found


def readers(seg: RunSegment) -> int | None:
    """How many parts ``seg`` splits each step into: its world size, or a live segment's
    participant count (None: a live line that does not record it; one part)."""
    return seg.participants if seg.live else seg.world_size


def step_readers(seg: RunSegment, order, cursor: int) -> np.ndarray:
    """The rank (a live segment: participant) that reads each position of the step at
    ``cursor`` (element ``j``: ``cursor + j``), by the loader's rule for ``seg``."""
    kw = {"lanes": order.effective_lanes, "epoch_size": order.num_samples}
    if seg.live:
        return step_owners(cursor, seg.global_batch, readers(seg) or 1, **kw)
    return step_ranks(cursor, seg.global_batch, seg.world_size,
                      ranks_per_node=seg.ranks_per_node or 1, **kw)


def rank_positions(seg: RunSegment, order, step: int,
                   rank: int | None = None) -> list[np.ndarray]:
    """The positions each rank (a live segment: participant), or only ``rank``, consumed
    at ``step`` of ``seg`` (the loader's rule), each one's in increasing order. All at once
    cost O(global_batch) in numpy, whatever the world size; one rank O(its share + lanes)."""
    c = seg.cursor_at(step)
    kw = {"lanes": order.effective_lanes, "epoch_size": order.num_samples}
    if rank is not None and seg.live:
        return [positions_for_participant(c, seg.global_batch, readers(seg) or 1, rank, **kw)]
    if rank is not None:
        return [positions_for_rank(c, seg.global_batch, seg.world_size, rank,
                                   ranks_per_node=seg.ranks_per_node or 1, **kw)]
    owners = step_readers(seg, order, c)
    # Stable: each one's positions stay increasing, as positions_for_rank gives them; a
    # live step's parts may differ in size by one.
    by_rank = c + np.argsort(owners, kind="stable")
    counts = np.bincount(owners, minlength=readers(seg) or 1)
    return np.split(by_rank, np.cumsum(counts)[:-1])


def trace(segments: Sequence[RunSegment], order_for: OrderFor, steps: Iterable[int], *,
          rank: int | None = None, deny_for: Callable[[RunSegment], Any] | None = None,
          end_step: int | None = None, max_ids: int = MAX_TRACE_IDS) -> list[TraceStep]:
    """The ids every rank (or only ``rank``) consumed at each of ``steps``.

    ``end_step``: the step the run reached (None: the last segment's end is unknown); each
    :class:`TraceStep` says whether the log shows the run reached it. Steps are taken from
    ``steps`` lazily, and more than ``max_ids`` ids in all, a negative step, a rank outside
    the world size or a step beyond any position raise :class:`AuditRequestError`.
    """
    out = []
    last = segments[-1]
    # One rank's (participant's) share: the largest part when a live step's are uneven.
    per_step = [seg.global_batch if rank is None else -(-seg.global_batch // (readers(seg) or 1))
                for seg in segments]
    if isinstance(steps, range) and steps.step == 1 and len(steps):
        # A range's size is known at once: refused before any step is computed.
        starts = [seg.first_step for seg in segments] + [max(steps.stop, last.first_step)]
        total = sum(max(0, min(steps.stop, starts[k + 1]) - max(steps.start, starts[k]))
                    * per_step[k] for k in range(len(segments)))
        if total > max_ids:
            raise AuditRequestError(
                f"steps [{steps.start}, {steps.stop}) hold {total} ids, more than {max_ids}; "
                "ask for fewer steps" + ("" if rank is not None else " or one --rank"))
    total = 0
    for s in steps:
        if s < 0:
            raise AuditRequestError(f"step must be >= 0, got {s}")
        seg = segment_at(segments, s)
        if seg.cursor_at(s) + seg.global_batch > MAX_POSITION:
            raise AuditRequestError(f"step {s} would start at position {seg.cursor_at(s)} "
                                    f"(line {seg.line}), beyond 2**62 that no run reaches")
        if rank is not None:
            _check_rank(seg, s, rank)
        total += per_step[segments.index(seg)]
        if total > max_ids:
            raise AuditRequestError(
                f"the steps asked for hold more than {max_ids} ids (step {s}: global batch "
                f"{seg.global_batch} over {seg.world_size} ranks); ask for fewer steps"
                + ("" if rank is not None else " or one --rank"))
        order = order_for(seg)
        parts = rank_positions(seg, order, s, rank)
        ids = [order.sample_at(p) for p in parts]
        deny = deny_for(seg) if deny_for is not None else None
        masked = None if deny is None else [deny.masked(i).tolist() for i in ids]
        # Each id as (source, the source's own id); one dataset's have no source index.
        split = [order.split_ids(i) for i in ids]
        names = order.source_names
        sources = (None if split[0][0] is None else
                   [[names[k] for k in src.tolist()] for src, _ in split])
        ids = [local for _, local in split]
        reached = (s < end_step) if end_step is not None else seg is not last
        out.append(TraceStep(s, seg.cursor_at(s), seg.global_batch, readers(seg), seg.line,
                             [i.tolist() for i in ids], masked, sources, reached, seg.live))
    return out


def _check_rank(seg: RunSegment, step: int, rank: int) -> None:
    """Refuse a rank (a live step's participant) ``seg`` does not have at ``step``."""
    n = readers(seg)
    if n is None:
        raise AuditRequestError(f"step {step} is live and its log line {seg.line} does not "
                                "record its participants; leave out --rank")
    if not 0 <= rank < n:
        what = f"the {n} participants" if seg.live else f"world size {n}"
        raise AuditRequestError(f"rank {rank} is outside {what} at step {step} (line "
                                f"{seg.line})")


def where(order, ids: Sequence[int], epochs: Iterable[int], *,
          segments: Sequence[RunSegment] | None = None, order_for: OrderFor | None = None,
          end_step: int | None = None, source: int | None = None) -> list[dict[str, Any]]:
    """Per id and epoch: its position in the epoch and global position ``epoch*N + q``;
    with ``segments``, the step and rank that consumed it (an empty list when the run had
    not reached it, two entries when segments read it twice); of a live segment, the
    step's ``participant`` instead of ``rank`` (None: its line does not record them).

    For a mixture's order, ``ids`` are source ``source``'s own ids and ``epochs`` that
    source's epochs: ``source_position`` is the position in the source's own stream, and
    ``global_position`` the mixture position the schedule gives it (-1: never reached).

    >>> import numpy as np
    >>> from zephon_store.order import Order, OrderOptions
    >>> o = Order(np.array([5, 5]), OrderOptions(seed=1))
    >>> [(w["epoch"], o.sample_at(w["global_position"]).item()) for w in where(o, [7], [0, 3])]
    [(0, 7), (3, 7)]
    """
    ids_arr = np.asarray(list(ids), dtype=np.int64)
    k = _source_of(order, source)
    name = order.source_names[k]
    inner = order.source_orders[k]
    n = int(inner.num_samples)
    # Epochs are taken lazily: a range of 10**12 epochs is refused, never listed.
    room = MAX_WHERE_ANSWERS // max(1, ids_arr.size)
    eps_list = list(itertools.islice(epochs, room + 1))
    if len(eps_list) > room:
        raise AuditRequestError(f"{ids_arr.size} ids over more than {room} epochs is more "
                                f"than {MAX_WHERE_ANSWERS} answers; ask for fewer epochs")
    if eps_list and (min(eps_list) < 0 or (max(eps_list) + 1) * n > MAX_POSITION):
        raise AuditRequestError(f"epochs must lie in [0, {MAX_POSITION // n}) (positions "
                                f"below 2**62 that a run can reach), got {max(eps_list)}")
    eps = np.asarray(eps_list, dtype=np.int64)
    grid_ids, grid_ep = np.meshgrid(ids_arr, eps, indexing="ij")
    pos = inner.positions_of(grid_ids, grid_ep)
    spans = segment_steps(segments, end_step) if segments else []
    out = []
    for i, sid in enumerate(ids_arr.tolist()):
        for j, e in enumerate(eps.tolist()):
            p = int(pos[i, j])
            rec: dict[str, Any] = {"id": sid, "epoch": e, "position": p - e * n,
                                   "global_position": p}
            if name is not None:
                # A named source's own stream position, and the position that reads it.
                rec["source"] = name
                rec["source_position"] = p
                rec["global_position"] = int(order.stream_position(k, np.array([p]))[0])
            if segments:
                rec["consumed"] = _consumed_at(spans, order_for, sid, e, end_step, source)
            out.append(rec)
    return out


def _source_of(order, source: int | None) -> int:
    """The index of the source ``source`` names in ``order``'s per-source view: the only
    one when that one is unnamed (one dataset), else ``source``, which must be given."""
    if order.source_names[0] is None:
        return 0
    if source is None:
        raise ValueError("a mixture's ids belong to a source: pass source=")
    return source


def _position_in(order, sid: int, epoch: int, source: int | None) -> int:
    """The position of ``sid`` in ``epoch`` of source ``source``'s own stream (one
    dataset: its own), as the position that reads it."""
    k = _source_of(order, source)
    p = int(order.source_orders[k].positions_of(np.array([sid]), epoch)[0])
    return int(order.stream_position(k, np.array([p]))[0])


def _consumed_at(spans, order_for, sid: int, epoch: int, end_step,
                 source: int | None = None) -> list[dict]:
    hits = []
    for k, (seg, a, b) in enumerate(spans):
        open_end = k == len(spans) - 1 and end_step is None
        order = order_for(seg)
        p = _position_in(order, sid, epoch, source)
        if p < 0:
            continue
        lo = seg.cursor_at(a)
        hi = None if open_end else seg.cursor_at(b)
        if p < lo or (hi is not None and p >= hi):
            continue
        step = seg.first_step + (p - seg.cursor) // seg.global_batch
        c = seg.cursor_at(step)
        r = int(step_readers(seg, order, c)[p - c])
        # A live step is read by participants, named when the log records their count.
        who = ({"participant": None if readers(seg) is None else r} if seg.live
               else {"rank": r})
        hits.append({"step": step, **who, "line": seg.line, "position": p,
                     "reached": not open_end})
    return hits


# --------------------------------------------------------------------------- observed ids


@dataclass(frozen=True)
class ConsumedStep:
    """One global step as the job consumed it: the cursor before it, its global batch and
    world size, and ``ids[rank]``, the sample ids rank ``rank`` got, in its order;
    ``ranks_per_node`` as the job's loader had it (the rank rule groups ranks by node)."""

    cursor: int
    global_batch: int
    world_size: int
    ids: Sequence[Sequence[int]]
    ranks_per_node: int = 1


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
    """Compare ids a job logged per step and rank with the stream its order defines.

    ``order`` gives the epoch size, the lane count of the rank rule and, unless
    ``reference`` is passed (the ids at positions ``[0, total)``, e.g. from an
    uninterrupted single-process run), the reference itself. ``start`` is the cursor the
    job began at. Per step, the multiset of ids over the ranks must equal the reference's;
    the cursors must chain; over the job no id repeats or drops; and each complete epoch
    holds each id exactly once (counted by :class:`Exposures`, as :func:`audit_run` does).

    >>> from zephon_store.order import OrderOptions
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
    exposures = Exposures(n)
    for s in steps:
        c, b = s.cursor, s.global_batch
        got = Counter(int(i) for ids in s.ids for i in ids)
        consumed += got
        if got != Counter(reference[c:c + b]):
            mismatched.append(c)
        for rank, ids in enumerate(s.ids):
            pos = positions_for_rank(c, b, s.world_size, rank, lanes=lanes, epoch_size=n,
                                     ranks_per_node=s.ranks_per_node)
            k = min(pos.size, len(ids))
            exposures.add(pos[:k], np.asarray(list(ids)[:k], dtype=np.int64))
    want = Counter(reference[start:total])

    complete = range(-(-start // n), total // n)
    bad = [epoch for epoch in complete if not exposures.close(epoch).ok]
    return AuditReport(
        steps=len(steps), samples=sum(consumed.values()), expected_samples=total - start,
        mismatched_steps=len(mismatched),
        first_mismatch_cursor=mismatched[0] if mismatched else None,
        repeats=sum((consumed - want).values()), drops=sum((want - consumed).values()),
        gaps=gaps, overlaps=overlaps,
        epochs_crossed=(total - 1) // n - start // n if total > start else 0,
        complete_epochs_checked=len(complete), complete_epochs_bad=tuple(bad))
