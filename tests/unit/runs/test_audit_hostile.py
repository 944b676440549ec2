"""trace, where and audit answer in bounded time or refuse in one line (issue 29, items 10,
13 and 16): impossible numbers in a run log, a log that is a FIFO or nested 100,000 deep,
an integer of thousands of digits, steps a run never reached, usage errors.

Each command runs in a subprocess with a timeout, so a hang fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import small_dataset
from zephon_store.load.runlog import RunSegment, append_segment, read_run_log
from zephon_store.order import OrderOptions

OPTS = OrderOptions(seed=3, window_blocks=2, lanes=4)
LIMIT_S = 60     # a hang, not a slow answer: the bounded commands take about a second


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("hostile")), files=2, records=100,
                         row_group_rows=10)


def zephon(*argv) -> subprocess.CompletedProcess:
    """``zephon ARGV`` in a subprocess; a hang fails the test after LIMIT_S."""
    try:
        return subprocess.run([sys.executable, "-m", "zephon_store.cli", *map(str, argv)],
                              capture_output=True, text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"zephon {' '.join(map(str, argv))} still running after {LIMIT_S} s")


def honest(url: str) -> RunSegment:
    from zephon_store.format.manifest import load_manifest
    from zephon_store.io.storage import Storage

    return RunSegment(first_step=0, cursor=0, global_batch=8, world_size=2, num_workers=0,
                      dataset_id=load_manifest(Storage(url)).dataset_id, order=OPTS,
                      ranks_per_node=2)


def write_lines(path, *objs) -> str:
    with open(path, "w") as f:
        for d in objs:
            f.write((d if isinstance(d, str) else json.dumps(d)) + "\n")
    return str(path)


def test_a_cursor_gap_of_8e14_is_audited_in_bounded_time(url, tmp_path) -> None:
    seg = honest(url)
    log = str(tmp_path / "gap.jsonl")
    append_segment(log, seg)
    append_segment(log, seg.replace(first_step=10, cursor=8 * 10**14))
    r = zephon("audit", url, "--log", log, "--end-step", 20, "--json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert [e["kind"] for e in report["events"] if e["failure"]] == ["gap"]
    # 4 * 10**12 whole epochs never read: counted, not listed one by one.
    assert report["unlisted_skipped_epochs"] > 10**12 and len(report["epochs"]) < 100
    assert any("never read" in n for n in report["notes"])
    # where and trace on the same log answer at once.
    r = zephon("where", url, "17", "--log", log, "--epochs", 3, "--end-step", 20, "--json")
    assert r.returncode == 0, r.stderr
    r = zephon("trace", url, "--log", log, "--step", 15, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"][0]["cursor"] == 8 * 10**14 + 40


@pytest.mark.parametrize("change, named", [
    ({"cursor": 2**63 - 1}, "below 2**62"),
    ({"first_step": 2**63 - 1}, "below 2**62"),
    ({"world_size": 10**12, "global_batch": 10**12}, "no run is that large"),
    ({"global_batch": 2**40, "world_size": 1}, "no run is that large"),
    ({"ranks_per_node": "8"}, "ranks_per_node must be an int"),
    ({"mixture": [1, 2]}, "mixture must be null or an object"),
    ({"order": [1]}, "line 2"),
])
def test_impossible_numbers_in_a_log_are_refused_naming_file_and_line(url, tmp_path, change,
                                                                      named) -> None:
    seg = honest(url)
    line = {**seg.replace(first_step=10, cursor=80).to_dict(), **change}
    log = write_lines(tmp_path / "bad.jsonl", seg.to_dict(), line)
    for cmd in (["audit", url, "--log", log, "--end-step", 20],
                ["trace", url, "--log", log, "--step", 12],
                ["where", url, "5", "--log", log]):
        r = zephon(*cmd)
        assert r.returncode == 1, (cmd, r.stderr)
        assert f"{log} line 2:" in r.stderr and named in r.stderr, (cmd, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_an_end_step_beyond_any_position_is_refused(url, tmp_path) -> None:
    log = str(tmp_path / "run.jsonl")
    append_segment(log, honest(url))
    r = zephon("audit", url, "--log", log, "--end-step", 2**62)
    assert r.returncode == 1 and f"{log} line 1: steps [0, {2**62})" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1


def test_trace_and_where_refuse_answers_too_large_to_give(url, tmp_path) -> None:
    log = str(tmp_path / "run.jsonl")
    append_segment(log, honest(url).replace(world_size=2**16, global_batch=2**22))
    # One step of 4M ids over 65,536 ranks: refused whole, answered for one rank.
    r = zephon("trace", url, "--log", log, "--step", 3)
    assert r.returncode == 2 and "more than 1048576 ids" in r.stderr, r.stderr
    r = zephon("trace", url, "--log", log, "--step", 3, "--rank", 65535, "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["steps"][0]["ranks"][0]["ids"]) == 64
    r = zephon("trace", url, "--log", log, "--steps", f"0:{10**15}", "--rank", 0)
    assert r.returncode == 2 and "ask for fewer steps" in r.stderr, r.stderr
    r = zephon("trace", url, "--step", 10**17, "--global-batch", 2**20)
    assert r.returncode == 2 and "beyond 2**62" in r.stderr, r.stderr
    r = zephon("where", url, "5", "--epochs", 10**12)
    assert r.returncode == 2 and "ask for fewer epochs" in r.stderr, r.stderr


def test_trace_of_many_ranks_matches_the_rank_rule(url, tmp_path) -> None:
    """All ranks at once (vectorised) give what positions_for_rank gives each rank."""
    from zephon_store.format.manifest import load_manifest
    from zephon_store.io.storage import Storage
    from zephon_store.order.assign import positions_for_rank
    from zephon_store.order.order import Order
    from zephon_store.runs.audit import trace

    m = load_manifest(Storage(url))
    order = Order(m.rg_rows, OPTS)
    seg = honest(url).replace(world_size=24, global_batch=96, ranks_per_node=8)
    (t,) = trace([seg], lambda s: order, [7])
    assert t.ranks == [order.sample_at(positions_for_rank(7 * 96, 96, 24, r, lanes=4,
                                                          ranks_per_node=8)).tolist()
                       for r in range(24)]


def test_trace_says_when_a_step_was_not_reached_and_when_there_is_no_log(url, tmp_path,
                                                                         capsys) -> None:
    from zephon_store.cli.main import main

    log = str(tmp_path / "run.jsonl")
    seg = honest(url)
    append_segment(log, seg)
    append_segment(log, seg.replace(first_step=10, cursor=80))
    assert main(["trace", url, "--log", log, "--steps", "9:11"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("log line 1):")                         # a later segment began
    assert out[3].endswith("log line 2, if the run got that far):")
    assert main(["trace", url, "--log", log, "--step", "12", "--end-step", "12"]) == 0
    assert "not reached: the run stopped at step 12" in capsys.readouterr().out
    assert main(["trace", url, "--log", log, "--step", "11", "--end-step", "12",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"][0]["reached"] is True
    assert main(["trace", url, "--step", "2", "--global-batch", "8"]) == 0
    out = capsys.readouterr().out
    assert "no log" in out and "log line 0" not in out


@pytest.mark.parametrize("argv", [
    ["trace", "DS", "--step", "-1", "--global-batch", "8"],
    ["trace", "DS", "--log", "LOG", "--step", "-1"],
    ["audit", "DS", "--log", "LOG", "--end-step", "-3"],
])
def test_negative_steps_are_usage_errors(url, tmp_path, capsys, argv) -> None:
    from zephon_store.cli.main import main

    log = str(tmp_path / "run.jsonl")
    append_segment(log, honest(url))
    argv = [url if a == "DS" else log if a == "LOG" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "must be >= 0" in err


@pytest.mark.parametrize("command", ["where", "audit", "trace"])
def test_an_unknown_flag_prints_the_command_s_own_usage(url, capsys, command) -> None:
    from zephon_store.cli.main import main

    seqs = ["5"] if command == "where" else []
    assert main([command, url, *seqs, "--log", "x", "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: zephon {command} ")
    assert "unrecognized arguments: --no-such-flag" in err


def test_a_fifo_as_a_run_log_is_refused_without_blocking(url, tmp_path) -> None:
    fifo = str(tmp_path / "log.fifo")
    os.mkfifo(fifo)
    r = zephon("audit", url, "--log", fifo)
    assert r.returncode == 1 and f"{fifo} is not a regular file" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("text, named", [
    ('{"kind": "zephon-runlog", "version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "nested too deep"),
    ('{"kind": "zephon-runlog", "version": 1, "cursor": ' + "9" * 5000 + "}",
     "thousands of digits"),
])
def test_hostile_lines_give_one_line_naming_file_and_line(url, tmp_path, text,
                                                          named) -> None:
    log = write_lines(tmp_path / "bad.jsonl", honest(url).to_dict(), text)
    r = zephon("audit", url, "--log", log)
    assert r.returncode == 1, r.stderr
    assert f"{log} line 2:" in r.stderr and named in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    with pytest.raises(Exception, match="line 2"):
        read_run_log(log)
