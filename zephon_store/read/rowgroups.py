"""The one owner of a dataset's row-group bytes and their decoding.

:class:`RowGroups` turns a global row-group index into a decoded table: the shard's footer
(:mod:`.footers`), bytes whose xxh3 was checked before anything decodes them (a local shard
memory-mapped, :mod:`.mapped`, hashing only the row group's range; a remote one by ranged
GETs, through the node's disk cache and the coalesced ranges the prefetcher planned,
:mod:`zephon_store.io.coalesce`), the decode itself (:mod:`.decode`), one decode per row group
however many threads ask at once, and a small LRU of decoded row groups bounded in bytes.

Locks, one per concern, none held across I/O or a decode: the footers' (inserts and their
fetches in flight), the maps' (inserts only), the decoded LRU's, the decodes in flight
(:class:`~zephon_store.read.once.OncePerKey`), and one guarding the creation of the range
fetcher, the thread pool and the prefetchers.

With a node-local :class:`~zephon_store.read.decoded_disk.DecodedDiskCache`, a row group
decoded once on the node (by any process, in any epoch) is mapped from that cache instead of
decoded again; its first decode writes it there.

Threads: :meth:`RowGroups.read_many` decodes on this object's pool (``zephon-io``), made on
first use and shut down by :meth:`RowGroups.close`. A :class:`~zephon_store.io.prefetch.Prefetcher`
made by :meth:`RowGroups.prefetcher` owns its pool (``zephon-prefetch``) and is closed by whoever
made it, and by :meth:`RowGroups.close` at the latest. In a forked child every lock is new and
the pool, the range fetcher, the maps and the decodes in flight are forgotten (their threads
did not survive the fork); the first use there makes fresh ones.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from ..errors import ManifestError
from ..format.footer import chunk_range_problem
from ..format.manifest import PARSE_ERRORS, Manifest, require_regular_file
from ..io.cache import ChunkCache
from ..io.coalesce import CoalesceOptions, RangeFetcher
from ..io.prefetch import DEFAULT_PREFETCH_BYTES, Prefetcher
from ..io.storage import Storage
from ..observe.profile import named_range
from .decode import decode_row_group
from .decoded_disk import DecodedDiskCache, decoded_key, schema_fingerprint
from .footers import Footers
from .mapped import MappedShards
from .once import OncePerKey
from .rangefile import RangeFile

DEFAULT_MEMORY_CACHE_BYTES = 256 << 20


class DecodedLRU:
    """A thread-safe LRU of decoded row groups in memory, bounded by bytes (``budget <= 0``:
    keeps none); ``open_dataset(memory_cache_bytes=)`` sizes it. Not the *decoded cache*
    (``decoded_cache=``, :class:`~zephon_store.read.decoded_disk.DecodedDiskCache`, on disk)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._tables: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, rg: int) -> pa.Table | None:
        with self._lock:
            t = self._tables.get(rg)
            if t is not None:
                self._tables.move_to_end(rg)
            return t

    def put(self, rg: int, table: pa.Table) -> None:
        if self.budget <= 0:
            return
        with self._lock:
            if rg in self._tables:
                return
            self._tables[rg] = table
            self.used += table.nbytes
            while self.used > self.budget and len(self._tables) > 1:
                _, old = self._tables.popitem(last=False)
                self.used -= old.nbytes

    def after_fork(self) -> None:
        self._lock = threading.Lock()


class RowGroups:
    """Verified bytes and decoded tables of one dataset's row groups.

    ``cache`` is the disk cache remote bytes go through (None: none); ``dataset_url`` names
    the dataset in errors.

    >>> from zephon_store import open_dataset
    >>> rgs = open_dataset(tiny_dataset).row_groups
    >>> rgs.read(0).num_rows, rgs.read(0).column("id")[0].as_py()
    (10, 0)
    """

    def __init__(self, manifest: Manifest, storage: Storage, *, cache: ChunkCache | None,
                 memory_cache_bytes: int = DEFAULT_MEMORY_CACHE_BYTES, io_threads: int = 8,
                 dataset_url: str = "", decoded_disk: DecodedDiskCache | None = None) -> None:
        self.manifest = manifest
        self.storage = storage
        self.cache = cache
        self.decoded_disk = decoded_disk
        self._fingerprint = (schema_fingerprint(manifest.schema, manifest.storage)
                             if decoded_disk is not None else b"")
        self.io_threads = io_threads
        self._dataset_url = dataset_url or storage.root_url
        self.footers = Footers(manifest, self._fetch, self.forged)
        self._mapped = (MappedShards(manifest, lambda s: storage.url(manifest.shard_path(s)))
                        if storage.local else None)
        self._lru = DecodedLRU(memory_cache_bytes)
        # Threads asking for the same row group at once (the loader's decode threads: a
        # sequential token batch is a quarter of one) wait for the one decode.
        self._decoding: OncePerKey[pa.Table] = OncePerKey()
        self._fetcher: RangeFetcher | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._prefetchers: weakref.WeakSet[Prefetcher] = weakref.WeakSet()
        self._owned_lock = threading.Lock()   # creation of the fetcher, the pool, prefetchers
        _LIVE.add(self)

    def forged(self, shard: int, what: str) -> ManifestError:
        """The error for a manifest that disagrees with the shard it names."""
        m = self.manifest
        return ManifestError(
            f"shard {m.shard_name(shard)} at {self.storage.url(m.shard_path(shard))}: {what}; "
            f"the manifest disagrees with the shard it names (forged or corrupted): run "
            f"'zephon verify {self._dataset_url}' and re-convert")

    # -- bytes -------------------------------------------------------------------------------

    def _fetch(self, shard: int, start: int, end: int, xxh3: str, what: str) -> bytes:
        rel = self.manifest.shard_path(shard)
        require_regular_file(self.storage, rel)
        with named_range(f"zephon: {what} (fetch)"):
            if self.cache is None:
                return self.storage.read_range(rel, start, end, expected_xxh3=xxh3, what=what)
            return self.cache.get_or_fetch(
                xxh3,
                lambda: self.storage.read_range(rel, start, end, expected_xxh3=xxh3, what=what))

    def fetch_alone(self, rg: int) -> bytes:
        """Row group ``rg`` by its own ranged GET (through the disk cache if any), verified."""
        m = self.manifest
        rg = int(rg)
        shard = int(m.rg_shard[rg])
        off, length = int(m.rg_offset[rg]), int(m.rg_length[rg])
        return self._fetch(shard, off, off + length, m.rg_xxh3(rg),
                           f"shard {m.shard_name(shard)} row group {m.rg_local_index(rg)}")

    def fetch_bytes(self, rg: int) -> bytes:
        """The verified bytes of global row group ``rg`` (through the disk cache if any).

        A row group the prefetcher planned into a coalesced range comes from that range (run
        here if no prefetch thread has started it yet), never from a second request.
        """
        fetcher = self._fetcher
        if fetcher is not None:
            data = fetcher.take(rg)
            if data is not None:
                return data
        return self.fetch_alone(rg)

    def range_fetcher(self, options: CoalesceOptions | None = None) -> RangeFetcher:
        """This process's :class:`~zephon_store.io.coalesce.RangeFetcher` (made on first use;
        ``options`` apply when it is made). Needs a disk cache."""
        if self.cache is None:
            raise ValueError("coalesced ranges go through a disk cache; this dataset has none "
                             "(open it with cache=ChunkCache(dir))")
        with self._owned_lock:
            if self._fetcher is None:
                storage = self.storage
                self._fetcher = RangeFetcher(
                    self.manifest, storage.read_range, self.cache, fetch_alone=self.fetch_alone,
                    on_corrupt=storage.count_integrity_failures, options=options)
            return self._fetcher

    def prefetcher(self, step_row_groups: Callable[[int], Iterable[int]], *,
                   budget_bytes: int = DEFAULT_PREFETCH_BYTES, threads: int = 4,
                   num_batches: int | None = None,
                   coalesce: CoalesceOptions | None = None) -> Prefetcher:
        """A :class:`~zephon_store.io.prefetch.Prefetcher` of these row groups' bytes.

        Without a disk cache (local datasets are read in place) it does nothing. The caller
        closes it; :meth:`close` closes every one still open.
        """
        ranges = self.range_fetcher(coalesce) if self.cache is not None else None
        pre = Prefetcher(self.manifest, step_row_groups, ranges=ranges, cache=self.cache,
                         budget_bytes=budget_bytes, threads=threads, num_batches=num_batches)
        with self._owned_lock:
            self._prefetchers.add(pre)
        return pre

    # -- decoding ----------------------------------------------------------------------------

    def read(self, rg: int, *, keep: bool = True) -> pa.Table:
        """Decode global row group ``rg`` (verified against its xxh3 before decoding).

        Concurrent calls for the same row group decode it once; the others wait for it.
        ``keep=False`` does not add a fresh decode to the decoded LRU (the loader's pipeline
        holds what it reads itself and drops it after its last use).
        """
        rg = int(rg)
        t = self._lru.get(rg)
        if t is not None:
            return t
        return self._decoding.run(rg, self._decode_keep if keep else self._decode,
                                  self._lru.get)

    def _decode_keep(self, rg: int) -> pa.Table:
        t = self._decode(rg)
        self._lru.put(rg, t)
        return t

    def _decode(self, rg: int) -> pa.Table:
        disk = self.decoded_disk
        if disk is None:
            return self._decode_shard(rg)
        # The manifest's row count, checked on every read: an entry of other rows is not
        # this row group's, whatever its own hash says.
        return disk.get_or_decode(self.decoded_key(rg), self.manifest.schema,
                                  lambda: self._decode_shard(rg),
                                  rows=int(self.manifest.rg_rows[rg]))

    def decoded_key(self, rg: int) -> str:
        """Global row group ``rg``'s key in the decoded cache (which must be set)."""
        m = self.manifest
        return decoded_key(m.shard_name(int(m.rg_shard[rg])), m.rg_local_index(rg),
                           self._fingerprint)

    def _decode_shard(self, rg: int) -> pa.Table:
        m = self.manifest
        shard = int(m.rg_shard[rg])
        m.warm_row_groups((rg,))   # v4: its chunk travels with the footer, one round trip
        footer = self.footers.get(shard)
        local = m.rg_local_index(rg)
        mapped = self._mapped.verified(rg, shard) if self._mapped is not None else None
        if mapped is not None:
            # Decode straight from the mapped shard, whose bytes of this row group were just
            # hashed: no copy, no Python file object in between.
            buf, base = mapped, 0
            source = pa.BufferReader(mapped)
        else:
            base = int(m.rg_offset[rg])
            data = self.fetch_bytes(rg)
            buf = pa.py_buffer(data)
            source = RangeFile(int(m.shard_bytes[shard]), {base: data},
                               name=self.storage.url(m.shard_path(shard)))
        meta = footer.metadata.row_group(local)
        problem = chunk_range_problem(m, rg, meta)
        if problem is not None:
            raise self.forged(shard, problem)
        try:
            t = decode_row_group(source, buf, base, footer, local, meta)
        except PARSE_ERRORS as exc:
            # The bytes passed their hash: a manifest that vouches for undecodable bytes.
            raise self.forged(shard, f"row group {local} (hash verified) does not decode: "
                              f"{type(exc).__name__}: {exc}") from exc
        return m.to_logical(t)  # storage types -> manifest schema; a no-op for v1 datasets

    def read_many(self, rgs: Iterable[int]) -> list[pa.Table]:
        """Decode several row groups, in parallel threads (pyarrow releases the GIL)."""
        rgs = [int(r) for r in rgs]
        # Decoded ones are taken here: a shuffled batch touches dozens of row groups, mostly
        # decoded already, and a pool task per decoded one costs more than the batch's work.
        out = [self._lru.get(r) for r in rgs]
        missing = [i for i, t in enumerate(out) if t is None]
        if len(missing) <= 1 or self.io_threads <= 1:
            for i in missing:
                out[i] = self.read(rgs[i])
            return out
        pool = self._pool
        if pool is None:
            with self._owned_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="zephon-io")
                pool = self._pool
        for i, t in zip(missing, pool.map(self.read, [rgs[i] for i in missing])):
            out[i] = t
        return out

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the prefetchers made here, stop the pool (waiting for its threads) and drop
        the maps and decoded tables. Usable afterwards: a later read starts afresh."""
        with self._owned_lock:
            pool, self._pool = self._pool, None
            prefetchers = list(self._prefetchers)
        for pre in prefetchers:
            pre.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if self._mapped is not None:
            self._mapped.clear()
        self._lru = DecodedLRU(self._lru.budget)

    def _after_fork(self) -> None:
        self._owned_lock = threading.Lock()
        self._decoding.after_fork()
        self._fetcher = None
        self._pool = None
        self._prefetchers = weakref.WeakSet()
        self.footers.after_fork()
        self._lru.after_fork()
        if self._mapped is not None:
            self._mapped.after_fork()
        if self.decoded_disk is not None:
            self.decoded_disk.after_fork()


_LIVE: weakref.WeakSet[RowGroups] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for row_groups in list(_LIVE):
        row_groups._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

