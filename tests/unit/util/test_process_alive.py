"""``_util/process.py``: every edge of "is process ``pid`` alive", on real processes.

Real: a live child, a reaped child, a zombie child, a process whose main thread exited while
another thread runs, EPERM (a child that drops to another user asks about its root parent;
pid 1 when the suite does not run as root), and the ids that are no process. Mocked, because
no real case exists on this machine: ``/proc`` unreadable (macOS, ``hidepid``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from zephon_store._util import process
from zephon_store._util.process import is_pid, process_alive

linux_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rpartition(b")")[2].split()[0].decode()


def _wait_for_state(pid: int, want: str) -> None:
    """Until ``/proc`` shows ``pid`` in state ``want`` (the child's own pace, not a timing)."""
    deadline = time.monotonic() + 60
    while _state(pid) != want:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {want}"
        time.sleep(0.01)


@pytest.fixture
def child():
    """A child that runs until killed."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p
    p.kill()
    p.wait()


def test_a_live_child_and_this_process_are_alive(child):
    assert process_alive(child.pid) and process_alive(os.getpid())


def test_a_reaped_child_is_dead(child):
    child.kill()
    child.wait()
    with pytest.raises(ProcessLookupError):   # the id is free: ESRCH is the path taken
        os.kill(child.pid, 0)
    assert not process_alive(child.pid)


@linux_proc
def test_a_zombie_child_is_dead(child):
    """kill(pid, 0) succeeds on a zombie; it has exited all the same (a crashed writer whose
    parent never reaps it must not hold its lock or scratch forever)."""
    child.kill()
    _wait_for_state(child.pid, "Z")
    os.kill(child.pid, 0)        # the plain check would call it alive
    assert not process_alive(child.pid)


@linux_proc
def test_a_process_whose_main_thread_exited_is_alive_while_another_thread_runs():
    """Its /proc/<pid>/stat shows Z, yet a thread still works: never taken for dead."""
    code = ("import ctypes, threading, time\n"
            "def work():\n"
            "    while True:\n"
            "        time.sleep(0.05)\n"
            "threading.Thread(target=work).start()\n"
            "print('ready', flush=True)\n"
            "ctypes.CDLL(None).pthread_exit(None)   # CDLL calls drop the GIL first\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        _wait_for_state(p.pid, "Z")
        assert process_alive(p.pid)
        p.kill()
        deadline = time.monotonic() + 60
        while os.listdir(f"/proc/{p.pid}/task") != [str(p.pid)]:   # its thread is gone
            assert time.monotonic() < deadline, "the killed child's thread never ended"
            time.sleep(0.01)
        assert not process_alive(p.pid)
    finally:
        p.kill()
        p.wait()
        p.stdout.close()


@pytest.mark.parametrize("pid", [0, -1, -os.getpid(), True, False, "12", 12.0, None,
                                 2**31, 2**64])
def test_ids_that_are_no_process_are_not_alive(pid):
    """0 and negatives are process groups to kill(): kill(0, 0) and kill(-1, 0) succeed, and
    True is pid 1. 2**31 and beyond overflow pid_t (os.kill raises OverflowError)."""
    assert not is_pid(pid)
    assert not process_alive(pid)


def test_the_largest_pid_t_is_a_pid_of_no_process():
    assert is_pid(2**31 - 1) and not process_alive(2**31 - 1)
    assert is_pid(1) and process_alive(1)


def test_a_process_of_another_user_is_alive():
    """EPERM means the process exists. As root: a forked child drops to uid 65534 and asks
    about its root parent; otherwise pid 1 (root's) is asked about directly."""
    if os.geteuid() != 0:
        try:
            os.kill(1, 0)
        except PermissionError:
            assert process_alive(1)
            return
        pytest.skip("pid 1 is this user's own process here: no EPERM to be had")
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:    # the child: report through the exit code, never return into pytest
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                os.kill(parent, 0)
                code = 4          # no EPERM: the check below would prove nothing
            except PermissionError:
                code = 0 if process_alive(parent) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@linux_proc
def test_without_a_readable_proc_a_zombie_counts_as_alive(child, monkeypatch):
    """macOS has no /proc and hidepid hides another user's entries: kill(pid, 0) is all
    there is, and an existing process is never called dead on a guess. (Mocked: this
    machine's /proc is readable.)"""
    child.kill()
    _wait_for_state(child.pid, "Z")
    assert not process_alive(child.pid)
    monkeypatch.setattr(process, "_state", lambda path: None)
    assert process_alive(child.pid)


# -- the callers: what each does with a zombie and with a name that is no pid ----------------

@pytest.fixture
def zombie(child):
    child.kill()
    if os.path.isdir("/proc/self/task"):
        _wait_for_state(child.pid, "Z")
    return child.pid


@linux_proc
def test_the_output_lock_takes_over_a_zombie_holder_and_keeps_a_record_naming_no_pid(zombie,
                                                                                   child):
    from zephon_store.write.lock import _holder, _stale_here

    me = _holder("convert")
    here = me["host"]
    assert _stale_here({"pid": zombie, "host": here}, me)         # a crashed convert
    assert not _stale_here({"pid": child.pid, "host": "elsewhere"}, me)
    assert not _stale_here({"pid": os.getpid(), "host": here}, me)
    # Not written by a convert: its holder is unknown, so the lock is never broken.
    for pid in ("12", None, True, 0, -1, 2**64, 1.5):
        assert not _stale_here({"pid": pid, "host": here}, me), pid


@linux_proc
def test_scratch_clear_removes_the_first_layout_files_of_zombies_and_of_no_process(
        zombie, tmp_path, monkeypatch):
    import tempfile

    from zephon_store.write.scratch import scratch_clear, scratch_info, scratch_root

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = scratch_root()
    os.makedirs(root)
    live = os.path.join(root, f"a.arrow.{os.getpid()}.0123abcd.tmp")
    gone = [os.path.join(root, f"b.arrow.{pid}.0123abcd.tmp") for pid in (zombie, 0, 2**64)]
    for path in [live, *gone]:
        with open(path, "wb") as f:
            f.write(b"x" * 10)
    assert scratch_info()["scratch_files"] == 4
    out = scratch_clear()
    assert (out["cleared_scratch_files"], out["cleared_scratch_bytes"]) == (3, 30)
    assert os.path.exists(live) and not any(map(os.path.exists, gone))


@linux_proc
def test_the_node_cache_drops_plans_of_zombies_and_of_names_without_a_pid(zombie, tmp_path):
    import socket

    from zephon_store.io.cache import ChunkCache

    cache = ChunkCache(tmp_path, budget_bytes=300, low_water=1.0)
    planned = _key(b"planned")
    cache.set_future([planned])     # makes the plans folder; this process's own plan
    host = socket.gethostname()
    names = [f"{host}-{pid}-0123456789ab.plan" for pid in (zombie, 0, "x", "\u00b2")]
    names.append(f"{host}-{os.getpid()}-ba9876543210.plan")           # a live process's
    for name in names:
        with open(os.path.join(cache._plans, name), "w") as f:
            f.write(planned + "\n")
    for i in range(4):      # over the budget: eviction reads (and prunes) the plans
        data = bytes([i]) * 100
        cache.put(_key(data), data)
    assert sorted(os.listdir(cache._plans)) == sorted([names[-1],
                                                      os.path.basename(cache._plan_file)])


def _key(data: bytes) -> str:
    from zephon_store._util.hashing import xxh3_hex

    return xxh3_hex(data)
