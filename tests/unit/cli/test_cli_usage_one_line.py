"""Every usage error, argparse's and the commands' own checks after parsing, is one line
``zephon <cmd>: error: <what>`` with exit status 2 (docs/cli.md). An unknown flag is the one
exception: it also prints the command's usage, which lists the flags it does take."""

from __future__ import annotations

import pytest

from tests.helpers import converted
from zephon_store.cli.main import main


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("cli_one_line"), files=1, records=40, seed=3,
                     row_group_rows=10)


def _one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"{prefix}: error: "), err
    return err


@pytest.mark.parametrize("argv,prefix,named", [
    (["convert", "x.jsonl", "--output", "o", "--workers", "0"], "zephon convert", "--workers"),
    (["verify", "ds", "--workers", "lots"], "zephon verify", "'lots'"),
    (["info", "ds", "--global-batch", "1.5"], "zephon info", "--global-batch"),
    (["convert", "x.jsonl", "--output", "o", "--target-shard-size", "lots"], "zephon convert",
     "--target-shard-size"),
    (["convert", "x.jsonl", "--output", "o", "--compression", "zip"], "zephon convert",
     "--compression"),
    (["convert", "x.jsonl"], "zephon convert", "--output"),
    (["verify"], "zephon verify", "url"),
    (["frobnicate"], "zephon", "frobnicate"),
    ([], "zephon", "COMMAND"),
])
def test_argparse_errors_are_one_line(argv, prefix, named, capsys):
    assert main(argv) == 2
    assert named in _one_line(capsys, prefix)


@pytest.mark.parametrize("argv,prefix,named", [
    (["plan", "{ds}", "--world-size", "5", "--global-batch", "12"], "zephon plan",
     "world_size must divide global_batch"),
    (["get", "{ds}", "40"], "zephon get", "0..39"),
    (["get", "{ds}", "1.5"], "zephon get", "integer"),
    (["convert", "x.jsonl", "--output", "o", "--seq-len", "8"], "zephon convert",
     "--tokenizer and --seq-len go together"),
    (["convert", "x.jsonl", "--output", "o", "--ray-address", "auto"], "zephon convert",
     "--ray-address needs --engine ray"),
    (["cache", "fill"], "zephon cache", "needs the dataset URL"),
    (["cache", "info", "{ds}"], "zephon cache", "takes no dataset URL"),
    (["info", "s3://bucket/ds", "--storage-options", '{"endpoint": "x"}'], "zephon info",
     "'endpoint'"),
])
def test_checks_after_parsing_are_one_line_with_error(ds_path, argv, prefix, named, capsys):
    assert main([a.replace("{ds}", ds_path) for a in argv]) == 2
    assert named in _one_line(capsys, prefix)


def test_an_unknown_flag_still_shows_the_commands_usage(capsys):
    assert main(["verify", "ds", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: zephon verify ")
    assert err.endswith("zephon verify: error: unrecognized arguments: --bogus\n")


def test_help_still_exits_0(capsys):
    assert main(["verify", "--help"]) == 0
    assert "usage: zephon verify" in capsys.readouterr().out
