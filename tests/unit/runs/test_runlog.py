"""The run log (zephon_store.load.runlog): written by rank 0 only, appended, one line per
segment; bad logs (another dataset, a cut line, overlapping segments) fail naming the line;
the loader writes it and counts steps in its state."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from tests.helpers import small_dataset
from zephon_store import StopOptions, Topology, WorkerOptions
from zephon_store.load.runlog import (
    RunLogError,
    RunSegment,
    append_segment,
    read_run_log,
    segment_steps,
)
from zephon_store.order import OrderOptions

OPTS = OrderOptions(seed=3, window_blocks=2, lanes=4)
SEG = RunSegment(first_step=0, cursor=0, global_batch=8, world_size=2, num_workers=0,
                 dataset_id="xxh3:00", order=OPTS, ranks_per_node=2)


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("runlog")), files=2, records=100,
                         row_group_rows=10)


def test_round_trip_and_only_rank_0_writes(tmp_path) -> None:
    path = str(tmp_path / "sub" / "run.jsonl")
    assert append_segment(path, SEG)
    assert not append_segment(path, SEG.replace(first_step=9), rank=1)
    assert append_segment(path, SEG.replace(first_step=4, cursor=32, world_size=4,
                                            global_batch=12, num_workers=2))
    segs = read_run_log(path, dataset_id="xxh3:00")
    assert [(s.first_step, s.cursor, s.global_batch, s.world_size, s.num_workers, s.line)
            for s in segs] == [(0, 0, 8, 2, 0, 1), (4, 32, 12, 4, 2, 2)]
    assert segs[0].order == OPTS and segs[0].ranks_per_node == 2
    d = json.loads(open(path).readline())
    assert d["kind"] == "zephon-runlog" and d["zephon_store"] and d["time"].endswith("Z")
    assert [(s.line, a, b) for s, a, b in segment_steps(segs, 10)] == [(1, 0, 4), (2, 4, 10)]
    assert segment_steps(segs)[-1][1:] == (4, 4)   # no end step: the last one counts nothing


def _append_many(path: str, k: int) -> None:
    for i in range(25):
        append_segment(path, SEG.replace(first_step=1000 * k + i, cursor=i))


def test_writers_starting_at_once_never_interleave(tmp_path) -> None:
    path = str(tmp_path / "run.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, k)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    lines = open(path).read().splitlines()
    assert len(lines) == 100
    assert sorted(json.loads(x)["first_step"] for x in lines) == sorted(
        1000 * k + i for k in range(4) for i in range(25))


def test_a_cut_line_is_reported_by_number_and_appends_stay_readable(tmp_path) -> None:
    path = str(tmp_path / "run.jsonl")
    append_segment(path, SEG)
    text = json.dumps(SEG.replace(first_step=5, cursor=40).to_dict())
    with open(path, "a") as f:
        f.write(text[:50])           # the writer died in the middle of line 2
    with pytest.raises(RunLogError, match=r"line 2: not a complete JSON line \(the writer"):
        read_run_log(path)
    append_segment(path, SEG.replace(first_step=5, cursor=40))
    lines = open(path).read().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["first_step"] == 5
    with pytest.raises(RunLogError, match="line 2: not a complete JSON line"):
        read_run_log(path)


def test_a_log_from_another_dataset_is_refused(tmp_path) -> None:
    path = str(tmp_path / "run.jsonl")
    append_segment(path, SEG)
    with pytest.raises(RunLogError, match=r"line 1: the log is for dataset xxh3:00, not "
                                          r"xxh3:11"):
        read_run_log(path, dataset_id="xxh3:11")


def test_overlapping_segments_are_refused_and_a_same_step_restart_replaces(tmp_path) -> None:
    path = str(tmp_path / "run.jsonl")
    for step, cursor in ((0, 0), (10, 80), (10, 80), (20, 160), (15, 120)):
        append_segment(path, SEG.replace(first_step=step, cursor=cursor))
    with pytest.raises(RunLogError, match=r"line 5: segment starts at step 15, inside the "
                                          r"segment of line 4 \(from step 20\)"):
        read_run_log(path)
    path2 = str(tmp_path / "ok.jsonl")
    for step, ws in ((0, 2), (10, 4), (10, 1)):
        append_segment(path2, SEG.replace(first_step=step, cursor=8 * step, world_size=ws))
    assert [(s.first_step, s.world_size, s.line) for s in read_run_log(path2)] == [
        (0, 2, 1), (10, 1, 3)]


def test_a_late_live_line_the_log_already_places_is_not_written(tmp_path) -> None:
    """A replica that stalled before logging where it took a live run up, while the others
    committed past a later heal: its line says nothing new and is dropped under the lock;
    one that disagrees with the log is written, and reads as the overlap it is."""
    live = SEG.replace(world_size=1, live=True)
    path = str(tmp_path / "live.jsonl")
    assert append_segment(path, live.replace(first_step=4, cursor=32))
    assert append_segment(path, live.replace(first_step=9, cursor=72))
    assert not append_segment(path, live.replace(first_step=6, cursor=48))   # placed: 72-24
    assert [(s.first_step, s.cursor) for s in read_run_log(path)] == [(4, 32), (9, 72)]
    assert append_segment(path, live.replace(first_step=6, cursor=56))       # disagrees
    with pytest.raises(RunLogError, match="line 3: segment starts at step 6, inside"):
        read_run_log(path)
    other = str(tmp_path / "not-live.jsonl")   # a resume from an older checkpoint: kept
    append_segment(other, SEG.replace(first_step=9, cursor=72))
    assert append_segment(other, SEG.replace(first_step=6, cursor=48))
    with pytest.raises(RunLogError, match="overlapping segments"):
        read_run_log(other)


@pytest.mark.parametrize("line, message", [
    ({"kind": "other"}, "line 1: not a zephon run log line"),
    ({**SEG.to_dict(), "version": 9}, "line 1: run log version 9 is not supported"),
    ({k: v for k, v in SEG.to_dict().items() if k != "cursor"}, r"line 1: missing \['cursor'\]"),
    ({**SEG.to_dict(), "world_size": 3}, "line 1: world_size 3 does not divide global_batch 8"),
    ({**SEG.to_dict(), "order": {"seed": 1}}, "line 1: missing order option key"),
])
def test_damaged_lines_name_the_line(tmp_path, line, message) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(RunLogError, match=message):
        read_run_log(str(path))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(RunLogError, match="holds no segment"):
        read_run_log(str(empty))


def test_the_loader_writes_one_line_per_segment_from_rank_0(url, tmp_path) -> None:
    from zephon_store.torch import ZephonLoader

    path = str(tmp_path / "run.jsonl")
    first = ZephonLoader(url, topology=Topology(8, world_size=1, rank=0), order=OPTS,
                         stop=StopOptions(max_steps=5), run_log=path)
    assert sum(1 for _ in first) == 5
    assert sum(1 for _ in first) == 5          # a second pass continues the same segment
    state = first.state_dict()
    assert (state["step"], state["cursor"]) == (10, 80)
    for rank in (1, 0):   # rank 1 starts first: it writes nothing, rank 0 writes the line
        loader = ZephonLoader(url, topology=Topology(12, world_size=2, rank=rank), order=OPTS,
                              workers=WorkerOptions(num_workers=0), stop=StopOptions(max_steps=3),
                              run_log=path)
        loader.load_state_dict(state)
        assert sum(1 for _ in loader) == 3
        assert loader.state_dict()["step"] == 13
    segs = read_run_log(path, dataset_id=first.dataset_id)
    assert [(s.first_step, s.cursor, s.global_batch, s.world_size) for s in segs] == [
        (0, 0, 8, 1), (10, 80, 12, 2)]
    # A state saved before steps were counted resumes with cursor // global_batch.
    old = {k: v for k, v in state.items() if k != "step"}
    loader = ZephonLoader(url, topology=Topology(8, world_size=1, rank=0), order=OPTS,
                          stop=StopOptions(max_steps=1))
    loader.load_state_dict(old)
    assert loader.state_dict()["step"] == 10
    assert not os.path.exists(str(tmp_path / "none.jsonl"))


def test_deny_lists_by_id_and_by_input_file(url, tmp_path) -> None:
    import numpy as np

    from zephon_store.load.denylist import load_deny_list
    from zephon_store.read.dataset import open_dataset

    manifest = open_dataset(url).manifest
    by_input = tmp_path / "inputs.json"
    by_input.write_text(json.dumps({"ids": [3], "inputs": ["part-001.jsonl"]}))
    deny = load_deny_list(str(by_input), manifest)
    assert deny.ids.tolist() == [3, *range(100, 200)]   # the second input's 100 records
    assert deny.masked(np.array([3, 4, 99, 100, 199])).tolist() == [
        True, False, False, True, True]
    same = tmp_path / "same.txt"
    same.write_text("# the same list, as text\n" + "\n".join(map(str, deny.ids.tolist())))
    assert load_deny_list(str(same), manifest).identity == deny.identity
    assert deny.to_log()["count"] == 101 and deny.to_log()["mode"] == "mask"
    for text, message in (('{"inputs": ["nope.jsonl"]}', "does not record"),
                          ('{"ids": [200]}', r"id 200 is outside the dataset's \[0, 200\)"),
                          ('{"idz": [1]}', "unknown key"), ("1\nx\n", "line 2: 'x'")):
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_deny_list(str(bad), manifest)
