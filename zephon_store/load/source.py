"""What the loader reads: the one normaliser to a :class:`~zephon_store.read.source.Source`.

A *source* is what is read (:mod:`zephon_store.read.source`: identity, schema, size, a
row-group table, reads and prefetch, its datasets); how a run reads it is its plan
(:func:`~zephon_store.load.plan.plan_of`). :class:`~zephon_store.read.dataset.Dataset` and
:class:`~zephon_store.mix.mixed.MixedDataset` both satisfy the contract; nothing downstream
asks which one it holds.

:func:`open_source` turns every spelling a loader accepts (a URL, an open ``Dataset``, a
mixture file ``.toml``/``.json``, its dict, a ``MixtureSpec``, an open ``MixedDataset``)
into a source; it is the one place that tells a mixture from a dataset. Its first half,
:func:`open_parts`, opens the datasets without what depends on the run (the columns, the
global batch that places a mixture's stage starts in steps), for a front end that decides
those from the data (TorchTitan's batch counts windows of the sources' ``seq_len``); its
answer is a spelling :func:`open_source` takes.

>>> ds = open_source(tiny_dataset)
>>> isinstance(ds, Source), ds.num_samples
(True, 100)
>>> open_source(ds) is ds
True
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..read.source import Source

__all__ = ["MixtureParts", "Source", "by_kind", "is_mixture", "open_mixture", "open_parts",
           "open_source", "plan_of", "seed_of"]

MIXTURE_FILE_SUFFIXES = (".toml", ".json")


def is_mixture(obj) -> bool:
    """Whether ``obj`` spells a mixture: a :class:`~zephon_store.mix.mixed.MixedDataset`
    or its :class:`MixtureParts`, a mixture spec or its dict, or the path of a mixture file
    (``.toml``/``.json``)."""
    from ..mix.mixed import MixedDataset

    if isinstance(obj, (MixedDataset, MixtureParts, dict)):
        return True
    if isinstance(obj, (str, os.PathLike)):
        path = os.fspath(obj)
        # A local file named *.toml/*.json; a dataset is a folder (or a remote URL).
        return (path.endswith(MIXTURE_FILE_SUFFIXES) and "://" not in path
                and not os.path.isdir(path))
    return type(obj).__name__ == "MixtureSpec"


def by_kind(spelling, *, dataset, mixture):
    """``mixture(spelling)`` when ``spelling`` names a mixture (:func:`is_mixture`), else
    ``dataset(spelling)``: the normaliser's one question, answered for a caller that acts on
    a spelling before it is opened (run accounting reads a mixture's log first: its global
    batch places the stage starts). The caller gives what each kind does, and asks nothing.

    >>> by_kind({"sources": []}, dataset=lambda s: "one dataset", mixture=lambda s: "mixture")
    'mixture'
    """
    return (mixture if is_mixture(spelling) else dataset)(spelling)


def open_parts(spelling, *, storage_options: dict | None = None, cache=None,
               decoded_cache=None, expect_dataset_id: str | None = None,
               no_mixture: str | None = None, as_mixture: bool = False):
    """The normaliser's first half: every dataset ``spelling`` names, opened (manifests
    read), before what depends on the run.

    A URL opens as a :class:`~zephon_store.read.dataset.Dataset`; an open ``Dataset`` or
    ``MixedDataset`` is returned as it is; a mixture file, its dict or a ``MixtureSpec``
    opens as :class:`MixtureParts`: its sources open, each with its own storage options,
    remote ones through ``cache`` and every one through ``decoded_cache``, its schedule not
    yet placed. Each answer has ``parts()`` (``[(name, Dataset)]``) and ``order_seed()``,
    and :func:`open_source` takes it as a spelling, with the columns and global batch a
    caller can decide only once it has read the parts (TorchTitan: the batch in windows of
    the sources' ``seq_len``). The keywords are :func:`open_source`'s.

    >>> stages = [{"name": "s", "start": {"samples": 0}}, {"name": "t", "start": {"steps": 2}}]
    >>> parts = open_parts({"stages": stages, "sources": [
    ...     {"name": "a", "url": tiny_dataset, "weights": [1, 0.5]},
    ...     {"name": "b", "url": tiny_dataset, "weights": [0, 0.5]}]})
    >>> [name for name, _ in parts.parts()], parts.order_seed(None)
    (['a', 'b'], 0)
    >>> [start for start, _ in open_source(parts, global_batch=4).schedule.stages]
    [0, 8]
    """
    from ..read.dataset import Dataset, open_dataset

    if as_mixture or is_mixture(spelling):
        if no_mixture is not None:
            raise ValueError(no_mixture)
        if expect_dataset_id is not None:
            raise ValueError("expect_dataset_id pins one dataset; a mixture pins its "
                             "sources by their dataset_ids (checked on resume)")
        return _open_mixture_parts(spelling, cache=cache, decoded_cache=decoded_cache)
    if isinstance(spelling, Dataset):
        if decoded_cache is not None:
            raise ValueError("decoded_cache applies to a dataset the loader opens; this one "
                             "is open already: open it with open_dataset(url, "
                             "decoded_cache=...)")
        if expect_dataset_id is not None:
            spelling.expect_id(expect_dataset_id)
        return spelling
    return open_dataset(spelling, storage_options=storage_options, cache=cache,
                        expect_dataset_id=expect_dataset_id, decoded_cache=decoded_cache)


def open_source(spelling, *, columns: Sequence[str] | None = None,
                global_batch: int | None = None, storage_options: dict | None = None,
                cache=None, decoded_cache=None, expect_dataset_id: str | None = None,
                defer_stage_order: bool = False, no_mixture: str | None = None,
                as_mixture: bool = False) -> Source:
    """The :class:`Source` that ``spelling`` names: :func:`open_parts`, then what depends
    on the run.

    A mixture (file, dict, ``MixtureSpec``, open ``MixedDataset`` or the
    :class:`MixtureParts` of one; docs/mixtures.md) is opened with ``columns`` selected,
    every source with its own storage options, remote ones through ``cache`` and all
    through ``decoded_cache``; stage starts in steps convert with ``global_batch``;
    ``defer_stage_order``: see :func:`~zephon_store.mix.mixed.build_mixture`. A mixture
    pins its sources by their dataset_ids, so ``expect_dataset_id`` is refused for one, and
    ``no_mixture`` (the refusal's words) refuses a mixture altogether. An open ``Dataset``
    is checked against ``expect_dataset_id``; it is open already, so ``decoded_cache`` is
    refused. A URL is opened with :func:`~zephon_store.read.dataset.open_dataset`.
    ``as_mixture``: read any spelling as a mixture's (:func:`open_mixture`).
    """
    from ..mix.mixed import MixedDataset

    opened = open_parts(spelling, storage_options=storage_options, cache=cache,
                        decoded_cache=decoded_cache, expect_dataset_id=expect_dataset_id,
                        no_mixture=no_mixture, as_mixture=as_mixture)
    if isinstance(opened, MixtureParts):
        return opened.mixture(columns=columns, global_batch=global_batch,
                              defer_stage_order=defer_stage_order)
    if isinstance(opened, MixedDataset):
        return opened.select(columns)
    return opened


def plan_of(source):
    """The plan a run reads ``source`` by (:mod:`zephon_store.load.plan`): the normaliser's
    second half. ``source`` itself when it is a plan already, a
    :class:`~zephon_store.load.plan.MixedPlan` for a mixture, else a
    :class:`~zephon_store.load.plan.DatasetPlan`.

    >>> plan = plan_of(open_source(tiny_dataset))
    >>> type(plan).__name__, plan_of(plan) is plan, plan.state_entry()
    ('DatasetPlan', True, None)
    """
    from ..mix.mixed import MixedDataset
    from .plan import DatasetPlan, MixedPlan

    if isinstance(source, (DatasetPlan, MixedPlan)):
        return source
    return MixedPlan(source) if isinstance(source, MixedDataset) else DatasetPlan(source)


def seed_of(opened, given: int | None) -> int:
    """The seed rule of what :func:`open_parts` opened (a source, or a mixture's
    :class:`MixtureParts` before its schedule is placed): the seed the order uses when
    ``given`` (None: not given)."""
    if isinstance(opened, MixtureParts):
        return opened.order_seed(given)
    return plan_of(opened).order_seed(given)


def open_mixture(mixture, *, columns: Sequence[str] | None = None,
                 global_batch: int | None = None, cache=None,
                 decoded_cache=None, defer_stage_order: bool = False):
    """Open a mixture: a :class:`~zephon_store.mix.mixed.MixedDataset` (``columns``
    selected), or a mixture file path, its dict or a
    :class:`~zephon_store.format.mixture_file.MixtureSpec` (every source opened with its own
    storage options; remote ones through ``cache``; every one through ``decoded_cache``, as
    for :func:`~zephon_store.open_dataset`). ``defer_stage_order``: see
    :func:`~zephon_store.mix.mixed.build_mixture`. :func:`open_source` tells an open mixture
    from one to open; any other spelling is read as a mixture's."""
    return open_source(mixture, columns=columns, global_batch=global_batch, cache=cache,
                       decoded_cache=decoded_cache, defer_stage_order=defer_stage_order,
                       as_mixture=True)


class MixtureParts:
    """A mixture's sources, open, before its schedule is placed (:func:`open_parts`).

    ``spec``: the :class:`~zephon_store.format.mixture_file.MixtureSpec`; ``sources``: its
    opened datasets, in its source order. What a caller reads before it knows the run's
    global batch (the sources' schemas and packing, the seed rule) is here;
    :func:`open_source` makes the :class:`~zephon_store.mix.mixed.MixedDataset`.
    """

    def __init__(self, spec, sources: Sequence) -> None:
        self.spec = spec
        self.sources = list(sources)

    def parts(self) -> list[tuple[str, Any]]:
        """``[(name, Dataset)]`` of every source, in the mixture's order."""
        return list(zip(self.spec.source_names, self.sources))

    def order_seed(self, given: int | None) -> int:
        """The mixture's seed rule (:func:`~zephon_store.load.order_inputs.mixture_seed`):
        the file's seed unless one is given; a given seed that disagrees is refused."""
        from .order_inputs import mixture_seed

        return mixture_seed(self.spec.seed, given,
                            origin=getattr(self.spec, "origin", None) or "the mixture file")

    def mixture(self, *, columns: Sequence[str] | None = None,
                global_batch: int | None = None, defer_stage_order: bool = False) -> Source:
        """The :class:`~zephon_store.mix.mixed.MixedDataset` over these sources
        (:func:`~zephon_store.mix.mixed.build_mixture`); the sources are shared."""
        from ..mix.mixed import build_mixture

        return build_mixture(self.spec, self.sources, columns=columns,
                             global_batch=global_batch, defer_stage_order=defer_stage_order)

    def close(self) -> None:
        for s in self.sources:
            s.close()


def _open_mixture_parts(spelling, *, cache, decoded_cache):
    """An open mixture (or its parts) as it is, or the parts a spec spelling names."""
    from ..mix.mixed import MixedDataset, mixture_spec, open_sources

    if isinstance(spelling, (MixedDataset, MixtureParts)):
        return spelling
    spec = mixture_spec(spelling)
    return MixtureParts(spec, open_sources(spec, cache=cache, decoded_cache=decoded_cache))
