"""Live elasticity without torchft (issue 20): per-step participants, commit cursor, reuse.

The torch-free core (``zephon_store.load.live``) and the torch shell driven by plain
callables. A whole live run is simulated in one process: replicas join and leave between
steps, steps fail to commit, joining replicas take the cursor from a state transfer; the
committed steps must consume the single-process stream. The real-torchft run is
``tests/integration/test_live_torchft.py``.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import opened, small_dataset
from zephon_store.load.live import (
    LiveCursor,
    LiveShare,
    LiveTopologyError,
    StepClaim,
    check_claims,
    claim_step,
    participant_positions,
)
from zephon_store.load.options import BatchOptions, ReadAheadOptions, StopOptions
from zephon_store.order import Order, OrderOptions, Topology
from zephon_store.torch import ReplicaOptions, ZephonLoader
from zephon_store.torch.live import LiveZephonLoader

OPTIONS = OrderOptions(seed=3, window_blocks=2, lanes=7)
B = 10


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return opened(small_dataset(str(tmp_path_factory.mktemp("live")), files=3, records=70,
                                row_group_rows=10))


@pytest.fixture(scope="module")
def reference(ds) -> list[int]:
    order = Order(ds.manifest.rg_rows, OPTIONS)
    return order.sample_at(np.arange(3 * ds.num_samples, dtype=np.int64)).tolist()


def test_live_core_imports_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import zephon_store.load.live\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=300, deadline=None)
@given(cursor=st.integers(0, 10_000), batch=st.integers(1, 40), participants=st.integers(1, 9),
       lanes=st.integers(1, 12), epoch=st.one_of(st.none(), st.integers(1, 500)),
       short=st.integers(0, 40), group=st.integers(1, 4))
def test_participants_and_their_groups_partition_every_step(cursor, batch, participants, lanes,
                                                           epoch, short, group) -> None:
    end = cursor + min(batch, short) if short else None
    width = batch if end is None else end - cursor
    got = []
    for index in range(participants):
        share = participant_positions(cursor, batch, participants, index, lanes=lanes,
                                      epoch_size=epoch, end=end)
        parts = [participant_positions(cursor, batch, participants, index, lanes=lanes,
                                       epoch_size=epoch, end=end, group_size=group,
                                       group_rank=g) for g in range(group)]
        assert np.concatenate(parts).tolist() == share.tolist()
        assert abs(share.size - width / participants) < 1
        got += share.tolist()
    assert sorted(got) == list(range(cursor, cursor + width))
    assert participant_positions(cursor, batch, participants, None).size == 0


@settings(max_examples=200, deadline=None)
@given(participants=st.integers(1, 6), cursor=st.integers(0, 1000), data=st.data())
def test_claims_that_do_not_partition_the_step_raise_on_every_participant(participants, cursor,
                                                                          data) -> None:
    claims = [StepClaim(cursor, participants, i) for i in range(participants)]
    for mine in claims:
        check_claims(mine, claims)
    # One participant's callable disagrees: another cursor, count or index, or it is missing.
    k = data.draw(st.integers(0, participants - 1))
    how = data.draw(st.sampled_from(["cursor", "count", "index", "missing"]))
    bad = list(claims)
    if how == "cursor":
        bad[k] = StepClaim(cursor + B, participants, k)
    elif how == "count":
        bad[k] = StepClaim(cursor, participants + 1, k)
    elif how == "index":
        if participants == 1:
            bad[k] = StepClaim(cursor, 1, None)
            bad = [c for c in bad if c.index is not None]
        else:
            bad[k] = StepClaim(cursor, participants, (k + 1) % participants)
    else:
        del bad[k]
    for mine in claims:
        with pytest.raises(LiveTopologyError, match="disagree"):
            check_claims(mine, bad)


def test_a_claim_no_quorum_can_give_is_refused() -> None:
    with pytest.raises(LiveTopologyError, match="at least one participant"):
        claim_step(0, 0, None)
    with pytest.raises(LiveTopologyError, match=r"index must be in \[0, 2\)"):
        claim_step(0, 2, 2)
    assert StepClaim.from_row(StepClaim(40, 3, 2).as_row()) == StepClaim(40, 3, 2)


def test_explicit_commits_move_the_cursor_once_per_committed_step() -> None:
    c = LiveCursor(B, end=25)
    assert c.begin() == 0
    with pytest.raises(LiveTopologyError, match="neither committed nor abandoned"):
        c.begin()
    c.commit(False)
    assert (c.begin(), c.position) == (0, 0)
    c.commit(True)
    assert c.begin() == 10
    c.load(20)                   # a state transfer while the step is in flight
    c.commit(True)
    assert c.position == 25      # the short last step ends at the end
    with pytest.raises(LiveTopologyError, match="without a served step"):
        c.commit(True)


def test_a_commit_counter_drives_the_cursor_and_a_load_re_anchors_it() -> None:
    counter = [5]
    c = LiveCursor(B, cursor=50, commits=lambda: counter[0])
    assert c.begin() == 50
    counter[0] += 1                       # should_commit() said yes
    assert (c.position, c.begin()) == (60, 60)
    assert c.begin() == 60                # not committed: the same step again
    counter[0] = 40                       # torchft healed: step counter of the source ...
    c.load(300)                           # ... and its cursor, before this step commits
    counter[0] += 1
    assert c.begin() == 310
    with pytest.raises(LiveTopologyError, match="went back"):
        counter[0] = 3
        c.begin()
    with pytest.raises(LiveTopologyError, match="follows a commit counter"):
        c.commit(True)


def test_a_step_served_again_with_the_same_positions_is_reused_not_decoded(ds) -> None:
    share = LiveShare.of(ds, OPTIONS, global_batch=B, batch=BatchOptions(with_seq=True))
    first = share.batch(20, 3, 1)
    decodes = share.decodes
    assert share.batch(20, 3, 1) is first and share.reused == 1 and share.decodes == decodes
    # The next step of the same quorum shape comes from the read-ahead; a new shape starts
    # a new read-ahead at that step.
    nxt = share.batch(30, 3, 1)
    assert nxt["_seq"].size == 3 and share.reused == 1
    other = share.batch(30, 2, 0)
    assert other["_seq"].size == 5
    assert share.batch(40, 2, 0)["_seq"].size == 5
    assert share.batch(40, 2, None)["_seq"].size == 0       # present, not participating
    share.close()


def test_a_simulated_live_run_consumes_the_single_process_stream(ds, reference) -> None:
    """Replicas join and leave between steps; some steps fail and are served again."""
    rng = np.random.default_rng(11)
    end = int(2.5 * ds.num_samples)
    counter = [0]                     # the quorum's committed steps (torchft's step)
    replicas: dict[int, tuple[LiveCursor, LiveShare]] = {}

    def join(r: int) -> None:
        cursor = LiveCursor(B, end=end, commits=lambda: counter[0])
        if replicas:                  # the state transfer: any present replica's cursor
            cursor.load(next(iter(replicas.values()))[0].position)
        # A small decode-ahead: the whole tiny dataset would be queued at every quorum change.
        replicas[r] = (cursor, LiveShare.of(ds, OPTIONS, global_batch=B,
                                         batch=BatchOptions(with_seq=True),
                                         read_ahead=ReadAheadOptions(decode_ahead_bytes=1)))

    for r in range(3):
        join(r)
    committed: list[tuple[int, list[int]]] = []
    next_id = 3
    while True:
        cursors = {c.begin() for c, _ in replicas.values()}
        assert len(cursors) == 1
        cursor = cursors.pop()
        if cursor + B > end:
            break
        present = sorted(replicas)
        healing = {r for r in present if rng.random() < 0.1}
        participants = [r for r in present if r not in healing] or present[:1]
        claims = {r: StepClaim(cursor, len(participants), participants.index(r)
                               if r in participants else None) for r in present}
        for r in present:
            check_claims(claims[r], [c for c in claims.values() if c.index is not None])
        ids = []
        for r in participants:
            ids += replicas[r][1].batch(cursor, len(participants), claims[r].index)["_seq"].tolist()
        if rng.random() < 0.8:
            counter[0] += 1
            committed.append((cursor, sorted(ids)))
        # Between steps a replica may leave (dies) or a new one join.
        if len(replicas) > 1 and rng.random() < 0.15:
            gone = int(rng.choice(sorted(replicas)))
            replicas.pop(gone)[1].close()
        if len(replicas) < 5 and rng.random() < 0.15:
            join(next_id)
            next_id += 1
    assert [c for c, _ in committed] == list(range(0, end - end % B, B))
    for cursor, ids in committed:
        assert ids == sorted(reference[cursor:cursor + B])
    reused = sum(s.reused for _, s in replicas.values())
    assert reused > 0


def test_the_torch_shell_with_plain_callables_and_the_shared_state(ds, reference) -> None:
    quorum = [(1, 3)]
    loader = LiveZephonLoader(ds, global_batch=B, order=OPTIONS,
                              batch=BatchOptions(with_seq=True),
                              replica=ReplicaOptions(participants=lambda: quorum[0]),
                              stop=StopOptions(epochs=1))
    batches = iter(loader)
    positions = participant_positions(0, B, 3, 1, lanes=7, epoch_size=ds.num_samples)
    assert next(batches)["_seq"].tolist() == [reference[p] for p in positions]
    loader.commit(True)
    quorum[0] = (0, 1)
    assert next(batches)["_seq"].tolist() == reference[10:20]
    loader.commit(False)
    assert next(batches)["_seq"].tolist() == reference[10:20]
    loader.commit(True)
    state = loader.state_dict()
    assert state["cursor"] == 20
    # The same one-cursor state as ZephonLoader: each resumes the other.
    plain = ZephonLoader(ds, topology=Topology(B, world_size=1, rank=0), order=OPTIONS,
                         batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=1))
    plain.load_state_dict(state)
    assert [b["_seq"].tolist() for b in plain] == [reference[20:30]]
    again = LiveZephonLoader(ds, global_batch=B, order=OPTIONS,
                             batch=BatchOptions(with_seq=True),
                             replica=ReplicaOptions(participants=lambda: (0, 1)),
                             stop=StopOptions(epochs=1))
    again.load_state_dict(plain.state_dict())
    got = [b["_seq"].tolist() for b in _committing(again)]
    assert got[0] == reference[30:40] and len(got) == (ds.num_samples - 30) // B


def _committing(loader):
    for batch in loader:
        yield batch
        loader.commit(True)


def test_auto_lanes_are_resolved_like_zephon_loader_and_a_resume_takes_the_checkpoints(
        ds, reference) -> None:
    auto = OrderOptions(seed=3, window_blocks=2)
    live = LiveZephonLoader(ds, global_batch=B, order=auto,
                            replica=ReplicaOptions(participants=lambda: (0, 1)))
    plain = ZephonLoader(ds, topology=Topology(B, world_size=1, rank=0), order=auto)
    assert live.state_dict()["order"] == plain.state_dict()["order"]
    assert live.state_dict()["order"]["lanes"] != "auto"
    # A checkpoint of a 7-lane run: the "auto" loader adopts its lanes, and its next batch is
    # that run's next step.
    seven = ZephonLoader(ds, topology=Topology(B, world_size=1, rank=0), order=OPTIONS,
                         stop=StopOptions(max_steps=2), batch=BatchOptions(with_seq=True))
    list(seven)
    live = LiveZephonLoader(ds, global_batch=B, order=auto,
                            replica=ReplicaOptions(participants=lambda: (0, 1)),
                            batch=BatchOptions(with_seq=True))
    live.load_state_dict(seven.state_dict())
    assert live.order == OPTIONS
    assert next(iter(live))["_seq"].tolist() == reference[20:30]
