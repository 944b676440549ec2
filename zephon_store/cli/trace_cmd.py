"""``zephon trace``, ``zephon where``, ``zephon audit``: questions a run log answers exactly.

Pure computation over the manifest and the run log (:mod:`zephon_store.load.runlog`): no
shard byte is read, except by ``trace --show`` (the records themselves). Without a log,
``trace`` and ``where`` take the order options as ``zephon plan`` does, plus
``--global-batch``, ``--world-size`` and ``--cursor`` for ``trace``; a mixture file's seed
and stages come from the file, by the loader's own rule (:mod:`zephon_store.load.order_inputs`).
See docs/audit.md.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np

from .common import (
    UsageError,
    add_storage_options,
    build_options,
    dumps,
    emit,
    non_negative_int,
    positive_int,
)
from .plan_cmd import _steps


def _order_args(p) -> None:
    g = p.add_argument_group("order (without --log)")
    g.add_argument("--seed", type=int, default=None,
                   help="default: a mixture file's seed, else 0 (a seed that disagrees with "
                        "the file's, or with the log's, is refused)")
    g.add_argument("--no-shuffle", action="store_true", help="sequential order")
    g.add_argument("--window-blocks", type=int, default=None, metavar="K")
    g.add_argument("--lanes", type=int, default=None, metavar="P")


def add_trace_parsers(sub) -> None:
    """Register ``trace``, ``where`` and ``audit``."""
    t = sub.add_parser("trace", help="the sample ids each rank consumed at given steps")
    t.add_argument("dataset", metavar="DATASET")
    t.add_argument("--log", default=None, metavar="RUNLOG", help="the run log (JSONL)")
    t.add_argument("--step", type=non_negative_int, default=None, metavar="S")
    t.add_argument("--steps", type=_steps, default=None, metavar="A:B")
    t.add_argument("--rank", type=non_negative_int, default=None, metavar="R")
    t.add_argument("--world-size", type=positive_int, default=1, metavar="W",
                   help="without --log (default 1)")
    t.add_argument("--cursor", type=non_negative_int, default=0, metavar="C",
                   help="without --log: the cursor before step 0 (default 0)")
    _end_step_arg(t, "with --log: the step the run reached (steps from it on are marked "
                     "'not reached'; default: the last segment's end is unknown)")
    t.add_argument("--provenance", action="store_true",
                   help="add each sample's input file and record index (from conversion)")
    t.add_argument("--show", action="store_true", help="print the records themselves "
                   "(a sample the segment's deny list masked is not read: 'denied')")
    t.add_argument("--show-denied", action="store_true",
                   help="with --show, print denied records too (e.g. to review a takedown)")
    _common_args(t, order=True)

    w = sub.add_parser("where", help="when each sample id is read: its position per epoch, "
                       "and with a run log the step and rank that consumed it")
    w.add_argument("dataset", metavar="DATASET")
    w.add_argument("seqs", nargs="+", metavar="SEQ",
                   help="sample ids; for a mixture SOURCE:ID (a source name or index)")
    w.add_argument("--epochs", type=positive_int, default=1, metavar="E",
                   help="epochs 0..E-1 (default 1)")
    w.add_argument("--log", default=None, metavar="RUNLOG")
    _end_step_arg(w, "with --log: the step the run reached (default: the last segment is "
                     "open-ended)")
    _common_args(w, order=True)

    a = sub.add_parser("audit", help="recompute every exposure of a run from its log; exit 0 "
                       "when each sample was read exactly once per epoch, 1 otherwise")
    a.add_argument("dataset", metavar="DATASET")
    a.add_argument("--log", required=True, metavar="RUNLOG")
    _end_step_arg(a, "the step the run reached (the log records where segments start, not "
                     "where the last one stopped; default: audit up to the last segment's "
                     "first step)")
    _common_args(a, order=False)


def _end_step_arg(p, help_text: str) -> None:
    p.add_argument("--end-step", type=non_negative_int, default=None, metavar="S", help=help_text)


def _common_args(p, *, order: bool) -> None:
    p.add_argument("--json", action="store_true")
    p.add_argument("--global-batch", type=positive_int, default=None, metavar="B",
                   help="samples per step: without --log, places a mixture's stage starts "
                        "in steps (and trace's steps); with --log the log's is used, and "
                        "another is refused")
    if order:
        _order_args(p)
    add_storage_options(p)


@contextlib.contextmanager
def _answers(log: str | None):
    """Library refusals as the CLI reports them: a question too large or outside the run
    is a usage error (exit 2); a run log error names the file."""
    from ..errors import MixtureError
    from ..load.audit import AuditRequestError
    from ..load.runlog import RunLogError

    try:
        yield
    except AuditRequestError as exc:
        raise UsageError(str(exc)) from None
    except RunLogError as exc:
        if log and not str(exc).startswith(log):
            raise type(exc)(f"{log} {exc}") from None
        raise
    except MixtureError as exc:
        if "needs global_batch" in str(exc):
            raise UsageError(f"{exc}: pass --global-batch B (or --log RUNLOG)") from None
        raise


class _Context:
    """The manifest, the orders per options, deny lists and provenance, loaded once."""

    def __init__(self, args) -> None:
        from ..errors import MixtureError
        from ..format.manifest import load_manifest
        from ..io.storage import Storage
        from ..load.mixed import is_mixture, open_mixture
        from ..load.order_inputs import run_global_batch
        from ..load.runlog import read_run_log

        self.args = args
        self.mix = None
        self.segments = None
        self._orders: dict = {}
        self._deny: dict = {}
        mixture = is_mixture(args.dataset)
        if getattr(args, "log", None) and mixture:
            self.segments = read_run_log(args.log)
        try:
            # The loader's rule: the log's global batch (or --global-batch without a log)
            # places the stage starts in steps; a disagreeing flag is refused.
            self.global_batch = run_global_batch(getattr(args, "global_batch", None),
                                                 self.segments, log=args.log)
        except MixtureError as exc:
            raise UsageError(str(exc)) from None
        if mixture:
            # A mixture file: its sources' manifests; each segment's schedule comes from
            # the log, so stages in steps that a checkpoint fixed (and that would not be in
            # order at the first segment's batch) are not an error here (as for a loader
            # that resumes).
            with _answers(None):
                self.mix = open_mixture(args.dataset, global_batch=self.global_batch,
                                        defer_stage_order=self.segments is not None)
            self.manifest = None
            self.dataset_id = self.mix.dataset_id
        else:
            self.manifest = load_manifest(Storage(args.dataset,
                                                  storage_options=args.storage_options))
            self.dataset_id = self.manifest.dataset_id
        if getattr(args, "log", None):
            if self.segments is None:
                self.segments = read_run_log(args.log, dataset_id=self.dataset_id)
                try:
                    run_global_batch(args.global_batch, self.segments, log=args.log)
                except MixtureError as exc:
                    raise UsageError(str(exc)) from None
            if self.mix is not None:
                self._check_mixture_log()
            self._check_order_flags()

    def _check_order_flags(self) -> None:
        """With a log, the order flags may only repeat what every segment recorded."""
        a = self.args
        given = {"seed": getattr(a, "seed", None),
                 "shuffle": False if getattr(a, "no_shuffle", False) else None,
                 "window_blocks": getattr(a, "window_blocks", None),
                 "lanes": getattr(a, "lanes", None)}
        for seg in self.segments:
            logged = seg.order.to_dict()
            for key, value in given.items():
                if value is not None and logged.get(key) != value:
                    shown = ("--no-shuffle" if key == "shuffle"
                             else f"--{key.replace('_', '-')} {value}")
                    raise UsageError(f"{shown} disagrees with {a.log} line {seg.line}, which "
                                     f"records {key} {logged.get(key)!r}; leave it out (the "
                                     "log's order is used)")

    def _check_mixture_log(self) -> None:
        from ..load.runlog import RunLogError

        ids = [s.dataset_id for s in self.mix.sources]
        for seg in self.segments:
            logged = [str(s.get("dataset_id")) for s in (seg.mixture or {}).get("sources", [])]
            if seg.mixture is None or logged[:len(ids)] != ids[:len(logged)]:
                raise RunLogError(
                    f"{self.args.log} line {seg.line}: the segment is for "
                    + (f"dataset {seg.dataset_id}" if seg.mixture is None else
                       f"a mixture of sources {logged}")
                    + f", not this mixture's sources {ids}; pass the mixture the run read")

    @property
    def num_samples(self) -> int:
        return self.mix.num_samples if self.mix is not None else self.manifest.num_samples

    def order(self, options, schedule: dict | None = None):
        import json

        from ..load.mixed import MixedOrder
        from ..order.mixture import MixtureSchedule
        from ..order.order import Order

        key = (options, None if schedule is None else json.dumps(schedule, sort_keys=True))
        got = self._orders.get(key)
        if got is None:
            if self.mix is None:
                got = Order(self.manifest.rg_rows, options)
            else:
                mix = self.mix if schedule is None else self.mix.with_schedule(
                    MixtureSchedule.from_dict(schedule))
                got = MixedOrder(mix, options)
            self._orders[key] = got
        return got

    def order_for(self, seg):
        if self.mix is not None:
            return self.order(seg.order, (seg.mixture or {}).get("schedule"))
        if seg.mixture is not None:
            raise UsageError(f"line {seg.line} of {self.args.log} is a mixture's segment; "
                             "pass the mixture file, not a dataset")
        if seg.dataset_id != self.dataset_id:
            from ..load.runlog import RunLogError

            raise RunLogError(f"{self.args.log} line {seg.line}: that segment read dataset "
                              f"{seg.dataset_id}, not {self.dataset_id}; its samples cannot "
                              "be recomputed from this dataset (zephon audit reports the swap)")
        return self.order(seg.order)

    def source_index(self, name: str) -> int:
        names = list(self.mix.names)
        if name in names:
            return names.index(name)
        if name.isdigit() and int(name) < len(names):
            return int(name)
        raise UsageError(f"mixture source {name!r} is not one of {names}")

    def deny_for(self, seg):
        """The deny list segment ``seg`` honoured: the run log's copy of it (named by its
        identity, load/denylist.py), never the list file as it is now, which a takedown
        edits in place. A log written before copies were kept names only the file: it is
        read and must still hash to the logged identity."""
        from ..errors import DenyListError
        from ..load.denylist import load_deny_list, load_logged_copy
        from ..load.runlog import RunLogError

        entry = seg.deny_list
        if not entry:
            return None
        got = self._deny.get(entry["id"])
        if got is None:
            at = f"{self.args.log} line {seg.line}"
            path = entry.get("path") or ""
            if self.manifest is None:
                raise RunLogError(f"{at}: deny lists of mixtures are not supported")
            try:
                got = load_logged_copy(self.args.log, entry, self.manifest.num_samples)
                if got is None:   # the copy checks its own identity; the file cannot
                    got = load_deny_list(path, self.manifest)
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

    def options_from_args(self):
        from ..errors import MixtureError
        from ..load.order_inputs import mixture_seed
        from ..order.order import OrderOptions

        seed = 0 if self.args.seed is None else self.args.seed
        if self.mix is not None:
            # The loader's seed rule: the file's seed unless --seed; a disagreeing one refused.
            try:
                seed = mixture_seed(self.mix.seed, self.args.seed, origin=self.args.dataset)
            except MixtureError as exc:
                raise UsageError(str(exc)) from None
        kw = {"seed": seed, "shuffle": not self.args.no_shuffle}
        if self.args.window_blocks is not None:
            kw["window_blocks"] = self.args.window_blocks
        if self.args.lanes is not None:
            kw["lanes"] = self.args.lanes
        return build_options(OrderOptions, **kw)

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

    def origin(self, ids: list[int], sources: list[str] | None = None) -> list[dict]:
        """Each id's input file and record index (a mixture: in its source)."""
        out = []
        for j, i in enumerate(ids):
            manifest = (self.manifest if sources is None
                        else self.mix.sources[self.source_index(sources[j])].manifest)
            starts, names, input_rows = self.provenance(manifest)
            k = int(np.searchsorted(starts, i, side="right") - 1)
            out.append({"input": str(names[k]), "record": int(input_rows[k] + i - starts[k])})
        return out

    def records(self, ids: list[int], sources: list[str] | None = None, *,
                hide: list[bool] | None = None) -> list[dict | None]:
        """The records themselves (reads their row groups); None, unread, where ``hide``
        (a deny list's mask) is true."""
        if sources is None:
            from ..read.dataset import open_dataset

            keep = [i for j, i in enumerate(ids) if not (hide and hide[j])]
            with open_dataset(self.args.dataset,
                              storage_options=self.args.storage_options) as ds:
                got = iter(ds.take(keep).to_pylist() if keep else [])
            return [None if hide and hide[j] else next(got) for j in range(len(ids))]
        return [self.mix.sources[self.source_index(src)].take([i]).to_pylist()[0]
                for i, src in zip(ids, sources)]


def cmd_trace(args) -> int:
    from ..load.audit import trace
    from ..load.runlog import RunSegment

    if (args.step is None) == (args.steps is None):
        raise UsageError("pass --step S or --steps A:B")
    ctx = _Context(args)
    # A range, taken lazily: trace refuses more ids than one answer holds.
    steps = [args.step] if args.step is not None else range(*args.steps)
    logged = ctx.segments is not None
    if not logged:
        if args.global_batch is None:
            raise UsageError("without --log, pass --global-batch B (and --world-size, --cursor "
                             "and the order options as for zephon plan)")
        if args.end_step is not None:
            raise UsageError("--end-step needs --log (the step the logged run reached)")
        seg = build_options(RunSegment, first_step=0, cursor=args.cursor,
                            global_batch=args.global_batch, world_size=args.world_size,
                            num_workers=0, dataset_id=ctx.dataset_id,
                            order=ctx.options_from_args())
        ctx.segments = [seg]
    with _answers(args.log):
        traced = trace(ctx.segments, ctx.order_for, steps, rank=args.rank,
                       deny_for=ctx.deny_for, end_step=args.end_step)
    out = []
    for t in traced:
        d = t.to_dict()
        if not logged:
            # Computed from the options, not from a run: no log line, nothing "reached".
            d["line"] = None
            d.pop("reached")
        ranks = range(t.world_size) if args.rank is None else [args.rank]
        d["ranks"] = [{"rank": r, "ids": ids} for r, ids in zip(ranks, t.ranks)]
        for key in ("masked", "sources"):
            if getattr(t, key) is not None:
                for entry, v in zip(d["ranks"], getattr(t, key)):
                    entry[key] = v
                d.pop(key, None)
        for entry in d["ranks"]:
            if args.provenance:
                entry["provenance"] = ctx.origin(entry["ids"], entry.get("sources"))
            if args.show:
                # A takedown's bytes stay unread unless asked for (--show-denied).
                entry["records"] = ctx.records(
                    entry["ids"], entry.get("sources"),
                    hide=None if args.show_denied else entry.get("masked"))
        out.append(d)
    if args.json:
        emit({"dataset_id": ctx.dataset_id, "steps": out})
        return 0
    for d in out:
        where = "no log" if not logged else f"log line {d['line']}" + (
            "" if d["reached"] else
            ", if the run got that far" if args.end_step is None else
            f", not reached: the run stopped at step {args.end_step}")
        print(f"step {d['step']} (cursor {d['cursor']}, W={d['world_size']}, "
              f"B={d['global_batch']}, {where}):")
        for entry in d["ranks"]:
            shown = (entry["ids"] if "sources" not in entry else
                     [f"{src}:{i}" for src, i in zip(entry["sources"], entry["ids"])])
            print(f"  rank {entry['rank']}: {shown}")
            if "masked" in entry and any(entry["masked"]):
                print(f"    masked: {[i for i, m in zip(entry['ids'], entry['masked']) if m]}")
            for i, prov in enumerate(entry.get("provenance", [])):
                print(f"    [{entry['ids'][i]}] {prov['input']} record {prov['record']}")
            for i, rec in enumerate(entry.get("records", [])):
                print(f"    [{entry['ids'][i]}] " + (
                    dumps(rec) if rec is not None else
                    "denied (its deny list masked it; --show-denied prints it)"))
    return 0


def cmd_where(args) -> int:
    from ..load.audit import where

    ctx = _Context(args)
    wanted = _parse_seqs(ctx, args.seqs)
    if ctx.segments is not None:
        order = ctx.order_for(ctx.segments[0])
    else:
        order = ctx.order(ctx.options_from_args())
    t0 = time.perf_counter()
    found = []
    with _answers(args.log):
        for source, ids in wanted:
            found += where(order, ids, range(args.epochs), segments=ctx.segments,
                           order_for=ctx.order_for if ctx.segments else None,
                           end_step=args.end_step, source=source)
    elapsed = time.perf_counter() - t0
    if args.json:
        emit({"dataset_id": ctx.dataset_id, "num_samples": ctx.num_samples, "where": found,
              "seconds": elapsed})
        return 0
    for rec in found:
        if "source" in rec:
            line = (f"{rec['source']}:{rec['id']} source epoch {rec['epoch']}: position "
                    f"{rec['position']} in the source (its stream position "
                    f"{rec['source_position']}), mixture position {rec['global_position']}")
        else:
            line = (f"id {rec['id']} epoch {rec['epoch']}: position {rec['position']} "
                    f"(global {rec['global_position']})")
        for hit in rec.get("consumed", []):
            line += (f"; step {hit['step']} rank {hit['rank']} (log line {hit['line']}"
                     + ("" if hit["reached"] else ", if the run got that far") + ")")
        if "consumed" in rec and not rec["consumed"]:
            line += "; not consumed by the logged steps"
        print(line)
    return 0


def _parse_seqs(ctx, seqs: list[str]) -> list[tuple[int | None, list[int]]]:
    """``[(source or None, ids)]`` from the command line, ids checked in range."""
    groups: dict = {}
    for text in seqs:
        source, _, sid = text.rpartition(":")
        if (ctx.mix is not None) != bool(source):
            raise UsageError(f"{text!r}: " + ("a mixture's samples are SOURCE:ID" if ctx.mix
                                               is not None else "a sample id is an integer"))
        try:
            i = int(sid)
        except ValueError:
            raise UsageError(f"{text!r} is not a sample id") from None
        k = ctx.source_index(source) if source else None
        n = ctx.manifest.num_samples if k is None else ctx.mix.sources[k].num_samples
        if not 0 <= i < n:
            raise UsageError(f"sample id {i} is outside [0, {n})"
                             + ("" if k is None else f" of source {source!r}"))
        groups.setdefault(k, []).append(i)
    return list(groups.items())


def _deny_lists(ctx, end_step: int) -> list[dict]:
    """Per segment, the deny list it honoured: identity, count and path as logged, and the
    copy beside the log that trace and audit read (None: a log from before copies)."""
    import os

    from ..load.denylist import logged_copy_path
    from ..load.runlog import segment_steps

    out = []
    for seg, a, b in segment_steps(ctx.segments, end_step):
        entry = seg.deny_list or {}
        copy = entry and logged_copy_path(ctx.args.log, entry["id"])
        out.append({"line": seg.line, "first_step": a, "end_step": b,
                    "id": entry.get("id"), "count": int(entry.get("count", 0)),
                    "path": entry.get("path"),
                    "copy": copy if copy and os.path.isfile(copy) else None})
    return out


def _step_span(d: dict) -> str:
    a, b = d["first_step"], d["end_step"]
    return f"steps {a}-{b - 1}" if b > a else f"from step {a}, not audited"


def cmd_audit(args) -> int:
    from ..load.audit import audit_run

    ctx = _Context(args)
    t0 = time.perf_counter()
    with _answers(args.log):
        report = audit_run(ctx.segments, ctx.order_for, end_step=args.end_step,
                           dataset_id=None if ctx.mix is not None else ctx.dataset_id,
                           deny_for=ctx.deny_for)
    elapsed = time.perf_counter() - t0
    out = report.to_dict()
    out["deny_lists"] = _deny_lists(ctx, report.end_step)
    out["seconds"] = elapsed
    out["positions_per_second"] = report.positions / elapsed if elapsed > 0 else None
    if args.json:
        emit(out)
    else:
        print(f"run log {args.log}: {report.segments} segment(s), steps "
              f"[{report.first_step}, {report.end_step}), {report.positions} positions "
              f"recomputed in {elapsed:.2f} s")
        for e in report.epochs:
            kind = "complete" if e.complete else "partial"
            src = "" if e.source is None else f"source {e.source} "
            print(f"  {src}epoch {e.epoch} ({kind}, {e.expected} expected): once {e.once}, "
                  f"repeated {e.repeated}, skipped {e.skipped}, unexpected {e.unexpected}"
                  + (f", masked {e.masked}" if e.masked else "")
                  + ("" if e.ok else "  <- NOT exactly once"))
        if any(d["id"] for d in out["deny_lists"]):
            for d in out["deny_lists"]:
                print(f"  line {d['line']} ({_step_span(d)}): " + (
                    f"deny list {d['id']} ({d['count']} ids, {d['path'] or 'no path'})"
                    if d["id"] else "no deny list"))
        for ev in report.events:
            mark = "DISCREPANCY" if ev.failure else "note"
            print(f"  {mark} at step {ev.step} (log line {ev.line}): {ev.kind}: {ev.detail}")
        for note in report.notes:
            print(f"  note: {note}")
        print("OK: every sample exactly once per epoch" if report.ok
              else "FAIL: the run is not exactly-once", file=sys.stdout)
    return 0 if report.ok else 1
