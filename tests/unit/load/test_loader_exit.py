"""A loader iterator left open at interpreter exit ends the process quietly (issue 29, item 6).

The docs' pattern ``batches = iter(loader); next(batches)`` at the end of a script used to
print ``Exception ignored in: <generator ...> ... 'NoneType' object has no attribute 'Empty'``
on every run: the open iterator was closed during module teardown.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import converted

pytest.importorskip("torch")

SCRIPT = """
import sys
from zephon_store import BatchOptions, WorkerOptions
from zephon_store.torch import ZephonLoader
kw = {"transform": lambda b: b} if sys.argv[3] == "transform" else {}
loader = ZephonLoader(sys.argv[1], global_batch=8, batch=BatchOptions(**kw),
                      workers=WorkerOptions(num_workers=int(sys.argv[2])))
batches = iter(loader)
next(batches)
"""


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("loader_exit"), files=1, records=400, seed=5,
                     row_group_rows=20)


@pytest.mark.parametrize("num_workers,mode,runs", [(0, "plain", 3), (0, "transform", 2),
                                                   (2, "plain", 1)])
def test_open_iterator_at_exit_prints_nothing(ds_path, num_workers, mode, runs):
    for _ in range(runs):
        # The timeout fails the test instead of hanging it if the exit ever waits forever.
        proc = subprocess.run([sys.executable, "-c", SCRIPT, ds_path, str(num_workers), mode],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""


KILLED = """
import multiprocessing, os, sys, time
from zephon_store import BatchOptions, WorkerOptions
from zephon_store.torch import ZephonLoader
calls = [0]
def busy_after_first(batch):      # each worker's first batch at once, then busy for minutes
    calls[0] += 1
    if calls[0] > 1:
        time.sleep(300)
    return batch
loader = ZephonLoader(sys.argv[1], global_batch=8, workers=WorkerOptions(num_workers=2),
                      batch=BatchOptions(transform=busy_after_first))
batches = iter(loader)
next(batches)
print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
os._exit(0)      # a rank killed without any shutdown: no DataLoader teardown runs
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_when_their_rank_is_killed(ds_path):
    import time

    out = subprocess.run([sys.executable, "-c", KILLED, ds_path], capture_output=True,
                         text=True, timeout=120)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr[-2000:]
    # Busy workers never reach torch's own parent check: only the workers' watch ends them.
    deadline = time.monotonic() + 30     # a bound for a hang, not a speed claim
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if _running(p)]
    for p in left:
        os.kill(p, 9)
    assert not left, f"DataLoader workers {left} outlived their killed rank"
