"""The per-step account: how long the training loop waited in ``next()`` for each step, and
why, plus this rank's counters; the stall forecast's warning; the run's step log.

:class:`StepAccount` is owned by the :class:`~zephon_store.load.loader.Loader` (so every
front end has it) and wraps each ``next()`` of its batches. The wait is measured where the
loop waits, in the loop's thread (not in a worker: a worker's own time says nothing about
whether the loop waited for it). It is then split by cause:

- made in this process (threads): the causes this thread ran itself (a decode, a transform,
  the collation) and those of the jobs it waited for (a pool thread's decode, a prefetch
  thread's fetch), each in that job's proportions (:mod:`.causes`);
- made by a worker process: the worker sends its account of the batch with it (a
  :class:`Note`: its causes and when the batch was ready); the part of the wait before the
  batch was ready is split in the worker's proportions, the rest is ``handover`` (the
  batch in the queue and being unpickled). The note also carries the worker's counters
  since its previous note, so this process's counters are the rank's.

:meth:`StepAccount.stats` is a flat dict of numbers, for ``wandb.log(loader.stats())`` or a
``SummaryWriter`` loop.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
import time
from collections import deque
from time import perf_counter
from typing import NamedTuple

from . import causes
from .causes import CAUSES, Tally
from .profile import recording
from .stall import Stall, stall_message

__all__ = ["Note", "StepAccount", "note_for", "with_notes"]

log = logging.getLogger("zephon_store")

# Steps between two looks at the coming steps' bytes (the forecast reads the cache's index).
FORECAST_EVERY = 4
# Steps of the loop's own pace whose median is its time per step: few, so that a loop that
# speeds up is seen before the lead it had runs out.
PACE_STEPS = 4
# Per-step records buffered before a step-log line is written.
STEP_LOG_LINES = 50
_COLLATE, _OTHER = CAUSES.index("collate"), CAUSES.index("other")
_HANDOVER = CAUSES.index("handover")
_TORCH = "torch"   # profiler ranges only once torch is imported (observe/profile.py)


class Note(NamedTuple):
    """A worker process's account of one batch, sent with it across the hand-over as a
    plain tuple (:meth:`pack`: a NamedTuple pickles by reference to its class, and a batch
    of a few small documents pays for every microsecond)."""

    worker: int
    seconds: tuple          # its causes, in CAUSES order
    ready: float            # time.time() when the batch left the worker's code
    counts: dict            # its counters since its previous note (gauges that changed)

    def pack(self) -> tuple:
        """``(worker, bytes, counts or None)``: the causes and ``ready`` as 11 doubles."""
        return (self.worker, _NOTE.pack(*self.seconds, self.ready), self.counts or None)

    @classmethod
    def unpack(cls, packed: tuple) -> Note:
        """The note :meth:`pack` made."""
        worker, raw, counts = packed
        *seconds, ready = _NOTE.unpack(raw)
        return cls(worker, tuple(seconds), ready, counts or {})


_NOTE = struct.Struct(f"<{len(CAUSES) + 1}d")


def with_notes(items, worker: int):
    """``(i, batch, note)`` for each ``(i, batch)`` of ``items``, made in worker process
    ``worker`` (the note :meth:`Note.pack`-ed): what :class:`StepAccount` needs from the
    other side of the hand-over."""
    last = causes.counters()
    it = iter(items)
    while True:
        with causes.collect() as tally:
            try:
                i, batch = next(it)
            except StopIteration:
                return
        now = causes.counters()
        yield i, batch, Note(worker, tuple(tally.seconds), time.time(),
                             note_for(last, now)).pack()
        last = now


def note_for(before: dict, after: dict) -> dict:
    """The counters that changed from ``before`` to ``after`` (a gauge: its new value)."""
    out = {}
    for k, v in after.items():
        if v != before.get(k, 0):
            out[k] = v if k.startswith("gauge.") else v - before.get(k, 0)
    return out


class StepAccount:
    """This rank's account of its steps (see the module docstring).

    ``rank``: this process's rank (for the step log); ``step_log``: a JSONL file this rank
    appends its steps to (None: none); ``forecast``: a callable ``(step) -> (need, lead,
    budget)`` giving the bytes each coming step must fetch, or None (no warning);
    ``horizon``: steps the forecast looks ahead.
    """

    def __init__(self, *, rank: int = 0, step_log: str | None = None, forecast=None,
                 horizon: int = 32) -> None:
        self.rank = rank
        self.step_log = step_log
        self.forecast = forecast
        self.horizon = horizon
        self._base = causes.counters()
        self._workers: dict[str, float] = {}
        self._worker_rates: dict[int, list[float]] = {}
        # The causes of every step so far, added up in place: this thread's tally while a
        # next() runs (causes.activate), so a step costs a copy of its ten numbers, not a
        # tally of its own (docs/benchmarks.md, "The per-step account").
        self.total = Tally()
        self._before: list[float] = self.total.seconds[:]   # the total before the last step
        self.last_wait = 0.0
        self.wait_total = 0.0
        self.steps = 0
        self.step = 0
        self._pace: deque[float] = deque(maxlen=PACE_STEPS)
        self._handed_at = 0.0
        self._lines: list[tuple[int, float, tuple]] = []
        self.warned: Stall | None = None

    # -- one step ------------------------------------------------------------------------
    def next(self, it, step: int, collate=None):
        """``next(it)``'s ``(i, batch)``, the batch collated by ``collate``, with the wait
        accounted as global step ``step``; StopIteration at the end."""
        # Per step: two clock reads, a copy of ten numbers and this thread's tally swapped
        # in and out; the split is computed when asked (stats(), the step log).
        t0 = perf_counter()
        if self._handed_at:
            self._pace.append(t0 - self._handed_at)   # the loop's own time on the last step
        total = self.total
        before = total.seconds[:]
        local = causes._local
        saved = local.__dict__.get("tally"), local.__dict__.get("frames")
        local.tally, local.frames = total, []
        try:
            record = recording() if _TORCH in sys.modules else None
            if record is None:
                item = next(it)
            else:
                with record(f"zephon: waiting for step {step}"):
                    item = next(it)
            if collate is not None:
                with causes.timed("collate"):
                    item = (item[0], collate(item[1])) + tuple(item[2:])
        finally:
            local.tally, local.frames = saved
        now = perf_counter()
        wait = now - t0
        if len(item) == 3:
            self._across(Note.unpack(item[2]), before, time.time() - wait, wait)
        self.step, self.last_wait, self._before = step, wait, before
        self.steps += 1
        self.wait_total += wait
        if self.step_log is not None or (self.forecast is not None and self.warned is None
                                         and not self.steps % FORECAST_EVERY):
            self._record(step, wait, before)
        self._handed_at = now
        return item[0], item[1]

    def _across(self, note: Note, before: list[float], called: float, wait: float) -> None:
        """A batch a worker made: the wait until it was ready counts in the worker's
        proportions, the rest as hand-over (this thread's own causes of the step, the
        collation, are kept; what it spent inside the DataLoader is that hand-over)."""
        seconds = self.total.seconds
        collate = seconds[_COLLATE] - before[_COLLATE]
        seconds[:] = before
        seconds[_COLLATE] += collate
        waited = max(0.0, wait - collate)
        made = min(waited, max(0.0, note.ready - called))
        spent = sum(note.seconds)
        if spent > 0:
            scale = made / spent
            for k, v in enumerate(note.seconds):
                if v:
                    seconds[k] += v * scale
        else:
            seconds[_OTHER] += made
        seconds[_HANDOVER] += waited - made
        if note.counts:
            self._add_counts(note)

    def _add_counts(self, note: Note) -> None:
        """A worker's counters since its last note, added to the rank's."""
        for k, v in note.counts.items():
            if k.startswith("gauge."):
                self._workers[k] = v
            else:
                self._workers[k] = self._workers.get(k, 0) + v
        rate = self._worker_rates.setdefault(note.worker, [0.0, 0.0])
        rate[0] += note.counts.get("bytes.get_range", 0) + note.counts.get("bytes.get", 0)
        rate[1] += note.counts.get("fetch_busy_s", 0)

    def _record(self, step: int, wait: float, before: list[float]) -> None:
        """The step log's line and the forecast, when either is due."""
        if self.step_log is not None:
            self._lines.append((step, wait, tuple(self._split(wait, before))))
            if len(self._lines) >= STEP_LOG_LINES:
                self.flush()
        if (self.forecast is not None and self.warned is None
                and self.steps % FORECAST_EVERY == 0 and len(self._pace) >= 2):
            self._look_ahead(step)

    def _split(self, wait: float, before: list[float]) -> list[float]:
        """The last step's seconds by cause: what the total gained, and the rest of its wait
        as ``other`` (planning and cutting batches: no mark covers it)."""
        got = [a - b for a, b in zip(self.total.seconds, before)]
        got[_OTHER] += max(0.0, wait - sum(got))
        return got

    # -- the forecast --------------------------------------------------------------------
    def fetch_rate(self) -> float:
        """Bytes per second storage delivered while this rank had requests on the wire
        (its worker processes' rates summed); 0 before any fetch."""
        c = self._local()
        rate = 0.0
        busy = c.get("fetch_busy_s", 0)
        if busy > 0:
            rate += (c.get("bytes.get_range", 0) + c.get("bytes.get", 0)) / busy
        for got, busy in self._worker_rates.values():
            if busy > 0:
                rate += got / busy
        return rate

    def _look_ahead(self, step: int) -> None:
        rate = self.fetch_rate()
        if rate <= 0:
            return
        need, lead, budget = self.forecast(step + 1, self.horizon)
        pace = sorted(self._pace)[len(self._pace) // 2]   # the median: robust to one hiccup
        stall = Stall.first(need, rate=rate, step_s=pace, budget=budget, start_step=step + 1,
                            lead_bytes=lead)
        if stall is not None:
            self.warned = stall
            log.warning(stall_message(stall))

    # -- what users read -----------------------------------------------------------------
    def _local(self) -> dict:
        now = causes.counters()
        return {k: (v if k.startswith("gauge.") else v - self._base.get(k, 0))
                for k, v in now.items()}

    def counters(self) -> dict[str, float]:
        """This rank's counters since the loader began: this process's and its workers'."""
        out = self._local()
        for k, v in self._workers.items():
            out[k] = v if k.startswith("gauge.") else out.get(k, 0) + v
        return {k.removeprefix("gauge."): v for k, v in out.items()}

    def stats(self) -> dict[str, float]:
        """A snapshot, flat and numeric: ``step``, ``wait_s`` (the last step's wait) and
        ``wait_s/CAUSE``, ``wait_total_s`` and ``wait_total_s/CAUSE`` (all steps so far),
        and the counters (``requests.get_range``, ``bytes.get_range``, ``retries``,
        ``refusals``, ``cache_hits``, ``decoded_cache_hits``, ``prefetch_lead_steps``, ...).

        >>> acct = StepAccount()
        >>> {"step", "steps", "wait_s", "wait_total_s/fetch", "fetch_MBps"} <= set(acct.stats())
        True
        """
        out: dict[str, float] = {"step": self.step, "steps": self.steps,
                                 "wait_s": self.last_wait, "wait_total_s": self.wait_total}
        last = self._split(self.last_wait, self._before)
        totals = self.total.seconds[:]
        # Each step's rest is "other"; the total's is what the marks did not cover.
        totals[_OTHER] += max(0.0, self.wait_total - sum(totals))
        for c, one, every in zip(CAUSES, last, totals):
            out[f"wait_s/{c}"] = one
            out[f"wait_total_s/{c}"] = every
        out.update(self.counters())
        out["fetch_MBps"] = self.fetch_rate() / 1e6
        return out

    def flush(self) -> None:
        """Append the buffered steps to the step log, one compact line (milliseconds)."""
        lines, self._lines = self._lines, []
        if not lines or self.step_log is None:
            return
        rec = {"kind": "zephon-steps", "version": 1, "rank": self.rank,
               "causes": list(CAUSES),
               "steps": [[s, round(w * 1e3, 2), [round(x * 1e3, 2) for x in t]]
                         for s, w, t in lines]}
        parent = os.path.dirname(os.path.abspath(self.step_log))
        os.makedirs(parent, exist_ok=True)
        with open(self.step_log, "a") as f:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
