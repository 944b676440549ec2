"""Cut the global row stream into row groups and shards.

The cut points depend only on the sequence of per-row sizes (see :mod:`rowsize`) and the
write options, so they are the same however many processes parse or write.

Rules: a row group closes after ``row_group_rows`` rows (when set) or as soon as it holds
at least ``row_group_bytes`` bytes; a shard closes after the row group that brings it to at
least ``target_shard_bytes``. Every row group and shard holds at least one row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ShardCut:
    """One shard as cut: global rows ``[row_start, row_start + rows)`` cut into row groups."""

    index: int
    row_start: int
    row_group_rows: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return int(sum(self.row_group_rows))


class Cutter:
    """Streaming cutter: feed per-row sizes in stream order, then :meth:`finish`.

    >>> c = Cutter(row_group_rows=None, row_group_bytes=10, target_shard_bytes=25)
    >>> c.feed(np.array([4, 4, 4, 4, 4, 4, 4, 4]))
    >>> [s.row_group_rows for s in c.finish()]
    [[3, 3, 2]]
    """

    def __init__(self, *, row_group_rows: int | None, row_group_bytes: int | None,
                 target_shard_bytes: int) -> None:
        if row_group_rows is None and row_group_bytes is None:
            raise ValueError("one of row_group_rows or row_group_bytes must be set")
        self._rg_rows = row_group_rows
        self._rg_bytes = row_group_bytes
        self._target = target_shard_bytes
        self.shards: list[ShardCut] = []
        self._rows_seen = 0
        self._cur_rg_rows = 0      # rows in the open row group
        self._cur_rg_bytes = 0
        self._cur_shard = ShardCut(0, 0)
        self._cur_shard_bytes = 0

    def feed(self, sizes: np.ndarray) -> None:
        """Add the sizes of the next rows of the stream."""
        sizes = np.asarray(sizes, dtype=np.int64)
        i, n = 0, len(sizes)
        csum = np.cumsum(sizes)
        while i < n:
            base = csum[i - 1] if i else 0
            # How many more rows fit the open row group before it must close.
            take = n - i
            if self._rg_rows is not None:
                take = min(take, self._rg_rows - self._cur_rg_rows)
            closes = self._rg_rows is not None and take == self._rg_rows - self._cur_rg_rows
            if self._rg_bytes is not None:
                need = self._rg_bytes - self._cur_rg_bytes
                # first row j (relative) where the group's bytes reach the limit
                j = int(np.searchsorted(csum[i:], base + need, side="left"))
                if j < take:
                    take, closes = j + 1, True
            added = int(csum[i + take - 1] - base)
            self._cur_rg_rows += take
            self._cur_rg_bytes += added
            self._rows_seen += take
            i += take
            if closes:
                self._close_row_group()

    def _close_row_group(self) -> None:
        self._cur_shard.row_group_rows.append(self._cur_rg_rows)
        self._cur_shard_bytes += self._cur_rg_bytes
        self._cur_rg_rows = 0
        self._cur_rg_bytes = 0
        if self._cur_shard_bytes >= self._target:
            self._close_shard()

    def _close_shard(self) -> None:
        self.shards.append(self._cur_shard)
        self._cur_shard = ShardCut(len(self.shards), self._rows_seen)
        self._cur_shard_bytes = 0

    def finish(self) -> list[ShardCut]:
        """Close the open row group and shard; return every shard cut."""
        if self._cur_rg_rows:
            self._close_row_group()
        if self._cur_shard.row_group_rows:
            self._close_shard()
        return self.shards
