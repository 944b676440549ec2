"""Global sequence number -> (shard, row group, row): the index over the manifest.

Pure numpy over the manifest's row-group table (``row_start`` is the running sum of row
counts), so a lookup is one ``searchsorted``, O(log R), vectorised, no shard bytes read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SeqOutOfRangeError


@dataclass(frozen=True)
class Located:
    """Where each requested sequence number lives (all int64 arrays of equal length)."""

    seq: np.ndarray
    shard: np.ndarray
    row_group: np.ndarray       # global row-group index
    row_in_group: np.ndarray
    row_in_shard: np.ndarray


def _out_of_range(bad: int | str, num_samples: int) -> SeqOutOfRangeError:
    return SeqOutOfRangeError(
        f"sequence number {bad} is out of range; valid sequence numbers are "
        f"0..{num_samples - 1} (the dataset holds {num_samples} samples)")


def as_seqs(seqs, num_samples: int) -> np.ndarray:
    """Validate and convert sequence numbers to int64; out of range -> SeqOutOfRangeError.

    Integers of any width are checked before conversion (a uint64 or a 23-digit number is
    out of range, never wrapped to a negative); booleans and non-integers raise TypeError.

    >>> as_seqs(np.array([3], dtype=np.uint64), 10).tolist()
    [3]
    """
    arr = np.asarray(seqs)
    if arr.dtype == object:
        # Python ints past int64 (numpy keeps them as objects): check them as Python ints.
        flat = arr.reshape(-1).tolist()
        if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer))
               for v in flat):
            bad = next(v for v in flat if isinstance(v, (bool, np.bool_))
                       or not isinstance(v, (int, np.integer)))
            raise TypeError(f"sequence numbers must be integers (not bool), got {bad!r}")
        for v in flat:
            if not 0 <= int(v) < num_samples:
                raise _out_of_range(int(v), num_samples)
        return np.array(flat, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"sequence numbers must be integers (not bool), got dtype "
                            f"{arr.dtype}")
    arr = arr.reshape(-1)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())   # Python ints: no wrap for uint64
        if lo < 0 or hi >= num_samples:
            raise _out_of_range(lo if lo < 0 else hi, num_samples)
    return arr.astype(np.int64, copy=False)


def parse_seq(text: str, *, num_samples: int) -> int:
    """A sequence number typed by a user (``zephon get 17``), validated.

    Raises ValueError when ``text`` is not a plain base-10 integer, and
    :class:`~zephon_store.errors.SeqOutOfRangeError` (naming the valid range) when it lies
    outside ``[0, num_samples)``, however many digits it has.

    >>> parse_seq("17", num_samples=100)
    17
    """
    stripped = text.strip() if isinstance(text, str) else ""
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    if not digits.isdigit() or not digits.isascii():
        raise ValueError(f"a sequence number must be a base-10 integer, got {text!r}")
    if len(digits) > 40:   # past any int64 (and Python's 4300-digit int() limit)
        raise _out_of_range(stripped, num_samples)
    return int(as_seqs([int(stripped)], num_samples)[0])


class RowGroupFinder:
    """``searchsorted(row_start, s, "right") - 1``, but fast for random queries.

    A binary search over a million row groups costs ~20 cache misses per query. Instead, a
    guide table maps equal-width buckets of sequence numbers to the first row group that
    can hold them; a query starts there and steps forward (one or two steps when row groups
    are of similar size). Queries still unresolved after a few steps (very uneven row
    groups) fall back to binary search, so the answer is always exact.

    >>> f = RowGroupFinder(np.array([0, 3, 10, 11]), 15)
    >>> f.find(np.array([0, 2, 3, 10, 14])).tolist()
    [0, 0, 1, 2, 3]
    """

    _MAX_STEPS = 4

    def __init__(self, row_start: np.ndarray, num_samples: int) -> None:
        self.row_start = np.asarray(row_start, dtype=np.int64)
        self.num_samples = int(num_samples)
        r = len(self.row_start)
        # Bucket width: a power of two near N / R, so the bucket of s is a shift, not a
        # (much slower) 64-bit division.
        avg = max(1, self.num_samples // max(1, r))
        self.shift = max(0, avg.bit_length() - 1)
        width = 1 << self.shift
        buckets = np.arange(0, self.num_samples + width, width, dtype=np.int64)
        self.guide = np.searchsorted(self.row_start, buckets, side="right") - 1
        # sentinel so idx + 1 is always a valid index
        self._next_start = np.append(self.row_start[1:], np.int64(np.iinfo(np.int64).max))

    def find(self, s: np.ndarray) -> np.ndarray:
        idx = self.guide[s >> self.shift]
        todo = np.flatnonzero(self._next_start[idx] <= s)
        for _ in range(self._MAX_STEPS):
            if todo.size == 0:
                return idx
            idx[todo] += 1
            todo = todo[self._next_start[idx[todo]] <= s[todo]]
        if todo.size:
            idx[todo] = np.searchsorted(self.row_start, s[todo], side="right") - 1
        return idx


def locate(manifest, seqs) -> Located:
    """Locate global sequence numbers.

    >>> from zephon_store.io.storage import Storage
    >>> from zephon_store.format.manifest import load_manifest
    >>> loc = locate(load_manifest(Storage(tiny_dataset)), [0, 57, 99])   # row groups of 10
    >>> loc.shard.tolist(), loc.row_group.tolist(), loc.row_in_group.tolist()
    ([0, 0, 0], [0, 5, 9], [0, 7, 9])
    """
    s = as_seqs(seqs, manifest.num_samples)
    finder = getattr(manifest, "_finder", None)
    if finder is None:
        finder = manifest._finder = RowGroupFinder(manifest.rg_row_start, manifest.num_samples)
    rg = finder.find(s)
    shard = manifest.rg_shard[rg]
    return Located(
        seq=s, shard=shard, row_group=rg,
        row_in_group=s - manifest.rg_row_start[rg],
        row_in_shard=s - manifest.shard_row_start[shard],
    )
