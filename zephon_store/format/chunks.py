"""Format v4's row-group index: every row count at once, byte ranges and hashes in chunks.

A loader's order needs the row count of every row group; the byte range and hash of a row
group only when it reads that row group. So format v4 (``formats/SPEC.md``, section 4.1)
splits the v3 ``row_groups`` table in two:

- the **row-group index** (``tables.row_groups``): one row per chunk of ``K`` consecutive
  row groups (``K`` is the manifest's ``row_groups_per_chunk``), holding the chunk's row
  counts (a list of the smallest unsigned type that holds every count), the xxh3 and size
  of the chunk's file, and the sum of its row groups' lengths. ~1 byte per row group for
  fixed-size windows once compressed, so 10^6 row groups cost a rank ~1 MB, not 60;
- the **chunks**, ``index/<xxh3>.arrow`` each: ``offset``, ``length``, ``xxh3`` of its
  ``K`` row groups, fetched (through the node cache), verified and checked by
  :class:`ChunkedDetails` the first time one of its row groups is indexed.

Shard and ``row_start`` columns are not stored: they follow from the shard table and a
running sum.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from .._util.arrow import column_np, i64, numbers
from ..errors import ManifestError

# 1,024 row groups a chunk: a dataset of up to ~1,000 row groups has one chunk (one request,
# like v3's whole table), and a chunk is ~32 KiB raw, so the few chunks a first step touches
# at 10^6 row groups stay far below the ~2 MB a rank may spend on its index (issue 31).
ROW_GROUPS_PER_CHUNK = 1024
# Chunk fetches side by side (the distinct chunks of a step, in one round trip).
_FETCH_THREADS = 16
COUNT_TYPES = (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())
CHUNK_TABLE_SCHEMA = pa.schema([
    ("offset", pa.int64()),
    ("length", pa.int64()),
    ("xxh3", pa.binary(16)),
])


def index_table_schema(count_type: pa.DataType) -> pa.Schema:
    """The v4 ``row_groups`` table's schema whose row counts are of ``count_type``."""
    return pa.schema([
        ("rows", pa.large_list(pa.field("item", count_type, nullable=False))),
        ("xxh3", pa.binary(16)),
        ("bytes", pa.int64()),
        ("row_group_bytes", pa.int64()),
    ])


INDEX_TABLE_SCHEMAS = tuple(index_table_schema(t) for t in COUNT_TYPES)


def count_type(max_rows: int) -> pa.DataType:
    """The smallest unsigned type that holds ``max_rows``.

    >>> count_type(255), count_type(256)
    (DataType(uint8), DataType(uint16))
    """
    for t in COUNT_TYPES:
        if max_rows <= np.iinfo(t.to_pandas_dtype()).max:
            return t
    raise ValueError(f"a row count of {max_rows} does not fit 64 bits")


def chunk_tables(offset: np.ndarray, length: np.ndarray, digests: np.ndarray,
                 per_chunk: int) -> list[pa.Table]:
    """The chunk tables of row groups given by ``offset``, ``length`` and ``digests`` (an
    ``(n, 16)`` uint8 array of xxh3 digests), ``per_chunk`` row groups each."""
    out = []
    for lo in range(0, len(offset), per_chunk):
        hi = min(len(offset), lo + per_chunk)
        d = np.ascontiguousarray(digests[lo:hi], dtype=np.uint8)
        out.append(pa.table([
            i64(offset[lo:hi]),
            i64(length[lo:hi]),
            pa.Array.from_buffers(pa.binary(16), hi - lo, [None, pa.py_buffer(d.tobytes())]),
        ], schema=CHUNK_TABLE_SCHEMA))
    return out


def index_table(rows: np.ndarray, length: np.ndarray, chunk_refs: list[tuple[bytes, int]],
                per_chunk: int) -> pa.Table:
    """The v4 ``row_groups`` table: per chunk its row counts, its file's ``(xxh3 digest,
    bytes)`` from ``chunk_refs``, and the sum of its row groups' lengths."""
    rows = np.asarray(rows, dtype=np.int64)
    t = count_type(int(rows.max()) if rows.size else 0)
    n = len(chunk_refs)
    bounds = np.minimum(np.arange(n + 1, dtype=np.int64) * per_chunk, rows.size)
    values = numbers(rows, t)
    lists = pa.LargeListArray.from_arrays(i64(bounds), values,
                                          type=index_table_schema(t).field("rows").type)
    sums = np.add.reduceat(np.asarray(length, np.int64), bounds[:-1]) if n else np.zeros(0)
    digests = b"".join(d for d, _ in chunk_refs)
    return pa.table([
        lists,
        pa.Array.from_buffers(pa.binary(16), n, [None, pa.py_buffer(digests)]),
        i64([b for _, b in chunk_refs]),
        i64(sums),
    ], schema=index_table_schema(t))


class DetailColumn:
    """One column (``offset`` or ``length``) of the row groups, fetched chunk by chunk on
    first index: ``col[g]`` reads one chunk, ``col[array]`` every distinct chunk of the
    array at once; ``np.asarray(col)`` all of them (checks and tools, never the read path)."""

    def __init__(self, details: ChunkedDetails, field: int) -> None:
        self._details = details
        self._field = field
        self.size = details.num_row_groups
        self.shape = (self.size,)
        self.dtype = np.dtype(np.int64)
        self.ndim = 1

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key):
        d = self._details
        if isinstance(key, (int, np.integer)):
            g = int(key)
            if not 0 <= g < self.size:
                if not -self.size <= g < 0:
                    raise IndexError(f"row group {g} is out of range [0, {self.size})")
                g += self.size
            c, i = divmod(g, d.per_chunk)
            return d.chunk(c)[self._field][i]
        idx = np.arange(self.size)[key] if isinstance(key, slice) else np.asarray(key)
        if idx.dtype.kind not in "iu":
            raise IndexError(f"row groups are indexed by integers, not {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        idx = np.where(idx < 0, idx + self.size, idx)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.size):
            raise IndexError(f"row groups out of range [0, {self.size})")
        chunks = idx // d.per_chunk
        d.ensure(np.unique(chunks))
        out = np.empty(idx.shape, dtype=np.int64)
        for c in np.unique(chunks):
            sel = chunks == c
            out[sel] = d.chunk(int(c))[self._field][idx[sel] - int(c) * d.per_chunk]
        return out

    def __array__(self, dtype=None, copy=None):
        whole = self[np.arange(self.size)]
        return whole if dtype is None else whole.astype(dtype)

    def sum(self) -> np.int64:
        """Sum over every row group (fetches every chunk)."""
        return np.asarray(self).sum()

    def max(self) -> np.int64:
        """Largest value over every row group (fetches every chunk)."""
        return np.asarray(self).max()

    def astype(self, dtype) -> np.ndarray:
        return np.asarray(self).astype(dtype)


class ChunkedDetails:
    """The row groups' byte ranges and hashes of a v4 manifest, one chunk fetched on first use.

    ``table``: the v4 ``row_groups`` table; ``read(xxh3 hex) -> bytes``: a chunk file's
    verified bytes (None: none can be read, e.g. a manifest built in memory without them);
    ``check(chunk, first, offset, length)``: raises ManifestError when a chunk's values do
    not fit the shard table; ``parallel``: fetch several chunks side by side (remote data).
    Threads asking for the same chunk wait for its one fetch.
    """

    def __init__(self, table: pa.Table, *, per_chunk: int, num_row_groups: int, url: str,
                 read: Callable[[str], bytes] | None,
                 check: Callable[[int, int, np.ndarray, np.ndarray], None],
                 parallel: bool = False) -> None:
        self.per_chunk = int(per_chunk)
        self.num_row_groups = int(num_row_groups)
        self.url = url
        self._read = read
        self._check = check
        self._parallel = parallel
        self._digests = table.column("xxh3").combine_chunks()
        self.chunk_bytes = column_np(table.column("bytes"))
        self.row_group_bytes = column_np(table.column("row_group_bytes"))
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._after_fork()
        self.offset = DetailColumn(self, 0)
        self.length = DetailColumn(self, 1)
        _LIVE.add(self)

    def __getstate__(self) -> dict:
        # Pickled with its manifest (a Dataset sent to a spawned worker): the chunks fetched
        # so far travel, the lock, the fetches in flight and the threads do not.
        state = self.__dict__.copy()
        for key in ("_lock", "_inflight", "_pool"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._after_fork()
        _LIVE.add(self)

    def _after_fork(self) -> None:
        # A thread of the parent may have held the lock or run a fetch at the fork.
        self._lock = threading.Lock()
        self._inflight: dict[int, Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_bytes)

    def chunk_xxh3(self, c: int) -> str:
        """The xxh3 (hex) of chunk ``c``'s file, ``index/<xxh3>.arrow``."""
        return self._digests[int(c)].as_py().hex()

    def paths(self) -> dict[str, int]:
        """``{index/<xxh3>.arrow: bytes}`` of every chunk file."""
        return {f"index/{self.chunk_xxh3(c)}.arrow": int(self.chunk_bytes[c])
                for c in range(self.num_chunks)}

    def xxh3(self, rg: int) -> str:
        """Row group ``rg``'s xxh3 (hex)."""
        c, i = divmod(int(rg), self.per_chunk)
        return self.chunk(c)[2][i].tobytes().hex()

    def loaded(self) -> list[int]:
        """The chunks fetched so far."""
        return sorted(self._chunks)

    def peek(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Chunk ``c``'s ``(offset, length, digests)`` if fetched already, else None."""
        return self._chunks.get(int(c))

    def chunk(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Chunk ``c``'s ``(offset, length, digests)``, fetched and checked on first use."""
        got = self._chunks.get(c)
        if got is not None:
            return got
        self.ensure([c])
        return self._chunks[c]

    def ensure(self, chunks) -> None:
        """Fetch the chunks of ``chunks`` not fetched yet, side by side, and wait for them."""
        for fut in self._start(chunks, wait=True):
            fut.result()

    def warm(self, rgs) -> None:
        """Start fetching the chunks of row groups ``rgs`` in the background (returns at once):
        a reader calls it before fetching a shard's footer, so both travel in one round trip."""
        if self._read is not None and self._parallel:
            self._start(np.unique(np.asarray(rgs, dtype=np.int64) // self.per_chunk),
                        wait=False)

    def load_all(self) -> None:
        """Fetch every chunk (verify, tools)."""
        self.ensure(range(self.num_chunks))

    def _start(self, chunks, *, wait: bool) -> list[Future]:
        futures, mine = [], []
        with self._lock:
            for c in (int(c) for c in chunks):
                if c in self._chunks:
                    continue
                fut = self._inflight.get(c)
                if fut is None:
                    fut = self._inflight[c] = Future()
                    mine.append((c, fut))
                futures.append(fut)
            if mine and (len(mine) > 1 or not wait) and self._parallel and self._pool is None:
                self._pool = ThreadPoolExecutor(_FETCH_THREADS,
                                                thread_name_prefix="zephon-index-chunk")
            pool = self._pool
        if pool is not None and (len(mine) > 1 or not wait):
            for c, fut in mine:
                pool.submit(self._run, c, fut)
        else:
            for c, fut in mine:
                self._run(c, fut)
        return futures

    def _run(self, c: int, fut: Future) -> None:
        try:
            got = self._load(c)
            with self._lock:
                self._chunks[c] = got
            fut.set_result(None)
        except BaseException as exc:   # handed to every waiter; a later call tries again
            fut.set_exception(exc)
        finally:
            with self._lock:
                self._inflight.pop(c, None)

    def _load(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not 0 <= c < self.num_chunks:
            raise IndexError(f"chunk {c} is out of range [0, {self.num_chunks})")
        h = self.chunk_xxh3(c)
        if self._read is None:
            raise ManifestError(f"{self.url}: row-group chunk index/{h}.arrow is not available "
                                "to this manifest (built in memory without its chunks)")
        table = parse_chunk(self._read(h), f"{self.url}: row-group chunk index/{h}.arrow")
        first = c * self.per_chunk
        want = min(self.per_chunk, self.num_row_groups - first)
        if table.num_rows != want:
            raise ManifestError(f"{self.url}: row-group chunk {c} (index/{h}.arrow) holds "
                                f"{table.num_rows} row groups, not {want}; the manifest is "
                                "corrupted or forged: restore it or re-convert")
        offset = column_np(table.column("offset"))
        length = column_np(table.column("length"))
        digests = np.frombuffer(table.column("xxh3").combine_chunks().buffers()[1], np.uint8,
                                count=16 * want).reshape(want, 16)
        self._check(c, first, offset, length)
        return offset, length, digests


_LIVE: weakref.WeakSet[ChunkedDetails] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for d in list(_LIVE):
        d._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def parse_chunk(data: bytes, where: str) -> pa.Table:
    """A chunk file's table; ManifestError unless it is Arrow IPC of exactly
    :data:`CHUNK_TABLE_SCHEMA` without nulls."""
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ManifestError(f"{where} is not a readable Arrow IPC file ({type(exc).__name__}: "
                            f"{exc}); re-convert the dataset") from exc
    if not table.schema.equals(CHUNK_TABLE_SCHEMA):
        raise ManifestError(f"{where} has schema {table.schema}, expected {CHUNK_TABLE_SCHEMA}")
    if any(col.null_count for col in table.columns):
        raise ManifestError(f"{where} has nulls; re-convert the dataset")
    return table
