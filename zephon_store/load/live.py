"""Live elasticity: each step's participants come from its quorum, the cursor moves on commit.

With torchft, replica groups leave on failure and rejoin later while the others keep
training; no process restarts. Each step's quorum says who is present, and a step whose
quorum broke is not committed. This module makes the loader follow that, without torch:

- **Per-step topology.** The step ``[cursor, cursor + B)`` is split among exactly the
  participants of its quorum: participant ``index`` of ``participants`` reads
  :func:`~zephon_store.order.assign.positions_for_participant` (uneven when the count does
  not divide ``B``; every position of the step read by exactly one participant).
- **Commit-based cursor** (:class:`LiveCursor`). The cursor advances only when the step
  commits, so a step that failed part-way is served again, to whatever quorum comes next.
- **Reuse** (:class:`LiveShare`). A step served again to the same participant with the
  same positions gets the batch already made, not fetched or decoded again; the steps after
  it are made ahead by one :class:`~zephon_store.load.share_reader.ShareReader` as long as the
  quorum keeps its shape (a new shape gets a new reader from that step on).
- **Agreement** (:func:`check_claims`). Before a step is read, the participants exchange
  ``(cursor, participants, index)`` through a caller-given collective (a cheap all-gather)
  and every participant checks that the claims partition the step. A participants callable
  that disagrees across ranks raises :class:`LiveTopologyError` instead of training on
  overlapping data.

Joining replicas take the cursor from the quorum's state transfer: the state is the plain
one-cursor loader state (:mod:`zephon_store.load.state`), unchanged. :class:`LiveLoader`
is the :class:`~zephon_store.load.loader.Loader` with these two additions (the per-step
participants and the commit rule); the torch shell over it is
:class:`zephon_store.torch.live.LiveZephonLoader`; ``docs/live-elastic.md`` has the failure
cases and why each is exact.

>>> from zephon_store import open_dataset
>>> share = LiveShare.of(open_dataset(tiny_dataset), OrderOptions(seed=7), global_batch=8)
>>> [share.batch(0, 3, i)["id"].tolist() for i in range(3)]    # 8 positions, 3 participants
[[79, 41], [78, 45, 68], [97, 30, 33]]
>>> share.batch(0, 1, 0)["id"].tolist()                         # the same step, alone
[79, 41, 78, 45, 68, 97, 30, 33]
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .._util.exit_close import close_at_exit
from ..errors import LiveTopologyError
from ..order.assign import positions_for_participant, tail_positions_for_rank
from ..order.order import OrderOptions
from ..order.topology import Topology
from .loader import Loader
from .options import BatchOptions, ReadAheadOptions
from .share_reader import ShareReader
from .workers import thread_batches

__all__ = ["LiveTopologyError", "StepClaim", "claim_step", "check_claims", "participant_positions",
           "Participant", "LiveCursor", "LiveShare", "LiveLoader"]


@dataclass(frozen=True)
class StepClaim:
    """What one process is about to read: the step at ``cursor``, as participant ``index``
    of ``participants`` (``index`` None: present in the quorum but not reading, e.g. healing).

    ``as_row``/``from_row`` give a fixed-size int64 row for a collective:
    ``[present, cursor, participants, index]`` (``present`` 0 for a non-participant).

    >>> StepClaim(120, 3, 1).as_row().tolist()
    [1, 120, 3, 1]
    >>> StepClaim.from_row([0, 0, 0, 0]) is None
    True
    """

    cursor: int
    participants: int
    index: int | None

    def as_row(self) -> np.ndarray:
        if self.index is None:
            return np.zeros(4, dtype=np.int64)
        return np.array([1, self.cursor, self.participants, self.index], dtype=np.int64)

    @classmethod
    def from_row(cls, row) -> StepClaim | None:
        present, cursor, participants, index = (int(v) for v in row)
        return None if present == 0 else cls(cursor, participants, index)


def claim_step(cursor: int, participants, index) -> StepClaim:
    """This process's claim on the step at ``cursor``, from its participants callable's
    ``(index, participants)``; a value no quorum can give raises :class:`LiveTopologyError`.

    >>> claim_step(16, 0, None)
    Traceback (most recent call last):
    ...
    zephon_store.errors.LiveTopologyError: a live step needs at least one participant, got participants=0; draw the step's batch after its quorum is formed (torchft: after manager.start_quorum(), which torchft's Optimizer.zero_grad() calls)
    """
    participants = int(participants)
    if participants <= 0:
        raise LiveTopologyError(
            f"a live step needs at least one participant, got participants={participants}; "
            "draw the step's batch after its quorum is formed (torchft: after "
            "manager.start_quorum(), which torchft's Optimizer.zero_grad() calls)")
    if index is not None and not 0 <= int(index) < participants:
        raise LiveTopologyError(f"participant index must be in [0, {participants}) or None "
                                f"(present, not reading), got {index}")
    return StepClaim(cursor, participants, None if index is None else int(index))


def check_claims(mine: StepClaim, claims: Sequence[StepClaim]) -> None:
    """Check that the participants' ``claims`` for one step partition it; raise if not.

    ``claims`` are every participant's (the all-gather's result, non-participants left
    out). They must agree on the cursor and the number of participants, that number must be
    how many claims there are, and the indices must be ``0 .. participants-1``, once each.
    Every participant sees the same claims, so all of them raise together.

    >>> check_claims(StepClaim(24, 2, 0), [StepClaim(24, 2, 0), StepClaim(24, 2, 1)])
    >>> check_claims(StepClaim(24, 2, 0), [StepClaim(24, 2, 0), StepClaim(24, 2, 0)])
    Traceback (most recent call last):
    ...
    zephon_store.errors.LiveTopologyError: the participants of the live step at cursor 24 disagree: indices [0, 0] of 2 participants (each of 0..1 must be claimed once); 2 processes claimed it. The participants callable must give every process of the step's quorum the same count and a distinct index; the step is not read, so nothing overlaps
    """
    if mine.index is None:
        return
    cursors = sorted({c.cursor for c in claims})
    counts = sorted({c.participants for c in claims})
    indices = sorted(c.index for c in claims)
    problem = None
    if cursors != [mine.cursor]:
        problem = f"cursors {cursors} (this process: {mine.cursor})"
    elif counts != [mine.participants]:
        problem = f"participant counts {counts} (this process: {mine.participants})"
    elif indices != list(range(mine.participants)):
        problem = (f"indices {indices} of {mine.participants} participants (each of "
                   f"0..{mine.participants - 1} must be claimed once)")
    if problem is not None:
        raise LiveTopologyError(
            f"the participants of the live step at cursor {mine.cursor} disagree: {problem}; "
            f"{len(claims)} processes claimed it. The participants callable must give every "
            "process of the step's quorum the same count and a distinct index; the step is "
            "not read, so nothing overlaps")


def participant_positions(cursor: int, global_batch: int, participants: int,
                          index: int | None, *, lanes: int = 1,
                          epoch_size: int | None = None, end: int | None = None,
                          group_size: int = 1, group_rank: int = 0) -> np.ndarray:
    """Positions participant ``index`` of ``participants`` reads in the step at ``cursor``.

    A full step follows :func:`~zephon_store.order.assign.positions_for_participant` (any
    count, uneven when it does not divide ``global_batch``). A step cut short by ``end``
    (the last one of a bounded run) is split as evenly as it goes. ``index`` None (present,
    not participating) reads nothing. ``group_size`` ranks of one participant (a replica
    group) split its share into contiguous parts as evenly as they go; ``group_rank`` takes
    its part.

    >>> [participant_positions(0, 8, 3, i).tolist() for i in range(3)]
    [[0, 1], [2, 3, 4], [5, 6, 7]]
    >>> participant_positions(96, 8, 2, 1, end=100).tolist()        # short last step
    [98, 99]
    >>> participant_positions(0, 8, 3, 2, group_size=2, group_rank=1).tolist()
    [6, 7]
    """
    claim_step(cursor, participants, index)
    if not 0 <= group_rank < group_size:
        raise ValueError(f"group_rank must be in [0, {group_size}), got {group_rank}")
    if index is None:
        return np.empty(0, dtype=np.int64)
    if end is not None and cursor + global_batch > end:
        share = tail_positions_for_rank(min(cursor, end), end, participants, index,
                                        lanes=lanes, epoch_size=epoch_size)
    else:
        share = positions_for_participant(cursor, global_batch, participants, index,
                                          lanes=lanes, epoch_size=epoch_size)
    n = share.size
    return share[group_rank * n // group_size:(group_rank + 1) * n // group_size]


class LiveCursor:
    """The committed cursor of a live run: it moves only when a step commits.

    Two ways to learn of commits:

    - ``commits`` given: a counter of committed steps (torchft: ``manager.current_step``).
      The cursor is ``anchor + (commits() - anchor_count) * global_batch`` (capped at
      ``end``): each committed step moved it by one global batch. A load re-anchors it at
      the counter's value then. That is what makes a replica that heals exact: torchft sets
      the counter and loads the state together, before the step's commit.
    - no ``commits``: the caller calls :meth:`commit` after each served step with the
      step's fate; serving another step first raises.

    >>> c = LiveCursor(8)
    >>> c.begin(), c.commit(False), c.begin(), c.commit(True), c.position
    (0, None, 0, None, 8)
    >>> steps = iter([0, 0, 0, 1])
    >>> c = LiveCursor(8, commits=lambda: next(steps))
    >>> c.begin(), c.begin(), c.begin()     # the first step did not commit, the second did
    (0, 0, 8)
    """

    def __init__(self, global_batch: int, *, cursor: int = 0, end: int | None = None,
                 commits: Callable[[], int] | None = None) -> None:
        if global_batch <= 0:
            raise ValueError(f"global_batch must be > 0, got {global_batch}")
        if cursor < 0:
            raise ValueError(f"cursor must be >= 0, got {cursor}")
        self.global_batch = global_batch
        self.end = end
        self.commits = commits
        self._lock = threading.Lock()
        self._anchor = cursor
        self._anchor_step = 0
        self._anchor_count = commits() if commits is not None else 0
        self._pending = False       # explicit mode: a served step awaits commit()

    def _steps(self, count: int) -> int:
        steps = count - self._anchor_count
        if steps < 0:
            raise LiveTopologyError(
                f"the commit counter went back from {self._anchor_count} to {count}; the "
                "loader state must be loaded after the counter's owner (torchft: load the "
                "Manager's state before the loader's)")
        return steps

    def _at(self, count: int) -> int:
        cursor = self._anchor + self._steps(count) * self.global_batch
        return cursor if self.end is None else min(cursor, max(self.end, self._anchor))

    @property
    def step(self) -> int:
        """Committed steps (counted from the loaded state's, else from 0)."""
        with self._lock:
            if self.commits is None:
                return self._anchor_step
            return self._anchor_step + self._steps(self.commits())

    @property
    def position(self) -> int:
        """The committed cursor: every position before it was consumed by a committed step."""
        with self._lock:
            if self.commits is None:
                return self._anchor
            return self._at(self.commits())

    def begin(self) -> int:
        """The cursor of the step to serve now (the same one again if the last did not commit)."""
        with self._lock:
            if self.commits is None:
                if self._pending:
                    raise LiveTopologyError(
                        f"the step at cursor {self._anchor} was served but neither committed "
                        "nor abandoned; call commit(True) or commit(False) after each step "
                        "(or give the loader a commit counter)")
                self._pending = True
                return self._anchor
            return self._at(self.commits())

    def commit(self, ok: bool = True) -> None:
        """The step served last committed (``ok``) or did not; explicit mode only."""
        with self._lock:
            if self.commits is not None:
                raise LiveTopologyError("this cursor follows a commit counter; commit() is "
                                        "for a cursor without one")
            if not self._pending:
                raise LiveTopologyError("commit() without a served step; call it once per step")
            self._pending = False
            if ok:
                step = self.global_batch if self.end is None else \
                    min(self.global_batch, max(0, self.end - self._anchor))
                self._anchor += step
                self._anchor_step += 1

    def load(self, cursor: int, step: int | None = None) -> None:
        """Continue from ``cursor`` (a loaded state; a joining replica's state transfer),
        after ``step`` committed steps (None: ``cursor // global_batch``).

        A step in flight stays in flight: committing it advances from ``cursor``, which is
        where the quorum that commits it stands.
        """
        with self._lock:
            self._anchor = cursor
            self._anchor_step = cursor // self.global_batch if step is None else step
            if self.commits is not None:
                self._anchor_count = self.commits()


@dataclass(frozen=True)
class Participant:
    """This process's part of every live step: participant ``index`` of ``participants``
    (``index`` None: present, reads nothing), rank ``group_rank`` of its replica group of
    ``group_size``. It is the ``split`` a :class:`~zephon_store.load.share_reader.ShareReader`
    reads by instead of the topology's rank rule; one reader per quorum shape, so nothing
    about it ever changes.

    >>> Participant(3, 1).positions(0, 8).tolist()
    [2, 3, 4]
    """

    participants: int
    index: int | None
    group_size: int = 1
    group_rank: int = 0

    def positions(self, cursor: int, global_batch: int, *, lanes: int = 1,
                  epoch_size: int | None = None, end: int | None = None) -> np.ndarray:
        """Its positions in the step at ``cursor`` (:func:`participant_positions`)."""
        return participant_positions(cursor, global_batch, self.participants, self.index,
                                     lanes=lanes, epoch_size=epoch_size, end=end,
                                     group_size=self.group_size, group_rank=self.group_rank)


EngineFor = Callable[[int, Participant], ShareReader]


class LiveShare:
    """This process's batch of any live step, reused when a step is served again.

    :meth:`batch` ``(cursor, participants, index)`` returns the share's decoded batch. The
    steps after it come from one reader (``reader(cursor, participant)``, decoding ahead)
    while the quorum keeps its shape (same participants, same index); when it changes, a new
    reader starts at the new step. The last batch handed out is kept: a step that did not
    commit and comes back with the same positions (:attr:`reused` counts those) is handed
    out again without fetching or decoding. ``batches(reader)`` makes a reader's
    ``(i, batch)`` (default: :meth:`ShareReader.batches`; the loader's producer thread
    when it has a transform).

    >>> from zephon_store import open_dataset
    >>> share = LiveShare.of(open_dataset(tiny_dataset), OrderOptions(seed=7), global_batch=8)
    >>> a = share.batch(0, 2, 1); b = share.batch(0, 2, 1)      # not committed: served again
    >>> a is b, share.reused, a["id"].tolist()
    (True, 1, [68, 97, 30, 33])
    """

    def __init__(self, reader: EngineFor, *, global_batch: int, group_size: int = 1,
                 group_rank: int = 0,
                 batches: Callable[[ShareReader], Iterator] | None = None) -> None:
        if not 0 <= group_rank < group_size:
            raise ValueError(f"group_rank must be in [0, {group_size}), got {group_rank}")
        self._reader = reader
        self._batches = batches or ShareReader.batches
        self.global_batch = global_batch
        self.group = (group_size, group_rank)
        self._last: tuple[tuple, dict] | None = None
        self._run: _Run | None = None
        self.reused = 0          # batches handed out again for a step served again
        self.decodes = 0         # row-group decodes started, over every reader
        self.last_note = None    # a process worker's note of the batch just made (observe/)

    @classmethod
    def of(cls, dataset, order_options: OrderOptions, *, global_batch: int,
           batch: BatchOptions | None = None, read_ahead: ReadAheadOptions | None = None,
           end: int | None = None, group_size: int = 1, group_rank: int = 0) -> LiveShare:
        """A share of ``dataset`` (a Source) read alone; ``end``: where the run stops (a
        short last step; None: endless). :class:`LiveLoader` builds its own from its
        loader's reader."""
        def reader(cursor: int, part: Participant) -> ShareReader:
            n = None if end is None else -(-max(0, end - cursor) // global_batch)
            return ShareReader(dataset, order_options, Topology(global_batch), batch=batch,
                               read_ahead=read_ahead, start_cursor=cursor, num_batches=n,
                               end=end, split=part)

        return cls(reader, global_batch=global_batch, group_size=group_size,
                   group_rank=group_rank)

    def batch(self, cursor: int, participants: int, index: int | None) -> dict:
        """The batch of participant ``index`` of ``participants`` in the step at ``cursor``."""
        key = (cursor, participants, index)
        if self._last is not None and self._last[0] == key:
            self.reused += 1
            self.last_note = None
            return self._last[1]
        run = self._run
        if run is None or run.shape != (participants, index) or run.next_cursor != cursor:
            self.close()
            reader = self._reader(cursor, Participant(participants, index, *self.group))
            run = self._run = _Run(reader, self._batches(reader), (participants, index),
                                   cursor, self.global_batch)
        out = run.next()
        self.last_note = run.note
        self.decodes += run.decodes_since()
        self._last = (key, out)
        return out

    def close(self) -> None:
        """Stop the read-ahead (decodes queued are dropped)."""
        run, self._run = self._run, None
        if run is not None:
            run.close()


class _Run:
    """One reader's batches over consecutive steps of one quorum shape."""

    def __init__(self, reader: ShareReader, batches: Iterator, shape: tuple, cursor: int,
                 global_batch: int) -> None:
        self.reader = reader
        self.shape = shape
        self.next_cursor = cursor
        self.global_batch = global_batch
        self._it = batches
        self._counted = 0
        self.note = None

    def next(self) -> dict:
        # A process worker's batch comes with its note (observe/account.py): kept in
        # ``note`` for the loader's account of the step.
        i, out, *note = next(self._it)
        assert self.reader.start_cursor + i * self.global_batch == self.next_cursor
        self.next_cursor += self.global_batch
        self.note = note[0] if note else None
        return out

    def decodes_since(self) -> int:
        now = self.reader.decodes
        new, self._counted = now - self._counted, now
        return new

    def close(self) -> None:
        self._it.close()


class LiveLoader(Loader):
    """A :class:`~zephon_store.load.loader.Loader` whose steps are split among each step's
    participants and whose cursor moves when a step commits; no torch.

    Everything else is the Loader's, over the same reader: the source (a dataset or a
    mixture), the order and its lanes (``lanes="auto"`` for one node: replica groups come
    and go, so they are not nodes), the option groups, the deny list, the run log, the end
    of the stream and the state (``state_dict()`` is the committed cursor and step, so a
    ``ZephonLoader`` resumes it and the other way round).

    ``participants()`` gives ``(index, count)`` for the step about to be drawn (``index``
    None: present, reads nothing); ``commits()`` counts committed steps (None: call
    :meth:`commit` after each step); ``agree(claim)`` all-gathers the participants' claims
    (None: not checked); ``group_size``/``group_rank`` split a participant's share among
    the ranks of its replica group. Unlike the Loader, a loaded state applies to the live
    iterator's next step: that is how a replica heals mid-run. Process workers (a front end
    that has them, :class:`~zephon_store.torch.LiveZephonLoader`) make the batches of each
    quorum shape; a step this process only watches is made here (it reads nothing).

    >>> quorum = [(1, 3)]                     # participant 1 of 3
    >>> loader = LiveLoader(tiny_dataset, global_batch=8, seed=7,
    ...                     participants=lambda: quorum[0])
    >>> batches = iter(loader)
    >>> next(batches)["id"].tolist()
    [78, 45, 68]
    >>> loader.commit(True); quorum[0] = (0, 1)  # committed; now alone
    >>> next(batches)["id"].tolist(), loader.state_dict()["cursor"]
    ([49, 5, 87, 4, 43, 40, 0, 3], 8)
    """

    def __init__(self, dataset, *, global_batch: int, participants: Callable[[], tuple],
                 commits: Callable[[], int] | None = None,
                 agree: Callable[[StepClaim], Sequence[StepClaim] | None] | None = None,
                 group_size: int = 1, group_rank: int = 0, **options) -> None:
        if participants is None:
            raise ValueError("pass participants= (a callable giving (index, count) for the "
                             "current step)")
        if not 0 <= group_rank < group_size:
            raise ValueError(f"group_rank must be in [0, {group_size}), got {group_rank}")
        super().__init__(dataset, topology=Topology(global_batch), **options)
        self.participants = participants
        self.agree = agree
        self.group = (group_size, group_rank)
        self._commits = LiveCursor(global_batch, end=self._stream_end, commits=commits)
        self.share: LiveShare | None = None
        self._share_loads = -1
        self.last_step: StepClaim | None = None   # the step served last (for logs and audits)
        # (cursor, participants, log size) of the step whose count this process last logged
        # or found logged (_log_step).
        self._logged_shape: tuple[int, int, int] | None = None

    def _position(self) -> tuple[int, int]:
        return self._commits.position, self._commits.step

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (a checkpoint, or the quorum's state transfer) at the
        open iterator's next step.

        With a commit counter (torchft), load the counter's owner first: the cursor counts
        commits from the counter's value at the time of the load.
        """
        st, step = self._adopt_state(state)
        self._commits.end = self._stream_end
        self._commits.load(st.cursor, step)
        self._loads += 1      # the next step starts a new share (order, schedule, cursor)

    def commit(self, ok: bool = True) -> None:
        """The step served last committed (``ok``) or not; only without a commit counter."""
        self._commits.commit(ok)

    def __iter__(self) -> Iterator:
        return close_at_exit(self._live_steps())

    def _live_steps(self) -> Iterator:
        self._warn_dropped(self._commits.position)
        try:
            while True:
                # The quorum first: a replica that heals before the step loads its cursor
                # in there (torchft's synchronous quorum), so the cursor is read after it.
                index, count = self.participants()
                if self._num_batches(self._commits.position) == 0:
                    return
                claim = claim_step(self._commits.begin(), count, index)
                if self.agree is not None:
                    claims = self.agree(claim)
                    if claims is not None:
                        check_claims(claim, claims)
                if claim.index is not None and self.run_log:
                    self._log_step(claim)
                # The loop's wait for this step, by cause, as the Loader's (its collation
                # included; a worker's note splits the wait until its batch was ready).
                _, batch = self.account.next(self._step_batch(claim), self._commits.step,
                                             self.collate)
                self.last_step = claim
                yield batch
        finally:
            self.account.flush()
            if self.share is not None:
                self.share.close()

    def _step_batch(self, claim: StepClaim) -> Iterator:
        """The claimed step's batch as the account reads a step: ``(0, batch[, note])``."""
        share = self._share()
        batch = share.batch(claim.cursor, claim.participants, claim.index)
        yield (0, batch) if share.last_note is None else (0, batch, share.last_note)

    def _log_step(self, claim: StepClaim) -> None:
        """Log the segment this loader takes the run up at (its construction or a load), or
        the participant count of a step the log may not give it.

        A live segment is a stretch of committed steps in one order from one ``(step,
        cursor)`` with one participant count (which places each participant's positions).
        Taken up: logged at the first step this process reads after it, so a replica that
        heals, reading nothing until its state arrived, never logs the cursor it had before;
        every replica logs, and lines that continue the run's cursor are no discrepancy for
        ``zephon audit``, one that does not is (runs/audit.py). The count: participant 0 of
        each step (rank 0 of its group) logs it unless its own last check was this step or
        the one before, with the same count, and the log has not grown since (another
        quorum's line, e.g. for this step served to a quorum without it). The log drops a
        line it already places with the same count (load/runlog.py), so a step costs one
        ``stat``, and a change of the count one line.
        """
        if self._logged_loads == self._loads and (
                claim.index != 0 or self.group[1] != 0 or self._log_has(claim)):
            return
        self._log_segment(claim.cursor, self._commits.step, live=True,
                          participants=claim.participants)
        self._logged_loads = self._loads
        self._logged_shape = (claim.cursor, claim.participants, _file_size(self.run_log))

    def _log_has(self, claim: StepClaim) -> bool:
        """Whether the log gives ``claim``'s step its participant count, by this process's
        last check (then moved to this step)."""
        last = self._logged_shape
        size = _file_size(self.run_log)
        if (last is None or last[1] != claim.participants or last[2] != size
                or claim.cursor - last[0] not in (0, self.topology.global_batch)):
            return False
        self._logged_shape = (claim.cursor, claim.participants, size)
        return True

    def _share(self) -> LiveShare:
        """The share over this loader's reader, new after each load."""
        if self.share is None or self._share_loads != self._loads:
            if self.share is not None:
                self.share.close()
            self._share_loads = self._loads
            g_size, g_rank = self.group
            self.share = LiveShare(self._reader, global_batch=self.topology.global_batch,
                                   group_size=g_size, group_rank=g_rank,
                                   batches=self._batches_of)
        return self.share

    def _batches_of(self, reader: ShareReader) -> Iterator:
        """One quorum shape's batches: by the process workers, if any, unless this process
        only watches (it reads nothing: no worker is started for an empty share)."""
        if reader.stream.split.index is not None:
            return self.worker_part.batches(reader)
        return thread_batches(reader, self.workers.prefetch)


def _file_size(path: str) -> int:
    """The size of ``path`` (-1: none): a run log only grows, so a new size means a new line."""
    try:
        return os.path.getsize(path)
    except OSError:
        return -1
