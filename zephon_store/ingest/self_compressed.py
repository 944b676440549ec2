"""Opening a file format that compresses its own data (Parquet pages, Arrow IPC buffers).

Such a file is never read through a container codec (``x.parquet.gz``): its reader needs
random access, and the codec inside is the format's own. An unreadable file is one
:class:`~zephon_store.errors.InputError` naming it; a storage error that outlasted its
retries passes through as itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import pyarrow as pa

from ..errors import InputError, ZephonError
from .options import InputFile
from .source import open_raw

#: What a reader raises on bytes that are not its format (or are cut short).
READ_ERRORS = (pa.ArrowException, OSError, ValueError)


@contextlib.contextmanager
def open_self_compressed(file: InputFile, storage_options: dict | None, *, format: str,
                         compresses: str, check: str,
                         open_fn: Callable[[BinaryIO], Any]) -> Iterator[Any]:
    """``open_fn`` over the stored bytes of ``file`` (a ``format`` file that compresses its
    ``compresses`` itself); ``check`` says what to verify when it is not readable."""
    if file.compression is not None:
        raise InputError(
            f"{file.url}: {format} compresses its {compresses} itself and cannot be read "
            f"through {file.compression}; decompress the file first", path=file.url)
    with open_raw(file, storage_options) as raw:
        try:
            opened = open_fn(raw)
        except ZephonError:
            raise  # storage gave up after retries (pyarrow passes our errors through)
        except READ_ERRORS as exc:
            raise InputError(f"{file.url}: not a readable {format} file ({exc}); {check}, or "
                             "pass --format", path=file.url) from exc
        yield opened
