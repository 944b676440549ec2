"""Advice that matches the cause (issue 41 item 6): a dataset path with a typo, a folder that
is no dataset, or a bucket that does not exist is told to check the URL; only a conversion
that did not finish (its shards, staging folder or lock are there, its manifest is not) is
told to run 'zephon convert' again. A mixture file's syntax error names the file once."""

from __future__ import annotations

import os

import pytest

from tests.helpers import converted
from zephon_store.cli.main import main

RERUN = "run 'zephon convert' again"


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("cli_advice"), files=1, records=40, seed=3,
                     row_group_rows=10)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args", [["info"], ["get", "0"], ["trace", "--global-batch", "4",
                                                            "--step", "0"]])
def test_a_typo_in_the_path_is_told_to_check_it(ds_path, args, capsys):
    url = ds_path + "-typo"
    assert main([args[0], url, *args[1:]]) == 1
    err = _error_line(capsys)
    assert f"{url} does not exist" in err and "check the dataset path" in err, err
    assert RERUN not in err


def test_a_folder_that_is_no_dataset_is_told_to_check_the_path(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["info", str(tmp_path)]) == 1
    err = _error_line(capsys)
    assert "is not a zephon dataset" in err and "check the dataset path" in err, err
    assert RERUN not in err


@pytest.mark.parametrize("sign", ["shards", ".zephon-staging", ".zephon-lock"])
def test_an_unfinished_conversion_is_told_to_rerun_convert(tmp_path, sign, capsys):
    if sign == ".zephon-lock":
        (tmp_path / sign).write_text("{}")
    else:
        (tmp_path / sign).mkdir()
    assert main(["info", str(tmp_path)]) == 1
    err = _error_line(capsys)
    assert "has not finished" in err and RERUN in err and sign in err, err


def test_a_dataset_whose_manifest_is_gone_is_told_to_rerun_convert(ds_path, tmp_path, capsys):
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(ds_path, copy)
    os.remove(copy / "manifest.json")
    assert main(["info", str(copy)]) == 1
    assert RERUN in _error_line(capsys)


def test_a_bucket_that_does_not_exist_is_told_to_check_the_url(monkeypatch, capsys):
    from zephon_store.io import storage
    from zephon_store.io.s3_get import S3NotFound

    asked = []

    def read_file(self, relpath, **_):
        asked.append(relpath)
        url = self.url(relpath)
        try:
            raise S3NotFound("NoSuchBucket", "The specified bucket does not exist", url)
        except FileNotFoundError as exc:
            raise storage.ShardNotFoundError(f"{relpath}: not found at {url} ({exc})") from exc

    monkeypatch.setattr(storage.Storage, "read_file", read_file)
    monkeypatch.setattr(storage.Storage, "exists", lambda self, relpath: False)
    monkeypatch.setattr(storage.Storage, "listdir", lambda self, relprefix="": [])
    opts = '{"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s"}'
    assert main(["info", "s3://no-such-bucket/ds", "--storage-options", opts]) == 1
    err = _error_line(capsys)
    assert asked == ["manifest.json"]
    assert "bucket 'no-such-bucket' does not exist" in err and "check the dataset URL" in err
    assert RERUN not in err


@pytest.mark.parametrize("name,text,says", [
    ("m5.toml", 'seed = 7\n[[sources]\nname = "a"\n', "not valid TOML"),
    ("m5.json", '{"seed": 7,', "not valid JSON"),
])
def test_a_mixture_syntax_error_names_the_file_once(tmp_path, name, text, says, capsys):
    path = tmp_path / name
    path.write_text(text)
    assert main(["info", str(path)]) == 1
    err = _error_line(capsys)
    assert err.count(str(path)) == 1 and err.count(says) == 1, err


def test_verify_of_a_typo_is_told_to_check_the_path(ds_path, capsys):
    """verify reports a missing manifest as a finding, with the same advice as the other
    commands: a wrong path is not an unfinished conversion."""
    url = ds_path + "-typo"
    assert main(["verify", url]) == 1
    out = capsys.readouterr().out
    assert f"{url} does not exist" in out and "check the dataset path" in out, out
    assert RERUN not in out


def test_a_datasets_manifest_json_is_told_to_pass_its_folder(ds_path, capsys):
    """``zephon info ds/manifest.json`` (a .json path reads as a mixture file) names the
    mistake instead of the mixture schema's errors."""
    path = os.path.join(ds_path, "manifest.json")
    assert main(["info", path]) == 1
    err = _error_line(capsys)
    assert "is a dataset's manifest, not a mixture file" in err and ds_path in err, err
