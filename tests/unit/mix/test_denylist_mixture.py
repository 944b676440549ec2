"""Takedowns on a mixture: each source's own ids (or inputs) denied, in every batch, the run
log, trace and audit; the same blanking as for one dataset (tests/unit/runs/test_denylist.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import zephon_store as z
from tests.helpers import DENY, takedown_sources, two_stage_mixture
from zephon_store import BatchOptions, StopOptions, Topology, WorkerOptions, as_numpy
from zephon_store.cli.main import main
from zephon_store.load.denylist import MASK_KEY, DenyList, DenyListError
from zephon_store.order import OrderOptions
from zephon_store.torch import ZephonLoader


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("deny_mix")
    web, code = takedown_sources(root)
    return two_stage_mixture(root / "mix.json", {"web": (web, [0.8, 0.4]),
                                                 "code": (code, [0.2, 0.6])})


def _loader(mixture, deny, **kw):
    return ZephonLoader(mixture, topology=Topology(6, world_size=1, rank=0),
                        order=OrderOptions(seed=3),
                        batch=BatchOptions(with_seq=True, collate=as_numpy), deny_list=deny,
                        **kw)


NAMES = ["web", "code"]


def _check_batches(loader, deny=DENY) -> list[list[tuple[str, int]]]:
    """Every batch: exactly the rows ``deny`` names blanked and flagged (so no marked text
    left when ``deny`` is all of DENY), the others intact; returns each step's (source, own
    id) pairs."""
    steps = []
    for batch in loader:
        pairs = [(NAMES[int(k)], int(i)) for k, i in zip(batch["_source"], batch["_seq"])]
        for j, (text, masked) in enumerate(zip(batch["text"], batch[MASK_KEY].tolist())):
            assert masked == (pairs[j][1] in deny.get(pairs[j][0], ())), pairs[j]
            if masked:
                assert (text, int(batch["n"][j])) == ("", 0)
            else:
                assert text.endswith(f"{pairs[j][0]} {pairs[j][1]}")   # not denied: intact
        steps.append(pairs)
    return steps


@pytest.mark.parametrize("spelling", ["file", "dict", "lists", "paths", "denylists"])
@pytest.mark.parametrize("workers", [0, 2])
def test_each_source_s_ids_are_denied_in_every_batch(mixture, tmp_path, spelling, workers):
    if spelling == "file":
        path = tmp_path / "deny.json"
        path.write_text(json.dumps({"sources": {k: {"ids": v} for k, v in DENY.items()}}))
        deny = str(path)
    elif spelling == "dict":
        deny = {k: {"ids": v} for k, v in DENY.items()}
    elif spelling == "lists":   # each source's ids inline (it read '[3, 17]' as a file name)
        deny = {k: (list(v) if k == "web" else np.array(v)) for k, v in DENY.items()}
    elif spelling == "paths":
        deny = {}
        for k, v in DENY.items():
            (tmp_path / f"{k}.txt").write_text("".join(f"{i}\n" for i in v))
            deny[k] = str(tmp_path / f"{k}.txt")
    else:
        mix = z.open_dataset  # the sources' own DenyLists, made from their manifests
        deny = {}
        spec = json.loads(open(mixture).read())
        for s in spec["sources"]:
            with mix(s["url"]) as ds:
                deny[s["name"]] = DenyList(np.array(DENY[s["name"]]), ds.dataset_id)
    steps = _check_batches(_loader(mixture, deny, stop=StopOptions(max_steps=40),
                                   workers=WorkerOptions(num_workers=workers)))
    denied = {p for st in steps for p in st if p[1] in DENY[p[0]]}
    assert denied == {(k, i) for k, v in DENY.items() for i in v}   # every one was met


def test_the_run_log_trace_and_audit_of_a_mixture_with_a_deny_list(mixture, tmp_path,
                                                                    capsys):
    log = str(tmp_path / "ckpt" / "run.jsonl")
    deny = tmp_path / "deny.json"
    deny.write_text(json.dumps({"sources": {"web": {"ids": DENY["web"]}}}))
    first = _loader(mixture, str(deny), stop=StopOptions(max_steps=20), run_log=log)
    seen = _check_batches(first, {"web": DENY["web"]})
    state = first.state_dict()
    deny.write_text(json.dumps({"sources": {k: {"ids": v} for k, v in DENY.items()}}))
    second = _loader(mixture, str(deny), stop=StopOptions(max_steps=20),
                     run_log=log)   # the takedown grows
    second.load_state_dict(state)
    seen += _check_batches(second)
    assert main(["audit", mixture, "--log", log, "--end-step", "40", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"]
    assert [d["count"] for d in report["deny_lists"]] == [3, 5]
    assert main(["trace", mixture, "--log", log, "--steps", "0:40", "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    for s, (step, pairs) in enumerate(zip(steps, seen, strict=True)):
        lists = {"web": DENY["web"]} if s < 20 else DENY
        assert step["ranks"][0]["masked"] == [i in lists.get(k, ()) for k, i in pairs]
    masked = {}
    for s, pairs in enumerate(seen):
        lists = {"web": DENY["web"]} if s < 20 else DENY
        for k, i in pairs:
            masked[k] = masked.get(k, 0) + (i in lists.get(k, ()))
    got = {}
    for e in report["epochs"]:
        got[e["source"]] = got.get(e["source"], 0) + e["masked"]
    assert got == masked and masked["code"] > 0 and masked["web"] > 0


def test_trace_show_reads_no_denied_record_of_a_mixture(mixture, tmp_path, capsys):
    """A takedown's bytes stay unread by ``trace --show`` (``null``), as for one dataset,
    and ``--show-denied`` prints them to review it."""
    log = str(tmp_path / "run.jsonl")
    deny = {k: {"ids": v} for k, v in DENY.items()}
    seen = _check_batches(_loader(mixture, deny, stop=StopOptions(max_steps=12), run_log=log))
    for flags, shown in (([], False), (["--show-denied"], True)):
        assert main(["trace", mixture, "--log", log, "--steps", "0:12", "--show", "--json",
                     *flags]) == 0
        steps = json.loads(capsys.readouterr().out)["steps"]
        for step, pairs in zip(steps, seen, strict=True):
            for (k, i), record in zip(pairs, step["ranks"][0]["records"], strict=True):
                if i in DENY[k] and not shown:
                    assert record is None, (k, i)
                else:
                    assert record["text"].endswith(f"{k} {i}"), (k, i)
    assert any(i in DENY[k] for st in seen for k, i in st)   # a denied sample was met


@pytest.mark.parametrize("deny, message", [
    ({"nope": {"ids": [1]}}, "source(s) ['nope'] are not in the mixture"),
    ({"web": {"ids": [60]}}, "outside the dataset's [0, 60)"),
    ({"web": {"id": [1]}}, "unknown key(s) ['id']"),
    ({"web": [1, "two"]}, "source 'web'"),
])
def test_a_wrong_mixture_list_is_refused_at_construction(mixture, deny, message):
    with pytest.raises(DenyListError) as info:
        _loader(mixture, deny)
    assert message in str(info.value)


def test_a_one_dataset_list_given_for_a_mixture_says_what_to_pass(mixture, tmp_path):
    path = tmp_path / "deny.json"
    path.write_text(json.dumps({"ids": [1, 2]}))
    with pytest.raises(DenyListError) as info:
        _loader(mixture, str(path))
    assert "sources" in str(info.value) and "['web', 'code']" in str(info.value)
    with z.open_dataset(json.loads(open(mixture).read())["sources"][0]["url"]) as ds:
        one = DenyList(np.array([1]), ds.dataset_id)
    with pytest.raises(DenyListError, match=r"pass \{source name: list\}"):
        _loader(mixture, one)


def test_a_deny_list_in_batch_options_says_to_give_it_to_the_loader():
    with pytest.raises(TypeError, match="pass deny_list= to the loader itself"):
        BatchOptions(deny_list={"web": [3, 17]})
