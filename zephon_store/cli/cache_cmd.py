"""``zephon cache info|clear|fill``: the node-local disk cache of remote row groups, the
decoded cache (``<cache dir>/decoded``, or ``$ZEPHON_DECODED_CACHE_DIR``), the staging
folders of conversions into remote outputs (``<cache dir>/staging``) and their local scratch
files (``<system temp>/zephon-scratch``, :mod:`zephon_store.write.scratch`). ``fill URL`` decodes a
dataset into the decoded cache ahead of a job (on each node, while the job starts)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from .common import UsageError, add_storage_options, emit


def _decoded(directory: str | None, budget: int | None = None):
    from ..read.decoded_disk import DecodedDiskCache, default_decoded_dir

    return DecodedDiskCache(os.path.join(directory, "decoded") if directory
                            else default_decoded_dir(), budget_bytes=budget)


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


def _how_jobs_read(cache, budget_flag: int | None) -> tuple[dict[str, str], bool, str | None]:
    """The environment a job needs to read ``cache`` (a default loader reads a decoded
    cache only where ``$ZEPHON_DECODED_CACHE_DIR`` names it), whether a job started from
    this environment would, and a warning when it would not."""
    from ..read.decoded_disk import ENV_BUDGET, ENV_DIR

    env = {ENV_DIR: cache.directory}
    if budget_flag is not None:
        # A job with a smaller budget would evict part of what was filled.
        env[ENV_BUDGET] = str(budget_flag)
    here = os.environ.get(ENV_DIR)
    usage = (f"set {ENV_DIR}={cache.directory} in the job's environment or pass "
             f"decoded_cache={cache.directory!r} to ZephonLoader/open_dataset")
    if not here:
        return env, False, (f"${ENV_DIR} is not set here, so a job started from this "
                            f"environment reads no decoded cache; {usage}")
    here = os.path.abspath(os.path.expanduser(here))
    if os.path.realpath(here) != os.path.realpath(cache.directory):
        return env, False, (f"${ENV_DIR} here names {here}, so a job started from this "
                            f"environment reads that folder, not {cache.directory} filled "
                            f"now; {usage}")
    return env, True, None


def cmd_fill(args) -> int:
    """Decode the row groups of ``args.url`` into the decoded cache, in order, until all are
    there or 90% of the budget is filled (beyond it, eviction would undo the fill), and say
    how a job reads it."""
    import sys

    from ..read.dataset import open_dataset

    budget = _budget(args.budget) if args.budget is not None else None
    cache = _decoded(args.dir, budget)
    limit = int(cache.budget_bytes * 0.9)
    done = size = 0
    # One decode per core: more threads than cores cost far more system time than they
    # overlap (docs/benchmarks.md, section 14).
    threads = min(4, os.cpu_count() or 1)
    # cache=False: a remote dataset's compressed bytes are not kept beside the decoded ones.
    with open_dataset(args.url, storage_options=args.storage_options, cache=False,
                      decoded_cache=cache) as ds, ThreadPoolExecutor(threads) as pool:
        rgs = ds.row_groups
        n = ds.manifest.num_row_groups
        while done < n and size <= limit:
            batch = range(done, min(n, done + threads))
            size += sum(t.nbytes for t in pool.map(lambda rg: rgs.read(rg, keep=False), batch))
            done += len(batch)
        cached = sum(cache.contains(rgs.decoded_key(rg)) for rg in range(n))
    job_env, read_here, warning = _how_jobs_read(cache, budget)
    out = {"url": args.url, "decoded_dir": cache.directory, "row_groups": n,
           "filled": cached, "decoded": cache.stats.misses, "present": cache.stats.hits,
           "dropped": cache.stats.corrupt, "bytes": size, "budget": cache.budget_bytes,
           "complete": cached == n, "job_env": job_env, "jobs_here_read_it": read_here,
           "warning": warning}
    if args.json:
        emit(out)
        return 0
    print(f"{cached} of {n} row groups of {args.url} in {cache.directory} "
          f"({cache.stats.misses} decoded now, {cache.stats.hits} already there, "
          f"{size / 1e6:.1f} MB decoded"
          + (f", {cache.stats.corrupt} damaged or misplaced entries replaced"
             if cache.stats.corrupt else "") + ")")
    if cached < n:
        print(f"stopped at 90% of the budget ({cache.budget_bytes} bytes): the rest "
              "would evict what was filled; pass a larger --budget")
    print("a job reads it only with "
          + " ".join(f"{k}={v}" for k, v in job_env.items())
          + f" in its environment, or with decoded_cache={cache.directory!r} passed to "
          "ZephonLoader or open_dataset; without either, the loader reads no decoded cache")
    if warning:
        print(f"zephon cache fill: warning: {warning}", file=sys.stderr)
    return 0


def cmd_cache(args) -> int:
    from ..io.cache import cache_clear, cache_info
    from ..write.scratch import scratch_clear, scratch_info
    from ..write.staging import staging_clear, staging_info

    if args.action == "fill":
        if not args.url:
            raise UsageError("zephon cache fill needs the dataset URL: zephon cache fill URL")
        return cmd_fill(args)
    if args.url:
        raise UsageError(f"zephon cache {args.action} takes no dataset URL (got {args.url!r})")
    if args.budget is not None:
        raise UsageError(f"zephon cache {args.action} takes no --budget (only fill does)")

    if args.action == "info":
        decoded = _decoded(args.dir).info()
        info = {**cache_info(args.dir), "decoded_dir": decoded["dir"],
                "decoded_entries": decoded["entries"], "decoded_bytes": decoded["bytes"],
                **staging_info(args.dir), **scratch_info()}
        if args.json:
            emit(info)
        else:
            for k, v in info.items():
                print(f"{k:14} {v}")
        return 0
    freed = cache_clear(args.dir)
    decoded = _decoded(args.dir).clear()
    staged = staging_clear(args.dir)
    scratch = scratch_clear()
    if args.json:
        emit({"cleared_bytes": freed, "cleared_decoded_bytes": decoded, **staged, **scratch})
    else:
        print(f"cleared {freed} bytes of cached row groups")
        print(f"cleared {decoded} bytes of decoded row groups")
        print(f"cleared {staged['cleared_staging_jobs']} staged conversion(s), "
              f"{staged['cleared_staging_bytes']} bytes"
              + (f" ({staged['staging_in_use']} in use by a running convert, kept)"
                 if staged["staging_in_use"] else ""))
        print(f"cleared {scratch['cleared_scratch_files']} scratch file(s) of stopped "
              f"conversions, {scratch['cleared_scratch_bytes']} bytes"
              + (f" ({scratch['scratch_in_use']} in use by a running convert, kept)"
                 if scratch["scratch_in_use"] else ""))
    return 0
