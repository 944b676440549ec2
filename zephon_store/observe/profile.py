"""``torch.profiler.record_function`` ranges, when torch is already imported and a profiler
is recording: a profile then shows "zephon: waiting for step S" around each ``next()``, and
"zephon: row group R of shard S (fetch)" around a fetch. Without torch (``import
zephon_store`` never imports it) or without a profiler running, a range is a no-op.
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["named_range", "recording", "step_range"]

_NULL = contextlib.nullcontext()


_enabled = None   # torch.autograd._profiler_enabled, once torch is imported


def recording():
    """``torch.profiler.record_function`` while a torch profiler records, else None."""
    global _enabled
    if _enabled is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        _enabled = getattr(getattr(torch, "autograd", None), "_profiler_enabled", None)
        if _enabled is None:
            return None
    return sys.modules["torch"].profiler.record_function if _enabled() else None


def named_range(name: str):
    """A ``record_function(name)`` while a torch profiler records, else a no-op context."""
    record = recording()
    return _NULL if record is None else record(name)


def step_range(step: int):
    """The range around the loop's wait for global step ``step``."""
    record = recording()
    return _NULL if record is None else record(f"zephon: waiting for step {step}")
