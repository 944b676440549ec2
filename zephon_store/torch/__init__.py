"""PyTorch loading: one cursor, any world size, any number of workers.

>>> from zephon_store.torch import ZephonLoader                         # doctest: +SKIP
>>> loader = ZephonLoader("s3://b/ds", global_batch=256, seed=7)         # doctest: +SKIP
>>> for batch in loader: ...                                             # doctest: +SKIP
>>> torch.save(loader.state_dict(), "ckpt.pt")  # {version, dataset_id, seed, order, cursor}  # doctest: +SKIP

Needs the ``torch`` extra; the rest of zephon_store works without it.
"""

from __future__ import annotations

from ..errors import require

require("torch", "torch")

from ..load.state import STATE_VERSION, LoaderState, check_state  # noqa: E402
from .dataset import ZephonIterableDataset  # noqa: E402
from .loader import ZephonLoader  # noqa: E402

__all__ = ["ZephonLoader", "ZephonIterableDataset", "LoaderState", "check_state",
           "STATE_VERSION"]
