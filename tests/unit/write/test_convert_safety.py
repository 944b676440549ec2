"""Convert's write path under misuse and crashes (issue 14): locking, verified reuse, output
inside the input, replacing a dataset, orphans and gc, staging hygiene, Ctrl-C, ENOSPC."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.helpers import ROOT, tree_digest, write_jsonl_corpus
from zephon_store import convert, open_dataset
from zephon_store.cli.main import main
from zephon_store.errors import ZephonError
from zephon_store.read.verify import verify
from zephon_store.write.shardwriter import WriteOptions

SMALL = WriteOptions(target_shard_bytes=16 << 10, row_group_bytes=4 << 10)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    write_jsonl_corpus(d, files=3, records=150, seed=5)
    return d


def _flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _staging(out):
    return out / ".zephon-staging"


def _crash_at_publish(monkeypatch):
    """Make the next convert die right before its manifest (staging and shards stay)."""
    import zephon_store.write.convert as conv

    def boom(*a, **k):
        raise KeyboardInterrupt("simulated crash before publish")

    monkeypatch.setattr(conv, "publish_manifest", boom)


# -- 1. locking ---------------------------------------------------------------------------------

def test_second_convert_fails_while_the_lock_is_held_naming_holder(src, tmp_path):
    from zephon_store.io.storage import Storage
    from zephon_store.write.lock import LOCK_NAME, output_lock

    out = tmp_path / "ds"
    with output_lock(Storage(str(out))):
        with pytest.raises(ZephonError) as e:
            convert([str(src)], str(out), options=SMALL)
    msg = str(e.value)
    assert f"pid {os.getpid()}" in msg and "another convert" in msg and str(out) in msg
    assert LOCK_NAME in msg and "wait for it" in msg
    assert not (out / "manifest.json").exists() and not _staging(out).exists()
    convert([str(src)], str(out), options=SMALL)  # released: the next one runs
    assert not (out / LOCK_NAME).exists()


def test_lock_left_by_a_killed_convert_is_taken_over(src, tmp_path, caplog):
    from zephon_store.write.lock import LOCK_NAME

    out = tmp_path / "ds"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (out / LOCK_NAME).write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename,
                                             "since": "2026-01-01T00:00:00Z", "token": "x"}))
    with caplog.at_level("WARNING"):
        convert([str(src)], str(out), options=SMALL)
    assert f"pid {int(dead.stdout)}" in caplog.text and "taking over" in caplog.text
    assert verify(str(out)).ok and not (out / LOCK_NAME).exists()


def test_two_converts_at_once_one_wins_the_other_fails_clearly(src, tmp_path):
    """Real processes: A holds the lock (it waits in its parse phase at a FIFO gate) while B
    runs the CLI into the same output; B fails naming A; A finishes; the result verifies."""
    from tests.helpers.gate import open_gate_for_writing

    out, gate = tmp_path / "ds", tmp_path / "gate"
    os.mkfifo(gate)
    env = dict(os.environ, ZEPHON_TEST_GATE=str(gate), PYTHONPATH=ROOT)
    a = subprocess.Popen(
        [sys.executable, "-c", "import sys; from zephon_store import convert; "
         "from tests.helpers.gate import gated_parse; "
         "convert([sys.argv[1]], sys.argv[2], parse_fn=gated_parse)",
         str(src / "part-000.jsonl"), str(out)], env=env, cwd=ROOT,
        stderr=subprocess.PIPE, text=True)
    try:
        with open_gate_for_writing(str(gate)):
            b = subprocess.run([sys.executable, "-m", "zephon_store.cli.main", "convert",
                                str(src / "part-000.jsonl"), "-o", str(out)], env=env, cwd=ROOT,
                               capture_output=True, text=True)
        assert a.wait(60) == 0, a.stderr.read()
    finally:
        a.kill()
    assert b.returncode == 1
    assert f"another convert (pid {a.pid} on host" in b.stderr and str(out) in b.stderr
    assert "Traceback" not in b.stderr and len(b.stderr.strip().splitlines()) == 1
    report = verify(str(out), deep=True)
    assert report.ok and not report.findings, report.findings
    assert open_dataset(str(out)).num_samples == 150


# -- 1/2. reuse only verified bytes --------------------------------------------------------------

def test_reconvert_repairs_a_damaged_shard_and_side_table(src, tmp_path):
    out = tmp_path / "ds"
    first = convert([str(src)], str(out), options=SMALL)
    clean = tree_digest(out)
    shard = sorted((out / "shards").iterdir())[1]
    table = sorted((out / "index").iterdir())[0]
    _flip_byte(shard)
    _flip_byte(table)
    assert not verify(str(out)).ok
    again = convert([str(src)], str(out), options=SMALL)
    assert again.dataset_id == first.dataset_id
    assert tree_digest(out) == clean and verify(str(out)).ok


def test_resume_does_not_trust_a_receipt_whose_shard_was_damaged(src, tmp_path, monkeypatch):
    out = tmp_path / "ds"
    ref = convert([str(src)], str(tmp_path / "ref"), options=SMALL)
    with monkeypatch.context() as m:
        _crash_at_publish(m)
        with pytest.raises(KeyboardInterrupt):
            convert([str(src)], str(out), options=SMALL)
    assert list(_staging(out).glob("*/done/*.json"))  # receipts survived the crash
    for shard in sorted((out / "shards").iterdir())[:2]:
        _flip_byte(shard)
    res = convert([str(src)], str(out), options=SMALL)
    assert res.dataset_id == ref.dataset_id and res.shards_reused < ref.num_shards
    assert tree_digest(out) == tree_digest(tmp_path / "ref") and verify(str(out)).ok


# -- 4. output inside the input -------------------------------------------------------------------

def test_output_inside_input_is_never_read_back(tmp_path, monkeypatch):
    src = tmp_path / "src"
    records = write_jsonl_corpus(src, files=2, records=100, seed=9)
    out = src / "out"
    first = convert([str(src)], str(out), options=SMALL)
    assert first.num_samples == len(records)
    again = convert([str(src)], str(out), options=SMALL)  # plain rerun
    assert again.dataset_id == first.dataset_id
    (out / "manifest.json").unlink()  # as if the last run crashed before publishing
    with monkeypatch.context() as m:
        _crash_at_publish(m)
        with pytest.raises(KeyboardInterrupt):
            convert([str(src)], str(out), options=SMALL)
    res = convert([str(src)], str(out), options=SMALL)
    assert res.num_samples == len(records) and res.dataset_id == first.dataset_id
    assert open_dataset(str(out)).take(range(len(records))).to_pylist() == records


def test_a_dataset_inside_the_input_folder_is_skipped(tmp_path):
    src = tmp_path / "src"
    records = write_jsonl_corpus(src, files=2, records=50, seed=1)
    convert([str(src)], str(tmp_path / "other"), options=SMALL)
    shutil.copytree(tmp_path / "other", src / "nested" / "ds")
    res = convert([str(src)], str(tmp_path / "ds"), options=SMALL)
    assert res.num_samples == len(records) and res.input_files == 2


# -- 5. a different dataset in the output, orphans, gc ----------------------------------------

@pytest.fixture
def two_corpora(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_jsonl_corpus(a, files=2, records=80, seed=1)
    write_jsonl_corpus(b, files=2, records=90, seed=2)
    return a, b


def test_converting_a_different_dataset_into_an_output_is_refused(two_corpora, tmp_path):
    a, b = two_corpora
    out = tmp_path / "ds"
    first = convert([str(a)], str(out), options=SMALL)
    before = tree_digest(out)
    # Other inputs: refused before anything is parsed or staged.
    with pytest.raises(FileExistsError) as e:
        convert([str(b)], str(out), options=SMALL)
    assert "overwrite" in str(e.value) and first.dataset_id in str(e.value)
    assert tree_digest(out) == before and not _staging(out).exists()
    # Same sizes and options, other bytes: found at publish, and the new shards go again.
    edited = tmp_path / "edited"
    shutil.copytree(a, edited)
    part = edited / "part-000.jsonl"
    part.write_bytes(part.read_bytes().replace(b"alpha", b"ALPHA", 1))
    with pytest.raises(FileExistsError, match="overwrite"):
        convert([str(edited)], str(out), options=SMALL)
    assert tree_digest(out) == before  # untouched: no new shards left behind either
    assert open_dataset(str(out)).dataset_id == first.dataset_id


def test_overwrite_replaces_and_removes_what_only_the_old_manifest_owned(two_corpora, tmp_path):
    a, b = two_corpora
    out = tmp_path / "ds"
    convert([str(a)], str(out), options=SMALL)
    res = convert([str(b)], str(out), options=SMALL, overwrite=True)
    assert tree_digest(out) == tree_digest(_fresh(b, tmp_path / "fresh"))
    report = verify(str(out))
    assert report.ok and not report.findings
    assert open_dataset(str(out)).dataset_id == res.dataset_id


def _fresh(src, out):
    convert([str(src)], str(out), options=SMALL)
    return out


def test_verify_reports_orphans_as_warnings_and_gc_removes_them(src, tmp_path, capsys):
    out = tmp_path / "ds"
    convert([str(src)], str(out), options=SMALL)
    clean = tree_digest(out)
    (out / "shards" / ("ab" * 16 + ".parquet")).write_bytes(b"left over")
    (out / "index" / ("cd" * 16 + ".arrow")).write_bytes(b"left over too")
    report = verify(str(out))
    orphans = [f for f in report.findings if f.kind == "orphan"]
    assert report.ok and len(orphans) == 2 and all(f.severity == "warning" for f in orphans)
    assert main(["verify", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and {f["kind"] for f in doc["findings"]} == {"orphan"}

    assert main(["gc", str(out), "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert sorted(dry["removed"]) == ["index/" + "cd" * 16 + ".arrow",
                                      "shards/" + "ab" * 16 + ".parquet"]
    assert dry["dry_run"] and (out / "shards" / ("ab" * 16 + ".parquet")).exists()
    assert main(["gc", str(out)]) == 0
    # Sizes in units, as the cache commands print them (issue 41 item 10).
    assert re.search(r"removed 2 file\(s\), [\d.]+ (B|KiB), from ", capsys.readouterr().out)
    assert tree_digest(out) == clean and not verify(str(out)).findings


def test_gc_refuses_while_a_convert_holds_the_lock(src, tmp_path, capsys):
    from zephon_store.io.storage import Storage
    from zephon_store.write.gc import gc
    from zephon_store.write.lock import output_lock

    out = tmp_path / "ds"
    convert([str(src)], str(out), options=SMALL)
    (out / "shards" / ("ab" * 16 + ".parquet")).write_bytes(b"in flight")
    with output_lock(Storage(str(out))):
        assert main(["gc", str(out)]) == 1
        assert "another convert" in capsys.readouterr().err
        with pytest.raises(ZephonError):
            gc(str(out))
    assert (out / "shards" / ("ab" * 16 + ".parquet")).exists()
    assert main(["gc", str(tmp_path / "nothing-here")]) == 1


# -- 12 and 15: staging hygiene ----------------------------------------------------------------------

def test_crash_during_staging_cleanup_reruns_as_a_noop(src, tmp_path, monkeypatch):
    import zephon_store.write.convert as conv

    out = tmp_path / "ds"
    kept = tmp_path / "kept"
    real = conv.publish_manifest

    def publish_and_keep_staging(*a, **k):
        result = real(*a, **k)
        shutil.copytree(_staging(out), kept)
        return result

    with monkeypatch.context() as m:
        m.setattr(conv, "publish_manifest", publish_and_keep_staging)
        first = convert([str(src)], str(out), options=SMALL)
    published = tree_digest(out)
    # A cleanup killed half way: the staging folder is back with some of its files gone.
    shutil.copytree(kept, _staging(out), dirs_exist_ok=True)
    for arrow in sorted(_staging(out).glob("*/parsed/*.arrow"))[:2]:
        arrow.unlink()
    for receipt in sorted(_staging(out).glob("*/done/*.json"))[:2]:
        receipt.unlink()
    again = convert([str(src)], str(out), options=SMALL)
    assert again.dataset_id == first.dataset_id and tree_digest(out) == published
    assert not _staging(out).exists()


def test_staging_of_a_stale_option_set_is_removed_and_no_empty_folder_is_left(src, tmp_path,
                                                                              monkeypatch):
    out = tmp_path / "ds"
    with monkeypatch.context() as m:
        _crash_at_publish(m)
        with pytest.raises(KeyboardInterrupt):
            convert([str(src)], str(out), options=WriteOptions(target_shard_bytes=8 << 10))
    assert len(os.listdir(_staging(out))) == 1
    convert([str(src)], str(out), options=SMALL, overwrite=True)
    assert not _staging(out).exists()


def test_cache_info_and_clear_count_staging(src, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    staging = tmp_path / "cache" / "staging"
    with monkeypatch.context() as m:
        _crash_at_publish(m)
        with pytest.raises(KeyboardInterrupt):
            convert([str(src)], str(tmp_path / "ds"), options=SMALL,
                    staging_dir=str(staging))
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["staging_jobs"] == 1 and info["staging_bytes"] > 0
    assert info["staging_dir"] == str(staging)
    assert main(["cache", "clear", "--json"]) == 0
    cleared = json.loads(capsys.readouterr().out)
    assert cleared["cleared_staging_bytes"] == info["staging_bytes"]
    assert not staging.exists() or not os.listdir(staging)


# -- 15: Ctrl-C with workers, ENOSPC ---------------------------------------------------------------

def test_ctrl_c_with_workers_prints_one_line_and_exits_130(src, tmp_path):
    from tests.helpers.gate import open_gate_for_writing

    gate = tmp_path / "gate"
    os.mkfifo(gate)
    # A shell starts a background job with SIGINT ignored, and a Python started so never
    # raises KeyboardInterrupt: the child takes the handler a terminal's foreground job has.
    script = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "import zephon_store.write.convert as c; from tests.helpers.gate import gated_parse; "
              "from zephon_store.cli.main import main; real = c.convert; "
              "c.convert = lambda *a, **k: real(*a, parse_fn=gated_parse, **k); "
              "sys.exit(main(sys.argv[1:]))")
    p = subprocess.Popen([sys.executable, "-c", script, "convert", str(src), "-o",
                          str(tmp_path / "ds"), "--workers", "2"],
                         env=dict(os.environ, ZEPHON_TEST_GATE=str(gate), PYTHONPATH=ROOT),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        with open_gate_for_writing(str(gate)):
            os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
            _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines() == [
        "zephon convert: interrupted; rerun the same command to resume"]


@pytest.mark.parametrize("where", ["staging", "shard"])
def test_disk_full_names_the_path_and_what_to_do(src, tmp_path, monkeypatch, where):
    import zephon_store.write.convert as conv
    import zephon_store.write.staging as staging

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "staging":
        monkeypatch.setattr(staging, "atomic_write_json", full)
    else:
        monkeypatch.setattr(conv, "write_shard", full)
    out = tmp_path / "ds"
    with pytest.raises(OSError) as e:
        convert([str(src)], str(out), options=SMALL)
    msg = str(e.value)
    assert isinstance(e.value, ZephonError) and e.value.errno == errno.ENOSPC
    assert "no space left" in msg.lower() and str(out) in msg and "free" in msg


# -- issue 29 item 11: the write path deletes only what it wrote and can name ----------------------

def _forge_table_path(out, key, path):
    """Point the manifest's ``tables[key]`` at ``path`` and re-seal the dataset_id: a forged (or
    hand-edited) old manifest that a later ``convert --overwrite`` replaces."""
    from zephon_store.format.manifest import compute_dataset_id

    doc = json.loads((out / "manifest.json").read_text())
    ref = dict(doc["tables"]["provenance"])
    doc["tables"][key] = {**ref, "path": path}
    doc["dataset_id"] = compute_dataset_id(doc)
    (out / "manifest.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("key", ["provenance", "readme"])
@pytest.mark.parametrize("forged", ["manifest.json", "README.md", "../victim.txt",
                                    "shards/../../victim.txt", "ABSOLUTE", "shards/x.parquet",
                                    "index/" + "ab" * 16 + ".arrow/"])
def test_overwrite_over_a_forged_manifest_deletes_nothing_it_cannot_name(
        two_corpora, tmp_path, capsys, key, forged):
    a, b = two_corpora
    out = tmp_path / "ds"
    convert([str(a)], str(out), options=SMALL)
    readme, victim = out / "README.md", tmp_path / "victim.txt"
    readme.write_text("the user's notes")
    victim.write_text("outside the dataset")
    (out / "shards" / "x.parquet").write_text("a user's file under shards/")
    if forged == "ABSOLUTE":
        forged = str(victim)
    _forge_table_path(out, key, forged)
    assert main(["convert", str(b), "-o", str(out), "--overwrite", "--target-shard-size",
                 "16KiB"]) == 0, capsys.readouterr().err
    assert readme.read_text() == "the user's notes" and victim.read_text() == "outside the dataset"
    assert (out / "shards" / "x.parquet").exists()
    report = verify(str(out), deep=True)
    assert report.ok, report.findings
    assert open_dataset(str(out)).num_samples == 180


def test_publish_refuses_when_a_referenced_object_vanished_before_the_manifest(src, tmp_path,
                                                                               monkeypatch, capsys):
    """A shard removed between its write and the manifest (a concurrent deleter) must fail the
    convert, never publish a manifest that names a missing file."""
    from zephon_store.io.storage import Storage

    out = tmp_path / "ds"
    real = Storage.write_atomic

    def write_atomic(self, relpath, data):
        if relpath.startswith("index/"):
            for name in os.listdir(out / "shards"):
                os.remove(out / "shards" / name)
        return real(self, relpath, data)

    monkeypatch.setattr(Storage, "write_atomic", write_atomic)
    assert main(["convert", str(src), "-o", str(out), "--target-shard-size", "16KiB"]) == 1
    err = capsys.readouterr().err
    assert "shards/" in err and "missing" in err and len(err.strip().splitlines()) == 1
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    assert main(["convert", str(src), "-o", str(out), "--target-shard-size", "16KiB"]) == 0
    assert verify(str(out), deep=True).ok


def test_gc_skips_and_reports_a_folder_or_foreign_file_under_shards(src, tmp_path, capsys):
    out = tmp_path / "ds"
    convert([str(src)], str(out), options=SMALL)
    (out / "shards" / "mine").mkdir()
    (out / "shards" / "mine" / "notes.txt").write_text("keep")
    (out / "shards" / ("ef" * 16 + ".parquet")).mkdir()   # a folder with a shard's name
    (out / "index" / "README").write_text("keep too")
    (out / "shards" / ("ab" * 16 + ".parquet")).write_bytes(b"a real orphan")
    assert main(["gc", str(out)]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "removed 1 file(s)" in text and "skipped shards/mine" in text
    assert "skipped index/README" in text
    assert (out / "shards" / "mine" / "notes.txt").read_text() == "keep"
    assert (out / "shards" / ("ef" * 16 + ".parquet")).is_dir()
    assert (out / "index" / "README").exists()
    assert not (out / "shards" / ("ab" * 16 + ".parquet")).exists()
    assert main(["gc", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["removed"] == [] and sorted(doc["skipped"]) == [
        "index/README", "shards/" + "ef" * 16 + ".parquet", "shards/mine"]
    report = verify(str(out))
    assert report.ok
    found = {f.message.split(" ")[0]: f.message for f in report.findings}
    assert "gc' leaves it" in found[str(out / "shards" / "mine")]


def test_a_convert_whose_local_lock_was_removed_and_retaken_does_not_publish(src, tmp_path,
                                                                             monkeypatch):
    """The lock file removed by hand while its convert runs, and taken by another: the first
    convert re-checks its lock before the manifest and fails instead of publishing."""
    import zephon_store.write.convert as conv
    from zephon_store.errors import OutputLockedError
    from zephon_store.io.storage import Storage
    from zephon_store.write.lock import LOCK_NAME, output_lock

    out = tmp_path / "ds"
    real = conv.publish_manifest
    other = []

    def publish(st, *a, **k):
        os.remove(out / LOCK_NAME)
        other.append(output_lock(Storage(str(out)), command="gc"))
        other[0].__enter__()
        return real(st, *a, **k)

    monkeypatch.setattr(conv, "publish_manifest", publish)
    try:
        with pytest.raises(OutputLockedError, match="lost"):
            convert([str(src)], str(out), options=SMALL)
    finally:
        other[0].__exit__(None, None, None)
    assert not (out / "manifest.json").exists()
