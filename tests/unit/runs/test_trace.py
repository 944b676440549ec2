"""Trace, where and audit: the inverse of the order, and questions answered from a run log.

- ``Order.positions_of`` inverts ``Order.sample_at`` for random orders and epochs
  (hypothesis), and ``unpermute`` inverts ``permute``;
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import run_cli
from zephon_store import BatchOptions, StopOptions, Topology
from zephon_store.order.order import Order, OrderOptions, permute, unpermute


@st.composite
def orders(draw):
    rows = draw(st.lists(st.integers(0, 40), min_size=1, max_size=24))
    if sum(rows) == 0:
        rows[0] = 1
    options = OrderOptions(seed=draw(st.integers(0, 2**64 - 1)),
                           shuffle=draw(st.booleans()),
                           window_blocks=draw(st.integers(1, 6)),
                           lanes=draw(st.sampled_from([1, 2, 3, 4, 6, 12, 5040])))
    return Order(np.array(rows), options)


@settings(max_examples=150, deadline=None)
@given(orders(), st.data())
def test_positions_of_inverts_sample_at(order, data) -> None:
    n = order.num_samples
    positions = np.array(data.draw(st.lists(st.integers(0, 50 * n), min_size=1, max_size=64)))
    ids = order.sample_at(positions)
    assert order.positions_of(ids, positions // n).tolist() == positions.tolist()
    # And the other way round: every id of a random epoch lands on a position holding it.
    epoch = data.draw(st.integers(0, 10**6))
    back = order.positions_of(np.arange(n), epoch)
    assert order.sample_at(back).tolist() == list(range(n))
    assert sorted(back.tolist()) == list(range(epoch * n, (epoch + 1) * n))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2**40), st.integers(0, 2**64 - 1), st.data())
def test_unpermute_inverts_permute(n, key, data) -> None:
    x = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=32)))
    assert unpermute(permute(x, n, key), n, key).tolist() == x.tolist()
    assert permute(unpermute(x, n, key), n, key).tolist() == x.tolist()


def test_unpermute_with_many_domains_and_keys_at_once() -> None:
    rng = np.random.default_rng(3)
    n = rng.integers(1, 5000, 20_000)
    x = (rng.random(n.size) * n).astype(np.int64)
    keys = rng.integers(0, 2**63, n.size)
    assert (unpermute(permute(x, n, keys), n, keys) == x).all()


# --------------------------------------------------------------------------- run logs

B_SEGMENTS = ((0, 0, 12, 2), (7, 84, 24, 3), (11, 180, 8, 4))   # (first step, cursor, B, W)
ORDER = Order(np.full(12, 10), OrderOptions(seed=5, window_blocks=2, lanes=6))


def honest_log(first_cursor_edit: int = 0) -> list:
    from zephon_store.load.runlog import RunSegment

    segs = []
    for k, (step, cursor, b, w) in enumerate(B_SEGMENTS):
        segs.append(RunSegment(first_step=step, cursor=cursor + (first_cursor_edit if k == 1
                                                                 else 0),
                               global_batch=b, world_size=w, num_workers=k,
                               dataset_id="xxh3:00", order=ORDER.options, line=k + 1))
    return segs


def order_for(seg):
    return ORDER if seg.order == ORDER.options else Order(np.full(12, 10), seg.order)


def test_the_honest_log_has_continuing_cursors() -> None:
    segs = honest_log()
    for a, b in zip(segs, segs[1:]):
        assert a.cursor_at(b.first_step) == b.cursor


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6))
def test_where_inverts_trace(steps) -> None:
    from zephon_store.runs.audit import rank_positions, segment_at, trace, where

    segs = honest_log()
    n = ORDER.num_samples
    for t in trace(segs, order_for, steps):
        positions = rank_positions(segment_at(segs, t.step), ORDER, t.step)
        for rank, ids in enumerate(t.ranks):
            for sid, p in zip(ids, positions[rank].tolist()):
                (rec,) = where(ORDER, [sid], [p // n], segments=segs, order_for=order_for)
                assert rec["global_position"] == p
                assert [(h["step"], h["rank"]) for h in rec["consumed"]] == [(t.step, rank)]


def test_trace_matches_the_order_and_the_rank_rule() -> None:
    from zephon_store.order.assign import positions_for_rank
    from zephon_store.runs.audit import trace

    segs = honest_log()
    for t in trace(segs, order_for, [0, 6, 7, 10, 11, 30]):
        assert t.world_size == {0: 2, 6: 2, 7: 3, 10: 3}.get(t.step, 4)
        assert sorted(i for r in t.ranks for i in r) == sorted(
            ORDER.sample_at(np.arange(t.cursor, t.cursor + t.global_batch)).tolist())
        for r, ids in enumerate(t.ranks):
            pos = positions_for_rank(t.cursor, t.global_batch, t.world_size, r,
                                     lanes=ORDER.effective_lanes, epoch_size=120)
            assert ids == ORDER.sample_at(pos).tolist()
    only = trace(segs, order_for, [8], rank=2)[0]
    assert len(only.ranks) == 1 and only.ranks[0] == trace(segs, order_for, [8])[0].ranks[2]


def test_audit_passes_an_honest_run_across_epochs() -> None:
    from zephon_store.runs.audit import audit_run

    r = audit_run(honest_log(), order_for, end_step=41)   # 180 + 30*8 = 420 positions
    assert r.ok, r
    assert r.positions == 420 and [e.complete for e in r.epochs] == [True, True, True, False]
    assert all(e.once == 120 for e in r.epochs[:3]) and r.epochs[3].expected == 60
    assert [e.kind for e in r.events] == ["resumed", "resumed"]


@pytest.mark.parametrize("edit, kind, skipped, repeated", [
    (12, "gap", 12, 0), (-24, "overlap", 0, 24)])
def test_audit_names_the_step_where_an_edited_cursor_entered(edit, kind, skipped,
                                                            repeated) -> None:
    from zephon_store.runs.audit import audit_run

    segs = honest_log(first_cursor_edit=edit)
    segs[2] = segs[2].replace(cursor=segs[1].cursor_at(11))   # later segments continue
    r = audit_run(segs, order_for, end_step=41)
    assert not r.ok
    bad = [e for e in r.events if e.failure]
    assert [(e.step, e.line, e.kind) for e in bad] == [(7, 2, kind)]
    assert sum(e.skipped for e in r.epochs) == skipped
    assert sum(e.repeated for e in r.epochs) == repeated


def test_audit_catches_a_changed_seed_and_a_dataset_swap() -> None:
    from zephon_store.runs.audit import audit_run

    segs = honest_log()
    segs[1] = segs[1].replace(order=ORDER.options.replace(seed=6))
    r = audit_run(segs, order_for, end_step=41)
    assert not r.ok and [(e.step, e.kind) for e in r.events if e.failure] == [
        (7, "order_changed"), (11, "order_changed")]   # seed 5 -> 6, then back
    assert any(e.repeated for e in r.epochs) and any(e.skipped for e in r.epochs)
    swapped = honest_log()
    swapped[2] = swapped[2].replace(dataset_id="xxh3:99")
    r = audit_run(swapped, order_for, end_step=41, dataset_id="xxh3:00")
    assert not r.ok and [(e.step, e.kind) for e in r.events if e.failure] == [
        (11, "dataset_changed")]


def test_exposures_count_repeats_exactly() -> None:
    from zephon_store.runs.audit import Exposures

    e = Exposures(5)
    e.add(np.array([0, 1, 2]), np.array([4, 4, 4]))
    e.add(np.array([3, 4]), np.array([0, 1]))
    x = e.close(0)
    assert (x.once, x.repeated, x.extra_exposures, x.skipped) == (2, 1, 2, 2)


# --------------------------------------------------------------------------- CLI + loader


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    from tests.helpers import small_dataset

    return small_dataset(str(tmp_path_factory.mktemp("trace")), files=2, records=100,
                         row_group_rows=10)


def test_cli_trace_where_audit_on_a_real_run(url, tmp_path, capsys) -> None:
    from zephon_store.torch import ZephonLoader

    log = str(tmp_path / "run.jsonl")
    deny = tmp_path / "deny.txt"
    deny.write_text("# takedown\n5\n17\n150\n")
    opts = OrderOptions(seed=3, window_blocks=2, lanes=4)
    seen: dict[int, list] = {}
    first = ZephonLoader(url, topology=Topology(8, world_size=1, rank=0), order=opts,
                         batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=15),
                         run_log=log, deny_list=str(deny))
    for i, batch in enumerate(first):
        seen[i] = [batch["_seq"].tolist()]
        assert batch["_masked"].tolist() == [s in (5, 17, 150) for s in seen[i][0]]
    state = first.state_dict()
    for rank in range(2):
        loader = ZephonLoader(url, topology=Topology(12, world_size=2, rank=rank), order=opts,
                              batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=20),
                              run_log=log)
        loader.load_state_dict(state)
        for i, batch in enumerate(loader):
            seen.setdefault(15 + i, [None, None])[rank] = batch["_seq"].tolist()
            assert "_masked" not in batch      # the resumed segment has no deny list
    code, out, _ = run_cli(capsys, "trace", url, "--log", log, "--steps", "0:35", "--json")
    assert code == 0
    traced = json.loads(out)["steps"]
    assert [[r["ids"] for r in t["ranks"]] for t in traced] == [seen[s] for s in range(35)]
    assert [[r.get("masked") for r in t["ranks"]] for t in traced][:15] == [
        [[i in (5, 17, 150) for i in seen[s][0]]] for s in range(15)]
    code, out, _ = run_cli(capsys, "where", url, "17", "150", "--log", log, "--epochs", "2",
                           "--end-step", "35", "--json")
    found = json.loads(out)["where"]
    for rec in found:
        for hit in rec["consumed"]:
            assert rec["id"] in seen[hit["step"]][hit["rank"]]
    assert sum(len(r["consumed"]) for r in found) == 4   # both ids, both epochs: 360 positions
    code, out, _ = run_cli(capsys, "audit", url, "--log", log, "--end-step", "35", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["positions"] == 15 * 8 + 20 * 12
    masked = sum(i in (5, 17, 150) for s in range(15) for i in seen[s][0])
    assert masked >= 1 and report["epochs"][0]["masked"] == masked
    assert report["epochs"][1]["masked"] == 0
    assert [e["kind"] for e in report["events"]] == ["deny_list_changed", "resumed"]
    code, out, _ = run_cli(capsys, "audit", url, "--log", log, "--end-step", "35")
    assert code == 0 and "OK: every sample exactly once per epoch" in out
    # Without a log: the same step from the options, as zephon plan takes them.
    code, out, _ = run_cli(capsys, "trace", url, "--step", "3", "--global-batch", "8",
                           "--seed", "3", "--window-blocks", "2", "--lanes", "4", "--json",
                           "--provenance", "--show")
    step3 = json.loads(out)["steps"][0]["ranks"][0]
    assert step3["ids"] == seen[3][0]
    assert [r["id"] for r in step3["records"]] == seen[3][0]
    assert [p["input"] for p in step3["provenance"]] == [
        f"part-00{i // 100}.jsonl" for i in seen[3][0]]
    assert [p["record"] for p in step3["provenance"]] == [i % 100 for i in seen[3][0]]
    code, out, _ = run_cli(capsys, "where", url, "17", "--seed", "3", "--window-blocks", "2",
                           "--lanes", "4", "--epochs", "3", "--json")
    positions = [r["global_position"] for r in json.loads(out)["where"]]
    assert [p // 200 for p in positions] == [0, 1, 2]


def test_cli_audit_fails_naming_the_step_of_an_edited_cursor(url, tmp_path, capsys) -> None:
    from zephon_store.load.runlog import append_segment, read_run_log
    from zephon_store.torch import ZephonLoader

    log = str(tmp_path / "run.jsonl")
    opts = OrderOptions(seed=1)
    loader = ZephonLoader(url, topology=Topology(8, world_size=1, rank=0), order=opts,
                          stop=StopOptions(max_steps=10), run_log=log)
    for _ in loader:
        pass
    state = loader.state_dict()
    state["cursor"] -= 16          # edited by hand in the checkpoint
    resumed = ZephonLoader(url, topology=Topology(8, world_size=1, rank=0), order=opts,
                           stop=StopOptions(max_steps=5), run_log=log)
    resumed.load_state_dict(state)
    for _ in resumed:
        pass
    code, out, _ = run_cli(capsys, "audit", url, "--log", log, "--end-step", "15")
    assert code == 1
    assert "DISCREPANCY at step 10 (log line 2): overlap" in out and "FAIL" in out
    # Bad logs: clear errors naming the line, exit 1.
    other = str(tmp_path / "other.jsonl")
    append_segment(other, read_run_log(log)[0].replace(dataset_id="xxh3:" + "0" * 32))
    code, _, err = run_cli(capsys, "audit", url, "--log", other)
    assert code == 1 and "line 1: the log is for dataset xxh3:000" in err
    with open(log, "a") as f:
        f.write('{"kind": "zephon-runlog", "ver')
    code, _, err = run_cli(capsys, "trace", url, "--log", log, "--step", "1")
    assert code == 1 and "line 3: not a complete JSON line" in err
    code, _, err = run_cli(capsys, "trace", url, "--step", "1")
    assert code == 2 and "--global-batch" in err


def test_mixture_trace_where_audit(tmp_path, capsys) -> None:
    from tests.helpers import mixture_toml, small_dataset
    from zephon_store.torch import ZephonLoader

    a = small_dataset(str(tmp_path / "a"), files=1, records=100, row_group_rows=10)
    b = small_dataset(str(tmp_path / "b"), files=1, records=60, row_group_rows=10)
    mix = tmp_path / "mix.toml"
    mix.write_text(mixture_toml(seed=3, stages={"only": {"samples": 0}}, sources=[
        {"name": "web", "url": a, "weights": {"only": 0.6}},
        {"name": "code", "url": b, "weights": {"only": 0.4}}]))
    log = str(tmp_path / "run.jsonl")
    seen: dict[int, list] = {}
    first = ZephonLoader(str(mix), topology=Topology(8, world_size=1, rank=0),
                         batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=10),
                         run_log=log)
    for i, batch in enumerate(first):
        seen[i] = [list(zip(batch["_source"].tolist(), batch["_seq"].tolist()))]
    state = first.state_dict()
    for rank in range(2):
        loader = ZephonLoader(str(mix), topology=Topology(12, world_size=2, rank=rank),
                              batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=15),
                              run_log=log)
        loader.load_state_dict(state)
        for i, batch in enumerate(loader):
            seen.setdefault(10 + i, [None, None])[rank] = list(
                zip(batch["_source"].tolist(), batch["_seq"].tolist()))
    names = ["web", "code"]
    code, out, _ = run_cli(capsys, "trace", str(mix), "--log", log, "--steps", "0:25",
                           "--json", "--provenance")
    assert code == 0
    for t in json.loads(out)["steps"]:
        got = [[(names.index(s), i) for s, i in zip(r["sources"], r["ids"])]
               for r in t["ranks"]]
        assert got == seen[t["step"]]
        for r in t["ranks"]:
            assert [p["record"] for p in r["provenance"]] == r["ids"]
    # 80 + 180 = 260 positions: web (100) and code (60) each wrap an epoch.
    code, out, _ = run_cli(capsys, "audit", str(mix), "--log", log, "--end-step", "25",
                           "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"], report
    assert {(e["source"], e["epoch"], e["complete"]) for e in report["epochs"]} >= {
        ("web", 0, True), ("code", 0, True)}
    assert sum(e["exposures"] for e in report["epochs"]) == 260
    code, out, _ = run_cli(capsys, "where", str(mix), "code:7", "web:42", "--log", log,
                           "--end-step", "25", "--json")
    for rec in json.loads(out)["where"]:
        k = names.index(rec["source"])
        assert len(rec["consumed"]) == 1
        hit = rec["consumed"][0]
        assert (k, rec["id"]) in seen[hit["step"]][hit["rank"]]
    code, _, err = run_cli(capsys, "where", str(mix), "7", "--log", log)
    assert code == 2 and "SOURCE:ID" in err


def test_cli_a_dataset_swap_mid_run(url, tmp_path, capsys) -> None:
    from zephon_store.load.runlog import append_segment, read_run_log
    from zephon_store.torch import ZephonLoader

    log = str(tmp_path / "run.jsonl")
    loader = ZephonLoader(url, topology=Topology(8, world_size=1, rank=0),
                          order=OrderOptions(seed=1), stop=StopOptions(max_steps=4), run_log=log)
    for _ in loader:
        pass
    (seg,) = read_run_log(log)
    append_segment(log, seg.replace(first_step=4, cursor=32, dataset_id="xxh3:" + "9" * 32))
    code, out, _ = run_cli(capsys, "audit", url, "--log", log, "--end-step", "6", "--json")
    report = json.loads(out)
    assert code == 1
    assert [(e["step"], e["kind"]) for e in report["events"] if e["failure"]] == [
        (4, "dataset_changed")]
    assert report["epochs"][0]["skipped"] == 16     # steps 4-5 read another dataset
    code, _, err = run_cli(capsys, "trace", url, "--log", log, "--step", "5")
    assert code == 1 and "line 2: that segment read dataset xxh3:999" in err
    code, out, _ = run_cli(capsys, "trace", url, "--log", log, "--step", "3", "--json")
    assert code == 0 and json.loads(out)["steps"][0]["line"] == 1
