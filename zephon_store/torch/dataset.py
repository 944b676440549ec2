"""An ``IterableDataset`` yielding one rank's batches from a start cursor: a shell over
:class:`~zephon_store.load.share_reader.ShareReader`.

Worker ``k`` of ``n`` makes local batches ``i`` with ``i % n == k``; torch's DataLoader
returns worker outputs round-robin, so the main process sees batches ``0, 1, 2, ...`` for
any ``num_workers``. Workers hold no state: everything follows from the start cursor.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import torch.utils.data

from .._util.parent_watch import exit_with_parent
from ..io.coalesce import CoalesceOptions
from ..load.options import BatchOptions, ReadAheadOptions
from ..load.share_reader import ShareReader
from ..order.order import OrderOptions
from ..order.topology import Topology


class ZephonIterableDataset(torch.utils.data.IterableDataset):
    """Yields ``(i, batch)``: the local batch index (from ``start_cursor``) and the batch.

    ``num_batches=None`` is an endless stream (epochs follow each other, each a fresh
    permutation). ``end``: no position at or past it is read; the step that would cross it
    is short (``drop_last=False`` of :class:`zephon_store.torch.ZephonLoader`, which
    usually drives this).
    """

    def __init__(self, dataset, *, order: OrderOptions, topology: Topology, start_cursor: int = 0,
                 num_batches: int | None = None, columns: list[str] | None = None,
                 with_seq: bool = False, transform: Callable[[dict], dict] | None = None,
                 prefetch_bytes: int = ReadAheadOptions.prefetch_bytes,
                 decode_ahead_bytes: int | None = None,
                 coalesce: CoalesceOptions | None = None, end: int | None = None) -> None:
        super().__init__()
        self.reader = ShareReader(
            dataset, order, topology,
            batch=BatchOptions(columns=columns, with_seq=with_seq, transform=transform),
            read_ahead=ReadAheadOptions(prefetch_bytes=prefetch_bytes,
                                        decode_ahead_bytes=decode_ahead_bytes,
                                        coalesce=coalesce),
            start_cursor=start_cursor, num_batches=num_batches, end=end)
        self.notes = False

    @classmethod
    def over(cls, reader: ShareReader) -> ZephonIterableDataset:
        """The dataset of a reader already built (the loader's)."""
        self = cls.__new__(cls)
        torch.utils.data.IterableDataset.__init__(self)
        self.reader = reader
        # The loader's own workers send their account of each batch with it
        # (observe/account.py); a DataLoader a user builds gets plain (i, batch).
        self.notes = True
        return self

    @staticmethod
    def worker_init_fn(worker_id: int = 0) -> None:
        """A DataLoader ``worker_init_fn`` for this dataset: the worker process ends within
        a second of its parent's death, whatever it is doing
        (:func:`~zephon_store._util.parent_watch.exit_with_parent`). ``__iter__`` starts the
        same watch; this starts it before the worker's first batch::

            DataLoader(ds, batch_size=None, num_workers=2,
                       worker_init_fn=ZephonIterableDataset.worker_init_fn)
        """
        exit_with_parent()

    def __iter__(self) -> Iterator[tuple[int, dict]]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            yield from self.reader.batches()
            return
        exit_with_parent()   # a killed rank's workers end too (_util/parent_watch.py)
        # A forked worker inherits the parent's Dataset, including its I/O thread pool
        # (whose threads did not survive the fork: reads would wait forever) and locks
        # a parent thread may have held. A copy goes through __getstate__/__setstate__
        # and gets fresh ones; the manifest is shared, not reloaded.
        self.reader.stream.dataset = copy.copy(self.reader.stream.dataset)
        yield from self.reader.batches(info.id, info.num_workers,
                                       notes=getattr(self, "notes", False))
