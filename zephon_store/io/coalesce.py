"""Coalesce row groups into multi-MiB ranged GETs, verify and cache them, split per row group.

One ranged GET per row group (a few hundred KB) leaves an object store idle between requests
and pays its per-request cost (signing, a round trip, the server's lookup) hundreds of times
per shard. The prefetcher knows which row groups come next, so neighbours in the same shard
are read as one range of up to ``max_bytes`` (small gaps between them are read and dropped),
then split and each row group checked against its own xxh3 before it reaches the disk cache.

The grouping is a pure function, :func:`coalesce_ranges`; :class:`RangeFetcher` runs the ranges
(several GETs in flight on the prefetcher's threads) and lets a reader that needs a row group
now take it from the range being fetched instead of fetching it a second time.

>>> spans = [RowGroupSpan(rg=0, offset=4, length=100, shard=0),
...          RowGroupSpan(rg=1, offset=104, length=100, shard=0),
...          RowGroupSpan(rg=2, offset=4, length=100, shard=1)]
>>> [(r.shard, r.start, r.end, r.row_groups) for r in coalesce_ranges(spans)]
[(0, 4, 204, (0, 1)), (1, 4, 104, (2,))]
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .._util.hashing import xxh3_hex
from ..errors import RetriesExhaustedError
from ..observe import causes
from ..observe.profile import named_range

# 8 MiB ranges, 4 at a time: far fewer requests than one GET per row group (measured in
# docs/benchmarks.md, S3); S3 itself recommends 8-16 MiB ranged GETs.
DEFAULT_MAX_RANGE_BYTES = 8 << 20
# A gap this small costs less to read and drop than a second request (a round trip moves
# far more than this on a LAN); in a shard written by zephon row groups are contiguous anyway.
DEFAULT_MAX_GAP_BYTES = 64 << 10


class RowGroupSpan(NamedTuple):
    """Where global row group ``rg`` lies: ``length`` bytes at ``offset`` of ``shard``."""

    rg: int
    offset: int
    length: int
    shard: int


@dataclass(frozen=True)
class ByteRange:
    """One ranged GET: bytes ``[start, end)`` of ``shard``, holding ``row_groups``."""

    shard: int
    start: int
    end: int
    row_groups: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes the GET transfers (row groups and the gaps between them)."""
        return self.end - self.start


@dataclass(frozen=True)
class CoalesceOptions:
    """How row groups are merged into ranges.

    >>> CoalesceOptions(max_bytes=0)
    Traceback (most recent call last):
    ...
    ValueError: max_bytes must be > 0, got 0
    """

    max_bytes: int = DEFAULT_MAX_RANGE_BYTES
    max_gap: int = DEFAULT_MAX_GAP_BYTES

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {self.max_bytes}")
        if self.max_gap < 0:
            raise ValueError(f"max_gap must be >= 0, got {self.max_gap}")


def coalesce_ranges(spans: Iterable[RowGroupSpan], *, max_bytes: int = DEFAULT_MAX_RANGE_BYTES,
                max_gap: int = DEFAULT_MAX_GAP_BYTES) -> list[ByteRange]:
    """Group row groups into ranged GETs.

    Each row group lands in exactly one range (repeats in ``spans`` are dropped). A range holds
    row groups of one shard only, neighbours at most ``max_gap`` bytes apart (overlapping ones
    are never merged), and spans at most ``max_bytes`` unless it is a single larger row group.
    Ranges come in the order their first row group appears in ``spans``, so the one needed
    soonest is fetched first.

    >>> [r.row_groups for r in coalesce_ranges([RowGroupSpan(0, 0, 10, 0), RowGroupSpan(1, 20, 10, 0)],
    ...                                    max_gap=5)]
    [(0,), (1,)]
    """
    first_seen: dict[int, int] = {}
    unique: list[RowGroupSpan] = []
    for span in spans:
        if span.rg not in first_seen:
            first_seen[span.rg] = len(unique)
            unique.append(span)
    unique.sort(key=lambda s: (s.shard, s.offset, s.rg))
    groups: list[list[RowGroupSpan]] = []
    end = 0
    for span in unique:
        cur = groups[-1] if groups else None
        if (cur is not None and span.shard == cur[0].shard
                and end <= span.offset <= end + max_gap
                and span.offset + span.length - cur[0].offset <= max_bytes):
            cur.append(span)
        else:
            groups.append([span])
        end = span.offset + span.length
    ranges = [(min(first_seen[s.rg] for s in g),
               ByteRange(g[0].shard, g[0].offset, g[-1].offset + g[-1].length,
                         tuple(s.rg for s in g)))
              for g in groups]
    ranges.sort(key=lambda t: t[0])
    return [r for _, r in ranges]


def _range_name(manifest, r: ByteRange) -> str:
    """A profiler range's name for the ranged GET ``r``: its shard and row groups."""
    first, last = manifest.rg_local_index(r.row_groups[0]), manifest.rg_local_index(
        r.row_groups[-1])
    groups = f"row group {first}" if first == last else f"row groups {first}-{last}"
    return f"zephon: shard {manifest.shard_name(r.shard)} {groups} (fetch)"


class _Task:
    """One submitted range: run by whichever comes first, a prefetch thread or a reader."""

    def __init__(self, fn: Callable[[], dict]) -> None:
        self.future: Future = Future()
        self._fn = fn
        self._started = False
        self._lock = threading.Lock()
        self.tally: causes.Tally | None = None   # where its time went (observe/causes.py)

    def run(self) -> None:
        with self._lock:
            if self._started:
                return  # running or done in another thread
            self._started = True
        if not self.future.set_running_or_notify_cancel():
            return  # cancelled before anyone started it
        with causes.collect() as self.tally:
            try:
                result = self._fn()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                self.future.set_exception(exc)
                return
        self.future.set_result(result)

    def result(self) -> dict:
        """Run the task here if nobody started it yet, else wait for it (a wait counted
        in the proportions of the task's own causes: a prefetch thread's fetch)."""
        self.run()
        with causes.waiting_on(lambda: self.tally, "fetch"):
            return self.future.result()


class RangeFetcher:
    """Fetches coalesced ranges of one dataset's shards into a disk cache.

    ``manifest`` says where each row group lies and its xxh3; ``read_range(relpath, start,
    end, *, what)`` returns bytes of a shard (retried; ``what`` labels errors, e.g.
    :meth:`zephon_store.io.storage.Storage.read_range`); ``cache`` receives the verified row
    groups; ``fetch_alone(rg)`` returns one row group's verified bytes by its own request (used
    for a piece of a range that failed its hash); ``on_corrupt(n)`` counts such pieces.

    :meth:`coalesce` groups row groups into ranges, :meth:`submit` runs them on an executor (a
    thread pool); :meth:`take` gives a reader the verified bytes of a row group that a submitted
    range holds, running that range in the caller's thread if no prefetch thread has started
    it yet.

    Across processes of a node the per-key locks of the cache decide who fetches a row group:
    a range fetches only the row groups whose lock it gets at once (others are being fetched
    by someone else, or are cached), so no lock is ever waited for while another is held.

    The verified bytes a range fetched also stay in memory, up to :meth:`hold` bytes (oldest
    dropped first), until :meth:`take` hands them to their reader: without them a reader got
    a prefetched row group back from the disk cache, a file read, a lock and a second hash of
    bytes already checked.
    """

    def __init__(self, manifest, read_range: Callable[..., bytes], cache, *,
                 fetch_alone: Callable[[int], bytes],
                 on_corrupt: Callable[[int], None] | None = None,
                 options: CoalesceOptions | None = None) -> None:
        self.manifest = manifest
        self.cache = cache
        self.options = options or CoalesceOptions()
        self._read_range = read_range
        self._fetch_alone = fetch_alone
        self._on_corrupt = on_corrupt
        self._tasks: dict[int, _Task] = {}   # row group -> the submitted range that holds it
        self._lock = threading.Lock()
        self._held: OrderedDict[int, bytes] = OrderedDict()   # verified, not taken yet
        self._held_bytes = 0
        self._hold_limit = 0
        self.ranges = 0          # ranged GETs issued (counters for tests and benchmarks)
        self.row_groups = 0      # row groups they delivered, verified
        self.refetched = 0       # row groups whose bytes failed their hash in a range

    def hold(self, nbytes: int) -> None:
        """Keep up to ``nbytes`` of fetched row groups in memory for :meth:`take` (the
        largest value asked for wins; a prefetcher asks for its budget)."""
        with self._lock:
            self._hold_limit = max(self._hold_limit, int(nbytes))

    def _keep(self, got: dict[int, bytes]) -> None:
        with self._lock:
            if not self._hold_limit:
                return
            for rg, data in got.items():
                old = self._held.pop(rg, None)
                self._held_bytes += len(data) - (len(old) if old is not None else 0)
                self._held[rg] = data
            while self._held_bytes > self._hold_limit and self._held:
                _, data = self._held.popitem(last=False)
                self._held_bytes -= len(data)

    def _unhold(self, rg: int) -> bytes | None:
        """Drop ``rg``'s held bytes and return them (None if none); call with the lock."""
        held = self._held.pop(rg, None)
        if held is not None:
            self._held_bytes -= len(held)
        return held

    def spans(self, rgs: Iterable[int]) -> list[RowGroupSpan]:
        """The :class:`RowGroupSpan` of each global row group in ``rgs``."""
        m = self.manifest
        # Indexed by the whole array: format v4 fetches the distinct chunks of their
        # byte ranges at once (one round trip), not one after another.
        rgs = np.asarray(list(rgs), dtype=np.int64)
        return [RowGroupSpan(int(r), int(o), int(n), int(s)) for r, o, n, s in
                zip(rgs.tolist(), np.asarray(m.rg_offset[rgs]).tolist(),
                    np.asarray(m.rg_length[rgs]).tolist(), m.rg_shard[rgs].tolist())]

    def coalesce(self, rgs: Iterable[int]) -> list[ByteRange]:
        """:func:`coalesce_ranges` of the row groups ``rgs`` (soonest first) with these options."""
        return coalesce_ranges(self.spans(rgs), max_bytes=self.options.max_bytes,
                           max_gap=self.options.max_gap)

    def submit(self, ranges: Iterable[ByteRange], executor) -> list[Future]:
        """Start ``ranges`` on ``executor``; returns one Future per range
        (cancel one that has not started to drop it)."""
        futures = []
        for r in ranges:
            task = _Task(lambda r=r: self._fetch_range(r))
            futures.append(task.future)
            with self._lock:
                for rg in r.row_groups:
                    self._tasks[rg] = task
            task.future.add_done_callback(lambda _f, r=r, task=task: self._forget(r, task))
            try:
                executor.submit(task.run)
            except RuntimeError:  # executor shut down: readers run the task themselves
                pass
        return futures

    def _forget(self, r: ByteRange, task: _Task) -> None:
        # Once done its row groups are in the cache (or failed): drop the bytes it holds.
        with self._lock:
            for rg in r.row_groups:
                if self._tasks.get(rg) is task:
                    del self._tasks[rg]

    def take(self, rg: int) -> bytes | None:
        """Verified bytes of ``rg`` from its submitted range, or None (not submitted, cached
        meanwhile, fetched by another process, or the range failed: fetch it alone).

        Raises the row group's own error (e.g. IntegrityError) when the range found its bytes
        corrupt and the re-fetch alone failed too, and the range's
        :class:`~zephon_store.errors.RetriesExhaustedError` when its retries ran out: the
        read already waited one whole retry deadline, and fetching the row group alone would
        wait a second one before saying the same.
        """
        with self._lock:
            held = self._unhold(int(rg))
            if held is not None:
                return held
            task = self._tasks.get(int(rg))
        if task is None:
            return None
        try:
            out = task.result()
        except CancelledError:
            return None
        except RetriesExhaustedError:
            raise
        except Exception:  # noqa: BLE001 - the row group alone retries and names itself
            return None
        got = out.get(int(rg))
        if isinstance(got, BaseException):
            raise got
        if got is not None:
            with self._lock:     # taken: not held for anyone else
                self._unhold(int(rg))
        return got

    # -- one range -----------------------------------------------------------------------

    def _fetch_range(self, r: ByteRange) -> dict:
        m, cache = self.manifest, self.cache
        keys = {rg: m.rg_xxh3(rg) for rg in r.row_groups}
        missing = [rg for rg in r.row_groups if not cache.contains(keys[rg])]
        out: dict[int, bytes | BaseException] = {}
        bad: list[int] = []
        if missing:
            with cache.claim_keys({keys[rg] for rg in missing}) as claimed:
                # Re-checked under the claim: a holder that published and let go between the
                # check above and the claim would otherwise be fetched again (duplicate bytes,
                # seen in the 8 x 2 node start of tests/integration/test_start_s3.py).
                mine = [rg for rg in missing
                        if keys[rg] in claimed and not cache.contains(keys[rg])]
                for sub in coalesce_ranges(self.spans(mine), max_bytes=max(r.nbytes, 1),
                                       max_gap=self.options.max_gap):
                    with named_range(_range_name(m, sub)):
                        got, failed = self._read_split(sub, keys)
                    out.update(got)
                    bad += failed
                    cache.put_many((keys[rg], data) for rg, data in got.items())
                    self._keep(got)
        # Outside the claim: the path alone takes the row group's own key lock.
        for rg in bad:
            try:
                out[rg] = self._fetch_alone(rg)
            except Exception as exc:  # noqa: BLE001 - raised by take() for this row group
                out[rg] = exc
        return out

    def _read_split(self, r: ByteRange, keys: dict[int, str]) -> tuple[dict[int, bytes], list[int]]:
        m = self.manifest
        name = m.shard_name(r.shard)
        locals_ = [m.rg_local_index(rg) for rg in r.row_groups]
        what = (f"shard {name} row group {locals_[0]}" if len(locals_) == 1 else
                f"shard {name} row groups {locals_[0]}-{locals_[-1]}")
        data = self._read_range(m.shard_path(r.shard), r.start, r.end, what=what)
        view = memoryview(data)
        good: dict[int, bytes] = {}
        bad: list[int] = []
        for rg in r.row_groups:
            off = int(m.rg_offset[rg]) - r.start
            piece = bytes(view[off:off + int(m.rg_length[rg])])
            if xxh3_hex(piece) == keys[rg]:
                good[rg] = piece
            else:
                bad.append(rg)
        with self._lock:
            self.ranges += 1
            self.row_groups += len(good)
            self.refetched += len(bad)
        if bad and self._on_corrupt is not None:
            self._on_corrupt(len(bad))
        return good, bad


__all__ = ["ByteRange", "CoalesceOptions", "DEFAULT_MAX_GAP_BYTES", "DEFAULT_MAX_RANGE_BYTES",
           "RangeFetcher", "RowGroupSpan", "coalesce_ranges"]
