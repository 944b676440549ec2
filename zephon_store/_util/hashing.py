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


def xxh3_ranges(path: str, ranges: list[tuple[int, int]]) -> tuple[str, list[str]]:
    """The xxh3-128 of a local file and of each byte range ``[start, end)`` of it, in one
    sequential pass of :data:`_CHUNK`-sized reads (the file is never held whole).

    The ranges must be sorted and must not overlap; bytes between them count for the file only.

    >>> import os
    >>> p = os.path.join(tmp, "r.bin")
    >>> _ = open(p, "wb").write(b"abcdefgh")
    >>> whole, (a, b) = xxh3_ranges(p, [(0, 3), (5, 8)])
    >>> whole == xxh3_hex(b"abcdefgh"), a == xxh3_hex(b"abc"), b == xxh3_hex(b"fgh")
    (True, True, True)
    """
    whole = xxhash.xxh3_128()
    hashers = [xxhash.xxh3_128() for _ in ranges]
    k, pos = 0, 0
    with open(path, "rb") as f:
        while True:
            block = memoryview(f.read(_CHUNK))
            if not block:
                break
            whole.update(block)
            end = pos + len(block)
            while k < len(ranges) and ranges[k][0] < end:
                a, b = ranges[k]
                lo, hi = max(a, pos) - pos, min(b, end) - pos
                if hi > lo:
                    hashers[k].update(block[lo:hi])
                if b > end:
                    break  # this range continues in the next block
                k += 1
            pos = end
    return whole.hexdigest(), [h.hexdigest() for h in hashers]


def is_hex_hash(s: str) -> bool:
    """True when ``s`` looks like a 32-hex-digit xxh3-128 value."""
    return isinstance(s, str) and HEX_RE.fullmatch(s) is not None
