"""Read a dataset by global sequence number, locally or from object storage.

:class:`Dataset` is a thin facade: it opens the manifest, locates sequence numbers, and takes
rows. Row-group bytes and their decoding (footers, verified local or remote bytes, the disk
cache, in-flight de-duplication, the decoded LRU, fork safety) have one owner,
:class:`~zephon_store.read.rowgroups.RowGroups`, at ``Dataset.row_groups``.
"""

from __future__ import annotations

import operator
import os
import warnings
from typing import Literal, overload

import numpy as np
import pyarrow as pa

from .._util.arrow import i64
from .._util.hashing import DATASET_ID_PREFIX, HEX_RE
from .._util.to_numpy import array_view
from ..errors import ManifestError, SeqOutOfRangeError
from ..format.index import Located, as_seqs, locate
from ..format.manifest import Manifest, load_manifest
from ..io.cache import ChunkCache
from ..io.storage import Storage, is_local_url
from ..io.throttle import NodeThrottle
from .decoded_disk import DecodedDiskCache, as_decoded_cache
from .rowgroups import DEFAULT_MEMORY_CACHE_BYTES, RowGroups
from .source import SourceBase

__all__ = ["DEFAULT_MEMORY_CACHE_BYTES", "Dataset", "as_dataset", "check_dataset_id",
           "columns_repr", "gather_rows", "open_dataset"]

#: Columns a repr names before "... and N more": one screen for a wide schema.
_REPR_COLUMNS = 10
#: Characters of one column's type in a repr (a deep struct is cut with "...").
_REPR_TYPE_CHARS = 40


class Dataset(SourceBase):
    """A converted dataset opened for reading (a :class:`~zephon_store.read.source.Source`).
    Use :func:`open_dataset` to make one.

    >>> ds = open_dataset(tiny_dataset)
    >>> ds.num_samples, ds.dataset_id
    (100, 'xxh3:...')
    >>> ds.take([5, 0, 5]).column("text").to_pylist()
    ['record 5', 'record 0', 'record 5']
    """

    def __init__(self, url: str, *, storage_options: dict | None = None,
                 cache: ChunkCache | str | os.PathLike | Literal[False] | None = None,
                 memory_cache_bytes: int = DEFAULT_MEMORY_CACHE_BYTES, retry=None,
                 io_threads: int = 8, expect_dataset_id: str | None = None,
                 decoded_cache: DecodedDiskCache | str | os.PathLike | Literal[False] | None = None,
                 ) -> None:
        check_dataset_id(expect_dataset_id)   # a malformed pin fails before any I/O
        self.url = url
        self.storage_options = storage_options
        self._cache_arg = as_cache(cache)
        self._decoded_disk = as_decoded_cache(decoded_cache)
        self._retry = retry
        self._memory_cache_bytes = memory_cache_bytes
        self._io_threads = io_threads
        self.storage = self._storage()
        # The node's processes share the startup objects through the disk cache.
        self.manifest: Manifest = load_manifest(self.storage, node_cache=self._node_cache())
        self._open_row_groups()
        if expect_dataset_id is not None:
            self.expect_id(expect_dataset_id)

    def _node_cache(self) -> ChunkCache | None:
        """The node's disk cache of this dataset (None: none, e.g. a local dataset)."""
        if getattr(self, "_node_cache_obj", False) is False:
            # Local datasets are read in place; a disk cache only pays for remote bytes.
            cache = self._cache_arg
            if cache is None and not is_local_url(self.url):
                cache = ChunkCache()
            elif not isinstance(cache, ChunkCache):
                cache = None
            self._node_cache_obj = cache
        return self._node_cache_obj

    def _storage(self) -> Storage:
        """The dataset's storage; remote, it shares the node's request rate through the cache's
        folder (io/throttle.py) when there is a cache."""
        cache = None if is_local_url(self.url) else self._node_cache()
        throttle = NodeThrottle(cache.directory) if cache is not None else None
        return Storage(self.url, storage_options=self.storage_options, retry=self._retry,
                       throttle=throttle)

    def _open_row_groups(self) -> None:
        cache = self._node_cache()
        self.row_groups = RowGroups(self.manifest, self.storage, cache=cache,
                                    memory_cache_bytes=self._memory_cache_bytes,
                                    io_threads=self._io_threads, dataset_url=self.url,
                                    decoded_disk=self._decoded_disk)

    def expect_id(self, dataset_id: str) -> None:
        """Raise :class:`~zephon_store.errors.ManifestError` unless this is dataset
        ``dataset_id`` (``"xxh3:<32 hex>"``; ValueError if malformed).

        >>> ds = open_dataset(tiny_dataset)
        >>> ds.expect_id(ds.dataset_id)
        >>> ds.expect_id("xxh3:" + "0" * 32)
        Traceback (most recent call last):
        ...
        zephon_store.errors.ManifestError: ...
        """
        check_dataset_id(dataset_id)
        if self.manifest.dataset_id != dataset_id:
            raise ManifestError(
                f"{self.storage.url('manifest.json')} holds dataset {self.manifest.dataset_id},"
                f" not the expected {dataset_id}: the data at {self.url} was replaced or the "
                "URL is wrong; point at the dataset the run was pinned to, or update the pin")

    # Pickling (DataLoader workers) carries the manifest and options, not threads or caches.
    def __getstate__(self) -> dict:
        cache = self._cache_arg
        return {"url": self.url, "storage_options": self.storage_options,
                "_cache_arg": cache.clone() if isinstance(cache, ChunkCache) else cache,
                "_retry": self._retry,
                "_memory_cache_bytes": self._memory_cache_bytes,
                "_io_threads": self._io_threads, "manifest": self.manifest,
                "_decoded_disk": (self._decoded_disk.clone() if self._decoded_disk is not None
                                  else None)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.storage = self._storage()
        self._open_row_groups()

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

    @property
    def cache(self) -> ChunkCache | None:
        """The disk cache remote row groups go through (None: none, e.g. a local dataset)."""
        return self.row_groups.cache

    @property
    def decoded_cache(self) -> DecodedDiskCache | None:
        """The node-local cache of decoded row groups (None: none, the default)."""
        return self.row_groups.decoded_disk

    # -- as a Source (read/source.py: what is read; how a run reads it is load/plan.py) ---
    @property
    def row_group_table(self) -> Manifest:
        """The row-group table the loader plans reads from: the manifest's."""
        return self.manifest

    def split_ids(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(source 0 for every id: one dataset, the sample ids themselves)."""
        ids = np.asarray(ids, dtype=np.int64)
        return np.zeros(ids.shape, dtype=np.int64), ids

    def decoded_row_group_bytes(self) -> float:
        """Estimated decoded size of one row group (:func:`decoded_row_group_bytes`)."""
        return decoded_row_group_bytes(self.manifest)

    def read_row_group(self, rg: int, *, keep: bool = True) -> pa.Table:
        """Row group ``rg`` decoded (:meth:`RowGroups.read <zephon_store.read.rowgroups.RowGroups.read>`)."""
        return self.row_groups.read(rg, keep=keep)

    def prefetcher(self, step_row_groups, **options):
        """A prefetcher of each step's row groups into the disk cache
        (:meth:`RowGroups.prefetcher <zephon_store.read.rowgroups.RowGroups.prefetcher>`)."""
        return self.row_groups.prefetcher(step_row_groups, **options)

    def parts(self) -> list[tuple[str, Dataset]]:
        """``[(name, dataset)]`` of every dataset read: this one, named by its URL."""
        return [(self.url, self)]

    def locate(self, seqs) -> Located:
        """Vectorised lookup of (shard, row group, row) for global sequence numbers."""
        return locate(self.manifest, seqs)

    # -- reading -------------------------------------------------------------------------
    def take(self, seqs) -> pa.Table:
        """Rows at global sequence numbers ``seqs``, in that order (repeats allowed).

        Reads only the row groups that hold them, each once per call.
        """
        loc = self.locate(seqs)
        if loc.seq.size == 0:
            return self.schema.empty_table()
        rgs, inverse = np.unique(loc.row_group, return_inverse=True)
        return gather_rows(self.row_groups.read_many(rgs), inverse.reshape(-1),
                           loc.row_in_group)

    @overload
    def __getitem__(self, seq: int) -> dict: ...
    @overload
    def __getitem__(self, seq: slice) -> list[dict]: ...

    def __getitem__(self, seq):
        """One record as a dict, ``ds[17]``; a slice as a list of them, ``ds[10:20:2]``.

        Indices follow Python's sequences: ``ds[-1]`` is the last record, a slice takes
        any step and bounds past the ends are clipped. A slice is a list of records, each
        as ``ds[i]`` gives it (Hugging Face's ``Dataset`` gives a dict of columns instead);
        :meth:`take` gives the same rows as one Arrow table.

        Values are Python objects, except fixed-size lists of numbers (token windows),
        which come as a 1-D numpy array viewing the decoded row group (read-only), as in
        the loader's batches. The row group is decoded once and kept in the decoded LRU.

        >>> ds = open_dataset(tiny_dataset)
        >>> ds[17], ds[-1]
        ({'id': 17, 'text': 'record 17'}, {'id': 99, 'text': 'record 99'})
        >>> ds[98:]
        [{'id': 98, 'text': 'record 98'}, {'id': 99, 'text': 'record 99'}]
        >>> [r["id"] for r in ds[10:2:-3]]
        [10, 7, 4]
        """
        if isinstance(seq, slice):
            return self._records(self.take(np.arange(*seq.indices(self.num_samples))))
        if isinstance(seq, (bool, np.bool_)):
            # operator.index(True) is 1: a mask or a flag passed by mistake must not read
            # sample 1 (take() rejects bools too).
            raise TypeError(f"a sequence number must be an int, not bool ({seq!r})")
        try:
            s = operator.index(seq)
        except TypeError:
            as_seqs([seq], self.num_samples)  # raises the precise error
            raise TypeError(f"a sequence number must be an int or a slice, got {seq!r}"
                            ) from None
        n = self.num_samples
        if not -n <= s < n:
            raise SeqOutOfRangeError(
                f"index {s} is out of range; valid indices are {-n}..{n - 1} (the dataset "
                f"holds {n} samples; negative ones count from the end)")
        s %= n
        m = self.manifest
        # One scalar search: locate() builds arrays for many ids, overhead a single row
        # does not need.
        rg = int(m.rg_row_start.searchsorted(s, "right")) - 1
        row = self.row_groups.read(rg).slice(s - int(m.rg_row_start[rg]), 1)
        return {name: _first_value(col) for name, col in zip(row.column_names, row.columns)}

    @staticmethod
    def _records(table: pa.Table) -> list[dict]:
        """``table``'s rows as :meth:`__getitem__` gives one (token windows as numpy)."""
        columns = {}
        for name, col in zip(table.column_names, table.columns):
            view = array_view(col) if pa.types.is_fixed_size_list(col.type) else None
            columns[name] = list(view) if view is not None else col.to_pylist()
        return [dict(zip(columns, values)) for values in zip(*columns.values())]

    def __repr__(self) -> str:
        """What the dataset holds, on a few lines (at most ten columns named).

        >>> print(repr(open_dataset(tiny_dataset)))  # doctest: +ELLIPSIS
        Dataset(url='...ds',
                dataset_id='xxh3:...', num_samples=100, num_shards=...,
                columns={'id': int64, 'text': string})
        """
        indent = " " * len("Dataset(")
        return (f"Dataset(url={self.url!r},\n{indent}dataset_id={self.dataset_id!r}, "
                f"num_samples={self.num_samples}, num_shards={self.num_shards},\n{indent}"
                f"columns={columns_repr(self.schema, indent=indent + ' ' * len('columns={'))})")

    def close(self) -> None:
        """Stop this dataset's I/O threads (waiting for them), close the prefetchers made
        for it, and drop its buffers.

        Deterministic: when it returns no thread of this dataset holds an Arrow buffer, so
        nothing is freed during interpreter shutdown (a pool thread doing that aborted the
        process, exit 134). The dataset stays usable: a later read starts a fresh pool.
        ``with open_dataset(url) as ds:`` calls it.
        """
        self.row_groups.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def columns_repr(schema: pa.Schema, limit: int = _REPR_COLUMNS, *, indent: str = " ",
                 width: int = 88) -> str:
    """``{'name': type, ...}`` of ``schema``'s first ``limit`` columns, each type cut to
    :data:`_REPR_TYPE_CHARS`, and how many more, in lines of about ``width`` characters
    (the next ones starting with ``indent``): the columns of a repr.

    >>> columns_repr(pa.schema({"id": pa.int64(), "text": pa.string()}))
    "{'id': int64, 'text': string}"
    >>> columns_repr(pa.schema({f"c{i}": pa.int8() for i in range(5)}), limit=2)
    "{'c0': int8, 'c1': int8, ... and 3 more}"
    """
    def short(t: pa.DataType) -> str:
        text = str(t)
        return text if len(text) <= _REPR_TYPE_CHARS else text[:_REPR_TYPE_CHARS - 3] + "..."

    parts = [f"{f.name!r}: {short(f.type)}" for f in list(schema)[:limit]]
    if len(schema) > limit:
        parts.append(f"... and {len(schema) - limit} more")
    lines = [""]
    for k, part in enumerate(parts):
        part += "," if k + 1 < len(parts) else ""
        if lines[-1] and len(indent) + len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + part
    return "{" + ("\n" + indent).join(lines) + "}"


def decoded_row_group_bytes(manifest) -> float:
    """Estimated decoded size of one row group: the smaller of its cut size and 4x its bytes.

    Row groups are cut at ``row_group_bytes`` of values before compression (plus at most
    one row), or earlier by ``row_group_rows``; 4x the stored bytes is zstd's typical ratio.
    """
    if not manifest.num_row_groups:
        return 0.0
    stored = 4.0 * manifest.stored_row_group_bytes / manifest.num_row_groups
    rg_bytes = manifest.writer.get("row_group_bytes")
    return min(1.25 * rg_bytes, stored) if rg_bytes else stored


def as_cache(cache):
    """The one cache type: a :class:`~zephon_store.io.cache.ChunkCache`, ``None`` (the default
    disk cache for remote datasets, none for local ones) or ``False`` (no disk cache). A folder
    path is shorthand for ``ChunkCache(path)``; anything else is a TypeError saying what to pass.

    >>> as_cache("/tmp/c").directory
    '/tmp/c'
    >>> as_cache(True)
    Traceback (most recent call last):
    ...
    TypeError: cache must be a ChunkCache, a folder path, None (the default disk cache for remote datasets) or False (none), got True: pass cache=ChunkCache() for the default disk cache
    """
    if cache is None or cache is False or isinstance(cache, ChunkCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return ChunkCache(os.fspath(cache))
    hint = ": pass cache=ChunkCache() for the default disk cache" if cache is True else ""
    raise TypeError("cache must be a ChunkCache, a folder path, None (the default disk cache for "
                    f"remote datasets) or False (none), got {cache!r}{hint}")


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
    # half fits. Trying first costs nothing on the usual path (no size estimate per call,
    # docs/benchmarks.md); the rare huge take pays one failed attempt.
    half = rows.size // 2
    return pa.concat_tables([gather_rows(tables, inverse[:half], rows[:half]),
                             gather_rows(tables, inverse[half:], rows[half:])])


def _gather_rows(tables: list[pa.Table], inverse: np.ndarray, rows: np.ndarray) -> pa.Table:
    if len(tables) == 1:
        return _rows(tables[0], rows)
    # Take from each row group, then put the rows in the requested order. A take on the
    # concatenated row groups would be one call, but Arrow's take on a many-chunk column
    # of a nested or variable-width type (token windows, text) first concatenates every
    # chunk: it copied all the row groups a batch touches where this copies only the rows
    # asked for (one copy per row).
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


def open_dataset(url: str, *, storage_options: dict | None = None,
                 cache: ChunkCache | str | os.PathLike | Literal[False] | None = None,
                 memory_cache_bytes: int = DEFAULT_MEMORY_CACHE_BYTES, retry=None,
                 expect_dataset_id: str | None = None,
                 decoded_cache: DecodedDiskCache | str | os.PathLike | Literal[False] | None = None,
                 decode_cache_bytes: int | None = None) -> Dataset:
    """Open the dataset at ``url`` (local path or any fsspec URL, e.g. ``s3://b/ds``).

    ``cache``: the :class:`~zephon_store.io.cache.ChunkCache` remote row groups go through;
    ``None`` (default) is ``ChunkCache()`` for a remote dataset and none for a local one;
    ``False`` disables it; a folder path is shorthand for ``ChunkCache(path)``. ``retry``: a
    :class:`~zephon_store.io.retry.RetryPolicy` (default: the ``"retry"`` storage option, else a
    60 s budget per read). ``expect_dataset_id``
    (``"xxh3:<32 hex>"``) pins the exact dataset: anything else at ``url`` raises
    :class:`~zephon_store.errors.ManifestError`. The manifest and its side tables are
    validated on open; each shard's footer is checked against them before its first
    decode. ``decoded_cache``: a node-local
    :class:`~zephon_store.read.decoded_disk.DecodedDiskCache` (or its folder) that keeps
    decoded row groups uncompressed for later epochs and the node's other processes;
    ``None`` (default) uses one at ``$ZEPHON_DECODED_CACHE_DIR`` when that is set, else none;
    ``False`` none. ``memory_cache_bytes`` (default 256 MiB; 0 keeps none) bounds the
    decoded row groups this process keeps in memory (``decode_cache_bytes``, its old name,
    still works and warns). So the three caches are: ``cache``, the node's compressed
    shard bytes on disk; ``memory_cache_bytes``, this process's decoded row groups in
    memory; ``decoded_cache``, the node's decoded row groups on disk. Use it as a context
    manager (or call :meth:`Dataset.close`) to stop its threads.

    >>> with open_dataset(tiny_dataset) as ds:
    ...     ds.take([0]).to_pylist()
    [{'id': 0, 'text': 'record 0'}]

    A remote one: ``open_dataset("s3://bucket/ds", storage_options={"endpoint_url": ...})``.
    """
    if decode_cache_bytes is not None:
        warnings.warn("open_dataset(decode_cache_bytes=) is now memory_cache_bytes= (the "
                      "decoded row groups kept in memory); the old name will go",
                      DeprecationWarning, stacklevel=2)
        memory_cache_bytes = decode_cache_bytes
    return Dataset(url, storage_options=storage_options, cache=cache,
                   memory_cache_bytes=memory_cache_bytes, retry=retry,
                   expect_dataset_id=expect_dataset_id, decoded_cache=decoded_cache)


def as_dataset(dataset: str | Dataset, *, storage_options: dict | None = None, cache=None,
               expect_dataset_id: str | None = None, decoded_cache=None) -> Dataset:
    """``dataset`` when it is already a :class:`Dataset` (checked against
    ``expect_dataset_id``), else :func:`open_dataset` of the URL: what a loader takes.

    >>> ds = open_dataset(tiny_dataset)
    >>> as_dataset(ds) is ds, as_dataset(tiny_dataset).num_samples
    (True, 100)
    """
    if isinstance(dataset, Dataset):
        if expect_dataset_id is not None:
            dataset.expect_id(expect_dataset_id)
        return dataset
    return open_dataset(dataset, storage_options=storage_options, cache=cache,
                        expect_dataset_id=expect_dataset_id, decoded_cache=decoded_cache)


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
