"""The value types of ingest: what to read (:class:`InputFile`), how (:class:`InputOptions`) and
what was skipped (:class:`InputStats`)."""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass, field, fields
from typing import ClassVar

KINDS = ("jsonl", "parquet", "text", "csv", "arrow")
COMPRESSIONS = ("gzip", "zstd", "bz2", "xz")
TEXT_MODES = ("file", "line")
ON_ERROR = ("raise", "skip")
# The kinds of bad record that ``on_error="skip"`` drops; each is a counter on InputStats.
SKIP_KINDS = ("malformed_json", "bad_encoding", "not_an_object", "schema_mismatch", "bad_row")


@dataclass(frozen=True)
class InputFile:
    """One raw input file, as found by :func:`~zephon_store.ingest.expand_inputs`.

    ``url`` is an absolute local path or a full fsspec URL (``s3://b/k``, ``memory:///x``);
    ``kind`` is one of ``jsonl parquet text csv``; ``compression`` is one of
    ``gzip zstd bz2 xz`` or None; ``size`` is the stored (compressed) size in bytes.
    ``version`` is what an object store says changes whenever the bytes do (the listing's
    ETag, or a GCS generation); None for local files, whose modification time stands in for
    it (:func:`input_stamp`). A rerun of convert uses it to tell an unchanged input.

    >>> InputFile("/data/a.jsonl.zst", "jsonl", "zstd", 1024).kind
    'jsonl'
    """

    url: str
    kind: str
    compression: str | None
    size: int
    version: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {'|'.join(KINDS)}, got {self.kind!r}")
        if self.compression is not None and self.compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be one of {'|'.join(COMPRESSIONS)} or None, got {self.compression!r}"
            )


def input_stamp(f: InputFile) -> str | int | None:
    """What changes when ``f``'s bytes do, short of reading them: an object's ``version``
    (ETag), a local file's modification time in ns; None when neither is known (the file is
    gone, or the store lists no ETag), which no rerun takes for unchanged.

    >>> input_stamp(InputFile("s3://b/a.jsonl", "jsonl", None, 9, version='"9b2c"'))
    '"9b2c"'
    """
    path = f.url.removeprefix("file://")
    if "://" in path:
        return f.version
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


@dataclass(frozen=True)
class InputOptions:
    """How raw inputs are read. Validated on construction.

    >>> InputOptions(text_mode="line", on_error="skip").batch_rows
    65536
    >>> InputOptions(batch_rows=0)
    Traceback (most recent call last):
    ValueError: batch_rows must be > 0, got 0
    """

    format: str | None = None  # force this kind for every file instead of guessing from the name
    text_mode: str = "file"  # "file": one sample per text file; "line": one sample per line
    text_column: str = "text"
    on_error: str = "raise"  # "raise": first bad record is an InputError; "skip": drop and count
    # 64 Ki rows keeps a batch of short records near a few MiB, the size Arrow kernels like.
    batch_rows: int = 65536
    csv_delimiter: str = ","
    # A quoted CSV field may span lines (RFC 4180; pandas and spreadsheets write them). Off: a
    # newline always ends a record, so a stray quote can only spoil its own line.
    csv_newlines_in_values: bool = True
    encoding: str = "utf-8"

    def __post_init__(self) -> None:
        if self.format is not None and self.format not in KINDS:
            raise ValueError(f"format must be one of {'|'.join(KINDS)} or None, got {self.format!r}")
        if self.text_mode not in TEXT_MODES:
            raise ValueError(f"text_mode must be one of {'|'.join(TEXT_MODES)}, got {self.text_mode!r}")
        if not isinstance(self.text_column, str) or not self.text_column:
            raise ValueError(f"text_column must be a non-empty string, got {self.text_column!r}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {'|'.join(ON_ERROR)}, got {self.on_error!r}")
        if isinstance(self.batch_rows, bool) or not isinstance(self.batch_rows, int):
            raise ValueError(f"batch_rows must be an int, got {self.batch_rows!r}")
        if self.batch_rows <= 0:
            raise ValueError(f"batch_rows must be > 0, got {self.batch_rows}")
        if not isinstance(self.csv_delimiter, str) or len(self.csv_delimiter) != 1 \
                or self.csv_delimiter in "\r\n\"":
            raise ValueError(
                f"csv_delimiter must be one character other than a quote or newline, "
                f"got {self.csv_delimiter!r}"
            )
        if not isinstance(self.csv_newlines_in_values, bool):
            raise ValueError(f"csv_newlines_in_values must be a bool, got "
                             f"{self.csv_newlines_in_values!r}")
        try:
            codecs.lookup(self.encoding)
        except (LookupError, TypeError):
            raise ValueError(f"encoding must be a codec Python knows, got {self.encoding!r}") from None
        # Lines are split on the byte b"\n" before decoding, which is only sound when the
        # encoding writes ASCII as ASCII (UTF-16/32 do not).
        if "\n{}\",".encode(self.encoding, errors="replace") != b"\n{}\",":
            raise ValueError(
                f"encoding must be ASCII-compatible (utf-8, latin-1, cp1252, shift_jis, ...), "
                f"got {self.encoding!r}; re-encode the file as UTF-8 first"
            )


# The default for keyword arguments: InputOptions is frozen, so one shared instance is safe.
DEFAULT_OPTIONS = InputOptions()


def is_utf8(encoding: str) -> bool:
    """True for the encodings that need no transcoding (a leading BOM is stripped either way)."""
    return codecs.lookup(encoding).name in ("utf-8", "utf-8-sig")


@dataclass
class InputStats:
    """Counts of what :func:`read_input` produced and skipped; pass one to accumulate.

    Picklable and mergeable, so parser processes can each fill one and the parent can sum them.

    >>> stats = InputStats()
    >>> stats.record_skip("malformed_json", "a.jsonl line 3: malformed JSON (...)")
    >>> stats.skipped, stats.malformed_json, stats.examples
    (1, 1, ['a.jsonl line 3: malformed JSON (...)'])
    """

    MAX_EXAMPLES: ClassVar[int] = 10

    files: int = 0
    rows: int = 0
    malformed_json: int = 0
    bad_encoding: int = 0
    not_an_object: int = 0
    schema_mismatch: int = 0
    bad_row: int = 0  # CSV records with the wrong number of fields or broken quoting
    examples: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """All skipped records, of every kind."""
        return sum(getattr(self, kind) for kind in SKIP_KINDS)

    def record_skip(self, kind: str, example: str) -> None:
        """Count one skipped record of ``kind``; keep ``example`` if fewer than MAX_EXAMPLES are kept."""
        if kind not in SKIP_KINDS:
            raise ValueError(f"kind must be one of {'|'.join(SKIP_KINDS)}, got {kind!r}")
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < self.MAX_EXAMPLES:
            self.examples.append(example)

    def merge(self, other: InputStats) -> None:
        """Add ``other``'s counts to this one (examples are kept up to MAX_EXAMPLES)."""
        for f in fields(self):
            if f.name != "examples":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        room = self.MAX_EXAMPLES - len(self.examples)
        self.examples.extend(other.examples[:max(room, 0)])

    def to_dict(self) -> dict:
        """A JSON-ready dict: every counter, ``skipped`` and ``examples``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "examples"}
        out["skipped"] = self.skipped
        out["examples"] = list(self.examples)
        return out
