"""The audit of a mixture run resumed with a stage (or a source) appended (docs/mixtures.md,
"Appending a stage mid-run"): the loader continues each source exactly, so the audit passes
with a ``schedule_changed`` note; what each source consumed by the run's end is counted with
the schedule the run ended on, not the first segment's."""

from __future__ import annotations

import json

import pytest

import zephon_store as z
from tests.helpers import takedown_sources
from zephon_store import BatchOptions, StopOptions, Topology
from zephon_store.runs.accounting import RunContext

B = 6


def _loader(mix: str, log: str, steps: int) -> z.Loader:
    return z.Loader(mix, topology=Topology(B), seed=3, run_log=log,
                        batch=BatchOptions(columns=("text",), with_seq=True),
                        stop=StopOptions(max_steps=steps))


@pytest.mark.parametrize("added", ["stage", "source"])
def test_a_resume_that_appends_a_stage_audits_exactly_once(tmp_path, added) -> None:
    web, code = takedown_sources(tmp_path)
    mix = tmp_path / "mix.json"
    spec = {"stages": [{"name": "warm", "start": {"steps": 0}}],
            "sources": [{"name": "web", "url": web, "weights": [0.7]},
                        {"name": "code", "url": code, "weights": [0.3]}]}
    if added == "source":
        spec["sources"].append({"name": "web2", "url": web, "weights": [0]})
    mix.write_text(json.dumps(spec))
    log = str(tmp_path / "run.jsonl")
    first = _loader(str(mix), log, 5)
    seen = [list(zip(b["_source"].tolist(), b["_seq"].tolist())) for b in first]
    state = first.state_dict()
    spec["stages"].append({"name": "late", "start": {"steps": 7}})
    for s, w in zip(spec["sources"], ([0.2], [0.3], [0.5]) if added == "source"
                    else ([0.2], [0.8])):
        s["weights"] += w
    mix.write_text(json.dumps(spec))
    second = _loader(str(mix), log, 7)
    second.load_state_dict(state)
    seen += [list(zip(b["_source"].tolist(), b["_seq"].tolist())) for b in second]
    ctx = RunContext(str(mix), log)
    report = ctx.audit(end_step=12)
    assert [e.kind for e in report.events] == ["schedule_changed", "resumed"]
    assert report.ok, report.epochs
    names = ctx.source_names
    traced = [[(names.index(s), i) for s, i in zip(t.sources[0], t.ranks[0])]
              for t in ctx.trace(range(12))]
    assert traced == seen
