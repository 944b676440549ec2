"""``zephon where --document`` against a scan of every batch of real runs of TorchTitan's
loader (0.3.0 rows and main's flat stream) and of Grain's ``ZephonIterDataset``, two ranks
each, from the run log they wrote (issue 42 item 4; ZephonLoader with worker processes and a
2-source mixture: ``tests/unit/runs/test_document_reads.py``)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pytest

from tests.integration.test_documents_front_ends import (
    SEQ_LEN,
    short_documents,
    titan_steps,
)
from tests.integration.torchtitan_worker import make_packed_dataset
from zephon_store.cli.main import main
from zephon_store.read.dataset import open_dataset
from zephon_store.read.documents import open_documents

pytestmark = pytest.mark.integration

SEED, STEPS, BATCH, WORLD = 4, 5, 6, 2


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("where-fronts")
    make_packed_dataset(str(root / "tok"), seq_len=SEQ_LEN, windows=60)
    return short_documents(str(root / "a"), str(root / "tok" / "tokenizer.json"), docs=200,
                           seed=8)


def _scan(front: str, url: str, log: str) -> set:
    """``(step, rank, window)`` of every window each rank was handed."""
    seen = set()
    if front == "grain":
        from zephon_store import BatchOptions, Topology
        from zephon_store.grain import ZephonIterDataset

        for rank in range(WORLD):
            it = iter(ZephonIterDataset(url, topology=Topology(BATCH, WORLD, rank), seed=SEED,
                                        batch=BatchOptions(with_seq=True, columns=("tokens",)),
                                        run_log=log if rank == 0 else None))
            for step in range(STEPS):
                seen |= {(step, rank, int(w)) for w in next(it)["_seq"]}
        return seen
    with open_dataset(url) as ds:
        windows = ds.take(range(ds.num_samples)).column("tokens").to_pylist()
    by_input = {tuple(w[:-1]): i for i, w in enumerate(windows)}
    for rank in range(WORLD):
        loader = _titan_rank(url, front.split("-")[1], rank, log if rank == 0 else "")
        for step, (_, _, (inp, _, _)) in enumerate(titan_steps(loader, STEPS)):
            seen |= {(step, rank, by_input[tuple(int(v) for v in row)]) for row in inp}
    return seen


def _titan_rank(url: str, layout: str, rank: int, log: str):
    from zephon_store.integrations.torchtitan import ZephonDataLoader

    size = ({"seq_len": SEQ_LEN, "local_batch_size": BATCH // WORLD} if layout == "rows" else
            {"max_context_length": SEQ_LEN,
             "num_tokens_per_batch": BATCH // WORLD * SEQ_LEN})
    return ZephonDataLoader.Config(dataset=url, seed=SEED, run_log=log).build(
        dp_world_size=WORLD, dp_rank=rank, tokenizer=None, **size)


@pytest.mark.parametrize("front", ["titan-rows", "titan-flat", "grain"])
def test_where_document_equals_a_scan_of_every_batch(front, dataset, tmp_path) -> None:
    log = str(tmp_path / "run.jsonl")
    seen = _scan(front, dataset, log)
    assert len(seen) == STEPS * BATCH
    table = open_documents(dataset)
    hit = 0
    for d in range(table.num_documents):
        doc = table.document(d)
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["where", dataset, "--document", f"{doc.input}:{doc.record}", "--log",
                         log, "--end-step", str(STEPS), "--epochs", "2", "--json"]) == 0
        got = json.loads(out.getvalue())["documents"][0]
        windows = {s.window for s in doc.spans}
        want = {r for r in seen if r[2] in windows}
        assert {(r["step"], r["rank"], r["window"]) for r in got["reads"]} == want
        assert got["first_step"] == min((s for s, _, _ in want), default=None)
        hit += bool(want)
    assert 0 < hit < table.num_documents
    assert np.all([r["reached"] for r in got["reads"]])
