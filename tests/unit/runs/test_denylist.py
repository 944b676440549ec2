"""Deny lists (zephon_store.load.denylist): a denied sample's bytes never reach the caller.

- every payload column of a denied row is blanked before any transform or collate sees the
  batch: a marker planted in the denied records (text, numbers, lists, token windows) is
  in no batch, for ``num_workers`` 0 and 2, with and without a transform that builds a new
  dict; ``_masked`` is in every batch and survives the transform;
- the run log keeps a content-addressed copy of each list, so editing the file in place
  (add ids, restart) leaves ``zephon audit``/``trace`` of past segments exact, and the audit
  says which list each segment honoured;
- hostile deny lists and run-log entries fail in one line naming the file (CLI exit 2), in
  bounded time (a FIFO is refused, not opened for a blocking read).
"""

from __future__ import annotations

import json
import os
import re
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import zephon_store as z
from zephon_store import BatchOptions, StopOptions, Topology, WorkerOptions, as_numpy
from zephon_store.cli.main import main
from zephon_store.load.denylist import MASK_KEY, DenyListError, load_deny_list
from zephon_store.order import OrderOptions
from zephon_store.torch import ZephonLoader

MARK = "TAKEDOWN-7f3c"
MARK_INT = 424242
N = 120
DENIED = [3, 17, 18, 64, 99, 119]
SEQ = 8   # token windows of SEQ + 1 tokens
SMALL = z.WriteOptions(target_shard_bytes=1 << 13, row_group_rows=10, row_group_bytes=None)


@pytest.fixture(scope="module")
def text_url(tmp_path_factory) -> str:
    """Records with text, a number, a list and a nullable number; the denied ones carry the
    marker in every column."""
    root = tmp_path_factory.mktemp("deny_text")
    src = root / "part-000.jsonl"
    with open(src, "w") as f:
        for i in range(N):
            bad = i in DENIED
            f.write(json.dumps({
                "text": f"{MARK} record {i}" if bad else f"record {i}",
                "score": MARK_INT if bad else i,
                "tags": [MARK_INT, i] if bad else [i],
                "note": (f"{MARK}" if bad else None) if i % 2 else "plain",
            }) + "\n")
    return z.convert([str(src)], str(root / "ds"), options=SMALL).url


@pytest.fixture(scope="module")
def packed_url(tmp_path_factory) -> str:
    """Windows of SEQ + 1 tokens (fixed-size lists) with doc_starts; denied windows hold the
    marker token."""
    root = tmp_path_factory.mktemp("deny_packed")
    tokens = (np.arange(N * (SEQ + 1), dtype=np.int32) % 1000).reshape(N, SEQ + 1)
    tokens[DENIED] = MARK_INT
    starts = [[0, 4] if i in DENIED else [0] for i in range(N)]
    table = pa.table({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens.reshape(-1)), SEQ + 1),
        "doc_starts": pa.array(starts, type=pa.list_(pa.int32()))})
    pq.write_table(table, str(root / "windows.parquet"))
    return z.convert([str(root / "windows.parquet")], str(root / "ds"), options=SMALL).url


def _leaks(value) -> bool:
    """Whether the marker is anywhere in ``value`` (a batch, a column, a cell)."""
    if isinstance(value, dict):
        return any(_leaks(v) for v in value.values())
    if hasattr(value, "numpy"):   # a tensor
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return value.dtype != bool and bool((value == MARK_INT).any())
    if isinstance(value, str):
        return MARK in value
    if isinstance(value, bytes):
        return MARK.encode() in value
    if isinstance(value, (list, tuple)):
        return any(_leaks(v) for v in value)
    return value == MARK_INT


def rebuild(batch: dict) -> dict:
    """A transform that builds a new dict (and so drops ``_masked``)."""
    return {k: v for k, v in batch.items() if k != MASK_KEY}


def _deny_file(tmp_path, ids) -> str:
    path = tmp_path / "deny.json"
    path.write_text(json.dumps({"ids": list(ids)}))
    return str(path)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("transform", [None, rebuild])
@pytest.mark.parametrize("given", ["file", "ids"])
def test_denied_text_never_reaches_a_batch(text_url, tmp_path, workers, transform,
                                           given) -> None:
    deny = _deny_file(tmp_path, DENIED) if given == "file" else list(DENIED)   # ids inline
    loader = ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0),
                          order=OrderOptions(seed=5),
                          batch=BatchOptions(with_seq=True, collate=as_numpy, transform=transform),
                          stop=StopOptions(epochs=1), workers=WorkerOptions(num_workers=workers),
                          deny_list=deny)
    masked_seen = []
    for batch in loader:
        assert not _leaks(batch), batch
        seq, masked = batch["_seq"].tolist(), batch[MASK_KEY].tolist()
        assert masked == [s in DENIED for s in seq]
        for j in np.flatnonzero(masked).tolist():
            # What a denied row looks like: empty text, zero numbers, empty lists, and a
            # column that holds nulls gets a null; the position stays.
            assert (batch["text"][j], batch["score"][j], batch["tags"][j]) == ("", 0, [])
            assert batch["note"][j] in ("", None)
        masked_seen += [s for s, m in zip(seq, masked) if m]
        assert "record" in batch["text"][int(np.argmin(masked))]   # the others are intact
    assert sorted(masked_seen) == DENIED   # one epoch: every denied id took its position


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("transform", [None, rebuild])
def test_denied_token_windows_never_reach_a_batch(packed_url, tmp_path, workers,
                                                  transform) -> None:
    loader = ZephonLoader(packed_url, topology=Topology(8, world_size=2, rank=1),
                          order=OrderOptions(seed=9),
                          batch=BatchOptions(with_seq=True, transform=transform),
                          stop=StopOptions(epochs=1), workers=WorkerOptions(num_workers=workers),
                          deny_list=_deny_file(tmp_path, DENIED))
    masked_seen = 0
    for batch in loader:   # the default collate: tensors
        assert not _leaks(batch)
        masked = batch[MASK_KEY].numpy()
        assert masked.tolist() == [s in DENIED for s in batch["_seq"].tolist()]
        tokens = batch["tokens"].numpy()
        assert tokens.shape == (masked.size, SEQ + 1)   # the position keeps its shape
        assert (tokens[masked] == 0).all() and (tokens[~masked] < 1000).all()
        assert [batch["doc_starts"][j] for j in np.flatnonzero(masked)] == [[]] * masked.sum()
        masked_seen += int(masked.sum())
    assert masked_seen > 0


def test_a_transform_that_returns_no_dict_is_refused(text_url, tmp_path) -> None:
    loader = ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0),
                          stop=StopOptions(max_steps=1),
                          batch=BatchOptions(transform=lambda b: b["text"], collate=as_numpy),
                          deny_list=_deny_file(tmp_path, DENIED))
    with pytest.raises(DenyListError, match="transform returned list.*_masked"):
        next(iter(loader))


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_editing_the_deny_list_in_place_keeps_the_audit_exact(text_url, tmp_path,
                                                              capsys) -> None:
    log = str(tmp_path / "ckpt" / "run.jsonl")
    deny = tmp_path / "deny.txt"
    deny.write_text("3\n17\n")
    opts = OrderOptions(seed=5)
    first = ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0), order=opts,
                         batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=6),
                         run_log=log, deny_list=str(deny))
    seen = [b["_seq"].tolist() for b in first]
    state = first.state_dict()
    deny.write_text("3\n17\n18\n64\n")   # the takedown workflow: add ids, restart
    second = ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0), order=opts,
                          batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=6),
                          run_log=log, deny_list=str(deny))
    second.load_state_dict(state)
    seen += [b["_seq"].tolist() for b in second]
    code, out, err = run_cli(capsys, "audit", text_url, "--log", log, "--end-step", "12",
                             "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"]
    lists = report["deny_lists"]
    assert [(d["line"], d["count"], d["path"]) for d in lists] == [
        (1, 2, str(deny)), (2, 4, str(deny))]
    assert lists[0]["id"] != lists[1]["id"]
    masked = [sum(i in ids for s in steps for i in s) for ids, steps in
              (((3, 17), seen[:6]), ((3, 17, 18, 64), seen[6:]))]
    assert report["epochs"][0]["masked"] == sum(masked)
    code, out, _ = run_cli(capsys, "audit", text_url, "--log", log, "--end-step", "12")
    assert code == 0
    assert f"line 1 (steps 0-5): deny list {lists[0]['id']} (2 ids, {deny})" in out
    assert f"line 2 (steps 6-11): deny list {lists[1]['id']} (4 ids, {deny})" in out
    # trace flags the ids of the list each step honoured, not the file as it is now.
    code, out, _ = run_cli(capsys, "trace", text_url, "--log", log, "--steps", "0:12",
                           "--json")
    traced = json.loads(out)["steps"]
    for s, step in enumerate(traced):
        ids = (3, 17) if s < 6 else (3, 17, 18, 64)
        assert step["ranks"][0]["masked"] == [i in ids for i in seen[s]]
    # The copy is what counts: damage it and the audit refuses, naming the copy.
    (copy,) = [p for p in (tmp_path / "ckpt").rglob("*.json")
               if json.loads(p.read_text())["count"] == 2]
    doc = json.loads(copy.read_text())
    doc["ids"] = [3, 18]
    copy.write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "audit", text_url, "--log", log, "--end-step", "12")
    assert code == 2 and str(copy) in err and len(err.strip().splitlines()) == 1


def test_trace_show_hides_denied_records_unless_asked(text_url, tmp_path, capsys) -> None:
    log = str(tmp_path / "run.jsonl")
    loader = ZephonLoader(text_url, topology=Topology(N, world_size=1, rank=0),
                          stop=StopOptions(max_steps=1), run_log=log,
                          deny_list=_deny_file(tmp_path, DENIED))
    for _ in loader:
        pass
    code, out, _ = run_cli(capsys, "trace", text_url, "--log", log, "--step", "0", "--show")
    assert code == 0 and MARK not in out and "record 5" in out and "denied" in out
    code, out, _ = run_cli(capsys, "trace", text_url, "--log", log, "--step", "0", "--show",
                           "--json")
    records = json.loads(out)["steps"][0]["ranks"][0]
    assert MARK not in out
    assert [r is None for r in records["records"]] == records["masked"]
    code, out, _ = run_cli(capsys, "trace", text_url, "--log", log, "--step", "0", "--show",
                           "--show-denied")
    assert code == 0 and sum(MARK in line for line in out.splitlines()) == len(DENIED)


# -- hostile inputs ----------------------------------------------------------------------


def _bounded(fn, seconds: float = 20.0):
    """``fn()``'s result or exception; fails the test if it has not returned in time."""
    got: dict = {}

    def run() -> None:
        try:
            got["value"] = fn()
        except BaseException as exc:  # handed to the test
            got["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    return got


@pytest.mark.parametrize("text, message", [
    ('{"ids": 5}', "'ids' must be a list of sample ids, got 5"),
    ('{"ids": null}', "'ids' must be a list of sample ids, got None"),
    ('{"inputs": 5}', "'inputs' must be a list of input file names, got 5"),
    ('{"inputs": [5]}', "'inputs' must be a list of input file names"),
    ("null", "line 1: 'null' is not a sample id"),
    ("[1, 2]", "line 1: '\\[1, 2\\]' is not a sample id"),
    ('{"ids": [9223372036854775808]}', "id 9223372036854775808 is outside"),
    ('{"ids": [1e3]}', "ids must be integers, got 1000.0"),
    ("9223372036854775808\n", "id 9223372036854775808 is outside"),
    ("1" * 5000 + "\n", "line 1: .* is not a sample id"),
    ('{"ids": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
])
def test_hostile_deny_lists_fail_in_one_line(text_url, tmp_path, text, message) -> None:
    path = tmp_path / "deny.json"
    path.write_text(text)
    got = _bounded(lambda: ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0),
                                        deny_list=str(path)))
    exc = got.get("error")
    assert isinstance(exc, DenyListError) and isinstance(exc, ValueError), got
    assert str(path) in str(exc) and len(str(exc).splitlines()) == 1
    assert re.search(message, str(exc)), str(exc)


def _unblock(fifo: str) -> None:
    """Let a reader that opened ``fifo`` (and waits for a writer) go on, so its thread ends."""
    try:
        os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_fifo_as_deny_list_is_refused_not_read(text_url, tmp_path) -> None:
    fifo = str(tmp_path / "deny.fifo")
    os.mkfifo(fifo)
    manifest = z.open_dataset(text_url).manifest
    try:
        got = _bounded(lambda: load_deny_list(fifo, manifest))
    finally:
        _unblock(fifo)
    exc = got.get("error")
    assert isinstance(exc, DenyListError) and fifo in str(exc) and "not a regular file" in str(
        exc), got


def _log_with_deny_entry(tmp_path, text_url, entry) -> str:
    loader = ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0),
                          stop=StopOptions(max_steps=1), run_log=str(tmp_path / "run.jsonl"))
    for _ in loader:
        pass
    d = json.loads((tmp_path / "run.jsonl").read_text())
    d["deny_list"] = entry
    (tmp_path / "run.jsonl").write_text(json.dumps(d) + "\n")
    return str(tmp_path / "run.jsonl")


@pytest.mark.parametrize("entry, message", [
    (5, "line 1: 'deny_list' must be null or an object"),
    ([1, 2], "line 1: 'deny_list' must be null or an object"),
    ("deny.txt", "line 1: 'deny_list' must be null or an object"),
    ({"mode": "mask", "count": 1, "path": ""}, r"line 1: 'deny_list' has no 'id'"),
    ({"id": 5, "mode": "mask", "count": 1, "path": ""}, "'deny_list.id' must be"),
    ({"id": "xxh3:../../etc", "mode": "mask", "count": 1, "path": ""},
     "'deny_list.id' must be"),
    ({"id": "xxh3:" + "0" * 32, "mode": "drop", "count": 1, "path": ""},
     "'deny_list.mode' must be \"mask\""),
    ({"id": "xxh3:" + "0" * 32, "mode": "mask", "count": -1, "path": ""},
     "'deny_list.count' must be an int >= 0"),
    ({"id": "xxh3:" + "0" * 32, "mode": "mask", "count": 1, "path": 7},
     "'deny_list.path' must be a string"),
])
@pytest.mark.parametrize("command", ["audit", "trace"])
def test_a_bad_deny_list_entry_in_the_run_log_exits_2(text_url, tmp_path, capsys, entry,
                                                      message, command) -> None:
    log = _log_with_deny_entry(tmp_path, text_url, entry)
    extra = ["--end-step", "1"] if command == "audit" else ["--step", "0"]
    code, _, err = run_cli(capsys, command, text_url, "--log", log, *extra)
    assert code == 2, err
    assert log in err and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_a_fifo_named_by_an_old_run_log_is_refused(text_url, tmp_path, capsys) -> None:
    fifo = str(tmp_path / "deny.fifo")
    os.mkfifo(fifo)
    # A log written before the loader kept copies names only the file.
    log = _log_with_deny_entry(tmp_path, text_url, {"id": "xxh3:" + "0" * 32, "mode": "mask",
                                                    "count": 1, "path": fifo})
    try:
        got = _bounded(lambda: run_cli(capsys, "audit", text_url, "--log", log,
                                       "--end-step", "1"))
    finally:
        _unblock(fifo)
    code, _, err = got["value"]
    assert code == 2 and fifo in err and "not a regular file" in err
    assert f"{log} line 1: " in err and len(err.strip().splitlines()) == 1


def test_a_damaged_copy_is_written_again_by_the_next_launch_with_that_list(text_url, tmp_path,
                                                                          capsys) -> None:
    log = str(tmp_path / "run.jsonl")
    deny = _deny_file(tmp_path, DENIED)
    first = ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0),
                         stop=StopOptions(max_steps=2), run_log=log, deny_list=deny)
    for _ in first:
        pass
    (copy,) = (tmp_path / "run.jsonl.denylists").iterdir()
    copy.write_text("{}")   # damaged by hand
    second = ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0),
                          stop=StopOptions(max_steps=2), run_log=log, deny_list=deny)
    second.load_state_dict(first.state_dict())
    for _ in second:
        pass
    code, _, err = run_cli(capsys, "audit", text_url, "--log", log, "--end-step", "4")
    assert code == 0, err


def test_a_deny_list_object_for_another_dataset_is_refused(text_url, packed_url) -> None:
    from zephon_store.load.denylist import DenyList

    other = DenyList(np.array([1, 2]), z.open_dataset(packed_url).dataset_id)
    with pytest.raises(DenyListError, match="is for dataset xxh3:.*, not xxh3:"):
        ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0), deny_list=other)
    ds_id = z.open_dataset(text_url).dataset_id
    with pytest.raises(DenyListError, match=f"id {N} is outside the dataset's"):
        ZephonLoader(text_url, topology=Topology(8, world_size=1, rank=0),
                     deny_list=DenyList(np.array([N]), ds_id))
