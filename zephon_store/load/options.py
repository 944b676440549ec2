"""The loader's options in named groups (STYLE 15), each frozen and validated on creation.

``ZephonLoader(...)``'s keywords build them; the engine and the torch shells pass the groups
on instead of copying twenty keyword arguments through each signature.

- :class:`BatchOptions`: what a batch holds (columns, ``_seq``, a transform);
- :class:`ReadAheadOptions`: how far ahead bytes are fetched and row groups decoded;
- :class:`StopOptions`: where a run ends (``max_steps``, ``epochs``, ``drop_last``);
- :class:`WorkerOptions`: process workers of a torch ``DataLoader``.

Who reads (:class:`~zephon_store.order.Topology`) and in which order
(:class:`~zephon_store.order.OrderOptions`) are the order layer's.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..io.coalesce import CoalesceOptions
from ..io.prefetch import DEFAULT_PREFETCH_BYTES
from .state import MAX_CURSOR

__all__ = ["BatchOptions", "ReadAheadOptions", "StopOptions", "WorkerOptions", "option_group"]


@dataclass(frozen=True)
class BatchOptions:
    """What each batch holds: ``columns`` (None: all), ``with_seq`` adds ``_seq`` (int64
    global sample ids), ``transform`` maps the decoded batch dict, ``deny_list`` (a
    :class:`~zephon_store.load.denylist.DenyList`) blanks the denied rows before the
    transform and adds ``_masked`` (bool per sample)."""

    columns: tuple[str, ...] | None = None            # the columns read (None: all)
    with_seq: bool = False                            # add _seq (and a mixture's _source)
    transform: Callable[[dict], dict] | None = None   # maps each decoded batch dict
    deny_list: Any = None                             # a DenyList: its rows blanked, _masked

    def __post_init__(self) -> None:
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))

    def with_deny_list(self, deny_list) -> BatchOptions:
        """A copy that masks ``deny_list``'s samples."""
        return dataclasses.replace(self, deny_list=deny_list)


@dataclass(frozen=True)
class ReadAheadOptions:
    """``prefetch_bytes`` of a remote dataset fetched ahead into the disk cache, in ranged
    GETs merged by ``coalesce`` (None: the default CoalesceOptions); ``decode_ahead_bytes``
    of decoded row groups held ahead (None: two working sets of the order, see
    :mod:`zephon_store.load.pipeline`)."""

    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES   # remote bytes fetched ahead to the disk cache
    decode_ahead_bytes: int | None = None          # decoded row groups held ahead (None: auto)
    coalesce: CoalesceOptions | None = None        # how row groups merge into ranged GETs

    def __post_init__(self) -> None:
        if self.coalesce is not None and not isinstance(self.coalesce, CoalesceOptions):
            raise TypeError(f"coalesce must be a CoalesceOptions, got {self.coalesce!r}")


@dataclass(frozen=True)
class StopOptions:
    """Where a run ends: after ``max_steps`` steps from where it starts, or at position
    ``int(epochs * num_samples)``; None for both: endless. ``drop_last`` drops the positions
    of that end which do not fill a global batch; False reads them in a short last step."""

    max_steps: int | None = None   # steps from where the run starts (None: no bound)
    epochs: float | None = None    # the run ends at position int(epochs * num_samples)
    drop_last: bool = True         # False: the positions short of a step in a short last step

    def __post_init__(self) -> None:
        max_steps, epochs = self.max_steps, self.epochs
        if max_steps is not None and epochs is not None:
            raise ValueError("pass max_steps or epochs, not both")
        if max_steps is not None and (not isinstance(max_steps, numbers.Integral)
                                      or isinstance(max_steps, (bool, np.bool_))
                                      or max_steps < 0):
            raise ValueError(f"max_steps must be an int >= 0 (None: endless), got {max_steps!r}")
        if epochs is not None and (isinstance(epochs, (bool, np.bool_))
                                   or not isinstance(epochs, numbers.Real)
                                   or not math.isfinite(epochs) or epochs < 0):
            raise ValueError(f"epochs must be a finite number >= 0 (None: endless), got "
                             f"{epochs!r}")
        if not isinstance(self.drop_last, bool):
            raise ValueError(f"drop_last must be a bool, got {self.drop_last!r}")

    def end_position(self, num_samples: int) -> int | None:
        """The position ``epochs`` ends at (None without ``epochs``).

        >>> StopOptions(epochs=1.5).end_position(100)
        150
        """
        if self.epochs is None:
            return None
        end = int(self.epochs * num_samples)
        if end >= MAX_CURSOR:
            raise ValueError(f"epochs={self.epochs!r} of {num_samples} samples is past 2**63 "
                             "positions")
        return end

    def num_batches(self, start: int, global_batch: int, num_samples: int) -> int | None:
        """Steps a run starting at cursor ``start`` takes (None: endless).

        >>> StopOptions(epochs=1, drop_last=False).num_batches(0, 8, 20)
        3
        """
        limits = []
        if self.max_steps is not None:
            limits.append(self.max_steps)
        end = self.end_position(num_samples)
        if end is not None:
            left = max(0, end - start)
            limits.append(left // global_batch if self.drop_last else -(-left // global_batch))
        return min(limits) if limits else None


@dataclass(frozen=True)
class WorkerOptions:
    """``num_workers`` process workers (0: threads in this process), ``prefetch`` batches
    made ahead of the loop, and the DataLoader's ``multiprocessing_context`` and
    ``pin_memory``."""

    num_workers: int = 0                         # process workers (0: threads in this process)
    prefetch: int = 4                            # batches made ahead of the loop
    multiprocessing_context: str | None = None   # the DataLoader's ("fork", "spawn", ...)
    pin_memory: bool = False                     # the DataLoader's pin_memory

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {self.prefetch}")


def option_group(name: str, given, cls: type, **flat):
    """The ``cls`` group a front end uses: ``given`` (the group passed as ``name=``) or one
    made from its flat keywords ``flat``; both at once is refused when a flat keyword is not
    its default, naming them (each setting is given once).

    >>> option_group("stop", None, StopOptions, max_steps=3, epochs=None, drop_last=True)
    StopOptions(max_steps=3, epochs=None, drop_last=True)
    >>> option_group("stop", StopOptions(epochs=1.0), StopOptions, max_steps=None,
    ...              epochs=None, drop_last=True).epochs
    1.0
    >>> option_group("stop", StopOptions(epochs=1.0), StopOptions, max_steps=3, epochs=None,
    ...              drop_last=True)
    Traceback (most recent call last):
    TypeError: stop=StopOptions(...) and the keyword max_steps=3 both set where the run stops: give max_steps in the group or drop stop=
    """
    if given is None:
        return cls(**flat)
    if not isinstance(given, cls):
        raise TypeError(f"{name}= must be a {cls.__name__}, got {type(given).__name__}")
    default = cls()
    changed = [k for k, v in flat.items() if v is not getattr(default, k)
               and v != getattr(default, k)]
    if changed:
        what = {"BatchOptions": "what a batch holds", "ReadAheadOptions": "the read-ahead",
                "StopOptions": "where the run stops",
                "WorkerOptions": "the process workers"}.get(cls.__name__, cls.__name__)
        keywords = ", ".join(f"{k}={flat[k]!r}" for k in changed)
        raise TypeError(f"{name}={cls.__name__}(...) and the keyword {keywords} both set "
                        f"{what}: give {', '.join(changed)} in the group or drop {name}=")
    return given
