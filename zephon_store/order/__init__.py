"""The order layer: which sample sits at each stream position, and who reads it.

A pure function of ``(row-group sizes, OrderOptions, position)``; nothing here depends on
world size, and nothing holds state (DESIGN section 1).

- :mod:`.order`: :class:`OrderOptions` and :class:`Order` (position -> sample id), with the
  keyed permutation :func:`permute`;
- :mod:`.topology`: :class:`Topology`, who reads (global batch, world size, rank);
- :mod:`.assign`: (cursor, global batch, participants, index) -> positions of a share: the
  one rank rule (node-aware, any participant count);
- :mod:`.mixture`: :class:`MixtureSchedule`, mixture position -> (source, index in that
  source's own stream), with stages and caps.
"""

from .mixture import MIXTURE_ALGORITHM, MixtureSchedule
from .order import (
    AUTO_LANES,
    ORDER_ALGORITHM,
    Order,
    OrderOptions,
    auto_lanes,
    derive_key,
    permute,
    shuffle_quality,
)
from .topology import Topology

__all__ = ["AUTO_LANES", "MIXTURE_ALGORITHM", "MixtureSchedule", "ORDER_ALGORITHM", "Order",
           "OrderOptions", "Topology", "auto_lanes", "derive_key", "permute", "shuffle_quality"]
