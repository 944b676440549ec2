"""Raw inputs (JSONL, Parquet, text, CSV; compressed, local or remote) to Arrow record batches.

>>> from zephon_store.ingest import InputOptions, expand_inputs, read_input
>>> files = expand_inputs([tiny_jsonl])   # also globs, folders, "s3://b/raw/"
>>> [batch.num_rows for batch in read_input(files[0], options=InputOptions())]
[100]

See docs/inputs.md for detection rules, options, error messages and limits.
"""

from .files import detect_kind, expand_inputs, open_stream
from .options import InputFile, InputOptions, InputStats
from .read import read_input
from .schema import conform_batch, normalize_batch, unify_schemas

__all__ = [
    "InputFile",
    "InputOptions",
    "InputStats",
    "conform_batch",
    "detect_kind",
    "expand_inputs",
    "normalize_batch",
    "open_stream",
    "read_input",
    "unify_schemas",
]
