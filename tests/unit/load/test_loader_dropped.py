"""A loader with process workers that the caller drops without closing it.

Training code often keeps its loader's iterator in a reference cycle (a trainer object that
refers to itself through a callback or a closure). When such an iterator is dropped mid-epoch
the garbage collector frees the whole cycle at some later collection, and it may finalize
torch's worker queues before the torch iterator's cleanup asks its workers to stop: each
worker's join then waits out its timeout (5 s each in torch; plain torch ``DataLoader`` does
the same), a stall in the middle of whatever step triggered the collection.
``ZephonLoader`` keeps its torch iterator whole until its own generator closes
(``torch/loader.py``, ``_RUNNING``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

_CHILD = textwrap.dedent("""
    import gc, sys
    import torch.utils.data._utils as tu
    tu.MP_STATUS_CHECK_INTERVAL = 120.0   # a worker join that times out now hangs the test
    from zephon_store import BatchOptions, WorkerOptions, as_numpy
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    class Trainer:
        def __init__(self):
            self.loader = ZephonLoader(sys.argv[1], global_batch=8, order=OrderOptions(seed=3),
                                       workers=WorkerOptions(num_workers=2),
                                       batch=BatchOptions(collate=as_numpy))
            self.it = iter(self.loader)
            self.me = self        # the cycle
    gc.disable()
    t = Trainer()
    next(t.it); next(t.it)
    del t
    gc.collect()
    print("collected", flush=True)
""")


def test_an_iterator_dropped_in_a_cycle_stops_its_workers_at_once(_tiny):
    tiny_dataset = _tiny[1]
    # Without the fix the collection waits out a 120 s join per worker; the limit is far
    # above the few seconds a working stop takes on a loaded machine (this is a hang test).
    out = subprocess.run([sys.executable, "-c", _CHILD, tiny_dataset], capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "collected" in out.stdout
