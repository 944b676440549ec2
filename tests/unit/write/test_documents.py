"""The document table and best-fit packing, checked against brute force.

A real byte-level BPE tokenizer (tokenizers) is trained on Python standard-library sources;
the corpus is whole stdlib files and paragraphs of them (from empty to several windows long),
over inputs of very different sizes. Every document is tokenized again here, independently
of zephon_store, and compared with what its spans hold in the packed windows.
"""

from __future__ import annotations

import glob
import json
import os
import sysconfig

import numpy as np
import pytest
import xxhash

from tests.helpers import tree_digest
from zephon_store.errors import DocumentNotFoundError, NoDocumentTableError
from zephon_store.read.dataset import open_dataset
from zephon_store.read.documents import open_documents
from zephon_store.read.verify import verify
from zephon_store.write.convert import convert
from zephon_store.write.packing import PackingOptions, packing_convert_kwargs
from zephon_store.write.shardwriter import WriteOptions

tokenizers = pytest.importorskip("tokenizers")

SEQ_LEN = 127   # windows of 128 tokens
SMALL = WriteOptions(target_shard_bytes=48 << 10, row_group_bytes=8 << 10)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
PER_CHUNK = 37   # documents per chunk of the table here: many chunks, a short last one


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(tokenizer.json, input folder, [(input name, record, text)] in input order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("documents")
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    assert len(files) > 60, "the Python standard library sources are needed for this test"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([open(f, encoding="utf-8", errors="replace").read()
                             for f in files[:20]],
                            trainers.BpeTrainer(vocab_size=500, special_tokens=[BOS, EOS],
                                                show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(root / "tok")
    tok_path = str(root / "tok" / "tokenizer.json")
    tok.save(tok_path)
    src = root / "inputs"
    src.mkdir()
    docs = []
    for k, (f, limit) in enumerate(zip(files[20:25], [120, 3, 90, 1, 60])):
        text = open(f, encoding="utf-8", errors="replace").read()
        paras = text.split("\n\n")[:limit]
        if k == 0:
            paras[5] = ""                     # an empty document: BOS + EOS only
            paras[7] = text[:6000]            # several windows long: split
        with open(src / f"part-{k}.jsonl", "w") as fh:
            for r, p in enumerate(paras):
                fh.write(json.dumps({"text": p}) + "\n")
                docs.append((f"part-{k}.jsonl", r, p))
    return tok_path, src, docs


def _kwargs(tok_path, strategy, **opts):
    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=SEQ_LEN,
                                               strategy=strategy, **opts))
    kw["extra_manifest"] = {**kw["extra_manifest"], "documents_per_chunk": PER_CHUNK}
    return kw


def _convert(corpus, out, strategy, *, workers=1, **opts):
    tok_path, src, _ = corpus
    return convert([str(src)], str(out), options=SMALL, workers=workers, progress=False,
                   **_kwargs(tok_path, strategy, **opts))


@pytest.fixture(scope="module", params=["concat", "best-fit"])
def packed(request, corpus, tmp_path_factory):
    """(strategy, dataset) of the corpus; best-fit with buffers of 8 windows, so documents
    are packed over several buffers that cross input borders."""
    out = tmp_path_factory.mktemp("packed") / "ds"
    opts = {"buffer_windows": 8} if request.param == "best-fit" else {}
    _convert(corpus, out, request.param, **opts)
    return request.param, open_dataset(str(out))


def _tokenized(tok_path):
    tok = tokenizers.Tokenizer.from_file(tok_path)
    b, e = tok.token_to_id(BOS), tok.token_to_id(EOS)
    return lambda text: [b] + tok.encode(text, add_special_tokens=False).ids + [e]


def _windows(ds) -> np.ndarray:
    t = ds.take(range(ds.num_samples))
    return np.stack(t.column("tokens").to_numpy(zero_copy_only=False)).astype(np.int64)


def test_every_document_rebuilt_from_its_spans_is_its_tokenization(corpus, packed):
    strategy, ds = packed
    tok_path, _, docs = corpus
    encode = _tokenized(tok_path)
    windows = _windows(ds)
    table = open_documents(ds)
    assert table.num_documents == len(docs) and table.num_chunks == -(-len(docs) // PER_CHUNK)
    split, end = 0, 0
    kept = ds.manifest.packing["packed_tokens"]
    for d, (name, record, text) in enumerate(docs):
        doc = table.document(d)
        assert (doc.input, doc.record) == (name, record)
        want = encode(text)
        assert doc.num_tokens == len(want)
        assert doc.xxh3 == xxhash.xxh3_128_hexdigest(text.encode())
        got = [t for s in doc.spans for t in windows[s.window, s.offset:s.offset + s.length]]
        if strategy == "best-fit":
            assert got == want, (name, record)
            # Split only when longer than a window: into window-sized pieces and a rest.
            assert len(doc.spans) == -(-len(want) // (SEQ_LEN + 1))
        else:   # documents back to back; only the dropped tail is in no window
            assert got == want[:max(0, min(len(want), kept - end))]
        end += len(want)
        split += len(doc.spans) > 1
    assert split == ds.manifest.packing["documents_split"] > 0


def test_spans_tile_the_windows_and_padding_is_counted(packed):
    strategy, ds = packed
    windows = _windows(ds)
    table = open_documents(ds)
    p = ds.manifest.packing
    w = SEQ_LEN + 1
    covered = np.zeros(ds.num_samples, np.int64)
    by_window = {}
    for d in range(table.num_documents):
        for s in table.document(d).spans:
            covered[s.window] += s.length
            by_window.setdefault(s.window, []).append((s.offset, s.length, d))
    for k in range(ds.num_samples):
        segs = sorted(by_window.get(k, []))
        ends = [o + n for o, n, _ in segs]
        assert all(o >= e for (o, _, _), e in zip(segs[1:], ends))   # no overlap
        if strategy == "concat":
            assert covered[k] == w and segs[0][0] == 0
    if strategy == "best-fit":
        num_tokens = np.array(ds.take(range(ds.num_samples)).column("num_tokens").to_pylist())
        assert np.array_equal(covered, num_tokens)
        pad = np.arange(w)[None, :] >= num_tokens[:, None]
        assert np.all(windows[pad] == p["pad_id"]) and p["pad_id"] == p["eos_id"]
        assert p["padded_tokens"] == int(pad.sum()) and p["dropped_tail_tokens"] == 0
        # doc_starts: every segment's start, so each piece is its own attention block.
        starts = ds.take(range(ds.num_samples)).column("doc_starts").to_pylist()
        assert starts == [[o for o, _, _ in sorted(by_window.get(k, []))]
                          for k in range(ds.num_samples)]
    else:
        assert p["padded_tokens"] == 0
    assert p["packed_tokens"] == p["num_windows"] * w == covered.sum() + p["padded_tokens"]


def test_window_spans_equal_a_scan_of_every_document(packed):
    _, ds = packed
    table = open_documents(ds)
    every = [(s.window, s.offset, d, s.length) for d in range(table.num_documents)
             for s in table.document(d).spans]
    for wins in ([0], [3, 1, 3], list(range(ds.num_samples)), [ds.num_samples - 1]):
        got = table.window_spans(wins)
        want = sorted(e for e in every if e[0] in set(wins))
        assert list(zip(got.window.tolist(), got.offset.tolist(), got.document.tolist(),
                        got.length.tolist())) == want
    spans = table.spans([4, 0])
    assert spans.document.tolist() == [4] * len(table.document(4).spans) + [0] * len(
        table.document(0).spans)


def test_lookups_by_input_record_and_text_hash(corpus, packed):
    _, ds = packed
    _, _, docs = corpus
    table = open_documents(ds)
    assert table.inputs == [f"part-{k}.jsonl" for k in range(5)]
    for d in (0, 7, 121, len(docs) - 1):
        name, record, text = docs[d]
        assert table.find(name, record).id == d
        h = xxhash.xxh3_128_hexdigest(text.encode())
        assert d in [x.id for x in table.find_text("xxh3:" + h)]
        assert [x.id for x in table.resolve([f"{name}:{record}", {"input": name,
                                                                   "record": record}])] == [d, d]
    with pytest.raises(DocumentNotFoundError, match="part-1.jsonl has no document at record 9"):
        table.find("part-1.jsonl", 9)
    with pytest.raises(DocumentNotFoundError, match="no input 'nope.jsonl'"):
        table.find("nope.jsonl", 0)
    with pytest.raises(DocumentNotFoundError, match="hashes to"):
        table.resolve([{"xxh3": "0" * 32}])
    with pytest.raises(ValueError, match="INPUT:RECORD"):
        table.resolve(["part-0.jsonl"])
    assert open_documents(ds) is table   # one table per opened dataset


def test_verify_checks_the_document_table_and_catches_a_damaged_chunk(packed, tmp_path):
    import shutil

    from zephon_store import gc

    _, ds = packed
    clean = verify(ds.url, deep=True)
    assert clean.ok and clean.findings == []    # its chunks are referenced: no orphan
    copy = tmp_path / "copy"
    shutil.copytree(ds.url, copy)
    assert gc(str(copy)).removed == []          # gc keeps every chunk of the table
    table = open_documents(ds)
    _flip_a_byte(copy / "index" / f"{table._digests[2]}.arrow")
    report = verify(str(copy))
    assert not report.ok
    assert [f.kind for f in report.findings] == ["document_chunk"]
    assert "document chunk 2" in report.findings[0].message
    with pytest.raises(Exception, match="xxh3"):
        open_documents(open_dataset(str(copy))).document(2 * PER_CHUNK)


def test_verify_catches_a_damaged_document_index(packed, tmp_path):
    import shutil

    _, ds = packed
    copy = tmp_path / "copy"
    shutil.copytree(ds.url, copy)
    ref = ds.manifest.doc["tables"]["documents"]
    path = copy / ref["path"]
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    report = verify(str(copy))
    assert [f.kind for f in report.findings if f.severity == "error"] == ["document_table"]
    assert "xxh3" in report.findings[0].message


def test_best_fit_is_byte_identical_for_1_2_and_8_workers(corpus, tmp_path):
    trees = []
    for workers in (1, 2, 8):
        _convert(corpus, tmp_path / f"w{workers}", "best-fit", workers=workers,
                 buffer_windows=8)
        trees.append(tree_digest(tmp_path / f"w{workers}"))
    assert len(trees[0]) > 8 and trees[1] == trees[0] and trees[2] == trees[0]


def test_unpacked_and_older_datasets_have_no_document_table(tmp_path):
    from tests.helpers import ROOT

    with pytest.raises(NoDocumentTableError, match="holds records, not packed token windows"):
        open_documents(os.path.join(ROOT, "formats", "golden", "v6", "text"))
    with pytest.raises(NoDocumentTableError, match="format v5 writer"):
        _v5_packed(tmp_path)


def _v5_packed(tmp_path):
    """A packed dataset as format v5 wrote it: its manifest without the document table."""
    import shutil

    from tests.helpers import ROOT
    from zephon_store.format.manifest import compute_dataset_id

    src = os.path.join(ROOT, "formats", "golden", "v6", "packed")
    shutil.copytree(src, tmp_path / "v5")
    doc = json.loads((tmp_path / "v5" / "manifest.json").read_text())
    for key in ("documents", "document_inputs", "document_hashes"):
        del doc["tables"][key]
    del doc["documents_per_chunk"]
    doc["format_version"] = 5
    doc["dataset_id"] = compute_dataset_id(doc)
    (tmp_path / "v5" / "manifest.json").write_text(json.dumps(doc))
    return open_documents(str(tmp_path / "v5"))


@pytest.mark.parametrize("strategy", ["concat", "best-fit"])
def test_cli_convert_packing_and_info_report_the_documents(corpus, tmp_path, capsys, strategy):
    from zephon_store.cli.main import main

    tok_path, src, docs = corpus
    out = str(tmp_path / "ds")
    assert main(["convert", str(src), "-o", out, "--tokenizer", tok_path, "--seq-len",
                 str(SEQ_LEN), "--packing", strategy, "--buffer-windows", "8", "--json"]) == 0
    p = open_dataset(out).manifest.packing
    assert p["strategy"] == strategy and p["num_documents"] == len(docs)
    assert p["buffer_windows"] == (8 if strategy == "best-fit" else None)
    capsys.readouterr()
    assert main(["info", out]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("documents"))
    assert line == (f"documents {len(docs)} ({p['documents_split']} split into "
                    f"{p['split_pieces']} pieces), {p['num_tokens']} tokens in "
                    f"{p['num_windows']} windows; padded {p['padded_tokens']} tokens, dropped a "
                    f"tail of {p['dropped_tail_tokens']} tokens ({strategy})")
    assert (p["padded_tokens"] > 0) == (strategy == "best-fit")
    assert (p["dropped_tail_tokens"] > 0) == (strategy == "concat")


def test_cli_packing_needs_a_tokenizer(corpus, tmp_path, capsys):
    from zephon_store.cli.main import main

    tok_path, src, _ = corpus
    assert main(["convert", str(src), "-o", str(tmp_path / "x"), "--packing", "best-fit"]) == 2
    assert "--packing and --buffer-windows need --tokenizer and --seq-len" in \
        capsys.readouterr().err


def test_best_fit_resume_reuses_staged_buffers(corpus, tmp_path, monkeypatch):
    """A best-fit conversion killed while packing, rerun, reuses the inputs packed before the
    crash and writes the bytes of an uninterrupted run."""
    from tests.helpers import CrashOnSecond
    from zephon_store.write import packing

    task = CrashOnSecond(packing.stage_buffers)
    calls = task.calls
    monkeypatch.setattr(packing, "stage_buffers", task)
    _convert(corpus, tmp_path / "clean", "best-fit", buffer_windows=8)
    every = list(calls)
    assert len(every) == 5
    calls.clear()
    task.crash = True
    with pytest.raises(KeyboardInterrupt):
        _convert(corpus, tmp_path / "ds", "best-fit", buffer_windows=8)
    calls.clear()
    task.crash = False
    _convert(corpus, tmp_path / "ds", "best-fit", buffer_windows=8)
    assert every[0] not in calls and every[1] in calls
    assert tree_digest(tmp_path / "ds") == tree_digest(tmp_path / "clean")


def test_best_fit_is_the_default(corpus, tmp_path):
    """Chosen by measurement (docs/packing.md): a conversion that names no strategy packs
    best-fit, in the CLI and in the Python API."""
    from zephon_store.cli.main import main

    tok_path, src, _ = corpus
    assert PackingOptions(tokenizer=tok_path, seq_len=8).strategy == "best-fit"
    out = str(tmp_path / "ds")
    assert main(["convert", str(src), "-o", out, "--tokenizer", tok_path, "--seq-len",
                 str(SEQ_LEN), "--json"]) == 0
    p = open_dataset(out).manifest.packing
    assert p["strategy"] == "best-fit" and p["buffer_windows"] == 4096


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(format_version=5), "format_version 5 manifest cannot name a document "
                                            "table"),
    (lambda d: d["tables"].pop("document_inputs"), "names tables.documents without "
                                                   "tables.document_inputs"),
    (lambda d: d.pop("documents_per_chunk"), "documents_per_chunk is None"),
    (lambda d: d.update(documents_per_chunk=0), "documents_per_chunk is 0"),
    (lambda d: d.update(documents_per_chunk=4), "chunks do not hold 4 documents each"),
])
def test_a_forged_document_table_entry_is_refused(tmp_path, edit, message):
    """The manifest's document-table keys are checked before the table is used, and verify
    reports them (formats/SPEC.md 4.2)."""
    import shutil

    from tests.helpers import ROOT, reseal
    from zephon_store.errors import ManifestError

    ds = tmp_path / "ds"
    shutil.copytree(os.path.join(ROOT, "formats", "golden", "v6", "bestfit"), ds)
    reseal(ds, edit)
    with pytest.raises(ManifestError, match=message):
        open_documents(str(ds))
    assert not verify(str(ds)).ok


def test_the_text_hash_index_does_not_depend_on_how_it_was_sorted(corpus, tmp_path,
                                                                  monkeypatch):
    """The hash index is built in groups of buckets sorted one at a time (memory bounded);
    any group size writes the same bytes, and every document is found by its text hash."""
    from zephon_store.write import hashindex

    _convert(corpus, tmp_path / "one", "best-fit", buffer_windows=8)
    monkeypatch.setattr(hashindex, "GROUP_PAIRS", 50)   # 8 buckets in 8 groups
    _convert(corpus, tmp_path / "many", "best-fit", buffer_windows=8)
    assert tree_digest(tmp_path / "many") == tree_digest(tmp_path / "one")
    _, _, docs = corpus
    table = open_documents(str(tmp_path / "many"))
    assert table._hash_bits == 3
    by_text: dict[str, list[int]] = {}
    for d, (_, _, text) in enumerate(docs):
        by_text.setdefault(xxhash.xxh3_128_hexdigest(text.encode()), []).append(d)
    for h, ids in by_text.items():
        assert [x.id for x in table.find_text(h)] == ids
    assert table.find_text("f" * 32) == []


def test_verify_catches_a_damaged_hash_bucket(packed, tmp_path):
    import shutil

    _, ds = packed
    copy = tmp_path / "copy"
    shutil.copytree(ds.url, copy)
    table = open_documents(ds)
    _flip_a_byte(copy / "index" / f"{table._hash_digests[1]}.arrow")
    report = verify(str(copy))
    assert [f.kind for f in report.findings] == ["document_hashes"]


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
