"""``zephon gc URL``: remove files under shards/ and index/ that the manifest does not name.

Only ``shards/<hash>.parquet`` and ``index/<hash>.arrow`` files are removed; anything else
there (a folder, a user's file) is reported as skipped and left alone.

Exit codes: 0 done (also when there was nothing to remove), 1 an error (no manifest, a
convert holds the output's lock, storage), 2 usage error.
"""

from __future__ import annotations

from .common import add_storage_options, emit, format_size


def add_gc_parser(sub) -> None:
    p = sub.add_parser("gc", help="remove unreferenced shards and side tables (orphans)")
    p.add_argument("url")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove "
                   "nothing")
    p.add_argument("--json", action="store_true")
    add_storage_options(p)


def cmd_gc(args) -> int:
    from ..write.gc import gc

    result = gc(args.url, dry_run=args.dry_run, storage_options=args.storage_options,
                progress=False if args.json else None)
    if args.json:
        emit(result.to_dict())
        return 0
    for rel in result.removed:
        print(f"{'would remove' if result.dry_run else 'removed'} {rel}")
    for rel in result.skipped:
        print(f"skipped {rel}: not a name zephon writes (shards/<hash>.parquet, "
              "index/<hash>.arrow); left as it is")
    verb = "would remove" if result.dry_run else "removed"
    print(f"{verb} {len(result.removed)} file(s), {format_size(result.bytes)}, from {result.url}")
    return 0
