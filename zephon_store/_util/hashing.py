"""Content hashes: xxh3-128, written as 32 lowercase hex digits.

Shards are named by the hash of their bytes, row groups and footers carry the hash of
their byte range, and ``dataset_id`` is ``"xxh3:" + hash(canonical manifest)``.
"""

from __future__ import annotations

import re

import xxhash

HEX_RE = re.compile(r"[0-9a-f]{32}")  # used with fullmatch: "$" would pass a trailing "\n"
DATASET_ID_PREFIX = "xxh3:"
_CHUNK = 8 << 20
#: Above this many bytes python-xxhash's hasher object releases the GIL while it hashes
#: (its one-shot functions never do), so row-group checks in decode threads overlap with
#: the loop's own Python work.
_RELEASE_GIL_BYTES = 64 << 10


def xxh3_hex(data: bytes | bytearray | memoryview) -> str:
    """Return the xxh3-128 of ``data`` as 32 hex digits.

    >>> xxh3_hex(b"")
    '99aa06d3014798d86001c324468d497f'
    """
    if memoryview(data).nbytes > _RELEASE_GIL_BYTES:
        return xxhash.xxh3_128(data).hexdigest()
    return xxhash.xxh3_128_hexdigest(data)


def xxh3_file(path: str, start: int = 0, end: int | None = None) -> str:
    """Hash a local file's bytes ``[start, end)`` without loading it whole."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        f.seek(start)
        remaining = None if end is None else end - start
        while remaining is None or remaining > 0:
            n = _CHUNK if remaining is None else min(_CHUNK, remaining)
            block = f.read(n)
            if not block:
                break
            h.update(block)
            if remaining is not None:
                remaining -= len(block)
    return h.hexdigest()


def is_hex_hash(s: str) -> bool:
    """True when ``s`` looks like a 32-hex-digit xxh3-128 value."""
    return isinstance(s, str) and HEX_RE.fullmatch(s) is not None
