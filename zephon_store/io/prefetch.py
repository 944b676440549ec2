"""Prefetch row groups of the positions a rank will read next.

The order is known in advance, so prefetching is planned, not guessed: the row groups of the
next steps are fetched into the node-local disk cache by a small thread pool, up to a byte
budget of not-yet-consumed data, and the cache is told the upcoming key sequence so its
eviction spares what is needed soonest. Only remote datasets (with a disk cache) prefetch;
local shards are read in place (decoding ahead is the loader's pipeline,
:mod:`zephon_store.load.pipeline`, for both).

Remote row groups are not fetched one GET each: the queued ones are collected until about
one range's worth (``CoalesceOptions.max_bytes``, at most a quarter of the budget) is pending,
then neighbours in a shard are merged into multi-MiB ranged GETs (:mod:`.coalesce`) that run
``threads`` at a time.

The start: the first step's row groups are queued as soon as the prefetcher exists, in
ranges of their own, and run at once. The rest of the budget is queued then too, but its
ranges are *held* until the first batch has been handed out (the first :meth:`consumed`):
before that they only competed with the first step's requests, for the node's cores, its
connections and, on a throttled store, its request rate (the start benchmark's 8 ranks x 2
workers, docs/benchmarks_start.md). A held range is still known to the readers: one that
needs its row groups early runs it in its own thread, as one coalesced GET. After the first
batch, the later steps' ranges run as :func:`~.throttle.background` requests, which take
only the idle send slots while the node is paced, so the requests a batch waits for go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..observe import causes
from .cache import ChunkCache
from .coalesce import RangeFetcher
from .throttle import background

DEFAULT_PREFETCH_BYTES = 64 << 20
_PLAN_EVERY = 32        # steps between publishing the cache's future plan
_PLAN_STEPS = 256       # steps of future row groups in that plan
# Steps queued ahead at most. Steps whose row groups were all queued already add no bytes,
# so without a horizon an endless stream over a dataset smaller than the budget (or any
# dataset once every row group was seen) queued forever and the first batch never came.
_MAX_AHEAD_STEPS = _PLAN_STEPS


class Prefetcher:
    """Keeps up to ``budget_bytes`` of upcoming row groups fetched ahead of consumption.

    ``step_row_groups(i)`` returns the row groups local batch ``i`` reads, in order.
    Call :meth:`consumed` with the index of each batch as it is handed out. ``ranges`` (the
    dataset's :class:`~zephon_store.io.coalesce.RangeFetcher`, whose options set the size of
    the ranged GETs) fetches them into ``cache``, which is also told the upcoming keys; with
    ``ranges=None`` (local shards, read in place) the prefetcher does nothing.

    Threads: the prefetcher makes its own pool of ``threads`` (the ranged GETs in flight)
    and :meth:`close` shuts it down; its owner (the loader, or
    :meth:`zephon_store.read.rowgroups.RowGroups.close`) calls that.
    """

    def __init__(self, manifest, step_row_groups, *, ranges: RangeFetcher | None,
                 cache: ChunkCache | None, budget_bytes: int = DEFAULT_PREFETCH_BYTES,
                 threads: int = 4, num_batches: int | None = None) -> None:
        self.manifest = manifest
        self.step_row_groups = step_row_groups
        self.cache = cache
        self.budget = budget_bytes
        self.num_batches = num_batches
        self.enabled = ranges is not None and self.budget > 0
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="zephon-prefetch") \
            if self.enabled else None
        self._ahead: OrderedDict[int, int] = OrderedDict()   # step -> bytes queued for it
        # step -> its row groups, for steps not consumed yet: the plan published every
        # _PLAN_EVERY steps covers _PLAN_STEPS steps, so without this every step's row
        # groups were computed once per plan covering it.
        self._rgs: dict[int, np.ndarray] = {}
        self._seen: set[int] = set()
        self._next = 0
        self._lock = threading.Lock()
        if self.enabled:
            self._init_ranges(ranges)

    # -- remote: coalesced ranges ----------------------------------------------------------

    def _init_ranges(self, ranges: RangeFetcher) -> None:
        self._ranges = ranges
        self._ranges.hold(self.budget)    # fetched bytes wait in memory for their reader
        # Queued row groups not yet submitted -> the step that reads them (soonest first).
        self._pending: dict[int, int] = {}
        self._pending_bytes = 0
        self._futures: list[Future] = []
        self._executor = self._pool        # the first step's ranges run at once
        self._later = _HeldUntilFirstBatch(self._pool)
        max_bytes = ranges.options.max_bytes
        self._max_range = max_bytes
        # At least four ranges fit in the budget, so that many GETs can be in flight.
        self._flush_bytes = max(1, min(max_bytes, self.budget // 4))
        if self.num_batches is None or self.num_batches > 0:
            # Queue the whole budget now, not at the first consumed(): readers (the loader's
            # decode-ahead) ask for row groups before the first batch is handed out, and one
            # that no range holds yet is fetched alone. Step 0 goes first, in ranges of its
            # own, so the first batch waits for its own row groups only.
            with self._lock:
                self._ahead[0] = self._queue_step(0)
                self._next = 1
                self._flush(final=True)
                self._executor = self._later   # the later steps' ranges: held, see above
            self.consumed(-1)

    def _flush(self, *, final: bool) -> None:
        """Submit the pending row groups as coalesced ranges (call with ``_lock`` held).

        Unless ``final``, a short last range stays pending to grow with the next steps:
        sequential reads would otherwise split every range in a full one and a stub.
        """
        if not self._pending:
            return
        ranges = self._ranges.coalesce(self._pending)
        keep: dict[int, int] = {}
        if not final and len(ranges) > 1 and ranges[-1].nbytes < self._max_range // 2:
            keep = {rg: self._pending[rg] for rg in ranges.pop().row_groups}
        self._futures = [f for f in self._futures if not f.done()]
        self._futures += self._ranges.submit(ranges, self._executor)
        m = self.manifest
        self._pending = keep
        self._pending_bytes = sum(int(m.rg_length_hint(rg)) for rg in keep)

    def _step_rgs(self, step: int) -> np.ndarray:
        got = self._rgs.get(step)
        if got is None:
            got = self._rgs[step] = np.asarray(self.step_row_groups(step), dtype=np.int64)
        return got

    def consumed(self, i: int) -> None:
        """Batch ``i`` of this share was handed out (``-1``: none yet): queue ahead up to
        the budget; the first call with ``i >= 0`` also releases the held ranges."""
        if not self.enabled:
            return
        if i >= 0:
            self._later.release()
        with self._lock:
            for step in [s for s in self._ahead if s <= i]:
                del self._ahead[step]
            if i % _PLAN_EVERY == 0:
                for step in [s for s in self._rgs if s <= i]:
                    del self._rgs[step]
            self._next = max(self._next, i + 1)
            while (sum(self._ahead.values()) < self.budget
                   and self._next <= i + _MAX_AHEAD_STEPS
                   and (self.num_batches is None or self._next < self.num_batches)):
                self._ahead[self._next] = self._queue_step(self._next)
                self._next += 1
            causes.gauge("prefetch_lead_steps", self._next - i - 1)
            # Wait for a range's worth unless queueing reached the end of the stream or
            # the pending row groups are about to be read. (Stopping at the horizon is no
            # reason: over a small dataset that would submit every new step alone.)
            end = self.num_batches is not None and self._next >= self.num_batches
            if end or min(self._pending.values(), default=i + 3) <= i + 2:
                self._flush(final=True)
            elif self._pending_bytes >= self._flush_bytes:
                self._flush(final=False)
            if i % _PLAN_EVERY == 0:
                self._publish_plan(i + 1)

    def _queue_step(self, step: int) -> int:
        m = self.manifest
        total = 0
        for rg in self._step_rgs(step).tolist():
            if rg in self._seen:
                continue
            self._seen.add(rg)
            if len(self._seen) > 65536:  # forget old ones; a re-queued one only costs a cache hit
                self._seen.clear()
            # A hint, exact where known: format v4 fetches a row group's byte range with its
            # chunk, which the flush does for every pending row group at once.
            nbytes = int(m.rg_length_hint(rg))
            total += nbytes
            self._pending[rg] = step
            self._pending_bytes += nbytes
        return total

    def _publish_plan(self, first_step: int) -> None:
        m = self.manifest
        last = first_step + _PLAN_STEPS
        if self.num_batches is not None:
            last = min(last, self.num_batches)
        rgs = [self._step_rgs(s) for s in range(first_step, last)]
        if rgs:
            order = dict.fromkeys(np.concatenate(rgs).tolist())   # soonest use first, once
            # Only hashes known without a fetch: planning must not fetch v4 chunks the
            # prefetcher has not needed yet (a row group not fetched is not in the cache).
            self.cache.set_future(k for k in map(m.known_rg_xxh3, order) if k is not None)

    def close(self) -> None:
        """Stop prefetching: queued work is dropped (readers then fetch what they need)."""
        for fut in getattr(self, "_futures", ()):
            fut.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class _HeldUntilFirstBatch:
    """The executor of the later steps' ranges: holds what it is given until
    :meth:`release`, then runs it, and everything given after, on ``pool`` as
    :func:`~.throttle.background` work. (A held range's task can still be run by a reader
    that needs it: :meth:`RangeFetcher.take <.coalesce.RangeFetcher.take>`.)"""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._held: list | None = []    # None once released
        self._lock = threading.Lock()

    def submit(self, fn) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(fn)
                return
        self._pool.submit(_in_background, fn)   # RuntimeError after close: see submit()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, None
        for fn in held or ():
            try:
                self._pool.submit(_in_background, fn)
            except RuntimeError:   # closed meanwhile: readers run what they need
                return


def _in_background(fn) -> None:
    with background():
        fn()
