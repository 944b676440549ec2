"""One adaptive request rate per node when the object store throttles (503 SlowDown, 429).

An object store that answers ``SlowDown`` asks the *client* to slow down, and the client
of a training node is all of its processes together: 8 ranks x 2 workers that each back off
on their own keep the node's request rate where it was, and the refusals multiply instead of
the requests thinning out. A node that pauses as one (the design before this one) is refused
rarely but loses time: the refusals of requests already on their way keep lengthening the
pause, and after it every process sends at once again. So the processes sharing a node cache
folder share one allowed *rate*, the idea of the AWS SDKs' "adaptive" retry mode held in one
small fixed-width file, ``<cache>/v1/throttle``, under ``flock``:

- **Not throttled, not paced.** Before each request a process reads the file (a few
  microseconds); while the node has no allowed rate the request goes at once, nothing is
  written.
- **A throttle decreases the rate, once per wave.** A process answered ``SlowDown``/``429``/
  ``503`` calls :meth:`NodeThrottle.report`. The first time, the node's rate starts from its
  measured recent request rate times ``beta`` (0.7): each process counts its own requests of
  the last second (and the one it asks to send), and every process that reports or asks to
  send in the next ``gather`` seconds (0.25) adds its count, once, while the node's requests
  wait; so the rate is measured without any write while the node was not throttled. Later
  throttles multiply the rate the refused request went at by ``beta``. A report for a request
  let go *before* the last decrease changes nothing: that request belongs to the wave the
  decrease already answered (8 requests released together and refused 7 times are one
  excess, not seven).
- **Paced requests take send slots.** While the node has a rate ``r``, every process takes
  the next slot, ``slot = max(now, next_slot); next_slot = slot + 1/r``, and sleeps until it,
  so the node's requests go ``1/r`` apart instead of being released together. A decrease
  restarts the schedule at the new rate; a request still waiting on a slot of the old one
  takes a new slot when it wakes, so it is not sent at the rate just refused.
- **The rate rises again** along CUBIC's curve (TCP's, and the AWS SDKs'), scaled to the
  rate: after a throttle at rate ``w`` the next slot is one interval of ``beta * w`` away,
  and the curve's plateau is ``(1 + beta) / 2 * w`` (below the rate refused); the curve
  starts at ``beta`` times that, is back near the plateau in ~1.4 s, stays there a while,
  then rises faster; at twice the plateau without a throttle the pacing ends. It never goes
  below ``min_rate`` (0.5 requests/s per node).
- **Background requests yield.** Requests made inside :func:`background` (the prefetch of
  later steps, :mod:`zephon_store.io.prefetch`) take a slot only when the schedule is idle
  (no slot is reserved ahead of now), so while the node is paced the requests a batch waits
  for now go first. After :data:`MAX_BACKGROUND_WAIT` seconds of yielding a background
  request takes its slot like any other, so a reader that waits for it is not held longer.

A process's own retry schedule (:class:`~zephon_store.io.retry.RetryPolicy`) still bounds each
request and still sleeps its jittered back-off after a throttle; the retry then takes a slot
too. When the folder cannot be used (read-only, vanished) the throttle does nothing and each
process backs off alone under its ``RetryPolicy``.

>>> t = NodeThrottle(tmp)
>>> t.wait()            # the node is not throttled: at once
0.0
>>> t.report()          # throttled: the node is paced from now on
>>> t.rate() > 0
True
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

FILE_NAME = "throttle"
LAYOUT = "v1"   # the folder layout of io/cache.py: the file lives beside the cache's entries
_WIDTH = 96     # the state is rewritten in place, one pwrite of a fixed width
# The longest a background request yields to the others (seconds): a reader may be waiting
# for it (a prefetched range it needs), and the store may stay throttled.
MAX_BACKGROUND_WAIT = 10.0
# A process's own request rate is its requests of the last MEASURE_WINDOW seconds; at most
# _MEASURE_MAX of them are kept (a process sending faster is counted as sending that many).
MEASURE_WINDOW = 1.0
_MEASURE_MAX = 4096

_local = threading.local()


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Requests this thread makes inside the block are background ones: while the node is
    paced they take a send slot only when no other request waits for one (see the module
    docstring).

    >>> with background():
    ...     in_background()
    True
    >>> in_background()
    False
    """
    before = getattr(_local, "background", False)
    _local.background = True
    try:
        yield
    finally:
        _local.background = before


def in_background() -> bool:
    """Whether this thread is inside :func:`background`."""
    return getattr(_local, "background", False)


@dataclass(frozen=True)
class RateState:
    """What the processes of a node share: one fixed-width line of the throttle file.

    ``wmax``: the rate (requests/s) the node was last throttled at; 0 while it never was (or
    its pacing ended). ``t_dec``: when the rate was last decreased, the start of the current
    wave. ``next_slot``: the earliest time the node's next paced request may go.
    ``gather_until``: in the first wave only, until when processes add their own measured
    rate to ``wmax``. Times are ``time.time()`` seconds, the same clock in every process.

    >>> RateState.decode(RateState(4.0, 10.0, 10.25, 0.0).encode())
    RateState(wmax=4.0, t_dec=10.0, next_slot=10.25, gather_until=0.0)
    >>> RateState.decode(b"garbage")      # unreadable: not throttled
    RateState(wmax=0.0, t_dec=0.0, next_slot=0.0, gather_until=0.0)
    """

    wmax: float = 0.0
    t_dec: float = 0.0
    next_slot: float = 0.0
    gather_until: float = 0.0

    def encode(self) -> bytes:
        line = " ".join(f"{v:.6f}" for v in (self.wmax, self.t_dec, self.next_slot,
                                              self.gather_until))
        if len(line) > _WIDTH:
            raise ValueError(f"throttle state {line!r} is wider than its {_WIDTH} bytes")
        return line.ljust(_WIDTH).encode()

    @classmethod
    def decode(cls, raw: bytes) -> RateState:
        try:
            values = [float(v) for v in raw.split()]
        except ValueError:
            return cls()
        if len(values) != 4 or not all(math.isfinite(v) for v in values) or values[0] < 0:
            return cls()
        return cls(*values)


@dataclass(frozen=True)
class AdaptiveRate:
    """The rate math, pure: states in, states out, ``now`` given (tests inject any clock).

    ``beta``: the factor a throttle multiplies the rate by (0.7, as in the AWS SDKs'
    adaptive mode and CUBIC). ``scale``: the cubic's constant, relative to the plateau:
    ``rate(t) = wmax * (1 + scale * (t - t_dec - K)**3)`` with ``K`` such that ``rate(t_dec)
    = beta * wmax`` (0.1 per s^3: the AWS SDKs' 0.4 requests/s per s^3 at 4 requests/s, and
    the same shape in seconds at any rate, ``K`` = 1.44 s). ``min_rate``: the floor (requests/s per node).
    ``end_factor``: pacing ends once the rate reaches ``end_factor * wmax``. ``gather``:
    seconds after the first decrease during which processes add their measured rate.

    >>> policy = AdaptiveRate()
    >>> st = policy.throttled(RateState(), now=100.0, sent_at=100.0, measured=8.0)
    >>> policy.grant(st, 100.1, 0.0)[1] is None      # the node's rate is being gathered
    True
    >>> round(policy.rate(st, st.t_dec), 6)         # then 0.7 x the 8 requests/s measured
    5.6
    >>> st, slot = policy.grant(st, st.t_dec, 0.0)  # a slot now, the next one 1/5.6 s later
    >>> slot == st.t_dec, round(st.next_slot - slot, 4)
    (True, 0.1786)
    >>> policy.throttled(st, now=slot + 0.1, sent_at=slot - 0.1, measured=0.0) == st
    True
    """

    beta: float = 0.7
    scale: float = 0.1
    min_rate: float = 0.5
    end_factor: float = 2.0
    gather: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.beta < 1:
            raise ValueError(f"beta must be in (0, 1), got {self.beta}")
        if not (self.scale > 0 and self.min_rate > 0 and self.gather >= 0):
            raise ValueError(f"need scale > 0, min_rate > 0 and gather >= 0, got "
                             f"scale={self.scale}, min_rate={self.min_rate}, "
                             f"gather={self.gather}")
        if not self.end_factor > 1:
            raise ValueError(f"end_factor must be > 1, got {self.end_factor}")

    def rate(self, st: RateState, now: float) -> float | None:
        """The node's allowed rate at ``now`` (requests/s), or None: not paced."""
        if st.wmax <= 0 or now >= self.end_at(st):
            return None
        return self.curve(st, now)

    def curve(self, st: RateState, t: float) -> float:
        """The rate of a paced node at time ``t``: the cubic through ``beta * wmax`` at
        ``t_dec`` and ``wmax``, at least ``min_rate``, at most ``end_factor * wmax``."""
        r = st.wmax * (1.0 + self.scale * (max(0.0, t - st.t_dec) - self._k()) ** 3)
        return max(self.min_rate, min(self.end_factor * st.wmax, r))

    def end_at(self, st: RateState) -> float:
        """When the pacing ends if no throttle comes: the curve reaches ``end_factor * wmax``."""
        return st.t_dec + self._k() + ((self.end_factor - 1.0) / self.scale) ** (1.0 / 3.0)

    def _k(self) -> float:
        return ((1.0 - self.beta) / self.scale) ** (1.0 / 3.0)

    def interval(self, rate: float) -> float:
        """Seconds between two send slots at ``rate``."""
        return 1.0 / rate

    def throttled(self, st: RateState, *, now: float, sent_at: float,
                  measured: float) -> RateState:
        """The state after a throttle at ``now`` of a request let go at ``sent_at``.

        ``measured``: the reporting process's own recent rate, if it has not yet added it
        in this wave (else 0)."""
        r = self.rate(st, now)
        if r is None:
            # The first wave: from the node's measured rate, which the other processes add
            # to until the gather ends; then the slots start at the rate gathered.
            start = now + self.gather
            return RateState(max(measured, self.min_rate / self.beta), start, start, start)
        if sent_at < st.t_dec:   # sent before the last decrease: that wave was answered
            if measured > 0 and now < st.gather_until:
                return replace(st, wmax=st.wmax + measured)
            return st
        # The rate the refused request went at: the spacing from the slot before it, one
        # interval earlier (the curve rises, so its own slot's rate would overstate it).
        sent_rate = self.curve(st, sent_at - self.interval(self.curve(st, sent_at)))
        # The curve's plateau goes below the rate just refused (CUBIC's "fast convergence",
        # taken for every throttle): the store's rate is below it, and a plateau at it
        # would be refused on every probe near the plateau.
        wmax = max(self.min_rate, sent_rate * (1.0 + self.beta) / 2.0)
        low = max(self.min_rate, self.beta * sent_rate)
        return RateState(wmax, now, now + self.interval(low), 0.0)

    def grant(self, st: RateState, now: float, measured: float, *,
              background: bool = False) -> tuple[RateState, float | None]:
        """``(state, slot)``: the send slot a request asking at ``now`` takes (``now`` itself
        when the node is not paced; the next slot is then one interval at the rate *at that
        slot* later), or None: no slot now, during the first wave's gather or for a
        background request while slots are reserved ahead of now. ``measured`` as in
        :meth:`throttled`."""
        if now < st.gather_until:
            return (replace(st, wmax=st.wmax + measured) if measured > 0 else st), None
        r = self.rate(st, now)
        if r is None:
            return st, now
        if background and st.next_slot > now:
            return st, None
        slot = max(now, st.next_slot)
        return replace(st, next_slot=slot + self.interval(self.curve(st, slot))), slot


@dataclass
class SlotRequest:
    """One request's wait for its send slot: what :meth:`NodeThrottle.step` looks at and
    updates (:meth:`NodeThrottle.wait` makes one per request)."""

    background: bool = False
    granted: float | None = None   # when it was given its slot
    slot: float = 0.0
    slept: float = 0.0
    sent_at: float | None = None   # set when it may go


class NodeThrottle:
    """The shared allowed request rate of the processes using one node cache folder.

    ``directory`` is the cache folder (``ChunkCache.directory``); the state lives in
    ``<directory>/v1/throttle``. Picklable (a worker process gets its own handle, with its
    own count of requests). ``clock`` is wall time: every process of the node reads the same.
    ``policy``: the rate math (:class:`AdaptiveRate`).
    """

    def __init__(self, directory: str | os.PathLike[str], *,
                 policy: AdaptiveRate | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self.path = os.path.join(self.directory, LAYOUT, FILE_NAME)
        self.policy = policy if policy is not None else AdaptiveRate()
        self._clock, self._sleep = clock, sleep
        self._sent: collections.deque[float] = collections.deque(maxlen=_MEASURE_MAX)
        self._sent_lock = threading.Lock()   # the threads of a process share the count
        self._gave = -1.0     # the wave (its t_dec) this handle added its measured rate to
        self.waited = 0.0     # seconds this handle slept in wait() (for tests and logs)
        self.reports = 0      # throttles this handle reported
        self.decreases = 0    # of which decreased the node's rate

    def __reduce__(self):
        return (NodeThrottle, (self.directory,), {"policy": self.policy})

    def __setstate__(self, state: dict) -> None:
        self.policy = state["policy"]

    def __repr__(self) -> str:
        return f"NodeThrottle({self.directory!r})"

    # -- the shared state -------------------------------------------------------------------

    def state(self) -> RateState:
        """The node's state; a missing or unreadable file reads as not throttled."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return RateState()
        try:
            return RateState.decode(os.pread(fd, _WIDTH, 0))
        except OSError:
            return RateState()
        finally:
            os.close(fd)

    def rate(self) -> float | None:
        """The node's allowed rate now (requests/s), or None while it is not paced."""
        return self.policy.rate(self.state(), self._clock())

    def _update(self, change: Callable[[RateState, float], tuple[RateState, object]], *,
                create: bool) -> tuple[RateState, object] | None:
        """``change(state, now)`` under the file's lock, ``now`` read once the lock is held;
        the new state is written when it differs. None: the folder is unusable."""
        try:
            if create:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = RateState.decode(os.pread(fd, _WIDTH, 0))
            new, out = change(st, self._clock())
            if new != st:
                os.pwrite(fd, new.encode(), 0)
            return new, out
        except OSError:
            return None
        finally:
            os.close(fd)   # releases the lock

    # -- this process's share ---------------------------------------------------------------

    def _measured(self, now: float, asking: int = 0) -> float:
        """This handle's requests per second over the last :data:`MEASURE_WINDOW`, counting
        ``asking`` more (a request waiting to go is demand too)."""
        with self._sent_lock:
            sent = self._sent
            while sent and sent[0] < now - MEASURE_WINDOW:
                sent.popleft()
            if len(sent) == sent.maxlen and sent[0] < now:
                return len(sent) / (now - sent[0])
            return (len(sent) + asking) / MEASURE_WINDOW

    def _offer(self, st: RateState, now: float, asking: int = 0) -> float:
        """What this handle adds to the node's first-wave measurement (once per wave)."""
        if now < st.gather_until and self._gave != st.t_dec:
            return self._measured(now, asking)
        return 0.0

    def step(self, req: SlotRequest, now: float) -> float:
        """One look at the schedule for ``req``: the seconds to sleep before looking again,
        or 0.0 when it may go now (``req.sent_at`` is then set). :meth:`wait` loops on it;
        tests drive it with their own clock."""
        st = self.state()
        if self.policy.rate(st, now) is None:
            return self._go(req, now, now)
        if req.granted is not None and st.t_dec <= req.granted:
            # Its slot stands (no decrease since it was given); else it takes a new one.
            # Pacing that ends before the slot lets it go then.
            if req.slot <= now:
                return self._go(req, now, req.slot)
            return min(req.slot, self.policy.end_at(st)) - now
        yielding = req.background and req.slept < MAX_BACKGROUND_WAIT

        def take(st: RateState, now: float):
            offer = self._offer(st, now, asking=1)
            new, slot = self.policy.grant(st, now, offer, background=yielding)
            return new, (slot, now, offer)

        done = self._update(take, create=False)
        if done is None:   # the file vanished: alone
            return self._go(req, now, now)
        new, (slot, now, offer) = done
        if offer:
            self._gave = new.t_dec
        if slot is None:
            if now < new.gather_until:
                return new.gather_until - now
            # A background request yields while slots are reserved ahead of now.
            r = self.policy.rate(new, now) or self.policy.min_rate
            pause = new.next_slot - now + self.policy.interval(r)
            return max(1e-3, min(pause, MAX_BACKGROUND_WAIT - req.slept))
        req.granted, req.slot = now, slot
        return self._go(req, now, slot) if slot <= now else slot - now

    def _go(self, req: SlotRequest, now: float, sent_at: float) -> float:
        req.sent_at = sent_at
        with self._sent_lock:
            self._sent.append(now)
        return 0.0

    def wait(self) -> float:
        """Wait for this request's send slot while the node is paced (at once otherwise);
        returns the seconds slept. Remembers, per thread, when the request was let go, for
        the :meth:`report` of its throttle."""
        req = SlotRequest(background=in_background())
        while (delay := self.step(req, self._clock())) > 0:
            self._sleep(delay)
            req.slept += delay
            self.waited += delay
        _local.sent_at = req.sent_at
        return req.slept

    def report(self, *, sent_at: float | None = None) -> None:
        """The store just throttled a request of this process, let go at ``sent_at``
        (default: the one this thread last waited for, else now): decrease the node's rate,
        unless that request was let go before the last decrease (see the module docstring)."""
        self.reports += 1
        if sent_at is None:
            sent_at = getattr(_local, "sent_at", None)

        def throttled(st: RateState, now: float):
            offer = (self._measured(now) if self.policy.rate(st, now) is None
                     else self._offer(st, now))
            sent = now if sent_at is None else sent_at
            new = self.policy.throttled(st, now=now, sent_at=sent, measured=offer)
            moved = (new.t_dec, new.next_slot, new.gather_until) != (
                st.t_dec, st.next_slot, st.gather_until)   # not only a first-wave share
            return new, (offer, moved)

        done = self._update(throttled, create=True)   # None: no usable folder, alone
        if done is None:
            return
        new, (offer, decreased) = done
        if offer:
            self._gave = new.t_dec
        self.decreases += decreased
