"""The torch-free loader: a rank's batches over one :class:`~zephon_store.load.source.Source`,
and a one-cursor checkpoint.

:class:`Loader` owns everything about a run that is not torch: the source (opened by
:func:`~zephon_store.load.source.open_source`) and the plan it reads it by, the order and its
lanes, the cursor and the step count, ``state_dict``/``load_state_dict`` (a loaded state
applies at the next ``iter()``, STYLE 13), the run log's segments, the deny list, the end of
the stream and its warnings, over :class:`~zephon_store.load.share_reader.ShareReader`. Who
makes the batches is a part handed to it (:mod:`zephon_store.load.workers`). A batch is a
dict of numpy arrays. :class:`~zephon_store.torch.ZephonLoader` adds only its workers part
(torch's ``DataLoader``), the tensor collation and the topology torch.distributed knows.

The cursor advances by ``global_batch`` each time a batch is handed to the training loop,
so it counts consumed samples, never prefetched ones.

>>> loader = Loader(tiny_dataset, topology=Topology(8), order=OrderOptions(seed=7),
...                 stop=StopOptions(max_steps=1))
>>> [batch["id"].tolist() for batch in loader], loader.state_dict()["cursor"]
([[79, 41, 78, 45, 68, 97, 30, 33]], 8)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import weakref
from collections.abc import Iterator

from .._util.exit_close import close_at_exit
from ..errors import StateMismatchError
from ..order.assign import step_cursor
from ..order.order import OrderOptions
from ..order.topology import Topology
from .denylist import open_deny_list, save_logged_copy
from .documents import DocumentColumns
from .options import (
    BatchOptions,
    ReadAheadOptions,
    SourceOptions,
    StopOptions,
    WorkerOptions,
    grouped,
)
from .pipeline import MAX_AUTO_AHEAD_BYTES, two_working_sets_bytes
from .runlog import RunSegment, append_segment
from .share_reader import ShareReader, prepare_workers_soon
from .source import open_parts, open_source, plan_of
from .state import MAX_CURSOR, LoaderState, check_state
from .stream import RankStream
from .workers import Workers, as_workers

__all__ = ["Loader"]

log = logging.getLogger("zephon_store")

# The flat keywords the Loader took before its option groups (each now warns).
LOADER_FLAT = frozenset({"storage_options", "cache", "decoded_cache", "expect_dataset_id",
                         "collate"})


class Loader:
    """This rank's batches of a source in the global, elastic order (numpy dicts), and the
    checkpoint of the run; no torch.

    ``dataset``: any spelling :func:`~zephon_store.load.source.open_source` takes (a URL, a
    ``Dataset``, a mixture file, its dict, a ``MixtureSpec``, a ``MixedDataset``), opened
    as ``source`` (:class:`~zephon_store.load.options.SourceOptions`) says;
    ``topology``: who reads (global batch, world size, rank, ranks per node); ``seed`` or
    ``order``: the order (a mixture file's seed applies unless one is given); the option
    groups ``batch`` (its ``collate`` applies to each batch handed out), ``read_ahead`` and
    ``stop`` (:mod:`zephon_store.load.options`);
    ``workers``: who makes the batches, a part (:mod:`zephon_store.load.workers`: threads, or
    torch's or Grain's process workers, which their front ends hand over) or the
    :class:`~zephon_store.load.options.WorkerOptions` of threads; ``run_log``: rank 0
    appends one line per segment; ``deny_list``: a file or a ``DenyList`` (a mixture's: a
    dict or file per source, :func:`~zephon_store.load.denylist.open_deny_list`). Each
    keyword is described in :class:`~zephon_store.torch.ZephonLoader`'s docstring; the flat
    keywords of before the groups (``storage_options=``, ``cache=``, ``decoded_cache=``,
    ``expect_dataset_id=``, ``collate=``) still work and warn
    (:func:`~zephon_store.load.options.grouped`).
    """

    def __init__(self, dataset, *, topology: Topology, seed: int | None = None,
                 order: OrderOptions | None = None, source: SourceOptions | None = None,
                 batch: BatchOptions | None = None, read_ahead: ReadAheadOptions | None = None,
                 stop: StopOptions | None = None, workers: WorkerOptions | Workers | None = None,
                 run_log: str | None = None, deny_list=None, **deprecated) -> None:
        groups = grouped(type(self).__name__, {"source": source, "batch": batch}, deprecated,
                         allowed=LOADER_FLAT)
        source, batch = groups["source"], groups["batch"]
        seed_given = seed is not None or order is not None
        if order is None:
            order = OrderOptions(seed=seed or 0)
        elif seed is not None and seed != order.seed:
            raise ValueError(f"seed={seed} disagrees with order.seed={order.seed}; pass one")
        # Who makes the batches (load/workers.py), and its options.
        self.worker_part = as_workers(workers)
        self.workers = self.worker_part.options
        self.stop = stop or StopOptions()
        # The collation runs in this process, on each batch handed out; the reader's
        # options (pickled into process workers) do not carry it.
        self.collate = batch.collate
        self.batch_options = dataclasses.replace(batch, collate=None)
        self.run_log = run_log
        self.read_ahead = read_ahead or ReadAheadOptions()
        self.topology = topology
        columns = self.batch_options.columns
        if self.workers.num_workers:
            # The forked workers' S3 stack, readied while the node's metadata is fetched.
            prepare_workers_soon(dataset, self.workers.multiprocessing_context,
                                 source.storage_options)
        open_kwargs = source.open_kwargs()
        if self.batch_options.documents:
            # The parts first: the columns the document fields need (a best-fit dataset's
            # num_tokens too) are known from them; refused here, in one line, if not packed.
            dataset, open_kwargs = open_parts(dataset, **open_kwargs), {}
            columns = DocumentColumns.of(dataset).with_columns(columns)
            self.batch_options = dataclasses.replace(self.batch_options, columns=columns)
        # A URL, a Dataset or a mixture (docs/mixtures.md), as one Source (load/source.py),
        # and the plan this run reads it by (load/plan.py).
        self.plan = plan_of(open_source(
            dataset, columns=None if columns is None else list(columns),
            global_batch=topology.global_batch, defer_stage_order=True, **open_kwargs))
        # The plan's seed rule (a mixture file's seed applies unless one is given).
        order = order.replace(seed=self.plan.order_seed(order.seed if seed_given else None))
        # The order options asked for, and the ones in use: lanes="auto" is resolved here,
        # from the dataset and the nodes this run starts on, and a resume takes the
        # checkpoint's lanes instead (load_state_dict).
        self._requested_order = order
        self.order = self._resolve_lanes(order)
        self.cursor = 0
        self._warned_drop = False
        # The iterator made by the last iter(); load_state_dict closes it, and every
        # iterator made before the last load_state_dict stops (STYLE 13).
        self._open_iter: weakref.ref | None = None
        self._loads = 0
        # Global steps consumed since the run began (saved as the state's "step"): the run
        # log numbers segments by it, independently of the cursor (load/runlog.py).
        self.step = 0
        self._logged_loads: int | None = None
        if deny_list is not None:
            deny_list = open_deny_list(deny_list, self.plan.deny_ids())
            self.batch_options = self.batch_options.with_deny_list(deny_list)
            if deny_list.spans is not None:
                self._documents_for_takedown(columns)
        self._max_cursor = self.stop.end_position(self.dataset.num_samples)
        self._check_working_set()

    def _documents_for_takedown(self, columns) -> None:
        """A deny list naming documents turns the document fields on: a taken-down
        document's tokens become padding, and only ``loss_mask`` and the segments of
        ``position_ids``/``cu_seqlens`` tell the training loop so (docs/audit.md)."""
        if self.batch_options.documents:
            return
        need = DocumentColumns.of(self.plan.source).names
        if columns is not None and not set(need) <= set(columns):
            raise ValueError(
                f"the deny list names documents, whose takedown needs the columns {list(need)} "
                f"read (the batch says which tokens were removed); columns={list(columns)} "
                "leaves some out: add them, or pass BatchOptions(documents=True)")
        self.batch_options = dataclasses.replace(self.batch_options, documents=True)

    @property
    def dataset(self):
        """The :class:`~zephon_store.read.source.Source` this loader reads (its plan's)."""
        return self.plan.source

    @property
    def num_workers(self) -> int:
        return self.workers.num_workers

    @property
    def drop_last(self) -> bool:
        return self.stop.drop_last

    def _resolve_lanes(self, order: OrderOptions) -> OrderOptions:
        """``order`` with ``lanes="auto"`` resolved for this job (OrderOptions.resolved)."""
        return self.plan.resolve_lanes(order, self.topology)

    def _check_working_set(self) -> None:
        # A shuffled order keeps (lanes / world_size) * (window_blocks + 2) row groups in use
        # at once; the pipeline holds two such sets decoded. Beyond its automatic cap, row
        # groups are decoded more than once per epoch: say so, with the numbers.
        if self.read_ahead.decode_ahead_bytes is not None:
            return
        stream = RankStream(self.plan, self.order, self.topology)
        need = two_working_sets_bytes(stream)
        if need > MAX_AUTO_AHEAD_BYTES:
            log.warning(
                "zephon: this rank's order reads from %d row groups at once (~%.1f GB decoded "
                "for two working sets), more than the %.1f GB decoded automatically; row groups "
                "will be decoded more than once per epoch. Pass decode_ahead_bytes=... to hold "
                "them, or use more ranks (each reads lanes/world_size lanes).",
                stream.working_set_row_groups(), need / 1e9, MAX_AUTO_AHEAD_BYTES / 1e9)

    # -- state ---------------------------------------------------------------------------
    @property
    def dataset_id(self) -> str:
        return self.dataset.dataset_id

    def state_dict(self) -> dict:
        """``{version, dataset_id, seed, order, cursor, step}``: identical on every rank (a
        mixture adds ``mixture``: its sources and schedule, see docs/mixtures.md). ``step``
        counts the global steps consumed since the run began (the run log's step numbers)."""
        cursor, step = self._position()
        return LoaderState(self.dataset_id, self.order, cursor,
                           mixture=self.plan.state_entry(), step=step).to_dict()

    def _position(self) -> tuple[int, int]:
        """``(cursor, step)``: positions and global steps consumed (a live loader: committed)."""
        return self.cursor, self.step

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state``; raises StateMismatchError if it is for other data/options.

        Changing world size, global batch or num_workers is allowed (and logged). The state
        applies at the next ``iter()``: an iterator still open is closed (its next ``next()``
        raises StopIteration), so it can never hand out a batch of the old stream or move
        the loaded cursor. ``state_dict()`` returns the loaded cursor at once.
        """
        st, step = self._adopt_state(state)
        self._loads += 1
        self._close_open_iter()
        self.cursor = st.cursor
        self.step = step
        n = self.dataset.num_samples
        log.info("zephon: resuming %s at cursor %d (epoch %d, %d into it) with world_size=%d "
                 "global_batch=%d num_workers=%d", self.dataset_id, st.cursor, st.cursor // n,
                 st.cursor % n, self.topology.world_size, self.topology.global_batch,
                 self.num_workers)
        if st.cursor % self.topology.global_batch:
            log.info("zephon: cursor %d is not a multiple of global_batch %d; steps are counted "
                     "from the cursor, so nothing is skipped or repeated", st.cursor,
                     self.topology.global_batch)

    def _adopt_state(self, state: dict) -> tuple[LoaderState, int]:
        """``state`` checked against this loader (StateMismatchError), its order and a
        mixture's schedule adopted; returns it and its step count. The cursor is the
        caller's to move (at the next ``iter()``, or a live run's next step)."""
        st = check_state(state, dataset_id=self.dataset_id, order=self._requested_order,
                         mixture=self.plan.state_entry() is not None)
        if st.cursor + self.topology.global_batch > MAX_CURSOR:
            raise StateMismatchError(
                f"loader state 'cursor' {st.cursor} leaves no room for a step of "
                f"{self.topology.global_batch} positions below 2**63; the checkpoint is corrupted")
        step = st.step_or(self.topology.global_batch)
        # A mixture: the checkpoint's schedule up to the cursor, then this loader's later
        # stages (an appended stage continues each source where it stopped; one given in
        # steps begins at that step of the run). A dataset: itself.
        self.plan = self.plan.resumed(st.mixture, st.cursor, step=step,
                                      global_batch=self.topology.global_batch)
        self.order = st.order
        return st, step

    # -- iteration -----------------------------------------------------------------------
    def _num_batches(self, start: int) -> int | None:
        self.plan.check_ready()
        n = self.stop.num_batches(start, self.topology.global_batch, self.dataset.num_samples)
        end = self._mixture_end
        if end is not None:
            # A capped source ends the mixture (policy "error"), and the stream with it:
            # the full steps before it, or with drop_last=False a short last step up to it.
            left, b = max(0, end - start), self.topology.global_batch
            n_end = left // b if self.drop_last else -(-left // b)
            n = n_end if n is None else min(n, n_end)
        return n

    @property
    def _mixture_end(self) -> int | None:
        """The first position the mixture cannot serve (a capped source ran out), or None."""
        return self.plan.end

    @property
    def _stream_end(self) -> int | None:
        """Where the stream ends: the run's own end (epochs) or the mixture's, the nearer."""
        ends = [e for e in (self._max_cursor, self._mixture_end) if e is not None]
        return min(ends) if ends else None

    @property
    def _end(self) -> int | None:
        """The position the run stops at, when its last step may be short (drop_last=False)."""
        return None if self.drop_last else self._stream_end

    def _reader(self, start: int, split=None) -> ShareReader:
        """The reader of this loader's batches from cursor ``start`` (``split``: another
        rule for this process's share of each step, a live run's participant)."""
        return ShareReader(self.plan, self.order, self.topology, batch=self.batch_options,
                           read_ahead=self.read_ahead, start_cursor=start,
                           num_batches=self._num_batches(start), end=self._end, split=split)

    def _warn_dropped(self, start: int) -> None:
        if self._warn_mixture_end(start):
            return
        left = 0 if self._max_cursor is None else max(0, self._max_cursor - start)
        dropped = left % self.topology.global_batch
        if self.drop_last and dropped and not self._warned_drop:
            self._warned_drop = True
            log.warning(
                "zephon: the run ends at position %d (epochs); its last %d positions are "
                "fewer than global_batch=%d and are dropped (drop_last=True, the default). "
                "Pass drop_last=False to read them in a short last step.",
                self._max_cursor, dropped, self.topology.global_batch)

    def _warn_mixture_end(self, start: int) -> bool:
        """Log once that the mixture ends before the run would (it names that end, not the
        run's own); True when the mixture's end is the one this run stops at."""
        end, b = self._mixture_end, self.topology.global_batch
        wanted = self.stop.num_batches(start, b, self.dataset.num_samples)
        if end is None or (wanted is not None and wanted <= self._num_batches(start)):
            return False
        if not self._warned_drop:
            self._warned_drop = True
            own = ("endless" if wanted is None else f"max_steps={self.stop.max_steps}"
                   if self.stop.max_steps is not None
                   else f"epochs={self.stop.epochs} ends at position {self._max_cursor}")
            left = max(0, end - start)
            tail = (f"; its last {left % b} positions are fewer than global_batch={b} and are "
                    "dropped (drop_last=True, the default): pass drop_last=False to read them "
                    "in a short last step" if self.drop_last and left % b else "")
            log.warning("zephon: the mixture ends at position %d, before this run's own end "
                        "(%s): %s; the loop ends there, at cursor %d%s", end, own,
                        self.plan.end_reason(),
                        start + (left // b * b if self.drop_last else left), tail)
        return True

    def _close_open_iter(self) -> None:
        it = self._open_iter() if self._open_iter is not None else None
        self._open_iter = None
        if it is not None:
            try:
                it.close()
            except ValueError:
                # Running in another thread right now: it cannot be closed from here;
                # _loads has changed, so it writes no cursor and ends at its next batch.
                pass

    def __iter__(self) -> Iterator:
        # Closed at interpreter exit if still open (the docs' `batches = iter(loader)`):
        # left to module teardown, its cleanup ran over cleared module globals and printed a
        # traceback.
        it = close_at_exit(self._batches(self.cursor, self._loads))
        self._open_iter = weakref.ref(it)
        return it

    def _batches(self, start: int, loads: int) -> Iterator:
        self._warn_dropped(start)
        batches = self.worker_part.batches(self._reader(start))
        b = self.topology.global_batch
        end = self._end if self._end is not None else MAX_CURSOR
        first_step = self.step
        with contextlib.closing(batches):
            for i, batch in batches:
                if self._loads != loads:
                    return   # a state was loaded since this iterator began: it is over
                if i == 0 and self.run_log and self._logged_loads != loads:
                    self._log_segment(start, first_step)
                    self._logged_loads = loads
                self.step = first_step + i + 1
                # Consumed means handed to the training loop: advance before yielding so a
                # state_dict() taken right after this batch resumes with the next one. A
                # short last step (drop_last=False) ends the cursor exactly at the end.
                self.cursor = min(step_cursor(start, i + 1, b), end)
                yield self.collate(batch) if self.collate is not None else batch

    def _log_segment(self, cursor: int, first_step: int, *, live: bool = False,
                     participants: int | None = None) -> None:
        """Rank 0 appends this segment's line to the run log (load/runlog.py); ``live``:
        a live run's (each step split among its ``participants``)."""
        t = self.topology
        deny = self.batch_options.deny_list
        # A mixture's entry holds its schedule too: trace and audit rebuild its order from
        # the log (a resume may append stages).
        entry = self.plan.state_entry()
        mixture = None if entry is None else {"id": self.dataset_id, **entry}
        if deny is not None and t.rank == 0:
            # The list's ids beside the log, before the line that names them: audit and
            # trace read this copy, so editing the list file in place (a takedown's usual
            # step) never breaks the audit of this segment.
            save_logged_copy(deny, self.run_log)
        append_segment(self.run_log, RunSegment(
            first_step=first_step, cursor=cursor, global_batch=t.global_batch,
            world_size=t.world_size, num_workers=self.num_workers,
            dataset_id=self.dataset_id, order=self.order, ranks_per_node=t.ranks_per_node,
            mixture=mixture, deny_list=None if deny is None else deny.to_log(), live=live,
            participants=participants),
            rank=t.rank)

    def __len__(self) -> int:
        n = self._num_batches(self._position()[0])
        if n is None:
            raise TypeError(f"an endless {type(self).__name__} has no len(); pass max_steps "
                            "or epochs")
        return n
