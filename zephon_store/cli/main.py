"""``zephon``: convert, verify, info, get, plan, cache, gc.

Exit codes: 0 ok, 1 findings (verify) or a runtime error, 2 usage error, 141 stdout closed
(``| head``).

>>> main(["info", tiny_dataset, "--json"])
{"url": "...", "dataset_id": "xxh3:...", "format_version": 6, "num_samples": 100, ...}
0
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import (
    DenyListError,
    RayAddressError,
    SeqOutOfRangeError,
    StorageOptionsError,
    ZephonError,
)
from .common import (
    UsageError,
    add_storage_options,
    build_options,
    dumps,
    emit,
    parse_row_group_size,
    positive_int,
    size_arg,
)


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line, ``zephon <cmd>: error: <what>``, exit 2
    (docs/cli.md): a 17-line usage block above a bad value buries the line that matters.
    The commands' parsers are this class too (``add_subparsers`` builds its own kind)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def error_with_usage(self, message: str):
        """An unknown flag: the usage lists the flags the command does take."""
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="zephon", description="Content-hashed Parquet shards and an "
                "elastically deterministic loader.")
    from .. import __version__

    p.add_argument("--version", action="version", version=f"zephon_store {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_convert_parser(sub)

    v = sub.add_parser("verify", help="check a dataset's integrity (read-only)")
    v.add_argument("url")
    v.add_argument("--deep", action="store_true", help="also decode every row group")
    v.add_argument("--workers", type=positive_int, default=4)
    v.add_argument("--json", action="store_true")
    add_storage_options(v)

    i = sub.add_parser("info", help="describe a dataset, or a mixture file (.toml/.json)")
    i.add_argument("url")
    i.add_argument("--global-batch", type=positive_int, default=None, metavar="B",
                   help="a mixture: convert stage starts in steps to samples")
    i.add_argument("--json", action="store_true")
    add_storage_options(i)

    g = sub.add_parser("get", help="print the records at global sequence numbers")
    g.add_argument("url")
    g.add_argument("seqs", nargs="+", metavar="SEQ")
    g.add_argument("--json", action="store_true", help="one JSON object per line")
    add_storage_options(g)

    from .cache_cmd import add_cache_parser
    from .gc_cmd import add_gc_parser
    from .plan_cmd import add_plan_parser

    add_plan_parser(sub)
    from .trace_cmd import add_trace_parsers

    add_trace_parsers(sub)
    add_cache_parser(sub)
    add_gc_parser(sub)
    return p


def _add_convert_parser(sub) -> None:
    """``zephon convert``: its arguments (docs/cli.md)."""
    c = sub.add_parser("convert", help="convert raw inputs into a dataset")
    c.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="files, globs, directories or URLs (JSONL[.gz|.zst|.bz2|.xz], Parquet, "
                        "text, CSV)")
    c.add_argument("--output", "-o", required=True, metavar="URL", help="dataset root to write")
    c.add_argument("--target-shard-size", type=size_arg, default="128MiB", metavar="SIZE",
                   help="close a shard at this many bytes, measured before compression "
                        "(default 128MiB)")
    c.add_argument("--row-group-size", type=parse_row_group_size, default="1MiB", metavar="SIZE",
                   help="bytes (e.g. 1MiB, before compression) or rows (e.g. 4096rows) per row "
                        "group (default 1MiB)")
    c.add_argument("--compression", default="auto", choices=["auto", "zstd", "lz4", "snappy", "gzip", "brotli", "none"],
                   help="auto (default): per column, zstd level 6 for text, LZ4 where it packs "
                        "within 10%% of zstd level 1 (token windows), else zstd level 1, or "
                        "none where a sample barely compresses (formats/SPEC.md, "
                        "'Compression'); a codec name "
                        "applies to every column (lz4 is Parquet's LZ4_RAW)")
    c.add_argument("--compression-level", type=int, default=None,
                   help="zstd/gzip/brotli level with a named codec (default 3)")
    c.add_argument("--dictionary", choices=["auto", "on", "off"], default="auto",
                   help="dictionary encoding: auto (default: not for top-level text whose "
                        "values are mostly distinct, e.g. documents), on or off for every column")
    c.add_argument("--fixed-size-lists", choices=["split", "binary", "list"], default="split",
                   help="store fixed-size lists of numbers as fixed-size binary, each value's "
                        "bytes in byte planes (default: smaller under a codec), or back "
                        "to back (binary: the format v2-v4 layout, decoded without a copy), or "
                        "as Parquet lists (can hold null elements)")
    c.add_argument("--workers", type=positive_int, default=None,
                   help="conversion processes (local engine, default 1) or Ray tasks at once "
                        "(default: the Ray cluster's CPUs)")
    c.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="where the parse and write tasks run: processes of this host (default) "
                        "or a Ray cluster (pip install 'zephon_store[ray]'); the output is the "
                        "same byte for byte")
    c.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="--engine ray: the cluster to join (e.g. 127.0.0.1:6379 or auto); "
                        "default: start a local Ray instance")
    c.add_argument("--format", choices=["jsonl", "parquet", "text", "csv", "arrow"], default=None,
                   help="input format (default: from each file name)")
    c.add_argument("--text-mode", choices=["file", "line"], default="file",
                   help="plain text: one sample per file or per line")
    c.add_argument("--on-error", choices=["raise", "skip"], default="raise",
                   help="bad records: stop with an error naming file and line, or skip and count")
    c.add_argument("--encoding", default="utf-8",
                   help="text encoding of JSONL, text and CSV inputs (ASCII-compatible: utf-8, "
                        "latin-1, cp1252, shift_jis, ...; default utf-8)")
    c.add_argument("--csv-delimiter", default=",", metavar="CHAR",
                   help="CSV field delimiter, one character (default ',')")
    c.add_argument("--csv-newlines-in-values", action=argparse.BooleanOptionalAction,
                   default=True,
                   help="CSV: a quoted field may span lines (default); with --no-csv-newlines-"
                        "in-values a newline always ends a record (docs/inputs.md)")
    c.add_argument("--batch-rows", type=positive_int, default=65536, metavar="N",
                   help="records per parsed batch (default 65536; memory, not output, depends "
                        "on it)")
    _add_packing_args(c)
    c.add_argument("--json", action="store_true", help="print a JSON summary, no progress bar")
    c.add_argument("--verbose", "-v", action="store_true",
                   help="print where the time went (each phase's wall time, and the seconds "
                        "of each kind of work summed over the tasks); with --engine ray also "
                        "show Ray's own log lines and the workers' output (default: Ray's "
                        "errors only)")
    c.add_argument("--overwrite", action="store_true",
                   help="replace a different dataset already at --output (what only its "
                        "manifest references is removed after the new one is published)")
    add_storage_options(c)
    c.add_argument("--input-storage-options", type=_json_arg, default=None, metavar="JSON",
                   help="storage options for the inputs (default: --storage-options)")


def _add_packing_args(c) -> None:
    """``zephon convert``'s token-packing options (docs/packing.md)."""
    c.add_argument("--tokenizer", metavar="PATH", default=None,
                   help="pack tokens: a local tokenizer.json (needs --seq-len)")
    c.add_argument("--seq-len", type=int, default=None, metavar="L",
                   help="pack documents into windows of L+1 tokens")
    c.add_argument("--text-column", default="text", help="column holding the document text")
    c.add_argument("--bos", action=argparse.BooleanOptionalAction, default=True,
                   help="packing: put the tokenizer's BOS token before each document")
    c.add_argument("--eos", action=argparse.BooleanOptionalAction, default=True,
                   help="packing: put the tokenizer's EOS token after each document")
    c.add_argument("--packing", choices=["concat", "best-fit"], default=None,
                   help="packing: best-fit (the default: split only documents longer than a "
                        "window, pad the rest) or concat (documents back to back, cut every "
                        "L+1 tokens); docs/packing.md")
    c.add_argument("--buffer-windows", type=positive_int, default=None, metavar="N",
                   help="packing best-fit: windows per buffer (default 4096; memory per "
                        "worker about N*(L+1)*4 bytes)")


def _json_arg(text: str) -> dict:
    from .common import parse_json_object

    return parse_json_object(text)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (tests call this directly)."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            # parse_args would report these with the top-level usage; the command's own
            # usage lists the flags it does take.
            _subparser(parser, args.command).error_with_usage(
                f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    try:
        _refuse_mixture(args)
        return COMMANDS[args.command](args)
    except BrokenPipeError:
        # Before OSError below: a reader that went away (``| head -1``) is no error.
        return _stdout_closed()
    except (UsageError, SeqOutOfRangeError, StorageOptionsError, DenyListError) as exc:
        print(f"zephon {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (ZephonError, OSError, ValueError) as exc:
        print(f"zephon {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"zephon {args.command}: interrupted; rerun the same command to resume",
              file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    """A usage error's message on one line (a library message may wrap a long list)."""
    return " ".join(str(exc).split("\n"))


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command, parser)
    return parser


# The commands that read one dataset, and what to use for a mixture file instead.
_ONE_DATASET = {
    "verify": "verify each source's dataset URL",
    "get": "get records from a source's dataset URL",
    "plan": "zephon plan --mixture {url} --world-size W --global-batch B",
    "cache": "fill the cache from each source's dataset URL",
    "gc": "gc each source's dataset URL",
}


def _refuse_mixture(args) -> None:
    """A mixture file given where one dataset is read: one line saying so (else the reader
    fails on ``<file>/manifest.json`` with NotADirectoryError)."""
    from ..load.source import by_kind

    url = getattr(args, "url", None)
    if args.command not in _ONE_DATASET or url is None:
        return
    if (args.command == "plan" and args.mixture is not None) or (
            args.command == "cache" and args.action != "fill"):
        return
    by_kind(url, dataset=lambda _: None, mixture=lambda _: _mixture_refused(args, url))


def _mixture_refused(args, url: str) -> None:
    command = "cache fill" if args.command == "cache" else args.command
    instead = _ONE_DATASET[args.command].format(url=url)
    raise UsageError(f"{url} is a mixture file, not a dataset, and 'zephon {command}' reads one "
                     f"dataset: {instead}; the commands that read a mixture file are info, "
                     "plan --mixture, trace, where and audit")


#: The exit status of a command whose stdout was closed: a process killed by SIGPIPE shows the
#: shell 128 + 13, so ``set -o pipefail`` scripts see from ``zephon ... | head`` what they see
#: from ``cat ... | head``.
EXIT_PIPE_CLOSED = 141


def _stdout_closed() -> int:
    """Point stdout at /dev/null and return :data:`EXIT_PIPE_CLOSED`.

    A closed pipe is caught as BrokenPipeError rather than by restoring SIGPIPE's default
    action, which would kill the process mid-write and skip every ``finally`` (a convert's
    lock and staging cleanup). What stdout still buffers would fail again at the
    interpreter's flush at exit ("Exception ignored ... BrokenPipeError", status 120), so its
    descriptor is pointed at /dev/null first, as the Python docs advise (signal module,
    "Note on SIGPIPE").
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # no descriptor: a test's captured stdout
        pass
    return EXIT_PIPE_CLOSED


def entry() -> None:
    """Console-script entry point (also ``python -m zephon_store.cli``)."""
    code = main()
    try:
        # Output smaller than the buffer reaches a closed pipe only here.
        sys.stdout.flush()
    except BrokenPipeError:
        code = _stdout_closed()
    sys.exit(code)


def cmd_convert(args) -> int:
    from ..ingest import InputOptions
    from ..write.convert import convert
    from ..write.shardwriter import WriteOptions

    rg_bytes, rg_rows = args.row_group_size
    wopts = build_options(WriteOptions, target_shard_bytes=args.target_shard_size,
                          row_group_bytes=rg_bytes, row_group_rows=rg_rows,
                          compression=args.compression, compression_level=args.compression_level,
                          use_dictionary={"auto": "auto", "on": True,
                                          "off": False}[args.dictionary],
                          fixed_size_lists=args.fixed_size_lists)
    iopts = build_options(InputOptions, format=args.format, text_mode=args.text_mode,
                          on_error=args.on_error, text_column=args.text_column,
                          encoding=args.encoding, csv_delimiter=args.csv_delimiter,
                          csv_newlines_in_values=args.csv_newlines_in_values,
                          batch_rows=args.batch_rows)
    kwargs = {}
    if args.tokenizer or args.seq_len:
        if not (args.tokenizer and args.seq_len):
            raise UsageError("--tokenizer and --seq-len go together")
        from ..write.packing import PackingOptions, packing_convert_kwargs

        kwargs = packing_convert_kwargs(build_options(
            PackingOptions, tokenizer=args.tokenizer, seq_len=args.seq_len,
            text_column=args.text_column, bos=args.bos, eos=args.eos,
            **({"strategy": args.packing} if args.packing else {}),
            **({"buffer_windows": args.buffer_windows} if args.buffer_windows else {})))
    elif args.packing or args.buffer_windows:
        raise UsageError("--packing and --buffer-windows need --tokenizer and --seq-len")
    if args.ray_address is not None and args.engine != "ray":
        raise UsageError("--ray-address needs --engine ray")
    from ..write.engines import make_executor

    try:
        # Before convert writes anything: a wrong --ray-address fails here in seconds.
        executor = make_executor(args.engine, workers=args.workers,
                                 ray_address=args.ray_address, verbose=args.verbose)
    except RayAddressError as exc:
        message = f"--ray-address {exc.address}: {exc.reason}"
        if exc.malformed:
            raise UsageError(message) from None
        print(f"zephon convert: error: {message}", file=sys.stderr)
        return 1
    result = convert(args.inputs, args.output, options=wopts, input_options=iopts,
                     storage_options=args.storage_options,
                     input_storage_options=args.input_storage_options,
                     progress=None if not args.json else False, overwrite=args.overwrite,
                     executor=executor, **kwargs)
    if args.json:
        emit(result.to_dict())
    elif result.unchanged:   # a rerun that found nothing to do
        print(f"nothing to do: the output already holds this conversion of "
              f"{_count(result.input_files, 'unchanged input')} ({result.num_samples} samples in "
              f"{_count(result.num_shards, 'shard')}, intact) at {result.url}")
        print(f"dataset_id {result.dataset_id}")
    else:
        print(f"wrote {result.num_samples} samples in {_count(result.num_shards, 'shard')} "
              f"({result.total_bytes / 1e6:.1f} MB) to {result.url}")
        if result.inputs_reused or result.shards_reused:
            print(f"reused from an earlier run: {_count(result.inputs_reused, 'parsed input')}, "
                  f"{_count(result.shards_reused, 'stored shard')}")
        print(f"dataset_id {result.dataset_id}")
        if any(result.skipped.values()):
            counts = ", ".join(f"{k}={v}" for k, v in result.skipped.items() if v)
            print(f"skipped (--on-error skip): {counts}")
            for example in result.skip_examples:
                print(f"  e.g. {example}")
        if args.verbose:
            print(_convert_times(result))
    return 0


def _convert_times(result) -> str:
    """``convert --verbose``: each phase's wall time, then the seconds of each kind of work
    summed over the tasks (zephon_store.write.stage_times)."""
    def line(seconds: dict) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in seconds.items())

    across = f"{_count(result.workers, 'worker')} ({result.engine})"
    return (f"time {result.seconds:.2f} s: {line(result.stages)}\n"
            f"work, s summed over the tasks of {across}: {line(result.work_seconds)}")


def cmd_verify(args) -> int:
    from ..read.verify import verify

    report = verify(args.url, deep=args.deep, storage_options=args.storage_options,
                    workers=args.workers, progress=False if args.json else None)
    if args.json:
        emit(report.to_dict())
    else:
        for f in report.findings:
            print(f"{f.kind}: {f.message}")
        status = "OK" if report.ok else f"{len(report.findings)} finding(s)"
        print(f"{status}: {report.shards_checked} shards checked, dataset_id {report.dataset_id}")
    return 0 if report.ok else 1


def cmd_info(args) -> int:
    from ..load.source import by_kind
    from .mixture_cmd import cmd_mixture_info

    return by_kind(args.url, dataset=lambda _: _dataset_info(args),
                   mixture=lambda _: cmd_mixture_info(args))


def _dataset_info(args) -> int:
    from ..read.dataset import open_dataset

    with open_dataset(args.url, storage_options=args.storage_options) as ds:
        m = ds.manifest
    info = {
        "url": args.url, "dataset_id": m.dataset_id, "format_version": m.format_version,
        "num_samples": m.num_samples, "num_shards": m.num_shards,
        "num_row_groups": m.num_row_groups, "total_bytes": m.total_bytes,
        "schema": m.schema_fields, "writer": m.writer, "inputs": m.inputs, "skipped": m.skipped,
    }
    if m.packing is not None:
        info["packing"] = m.packing
    codecs = m.codecs   # compression="auto": the codec chosen per column (SPEC 3.2)
    if codecs is not None:
        info["codecs"] = codecs
    if args.json:
        emit(info)
        return 0
    print(f"dataset   {args.url}")
    print(f"id        {m.dataset_id}")
    print(f"format    version {m.format_version}")
    print(f"samples   {m.num_samples}")
    print(f"shards    {_count(m.num_shards, 'shard')} ({_count(m.num_row_groups, 'row group')}, "
          f"{m.total_bytes / 1e6:.1f} MB)")
    print(f"inputs    {_inputs_line(m.inputs)}")
    skipped = {k: v for k, v in (m.skipped or {}).items() if v}
    print("skipped   " + (", ".join(f"{k}={v}" for k, v in skipped.items()) or "none"))
    print(f"writer    {_key_values(m.writer)}")
    if codecs is not None:
        print("codecs    " + "; ".join(
            f"{col}: " + ", ".join(f"{codec} x{n}" for codec, n in sorted(per.items()))
            for col, per in codecs.items()))
    if m.packing is not None:
        print(f"packing   {_key_values(m.packing)}")
        print(f"documents {documents_line(m.packing)}")
    print("schema")
    for f in info["schema"]:
        print(f"  {f['name']}: {f['type']}{'' if f['nullable'] else ' not null'}")
    return 0


def documents_line(packing: dict) -> str:
    """``zephon info``'s summary of what packing did to the documents.

    >>> documents_line({"strategy": "best-fit", "num_documents": 23, "documents_split": 16,
    ...                 "split_pieces": 39, "num_tokens": 541, "num_windows": 38,
    ...                 "padded_tokens": 67, "dropped_tail_tokens": 0})
    '23 (16 split into 39 pieces), 541 tokens in 38 windows; padded 67 tokens, dropped a tail of 0 tokens (best-fit)'
    """
    def known(key):
        return packing.get(key, "?")   # written before packing version 2: not recorded

    return (f"{known('num_documents')} ({known('documents_split')} split into "
            f"{known('split_pieces')} pieces), {known('num_tokens')} tokens in "
            f"{known('num_windows')} windows; padded {known('padded_tokens')} tokens, dropped "
            f"a tail of {known('dropped_tail_tokens')} tokens "
            f"({packing.get('strategy', 'concat')})")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _key_values(obj) -> str:
    if not isinstance(obj, dict):
        return dumps(obj)
    return " ".join(f"{k}={dumps(v) if isinstance(v, (dict, list)) else v}"
                    for k, v in obj.items())


def _inputs_line(inputs) -> str:
    if isinstance(inputs, dict) and {"count", "bytes"} <= inputs.keys():
        rest = {k: v for k, v in inputs.items() if k not in ("count", "bytes")}
        line = f"{_count(inputs['count'], 'file')}, {inputs['bytes'] / 1e6:.1f} MB"
        return line + (f" ({_key_values(rest)})" if rest else "")
    return _key_values(inputs)


def cmd_get(args) -> int:
    from ..format.index import parse_seq
    from ..read.dataset import open_dataset

    with open_dataset(args.url, storage_options=args.storage_options) as ds:
        try:
            seqs = [parse_seq(t, num_samples=ds.num_samples) for t in args.seqs]
        except ValueError as exc:   # not an integer; out of range is SeqOutOfRangeError
            raise UsageError(str(exc)) from exc
        rows = ds.take(seqs).to_pylist()
    for seq, row in zip(seqs, rows):
        if args.json:
            emit(row)
        else:
            print(f"[{seq}] {dumps(row)}")
    return 0


def _cmd_plan(args) -> int:
    from .plan_cmd import cmd_plan

    return cmd_plan(args)


def _cmd_trace(args) -> int:
    from .trace_cmd import cmd_trace

    return cmd_trace(args)


def _cmd_where(args) -> int:
    from .trace_cmd import cmd_where

    return cmd_where(args)


def _cmd_audit(args) -> int:
    from .trace_cmd import cmd_audit

    return cmd_audit(args)


def _cmd_gc(args) -> int:
    from .gc_cmd import cmd_gc

    return cmd_gc(args)


def _cmd_cache(args) -> int:
    from .cache_cmd import cmd_cache

    return cmd_cache(args)


COMMANDS = {"convert": cmd_convert, "verify": cmd_verify, "info": cmd_info, "get": cmd_get,
            "plan": _cmd_plan, "trace": _cmd_trace, "where": _cmd_where, "audit": _cmd_audit,
            "cache": _cmd_cache, "gc": _cmd_gc}

if __name__ == "__main__":  # pragma: no cover
    entry()
