"""The grid's cells and the order they run in: one axis at a time around the old default,
then the combinations with the new one.

The baseline is the format before issue 32 (zstd level 3 for every column, 1 MiB data
pages, 1 MiB row groups); every ratio in the report is a cell against it, measured in the
same run. A cell is a name and the ``WriteOptions`` fields it sets.
"""

from __future__ import annotations

OLD = {"compression": "zstd", "compression_level": 3}
BASELINE = "zstd-3 (old default)"

CELLS: dict[str, dict] = {
    BASELINE: OLD,
    # codec, every column alike
    "none": {"compression": "none"},
    "lz4 (LZ4_RAW)": {"compression": "lz4"},
    "snappy": {"compression": "snappy"},
    "zstd-1": {"compression": "zstd", "compression_level": 1},
    # the per-column rule (the new default)
    "auto (new default)": {},
    # data page size, old codec
    "zstd-3, pages 64 KiB": {**OLD, "data_page_size": 64 << 10},
    # row-group size, old codec
    "zstd-3, row groups 256 KiB": {**OLD, "row_group_bytes": 256 << 10},
    # combinations
    "auto, row groups 256 KiB": {"row_group_bytes": 256 << 10},
    "auto, pages 64 KiB": {"data_page_size": 64 << 10},
}

CORPORA = ("text", "tokens", "code")
# The code corpus checks the codec axis on a third kind of data (and small scalar columns);
# the page and row-group axes are measured on text and tokens (a lean grid on 2 shared cores).
CODE_CELLS = (BASELINE, "none", "lz4 (LZ4_RAW)", "zstd-1", "auto (new default)")
