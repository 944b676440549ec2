"""``zephon cache info|clear``: the node-local disk cache of remote row groups, the decoded
cache (``<cache dir>/decoded``, or ``$ZEPHON_DECODED_CACHE_DIR``) and the staging folders of
conversions into remote outputs (``<cache dir>/staging``)."""

from __future__ import annotations

import os

from .common import emit


def _decoded(directory: str | None):
    from ..read.decoded_disk import DecodedDiskCache, default_decoded_dir

    return DecodedDiskCache(os.path.join(directory, "decoded") if directory
                            else default_decoded_dir())


def add_cache_parser(sub) -> None:
    p = sub.add_parser("cache", help="inspect or clear the local cache of remote bytes, of decoded "
                       "row groups, and conversion staging")
    p.add_argument("action", choices=["info", "clear"])
    p.add_argument("--dir", default=None, help="cache directory (default: $ZEPHON_CACHE_DIR or "
                   "the user cache directory)")
    p.add_argument("--json", action="store_true")


def cmd_cache(args) -> int:
    from ..io.cache import cache_clear, cache_info
    from ..write.staging import staging_clear, staging_info

    if args.action == "info":
        decoded = _decoded(args.dir).info()
        info = {**cache_info(args.dir), "decoded_dir": decoded["dir"],
                "decoded_entries": decoded["entries"], "decoded_bytes": decoded["bytes"],
                **staging_info(args.dir)}
        if args.json:
            emit(info)
        else:
            for k, v in info.items():
                print(f"{k:14} {v}")
        return 0
    freed = cache_clear(args.dir)
    decoded = _decoded(args.dir).clear()
    staged = staging_clear(args.dir)
    if args.json:
        emit({"cleared_bytes": freed, "cleared_decoded_bytes": decoded, **staged})
    else:
        print(f"cleared {freed} bytes of cached row groups")
        print(f"cleared {decoded} bytes of decoded row groups")
        print(f"cleared {staged['cleared_staging_jobs']} staged conversion(s), "
              f"{staged['cleared_staging_bytes']} bytes"
              + (f" ({staged['staging_in_use']} in use by a running convert, kept)"
                 if staged["staging_in_use"] else ""))
    return 0
