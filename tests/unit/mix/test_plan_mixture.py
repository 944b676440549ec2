"""``mixture_info`` and ``plan_mixture``: the library functions behind ``zephon info mix.toml``
and ``zephon plan --mixture`` (issue 30 item 4): what they return is what the CLI prints, and a
plan that cannot be made as asked is a ``PlanRequestError`` (the CLI's usage error, exit 2)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import mixture_toml, write_jsonl_corpus
from zephon_store import MixturePlan, convert, mixture_info, plan_mixture
from zephon_store.cli.main import main
from zephon_store.runs.plan_mixture import PlanRequestError
from zephon_store.write.shardwriter import WriteOptions

MIX = mixture_toml(weight_unit="samples", seed=7,
                   stages={"warm": {"steps": 0}, "anneal": {"steps": 3}},
                   sources=[{"name": "a", "url": "a", "weights": {"warm": 0.7, "anneal": 0.5}},
                            {"name": "b", "url": "b", "max_epochs": 1,
                             "weights": {"warm": 0.3, "anneal": 0.5}}])


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan_mixture")
    for name, n in (("a", 80), ("b", 40)):
        write_jsonl_corpus(d / f"src_{name}", files=1, records=n, seed=len(name) + n)
        convert([str(d / f"src_{name}")], str(d / name), options=WriteOptions(row_group_rows=10))
    (d / "mix.toml").write_text(MIX)
    return str(d / "mix.toml")


def _cli_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_info_is_what_the_cli_prints(mix, capsys):
    info = mixture_info(mix)
    assert info["mixture_id"] is None and "global batch" in info["mixture_id_note"]
    assert [s["name"] for s in info["sources"]] == ["a", "b"]
    assert info == _cli_json(capsys, ["info", mix, "--json"])
    placed = mixture_info(mix, global_batch=8)
    assert [st["start_sample"] for st in placed["stages"]] == [0, 24]
    assert placed["mixture_id"].startswith("mix:")
    assert placed == _cli_json(capsys, ["info", mix, "--global-batch", "8", "--json"])


def test_plan_is_what_the_cli_prints(mix, capsys):
    plan = plan_mixture(mix, global_batch=8, world_size=2, steps=(1, 3))
    assert isinstance(plan, MixturePlan) and len(plan.schedule.stages) == 2
    doc = plan.to_dict()
    assert [st["step"] for st in doc["steps"]] == [1, 2] and doc["order"]["seed"] == 7
    assert all(len(ranks) == 4 for st in doc["steps"] for ranks in st["ranks"])
    printed = _cli_json(capsys, ["plan", "--mixture", mix, "--world-size", "2",
                                 "--global-batch", "8", "--steps", "1:3", "--json"])
    assert printed == json.loads(json.dumps(doc))


def test_a_plan_that_cannot_be_made_is_a_request_error(mix, capsys):
    with pytest.raises(PlanRequestError, match="sets seed 7 but seed 3"):
        plan_mixture(mix, global_batch=8, world_size=2, seed=3)
    with pytest.raises(PlanRequestError, match="multiple of world_size"):
        plan_mixture(mix, global_batch=8, world_size=3)
    assert main(["plan", "--mixture", mix, "--world-size", "2", "--global-batch", "8",
                 "--seed", "3"]) == 2
    assert "sets seed 7 but seed 3" in capsys.readouterr().err
