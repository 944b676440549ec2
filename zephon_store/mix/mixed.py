"""A mixture of datasets as one more stateless layer: a virtual dataset and its order.

Mixture position ``p`` goes to ``(source k, index i in k's own stream)`` by the stage
schedule (:class:`~zephon_store.order.mixture.MixtureSchedule`), and source ``k``'s own
:class:`~zephon_store.order.Order` (its own seed-derived key, blocks, windows and epochs)
gives the sample. :class:`MixedDataset` presents the sources as one dataset to the rest of
the loader: the sources' row groups concatenated (virtual row group ``g`` is source ``k``'s
row group ``g - rg_offset[k]``), virtual ids ``id_offset[k] + local id``, one row-group
view of the concatenated row-group tables, row-group reads and prefetch dispatched to each
source (each local or remote with its own storage options and disk cache). So assignment,
workers, the decode-ahead pipeline, prefetch and the cache run unchanged on the mixed
stream, and the sample at a position stays a pure function of (the sources' dataset_ids,
the schedule, seed, position).

>>> from zephon_store import OrderOptions, open_dataset
>>> from zephon_store.order.mixture import MixtureSchedule
>>> a, b = open_dataset(tiny_dataset), open_dataset(tiny_dataset)
>>> mix = MixedDataset([a, b], MixtureSchedule([(0, [0.5, 0.5])]), names=["a", "b"])
>>> order = MixedOrder(mix, OrderOptions(seed=7))
>>> ids = order.sample_at(np.arange(6))
>>> src, local = mix.split_ids(ids)
>>> src.tolist()
[0, 1, 0, 1, 0, 1]
>>> (local[src == 0] == order.source_orders[0].sample_at(np.arange(3))).all()
np.True_
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from .._util.hashing import xxh3_hex
from ..errors import MixtureError
from ..format.columns import ConcatColumn
from ..order.mixture import MixtureSchedule
from ..order.order import Order, OrderOptions, derive_key
from ..read.source import SourceBase

__all__ = ["ConcatRowGroupTable", "MixedDataset", "MixedOrder", "SOURCE_KEY", "build_mixture",
           "mean_sample_size", "mixture_spec", "open_sources", "source_order_options"]

SOURCE_KEY = "_source"
# Folded into each source's seed, so source k's order differs from the mixture seed's own
# order over the same data and from every other source's.
_TAG_SOURCE = 0x736F75726365  # "source"
MIXTURE_ID_PREFIX = "mix:"


#: Sources a repr names before "... and N more": one screen for a wide mixture.
_REPR_SOURCES = 10


def source_order_options(options: OrderOptions, k: int) -> OrderOptions:
    """Order options of source ``k`` of a mixture: the mixture's, with a seed derived from
    ``(seed, k)``.

    >>> source_order_options(OrderOptions(seed=7), 0) != source_order_options(OrderOptions(seed=7), 1)
    True
    """
    seed = int(derive_key(options.seed, _TAG_SOURCE, k)[0])
    return options.replace(seed=seed)


class ConcatRowGroupTable:
    """The sources' row-group tables concatenated (virtual row group ``g`` is source ``k``'s
    ``g - rg_offset[k]``): the tables the engine plans steps from (``rg_rows``,
    ``rg_row_start`` in virtual ids, ``rg_length``, ``rg_offset``, ``rg_shard`` numbered
    across sources) and their counts; a mixture's
    :class:`~zephon_store.read.source.RowGroupTable`."""

    def __init__(self, sources: Sequence, id_offset: np.ndarray) -> None:
        ms = [s.manifest for s in sources]
        self.rg_rows = np.concatenate([m.rg_rows for m in ms]).astype(np.int64)
        self.rg_row_start = np.concatenate(
            [m.rg_row_start + off for m, off in zip(ms, id_offset)]).astype(np.int64)
        # Byte ranges stay with their sources, read only where indexed (format v4 fetches
        # them in chunks on first use; a concatenation would fetch every chunk).
        self.rg_length = ConcatColumn([m.rg_length for m in ms])
        self.rg_offset = ConcatColumn([m.rg_offset for m in ms])
        self.stored_row_group_bytes = int(sum(m.stored_row_group_bytes for m in ms))
        # Shards numbered across sources, so two sources' shard 0 never look alike.
        shard_base = np.cumsum([0] + [m.num_shards for m in ms])
        self.rg_shard = np.concatenate(
            [m.rg_shard + base for m, base in zip(ms, shard_base)]).astype(np.int64)
        self.num_row_groups = int(self.rg_rows.size)
        self.num_samples = int(sum(m.num_samples for m in ms))
        self.num_shards = int(shard_base[-1])
        self.total_bytes = int(sum(m.total_bytes for m in ms))

    def row_group_of(self, ids) -> np.ndarray:
        """The virtual row group holding each virtual sample id."""
        return self.rg_row_start.searchsorted(np.asarray(ids, dtype=np.int64), "right") - 1


class _SourcePrefetchers:
    """The prefetchers of a mixture's remote sources, told together what was consumed (each
    fetches only its own source's row groups)."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def consumed(self, i: int) -> None:
        for p in self.parts:
            p.consumed(i)

    def close(self) -> None:
        for p in self.parts:
            p.close()


class MixedDataset(SourceBase):
    """Several datasets read as one by a stage schedule (see the module docstring).

    ``sources``: opened :class:`~zephon_store.read.dataset.Dataset` objects, in the
    mixture's source order (source ``k`` is weight ``k`` of every stage); ``schedule``: the
    :class:`~zephon_store.order.mixture.MixtureSchedule`; ``names``: one per source (errors
    and checkpoints name sources by them); ``columns``: the columns every batch holds. Sources
    may differ in schema; each must hold every selected column, with one type across sources
    (checked here, before any batch). ``columns=None`` selects the columns of the first
    source, which every other source must then hold.
    """

    def __init__(self, sources: Sequence, schedule, *, names: Sequence[str] | None = None,
                 columns: Sequence[str] | None = None, spec=None,
                 schedule_inputs: dict | None = None) -> None:
        if not sources:
            raise ValueError("a mixture needs at least one source")
        self.sources = list(sources)
        self.names = list(names) if names is not None else [f"source{k}"
                                                            for k in range(len(sources))]
        if len(self.names) != len(self.sources) or len(set(self.names)) != len(self.names):
            raise ValueError(f"a mixture needs one distinct name per source, got {self.names} "
                             f"for {len(self.sources)} sources")
        if schedule.num_sources != len(self.sources) or (
                schedule.names is not None and list(schedule.names) != self.names):
            raise MixtureError(
                f"the schedule is for {schedule.num_sources} sources "
                f"{list(schedule.names or [])}, but the mixture has {len(self.sources)} "
                f"{self.names}; give one weight per source, in the same order")
        self.schedule = schedule
        # The schedule this mixture was configured with; a resume replaces ``schedule`` by
        # the checkpoint's past plus this one's later stages, and a second resume starts
        # from this one again.
        self.config_schedule = schedule
        self.spec = spec
        # What turns the spec's stage starts into samples (build_mixture): a resume converts
        # the stages in steps again, from the checkpoint's step and cursor.
        self.schedule_inputs = dict(schedule_inputs or {})
        # The file's stage starts, converted from step 0 with this run's global batch, can
        # cross (a stage in steps before one in samples) where a checkpoint that began them
        # fixes them; the error then waits for the first batch (check_ready).
        self.pending_error: MixtureError | None = None
        self._setup(columns)

    def _setup(self, columns: Sequence[str] | None) -> None:
        sizes = np.array([s.num_samples for s in self.sources], dtype=np.int64)
        self.id_offset = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.rg_offset = np.concatenate(
            [[0], np.cumsum([s.manifest.num_row_groups for s in self.sources])[:-1]]
        ).astype(np.int64)
        self.columns = list(columns) if columns is not None else list(
            self.sources[0].schema.names)
        self.schema = self._common_schema(self.columns)
        self.row_group_table = ConcatRowGroupTable(self.sources, self.id_offset)

    def _common_schema(self, columns: list[str]) -> pa.Schema:
        fields = []
        for name in columns:
            types = {}
            for k, s in enumerate(self.sources):
                if name not in s.schema.names:
                    raise ValueError(
                        f"mixture source {self.names[k]!r} ({s.url}) has no column {name!r} "
                        f"(it has {s.schema.names}); select columns every source holds "
                        "(columns=[...]) or convert that source with the column")
                types.setdefault(s.schema.field(name).type, []).append(self.names[k])
            if len(types) > 1:
                raise ValueError(
                    f"mixture column {name!r} has different types across sources: "
                    + "; ".join(f"{t} in {ks}" for t, ks in types.items())
                    + "; convert the sources to one type or leave the column out")
            nullable = any(s.schema.field(name).nullable for s in self.sources)
            fields.append(pa.field(name, next(iter(types)), nullable=nullable))
        return pa.schema(fields)

    def select(self, columns: Sequence[str] | None) -> MixedDataset:
        """This mixture reading ``columns`` (checked in every source); None: unchanged."""
        if columns is None or list(columns) == self.columns:
            return self
        out = self._view()
        out._setup(columns)
        return out

    def with_schedule(self, schedule) -> MixedDataset:
        """This mixture (same sources, shared) read by another schedule."""
        out = self._view()
        out.schedule = schedule
        out.pending_error = None
        return out

    def _view(self) -> MixedDataset:
        # Shares the opened sources (select, with_schedule). copy.copy() instead goes through
        # __getstate__/__setstate__ and gives each source fresh threads, as a forked
        # DataLoader worker needs (torch/dataset.py).
        out = MixedDataset.__new__(MixedDataset)
        out.__dict__.update(self.__dict__)
        return out

    # Pickling (DataLoader workers): each source pickles as a Dataset does (manifest and
    # options; fresh threads and caches on the other side).
    def __getstate__(self) -> dict:
        return {"sources": self.sources, "names": self.names, "schedule": self.schedule,
                "config_schedule": self.config_schedule, "columns": self.columns,
                "spec": self.spec, "inputs": self.schedule_inputs, "pending": self.pending_error}

    def __setstate__(self, state: dict) -> None:
        self.sources = [copy.copy(s) for s in state["sources"]]
        self.names, self.schedule, self.spec = state["names"], state["schedule"], state["spec"]
        self.config_schedule = state["config_schedule"]
        self.schedule_inputs, self.pending_error = state["inputs"], state["pending"]
        self._setup(state["columns"])

    # -- facts -------------------------------------------------------------------------
    @property
    def num_sources(self) -> int:
        return len(self.sources)

    @property
    def num_samples(self) -> int:
        """Samples of all sources together (``epochs=1`` of a mixture reads this many)."""
        return self.row_group_table.num_samples

    @property
    def seed(self) -> int | None:
        """The seed the mixture file sets (None: the loader's)."""
        return None if self.spec is None else self.spec.seed

    @property
    def source_ids(self) -> list[str]:
        return [s.dataset_id for s in self.sources]

    @property
    def dataset_id(self) -> str:
        """The mixture's identity: a hash of its sources' names and dataset_ids and of the
        schedule (``"mix:" + xxh3``)."""
        doc = {"sources": [[n, i] for n, i in zip(self.names, self.source_ids)],
               "schedule": self.schedule.identity()}
        return MIXTURE_ID_PREFIX + xxh3_hex(json.dumps(doc, sort_keys=True).encode())

    @property
    def url(self) -> str:
        return "mixture(" + ", ".join(f"{n}={s.url}" for n, s in zip(self.names,
                                                                      self.sources)) + ")"

    def __repr__(self) -> str:
        """What the mixture mixes: its sources (name, samples, URL; the first ten), its
        stages, its columns.

        >>> from zephon_store import open_dataset
        >>> ds = open_dataset(tiny_dataset)
        >>> sched = MixtureSchedule([(0, [0.5, 0.5])], names=["a", "b"])
        >>> print(repr(MixedDataset([ds, ds], sched, names=["a", "b"])))  # doctest: +ELLIPSIS
        MixedDataset(dataset_id='mix:...', num_samples=200, stages=1,
                     sources={'a': 100 samples at '...ds',
                              'b': 100 samples at '...ds'},
                     columns={'id': int64, 'text': string})
        """
        from ..read.dataset import columns_repr

        indent = " " * len("MixedDataset(")
        inner = indent + " " * len("sources={")
        parts = [f"{n!r}: {s.num_samples} samples at {s.url!r}"
                 for n, s in list(zip(self.names, self.sources))[:_REPR_SOURCES]]
        if len(self.sources) > _REPR_SOURCES:
            parts.append(f"... and {len(self.sources) - _REPR_SOURCES} more")
        return (f"MixedDataset(dataset_id={self.dataset_id!r}, num_samples={self.num_samples}, "
                f"stages={len(self.schedule.stages)},\n{indent}sources={{"
                + (",\n" + inner).join(parts) + f"}},\n{indent}columns="
                + columns_repr(self.schema, indent=indent + " " * len("columns={")) + ")")

    # -- virtual ids and row groups ------------------------------------------------------
    def split_ids(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Virtual ids -> (source index, the source's own sample id)."""
        ids = np.asarray(ids, dtype=np.int64)
        k = np.searchsorted(self.id_offset, ids, side="right") - 1
        return k, ids - self.id_offset[k]

    def split_row_group(self, rg: int) -> tuple[int, int]:
        """Virtual row group -> (source index, the source's own row group)."""
        k = int(np.searchsorted(self.rg_offset, rg, side="right")) - 1
        return k, rg - int(self.rg_offset[k])

    def conform(self, k: int, table: pa.Table) -> pa.Table:
        """Source ``k``'s decoded table as the mixture's columns and schema."""
        table = table.select(self.columns)
        if table.schema != self.schema:
            table = table.cast(self.schema)
        return table

    # -- row groups: virtual row group g is read from (and prefetched by) its source ----
    def read_row_group(self, rg: int, *, keep: bool = True) -> pa.Table:
        """Virtual row group ``rg``, read by the source that holds it, as the mixture's
        columns and schema."""
        k, local = self.split_row_group(int(rg))
        return self.conform(k, self.sources[k].row_groups.read(local, keep=keep))

    def prefetcher(self, step_row_groups: Callable[[int], Iterable[int]], *,
                   budget_bytes: int, num_batches: int | None = None,
                   coalesce=None, threads: int = 4) -> _SourcePrefetchers:
        """One prefetcher per remote source, each told only its own source's row groups of
        each step, sharing ``budget_bytes``."""
        remote = [k for k, s in enumerate(self.sources) if s.cache is not None]
        memo: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

        def split(j: int) -> tuple[np.ndarray, np.ndarray]:
            got = memo.get(j)
            if got is None:
                rgs = np.asarray(list(step_row_groups(j)), dtype=np.int64)
                k = np.searchsorted(self.rg_offset, rgs, side="right") - 1
                got = memo[j] = (k, rgs - self.rg_offset[k])
                while len(memo) > 4 * (len(remote) + 1):
                    memo.popitem(last=False)
            return got

        def of_source(k: int):
            def rgs(j: int) -> np.ndarray:
                src, local = split(j)
                return local[src == k]
            return rgs

        # The budget is shared: each remote source keeps its share of it fetched ahead.
        share = max(1, budget_bytes // max(1, len(remote)))
        return _SourcePrefetchers([
            self.sources[k].row_groups.prefetcher(of_source(k), budget_bytes=share,
                                                  num_batches=num_batches, coalesce=coalesce,
                                                  threads=threads)
            for k in remote])

    # -- as a Source (read/source.py) ---------------------------------------------------
    def parts(self) -> list[tuple[str, object]]:
        """``[(name, dataset)]`` of every source, in the mixture's order."""
        return list(zip(self.names, self.sources))

    def close(self) -> None:
        for s in self.sources:
            s.close()


class MixedOrder:
    """Mixture position -> virtual sample id: the schedule picks (source, index), the
    source's own order picks the sample.

    Plain slicing between ranks (``effective_lanes`` 1): a mixture step holds several
    sources, each with its own lanes, so there is no lane to align ranks with.
    """

    def __init__(self, mix: MixedDataset, options: OrderOptions) -> None:
        self.mix = mix
        self._options = options
        self.source_orders = [Order(s.manifest.rg_rows, source_order_options(options, k))
                              for k, s in enumerate(mix.sources)]

    @property
    def options(self) -> OrderOptions:
        return self._options

    @property
    def num_samples(self) -> int:
        return self.mix.num_samples

    @property
    def effective_lanes(self) -> int:
        return 1

    @property
    def window_samples(self) -> int:
        """The largest shuffle window of the sources' orders."""
        return max(o.window_samples for o in self.source_orders)

    # -- the per-source view (as Order's, order/order.py: one dataset is one source) ---

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(self.mix.names)

    def source_positions(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(source, position in that source's own stream) of each mixture position."""
        src, index = self.mix.schedule.locate(np.asarray(positions, dtype=np.int64))
        return np.asarray(src, dtype=np.int64), np.asarray(index, dtype=np.int64)

    def consumed(self, position: int) -> np.ndarray:
        """Positions of each source's stream before mixture position ``position``."""
        return np.asarray(self.mix.schedule.consumed(position), dtype=np.int64)

    def stream_position(self, source: int, index) -> np.ndarray:
        """The mixture position of source ``source``'s stream position ``index`` (-1: the
        schedule never reaches it)."""
        return np.asarray(self.mix.schedule.position_of(source, np.asarray(index)),
                          dtype=np.int64)

    def split_ids(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """Virtual ids -> (source index, the source's own sample id)."""
        return self.mix.split_ids(ids)

    def global_ids(self, source: int, ids) -> np.ndarray:
        """The mixture's (virtual) ids of source ``source``'s own sample ids."""
        return np.asarray(ids, dtype=np.int64) + self.mix.id_offset[int(source)]

    def block_of(self, ids) -> np.ndarray:
        """The virtual row group (block) holding each virtual sample id."""
        return np.searchsorted(self.mix.row_group_table.rg_row_start, np.asarray(ids, np.int64),
                               side="right") - 1

    def locate(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(source index, the source's own sample id) at each mixture position."""
        p = np.asarray(positions, dtype=np.int64)
        shape = p.shape
        src, index = self.mix.schedule.locate(p.reshape(-1))
        src = np.asarray(src, dtype=np.int64)
        index = np.asarray(index, dtype=np.int64)
        ids = np.empty_like(index)
        for k in np.unique(src).tolist():
            sel = src == k
            ids[sel] = self.source_orders[k].sample_at(index[sel])
        return src.reshape(shape), ids.reshape(shape)

    def sample_at(self, positions) -> np.ndarray:
        """The virtual sample id at each mixture position (``id_offset[k] + local id``)."""
        src, ids = self.locate(positions)
        return ids + self.mix.id_offset[src]

    def __repr__(self) -> str:
        return f"MixedOrder(sources={self.mix.names}, options={self._options!r})"


def open_sources(spec, *, cache=None, decoded_cache=None) -> list:
    """Open every source of ``spec`` with its own storage options (remote ones through
    ``cache``); a source that cannot be opened is a :class:`MixtureError` naming it."""
    from ..read.dataset import open_dataset

    sources = []
    for src in spec.sources:
        try:
            sources.append(open_dataset(src.url, storage_options=(
                None if src.storage_options is None else dict(src.storage_options)),
                cache=cache, decoded_cache=decoded_cache))
        except (OSError, ValueError) as exc:
            # The message carries the cause's (what, where, what to do); its chain of
            # storage, manifest and retry frames added 80 lines before it and nothing else.
            raise MixtureError(f"{spec.origin}: mixture source {src.name!r} at {src.url} "
                               f"cannot be opened: {exc}") from None
    return sources


def build_mixture(spec, sources: Sequence, *, columns: Sequence[str] | None = None,
                  global_batch: int | None = None,
                  defer_stage_order: bool = False) -> MixedDataset:
    """The :class:`MixedDataset` of ``spec`` over its opened ``sources``: stage starts in
    steps converted with ``global_batch`` (for a run from step 0), token or byte weights
    with each source's mean size per sample (:func:`mean_sample_size`), caps with each
    source's size.

    ``defer_stage_order`` (a loader that may resume): stage starts that do not increase
    once converted (a stage in steps before one in samples, at this global batch) are not
    an error yet: a checkpoint that began those stages fixes their samples
    (:meth:`MixedDataset.resumed`); reading from the start raises it
    (:meth:`MixedDataset.check_ready`).
    """
    tokens_per_sample = _tokens_per_sample(spec, sources)
    inputs = {
        "global_batch": global_batch, "tokens_per_sample": tokens_per_sample,
        "mean_sizes": (None if spec.weight_unit == "samples"
                       else [mean_sample_size(s, spec.weight_unit, name=n)
                             for n, s in zip(spec.source_names, sources)]),
        "epoch_sizes": [s.num_samples for s in sources]}
    convert = {"global_batch": global_batch, "tokens_per_sample": tokens_per_sample}
    starts = spec.stage_starts(**convert, check_order=False)
    pending = None
    try:
        spec.stage_starts(**convert)
    except MixtureError as exc:
        if not defer_stage_order or not any(st.unit == "steps" for st in spec.stages):
            raise
        pending = exc
    if pending is None:
        schedule = MixtureSchedule.from_spec(spec, starts=starts, mean_sizes=inputs["mean_sizes"],
                                             epoch_sizes=inputs["epoch_sizes"])
    else:
        # The stages up to the first that does not increase: enough to open the mixture
        # (its sources, columns, working set) until a checkpoint fixes the rest.
        n = next(j for j in range(1, len(starts)) if starts[j] <= starts[j - 1])
        schedule = MixtureSchedule.from_spec(
            _first_stages(spec, n), starts=starts[:n], mean_sizes=inputs["mean_sizes"],
            epoch_sizes=inputs["epoch_sizes"])
    mix = MixedDataset(sources, schedule, names=spec.source_names, columns=columns, spec=spec,
                       schedule_inputs=inputs)
    mix.pending_error = pending
    return mix


def _first_stages(spec, n: int):
    """``spec`` with only its first ``n`` stages."""
    import dataclasses

    return dataclasses.replace(
        spec, stages=spec.stages[:n],
        sources=tuple(dataclasses.replace(s, weights=s.weights[:n]) for s in spec.sources))


def mixture_spec(mixture):
    """A :class:`~zephon_store.format.mixture_file.MixtureSpec` from a mixture file path, its
    dict or a spec."""
    from ..format.mixture_file import MixtureSpec, load_mixture_file

    if isinstance(mixture, MixtureSpec):
        return mixture
    if isinstance(mixture, dict):
        return MixtureSpec.from_dict(mixture)
    return load_mixture_file(mixture)


def mean_sample_size(dataset, unit: str, *, name: str = "") -> float:
    """Mean ``unit`` ("tokens" or "bytes") per sample of ``dataset``, from its manifest.

    Tokens: the window length of a packed dataset (``seq_len`` in its manifest's packing
    entry; each sample trains on that many tokens). Bytes: the stored (compressed) bytes of
    its row groups per sample. An unpacked dataset records no token counts: token weights
    need packed sources (or weights in bytes).
    """
    m = dataset.manifest
    if unit == "bytes":
        return float(m.stored_row_group_bytes) / max(1, m.num_samples)
    if unit == "tokens":
        info = m.packing
        if info is None or "seq_len" not in info:
            raise MixtureError(
                f"mixture source {name!r} ({dataset.url}) is not packed, so its manifest "
                "records no tokens per sample; token weights need sources converted with "
                "--tokenizer and --seq-len (or give the weights in samples or bytes)")
        return float(info["seq_len"])
    raise MixtureError(f"unknown weight unit {unit!r}; use samples, tokens or bytes")


def _tokens_per_sample(spec, sources) -> int | None:
    """The window length shared by every packed source (stage starts in tokens), or None."""
    if not any(st.unit == "tokens" for st in spec.stages):
        return None
    lens = {int(mean_sample_size(s, "tokens", name=n))
            for n, s in zip(spec.source_names, sources)}
    if len(lens) != 1:
        raise MixtureError(f"{spec.origin}: stage starts in tokens need one window length "
                           f"across sources, got {sorted(lens)}; give the starts in samples")
    return lens.pop()
