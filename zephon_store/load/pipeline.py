"""Decode ahead, assemble in order: the engine behind every loader path.

The order is known in advance, so the coming batches are known, not guessed: for each
upcoming step the pipeline computes its sample ids and the row groups that hold them,
starts decoding each row group once (a small thread pool; pyarrow decodes without the GIL),
and drops it right after the last queued step that reads from it. Batches are then cut
from the decoded row groups in order, in the caller's thread.

Why not an LRU of decoded row groups: an LRU does not know that a row group will never be
read again this epoch, so a sequential pass kept dead row groups up to its budget, and a
shuffled pass whose working set exceeded the LRU decoded row groups several times
(docs/benchmarks.md, "Why the code is shaped this way: loading"). Releasing a row group
after its last queued step holds exactly the row groups of the steps in flight plus the
decode-ahead budget, and decodes each row group once per pass
(:attr:`BatchPipeline.decodes` counts them; the tests check it).

The first step is queued and decoded alone, and nothing else is decoded until it has been
handed out: a start or a resume waits only for its own row groups. The caller's thread
decodes them too, beside ``decode_threads - 1`` pool threads (:meth:`_Pass.decode_first`):
it would otherwise sit idle, and on a busy host each hand-off to a thread (and each thread
start) waited milliseconds for a core (docs/benchmarks_format.md, "Resume").

Small per-rank batches are planned, decoded and cut in groups of consecutive steps (about
``GROUP_IDS`` sample ids, see :func:`group_steps`): the group's rows are gathered once and
each step's batch is a slice of them, so the per-step cost of queueing, waiting and
gathering is paid once per group. The batches are the same as step by step.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .._util.arrow import gather_pylist, is_flat_binary
from .._util.exit_close import close_at_exit
from .._util.to_numpy import array_type, array_view, column_to_numpy, table_to_numpy
from ..order.assign import step_cursor
from ..read.dataset import gather_rows
from .denylist import MASK_KEY, DenyListError, blank_denied
from .documents import DocumentColumns, add_document_fields, blank_spans

# Decoded bytes queued ahead, at least (the working set of a shuffled order may need more).
MIN_AHEAD_BYTES = 16 << 20
# At most this much is queued ahead automatically, whatever the working set; a larger one
# is the caller's call (memory is per rank and per worker process).
MAX_AUTO_AHEAD_BYTES = 1 << 30
# Steps queued ahead at most: bounds the queueing work when row groups are tiny.
MAX_AHEAD_STEPS = 1024
# Sample ids whose steps are planned together (plan_steps), after the first step.
PLAN_AHEAD_IDS = 2048
# Sample ids of the steps gathered together as one group (see group_steps), and the most
# decoded bytes such a group may hold.
GROUP_IDS = 256
GROUP_BYTES = 4 << 20


# The step's sample ids, carried through split_group for a deny list that names documents.
_IDS_KEY = "_zephon_ids"


@dataclass
class _Slot:
    future: Future
    last: int          # serial number of the last queued step that reads this row group
    rows: int = 0      # rows of it the steps queued so far read


@dataclass
class _Decoded:
    table: pa.Table                  # the selected columns
    views: dict[str, np.ndarray]     # numbers and token windows without nulls, as numpy
    # Text columns of the row group as Python lists, made at their first gather (see
    # BatchPipeline._assemble).
    lists: dict[str, list] = field(default_factory=dict)

    def pylist(self, name: str) -> list:
        got = self.lists.get(name)
        if got is None:
            got = self.lists[name] = self.table.column(name).to_pylist()
        return got


@dataclass
class _Step:
    # (local batch index from the start cursor, samples) of each step of this group, in
    # order; the group's rows are theirs one after the other.
    parts: list[tuple[int, int]]
    serial: int             # running number of queued groups
    ids: np.ndarray
    row_groups: list[int]   # in order of first use
    # Either runs: rows [start, start + n) of each row group in turn (ids that follow each
    # other, as in a sequential order), or a gather: row rows[j] of row_groups[inverse[j]].
    runs: list[tuple[int, int]] | None
    inverse: np.ndarray | None = None
    rows: np.ndarray | None = None


def step_rows(manifest, ids: np.ndarray, *, rg_of: np.ndarray | None = None,
              contiguous: bool | None = None) -> tuple[list[int], list | None, object, object]:
    """Where a step's rows are: ``(row_groups, runs, inverse, rows)``, see ``_Step``.

    ``rg_of`` (the row group of each id) and ``contiguous`` (ids follow each other) may be
    given when already known (:func:`plan_steps` computes them for many steps at once).

    >>> from zephon_store import open_dataset
    >>> step_rows(open_dataset(tiny_dataset).manifest, np.arange(5, 12))   # row groups of 10 rows
    ([0, 1], [(5, 5), (0, 2)], None, None)
    """
    n = ids.size
    starts = manifest.rg_row_start
    if contiguous is None:
        contiguous = bool(n) and int(ids[-1]) - int(ids[0]) == n - 1 and (
            n == 1 or bool((np.diff(ids) == 1).all()))
    if contiguous:
        lo, hi = int(ids[0]), int(ids[-1]) + 1
        if rg_of is not None:
            first, last = int(rg_of[0]), int(rg_of[-1])
        else:
            first = int(starts.searchsorted(lo, "right")) - 1
            last = int(starts.searchsorted(hi - 1, "right")) - 1
        rgs, runs = [], []
        for rg in range(first, last + 1):
            begin = max(lo, int(starts[rg]))
            end = min(hi, int(starts[rg]) + int(manifest.rg_rows[rg]))
            rgs.append(rg)
            runs.append((begin - int(starts[rg]), end - begin))
        return rgs, runs, None, None
    # Row groups are listed in order of first use, so decodes start with the one needed first.
    if rg_of is None:
        rg_of = starts.searchsorted(ids, "right") - 1
    if n <= 512:
        # On a batch this small a dict beats np.unique + argsort (docs/benchmarks.md).
        seen: dict[int, int] = {}
        inverse = np.fromiter((seen.setdefault(r, len(seen)) for r in rg_of.tolist()),
                              dtype=np.int64, count=n)
        return list(seen), None, inverse, ids - starts[rg_of]
    rgs, first, inverse = np.unique(rg_of, return_index=True, return_inverse=True)
    by_use = np.argsort(first, kind="stable")
    rank = np.empty_like(by_use)
    rank[by_use] = np.arange(by_use.size)
    return rgs[by_use].tolist(), None, rank[inverse.reshape(-1)], ids - starts[rg_of]


def plan_steps(manifest, id_blocks: list[np.ndarray]) -> list[tuple]:
    """:func:`step_rows` of several steps at once, with the same results: the row group of
    every id in one ``searchsorted`` and the runs of consecutive ids in one pass. At a
    per-rank batch of 8 the per-step numpy calls were most of the loop thread's own time.

    >>> from zephon_store import open_dataset
    >>> m = open_dataset(tiny_dataset).manifest
    >>> plan = plan_steps(m, [np.arange(5, 12), np.array([31, 3, 35])])
    >>> plan[0]
    ([0, 1], [(5, 5), (0, 2)], None, None)
    >>> plan[1][0], plan[1][2].tolist(), plan[1][3].tolist()   # row groups, inverse, rows
    ([3, 0], [0, 1, 0], [1, 3, 5])
    """
    if not id_blocks:
        return []
    ids = np.concatenate(id_blocks)
    rg_all = manifest.rg_row_start.searchsorted(ids, "right") - 1
    # j is in `breaks` when ids[j] does not follow ids[j - 1].
    breaks = (np.flatnonzero(np.diff(ids) != 1) + 1).tolist()
    plans, a = [], 0
    for block in id_blocks:
        b = a + block.size
        k = bisect.bisect_right(breaks, a)
        contiguous = b > a and (k == len(breaks) or breaks[k] >= b)
        plans.append(step_rows(manifest, block, rg_of=rg_all[a:b], contiguous=contiguous))
        a = b
    return plans


def _cut(tables: list[pa.Table], step: _Step) -> pa.Table:
    """The step's rows of ``tables`` (one per row group of the step), as one table."""
    if step.runs is None:
        return gather_rows(tables, step.inverse, step.rows)
    parts = [t.slice(b, n) for t, (b, n) in zip(tables, step.runs)]
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def _cut_arrays(views: list[np.ndarray], step: _Step) -> np.ndarray | _Runs:
    """The step's rows of numpy ``views`` (one per row group): a view for one run, else a copy
    (the pieces, for a group of several steps: split_group cuts each step from them)."""
    if step.runs is not None:
        parts = [v[b:b + n] for v, (b, n) in zip(views, step.runs)]
        if len(parts) == 1:
            return parts[0]
        return _Runs(parts) if len(step.parts) > 1 else np.concatenate(parts)
    if len(views) == 1:
        return views[0][step.rows]
    out = np.empty((step.rows.size,) + views[0].shape[1:], dtype=views[0].dtype)
    if views[0].ndim > 1 and views[0][:1].nbytes >= 1024:
        # Long rows (token windows): one copy per row straight into place. The grouped
        # fancy indexing below makes a temporary per row group and copies twice.
        for j, (k, r) in enumerate(zip(step.inverse.tolist(), step.rows.tolist())):
            out[j] = views[k][r]
        return out
    order = np.argsort(step.inverse, kind="stable")
    bounds = np.searchsorted(step.inverse[order], np.arange(len(views) + 1))
    for k, view in enumerate(views):
        at = order[bounds[k]:bounds[k + 1]]
        out[at] = view[step.rows[at]]
    return out


class _Runs:
    """Rows of a column held as consecutive pieces (numpy views of row groups), not copied
    into one array: a group of sequential steps cuts each step's rows from the pieces, a
    view when they lie in one piece, as a step alone would."""

    __slots__ = ("pieces", "ends")

    def __init__(self, pieces: list[np.ndarray]) -> None:
        self.pieces = pieces
        self.ends = np.cumsum([len(p) for p in pieces]).tolist()

    def __getitem__(self, cut: slice) -> np.ndarray:
        a, b = cut.start, cut.stop
        k = bisect.bisect_right(self.ends, a)
        parts = []
        while a < b:
            base = self.ends[k] - len(self.pieces[k])
            stop = min(b, self.ends[k])
            parts.append(self.pieces[k][a - base:stop - base])
            a, k = stop, k + 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else self.pieces[0][:0]


class _PerStep:
    """A group's column of numbers with nulls somewhere: each step's rows are decoded on
    their own, so that a step without nulls gets numpy as it would alone (column_to_numpy)."""

    __slots__ = ("col",)

    def __init__(self, col: pa.ChunkedArray) -> None:
        self.col = col

    def __getitem__(self, cut: slice):
        return column_to_numpy(self.col.slice(cut.start, cut.stop - cut.start))


def split_group(batch: dict, parts: list[tuple[int, int]]) -> Iterator[tuple[int, dict]]:
    """The steps of a group's ``batch``: ``(index, batch)`` for each ``(index, samples)``
    of ``parts``, each column cut to the step's rows (lists and arrays are sliced; numpy
    slices are views).

    >>> steps = split_group({"id": np.arange(5), "text": list("abcde")}, [(3, 2), (4, 3)])
    >>> [(i, b["id"].tolist(), b["text"]) for i, b in steps]
    [(3, [0, 1], ['a', 'b']), (4, [2, 3, 4], ['c', 'd', 'e'])]
    """
    if len(parts) == 1:
        yield parts[0][0], batch
        return
    a = 0
    for index, n in parts:
        cut = slice(a, a + n)
        yield index, {k: v[cut] for k, v in batch.items()}
        a += n


def group_steps(local_batch: int, sample_bytes: float, *, max_bytes: int = GROUP_BYTES) -> int:
    """Steps gathered as one group at a per-rank batch of ``local_batch`` samples of about
    ``sample_bytes`` decoded bytes each: about ``GROUP_IDS`` ids, at most ``GROUP_BYTES``
    (and at most ``max_bytes``, the pipeline's decode-ahead budget).

    >>> group_steps(8, 13_000), group_steps(32, 8196), group_steps(256, 1000)
    (32, 8, 1)
    >>> group_steps(8, 1 << 20)   # 1 MiB samples: no grouping
    1
    """
    b = max(1, int(local_batch))
    by_ids = GROUP_IDS // b
    by_bytes = int(min(GROUP_BYTES, max_bytes) // max(1.0, b * float(sample_bytes)))
    return max(1, min(by_ids, by_bytes))


def _gather_text(step: _Step, decoded: list[_Decoded], name: str,
                 whole: list[bool] | None) -> list:
    """A step's rows of a string/binary column, as Python objects.

    Where ``whole`` says this pipeline reads most of every row group of the step (a
    shuffled order reads all rows of a row group within one window of steps, when one rank
    and one worker read them all), each row group's column is converted whole, once, by
    Arrow's loop (``_Decoded.pylist``), and steps pick from those lists, cheaper than a
    row-by-row conversion; a sequential step (``step.runs``) takes slices of them, where
    an Arrow slice and conversion per step cost more than the rows at a batch of 8.
    Otherwise (the first step after a start or resume, or a rank's or worker's share of
    the rows) only the step's own rows are converted.
    """
    lists = [d.pylist(name) for d in decoded] if whole and all(whole) else None
    if step.runs is not None:   # a run of a sequential order: slices of the whole lists
        parts = [lst[b:b + n] for lst, (b, n) in zip(lists, step.runs)]
        return parts[0] if len(parts) == 1 else [x for part in parts for x in part]
    if lists is None:
        return gather_pylist([d.table.column(name) for d in decoded], step.inverse, step.rows)
    return [lists[k][r] for k, r in zip(step.inverse.tolist(), step.rows.tolist())]


def two_working_sets_bytes(stream) -> int:
    """Decoded bytes of two working sets of ``stream``'s order (see ``default_ahead_bytes``)."""
    per_rg = stream.dataset.decoded_row_group_bytes()
    return int(2 * stream.working_set_row_groups() * per_rg)


def default_ahead_bytes(stream) -> int:
    """Decode-ahead budget for ``stream``: two working sets, at least 16 MiB, at most 1 GiB.

    Two working sets, so that a shuffled order's next window is queued before the current
    one is released (a row group cut by a window boundary is then still held, not decoded
    twice).
    """
    return min(max(MIN_AHEAD_BYTES, two_working_sets_bytes(stream)), MAX_AUTO_AHEAD_BYTES)


def default_decode_threads(dataset, workers: int = 1) -> int:
    """Threads decoding row groups: the cores (2-4) locally, 8 when bytes come over a network.

    ``workers`` process workers each run a pipeline: locally each gets its share of the
    cores (at least one thread).
    """
    if dataset.cache is not None or not dataset.local:
        return 8
    if workers > 1:
        return max(1, min(4, (os.cpu_count() or 1) // workers))
    return max(2, min(4, os.cpu_count() or 1))


class BatchPipeline:
    """Batches ``indices`` of a :class:`~zephon_store.load.stream.RankStream`, in that order.

    ``indices`` are local batch numbers counted from ``start_cursor`` (one worker's share
    is ``range(worker, n, workers)``; ``itertools.count()`` is endless). ``group`` steps
    are gathered together (default: :func:`group_steps` of the per-rank batch; 1 gathers
    step by step); the batches do not depend on it.

    >>> from zephon_store import OrderOptions, Topology, open_dataset
    >>> from zephon_store.load.stream import RankStream
    >>> stream = RankStream(open_dataset(tiny_dataset), OrderOptions(seed=7), Topology(8))
    >>> [(i, batch["id"].tolist()) for i, batch in BatchPipeline(stream, 0, range(2))]
    [(0, [79, 41, 78, 45, 68, 97, 30, 33]), (1, [49, 5, 87, 4, 43, 40, 0, 3])]
    """

    def __init__(self, stream, start_cursor: int, indices: Iterable[int], *,
                 transform: Callable[[dict], dict] | None = None,
                 ahead_bytes: int | None = None, decode_threads: int | None = None,
                 stop: threading.Event | None = None, deny_list=None,
                 documents: DocumentColumns | None = None, group: int | None = None) -> None:
        self.stream = stream
        self.dataset = stream.dataset
        self.start_cursor = int(start_cursor)
        self.indices = indices
        self.transform = transform
        # A takedown list (load/denylist.py): its samples keep their positions, so the
        # cursor stays a plain count, and their rows are blanked and flagged in _masked
        # before the transform (or anything after it) sees the batch.
        self.deny_list = deny_list
        self._payload = None if deny_list is None else {
            f.name: f.type for f in stream.select(self.dataset.schema.empty_table()).schema}
        # Per-document attention data (load/documents.py), added after the blanking, so a
        # denied window is one blank segment, and before the transform.
        self.documents = documents
        self.ahead_bytes = default_ahead_bytes(stream) if ahead_bytes is None else ahead_bytes
        self.decode_threads = decode_threads or default_decode_threads(self.dataset)
        self._per_rg = int(self.dataset.decoded_row_group_bytes())
        # Steps gathered together (module docstring); 1 gathers step by step.
        m = self.dataset.row_group_table
        rows_per_rg = max(1.0, m.num_samples / max(1, m.num_row_groups))
        self.group = group or group_steps(stream.topology.local_batch, self._per_rg / rows_per_rg,
                                          max_bytes=self.ahead_bytes)
        self.stop = stop or threading.Event()
        # Decodes not finished yet, for cancel(). Finished ones leave at once: a future holds
        # its result, so keeping them kept every decoded row group of the pass alive.
        self._futures: set[Future] = set()
        self._futures_lock = threading.Lock()
        self.decodes = 0          # row-group decodes started (for tests and benchmarks)
        self.max_held = 0         # most decoded row groups held at once (same)

    def _forget(self, fut: Future) -> None:
        with self._futures_lock:
            self._futures.discard(fut)

    def cancel(self) -> None:
        """Stop from another thread: no further steps, queued decodes dropped at once.

        Decodes already running finish (pyarrow cannot be interrupted); nothing waits for
        them. Without this a closed loader kept decoding its whole decode-ahead in the
        background, which slowed whatever the process did next.
        """
        self.stop.set()
        with self._futures_lock:
            pending = list(self._futures)
        for fut in pending:     # outside the lock: a cancelled future runs _forget at once
            fut.cancel()

    def _decode(self, rg: int) -> _Decoded:
        table = self.stream.select(self.dataset.read_row_group(rg, keep=False))
        # Numbers and token windows become zero-copy numpy views here, in the decode
        # threads; batches are cut from them with numpy. Text stays Arrow until a batch takes
        # its rows: Python strings made in the decode threads come from those threads'
        # malloc arenas, which glibc grows and trims rather than reuses, so a fresh
        # process's first pass page-faults far more (docs/benchmarks.md).
        views = {}
        for name, col in zip(table.column_names, table.columns):
            view = array_view(col) if array_type(col.type) else None
            if view is not None:
                views[name] = view
        return _Decoded(table, views)

    def _assemble(self, step: _Step, decoded: list[_Decoded],
                  whole: list[bool] | None = None) -> dict:
        out = {}
        for name in decoded[0].table.column_names:
            if all(name in d.views for d in decoded):
                out[name] = _cut_arrays([d.views[name] for d in decoded], step)
            elif is_flat_binary(decoded[0].table.schema.field(name).type) and (
                    step.runs is None or (whole and all(whole))):
                out[name] = _gather_text(step, decoded, name, whole)
            else:
                if step.runs is not None:   # a run of other objects: slices of the column
                    parts = [d.table.column(name).slice(b, n)
                             for d, (b, n) in zip(decoded, step.runs)]
                    col = parts[0] if len(parts) == 1 else pa.chunked_array(
                        [c for part in parts for c in part.chunks], type=parts[0].type)
                else:   # text and other objects, or numbers with nulls: as table_to_numpy does
                    col = _cut([d.table.select([name]) for d in decoded], step).column(0)
                # Numbers with nulls in a group: each step's rows decide numpy or list.
                grouped = len(step.parts) > 1 and array_type(col.type)
                out[name] = _PerStep(col) if grouped else column_to_numpy(col)
        return self._with_id_fields(out, step)

    def _with_id_fields(self, batch: dict, step: _Step) -> dict:
        """``batch`` with the fields of the step's ids: ``_seq`` (``with_seq``) and
        ``_masked`` (a deny list), and, for a list naming documents, the ids themselves
        under a private key that :meth:`_handed_out` takes out again."""
        if self.stream.with_seq:
            batch.update(self.stream.seq_fields(step.ids))
        if self.deny_list is not None:
            batch[MASK_KEY] = self.deny_list.masked(step.ids)
            if self.deny_list.spans is not None:
                batch[_IDS_KEY] = np.asarray(step.ids, dtype=np.int64)
        return batch

    def _transformed(self, batch: dict):
        """The transform's output; with a deny list, a dict that carries ``_masked``.

        A transform that builds a new dict drops ``_masked``; it is put back (the rows are
        the ones the transform was given, blanked already). A transform that changes the
        rows must set its own ``_masked``. An output that is not a dict cannot carry it and
        is refused: the training code could not tell a denied row from another.
        """
        out = self.transform(batch)
        if self.deny_list is None:
            return out
        if not isinstance(out, dict):
            raise DenyListError(
                f"with a deny list the transform must return a dict, so that {MASK_KEY!r} "
                f"reaches the training loop; the transform returned {type(out).__name__}: "
                f"return a dict (the loader adds {MASK_KEY!r} if it is missing) and convert "
                "in collate=")
        if MASK_KEY not in out:
            out[MASK_KEY] = batch[MASK_KEY]
        return out

    def __iter__(self) -> Iterator[tuple[int, dict]]:
        # Closed at interpreter exit if still open: its pool's shutdown, run by the garbage
        # collector during module teardown, failed inside concurrent.futures (_util/exit_close.py).
        return close_at_exit(self._steps())

    def _steps(self) -> Iterator[tuple[int, dict]]:
        run = _Pass(self)
        rg_rows = self.dataset.row_group_table.rg_rows
        try:
            run.queue_one(deferred=True)   # the first step alone (the module docstring)
            first = True
            while run.queued and not self.stop.is_set():
                step = run.pop()
                if first:
                    run.decode_first(step)
                    if self.stop.is_set():
                        break      # cancelled meanwhile: its other decodes were skipped
                decoded = [run.slots[rg].future.result() for rg in step.row_groups]
                # Whole-row-group text conversion pays when this pipeline reads most of a
                # row group (one rank, one worker); a rank of 8 reads an eighth of it.
                whole = [not first and 2 * run.slots[rg].rows >= int(rg_rows[rg])
                         for rg in step.row_groups]
                batch = self._step_batch(step, decoded, whole)
                del decoded
                # Queue (and start decoding) ahead before a batch is handed out, so decodes
                # run while the caller works on it (the loader's thread path calls next()
                # only when the training loop wants the next batch); after it for the
                # first batch, which waits for nothing else. Then drop the row groups no
                # queued step reads any more: queueing first, so that one the next step
                # reads again (sequential steps share row groups) is not dropped and
                # decoded twice.
                if not first:
                    run.queue_ahead()
                for index, sub in split_group(batch, step.parts):
                    yield index, self._handed_out(sub)
                    if self.stop.is_set():
                        break
                batch = sub = None
                if first:
                    run.queue_ahead()
                    first = False
                run.release(step)
        finally:
            run.close()

    def _step_batch(self, step: _Step, decoded: list[_Decoded], whole: list[bool]) -> dict:
        """The batch of a step (or a group of steps) from its decoded row groups."""
        if decoded:
            return self._assemble(step, decoded, whole)
        # A short last step can leave a rank no rows: an empty batch.
        return self._with_id_fields(
            table_to_numpy(self.stream.select(self.dataset.schema.empty_table())), step)

    def _handed_out(self, sub: dict):
        """One step's batch as the caller gets it: denied rows blanked, the document fields
        added (``documents``), then transformed."""
        blank = None
        if self.deny_list is not None:
            sub = blank_denied(sub, sub[MASK_KEY], self._payload)
            ids = sub.pop(_IDS_KEY, None)
            if ids is not None:   # a document takedown: only its tokens leave the window
                sub, blank = blank_spans(sub, self.documents, self.deny_list.spans_in(ids))
        if self.documents is not None:
            sub = add_document_fields(sub, self.documents, sub.get(MASK_KEY), blank)
        if self.transform is not None:
            sub = self._transformed(sub)
        return sub


class _Pass:
    """One pass of a :class:`BatchPipeline`: the steps planned and queued ahead, and the
    row-group decodes they started (``slots``: row group -> its future and last reader).

    Steps are planned :data:`PLAN_AHEAD_IDS` ids at a time (the first step alone, so a start
    or resume waits only for its own ids), queued while the decoded row groups held stay
    under ``ahead_bytes`` and the queued steps under :data:`MAX_AHEAD_STEPS`, and a row
    group is dropped once no queued step reads it.
    """

    def __init__(self, pipe: BatchPipeline) -> None:
        self.pipe = pipe
        self.pool = ThreadPoolExecutor(pipe.decode_threads, thread_name_prefix="zephon-decode")
        self.slots: dict[int, _Slot] = {}
        self.queued: deque[_Step] = deque()
        self.planned: deque[tuple] = deque()   # (parts, ids, step plan) of the coming groups
        self.indices = iter(pipe.indices)
        self.serial = 0          # groups queued so far
        self.queued_steps = 0    # steps of the queued groups
        self.more = True         # False once the indices are exhausted

    def plan_ahead(self) -> None:
        """Plan the next groups of steps: one numpy pass plans them all."""
        pipe = self.pipe
        t = pipe.stream.topology
        count = 1 if self.serial == 0 else max(1, PLAN_AHEAD_IDS // max(1, t.local_batch))
        group = 1 if self.serial == 0 else pipe.group
        groups = []
        indices = list(itertools.islice(self.indices, count))
        for g in range(0, len(indices), group):
            parts, blocks = [], []
            for i in indices[g:g + group]:
                cursor = step_cursor(pipe.start_cursor, i, t.global_batch)
                ids = pipe.stream.ids(cursor, ahead=self.serial > 0)
                parts.append((i, ids.size))
                blocks.append(ids)
            groups.append((parts, blocks[0] if len(blocks) == 1 else np.concatenate(blocks)))
        plans = plan_steps(pipe.dataset.row_group_table, [ids for _, ids in groups])
        self.planned.extend((parts, ids, p) for (parts, ids), p in zip(groups, plans))

    def queue_one(self, *, deferred: bool = False) -> bool:
        """Queue the next group and start decoding its row groups; False at the end.

        ``deferred``: its decodes are not submitted but left pending, for
        :meth:`decode_first` to run.
        """
        if not self.planned:
            self.plan_ahead()
            if not self.planned:
                self.more = False
                return False
        parts, ids, (rgs, runs, inverse, rows) = self.planned.popleft()
        counts = ([n for _, n in runs] if runs is not None
                  else np.bincount(inverse, minlength=len(rgs)).tolist())
        for rg, count in zip(rgs, counts):
            slot = self.slots.get(rg)
            if slot is None:
                slot = self.slots[rg] = _Slot(self._pending() if deferred else self._submit(rg),
                                              self.serial)
            else:
                slot.last = self.serial
            slot.rows += count
        self.queued.append(_Step(parts, self.serial, ids, rgs, runs, inverse, rows))
        self.queued_steps += len(parts)
        self.serial += 1
        return True

    def _submit(self, rg: int) -> Future:
        return self._track(self.pool.submit(self.pipe._decode, rg))

    def _pending(self) -> Future:
        """A decode's future that no thread runs yet (:meth:`decode_first` does)."""
        return self._track(Future())

    def _track(self, fut: Future) -> Future:
        """Count a decode and keep its future for :meth:`BatchPipeline.cancel`."""
        pipe = self.pipe
        with pipe._futures_lock:
            pipe._futures.add(fut)
        fut.add_done_callback(pipe._forget)
        pipe.decodes += 1
        pipe.max_held = max(pipe.max_held, len(self.slots) + 1)
        return fut

    def decode_first(self, step: _Step) -> None:
        """Run the pending decodes of ``step`` (queued with ``deferred``): this thread and up
        to ``decode_threads - 1`` pool threads take its row groups in order of first use until
        none is left. Returns when this thread finds none left; the caller then waits on the
        slots' futures for those still running in the pool.

        Each decode is claimed through its future (``set_running_or_notify_cancel``), so a
        cancelled pipeline skips what is left and no row group is decoded twice.
        """
        todo = deque((rg, self.slots[rg].future) for rg in step.row_groups)
        helpers = min(len(todo) - 1, self.pipe.decode_threads - 1)
        for _ in range(helpers):
            self.pool.submit(self._claim_all, todo)
        self._claim_all(todo)

    def _claim_all(self, todo: deque) -> None:
        decode = self.pipe._decode
        while True:
            try:
                rg, fut = todo.popleft()   # atomic: two threads never take the same one
            except IndexError:
                return
            if not fut.set_running_or_notify_cancel():
                continue                   # cancelled: the pipeline is closing
            try:
                fut.set_result(decode(rg))
            except BaseException as exc:
                fut.set_exception(exc)   # raised where the step's batch is assembled
                if not isinstance(exc, Exception):
                    raise                # KeyboardInterrupt, SystemExit: stop decoding now

    def queue_ahead(self) -> None:
        """Queue groups while the decode-ahead budget and the step bound allow."""
        pipe = self.pipe
        while self.more and not pipe.stop.is_set() and (
                not self.queued or (len(self.slots) * pipe._per_rg < pipe.ahead_bytes
                                    and self.queued_steps < MAX_AHEAD_STEPS)):
            self.queue_one()

    def pop(self) -> _Step:
        """The next queued group, to be read now."""
        step = self.queued.popleft()
        self.queued_steps -= len(step.parts)
        return step

    def release(self, step: _Step) -> None:
        """Drop the row groups no queued step reads after ``step``."""
        for rg in step.row_groups:
            slot = self.slots.get(rg)
            if slot is not None and slot.last == step.serial:
                del self.slots[rg]

    def close(self) -> None:
        """Cancel the decodes not started; nothing waits for running ones."""
        for slot in self.slots.values():
            slot.future.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)
