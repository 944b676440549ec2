"""The one byte-size parser: every size in the CLI, the environment and the API goes through it.

One convention (docs/cli.md, "Sizes"): decimal prefixes are powers of 1000, binary prefixes
powers of 1024, so ``20G`` and ``20GB`` are 20,000,000,000 bytes and ``20GiB`` is
21,474,836,480. Units are case-insensitive (``512m`` is ``512MB``); a bare number is bytes.

>>> parse_size("20G"), parse_size("20GB"), parse_size("20GiB")
(20000000000, 20000000000, 21474836480)
>>> parse_size("1.5KiB"), parse_size(4096)
(1536, 4096)
"""

from __future__ import annotations

import re

__all__ = ["parse_size"]

_UNITS = {"": 1, "b": 1,
          "k": 1000, "kb": 1000, "kib": 1 << 10,
          "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
          "g": 1000**3, "gb": 1000**3, "gib": 1 << 30,
          "t": 1000**4, "tb": 1000**4, "tib": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text`` (``"128MiB"``, ``"1.5GB"``, ``"4096"``); an int is returned as it is.

    >>> parse_size("lots")
    Traceback (most recent call last):
    ...
    ValueError: not a byte size: 'lots' (examples: 4096, 128MiB, 20GB; k/M/G/T are powers of 1000, KiB/MiB/GiB/TiB powers of 1024)
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE_RE.match(text) if isinstance(text, str) else None
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte size: {text!r} (examples: 4096, 128MiB, 20GB; k/M/G/T are "
                         "powers of 1000, KiB/MiB/GiB/TiB powers of 1024)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
