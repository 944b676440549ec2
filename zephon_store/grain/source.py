"""A Zephon dataset or mixture as Grain's random-access data source.

:class:`ZephonSource` satisfies Grain's ``RandomAccessDataSource`` protocol (``__len__``,
``__getitem__``) and its batched read (``_getitems``, which Grain's ``MapDataset`` calls
when a pipeline batches; ``__getitems__``, torch's spelling of it, is the same method), so
it plugs into any ``grain.MapDataset.source(...)`` pipeline or ``grain.DataLoader``.

An index means one of two things:

- ``order=None`` (the default): the sample id. A dataset's rows ``0 .. N-1``; a mixture's
  sources concatenated (source ``k``'s row ``j`` is ``id_offset[k] + j``). Grain's own
  ``shuffle``/``mix`` then decide the order.
- ``order=OrderOptions(...)``: a position of Zephon's own order, the sample at index ``p``
  is the one Zephon's loaders read at position ``p`` (a mixture: its stage schedule and
  weights too). ``length`` (default one epoch, the source's samples) is how many positions
  Grain sees; positions past ``length`` are never asked for (Grain folds an index modulo
  ``len``).

Indexed by Zephon's order, the source knows which samples come after the last read: a
remote one fetches and decodes their row groups ahead in its threads (the next 32 MiB of
decoded row groups by default), so a Grain pipeline that iterates in order finds them
decoded instead of waiting for each GET.

Every byte is checked against the manifest's xxh3 before it is decoded, as in the rest of
Zephon. A ``deny_list`` (a takedown, docs/audit.md) reaches this source as it reaches every
loader: a denied sample keeps its index, its record's columns are blanked before Grain sees
them, and every record holds ``_masked`` (True for a denied one). A batched read decodes each row group it touches once, and for a remote source fetches
the missing ones' bytes first as coalesced ranged GETs (neighbouring row groups in one
request, :mod:`zephon_store.io.coalesce`), not one request per index.

>>> src = ZephonSource(tiny_dataset)
>>> len(src), src[17]["text"], src[17]["id"].dtype       # numbers come as numpy scalars
(100, 'record 17', dtype('int64'))
>>> [int(r["id"]) for r in src._getitems([3, 99, 4])]
[3, 99, 4]
"""

from __future__ import annotations

import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from .._util.to_numpy import table_to_numpy
from ..load.denylist import MASK_KEY, blank_denied, open_deny_list
from ..load.documents import DocumentColumns, add_document_fields, blank_spans
from ..load.options import FLAT, ReadAheadOptions, SourceOptions, grouped
from ..load.source import open_parts, open_source, plan_of
from ..order.order import OrderOptions
from ..read.dataset import gather_rows

__all__ = ["ZephonSource"]

# The flat keywords taken before the option groups (each now warns).
_FLAT = frozenset({"storage_options", "cache", "decoded_cache", "coalesce"}) & set(FLAT)
# Decoded row groups queued ahead of a source indexed by Zephon's order (a fraction of the
# decoded row groups a dataset keeps in memory, 256 MiB by default, so that what is queued
# ahead does not push out what is being read).
DEFAULT_DECODE_AHEAD_BYTES = 32 << 20

# Decode threads for a batched read that touches several row groups (pyarrow decodes
# without the GIL); a pool is made on first use, and never pickled.
_READ_THREADS = min(8, os.cpu_count() or 1)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


class ZephonSource:
    """A dataset or mixture as a Grain random-access source (see the module docstring).

    ``dataset``: any spelling the loaders take (a URL, an open ``Dataset``, a mixture file
    ``.toml``/``.json``, its dict, a ``MixtureSpec``, a ``MixedDataset``), opened as
    ``source`` (:class:`~zephon_store.load.options.SourceOptions`: storage options, the disk
    cache, the decoded cache, a pinned dataset id; the flat ``storage_options=``,
    ``cache=`` and ``decoded_cache=`` still work and warn); ``columns``: the columns each
    record holds (default all); ``order``: index by Zephon's order instead of by sample id
    (its seed must agree with a mixture file's, when the file sets one); ``length``:
    positions exposed in that case (default: the source's samples, capped where a capped
    mixture source runs out; more spans several epochs); ``with_seq``: each record also holds ``_seq`` (the sample's id in
    its dataset) and, for a mixture, ``_source`` (the source's index); ``global_batch``:
    the run's, which converts a mixture's stage starts given in steps; ``read_ahead``
    (:class:`~zephon_store.load.options.ReadAheadOptions`): ``coalesce``, how neighbouring
    row groups of a remote source merge into one GET, and ``decode_ahead_bytes``, the
    decoded row groups queued ahead of the last read when indexed by Zephon's order (None:
    32 MiB for a remote source, none for a local one; 0: none; the flat ``coalesce=`` still
    works and warns); ``deny_list``: a takedown
    list, as the loaders take it (a file or ``DenyList``; a mixture's: a file or dict per
    source, :func:`~zephon_store.load.denylist.open_deny_list`): denied records are blanked
    and flagged in ``_masked``, and keep their index; ``documents``: each record (packed
    windows only) adds ``position_ids``, ``cu_seqlens``, ``max_seqlen`` and ``loss_mask``,
    the loaders' ``BatchOptions(documents=True)`` fields (docs/packing.md). ``run_log`` is refused: which index a
    step reads is Grain's sampler's (``ZephonIterDataset`` logs a run).

    A record is a dict: numbers and booleans as numpy scalars, lists (token windows) as
    numpy arrays, other values (strings, structs) as Python objects. The source pickles
    (Grain's process workers): each copy opens fresh I/O threads.

    >>> src = ZephonSource(tiny_dataset, order=OrderOptions(seed=7), with_seq=True)
    >>> [int(src[p]["_seq"]) for p in range(4)]      # the loaders' first positions
    [79, 41, 78, 45]
    """

    def __init__(self, dataset, *, columns: Sequence[str] | None = None,
                 order: OrderOptions | None = None, length: int | None = None,
                 with_seq: bool = False, global_batch: int | None = None,
                 source: SourceOptions | None = None, read_ahead: ReadAheadOptions | None = None,
                 deny_list=None, documents: bool = False, run_log: str | None = None,
                 **deprecated) -> None:
        if run_log is not None:
            raise TypeError("ZephonSource keeps no run log: Grain's sampler decides which index "
                            "each step reads; log a run with "
                            "zephon_store.grain.ZephonIterDataset(run_log=...)")
        groups = grouped("ZephonSource", {"source": source, "read_ahead": read_ahead},
                         deprecated, allowed=_FLAT)
        source, read_ahead = groups["source"], groups["read_ahead"]
        open_kwargs = source.open_kwargs()
        self.documents = None
        if documents:   # the document fields are made from these columns (the loaders' rule)
            dataset, open_kwargs = open_parts(dataset, **open_kwargs), {}
            self.documents = DocumentColumns.of(dataset)
            columns = self.documents.with_columns(columns)
        self.plan = plan_of(open_source(
            dataset, columns=None if columns is None else list(columns),
            global_batch=global_batch, **open_kwargs))
        self.source = self.plan.source
        missing = [c for c in columns or () if c not in self.source.schema.names]
        if missing:
            raise ValueError(f"columns {missing} are not in {self.source.url}; it has "
                             f"{self.source.schema.names}")
        if order is not None:
            order = order.replace(seed=self.plan.order_seed(order.seed))
            if order.is_auto:
                # Random access has no topology: one lane keeps the order independent of it.
                order = order.replace(lanes=1)
        elif length is not None:
            raise ValueError("length applies to a source indexed by Zephon's order; pass "
                             "order=OrderOptions(...) with it, or leave it out (the index is "
                             "then the sample id, and the length the number of samples)")
        self.options = order
        self._order = None if order is None else self.plan.order(order)
        self.columns = None if columns is None else list(columns)
        self.with_seq = with_seq
        self.read_ahead = read_ahead
        self.coalesce = read_ahead.coalesce
        self.deny_list = (None if deny_list is None
                          else open_deny_list(deny_list, self.plan.deny_ids()))
        if self.deny_list is not None and self.deny_list.spans is not None and not documents:
            raise ValueError("the deny list names documents: their takedown blanks their "
                             "tokens and says so in the document fields; pass documents=True")
        n = self.source.num_samples
        if order is not None:
            end = self.plan.end
            n = length if length is not None else n if end is None else min(n, end)
            if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
                raise ValueError(f"length must be an int > 0, got {length!r}")
            if end is not None and n > end:
                raise ValueError(f"length {n} runs past position {end}, where this mixture "
                                 f"ends: {self.plan.end_reason()}; pass length <= {end}")
        self._len = int(n)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._ahead = self._decode_ahead()

    def _decode_ahead(self) -> _DecodeAhead | None:
        """The decode-ahead of a source indexed by Zephon's order (None: by sample id, whose
        next index is Grain's to choose, or a budget of 0). By default only a remote source
        decodes ahead: there it hides each GET's latency; a local one gained nothing and
        paid a little CPU (docs/benchmarks.md, "Grain's random-access source")."""
        budget = self.read_ahead.decode_ahead_bytes
        if budget is None:
            budget = DEFAULT_DECODE_AHEAD_BYTES if self.source.cache is not None else 0
        if self._order is None or budget <= 0:
            return None
        return _DecodeAhead(self.source, self._order, self._len, budget)

    # -- Grain's protocol ----------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict:
        """The record at ``index`` (a sample id, or a position with ``order``)."""
        if isinstance(index, (bool, np.bool_)):
            raise TypeError(f"an index must be an int, not bool ({index!r})")
        return self._getitems([operator.index(index)])[0]

    def _getitems(self, indices: Sequence[int]) -> list[dict]:
        """The records at ``indices``, in that order (repeats allowed): each row group
        they touch read and decoded once, a remote source's bytes in coalesced GETs."""
        table, cols = self._columns(indices)
        for name in table.column_names:
            col = cols[name]
            if isinstance(col, list) and _is_list(table.schema.field(name).type):
                # Grain treats a Python list as a tree of leaves: a list value comes as one
                # numpy array, so batching stacks it like a token window.
                cols[name] = [None if v is None else np.asarray(v) for v in col]
        return [{k: v[i] for k, v in cols.items()} for i in range(table.num_rows)]

    def read_batch(self, indices: Sequence[int]) -> dict:
        """The rows at ``indices`` as one batch, a dict of columns: numpy arrays where Arrow
        allows (numbers, token windows as 2-D), lists otherwise; the loaders' batch format.

        Grain 0.2.18 reads a source one index at a time (its batch pushdown to ``_getitems``
        is off in the release); batch the indices and map this to read a batch in one go:

        >>> import grain
        >>> src = ZephonSource(tiny_dataset)
        >>> ds = grain.MapDataset.range(len(src)).shuffle(seed=1).batch(4).map(src.read_batch)
        >>> ds[0]["id"].tolist(), ds[0]["text"][0]
        ([35, 7, 50, 32], 'record 35')
        """
        return self._columns(indices)[1]

    __getitems__ = _getitems

    def __repr__(self) -> str:
        # Grain's DataLoader checks a checkpoint against repr(source): the data's identity
        # and how it is indexed, never the path it was opened from. Not the deny list: a
        # takedown added at a restart keeps every index where it was, as in the loaders.
        how = "ids" if self.options is None else f"order={self.options.to_dict()}"
        return (f"ZephonSource(dataset_id={self.source.dataset_id!r}, len={self._len}, {how}, "
                f"columns={self.columns}, with_seq={self.with_seq})")

    # -- reading -------------------------------------------------------------------------
    def _columns(self, indices: Sequence[int]) -> tuple[pa.Table, dict]:
        """(the rows at ``indices`` as read, their batch of columns): numpy or lists, plus
        ``_seq``/``_source`` (``with_seq``) and, with a deny list, ``_masked``, the denied
        rows blanked before anything else sees them (as the loaders' pipeline does)."""
        table, extra, ids = self._rows(indices)
        cols = {**table_to_numpy(table), **extra}
        masked = blank = None
        if self.deny_list is not None:
            masked = self.deny_list.masked(ids)
            cols = blank_denied(cols, masked, dict(zip(table.schema.names, table.schema.types)))
            cols[MASK_KEY] = masked
            if self.deny_list.spans is not None:   # a document takedown (docs/audit.md)
                cols, blank = blank_spans(cols, self.documents, self.deny_list.spans_in(ids))
        if self.documents is not None:
            cols = add_document_fields(cols, self.documents, masked, blank)
        return table, cols

    def _rows(self, indices: Sequence[int]):
        """(the rows at ``indices`` as a table of the chosen columns, ``_seq``/``_source``
        arrays when ``with_seq``, their sample ids)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        bad = idx[(idx < 0) | (idx >= self._len)]
        if bad.size:
            raise IndexError(f"index {int(bad[0])} is out of range for {self!r}, which has "
                             f"{self._len} {'positions' if self._order else 'samples'} "
                             f"[0, {self._len})")
        ids = idx if self._order is None else self._order.sample_at(idx)
        table = self._take(ids)
        if self._ahead is not None and idx.size:
            self._ahead.after(int(idx.max()) + 1, self._threads())
        if self.columns is not None:
            table = table.select(self.columns)
        extra = self.plan.seq_fields(ids) if self.with_seq else {}
        return table, extra, ids

    def _take(self, ids: np.ndarray):
        """Rows ``ids`` (sample ids of the source), in that order, as one table."""
        m = self.source.row_group_table
        rg = m.row_group_of(ids)
        rgs, inverse = np.unique(rg, return_inverse=True)
        pre = None
        if self.source.cache is not None and rgs.size > 1:
            # A remote source: the missing row groups' bytes as coalesced, verified GETs
            # (cached ones are skipped), run before the decodes below ask for them. One row
            # group is one GET either way (and Grain reads one index at a time).
            need = int(m.rg_length[rgs].sum())
            pre = self.source.prefetcher(lambda _step: rgs, budget_bytes=max(1, need),
                                         num_batches=1, coalesce=self.coalesce)
        try:
            tables = self._read(rgs.tolist())
        finally:
            if pre is not None:
                pre.close()
        return gather_rows(tables, inverse.reshape(-1), ids - m.rg_row_start[rg])

    def _read(self, rgs: list[int]) -> list:
        if len(rgs) <= 1:
            return [self.source.read_row_group(r) for r in rgs]
        return list(self._threads().map(self.source.read_row_group, rgs))

    def _threads(self) -> ThreadPoolExecutor:
        with self._lock:   # Grain reads from several threads at once
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="zephon-grain")
            return self._pool

    # -- lifetime ------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_pool"], state["_lock"], state["_ahead"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _pool=None, _lock=threading.Lock())
        self._ahead = self._decode_ahead()

    def close(self) -> None:
        """Stop this source's threads and close what it opened (usable again afterwards)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.source.close()


class _DecodeAhead:
    """The row groups of the positions after the last read, decoded in the background into
    the source's decoded row groups in memory: Zephon's order says which samples come next,
    and Grain asks for them in order when it iterates (``to_iter_dataset``, batches of
    consecutive indices). At most ``budget_bytes`` of decoded row groups are queued ahead;
    a row group already queued is not queued again, and a read that jumps (Grain's own
    shuffle over positions) only queues what follows it."""

    def __init__(self, source, order, length: int, budget_bytes: int) -> None:
        self.source, self.order, self.length = source, order, length
        per_rg = max(1.0, float(source.decoded_row_group_bytes()))
        self.row_groups = max(1, int(budget_bytes // per_rg))
        t = source.row_group_table
        rows = max(1.0, t.num_samples / max(1, t.num_row_groups))
        # Positions whose row groups fill the budget read in order (a shuffled order's
        # window spreads them over more row groups: the cap below still holds).
        self.span = max(1, int(self.row_groups * rows))
        self.queued_to = 0                       # positions below this were looked at
        self.queued: OrderedDict[int, None] = OrderedDict()   # row groups queued lately

    def after(self, end: int, pool: ThreadPoolExecutor) -> None:
        """A read ended at position ``end`` (exclusive): queue the row groups of the
        positions after it once half of what was queued ahead has been read (a read that
        jumped, back or forward, starts afresh from where it ended)."""
        q, span = self.queued_to, self.span
        if q - span <= end < q - span // 2:
            return     # more than half of what was queued is still ahead
        lo = q if q - span <= end <= q else end
        hi = self.queued_to = min(self.length, end + span)
        if lo >= hi:
            return
        rgs = self.source.row_group_of(self.order.sample_at(np.arange(lo, hi)))
        for rg in dict.fromkeys(rgs.tolist()):   # in order of first use
            if rg in self.queued:
                continue
            self.queued[rg] = None
            while len(self.queued) > 2 * self.row_groups:
                self.queued.popitem(last=False)
            pool.submit(_quietly, self.source.read_row_group, rg)


def _quietly(read, rg: int) -> None:
    """A decode ahead: an error here is the read's to raise when it asks for that row group
    (it decodes it again and raises there, with the row group named)."""
    try:
        read(rg)
    except Exception:  # noqa: BLE001 - raised again by the read that needs it
        pass
