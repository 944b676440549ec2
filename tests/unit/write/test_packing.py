"""Token packing at conversion: windows equal the tokenized corpus, any worker count, errors.

A real byte-level BPE tokenizer is trained (tokenizers) on Python standard-library sources;
the corpus is paragraphs of other stdlib files, spread over JSONL inputs of very different
sizes so windows straddle inputs (one input is shorter than a window).
"""

from __future__ import annotations

import glob
import json
import os
import sysconfig

import numpy as np
import pytest

from tests.helpers import tree_digest
from zephon_store.cli.main import main
from zephon_store.errors import InputError, InputNotFoundError
from zephon_store.read.dataset import open_dataset
from zephon_store.read.verify import verify
from zephon_store.write import packing
from zephon_store.write.convert import convert
from zephon_store.write.packing import (
    PackingOptions,
    packing_convert_kwargs,
    resolve_special_tokens,
)
from zephon_store.write.shardwriter import WriteOptions

tokenizers = pytest.importorskip("tokenizers")

SEQ_LEN = 63  # windows of 64 tokens
SMALL = WriteOptions(target_shard_bytes=24 << 10, row_group_bytes=4 << 10)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def _stdlib_files() -> list[str]:
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    assert len(files) > 60, "the Python standard library sources are needed for this test"
    return files


def _train(path: str, texts: list[str], specials: list[str]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tok.save(path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(tokenizer.json, input folder, documents in input order)."""
    root = tmp_path_factory.mktemp("packing")
    files = _stdlib_files()
    train_texts = [open(f, encoding="utf-8", errors="replace").read() for f in files[:30]]
    tok_path = _train(str(root / "tok" / "tokenizer.json"), train_texts, [BOS, EOS, "<pad>"])
    src = root / "inputs"
    src.mkdir()
    docs_by_file = []
    # Sizes in paragraphs; "part-2" is tiny so a window spans it entirely.
    for k, (f, limit) in enumerate(zip(files[30:34], [400, 150, 2, 300])):
        text = open(f, encoding="utf-8", errors="replace").read()
        paras = [p for p in text.split("\n\n")][:limit]
        if k == 1:
            paras.insert(3, "")  # an empty document still gets BOS + EOS
        docs_by_file.append(paras)
        with open(src / f"part-{k}.jsonl", "w") as fh:
            for p in paras:
                fh.write(json.dumps({"text": p, "n": len(p)}) + "\n")
    docs = [d for ds in docs_by_file for d in ds]
    return tok_path, src, docs


def _expected_stream(tok_path: str, docs: list[str], bos=True, eos=True):
    """Tokens and global document starts, computed independently of zephon_store."""
    tok = tokenizers.Tokenizer.from_file(tok_path)
    b, e = tok.token_to_id(BOS), tok.token_to_id(EOS)
    stream, starts = [], []
    for d in docs:
        ids = ([b] if bos else []) + tok.encode(d, add_special_tokens=False).ids + \
            ([e] if eos else [])
        if ids:
            starts.append(len(stream))
        stream.extend(ids)
    return np.array(stream, dtype=np.int64), np.array(starts, dtype=np.int64)


def _convert(corpus, out, *, workers=1, seq_len=SEQ_LEN, **opts):
    tok_path, src, _ = corpus
    opts.setdefault("strategy", "concat")   # these tests check the concatenated stream
    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=seq_len, **opts))
    return convert([str(src)], str(out), options=SMALL, workers=workers, **kw)


@pytest.fixture(scope="module")
def packed(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "ds"
    res = _convert(corpus, out)
    return str(out), res


def test_windows_are_exactly_the_tokenized_corpus(corpus, packed):
    tok_path, _, docs = corpus
    url, res = packed
    w = SEQ_LEN + 1
    stream, starts = _expected_stream(tok_path, docs)
    n = len(stream) // w
    ds = open_dataset(url)
    assert res.num_samples == ds.num_samples == n > 100
    assert ds.manifest.num_shards > 2
    table = ds.take(range(n))
    windows = np.array(table.column("tokens").to_pylist())
    assert windows.shape == (n, w)
    assert np.array_equal(windows.reshape(-1), stream[: n * w])
    # doc_starts: the positions inside each window where a document begins.
    got = table.column("doc_starts").to_pylist()
    for k in range(n):
        exp = starts[(starts >= k * w) & (starts < (k + 1) * w)] - k * w
        assert got[k] == exp.tolist(), k
    assert verify(url, deep=True).ok


def test_manifest_records_packing(corpus, packed):
    tok_path, _, docs = corpus
    url, _ = packed
    stream, _ = _expected_stream(tok_path, docs)
    info = open_dataset(url).manifest.packing
    tok = tokenizers.Tokenizer.from_file(tok_path)
    w = SEQ_LEN + 1
    assert info["seq_len"] == SEQ_LEN and info["window"] == w
    assert info["tokenizer"]["file"] == "tokenizer.json"
    assert info["tokenizer"]["xxh3"] == packing.xxh3_file(tok_path)
    assert info["tokenizer"]["vocab_size"] == tok.get_vocab_size() == 600
    assert (info["bos_id"], info["eos_id"]) == (tok.token_to_id(BOS), tok.token_to_id(EOS))
    assert (info["bos_token"], info["eos_token"]) == (BOS, EOS)
    assert info["num_documents"] == len(docs)
    assert info["num_tokens"] == len(stream)
    assert info["num_windows"] == len(stream) // w
    assert info["dropped_tail_tokens"] == len(stream) % w
    assert info["doc_starts_column"] == "doc_starts"


def test_byte_identical_for_any_worker_count(corpus, packed, tmp_path):
    url, _ = packed
    reference = tree_digest(url)
    for workers in (2, 3):
        out = tmp_path / f"w{workers}"
        _convert(corpus, out, workers=workers)
        assert tree_digest(out) == reference, workers


def test_resume_reuses_staged_windows(corpus, packed, tmp_path, monkeypatch):
    from tests.helpers import CrashOnSecond

    url, _ = packed
    task = CrashOnSecond(packing._pack_file)
    calls = task.calls
    monkeypatch.setattr(packing, "_pack_file", task)
    _convert(corpus, tmp_path / "clean")
    every = list(calls)
    assert len(every) >= 3
    calls.clear()
    task.crash = True
    with pytest.raises(KeyboardInterrupt):
        _convert(corpus, tmp_path / "ds")
    calls.clear()
    task.crash = False
    _convert(corpus, tmp_path / "ds")
    # The input staged before the crash is reused; the crashed one is redone. (Inputs after
    # it may have been staged by the converter's second thread before the crash surfaced.)
    assert every[0] not in calls and every[1] in calls and set(calls) <= set(every[1:])
    assert tree_digest(tmp_path / "ds") == tree_digest(url)


def test_no_bos_no_eos_and_no_doc_starts(corpus, tmp_path):
    tok_path, _, docs = corpus
    res = _convert(corpus, tmp_path / "ds", seq_len=31, bos=False, eos=True, doc_starts=False)
    stream, _ = _expected_stream(tok_path, docs, bos=False, eos=True)
    ds = open_dataset(str(tmp_path / "ds"))
    assert ds.schema.names == ["tokens"]
    windows = np.array(ds.take(range(res.num_samples)).column("tokens").to_pylist())
    assert np.array_equal(windows.reshape(-1), stream[: windows.size])
    info = ds.manifest.doc["packing"]
    assert info["bos_id"] is None and info["doc_starts_column"] is None


def test_cli_convert_with_packing(corpus, packed, tmp_path, capsys):
    tok_path, src, _ = corpus
    url, _ = packed
    out = tmp_path / "cli"
    rc = main(["convert", str(src), "--output", str(out), "--tokenizer", tok_path,
               "--seq-len", str(SEQ_LEN), "--packing", "concat", "--target-shard-size", "24KiB",
               "--row-group-size", "4KiB", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_samples"] == open_dataset(url).num_samples
    assert tree_digest(out) == tree_digest(url)
    rc = main(["info", str(out), "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["packing"]["seq_len"] == SEQ_LEN


def test_special_tokens_from_tokenizer_config_or_options(corpus, tmp_path):
    tok_path, _, docs = corpus
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(open(tok_path, "rb").read())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<pad>"}, "eos_token": "<pad>"}))
    tok = tokenizers.Tokenizer.from_file(tok_path)
    special = resolve_special_tokens(PackingOptions(tokenizer=str(folder), seq_len=8))
    assert special.bos_id == special.eos_id == tok.token_to_id("<pad>")
    assert "tokenizer_config.json" in special.source
    special = resolve_special_tokens(PackingOptions(tokenizer=tok_path, seq_len=8, bos_id=5,
                                                    eos_token=BOS))
    assert (special.bos_id, special.eos_id) == (5, tok.token_to_id(BOS))


def test_missing_bos_is_a_clear_error(corpus, tmp_path):
    tok_path, _, _ = corpus
    bare = _train(str(tmp_path / "bare" / "tokenizer.json"), ["hello world"] * 10, ["<unk>"])
    with pytest.raises(ValueError, match=r"has no BOS token.*--no-bos"):
        packing_convert_kwargs(PackingOptions(tokenizer=bare, seq_len=8))
    kw = packing_convert_kwargs(PackingOptions(tokenizer=bare, seq_len=8, bos=False, eos=False))
    assert kw["extra_manifest"]["packing"]["eos_id"] is None
    with pytest.raises(ValueError, match="outside the vocabulary"):
        packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=8, bos_id=10**6))


def test_option_validation():
    with pytest.raises(ValueError, match="seq_len must be > 0, got 0"):
        PackingOptions(tokenizer="t.json", seq_len=0)
    with pytest.raises(ValueError, match="seq_len must be > 0, got -3"):
        PackingOptions(tokenizer="t.json", seq_len=-3)
    with pytest.raises(ValueError, match="seq_len must be an int"):
        PackingOptions(tokenizer="t.json", seq_len=2.5)
    with pytest.raises(ValueError, match="bos_token or bos_id, not both"):
        PackingOptions(tokenizer="t.json", seq_len=4, bos_token="<s>", bos_id=1)


def test_missing_tokenizer_file(tmp_path, corpus, capsys):
    _, src, _ = corpus
    with pytest.raises(InputNotFoundError, match="tokenizer file not found"):
        packing_convert_kwargs(PackingOptions(tokenizer=str(tmp_path / "nope.json"), seq_len=8))
    rc = main(["convert", str(src), "-o", str(tmp_path / "ds"), "--tokenizer",
               str(tmp_path / "nope.json"), "--seq-len", "8"])
    assert rc == 1 and "tokenizer file not found" in capsys.readouterr().err


def test_cli_rejects_bad_seq_len(corpus, tmp_path, capsys):
    tok_path, src, _ = corpus
    rc = main(["convert", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", tok_path,
               "--seq-len", "-1"])
    assert rc != 0 and "seq_len must be > 0" in capsys.readouterr().err


def test_missing_text_column_names_the_file(corpus, tmp_path):
    tok_path, _, _ = corpus
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.jsonl").write_text('{"body": "x"}\n')
    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=8))
    with pytest.raises(InputError, match=r"a\.jsonl: no column 'text'.*--text-column") as exc:
        convert([str(bad)], str(tmp_path / "ds"), **kw)
    assert exc.value.path.endswith("a.jsonl")


def test_too_few_tokens_for_one_window(corpus, tmp_path):
    tok_path, _, _ = corpus
    src = tmp_path / "tiny"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "x"}\n')
    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=100))
    with pytest.raises(InputError, match="fewer than one window"):
        convert([str(src)], str(tmp_path / "ds"), **kw)


def test_null_text_raises_or_is_skipped(corpus, tmp_path):
    tok_path, _, _ = corpus
    src = tmp_path / "nulls"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "def f(): pass"}\n{"text": null}\n' * 8)
    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=8))
    with pytest.raises(InputError, match="record 2: 'text' is null"):
        convert([str(src)], str(tmp_path / "a"), **kw)
    from zephon_store.ingest import InputOptions

    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=8))
    res = convert([str(src)], str(tmp_path / "b"), input_options=InputOptions(on_error="skip"),
                  **kw)
    assert res.skipped["schema_mismatch"] == 8
    assert open_dataset(str(tmp_path / "b")).manifest.doc["packing"]["num_documents"] == 8


def test_packing_totals_are_returned_not_written_in_place(corpus, packed, tmp_path):
    tok_path, src, docs = corpus
    url, res = packed
    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=SEQ_LEN,
                                               strategy="concat"))
    before = json.loads(json.dumps(kw["extra_manifest"]))
    first = convert([str(src)], str(tmp_path / "a"), options=SMALL, **kw)
    second = convert([str(src)], str(tmp_path / "b"), options=SMALL, **kw)   # the same kwargs
    assert kw["extra_manifest"] == before and "num_tokens" not in before["packing"]
    assert first.dataset_id == second.dataset_id == res.dataset_id
    info = open_dataset(str(tmp_path / "b")).manifest.packing
    stream, _ = _expected_stream(tok_path, docs)
    assert info["num_documents"] == len(docs) and info["num_tokens"] == len(stream)
    assert info["num_windows"] == res.num_samples
    assert {k: info[k] for k in before["packing"]} == before["packing"]
