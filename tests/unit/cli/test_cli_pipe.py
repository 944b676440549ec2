"""A closed stdout (``zephon plan ds ... | head -1``) ends the command quietly with exit
status 141 (128 + SIGPIPE), what a shell reports for ``cat`` or ``grep`` in the same place."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import converted

# The status a process killed by SIGPIPE reports to the shell (128 + 13).
SIGPIPE_STATUS = 141


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("cli_pipe"), files=1, records=400, seed=5,
                     row_group_rows=20)


def _zephon(*argv: str) -> list[str]:
    return [sys.executable, "-m", "zephon_store.cli", *argv]


def _read_one_line_then_close(argv: list[str]) -> tuple[int, bytes, bytes]:
    """``zephon ... | head -1``: the output is far larger than a pipe's buffer, so the command
    is still writing when the reader goes away."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=120), first, err


def _into_a_closed_pipe(argv: list[str]) -> tuple[int, bytes]:
    """stdout a pipe whose reader closed before the command started: its first write, or the
    flush at exit for an output smaller than the buffer, fails, whatever the timing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("command", ["plan", "get"])
def test_head_dash_1_ends_quietly(ds_path, command):
    if command == "plan":
        argv = _zephon("plan", ds_path, "--world-size", "2", "--global-batch", "4",
                       "--steps", "0:3000")
    else:
        argv = _zephon("get", ds_path, *map(str, range(400)), *map(str, range(400)))
    code, first, err = _read_one_line_then_close(argv)
    assert first and err == b"" and code == SIGPIPE_STATUS, (code, err.decode())


@pytest.mark.parametrize("command", ["info", "get", "trace", "plan"])
def test_a_reader_gone_before_the_first_write_ends_quietly(ds_path, command):
    argv = {"info": ["info", ds_path],
            "get": ["get", ds_path, "0"],
            "trace": ["trace", ds_path, "--world-size", "2", "--global-batch", "4",
                      "--steps", "0:2"],
            "plan": ["plan", ds_path, "--world-size", "2", "--global-batch", "4"]}[command]
    code, err = _into_a_closed_pipe(_zephon(*argv))
    assert err == b"" and code == SIGPIPE_STATUS, (code, err.decode())


def test_a_full_output_still_exits_0(ds_path):
    proc = subprocess.run(_zephon("get", ds_path, "0", "1"), capture_output=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == b"" and proc.stdout.count(b"\n") == 2
