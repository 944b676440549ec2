"""Local shards, memory-mapped once and handed out only for row groups whose bytes verify.

Content-addressed shard files never change in place, so a map stays valid for the life of
the dataset. Decoding straight from the map needs no copy and no Python file object.
"""

from __future__ import annotations

import os
import stat
import threading

import pyarrow as pa

from .._util.hashing import xxh3_hex
from ..format.manifest import Manifest

MAX_MAPPED_SHARDS = 256  # memory maps kept per dataset (their files are closed once mapped)


class MappedShards:
    """Memory maps of a local dataset's shards, at most :data:`MAX_MAPPED_SHARDS` open."""

    def __init__(self, manifest: Manifest, shard_url) -> None:
        self._manifest = manifest
        self._shard_url = shard_url      # shard index -> its local path
        self._maps: dict[int, pa.Buffer] = {}
        self._lock = threading.Lock()    # guards inserts and evictions of _maps only

    def clear(self) -> None:
        """Drop every map (they close when no decoded table uses them any more)."""
        with self._lock:
            self._maps = {}

    def after_fork(self) -> None:
        """In a forked child: fresh maps and a lock no parent thread can be holding."""
        self._lock = threading.Lock()
        self._maps = {}

    def verified(self, rg: int, shard: int) -> pa.Buffer | None:
        """The whole mapped shard if row group ``rg``'s bytes in it verify, else None.

        ``None`` sends the caller down the ordinary path, which re-reads, retries and raises
        the precise error (missing shard, short file, IntegrityError) when something is wrong.
        """
        m = self._manifest
        buf = self._maps.get(shard)
        if buf is None:
            buf = self._map(shard)
            if buf is None:
                return None
        off, length = int(m.rg_offset[rg]), int(m.rg_length[rg])
        if xxh3_hex(memoryview(buf)[off:off + length]) != m.rg_xxh3(rg):
            return None
        return buf

    def _map(self, shard: int) -> pa.Buffer | None:
        path = self._shard_url(shard)
        try:
            # Opening a FIFO blocks and a device maps endless bytes: regular files only.
            if not stat.S_ISREG(os.stat(path).st_mode):
                return None
            f = pa.memory_map(path, "r")
            try:
                buf = f.read_buffer()
            finally:
                f.close()   # the mapping lives while a buffer views it; the descriptor need not
        except OSError:
            return None
        if buf.size != int(self._manifest.shard_bytes[shard]):
            return None
        with self._lock:
            if len(self._maps) >= MAX_MAPPED_SHARDS:
                self._maps.pop(next(iter(self._maps)))
            self._maps[shard] = buf
        return buf
