"""A loader iterator left open at interpreter exit ends the process quietly (issue 29, item 6).

The docs' pattern ``batches = iter(loader); next(batches)`` at the end of a script used to
print ``Exception ignored in: <generator ...> ... 'NoneType' object has no attribute 'Empty'``
on every run: the open iterator was closed during module teardown.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import convert
from zephon_store.write.shardwriter import WriteOptions

pytest.importorskip("torch")

SCRIPT = """
import sys
from zephon_store.torch import ZephonLoader
kw = {"transform": lambda b: b} if sys.argv[3] == "transform" else {}
loader = ZephonLoader(sys.argv[1], global_batch=8, num_workers=int(sys.argv[2]), **kw)
batches = iter(loader)
next(batches)
"""


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("loader_exit")
    write_jsonl_corpus(d / "src", files=1, records=400, seed=5)
    convert([str(d / "src")], str(d / "ds"), options=WriteOptions(row_group_rows=20))
    return str(d / "ds")


@pytest.mark.parametrize("num_workers,mode,runs", [(0, "plain", 3), (0, "transform", 2),
                                                   (2, "plain", 1)])
def test_open_iterator_at_exit_prints_nothing(ds_path, num_workers, mode, runs):
    for _ in range(runs):
        # The timeout fails the test instead of hanging it if the exit ever waits forever.
        proc = subprocess.run([sys.executable, "-c", SCRIPT, ds_path, str(num_workers), mode],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
