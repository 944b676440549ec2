"""Decode one row group from bytes whose hash was checked.

Fixed-size binary columns (token windows) come straight from their pages where
:mod:`~zephon_store.read.pages` can read them exactly (zero-copy views of the verified bytes);
every other column, or a page it cannot read, goes through pyarrow's Parquet reader.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from .footers import ShardFooter
from .pages import read_fixed_chunk


def decode_row_group(source, buf: pa.Buffer, base: int, footer: ShardFooter, local: int,
                     meta: pq.RowGroupMetaData) -> pa.Table:
    """Row group ``local`` of a shard as a table in the shard's storage schema.

    ``buf`` holds the shard's bytes from offset ``base`` (the whole mapped shard with
    ``base=0``, or the row group's own bytes); ``source`` is a file object over the same bytes
    for pyarrow; ``meta`` is the footer's metadata of that row group.
    """
    md = footer.metadata
    direct = {}
    for name, (ci, max_def, max_rep, width) in footer.fixed.items():
        col = read_fixed_chunk(buf, base, meta.column(ci), max_def, max_rep, width)
        if col is not None:
            direct[name] = col
    # use_threads=False: row groups are ~1 MiB and callers decode several at once in their
    # own threads; Arrow's own pool only adds handoffs per call (docs/benchmarks.md).
    if not direct:
        return pq.ParquetFile(source, metadata=md).read_row_group(local, use_threads=False)
    schema = footer.schema
    rest = [f.name for f in schema if f.name not in direct]
    other = (pq.ParquetFile(source, metadata=md).read_row_group(
        local, columns=rest, use_threads=False) if rest else None)
    return pa.Table.from_arrays(
        [direct[f.name] if f.name in direct else other.column(f.name) for f in schema],
        schema=schema)
