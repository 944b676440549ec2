"""``zephon where --document`` and ``zephon trace --documents`` (issue 42 item 4) against a
scan of every batch of a real run: two launches (one rank, then two ranks with 2 worker
processes each), over a packed dataset and over a 2-source mixture of packed datasets."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pytest

from tests.helpers import two_stage_mixture
from tests.integration.torchtitan_worker import make_packed_dataset
from zephon_store import BatchOptions, StopOptions, Topology, WorkerOptions
from zephon_store.cli.main import main
from zephon_store.order.order import OrderOptions
from zephon_store.read.documents import open_documents

OPTS = OrderOptions(seed=9, window_blocks=2)
STEPS = (8, 6)            # steps of the two launches
END = sum(STEPS)


def run_and_scan(dataset: str, log: str) -> list[tuple[int, int, int | None, int]]:
    """``(step, rank, source or None, window)`` of every window every rank was handed."""
    from zephon_store.torch import ZephonLoader

    seen = []

    def scan(step: int, rank: int, b: dict) -> None:
        src = b.get("_source")
        for j, w in enumerate(np.asarray(b["_seq"]).tolist()):
            seen.append((step, rank, None if src is None else int(src[j]), w))

    first = ZephonLoader(dataset, topology=Topology(6), order=OPTS,
                         batch=BatchOptions(with_seq=True, columns=("tokens",)),
                         stop=StopOptions(max_steps=STEPS[0]), run_log=log)
    for s, b in enumerate(first):
        scan(s, 0, b)
    state = first.state_dict()
    for rank in range(2):
        loader = ZephonLoader(dataset, topology=Topology(10, world_size=2, rank=rank),
                              order=OPTS, batch=BatchOptions(with_seq=True, columns=("tokens",)),
                              stop=StopOptions(max_steps=STEPS[1]),
                              workers=WorkerOptions(num_workers=2),
                              run_log=log if rank == 0 else None)
        loader.load_state_dict(state)
        for s, b in enumerate(loader):
            scan(STEPS[0] + s, rank, b)
    return seen


def _cli(*argv) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("doc-reads")
    url = make_packed_dataset(str(d / "a"), seq_len=16, windows=200)
    log = str(d / "run.jsonl")
    return url, log, run_and_scan(url, log)


def _expected(table, seen, source, doc) -> set:
    windows = {s.window for s in doc.spans}
    return {(step, rank, w) for step, rank, src, w in seen if src == source and w in windows}


def test_where_document_equals_a_scan_of_every_batch(packed) -> None:
    url, log, seen = packed
    table = open_documents(url)
    assert table.num_documents > 10
    read = 0
    for d in range(table.num_documents):
        doc = table.document(d)
        got = _cli("where", url, "--document", f"{doc.input}:{doc.record}", "--log", log,
                   "--end-step", str(END), "--epochs", "2", "--json")["documents"]
        assert len(got) == 1 and got[0]["document"] == d
        reads = {(r["step"], r["rank"], r["window"]) for r in got[0]["reads"]}
        want = _expected(table, seen, None, doc)
        assert reads == want, doc
        first = min((s for s, _, _ in want), default=None)
        assert got[0]["first_step"] == first
        read += bool(want)
    assert 0 < read < table.num_documents       # some documents read, some not


def test_where_by_text_hash_and_the_clean_checkpoint(packed) -> None:
    url, log, seen = packed
    table = open_documents(url)
    doc = next(table.document(d) for d in range(table.num_documents)
               if _expected(table, seen, None, table.document(d)))
    first = min(s for s, _, _ in _expected(table, seen, None, doc))
    got = _cli("where", url, "--xxh3", doc.xxh3, "--log", log, "--end-step", str(END),
               "--checkpoint-every", "4", "--json")["documents"]
    assert [g["document"] for g in got] == [doc.id]
    assert got[0]["clean_checkpoint"] == {"max_step": first, "every": 4,
                                          "step": first // 4 * 4}


def test_trace_documents_lists_each_windows_spans(packed) -> None:
    url, log, seen = packed
    table = open_documents(url)
    step = 9
    got = _cli("trace", url, "--log", log, "--step", str(step), "--documents", "--json")
    for entry in got["steps"][0]["ranks"]:
        assert [w for s, r, _, w in seen if s == step and r == entry["rank"]] == entry["ids"]
        for w, pieces in zip(entry["ids"], entry["documents"]):
            want = [(d, s.offset, s.length) for d in range(table.num_documents)
                    for s in table.document(d).spans if s.window == w]
            assert sorted((p["document"], p["offset"], p["length"]) for p in pieces) == \
                sorted(want)
            assert sum(p["length"] for p in pieces) <= 17


def test_where_document_in_a_mixture(tmp_path) -> None:
    a = make_packed_dataset(str(tmp_path / "a"), seq_len=16, windows=80)
    b = make_packed_dataset(str(tmp_path / "b"), seq_len=16, windows=60)
    mix = two_stage_mixture(tmp_path / "mix.json", {"web": (a, [0.6, 0.3]),
                                                    "code": (b, [0.4, 0.7])})
    log = str(tmp_path / "mix.jsonl")
    seen = run_and_scan(mix, log)
    for k, (name, url) in enumerate([("web", a), ("code", b)]):
        table = open_documents(url)
        for d in range(0, table.num_documents, 2):
            doc = table.document(d)
            got = _cli("where", mix, "--document", f"{doc.input}:{doc.record}", "--source",
                       name, "--log", log, "--end-step", str(END), "--epochs", "3",
                       "--json")["documents"]
            assert {(r["step"], r["rank"], r["window"]) for r in got[0]["reads"]} == \
                _expected(table, seen, k, doc)


def test_refusals(packed, tmp_path, capsys) -> None:
    from tests.helpers import small_dataset
    from zephon_store.torch import ZephonLoader

    url, log, _ = packed
    table = open_documents(url)
    (tmp_path / "deny.json").write_text(json.dumps({"documents": [
        {"input": table.inputs[0], "record": 0}]}))
    with pytest.raises(ValueError, match=r"the deny list names documents, whose takedown "
                                         r"needs the columns \['tokens', 'doc_starts'\]"):
        ZephonLoader(url, topology=Topology(4), batch=BatchOptions(columns=("tokens",)),
                     deny_list=str(tmp_path / "deny.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"documents": [
        {"input": table.inputs[0], "record": 10 ** 6}]}))
    with pytest.raises(ValueError, match=r"deny list .*bad.json: .*has no document at record"):
        ZephonLoader(url, topology=Topology(4), deny_list=str(tmp_path / "bad.json"))
    plain = small_dataset(str(tmp_path), files=1, records=20, row_group_rows=10)
    assert main(["where", plain, "--document", "a.jsonl:1"]) == 2
    assert "has no document table" in capsys.readouterr().err
    assert main(["where", url, "--document", "nope.jsonl:1"]) == 2
    assert "no input 'nope.jsonl'" in capsys.readouterr().err
    assert main(["where", url, "3", "--document", "a:1"]) == 2
    assert "not both" in capsys.readouterr().err


def test_the_run_log_keeps_a_documents_takedown_and_where_proves_it_held(packed, tmp_path,
                                                                          capsys) -> None:
    """Launch 1 honours a list naming two documents, launch 2 runs without it: the log's
    copy keeps the documents' spans, the audit passes and names them, and ``where`` marks
    every read under the list masked, so the document's first training step is launch 2's."""
    from zephon_store.torch import ZephonLoader

    url, _, seen = packed
    table = open_documents(url)
    first_steps = {d: min((s for s, _, _ in _expected(table, seen, None, table.document(d))),
                          default=None) for d in range(table.num_documents)}
    # Read in launch 1 and again in launch 2 of the same order (a second epoch is not
    # reached: pick documents with reads in both launches).
    late = {d for d in range(table.num_documents)
            if any(s >= STEPS[0] for s, _, _ in _expected(table, seen, None, table.document(d)))}
    picks = [d for d, s in first_steps.items() if s is not None and s < STEPS[0] and d in late][:2]
    assert len(picks) == 2
    docs = [table.document(d) for d in picks]
    deny = tmp_path / "deny.json"
    deny.write_text(json.dumps({"documents": [{"input": d.input, "record": d.record}
                                              for d in docs]}))
    log = str(tmp_path / "run.jsonl")
    first = ZephonLoader(url, topology=Topology(6), order=OPTS,
                         batch=BatchOptions(columns=("tokens", "doc_starts")),
                         stop=StopOptions(max_steps=STEPS[0]), run_log=log,
                         deny_list=str(deny))
    for _ in first:
        pass
    state = first.state_dict()
    second = ZephonLoader(url, topology=Topology(10), order=OPTS,
                          batch=BatchOptions(columns=("tokens",)),
                          stop=StopOptions(max_steps=STEPS[1]), run_log=log)
    second.load_state_dict(state)
    for _ in second:
        pass
    copies = list((tmp_path / "run.jsonl.denylists").glob("*.json"))
    assert len(copies) == 1
    kept = json.loads(copies[0].read_text())
    assert sorted(d for _, d in kept["documents"]) == sorted(picks) and kept["spans"]
    audit = _cli("audit", url, "--log", log, "--end-step", str(END), "--json")
    assert audit["ok"] and [d["documents"] for d in audit["deny_lists"]] == [2, 0]
    # The audit recomputes the tokens the list blanked: each read, under the list, of a
    # window holding a piece of a denied document, that piece's length.
    blanked = sum(s.length for doc in docs for s in doc.spans for step, _, _, w in seen
                  if w == s.window and step < STEPS[0])
    assert sum(e["masked_tokens"] for e in audit["epochs"]) == blanked > 0
    for doc in docs:
        got = _cli("where", url, "--document", f"{doc.input}:{doc.record}", "--log", log,
                   "--end-step", str(END), "--json")["documents"][0]
        under = [r for r in got["reads"] if r["step"] < STEPS[0]]
        after = [r for r in got["reads"] if r["step"] >= STEPS[0]]
        assert under and all(r["masked"] for r in under)
        assert after and not any(r["masked"] for r in after)
        assert got["first_step"] == min(r["step"] for r in after)
