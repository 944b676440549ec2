"""The stall forecast: from the bytes the coming steps must fetch, the rate storage
delivers, the loop's own time per step and the prefetch budget, the first step that will
wait for its bytes, and how long. One function serves the running loader's warning
(:class:`~zephon_store.observe.account.StepAccount`) and ``zephon plan --bandwidth``.

The model: one fetcher delivers ``rate`` bytes/s, in step order, and may run ahead of the
loop by at most ``budget`` bytes (``prefetch_bytes``); the loop spends ``step_s`` seconds
of its own on each step and then asks for the next one, which it gets once that step's
bytes have arrived. Step ``k`` waits for what arrives after the loop asked.

>>> Stall.first([10e6] * 8, rate=100e6, step_s=0.2, budget=64e6) is None  # 50 MB/s needed
True
>>> s = Stall.first([10e6] * 40, rate=25e6, step_s=0.2, budget=64e6, start_step=100)
>>> # 50 MB/s needed, 25 delivered: step 101 waits 0.2 s
>>> s.step, round(s.wait_s, 2), round(s.need_bps / 1e6)
(101, 0.2, 50)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stall", "forecast_of", "stall_message", "step_need"]

# A wait shorter than this is noise, not a stall worth a warning.
MIN_WAIT_S = 0.05


@dataclass(frozen=True)
class Stall:
    """The first step that will wait: its number, the wait, and the rates behind it."""

    step: int
    wait_s: float
    rate_bps: float          # what storage delivers
    need_bps: float          # what the steps up to the stall need, at the loop's pace
    budget: float

    @classmethod
    def first(cls, need: list[float], *, rate: float, step_s: float, budget: float,
              start_step: int = 0, lead_bytes: float = 0.0,
              min_wait: float = MIN_WAIT_S) -> Stall | None:
        """The first of the steps ``start_step, start_step + 1, ...`` (the bytes each must
        fetch: ``need``; ``lead_bytes`` of them already on their way) that waits at least
        ``min_wait`` s, or None."""
        if rate <= 0 or not need:
            return None
        t_loop = 0.0         # when the loop got its last step
        t_fetch = 0.0        # when the fetcher has delivered everything queued so far
        done: list[float] = []    # when each step was handed to the loop
        cum = [0.0]          # bytes to fetch for the steps before k
        lead = lead_bytes
        m = -1               # steps up to m must be consumed before step k's fetch starts
        raw = 0.0            # bytes the steps up to k read, fetched ahead or not
        for k, b in enumerate(need):
            raw += b
            use = min(b, lead)
            lead -= use
            b -= use
            cum.append(cum[-1] + b)
            while m < k - 1 and cum[k + 1] - cum[m + 1] > budget:
                m += 1
            start = max(t_fetch, done[m] if m >= 0 else 0.0)
            t_fetch = start + b / rate
            asked = t_loop + step_s if k else 0.0
            got = max(asked, t_fetch)
            if k and got - asked >= min_wait:
                return cls(start_step + k, got - asked, rate, raw / ((k + 1) * step_s), budget)
            done.append(got)
            t_loop = got
        return None


def stall_message(stall: Stall, *, where: str = "storage") -> str:
    """The one-line warning for ``stall`` (what, the numbers, the options to change).

    >>> print(stall_message(Stall(1200, 0.4, 38e6, 55e6, 64 << 20))[:99])
    zephon: step 1,200 will wait ~0.4 s for data: storage delivers 38 MB/s, the next steps need 55 MB/s
    """
    return (f"zephon: step {stall.step:,} will wait ~{stall.wait_s:.2g} s for data: {where} "
            f"delivers {_mbps(stall.rate_bps)}, the next steps need {_mbps(stall.need_bps)} "
            f"at the loop's pace; raise prefetch_bytes (now {stall.budget / 2**20:.3g} MiB) "
            f"if the rate suffices on average, else add bandwidth (more connections or ranks "
            f"per node), turn on the decoded cache for later epochs, or read fewer bytes per "
            f"step")


def _mbps(bps: float) -> str:
    mb = bps / 1e6
    return f"{mb:.0f} MB/s" if mb >= 10 else f"{mb:.2g} MB/s"


def step_need(step_row_groups, lengths, steps, *, cached=None) -> list[float]:
    """The bytes each of ``steps`` (local batch indices) must fetch: the byte length
    (``lengths[rg]``) of each row group ``step_row_groups(i)`` names, counted at its first
    use among these steps, unless ``cached(rg)``. The loader's forecast and ``zephon plan
    --bandwidth`` both count by it.

    >>> step_need(lambda i: [i // 2], [100, 200, 300], range(4))
    [100.0, 0.0, 200.0, 0.0]
    """
    need, seen = [], set()
    for i in steps:
        b = 0
        for rg in (int(r) for r in step_row_groups(i)):
            if rg in seen:
                continue
            seen.add(rg)
            if cached is None or not cached(rg):
                b += int(lengths[rg])
        need.append(float(b))
    return need


def forecast_of(reader, prefetch_bytes: int, first_step: int):
    """The forecast input of a loader's ``reader`` (a
    :class:`~zephon_store.load.share_reader.ShareReader` whose batch ``i`` is global step
    ``first_step + i``): a callable ``(step, horizon) -> (need, lead, budget)``, ``need``
    the bytes each of the ``horizon`` steps from ``step`` must still fetch (row groups not
    in the node's disk cache, :func:`step_need`); None for data read in place (a local
    dataset) or a mixture (its parts have their own caches)."""
    dataset = reader.dataset
    cache = getattr(dataset, "cache", None)
    manifest = getattr(dataset, "manifest", None)
    if cache is None or manifest is None or prefetch_bytes <= 0:
        return None

    def cached(rg: int) -> bool:
        key = manifest.known_rg_xxh3(rg)
        return key is not None and cache.contains(key)

    def forecast(step: int, horizon: int):
        first = step - first_step
        last = first + horizon
        if reader.num_batches is not None:
            last = min(last, reader.num_batches)
        need = step_need(reader.step_row_groups, manifest.rg_length, range(first, last),
                         cached=cached)
        return need, 0.0, float(prefetch_bytes)

    return forecast
