"""Arrow IPC files (``.arrow``, ``.feather``, ``.ipc``): data already in Arrow, read as written.

The cheapest input for a table that is already in memory: ``pa.ipc.new_file`` (or
``pyarrow.feather.write_feather(table, path, compression="uncompressed")``) writes it at
memory-copy speed, where exporting it to Parquet first encodes and compresses every value
(docs/benchmarks.md, "Conversion (local engine)"). A local file is memory-mapped, so reading
it copies nothing. Types get the normalisations of :func:`~.schema.normalize_batch`, as for
Parquet. Only the IPC *file* format (with its footer) is read; the stream format has no
footer to find the batches by.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from ..errors import InputError, ZephonError
from ..io.storage import is_local_url
from .options import InputFile, InputOptions, InputStats
from .schema import normalize_batch
from .self_compressed import READ_ERRORS, open_self_compressed


def read_arrow(file: InputFile, *, options: InputOptions, storage_options: dict | None,
               stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    """Record batches of one Arrow IPC file, at most ``options.batch_rows`` rows each."""
    def open_fn(raw):
        local = is_local_url(file.url)
        return pa.ipc.open_file(pa.memory_map(file.url.removeprefix("file://")) if local else raw)

    with open_self_compressed(
            file, storage_options, format="Arrow IPC", compresses="buffers",
            check="check that it is the IPC file format (pa.ipc.new_file, Feather v2) and "
                  "complete", open_fn=open_fn) as reader:
        row = 0
        for i in range(reader.num_record_batches):
            try:
                batch = reader.get_batch(i)
            except ZephonError:
                raise
            except READ_ERRORS as exc:
                raise InputError(f"{file.url} record batch {i} (rows from {row}): cannot read "
                                 f"Arrow IPC ({exc}); the file is damaged: re-create it",
                                 path=file.url, row=row) from exc
            for start in range(0, batch.num_rows, options.batch_rows):
                yield normalize_batch(batch.slice(start, options.batch_rows))
            row += batch.num_rows
