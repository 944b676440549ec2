"""``torch.profiler.record_function`` ranges, when torch is already imported and a profiler
is recording: a profile then shows "zephon: waiting for step S" around each ``next()``, and
"zephon: row group R of shard S (fetch)" around a fetch. Without torch (``import
zephon_store`` never imports it) or without a profiler running, a range is a no-op.
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["named_range", "step_range"]

_NULL = contextlib.nullcontext()


def _recording():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    autograd = getattr(torch, "autograd", None)
    profiler = getattr(autograd, "profiler", None) if autograd is not None else None
    enabled = getattr(torch.autograd, "_profiler_enabled", None) if profiler else None
    if enabled is None or not enabled():
        return None
    return torch.profiler.record_function


def named_range(name: str):
    """A ``record_function(name)`` while a torch profiler records, else a no-op context."""
    record = _recording()
    return _NULL if record is None else record(name)


def step_range(step: int):
    """The range around the loop's wait for global step ``step``."""
    record = _recording()
    return _NULL if record is None else record(f"zephon: waiting for step {step}")
