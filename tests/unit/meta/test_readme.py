"""The README stays true to the code: its install line, its links, its state_dict() keys."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers import ROOT, write_jsonl_corpus
from zephon_store import Topology, convert


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_installs_from_a_clone_with_real_extras():
    text = _readme()
    # The package is not on PyPI: no bare 'pip install zephon_store'.
    assert not re.search(r"pip install zephon_store\b", text)
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        pyproject = f.read()
    extras = set(re.findall(r"^(\w+) = \[", pyproject.split("[project.optional-dependencies]")[1]
                            .split("\n[")[0], flags=re.M))
    installs = re.findall(r"pip install -e '\.\[([\w,]+)\]'", text)
    assert installs, "no 'pip install -e .[extras]' line"
    for group in installs:
        assert set(group.split(",")) <= extras, group


@pytest.mark.parametrize("page", ["docs/mixtures.md", "docs/audit.md", "docs/scale.md",
                                  "docs/live-elastic.md"])
def test_readme_links_the_feature_pages(page):
    assert f"`{page}`" in _readme() and os.path.exists(os.path.join(ROOT, page))


def test_readme_state_dict_comment_names_every_key(tmp_path):
    pytest.importorskip("torch")
    from zephon_store.torch import ZephonLoader

    comment = _readme().split("state = loader.state_dict()")[1].split("```")[0]
    named = set(re.findall(r'"(\w+)"', comment))
    write_jsonl_corpus(tmp_path / "src", files=1, records=20)
    convert([str(tmp_path / "src")], str(tmp_path / "ds"))
    keys = set(ZephonLoader(str(tmp_path / "ds"),
                            topology=Topology(4, world_size=1, rank=0)).state_dict())
    assert keys | {"mixture"} == named   # a mixture's state adds "mixture"
