"""Doctest namespace: small real data for the examples in ``zephon_store`` docstrings.

``tiny_dataset`` is a local dataset (100 JSONL records ``{"id", "text"}``, row groups of 10
rows) converted once per session; ``tiny_jsonl`` is its input file; ``tiny_tokenizer`` a
word-level ``tokenizer.json`` for it ("record", "0".."99", ``<s>``, ``</s>``); ``tmp`` is a
fresh temporary directory per doctest. Examples write only there, never into the working
directory or the home directory.
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest


@pytest.fixture(scope="session")
def _tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    import zephon_store as z

    work = tmp_path_factory.mktemp("doctest-data")
    src = os.path.join(work, "a.jsonl")
    with open(src, "w") as f:
        for i in range(100):
            f.write(json.dumps({"id": i, "text": f"record {i}"}) + "\n")
    out = os.path.join(work, "ds")
    z.convert([src], out, options=z.WriteOptions(row_group_rows=10, target_shard_bytes="4KiB"),
              progress=False)
    # Not beside a.jsonl: that folder holds the corpus and its dataset only.
    tok = os.path.join(tmp_path_factory.mktemp("doctest-tokenizer"), "tokenizer.json")
    with contextlib.suppress(ImportError):   # the tokenize extra; without it packing doctests fail
        from tokenizers import Tokenizer, models, pre_tokenizers

        words = ["[UNK]", "<s>", "</s>", "record"] + [str(i) for i in range(100)]
        tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                               unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer.save(tok)
    return src, out, tok


@pytest.fixture(autouse=True)
def _doctest_data(request: pytest.FixtureRequest) -> None:
    """Fill ``doctest_namespace`` for doctests only (plain tests do not pay for the dataset)."""
    if not isinstance(request.node, pytest.DoctestItem):
        return
    src, out, tok = request.getfixturevalue("_tiny")
    ns = request.getfixturevalue("doctest_namespace")
    ns.update(tiny_dataset=out, tiny_jsonl=src, tiny_tokenizer=tok, tmp=str(request.getfixturevalue("tmp_path")))
