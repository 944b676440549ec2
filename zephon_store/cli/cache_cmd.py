"""``zephon cache info|clear|fill``: the node-local disk cache of remote row groups, the
decoded cache (``<cache dir>/decoded``, or ``$ZEPHON_DECODED_CACHE_DIR``), the staging
folders of conversions into remote outputs (``<cache dir>/staging``) and their local scratch
files (``<system temp>/zephon-scratch``, :mod:`zephon_store.write.scratch`). ``fill URL`` decodes a
dataset into the decoded cache ahead of a job (on each node, while the job starts)."""

from __future__ import annotations

import os

from .common import UsageError, add_storage_options, emit, format_size


def _is_size(key: str) -> bool:
    """A ``cache info`` key that counts bytes: printed in units, kept as bytes in --json."""
    return key in ("bytes", "budget") or key.endswith("_bytes")


def _decoded_dir(directory: str | None) -> str | None:
    """``DIR/decoded`` for ``--dir DIR``; None (the default folder) without it."""
    return os.path.join(directory, "decoded") if directory else None


def _decoded(directory: str | None):
    from ..read.decoded_disk import DecodedDiskCache

    return DecodedDiskCache(_decoded_dir(directory))


def add_cache_parser(sub) -> None:
    p = sub.add_parser("cache", help="inspect, clear or fill the local cache of remote bytes, of "
                       "decoded row groups, and conversion staging")
    p.add_argument("action", choices=["info", "clear", "fill"])
    p.add_argument("url", nargs="?", help="fill: the dataset to decode into the decoded cache")
    p.add_argument("--dir", default=None, help="cache directory (default: $ZEPHON_CACHE_DIR or "
                   "the user cache directory; the decoded cache is DIR/decoded, or "
                   "$ZEPHON_DECODED_CACHE_DIR without --dir)")
    # Read by cmd_fill, not argparse: a bad size is one line, not the usage block.
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="fill: the decoded cache's budget (default: "
                   "$ZEPHON_DECODED_CACHE_BUDGET or 20GiB); fill stops before evicting")
    add_storage_options(p)
    p.add_argument("--json", action="store_true")


def _budget(text: str) -> int:
    """``--budget`` in bytes (> 0), else a one-line usage error naming the flag."""
    from .._util.sizes import parse_size

    try:
        budget = parse_size(text)
    except (ValueError, OverflowError):
        budget = None
    if budget is None or budget <= 0:
        raise UsageError(f"--budget must be a size > 0 bytes, such as 50GiB, 1GB or 4096; "
                         f"got {text!r}")
    return budget


def cmd_fill(args) -> int:
    """Print what :func:`~zephon_store.read.fill.fill_decoded_cache` did with ``args.url``
    and how a job reads it."""
    import sys

    from ..read.fill import fill_decoded_cache

    budget = _budget(args.budget) if args.budget is not None else None
    report = fill_decoded_cache(args.url, _decoded_dir(args.dir), budget_bytes=budget,
                                storage_options=args.storage_options,
                                progress=False if args.json else None)
    if args.json:
        emit(report.to_dict())
        return 0
    cached, n = report.filled, report.row_groups
    print(f"{cached} of {n} row groups of {args.url} in {report.decoded_dir} "
          f"({report.decoded} decoded now, {report.present} already there, "
          f"{report.bytes / 1e6:.1f} MB decoded"
          + (f", {report.dropped} damaged or misplaced entries replaced"
             if report.dropped else "") + ")")
    if cached < n:
        print(f"stopped at 90% of the budget ({format_size(report.budget)}): the rest "
              "would evict what was filled; pass a larger --budget")
    print("a job reads it only with "
          + " ".join(f"{k}={v}" for k, v in report.job_env.items())
          + f" in its environment, or with decoded_cache={report.decoded_dir!r} passed to "
          "ZephonLoader or open_dataset; without either, the loader reads no decoded cache")
    if report.warning:
        print(f"zephon cache fill: warning: {report.warning}", file=sys.stderr)
    return 0


def cmd_cache(args) -> int:
    from ..io.cache import cache_clear, cache_info
    from ..write.scratch import scratch_clear, scratch_info
    from ..write.staging import staging_clear, staging_info

    if args.action == "fill":
        if not args.url:
            raise UsageError("cache fill needs the dataset URL: zephon cache fill URL")
        return cmd_fill(args)
    if args.url:
        raise UsageError(f"cache {args.action} takes no dataset URL (got {args.url!r})")
    if args.budget is not None:
        raise UsageError(f"cache {args.action} takes no --budget (only fill does)")

    if args.action == "info":
        decoded = _decoded(args.dir).info()
        info = {**cache_info(args.dir), "decoded_dir": decoded["dir"],
                "decoded_entries": decoded["entries"], "decoded_bytes": decoded["bytes"],
                **staging_info(args.dir), **scratch_info()}
        if args.json:
            emit(info)
        else:
            width = max(map(len, info)) + 2
            for k, v in info.items():
                print(f"{k:{width}}{format_size(v) if _is_size(k) else v}")
        return 0
    freed = cache_clear(args.dir)
    decoded = _decoded(args.dir).clear()
    staged = staging_clear(args.dir)
    scratch = scratch_clear()
    if args.json:
        emit({"cleared_bytes": freed, "cleared_decoded_bytes": decoded, **staged, **scratch})
    else:
        print(f"cleared {format_size(freed)} of cached row groups")
        print(f"cleared {format_size(decoded)} of decoded row groups")
        print(f"cleared {staged['cleared_staging_jobs']} staged conversion(s), "
              f"{format_size(staged['cleared_staging_bytes'])}"
              + (f" ({staged['staging_in_use']} in use by a running convert, kept)"
                 if staged["staging_in_use"] else ""))
        print(f"cleared {scratch['cleared_scratch_files']} scratch file(s) of stopped "
              f"conversions, {format_size(scratch['cleared_scratch_bytes'])}"
              + (f" ({scratch['scratch_in_use']} in use by a running convert, kept)"
                 if scratch["scratch_in_use"] else ""))
    return 0
