"""``BatchOptions(documents=True)`` in every front end (issue 42 item 3): ZephonLoader with 0
and 2 worker processes, LiveZephonLoader, TorchTitan (0.3.0 rows and main's flat stream),
Grain's ``ZephonIterDataset`` and its random-access ``ZephonSource``, over a packed dataset
and a 2-source mixture.

Each window handed out is looked up in the dataset (every window is distinct) and its
``position_ids``, ``cu_seqlens``, ``max_seqlen`` and ``loss_mask`` are compared with the
token-by-token reference of its own ``doc_starts``; the windows themselves are compared with
ZephonLoader's without documents, so the fields change nothing else.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from tests.helpers import two_stage_mixture
from tests.integration.torchtitan_worker import make_packed_dataset
from tests.unit.load.test_documents import brute_force, check_row
from zephon_store.load.documents import flat_cu_seqlens

pytestmark = pytest.mark.integration

SEQ_LEN = 16
SEED = 5
STEPS = 6
GLOBAL_BATCH = 6


def _windows(url: str) -> dict[tuple, tuple[list, list | None]]:
    """Each window of ``url``: its ``doc_starts`` and its blank tokens (best-fit padding:
    from ``num_tokens`` on; None without padding)."""
    from zephon_store.read.dataset import open_dataset

    with open_dataset(url) as ds:
        t = ds.take(range(ds.num_samples))
    windows = t.column("tokens").to_pylist()
    real = (t.column("num_tokens").to_pylist() if "num_tokens" in t.column_names
            else [None] * len(windows))
    return {tuple(w): (s, None if n is None else [j >= n for j in range(len(w))])
            for w, s, n in zip(windows, t.column("doc_starts").to_pylist(), real)}


def short_documents(root: str, tokenizer: str, *, docs: int, seed: int,
                    strategy: str = "concat") -> str:
    """A packed dataset of ``docs`` short documents (1 to 12 words: several per window) in
    3 JSONL inputs, with ``tokenizer``, packed by ``strategy``."""
    from zephon_store.write.convert import convert
    from zephon_store.write.packing import PackingOptions, packing_convert_kwargs
    from zephon_store.write.shardwriter import WriteOptions

    rng = random.Random(seed)
    words = "the data model run step token window shard order seed loader batch".split()
    os.makedirs(os.path.join(root, "raw"), exist_ok=True)
    for k in range(3):
        with open(os.path.join(root, "raw", f"part-{k}.jsonl"), "w") as fh:
            for i in range(k, docs, 3):
                text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
                fh.write(json.dumps({"text": f"{i} {text}", "url": f"https://s{i % 4}.org/{i}",
                                     "license": ["cc-by", "mit"][i % 2]}) + "\n")
    out = os.path.join(root, "ds")
    convert([os.path.join(root, "raw")], out,
            options=WriteOptions(row_group_rows=4, row_group_bytes=None,
                                 target_shard_bytes=16 << 10),
            **packing_convert_kwargs(PackingOptions(tokenizer=tokenizer, seq_len=SEQ_LEN,
                                                    strategy=strategy)))
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("documents")
    make_packed_dataset(str(root / "tok"), seq_len=SEQ_LEN, windows=60)   # for its tokenizer
    tokenizer = str(root / "tok" / "tokenizer.json")
    url = short_documents(str(root / "a"), tokenizer, docs=150, seed=1)
    other = short_documents(str(root / "b"), tokenizer, docs=80, seed=2)
    best = short_documents(str(root / "c"), tokenizer, docs=150, seed=3, strategy="best-fit")
    mix = two_stage_mixture(root / "mix.json", {"big": (url, [0.9, 0.3]),
                                                "small": (other, [0.1, 0.7])})
    starts = {**_windows(url), **_windows(other), **_windows(best)}
    assert len(starts) > 60
    assert sum(len(s) > 1 for s, _ in starts.values()) > 10  # windows of several documents
    assert sum(any(b or ()) for _, b in starts.values()) > 10   # best-fit windows with padding
    return {"dataset": url, "mixture": mix, "best-fit": best}, starts


FIELDS = ("position_ids", "cu_seqlens", "max_seqlen", "loss_mask")


def _batch_rows(batch) -> list[dict]:
    """Each window of a batch with its document fields."""
    return [{"window": tuple(int(v) for v in batch["tokens"][r]),
             **{k: np.asarray(batch[k][r]) for k in FIELDS}}
            for r in range(len(batch["tokens"]))]


def _loader_rows(loader, steps: int, *, commit: bool = False) -> list[dict]:
    it = iter(loader)
    out = []
    for _ in range(steps):
        out += _batch_rows(next(it))
        if commit:
            loader.commit(True)
    it.close()
    return out


def _plain_windows(dataset, steps: int) -> list[tuple]:
    from zephon_store import BatchOptions, Topology, as_numpy
    from zephon_store.torch import ZephonLoader

    loader = ZephonLoader(dataset, topology=Topology(GLOBAL_BATCH), seed=SEED,
                          batch=BatchOptions(columns=("tokens",), collate=as_numpy))
    it = iter(loader)
    rows = [tuple(int(v) for v in w) for _ in range(steps) for w in next(it)["tokens"]]
    it.close()
    return rows


def _torch(dataset, workers: int):
    from zephon_store import BatchOptions, Topology, WorkerOptions
    from zephon_store.torch import ZephonLoader

    return _loader_rows(ZephonLoader(
        dataset, topology=Topology(GLOBAL_BATCH), seed=SEED,
        batch=BatchOptions(columns=("tokens",), documents=True),
        workers=WorkerOptions(num_workers=workers)), STEPS)


def _live(dataset):
    from zephon_store import BatchOptions
    from zephon_store.torch import LiveZephonLoader, ReplicaOptions

    return _loader_rows(LiveZephonLoader(
        dataset, global_batch=GLOBAL_BATCH, seed=SEED,
        replica=ReplicaOptions(participants=lambda: (0, 1)),
        batch=BatchOptions(columns=("tokens",), documents=True)), STEPS, commit=True)


def _grain_iter(dataset):
    from zephon_store import BatchOptions, Topology
    from zephon_store.grain import ZephonIterDataset

    ds = ZephonIterDataset(dataset, topology=Topology(GLOBAL_BATCH), seed=SEED,
                           batch=BatchOptions(columns=("tokens",), documents=True))
    it = iter(ds)
    return [row for _ in range(STEPS) for row in _batch_rows(next(it))]


def _grain_source(dataset):
    from zephon_store import OrderOptions
    from zephon_store.grain import ZephonSource

    src = ZephonSource(dataset, order=OrderOptions(seed=SEED), columns=["tokens"],
                       documents=True, global_batch=GLOBAL_BATCH)
    out = []
    for p in range(STEPS * GLOBAL_BATCH):
        rec = src[p]
        out.append({"window": tuple(int(v) for v in rec["tokens"]),
                    **{k: np.asarray(rec[k]) for k in FIELDS}})
    src.close()
    return out


def titan_loader(dataset: str, layout: str, batch: int, **config):
    """A one-rank TorchTitan ``ZephonDataLoader`` of ``batch`` windows a step, built as
    0.3.0 (``rows``) or main (``flat``) builds it; ``config``: its Config fields."""
    from zephon_store.integrations.torchtitan import ZephonDataLoader

    where = {"mixture": dataset} if dataset.endswith(".json") else {"dataset": dataset}
    size = ({"seq_len": SEQ_LEN, "local_batch_size": batch} if layout == "rows" else
            {"max_context_length": SEQ_LEN, "num_tokens_per_batch": batch * SEQ_LEN})
    return ZephonDataLoader.Config(**where, **config).build(dp_world_size=1, dp_rank=0,
                                                            tokenizer=None, **size)


def titan_steps(loader, steps: int):
    """``(inputs, labels, (input, label, positions) as [rows, L] numpy)`` of ``steps``
    batches of a TorchTitan loader (either layout); the loader is closed after."""
    it = iter(loader)
    for _ in range(steps):
        x, y = next(it)
        yield x, y, tuple(t.reshape(-1, SEQ_LEN).numpy() for t in (x["input"], y,
                                                                   x["positions"]))
    loader.close()


def _titan(dataset, layout: str, starts: dict):
    from zephon_store.integrations.torchtitan import IGNORE_INDEX

    loader = titan_loader(dataset, layout, GLOBAL_BATCH, seed=SEED, documents=True, lanes=1)
    out = []
    for x, y, (inp, lab, pos) in titan_steps(loader, STEPS):
        cu = x.cu_seqlens.numpy()      # rows: [B, L+1]; flat: the stream's offsets
        # A padded window's last label is -100: the window is found by its inputs.
        by_input = {w[:-1]: w for w in starts}
        step = [{"window": by_input[tuple(int(v) for v in inp[r])],
                 "position_ids": pos[r], "loss_mask": lab[r] != IGNORE_INDEX,
                 "cu_seqlens": cu[r] if layout == "rows" else None}
                for r in range(len(inp))]
        if layout == "flat":
            step[0]["flat_cu"] = cu
        assert x.num_valid_tokens == int((y != IGNORE_INDEX).sum())
        assert set(x) == {"input", "positions"}      # nothing else reaches forward(**x)
        out += step
    return out


def _want(window: tuple, starts: dict) -> dict:
    doc_starts, blank = starts[window]
    return brute_force(window, doc_starts, blank)


def _check(rows: list[dict], starts: dict, *, full: bool = True) -> None:
    for row in rows:
        window = row["window"]
        want = _want(window, starts)
        if full:
            check_row({k: [row[k]] for k in FIELDS}, 0, want, SEQ_LEN)
        else:
            assert list(row["position_ids"]) == want["position_ids"]
            assert [float(v) for v in row["loss_mask"]] == want["loss_mask"]


@pytest.mark.parametrize("front", ["torch-0", "torch-2", "live", "grain-iter", "grain-source",
                                   "titan-rows", "titan-flat"])
@pytest.mark.parametrize("which", ["dataset", "mixture", "best-fit"])
def test_documents_in_every_front_end(front, which, data) -> None:
    urls, starts = data
    dataset = urls[which]
    if front.startswith("torch"):
        rows = _torch(dataset, int(front[-1]))
    elif front == "live":
        rows = _live(dataset)
    elif front == "grain-iter":
        rows = _grain_iter(dataset)
    elif front == "grain-source":
        rows = _grain_source(dataset)
    else:
        rows = _titan(dataset, front.split("-")[1], starts)
    assert [r["window"] for r in rows] == _plain_windows(dataset, STEPS)
    if front == "titan-flat":
        _check(rows, starts, full=False)
        for s in range(STEPS):
            step = rows[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH]
            want = [_want(r["window"], starts) for r in step]
            padded = np.array([w["offsets"] + [SEQ_LEN] * (SEQ_LEN + 1 - len(w["offsets"]))
                               for w in want], dtype=np.int32)
            assert step[0]["flat_cu"].tolist() == flat_cu_seqlens(padded).tolist()
    elif front == "titan-rows":
        _check(rows, starts, full=False)
        for r in rows:
            want = _want(r["window"], starts)["offsets"]
            assert r["cu_seqlens"].tolist()[:len(want)] == want
    else:
        _check(rows, starts)
