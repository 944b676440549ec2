"""A failed convert leaves no debris (issue 41 item 4): no output folder it made itself, no
staging job that staged nothing, and one line naming what is wrong; a job that staged an
input keeps it for the rerun."""

from __future__ import annotations

import json
import os

import pytest
import zstandard

import zephon_store as z
from tests.helpers import run_cli
from zephon_store.errors import InputError, OutputExistsError


def _jsonl(path, n: int) -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "text": f"record {i}"}) + "\n")
    return str(path)


def _tree(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), path)
                  for d, dirs, files in os.walk(path) for n in dirs + files)


def test_an_input_path_with_a_typo_leaves_no_output_folder(tmp_path, capsys) -> None:
    code, _, err = run_cli(capsys, "convert", tmp_path / "nosuch.jsonl",
                           "--output", tmp_path / "out")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "matched no input" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", ["empty", "truncated"])
def test_an_input_that_fails_to_parse_leaves_no_staging(tmp_path, capsys, bad) -> None:
    if bad == "empty":
        path = tmp_path / "in.jsonl"
        path.write_text("")
    else:
        path = tmp_path / "in.jsonl.zst"
        data = zstandard.ZstdCompressor().compress(
            open(_jsonl(tmp_path / "raw.jsonl", 2000), "rb").read())
        path.write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(capsys, "convert", path, "--output", tmp_path / "out")
    assert code == 1 and len(err.strip().splitlines()) == 1 and str(path) in err, err
    assert not (tmp_path / "out").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(InputError):
        z.convert([str(path)], str(existing), progress=False)
    assert _tree(existing) == []                 # the folder stays, empty: it was the user's


def test_an_output_that_is_a_file_is_one_clear_line(tmp_path, capsys) -> None:
    target = tmp_path / "afile"
    target.write_text("not a dataset")
    with pytest.raises(OutputExistsError, match="is a file, not a dataset folder"):
        z.convert([_jsonl(tmp_path / "a.jsonl", 3)], str(target), progress=False)
    code, _, err = run_cli(capsys, "convert", tmp_path / "a.jsonl", "--output", target)
    assert code != 0 and err.strip().splitlines() == [
        f"zephon convert: error: {target} is a file, not a dataset folder; pass as the output "
        "a new folder or one that holds a dataset"]
    assert target.read_text() == "not a dataset"


def test_a_job_that_staged_an_input_keeps_it_for_the_rerun(tmp_path) -> None:
    """What was staged stays (a rerun of the same inputs reuses it); a rerun over changed
    inputs is another job, which removes the stale one when it finishes."""
    good, bad = _jsonl(tmp_path / "a.jsonl", 5), tmp_path / "b.jsonl"
    bad.write_text("")
    out = tmp_path / "out"
    with pytest.raises(InputError):
        z.convert([good, str(bad)], str(out), progress=False)
    assert any(p.endswith(".json") and "parsed" in p for p in _tree(out))
    _jsonl(bad, 4)                                # the bad input fixed
    assert z.convert([good, str(bad)], str(out), progress=False).num_samples == 9
    assert not (out / ".zephon-staging").exists()
