"""``ZephonLoader``: batches for this rank as tensors, and a one-cursor checkpoint.

The run (source, order, cursor and step, checkpoint, run log, deny list, end of the
stream) is :class:`~zephon_store.load.loader.Loader`'s, without torch; this shell adds the
topology torch.distributed knows, the tensor collation and process workers. Two ways to make batches, with the identical sequence:

- ``num_workers=0`` (default): a small pool of threads decodes the row groups of the
  coming steps ahead (pyarrow decodes without the GIL; :mod:`zephon_store.load.pipeline`), and
  each batch is cut from them when the loop asks for it. With a ``transform``, one more
  thread runs it ``prefetch`` batches ahead of the loop. On small CPU hosts this beats
  process workers, which pay an IPC copy per batch.
- ``num_workers>0``: a torch ``DataLoader`` with process workers over
  :class:`ZephonIterableDataset`.

The cursor advances by ``global_batch`` each time a batch is handed to the training loop,
so it counts consumed samples, never prefetched ones.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import torch

from ..io.coalesce import CoalesceOptions
from ..load.loader import Loader
from ..load.options import BatchOptions, ReadAheadOptions, StopOptions, WorkerOptions, option_group
from ..load.share_reader import ShareReader
from ..load.source import Source
from ..load.workers import ProcessWorkers
from ..order.order import OrderOptions
from ..order.topology import Topology
from ..read.dataset import Dataset
from .dataset import ZephonIterableDataset


def detect_topology() -> tuple[int, int]:
    """(world_size, rank) from torch.distributed when initialised, else the torchrun env."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))


def detect_ranks_per_node(world_size: int) -> int:
    """Ranks per node: torchrun's ``LOCAL_WORLD_SIZE`` (its ranks of a node are consecutive,
    ``rank = node_rank * local_world_size + local_rank``), else 1; at most ``world_size``.

    >>> detect_ranks_per_node(16) if "LOCAL_WORLD_SIZE" not in os.environ else 1
    1
    """
    return max(1, min(world_size, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def to_torch(batch: dict) -> dict:
    """numpy arrays -> tensors (zero-copy); lists and other values unchanged.

    Arrow buffers are read-only, so the tensors share read-only memory: torch warns about
    that once per call, which is silenced here. Writing into a batch tensor in place is not
    supported; copy it first.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                for k, v in batch.items()}


class ZephonLoader(Loader):
    """Iterate this rank's batches of a dataset in the global, elastic order.

    >>> loader = ZephonLoader(tiny_dataset, global_batch=8, order=OrderOptions(seed=7),
    ...                       world_size=1, rank=0, max_steps=1)   # or "s3://bucket/ds"
    >>> [batch["id"].tolist() for batch in loader]
    [[79, 41, 78, 45, 68, 97, 30, 33]]
    >>> sd = loader.state_dict()
    >>> sd["cursor"], sd["seed"]
    (8, 7)
    >>> resumed = ZephonLoader(tiny_dataset, global_batch=8, seed=7, world_size=2, rank=1,
    ...                        max_steps=1)
    >>> resumed.load_state_dict(sd)   # step 1, now on two ranks: rank 1 reads its half
    >>> [batch["id"].tolist() for batch in resumed]
    [[43, 40, 0, 3]]

    ``dataset``: a URL, a :class:`~zephon_store.read.dataset.Dataset`, or a mixture (a mixture
    file ``.toml``/``.json``, its dict, a ``MixtureSpec`` or a
    :class:`~zephon_store.load.mixed.MixedDataset`; docs/mixtures.md): batches then hold
    rows of every source, ``with_seq`` adds ``_source`` and ``_seq`` is the id in that
    source, and the state carries the sources and the stage schedule (version 2).

    Arguments: ``global_batch`` samples per step over all ranks (``world_size`` must divide
    it); ``world_size``/``rank`` default to torch.distributed or the torchrun environment;
    ``ranks_per_node`` (default torchrun's ``LOCAL_WORLD_SIZE``, else 1) groups consecutive
    ranks into nodes, for the node-aware rank rule and ``lanes="auto"`` (docs/order.md,
    "Locality at scale"); ``max_steps``/``epochs`` bound the stream (default endless; ``epochs`` may be
    fractional, the run ends at position ``int(epochs * num_samples)``; a mixture whose capped
    source runs out, exhaustion "error", ends it there too); ``drop_last``
    (default True) drops the positions of that end that do not fill a global batch (logged
    once as a warning), ``drop_last=False`` reads them in a short last step split as evenly
    as they go among the ranks (a rank may get an empty batch; every rank takes the same
    number of steps), and the cursor ends exactly at the end; ``expect_dataset_id``
    (``"xxh3:..."``) refuses any other dataset (ManifestError); ``columns`` selects columns;
    ``with_seq`` adds ``_seq`` (int64 global sample ids) to every batch; ``transform`` maps a
    decoded batch dict; ``collate`` replaces the numpy->tensor conversion; ``prefetch``
    batches are made ahead of the loop by process workers, or by a thread when there is a
    ``transform`` (without one a batch is cut from row groups decoded ahead, which is cheap);
    ``decode_ahead_bytes`` bounds the decoded row groups
    held ahead (default: two working sets of the order, 16 MiB to 1 GiB; see
    :mod:`zephon_store.load.pipeline`); ``prefetch_bytes`` bounds the bytes of a remote dataset
    fetched ahead into the disk cache; ``coalesce``
    (:class:`~zephon_store.io.coalesce.CoalesceOptions`) sets how neighbouring row groups are
    merged into ranged GETs (default: up to 8 MiB a range; ``docs/storage.md``);
    ``run_log`` (a local path) makes rank 0 append one JSON line per segment of the run (at
    its first batch after a start or resume) for ``zephon trace``/``where``/``audit``;
    ``deny_list`` (a file or a :class:`~zephon_store.load.denylist.DenyList`) keeps those
    samples' positions but blanks their rows before ``transform`` and ``collate`` see them,
    and flags them in ``_masked`` (docs/audit.md, "Takedowns"); ``decoded_cache`` (a
    :class:`~zephon_store.read.decoded_disk.DecodedDiskCache` or its folder, for a dataset
    given by URL or a mixture) keeps decoded row groups on the node for later epochs and the node's other
    ranks (docs/loader.md, "Decoded cache").

    The option groups of :mod:`zephon_store.load.options` may be given whole instead of their
    keywords (``batch=BatchOptions(columns=("tokens",))``, ``read_ahead=``, ``stop=``,
    ``workers=``); a group and one of its own keywords together are refused (TypeError).
    """

    def __init__(self, dataset: str | Dataset | Source, *, global_batch: int, seed: int | None = None,
                 order: OrderOptions | None = None, world_size: int | None = None,
                 rank: int | None = None, num_workers: int = 0, prefetch: int = 4,
                 columns: list[str] | None = None, with_seq: bool = False,
                 transform: Callable[[dict], dict] | None = None,
                 collate: Callable[[dict], object] | None = to_torch,
                 max_steps: int | None = None, epochs: float | None = None,
                 storage_options: dict | None = None, cache=None,
                 multiprocessing_context: str | None = None, pin_memory: bool = False,
                 prefetch_bytes: int = ReadAheadOptions.prefetch_bytes,
                 decode_ahead_bytes: int | None = None,
                 coalesce: CoalesceOptions | None = None, drop_last: bool = True,
                 expect_dataset_id: str | None = None, ranks_per_node: int | None = None,
                 run_log: str | None = None,
                 deny_list=None, decoded_cache=None, batch: BatchOptions | None = None,
                 read_ahead: ReadAheadOptions | None = None, stop: StopOptions | None = None,
                 workers: WorkerOptions | None = None) -> None:
        # The keywords travel on as named groups (load/options.py), validated there; a
        # group given whole replaces its keywords.
        workers = option_group("workers", workers, WorkerOptions, num_workers=num_workers,
                               prefetch=prefetch,
                               multiprocessing_context=multiprocessing_context,
                               pin_memory=pin_memory)
        stop = option_group("stop", stop, StopOptions, max_steps=max_steps, epochs=epochs,
                            drop_last=drop_last)
        batch = option_group("batch", batch, BatchOptions, columns=columns, with_seq=with_seq,
                             transform=transform)
        read_ahead = option_group("read_ahead", read_ahead, ReadAheadOptions,
                                  prefetch_bytes=prefetch_bytes,
                                  decode_ahead_bytes=decode_ahead_bytes, coalesce=coalesce)
        ws, rk = detect_topology()
        ws = ws if world_size is None else world_size
        topology = Topology(global_batch, ws, rk if rank is None else rank,
                            ranks_per_node=(detect_ranks_per_node(ws)
                                            if ranks_per_node is None else ranks_per_node))
        super().__init__(dataset, topology=topology, seed=seed, order=order, batch=batch,
                         read_ahead=read_ahead, stop=stop, workers=TorchProcesses(workers),
                         storage_options=storage_options, cache=cache,
                         decoded_cache=decoded_cache, expect_dataset_id=expect_dataset_id,
                         run_log=run_log, deny_list=deny_list, collate=collate)


class TorchProcesses(ProcessWorkers):
    """The workers part of :class:`ZephonLoader` (:mod:`zephon_store.load.workers`): with
    ``num_workers > 0``, a torch ``DataLoader`` whose process workers each make their share
    of the batches (:class:`ZephonIterableDataset`); with none, threads."""

    def processes(self, reader: ShareReader) -> Iterator[tuple[int, dict]]:
        from torch.utils.data import DataLoader

        w = self.options
        dl = DataLoader(ZephonIterableDataset.over(reader), batch_size=None,
                        num_workers=w.num_workers, prefetch_factor=w.prefetch,
                        pin_memory=w.pin_memory,
                        multiprocessing_context=w.multiprocessing_context, collate_fn=_identity,
                        worker_init_fn=ZephonIterableDataset.worker_init_fn)
        it = iter(dl)
        # Held from outside this generator while it runs: an iterator the caller drops in a
        # reference cycle is collected with everything in the cycle, and the collector may
        # finalize torch's queues before the torch iterator's own cleanup asks its workers
        # to stop, which then waits out a 5 s join per worker (a whole training step's
        # stall at a random later collection). Held here, the torch iterator stays whole
        # until this generator's own close (also run by the collector) stops its workers.
        _RUNNING.add(it)
        try:
            yield from it
        finally:
            _RUNNING.discard(it)
            stop = getattr(it, "_shutdown_workers", None)
            if stop is not None:
                stop()


# The torch DataLoader iterators of running loaders (see TorchProcesses.processes).
_RUNNING: set = set()


def _identity(x):
    return x
