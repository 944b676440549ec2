"""A node-local disk cache of *decoded* row groups: Arrow IPC files, memory-mapped.

The shards stay compressed (a codec per column by default, ``compression="auto"``), and every pass over them pays the decode
again: on a 2-core machine that is most of a pass's CPU (docs/benchmarks.md, "Loader").
With a :class:`DecodedDiskCache`, the first decode of a row group on a node also writes the
table, uncompressed, as an Arrow IPC file; every later read of it, by any rank, worker or
epoch of the node, maps that file and hands out zero-copy views of it (no decompression,
no Parquet decoding, no copy).

The key is derived, not a content hash: ``xxh3("zephon-decoded-v2", shard name, row group
index in the shard, schema fingerprint)``. Shards are named by the hash of their bytes, so
the key names exactly one decoded table, whatever dataset or URL the shard is read through,
and a re-converted dataset can never be served an old table.

The decoded bytes are not the bytes the manifest vouches for, so each entry carries its own
check: a 56-byte trailer (magic, the xxh3-128 of the IPC bytes, the key and the row count,
then the IPC length, the key and the row count) written with it, and every read hashes the
mapped bytes against it before using them (cost: docs/benchmarks.md, "The decoded cache"). The
key in the trailer binds the entry to its name: an entry file copied onto another key's
name (an rsync or restore slip, two caches merged) hashes correctly but names another key,
and is refused. Every read also checks the table's schema and its row count against the
manifest's row group. An entry failing any check is dropped and counted
(``stats.corrupt``), and the row group is decoded from the verified shard instead. What it
cannot detect is a *forged* entry (someone with write access to the folder writing a
well-formed file with other rows under the right key and row count): keep the folder
node-local and private to the job's user, as for any cache of derived data.

The format tag is in both the key (``zephon-decoded-v2``) and the trailer's magic
(``ZPHDEC02``): entries of the first format (whose trailer named no key) sit under other
names, so they are misses, rewritten in the new format and aged out by the budget's LRU;
one found under a new name anyway fails the magic check and is dropped, never read.

Entries, the budget, eviction (least recently used first) and concurrent publishing by
several processes are the :class:`~zephon_store.io.cache.ChunkCache`'s, on a folder of its
own (``<directory>/v1``), with verification of contents by key switched off in favour of
the trailer.

>>> import pyarrow as pa
>>> dc = DecodedDiskCache(tmp, budget_bytes=1 << 20)
>>> table = pa.table({"text": ["a", "bc"]})
>>> dc.put("ab" * 16, table)
True
>>> dc.get("ab" * 16, table.schema, rows=2).equals(table)
True
>>> dc.get("ab" * 16, table.schema, rows=3) is None     # not the row group's row count
True
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import stat
import struct
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow as pa
import xxhash

from .._util.hashing import xxh3_hex
from .._util.sizes import parse_size
from ..io.cache import ChunkCache, default_cache_dir
from ..observe import causes

_log = logging.getLogger(__name__)

ENV_DIR = "ZEPHON_DECODED_CACHE_DIR"
ENV_BUDGET = "ZEPHON_DECODED_CACHE_BUDGET"
DEFAULT_BUDGET_BYTES = 20 << 30
# Both bumped together when an entry's layout or meaning changes: an entry of another
# format is then a miss (other names) and, under a name of this one, fails the magic.
KEY_VERSION = b"zephon-decoded-v2"
_MAGIC = b"ZPHDEC02"
# magic, xxh3-128 of (IPC bytes + the bound part), then the bound part: the IPC bytes'
# length, the key (16 bytes) and the table's row count.
_TRAILER = struct.Struct("<8s16sQ16sQ")
_BOUND = struct.Struct("<Q16sQ")


def default_decoded_dir() -> str:
    """``$ZEPHON_DECODED_CACHE_DIR``, else ``decoded`` in :func:`default_cache_dir`."""
    env = os.environ.get(ENV_DIR)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    return os.path.join(default_cache_dir(), "decoded")


def _env_budget() -> int:
    """``$ZEPHON_DECODED_CACHE_BUDGET`` as bytes, else the default; a bad value names the
    variable (the cache's own check would only say ``budget_bytes``)."""
    env = os.environ.get(ENV_BUDGET)
    if not env:
        return DEFAULT_BUDGET_BYTES
    try:
        budget = parse_size(env)
    except ValueError as exc:
        raise ValueError(f"${ENV_BUDGET}={env!r}: {exc}") from None
    if budget <= 0:
        raise ValueError(f"${ENV_BUDGET}={env!r}: the decoded cache's budget must be > 0 "
                         "bytes; set a size such as 50GiB, or unset it for the default 20GiB")
    return budget


def schema_fingerprint(schema: pa.Schema, storage: dict) -> bytes:
    """What a decoded table's layout depends on besides the shard's bytes: the logical
    schema (with its metadata) and the storage encodings undone on decode."""
    return (schema.serialize().to_pybytes()
            + json.dumps(storage, sort_keys=True, separators=(",", ":")).encode())


def decoded_key(shard_name: str, local_rg: int, fingerprint: bytes) -> str:
    """The cache key of row group ``local_rg`` of the shard named ``shard_name``.

    >>> decoded_key("00" * 16, 0, b"s") == decoded_key("00" * 16, 1, b"s")
    False
    """
    return xxh3_hex(b"\0".join((KEY_VERSION, shard_name.encode(), str(int(local_rg)).encode(),
                                fingerprint)))


@dataclass
class DecodedStats:
    """What this process's :class:`DecodedDiskCache` did."""

    hits: int = 0
    misses: int = 0     # decoded here (and then written: ``store_stats.puts``)
    corrupt: int = 0    # entries that failed their check, dropped
    unwritable: int = 0   # decoded tables Arrow could not serialize (not cached; logged once)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class DecodedDiskCache:
    """Decoded row groups of any dataset, shared by the processes of one node.

    ``directory`` defaults to :func:`default_decoded_dir`; ``budget_bytes`` (an int or a
    size such as ``"50GiB"``) to ``$ZEPHON_DECODED_CACHE_BUDGET``, else 20 GiB. Decoded text
    is about 4x its zstd shard bytes, token windows about 2x: size the budget to the
    decoded dataset (or the part of it a node reads) for every epoch after the first to
    hit. Pass it to :func:`~zephon_store.open_dataset` (``decoded_cache=``) or
    :class:`~zephon_store.torch.ZephonLoader`; setting ``$ZEPHON_DECODED_CACHE_DIR`` turns
    it on for every dataset opened without an explicit choice.

    >>> dc = DecodedDiskCache(tmp, budget_bytes="1GiB")
    >>> dc.budget_bytes
    1073741824
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 budget_bytes: int | str | None = None, low_water: float = 0.9) -> None:
        self.directory = (os.path.abspath(os.fspath(directory)) if directory is not None
                          else default_decoded_dir())
        if budget_bytes is None:
            budget_bytes = _env_budget()
        self._store = ChunkCache(self.directory, budget_bytes=budget_bytes,
                                 low_water=low_water, verify=False)
        self._store.label, self._store.env_dir = "decoded cache", ENV_DIR
        self._store.off_switch = "decoded_cache=False"
        self.stats = DecodedStats()
        self._mutex = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: a lock no parent thread can be holding."""
        self._mutex = threading.Lock()

    def _count(self, **deltas: int) -> None:
        with self._mutex:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)
        for name in ("hits", "misses"):
            if name in deltas:
                causes.count("decoded_cache_" + name, deltas[name])

    @property
    def budget_bytes(self) -> int:
        return self._store.budget_bytes

    @property
    def store_stats(self):
        """The entries' store's :class:`~zephon_store.io.cache.CacheStats` (``puts``,
        ``evictions``, ``bypassed``: disk operations that failed and were skipped)."""
        return self._store.stats

    def __repr__(self) -> str:
        return f"DecodedDiskCache({self.directory!r}, budget_bytes={self.budget_bytes})"

    def clone(self) -> DecodedDiskCache:
        """Another handle on the same folder and budget, with its own stats."""
        return DecodedDiskCache(self.directory, budget_bytes=self.budget_bytes,
                                low_water=self._store.low_water)

    def __reduce__(self):
        return (_unpickle, (self.directory, self.budget_bytes, self._store.low_water))

    # -- entries -----------------------------------------------------------------------------

    def get(self, key: str, schema: pa.Schema, *, rows: int | None = None) -> pa.Table | None:
        """The table cached under ``key`` as zero-copy views of the mapped entry, or None.

        The entry's bytes are hashed against its trailer, the key its trailer names compared
        with ``key``, its schema with ``schema`` and, given ``rows`` (the manifest's row
        count of the row group), its row count with ``rows``; an entry that fails any of
        them is dropped and counted in ``stats.corrupt`` (the caller decodes the row group
        from its shard instead).
        """
        table = self._get_quiet(key, schema, rows)
        self._count(**({"hits": 1} if table is not None else {"misses": 1}))
        return table

    def _get_quiet(self, key: str, schema: pa.Schema, rows: int | None) -> pa.Table | None:
        """:meth:`get` without counting hits and misses (damaged entries are counted)."""
        path = self._store.entry_path(key)
        try:
            # Arrow's map, closed at once: the mapping lives as long as a buffer views it,
            # the file descriptor does not (a Python mmap would hold one per live table).
            f = pa.memory_map(path, "r")
        except FileNotFoundError:
            return None
        except OSError:   # unreadable folder, or an entry that cannot be mapped (empty)
            with contextlib.suppress(OSError):
                st = os.stat(path)
                if stat.S_ISREG(st.st_mode):
                    self._count(corrupt=1)
                    self._store.drop_damaged(key, st.st_ino, st.st_size)
            return None
        try:
            st = os.fstat(f.fileno())
            size = st.st_size
            mapped = f.read_buffer()
        except OSError:
            return None
        finally:
            f.close()
        table = _check(mapped, size, key, schema, rows)
        if table is None:
            self._count(corrupt=1)
            self._store.drop_damaged(key, st.st_ino, size)
            return None
        self._store.touch(key)
        return table

    def get_or_decode(self, key: str, schema: pa.Schema, decode: Callable[[], pa.Table], *,
                      rows: int | None = None) -> pa.Table:
        """The table cached under ``key`` (checked as by :meth:`get`), else ``decode()``
        published under ``key``.

        Processes of the node asking for the same missing key wait on its file lock, held
        until the entry is published, so a row group read by several ranks of a node at
        once is decoded by one of them and mapped by the others (a first epoch decodes once
        per node, not once per rank). The entry is written in the calling thread: a
        background writer that skipped entries when behind was tried and measured slower on
        both one and two ranks (docs/benchmarks.md, "The decoded cache").

        >>> import pyarrow as pa
        >>> dc, t = DecodedDiskCache(tmp), pa.table({"a": [1]})
        >>> dc.get_or_decode("12" * 16, t.schema, lambda: t).equals(t)
        True
        >>> dc.get_or_decode("12" * 16, t.schema, lambda: 1 / 0).equals(t)   # mapped
        True
        """
        table = self._get_quiet(key, schema, rows)
        if table is not None:
            self._count(hits=1)
            return table
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._store.key_lock(key))
            except OSError:
                pass    # no locks on this disk: decode here (a neighbour may too)
            else:
                table = self._get_quiet(key, schema, rows)   # published while this one waited
                if table is not None:
                    self._count(hits=1)
                    return table
            self._count(misses=1)
            table = decode()
            try:
                self.put(key, table)
            except (pa.ArrowException, MemoryError) as exc:   # the read goes on, uncached
                self._count(unwritable=1)
                if self.stats.unwritable == 1:
                    _log.warning("decoded cache %s: a row group could not be written (%s: "
                                 "%s); reading on without caching it", self.directory,
                                 type(exc).__name__, exc)
            return table

    def contains(self, key: str) -> bool:
        """True if an entry for ``key`` is on disk (not verified)."""
        return self._store.contains(key)

    def put(self, key: str, table: pa.Table) -> bool:
        """Publish ``table`` under ``key``: True if cached (now or before by anyone), False
        if it is bigger than the whole budget or the disk refused it (the read goes on)."""
        if os.path.exists(self._store.entry_path(key)):
            return True
        counter = pa.MockOutputStream()
        with pa.ipc.new_file(counter, table.schema) as w:
            w.write_table(table)
        n = counter.size()
        size = n + _TRAILER.size
        if size > self.budget_bytes:
            return False
        view = _scratch(size)
        with pa.ipc.new_file(pa.FixedSizeBufferWriter(pa.py_buffer(view)), table.schema) as w:
            w.write_table(table)
        bound = _BOUND.pack(n, bytes.fromhex(key), table.num_rows)
        view[n:] = _TRAILER.pack(_MAGIC, _digest(view[:n], bound), *_BOUND.unpack(bound))
        return self._store.put(key, view)

    def info(self) -> dict[str, object]:
        """``{"dir", "entries", "bytes", "budget", "plans"}`` measured on disk."""
        return self._store.info()

    def clear(self) -> int:
        """Remove every entry; returns the bytes freed."""
        return self._store.clear()


_local = threading.local()


def _scratch(size: int) -> memoryview:
    """A writable view of ``size`` bytes of this thread's reused scratch memory.

    Fresh memory costs a page fault per 4 KiB on first touch, which on the benchmark VM could
    cost more than encoding the table; a thread re-uses one buffer for every entry it writes.
    """
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        buf = _local.buf = mmap.mmap(-1, max(size, 2 * len(buf) if buf is not None else 0))
    return memoryview(buf)[:size]


def _digest(body, bound: bytes) -> bytes:
    """The xxh3-128 of an entry's IPC bytes followed by its bound part (length, key, rows):
    rewriting the key or row count in a trailer breaks the hash as a flipped byte does."""
    h = xxhash.xxh3_128(body)
    h.update(bound)
    return h.digest()


def _check(mapped: pa.Buffer, size: int, key: str, schema: pa.Schema,
           rows: int | None) -> pa.Table | None:
    """The table in the mapped entry of ``key`` if its trailer, hash, key, schema and row
    count hold, else None."""
    if size < _TRAILER.size or mapped.size != size:
        return None
    magic, digest, n, bound_key, n_rows = _TRAILER.unpack_from(mapped, size - _TRAILER.size)
    # The cheap checks first: a misplaced entry is refused without hashing it.
    if (magic != _MAGIC or n != size - _TRAILER.size or bound_key != bytes.fromhex(key)
            or (rows is not None and n_rows != rows)):
        return None
    body = mapped.slice(0, n)
    if _digest(body, _BOUND.pack(n, bound_key, n_rows)) != digest:
        return None
    try:
        table = pa.ipc.open_file(pa.BufferReader(body)).read_all()   # views of the map
    except (pa.ArrowException, ValueError, OSError):
        return None
    if table.num_rows != n_rows or not table.schema.equals(schema, check_metadata=False):
        return None
    return table


def as_decoded_cache(value) -> DecodedDiskCache | None:
    """What ``open_dataset(decoded_cache=...)`` means: a cache, a folder, ``False`` (none),
    or ``None`` (a cache at ``$ZEPHON_DECODED_CACHE_DIR`` when it is set, else none).

    >>> as_decoded_cache(False) is None, as_decoded_cache(tmp).directory == tmp
    (True, True)
    """
    if value is False:
        return None
    if value is None:
        return DecodedDiskCache() if os.environ.get(ENV_DIR) else None
    if isinstance(value, DecodedDiskCache):
        return value
    if isinstance(value, (str, os.PathLike)):
        return DecodedDiskCache(value)
    raise TypeError(f"decoded_cache must be a DecodedDiskCache, a folder path, None or False; "
                    f"got {type(value).__name__}")


def _unpickle(directory: str, budget_bytes: int, low_water: float) -> DecodedDiskCache:
    return DecodedDiskCache(directory, budget_bytes=budget_bytes, low_water=low_water)

