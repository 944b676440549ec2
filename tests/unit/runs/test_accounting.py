"""``RunContext``: the library's answer to "which order and deny list did this log segment
use" (issue 30 item 4), the one ``zephon trace/where/audit`` and the demo call: for a real run
it gives each segment the order the loader read and the deny list it honoured, and its
refusals are library errors (``AuditRequestError``, ``RunLogError``), not CLI exits."""

from __future__ import annotations

import pytest

from zephon_store import AuditRequestError, BatchOptions, RunContext, StopOptions, Topology
from zephon_store.load.runlog import RunLogError, append_segment, read_run_log
from zephon_store.order.order import OrderOptions


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A dataset and the log of a run: 6 steps of 8 with a deny list, then 4 steps of 12 on
    two ranks from that checkpoint, without one."""
    from tests.helpers import small_dataset
    from zephon_store.torch import ZephonLoader

    d = tmp_path_factory.mktemp("accounting")
    url = small_dataset(str(d), files=2, records=50, row_group_rows=10)
    log, deny = str(d / "run.jsonl"), d / "deny.txt"
    deny.write_text("5\n17\n")
    opts = OrderOptions(seed=3, window_blocks=2)
    seen = []
    first = ZephonLoader(url, topology=Topology(8, world_size=1, rank=0), order=opts,
                         batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=6),
                         run_log=log, deny_list=str(deny))
    seen += [b["_seq"].tolist() for b in first]
    state = first.state_dict()
    for rank in range(2):
        loader = ZephonLoader(url, topology=Topology(12, world_size=2, rank=rank), order=opts,
                              batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=4),
                              run_log=log)
        loader.load_state_dict(state)
        for i, b in enumerate(loader):
            if rank == 0:
                seen.append(b["_seq"].tolist())
            else:
                seen[6 + i] += b["_seq"].tolist()
    deny.write_text("5\n17\n18\n")   # edited after the run: the log's copy still answers
    return url, log, seen


def test_each_segment_gets_the_order_and_deny_list_it_used(run):
    url, log, seen = run
    ctx = RunContext(url, log)
    first, resumed = ctx.segments
    assert ctx.order_for(first) is ctx.order_for(resumed)          # one order, built once
    got = ctx.order_for(first).options
    assert (got.seed, got.window_blocks) == (3, 2) and got == first.order
    assert sorted(ctx.deny_for(first).ids.tolist()) == [5, 17]
    assert ctx.deny_for(resumed) is None
    traced = ctx.trace(range(10))
    assert [sum(t.ranks, []) for t in traced] == seen
    report = ctx.audit(end_step=10)
    assert report.ok and report.positions == 6 * 8 + 4 * 12
    assert [d["count"] for d in ctx.deny_lists(10)] == [2, 0]
    assert ctx.where([seen[7][0]], range(1))[0]["consumed"][0]["step"] == 7


def test_without_a_log_the_options_give_the_order(run):
    url, _, seen = run
    ctx = RunContext(url, seed=3, window_blocks=2)
    assert ctx.segments is None and ctx.order_options().seed == 3
    planned = ctx.planned_segment(global_batch=8)
    assert [t.ranks[0] for t in ctx.trace(range(6), segments=[planned])] == seen[:6]


def test_refusals_are_library_errors(run, tmp_path):
    url, log, _ = run
    with pytest.raises(AuditRequestError, match="--seed 4 disagrees with .* line 1"):
        RunContext(url, log, seed=4)
    with pytest.raises(AuditRequestError, match="--no-shuffle disagrees"):
        RunContext(url, log, shuffle=False)
    with pytest.raises(AuditRequestError, match="window_blocks"):
        RunContext(url, window_blocks=0).order_options()
    swapped = str(tmp_path / "swapped.jsonl")
    seg = read_run_log(log)[0]
    append_segment(swapped, seg.replace(dataset_id="xxh3:" + "0" * 32))
    with pytest.raises(RunLogError):
        RunContext(url, swapped)
