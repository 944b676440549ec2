"""The order: a seeded, stateless bijection from stream position to sample id, per epoch.

The sample at position ``p`` is a pure function of ``(row_group_rows, options, p)``: nothing
here holds an RNG, so a checkpoint needs only the options and a cursor, and every host
computes the same id for the same position whatever the world size (DESIGN section 1).

Shuffled mode, for epoch ``e = p // N`` and ``q = p % N`` (see ``docs/order.md``):

1. permute the blocks (row groups) with a keyed bijection of ``(seed, e)``; concatenating
   the permuted blocks gives a sequence ``S`` of ``N`` samples;
2. cut ``S`` into ``P`` lanes; lane ``l`` is the contiguous run holding ``ceil((N - l) / P)``
   samples, so lanes differ in size by at most one;
3. inside each lane, shuffle the samples within consecutive windows of ``w`` samples
   (about ``window_blocks`` blocks' worth), keyed by ``(seed, e, lane, window)``;
4. interleave the lanes: position ``q`` is sample ``q // P`` of lane ``q % P``.

Memory is O(num_blocks): the block permutation and its cumulative sizes for the most recently
used epoch. No O(N) table is ever built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Order", "OrderOptions", "permute", "unpermute", "derive_key", "shuffle_quality"]

_U64 = np.uint64
_MASK64 = (1 << 64) - 1
# Odd 64-bit constants: the golden ratio (splitmix64's increment) and murmur3's fmix64
# multipliers; they are what make the mixer below a full-avalanche bijection of uint64.
_GOLDEN = 0x9E3779B97F4A7C15
_FMIX1 = 0xFF51AFD7ED558CCD
_FMIX2 = 0xC4CEB9FE1A85EC53
# Domain tags keep the block-permutation key and the window keys apart even when
# (lane, window) happen to equal other inputs of the hash.
_TAG_BLOCKS = 0x626C6F636B73  # "blocks"
_TAG_WINDOW = 0x77696E646F77  # "window"
# Feistel rounds by domain width (bits). Luby-Rackoff's 4 rounds assume wide halves; with
# halves of a few bits the permutations are measurably non-uniform (chi-square tests of
# neighbour differences and of position marginals over 10^4+ keys: 4 rounds fail up to
# 12 bits, 6 pass from 7 bits, 3-bit domains with cycle walking need ~20). Small domains
# only occur for tiny windows (lane tails, tiny datasets), so the extra rounds cost little.
_ROUND_SCHEDULE = ((3, 24), (5, 12), (6, 8))  # (max bits, rounds); wider domains: 6
_ROUNDS_WIDE = 6
# Elements per vectorised pass: every Feistel step is one numpy pass over its operands, so
# the working arrays are kept small enough to stay in L2 cache (docs/benchmarks.md).
_PASS_ELEMENTS = 1 << 17
# Epoch tables kept per Order: the current epoch and its neighbour across a boundary.
_CACHED_EPOCHS = 2
_OPTION_KEYS = ("seed", "shuffle", "window_blocks", "lanes", "algorithm")
# lanes="auto": resolved once, from the dataset and the job at its first start (auto_lanes).
AUTO_LANES = "auto"
# Lanes per node that "auto" aims for: one lane per rank on an 8-GPU node, so a rank's decode
# working set is the same (window_blocks + 2 row groups) as with one lane at W = 1, while a
# later node count M' keeps the bound 1 + M' / P with P = 8 * (nodes at the start).
AUTO_LANES_PER_NODE = 8
# Version of the position -> id mapping. Any change that moves a sample to another position
# for the same options must bump it, so old checkpoints are refused instead of silently
# resuming into a different order.
ORDER_ALGORITHM = 1


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True)
class OrderOptions:
    """Options of the order; they go into checkpoints and are compared on resume.

    ``lanes`` is the requested lane count P, or ``"auto"`` (the default): the loader
    resolves ``"auto"`` once, at the run's first start, from the dataset and the number of
    nodes (:func:`auto_lanes`: 1 on one node, about 8 per node otherwise) and checkpoints
    the number, so a resume keeps the order. An :class:`Order` built straight from
    ``"auto"`` options is a one-node order (P = 1). The effective count is capped by the
    data (see :attr:`Order.effective_lanes`; docs/order.md, "Locality at scale").

    >>> OrderOptions(seed=7, window_blocks=4).to_dict()
    {'seed': 7, 'shuffle': True, 'window_blocks': 4, 'lanes': 'auto', 'algorithm': 1}
    >>> OrderOptions(seed=7).resolved(num_blocks=2000, num_samples=40000, nodes=8).lanes
    64
    >>> OrderOptions(window_blocks=0)
    Traceback (most recent call last):
    ...
    ValueError: window_blocks must be > 0, got 0
    """

    seed: int = 0
    shuffle: bool = True
    window_blocks: int = 8
    lanes: int | str = AUTO_LANES
    algorithm: int = ORDER_ALGORITHM

    def __post_init__(self) -> None:
        # True and 1.0 compare equal to 1 but no release writes them: exact ints only.
        if not _is_int(self.algorithm) or self.algorithm != ORDER_ALGORITHM:
            raise ValueError(
                f"order algorithm {self.algorithm!r} is not known to this zephon_store (it "
                f"implements algorithm {ORDER_ALGORITHM}); use the zephon_store version that "
                "wrote the checkpoint")
        if not _is_int(self.seed) or not 0 <= int(self.seed) <= _MASK64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.shuffle, (bool, np.bool_)):
            raise ValueError(f"shuffle must be a bool, got {self.shuffle!r}")
        for name in ("window_blocks", "lanes"):
            value = getattr(self, name)
            if name == "lanes" and value == AUTO_LANES:
                continue
            if not _is_int(value):
                also = f" or {AUTO_LANES!r}" if name == "lanes" else ""
                raise ValueError(f"{name} must be an int{also}, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        # Normalise numpy scalars so to_dict() is plain JSON and equality is exact.
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        object.__setattr__(self, "window_blocks", int(self.window_blocks))
        object.__setattr__(self, "algorithm", int(self.algorithm))
        if self.lanes != AUTO_LANES:
            object.__setattr__(self, "lanes", int(self.lanes))

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict of the options (the ``"order"`` entry of a checkpoint)."""
        return {key: getattr(self, key) for key in _OPTION_KEYS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OrderOptions:
        """Strict inverse of :meth:`to_dict`: an unknown or missing key raises ``ValueError``.

        >>> OrderOptions.from_dict({"seed": 1, "shuffle": False, "window_blocks": 8, "lanes": 1,
        ...                         "algorithm": 1})
        OrderOptions(seed=1, shuffle=False, window_blocks=8, lanes=1, algorithm=1)
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"order options must be a mapping, got {type(d).__name__}")
        unknown = sorted(set(d) - set(_OPTION_KEYS))
        if unknown:
            raise ValueError(
                f"unknown order option key {unknown[0]!r}; expected keys {list(_OPTION_KEYS)}"
            )
        missing = [key for key in _OPTION_KEYS if key not in d]
        if missing:
            raise ValueError(
                f"missing order option key {missing[0]!r}; expected keys {list(_OPTION_KEYS)}"
            )
        return cls(**{key: d[key] for key in _OPTION_KEYS})

    def replace(self, **changes: Any) -> OrderOptions:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def is_auto(self) -> bool:
        """Whether ``lanes`` is still ``"auto"`` (not resolved for a job yet)."""
        return self.lanes == AUTO_LANES

    def resolved(self, num_blocks: int, num_samples: int, *, nodes: int = 1,
                 node_batch: int | None = None) -> OrderOptions:
        """These options with ``lanes="auto"`` replaced by :func:`auto_lanes`; else ``self``.

        Call it once, when a run first starts, and checkpoint the result: the lane count is
        part of the order, so a resume must use the number, not ``"auto"`` again.
        """
        if not self.is_auto:
            return self
        return self.replace(lanes=auto_lanes(num_blocks, num_samples,
                                             window_blocks=self.window_blocks, nodes=nodes,
                                             node_batch=node_batch))


def auto_lanes(num_blocks: int, num_samples: int, *, window_blocks: int = 8, nodes: int = 1,
               node_batch: int | None = None) -> int:
    """The lane count ``lanes="auto"`` stands for, for a run that starts on ``nodes`` nodes.

    - one node: 1. A node's amplification is 1 whatever the lanes, and one lane keeps every
      rank's decode working set at about ``window_blocks + 2`` row groups.
    - ``M`` nodes: ``P = M * k`` with ``k`` up to ``AUTO_LANES_PER_NODE`` (8), the largest
      that the data allows (``P <= num_blocks // window_blocks``, so every lane holds a
      window) and, among those, one that divides ``node_batch`` (the samples a node takes
      per step), so ``P`` divides the global batch and every node reads exactly ``k`` lanes
      of its own (read amplification 1, docs/order.md). When even ``k = 1`` does not fit,
      the largest count up to the cap that divides ``M * node_batch`` (else the cap).

    At another node count ``M'`` the rank rule keeps each node's amplification within
    about ``1 + M' / P`` (docs/order.md, "Locality at scale").

    >>> auto_lanes(20000, 400000, nodes=1), auto_lanes(20000, 400000, nodes=125, node_batch=64)
    (1, 1000)
    >>> auto_lanes(2000, 40000, nodes=64, node_batch=64)   # 250 lanes at most: k = 2
    128
    """
    for name, value in (("num_blocks", num_blocks), ("num_samples", num_samples),
                        ("window_blocks", window_blocks), ("nodes", nodes)):
        if not _is_int(value) or value <= 0:
            raise ValueError(f"{name} must be an int > 0, got {value!r}")
    if node_batch is not None and (not _is_int(node_batch) or node_batch <= 0):
        raise ValueError(f"node_batch must be an int > 0 or None, got {node_batch!r}")
    if nodes == 1:
        return 1
    cap = max(1, min(num_blocks // window_blocks, num_samples))
    fits = [k for k in range(AUTO_LANES_PER_NODE, 0, -1) if nodes * k <= cap]
    if fits:
        dividing = [k for k in fits if node_batch is not None and node_batch % k == 0]
        return nodes * (dividing or fits)[0]
    if node_batch is not None:
        batch = nodes * node_batch
        return next(p for p in range(cap, 0, -1) if batch % p == 0)
    return cap


# --------------------------------------------------------------------------- hashing


def _fmix64(x: np.ndarray) -> np.ndarray:
    """murmur3's finaliser, in place on a uint64 array: a bijection with full avalanche."""
    x ^= x >> _U64(33)
    x *= _U64(_FMIX1)
    x ^= x >> _U64(33)
    x *= _U64(_FMIX2)
    x ^= x >> _U64(33)
    return x


def _as_u64(x: int | np.ndarray) -> np.ndarray:
    """A uint64 array (at least 1-d) holding ``x`` modulo 2**64, without overflow warnings."""
    if isinstance(x, (int, np.integer)):
        return np.array([int(x) & _MASK64], dtype=_U64)
    arr = np.asarray(x)
    if arr.dtype == _U64:
        return np.atleast_1d(arr).copy()
    # int64 -> uint64 reinterpretation is the two's complement, i.e. modulo 2**64.
    return np.atleast_1d(arr.astype(np.int64)).view(_U64).copy()


def derive_key(*parts: int | np.ndarray) -> np.ndarray:
    """Hash integers (or int arrays, broadcast together) into 64-bit keys, splitmix64-style.

    Each part is folded in as ``h = fmix64((h + GOLDEN) ^ part)``, so the key depends on the
    order of the parts and on every bit of each. Scalar parts cost nothing per element.

    >>> derive_key(7, 0).shape
    (1,)
    >>> bool((derive_key(7, 0) != derive_key(7, 1)).all())
    True
    """
    h = np.array([_GOLDEN], dtype=_U64)
    for part in parts:
        h = _fmix64((h + _U64(_GOLDEN)) ^ _as_u64(part))
    return h


# --------------------------------------------------------------------------- permutation


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Exact ``int.bit_length`` of each element of a uint64 array, as uint64."""
    if v.size and int(v.max()) >= 1 << 53:
        # float64 would round these; fall back to a slower exact binary search.
        v = v.copy()
        b = np.zeros(v.shape, dtype=_U64)
        for s in (32, 16, 8, 4, 2, 1):
            t = v >> _U64(s)
            big = t != 0
            v = np.where(big, t, v)
            b += big.astype(_U64) * _U64(s)
        return b + v  # v is 0 or 1 now
    # Integers below 2**53 are exact in float64, and frexp's exponent is the bit length.
    return np.frexp(v.astype(np.float64))[1].astype(_U64)


def _rounds_for(bits: int) -> int:
    for max_bits, rounds in _ROUND_SCHEDULE:
        if bits <= max_bits:
            return rounds
    return _ROUNDS_WIDE


def _feistel(x: np.ndarray, bits: np.ndarray | np.uint64, key: np.ndarray,
             rounds: int) -> np.ndarray:
    """A keyed bijection of ``[0, 2**bits)``: an unbalanced Feistel network (overwrites ``x``).

    The value is split into a high half of ``hi`` bits and a low half of ``lo`` bits
    (``hi + lo = bits``). A round maps ``(L, R)`` to ``(R, L ^ F(R))``: ``R`` moves up, the
    mixed ``L`` moves down, and the two widths swap for the next round. Each round is
    invertible whatever ``F`` is, so the network is a bijection for any width, 0 and 1
    included. ``F`` is a multiply-xorshift-multiply hash of ``R + round key`` whose top
    ``hi`` bits are kept (the top bits of a product depend on every input bit).
    Buffers are reused because each numpy pass costs about as much as the arithmetic.
    """
    one = _U64(1)
    hi = (bits + one) >> one
    lo = bits >> one
    left = np.empty_like(x)
    f = np.empty_like(x)
    tmp = np.empty_like(x)
    # A single key stays a numpy scalar: a (1,)-shaped operand broadcasts more slowly.
    key0 = int(key.reshape(-1)[0]) if key.size == 1 else None
    for r in range(rounds):
        np.right_shift(x, lo, out=left)
        np.bitwise_and(x, (one << lo) - one, out=x)
        if key0 is not None:
            np.add(x, _U64((key0 + (r + 1) * _GOLDEN) & _MASK64), out=f)
        else:
            np.add(x, key + _U64((r + 1) * _GOLDEN & _MASK64), out=f)
        f *= _U64(_FMIX1)
        np.right_shift(f, _U64(29), out=tmp)
        f ^= tmp
        f *= _U64(_FMIX2)
        # Two shifts, because a single shift by 64 (hi == 0) is undefined.
        np.right_shift(f, _U64(63) - hi, out=f)
        f >>= one
        f ^= left
        np.left_shift(x, hi, out=x)
        x |= f
        hi, lo = lo, hi
    return x


def _pick(a: np.ndarray | np.uint64, sel: np.ndarray) -> np.ndarray | np.uint64:
    """``a[sel]`` for per-element arrays; scalars (and single keys) pass through."""
    return a if np.ndim(a) == 0 or a.size == 1 else a[sel]


def _feistel_inverse(y: np.ndarray, bits: np.ndarray | np.uint64, key: np.ndarray,
                     rounds: int) -> np.ndarray:
    """The inverse of :func:`_feistel` with the same ``bits``, ``key`` and ``rounds``.

    Round ``r`` of the forward network maps ``(L, R)`` (``hi`` and ``lo`` bits) to
    ``(R, L ^ F_r(R))``; undoing it reads ``R`` from the top ``lo`` bits, recomputes
    ``F_r(R)`` and xors it off the low ``hi`` bits. Rounds are undone last to first.
    """
    one = _U64(1)
    hi0 = (bits + one) >> one
    lo0 = bits >> one
    key0 = int(key.reshape(-1)[0]) if key.size == 1 else None
    x = y
    for r in range(rounds - 1, -1, -1):
        hi, lo = (hi0, lo0) if r % 2 == 0 else (lo0, hi0)  # widths before round r
        right = x >> hi
        g = x & ((one << hi) - one)
        if key0 is not None:
            f = right + _U64((key0 + (r + 1) * _GOLDEN) & _MASK64)
        else:
            f = right + (key + _U64((r + 1) * _GOLDEN & _MASK64))
        f *= _U64(_FMIX1)
        f ^= f >> _U64(29)
        f *= _U64(_FMIX2)
        f = (f >> (_U64(63) - hi)) >> one
        x = ((g ^ f) << lo) | right
    return x


def _walk(out: np.ndarray, todo: np.ndarray | None, bits: np.ndarray | np.uint64,
          keys: np.ndarray, n: np.ndarray | np.uint64, rounds: int,
          network: Callable = _feistel) -> None:
    """Cycle-walk ``out[todo]`` (all of ``out`` if ``None``) in place until each is below n.

    ``network`` is :func:`_feistel` (the permutation) or :func:`_feistel_inverse` (its
    inverse: walking the same cycles backwards lands on the preimage).
    """
    if todo is None:
        res = network(out, bits, keys, rounds)  # no gather for the common first pass
        if res is not out:   # _feistel works in place; its inverse returns a new array
            out[...] = res
        todo = np.flatnonzero(out >= n)
    while todo.size:
        nxt = network(out[todo], _pick(bits, todo), _pick(keys, todo), rounds)
        out[todo] = nxt
        todo = todo[nxt >= _pick(n, todo)]


def unpermute(values: np.ndarray | int, n: np.ndarray | int, key: np.ndarray | int) -> np.ndarray:
    """The inverse of :func:`permute`: ``unpermute(permute(i, n, k), n, k) == i``.

    Same arguments, cost and broadcasting as :func:`permute` (O(1) per element, nothing of
    size ``n``): the Feistel rounds are undone and the cycle walk runs backwards.

    >>> x = permute(np.arange(10), 10, 77)
    >>> unpermute(x, 10, 77).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    return permute(values, n, key, _network=_feistel_inverse)


def permute(indices: np.ndarray | int, n: np.ndarray | int, key: np.ndarray | int, *,
            _network: Callable = _feistel) -> np.ndarray:
    """Apply a keyed pseudo-random bijection of ``[0, n)`` to ``indices`` (all in ``[0, n)``).

    A Feistel network over the next power of two ``>= n``, with cycle walking: an output
    ``>= n`` is fed through the network again until it lands inside the domain. Walking
    terminates for every input (the walk follows the input's cycle, which returns to it),
    and since the power of two is below ``2n`` the expected number of passes is below 2.

    ``n`` and ``key`` are scalars or arrays broadcastable to ``indices``, so many windows
    of different sizes and keys are permuted in one vectorised call. Memory is a few
    arrays the size of ``indices``; nothing of size ``n`` is built.

    >>> sorted(permute(np.arange(5), 5, 123).tolist())
    [0, 1, 2, 3, 4]
    >>> permute(np.array([0]), 1, 9).tolist()
    [0]
    """
    idx = np.asarray(indices, dtype=np.int64)
    shape = idx.shape
    idx = idx.reshape(-1)
    if idx.size > _PASS_ELEMENTS:
        n_b = np.broadcast_to(np.asarray(n, dtype=np.int64), shape).reshape(-1)
        k_b = np.broadcast_to(np.asarray(key), shape).reshape(-1)
        single_n, single_k = np.size(n) == 1, np.size(key) == 1
        out = np.empty(idx.size, dtype=np.int64)
        for lo in range(0, idx.size, _PASS_ELEMENTS):
            hi = lo + _PASS_ELEMENTS
            out[lo:hi] = permute(idx[lo:hi], n if single_n else n_b[lo:hi],
                                 key if single_k else k_b[lo:hi], _network=_network)
        return out.reshape(shape)
    n_arr = np.asarray(n, dtype=np.int64)
    if n_arr.size and int(n_arr.min()) < 1:
        raise ValueError(f"permute domain size n must be >= 1, got {int(n_arr.min())}")
    if idx.size == 0:
        return np.zeros(shape, dtype=np.int64)
    if n_arr.size == 1:
        n_one = int(n_arr.reshape(-1)[0])
        n_u: np.ndarray | np.uint64 = _U64(n_one)
        bits_all: np.ndarray | np.uint64 = _U64((n_one - 1).bit_length())
        bad = int(idx.min()) < 0 or int(idx.max()) >= n_one
    else:
        n_b = np.broadcast_to(n_arr, shape).reshape(-1)
        bad = int(idx.min()) < 0 or bool((idx >= n_b).any())
        n_u = n_b.astype(_U64)
        bits_all = _bit_length(n_u - _U64(1))
    if bad:
        raise ValueError("permute indices must lie in [0, n)")
    key_arr = np.asarray(key)
    # A single key stays a scalar: no per-element copies, no gathers.
    keys = _as_u64(key) if key_arr.size == 1 else np.broadcast_to(
        _as_u64(key_arr).reshape(key_arr.shape), shape).reshape(-1)
    out = idx.astype(_U64)
    if np.ndim(bits_all) == 0:
        _walk(out, None, bits_all, keys, n_u, _rounds_for(int(bits_all)), _network)
        return out.astype(np.int64).reshape(shape)
    # Group elements by round count so each element always gets the rounds of its own
    # domain width, whatever else is in the call.
    lo_bits = 0
    for max_bits, rounds in (*_ROUND_SCHEDULE, (64, _ROUNDS_WIDE)):
        in_class = (bits_all >= _U64(lo_bits)) & (bits_all <= _U64(max_bits))
        lo_bits = max_bits + 1
        if in_class.all():
            _walk(out, None, bits_all, keys, n_u, rounds, _network)
        elif in_class.any():
            _walk(out, np.flatnonzero(in_class), bits_all, keys, n_u, rounds, _network)
    return out.astype(np.int64).reshape(shape)


# --------------------------------------------------------------------------- order


class Order:
    """Position -> sample id, one fresh bijection of ``[0, N)`` per epoch.

    ``row_group_rows[i]`` is the number of samples in block (row group) ``i``; block ``i``
    holds the global ids ``[start_i, start_i + rows_i)``, blocks contiguous and in order.

    >>> o = Order(np.array([3, 3, 3, 3]), OrderOptions(seed=1, window_blocks=1, lanes=2))
    >>> o.num_samples, o.num_blocks, o.effective_lanes
    (12, 4, 2)
    >>> sorted(o.sample_at(np.arange(12)).tolist()) == list(range(12))
    True
    >>> Order(np.array([2, 2]), OrderOptions(shuffle=False)).sample_at(np.arange(6)).tolist()
    [0, 1, 2, 3, 0, 1]
    """

    def __init__(self, row_group_rows: np.ndarray, options: OrderOptions | None = None) -> None:
        options = OrderOptions() if options is None else options
        if not isinstance(options, OrderOptions):
            raise TypeError(f"options must be OrderOptions, got {type(options).__name__}")
        rows = np.asarray(row_group_rows)
        if rows.ndim != 1 or not (rows.size == 0 or np.issubdtype(rows.dtype, np.integer)):
            raise ValueError("row_group_rows must be a 1-d integer array")
        rows = rows.astype(np.int64)
        if rows.size and int(rows.min()) < 0:
            raise ValueError(f"row_group_rows must be >= 0, got {int(rows.min())}")
        self._options = options
        self._rows = rows
        self._block_start = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(rows, out=self._block_start[1:])
        self._n = int(self._block_start[-1])
        if self._n == 0:
            raise ValueError("the dataset has no samples; an order needs at least one")
        nb = int(rows.size)
        # A window holds about window_blocks blocks' worth of samples (average block size,
        # rounded up so a window is never smaller than intended).
        self._window = options.window_blocks * (-(-self._n // nb))
        self._lanes = _effective_lanes(options, nb, self._n)
        self._cache: list[tuple[int, tuple[np.ndarray, np.ndarray]]] = []

    @property
    def options(self) -> OrderOptions:
        return self._options

    @property
    def num_samples(self) -> int:
        """N, the number of samples in one epoch."""
        return self._n

    @property
    def num_blocks(self) -> int:
        return int(self._rows.size)

    @property
    def effective_lanes(self) -> int:
        """P, the number of lanes actually used (1 in sequential mode)."""
        return self._lanes

    @property
    def window_samples(self) -> int:
        """w, the number of samples in one shuffle window of a lane."""
        return self._window

    # -- the per-source view: one dataset's order is a mixture of one unnamed source (0),
    # whose stream position is the position itself (as MixedOrder's, mix/mixed.py).

    @property
    def source_orders(self) -> tuple[Order]:
        """Each source's own order: this one."""
        return (self,)

    @property
    def source_names(self) -> tuple[None]:
        """Each source's name: None, one dataset's (a mixture's are its sources')."""
        return (None,)

    def source_positions(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(source, position in that source's own stream) of each position: (0, p)."""
        p = np.asarray(positions, dtype=np.int64)
        return np.zeros_like(p), p

    def consumed(self, position: int) -> np.ndarray:
        """Positions of each source's stream before ``position``: ``[position]``."""
        return np.array([position], dtype=np.int64)

    def stream_position(self, source: int, index) -> np.ndarray:
        """The position of source ``source``'s stream position ``index``: ``index``."""
        return np.asarray(index, dtype=np.int64)

    def split_ids(self, ids) -> tuple[None, np.ndarray]:
        """Sample ids -> (None: one dataset has no source index, the ids)."""
        return None, np.asarray(ids, dtype=np.int64)

    def global_ids(self, source: int, ids) -> np.ndarray:
        """The sample ids of source ``source`` (0, the only one) as the loader names them:
        the ids themselves (a mixture's order adds the source's offset)."""
        return np.asarray(ids, dtype=np.int64)

    def epoch_of(self, positions: np.ndarray | int) -> np.ndarray:
        """The epoch of each position (``p // N``)."""
        return self._check(positions) // self._n

    def block_of(self, ids: np.ndarray | int) -> np.ndarray:
        """The block (row group) holding each sample id."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self._n):
            raise ValueError(f"sample ids must lie in [0, {self._n})")
        # side="right" skips empty blocks, which share their start with the next block.
        return np.searchsorted(self._block_start, ids, side="right") - 1

    def block_order(self, epoch: int) -> np.ndarray:
        """The blocks in the order the epoch's sequence ``S`` lays them out (O(num_blocks)).

        Lane ``l`` reads a contiguous run of this sequence, so a reader can plan prefetch
        from it. Sequential mode: ``0, 1, 2, ...``.

        >>> Order(np.array([5, 5, 5]), OrderOptions(shuffle=False)).block_order(3).tolist()
        [0, 1, 2]
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if not self._options.shuffle:
            return np.arange(self.num_blocks, dtype=np.int64)
        return self._epoch_tables(int(epoch))[0].copy()

    def sample_at(self, positions: np.ndarray | int) -> np.ndarray:
        """The sample id at each stream position (int64, same shape as ``positions``).

        Vectorised; positions may span several epochs and come in any order.

        >>> o = Order(np.array([4, 4]), OrderOptions(seed=3, window_blocks=1))
        >>> o.sample_at(np.arange(8)).tolist() == o.sample_at(np.arange(8)[::-1])[::-1].tolist()
        True
        """
        p = self._check(positions)
        shape = p.shape
        p = p.reshape(-1)
        if not self._options.shuffle:
            return (p % self._n).reshape(shape)
        epochs = p // self._n
        q = p - epochs * self._n
        if p.size == 0:
            return q.reshape(shape)
        out = np.empty_like(p)
        for lo in range(0, p.size, _PASS_ELEMENTS):
            hi = lo + _PASS_ELEMENTS
            e_part, q_part = epochs[lo:hi], q[lo:hi]
            first, last = int(e_part.min()), int(e_part.max())
            if first == last:
                out[lo:hi] = self._shuffled(q_part, first)
                continue
            uniq, inverse = np.unique(e_part, return_inverse=True)
            if uniq.size <= _CACHED_EPOCHS:
                # An epoch boundary: both epochs' tables stay cached for the next call.
                for i, epoch in enumerate(uniq.tolist()):
                    sel = np.flatnonzero(inverse == i)
                    out[lo + sel] = self._shuffled(q_part[sel], epoch)
            else:
                # Many short epochs (a tiny dataset): stack their tables, one pass.
                out[lo:hi] = self._shuffled_many(q_part, uniq, inverse.reshape(-1))
        return out.reshape(shape)

    def positions_of(self, ids: np.ndarray | int, epochs: np.ndarray | int) -> np.ndarray:
        """The inverse of :meth:`sample_at`: the stream position of each id in each epoch.

        ``ids`` and ``epochs`` broadcast together; the result is ``epoch * N + q`` with
        ``sample_at(result) == ids``. O(1) per element after an O(num_blocks) table per
        distinct epoch: the window permutation and the block permutation are undone with
        :func:`unpermute`, the lane interleave with a division. No scan, nothing of size N.

        >>> o = Order(np.array([4, 4, 4]), OrderOptions(seed=3, window_blocks=1, lanes=3))
        >>> p = o.positions_of(np.arange(12), 2)
        >>> o.sample_at(p).tolist()
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
        >>> bool(((p >= 24) & (p < 36)).all())
        True
        """
        ids_arr, ep_arr = np.broadcast_arrays(np.asarray(ids, dtype=np.int64),
                                              np.asarray(epochs, dtype=np.int64))
        shape = ids_arr.shape
        ids_flat, ep_flat = ids_arr.reshape(-1), ep_arr.reshape(-1)
        self.block_of(ids_flat)   # validates the ids
        if ep_flat.size and int(ep_flat.min()) < 0:
            raise ValueError(f"epochs must be >= 0, got {int(ep_flat.min())}")
        if not self._options.shuffle or ids_flat.size == 0:
            return (ep_flat * self._n + ids_flat).reshape(shape)
        out = np.empty(ids_flat.size, dtype=np.int64)
        uniq, inverse = np.unique(ep_flat, return_inverse=True)
        inverse = inverse.reshape(-1)
        for i, epoch in enumerate(uniq.tolist()):
            sel = np.flatnonzero(inverse == i) if uniq.size > 1 else slice(None)
            out[sel] = epoch * self._n + self._q_of(ids_flat[sel], epoch)
        return out.reshape(shape)

    def _q_of(self, ids: np.ndarray, epoch: int) -> np.ndarray:
        """Steps 1-4 of the module docstring undone: ids -> positions inside ``epoch``."""
        n, lanes, w = self._n, self._lanes, self._window
        # Step 1: the id's block sits at slot unpermute(block) of S.
        block = np.searchsorted(self._block_start, ids, side="right") - 1
        nb = self.num_blocks
        slot = unpermute(block, nb, derive_key(self._options.seed, epoch, _TAG_BLOCKS))
        slot_start = self._epoch_tables(epoch)[1]
        s = slot_start[slot] + (ids - self._block_start[block])
        # Step 2: the lane holding index s of S (the first N % P lanes hold m + 1).
        m, extra = divmod(n, lanes)
        big = extra * (m + 1)
        lane = np.where(s < big, s // (m + 1), extra + (s - big) // max(m, 1))
        lane_lo = lane * m + np.minimum(lane, extra)
        lane_len = m + (lane < extra)
        t_shuffled = s - lane_lo
        # Step 3: undo the window shuffle.
        win = t_shuffled // w
        win_len = np.minimum(w, lane_len - win * w)
        key = derive_key(self._options.seed, epoch, _TAG_WINDOW, lane, win)
        t = win * w + unpermute(t_shuffled - win * w, win_len, key)
        # Step 4: sample t of lane l is position t * P + l.
        return t * lanes + lane

    def __repr__(self) -> str:
        return (f"Order(num_samples={self._n}, num_blocks={self.num_blocks}, "
                f"effective_lanes={self._lanes}, options={self._options!r})")

    # ---------------------------------------------------------------- internals

    def _check(self, positions: np.ndarray | int) -> np.ndarray:
        p = np.asarray(positions)
        if p.size and not np.issubdtype(p.dtype, np.integer):
            raise ValueError(f"positions must be integers, got dtype {p.dtype}")
        p = p.astype(np.int64)
        if p.size and int(p.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(p.min())}")
        return p

    def _epoch_tables(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(block at each slot of S, start of each slot in S) for one epoch; O(num_blocks).

        The tables of the last two epochs used are kept, so a reader working across an
        epoch boundary does not rebuild them on every call.
        """
        for i, (cached_epoch, tables) in enumerate(self._cache):
            if cached_epoch == epoch:
                if i:
                    self._cache = [self._cache[i], *self._cache[:i], *self._cache[i + 1:]]
                return tables
        slot_block, slot_start = self._stacked_tables(np.array([epoch], dtype=np.int64))
        tables = (slot_block[0], slot_start[0])
        self._cache = [(epoch, tables), *self._cache[:_CACHED_EPOCHS - 1]]
        return tables

    def _stacked_tables(self, epochs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Block order and slot starts of several epochs, shape ``(len(epochs), num_blocks)``."""
        nb = self.num_blocks
        keys = derive_key(self._options.seed, epochs, _TAG_BLOCKS)
        slot_block = permute(np.tile(np.arange(nb, dtype=np.int64), epochs.size), nb,
                             np.repeat(keys, nb)).reshape(epochs.size, nb)
        sizes = self._rows[slot_block]
        slot_start = np.cumsum(sizes, axis=1) - sizes
        return slot_block, slot_start

    def _position_in_s(self, q: np.ndarray, epoch: int | np.ndarray) -> np.ndarray:
        """Steps 2-4 backwards: position ``q`` of an epoch -> its index in that epoch's S."""
        n, lanes, w = self._n, self._lanes, self._window
        m, extra = divmod(n, lanes)
        # Step 4 (interleave): position q is index t of lane q % P. Lane l holds
        # ceil((N - l) / P) samples: m + 1 for the first N % P lanes, m for the others.
        lane = q % lanes
        t = q // lanes
        lane_len = m + (lane < extra)
        lane_lo = lane * m + np.minimum(lane, extra)
        # Step 3 (window shuffle inside the lane); the last window of a lane may be short.
        win = t // w
        offset = t - win * w
        win_len = np.minimum(w, lane_len - win * w)
        key = derive_key(self._options.seed, epoch, _TAG_WINDOW, lane, win)
        return lane_lo + win * w + permute(offset, win_len, key)

    def _shuffled(self, q: np.ndarray, epoch: int) -> np.ndarray:
        s = self._position_in_s(q, epoch)
        # Step 1: position s of the block-permuted sequence S -> global id.
        slot_block, slot_start = self._epoch_tables(epoch)
        slot = np.searchsorted(slot_start, s, side="right") - 1
        block = slot_block[slot]
        return self._block_start[block] + (s - slot_start[slot])

    def _shuffled_many(self, q: np.ndarray, epochs: np.ndarray,
                       inverse: np.ndarray) -> np.ndarray:
        """Like :meth:`_shuffled` for ``q[i]`` in epoch ``epochs[inverse[i]]``."""
        n = self._n
        s = self._position_in_s(q, epochs[inverse])
        slot_block, slot_start = self._stacked_tables(epochs)
        # Offsetting epoch u by u*N makes the stacked starts one sorted array.
        offsets = np.arange(epochs.size, dtype=np.int64) * n
        flat_start = (slot_start + offsets[:, None]).reshape(-1)
        target = s + offsets[inverse]
        slot = np.searchsorted(flat_start, target, side="right") - 1
        block = slot_block.reshape(-1)[slot]
        return self._block_start[block] + (target - flat_start[slot])


def _effective_lanes(options: OrderOptions, num_blocks: int, num_samples: int) -> int:
    """P_eff: the largest divisor of ``options.lanes`` not above the data's cap.

    The cap is ``num_blocks // window_blocks`` (so each lane holds at least a window of
    blocks; with more lanes a window would straddle lanes and a lane would be shuffled
    over fewer samples than asked for) and ``N`` (no empty lanes). Taking a *divisor* of
    the requested count, rather than the cap itself, keeps every world size that divides
    ``lanes`` and the result a lane-aligned world size: 5040 capped at 1000 gives 840, not
    1000, so W in {3, 6, 7, 12, 14, ...} still get whole lanes.
    """
    if not options.shuffle or options.is_auto:
        # sequential order: contiguous slicing is already local; "auto" not resolved for a
        # job is a one-node order (OrderOptions.resolved).
        return 1
    cap = max(1, min(options.lanes, num_blocks // options.window_blocks, num_samples))
    best = 1
    d = 1
    while d * d <= options.lanes:
        if options.lanes % d == 0:
            for c in (d, options.lanes // d):
                if best < c <= cap:
                    best = c
        d += 1
    return best


# --------------------------------------------------------------------------- quality


def shuffle_quality(
    order: Order,
    global_batch: int,
    block_of_id: Callable[[np.ndarray], np.ndarray] | np.ndarray | None = None,
    *,
    num_batches: int = 64,
    shard_of_block: np.ndarray | None = None,
    max_positions: int = 1_000_000,
    end: int | None = None,
) -> dict[str, float]:
    """Figures of merit of an order, for the ``plan`` simulator and benchmarks.

    - ``mean_distinct_blocks_per_batch`` / ``min_...``: distinct blocks in each of the first
      ``num_batches`` global batches (higher = better mixed, more blocks read at once);
    - ``mean_distinct_shards_per_batch`` when ``shard_of_block`` maps block -> shard;
    - ``spearman_position_vs_id``: rank correlation of position and id over the first epoch
      (0 = no trace of the storage order left, 1 = sequential). Over at most
      ``max_positions`` evenly strided positions when the epoch is larger.

    ``block_of_id`` maps ids to blocks (a callable or an array indexed by id); by default the
    order's own blocks. ``end``: the first position the order cannot serve (a mixture that
    ends), which bounds the positions measured.

    >>> o = Order(np.full(100, 10), OrderOptions(seed=0, window_blocks=2, lanes=10))
    >>> q = shuffle_quality(o, 64, num_batches=4)
    >>> q["mean_distinct_blocks_per_batch"] > 10, abs(q["spearman_position_vs_id"]) < 0.2
    (True, True)
    """
    if global_batch <= 0:
        raise ValueError(f"global_batch must be > 0, got {global_batch}")
    if num_batches <= 0:
        raise ValueError(f"num_batches must be > 0, got {num_batches}")
    if block_of_id is None:
        to_block: Callable[[np.ndarray], np.ndarray] = order.block_of
    elif callable(block_of_id):
        to_block = block_of_id
    else:
        table = np.asarray(block_of_id)
        to_block = table.__getitem__

    positions = np.arange(num_batches * global_batch, dtype=np.int64)
    blocks = np.asarray(to_block(order.sample_at(positions))).reshape(num_batches, global_batch)
    distinct = np.array([np.unique(row).size for row in blocks], dtype=np.float64)
    result = {
        "mean_distinct_blocks_per_batch": float(distinct.mean()),
        "min_distinct_blocks_per_batch": float(distinct.min()),
    }
    if shard_of_block is not None:
        shards = np.asarray(shard_of_block)[blocks]
        result["mean_distinct_shards_per_batch"] = float(
            np.mean([np.unique(row).size for row in shards])
        )

    n = order.num_samples if end is None else min(order.num_samples, end)
    stride = max(1, -(-n // max_positions))
    pos = np.arange(0, n, stride, dtype=np.int64)
    ids = order.sample_at(pos)
    if pos.size < 2:
        rho = 1.0
    else:
        # Ranks by argsort (ids are distinct, so no ties); positions are their own ranks.
        rank = np.empty(ids.size, dtype=np.float64)
        rank[np.argsort(ids, kind="stable")] = np.arange(ids.size, dtype=np.float64)
        d = rank - np.arange(ids.size, dtype=np.float64)
        k = float(ids.size)
        rho = 1.0 - 6.0 * float(np.dot(d, d)) / (k * (k * k - 1.0))
    result["spearman_position_vs_id"] = float(rho)
    result["effective_lanes"] = float(order.effective_lanes)
    result["window_samples"] = float(order.window_samples)
    return result
