"""The order layer: which sample sits at each stream position, and who reads it.

A pure function of ``(row-group sizes, OrderOptions, position)``; nothing here depends on
world size, and nothing holds state (DESIGN section 1).

- :mod:`.order`: :class:`OrderOptions` and :class:`Order` (position -> sample id), with the
  keyed permutation :func:`permute`;
- :mod:`.topology`: :class:`Topology`, who reads (global batch, world size, rank);
- :mod:`.assign`: (cursor, global batch, world size, rank) -> positions of a rank's share;
- :mod:`.mixture`: :class:`MixtureSchedule`, mixture position -> (source, index in that
  source's own stream), with stages and caps.
"""

from .mixture import MIXTURE_ALGORITHM, MixtureSchedule
from .order import ORDER_ALGORITHM, Order, OrderOptions, derive_key, permute, shuffle_quality
from .topology import Topology

__all__ = ["MIXTURE_ALGORITHM", "MixtureSchedule", "ORDER_ALGORITHM", "Order", "OrderOptions",
           "Topology", "derive_key", "permute", "shuffle_quality"]
