"""Zephon with the node-local decoded cache: the default (zstd) shards, read through a
:class:`~zephon_store.read.decoded_disk.DecodedDiskCache` at ``$ZEPHON_DECODED_CACHE_DIR``.

The runner (``benchmarks/bench_decoded_cache.py``) sets the folder per case: empty for a
first epoch (every row group decoded and written), filled for a later one (every row group
mapped). Only the environment differs; the reads are ``sys_zephon``'s.
"""

from __future__ import annotations

import os

from . import sys_zephon


def _check() -> None:
    if not os.environ.get("ZEPHON_DECODED_CACHE_DIR"):
        raise RuntimeError("sys_zephoncache needs ZEPHON_DECODED_CACHE_DIR (set by the runner)")


def read(kind: str, path: str, *, shuffle: bool) -> int:
    _check()
    return sys_zephon.read(kind, path, shuffle=shuffle)


def resume(kind: str, path: str, state: dict, *, shuffle: bool = True):
    _check()
    return sys_zephon.resume(kind, path, state, shuffle=shuffle)
