"""The run log: one JSON line per segment of a run, enough to recompute every step.

A *segment* is what one launch of a job consumed: from its first step, at its cursor, with
one global batch, world size and worker count. A resume (on any world size, batch size or
worker count) starts a new segment. Each line holds::

    {"kind": "zephon-runlog", "version": 1, "first_step": 40, "cursor": 480,
     "global_batch": 12, "world_size": 3, "num_workers": 2, "ranks_per_node": 3,
     "dataset_id": "xxh3:...", "mixture": null, "order": {...OrderOptions...},
     "deny_list": null | {"id": "xxh3:...", "mode": "mask", "count": 3, "path": "..."},
     "zephon_store": "0.1.0", "time": "2026-12-01T10:00:00Z"}

A live run (:class:`~zephon_store.load.live.LiveLoader`) adds ``"live": true`` and
``"participants": n``: its steps are split among each step's participants (participant
``i`` of ``n`` reads :func:`~zephon_store.order.assign.positions_for_participant`), whose
count changes from step to step while the order and the cursor do not, so its
``world_size`` is 1 and a live line is written where the count changes (and where a replica
takes the run up); a step counts when it commits (a step that did not is served again and
counted once, and a line for it written then replaces the one before). Without the key a
line is not live: lines of earlier versions read unchanged, and other lines are written as
before; a live line without ``participants`` (written before the count was) places its
steps as one part, read by participants it does not name.

With the dataset, that is enough to recompute which sample every rank read at every step
(``zephon trace``), when a sample was read (``zephon where``) and whether the run read
every sample exactly once per epoch (``zephon audit``): nothing is stored per sample.

The log is appended, never rewritten, by one writer: rank 0, with ``O_APPEND``, an
exclusive ``flock`` and an ``fsync`` per line, so ranks starting at once never interleave
and a crash leaves at most one incomplete last line (which :func:`read_run_log` reports by
its line number). Other ranks write nothing.

A log is read as untrusted input: a line with numbers no run reaches (positions or steps at
``MAX_POSITION``, more than ``MAX_WORLD_SIZE`` ranks or ``MAX_GLOBAL_BATCH`` samples per
step), deep nesting, an integer of thousands of digits, or a path that is not a regular
file is a :class:`RunLogError` naming the file and line, so every answer computed from a
log is bounded by what its steps reach.

Step numbers come from the loader state (``step``, the global batches consumed since the
run began), independently of the cursor: a cursor edited by hand in a checkpoint then shows
as a segment whose cursor does not continue the one before it.

>>> import os
>>> from zephon_store.order import OrderOptions
>>> path = os.path.join(tmp, "run.jsonl")
>>> seg = RunSegment(first_step=0, cursor=0, global_batch=8, world_size=2, num_workers=0,
...                  dataset_id="xxh3:00", order=OrderOptions(seed=7))
>>> append_segment(path, seg), append_segment(path, seg.replace(first_step=5, cursor=40,
...                                                                world_size=4), rank=1)
(True, False)
>>> [(s.first_step, s.cursor, s.world_size, s.line) for s in read_run_log(path)]
[(0, 0, 2, 1)]
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._util.regular import NotRegularFileError, read_regular
from ..errors import ZephonError
from ..order.order import OrderOptions
from .denylist import DENY_MODE, IDENTITY_RE, DenyListError

__all__ = ["RunLogError", "RunSegment", "append_segment", "read_run_log", "segment_steps",
           "MAX_GLOBAL_BATCH", "MAX_POSITION",
           "MAX_WORLD_SIZE", "RUNLOG_KIND", "RUNLOG_VERSION", "RUNLOG_NAME"]

RUNLOG_KIND = "zephon-runlog"
RUNLOG_VERSION = 1
# The file name the TorchTitan integration uses inside the checkpoint folder.
RUNLOG_NAME = "zephon-runlog.jsonl"
_REQUIRED = ("first_step", "cursor", "global_batch", "world_size", "num_workers",
             "dataset_id", "order")
_INT_FIELDS = ("first_step", "cursor", "global_batch", "world_size", "num_workers")

# What a run can reach, so that trace, where and audit answer in bounded time or refuse.
# Positions (and steps, one sample at least each) stay below a mixture's limit (2**62,
# order/mixture.py), so every cursor and the step after it fit int64. Ranks: 2**20 is ten
# times the largest clusters built; a global batch of 2**24 samples is far beyond any run's,
# and trace and where build a step's positions (O(global_batch)) to place its ranks.
MAX_POSITION = 1 << 62
MAX_WORLD_SIZE = 1 << 20
MAX_GLOBAL_BATCH = 1 << 24


class RunLogError(ZephonError, ValueError):
    """A run log is unreadable or inconsistent; the message names the file and line."""


@dataclass(frozen=True)
class RunSegment:
    """One line of a run log: a launch's first step and everything that places its steps.

    ``line`` is the 1-based line number it was read from (0 for a segment not read from a
    file). ``mixture`` is a mixture's identity entry (None for one dataset); ``deny_list``
    is a deny list's ``{"id", "mode", "count", "path"}`` (None: nothing masked); ``live``:
    a live run's segment (each step split among its participants; ``world_size`` 1);
    ``participants``: a live segment's participant count (None: not recorded).
    """

    first_step: int
    cursor: int
    global_batch: int
    world_size: int
    num_workers: int
    dataset_id: str
    order: OrderOptions
    ranks_per_node: int | None = None
    mixture: dict | None = None
    deny_list: dict | None = None
    zephon_store: str = ""
    time: str = ""
    line: int = 0
    live: bool = False
    participants: int | None = None

    def __post_init__(self) -> None:
        n = self.participants
        if n is not None and (not self.live or not isinstance(n, int) or isinstance(n, bool)
                              or not 1 <= n <= MAX_WORLD_SIZE):
            raise ValueError(f"participants is a live segment's participant count, an int in "
                             f"[1, {MAX_WORLD_SIZE}] (or null), got {n!r} "
                             f"(live={self.live!r})")
        if not isinstance(self.live, bool) or (self.live and self.world_size != 1):
            raise ValueError(f"live must be true or false, and a live segment's world_size 1 "
                             f"(its participants change per step), got live={self.live!r}, "
                             f"world_size={self.world_size!r}")
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if self.global_batch < 1 or self.world_size < 1:
            raise ValueError(f"global_batch and world_size must be >= 1, got "
                             f"{self.global_batch} and {self.world_size}")
        if self.world_size > MAX_WORLD_SIZE or self.global_batch > MAX_GLOBAL_BATCH:
            raise ValueError(f"world_size {self.world_size} and global_batch "
                             f"{self.global_batch} must be <= {MAX_WORLD_SIZE} and "
                             f"{MAX_GLOBAL_BATCH}: no run is that large")
        if self.first_step >= MAX_POSITION or self.cursor + self.global_batch > MAX_POSITION:
            raise ValueError(f"first_step {self.first_step} and cursor {self.cursor} (+ "
                             f"global_batch) must stay below 2**62: no run reaches that")
        if self.global_batch % self.world_size:
            raise ValueError(f"world_size {self.world_size} does not divide global_batch "
                             f"{self.global_batch}")
        rpn = self.ranks_per_node
        if rpn is not None and (not isinstance(rpn, int) or isinstance(rpn, bool)
                                or not 1 <= rpn <= MAX_WORLD_SIZE):
            raise ValueError(f"ranks_per_node must be an int in [1, {MAX_WORLD_SIZE}] or "
                             f"null, got {rpn!r}")
        if self.mixture is not None and not _well_formed_mixture_entry(self.mixture):
            raise ValueError("mixture must be null or an object with a list of \"sources\" "
                             "(objects) and a \"schedule\" object")
        if not isinstance(self.order, OrderOptions):
            raise ValueError(f"order must be OrderOptions, got {type(self.order).__name__}")
        _check_deny_entry(self.deny_list)

    def replace(self, **changes: Any) -> RunSegment:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def cursor_at(self, step: int) -> int:
        """The cursor before global step ``step`` of this segment (``step >= first_step``).

        >>> RunSegment(10, 120, 12, 3, 0, "xxh3:00", OrderOptions()).cursor_at(12)
        144
        """
        if step < self.first_step:
            raise ValueError(f"step {step} is before this segment's first step "
                             f"{self.first_step}")
        return self.cursor + (step - self.first_step) * self.global_batch

    def same_stream(self, other: RunSegment) -> bool:
        """Whether both segments read the same stream (dataset or mixture, and order)."""
        return (self.dataset_id, self.order, _mix_id(self.mixture)) == (
            other.dataset_id, other.order, _mix_id(other.mixture))

    def to_dict(self) -> dict[str, Any]:
        """The JSON line's object (without ``line``; ``live`` only when true, so every
        other line is written as before)."""
        from .. import __version__

        live = {"live": True} if self.live else {}
        if self.participants is not None:
            live["participants"] = self.participants
        return {**live, "kind": RUNLOG_KIND, "version": RUNLOG_VERSION, "first_step": self.first_step,
                "cursor": self.cursor, "global_batch": self.global_batch,
                "world_size": self.world_size, "num_workers": self.num_workers,
                "ranks_per_node": self.ranks_per_node, "dataset_id": self.dataset_id,
                "mixture": self.mixture, "order": self.order.to_dict(),
                "deny_list": self.deny_list, "zephon_store": self.zephon_store or __version__,
                "time": self.time or datetime.datetime.now(datetime.timezone.utc)
                .strftime("%Y-%m-%dT%H:%M:%SZ")}

    @classmethod
    def from_dict(cls, d: dict, *, line: int = 0, where: str = "run log") -> RunSegment:
        """Parse one line's object; errors name ``where`` and ``line``."""
        at = f"{where} line {line}"
        if not isinstance(d, dict) or d.get("kind") != RUNLOG_KIND:
            raise RunLogError(f"{at}: not a zephon run log line (no \"kind\": "
                              f"\"{RUNLOG_KIND}\"); is this the right file?")
        if d.get("version") != RUNLOG_VERSION:
            raise RunLogError(f"{at}: run log version {d.get('version')!r} is not supported "
                              f"(this zephon_store reads version {RUNLOG_VERSION})")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise RunLogError(f"{at}: missing {missing}; the line is damaged")
        try:
            _check_deny_entry(d.get("deny_list"))
        except ValueError as exc:
            raise DenyListEntryError(f"{at}: {exc}; the line is damaged") from None
        try:
            order = OrderOptions.from_dict(d["order"])
            return cls(first_step=d["first_step"], cursor=d["cursor"],
                       global_batch=d["global_batch"], world_size=d["world_size"],
                       num_workers=d["num_workers"], dataset_id=str(d["dataset_id"]),
                       order=order, ranks_per_node=d.get("ranks_per_node"),
                       mixture=d.get("mixture"), deny_list=d.get("deny_list"),
                       zephon_store=str(d.get("zephon_store", "")),
                       time=str(d.get("time", "")), line=line, live=d.get("live", False),
                       participants=d.get("participants"))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # A hand-edited line (an order that is not an object, a field of the wrong
            # type): one line naming the file and line, never a traceback.
            raise RunLogError(f"{at}: {exc}") from None


class DenyListEntryError(RunLogError, DenyListError):
    """A run log line's ``deny_list`` entry is malformed (a damaged or hand-edited line)."""


def _check_deny_entry(entry: object) -> None:
    """A ``deny_list`` entry is null or ``{"id": "xxh3:<32 hex>", "mode": "mask", "count":
    n, "path": "..."}``: trace and audit find the logged copy by ``id``, so it must not
    name anything else (load/denylist.py)."""
    if entry is None:
        return
    if not isinstance(entry, dict):
        raise ValueError(f"'deny_list' must be null or an object {{id, mode, count, path}}, "
                         f"got {entry!r:.60}")
    if "id" not in entry:
        raise ValueError("'deny_list' has no 'id'")
    if not isinstance(entry["id"], str) or not IDENTITY_RE.fullmatch(entry["id"]):
        raise ValueError(f"'deny_list.id' must be xxh3:<32 hex digits>, got {entry['id']!r:.60}")
    if entry.get("mode") != DENY_MODE:
        raise ValueError(f"'deny_list.mode' must be \"{DENY_MODE}\", got "
                         f"{entry.get('mode')!r:.60}")
    count = entry.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"'deny_list.count' must be an int >= 0, got {count!r:.60}")
    if not isinstance(entry.get("path", ""), str):
        raise ValueError(f"'deny_list.path' must be a string, got {entry.get('path')!r:.60}")


def _well_formed_mixture_entry(mixture: object) -> bool:
    """Whether a log line's ``mixture`` value has the entry's shape: an object with a list
    of ``sources`` (objects) and a ``schedule`` object."""
    return (isinstance(mixture, dict) and isinstance(mixture.get("sources"), list)
            and all(isinstance(s, dict) for s in mixture["sources"])
            and isinstance(mixture.get("schedule"), dict))


def _mix_id(mixture: dict | None) -> str | None:
    return None if mixture is None else str(mixture.get("id"))


def append_segment(path: str, segment: RunSegment, *, rank: int = 0) -> bool:
    """Append ``segment`` as one line to the local file ``path``; only rank 0 writes.

    Returns whether this call wrote. The line goes out in one ``write`` on an ``O_APPEND``
    descriptor under an exclusive ``flock``, then ``fsync``: two writers (a stale job and a
    new one) never interleave, and the line is on disk before training goes on. A file whose
    last line was cut by a crash gets a newline first, so the new line stays readable (the
    cut line itself is still reported by :func:`read_run_log`).

    A live line is not written when the live line last written already places its step at
    its cursor and says nothing new: one older than it (a replica that stalled between
    taking the run up and logging it, while the others committed past a later heal; written
    after it, it would read as overlapping segments), or one whose participant count the
    last line's segment already gives its step (another replica's line for the same quorum).
    One that disagrees is written, so that the audit reports it.
    """
    if rank != 0:
        return False
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    data = (json.dumps(segment.to_dict(), sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        with _locked(fd):
            size = os.fstat(fd).st_size
            if segment.live and size and _already_placed(path, size, segment):
                return False
            if size:
                with open(path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _already_placed(path: str, size: int, segment: RunSegment) -> bool:
    """Whether the last complete line of ``path`` (``size`` bytes) is a live segment of the
    same stream and global batch that places ``segment``'s first step at its cursor, and
    starts after it or at or before it with the same participant count (recorded)."""
    with open(path, "rb") as f:
        f.seek(max(0, size - (1 << 16)))
        tail = f.read(size - f.tell())
    lines = [ln for ln in tail.split(b"\n") if ln.strip()]
    if not lines:
        return False
    try:
        last = RunSegment.from_dict(json.loads(lines[-1]))
    except (ValueError, RunLogError):
        return False    # a cut or foreign last line: write, read_run_log reports it
    same_count = (segment.participants is not None
                  and last.participants == segment.participants)
    return (last.live and (last.first_step > segment.first_step or same_count)
            and last.global_batch == segment.global_batch and last.same_stream(segment)
            and (last.deny_list or {}).get("id") == (segment.deny_list or {}).get("id")
            and last.cursor - segment.cursor
            == (last.first_step - segment.first_step) * segment.global_batch)


@contextlib.contextmanager
def _locked(fd: int):
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock (Windows): O_APPEND alone
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def read_run_log(path: str, *, dataset_id: str | None = None) -> list[RunSegment]:
    """The segments of a run log, in order, checked; a bad line raises :class:`RunLogError`.

    Checks, each error naming the line: every line is one complete JSON object of this
    format (a line cut by a crash is reported, not skipped); with ``dataset_id``, the log
    is for that dataset or mixture; segments start at increasing steps. A line with the
    same first step as the one before it replaces it (a launch that stopped before its
    first checkpoint, resumed from the same state); a smaller first step overlaps steps
    already logged and is an error (a resume from an older checkpoint: start a new log, or
    cut the lines after that checkpoint's segment).
    """
    # A FIFO would block and a device read without end: a run log is a regular file (as
    # manifests and shards are).
    try:
        raw = read_regular(path)
    except NotRegularFileError:
        raise RunLogError(f"{path} is not a regular file (a FIFO, socket, device or "
                          "folder); pass the run log the loader wrote") from None
    except OSError as exc:
        raise RunLogError(f"{path}: cannot read the run log ({exc.strerror or exc})") from None
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out: list[RunSegment] = []
    for i, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            d = json.loads(text)
        except RecursionError:
            raise RunLogError(f"{path} line {i}: JSON nested too deep to be a run log line; "
                              "restore the log or delete that line") from None
        except ValueError as exc:
            if "integer string conversion" in str(exc):
                raise RunLogError(f"{path} line {i}: an integer of thousands of digits, not "
                                  "a run log number; restore the log or delete that line"
                                  ) from None
            last = i == len(lines)
            raise RunLogError(
                f"{path} line {i}: not a complete JSON line"
                + (" (the writer stopped in the middle of it?)" if last or not
                   raw.endswith(b"\n") else "")
                + f": {text[:80]!r}; restore the log or delete that line") from None
        seg = RunSegment.from_dict(d, line=i, where=path)
        if dataset_id is not None and seg.dataset_id != dataset_id and not out:
            raise RunLogError(f"{path} line {i}: the log is for dataset {seg.dataset_id}, not "
                              f"{dataset_id}; pass the dataset (or mixture) the run read")
        if out and seg.first_step < out[-1].first_step:
            prev = out[-1]
            raise RunLogError(
                f"{path} line {i}: segment starts at step {seg.first_step}, inside the "
                f"segment of line {prev.line} (from step {prev.first_step}): overlapping "
                "segments; a resume from an older checkpoint starts a new log (or cut the "
                "lines logged after that checkpoint)")
        if out and seg.first_step == out[-1].first_step:
            out.pop()
        out.append(seg)
    if not out:
        raise RunLogError(f"{path}: the run log holds no segment")
    return out


def segment_steps(segments: Iterable[RunSegment],
                  end_step: int | None = None) -> list[tuple[RunSegment, int, int]]:
    """``(segment, first, stop)`` per segment: the steps ``[first, stop)`` it consumed.

    A segment ends where the next begins; the last ends at ``end_step`` (None: at its own
    first step, i.e. nothing of it is counted, since the log does not record where a run
    stopped).

    >>> s0 = RunSegment(0, 0, 8, 2, 0, "xxh3:00", OrderOptions())
    >>> [(s.line, a, b) for s, a, b in segment_steps([s0, s0.replace(first_step=5)], 9)]
    [(0, 0, 5), (0, 5, 9)]
    """
    segs = list(segments)
    out = []
    for k, seg in enumerate(segs):
        stop = segs[k + 1].first_step if k + 1 < len(segs) else (
            seg.first_step if end_step is None else end_step)
        if k + 1 == len(segs) and stop < seg.first_step:
            raise RunLogError(f"end step {stop} is before the last segment's first step "
                              f"{seg.first_step} (line {seg.line})")
        if stop > seg.first_step and seg.cursor_at(stop) > MAX_POSITION:
            raise RunLogError(f"line {seg.line}: steps [{seg.first_step}, {stop}) would reach "
                              f"position {seg.cursor_at(stop)}, beyond 2**62 that no run "
                              "reaches" + (f"; is end step {stop} right?" if k + 1 == len(segs)
                                           else "; the log is damaged"))
        out.append((seg, seg.first_step, stop))
    return out
