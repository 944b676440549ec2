"""The load reader and the loader's option groups (issue 15): torch-free, one share at a time."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import opened, small_dataset
from zephon_store.load.options import BatchOptions, ReadAheadOptions, StopOptions, WorkerOptions
from zephon_store.load.share_reader import ShareReader
from zephon_store.order import Order, OrderOptions, Topology
from zephon_store.order.assign import positions_for_rank

OPTIONS = OrderOptions(seed=4, window_blocks=2, lanes=12)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return opened(small_dataset(str(tmp_path_factory.mktemp("reader")), files=3, records=101,
                                row_group_rows=10))


def test_the_share_reader_imports_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import zephon_store.load.share_reader, zephon_store.load.options\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_worker_shares_partition_the_rank_and_hold_the_ordered_ids(ds, workers) -> None:
    topo = Topology(12, 3, 1)
    reader = ShareReader(ds, OPTIONS, topo, batch=BatchOptions(with_seq=True),
                         start_cursor=24, num_batches=10)
    got = {}
    for w in range(max(1, workers)):
        for i, batch in reader.batches(w, workers):
            assert i not in got
            got[i] = batch["_seq"].tolist()
    assert sorted(got) == list(range(10))
    order = Order(ds.manifest.rg_rows, OPTIONS)
    for i, ids in got.items():
        pos = positions_for_rank(24 + 12 * i, 12, 3, 1, lanes=order.effective_lanes,
                                 epoch_size=order.num_samples)
        assert ids == order.sample_at(pos).tolist()


def test_batch_options_select_columns_and_transform(ds) -> None:
    reader = ShareReader(ds, OPTIONS, Topology(6),
                         batch=BatchOptions(columns=["id"], transform=lambda b: {"n": b["id"]}),
                         num_batches=2)
    batches = [b for _, b in reader.batches()]
    assert [list(b) for b in batches] == [["n"], ["n"]]
    assert BatchOptions(columns=["a", "b"]).columns == ("a", "b")


@pytest.mark.parametrize("make,match", [
    (lambda: StopOptions(max_steps=1, epochs=1), "max_steps or epochs"),
    (lambda: StopOptions(max_steps=-1), "max_steps must be an int"),
    (lambda: StopOptions(epochs=float("nan")), "epochs must be a finite number"),
    (lambda: StopOptions(drop_last=1), "drop_last must be a bool"),
    (lambda: WorkerOptions(num_workers=-1), "num_workers must be >= 0"),
    (lambda: WorkerOptions(prefetch=0), "prefetch must be >= 1"),
    (lambda: Topology(10, 4), "world_size must divide global_batch"),
    (lambda: Topology(8, 2, rank=2), r"rank must be in \[0, 2\)"),
])
def test_groups_validate_on_creation(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()
    with pytest.raises(TypeError, match="coalesce must be a CoalesceOptions"):
        ReadAheadOptions(coalesce={"max_gap": 1})


def test_stop_options_count_the_steps_of_a_run() -> None:
    assert StopOptions().num_batches(0, 8, 20) is None
    assert StopOptions(max_steps=5).num_batches(100, 8, 20) == 5
    assert StopOptions(epochs=2).num_batches(0, 8, 20) == 5          # 40 // 8
    assert StopOptions(epochs=1).num_batches(0, 8, 20) == 2          # last 4 dropped
    assert StopOptions(epochs=1, drop_last=False).num_batches(0, 8, 20) == 3
    assert StopOptions(epochs=1).num_batches(24, 8, 20) == 0


def test_loader_keywords_build_the_groups(ds) -> None:
    torch = pytest.importorskip("torch")
    del torch
    from zephon_store.torch import ZephonLoader

    loader = ZephonLoader(ds, global_batch=12, order=OPTIONS, world_size=2, rank=1,
                          columns=["id"], with_seq=True, max_steps=3, num_workers=1,
                          prefetch=2, prefetch_bytes=1 << 20, drop_last=False)
    assert loader.topology == Topology(12, 2, 1)
    assert loader.batch_options == BatchOptions(columns=("id",), with_seq=True)
    assert loader.stop == StopOptions(max_steps=3, drop_last=False)
    assert loader.workers == WorkerOptions(num_workers=1, prefetch=2)
    assert loader.read_ahead == ReadAheadOptions(prefetch_bytes=1 << 20)
    assert loader.num_workers == 1 and loader.drop_last is False and len(loader) == 3
