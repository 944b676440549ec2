"""Mixtures: mixture position ``p`` -> (source ``k``, position in source ``k``'s own stream).

A pure function of ``(stage schedule, caps, p)``, computed per position in O(log K) integer
operations; nothing is replayed, so locating position 10**12 costs what position 0 costs.
Each source then keeps its own :class:`~zephon_store.order.Order` (its seed-derived key,
locality and epochs): the index returned here is a position in that source's own stream.

Within a stage, the weights are exact fractions over one integer denominator and a
:class:`~zephon_store.order.interleave.SplitTree` (a balanced tree of two-way Beatty splits)
routes each position: a source at depth ``d`` holds, after any ``n`` positions of a stage,
``count_k(n)`` with ``|count_k(n) - n*w_k| <= d/2`` (for every ``n``, however large), and any
``B`` consecutive positions hold it within ``d`` of ``B*w_k``; ``d <= ceil(log2 K)``
(:attr:`MixtureSchedule.bound` is the prefix bound, docs/mixtures.md the proof).

A stage starting at ``P_j`` continues every source where the previous stage left it: the
offsets ``o_{j,k} = consumed_k(P_j)`` are closed-form counts, so position ``p`` of stage
``j`` maps to ``(k, o_{j,k} + count within the stage)``. Appending a stage at a resume point
therefore neither repeats nor skips a sample of any source.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .._util import weights as _w
from .._util.hashing import xxh3_hex
from ..errors import MixtureError, SourceExhaustedError
from .interleave import SplitTree

__all__ = ["MIXTURE_ALGORITHM", "MixtureSchedule", "POLICIES", "sample_weights"]


def _check_weights(values, **kw) -> list[Fraction]:
    return _w.check_weights(values, error=MixtureError, **kw)


def _integer_weights(weights, **kw) -> tuple[list[int], int]:
    return _w.integer_weights(weights, error=MixtureError, **kw)


def _parse_weight(value, where: str) -> Fraction:
    return _w.parse_weight(value, where, error=MixtureError)


#: Version of the position -> (source, index) mapping. Any change that moves a sample to
#: another mixture position for the same schedule must bump it, so old checkpoints are
#: refused instead of silently resuming into a different mix.
MIXTURE_ALGORITHM = 1
#: What happens when a source capped by ``max_epochs`` runs out.
POLICIES = ("error", "renormalize")
_VERSION = 1
# Positions are int64 and the interleave's products stay under 2**62 (order/interleave.py);
# an exhaustion point further out than this is "never" for any run.
_MAX_POSITION = 1 << 62
# Positions per vectorised pass of locate: the per-level gathers then stay in L2 cache
# (docs/benchmarks.md, "Why the code is shaped this way: loading").
_PASS_ELEMENTS = 1 << 16
_DICT_KEYS = ("version", "algorithm", "policy", "sources", "stages")
_SOURCE_KEYS = ("name", "max_epochs", "epoch_size")
_STAGE_KEYS = ("name", "start", "weights", "consumed")


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass
class _Segment:
    """A run of positions ``[start, stop)`` with one weight vector and per-source offsets."""

    start: int
    stop: int | None
    stage: int
    derived: bool           # an implicit boundary (a capped source ran out), not a user stage
    weights: tuple[Fraction, ...]
    offsets: tuple[int, ...]
    tree: SplitTree

    def __post_init__(self) -> None:
        self.offset_array = np.asarray(self.offsets, dtype=np.int64)

    def consumed_at(self, p: int) -> list[int]:
        return [o + c for o, c in zip(self.offsets, self.tree.counts(p - self.start))]


class MixtureSchedule:
    """Stages of source weights over mixture positions; maps each position to a source sample.

    ``stages`` is a sequence of ``(start, weights)``: ``start`` in mixture samples (the first
    stage starts at 0, starts strictly increase), ``weights`` one per source (numbers or
    fraction strings such as ``"1/3"``; a mapping by name when ``names`` are given, absent
    names weighing 0). Weights must sum to 1 (within 1e-9) unless ``normalize`` (the mixture
file's ``normalize = true``; the old spelling ``normalise=`` still works and warns).

    Optional caps: ``max_epochs[k]`` (None = uncapped) with ``epoch_sizes[k]`` (samples in
    one epoch of source ``k``); when a capped source runs out, ``policy="error"`` ends the
    mixture there (:class:`~zephon_store.errors.SourceExhaustedError`) and
    ``policy="renormalize"`` continues with the other sources' weights renormalised (an
    implicit, derived stage boundary).

    Schedules are immutable; :meth:`append_stage` returns a new one.

    >>> s = MixtureSchedule([(0, [0.5, 0.3, 0.2]), (10, [0.2, 0.3, 0.5])],
    ...                     names=["web", "code", "math"])
    >>> src, idx = s.locate(np.arange(12))
    >>> src.tolist(), idx.tolist()
    ([0, 1, 2, 0, 0, 1, 0, 2, 1, 0, 1, 2], [0, 0, 0, 1, 2, 1, 3, 1, 2, 4, 3, 2])
    >>> s.consumed(10).tolist(), s.position_of(1, np.array([3])).tolist()
    ([5, 3, 2], [10])
    """

    def __init__(self, stages: Sequence[tuple[int, Sequence[object] | Mapping[str, object]]],
                 *, names: Sequence[str] | None = None,
                 stage_names: Sequence[str | None] | None = None,
                 max_epochs: Sequence[int | None] | None = None,
                 epoch_sizes: Sequence[int | None] | None = None,
                 policy: str = "error", normalize: bool = False,
                 normalise: bool | None = None) -> None:
        normalize = _normalize(normalize, normalise, "MixtureSchedule")
        try:
            stages = [tuple(st) for st in stages]
        except TypeError:
            raise MixtureError(f"stages must be a sequence of (start, weights) pairs, e.g. "
                               f"[(0, [0.7, 0.3])], got {stages!r}") from None
        if not stages:
            raise MixtureError("a mixture schedule needs at least one stage (start, weights)")
        if names is not None:
            names = [str(n) for n in names]
            if len(set(names)) != len(names):
                dup = next(n for n in names if names.count(n) > 1)
                raise MixtureError(f"source name {dup!r} is given twice; names must be unique")
        k = len(names) if names is not None else None
        if k is None:
            first = stages[0][1] if len(stages[0]) == 2 else None
            if isinstance(first, Mapping):
                raise MixtureError("weights given by name need names=[...] for the sources")
            k = len(first) if hasattr(first, "__len__") else 0
        self._names = tuple(names) if names is not None else None
        self._k = k
        if stage_names is not None and len(stage_names) != len(stages):
            raise MixtureError(f"{len(stage_names)} stage names for {len(stages)} stages")
        self._stage_names = tuple(stage_names) if stage_names is not None else (None,) * len(stages)
        self._policy = policy
        if policy not in POLICIES:
            raise MixtureError(f"exhaustion policy must be one of {list(POLICIES)}, got {policy!r}")
        self._max_epochs = self._per_source(max_epochs, "max_epochs")
        self._epoch_sizes = self._per_source(epoch_sizes, "epoch_sizes")
        for i, (cap, size) in enumerate(zip(self._max_epochs, self._epoch_sizes)):
            if cap is not None and size is None:
                raise MixtureError(f"{self._label(i)} has max_epochs={cap} but no epoch size; "
                                   "pass epoch_sizes (samples per epoch of each source)")
        self._starts: list[int] = []
        self._weights: list[tuple[Fraction, ...]] = []
        for j, stage in enumerate(stages):
            try:
                start, weights = stage
            except (TypeError, ValueError):
                raise MixtureError(f"stage {j} must be a pair (start, weights), got "
                                   f"{stage!r}") from None
            self._add_stage(j, start, weights, normalize=normalize)
        self._build()

    # --- construction -------------------------------------------------------------------
    def _label(self, k: int) -> str:
        return f"source {self._names[k]!r}" if self._names else f"source {k}"

    def _stage_label(self, j: int) -> str:
        name = self._stage_names[j] if j < len(self._stage_names) else None
        return f"stage {name!r}" if name else f"stage {j}"

    def _by_name(self, values, what: str, default):
        """A mapping name -> value as a list in source order (absent names get ``default``)."""
        if not isinstance(values, Mapping):
            return values
        if self._names is None:
            raise MixtureError(f"{what} given by name need names=[...] for the sources")
        unknown = sorted(set(values) - set(self._names))
        if unknown:
            raise MixtureError(f"{what} names unknown source {unknown[0]!r}; sources are "
                               f"{list(self._names)}")
        return [values.get(n, default) for n in self._names]

    def _per_source(self, values, what: str) -> tuple[int | None, ...]:
        if values is None:
            return (None,) * self._k
        values = self._by_name(values, what, None)
        values = list(values)
        if len(values) != self._k:
            raise MixtureError(f"{what} has {len(values)} entries for {self._k} sources")
        for i, v in enumerate(values):
            if v is not None and (not _is_int(v) or v <= 0):
                raise MixtureError(f"{what} of {self._label(i)} must be an int > 0 or None, "
                                   f"got {v!r}")
        return tuple(None if v is None else int(v) for v in values)

    def _weight_vector(self, j: int, weights, normalize: bool) -> tuple[Fraction, ...]:
        where = self._stage_label(j)
        if isinstance(weights, Mapping):
            weights = self._by_name(weights, f"{where}: weights", 0)
        elif isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence | np.ndarray):
            raise MixtureError(f"{where}: weights must be a sequence (one per source), got "
                               f"{weights!r}")
        weights = list(weights)
        if len(weights) != self._k:
            raise MixtureError(f"{where}: {len(weights)} weights for {self._k} sources")
        exact = _check_weights(weights, normalize=normalize, where=where, names=self._names)
        nums, den = _integer_weights(exact, where=where, names=self._names)
        return tuple(Fraction(m, den) for m in nums)

    def _add_stage(self, j: int, start: object, weights, *, normalize: bool) -> None:
        if not _is_int(start) or not 0 <= start < _MAX_POSITION:
            raise MixtureError(f"{self._stage_label(j)}: start must be an int >= 0 (mixture "
                               f"samples) and below 2**62, got {start!r}")
        start = int(start)
        if j == 0 and start != 0:
            raise MixtureError(f"{self._stage_label(0)} starts at {start}; the first stage "
                               "must start at 0")
        if j > 0 and start <= self._starts[-1]:
            raise MixtureError(
                f"{self._stage_label(j)} starts at {start}, not after the previous stage's "
                f"start {self._starts[-1]}; stage starts must strictly increase")
        self._weights.append(self._weight_vector(j, weights, normalize))
        self._starts.append(start)

    def _build(self) -> None:
        """Sweep the stages once, in closed form: offsets and the implicit exhaustion points."""
        caps = [None if c is None else c * s for c, s in zip(self._max_epochs, self._epoch_sizes)]
        segs: list[_Segment] = []
        exhausted: set[int] = set()
        offsets = [0] * self._k
        self._end: int | None = None
        self._end_source: int | None = None
        self._exhausted: dict[int, int] = {}
        self._boundary_consumed: list[tuple[int, ...]] = []
        for j, (start, weights) in enumerate(zip(self._starts, self._weights)):
            stop = self._starts[j + 1] if j + 1 < len(self._starts) else None
            if segs:
                offsets = segs[-1].consumed_at(start)
            self._boundary_consumed.append(tuple(offsets))
            if self._end is not None:
                continue
            cur = start
            while True:
                eff = list(weights)
                if self._policy == "renormalize" and exhausted:
                    eff = [Fraction(0) if k in exhausted else w for k, w in enumerate(eff)]
                    left = sum(eff, Fraction(0))
                    if left == 0:
                        self._end, self._end_source = cur, None
                        break
                    eff = [w / left for w in eff]
                nums, den = _integer_weights(eff, where=self._stage_label(j),
                                             names=self._names)
                eff_w = tuple(Fraction(m, den) for m in nums)
                seg = _Segment(cur, stop, j, cur != start, eff_w, tuple(offsets), SplitTree(nums))
                if segs and segs[-1].start == cur:
                    segs.pop()   # an empty derived segment: a source ran out at its first item
                segs.append(seg)
                hit = None
                for k, cap in enumerate(caps):
                    if cap is None or k in exhausted or k not in seg.tree.paths:
                        continue
                    x = cur + seg.tree.position(k, cap - offsets[k])
                    if (stop is None or x < stop) and x < _MAX_POSITION and (
                            hit is None or x < hit[0]):
                        hit = (x, k)
                if hit is None:
                    break
                x, k = hit
                seg.stop = x
                self._exhausted[k] = x
                if self._policy == "error":
                    self._end, self._end_source = x, k
                    break
                offsets = seg.consumed_at(x)
                exhausted.add(k)
                cur = x
        self._segments = segs
        self._seg_starts = np.asarray([s.start for s in segs], dtype=np.int64)
        self._seg_start_list = [s.start for s in segs]
        self._bound = Fraction(max(s.tree.depth for s in segs), 2)

    @classmethod
    def from_spec(cls, spec: Any, *, global_batch: int | None = None,
                  tokens_per_sample: int | None = None,
                  mean_sizes: Sequence[float] | Mapping[str, float] | None = None,
                  epoch_sizes: Sequence[int] | Mapping[str, int] | None = None,
                  starts: Sequence[int] | None = None) -> MixtureSchedule:
        """The schedule of a mixture file's spec (:class:`zephon_store.format.mixture_file.MixtureSpec`).

        ``global_batch`` converts stage starts in steps, ``tokens_per_sample`` starts in
        tokens (:meth:`~zephon_store.format.mixture_file.MixtureSpec.stage_starts`, for a
        run from step 0); ``starts`` gives the starts in samples instead (a resume passes the
        ones its checkpoint fixed). ``mean_sizes`` (mean tokens or bytes per sample of each
        source, from its manifest) converts token/byte weights to sample weights
        (:func:`sample_weights`, in expectation); ``epoch_sizes`` (samples per epoch) are
        needed for capped sources. Every error names the spec's file.
        """
        names = list(spec.source_names)
        if starts is None:
            starts = spec.stage_starts(global_batch=global_batch,
                                       tokens_per_sample=tokens_per_sample)
        weights = spec.stage_weights()
        try:
            if spec.weight_unit != "samples":
                if mean_sizes is None:
                    raise MixtureError(
                        f"weights are in {spec.weight_unit}; converting them to sample "
                        f"weights needs mean_sizes (mean {spec.weight_unit} per sample of "
                        "each source)")
                sizes = _in_source_order(mean_sizes, names, "mean_sizes", spec.origin)
                weights = [sample_weights(w, sizes) for w in weights]
            sizes = None if epoch_sizes is None else _in_source_order(
                epoch_sizes, names, "epoch_sizes", spec.origin)
            return cls(list(zip(starts, weights)), names=names,
                       stage_names=list(spec.stage_names), max_epochs=list(spec.max_epochs),
                       epoch_sizes=sizes, policy=spec.exhaustion)
        except MixtureError as exc:
            if str(exc).startswith(spec.origin):
                raise
            raise MixtureError(f"{spec.origin}: {exc}") from None

    # --- properties ---------------------------------------------------------------------
    @property
    def num_sources(self) -> int:
        """Number of sources (including ones with weight 0 in some stages)."""
        return self._k

    @property
    def names(self) -> tuple[str, ...] | None:
        """Source names, if given."""
        return self._names

    @property
    def policy(self) -> str:
        """The exhaustion policy: ``"error"`` or ``"renormalize"``."""
        return self._policy

    @property
    def stages(self) -> list[tuple[int, tuple[Fraction, ...]]]:
        """The explicit stages as ``(start, exact weights)``."""
        return list(zip(self._starts, self._weights))

    @property
    def end(self) -> int | None:
        """First position the mixture cannot serve (a capped source ran out), or None."""
        return self._end

    def end_reason(self) -> str | None:
        """Why the mixture ends at :attr:`end` (None: it does not end), for messages.

        >>> s = MixtureSchedule([(0, [0.5, 0.5])], names=["a", "b"], max_epochs=[None, 1],
        ...                     epoch_sizes=[10, 3])
        >>> s.end, s.end_reason()
        (7, "source 'b' runs out (max_epochs=1 of 3 samples) and the exhaustion policy is 'error'")
        """
        if self._end is None:
            return None
        if self._end_source is None:
            return "every source is exhausted (max_epochs)"
        k = self._end_source
        return (f"{self._label(k)} runs out (max_epochs={self._max_epochs[k]} of "
                f"{self._epoch_sizes[k]} samples) and the exhaustion policy is 'error'")

    @property
    def bound(self) -> Fraction:
        """Prefix bound: within a stage, ``|count_k(n) - n*w_k| <= bound`` for every ``n``.

        It is ``depth/2`` for the deepest source of the split tree (``ceil(log2 K)/2``
        for K sources with a weight > 0); any window of consecutive positions inside a stage
        holds each source within ``2*bound`` of its share.
        """
        return self._bound

    # --- the mapping ----------------------------------------------------------------------
    def _check_positions(self, positions) -> np.ndarray:
        p = _int_array(positions, "mixture position")
        if self._end is not None and p.size and int(p.max()) >= self._end:
            self._raise_end(int(p.max()))
        return p

    def _raise_end(self, p: int) -> None:
        if self._end_source is None:
            raise SourceExhaustedError(
                f"every source of the mixture is exhausted (max_epochs) at position "
                f"{self._end}; position {p} cannot be served; raise max_epochs or add a source "
                "in a new stage", position=self._end)
        k = self._end_source
        name = self._names[k] if self._names else k
        raise SourceExhaustedError(
            f"{self._label(k)} runs out at mixture position {self._end} (max_epochs="
            f"{self._max_epochs[k]} epochs of {self._epoch_sizes[k]} samples) and the "
            f"exhaustion policy is 'error'; position {p} cannot be served; raise max_epochs, "
            "lower its weight in a new stage, or use policy 'renormalize'",
            source=name, position=self._end)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, index in that source's own stream) of each mixture position (int64 arrays).

        O(log K) integer operations per position; no replay. Raises
        :class:`~zephon_store.errors.SourceExhaustedError` at or past :attr:`end`.
        """
        p = self._check_positions(positions)
        flat = p.reshape(-1)
        src = np.empty(flat.shape, dtype=np.int64)
        idx = np.empty(flat.shape, dtype=np.int64)
        for a in range(0, len(flat), _PASS_ELEMENTS):
            part = flat[a:a + _PASS_ELEMENTS]
            seg_of = np.searchsorted(self._seg_starts, part, side="right") - 1
            first, last = int(seg_of.min(initial=0)), int(seg_of.max(initial=0))
            for s in range(first, last + 1):
                seg = self._segments[s]
                sel = slice(None) if first == last else seg_of == s
                k, n = seg.tree.locate(part[sel] - seg.start)
                src[a:a + _PASS_ELEMENTS][sel] = k
                idx[a:a + _PASS_ELEMENTS][sel] = seg.offset_array[k] + n
        return src.reshape(p.shape), idx.reshape(p.shape)

    def _segment_at(self, p: int) -> _Segment:
        return self._segments[bisect.bisect_right(self._seg_start_list, p) - 1]

    def consumed(self, position) -> np.ndarray:
        """Samples of each source before ``position`` (shape ``(K,)``; ``(n, K)`` for an array).

        Closed form, O(K log K) per position. ``position`` may equal :attr:`end`.
        """
        if np.ndim(position) == 0:
            if not _is_int(position) or position < 0:
                raise MixtureError(f"position must be an int >= 0, got {position!r}")
            p = int(position)
            if self._end is not None and p > self._end:
                self._raise_end(p)
            return np.asarray(self._segment_at(p).consumed_at(p), dtype=np.int64)
        p = np.asarray(position)
        if p.size and self._end is not None:
            self._check_positions(p[p != self._end])
        else:
            p = self._check_positions(p)
        p = p.astype(np.int64)
        out = np.empty((p.size, self._k), dtype=np.int64)
        flat = p.reshape(-1)
        seg_of = np.searchsorted(self._seg_starts, flat, side="right") - 1
        for s in np.unique(seg_of):
            seg = self._segments[s]
            sel = seg_of == s
            out[sel] = seg.offset_array + np.stack(seg.tree.counts(flat[sel] - seg.start),
                                                   axis=-1)
        return out.reshape((*p.shape, self._k))

    def position_of(self, source: int, index: np.ndarray) -> np.ndarray:
        """Mixture position of source ``source``'s sample ``index`` (its own stream position).

        The inverse of :meth:`locate`, O(log K) per index. ``-1`` where that index is never
        reached (the source's weight drops to 0 before it, or the mixture ends first).
        """
        if not _is_int(source) or not 0 <= source < self._k:
            raise MixtureError(f"source must be an int in [0, {self._k}), got {source!r}")
        i = _int_array(index, "source index")
        flat = i.reshape(-1)
        out = np.full(flat.shape, -1, dtype=np.int64)
        offs = np.asarray([s.offsets[source] for s in self._segments], dtype=np.int64)
        seg_of = np.searchsorted(offs, flat, side="right") - 1
        for s in np.unique(seg_of):
            seg = self._segments[s]
            if source not in seg.tree.paths:
                continue
            sel = np.nonzero(seg_of == s)[0]
            local = flat[sel] - seg.offsets[source]
            # Items whose position lies past int64 never occur; leaving them out also keeps
            # every intermediate of the exact inverse (each <= the result) inside int64.
            w = seg.weights[source]
            far = (local.astype(np.float64) + 1) * (w.denominator / w.numerator) \
                + seg.start > _MAX_POSITION / 2
            sel, local = sel[~far], local[~far]
            pos = seg.start + seg.tree.position(source, local)
            limit = seg.stop if seg.stop is not None else self._end
            if limit is not None:
                pos = np.where(pos < limit, pos, -1)
            out[sel] = pos
        return out.reshape(i.shape)

    # --- stages, caps and summaries -------------------------------------------------------
    def append_stage(self, start: int, weights: Sequence[object] | Mapping[str, object], *,
                     cursor: int | None = None, name: str | None = None,
                     normalize: bool = False,
                     epoch_sizes: Sequence[int | None] | Mapping[str, int | None] | None = None,
                     normalise: bool | None = None) -> MixtureSchedule:
        """A new schedule with one more stage from ``start`` (e.g. a resume cursor).

        Positions before ``start`` keep their samples; every source continues from its
        consumed count at ``start``, so nothing is repeated or skipped. ``start`` must come
        after the last stage's start and, if given, at or after ``cursor`` (positions
        already consumed cannot change). Longer ``weights`` (or new names in a mapping) add
        sources, weighing 0 before ``start``; dropping a source is weight 0. A source added
        here is uncapped; ``epoch_sizes`` (by name, or one per added source) records its
        samples per epoch, as the schedule records every other source's.

        >>> s = MixtureSchedule([(0, [0.5, 0.5])], names=["a", "b"])
        >>> t = s.append_stage(8, {"b": 0.25, "c": 0.75}, cursor=8)
        >>> t.names, t.consumed(8).tolist(), t.locate(np.arange(8, 12))[0].tolist()
        (('a', 'b', 'c'), [4, 4, 0], [2, 1, 2, 2])
        """
        if cursor is not None and _is_int(start) and start < cursor:
            raise MixtureError(
                f"the new stage starts at {start}, before the cursor {cursor}: positions "
                "already consumed cannot change their mix; start it at or after the cursor")
        names = list(self._names) if self._names is not None else None
        if isinstance(weights, Mapping):
            if names is None:
                raise MixtureError("weights given by name need a schedule with source names")
            names += [n for n in weights if n not in names]
            k_new = len(names)
        else:
            k_new = max(self._k, len(list(weights)))
            if names is not None and k_new > len(names):
                raise MixtureError(f"{k_new - len(names)} new sources need names: give the "
                                   "weights as a mapping name -> weight")
        pad = (Fraction(0),) * (k_new - self._k)
        if not isinstance(weights, Mapping):
            weights = [*weights, *[0] * (k_new - len(list(weights)))]
        new = MixtureSchedule.__new__(MixtureSchedule)
        new._names = tuple(names) if names is not None else None
        new._k = k_new
        new._stage_names = (*self._stage_names, name)
        new._policy = self._policy
        new._max_epochs = (*self._max_epochs, *[None] * len(pad))
        added: list = [None] * len(pad)
        if isinstance(epoch_sizes, Mapping) and new._names is not None:
            added = [epoch_sizes.get(n) for n in new._names[self._k:]]
        elif epoch_sizes is not None and not isinstance(epoch_sizes, Mapping):
            added = list(epoch_sizes)
            if len(added) != len(pad):
                raise MixtureError(f"epoch_sizes has {len(added)} entries for the "
                                   f"{len(pad)} sources this stage adds")
        new._epoch_sizes = new._per_source([*self._epoch_sizes, *added], "epoch_sizes")
        new._starts = list(self._starts)
        new._weights = [(*w, *pad) for w in self._weights]
        new._add_stage(len(new._starts), start, weights,
                       normalize=_normalize(normalize, normalise, "append_stage"))
        new._build()
        return new

    def exhausted_at(self) -> dict[int, int | None]:
        """For each capped source: the first mixture position that would need a sample past
        its cap (where it runs out), or None if it never does. Closed form, for ``plan``.

        >>> s = MixtureSchedule([(0, [0.5, 0.5])], max_epochs=[None, 2], epoch_sizes=[10, 3],
        ...                     policy="renormalize")
        >>> s.exhausted_at(), s.locate(np.arange(10, 14))[0].tolist()
        ({1: 13}, [0, 1, 0, 0])
        """
        return {k: self._exhausted.get(k) for k, c in enumerate(self._max_epochs)
                if c is not None}

    def realized(self, start: int, stop: int) -> list[dict[str, Any]]:
        """Per segment overlapping ``[start, stop)``: its weights, the realized proportions and
        per-source counts, each source's consumed count at the segment's end (and its epochs,
        when epoch sizes are known). ``stop`` is clipped to :attr:`end`. For ``zephon plan``
        and ``zephon info``.

        >>> s = MixtureSchedule([(0, ["1/3", "2/3"]), (6, [1, 0])])
        >>> [(r["start"], r["stop"], r["counts"]) for r in s.realized(0, 9)]
        [(0, 6, [2, 4]), (6, 9, [3, 0])]
        """
        if not (_is_int(start) and _is_int(stop) and 0 <= start <= stop):
            raise MixtureError(f"realized needs 0 <= start <= stop, got {start!r}, {stop!r}")
        if self._end is not None:
            stop = min(stop, self._end)
        rows = []
        for seg in self._segments:
            a = max(start, seg.start)
            b = stop if seg.stop is None else min(stop, seg.stop)
            if a >= b:
                continue
            before, after = seg.consumed_at(a), seg.consumed_at(b)
            counts = [y - x for x, y in zip(before, after)]
            row = {
                "stage": seg.stage, "name": self._stage_names[seg.stage],
                "derived": seg.derived, "start": a, "stop": b,
                "weights": [float(w) for w in seg.weights],
                "counts": counts,
                "proportions": [c / (b - a) for c in counts],
                "consumed": after,
            }
            if any(s is not None for s in self._epoch_sizes):
                row["epochs"] = [None if s is None else c / s
                                 for c, s in zip(after, self._epoch_sizes)]
            rows.append(row)
        return rows

    # --- state ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Small JSON: stages (start, exact weights, per-source consumed counts at the start),
        sources (name, caps) and the policy. Identical on every rank.

        >>> MixtureSchedule([(0, [0.7, 0.3])]).to_dict()["stages"]
        [{'name': None, 'start': 0, 'weights': ['7/10', '3/10'], 'consumed': [0, 0]}]
        """
        sources = [{"name": self._names[k] if self._names else None,
                    "max_epochs": self._max_epochs[k], "epoch_size": self._epoch_sizes[k]}
                   for k in range(self._k)]
        stages = [{"name": self._stage_names[j], "start": s,
                   "weights": [_w.fraction_text(w) for w in ws],
                   "consumed": list(self._boundary_consumed[j])}
                  for j, (s, ws) in enumerate(zip(self._starts, self._weights))]
        return {"version": _VERSION, "algorithm": MIXTURE_ALGORITHM, "policy": self._policy,
                "sources": sources, "stages": stages}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MixtureSchedule:
        """Strict inverse of :meth:`to_dict`; the recorded consumed counts are checked.

        >>> s = MixtureSchedule([(0, [0.5, 0.5]), (10, [0.1, 0.9])])
        >>> MixtureSchedule.from_dict(s.to_dict()).identity() == s.identity()
        True
        """
        _strict(d, _DICT_KEYS, "mixture state")
        if d["version"] != _VERSION:
            raise MixtureError(f"mixture state version {d['version']!r} is not known (this "
                               f"zephon_store reads version {_VERSION})")
        if d["algorithm"] != MIXTURE_ALGORITHM:
            raise MixtureError(
                f"mixture algorithm {d['algorithm']!r} is not known to this zephon_store (it "
                f"implements algorithm {MIXTURE_ALGORITHM}); use the version that wrote it")
        sources = d["sources"]
        stages = d["stages"]
        if not isinstance(sources, list) or not isinstance(stages, list):
            raise MixtureError("mixture state: 'sources' and 'stages' must be lists")
        for i, s in enumerate(sources):
            _strict(s, _SOURCE_KEYS, f"mixture state sources[{i}]")
        for j, s in enumerate(stages):
            _strict(s, _STAGE_KEYS, f"mixture state stages[{j}]")
        names = [s["name"] for s in sources]
        if any(n is None for n in names):
            if any(n is not None for n in names):
                raise MixtureError("mixture state: either every source has a name or none")
            names = None
        out = cls([(s["start"], s["weights"]) for s in stages], names=names,
                  stage_names=[s["name"] for s in stages],
                  max_epochs=[s["max_epochs"] for s in sources],
                  epoch_sizes=[s["epoch_size"] for s in sources], policy=d["policy"])
        for j, s in enumerate(stages):
            exact = [_parse_weight(w, f"mixture state stages[{j}]") for w in s["weights"]]
            if tuple(exact) != out._weights[j]:
                raise MixtureError(f"mixture state stages[{j}]: weights {s['weights']} are not "
                                   "exact fractions summing to 1 (to_dict writes them exactly)")
            if list(s["consumed"]) != list(out._boundary_consumed[j]):
                raise MixtureError(
                    f"mixture state stages[{j}] (start {s['start']}): recorded consumed counts "
                    f"{list(s['consumed'])} differ from the schedule's "
                    f"{list(out._boundary_consumed[j])}; the checkpoint was written with other "
                    "stages, weights or caps than it now describes")
        return out

    def identity(self) -> str:
        """A stable string naming this schedule (``"xxh3:" + hash of its canonical JSON``)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return "xxh3:" + xxh3_hex(text.encode())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MixtureSchedule) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.identity())

    def __repr__(self) -> str:
        stages = ", ".join(f"({s}, [{', '.join(_w.fraction_text(w) for w in ws)}])"
                           for s, ws in zip(self._starts, self._weights))
        return f"MixtureSchedule([{stages}], names={self._names}, policy={self._policy!r})"


def _in_source_order(values, names: list[str], what: str, origin: str) -> list:
    if isinstance(values, Mapping):
        missing = [n for n in names if n not in values]
        if missing:
            raise MixtureError(f"{origin}: {what} has no entry for source {missing[0]!r}")
        return [values[n] for n in names]
    values = list(values)
    if len(values) != len(names):
        raise MixtureError(f"{origin}: {what} has {len(values)} entries for {len(names)} sources")
    return values


def _int_array(values, what: str) -> np.ndarray:
    a = np.asarray(values)
    if a.dtype.kind not in "iu":
        raise MixtureError(f"{what}s must be integers, got dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a.size and int(a.min()) < 0:
        raise MixtureError(f"{what} {int(a.min())} is negative")
    return a


def _strict(d: object, keys: Sequence[str], where: str) -> None:
    if not isinstance(d, Mapping):
        raise MixtureError(f"{where} must be a mapping, got {type(d).__name__}")
    unknown = sorted(set(d) - set(keys))
    if unknown:
        raise MixtureError(f"{where}: unknown key {unknown[0]!r}; expected keys {list(keys)}")
    missing = [k for k in keys if k not in d]
    if missing:
        raise MixtureError(f"{where}: missing key {missing[0]!r}; expected keys {list(keys)}")


def sample_weights(weights: Sequence[object], mean_size: Sequence[float]) -> list[Fraction]:
    """Token (or byte) weights -> sample weights, given each source's mean tokens (bytes) per
    sample: ``w_sample[k] ∝ w_token[k] / mean_size[k]``.

    The mixture then draws samples in these proportions, so the share of *tokens* from each
    source matches the token weights in expectation (exactly when every sample of a source
    has the same size). A source with weight 0 may have any mean size.

    >>> [str(w) for w in sample_weights([0.5, 0.5], [100, 300])]
    ['3/4', '1/4']
    """
    ws = _check_weights(weights, where="token weights")
    if len(mean_size) != len(ws):
        raise MixtureError(f"{len(mean_size)} mean sizes for {len(ws)} weights")
    scaled = []
    for k, (w, m) in enumerate(zip(ws, mean_size)):
        if w == 0:
            scaled.append(Fraction(0))
            continue
        size = _parse_weight(m, f"mean size of source {k}")
        if size <= 0:
            raise MixtureError(f"mean size of source {k} must be > 0 (it has weight "
                               f"{float(w):g}), got {m!r}")
        scaled.append(w / size)
    total = sum(scaled, Fraction(0))
    return [s / total for s in scaled]


def _normalize(normalize: bool, normalise: bool | None, where: str) -> bool:
    """``normalize``, or the old spelling ``normalise`` (one release, with a warning)."""
    if normalise is None:
        return normalize
    import warnings

    warnings.warn(f"{where}(normalise=...) is now normalize=, as the mixture file spells it; "
                  "the old spelling goes in the next release", DeprecationWarning, stacklevel=3)
    return bool(normalise) or normalize
