"""``import zephon_store`` imports neither grain nor torch; zephon_store.grain imports
neither jax nor torch, and without grain names the extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import small_dataset

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError(f'blocked: {{name}}')
sys.meta_path.insert(0, Block())
"""


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("grain_imports")), files=1, records=40,
                         row_group_rows=10)


def _run(code: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK.format(blocked=blocked) + code],
                          capture_output=True, text=True, timeout=120)


def test_import_zephon_store_imports_neither_grain_nor_torch(tiny_dataset):
    r = _run(f"""
import zephon_store as z
ds = z.open_dataset({tiny_dataset!r})
assert ds[3]["id"] == 3
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('grain', 'torch', 'jax'))
assert not loaded, loaded
print("ok")
""", blocked=())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_zephon_store_grain_needs_neither_jax_nor_torch(tiny_dataset):
    r = _run(f"""
from zephon_store.grain import ZephonIterDataset, ZephonSource
from zephon_store import Topology
assert int(ZephonSource({tiny_dataset!r})[5]["id"]) == 5
it = iter(ZephonIterDataset({tiny_dataset!r}, topology=Topology(4)))
assert len(next(it)["id"]) == 4
print("ok")
""", blocked=("jax", "torch"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_without_grain_the_extra_is_named():
    r = _run("import zephon_store.grain", blocked=("grain",))
    assert r.returncode != 0
    assert "MissingExtraError" in r.stderr and "zephon_store[grain]" in r.stderr
