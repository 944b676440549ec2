"""Who reads: ``world_size`` ranks sharing a global batch, this process being ``rank``.

The one topology type of the package: the loader, the rank stream, the plan simulator, the
TorchTitan integration and :mod:`.assign`'s argument checks all validate through it. It
decides only *which rank reads which position*, never *which sample sits there*.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Topology"]


@dataclass(frozen=True)
class Topology:
    """``global_batch`` positions per step over ``world_size`` ranks; this one is ``rank``.

    ``ranks_per_node`` groups consecutive ranks into nodes (rank ``r`` is on node
    ``r // ranks_per_node``, as torchrun numbers them): the rank rule gives each node its
    own lanes (:mod:`.assign`), and the plan simulator reports figures per node.

    >>> Topology(global_batch=96, world_size=3, rank=2).local_batch
    32
    >>> Topology(global_batch=10, world_size=4)
    Traceback (most recent call last):
    ...
    ValueError: world_size must divide global_batch: global_batch=10 is not a multiple of world_size=4; pick a global batch that is
    """

    global_batch: int
    world_size: int = 1
    rank: int = 0
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        if self.global_batch <= 0:
            raise ValueError(f"global_batch must be > 0, got {self.global_batch}")
        if self.world_size <= 0:
            raise ValueError(f"world_size must be > 0, got {self.world_size}")
        if self.global_batch % self.world_size:
            raise ValueError(
                f"world_size must divide global_batch: global_batch={self.global_batch} is not a"
                f" multiple of world_size={self.world_size}; pick a global batch that is")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.ranks_per_node <= 0:
            raise ValueError(f"ranks_per_node must be > 0, got {self.ranks_per_node}")

    @property
    def local_batch(self) -> int:
        """Positions each rank reads per full step."""
        return self.global_batch // self.world_size

    @property
    def num_nodes(self) -> int:
        """Nodes the ranks occupy (the last one may hold fewer than ``ranks_per_node``)."""
        return -(-self.world_size // self.ranks_per_node)
