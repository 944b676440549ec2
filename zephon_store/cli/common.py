"""Shared pieces of the CLI: size parsing, JSON output, storage options."""

from __future__ import annotations

import argparse
import base64
import datetime
import decimal
import json
import sys

from .._util.sizes import parse_size
from ..errors import ZephonError


class UsageError(ZephonError, ValueError):
    """A command-line mistake; ``main`` prints it on one line and exits with status 2.

    Raise it (or use an argparse ``type=`` below) for any check of the command line that
    the parser cannot make: a value the library would refuse with a ValueError exits 1,
    which is for findings and runtime errors.
    """


def size_arg(text: str) -> int:
    """An argparse type: a byte size read by :func:`~zephon_store._util.sizes.parse_size`.

    >>> size_arg("128MiB"), size_arg("20G")
    (134217728, 20000000000)
    """
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r} as a size; use e.g. 128MiB, 1GB or 4096 (bytes); "
            "k/M/G/T are powers of 1000, KiB/MiB/GiB/TiB powers of 1024") from exc


_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")   # parse_size reads no PiB


def format_size(n: int) -> str:
    """``n`` bytes in binary units, at most one decimal, in a spelling
    :func:`~zephon_store._util.sizes.parse_size` reads back (a cache budget set as ``20GiB``
    prints as it was written).

    >>> format_size(0), format_size(1536), format_size(10 << 30)
    ('0 B', '1.5 KiB', '10 GiB')
    """
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(_BINARY_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    text = f"{value:.1f}".removesuffix(".0") if unit else str(int(n))
    return f"{text} {_BINARY_UNITS[unit]}"


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1.

    >>> positive_int("4")
    4
    """
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (a step, a cursor).

    >>> non_negative_int("0")
    0
    """
    return _int_at_least(text, 0)


def build_options(cls, **kwargs):
    """``cls(**kwargs)``, with the options' own validation reported as a usage error (exit 2).

    >>> build_options(dict, a=1)
    {'a': 1}
    """
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from exc


def parse_row_group_size(text: str) -> tuple[int | None, int | None]:
    """``1MiB`` -> (bytes, None); ``4096rows`` -> (None, 4096)."""
    t = text.strip().lower()
    if t.endswith("rows") or t.endswith("row"):
        n = t.rstrip("s")[:-3].strip()
        if not n.isdigit() or int(n) <= 0:
            raise argparse.ArgumentTypeError(f"cannot read {text!r} as a row count; use e.g. 4096rows")
        return None, int(n)
    return size_arg(text), None


def parse_json_object(text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return obj


def _default(o):
    if isinstance(o, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(o)).decode()}
    if isinstance(o, (datetime.datetime, datetime.date, datetime.time)):
        return o.isoformat()
    if isinstance(o, datetime.timedelta):
        return o.total_seconds()
    if isinstance(o, decimal.Decimal):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    return repr(o)


def dumps(obj, *, indent: int | None = None) -> str:
    """JSON text for CLI output (bytes as base64, timestamps as ISO 8601)."""
    return json.dumps(obj, default=_default, indent=indent, ensure_ascii=False)


def emit(obj) -> None:
    sys.stdout.write(dumps(obj) + "\n")


def add_storage_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-options", type=parse_json_object, default=None, metavar="JSON",
                   help='fsspec storage options, e.g. \'{"endpoint_url": "http://127.0.0.1:8333"}\''
                        " (default: the standard AWS environment variables)")
