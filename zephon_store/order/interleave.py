"""The interleave of one weight vector: a balanced tree of two-way Beatty splits.

A node with subtree weight ``M`` and left-subtree weight ``L`` (integer numerators) sends its
``n``-th item (0-based) left iff ``c(n + 1) > c(n)``, where ``c(n) = floor((n*L + M/2) / M)``
counts the first ``n`` items that went left; the item becomes item ``c(n)`` of the left
child or item ``n - c(n)`` of the right one. ``|c(n) - n*L/M| <= 1/2`` at every node, so a
source at depth ``d`` is within ``d/2`` of its share after any prefix (the proof is in
docs/mixtures.md). Everything here is integer arithmetic on numpy int64 arrays or Python
ints alike, with no state: item ``n`` costs ``depth`` steps whatever ``n`` is.

>>> t = SplitTree([5, 3, 2])                  # weights 1/2, 3/10, 1/5
>>> src, item = t.locate(np.arange(10))
>>> src.tolist(), item.tolist()
([0, 1, 2, 0, 0, 1, 0, 2, 1, 0], [0, 0, 0, 1, 2, 1, 3, 1, 2, 4])
>>> t.counts(10), t.position(2, 1)            # per-source counts; where source 2's item 1 is
([5, 3, 2], 7)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SplitTree"]


# Every function keeps its intermediate products below 2**62 for numerators up to 2**30 by
# splitting n = h*m + l with 0 <= l < m first: (h*m + l)*a/m = h*a + l*a/m.

def _left_count(n, left, total):
    """How many of the first ``n`` items of a node went left: floor((2*n*left + total) / (2*total))."""
    h = n // total
    lo = n - h * total
    return h * left + (2 * lo * left + total) // (2 * total)


def _left_item(i, left, total):
    """Node item number of the ``i``-th item (0-based) sent left: ceil((2i+1)*total/(2*left)) - 1."""
    h = i // left
    lo = i - h * left
    return h * total - ((-(2 * lo + 1) * total) // (2 * left)) - 1


def _right_item(i, right, total):
    """Node item number of the ``i``-th item sent right: floor((2i+1)*total/(2*right))."""
    h = i // right
    lo = i - h * right
    return h * total + ((2 * lo + 1) * total) // (2 * right)


class SplitTree:
    """The balanced split tree of one weight vector (integer numerators summing to ``total``).

    Leaves are stored as nodes that send everything left to themselves, so :meth:`locate`
    runs exactly ``depth`` vectorised passes without masks.
    """

    def __init__(self, numerators: Sequence[int]) -> None:
        self.numerators = tuple(int(m) for m in numerators)
        active = [k for k, m in enumerate(self.numerators) if m > 0]
        total, left, lchild, rchild, source = [], [], [], [], []
        self.paths: dict[int, list[tuple[int, bool]]] = {}

        def node(members: list[int], path: list[tuple[int, bool]]) -> int:
            i = len(total)
            weight = sum(self.numerators[k] for k in members)
            total.append(weight)
            left.append(weight)
            lchild.append(i)
            rchild.append(i)
            source.append(members[0])
            if len(members) == 1:
                self.paths[members[0]] = path
                return i
            half = (len(members) + 1) // 2
            left[i] = sum(self.numerators[k] for k in members[:half])
            lchild[i] = node(members[:half], [*path, (i, True)])
            rchild[i] = node(members[half:], [*path, (i, False)])
            return i

        node(active, [])
        self.depth = max(len(p) for p in self.paths.values())
        self._total = np.asarray(total, dtype=np.int64)
        self._left = np.asarray(left, dtype=np.int64)
        self._lchild = np.asarray(lchild, dtype=np.int64)
        self._rchild = np.asarray(rchild, dtype=np.int64)
        self._source = np.asarray(source, dtype=np.int64)
        self._py = [(total[i], left[i]) for i in range(len(total))]
        self._kids = list(zip(lchild, rchild, source))

    def locate(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, item number within the source) of stage-local positions ``n`` (int64)."""
        node = np.zeros(len(n), dtype=np.int64)
        cur = n.astype(np.int64, copy=True)
        for _ in range(self.depth):
            total, left = self._total[node], self._left[node]
            c = _left_count(cur, left, total)
            go_left = _left_count(cur + 1, left, total) > c
            cur = np.where(go_left, c, cur - c)
            node = np.where(go_left, self._lchild[node], self._rchild[node])
        return self._source[node], cur

    def counts(self, n) -> list:
        """Items of every source among the first ``n`` stage positions: one pass over the
        nodes (parents come before their children), instead of one path per source."""
        at = [n] + [None] * (len(self._py) - 1)
        out = [n * 0] * len(self.numerators)
        for i, ((total, left), (lc, rc, src)) in enumerate(zip(self._py, self._kids)):
            if lc == i:
                out[src] = at[i]
                continue
            c = _left_count(at[i], left, total)
            at[lc], at[rc] = c, at[i] - c
        return out

    def position(self, k: int, i):
        """Stage-local position of source ``k``'s item ``i`` (array or Python int); the inverse."""
        for node_id, is_left in reversed(self.paths[k]):
            total, left = self._py[node_id]
            i = _left_item(i, left, total) if is_left else _right_item(i, total - left, total)
        return i
