"""Finding inputs: glob and directory expansion, kind and compression detection, and opening a
file as one decompressed byte stream."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import fsspec

from ..errors import InputError, InputNotFoundError
from ..io.retry import RetryPolicy, call_with_retry
from ..io.storage import AZURE_PROTOCOLS, GCS_PROTOCOLS, is_local_url, resolve
from . import localtree
from .containers import DecompressedReader
from .localtree import HIDDEN, MAGIC, hidden_below_glob
from .options import DEFAULT_OPTIONS, InputFile, InputOptions
from .source import open_raw, remote_fs, retried

COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
KIND_SUFFIXES = {
    ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
    ".parquet": "parquet", ".pq": "parquet",
    ".csv": "csv", ".tsv": "csv",
    ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow",
}
# Plain-text and source-code suffixes; documented in docs/inputs.md, keep both in step.
TEXT_SUFFIXES = (
    ".txt .text .md .markdown .rst .tex .log .html .htm .xml .yaml .yml .toml "
    ".py .c .h .cc .cpp .hpp .java .js .ts .go .rs .rb .sh"
).split()
KIND_SUFFIXES.update((suffix, "text") for suffix in TEXT_SUFFIXES)



def split_compression(name: str) -> tuple[str, str | None]:
    """Strip one compression suffix: ``"a.jsonl.zst"`` -> ``("a.jsonl", "zstd")``."""
    lower = name.lower()
    for suffix, compression in COMPRESSION_SUFFIXES.items():
        if lower.endswith(suffix):
            return name[: -len(suffix)], compression
    return name, None


def detect_kind(url: str, format: str | None = None) -> str:
    """The input kind of ``url`` from its name (compression suffix stripped), or ``format``.

    >>> detect_kind("s3://b/raw/part-0.jsonl.zst")
    'jsonl'
    """
    if format is not None:
        return format
    base, _ = split_compression(url.rstrip("/"))
    suffix = os.path.splitext(base.rsplit("/", 1)[-1])[1].lower()
    if suffix in KIND_SUFFIXES:
        return KIND_SUFFIXES[suffix]
    raise InputError(
        f"cannot tell the format of {url}; pass --format jsonl|parquet|text|csv|arrow", path=url
    )


def expand_inputs(inputs: Sequence[str] | str, *, storage_options: dict | None = None,
                  options: InputOptions = DEFAULT_OPTIONS,
                  exclude: Sequence[str] = ()) -> list[InputFile]:
    """Expand paths, globs, directories and URLs into input files, sorted by URL, duplicates removed.

    Directories are walked recursively; in a walk or below a glob's wildcard, names starting
    with ``.`` or ``_`` (``.git``, ``_SUCCESS``, ``.crc``) are skipped unless the pattern spells
    the dot or underscore itself. A named file is always taken. Nothing under a root in
    ``exclude`` (the convert's own output and staging) or under a zephon dataset (a folder
    holding ``manifest.json`` and ``index/``) is ever an input. Local symbolic links are
    followed (a loop is an :class:`~zephon_store.errors.InputError`), and one local file
    reached under several names is one input, under the first name in sorted order.

    >>> import os
    >>> expand_inputs([os.path.dirname(tiny_jsonl)])   # the dataset beside it is skipped
    [InputFile(url='.../a.jsonl', kind='jsonl', compression=None, size=3180)]

    Globs and URLs work the same way: ``expand_inputs(["data/*.jsonl.zst", "s3://b/raw/"])``.
    """
    if isinstance(inputs, str):
        inputs = [inputs]
    found: dict[str, tuple] = {}   # url -> (size, local identity, object version)
    for pattern in inputs:
        matches = _drop_datasets(_expand_one(pattern, storage_options or {}), exclude)
        if not matches:
            raise InputNotFoundError(
                f"{pattern} matched no input files (names starting with '.' or '_' are skipped); "
                f"check the path and quote globs so the shell does not expand them"
            )
        for url, size, ident, *version in matches:
            found.setdefault(url, (size, ident, version[0] if version else None))
    out, seen = [], set()
    for url in sorted(found):
        size, ident, version = found[url]
        if ident is not None:
            if ident in seen:
                continue
            seen.add(ident)
        _, compression = split_compression(url)
        out.append(InputFile(url, detect_kind(url, options.format), compression, size,
                             version=version))
    return out


def _expand_one(pattern: str, storage_options: dict) -> list[tuple[str, int, tuple | None]]:
    if is_local_url(pattern):
        _, path = resolve(os.path.expanduser(pattern), storage_options)
        return _expand_local(path)
    protocol = pattern.split("://", 1)[0].lower()
    if protocol in GCS_PROTOCOLS + AZURE_PROTOCOLS:
        # zephon's own GCS/Azure clients serve datasets (read, and convert's output), not
        # raw inputs: they list no folders and open no streams.
        raise InputError(f"{pattern}: convert does not read inputs from {protocol}:// yet "
                         "(datasets there are read and written); copy the inputs to a local "
                         "folder or to s3:// and convert from there", path=pattern)
    fs, path, policy = remote_fs(pattern, storage_options)
    if MAGIC.search(path):
        out = []
        listing = retried(lambda: fs.glob(path, detail=True), policy, "LIST", pattern)
        for name, info in listing.items():
            if hidden_below_glob(name, path):
                continue
            if info.get("type") == "directory":
                out.extend(_walk(fs, name, policy))
            else:
                out.append((_url(fs, name), int(info.get("size") or 0), None,
                            object_version(info)))
        return out
    try:
        info = call_with_retry(lambda: fs.info(path), policy, what=f"HEAD {pattern}", url=pattern)
    except FileNotFoundError:
        return []
    if info.get("type") == "directory":
        return _walk(fs, path, policy)
    return [(_url(fs, path), int(info.get("size") or 0), None, object_version(info))]


def _expand_local(path: str) -> list[localtree.Found]:
    if MAGIC.search(path):
        return localtree.glob(path)
    if os.path.isdir(path):
        return localtree.walk(path)
    if os.path.lexists(path):
        # A named file is always taken; a named broken link or FIFO fails like one in a walk.
        kind = "file" if os.path.isfile(path) else "broken" if not os.path.exists(path) \
            else "special"
        return [localtree.take(path, kind)]
    return []


def object_version(info: dict) -> str | None:
    """What a listing entry says changes whenever the object's bytes do: s3fs's ``ETag``,
    zephon's own GCS and Azure clients' ``tag`` (a generation, an ETag; io/object_store.py),
    gcsfs's ``generation``, adlfs's ``etag``; None when it names none.

    >>> object_version({"name": "b/a.jsonl", "size": 3, "ETag": '"9b2c"'})
    '"9b2c"'
    >>> object_version({"name": "b/a.jsonl", "size": 3, "tag": "1733490000000001"})
    '1733490000000001'
    """
    for key in ("ETag", "tag", "etag", "generation"):
        if info.get(key) not in (None, ""):
            return str(info[key])
    return None


def _walk(fs: fsspec.AbstractFileSystem, root: str,
          policy: RetryPolicy) -> list[tuple[str, int, None, str | None]]:
    root = root.rstrip("/")
    out = []
    listing = retried(lambda: fs.find(root, detail=True, withdirs=False), policy, "LIST",
                      _url(fs, root))
    for name, info in listing.items():
        rel = name[len(root):].lstrip("/") if name.startswith(root) else name
        if any(part.startswith(HIDDEN) for part in rel.split("/")):
            continue
        out.append((_url(fs, name), int(info.get("size") or 0), None, object_version(info)))
    return out


def _drop_datasets(matches: list, exclude: Sequence[str]) -> list:
    """``matches`` (tuples starting with a URL) minus those under ``exclude`` or a dataset."""
    roots = {r.rstrip("/") for r in exclude}
    for url, *_ in matches:
        folder, name = url.rsplit("/", 1) if "/" in url else ("", url)
        if name == "manifest.json" and any(u.startswith(f"{folder}/index/") for u, *_ in matches):
            roots.add(folder)
    return [m for m in matches
            if not any(m[0] == r or m[0].startswith(r + "/") for r in roots)]


def _url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return fs.unstrip_protocol(path)


@contextlib.contextmanager
def open_stream(file: InputFile, storage_options: dict | None = None) -> Iterator[BinaryIO]:
    """Open ``file`` for reading as one decompressed byte stream (multi-member gzip and
    multi-frame zstd included). A truncated or corrupt container raises
    :class:`~zephon_store.errors.InputError` from ``read`` (see :mod:`.containers`); a remote
    file is read in retried ranges (see :mod:`.source`).

    >>> with open_stream(expand_inputs(tiny_jsonl)[0]) as f:   # .gz/.zst: the same, decompressed
    ...     f.read(29)
    b'{"id": 0, "text": "record 0"}'
    """
    with open_raw(file, storage_options) as raw:
        yield raw if file.compression is None else DecompressedReader(raw, file)


def read_blocks(stream: BinaryIO, size: int) -> Iterator[bytes]:
    """Yield ``size``-byte blocks of ``stream`` (the last may be shorter) until EOF."""
    while True:
        parts, have = [], 0
        while have < size:
            part = stream.read(size - have)
            if not part:
                break
            parts.append(part)
            have += len(part)
        if not parts:
            return
        yield parts[0] if len(parts) == 1 else b"".join(parts)
        if have < size:
            return
