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

import dataclasses
import os
import warnings
from collections.abc import Iterator

import numpy as np
import torch

from ..load.loader import Loader
from ..load.options import (
    BatchOptions,
    ReadAheadOptions,
    SourceOptions,
    StopOptions,
    WorkerOptions,
    as_numpy,
    grouped,
)
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

    >>> loader = ZephonLoader(tiny_dataset, topology=Topology(8), order=OrderOptions(seed=7),
    ...                       stop=StopOptions(max_steps=1))   # or "s3://bucket/ds"
    >>> [batch["id"].tolist() for batch in loader]
    [[79, 41, 78, 45, 68, 97, 30, 33]]
    >>> sd = loader.state_dict()
    >>> sd["cursor"], sd["seed"]
    (8, 7)
    >>> resumed = ZephonLoader(tiny_dataset, topology=Topology(8, world_size=2, rank=1),
    ...                        seed=7, stop=StopOptions(max_steps=1))
    >>> resumed.load_state_dict(sd)   # step 1, now on two ranks: rank 1 reads its half
    >>> [batch["id"].tolist() for batch in resumed]
    [[43, 40, 0, 3]]

    ``dataset``: a URL, a :class:`~zephon_store.read.dataset.Dataset`, or a mixture (a mixture
    file ``.toml``/``.json``, its dict, a ``MixtureSpec`` or a
    :class:`~zephon_store.mix.mixed.MixedDataset`; docs/mixtures.md): batches then hold
    rows of every source, ``with_seq`` adds ``_source`` and ``_seq`` is the id in that
    source, and the state carries the sources and the stage schedule (version 2).

    Who reads: ``global_batch`` samples per step over all ranks, the world size and this
    rank from torch.distributed or the torchrun environment, and torchrun's
    ``LOCAL_WORLD_SIZE`` ranks per node (else 1); or ``topology`` (a
    :class:`~zephon_store.order.Topology`: all four given, ``world_size`` dividing the
    global batch). Consecutive ranks form a node, for the node-aware rank rule and
    ``lanes="auto"`` (docs/order.md, "Locality at scale"). ``seed``/``order``: the order.

    The rest come in option groups (:mod:`zephon_store.load.options`), one spelling each:

    - ``source=SourceOptions(...)``: ``storage_options`` of a remote dataset, its disk
      ``cache``, the node's ``decoded_cache`` (decoded row groups kept for later epochs and
      the node's other ranks, docs/loader.md, "Decoded cache") and ``expect_dataset_id``
      (``"xxh3:..."``: any other dataset is a ManifestError);
    - ``batch=BatchOptions(...)``: ``columns``; ``with_seq`` adds ``_seq`` (int64 global
      sample ids); ``transform`` maps a decoded batch dict (in the workers); ``collate``
      turns each batch into what the loop takes (default: numpy arrays to tensors,
      :func:`to_torch`; ``as_numpy`` keeps them numpy);
    - ``read_ahead=ReadAheadOptions(...)``: ``prefetch_bytes`` of a remote dataset fetched
      ahead into the disk cache, ``decode_ahead_bytes`` of decoded row groups held ahead
      (default: two working sets of the order, 16 MiB to 1 GiB; see
      :mod:`zephon_store.load.pipeline`), ``coalesce``
      (:class:`~zephon_store.io.coalesce.CoalesceOptions`: neighbouring row groups merged
      into ranged GETs, up to 8 MiB a range; docs/storage.md);
    - ``stop=StopOptions(...)``: ``max_steps``/``epochs`` bound the stream (default
      endless; ``epochs`` may be fractional, the run ends at position
      ``int(epochs * num_samples)``; a mixture whose capped source runs out, exhaustion
      "error", ends it there too); ``drop_last`` (default True) drops the positions of that
      end that do not fill a global batch (logged once), False reads them in a short last
      step split as evenly as they go among the ranks, the cursor ending exactly at the end;
    - ``workers=WorkerOptions(...)``: ``num_workers`` process workers (a torch
      ``DataLoader``, :class:`TorchProcesses`; 0: threads in this process), ``prefetch``
      batches made ahead (by the workers, or by a thread when there is a ``transform``),
      ``multiprocessing_context``, ``pin_memory``.

    ``run_log`` (a local path) makes rank 0 append one JSON line per segment of the run (at
    its first batch after a start or resume) for ``zephon trace``/``where``/``audit``;
    ``deny_list`` (a file or a :class:`~zephon_store.load.denylist.DenyList`) keeps those
    samples' positions but blanks their rows before ``transform`` and ``collate`` see them,
    and flags them in ``_masked`` (docs/audit.md, "Takedowns").

    The flat keywords of before the groups (``world_size=``, ``rank=``,
    ``ranks_per_node=``, ``num_workers=``, ``columns=``, ``max_steps=``, ``cache=``...)
    still work for one release, each with a ``DeprecationWarning`` naming its group; a
    group and one of its own keywords together are refused (TypeError).
    """

    def __init__(self, dataset: str | Dataset | Source, *, global_batch: int | None = None,
                 topology: Topology | None = None, seed: int | None = None,
                 order: OrderOptions | None = None, source: SourceOptions | None = None,
                 batch: BatchOptions | None = None, read_ahead: ReadAheadOptions | None = None,
                 stop: StopOptions | None = None, workers: WorkerOptions | None = None,
                 run_log: str | None = None, deny_list=None, **deprecated) -> None:
        topology = torch_topology("ZephonLoader", global_batch, topology, deprecated)
        if deprecated.get("collate", to_torch) is None:
            deprecated["collate"] = as_numpy   # the flat spelling's None: numpy batches
        groups = grouped("ZephonLoader", {"source": source, "batch": batch,
                                          "read_ahead": read_ahead, "stop": stop,
                                          "workers": workers}, deprecated)
        batch = groups["batch"]
        if batch.collate is None:
            batch = dataclasses.replace(batch, collate=to_torch)
        super().__init__(dataset, topology=topology, seed=seed, order=order,
                         source=groups["source"], batch=batch,
                         read_ahead=groups["read_ahead"], stop=groups["stop"],
                         workers=TorchProcesses(groups["workers"]), run_log=run_log,
                         deny_list=deny_list)


def torch_topology(front: str, global_batch: int | None, topology: Topology | None,
                   flat: dict) -> Topology:
    """Who reads, for a torch front end: ``topology`` as given, or ``global_batch`` with
    the world size and rank from torch.distributed (or torchrun's environment) and its
    ranks per node; the flat ``world_size``/``rank``/``ranks_per_node`` (taken out of
    ``flat``) still work and warn."""
    given = {k: flat.pop(k) for k in ("world_size", "rank", "ranks_per_node") if k in flat}
    if given:
        spelled = ", ".join(f"{k}=..." for k in given)
        warnings.warn(f"{front}({spelled}) is deprecated: pass topology=Topology(global_batch, "
                      f"{spelled}); the flat keywords go in the next release",
                      DeprecationWarning, stacklevel=3)
    if topology is not None:
        if global_batch is not None or given:
            raise TypeError(f"{front}: topology= and global_batch= both say who reads: pass "
                            "topology=Topology(global_batch, world_size, rank) alone")
        return topology
    if global_batch is None:
        raise TypeError(f"{front} needs global_batch= (world size and rank from "
                        "torch.distributed or torchrun) or topology=Topology(...)")
    ws, rk = detect_topology()
    ws = given.get("world_size", ws)
    rpn = given.get("ranks_per_node")
    return Topology(global_batch, ws, given.get("rank", rk),
                    ranks_per_node=detect_ranks_per_node(ws) if rpn is None else rpn)


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
