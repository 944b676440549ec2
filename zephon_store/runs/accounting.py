"""Run accounting: which order and which deny list each segment of a run log used.

A :class:`RunContext` is built from what a user names (a dataset URL or a mixture file, the
run log or None, the order options given, storage options) and opens it as the loader does
(:func:`~zephon_store.load.source.open_source`, then its plan), reads the log's segments and
what each segment honoured, once. It answers the questions :mod:`zephon_store.runs.audit`
asks: ``order_for(segment)`` (the stream order the segment read: the plan's, for a mixture
over the schedule the log recorded) and
``deny_for(segment)`` (the deny list it honoured: the run log's copy, never the file as it
is now). ``zephon trace``, ``where`` and ``audit`` only parse their arguments, call it and
print; the demo's audit calls it too.

Checks made on construction, each an error naming the log line: the log's segments read
this dataset (or this mixture's sources); order options given may only repeat what every
segment recorded; a ``global_batch`` given disagrees with none of the log's. A question the
log cannot answer as asked is an :class:`~zephon_store.runs.audit.AuditRequestError` (the
CLI's usage error); a damaged log a :class:`~zephon_store.load.runlog.RunLogError`.

>>> ctx = RunContext(tiny_dataset, seed=3)
>>> ctx.num_samples, ctx.segments is None
(100, True)
>>> ctx.order(ctx.order_options()).options.seed
3
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .audit import AuditRequestError


class RunContext:
    """The manifest (or mixture), the log's segments, the orders per options, deny lists
    and provenance of one run, loaded once.

    ``dataset``: a dataset URL or a mixture file; ``log``: the run log's path (None: the
    order comes from ``seed``/``shuffle``/``window_blocks``/``lanes``, as for ``zephon
    plan``; a mixture file's seed and stages from the file). ``global_batch`` places a
    mixture's stage starts in steps without a log; with one, the log's is used and another
    refused. ``shuffle=None`` means not given (with a log: the log's; without: shuffled).

    >>> ctx = RunContext(tiny_dataset)
    >>> order = ctx.order(ctx.order_options())
    >>> sorted(order.sample_at(np.arange(100)).tolist()) == list(range(100))
    True
    """

    def __init__(self, dataset: str, log: str | None = None, *,
                 global_batch: int | None = None, seed: int | None = None,
                 shuffle: bool | None = None, window_blocks: int | None = None,
                 lanes: int | str | None = None, storage_options: dict | None = None,
                 columns: Sequence[str] | None = None) -> None:
        from ..load.runlog import read_run_log
        from ..load.source import open_source, plan_of

        self.dataset, self.log, self.storage_options = dataset, log, storage_options
        self._given = {"seed": seed, "shuffle": shuffle, "window_blocks": window_blocks,
                       "lanes": lanes}
        self.segments = None
        self._orders: dict = {}
        self._deny: dict = {}
        # The log first: its global batch places a mixture's stage starts. Each segment's
        # schedule comes from the log, so stages in steps that a checkpoint fixed (and that
        # would not be in order at the first segment's batch) are not an error here (as
        # for a loader that resumes).
        if log:
            self.segments = read_run_log(log)
        self.global_batch = self._run_global_batch(global_batch)
        # The data as the loader opens it, and the plan it reads it by (load/plan.py). No
        # disk cache: the accounting reads manifests, and records only when asked. No
        # columns: the order never depends on them, and a mixture's sources may hold
        # different ones (each record is read from its own source).
        self.plan = plan_of(open_source(
            dataset, storage_options=storage_options, global_batch=self.global_batch,
            defer_stage_order=self.segments is not None, cache=False, columns=()))
        self.source = self.plan.source
        self.dataset_id = self.source.dataset_id
        self.columns = self._check_columns(columns)
        if log:
            self._check_log()
            self._check_order_flags()

    @property
    def source_names(self) -> tuple[str, ...] | None:
        """The names of the sources the log lines record, from the plan's checkpoint entry
        (a mixture's); None where the lines name one dataset, whose samples are plain ids."""
        entry = self.plan.state_entry()
        return None if entry is None else tuple(s["name"] for s in entry["sources"])

    def _check_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        """``columns`` when each is held by some source (a record shows those of them its
        source has), else an :class:`AuditRequestError` naming what each source holds."""
        if columns is None:
            return None
        held = {name: d.schema.names for name, d in self.source.parts()}
        for c in columns:
            if not any(c in names for names in held.values()):
                raise AuditRequestError(
                    f"column {c!r} is in no source: "
                    + "; ".join(f"{n} has {names}" for n, names in held.items()))
        return list(columns)

    def part(self, k: int | None):
        """Source ``k`` of a mixture (None: the dataset itself), an open dataset."""
        return self.source.parts()[0 if k is None else k][1]

    def _run_global_batch(self, global_batch: int | None) -> int | None:
        """The loader's rule: the log's global batch (or ``global_batch`` without a log)
        places the stage starts in steps; a disagreeing one is refused."""
        from ..errors import MixtureError
        from ..load.order_inputs import run_global_batch

        try:
            return run_global_batch(global_batch, self.segments, log=self.log)
        except MixtureError as exc:
            raise AuditRequestError(str(exc)) from None

    def _check_order_flags(self) -> None:
        """With a log, the order options given may only repeat what every segment recorded."""
        given = {**self._given, "shuffle": False if self._given["shuffle"] is False else None}
        for seg in self.segments:
            logged = seg.order.to_dict()
            for key, value in given.items():
                if value is not None and logged.get(key) != value:
                    shown = ("--no-shuffle" if key == "shuffle"
                             else f"--{key.replace('_', '-')} {value}")
                    raise AuditRequestError(
                        f"{shown} disagrees with {self.log} line {seg.line}, which records "
                        f"{key} {logged.get(key)!r}; leave it out (the log's order is used)")

    def _check_log(self) -> None:
        """The log is for this data: one dataset's first segment read it (a later swap is
        the audit's to report); every segment of a mixture's read its sources."""
        from ..load.runlog import RunLogError

        if self.source_names is None:
            first = self.segments[0] if self.segments else None
            if first is not None and first.dataset_id != self.dataset_id:
                raise RunLogError(
                    f"{self.log} line {first.line}: the log is for dataset {first.dataset_id}, "
                    f"not {self.dataset_id}; pass the dataset (or mixture) the run read")
            return
        ids = [d.dataset_id for _, d in self.source.parts()]
        for seg in self.segments:
            logged = [str(s.get("dataset_id")) for s in (seg.mixture or {}).get("sources", [])]
            if seg.mixture is None or logged[:len(ids)] != ids[:len(logged)]:
                raise RunLogError(
                    f"{self.log} line {seg.line}: the segment is for "
                    + (f"dataset {seg.dataset_id}" if seg.mixture is None else
                       f"a mixture of sources {logged}")
                    + f", not this mixture's sources {ids}; pass the mixture the run read")

    @property
    def num_samples(self) -> int:
        return self.source.num_samples

    def order(self, options, schedule: dict | None = None):
        """The stream order for ``options`` (a mixture: over ``schedule``, a schedule's
        dict as a run log records it; None: the file's), built once per inputs."""
        from ..load.source import plan_of
        from ..order.mixture import MixtureSchedule

        key = (options, None if schedule is None else json.dumps(schedule, sort_keys=True))
        got = self._orders.get(key)
        if got is None:
            plan = self.plan if schedule is None else plan_of(
                self.source.with_schedule(MixtureSchedule.from_dict(schedule)))
            got = self._orders[key] = plan.order(options)
        return got

    def order_for(self, seg):
        """The order segment ``seg`` of the log read (the ``order_for`` of
        :func:`~zephon_store.runs.audit.audit_run`, ``trace`` and ``where``)."""
        if self.source_names is not None:
            return self.order(seg.order, (seg.mixture or {}).get("schedule"))
        if seg.mixture is not None:
            raise AuditRequestError(f"line {seg.line} of {self.log} is a mixture's segment; "
                                    "pass the mixture file, not a dataset")
        if seg.dataset_id != self.dataset_id:
            from ..load.runlog import RunLogError

            raise RunLogError(f"{self.log} line {seg.line}: that segment read dataset "
                              f"{seg.dataset_id}, not {self.dataset_id}; its samples cannot "
                              "be recomputed from this dataset (zephon audit reports the swap)")
        return self.order(seg.order)

    def base_order(self):
        """The first logged segment's order, or without a log the one the options give."""
        if self.segments is not None:
            return self.order_for(self.segments[0])
        return self.order(self.order_options())

    def source_index(self, name: str) -> int:
        """A mixture source's index from its name or its index as text."""
        names = list(self.source_names or ())
        if name in names:
            return names.index(name)
        if name.isdigit() and int(name) < len(names):
            return int(name)
        raise AuditRequestError(f"mixture source {name!r} is not one of {names}")

    def deny_for(self, seg):
        """The deny list segment ``seg`` honoured: the run log's copy of it (named by its
        identity, load/denylist.py), never the list file as it is now, which a takedown
        edits in place. A log written before copies were kept names only the file: it is
        read and must still hash to the logged identity."""
        from ..errors import DenyListError
        from ..load.denylist import load_logged_copy, open_deny_list
        from ..load.runlog import RunLogError

        entry = seg.deny_list
        if not entry:
            return None
        got = self._deny.get(entry["id"])
        if got is None:
            at = f"{self.log} line {seg.line}"
            path = entry.get("path") or ""
            space = self.plan.deny_ids()
            try:
                got = load_logged_copy(self.log, entry, space.num_samples)
                if got is None:   # the copy checks its own identity; the file cannot
                    got = open_deny_list(path, space)
                    if got.identity != entry["id"]:
                        raise RunLogError(
                            f"{at}: its deny list has no copy beside the log, and {path} now "
                            f"has identity {got.identity}, the run used {entry['id']}; "
                            "restore the file the run read")
            except DenyListError as exc:
                raise DenyListError(f"{at}: {exc}") from None
            except OSError as exc:
                raise RunLogError(f"{at}: its deny list has no copy beside the log and "
                                  f"cannot be read at {path!r} ({exc.strerror or exc}); "
                                  "restore that file") from None
            if int(got.ids.size) != entry["count"]:
                raise RunLogError(f"{at}: the deny list {entry['id']} holds {got.ids.size} ids, "
                                  f"the line says {entry['count']}; the line is damaged")
            self._deny[entry["id"]] = got
        return got

    def deny_lists(self, end_step: int) -> list[dict]:
        """Per segment, the deny list it honoured: identity, count and path as logged, and
        the copy beside the log that trace and audit read (None: a log from before copies)."""
        from ..load.denylist import logged_copy_path
        from ..load.runlog import segment_steps

        out = []
        for seg, a, b in segment_steps(self.segments, end_step):
            entry = seg.deny_list or {}
            copy = entry and logged_copy_path(self.log, entry["id"])
            deny = self.deny_for(seg) if entry else None
            out.append({"line": seg.line, "first_step": a, "end_step": b,
                        "id": entry.get("id"), "count": int(entry.get("count", 0)),
                        "documents": 0 if deny is None else len(deny.documents),
                        "path": entry.get("path"),
                        "copy": copy if copy and os.path.isfile(copy) else None})
        return out

    def order_options(self):
        """The order options given (without a log): seed 0 unless given; a mixture file's
        seed unless given, and a disagreeing one refused (the loader's rule)."""
        from ..errors import MixtureError
        from ..order.order import OrderOptions

        given = self._given
        try:
            seed = self.plan.order_seed(given["seed"])
        except MixtureError as exc:
            raise AuditRequestError(str(exc)) from None
        kw = {"seed": seed, "shuffle": given["shuffle"] is not False}
        if given["window_blocks"] is not None:
            kw["window_blocks"] = given["window_blocks"]
        if given["lanes"] is not None:
            kw["lanes"] = given["lanes"]
        try:
            return OrderOptions(**kw)
        except (ValueError, TypeError) as exc:
            raise AuditRequestError(str(exc)) from exc

    def planned_segment(self, *, global_batch: int, world_size: int = 1, cursor: int = 0):
        """Without a log: one segment from step 0 at ``cursor``, in the order the options
        give, as a run with these figures would log it (``trace`` without ``--log``)."""
        from ..load.runlog import RunSegment

        options = self.order_options()
        try:
            return RunSegment(first_step=0, cursor=cursor, global_batch=global_batch,
                              world_size=world_size, num_workers=0,
                              dataset_id=self.dataset_id, order=options)
        except (ValueError, TypeError) as exc:
            raise AuditRequestError(str(exc)) from exc

    def provenance(self, manifest):
        """``(starts, names, row starts)`` of the provenance pieces, sorted by sample."""
        table = manifest.tables["provenance"]
        starts = table.column("row_start").to_numpy()
        rows = table.column("num_rows").to_numpy()
        keep = rows > 0
        order = np.argsort(starts[keep], kind="stable")
        names = np.array(table.column("input").to_pylist(), dtype=object)[keep][order]
        return (starts[keep][order], names,
                table.column("input_row_start").to_numpy()[keep][order])

    def origin(self, ids: Sequence[int], sources: Sequence[str] | None = None) -> list[dict]:
        """Each id's input file and record index (a mixture: in its source)."""
        out = []
        for j, i in enumerate(ids):
            manifest = self.part(None if sources is None
                                 else self.source_index(sources[j])).manifest
            starts, names, input_rows = self.provenance(manifest)
            k = int(np.searchsorted(starts, i, side="right") - 1)
            out.append({"input": str(names[k]), "record": int(input_rows[k] + i - starts[k])})
        return out

    def records(self, ids: Sequence[int], sources: Sequence[str] | None = None, *,
                hide: Sequence[bool] | None = None) -> list[dict | None]:
        """The records themselves (reads their row groups); None, unread, where ``hide``
        (a deny list's mask) is true."""
        if sources is None:
            keep = [i for j, i in enumerate(ids) if not (hide and hide[j])]
            got = iter(self._columns_of(self.source.take(keep)).to_pylist() if keep else [])
            return [None if hide and hide[j] else next(got) for j in range(len(ids))]
        return [None if hide and hide[j] else
                self._columns_of(self.part(self.source_index(src)).take([i])).to_pylist()[0]
                for j, (i, src) in enumerate(zip(ids, sources))]

    def _columns_of(self, table):
        """``table`` with the chosen columns it holds (all without a choice)."""
        if self.columns is None:
            return table
        return table.select([c for c in self.columns if c in table.schema.names])

    # The audit questions, with this context's orders and deny lists.

    def audit(self, end_step: int | None = None, *, tallies=None):
        """:func:`~zephon_store.runs.audit.audit_run` of the log (what ``zephon audit`` runs);
        ``tallies``: one :class:`~zephon_store.runs.audit.ExposureTally` per source, filled
        by the same count (``zephon audit --summary``)."""
        from .audit import audit_run

        return audit_run(self.segments, self.order_for, end_step=end_step,
                         dataset_id=self.dataset_id if self.source_names is None else None,
                         deny_for=self.deny_for, tallies=tallies)

    def trace(self, steps: Iterable[int], *, rank: int | None = None,
              end_step: int | None = None, segments: Sequence[Any] | None = None):
        """:func:`~zephon_store.runs.audit.trace` over the log's segments (or ``segments``,
        e.g. ``[ctx.planned_segment(...)]`` without a log)."""
        from .audit import trace

        return trace(self.segments if segments is None else segments, self.order_for, steps,
                     rank=rank, deny_for=self.deny_for, end_step=end_step)

    def where(self, ids: Sequence[int], epochs: Iterable[int], *, source: int | None = None,
              end_step: int | None = None,
              segments: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """:func:`~zephon_store.runs.audit.where` with the base order, and with a log (or
        ``segments``, e.g. ``[ctx.planned_segment(...)]``) the step and rank that consumed
        each id."""
        from .audit import where

        segments = self.segments if segments is None else segments
        return where(self.base_order(), ids, epochs, segments=segments,
                     order_for=self.order_for if segments else None,
                     end_step=end_step, source=source)
