"""A mixture whose sources have different columns (web text with ``url`` and ``lang``, code
with ``repo``) is inspected as it is trained on (issue 41 item 1): ``zephon audit``,
``trace``, ``where``, ``plan --mixture`` and ``info MIX --global-batch`` answer from the
order alone, and ``--columns`` only chooses what a shown record holds, each source giving
the columns it has."""

from __future__ import annotations

import json

import pytest

import zephon_store as z
from tests.helpers import run_cli
from zephon_store import BatchOptions, StopOptions, Topology
from zephon_store.runs.accounting import RunContext
from zephon_store.runs.audit import AuditRequestError

SMALL = z.WriteOptions(target_shard_bytes=1 << 12, row_group_rows=8, row_group_bytes=None)
B = 6


def _source(root, name: str, n: int, extra: dict) -> str:
    src = root / f"{name}.jsonl"
    with open(src, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"{name} {i}", **{k: f"{v}{i}" for k, v in
                                                          extra.items()}}) + "\n")
    return z.convert([str(src)], str(root / name), options=SMALL, progress=False).url


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A mixture of sources with different columns, and the run log of a loader that read
    it with the columns they share."""
    root = tmp_path_factory.mktemp("mixcols")
    web = _source(root, "web", 50, {"url": "https://x/", "lang": "en"})
    code = _source(root, "code", 30, {"repo": "r/"})
    mix = root / "mix.json"
    mix.write_text(json.dumps({
        "stages": [{"name": "warm", "start": {"samples": 0}},
                   {"name": "main", "start": {"steps": 3}}],
        "sources": [{"name": "web", "url": web, "weights": [0.7, 0.4]},
                    {"name": "code", "url": code, "weights": [0.3, 0.6]}]}))
    log = str(root / "run.jsonl")
    loader = z.Loader(str(mix), topology=Topology(B), seed=3, run_log=log,
                      batch=BatchOptions(columns=("text",), with_seq=True),
                      stop=StopOptions(max_steps=8))
    steps = [list(zip(b["_source"].tolist(), b["_seq"].tolist())) for b in loader]
    return str(mix), log, steps


def test_the_audit_trace_and_where_of_the_mixed_run(run, capsys) -> None:
    mix, log, steps = run
    ctx = RunContext(mix, log)
    assert ctx.audit(end_step=8).ok
    traced = [list(zip(*[(src, i) for names, ids in zip(t.sources, t.ranks)
                         for src, i in zip(names, ids)])) for t in ctx.trace(range(8))]
    names = ctx.source_names
    assert [list(zip([names.index(s) for s in srcs], ids)) for srcs, ids in traced] == steps
    code, out, err = run_cli(capsys, "audit", mix, "--log", log, "--end-step", 8)
    assert code == 0, err
    k, i = steps[4][0]
    code, out, err = run_cli(capsys, "where", mix, f"{names[k]}:{i}", "--log", log, "--json")
    assert code == 0, err
    assert 4 in [hit["step"] for rec in json.loads(out)["where"] for hit in rec["consumed"]]


def test_trace_shows_each_sources_own_columns(run, capsys) -> None:
    mix, log, steps = run
    code, out, err = run_cli(capsys, "trace", mix, "--log", log, "--steps", "0:3", "--show",
                             "--json")
    assert code == 0, err
    records = [(s, r) for step in json.loads(out)["steps"] for rank in step["ranks"]
               for s, r in zip(rank["sources"], rank["records"])]
    assert {s for s, _ in records} == {"web", "code"}
    for s, r in records:
        assert set(r) == ({"text", "url", "lang"} if s == "web" else {"text", "repo"})
    code, out, err = run_cli(capsys, "trace", mix, "--log", log, "--steps", "0:3", "--show",
                             "--columns", "text,url", "--json")
    assert code == 0, err
    for step in json.loads(out)["steps"]:
        for rank in step["ranks"]:
            for s, r in zip(rank["sources"], rank["records"]):
                assert set(r) == ({"text", "url"} if s == "web" else {"text"})


def test_a_column_no_source_holds_is_refused(run) -> None:
    mix, log, _ = run
    with pytest.raises(AuditRequestError, match="column 'title' is in no source"):
        RunContext(mix, log, columns=["text", "title"])


def test_plan_and_info_of_the_mixture(run, capsys) -> None:
    mix, _, steps = run
    code, out, err = run_cli(capsys, "info", mix, "--global-batch", B, "--json")
    assert code == 0, err
    assert [s["name"] for s in json.loads(out)["sources"]] == ["web", "code"]
    code, out, err = run_cli(capsys, "plan", "--mixture", mix, "--world-size", 1,
                             "--global-batch", B, "--seed", 3, "--steps", "0:2", "--json")
    assert code == 0, err
    planned = json.loads(out)["steps"]
    names = ["web", "code"]
    assert [[(names.index(s), i) for s, i in step["ranks"][0]] for step in planned] == steps[:2]


def test_the_text_form_names_each_sample_as_source_colon_id(run, capsys) -> None:
    """``web:42`` as docs/audit.md writes it, on the rank line and on each record's line: a
    bare ``[3]`` under a rank that read ``web:3`` and ``code:3`` says neither."""
    mix, log, steps = run
    names = ["web", "code"]
    pairs = [f"{names[k]}:{i}" for k, i in steps[1]]
    code, out, err = run_cli(capsys, "trace", mix, "--log", log, "--step", 1, "--show",
                             "--provenance")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == f"  rank 0: [{', '.join(pairs)}]"
    labels = [line.split("]")[0].strip() + "]" for line in lines[2:]]
    assert labels == [f"[{p}]" for p in pairs] * 2
    code, out, err = run_cli(capsys, "plan", "--mixture", mix, "--world-size", 1,
                             "--global-batch", B, "--seed", 3, "--steps", "1:2")
    assert code == 0, err
    assert f"  rank 0: [{', '.join(pairs)}]" in out.splitlines()
