"""The grid's cells and the order they run in: one axis at a time around the old default,
then the combinations.

The baseline is the format before issue 32 (zstd level 3 for every column, 1 MiB data
pages, 1 MiB row groups, token windows back to back); every ratio in the report is a cell
against it, measured in the same run. A cell is a name and the ``WriteOptions`` fields it
sets. The cells of the v4 rule's era pin ``fixed_size_lists="binary"`` (the v2-v4 layout),
so their kept results still describe what they name; on text and tokens the v4 default
(``auto``: every column zstd-1) wrote the same bytes as the ``zstd-1`` cell.
"""

from __future__ import annotations

V4_LAYOUT = {"fixed_size_lists": "binary"}
OLD = {"compression": "zstd", "compression_level": 3, **V4_LAYOUT}
BASELINE = "zstd-3 (old default)"

CELLS: dict[str, dict] = {
    BASELINE: OLD,
    # codec, every column alike (v4 layout)
    "none": {"compression": "none", **V4_LAYOUT},
    "lz4 (LZ4_RAW)": {"compression": "lz4", **V4_LAYOUT},
    "snappy": {"compression": "snappy", **V4_LAYOUT},
    "zstd-1": {"compression": "zstd", "compression_level": 1, **V4_LAYOUT},
    # zstd level 6 for every column (v4 layout): what a higher level buys per column kind
    "zstd-6": {"compression": "zstd", "compression_level": 6, **V4_LAYOUT},
    # token windows in byte planes (v5), zstd-1
    "zstd-1 (byte planes)": {"compression": "zstd", "compression_level": 1},
    # token windows in byte planes, LZ4
    "lz4 (byte planes)": {"compression": "lz4"},
    # the v5 rule: text zstd-6, other columns lz4, zstd-1 or none, windows in byte planes
    "auto (v5 default)": {},
    # data page size, old codec
    "zstd-3, pages 64 KiB": {**OLD, "data_page_size": 64 << 10},
    # row-group size, old codec
    "zstd-3, row groups 256 KiB": {**OLD, "row_group_bytes": 256 << 10},
    # combinations, with the v4 default (zstd-1 on these corpora)
    "zstd-1, row groups 256 KiB": {"compression": "zstd", "compression_level": 1,
                                   "row_group_bytes": 256 << 10, **V4_LAYOUT},
    "zstd-1, pages 64 KiB": {"compression": "zstd", "compression_level": 1,
                             "data_page_size": 64 << 10, **V4_LAYOUT},
}

CORPORA = ("text", "tokens", "code")
# The code corpus checks the codec axis on a third kind of data (and small scalar columns);
# the page and row-group axes are measured on text and tokens (a lean grid on 2 shared cores).
CODE_CELLS = (BASELINE, "none", "lz4 (LZ4_RAW)", "zstd-1", "zstd-6", "auto (v5 default)")
