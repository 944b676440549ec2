"""Conversion on a real local Ray cluster: the same bytes as the local engine, crash-safe.

One cluster per module (``ray start --head`` on 127.0.0.1 with 2 CPUs plus a second node
joined with ``ray start --address`` with 1 CPU: three worker slots on two nodes); this test
process is the Ray driver for the in-process conversions. Ray is a test dependency (the
``ray`` extra): without it these tests fail, they are never skipped.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import ROOT, tree_digest, write_jsonl_corpus
from tests.helpers.tty import run_on_tty
from zephon_store import convert
from zephon_store.errors import InputError, OutputLockedError
from zephon_store.ingest import InputOptions
from zephon_store.ingest.source import remote_input_bytes
from zephon_store.io.storage import Storage
from zephon_store.read.verify import verify
from zephon_store.testing.ray_cluster import LocalRayCluster, ray_env
from zephon_store.write.lock import output_lock
from zephon_store.write.packing import PackingOptions, packing_convert_kwargs
from zephon_store.write.shardwriter import WriteOptions

pytestmark = pytest.mark.integration

SMALL = WriteOptions(target_shard_bytes=32 << 10, row_group_bytes=8 << 10)
SIZES = ["--target-shard-size", "32KiB", "--row-group-size", "8KiB"]


@pytest.fixture(scope="module")
def cluster():
    """A running two-node Ray cluster; this process is connected to it as the driver."""
    import ray  # the ray extra is a test dependency: an ImportError here fails the module

    saved = dict(os.environ)
    os.environ.update(ray_env())  # the driver's side of the cluster's settings
    try:
        with LocalRayCluster([2, 1]) as c:
            ray.init(address=c.address, logging_level="WARNING")
            try:
                assert len([n for n in ray.nodes() if n["Alive"]]) == 2
                yield c
            finally:
                ray.shutdown()
    finally:
        os.environ.clear()
        os.environ.update(saved)


# -- corpora ---------------------------------------------------------------------------------

def _records(tmp, n_files=4, records=300):
    return write_jsonl_corpus(tmp / "jsonl", files=n_files, records=records, seed=5,
                              suffix=".jsonl.zst")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """{kind: (input folder, convert kwargs)}: JSONL.zst, Parquet, CSV and packed tokens."""
    tmp = tmp_path_factory.mktemp("ray-corpora")
    records = _records(tmp)
    per_file = [records[k * 300:(k + 1) * 300] for k in range(4)]
    (tmp / "parquet").mkdir()
    (tmp / "csv").mkdir()
    for k, recs in enumerate(per_file):
        pq.write_table(pa.Table.from_pylist(recs), tmp / "parquet" / f"part-{k:03d}.parquet",
                       row_group_size=100)
        with open(tmp / "csv" / f"part-{k:03d}.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "text", "score"])
            w.writerows([r["id"], r["text"], r["score"]] for r in recs)
    tok = _tokenizer(tmp)
    packing = packing_convert_kwargs(PackingOptions(tokenizer=tok, seq_len=31, strategy="concat"))
    # Buffers of 16 windows: the corpus packs over many, crossing its four inputs.
    best_fit = packing_convert_kwargs(PackingOptions(tokenizer=tok, seq_len=31,
                                                     strategy="best-fit", buffer_windows=16))
    return {"jsonl.zst": (tmp / "jsonl", {}), "parquet": (tmp / "parquet", {}),
            "csv": (tmp / "csv", {}), "packed": (tmp / "jsonl", packing),
            "best-fit": (tmp / "jsonl", best_fit)}


def _tokenizer(tmp) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "<s>", "</s>", "alpha", "beta", "gamma", "delta", "epsilon", "zeta",
             "eta", "theta", "ünïcødé", "∑"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = str(tmp / "tok" / "tokenizer.json")
    os.makedirs(os.path.dirname(path))
    tok.save(path)
    return path


@pytest.fixture(scope="module")
def local_refs(corpora, tmp_path_factory):
    """The local engine's output (1 process) for every corpus: the reference bytes."""
    out = tmp_path_factory.mktemp("ray-refs")
    refs = {}
    for kind, (src, kw) in corpora.items():
        res = convert([str(src)], str(out / kind), options=SMALL, **kw)
        refs[kind] = (res, tree_digest(out / kind))
    return refs


# -- a local Ray instance, started by the command (first: before this module's cluster) -------

def test_a_local_ray_convert_prints_none_of_rays_log_lines(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(50)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    r = subprocess.run(_cli(str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "ds"), "--engine",
                            "ray", "--workers", "1"), capture_output=True, text=True, cwd=ROOT,
                       env=dict(env, PYTHONPATH=ROOT), timeout=300)
    assert r.returncode == 0, r.stderr
    # Ray 2.60 logged a token-authentication notice on every local start.
    assert "Token authentication" not in r.stderr and r.stderr == "", r.stderr
    assert "wrote 50 samples in 1 shard " in r.stdout


def test_a_ray_convert_on_a_terminal_shows_its_start_and_bars(tmp_path):
    # Issue 43 item 6; the test above is the same command on a pipe: nothing on stderr.
    (tmp_path / "a.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(50)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    rc, out, shown = run_on_tty(_cli(str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "ds"),
                                     "--engine", "ray", "--workers", "1"),
                                env=dict(env, PYTHONPATH=ROOT))
    assert rc == 0, shown[-2000:]
    assert "start: ray workers ..." in shown and "parse:" in shown and "write:" in shown, shown
    assert "wrote 50 samples in 1 shard " in out


# -- byte identity ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["jsonl.zst", "parquet", "csv", "packed", "best-fit"])
def test_ray_with_1_and_3_workers_writes_the_local_bytes(cluster, corpora, local_refs, kind,
                                                         tmp_path):
    src, kw = corpora[kind]
    ref, ref_tree = local_refs[kind]
    assert ref.num_shards > 2 and len(ref_tree) > 4
    if kind == "jsonl.zst":  # the local engine with N processes writes the same bytes too
        convert([str(src)], str(tmp_path / "local4"), options=SMALL, workers=4, **kw)
        assert tree_digest(tmp_path / "local4") == ref_tree
    for workers in (1, 3):
        out = tmp_path / f"ray{workers}"
        res = convert([str(src)], str(out), options=SMALL, engine="ray", workers=workers, **kw)
        assert (res.engine, res.workers) == ("ray", workers)
        assert res.dataset_id == ref.dataset_id and tree_digest(out) == ref_tree
        assert set(res.stages) >= {"plan", "parse", "cut", "write", "publish"}
        # Timed inside the Ray tasks and sent back with their results (issue 43 item 5).
        assert res.work_seconds["read"] > 0 and res.work_seconds["compress"] > 0
    assert verify(str(out), deep=True).ok


# -- faults ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A corpus whose parse and write tasks last long enough to be killed mid-run."""
    src = tmp_path_factory.mktemp("ray-big")
    write_jsonl_corpus(src, files=6, records=6000, seed=11, suffix=".jsonl.zst")
    ref = tmp_path_factory.mktemp("ray-big-ref") / "ds"
    res = convert([str(src)], str(ref), options=SMALL, workers=1)
    return src, res, tree_digest(ref)


def _convert_under_fault(big, out, fault) -> list[int]:
    """Convert ``big`` on Ray (3 workers) while ``fault()`` is polled until it kills something
    (it returns the pids it killed); check the bytes are the local engine's. Returns the pids."""
    src, ref, ref_tree = big
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = convert([str(src)], str(out), options=SMALL, engine="ray",
                                        workers=3)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    killed: list[int] = []
    while t.is_alive() and not killed:
        killed = fault()
        time.sleep(0.005)
    t.join(300)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].dataset_id == ref.dataset_id and tree_digest(out) == ref_tree
    return killed


def test_a_killed_worker_process_is_retried_and_the_bytes_are_the_same(cluster, big, tmp_path):
    def kill_a_worker() -> list[int]:
        pids = cluster.worker_pids("zephon parse") or cluster.worker_pids("zephon write")
        if pids:
            os.kill(pids[0], signal.SIGKILL)  # the worker process dies mid-task
        return pids[:1]

    assert _convert_under_fault(big, tmp_path / "ds", kill_a_worker), "no running task seen"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "zephon_store.cli.main", "convert", *args]


def _md5_tree(fs, base: str) -> dict[str, str]:
    return {p[len(base) + 1:]: hashlib.md5(fs.cat_file(p)).hexdigest() for p in fs.find(base)}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_killed_driver_loses_no_finished_work_and_a_rerun_is_identical(cluster, big, tmp_path,
                                                                         request, where):
    src, ref, ref_tree = big
    sizes = SIZES
    if where == "local":
        out, extra = str(tmp_path / "ds"), []

        def staged():  # the ledger beside the output
            return [p.name for p in (tmp_path / "ds").glob(".zephon-staging/*/parsed/*.json")]

        def tree():
            return tree_digest(tmp_path / "ds")
    else:
        import s3fs

        bucket = request.getfixturevalue("s3_bucket")
        fs = s3fs.S3FileSystem(**bucket.storage_options, skip_instance_cache=True,
                               use_listings_cache=False)
        out, extra = f"{bucket.url}/ds", ["--storage-options",
                                          json.dumps(bucket.storage_options)]
        # Fewer, larger shards: every shard costs a few requests to the store.
        sizes = ["--target-shard-size", "256KiB", "--row-group-size", "32KiB"]
        ref = convert([str(src)], str(tmp_path / "ref"), options=WriteOptions(
            target_shard_bytes=256 << 10, row_group_bytes=32 << 10))
        ref_tree = tree_digest(tmp_path / "ref")

        def staged():  # the ledger beside the output, on the object store
            return [p for p in fs.find(f"{bucket.name}/ds/.zephon-staging")
                    if "/parsed/" in p and p.endswith(".json")]

        def tree():
            return _md5_tree(fs, f"{bucket.name}/ds")
    cmd = _cli(str(src), "-o", out, "--engine", "ray", "--ray-address", cluster.address,
               "--json", *sizes, *extra)
    env = dict(ray_env(), PYTHONPATH=ROOT)
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline and len(staged()) < 2:
        time.sleep(0.02)
    assert p.poll() is None, p.communicate()
    p.kill()  # SIGKILL: the driver dies with tasks in flight
    p.communicate()
    done = staged()
    assert len(done) >= 2 and "manifest.json" not in tree()
    again = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["inputs_reused"] >= len(done) and summary["engine"] == "ray"
    assert summary["dataset_id"] == ref.dataset_id and tree() == ref_tree  # no ledger left


def test_a_second_driver_on_the_same_output_is_refused(cluster, corpora, tmp_path):
    src, _ = corpora["jsonl.zst"]
    out = tmp_path / "ds"
    with output_lock(Storage(str(out))), pytest.raises(OutputLockedError,
                                                       match="another convert .* holds"):
        convert([str(src)], str(out), options=SMALL, engine="ray")


# -- S3 to S3 --------------------------------------------------------------------------------

def test_s3_to_s3_through_ray_never_reads_inputs_in_the_driver(cluster, s3_bucket, corpora,
                                                               tmp_path, monkeypatch):
    import s3fs

    import zephon_store.write.convert as conv

    monkeypatch.setattr(conv, "_SIZES_AHEAD", 2)  # the driver's bounded read-ahead of row sizes

    src, _ = corpora["jsonl.zst"]
    so = s3_bucket.storage_options
    fs = s3fs.S3FileSystem(**so, skip_instance_cache=True, use_listings_cache=False)
    fs.put(str(src) + "/", f"{s3_bucket.name}/in/", recursive=True)
    inputs = f"{s3_bucket.url}/in/"

    before = remote_input_bytes()
    res = convert([inputs], f"{s3_bucket.url}/ds", options=SMALL, storage_options=so,
                  engine="ray", workers=3)
    assert remote_input_bytes() == before  # the driver fetched no input byte
    # The same inputs through the local engine (threads of this process) are counted, so
    # the counter is live: the zero above is the workers' doing.
    local = convert([inputs], str(tmp_path / "local"), options=SMALL, storage_options=so,
                    workers=1)
    assert remote_input_bytes() - before == res.input_bytes > 0

    assert res.dataset_id == local.dataset_id
    base = f"{s3_bucket.name}/ds"
    remote = {p[len(base) + 1:]: fs.cat_file(p) for p in fs.find(base)}
    assert not [k for k in remote if k.startswith(".zephon-staging")]  # the ledger is cleared
    mine = {k: (tmp_path / "local" / k).read_bytes() for k in tree_digest(tmp_path / "local")}
    assert remote == mine
    assert verify(f"{s3_bucket.url}/ds", storage_options=so, deep=True).ok


# -- bad input -------------------------------------------------------------------------------

@pytest.fixture
def bad_src(tmp_path):
    src = tmp_path / "bad"
    write_jsonl_corpus(src, files=3, records=200, seed=2)
    with open(src / "part-001.jsonl") as fh:
        lines = fh.read().splitlines()
    lines[41] = '{"id": 1, "text": "unterminated'
    lines[97] = "[1, 2, 3]"
    (src / "part-001.jsonl").write_text("\n".join(lines) + "\n")
    # A later input fails sooner (line 3): the error reported is still the first in order.
    lines = (src / "part-002.jsonl").read_text().splitlines()
    lines[2] = '{"id": 2, "text": }'
    (src / "part-002.jsonl").write_text("\n".join(lines) + "\n")
    return src


def test_bad_input_gets_the_same_error_and_the_same_skips_on_ray(cluster, bad_src, tmp_path):
    errors = []
    for engine, workers in (("local", 1), ("ray", 3)):
        with pytest.raises(InputError) as e:
            convert([str(bad_src)], str(tmp_path / engine), options=SMALL, engine=engine,
                    workers=workers)
        errors.append((type(e.value), str(e.value), e.value.path, e.value.line))
    assert errors[0] == errors[1]
    assert "part-001.jsonl" in errors[1][1] and errors[1][3] == 42

    skip = InputOptions(on_error="skip")
    local = convert([str(bad_src)], str(tmp_path / "ls"), options=SMALL, input_options=skip)
    ray_ = convert([str(bad_src)], str(tmp_path / "rs"), options=SMALL, input_options=skip,
                   engine="ray", workers=3)
    assert local.skipped == ray_.skipped and sum(ray_.skipped.values()) == 3
    assert local.skip_examples == ray_.skip_examples and local.dataset_id == ray_.dataset_id


def _parse_or_die(f, options, storage_options, stats):
    """The default parse, except that the worker process parsing part-002 dies while a file
    named CRASH lies beside the input folder (every retry too)."""
    from zephon_store.ingest import read_input

    marker = os.path.join(os.path.dirname(os.path.dirname(f.url)), "CRASH")
    if f.url.endswith("part-002.jsonl") and os.path.exists(marker):
        os._exit(1)  # as an out-of-memory kill or a segfault would
    return read_input(f, options=options, storage_options=storage_options, stats=stats)


def test_a_worker_that_keeps_dying_is_one_error_and_the_rerun_resumes(cluster, tmp_path):
    import ray.cloudpickle

    from zephon_store.errors import WorkerLostError

    # The workers import this module by value: it is not on their path.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    write_jsonl_corpus(tmp_path / "src", files=4, records=200, seed=3)
    (tmp_path / "CRASH").write_text("")
    out = tmp_path / "ds"
    with pytest.raises(WorkerLostError) as info:
        convert([str(tmp_path / "src")], str(out), options=SMALL, engine="ray", workers=3,
                parse_fn=_parse_or_die)
    message = str(info.value)
    assert "\n" not in message and message.startswith("zephon parse[2]: ")
    assert "WorkerCrashedError" in message and "rerun the same command" in message
    assert not (out / "manifest.json").exists()
    # The rerun resumes: the inputs parsed before are reused, the bytes are the local ones.
    (tmp_path / "CRASH").unlink()
    res = convert([str(tmp_path / "src")], str(out), options=SMALL, engine="ray", workers=3,
                  parse_fn=_parse_or_die)
    assert res.inputs_reused >= 1
    ref = convert([str(tmp_path / "src")], str(tmp_path / "ref"), options=SMALL,
                  parse_fn=_parse_or_die)
    assert res.dataset_id == ref.dataset_id and tree_digest(out) == tree_digest(tmp_path / "ref")


# -- last: a node dies (the cluster keeps only its head for what follows) -----------------------

def test_a_killed_node_loses_no_work_its_tasks_rerun_on_the_others(cluster, big, tmp_path):
    def kill_node() -> list[int]:  # its raylet, workers and agents, mid-task
        return cluster.kill_node(1) if cluster.node_running(1, "zephon") else []

    # Ray places tasks as it likes: a run that never put one on node 1 while it was polled
    # tested nothing (its bytes were still checked), so try again, up to three times.
    for attempt in range(3):
        if _convert_under_fault(big, tmp_path / f"ds{attempt}", kill_node):
            return
    import ray

    alive = [(n["NodeManagerPort"], n["Resources"].get("CPU")) for n in ray.nodes() if n["Alive"]]
    pytest.fail(f"no task seen on node 1 in three conversions; alive nodes (port, CPUs): "
                f"{alive}; node 1's processes: {sorted(cluster._node_tree(1).values())}")
