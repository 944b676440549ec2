"""``zephon trace``, ``zephon where``, ``zephon audit``: questions a run log answers exactly.

Pure computation over the manifest and the run log (:mod:`zephon_store.load.runlog`): no
shard byte is read, except by ``trace --show`` (the records themselves). Without a log,
``trace`` and ``where`` take the order options as ``zephon plan`` does, plus
``--global-batch``, ``--world-size`` and ``--cursor`` for ``trace``; a mixture file's seed
and stages come from the file, by the loader's own rule (:mod:`zephon_store.load.order_inputs`).
Which order and deny list each log segment used is the library's answer
(:class:`zephon_store.runs.accounting.RunContext`); this module parses and prints.
See docs/audit.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from .common import (
    UsageError,
    add_storage_options,
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
    t.add_argument("--documents", action="store_true",
                   help="add each window's documents (input, record, offset, length) from the "
                        "dataset's document table (packed data, format v6)")
    _common_args(t, order=True)

    w = sub.add_parser("where", help="when each sample id is read: its position per epoch, "
                       "and with a run log the step and rank that consumed it")
    w.add_argument("dataset", metavar="DATASET")
    w.add_argument("seqs", nargs="*", metavar="SEQ",
                   help="sample ids; for a mixture SOURCE:ID (a source name or index)")
    w.add_argument("--document", action="append", default=[], metavar="INPUT:RECORD",
                   help="a document of a packed dataset (its input as 'zephon info' lists it, "
                        "its 0-based record; or xxh3:<hash of its text>): every step, rank "
                        "and window that read a piece of it; repeatable")
    w.add_argument("--xxh3", action="append", default=[], metavar="HASH",
                   help="a document by the xxh3-128 of its text (as --document xxh3:HASH)")
    w.add_argument("--source", default=None, metavar="NAME",
                   help="with --document on a mixture: the source the document is in")
    w.add_argument("--checkpoint-every", type=positive_int, default=None, metavar="I",
                   help="with --document: checkpoints every I steps; names the last one "
                        "that never trained on the document")
    w.add_argument("--epochs", type=positive_int, default=1, metavar="E",
                   help="epochs 0..E-1 (default 1)")
    w.add_argument("--log", default=None, metavar="RUNLOG")
    w.add_argument("--world-size", type=positive_int, default=1, metavar="W",
                   help="with --document, without --log: the planned run's ranks (default 1)")
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
    summary = {"--summary": "the consumption report (Markdown; JSON with --json): samples, "
                              "tokens, documents and epochs per group, from the audit's count",
               "--by": "with --summary: group by source, input and/or columns the conversion "
                       "kept (url: by domain); default source,input"}
    a.add_argument("--summary", action="store_true", help=summary["--summary"])
    a.add_argument("--by", type=_columns, default=None, metavar="DIM,...", help=summary["--by"])
    _common_args(a, order=False)


def _end_step_arg(p, help_text: str) -> None:
    p.add_argument("--end-step", type=non_negative_int, default=None, metavar="S", help=help_text)


def _common_args(p, *, order: bool) -> None:
    p.add_argument("--json", action="store_true")
    p.add_argument("--global-batch", type=positive_int, default=None, metavar="B",
                   help="samples per step: without --log, places a mixture's stage starts "
                        "in steps (and trace's steps); with --log the log's is used, and "
                        "another is refused")
    p.add_argument("--columns", type=_columns, default=None, metavar="A,B",
                   help="the columns a shown record holds (trace --show); each source of a "
                        "mixture gives those it has (default: all of its own)")
    if order:
        _order_args(p)
    add_storage_options(p)


def _columns(text: str) -> list[str]:
    """``--columns a,b``: the names, in order, none empty."""
    names = [c.strip() for c in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of columns")
    return names


@contextlib.contextmanager
def _answers(log: str | None):
    """Library refusals as the CLI reports them: a question too large or outside the run
    is a usage error (exit 2); a run log error names the file."""
    from ..errors import MixtureError
    from ..load.runlog import RunLogError
    from ..runs.audit import AuditRequestError

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


def _context(args):
    """The run's :class:`~zephon_store.runs.accounting.RunContext` from the arguments."""
    from ..runs.accounting import RunContext

    with _answers(None):
        return RunContext(args.dataset, getattr(args, "log", None),
                          global_batch=getattr(args, "global_batch", None),
                          seed=getattr(args, "seed", None),
                          shuffle=False if getattr(args, "no_shuffle", False) else None,
                          window_blocks=getattr(args, "window_blocks", None),
                          lanes=getattr(args, "lanes", None),
                          storage_options=args.storage_options, columns=args.columns)


def cmd_trace(args) -> int:
    from ..runs.document_reads import trace_documents

    if (args.step is None) == (args.steps is None):
        raise UsageError("pass --step S or --steps A:B")
    ctx = _context(args)
    # A range, taken lazily: trace refuses more ids than one answer holds.
    steps = [args.step] if args.step is not None else range(*args.steps)
    logged = ctx.segments is not None
    if not logged:
        if args.global_batch is None:
            raise UsageError("without --log, pass --global-batch B (and --world-size, --cursor "
                             "and the order options as for zephon plan)")
        if args.end_step is not None:
            raise UsageError("--end-step needs --log (the step the logged run reached)")
        with _answers(None):
            planned = [ctx.planned_segment(global_batch=args.global_batch,
                                           world_size=args.world_size, cursor=args.cursor)]
    with _answers(args.log):
        traced = ctx.trace(steps, rank=args.rank, end_step=args.end_step,
                           segments=None if logged else planned)
    out = []
    for t in traced:
        d = t.to_dict()
        if not logged:
            # Computed from the options, not from a run: no log line, nothing "reached".
            d["line"] = None
            d.pop("reached")
        ranks = range(t.world_size or 1) if args.rank is None else [args.rank]
        # A live step's parts are its participants' (None: its line does not record them).
        key = "participant" if t.live else "rank"
        d["ranks"] = [{key: None if t.world_size is None else r, "ids": ids}
                      for r, ids in zip(ranks, t.ranks)]
        for key in ("masked", "sources"):
            if getattr(t, key) is not None:
                for entry, v in zip(d["ranks"], getattr(t, key)):
                    entry[key] = v
                d.pop(key, None)
        for entry in d["ranks"]:
            if args.provenance:
                entry["provenance"] = ctx.origin(entry["ids"], entry.get("sources"))
            if args.documents:
                with _answers(args.log):
                    entry["documents"] = trace_documents(ctx, entry["ids"], entry.get("sources"))
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
        print(f"step {d['step']} (cursor {d['cursor']}, {_readers(d)}, "
              f"B={d['global_batch']}, {where}):")
        for entry in d["ranks"]:
            # A mixture's sample is `web:42`: a bare id is ambiguous across its sources.
            shown = ([str(i) for i in entry["ids"]] if "sources" not in entry else
                     [f"{src}:{i}" for src, i in zip(entry["sources"], entry["ids"])])
            print(f"  {_reader(entry)}: [{', '.join(shown)}]")
            if "masked" in entry and any(entry["masked"]):
                print(f"    masked: [{', '.join(s for s, m in zip(shown, entry['masked']) if m)}]")
            for i, prov in enumerate(entry.get("provenance", [])):
                print(f"    [{shown[i]}] {prov['input']} record {prov['record']}")
            for i, pieces in enumerate(entry.get("documents", [])):
                print(f"    [{shown[i]}] " + ", ".join(
                    f"{p['input']}:{p['record']} [{p['offset']}, {p['offset'] + p['length']})"
                    for p in pieces))
            for i, rec in enumerate(entry.get("records", [])):
                print(f"    [{shown[i]}] " + (
                    dumps(rec) if rec is not None else
                    "denied (its deny list masked it; --show-denied prints it)"))
    return 0


def cmd_where(args) -> int:
    ctx = _context(args)
    refs = args.document + [f"xxh3:{h.removeprefix('xxh3:')}" for h in args.xxh3]
    if refs and args.seqs:
        raise UsageError("pass sample ids or --document/--xxh3, not both")
    if not refs and not args.seqs:
        raise UsageError("pass sample ids (SEQ...) or --document INPUT:RECORD")
    if refs:
        return _where_documents(ctx, args, refs)
    wanted = _parse_seqs(ctx, args.seqs)
    with _answers(None):
        ctx.base_order()   # built (and refused) before the clock starts
    t0 = time.perf_counter()
    found = []
    with _answers(args.log):
        for source, ids in wanted:
            found += ctx.where(ids, range(args.epochs), source=source,
                               end_step=args.end_step)
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
            line += (f"; step {hit['step']} {_reader(hit)} (log line {hit['line']}"
                     + ("" if hit["reached"] else ", if the run got that far") + ")")
        if "consumed" in rec and not rec["consumed"]:
            line += "; not consumed by the logged steps"
        print(line)
    return 0


def _where_documents(ctx, args, refs: list[str]) -> int:
    """``zephon where --document``: every read of each document (runs/document_reads.py)."""
    from ..runs.document_reads import where_documents

    segments = None
    if ctx.segments is None and args.global_batch is not None:
        with _answers(None):
            segments = [ctx.planned_segment(global_batch=args.global_batch,
                                            world_size=args.world_size)]
    with _answers(args.log):
        source = ctx.source_index(args.source) if args.source is not None else None
        found = where_documents(ctx, refs, source=source, epochs=range(args.epochs),
                                end_step=args.end_step, segments=segments,
                                checkpoint_every=args.checkpoint_every)
    if args.json:
        emit({"dataset_id": ctx.dataset_id, "documents": found})
        return 0
    for d in found:
        print(f"document {d['input']}:{d['record']} (xxh3:{d['xxh3']}, {d['num_tokens']} "
              f"tokens, {len(d['spans'])} span(s) in windows "
              f"{_ranges(sorted({s['window'] for s in d['spans']}))})")
        for r in d["reads"]:
            how = ("planned" if segments else f"log line {r['line']}"
                   + ("" if r["reached"] else ", if the run got that far"))
            print(f"  step {r['step']} {_reader(r)}: window {r['window']} (epoch {r['epoch']}, "
                  f"position {r['position']}, {how})"
                  + (", masked: its tokens never reached the model" if r["masked"] else ""))
        if ctx.segments is None and not segments:
            print("  positions (pass --log, or --global-batch for a planned run, for steps): "
                  + ", ".join(f"window {p['window']} epoch {p['epoch']} at {p['position']}"
                              for p in d["positions"]))
            continue
        clean = d["clean_checkpoint"]
        if clean is None:
            print("  never trained on: no checkpoint of these steps included it")
            continue
        print(f"  first trained on at step {d['first_step']}: a checkpoint saved after at most "
              f"{clean['max_step']} steps never included it"
              + (f"; with one every {clean['every']} steps, the last such is step "
                 f"{clean['step']}" if "step" in clean else ""))
    return 0


def _ranges(values: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9``."""
    out, start = [], None
    for j, v in enumerate(values):
        if start is None:
            start = v
        if j + 1 == len(values) or values[j + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def _readers(step: dict) -> str:
    """How a traced step was split: ``W=4``, or a live step's participants."""
    if not step.get("live"):
        return f"W={step['world_size']}"
    n = step["world_size"]
    return "live, participants not recorded" if n is None else f"live, {n} participants"


def _reader(entry: dict) -> str:
    """Who read a part of a step: ``rank 2``, or a live step's ``participant 2`` (the whole
    step when its log line does not record the participants)."""
    if "rank" in entry:
        return f"rank {entry['rank']}"
    if entry["participant"] is None:
        return "participants not recorded"
    return f"participant {entry['participant']}"


def _parse_seqs(ctx, seqs: list[str]) -> list[tuple[int | None, list[int]]]:
    """``[(source or None, ids)]`` from the command line, ids checked in range."""
    groups: dict = {}
    for text in seqs:
        source, _, sid = text.rpartition(":")
        named = ctx.source_names is not None
        if named != bool(source):
            raise UsageError(f"{text!r}: " + ("a mixture's samples are SOURCE:ID" if named
                                               else "a sample id is an integer"))
        try:
            i = int(sid)
        except ValueError:
            raise UsageError(f"{text!r} is not a sample id") from None
        with _answers(None):
            k = ctx.source_index(source) if source else None
        n = ctx.part(k).num_samples
        if not 0 <= i < n:
            raise UsageError(f"sample id {i} is outside [0, {n})"
                             + ("" if k is None else f" of source {source!r}"))
        groups.setdefault(k, []).append(i)
    return list(groups.items())


def _step_span(d: dict) -> str:
    a, b = d["first_step"], d["end_step"]
    return f"steps {a}-{b - 1}" if b > a else f"from step {a}, not audited"


def cmd_audit(args) -> int:
    if args.by is not None and not args.summary:
        raise UsageError("--by groups the consumption report: pass --summary with it")
    ctx = _context(args)
    if args.summary:
        return _summary(ctx, args)
    from ..runs.consumption import audit_with_documents

    t0 = time.perf_counter()
    with _answers(args.log):
        report, documents = audit_with_documents(ctx, end_step=args.end_step)
    elapsed = time.perf_counter() - t0
    out = report.to_dict()
    out["deny_lists"] = ctx.deny_lists(report.end_step)
    out["documents"] = documents
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
                  + (f", document tokens masked {e.masked_tokens}" if e.masked_tokens else "")
                  + ("" if e.ok else "  <- NOT exactly once"))
        if any(d["id"] for d in out["deny_lists"]):
            for d in out["deny_lists"]:
                print(f"  line {d['line']} ({_step_span(d)}): " + (
                    f"deny list {d['id']} ({d['count']} ids, "
                    + (f"{d['documents']} documents, " if d["documents"] else "")
                    + f"{d['path'] or 'no path'})" if d["id"] else "no deny list"))
        for d in documents:
            print(f"  documents of {d['source']}: read whole {d['documents_whole']}, in part "
                  f"{d['documents_part']}, not read {d['documents_unseen']}")
        for ev in report.events:
            mark = "DISCREPANCY" if ev.failure else "note"
            print(f"  {mark} at step {ev.step} (log line {ev.line}): {ev.kind}: {ev.detail}")
        for note in report.notes:
            print(f"  note: {note}")
        print("OK: every sample exactly once per epoch" if report.ok
              else "FAIL: the run is not exactly-once", file=sys.stdout)
    return 0 if report.ok else 1


def _summary(ctx, args) -> int:
    """``zephon audit --summary``: the consumption report (runs/consumption.py)."""
    from ..runs.consumption import consumption

    with _answers(args.log):
        report = consumption(ctx, end_step=args.end_step,
                             by=tuple(args.by or ("source", "input")))
    if args.json:
        emit(report.to_dict())
    else:
        sys.stdout.write(report.to_markdown())
    return 0 if report.audit.ok else 1
