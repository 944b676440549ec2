"""What is read: the :class:`Source` contract, narrow, and the base class its defaults come from.

A *source* is data, nothing about a run: its identity, schema and size, a row-group table
(where each sample's row group is, ``row_group_of``), row-group reads and prefetch, the
datasets it reads (``parts``), each sample id split into (source index, own id), and
``close``. :class:`~zephon_store.read.dataset.Dataset` satisfies it, and so does a mixture
(:class:`~zephon_store.mix.mixed.MixedDataset`): the sources' row groups concatenated. How a
run reads a source (its order, seed rule, lanes, working set, end, checkpoint entry and
resume) is a *plan* over it (:mod:`zephon_store.load.plan`); this layer knows no ranks.

>>> from zephon_store import open_dataset
>>> ds = open_dataset(tiny_dataset)
>>> isinstance(ds, Source), ds.num_samples, ds.row_group_of([0, 15, 99]).tolist()
(True, 100, [0, 1, 9])
>>> src, own = ds.split_ids([3, 1])
>>> src.tolist(), own.tolist()
([0, 0], [3, 1])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

__all__ = ["RowGroupTable", "Source", "SourceBase"]


@runtime_checkable
class RowGroupTable(Protocol):
    """A source's row groups as the loader plans reads from them: rows per row group
    (``rg_rows``), the first sample id of each (``rg_row_start``), stored bytes
    (``rg_length``; a format-v4 manifest fetches them in chunks on first index), the shard of
    each (``rg_shard``), their counts, and ``row_group_of(ids)``. A dataset's is its
    :class:`~zephon_store.format.manifest.Manifest`."""

    rg_rows: np.ndarray
    rg_row_start: np.ndarray
    rg_length: Any
    rg_shard: np.ndarray
    num_row_groups: int
    num_samples: int
    stored_row_group_bytes: int

    def row_group_of(self, ids) -> np.ndarray:
        """The row group holding each sample id."""


@runtime_checkable
class Source(Protocol):
    """What is read (see the module docstring). Ten members; the conveniences the reader
    also uses (``local``, ``cache``, ``decoded_row_group_bytes``, ``row_group_of``) come
    from :class:`SourceBase`, computed from these."""

    url: str

    @property
    def dataset_id(self) -> str: ...
    @property
    def schema(self) -> pa.Schema: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def row_group_table(self) -> RowGroupTable: ...

    def read_row_group(self, rg: int, *, keep: bool = True) -> pa.Table:
        """Row group ``rg`` decoded (``keep``: held in the decoded LRU)."""
    def prefetcher(self, step_row_groups: Callable[[int], Iterable[int]], *,
                   budget_bytes: int, num_batches: int | None = None, coalesce=None,
                   threads: int = 4) -> Any:
        """Fetches each step's row groups ahead into the disk cache (``consumed``, ``close``)."""
    def parts(self) -> list[tuple[str, Any]]:
        """``[(name, Dataset)]`` of every dataset read (a mixture's sources, in its order)."""
    def split_ids(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """Sample ids -> (source index, each source's own id); one dataset is source 0."""
    def close(self) -> None: ...


class SourceBase:
    """Defaults of a :class:`Source`, from its members: what the reader asks besides them."""

    def row_group_of(self, ids) -> np.ndarray:
        """The row group holding each sample id (``row_group_table.row_group_of``)."""
        return self.row_group_table.row_group_of(ids)

    @property
    def local(self) -> bool:
        """Whether every byte is read from a local path (decode threads: the cores)."""
        return all(d.storage.local for _, d in self.parts())

    @property
    def cache(self):
        """The disk cache remote bytes go through (a remote part's; None when every part is
        local: nothing to prefetch)."""
        return next((d.cache for _, d in self.parts() if d.cache is not None), None)

    def decoded_row_group_bytes(self) -> float:
        """Estimated decoded size of one row group (the decode-ahead budget's unit): 4x the
        mean stored bytes of the row groups (zstd's typical ratio)."""
        t = self.row_group_table
        return 4.0 * t.stored_row_group_bytes / t.num_row_groups if t.num_row_groups else 0.0

    def __len__(self) -> int:
        return self.num_samples

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
