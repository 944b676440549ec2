"""Row-group columns that are read a few entries at a time, never whole.

A reader indexes ``rg_offset``, ``rg_length`` and ``rg_xxh3`` at the row groups it reads;
format v4 (``formats/SPEC.md``, section 4.1) fetches those columns in chunks, on first
index, so nothing on the read path may ask for the whole column (a mean, a sum, a
concatenation). :class:`ConcatColumn` is the concatenation that asks its parts only for
the entries indexed: a mixture's row-group tables over its sources' manifests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ConcatColumn:
    """Columns ``parts`` read as one: entry ``g`` is ``parts[k][g - starts[k]]``, ``parts[k]``
    indexed only where asked (each a numpy array or a lazily fetched column).

    >>> c = ConcatColumn([np.array([5, 6]), np.array([7])])
    >>> int(c[2]), c[np.array([1, 2, 0])].tolist(), len(c)
    (7, [6, 7, 5], 3)
    """

    def __init__(self, parts: Sequence) -> None:
        self.parts = list(parts)
        sizes = np.array([len(p) for p in self.parts], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.size = int(self.starts[-1])
        self.shape = (self.size,)
        self.dtype = np.dtype(np.int64)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            g = int(key)
            if not -self.size <= g < self.size:
                raise IndexError(f"index {g} is out of bounds for a column of {self.size}")
            g %= max(1, self.size)
            k = int(np.searchsorted(self.starts, g, side="right")) - 1
            return np.int64(self.parts[k][g - int(self.starts[k])])
        idx = np.arange(self.size)[key] if isinstance(key, slice) else np.asarray(key)
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        out = np.empty(idx.size, dtype=np.int64)
        k = np.searchsorted(self.starts, idx, side="right") - 1
        for part in np.unique(k):
            sel = k == part
            out[sel] = np.asarray(self.parts[part][idx[sel] - self.starts[part]])
        return out

    def __array__(self, dtype=None, copy=None):
        """The whole column (every part in full: for checks and tools, not the read path)."""
        whole = np.concatenate([np.asarray(p, dtype=np.int64) for p in self.parts]
                               ) if self.parts else np.zeros(0, np.int64)
        return whole if dtype is None else whole.astype(dtype)
