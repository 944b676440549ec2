"""``read_input``: one input file to Arrow record batches, whatever its kind."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from .arrow_ipc import read_arrow
from .csv import read_csv
from .files import open_stream
from .jsonl import read_jsonl
from .options import DEFAULT_OPTIONS, InputFile, InputOptions, InputStats
from .parquet import read_parquet
from .text import read_text


def read_input(file: InputFile, *, options: InputOptions = DEFAULT_OPTIONS,
               storage_options: dict | None = None,
               stats: InputStats | None = None) -> Iterator[pa.RecordBatch]:
    """Stream ``file`` as record batches of at most ``options.batch_rows`` rows.

    The kind is ``file.kind`` (:func:`expand_inputs` already applied ``options.format``).
    Batches carry only the file's own columns. Bad records raise
    :class:`~zephon_store.errors.InputError` naming the file and line, or with
    ``options.on_error="skip"`` are dropped and counted in ``stats``. Batches of one file may
    differ in type where a later chunk widened a column (int64 then double); unify them with
    :func:`unify_schemas` and :func:`conform_batch` as for different files. A file with no
    records yields no batches. A truncated or damaged container (or a Parquet page failing its
    CRC) always raises, whatever ``on_error`` says. Remote files are read in ranges retried per
    the ``"retry"`` storage option; a :class:`~zephon_store.errors.StorageError` naming the
    file is raised when that budget runs out.

    >>> from zephon_store.ingest import expand_inputs
    >>> stats = InputStats()
    >>> for batch in read_input(expand_inputs(tiny_jsonl)[0],
    ...                         options=InputOptions(on_error="skip"), stats=stats):
    ...     batch.num_rows
    100
    >>> stats.rows, stats.skipped
    (100, 0)
    """
    if stats is not None:
        stats.files += 1
    if file.kind == "parquet":
        batches = read_parquet(file, options=options, storage_options=storage_options, stats=stats)
    elif file.kind == "csv":
        batches = read_csv(file, options=options, storage_options=storage_options, stats=stats)
    elif file.kind == "arrow":
        batches = read_arrow(file, options=options, storage_options=storage_options, stats=stats)
    else:
        batches = _streamed(file, options=options, storage_options=storage_options, stats=stats)
    for batch in batches:
        if stats is not None:
            stats.rows += batch.num_rows
        yield batch


def _streamed(file: InputFile, *, options: InputOptions, storage_options: dict | None,
              stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    reader = read_jsonl if file.kind == "jsonl" else read_text
    with open_stream(file, storage_options) as stream:
        yield from reader(stream, file, options=options, stats=stats)
