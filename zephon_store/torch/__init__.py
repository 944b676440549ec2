"""PyTorch loading: one cursor, any world size, any number of workers.

>>> import os, torch
>>> from zephon_store import StopOptions, Topology
>>> from zephon_store.torch import ZephonLoader
>>> loader = ZephonLoader(tiny_dataset, topology=Topology(8), seed=7,
...                       stop=StopOptions(max_steps=2))   # a URL works too: "s3://b/ds"
>>> [batch["id"].shape for batch in loader]
[torch.Size([8]), torch.Size([8])]
>>> sorted(loader.state_dict())
['cursor', 'dataset_id', 'order', 'seed', 'step', 'version']
>>> torch.save(loader.state_dict(), os.path.join(tmp, "ckpt.pt"))

Needs the ``torch`` extra; the rest of zephon_store works without it.
"""

from __future__ import annotations

from ..errors import require

require("torch", "torch")

from ..load.state import STATE_VERSION, LoaderState, check_state  # noqa: E402
from .dataset import ZephonIterableDataset  # noqa: E402
from .live import LiveZephonLoader, ReplicaOptions  # noqa: E402
from .loader import TorchProcesses, ZephonLoader, to_torch  # noqa: E402

__all__ = ["ZephonLoader", "ZephonIterableDataset", "LiveZephonLoader", "LoaderState",
           "ReplicaOptions", "STATE_VERSION", "TorchProcesses", "check_state", "to_torch"]
