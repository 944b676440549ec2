"""Prefetch row groups of the positions a rank will read next.

The order is known in advance, so prefetching is planned, not guessed: the row groups of the
next steps are fetched into the node-local disk cache by a small thread pool, up to a byte
budget of not-yet-consumed data, and the cache is told the upcoming key sequence so its
eviction spares what is needed soonest. Only remote datasets (with a disk cache) prefetch;
local shards are read in place.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

DEFAULT_PREFETCH_BYTES = 64 << 20
_PLAN_EVERY = 32        # steps between publishing the cache's future plan
_PLAN_STEPS = 256       # steps of future row groups in that plan
# Steps planned ahead at most. Steps whose row groups were all planned already add no bytes,
# so without a horizon an endless stream over a dataset smaller than the budget (or any
# dataset once every row group was seen) planned forever and the first batch never came.
_MAX_AHEAD_STEPS = _PLAN_STEPS
# Local datasets: row groups decoded ahead into the reader's decode cache, by the pool's
# threads, so a second core decodes while the batch threads wait on the current one (a
# sequential batch of token windows is a quarter of a row group, so the batch threads alone
# never decode two row groups at once).
DECODE_AHEAD_ROW_GROUPS = 4


class Prefetcher:
    """Keeps up to ``budget_bytes`` of upcoming row groups fetched ahead of consumption.

    ``step_row_groups(i)`` returns the row groups local batch ``i`` reads, in order.
    Call :meth:`consumed` with the index of each batch as it is handed out.
    """

    def __init__(self, dataset, step_row_groups, *, budget_bytes: int = DEFAULT_PREFETCH_BYTES,
                 threads: int = 4, num_batches: int | None = None) -> None:
        self.dataset = dataset
        self.step_row_groups = step_row_groups
        self.budget = budget_bytes
        self.num_batches = num_batches
        # Remote (a disk cache): fetch bytes into the cache, up to budget_bytes. Local: decode
        # up to DECODE_AHEAD_ROW_GROUPS row groups ahead (their bytes are in place already).
        self.fetch = dataset.cache is not None
        if not self.fetch:
            self.budget = DECODE_AHEAD_ROW_GROUPS if budget_bytes > 0 else 0
        self.enabled = self.budget > 0
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="zephon-prefetch") \
            if self.enabled else None
        self._ahead: OrderedDict[int, int] = OrderedDict()   # step -> bytes planned for it
        self._seen: set[int] = set()
        self._decoding: dict[int, Future] = {}
        self._next = 0
        self._lock = threading.Lock()
        self.started = 0

    def consumed(self, i: int) -> None:
        if not self.enabled:
            return
        with self._lock:
            for step in [s for s in self._ahead if s <= i]:
                del self._ahead[step]
            for rg in [r for r, f in self._decoding.items() if f.done()]:
                del self._decoding[rg]
            self._next = max(self._next, i + 1)
            while (sum(self._ahead.values()) < self.budget
                   and self._next <= i + _MAX_AHEAD_STEPS
                   and (self.num_batches is None or self._next < self.num_batches)):
                self._ahead[self._next] = self._plan_step(self._next)
                self._next += 1
            if self.fetch and i % _PLAN_EVERY == 0:
                self._publish_plan(i + 1)

    def _plan_step(self, step: int) -> int:
        m = self.dataset.manifest
        total = 0
        for rg in self.step_row_groups(step):
            rg = int(rg)
            if not self.fetch:
                # Decoded row groups leave the decode cache again, so "planned once" is not
                # "available": ask the reader, and count only the decodes started here.
                fut = self._decoding.get(rg)
                if (fut is not None and not fut.done()) or self.dataset.has_decoded(rg):
                    continue
                self._decoding[rg] = self._pool.submit(self.dataset.read_row_group, rg)
                total += 1
                self.started += 1
                continue
            if rg in self._seen:
                continue
            self._seen.add(rg)
            if len(self._seen) > 65536:  # forget old ones; a re-plan only costs a cache hit
                self._seen.clear()
            total += int(m.rg_length[rg])
            self._pool.submit(self.dataset.fetch_row_group_bytes, rg)
            self.started += 1
        return total

    def _publish_plan(self, first_step: int) -> None:
        m = self.dataset.manifest
        last = first_step + _PLAN_STEPS
        if self.num_batches is not None:
            last = min(last, self.num_batches)
        rgs = [self.step_row_groups(s) for s in range(first_step, last)]
        if rgs:
            order = np.concatenate(rgs)
            self.dataset.cache.set_future(m.rg_xxh3(int(r)) for r in order)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
