"""Takedowns by document (issue 42 item 5): a deny list naming documents removes only their
tokens, in every front end (ZephonLoader with 0 and 2 worker processes, TorchTitan's rows and
flat batches, Grain's ``ZephonIterDataset`` and ``ZephonSource``), over a packed dataset and a
2-source mixture.

Each run is compared row by row with the same front end's run without the list:

- a denied document's tokens appear in no batch: every one of its spans holds the padding id
  and none of its tokens is a label;
- every other document of its windows reads exactly as without the list: its tokens, its
  positions and the labels inside it (a label of its last token, which predicts the next
  document's first token, is not the document's own);
- a window that holds no denied document is unchanged.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import two_stage_mixture
from tests.integration.test_documents_front_ends import (
    SEQ_LEN,
    short_documents,
    titan_loader,
    titan_steps,
)
from tests.integration.torchtitan_worker import make_packed_dataset
from zephon_store.read.documents import open_documents

pytestmark = pytest.mark.integration

SEED = 3
STEPS = 8
BATCH = 6
IGNORE = -100


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("takedowns")
    make_packed_dataset(str(root / "tok"), seq_len=SEQ_LEN, windows=60)
    tok = str(root / "tok" / "tokenizer.json")
    web = short_documents(str(root / "web"), tok, docs=120, seed=5)
    code = short_documents(str(root / "code"), tok, docs=90, seed=6)
    mix = two_stage_mixture(root / "mix.json", {"web": (web, [0.6, 0.4]),
                                                "code": (code, [0.4, 0.6])})
    return {"web": web, "code": code, "mix": mix, "root": root}


def _pick(url: str, k: int, read: set) -> list:
    """``k`` documents to take down among those with a piece in the windows ``read``: ones
    cut across windows first, then ones sharing a window with others."""
    table = open_documents(url)
    docs = [table.document(d) for d in range(table.num_documents)]
    docs = [d for d in docs if any(s.window in read for s in d.spans)]
    split = [d for d in docs if len(d.spans) > 1]
    shared = [d for d in docs if len(d.spans) == 1 and d.spans[0].length < SEQ_LEN // 2]
    return (split[:k // 2] + shared[1:1 + k - k // 2])[:k]


# -- each front end's rows: (source, window id, input, label, positions) ---------------------
def _torch_like(batches, n_rows_key="tokens"):
    out = []
    for b in batches:
        tokens = np.asarray(b["tokens"])
        label = tokens[:, 1:].astype(np.int64).copy()
        label[np.asarray(b["loss_mask"]) == 0] = IGNORE
        src = b.get("_source")
        for r in range(len(tokens)):
            out.append((None if src is None else int(src[r]), int(b["_seq"][r]),
                        tokens[r, :-1].tolist(), label[r].tolist(),
                        np.asarray(b["position_ids"][r]).tolist()))
    return out


def _rows(front: str, dataset: str, deny: str | None) -> list:
    from zephon_store import BatchOptions, OrderOptions, Topology, WorkerOptions, as_numpy

    if front.startswith("torch"):
        from zephon_store.torch import ZephonLoader

        loader = ZephonLoader(dataset, topology=Topology(BATCH), seed=SEED,
                              batch=BatchOptions(with_seq=True, documents=True,
                                                 collate=as_numpy),
                              workers=WorkerOptions(num_workers=int(front[-1])),
                              deny_list=deny)
        it = iter(loader)
        rows = _torch_like(next(it) for _ in range(STEPS))
        it.close()
        return rows
    if front == "live":
        from zephon_store.torch import LiveZephonLoader, ReplicaOptions

        loader = LiveZephonLoader(dataset, global_batch=BATCH, seed=SEED,
                                  replica=ReplicaOptions(participants=lambda: (0, 1)),
                                  batch=BatchOptions(with_seq=True, documents=True,
                                                     collate=as_numpy), deny_list=deny)
        it = iter(loader)
        batches = []
        for _ in range(STEPS):
            batches.append(next(it))
            loader.commit(True)
        it.close()
        return _torch_like(batches)
    if front == "grain-iter":
        from zephon_store.grain import ZephonIterDataset

        it = iter(ZephonIterDataset(dataset, topology=Topology(BATCH), seed=SEED,
                                    batch=BatchOptions(with_seq=True, documents=True),
                                    deny_list=deny))
        return _torch_like(next(it) for _ in range(STEPS))
    if front == "grain-source":
        from zephon_store.grain import ZephonSource

        src = ZephonSource(dataset, order=OrderOptions(seed=SEED), with_seq=True,
                           documents=True, deny_list=deny, global_batch=BATCH)
        rows = _torch_like(src.read_batch(list(range(s * BATCH, (s + 1) * BATCH)))
                           for s in range(STEPS))
        src.close()
        return rows
    return _titan_rows(front.split("-")[1], dataset, deny)


def _titan_rows(layout: str, dataset: str, deny: str | None) -> list:
    loader = titan_loader(dataset, layout, BATCH, seed=SEED, deny_list=deny or "")
    return [(None, None, i.tolist(), lab.tolist(), p.tolist())
            for _, _, rows in titan_steps(loader, STEPS) for i, lab, p in zip(*rows)]


def _spans_by_window(url: str) -> dict:
    """window -> [(document, offset, length)] of the dataset's document table."""
    table = open_documents(url)
    out: dict = {}
    for d in range(table.num_documents):
        for s in table.document(d).spans:
            out.setdefault(s.window, []).append((d, s.offset, s.length))
    return out


def _check(got: list, ref: list, urls: list[str], denied: dict) -> int:
    """Compare a run with the list to the run without it (module docstring); returns how
    many denied spans the run held. ``denied``: {source index or None: {documents}}."""
    from zephon_store.read.dataset import open_dataset

    pads = {open_dataset(u).manifest.packing.get("pad_id", 0) for u in urls}
    assert len(pads) == 1
    pad = pads.pop()          # the packing's padding id: what a taken-down token becomes
    spans = [_spans_by_window(u) for u in urls]
    seen = 0
    assert len(got) == len(ref)
    for (src, win, inp, lab, pos), (rsrc, rwin, rinp, rlab, rpos) in zip(got, ref):
        k = 0 if rsrc is None else rsrc
        win = rwin if win is None else win
        assert (src, win) == (rsrc, rwin) or src is None
        pieces = spans[k].get(win, [])
        gone = denied.get(None if len(urls) == 1 else k, set())
        if not any(d in gone for d, _, _ in pieces):
            assert (inp, lab, pos) == (rinp, rlab, rpos)
            continue
        for d, o, n in pieces:
            inside = range(o, min(o + n, SEQ_LEN))
            if d in gone:
                seen += 1
                assert all(inp[j] == pad for j in inside)
                assert all(lab[j] == IGNORE for j in range(max(0, o - 1), min(o + n, SEQ_LEN)))
            else:
                assert [inp[j] for j in inside] == [rinp[j] for j in inside]
                assert [pos[j] for j in inside] == [rpos[j] for j in inside]
                own = range(o, min(o + n - 1, SEQ_LEN))
                assert [lab[j] for j in own] == [rlab[j] for j in own]
    return seen


def _with_ids(front: str, dataset: str, got: list, ref: list) -> tuple[list, list]:
    """TorchTitan's batches carry no ids: each row gets the (source, window) of ZephonLoader's
    row at its place (the same order; the test of every front end checks that)."""
    if not front.startswith("titan"):
        return got, ref
    ids = _rows("torch-0", dataset, None)
    return ([(s, w, *rest) for (s, w, *_), (_, _, *rest) in zip(ids, got)],
            [(s, w, *rest) for (s, w, *_), (_, _, *rest) in zip(ids, ref)])


FRONTS = ["torch-0", "torch-2", "live", "titan-rows", "titan-flat", "grain-iter",
          "grain-source"]


@pytest.mark.parametrize("front", FRONTS)
def test_a_documents_takedown_removes_only_its_tokens(front, data, tmp_path) -> None:
    web = data["web"]
    read = {w for _, w, *_ in _rows("torch-0", web, None)}
    docs = _pick(web, 6, read)
    deny = tmp_path / "deny.json"
    deny.write_text(json.dumps({"documents": [{"input": d.input, "record": d.record}
                                              for d in docs[:3]]
                                + [{"xxh3": d.xxh3} for d in docs[3:]]}))
    got, ref = _with_ids(front, web, _rows(front, web, str(deny)), _rows(front, web, None))
    denied = {None: {d.id for d in open_documents(web).resolve(
        json.loads(deny.read_text())["documents"])}}
    assert _check(got, ref, [web], denied) > 0       # the run held some denied pieces


@pytest.mark.parametrize("front", ["torch-2", "titan-flat", "grain-iter", "grain-source"])
def test_a_documents_takedown_in_each_source_of_a_mixture(front, data, tmp_path) -> None:
    mix = data["mix"]
    ref_ids = _rows("torch-0", mix, None)
    picks = {name: _pick(data[name], 4, {w for s, w, *_ in ref_ids if s == k})
             for k, name in enumerate(("web", "code"))}
    deny = tmp_path / "deny-mix.json"
    deny.write_text(json.dumps({"sources": {
        name: {"documents": [{"input": d.input, "record": d.record} for d in docs]}
        for name, docs in picks.items()}}))
    got, ref = _with_ids(front, mix, _rows(front, mix, str(deny)), _rows(front, mix, None))
    denied = {k: {d.id for d in picks[name]} for k, name in enumerate(("web", "code"))}
    assert _check(got, ref, [data["web"], data["code"]], denied) > 0


def test_old_deny_lists_keep_their_identity_and_batches(data, tmp_path) -> None:
    """A list of ids reads as before: the same identity (a log written before documents
    could be named still verifies) and no document fields forced on."""
    from zephon_store import BatchOptions, Topology, as_numpy
    from zephon_store.load.denylist import DenyList, load_deny_list
    from zephon_store.read.dataset import open_dataset
    from zephon_store.torch import ZephonLoader

    web = data["web"]
    (tmp_path / "old.txt").write_text("3\n5\n")
    deny = load_deny_list(str(tmp_path / "old.txt"), open_dataset(web).manifest)
    assert deny.spans is None and deny.identity == DenyList([3, 5], deny.dataset_id).identity
    b = next(iter(ZephonLoader(web, topology=Topology(4), seed=SEED,
                               batch=BatchOptions(collate=as_numpy),
                               deny_list=str(tmp_path / "old.txt"))))
    assert "position_ids" not in b and "_masked" in b
