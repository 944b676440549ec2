"""Random damage to a real dataset: never wrong data, never a non-zephon exception.

Hypothesis truncates a file, or flips one byte of it, anywhere in a small dataset (the
manifest, a side table, a shard), then reads it three ways: ``verify --deep``, ``take`` of
every sample and a loader pass. Each read must give exactly the undamaged dataset's data
or raise a :class:`~zephon_store.errors.ZephonError`; ``verify`` must report, not raise,
and may call a dataset clean only if it also reads correctly.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_store import (
    BatchOptions,
    StopOptions,
    Topology,
    ZephonError,
    as_numpy,
    convert,
    open_dataset,
)
from zephon_store.cli.main import main
from zephon_store.read.verify import verify
from zephon_store.write.shardwriter import WriteOptions

torch = pytest.importorskip("torch")
from zephon_store.torch import ZephonLoader  # noqa: E402

B = 8
ROOTS: dict[str, str] = {}


def _source(path: str) -> None:
    rng = np.random.default_rng(11)
    n = 90
    words = ["alpha", "beta", "gamma", "délta", "∑"]
    tokens = rng.integers(0, 50_000, size=(n, 16), dtype=np.int32)
    pq.write_table(pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "text": [" ".join(rng.choice(words, size=int(rng.integers(1, 12)))) for _ in range(n)],
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens.reshape(-1)), 16),
        "score": pa.array(rng.random(n)),
    }), path)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Two small datasets (zstd and uncompressed pages: the zero-copy page path) and what
    their undamaged reads give."""
    d = tmp_path_factory.mktemp("fuzz")
    _source(str(d / "in.parquet"))
    out = {}
    for codec in ("zstd", "none"):
        root = str(d / codec)
        convert([str(d / "in.parquet")], root,
                options=WriteOptions(target_shard_bytes=3 << 10, row_group_rows=10,
                                     compression=codec))
        ds = open_dataset(root)
        files = sorted(os.path.relpath(os.path.join(dp, f), root)
                       for dp, _, fs in os.walk(root) for f in fs
                       if not dp.startswith(os.path.join(root, ".zephon")))
        assert ds.num_shards >= 2 and any(f.startswith("index/") for f in files)
        out[codec] = (root, files, _take_all(ds), _loader_pass(ds))
    return out


def _take_all(ds) -> list:
    return ds.take(np.arange(ds.num_samples)).to_pylist()


def _loader_pass(ds) -> list:
    lo = ZephonLoader(ds, topology=Topology(B, world_size=1, rank=0),
                      stop=StopOptions(epochs=1, drop_last=False),
                      batch=BatchOptions(with_seq=True, collate=as_numpy))
    return [{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in b.items()}
            for b in lo]


def _damage(path: str, kind: str, where: float, mask: int) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    pos = min(len(data) - 1, int(where * len(data)))
    if kind == "truncate":
        data = data[:pos]
    else:
        data[pos] ^= mask
    with open(path, "wb") as f:
        f.write(data)


def _reads_right_or_refuses(read, want) -> bool:
    """True if ``read()`` gave ``want``; False if it raised a ZephonError; fails otherwise."""
    try:
        got = read()
    except ZephonError:
        return False
    assert got == want, "damaged data read as if it were sound"
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(codec=st.sampled_from(["zstd", "none"]), pick=st.integers(0, 10**6),
       kind=st.sampled_from(["truncate", "flip"]), where=st.floats(0, 1),
       mask=st.integers(1, 255))
def test_damage_reads_correctly_or_raises_a_zephon_error(datasets, codec, pick, kind, where,
                                                         mask):
    pristine, files, want_rows, want_batches = datasets[codec]
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "ds")
        shutil.copytree(pristine, root)
        _damage(os.path.join(root, files[pick % len(files)]), kind, where, mask)

        report = verify(root, deep=True)   # reports; never raises
        assert main(["verify", "--deep", "--json", root]) == (0 if report.ok else 1)
        rows_ok = _reads_right_or_refuses(lambda: _take_all(open_dataset(root)), want_rows)
        batches_ok = _reads_right_or_refuses(lambda: _loader_pass(open_dataset(root)),
                                             want_batches)
        if report.ok:
            assert rows_ok and batches_ok, "verify passed a dataset that does not read"
