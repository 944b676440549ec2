"""Zephon for Grain (``pip install 'zephon_store[grain]'``; docs/grain.md).

- :class:`ZephonSource`: a dataset or mixture as Grain's random-access data source
  (``__len__``, ``__getitem__``, batched ``_getitems``), for any ``grain.MapDataset`` or
  ``grain.DataLoader`` pipeline; every byte verified.
- :class:`ZephonIterDataset`: Zephon's order and rank rule as a ``grain.IterDataset`` whose
  iterator's state is Zephon's one cursor, so a pipeline resumes exactly on another number
  of hosts or worker processes.

Neither imports jax or torch; ``import zephon_store`` does not import this package.
"""

from ..errors import require

require("grain", "grain")

from .iter_dataset import ZephonDatasetIterator, ZephonIterDataset  # noqa: E402
from .source import ZephonSource  # noqa: E402

__all__ = ["ZephonDatasetIterator", "ZephonIterDataset", "ZephonSource"]
