"""Parquet from any writer (pyarrow, pandas, polars, duckdb, Spark, HF datasets), read by row group.

Types are kept as written, with the normalisations of :func:`~.schema.normalize_batch`
(dictionaries decoded, view types made large, list items named ``item``, metadata dropped).
A pandas index that was written as a column (``__index_level_0__`` or its name) stays a
column; a RangeIndex lives only in the pandas metadata and so does not appear.

Page CRC checksums are verified where the writer stored them (``write_page_checksum=True`` in
pyarrow, Spark's ``parquet.page.write-checksum.enabled``): pyarrow skips them unless asked, and
a flipped value byte then converts as a wrong number.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError, ZephonError
from .options import InputFile, InputOptions, InputStats
from .schema import normalize_batch
from .self_compressed import READ_ERRORS, open_self_compressed


def read_parquet(file: InputFile, *, options: InputOptions, storage_options: dict | None,
                 stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    """Record batches of one Parquet file, at most ``options.batch_rows`` rows each."""
    with open_self_compressed(
            file, storage_options, format="Parquet", compresses="pages",
            check="check that it is Parquet and complete",
            open_fn=lambda raw: pq.ParquetFile(raw, page_checksum_verification=True)) as pf:
        row = 0
        for rg in range(pf.num_row_groups):
            # One row group at a time, so an error can say where it happened.
            try:
                for batch in pf.iter_batches(batch_size=options.batch_rows, row_groups=[rg],
                                             use_threads=True):
                    if batch.num_rows:
                        yield normalize_batch(batch)
            except ZephonError:
                raise
            except READ_ERRORS as exc:
                what = "a page fails its CRC checksum" if "CRC checksum" in str(exc) \
                    else "cannot read Parquet"
                raise InputError(
                    f"{file.url} row group {rg} (rows from {row}): {what} ({exc}); the file is "
                    f"damaged: re-create or re-download it", path=file.url, row=row
                ) from exc
            row += pf.metadata.row_group(rg).num_rows
