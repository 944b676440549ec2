"""The loader's options in named groups (STYLE 15), each frozen and validated on creation.

``ZephonLoader(...)``'s keywords build them; the engine and the torch shells pass the groups
on instead of copying twenty keyword arguments through each signature.

- :class:`SourceOptions`: how the data is opened (storage options, caches, a pinned id);
- :class:`BatchOptions`: what a batch holds (columns, ``_seq``, a transform, the collation);
- :class:`ReadAheadOptions`: how far ahead bytes are fetched and row groups decoded;
- :class:`StopOptions`: where a run ends (``max_steps``, ``epochs``, ``drop_last``);
- :class:`WorkerOptions`: the process workers (torch's ``DataLoader``, Grain's).

Each setting has one spelling: its field in its group. The flat keywords the front ends
took before the groups (``num_workers=``, ``columns=``, ``cache=``...) still work for one
release, each with a ``DeprecationWarning`` naming its group (:func:`grouped`).

Who reads (:class:`~zephon_store.order.Topology`) and in which order
(:class:`~zephon_store.order.OrderOptions`) are the order layer's.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..io.coalesce import CoalesceOptions
from ..io.prefetch import DEFAULT_PREFETCH_BYTES
from .documents import DocumentColumns
from .state import MAX_CURSOR

__all__ = ["BatchOptions", "ReadAheadOptions", "SourceOptions", "StopOptions", "WorkerOptions",
           "as_numpy", "grouped", "option_group"]


def as_numpy(batch: dict) -> dict:
    """The batch as it is (dicts of numpy arrays and lists): the collation that keeps a torch
    loader's batches numpy (``BatchOptions(collate=as_numpy)``).

    >>> as_numpy({"id": 1})
    {'id': 1}
    """
    return batch


@dataclass(frozen=True)
class SourceOptions:
    """How the data is opened (:func:`~zephon_store.load.source.open_source`):
    ``storage_options`` of a remote dataset (a mixture's sources carry their own, in the
    mixture file); ``cache``, the disk cache remote row groups go through
    (:class:`~zephon_store.io.cache.ChunkCache` or its folder; None: the default for remote
    data; False: none); ``decoded_cache``, the node's decoded row groups
    (:class:`~zephon_store.read.decoded_disk.DecodedDiskCache` or its folder); and
    ``expect_dataset_id`` (``"xxh3:..."``), which refuses any other dataset.

    >>> SourceOptions(cache=False).open_kwargs()["cache"]
    False
    """

    storage_options: dict | None = None
    cache: Any = None
    decoded_cache: Any = None
    expect_dataset_id: str | None = None

    def open_kwargs(self) -> dict:
        """The keywords of :func:`~zephon_store.load.source.open_source` these set."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class BatchOptions:
    """What each batch holds: ``columns`` (None: all), ``with_seq`` adds ``_seq`` (int64
    global sample ids), ``transform`` maps the decoded batch dict (in the workers),
    ``collate`` turns each batch handed to the loop into what the loop takes (None: the
    front end's own: numpy dicts from ``Loader`` and Grain, tensors from the torch loaders;
    :func:`as_numpy` keeps them numpy), ``deny_list`` (a
    :class:`~zephon_store.load.denylist.DenyList`, set by the loader from its ``deny_list=``)
    blanks the denied rows before the transform and adds ``_masked`` (bool per sample).
    ``documents`` (packed data only) adds ``position_ids``, ``cu_seqlens``, ``max_seqlen``
    and ``loss_mask`` per window (:mod:`zephon_store.load.documents`, docs/packing.md),
    reading ``tokens`` and ``doc_starts`` whatever ``columns`` says.

    >>> BatchOptions(columns=["tokens"], documents=True).read_columns()
    ('tokens', 'doc_starts')
    """

    columns: tuple[str, ...] | None = None            # the columns read (None: all)
    with_seq: bool = False                            # add _seq (and a mixture's _source)
    transform: Callable[[dict], dict] | None = None   # maps each decoded batch dict
    collate: Callable[[dict], object] | None = None   # each batch as the loop takes it
    deny_list: Any = None                             # a DenyList: its rows blanked, _masked
    documents: bool = False                           # add per-document attention data

    def __post_init__(self) -> None:
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))
        if self.deny_list is not None and not callable(getattr(self.deny_list, "masked", None)):
            raise TypeError(
                f"BatchOptions(deny_list=...) takes the DenyList a loader opened, not "
                f"{type(self.deny_list).__name__}; pass deny_list= to the loader itself "
                "(a file, a list of sample ids, or a mixture's {source: list} dict)")

    def read_columns(self) -> tuple[str, ...] | None:
        """The columns a reader selects: ``columns``, plus the packing's token and
        document-start columns when ``documents`` is on (None: all)."""
        if self.columns is None or not self.documents:
            return self.columns
        return self.columns + tuple(c for c in DocumentColumns().names if c not in self.columns)

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
                "StopOptions": "where the run stops", "SourceOptions": "how the data is opened",
                "WorkerOptions": "the process workers"}.get(cls.__name__, cls.__name__)
        keywords = ", ".join(f"{k}={flat[k]!r}" for k in changed)
        raise TypeError(f"{name}={cls.__name__}(...) and the keyword {keywords} both set "
                        f"{what}: give {', '.join(changed)} in the group or drop {name}=")
    return given


# The flat keywords of the front ends before the groups, and the group each belongs to.
FLAT = {
    "storage_options": "source", "cache": "source", "decoded_cache": "source",
    "expect_dataset_id": "source",
    "columns": "batch", "with_seq": "batch", "transform": "batch", "collate": "batch",
    "prefetch_bytes": "read_ahead", "decode_ahead_bytes": "read_ahead", "coalesce": "read_ahead",
    "max_steps": "stop", "epochs": "stop", "drop_last": "stop",
    "num_workers": "workers", "prefetch": "workers", "multiprocessing_context": "workers",
    "pin_memory": "workers",
}
# Keywords that were not part of their group before (``collate`` stood beside ``batch=``):
# given with a group that leaves them unset, they join it instead of being refused.
JOINED_LATER = frozenset({"collate"})
GROUPS = {"source": SourceOptions, "batch": BatchOptions, "read_ahead": ReadAheadOptions,
          "stop": StopOptions, "workers": WorkerOptions}


def grouped(front: str, groups: dict, flat: dict, *, allowed=frozenset(FLAT),
            stacklevel: int = 3) -> dict:
    """The option groups a front end passes on: ``groups`` (group name -> the group given,
    or None) with its deprecated flat keywords ``flat`` folded in. Each flat keyword warns
    (``DeprecationWarning``, naming its group); one the front end never took
    (``allowed``) is a TypeError as Python's own; a group and one of its own keywords that
    disagree are refused (:func:`option_group`).

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     out = grouped("ZephonLoader", {"stop": None}, {"max_steps": 3})
    >>> out["stop"].max_steps, seen[0].category.__name__
    (3, 'DeprecationWarning')
    >>> str(seen[0].message)
    'ZephonLoader(max_steps=...) is deprecated: pass stop=StopOptions(max_steps=...); the flat keywords go in the next release'
    >>> grouped("ZephonLoader", {}, {"colums": ["x"]})
    Traceback (most recent call last):
    TypeError: ZephonLoader() got an unexpected keyword argument 'colums'
    """
    for key in flat:
        if key not in allowed or FLAT[key] not in groups:
            raise TypeError(f"{front}() got an unexpected keyword argument {key!r}")
    by_group: dict[str, dict] = {}
    for key, value in flat.items():
        by_group.setdefault(FLAT[key], {})[key] = value
    for name, keys in by_group.items():
        spelled = ", ".join(f"{k}=..." for k in keys)
        warnings.warn(f"{front}({spelled}) is deprecated: pass {name}={GROUPS[name].__name__}"
                      f"({spelled}); the flat keywords go in the next release",
                      DeprecationWarning, stacklevel=stacklevel)
    out = {}
    for name, given in groups.items():
        flat_here = by_group.get(name, {})
        late = {k: v for k, v in flat_here.items() if k in JOINED_LATER and given is not None
                and getattr(given, k) == getattr(GROUPS[name](), k)}
        if late:   # a keyword its group gained later: a group given without it takes it
            given = dataclasses.replace(given, **late)
            flat_here = {k: v for k, v in flat_here.items() if k not in late}
        out[name] = option_group(name, given, GROUPS[name], **flat_here)
    return out
