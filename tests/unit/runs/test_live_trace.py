"""``zephon trace`` and ``where`` on a live run's log name the participant that read each
sample (the live run log records each step's participant count).

A live step is split among its participants (participant ``i`` of ``n`` reads
``positions_for_participant``); the quorum changes from step to step, and a step that did
not commit is served again to whatever quorum comes next. The replicas here share a commit
counter in one process (torchft's step), and the test sets each step's quorum.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import small_dataset
from zephon_store.cli.main import main
from zephon_store.load.live import LiveLoader
from zephon_store.load.options import BatchOptions
from zephon_store.load.runlog import append_segment, read_run_log
from zephon_store.order import OrderOptions
from zephon_store.runs.accounting import RunContext

B = 10
OPTIONS = OrderOptions(seed=3, window_blocks=2, lanes=7)
# (replicas taking part in order, whether the step commits); the others only watch.
PLAN = [([0, 1, 2], True), ([0, 1, 2], False), ([0, 2], True), ([2, 0, 1], True),
        ([1], False), ([1], True), ([0, 1], True), ([1, 0], True), ([0, 1, 2], False),
        ([1, 2], False), ([0, 1, 2], True), ([0, 1, 2], True)]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("live_trace")), files=3, records=70,
                         row_group_rows=10)


def _play(url: str, log: str) -> tuple[list[tuple[int, dict[int, list[int]]]], int]:
    """Run PLAN with three replicas (replica 1 leaves after step 2 and heals in at step 3,
    taking replica 0's state); returns each committed step's ``(step, {participant index:
    ids read})`` and the committed step count."""
    counter = [0]
    quorum: dict[int, tuple] = {}
    replicas: dict[int, list] = {}

    def join(r: int) -> None:
        loader = LiveLoader(url, global_batch=B, order=OPTIONS, run_log=log,
                            batch=BatchOptions(with_seq=True),
                            participants=lambda: quorum[r], commits=lambda: counter[0])
        if replicas:
            loader.load_state_dict(replicas[0][0].state_dict())
        replicas[r] = [loader, iter(loader)]

    for r in range(3):
        join(r)
    committed = []
    for k, (taking_part, commit) in enumerate(PLAN):
        if k == 2:
            replicas.pop(1)[1].close()
        if k == 3:
            join(1)
        for r in replicas:
            quorum[r] = ((taking_part.index(r), len(taking_part)) if r in taking_part
                         else (None, len(taking_part)))
        step = replicas[0][0].state_dict()["step"]
        drawn = {r: next(it)["_seq"].tolist() for r, (_, it) in replicas.items()}
        if commit:
            committed.append((step, {i: drawn[r] for i, r in enumerate(taking_part)}))
            counter[0] += 1
    for _, it in replicas.values():
        it.close()
    return committed, counter[0]


def test_trace_and_where_name_the_participant_of_each_live_step(url, tmp_path,
                                                                capsys) -> None:
    log = str(tmp_path / "run.jsonl")
    committed, end = _play(url, log)
    assert len({len(parts) for _, parts in committed}) == 3     # quorums of 1, 2 and 3
    ctx = RunContext(url, log)
    assert ctx.audit(end_step=end).ok
    for (step, parts), traced in zip(committed, ctx.trace([s for s, _ in committed])):
        assert traced.world_size == len(parts), step
        assert traced.ranks == [parts[i] for i in range(len(parts))], step
        one = ctx.trace([step], rank=len(parts) - 1)[0]
        assert one.ranks == [parts[len(parts) - 1]]
    # where: every id of a step of two participants, each named by its participant.
    step, parts = next((s, p) for s, p in committed if len(p) == 2)
    for i, ids in parts.items():
        for rec in ctx.where(ids, range(1), end_step=end):
            (hit,) = rec["consumed"]
            assert (hit["step"], hit["participant"]) == (step, i)
            assert "rank" not in hit
    assert main(["trace", url, "--log", log, "--step", str(step), "--end-step",
                 str(end)]) == 0
    out = capsys.readouterr().out
    assert f"{len(parts)} participants" in out
    assert f"participant 1: {parts[1]}" in out and "rank 0" not in out
    assert main(["where", url, str(parts[1][0]), "--log", log, "--end-step", str(end)]) == 0
    assert f"step {step} participant 1 " in capsys.readouterr().out


def test_the_log_records_each_quorum_shape_once(url, tmp_path) -> None:
    """A line per change of the participant count (and per heal), not per step: the
    replicas' lines that repeat what the log already says are not written, and a step
    served again to another quorum is logged again (the later line replaces it)."""
    log = str(tmp_path / "run.jsonl")
    _play(url, log)
    shapes = [(s.first_step, s.cursor, s.participants) for s in read_run_log(log)]
    # Steps: 0 by three; 1 by three (not committed: no change), then by two; 2 by three
    # (the heal); 3 by one; 4-5 by two; 6 by three (not committed), by two (not committed),
    # by three; 7 by three (no change).
    assert shapes == [(0, 0, 3), (1, 10, 2), (2, 20, 3), (3, 30, 1), (4, 40, 2),
                      (6, 60, 3)]
    with open(log) as f:
        raw = [json.loads(line) for line in f]
    assert [d["first_step"] for d in raw] == [0, 1, 2, 3, 4, 6, 6, 6]
    assert all(d["live"] and d["world_size"] == 1 for d in raw)


def test_a_live_line_without_participants_names_none(url, tmp_path, capsys) -> None:
    """A live line written before the count was logged: the step is placed as one part,
    read by participants the log does not name (it used to say rank 0)."""
    from zephon_store.load.runlog import RunSegment
    from zephon_store.read.dataset import open_dataset

    log = str(tmp_path / "old.jsonl")
    ds = open_dataset(url)
    append_segment(log, RunSegment(0, 0, B, 1, 0, ds.dataset_id, OPTIONS, live=True))
    ctx = RunContext(url, log)
    (t,) = ctx.trace([1], end_step=3)
    assert t.world_size is None and len(t.ranks) == 1 and len(t.ranks[0]) == B
    (rec,) = ctx.where(t.ranks[0][:1], range(1), end_step=3)
    assert rec["consumed"][0]["participant"] is None
    assert main(["trace", url, "--log", log, "--step", "1", "--end-step", "3"]) == 0
    out = capsys.readouterr().out
    assert "participants not recorded" in out and "rank 0" not in out


def test_the_participants_field() -> None:
    """Written on live lines only, read back, and refused where it means nothing."""
    from zephon_store.load.runlog import RunLogError, RunSegment

    seg = RunSegment(0, 0, B, 1, 0, "xxh3:00", OPTIONS, live=True, participants=3)
    d = seg.to_dict()
    assert d["participants"] == 3 and RunSegment.from_dict(d).participants == 3
    assert "participants" not in seg.replace(participants=None).to_dict()
    with pytest.raises(ValueError, match="participants is a live segment's participant count"):
        seg.replace(live=False)
    for bad in (0, True, "3", 1 << 21):
        with pytest.raises(RunLogError, match="participants is a live segment's"):
            RunSegment.from_dict({**d, "participants": bad}, line=4)
