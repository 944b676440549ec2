"""Read a dataset by global sequence number, locally or from object storage.

Reads are by row group: the row group is the unit of I/O (one ranged GET), of integrity
checking (its xxh3 is checked before decoding) and of decoding. Footers are fetched once per
shard and kept. Decoded row groups are kept in a small in-memory LRU bounded in bytes, and
remote byte ranges can go through a node-local disk cache keyed by content hash.
"""

from __future__ import annotations

import operator
import os
import stat
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._util.arrow import i64
from .._util.decode import array_view
from .._util.hashing import DATASET_ID_PREFIX, HEX_RE, xxh3_hex
from ..errors import ManifestError
from ..format.footer import chunk_range_problem
from ..format.index import Located, as_seqs, locate
from ..format.manifest import PARSE_ERRORS, Manifest, load_manifest, require_regular_file
from ..io.storage import Storage
from .pages import read_fixed_chunk
from .rangefile import RangeFile

DEFAULT_DECODE_CACHE_BYTES = 256 << 20
_MAX_MAPPED_SHARDS = 256  # open memory maps kept per Dataset (one file descriptor each)


class _LRU:
    """A thread-safe LRU of decoded row groups bounded by bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._d: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: int) -> pa.Table | None:
        with self._lock:
            t = self._d.get(key)
            if t is not None:
                self._d.move_to_end(key)
            return t

    def __contains__(self, key: int) -> bool:
        with self._lock:
            return key in self._d

    def put(self, key: int, table: pa.Table) -> None:
        if self.budget <= 0:
            return
        with self._lock:
            if key in self._d:
                return
            self._d[key] = table
            self.used += table.nbytes
            while self.used > self.budget and len(self._d) > 1:
                _, old = self._d.popitem(last=False)
                self.used -= old.nbytes


class Dataset:
    """A converted dataset opened for reading. Use :func:`open_dataset` to make one.

    >>> ds = open_dataset("/data/ds")                 # doctest: +SKIP
    >>> ds.num_samples, ds.dataset_id                 # doctest: +SKIP
    >>> ds.take([5, 0, 5]).column("text").to_pylist() # doctest: +SKIP
    """

    def __init__(self, url: str, *, storage_options: dict | None = None, cache=None,
                 decode_cache_bytes: int = DEFAULT_DECODE_CACHE_BYTES, retry=None,
                 io_threads: int = 8, expect_dataset_id: str | None = None) -> None:
        check_dataset_id(expect_dataset_id)   # a malformed pin fails before any I/O
        self.url = url
        self.storage_options = storage_options
        self._cache_arg = cache
        self._retry = retry
        self._decode_cache_bytes = decode_cache_bytes
        self._io_threads = io_threads
        self._setup()
        self.manifest: Manifest = load_manifest(self.storage)
        if expect_dataset_id is not None:
            self.expect_id(expect_dataset_id)

    def expect_id(self, dataset_id: str) -> None:
        """Raise :class:`~zephon_store.errors.ManifestError` unless this is dataset
        ``dataset_id`` (``"xxh3:<32 hex>"``; ValueError if malformed).

        >>> ds.expect_id("xxh3:9f0c...")   # doctest: +SKIP
        """
        check_dataset_id(dataset_id)
        if self.manifest.dataset_id != dataset_id:
            raise ManifestError(
                f"{self.storage.url('manifest.json')} holds dataset {self.manifest.dataset_id},"
                f" not the expected {dataset_id}: the data at {self.url} was replaced or the "
                "URL is wrong; point at the dataset the run was pinned to, or update the pin")

    def _setup(self) -> None:
        self.storage = Storage(self.url, storage_options=self.storage_options, retry=self._retry)
        self.cache = self._make_cache(self._cache_arg)
        self._footers: dict[int, pq.FileMetaData] = {}
        self._footer_lock = threading.Lock()
        self._leaf_info: dict[int, tuple[pa.Schema, dict]] = {}
        self._decoded = _LRU(self._decode_cache_bytes)
        # Row groups being decoded right now -> the Future of their table. The loader's
        # prefetch threads ask for the same row group at once (a sequential token batch is a
        # quarter of one); without this each of them decoded it (3.6x the work, measured by
        # tools/bench/bench_loader.py), with it the others wait for the one decode.
        self._inflight: dict[int, Future] = {}
        self._inflight_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = -1
        # Local shards, memory-mapped once (content-addressed files never change in place).
        self._mmaps: dict[int, pa.Buffer] = {}
        self._mmaps_pid = os.getpid()

    def _make_cache(self, cache):
        # Local datasets are read in place; a disk cache only pays for remote bytes.
        if cache is False or (cache is None and self.storage.local):
            return None
        from ..io.cache import ChunkCache

        if isinstance(cache, ChunkCache):
            return cache
        return ChunkCache(cache if isinstance(cache, str) else None)

    # Pickling (DataLoader workers) carries the manifest and options, not threads or caches.
    def __getstate__(self) -> dict:
        return {"url": self.url, "storage_options": self.storage_options,
                "_cache_arg": self._cache_arg if not hasattr(self._cache_arg, "directory")
                else self._cache_arg.directory,
                "_retry": self._retry, "_decode_cache_bytes": self._decode_cache_bytes,
                "_io_threads": self._io_threads, "manifest": self.manifest}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    # -- facts -------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return self.manifest.num_samples

    def __len__(self) -> int:
        return self.manifest.num_samples

    @property
    def schema(self) -> pa.Schema:
        return self.manifest.schema

    @property
    def dataset_id(self) -> str:
        return self.manifest.dataset_id

    @property
    def num_shards(self) -> int:
        return self.manifest.num_shards

    def locate(self, seqs) -> Located:
        """Vectorised lookup of (shard, row group, row) for global sequence numbers."""
        return locate(self.manifest, seqs)

    # -- reading -------------------------------------------------------------------------
    def footer(self, shard: int) -> pq.FileMetaData:
        """The Parquet footer of ``shard``, fetched and verified once, then kept."""
        shard = int(shard)
        md = self._footers.get(shard)
        if md is not None:
            return md
        m = self.manifest
        start, end = int(m.footer_offset[shard]), int(m.shard_bytes[shard])
        data = self._fetch(shard, start, end, m.shard_footer_xxh3(shard),
                           f"shard {m.shard_name(shard)} footer")
        # The footer bytes end with the 4-byte length and "PAR1"; prefixing the leading magic
        # makes a minimal buffer pyarrow parses as a file (offsets inside are not checked).
        try:
            md = pq.read_metadata(pa.BufferReader(b"PAR1" + data))
        except PARSE_ERRORS as exc:
            raise self._forged(shard, f"its footer (bytes {start}..{end}, hash verified) does "
                               f"not parse: {exc}") from exc
        self._check_footer(shard, md)
        with self._footer_lock:
            self._footers[shard] = md
        return md

    def _forged(self, shard: int, what: str) -> ManifestError:
        m = self.manifest
        return ManifestError(
            f"shard {m.shard_name(shard)} at {self.storage.url(m.shard_path(shard))}: {what}; "
            f"the manifest disagrees with the shard it names (forged or corrupted): run "
            f"'zephon verify {self.url}' and re-convert")

    def _check_footer(self, shard: int, md: pq.FileMetaData) -> None:
        """The footer agrees with the manifest: schema, row groups and their row counts.

        Nothing is decoded from a shard before this passed: a manifest whose schema says
        int64 over shards holding strings must not hand out strings.
        """
        m = self.manifest
        first, n = int(m.shard_first_rg[shard]), int(m.shard_num_rgs[shard])
        if md.num_row_groups != n:
            raise self._forged(shard, f"its footer holds {md.num_row_groups} row groups, the "
                               f"manifest says {n}")
        for local in range(n):
            got, want = md.row_group(local).num_rows, int(m.rg_rows[first + local])
            if got != want:
                raise self._forged(shard, f"row group {local} holds {got} rows, the manifest "
                                   f"says {want}")
        try:
            schema = md.schema.to_arrow_schema()
        except PARSE_ERRORS as exc:
            raise self._forged(shard, f"its footer's schema does not convert: {exc}") from exc
        if not schema.equals(m.storage_schema, check_metadata=False):
            raise self._forged(shard, f"its schema {schema} differs from the manifest's "
                               f"{'storage schema' if m.storage else 'schema'} {m.storage_schema}")

    def _check_chunk_ranges(self, rg: int, shard: int, meta) -> None:
        problem = chunk_range_problem(self.manifest, rg, meta)
        if problem is not None:
            raise self._forged(shard, problem)

    def _fetch(self, shard: int, start: int, end: int, xxh3: str, what: str) -> bytes:
        rel = self.manifest.shard_path(shard)
        require_regular_file(self.storage, rel)
        if self.cache is None:
            return self.storage.read_range(rel, start, end, expected_xxh3=xxh3, what=what)
        return self.cache.get_or_fetch(
            xxh3, lambda: self.storage.read_range(rel, start, end, expected_xxh3=xxh3, what=what))

    def fetch_row_group_bytes(self, rg: int) -> bytes:
        """The verified bytes of global row group ``rg`` (through the disk cache if any).

        A row group the prefetcher planned into a coalesced range comes from that range (run
        here if no prefetch thread has started it yet), never from a second request.
        """
        fetcher = self.__dict__.get("_range_fetcher")
        if fetcher is not None and fetcher[0] == os.getpid():
            data = fetcher[1].take(rg)
            if data is not None:
                return data
        return self._fetch_row_group_alone(rg)

    def range_fetcher(self, options=None):
        """This process's :class:`~zephon_store.io.coalesce.RangeFetcher` (made on first use;
        ``options``, a :class:`~zephon_store.io.coalesce.CoalesceOptions`, apply when it is made)."""
        from ..io.coalesce import RangeFetcher

        with self._footer_lock:
            cur = self.__dict__.get("_range_fetcher")
            if cur is None or cur[0] != os.getpid():
                cur = self.__dict__["_range_fetcher"] = (os.getpid(), RangeFetcher(self, options))
            return cur[1]

    def _fetch_row_group_alone(self, rg: int) -> bytes:
        """Row group ``rg`` by its own ranged GET (through the disk cache if any)."""
        m = self.manifest
        rg = int(rg)
        shard = int(m.rg_shard[rg])
        off, length = int(m.rg_offset[rg]), int(m.rg_length[rg])
        return self._fetch(shard, off, off + length, m.rg_xxh3(rg),
                           f"shard {m.shard_name(shard)} row group {m.rg_local_index(rg)}")

    def read_row_group(self, rg: int, *, keep: bool = True) -> pa.Table:
        """Decode global row group ``rg`` (verified against its xxh3 before decoding).

        Concurrent calls for the same row group decode it once; the others wait for it.
        ``keep=False`` does not add a fresh decode to the decode cache (the loader's
        pipeline holds what it reads itself and drops it after its last use).
        """
        rg = int(rg)
        t = self._decoded.get(rg)
        if t is not None:
            return t
        with self._inflight_lock:
            t = self._decoded.get(rg)  # a decode may have finished since the check above
            if t is not None:
                return t
            fut = self._inflight.get(rg)
            owner = fut is None
            if owner:
                fut = self._inflight[rg] = Future()
        if not owner:
            return fut.result()
        try:
            t = self._decode_row_group(rg)
            if keep:
                self._decoded.put(rg, t)
            fut.set_result(t)
            return t
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            with self._inflight_lock:
                del self._inflight[rg]

    def _decode_row_group(self, rg: int) -> pa.Table:
        m = self.manifest
        shard = int(m.rg_shard[rg])
        md = self.footer(shard)
        local = m.rg_local_index(rg)
        mapped = self._mapped_row_group(rg, shard)
        if mapped is not None:
            # Local fast path: decode straight from the memory-mapped shard, whose bytes of
            # this row group were just hashed (no copy, no Python file object in between).
            buf, base = mapped, 0
            source = pa.BufferReader(mapped)
        else:
            base = int(m.rg_offset[rg])
            data = self.fetch_row_group_bytes(rg)
            buf = pa.py_buffer(data)
            source = RangeFile(int(m.shard_bytes[shard]), {base: data},
                               name=self.storage.url(m.shard_path(shard)))
        # Fixed-size binary columns (token windows) straight from their pages: zero-copy
        # from verified bytes where pages.py can read them exactly, else pyarrow decodes.
        schema, fixed = self._leaves(shard, md)
        meta = md.row_group(local)
        self._check_chunk_ranges(rg, shard, meta)
        try:
            t = self._decode_checked(source, buf, base, md, meta, local, schema, fixed)
        except PARSE_ERRORS as exc:
            # The bytes passed their hash: a manifest that vouches for undecodable bytes.
            raise self._forged(shard, f"row group {local} (hash verified) does not decode: "
                               f"{type(exc).__name__}: {exc}") from exc
        return m.to_logical(t)  # storage types -> manifest schema; a no-op for v1 datasets

    def _decode_checked(self, source, buf, base: int, md, meta, local: int,
                        schema: pa.Schema, fixed: dict) -> pa.Table:
        direct = {}
        for name, (ci, max_def, max_rep, width) in fixed.items():
            col = read_fixed_chunk(buf, base, meta.column(ci), max_def, max_rep, width)
            if col is not None:
                direct[name] = col
        # use_threads=False: row groups are ~1 MiB and callers decode several at once in
        # their own threads; Arrow's pool cost 40-60 us of handoffs per call on top.
        if not direct:
            t = pq.ParquetFile(source, metadata=md).read_row_group(local, use_threads=False)
        else:
            rest = [f.name for f in schema if f.name not in direct]
            other = (pq.ParquetFile(source, metadata=md).read_row_group(
                local, columns=rest, use_threads=False) if rest else None)
            t = pa.Table.from_arrays(
                [direct[f.name] if f.name in direct else other.column(f.name) for f in schema],
                schema=schema)
        return t

    def _leaves(self, shard: int, md: pq.FileMetaData) -> tuple[pa.Schema, dict]:
        """``shard``'s Arrow schema and its top-level fixed-size binary leaves (cached).

        The leaves map a column name to ``(leaf index, max definition level, max
        repetition level, byte width)``, what :func:`~zephon_store.read.pages.read_fixed_chunk`
        needs.
        """
        got = self._leaf_info.get(shard)
        if got is not None:
            return got
        schema = md.schema.to_arrow_schema()
        fixed = {}
        names = schema.names
        for ci in range(md.num_columns):
            leaf = md.schema.column(ci)
            if (leaf.path in names and names.count(leaf.path) == 1
                    and pa.types.is_fixed_size_binary(schema.field(leaf.path).type)):
                fixed[leaf.path] = (ci, leaf.max_definition_level, leaf.max_repetition_level,
                                    schema.field(leaf.path).type.byte_width)
        with self._footer_lock:
            self._leaf_info[shard] = (schema, fixed)
        return schema, fixed

    def _mapped_row_group(self, rg: int, shard: int) -> pa.Buffer | None:
        """The whole mapped shard if it is local and row group ``rg``'s bytes verify, else None.

        ``None`` sends the caller down the ordinary path, which re-reads, retries and raises
        the precise error (missing shard, short file, IntegrityError) when something is wrong.
        """
        if not self.storage.local:
            return None
        m = self.manifest
        buf = self._mmaps.get(shard)
        if buf is None or self._mmaps_pid != os.getpid():
            path = self.storage.url(m.shard_path(shard))
            try:
                # Opening a FIFO blocks and a device maps endless bytes: regular files only.
                if not stat.S_ISREG(os.stat(path).st_mode):
                    return None
                buf = pa.memory_map(path, "r").read_buffer()
            except OSError:
                return None
            if buf.size != int(m.shard_bytes[shard]):
                return None
            with self._footer_lock:
                if self._mmaps_pid != os.getpid():
                    self._mmaps, self._mmaps_pid = {}, os.getpid()
                if len(self._mmaps) >= _MAX_MAPPED_SHARDS:
                    self._mmaps.pop(next(iter(self._mmaps)))
                self._mmaps[shard] = buf
        off, length = int(m.rg_offset[rg]), int(m.rg_length[rg])
        if xxh3_hex(memoryview(buf)[off:off + length]) != m.rg_xxh3(rg):
            return None
        return buf

    def read_row_groups(self, rgs) -> list[pa.Table]:
        """Decode several row groups, in parallel threads (pyarrow releases the GIL)."""
        rgs = [int(r) for r in rgs]
        # Decoded ones are taken here: a shuffled batch touches dozens of row groups, mostly
        # cached, and a pool task per cached one cost more than the batch's own work.
        out = [self._decoded.get(r) for r in rgs]
        missing = [i for i, t in enumerate(out) if t is None]
        if len(missing) <= 1 or self._io_threads <= 1:
            for i in missing:
                out[i] = self.read_row_group(rgs[i])
            return out
        if self._pool is None or self._pool_pid != os.getpid():
            # A pool inherited through fork has no threads; make a fresh one in this process.
            self._pool = ThreadPoolExecutor(self._io_threads, thread_name_prefix="zephon-io")
            self._pool_pid = os.getpid()
        for i, t in zip(missing, self._pool.map(self.read_row_group, [rgs[i] for i in missing])):
            out[i] = t
        return out

    def take(self, seqs) -> pa.Table:
        """Rows at global sequence numbers ``seqs``, in that order (repeats allowed).

        Reads only the row groups that hold them, each once per call.
        """
        loc = self.locate(seqs)
        if loc.seq.size == 0:
            return self.schema.empty_table()
        rgs, inverse = np.unique(loc.row_group, return_inverse=True)
        return gather_rows(self.read_row_groups(rgs), inverse.reshape(-1), loc.row_in_group)

    def __getitem__(self, seq: int) -> dict:
        """One record as a dict: ``ds[17]``.

        Values are Python objects, except fixed-size lists of numbers (token windows),
        which come as a 1-D numpy array viewing the decoded row group (read-only), as in
        the loader's batches. The row group is decoded once and kept in the decode cache.

        >>> ds[17]["text"]               # doctest: +SKIP
        >>> ds[17]["tokens"].shape       # doctest: +SKIP
        (2049,)
        """
        if isinstance(seq, (bool, np.bool_)):
            # operator.index(True) is 1: a mask or a flag passed by mistake must not read
            # sample 1 (take() rejects bools too).
            raise TypeError(f"a sequence number must be an int, not bool ({seq!r})")
        try:
            s = operator.index(seq)
        except TypeError:
            s = None
        if s is None or not 0 <= s < self.num_samples:
            as_seqs([seq], self.num_samples)  # raises the precise error
            raise TypeError(f"a sequence number must be an int, got {seq!r}")
        m = self.manifest
        # One scalar search: locate() builds arrays for many ids, ~10 us of overhead here.
        rg = int(m.rg_row_start.searchsorted(s, "right")) - 1
        row = self.read_row_group(rg).slice(s - int(m.rg_row_start[rg]), 1)
        return {name: _first_value(col) for name, col in zip(row.column_names, row.columns)}

    @property
    def decode_cache_bytes(self) -> int:
        """Byte budget of the in-memory cache of decoded row groups."""
        return self._decode_cache_bytes

    def reserve_decode_cache(self, nbytes: int) -> None:
        """Grow the decoded row-group cache to at least ``nbytes`` (never shrinks it).

        A reader whose order keeps more row groups in use than the cache holds decodes each
        of them many times (LRU evicts exactly the ones needed next); the loader sizes it to
        its order's working set. Pickled copies (DataLoader workers) keep the size.
        """
        if nbytes > self._decode_cache_bytes:
            self._decode_cache_bytes = int(nbytes)
            self._decoded.budget = int(nbytes)

    def close(self) -> None:
        """Stop this dataset's I/O threads (waiting for them) and drop its buffers.

        Deterministic: when it returns no thread of this dataset holds an Arrow buffer, so
        nothing is freed during interpreter shutdown (a pool thread doing that aborted the
        process, exit 134). The dataset stays usable: a later read starts a fresh pool.
        ``with open_dataset(url) as ds:`` calls it.
        """
        pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown(wait=True, cancel_futures=True)
        with self._footer_lock:
            self._mmaps = {}
        self._decoded = _LRU(self._decode_cache_bytes)

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def gather_rows(tables: list[pa.Table], inverse: np.ndarray, rows: np.ndarray) -> pa.Table:
    """Row ``rows[j]`` of ``tables[inverse[j]]`` for every j, in that order, as one table.

    A result past 2 GiB of text (one Arrow chunk of a string column holds at most that:
    32-bit offsets) comes in several chunks, with the schema unchanged.

    >>> t = pa.table({"x": [0, 1, 2]}); u = pa.table({"x": [10, 11]})
    >>> gather_rows([t, u], np.array([1, 0, 0]), np.array([1, 2, 0])).column("x").to_pylist()
    [11, 2, 0]
    """
    try:
        return _gather_rows(tables, inverse, rows)
    except pa.ArrowInvalid as exc:
        if "overflow" not in str(exc) or rows.size < 2:
            raise
    # Arrow refused a chunk past 2 GiB ("offset overflow"): halve the request until each
    # half fits. Trying first costs nothing on the usual path (an estimate of the result's
    # size cost ~40 us a call); the rare huge take pays one failed attempt.
    half = rows.size // 2
    return pa.concat_tables([gather_rows(tables, inverse[:half], rows[:half]),
                             gather_rows(tables, inverse[half:], rows[half:])])


def _gather_rows(tables: list[pa.Table], inverse: np.ndarray, rows: np.ndarray) -> pa.Table:
    if len(tables) == 1:
        return _rows(tables[0], rows)
    # Take from each row group, then put the rows in the requested order. A take on the
    # concatenated row groups would be one call, but Arrow's take on a many-chunk column
    # of a nested or variable-width type (token windows, text) first concatenates every
    # chunk: it copied all the row groups a batch touches (~28 MB for a 256 KB shuffled
    # batch of token windows) where this copies only the rows asked for.
    by_group = np.argsort(inverse, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(tables)))])
    grouped_rows = rows[by_group]
    grouped = pa.concat_tables([_rows(t, grouped_rows[bounds[k]:bounds[k + 1]])
                                for k, t in enumerate(tables)])
    if (by_group[1:] > by_group[:-1]).all():
        return grouped  # already in the requested order (sequential reads)
    where = np.empty_like(by_group)
    where[by_group] = np.arange(by_group.size)
    return grouped.take(i64(where))


def _first_value(col: pa.ChunkedArray):
    """The first value of ``col`` as a Python object; fixed-size numeric lists as numpy."""
    if pa.types.is_fixed_size_list(col.type):
        view = array_view(col)   # None for non-numeric items or nulls
        if view is not None:
            return view[0]
    return col[0].as_py()


def _rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)``; a zero-copy slice when ``rows`` is one increasing run."""
    n = rows.size
    if n and int(rows[-1]) - int(rows[0]) == n - 1 and (n == 1 or bool((np.diff(rows) == 1).all())):
        return table.slice(int(rows[0]), n)
    return table.take(i64(rows))


def open_dataset(url: str, *, storage_options: dict | None = None, cache=None,
                 decode_cache_bytes: int = DEFAULT_DECODE_CACHE_BYTES, retry=None,
                 expect_dataset_id: str | None = None) -> Dataset:
    """Open the dataset at ``url`` (local path or any fsspec URL, e.g. ``s3://b/ds``).

    ``cache``: a :class:`zephon_store.io.cache.ChunkCache`, a directory, ``None`` (a disk
    cache for remote datasets only) or ``False`` (none). ``retry``: a
    :class:`~zephon_store.io.retry.RetryPolicy` (default: the ``"retry"`` storage option, else a
    60 s budget per read). ``expect_dataset_id``
    (``"xxh3:<32 hex>"``) pins the exact dataset: anything else at ``url`` raises
    :class:`~zephon_store.errors.ManifestError`. The manifest and its side tables are
    validated on open; each shard's footer is checked against them before its first
    decode. Use it as a context manager (or call :meth:`Dataset.close`) to stop its threads.

    >>> ds = open_dataset("s3://bucket/ds", storage_options={"endpoint_url": "http://127.0.0.1:8333"})  # doctest: +SKIP
    >>> ds.take([0]).to_pylist()   # doctest: +SKIP
    """
    return Dataset(url, storage_options=storage_options, cache=cache,
                   decode_cache_bytes=decode_cache_bytes, retry=retry,
                   expect_dataset_id=expect_dataset_id)


def check_dataset_id(dataset_id: str | None) -> None:
    """Raise ValueError unless ``dataset_id`` is ``None`` or ``"xxh3:"`` + 32 hex digits.

    >>> check_dataset_id("xxh3:" + "0" * 32)
    """
    if dataset_id is None:
        return
    if (not isinstance(dataset_id, str) or not dataset_id.startswith(DATASET_ID_PREFIX)
            or not HEX_RE.fullmatch(dataset_id[len(DATASET_ID_PREFIX):])):
        raise ValueError(f"expect_dataset_id must be 'xxh3:' and 32 hex digits (as "
                         f"'zephon info' prints it), got {dataset_id!r}")
