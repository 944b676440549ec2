"""Every golden dataset of every format version stays readable, verified and unchanged."""

from __future__ import annotations

import json
import pathlib

import pyarrow as pa
import pytest

from zephon_store import open_dataset
from zephon_store.verify import verify

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "formats" / "golden"
CASES = [(v.name, name) for v in sorted(GOLDEN.glob("v*"))
         for name in json.loads((v / "expected.json").read_text())["datasets"]]


def _expected(version):
    return json.loads((GOLDEN / version / "expected.json").read_text())


def test_there_are_golden_datasets():
    assert ("v1", "text") in CASES and ("v1", "nested") in CASES


@pytest.mark.parametrize("version,name", CASES)
def test_golden_reads_and_verifies(version, name):
    exp = _expected(version)["datasets"][name]
    ds = open_dataset(str(GOLDEN / version / name))
    assert ds.dataset_id == exp["dataset_id"]
    assert ds.num_samples == exp["num_samples"] and ds.num_shards == exp["num_shards"]
    got = json.loads(json.dumps(ds.take(range(ds.num_samples)).to_pylist(),
                                default=lambda o: o.isoformat()))
    assert got == exp["records"]
    assert verify(str(GOLDEN / version / name), deep=True).ok


@pytest.mark.parametrize("version,name", [c for c in CASES if c[0] == "v1"])
def test_current_writer_reproduces_golden_bytes(version, name, tmp_path):
    """Writing the golden inputs again gives the same dataset_id: bytes did not drift.

    Parquet bytes include the writer's version string, so this holds for the pyarrow that
    wrote the goldens; other versions are checked by the read test above.
    """
    exp = _expected(version)
    if exp["pyarrow"] != pa.__version__:
        pytest.skip(f"goldens written by pyarrow {exp['pyarrow']}, running {pa.__version__}")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_golden", GOLDEN.parents[1] / "tools" / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from zephon_store import convert

    make_inputs, wopts, iopts = mod.DATASETS[name]
    src = tmp_path / "src"
    src.mkdir()
    res = convert(make_inputs(str(src)), str(tmp_path / "out"), options=wopts,
                  input_options=iopts)
    assert res.dataset_id == exp["datasets"][name]["dataset_id"]
