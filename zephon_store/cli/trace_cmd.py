"""``zephon trace``, ``zephon where``, ``zephon audit``: questions a run log answers exactly.

Pure computation over the manifest and the run log (:mod:`zephon_store.load.runlog`): no
shard byte is read, except by ``trace --show`` (the records themselves). Without a log,
``trace`` and ``where`` take the order options as ``zephon plan`` does, plus
``--global-batch``, ``--world-size`` and ``--cursor`` for ``trace``.
See docs/audit.md.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .common import UsageError, add_storage_options, build_options, dumps, emit, positive_int
from .plan_cmd import _steps


def _order_args(p) -> None:
    g = p.add_argument_group("order (without --log)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-shuffle", action="store_true", help="sequential order")
    g.add_argument("--window-blocks", type=int, default=None, metavar="K")
    g.add_argument("--lanes", type=int, default=None, metavar="P")


def add_trace_parsers(sub) -> None:
    """Register ``trace``, ``where`` and ``audit``."""
    t = sub.add_parser("trace", help="the sample ids each rank consumed at given steps")
    t.add_argument("dataset", metavar="DATASET")
    t.add_argument("--log", default=None, metavar="RUNLOG", help="the run log (JSONL)")
    t.add_argument("--step", type=int, default=None, metavar="S")
    t.add_argument("--steps", type=_steps, default=None, metavar="A:B")
    t.add_argument("--rank", type=int, default=None, metavar="R")
    t.add_argument("--world-size", type=positive_int, default=1, metavar="W",
                   help="without --log (default 1)")
    t.add_argument("--global-batch", type=positive_int, default=None, metavar="B",
                   help="without --log: samples per step")
    t.add_argument("--cursor", type=int, default=0, metavar="C",
                   help="without --log: the cursor before step 0 (default 0)")
    t.add_argument("--provenance", action="store_true",
                   help="add each sample's input file and record index (from conversion)")
    t.add_argument("--show", action="store_true", help="print the records themselves")
    _common_args(t, order=True)

    w = sub.add_parser("where", help="when each sample id is read: its position per epoch, "
                       "and with a run log the step and rank that consumed it")
    w.add_argument("dataset", metavar="DATASET")
    w.add_argument("seqs", nargs="+", type=int, metavar="SEQ")
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
    p.add_argument("--end-step", type=int, default=None, metavar="S", help=help_text)


def _common_args(p, *, order: bool) -> None:
    p.add_argument("--json", action="store_true")
    if order:
        _order_args(p)
    add_storage_options(p)


class _Context:
    """The manifest, the orders per options, deny lists and provenance, loaded once."""

    def __init__(self, args) -> None:
        from ..format.manifest import load_manifest
        from ..io.storage import Storage

        self.args = args
        self.manifest = load_manifest(Storage(args.dataset,
                                              storage_options=args.storage_options))
        self._orders: dict = {}
        self._deny: dict = {}
        self.segments = None
        if getattr(args, "log", None):
            from ..load.runlog import read_run_log

            self.segments = read_run_log(args.log, dataset_id=self.manifest.dataset_id)

    def order(self, options):
        from ..order.order import Order

        got = self._orders.get(options)
        if got is None:
            got = self._orders[options] = Order(self.manifest.rg_rows, options)
        return got

    def order_for(self, seg):
        if seg.mixture is not None:
            raise UsageError(f"line {seg.line} of {self.args.log} is a mixture's segment; "
                             "trace/where/audit of mixtures is not supported yet")
        return self.order(seg.order)

    def deny_for(self, seg):
        from ..load.denylist import load_deny_list
        from ..load.runlog import RunLogError

        entry = seg.deny_list
        if not entry:
            return None
        got = self._deny.get(entry["id"])
        if got is None:
            path = entry.get("path") or ""
            try:
                got = load_deny_list(path, self.manifest)
            except OSError as exc:
                raise RunLogError(f"{self.args.log} line {seg.line}: cannot read its deny list "
                                  f"{path!r} ({exc}); restore that file") from exc
            if got.identity != entry["id"]:
                raise RunLogError(f"{self.args.log} line {seg.line}: deny list {path} now has "
                                  f"identity {got.identity}, the run used {entry['id']}; "
                                  "restore the file the run read")
            self._deny[entry["id"]] = got
        return got

    def options_from_args(self):
        from ..order.order import OrderOptions

        kw = {"seed": self.args.seed, "shuffle": not self.args.no_shuffle}
        if self.args.window_blocks is not None:
            kw["window_blocks"] = self.args.window_blocks
        if self.args.lanes is not None:
            kw["lanes"] = self.args.lanes
        return build_options(OrderOptions, **kw)

    def provenance(self):
        """``(starts, names, row starts)`` of the provenance pieces, sorted by sample."""
        table = self.manifest.tables["provenance"]
        starts = table.column("row_start").to_numpy()
        rows = table.column("num_rows").to_numpy()
        keep = rows > 0
        order = np.argsort(starts[keep], kind="stable")
        names = np.array(table.column("input").to_pylist(), dtype=object)[keep][order]
        return (starts[keep][order], names,
                table.column("input_row_start").to_numpy()[keep][order])

    def origin(self, ids: list[int]) -> list[dict]:
        starts, names, input_rows = self.provenance()
        at = np.searchsorted(starts, np.asarray(ids, dtype=np.int64), side="right") - 1
        return [{"input": str(names[k]), "record": int(input_rows[k] + i - starts[k])}
                for k, i in zip(at.tolist(), ids)]


def cmd_trace(args) -> int:
    from ..load.audit import trace
    from ..load.runlog import RunSegment

    ctx = _Context(args)
    if (args.step is None) == (args.steps is None):
        raise UsageError("pass --step S or --steps A:B")
    steps = [args.step] if args.step is not None else list(range(*args.steps))
    if ctx.segments is None:
        if args.global_batch is None:
            raise UsageError("without --log, pass --global-batch B (and --world-size, --cursor "
                             "and the order options as for zephon plan)")
        if args.cursor < 0:
            raise UsageError(f"--cursor must be >= 0, got {args.cursor}")
        seg = build_options(RunSegment, first_step=0, cursor=args.cursor,
                            global_batch=args.global_batch, world_size=args.world_size,
                            num_workers=0, dataset_id=ctx.manifest.dataset_id,
                            order=ctx.options_from_args())
        ctx.segments = [seg]
    traced = trace(ctx.segments, ctx.order_for, steps, rank=args.rank, deny_for=ctx.deny_for)
    records = None
    if args.show:
        from ..read.dataset import open_dataset

        with open_dataset(args.dataset, storage_options=args.storage_options) as ds:
            all_ids = sorted({i for t in traced for r in t.ranks for i in r})
            rows = dict(zip(all_ids, ds.take(all_ids).to_pylist())) if all_ids else {}
        records = rows
    out = []
    for t in traced:
        d = t.to_dict()
        ranks = range(t.world_size) if args.rank is None else [args.rank]
        d["ranks"] = [{"rank": r, "ids": ids} for r, ids in zip(ranks, t.ranks)]
        if t.masked is not None:
            for entry, m in zip(d["ranks"], t.masked):
                entry["masked"] = m
            d.pop("masked", None)
        if args.provenance:
            for entry in d["ranks"]:
                entry["provenance"] = ctx.origin(entry["ids"])
        if records is not None:
            for entry in d["ranks"]:
                entry["records"] = [records[i] for i in entry["ids"]]
        out.append(d)
    if args.json:
        emit({"dataset_id": ctx.manifest.dataset_id, "steps": out})
        return 0
    for d in out:
        print(f"step {d['step']} (cursor {d['cursor']}, W={d['world_size']}, "
              f"B={d['global_batch']}, log line {d['line']}):")
        for entry in d["ranks"]:
            print(f"  rank {entry['rank']}: {entry['ids']}")
            if "masked" in entry and any(entry["masked"]):
                print(f"    masked: {[i for i, m in zip(entry['ids'], entry['masked']) if m]}")
            for i, prov in enumerate(entry.get("provenance", [])):
                print(f"    [{entry['ids'][i]}] {prov['input']} record {prov['record']}")
            for i, rec in enumerate(entry.get("records", [])):
                print(f"    [{entry['ids'][i]}] {dumps(rec)}")
    return 0


def cmd_where(args) -> int:
    from ..load.audit import where

    ctx = _Context(args)
    n = ctx.manifest.num_samples
    bad = [s for s in args.seqs if not 0 <= s < n]
    if bad:
        raise UsageError(f"sample id {bad[0]} is outside the dataset's [0, {n})")
    if ctx.segments is not None:
        order = ctx.order_for(ctx.segments[0])
    else:
        order = ctx.order(ctx.options_from_args())
    t0 = time.perf_counter()
    found = where(order, args.seqs, range(args.epochs), segments=ctx.segments,
                  order_for=ctx.order_for if ctx.segments else None, end_step=args.end_step)
    elapsed = time.perf_counter() - t0
    if args.json:
        emit({"dataset_id": ctx.manifest.dataset_id, "num_samples": n, "where": found,
              "seconds": elapsed})
        return 0
    for rec in found:
        line = (f"id {rec['id']} epoch {rec['epoch']}: position {rec['position']} "
                f"(global {rec['global_position']})")
        for hit in rec.get("consumed", []):
            line += (f"; step {hit['step']} rank {hit['rank']} (log line {hit['line']}"
                     + ("" if hit["reached"] else ", if the run got that far") + ")")
        if "consumed" in rec and not rec["consumed"]:
            line += "; not consumed by the logged steps"
        print(line)
    return 0


def cmd_audit(args) -> int:
    from ..load.audit import audit_run

    ctx = _Context(args)
    t0 = time.perf_counter()
    report = audit_run(ctx.segments, ctx.order_for, end_step=args.end_step,
                       dataset_id=ctx.manifest.dataset_id, deny_for=ctx.deny_for)
    elapsed = time.perf_counter() - t0
    out = report.to_dict()
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
            print(f"  epoch {e.epoch} ({kind}, {e.expected} expected): once {e.once}, "
                  f"repeated {e.repeated}, skipped {e.skipped}, unexpected {e.unexpected}"
                  + (f", masked {e.masked}" if e.masked else "")
                  + ("" if e.ok else "  <- NOT exactly once"))
        for ev in report.events:
            mark = "DISCREPANCY" if ev.failure else "note"
            print(f"  {mark} at step {ev.step} (log line {ev.line}): {ev.kind}: {ev.detail}")
        for note in report.notes:
            print(f"  note: {note}")
        print("OK: every sample exactly once per epoch" if report.ok
              else "FAIL: the run is not exactly-once", file=sys.stdout)
    return 0 if report.ok else 1
