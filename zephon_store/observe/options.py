"""What a loader records about its steps beyond the always-on account.

>>> ObserveOptions(step_log="runs/steps-{rank}.jsonl").step_log_path(3)
'runs/steps-3.jsonl'
>>> ObserveOptions(stall_horizon=-1)
Traceback (most recent call last):
...
ValueError: stall_horizon must be >= 0 (0: no stall warning), got -1
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ObserveOptions", "STEP_LOG_ENV"]

# Where every rank's step log goes when no option names one (TorchTitan's config too).
STEP_LOG_ENV = "ZEPHON_STEP_LOG"


@dataclass(frozen=True)
class ObserveOptions:
    """``step_log``: a JSONL file each rank appends a compact line to every 50 steps (each
    step's wait and its causes, in ms), read by ``zephon stats``; ``{rank}`` in it is
    replaced by the rank (without it, only rank 0 writes). None: ``$ZEPHON_STEP_LOG``, else
    no step log. ``stall_horizon``: steps ahead the stall forecast looks (0: no warning).
    """

    step_log: str | None = None
    stall_horizon: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.stall_horizon, int) or self.stall_horizon < 0:
            raise ValueError(f"stall_horizon must be >= 0 (0: no stall warning), got "
                             f"{self.stall_horizon!r}")

    def step_log_path(self, rank: int) -> str | None:
        """The step log rank ``rank`` writes, or None."""
        path = self.step_log or os.environ.get(STEP_LOG_ENV) or None
        if path is None:
            return None
        if "{rank}" in path:
            return path.replace("{rank}", str(rank))
        return path if rank == 0 else None
