"""Live elasticity with real torchft: replica groups die and rejoin between steps, no restart.

A torchft lighthouse (in this process) and 3 replica groups (one process each,
``zephon_store.testing.live_worker``) train over gloo on a shuffled dataset (400 samples,
20 row groups, 10 lanes) with a global batch of 10 for 2 epochs (80 committed steps). A
seeded plan makes replicas SIGKILL themselves at random steps, at random points of a step
(after drawing their share, after the gradient allreduce, after the commit); each is
restarted at once with the same replica id and rejoins the running job, receiving the cursor
(and the "model") in torchft's state transfer. At most one replica is down at a time, so a
quorum of 2 keeps training. It runs with torchft's asynchronous quorum and threads, and with
its synchronous quorum and 2 process workers per replica (forked beside torchft's threads;
every share checked to come from a worker).

Checked against an uninterrupted single-process run:

- every committed step, in order of commit, consumed the single-process run's ids at its
  positions, split among exactly the participants of its quorum (3, 2 or, with 10 % 3 != 0,
  unevenly), and every committing replica's allreduced "gradient" (count, sum and sum of
  squares of the ids) equals that step's: a replica that died after the allreduce still had
  its share in the committed update, and a step that broke before it was served again;
- the committed cursors chain 0, 10, ..., 790 without a gap or a repeat; each id exactly once
  in each of the 2 epochs;
- every replica that finished ends with the model of all 80 steps and the cursor at 800 (one
  restarted too late to join before the end is stopped);
- the run log all replicas appended to (a live segment at the start and at each heal)
  passes the library audit (``RunContext.audit``, what ``zephon audit`` runs).

A second test gives one replica a participants callable that claims another's index: every
participant raises ``LiveTopologyError`` before reading the step.
"""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from torchft.coordination import LighthouseServer

from tests.helpers import ROOT, opened, small_dataset
from tests.helpers.stateful import assert_exactly_once_per_epoch, reference_ids
from zephon_store.load.runlog import read_run_log
from zephon_store.order import Order, OrderOptions
from zephon_store.order.assign import positions_for_participant
from zephon_store.read.dataset import open_dataset
from zephon_store.runs.accounting import RunContext
from zephon_store.torch import ZephonLoader

pytestmark = pytest.mark.integration

WORKER = "zephon_store.testing.live_worker"
B = 10
N = 400
EPOCHS = 2.0
END = int(EPOCHS * N)
SEED = 7
LANES, WINDOW_BLOCKS = 5040, 2     # 20 row groups / 2 = 10 effective lanes
OPTIONS = OrderOptions(seed=SEED, window_blocks=WINDOW_BLOCKS, lanes=LANES)
REPLICAS = 3
JOB_TIMEOUT = 240
# A replica restarts in seconds (a fresh interpreter imports torch); steps stand in for
# 0.15 s of compute so that it rejoins well before the run ends.
STEP_DELAY = 0.15
LATE_GRACE = 8.0
PHASES = ("served", "reduced", "committed")


def env() -> dict:
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, e.get("PYTHONPATH")]))
    return e


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory) -> str:
    url = small_dataset(str(tmp_path_factory.mktemp("live")), files=4, records=100,
                        row_group_rows=20)
    opened(url, samples=N, row_groups=20)
    return url


class Job:
    """A lighthouse and the replica processes of one run; restarts killed replicas."""

    def __init__(self, dataset: str, work: str, *, kills: dict[int, list[str]],
                 extra: dict[int, list[str]] | None = None, sync: bool = False) -> None:
        self.dataset, self.work, self.kills, self.sync = dataset, work, kills, sync
        self.extra = extra or {}
        self.run_log = os.path.join(work, "run.jsonl")   # every replica appends to it
        self.lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=1000,
                                           heartbeat_timeout_ms=1000)
        self.procs: dict[int, subprocess.Popen] = {}
        self.incarnation = defaultdict(int)
        self.outputs: list[str] = []

    def start(self, replica: int) -> None:
        k = self.incarnation[replica]
        args = [sys.executable, "-m", WORKER, self.dataset, "--replica-id", str(replica),
                "--lighthouse", self.lighthouse.address(), "--global-batch", str(B),
                "--seed", str(SEED), "--lanes", str(LANES), "--window-blocks",
                str(WINDOW_BLOCKS), "--epochs", str(EPOCHS),
                "--log", os.path.join(self.work, f"replica{replica}.{k}.jsonl"),
                "--run-log", self.run_log,
                "--step-delay", str(STEP_DELAY), "--kill-quorum", str(REPLICAS),
                *self.extra.get(replica, [])]
        if self.sync:
            args.append("--sync-quorum")
        plan = self.kills.get(replica, [])
        if k < len(plan):
            args += ["--kill", plan[k]]
        out = os.path.join(self.work, f"replica{replica}.{k}.out")
        self.outputs.append(out)
        with open(out, "w") as f:
            self.procs[replica] = subprocess.Popen(args, env=env(), stdout=f,
                                                   stderr=subprocess.STDOUT)

    def run(self) -> dict[int, int | None]:
        """Run until every replica exits by itself; returns their exit codes.

        A replica killed by its plan is restarted at once, as the same replica id, unless
        the run has ended (a replica finished). One that restarted too late to join before
        the end waits for a quorum that never comes: it is stopped ``LATE_GRACE`` seconds
        after the first replica finished, and its code is None.
        """
        for r in range(REPLICAS):
            self.start(r)
        done: dict[int, int | None] = {}
        deadline = time.monotonic() + JOB_TIMEOUT
        ended = None
        try:
            while len(done) < REPLICAS:
                if time.monotonic() > deadline:
                    pytest.fail(f"the job did not finish in {JOB_TIMEOUT} s\n{self.tail()}")
                for r, proc in list(self.procs.items()):
                    rc = proc.poll()
                    if r in done:
                        continue
                    if rc is None:
                        if ended is not None and time.monotonic() > ended + LATE_GRACE:
                            proc.kill()
                            proc.wait()
                            done[r] = None
                        continue
                    if rc == -9 and ended is None:   # killed by its plan: rejoin
                        self.incarnation[r] += 1
                        self.start(r)
                    else:
                        done[r] = rc
                        if rc == 0 and ended is None:
                            ended = time.monotonic()
                time.sleep(0.05)
        finally:
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            self.lighthouse.shutdown()
        return done

    def tail(self) -> str:
        parts = []
        for out in self.outputs[-REPLICAS:]:
            with open(out, errors="replace") as f:
                parts.append(f"--- {os.path.basename(out)}\n" + f.read()[-3000:])
        return "\n".join(parts)

    def events(self) -> list[dict]:
        out = []
        for path in sorted(glob.glob(os.path.join(self.work, "replica*.jsonl"))):
            incarnation = os.path.basename(path).split(".")[1]
            with open(path, encoding="utf-8") as f:
                out += [{**json.loads(line), "life": f"{os.path.basename(path)}",
                         "incarnation": int(incarnation)} for line in f]
        return out


def kill_plan(seed: int) -> dict[int, list[str]]:
    """Four kills at random steps (at least 6 apart, in the first 60 % of the run), of
    random replicas, at every phase. A kill waits for a step in which all replicas take
    part (``--kill-quorum``), so one replica at most is down at a time."""
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(3, int(0.6 * END // B), 6), 4))
    phases = list(PHASES) + [rng.choice(PHASES)]
    rng.shuffle(phases)
    plan: dict[int, list[str]] = defaultdict(list)
    for step, phase in zip(steps, phases):
        plan[rng.randrange(REPLICAS)].append(f"{step}:{phase}")
    return dict(plan)


def sums(ids) -> list[int]:
    return [len(ids), sum(ids), sum(i * i for i in ids)]


@pytest.mark.parametrize("sync,workers", [(False, 0), (True, 2)],
                         ids=["async-quorum", "sync-quorum-process-workers"])
def test_replicas_die_and_rejoin_and_the_committed_steps_consume_the_single_process_stream(
        dataset_url, tmp_path, sync, workers) -> None:
    plan = kill_plan(20 + sync)
    job = Job(dataset_url, str(tmp_path), kills=plan, sync=sync,
              extra={r: ["--num-workers", str(workers)] for r in range(REPLICAS)})
    codes = job.run()
    finished = sorted(r for r, rc in codes.items() if rc == 0)
    assert len(finished) >= 2 and all(rc in (0, None) for rc in codes.values()), \
        (codes, job.tail())
    events = job.events()

    ds = open_dataset(dataset_url)
    reference = reference_ids(
        lambda **kw: ZephonLoader(ds, order=OPTIONS, with_seq=True, **kw),
        global_batch=B, samples=END)
    order = Order(ds.manifest.rg_rows, OPTIONS)
    assert order.effective_lanes == 10

    def positions(cursor: int, participants: int, index: int) -> list[int]:
        return positions_for_participant(cursor, B, participants, index,
                                         lanes=order.effective_lanes, epoch_size=N).tolist()

    # Every share any replica drew holds the reference ids at its positions (served again
    # after a broken step or not).
    served = [e for e in events if e["event"] == "served"]
    shares: dict[tuple[int, int, int], list[int]] = {}
    for e in served:
        if e["index"] is None:                  # healing: present, reads nothing
            assert e["ids"] == []
            continue
        want = [reference[p] for p in positions(e["cursor"], e["participants"], e["index"])]
        assert e["ids"] == want, e
        shares[(e["cursor"], e["participants"], e["index"])] = e["ids"]

    if workers:   # the shares came from worker processes, not the replica's own
        made = [e for e in served if e["ids"]]
        assert made and all(e["made_by"] not in (None, e["pid"]) for e in made)

    # Commits: the steps committed cover 0, B, ..., END - B; no replica commits a cursor twice
    # and all replicas committed each step with the same allreduced gradient.
    committed = [e for e in events if e["event"] == "committed" and e["ok"]]
    by_cursor: dict[int, list[dict]] = defaultdict(list)
    for e in committed:
        by_cursor[e["cursor"]].append(e)
    assert sorted(by_cursor) == list(range(0, END, B))
    lives: dict[str, list[int]] = defaultdict(list)
    for e in committed:
        lives[e["life"]].append(e["cursor"])
    for life, cursors in lives.items():
        # No repeat. A gap is a replica that fell behind (a quorum of its own that could not
        # commit while the others did) and healed from them: the steps it missed were
        # committed by the others (checked above and below). Slow steps make that happen:
        # with process workers a quorum change restarts them.
        assert all(b > a and (b - a) % B == 0 for a, b in zip(cursors, cursors[1:])), \
            (life, cursors)

    # The quorum that committed each step: the participants of the committing replicas'
    # served record; their shares, plus those of participants that died after the allreduce,
    # cover the step exactly, and the committed gradient is exactly the step's.
    drawn_for: dict[int, list[dict]] = defaultdict(list)  # cursor -> draws that committed
    last_draw: dict[str, dict] = {}
    for e in events:                    # each life's events are in the order it wrote them
        if e["event"] == "served":
            last_draw[e["life"]] = e
        elif e["event"] == "committed" and e["ok"]:
            draw = last_draw[e["life"]]
            assert draw["step"] == e["step"] and draw["cursor"] == e["cursor"], (draw, e)
            drawn_for[e["cursor"]].append(draw)
    ids_at: dict[int, int] = {}
    counts = defaultdict(int)
    for cursor in range(0, END, B):
        step_sums = {tuple(e["sums"]) for e in by_cursor[cursor]}
        assert step_sums == {tuple(sums(reference[cursor:cursor + B]))}, (cursor, step_sums)
        sizes = {d["participants"] for d in drawn_for[cursor]}
        assert len(sizes) == 1, (cursor, drawn_for[cursor])
        p = sizes.pop()
        counts[p] += 1
        for index in range(p):
            ids = shares[(cursor, p, index)]
            for pos, i in zip(positions(cursor, p, index), ids):
                assert pos not in ids_at
                ids_at[pos] = i
    assert ids_at == dict(enumerate(reference))
    assert assert_exactly_once_per_epoch(ids_at, N) == 2

    # The replicas that finished hold the model of every committed step and the end cursor.
    total = [0, 0, 0]
    for cursor in range(0, END, B):
        total = [a + b for a, b in zip(total, sums(reference[cursor:cursor + B]))]
    finals = [e for e in events if e["event"] == "done"]
    assert sorted(int(e["replica"]) for e in finals) == finished
    for e in finals:
        assert e["model"] == total and e["state"]["cursor"] == END, e

    # The run log the replicas wrote (a live segment where each took the run up: the start
    # and every heal) passes the library audit (what `zephon audit` runs) over the 80
    # committed steps: each sample exactly once per epoch.
    segments = read_run_log(job.run_log)
    assert all(s.live for s in segments) and len(segments) > 1, segments
    report = RunContext(dataset_url, job.run_log).audit(end_step=END // B)
    assert report.ok and report.positions == END, report.to_dict()
    assert [e.complete for e in report.epochs] == [True, True]

    # The plan really ran: replicas died at each phase and rejoined; quorums of 3 and 2
    # committed steps; some step broke and was served again.
    killed = [e for e in events if e["event"] == "killed"]
    assert {e["phase"] for e in killed} == set(PHASES), killed
    assert counts[3] > 0 and counts[2] > 0, dict(counts)
    broken = [e for e in events if e["event"] == "committed" and not e["ok"]]
    assert broken, "no step failed to commit"
    if not sync:
        assert any(e["index"] is None for e in served), "no replica healed asynchronously"


def test_a_participants_callable_that_disagrees_raises_on_every_participant(
        dataset_url, tmp_path) -> None:
    # Replica 1 claims participant index 0 from step 3 on, as replica 0 does.
    job = Job(dataset_url, str(tmp_path), kills={}, extra={1: ["--bad-index", "3"]})
    codes = job.run()
    assert all(rc != 0 for rc in codes.values()), codes
    events = job.events()
    for r in range(REPLICAS):
        with open(os.path.join(str(tmp_path), f"replica{r}.0.out"), errors="replace") as f:
            out = f.read()
        assert "LiveTopologyError: the participants of the live step at cursor 30 disagree: " \
               "indices [0, 0, 2] of 3 participants" in out, out[-3000:]
    # Nothing was read for the bad step: the last share anyone drew is from step 2.
    assert max(e["cursor"] for e in events if e["event"] == "served") == 2 * B
