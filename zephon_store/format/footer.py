"""Where a shard's row groups lie, by its Parquet footer, checked against the manifest.

The decoders read column chunks at the footer's offsets; the manifest records the byte range
of each row group and its xxh3. A footer that places a chunk outside that range would have a
decoder read bytes nobody checked, so it is refused before any decode.
"""

from __future__ import annotations

import pyarrow.parquet as pq

from .manifest import Manifest


def row_group_byte_range(rg: pq.RowGroupMetaData) -> tuple[int, int]:
    """``[start, end)`` of the bytes holding every column chunk of a row group."""
    start, end = None, 0
    for c in range(rg.num_columns):
        col = rg.column(c)
        first = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset:
            first = min(first, col.dictionary_page_offset)
        last = first + col.total_compressed_size
        start = first if start is None else min(start, first)
        end = max(end, last)
    assert start is not None
    return start, end


def chunk_range_problem(m: Manifest, rg: int, meta: pq.RowGroupMetaData) -> str | None:
    """Why row group ``rg``'s column chunks (per its footer ``meta``) are not all inside
    the byte range whose xxh3 the manifest records, or None when they are.

    The decoders read at the footer's offsets; this makes those bytes the hashed ones
    (on the memory-mapped path the whole shard is addressable).
    """
    lo = int(m.rg_offset[rg])
    hi = lo + int(m.rg_length[rg])
    if meta.num_columns == 0:
        return None   # nothing is read
    start, end = row_group_byte_range(meta)
    if start < lo or end > hi:
        return (f"row group {m.rg_local_index(rg)}: the footer places its column chunks at "
                f"bytes {start}..{end}, outside the hashed range {lo}..{hi} the manifest "
                "records")
    return None
