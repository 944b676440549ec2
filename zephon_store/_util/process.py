"""The one answer to "is process ``pid`` of this host still alive?".

Callers decide from it whether what a process left behind is stale: the output lock of a
convert that died on this host (``write/lock.py``), the first layout's scratch files
(``write/scratch.py``), the node cache's read plans (``io/cache.py``), and whether a loader
worker's rank is gone (``_util/parent_watch.py``). Each answer below is the one all of them
need; the one they must never get is "dead" for a process that may still run, since a lock
broken or a file removed under a live process is a silent corruption, while one kept too long
is a visible and recoverable wait.

>>> import os
>>> process_alive(os.getpid())
True
>>> process_alive(0), process_alive(-1), process_alive(True), process_alive("12")
(False, False, False, False)
"""

from __future__ import annotations

import os

__all__ = ["is_pid", "process_alive"]

# pid_t is a signed 32-bit int on Linux and macOS: os.kill() raises OverflowError beyond it,
# and no process can have such an id (Linux's own ceiling, PID_MAX_LIMIT, is 2**22).
_PID_T_MAX = 2**31 - 1


def is_pid(value: object) -> bool:
    """Whether ``value`` can be the id of one process: an ``int`` (not a ``bool``) in
    ``1 .. 2**31 - 1``.

    ``0`` and negative numbers are not: ``kill()`` reads them as process *groups* (0 is the
    caller's own group, -1 every process it may signal), so asking about them would answer
    for some other process. A caller that reads a pid from a record it did not just write
    (a lock file) asks this first, to tell a record naming no process from a dead holder.

    >>> is_pid(1), is_pid(0), is_pid(-5), is_pid(True), is_pid("7"), is_pid(2**64)
    (True, False, False, False, False, False)
    """
    return type(value) is int and 0 < value <= _PID_T_MAX


def process_alive(pid: object) -> bool:
    """Whether a process with id ``pid`` runs on this host (in this pid namespace).

    Every edge, decided for what the callers need (see the module docstring):

    - ``pid`` is no process id (:func:`is_pid` is false: not an ``int``, a ``bool``, ``<= 0``,
      or beyond ``pid_t``, where ``os.kill`` raises ``OverflowError``): ``False``, since no
      process has that id. The answer is about the id, not about whoever wrote it down: a
      caller that may not act on a record naming no process checks :func:`is_pid` itself
      (the output lock does, and keeps such a lock).
    - ``kill(pid, 0)`` fails with ``ESRCH``: ``False``.
    - It fails with ``EPERM``: ``True``, the process exists and belongs to another user.
    - It succeeds, and on Linux ``/proc/<pid>/stat`` shows a zombie (``Z``, or ``X``): ``False``
      unless one of its threads still runs. A zombie has exited and runs no code again (a
      crashed writer whose parent did not reap it); but a process whose *main* thread
      called ``pthread_exit`` also shows ``Z`` while its other threads work on, so
      ``/proc/<pid>/task`` decides.
    - It succeeds and ``/proc`` cannot be read (macOS, or ``hidepid`` hiding another user's
      process): ``True``, existence is all we know (a zombie counts as alive there).

    Pid reuse is not detected: a dead process whose id a new process took reads as alive.
    That is the safe error for every caller (nothing is broken or removed, only kept).

    >>> import subprocess, sys
    >>> child = subprocess.Popen([sys.executable, "-c", "pass"])
    >>> _ = child.wait()
    >>> process_alive(child.pid)
    False
    """
    if not is_pid(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # exists, owned by another user
        return True
    return not _exited(pid)


def _state(stat_path: str) -> str | None:
    """The state letter of a ``/proc/.../stat`` file; None when it cannot be read."""
    try:
        with open(stat_path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The name field is in parentheses and may itself hold ")" or spaces: split at the last.
    fields = data.rpartition(b")")[2].split()
    return fields[0].decode("ascii", "replace") if fields else None


def _exited(pid: int) -> bool:
    """Whether ``/proc`` shows every thread of ``pid`` exited; False when it cannot tell."""
    if _state(f"/proc/{pid}/stat") not in ("Z", "X"):
        return False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True     # the leader is a zombie and its thread list is gone with it
    return all(_state(f"/proc/{pid}/task/{tid}/stat") in ("Z", "X", None) for tid in tids)
