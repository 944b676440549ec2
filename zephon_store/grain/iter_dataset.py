"""Zephon's order and rank rule as a Grain ``IterDataset`` whose state is the one cursor.

:class:`ZephonIterDataset` yields this host's batches (dicts of numpy arrays) in the global,
elastic order: step ``s`` after the cursor is global positions ``[c + s*B, c + (s+1)*B)``
and this host reads its share of them by Zephon's rank rule. Its iterator's ``get_state()``
is the loader's checkpoint, ``{version, dataset_id, seed, order, cursor, step}`` (a mixture
adds its sources and stage schedule): identical on every host, JSON as it is, so Grain's
checkpointing (``DatasetIterator.save``, Orbax) stores it unchanged, and ``set_state`` of it
resumes on any number of hosts (another ``world_size``/``rank``) or of worker processes.

It is a shell over :class:`~zephon_store.load.loader.Loader`: cursor, resume rules, run log,
deny list and the end of the stream are the loader's; this adds only Grain's iterator
protocol and Grain's process workers (:mod:`.workers`). Grain transformations chained after
it (``map``, ``filter``, ``batch``...) keep its state, so a whole pipeline's
``get_state()`` is still the one cursor.

>>> ds = ZephonIterDataset(tiny_dataset, topology=Topology(8), seed=7,
...                        stop=StopOptions(max_steps=2))
>>> it = iter(ds.map(lambda b: b["id"].tolist()))
>>> next(it), it.get_state()["cursor"]
([79, 41, 78, 45, 68, 97, 30, 33], 8)
>>> other = iter(ZephonIterDataset(tiny_dataset, topology=Topology(8, world_size=2, rank=1),
...                                seed=7, stop=StopOptions(max_steps=2)))
>>> other.set_state(it.get_state())     # step 1 on two hosts: host 1 reads its half
>>> next(other)["id"].tolist()
[43, 40, 0, 3]
"""

from __future__ import annotations

from collections.abc import Iterator

import grain

from ..load.loader import Loader
from ..load.options import (
    FLAT,
    BatchOptions,
    ReadAheadOptions,
    SourceOptions,
    StopOptions,
    WorkerOptions,
    grouped,
)
from ..load.share_reader import ShareReader
from ..load.workers import ProcessWorkers
from ..order.order import OrderOptions
from ..order.topology import Topology
from .workers import worker_batches

__all__ = ["GrainProcesses", "ZephonDatasetIterator", "ZephonIterDataset"]

# The flat keywords of how the data is opened, taken before SourceOptions (each now warns).
_SOURCE_FLAT = frozenset(k for k, group in FLAT.items() if group == "source")


class GrainProcesses(ProcessWorkers):
    """The workers part of :class:`ZephonIterDataset` (:mod:`zephon_store.load.workers`):
    with ``num_workers > 0``, Grain's process workers, each making its share of the batches
    by Zephon's worker rule (:mod:`.workers`); with none, threads."""

    def processes(self, reader: ShareReader) -> Iterator[tuple[int, dict]]:
        return worker_batches(reader, self.options)


class ZephonIterDataset(grain.IterDataset):
    """This host's batches of a dataset or mixture in Zephon's order (see the module
    docstring).

    ``dataset``: a URL, a ``Dataset``, or a mixture (file, dict, ``MixtureSpec``,
    ``MixedDataset``); ``topology``: the global batch and which host this is
    (``Topology(global_batch, world_size=jax.process_count(), rank=jax.process_index())``
    under JAX); ``seed``/``order``: the order; ``batch``, ``read_ahead``, ``stop``: the
    loader's option groups (:mod:`zephon_store.load.options`: columns, ``with_seq``, a
    ``transform`` run in the workers; prefetch budgets; ``max_steps``/``epochs``);
    ``source``: how the data is opened (:class:`~zephon_store.load.options.SourceOptions`);
    ``workers``: ``WorkerOptions(num_workers=n, prefetch=k)`` makes batches in ``n`` Grain
    worker processes (spawned: a ``transform`` must pickle), ``k`` ahead each; the others
    as :class:`~zephon_store.load.loader.Loader` takes them.

    Put process workers here, not in a ``.mp_prefetch()`` after it: Grain's prefetch would
    keep one state per worker, which resumes only on the same worker count.
    """

    def __init__(self, dataset, *, topology: Topology, seed: int | None = None,
                 order: OrderOptions | None = None, batch: BatchOptions | None = None,
                 read_ahead: ReadAheadOptions | None = None, stop: StopOptions | None = None,
                 workers: WorkerOptions | None = None, source: SourceOptions | None = None,
                 run_log: str | None = None, deny_list=None, observe=None,
                 **deprecated) -> None:
        super().__init__()
        source = grouped("ZephonIterDataset", {"source": source}, deprecated,
                         allowed=_SOURCE_FLAT)["source"]
        workers = workers or WorkerOptions()
        if workers.multiprocessing_context is not None or workers.pin_memory:
            raise ValueError("WorkerOptions.multiprocessing_context and pin_memory are torch "
                             "DataLoader options; Grain's workers are spawned processes: "
                             "pass num_workers and prefetch only")
        self._options: dict = dict(
            topology=topology, seed=seed, order=order, batch=batch, read_ahead=read_ahead,
            stop=stop, workers=GrainProcesses(workers), source=source, run_log=run_log,
            deny_list=deny_list, observe=observe)
        self._dataset = dataset
        # Opened now, so a wrong URL, option or mixture fails here and not at the first
        # batch; each iterator starts from this loader's options.
        self._first: Loader | None = self._loader()

    def _loader(self) -> Loader:
        return Loader(self._dataset, **self._options)

    @property
    def topology(self) -> Topology:
        """Who reads: the global batch, the number of hosts and this host's rank."""
        return self._options["topology"]

    def __iter__(self) -> ZephonDatasetIterator:
        loader, self._first = self._first, None
        return ZephonDatasetIterator(loader if loader is not None else self._loader())

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Refused: Grain's ``mp_prefetch`` slices its parent among workers, and then keeps
        one state per worker (resumable only on that worker count)."""
        raise ValueError("zephon_store.grain.ZephonIterDataset makes its batches in worker "
                         "processes itself: pass workers=WorkerOptions(num_workers=n) instead "
                         "of .mp_prefetch(), so its state stays the one cursor")

    def __str__(self) -> str:
        t = self.topology
        return (f"ZephonIterDataset(global_batch={t.global_batch}, world_size={t.world_size}, "
                f"rank={t.rank})")


class ZephonDatasetIterator(grain.DatasetIterator):
    """The iterator of :class:`ZephonIterDataset`: ``get_state()`` is the loader's state
    (the one cursor), ``set_state(state)`` resumes from one, applied at the next batch."""

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        self._loader = loader
        self._batches: Iterator | None = None

    @property
    def loader(self) -> Loader:
        """The :class:`~zephon_store.load.loader.Loader` this iterator runs."""
        return self._loader

    def __next__(self) -> dict:
        if self._batches is None:
            self._batches = iter(self._loader)
        return next(self._batches)

    def stats(self) -> dict[str, float]:
        """The loader's account (:meth:`~zephon_store.load.loader.Loader.stats`): the wait
        in ``next()`` by cause and this host's counters."""
        return self._loader.stats()

    def get_state(self) -> dict:
        """``{version, dataset_id, seed, order, cursor, step}`` (+ ``mixture``): the same on
        every host; the cursor counts the samples of batches already handed out."""
        return self._loader.state_dict()

    def set_state(self, state: dict) -> None:
        """Resume from ``state`` (saved by any number of hosts or workers); a wrong one
        raises :class:`~zephon_store.errors.StateMismatchError` naming the key."""
        self._loader.load_state_dict(state)
        self._batches = None   # the loader closed the old one: the next batch starts anew

    def close(self) -> None:
        """Stop making batches (worker processes, decode threads)."""
        batches, self._batches = self._batches, None
        if batches is not None:
            batches.close()
        super().close()

    def __str__(self) -> str:
        return f"ZephonDatasetIterator(cursor={self._loader.cursor})"

