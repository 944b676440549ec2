"""A Grain pipeline over ZephonIterDataset, run by separate host processes, checkpointed at 2
hosts, resumed at 3 (each host with 2 Grain worker processes) and then at 1: every host reads
exactly the positions Zephon's rank rule gives it, holding the ids of the uninterrupted run at
those positions. Once over a dataset, once over a mixture whose stage changes mid-run (in the
3-host phase).

Each host is this file run as a script (``--host``): it builds the pipeline, loads the state
file if given, consumes its steps, logs each step's ids and writes ``it.get_state()`` as JSON
(what Grain's own ``DatasetIterator.save`` writes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SEED = 5
B = 12
PHASES = [(2, 6, 0), (3, 6, 2), (1, 5, 0)]   # (hosts, steps, Grain workers per host)
TIMEOUT = 240


def _host(argv: list[str]) -> None:
    """One host of one phase (run in its own process)."""
    from zephon_store import BatchOptions, Topology, WorkerOptions
    from zephon_store.grain import ZephonIterDataset

    p = argparse.ArgumentParser()
    for name in ("data", "log", "save"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--load")
    for name in ("rank", "world", "steps", "workers"):
        p.add_argument(f"--{name}", type=int, required=True)
    a = p.parse_args(argv)
    ds = ZephonIterDataset(a.data, topology=Topology(B, a.world, a.rank), seed=SEED,
                           batch=BatchOptions(with_seq=True, columns=["id"]),
                           workers=WorkerOptions(num_workers=a.workers))
    # A JAX-style step: numpy batches, the ids and (a mixture) sources kept for the log.
    it = iter(ds.map(lambda b: {k: v for k, v in b.items() if k.startswith("_")}))
    if a.load:
        with open(a.load) as f:
            it.set_state(json.load(f))
    with open(a.log, "w") as log:
        for _ in range(a.steps):
            cursor = it.get_state()["cursor"]
            batch = next(it)
            sources = batch.get("_source")
            log.write(json.dumps({"cursor": cursor, "ids": batch["_seq"].tolist(),
                                  "sources": None if sources is None else sources.tolist()})
                      + "\n")
    with open(a.save, "w") as f:
        json.dump(it.get_state(), f)
    it.close()


def _phase(root: str, data: str, tag: str, hosts: int, steps: int, workers: int,
           load: str | None) -> list[dict]:
    """Run ``hosts`` host processes at once; returns each host's saved state."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    procs = []
    for r in range(hosts):
        cmd = [sys.executable, os.path.abspath(__file__), "--host", "--data", data,
               "--rank", str(r), "--world", str(hosts), "--steps", str(steps),
               "--workers", str(workers), "--log", os.path.join(root, f"{tag}.{r}.jsonl"),
               "--save", os.path.join(root, f"{tag}.{r}.state.json")]
        procs.append(subprocess.Popen(cmd + (["--load", load] if load else []), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, f"host failed:\n{out[-2000:]}\n{err[-6000:]}"
    states = []
    for r in range(hosts):
        with open(os.path.join(root, f"{tag}.{r}.state.json")) as f:
            states.append(json.load(f))
    assert all(s == states[0] for s in states), "hosts disagree on the state"
    return states


def _logged(root: str, tag: str, hosts: int):
    """[(cursor, rank, ids)] of a phase, ids as (source, id) pairs."""
    out = []
    for r in range(hosts):
        with open(os.path.join(root, f"{tag}.{r}.jsonl")) as f:
            for rec in map(json.loads, f):
                src = rec["sources"] or [0] * len(rec["ids"])
                out.append((rec["cursor"], r, list(zip(src, rec["ids"]))))
    return out


def _run_job(root: str, data: str) -> tuple[list, dict]:
    load, logged, first = None, [], None
    for k, (hosts, steps, workers) in enumerate(PHASES):
        states = _phase(root, data, f"p{k}", hosts, steps, workers, load)
        first = first or states[0]
        logged += [(hosts, *rec) for rec in _logged(root, f"p{k}", hosts)]
        load = os.path.join(root, f"p{k}.0.state.json")
    return logged, first


def _check_exact(data: str, logged: list, first_state: dict) -> None:
    """Each host's ids are the uninterrupted run's at the positions its rank rule gives."""
    from zephon_store import BatchOptions, OrderOptions, Topology
    from zephon_store.grain import ZephonIterDataset
    from zephon_store.load.source import open_source
    from zephon_store.load.stream import RankStream

    total = sum(s for _, s, _ in PHASES) * B
    # The uninterrupted run: one host, the order options the job resolved at its start.
    order = OrderOptions.from_dict(first_state["order"])
    ref_it = iter(ZephonIterDataset(data, topology=Topology(B), order=order,
                                    batch=BatchOptions(with_seq=True, columns=["id"])))
    ref = []
    while len(ref) < total:
        b = next(ref_it)
        src = b.get("_source", [0] * len(b["_seq"]))
        ref += list(zip([int(s) for s in src], b["_seq"].tolist()))
    ref_it.close()
    source = open_source(data, global_batch=B)
    cursors = sorted({c for _, c, _, _ in logged})
    assert cursors == list(range(0, total, B)), "a step was skipped or repeated"
    for hosts, cursor, rank, ids in logged:
        stream = RankStream(source, order, Topology(B, hosts, rank))
        want = [ref[p] for p in stream.positions(cursor).tolist()]
        assert [tuple(x) for x in ids] == want, (hosts, cursor, rank)


pytestmark = pytest.mark.integration


def test_grain_hosts_2_then_3_with_workers_then_1_read_the_uninterrupted_stream(tmp_path):
    from tests.helpers import small_dataset

    data = small_dataset(str(tmp_path / "data"), files=3, records=101, row_group_rows=10)
    logged, first = _run_job(str(tmp_path), data)
    assert first["cursor"] == 6 * B and first["version"] == 1
    _check_exact(data, logged, first)


def test_grain_hosts_resume_a_mixture_across_its_stage_change(tmp_path):
    from tests.helpers import small_dataset

    web = small_dataset(str(tmp_path / "web"), files=2, records=101, row_group_rows=10)
    code = small_dataset(str(tmp_path / "code"), files=1, records=90, row_group_rows=9,
                         seed=4)
    mix = str(tmp_path / "mix.json")
    with open(mix, "w") as f:
        json.dump({"stages": [{"name": "warm", "start": {"samples": 0}},
                              {"name": "main", "start": {"samples": 100}}],
                   "sources": [{"name": "web", "url": web, "weights": {"warm": 0.75, "main": 0.25}},
                               {"name": "code", "url": code,
                                "weights": {"warm": 0.25, "main": 0.75}}]}, f)
    logged, first = _run_job(str(tmp_path), mix)
    assert first["version"] == 2 and "mixture" in first
    _check_exact(mix, logged, first)
    # The stage changed inside the 3-host phase (cursor 72 -> 144): code's share rose.
    before = [k for h, c, _, ids in logged if c < 96 for k, _ in ids]
    after = [k for h, c, _, ids in logged if c >= 108 for k, _ in ids]
    assert before.count(1) / len(before) < 0.4 < after.count(1) / len(after)


if __name__ == "__main__" and "--host" in sys.argv:
    sys.argv.remove("--host")
    _host(sys.argv[1:])
