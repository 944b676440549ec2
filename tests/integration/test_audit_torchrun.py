"""Trace and audit of a real elastic run under ``torchrun`` + gloo, checkpointed with DCP.

One job over a shuffled dataset (600 samples, 12 row groups) in three launches that change
world size, global batch and worker count twice, each appending its segment to the run
log and logging every step's ``_seq`` ids and ``_masked`` flags per rank
(``zephon_store.testing.elastic_worker``):

- phase 1: ``--nproc_per_node=2``, B=12, thread path, 20 steps, deny list A;
- phase 2: ``--nproc_per_node=3``, B=24, ``num_workers=2``, 20 steps (crosses the epoch
  boundary at 600), deny list A;
- phase 3: ``--nproc_per_node=4``, B=16, ``num_workers=1``, 10 steps, deny list B.

``zephon trace`` of the run log equals the ids each rank consumed, step by step and rank by
rank; ``_masked`` flags exactly the listed samples, across the resume on another world
size and the change of list; ``zephon audit`` exits 0. Then phase 3 is run again from a
copy of phase 2's checkpoint whose cursor was edited by hand: the audit exits 1 and names
the step where the discrepancy entered.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, small_dataset
from zephon_store.cli.main import main as zephon
from zephon_store.read.dataset import open_dataset

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

WORKER = "zephon_store.testing.elastic_worker"
N = 600
LAUNCH_TIMEOUT = 150
DENY_A = [3, 77, 150, 299, 451, 598]
DENY_B = [10, 77, 500]


def env() -> dict:
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, e.get("PYTHONPATH")]))
    return e


def phase(nproc: int, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", WORKER, *args]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]


def consumed(log_dir: str, tag: str) -> dict[int, dict[int, dict]]:
    """global step -> rank -> that rank's logged record."""
    out: dict[int, dict[int, dict]] = {}
    for path in glob.glob(os.path.join(log_dir, f"{tag}.rank*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for rec in map(json.loads, f):
                if "event" not in rec:
                    out.setdefault(rec["global_step"], {})[rec["rank"]] = rec
    return out


def cli_json(capsys, *argv: str) -> tuple[int, dict]:
    code = zephon(list(argv))
    out, err = capsys.readouterr()
    assert out, err
    return code, json.loads(out)


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory) -> str:
    url = small_dataset(str(tmp_path_factory.mktemp("audit")), files=3, records=200,
                        row_group_rows=50)
    assert open_dataset(url).num_samples == N
    return url


def test_trace_and_audit_of_an_elastic_torchrun_job(dataset_url, tmp_path, capsys) -> None:
    logs, run_log = str(tmp_path / "logs"), str(tmp_path / "ckpt" / "zephon-runlog.jsonl")
    deny_a, deny_b = tmp_path / "deny-a.json", tmp_path / "deny-b.txt"
    deny_a.write_text(json.dumps({"ids": DENY_A}))
    deny_b.write_text("\n".join(map(str, DENY_B)) + "\n")
    ck = [str(tmp_path / "ckpt" / f"step-{s}") for s in (20, 40)]
    common = [dataset_url, "--seed", "7", "--window-blocks", "2", "--lanes", "12",
              "--log-dir", logs, "--run-log", run_log]
    phase(2, *common, "--global-batch", "12", "--steps", "20", "--deny-list", str(deny_a),
          "--save", ck[0], "--tag", "p1")
    phase(3, *common, "--global-batch", "24", "--steps", "20", "--num-workers", "2",
          "--deny-list", str(deny_a), "--load", ck[0], "--save", ck[1], "--tag", "p2")
    # A copy of the log so far, for the edited-checkpoint run below.
    edited_log = str(tmp_path / "edited" / "zephon-runlog.jsonl")
    os.makedirs(os.path.dirname(edited_log))
    shutil.copy(run_log, edited_log)
    phase(4, *common, "--global-batch", "16", "--steps", "10", "--num-workers", "1",
          "--deny-list", str(deny_b), "--load", ck[1], "--tag", "p3")

    seen = {**consumed(logs, "p1"), **consumed(logs, "p2"), **consumed(logs, "p3")}
    assert sorted(seen) == list(range(50))
    assert [len(seen[s]) for s in (0, 20, 40)] == [2, 3, 4]
    segments = [json.loads(x) for x in open(run_log)]
    assert [(s["first_step"], s["cursor"], s["global_batch"], s["world_size"],
             s["num_workers"]) for s in segments] == [
        (0, 0, 12, 2, 0), (20, 240, 24, 3, 2), (40, 720, 16, 4, 1)]

    # trace == what each rank consumed, step by step and rank by rank.
    code, traced = cli_json(capsys, "trace", dataset_url, "--log", run_log, "--steps", "0:50",
                            "--json")
    assert code == 0
    for t in traced["steps"]:
        got = seen[t["step"]]
        assert [r["ids"] for r in t["ranks"]] == [got[r]["ids"] for r in range(len(got))]
        # _masked flags exactly the listed samples of the deny list then in force.
        listed = DENY_A if t["step"] < 40 else DENY_B
        for r, entry in enumerate(t["ranks"]):
            assert got[r]["masked"] == entry["masked"] == [i in listed for i in entry["ids"]]
            assert got[r]["denied_payload"] == 0   # the denied rows reached the loop blank
    masked_ids = sorted(i for s in seen.values() for rec in s.values()
                        for i, m in zip(rec["ids"], rec["masked"]) if m)
    first_pass = [i for s in range(40) for r in sorted(seen[s]) for i in seen[s][r]["ids"]]
    assert masked_ids == sorted(
        [i for i in first_pass if i in DENY_A]
        + [i for s in range(40, 50) for r in seen[s].values() for i in r["ids"] if i in DENY_B])
    assert len(masked_ids) >= len(DENY_A)   # epoch 0 was complete: every listed id once

    # where: the step and rank that consumed a sample, from the log alone.
    code, found = cli_json(capsys, "where", dataset_url, "77", "--log", run_log, "--epochs",
                           "2", "--end-step", "50", "--json")
    for rec in found["where"]:
        for hit in rec["consumed"]:
            assert 77 in seen[hit["step"]][hit["rank"]]["ids"]
    assert len(found["where"][0]["consumed"]) == 1

    code, report = cli_json(capsys, "audit", dataset_url, "--log", run_log, "--end-step",
                            "50", "--json")
    assert code == 0 and report["ok"], report
    assert report["positions"] == 880 and report["epochs"][0]["once"] == N
    assert [e["kind"] for e in report["events"] if e["kind"] != "resumed"] == [
        "deny_list_changed"]

    # The same resume from a checkpoint whose cursor was edited by hand.
    import torch.distributed.checkpoint as dcp

    state = {"loader": _template(ck[1])}
    dcp.load(state, checkpoint_id=ck[1])
    state["loader"]["cursor"] -= 48
    edited_ck = str(tmp_path / "edited" / "step-40")
    dcp.save(state, checkpoint_id=edited_ck)
    phase(2, dataset_url, "--seed", "7", "--window-blocks", "2", "--lanes", "12",
          "--log-dir", logs, "--run-log", edited_log, "--global-batch", "16", "--steps", "3",
          "--load", edited_ck, "--tag", "edited")
    code, report = cli_json(capsys, "audit", dataset_url, "--log", edited_log, "--end-step",
                            "43", "--json")
    assert code == 1 and not report["ok"]
    assert [(e["step"], e["line"], e["kind"]) for e in report["events"] if e["failure"]] == [
        (40, 3, "overlap")]
    assert sum(e["repeated"] for e in report["epochs"]) == 48


def _template(checkpoint: str) -> dict:
    """A loader state shaped like the checkpoint's (DCP loads in place into a template)."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    out: dict = {}
    for key in keys:
        parts = key.split(".")[1:]
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = 0 if parts[-1] not in ("dataset_id",) else ""
    return out
