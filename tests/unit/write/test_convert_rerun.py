"""A rerun of convert over its own finished output reads no input and writes nothing, and
says what it reused (issue 41 item 3); any change (an input edited in place, a new input,
other options, a damaged shard) is a real convert again."""

from __future__ import annotations

import json
import os

import zephon_store as z
from tests.helpers import run_cli, tree_digest, write_jsonl_corpus
from zephon_store.write.convert import _default_parse
from zephon_store.write.rerun import RECORD_NAME

_LOG = "ZEPHON_TEST_PARSE_LOG"


def logged_parse(f, options, storage_options, stats):
    """The default parse, noting each input it reads in the file ``$ZEPHON_TEST_PARSE_LOG``."""
    with open(os.environ[_LOG], "a") as log:
        log.write(f.url + "\n")
    return _default_parse(f, options, storage_options, stats)


def _convert(inputs, out, **kw):
    return z.convert(inputs, str(out), options=z.WriteOptions(row_group_rows=50,
                                                               target_shard_bytes=20_000),
                     parse_fn=logged_parse, **kw)


def _parsed(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _setup(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    write_jsonl_corpus(corpus, files=3, records=300)
    log = tmp_path / "parsed.log"
    monkeypatch.setenv(_LOG, str(log))
    return corpus, log


def test_a_rerun_over_its_own_output_reads_no_input(tmp_path, monkeypatch) -> None:
    corpus, log = _setup(tmp_path, monkeypatch)
    first = _convert([str(corpus)], tmp_path / "out")
    assert first.inputs_reused == 0 and first.shards_reused == 0 and len(_parsed(log)) == 3
    before = tree_digest(tmp_path / "out")
    log.unlink()

    again = _convert([str(corpus)], tmp_path / "out", workers=2)
    assert _parsed(log) == []                       # no input was read
    assert again.dataset_id == first.dataset_id and again.num_samples == first.num_samples
    assert (again.inputs_reused, again.shards_reused) == (3, first.num_shards)
    assert again.unchanged and set(again.stages) == {"plan"} and not first.unchanged
    assert tree_digest(tmp_path / "out") == before  # nothing written
    assert z.verify(str(tmp_path / "out")).ok


def test_the_record_is_the_same_for_two_outputs_of_the_same_inputs(tmp_path, monkeypatch) -> None:
    corpus, _ = _setup(tmp_path, monkeypatch)
    _convert([str(corpus)], tmp_path / "a", workers=1)
    _convert([str(corpus)], tmp_path / "b", workers=2)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    record = json.loads((tmp_path / "a" / RECORD_NAME).read_text())
    assert set(record) == {"format", "dataset_id", "job"}
    assert str(tmp_path) not in json.dumps(record)


def test_an_input_edited_in_place_is_converted_again(tmp_path, monkeypatch) -> None:
    corpus, log = _setup(tmp_path, monkeypatch)
    first = _convert([str(corpus)], tmp_path / "out")
    victim = sorted(corpus.iterdir())[1]
    data = victim.read_bytes()
    victim.write_bytes(data.replace(b"a", b"b", 1))   # same size, other bytes, newer mtime
    os.utime(victim, ns=(os.stat(victim).st_atime_ns, os.stat(victim).st_mtime_ns + 10**9))
    log.unlink()
    again = _convert([str(corpus)], tmp_path / "out", overwrite=True)
    assert len(_parsed(log)) == 3 and again.dataset_id != first.dataset_id
    assert again.inputs_reused == 0
    log.unlink()
    third = _convert([str(corpus)], tmp_path / "out")   # and the new output is recorded
    assert _parsed(log) == [] and third.dataset_id == again.dataset_id


def test_other_options_or_a_new_input_convert_again(tmp_path, monkeypatch) -> None:
    corpus, log = _setup(tmp_path, monkeypatch)
    _convert([str(corpus)], tmp_path / "out")
    log.unlink()
    (corpus / "part-9.jsonl").write_text('{"id": 9, "text": "new"}\n')
    again = _convert([str(corpus)], tmp_path / "out", overwrite=True)
    assert len(_parsed(log)) == 4 and again.input_files == 4


def test_a_damaged_shard_is_rewritten_not_reused(tmp_path, monkeypatch) -> None:
    corpus, log = _setup(tmp_path, monkeypatch)
    first = _convert([str(corpus)], tmp_path / "out")
    assert first.num_shards > 1
    shard = sorted((tmp_path / "out" / "shards").iterdir())[0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    log.unlink()
    again = _convert([str(corpus)], tmp_path / "out")
    assert len(_parsed(log)) == 3                          # the inputs were read again ...
    assert again.shards_reused == first.num_shards - 1     # ... and only the damage rewritten
    assert z.verify(str(tmp_path / "out"), deep=True).ok


def test_the_cli_says_what_it_reused(tmp_path, monkeypatch, capsys) -> None:
    corpus, _ = _setup(tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert run_cli(capsys, "convert", corpus, "--output", out)[0] == 0
    code, stdout, _ = run_cli(capsys, "convert", corpus, "--output", out)
    assert code == 0
    assert "nothing to do: the output already holds this conversion of 3 unchanged inputs" \
        in stdout
    code, stdout, _ = run_cli(capsys, "convert", corpus, "--output", out, "--json")
    summary = json.loads(stdout)
    assert summary["unchanged"] is True and summary["inputs_reused"] == 3 and summary["shards_reused"] == summary["num_shards"]


def test_inputs_without_a_version_are_never_taken_for_unchanged(tmp_path) -> None:
    """memory:// lists no ETag: a same-size rewrite must not pass for unchanged."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/rerun-41/a.jsonl", b'{"id": 1, "text": "aaaa"}\n')
    first = z.convert(["memory:///rerun-41/a.jsonl"], str(tmp_path / "out"))
    assert not (tmp_path / "out" / RECORD_NAME).exists()
    fs.pipe("/rerun-41/a.jsonl", b'{"id": 1, "text": "bbbb"}\n')
    again = z.convert(["memory:///rerun-41/a.jsonl"], str(tmp_path / "out"), overwrite=True)
    assert not again.unchanged and again.dataset_id != first.dataset_id
    fs.rm("/rerun-41", recursive=True)


def test_a_rerun_with_nothing_to_do_still_sweeps_a_killed_cleanup(tmp_path, monkeypatch) -> None:
    """A convert killed while it removed its finished job (renamed to ``.<job>.trash.<pid>``)
    leaves that folder behind; the rerun that then finds nothing to do removes it (it
    returned at once and left it, seen on an Azure output: issue 44)."""
    corpus, _ = _setup(tmp_path, monkeypatch)
    staging = tmp_path / "staging"
    first = _convert([str(corpus)], tmp_path / "out", staging_dir=str(staging))
    trash = staging / ".0123456789abcdef.trash.999999.abc123"
    (trash / "parsed").mkdir(parents=True)
    (trash / "parsed" / "x.arrow").write_bytes(b"left by a killed cleanup")
    again = _convert([str(corpus)], tmp_path / "out", staging_dir=str(staging))
    assert again.unchanged and again.dataset_id == first.dataset_id
    assert not trash.exists() and os.listdir(staging) == []
