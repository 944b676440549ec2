"""Each shard's Parquet footer: fetched once, hash-verified, checked against the manifest, kept.

Nothing is decoded from a shard before its footer passed :meth:`Footers.get`: a manifest
whose schema says int64 over shards holding strings must not hand out strings.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ManifestError
from ..format.manifest import PARSE_ERRORS, Manifest
from .once import OncePerKey

# fetch(shard, start, end, expected xxh3, label) -> the verified bytes
FetchShardRange = Callable[[int, int, int, str, str], bytes]
# forged(shard, what) -> the error for a manifest that disagrees with its shard
Forged = Callable[[int, str], ManifestError]


class ShardFooter(NamedTuple):
    """A shard's parsed footer and what decoding needs from it.

    ``fixed`` maps each top-level fixed-size binary column to ``(leaf index, max definition
    level, max repetition level, byte width)``, what
    :func:`~zephon_store.read.pages.read_fixed_chunk` needs.
    """

    metadata: pq.FileMetaData
    schema: pa.Schema
    fixed: dict[str, tuple[int, int, int, int]]


class Footers:
    """The footers of one dataset's shards, each fetched and checked once (threads asking
    for the same new footer at once wait for the one fetch)."""

    def __init__(self, manifest: Manifest, fetch: FetchShardRange, forged: Forged) -> None:
        self._manifest = manifest
        self._fetch = fetch
        self._forged = forged
        self._footers: dict[int, ShardFooter] = {}
        self._lock = threading.Lock()   # guards inserts into _footers only
        self._fetching: OncePerKey[ShardFooter] = OncePerKey()

    def after_fork(self) -> None:
        """In a forked child: a parent thread may have held a lock at the fork."""
        self._lock = threading.Lock()
        self._fetching.after_fork()

    def get(self, shard: int) -> ShardFooter:
        """``shard``'s footer, fetched, verified and checked against the manifest once."""
        got = self._footers.get(shard)
        if got is not None:
            return got
        return self._fetching.run(shard, self._load, self._footers.get)

    def _load(self, shard: int) -> ShardFooter:
        m = self._manifest
        start, end = int(m.footer_offset[shard]), int(m.shard_bytes[shard])
        data = self._fetch(shard, start, end, m.shard_footer_xxh3(shard),
                           f"shard {m.shard_name(shard)} footer")
        # The footer bytes end with the 4-byte length and "PAR1"; prefixing the leading magic
        # makes a minimal buffer pyarrow parses as a file (offsets inside are not checked).
        try:
            md = pq.read_metadata(pa.BufferReader(b"PAR1" + data))
        except PARSE_ERRORS as exc:
            raise self._forged(shard, f"its footer (bytes {start}..{end}, hash verified) does "
                               f"not parse: {exc}") from exc
        schema = self._check(shard, md)
        got = ShardFooter(md, schema, _fixed_leaves(md, schema))
        with self._lock:
            self._footers[shard] = got
        return got

    def _check(self, shard: int, md: pq.FileMetaData) -> pa.Schema:
        """The footer agrees with the manifest (row groups, row counts, schema); its schema."""
        m = self._manifest
        first, n = int(m.shard_first_rg[shard]), int(m.shard_num_rgs[shard])
        if md.num_row_groups != n:
            raise self._forged(shard, f"its footer holds {md.num_row_groups} row groups, the "
                               f"manifest says {n}")
        for local in range(n):
            got, want = md.row_group(local).num_rows, int(m.rg_rows[first + local])
            if got != want:
                raise self._forged(shard, f"row group {local} holds {got} rows, the manifest "
                                   f"says {want}")
        try:
            schema = md.schema.to_arrow_schema()
        except PARSE_ERRORS as exc:
            raise self._forged(shard, f"its footer's schema does not convert: {exc}") from exc
        if not schema.equals(m.storage_schema, check_metadata=False):
            raise self._forged(shard, f"its schema {schema} differs from the manifest's "
                               f"{'storage schema' if m.storage else 'schema'} {m.storage_schema}")
        return schema


def _fixed_leaves(md: pq.FileMetaData, schema: pa.Schema) -> dict[str, tuple[int, int, int, int]]:
    fixed = {}
    names = schema.names
    for ci in range(md.num_columns):
        leaf = md.schema.column(ci)
        if (leaf.path in names and names.count(leaf.path) == 1
                and pa.types.is_fixed_size_binary(schema.field(leaf.path).type)):
            fixed[leaf.path] = (ci, leaf.max_definition_level, leaf.max_repetition_level,
                                schema.field(leaf.path).type.byte_width)
    return fixed
