"""The CLI's usage errors exit 2 with one line naming the flag; input options reach the reader."""

from __future__ import annotations

import json

import pytest

from tests.helpers import converted
from zephon_store import open_dataset
from zephon_store.cli.main import main


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("cli_usage"), files=1, records=40, seed=3,
                     row_group_rows=10)


@pytest.mark.parametrize("argv,flag", [
    (["convert", "x.jsonl", "--output", "o", "--target-shard-size", "0"], "target_shard_bytes"),
    (["convert", "x.jsonl", "--output", "o", "--workers", "0"], "--workers"),
    (["convert", "x.jsonl", "--output", "o", "--encoding", "utf-16"], "encoding"),
    (["convert", "x.jsonl", "--output", "o", "--encoding", "no-such-codec"], "encoding"),
    (["convert", "x.jsonl", "--output", "o", "--csv-delimiter", ";;"], "csv_delimiter"),
    (["convert", "x.jsonl", "--output", "o", "--batch-rows", "0"], "--batch-rows"),
    (["verify", "ds", "--workers", "0"], "--workers"),
])
def test_bad_option_values_are_usage_errors(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err


def test_plan_simulate_steps_zero_is_a_usage_error(ds_path, capsys):
    argv = ["plan", ds_path, "--world-size", "2", "--global-batch", "4", "--simulate-steps", "0"]
    assert main(argv) == 2
    assert "--simulate-steps" in capsys.readouterr().err


@pytest.mark.parametrize("seq", ["10000000000000000000000", str(2**63), str(2**64 - 1), "-1",
                                 "40"])
def test_get_out_of_int64_range_names_the_valid_range(ds_path, seq, capsys):
    assert main(["get", ds_path, "--", seq]) == 2
    err = capsys.readouterr().err
    assert "0..39" in err and "Traceback" not in err


def test_convert_encoding_flag_reads_latin1(tmp_path, capsys):
    src = tmp_path / "latin1.jsonl"
    src.write_bytes('{"text": "caf\u00e9"}\n'.encode("latin-1"))
    out = str(tmp_path / "ds")
    assert main(["convert", str(src), "--output", out, "--json"]) == 1
    assert "--encoding" in capsys.readouterr().err
    assert main(["convert", str(src), "--output", out, "--encoding", "latin-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_samples"] == 1
    assert open_dataset(out).take([0]).to_pylist() == [{"text": "caf\u00e9"}]


def test_convert_csv_delimiter_flag(tmp_path, capsys):
    src = tmp_path / "t.csv"
    src.write_text("a;b\n1;x\n2;y\n")
    out = str(tmp_path / "ds")
    assert main(["convert", str(src), "--output", out, "--csv-delimiter", ";", "--json"]) == 0
    assert open_dataset(out).take([0, 1]).to_pylist() == [{"a": "1", "b": "x"}, {"a": "2", "b": "y"}]


def test_convert_csv_newlines_in_values_flag(tmp_path, capsys):
    src = tmp_path / "m.csv"
    src.write_text('a,b\n1,"two\nlines"\n3,z\n')
    on, off = str(tmp_path / "on"), str(tmp_path / "off")
    assert main(["convert", str(src), "--output", on, "--json"]) == 0
    assert open_dataset(on).take([0]).to_pylist() == [{"a": "1", "b": "two\nlines"}]
    argv = ["convert", str(src), "--output", off, "--no-csv-newlines-in-values", "--json"]
    assert main(argv) == 1
    assert "line 2" in capsys.readouterr().err


def test_get_non_integer_is_a_usage_error(ds_path, capsys):
    assert main(["get", ds_path, "1.5"]) == 2
    assert "base-10 integer" in capsys.readouterr().err


def test_unknown_storage_option_is_a_usage_error(ds_path, capsys):
    assert main(["info", "s3://bucket/ds", "--storage-options", '{"endpoint": "x"}']) == 2
    err = capsys.readouterr().err
    assert "'endpoint'" in err and "Traceback" not in err


def test_python_dash_m_runs_the_cli(ds_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "zephon_store.cli", "info", ds_path, "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["num_samples"] == 40


@pytest.mark.parametrize("argv", [["where", "ds", "0", "--bogus"], ["audit", "ds", "--log", "x", "--bogus"],
                                  ["verify", "ds", "--bogus"], ["info", "ds", "--bogus"],
                                  ["cache", "info", "--bogus"]])
def test_an_unknown_flag_prints_the_commands_own_usage(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"usage: zephon {argv[0]} " in err
    assert f"zephon {argv[0]}: error: unrecognized arguments: --bogus" in err


def test_usage_error_is_a_zephon_error_and_a_value_error():
    from zephon_store.cli.common import UsageError
    from zephon_store.errors import ZephonError

    assert issubclass(UsageError, ZephonError) and issubclass(UsageError, ValueError)


@pytest.mark.parametrize("argv", [
    ["plan", "{mix}", "--world-size", "1", "--global-batch", "4"],
    ["verify", "{mix}"],
    ["get", "{mix}", "0"],
    ["cache", "fill", "{mix}", "--dir", "{tmp}"],
    ["gc", "{mix}"],
])
def test_one_dataset_commands_refuse_a_mixture_file_in_one_line(ds_path, tmp_path, argv,
                                                                 capsys):
    mix = tmp_path / "mix.toml"
    mix.write_text(f'seed = 7\n[[sources]]\nname = "a"\nurl = "{ds_path}"\nweights = [1.0]\n')
    argv = [a.format(mix=mix, tmp=tmp_path / "cache") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "NotADirectory" not in err
    assert f"{mix} is a mixture file, not a dataset" in err
    assert "plan --mixture" in err
    assert not (tmp_path / "cache").exists()
