"""``import zephon_store`` needs neither torch nor s3fs; missing extras are named."""

import subprocess
import sys

import pytest

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 's3fs', 'torchtitan', 'tokenizers'):
            raise ImportError(f'blocked: {name}')
sys.meta_path.insert(0, Block())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True)


def test_core_works_without_optional_dependencies(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    r = _run(f"""
import zephon_store as z
from zephon_store import verify, cli
res = z.convert([{str(tmp_path / 'a.jsonl')!r}], {str(tmp_path / 'ds')!r})
ds = z.open_dataset({str(tmp_path / 'ds')!r})
assert ds.take([1]).to_pylist() == [{{"x": 2}}]
from zephon_store.read.verify import verify
assert verify({str(tmp_path / 'ds')!r}).ok
assert not any(m.split('.')[0] in ('torch', 's3fs') for m in sys.modules)
# Naming a gs:// dataset's files loads no cloud SDK either (issue 44).
from zephon_store.io.storage import Storage
assert Storage('gs://b/ds').url('manifest.json') == 'gs://b/ds/manifest.json'
clouds = ('s3fs', 'botocore', 'aiobotocore', 'boto3', 'google', 'gcsfs', 'azure', 'adlfs')
assert not [m for m in sys.modules if m.split('.')[0] in clouds], sorted(
    m for m in sys.modules if m.split('.')[0] in clouds)
print("ok")
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


@pytest.mark.parametrize("code,extra", [
    ("import zephon_store.torch", "torch"),
    ("from zephon_store.io.storage import Storage; Storage('s3://b/x').fs", "s3"),
])
def test_missing_extra_is_named(code, extra):
    r = _run(code)
    assert r.returncode != 0
    assert f"zephon_store[{extra}]" in r.stderr and "MissingExtraError" in r.stderr


def test_reading_a_local_dataset_does_not_import_fsspec(tmp_path):
    """Local files are read with os calls; fsspec's import was ~10 ms of a first batch."""
    import zephon_store as z

    (tmp_path / "a.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(50)))
    z.convert([str(tmp_path / "a.jsonl")], str(tmp_path / "ds"), progress=False)
    r = _run(f"""
import zephon_store as z
ds = z.open_dataset({str(tmp_path / 'ds')!r})
assert ds[7] == {{"x": 7}}
assert ds.take([3, 40]).to_pylist() == [{{"x": 3}}, {{"x": 40}}]
assert "fsspec" not in sys.modules, "reading a local dataset imported fsspec"
print("ok")
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_opening_and_verifying_a_dataset_does_not_import_pandas(tmp_path):
    """pyarrow's ``to_numpy()`` on a column imports pandas when it is installed: ~0.2 s of
    CPU in every fresh process (each rank and worker at a start, each ``zephon`` call; a v4
    manifest's row counts did it). Readers go through ``_util/arrow.py`` instead."""
    import zephon_store as z

    (tmp_path / "a.jsonl").write_text("".join(f'{{"x": {i}, "t": "{i}"}}\n' for i in range(50)))
    z.convert([str(tmp_path / "a.jsonl")], str(tmp_path / "ds"), progress=False,
              options=z.WriteOptions(row_group_rows=5))
    r = _run(f"""
import zephon_store as z
from zephon_store.read.verify import verify
ds = z.open_dataset({str(tmp_path / 'ds')!r})
assert ds.manifest.format_version >= 4 and ds.manifest.num_row_groups == 10
assert ds[7]["x"] == 7 and verify({str(tmp_path / 'ds')!r}, deep=True).ok
assert "pandas" not in sys.modules, "opening or verifying a dataset imported pandas"
print("ok")
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")



def test_converting_does_not_import_pandas(tmp_path):
    """The converter's index tables were built with ``pa.array(numpy)``, which imports pandas
    when it is installed: ~0.17 s of CPU in every conversion (and every worker that builds
    an index). JSONL with text, numbers and a list column, and Parquet token windows."""
    (tmp_path / "a.jsonl").write_text(
        "".join(f'{{"x": {i}, "t": "doc {i}", "l": [{i}, {i + 1}]}}\n' for i in range(60)))
    r = _run(f"""
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import zephon_store as z
ids = np.arange(64 * 40, dtype=np.int32)   # built from buffers: pa.array would import pandas
col = pa.FixedSizeListArray.from_arrays(
    pa.Array.from_buffers(pa.int32(), ids.size, [None, pa.py_buffer(ids)]), 64)
pq.write_table(pa.table({{"tokens": col}}), {str(tmp_path / 'w.parquet')!r})
z.convert([{str(tmp_path / 'a.jsonl')!r}], {str(tmp_path / 'ds')!r}, progress=False,
          options=z.WriteOptions(row_group_rows=7))
z.convert([{str(tmp_path / 'w.parquet')!r}], {str(tmp_path / 'win')!r}, progress=False,
          options=z.WriteOptions(row_group_rows=8))
assert "pandas" not in sys.modules, "converting imported pandas"
print("ok")
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")
