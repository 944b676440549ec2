"""A node-local disk cache of byte ranges, keyed by their content hash.

Every rank and worker process of a node can share one cache directory: entries are published
atomically (temp file + ``os.replace``), concurrent fetches of one key run once (a per-key
``flock``), and the byte budget is kept under a cache-wide ``flock``. Because the key is the
xxh3 of the bytes, an updated dataset can never be served stale bytes, and a damaged entry is
detected and dropped on read.

Eviction is planned, not guessed: the reader knows the order, so it tells the cache which keys
it needs next (:meth:`ChunkCache.set_future`). Over budget, the cache first evicts keys no live
process plans to read (least recently used first), then the planned key needed furthest in the
future (Belady).

>>> from zephon_store._util.hashing import xxh3_hex
>>> cache = ChunkCache(tmp, budget_bytes=1 << 20)
>>> key = xxh3_hex(b"row group bytes")
>>> cache.get_or_fetch(key, lambda: b"row group bytes")
b'row group bytes'
>>> cache.get(key)
b'row group bytes'
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import NamedTuple

from .._util.atomic import atomic_write
from .._util.hashing import is_hex_hash, xxh3_hex
from .._util.process import process_alive
from .._util.sizes import parse_size
from ..errors import IntegrityError
from ..observe import causes

_log = logging.getLogger(__name__)

ENV_DIR = "ZEPHON_CACHE_DIR"
ENV_BUDGET = "ZEPHON_CACHE_BUDGET"
DEFAULT_BUDGET_BYTES = 10 << 30
LAYOUT = "v1"  # everything lives under <dir>/v1, so clear() never touches foreign files
# Temp files older than this belong to a crashed writer and are removed by the next scan.
_STALE_TEMP_SECONDS = 3600.0
_STALE_PLAN_SECONDS = 3600.0
_TEMP_PREFIX = ".tmp-"
# How long one process's copy of a mutable object (manifest.json) serves the node's other
# processes. A node's ranks and workers start within seconds of each other (a minute under
# heavy throttling), so one fetch serves them all; a process started later fetches again and
# so sees a replaced dataset within this long (docs/storage.md, "The start").
DEFAULT_SHARE_SECONDS = 60.0


def default_cache_dir() -> str:
    """``$ZEPHON_CACHE_DIR``, else ``$XDG_CACHE_HOME/zephon``, else ``~/.cache/zephon``."""
    env = os.environ.get(ENV_DIR)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "zephon")


def default_budget_bytes() -> int:
    """``$ZEPHON_CACHE_BUDGET`` read by :func:`parse_size` (``20GiB``; ``20G`` is 20e9), else 10 GiB."""
    env = os.environ.get(ENV_BUDGET)
    return parse_size(env) if env else DEFAULT_BUDGET_BYTES


@dataclass
class CacheStats:
    """What this process's :class:`ChunkCache` did (other processes keep their own)."""

    hits: int = 0
    misses: int = 0
    fetches: int = 0
    puts: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    corrupt: int = 0
    bypassed: int = 0   # operations that failed on the disk and were skipped (see ChunkCache)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Entry(NamedTuple):
    key: str
    path: str
    size: int
    mtime_ns: int


def _flock(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _try_flock(path: str) -> int | None:
    """An exclusive lock on ``path`` if free now (None if held), checked to still name the
    file it locked (a holder unlinks the lock file when it lets go)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _leave_why(fd: int) -> None:
    """Write the causes of this thread's work so far into the lock file ``fd`` it is about to
    let go of: a process that waited on the lock reads them, and counts its wait as theirs
    (a neighbour's fetch that was throttled is a throttle, not a lock)."""
    tally = causes.current()
    if tally is not None and tally.total() > 0:
        with contextlib.suppress(OSError):
            os.pwrite(fd, tally.encode(), 0)


def _unlink_quiet(path: str) -> None:
    # Gone already, or a folder that went away or turned read-only: nothing left to undo.
    with contextlib.suppress(OSError):
        os.unlink(path)


class ChunkCache:
    """A byte-budgeted disk cache shared by the processes of one node.

    ``directory`` defaults to :func:`default_cache_dir`; ``budget_bytes`` to
    :func:`default_budget_bytes`. Over budget, eviction runs down to ``low_water * budget`` so
    the directory scan it needs is paid once per ``(1 - low_water) * budget`` bytes written.
    With ``verify`` (default) every read is hashed and a mismatching entry is dropped.

    The cache never breaks a read: when the disk fails under it (a full filesystem, a
    read-only or vanished folder, a file where the folder should be), the operation is
    skipped, counted in ``stats.bypassed`` and logged once per cache object (a warning on the
    ``zephon_store.io.cache`` logger naming the folder and the error); :meth:`get_or_fetch`
    then returns the fetched bytes uncached. Each later operation tries the disk again, so a
    cache that heals (space freed, folder made again) is used again.

    >>> cache = ChunkCache(tmp, budget_bytes=64 << 20)
    >>> blobs = [b"row group 0", b"row group 1"]
    >>> keys = [xxh3_hex(b) for b in blobs]
    >>> cache.set_future(keys)   # the keys the reader needs next, in order
    >>> cache.get_or_fetch(keys[0], lambda: blobs[0])   # in practice: storage.read_range(...)
    b'row group 0'
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 budget_bytes: int | str | None = None, low_water: float = 0.9,
                 verify: bool = True) -> None:
        self.directory = (os.path.abspath(os.fspath(directory)) if directory is not None
                          else default_cache_dir())
        budget = default_budget_bytes() if budget_bytes is None else parse_size(budget_bytes)
        if budget <= 0:
            raise ValueError(f"budget_bytes must be > 0, got {budget}")
        if not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], got {low_water}")
        self.budget_bytes = budget
        self.low_water = low_water
        self.verify = verify
        self.stats = CacheStats()
        self._root = os.path.join(self.directory, LAYOUT)
        self._objects = os.path.join(self._root, "objects")
        self._locks = os.path.join(self._root, "locks")
        self._plans = os.path.join(self._root, "plans")
        self._recent = os.path.join(self._root, "recent")
        self._plan: dict[str, int] = {}
        self._plan_file: str | None = None
        self._plan_finalizer: weakref.finalize | None = None
        self._mutex = threading.Lock()
        self._warned = False
        # Named in the warning of _bypass; the decoded cache (read/decoded_disk.py) sets its own.
        self.label, self.env_dir, self.off_switch = "disk cache", ENV_DIR, "cache=False"

    def __repr__(self) -> str:
        return f"ChunkCache({self.directory!r}, budget_bytes={self.budget_bytes})"

    def clone(self) -> ChunkCache:
        """Another handle on the same folder with the same options, with its own stats and
        its own plan (what a worker process uses; the plan file is per process).

        >>> c = ChunkCache(tmp, budget_bytes=1 << 20).clone()
        >>> c.directory == tmp, c.budget_bytes
        (True, 1048576)
        """
        return ChunkCache(self.directory, budget_bytes=self.budget_bytes,
                          low_water=self.low_water, verify=self.verify)

    def __reduce__(self):
        # Locks and the plan belong to one process: a pickled cache arrives as a clone.
        return (_unpickle_cache, (self.directory, self.budget_bytes, self.low_water, self.verify))

    # -- layout and locks -------------------------------------------------------------------

    def _ensure_dirs(self) -> None:
        for d in (self._objects, self._locks, self._plans):
            if not os.path.isdir(d):   # one stat; makedirs(exist_ok) costs a failing mkdir too
                os.makedirs(d, exist_ok=True)

    def _entry_path(self, key: str) -> str:
        if not isinstance(key, str) or not is_hex_hash(key):
            raise ValueError(
                f"cache keys are xxh3-128 hex digests of the cached bytes (32 lowercase hex "
                f"digits), got {key!r}")
        return os.path.join(self._objects, key[:2], key)

    @contextlib.contextmanager
    def _cache_lock(self) -> Iterator[None]:
        """The cache-wide lock guarding the usage counter, eviction and clear."""
        self._ensure_dirs()
        fd = _flock(os.path.join(self._root, "lock"))
        try:
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def key_lock(self, key: str) -> Iterator[None]:
        """Hold ``key``'s node-wide lock (the one :meth:`get_or_fetch` fetches under), waiting
        while another process or thread holds it: for a caller that makes an entry itself,
        once per node. Raises OSError when the disk has no locks (the caller goes on without
        one). The lock file is removed by its holder.

        A waiter may wake up holding the lock of a file already unlinked (and a newcomer may
        have created a fresh one), so after locking it checks that the path still names the
        file it holds, and starts over otherwise.

        >>> with ChunkCache(tmp).key_lock("ab" * 16):
        ...     pass
        """
        self._ensure_dirs()
        path = os.path.join(self._locks, key + ".lock")
        t0 = time.perf_counter()
        why = None
        while True:
            fd = _flock(path)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            # A holder let go of this file: the causes of its work, which this one waited
            # for (observe/causes.py), are in it.
            why = causes.Tally.decode(os.pread(fd, 256, 0)) or why
            os.close(fd)
        causes.waited(time.perf_counter() - t0, why, "cache_lock")
        try:
            yield
        finally:
            _leave_why(fd)
            _unlink_quiet(path)
            os.close(fd)

    def _count(self, **deltas: int) -> None:
        with self._mutex:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)
        for name in ("hits", "misses"):
            if name in deltas:
                causes.count("cache_" + name, deltas[name])

    def _bypass(self, op: str, exc: OSError) -> None:
        """The disk failed under ``op``: count it, warn once, and let the caller go on
        without the cache (the bytes come from storage, verified, as without a cache)."""
        with self._mutex:
            self.stats.bypassed += 1
            first, self._warned = not self._warned, True
        if first:
            _log.warning(
                "%s %s is not usable (%s: %s: %s); reading through without caching "
                "(the data is unaffected, only not kept). Free space or fix the folder, point "
                "%s at a writable node-local folder, or pass %s", self.label, self.directory,
                op, type(exc).__name__, exc, self.env_dir, self.off_switch)

    # -- usage bookkeeping (call with the cache lock held) ----------------------------------

    def _usage_path(self) -> str:
        return os.path.join(self._root, "usage")

    def _read_usage(self) -> int | None:
        try:
            with open(self._usage_path()) as f:
                return int(f.read().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _write_usage(self, usage: int) -> None:
        # Padded to a fixed width, so one pwrite replaces the old value without an ftruncate
        # (docs/benchmarks.md, "The decoded cache").
        fd = os.open(self._usage_path(), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, f"{max(usage, 0):<24d}".encode(), 0)
        finally:
            os.close(fd)

    def _scan(self) -> list[_Entry]:
        """Every entry on disk; removes temp files left by crashed writers."""
        entries: list[_Entry] = []
        try:
            subdirs = os.scandir(self._objects)
        except FileNotFoundError:
            return entries
        now = time.time()
        with subdirs:
            for sub in subdirs:
                if not sub.is_dir():
                    continue
                with os.scandir(sub.path) as files:
                    for f in files:
                        try:
                            st = f.stat()
                        except FileNotFoundError:
                            continue
                        if f.name.startswith(_TEMP_PREFIX):
                            if now - st.st_mtime > _STALE_TEMP_SECONDS:
                                _unlink_quiet(f.path)
                            continue
                        entries.append(_Entry(f.name, f.path, st.st_size, st.st_mtime_ns))
        return entries

    # -- the future plan --------------------------------------------------------------------

    def set_future(self, keys_in_order: Iterable[str]) -> None:
        """Tell the cache which keys this process will read next, soonest first.

        Replaces the previous plan. The plan is published in the cache directory so eviction
        run by any process of the node protects it; it is removed when this cache object is
        garbage collected or the process exits (plans of dead processes are ignored).

        >>> cache = ChunkCache(tmp)
        >>> cache.set_future([xxh3_hex(b"rg 7"), xxh3_hex(b"rg 3")])   # row group hashes, read order
        """
        plan: dict[str, int] = {}
        for i, key in enumerate(keys_in_order):
            self._entry_path(key)  # validates
            plan.setdefault(key, i)
        # This process's own eviction sees the plan even when the disk refuses it below.
        self._plan = plan
        if self._plan_file is None:
            name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}.plan"
            self._plan_file = os.path.join(self._plans, name)
            self._plan_finalizer = weakref.finalize(self, _unlink_quiet, self._plan_file)
        tmp = None
        try:
            self._ensure_dirs()
            fd, tmp = tempfile.mkstemp(dir=self._plans, prefix=_TEMP_PREFIX)
            with os.fdopen(fd, "w") as f:
                f.write("".join(k + "\n" for k in plan))
            os.replace(tmp, self._plan_file)
        except OSError as exc:
            if tmp is not None:
                _unlink_quiet(tmp)
            self._bypass("publish the read plan", exc)

    def clear_future(self) -> None:
        """Forget this process's plan."""
        self._plan = {}
        if self._plan_finalizer is not None:
            self._plan_finalizer()
        self._plan_file = None
        self._plan_finalizer = None

    def _plan_distances(self) -> dict[str, int]:
        """Key -> soonest position at which any live process of the node plans to read it."""
        dist = dict(self._plan)
        try:
            names = os.listdir(self._plans)
        except FileNotFoundError:
            return dist
        host = socket.gethostname()
        now = time.time()
        for name in names:
            path = os.path.join(self._plans, name)
            if path == self._plan_file or not name.endswith(".plan"):
                continue
            plan_host, _, rest = name.rpartition("-")[0].rpartition("-")
            # Only this code names plans, with its own pid: one naming no live process of
            # this host is stale (a plan is a hint; dropping one never loses data).
            pid = int(rest) if rest.isascii() and rest.isdigit() else None
            try:
                stale = (not process_alive(pid) if plan_host == host
                         else now - os.stat(path).st_mtime > _STALE_PLAN_SECONDS)
                if stale:
                    _unlink_quiet(path)
                    continue
                with open(path) as f:
                    for i, line in enumerate(f):
                        key = line.strip()
                        if i < dist.get(key, i + 1):
                            dist[key] = i
            except FileNotFoundError:
                continue
        return dist

    def _evict_locked(self, target_bytes: int) -> int:
        """Evict until usage <= ``target_bytes``; returns the usage measured on disk."""
        entries = self._scan()
        usage = sum(e.size for e in entries)
        if usage <= target_bytes:
            return usage
        dist = self._plan_distances()
        unplanned = sorted((e for e in entries if e.key not in dist),
                           key=lambda e: (e.mtime_ns, e.key))
        planned = sorted((e for e in entries if e.key in dist),
                         key=lambda e: (-dist[e.key], e.key))
        for e in unplanned + planned:
            if usage <= target_bytes:
                break
            _unlink_quiet(e.path)
            usage -= e.size
            self._count(evictions=1, evicted_bytes=e.size)
        return usage

    # -- public API -------------------------------------------------------------------------

    def contains(self, key: str) -> bool:
        """True if an entry for ``key`` is on disk (not verified)."""
        return os.path.exists(self._entry_path(key))

    def _read(self, key: str) -> bytes | None:
        path = self._entry_path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
                ino = os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._bypass("read", exc)
            return None
        if self.verify and xxh3_hex(data) != key:
            self.drop_damaged(key, ino, len(data))
            return None
        # Recency for LRU among unplanned keys; only a hint, so a read-only cache skips it.
        with contextlib.suppress(OSError):
            os.utime(path)
        return data

    def entry_path(self, key: str) -> str:
        """Where the entry for ``key`` lives (it may not exist): for a caller that maps the
        file instead of reading it, verifies it itself and reports a damaged one to
        :meth:`drop_damaged` (the decoded cache, :mod:`zephon_store.read.decoded_disk`).

        >>> ChunkCache(tmp).entry_path("ab" * 16).endswith("/ab/" + "ab" * 16)
        True
        """
        return self._entry_path(key)

    def touch(self, key: str) -> None:
        """Mark ``key`` as just used (recency for the LRU among unplanned keys); a hint only."""
        with contextlib.suppress(OSError):
            os.utime(self._entry_path(key))

    def drop_damaged(self, key: str, ino: int, size: int) -> None:
        """Count and remove the entry for ``key`` found damaged, if it is still the file
        ``ino`` (of ``size`` bytes) that was read, not a good one published meanwhile."""
        self._count(corrupt=1)
        path = self._entry_path(key)
        try:
            with self._cache_lock():
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == ino:
                        os.unlink(path)
                        usage = self._read_usage()
                        if usage is not None:
                            self._write_usage(usage - size)
        except OSError as exc:
            self._bypass("drop a damaged entry", exc)

    def get(self, key: str) -> bytes | None:
        """The cached bytes for ``key``, or None.

        >>> ChunkCache(tmp).get("0" * 32) is None
        True
        """
        data = self._read(key)
        self._count(**({"hits": 1} if data is not None else {"misses": 1}))
        return data

    def put(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        """Publish ``data`` under ``key`` (its xxh3); False if it exceeds the whole budget.

        Raises :class:`~zephon_store.errors.IntegrityError` when ``verify`` is on and the bytes
        do not hash to ``key``.
        """
        return self.put_many([(key, data)])[0]

    def put_many(self, items: Iterable[tuple[str, bytes | bytearray | memoryview]]) -> list[bool]:
        """Publish several ``(key, data)`` entries under one cache-wide lock and one usage
        update; per entry, like :meth:`put`: True if cached (now or before), False if it
        exceeds the whole budget.

        Raises :class:`~zephon_store.errors.IntegrityError` (before publishing any) when
        ``verify`` is on and some bytes do not hash to their key.

        >>> cache = ChunkCache(tmp)
        >>> cache.put_many([(xxh3_hex(b), b) for b in (b"rg 0", b"rg 1", b"rg 2")])
        [True, True, True]
        """
        items = list(items)
        paths = [self._entry_path(key) for key, _ in items]
        if self.verify:
            for (key, data), path in zip(items, paths):
                actual = xxh3_hex(data)
                if actual != key:
                    raise IntegrityError(
                        f"cache put: bytes hash to {actual}, not to the key {key}; cache keys "
                        f"must be the xxh3 of the cached bytes", url=path, expected=key,
                        actual=actual)
        done = [len(data) <= self.budget_bytes for _, data in items]
        todo = [i for i, ok in enumerate(done) if ok and not os.path.exists(paths[i])]
        if not todo:
            return done
        try:
            self._publish(items, paths, todo)
        except OSError as exc:
            self._bypass("write", exc)
            return [ok and i not in todo for i, ok in enumerate(done)]
        return done

    def _publish(self, items: list[tuple[str, bytes | bytearray | memoryview]],
                 paths: list[str], todo: list[int]) -> None:
        """Write ``items[i]`` for ``i`` in ``todo`` to temp files, then publish them and
        update the usage under one cache-wide lock (evicting if over budget)."""
        self._ensure_dirs()
        temps: dict[int, str] = {}
        try:
            seen: set[str] = set()
            for i in todo:
                if paths[i] in seen:
                    continue
                seen.add(paths[i])
                subdir = os.path.dirname(paths[i])
                if not os.path.isdir(subdir):
                    os.makedirs(subdir, exist_ok=True)
                # No fsync: after a crash a torn entry fails verification and is dropped.
                fd, temps[i] = tempfile.mkstemp(dir=subdir, prefix=_TEMP_PREFIX)
                with os.fdopen(fd, "wb") as f:
                    f.write(items[i][1])
            published = 0
            with self._cache_lock():
                added = 0
                for i, tmp in temps.items():
                    if os.path.exists(paths[i]):
                        os.unlink(tmp)
                        continue
                    os.replace(tmp, paths[i])
                    added += len(items[i][1])
                    published += 1
                if added:
                    usage = self._read_usage()
                    usage = (usage if usage is not None
                             else sum(e.size for e in self._scan()) - added)
                    usage += added
                    if usage > self.budget_bytes:
                        usage = self._evict_locked(int(self.budget_bytes * self.low_water))
                    self._write_usage(usage)
        except BaseException:
            for tmp in temps.values():
                _unlink_quiet(tmp)
            raise
        self._count(puts=published)

    @contextlib.contextmanager
    def claim_keys(self, keys: Iterable[str]) -> Iterator[set[str]]:
        """Take the per-key locks of ``keys`` that are free right now; yields the claimed set.

        A key another process (or thread) holds is skipped, never waited for, so a caller
        holding some keys cannot deadlock with one holding others. Callers of
        :meth:`get_or_fetch` for a claimed key wait until the claim ends, then read the
        entry the claimer published.

        >>> cache, blobs = ChunkCache(tmp), {xxh3_hex(b): b for b in (b"rg 0", b"rg 1")}
        >>> with cache.claim_keys(blobs) as mine:
        ...     cache.put_many((k, blobs[k]) for k in mine)
        [True, True]
        """
        keys = sorted(set(keys))
        for key in keys:
            self._entry_path(key)  # validates
        held: dict[str, tuple[str, int]] = {}
        try:
            try:
                self._ensure_dirs()
                for key in keys:
                    path = os.path.join(self._locks, key + ".lock")
                    fd = _try_flock(path)
                    if fd is not None:
                        held[key] = (path, fd)
                claimed = set(held)
            except OSError as exc:
                # No locks on this disk: the caller fetches every key itself (a neighbour
                # process may fetch some too; the bytes are the same).
                self._bypass("lock", exc)
                claimed = set(keys)
            yield claimed
        finally:
            for path, fd in held.values():
                _leave_why(fd)
                _unlink_quiet(path)
                os.close(fd)

    def get_or_fetch(self, key: str, fetch_fn: Callable[[], bytes]) -> bytes:
        """The cached bytes for ``key``, else ``fetch_fn()`` published under ``key``.

        Processes (and threads) of the node asking for the same missing key wait on a per-key
        file lock, so the fetch runs once while it fits in the budget.

        >>> cache, key = ChunkCache(tmp), xxh3_hex(b"rg 0")
        >>> cache.get_or_fetch(key, lambda: b"rg 0")   # e.g. st.read_range(shard, off, end, ...)
        b'rg 0'
        >>> cache.get_or_fetch(key, lambda: 1 / 0)     # cached: no fetch
        b'rg 0'
        """
        data = self._read(key)
        if data is not None:
            self._count(hits=1)
            return data
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.key_lock(key))
            except OSError as exc:
                self._bypass("lock", exc)   # fetch without the lock: maybe twice per node
            else:
                data = self._read(key)
                if data is not None:
                    self._count(hits=1)
                    return data
            self._count(misses=1, fetches=1)
            data = fetch_fn()
            self.put(key, data)
            return data

    def get_or_fetch_recent(self, name: str, fetch_fn: Callable[[], bytes], *,
                            max_age: float = DEFAULT_SHARE_SECONDS) -> tuple[bytes, bool]:
        """``(bytes, shared)`` of a *mutable* object named ``name`` (e.g. a dataset's
        ``manifest.json`` by its URL): the copy another process of the node fetched less than
        ``max_age`` seconds ago (``shared`` True), else ``fetch_fn()``, published for the
        others.

        Content-addressed bytes use :meth:`get_or_fetch` (valid forever); this is for the one
        object whose name does not change with its content. One process fetches at a time
        (the same per-key lock); the others wait and read its copy. The caller verifies what
        it gets (a manifest checks its own ``dataset_id``) and calls :meth:`drop_recent` on a
        copy that fails. Outside the byte budget: a few small files.

        >>> cache = ChunkCache(tmp)
        >>> cache.get_or_fetch_recent("s3://b/ds/manifest.json", lambda: b"{}")
        (b'{}', False)
        >>> cache.get_or_fetch_recent("s3://b/ds/manifest.json", lambda: 1 / 0)
        (b'{}', True)
        """
        key = xxh3_hex(name.encode())
        data = self._read_recent(key, name, max_age)
        if data is not None:
            return data, True
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.key_lock(key))
            except OSError as exc:
                self._bypass("lock", exc)
            else:
                data = self._read_recent(key, name, max_age)
                if data is not None:
                    return data, True
            data = fetch_fn()
            try:
                os.makedirs(self._recent, exist_ok=True)
                atomic_write(os.path.join(self._recent, key), name.encode() + b"\n" + data)
            except OSError as exc:
                self._bypass("write", exc)
            return data, False

    def _read_recent(self, key: str, name: str, max_age: float) -> bytes | None:
        path = os.path.join(self._recent, key)
        try:
            with open(path, "rb") as f:
                if time.time() - os.fstat(f.fileno()).st_mtime >= max_age:
                    return None
                raw = f.read()
        except OSError:
            return None
        head, sep, data = raw.partition(b"\n")
        return data if sep and head == name.encode() else None

    def drop_recent(self, name: str) -> None:
        """Forget the node's copy of ``name`` (it failed its caller's check)."""
        _unlink_quiet(os.path.join(self._recent, xxh3_hex(name.encode())))

    def info(self) -> dict[str, object]:
        """``{"dir", "entries", "bytes", "budget", "plans"}`` measured on disk."""
        entries = self._scan()
        try:
            plans = sum(1 for n in os.listdir(self._plans) if n.endswith(".plan"))
        except FileNotFoundError:
            plans = 0
        return {"dir": self.directory, "entries": len(entries),
                "bytes": sum(e.size for e in entries), "budget": self.budget_bytes,
                "plans": plans}

    def clear(self) -> int:
        """Remove every entry (and stale temp files) and the node's recent copies of mutable
        objects (so the next open fetches ``manifest.json`` again); returns the bytes freed."""
        if not os.path.isdir(self._root):
            return 0
        freed = 0
        with self._cache_lock():
            for e in self._scan():
                try:
                    os.unlink(e.path)
                    freed += e.size
                except FileNotFoundError:
                    pass
            self._write_usage(0)
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(self._recent):
                    _unlink_quiet(os.path.join(self._recent, name))
        return freed


def _unpickle_cache(directory: str, budget_bytes: int, low_water: float,
                    verify: bool) -> ChunkCache:
    return ChunkCache(directory, budget_bytes=budget_bytes, low_water=low_water, verify=verify)


def cache_info(directory: str | None = None) -> dict[str, object]:
    """:meth:`ChunkCache.info` of the cache at ``directory`` (default: the user cache dir)."""
    return ChunkCache(directory).info()


def cache_clear(directory: str | None = None) -> int:
    """:meth:`ChunkCache.clear` of the cache at ``directory``; returns bytes freed."""
    return ChunkCache(directory).clear()


__all__ = ["ChunkCache", "CacheStats", "cache_clear", "cache_info", "default_budget_bytes",
           "default_cache_dir", "parse_size"]
