"""Races on an S3 output (issue 29 item 12), against the real SeaweedFS of the test session,
and the same races on a local output.

Each race runs 20 times: two ``--overwrite`` converts into one output (fresh, and over a
published dataset whose lock was left by a convert that died on this host), and ``gc`` racing
a convert over that stale lock. Every time one side wins, the other fails with one clean
``OutputLockedError`` line, and the output verifies (deep). The racers are threads of this
process (a lock's holder is alive when its pid is, so threads race exactly as processes of
one host do, without paying an interpreter start per racer). One racer starts 0 to 45 ms
after the other, a different offset each run. Hooks force the worst interleaving on event
waits, never on a clock: a racer about to write the lock object to take it over, second of
the two, waits until the first reached its dangerous step (a convert's publish, gc's
listing); each dangerous step waits for the other racer to reach its own or end. A lock
that takes over by deleting what it judged stale then lets both racers in (the hole of
issue 29 item 12); a conditional take-over makes the second one fail.
"""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import convert
from zephon_store.errors import OutputLockedError
from zephon_store.io.storage import Storage
from zephon_store.read.verify import verify
from zephon_store.write.lock import LOCK_NAME
from zephon_store.write.rerun import RECORD_NAME
from zephon_store.write.shardwriter import WriteOptions

pytestmark = pytest.mark.integration

RUNS = 20
# GCS and Azure run the same race code as S3 over their own conditional writes: fewer
# rounds there keep the suite's time (each round is a pair of converts).
OTHER_STORE_RUNS = 6


def _runs(base: str) -> int:
    return OTHER_STORE_RUNS if base.startswith(("gs://", "az://")) else RUNS
# Two shards per dataset: enough for "some shards only one dataset names", cheap to write.
SMALL = WriteOptions(target_shard_bytes=4 << 10, row_group_bytes=2 << 10)
# A hook that waits for the other racer gives up after this long and lets its racer go on
# (a hang guard: with a working lock the other racer has already failed or finished).
_RENDEZVOUS_S = 60


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("races")
    write_jsonl_corpus(d / "a", files=1, records=30, seed=11)
    write_jsonl_corpus(d / "b", files=1, records=35, seed=12)
    return str(d / "a"), str(d / "b")


@pytest.fixture(autouse=True)
def one_s3_client(monkeypatch):
    """One s3fs client per storage options for the whole test: each new client loads
    botocore's models (about half a second of CPU), which would dominate 20 runs of races
    that are about locks, not clients. Racing threads share it as a process's threads do."""
    import zephon_store.io.storage as storage

    real = storage._s3_filesystem

    @functools.cache
    def cached(key: str):
        return real(json.loads(key))

    monkeypatch.setattr(storage, "_s3_filesystem",
                        lambda opts: cached(json.dumps(opts, sort_keys=True)))


@pytest.fixture(scope="module")
def dead_pid():
    """The pid of a process of this host that has exited: the holder of a stale lock."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


class Racers:
    """Run callables in threads started together; collect each one's result or exception."""

    def __init__(self, n: int) -> None:
        self.start = threading.Barrier(n)
        self.cond = threading.Condition()
        self.done: set[str] = set()
        self.arrived: set[str] = set()
        self.outcome: dict[str, object] = {}
        self.names: list[str] = []
        self.first_writer: str | None = None
        self.gated: set[str] = set()

    def lock_write(self, name: str) -> None:
        """``name`` is about to write (PUT or DELETE) the lock object: if the other racer
        wrote it first, wait until that one reached its dangerous step or ended."""
        with self.cond:
            if self.first_writer is None:
                self.first_writer = name
                return
            if self.first_writer == name or name in self.gated:
                return
            self.gated.add(name)
            first = self.first_writer
            self.cond.wait_for(lambda: first in self.arrived | self.done, _RENDEZVOUS_S)

    def arrive(self, name: str, *, wait_for: str) -> None:
        """``name`` reached its dangerous step: wait until ``wait_for`` reached its own or
        ended (never longer than _RENDEZVOUS_S)."""
        with self.cond:
            self.arrived.add(name)
            self.cond.notify_all()
            self.cond.wait_for(lambda: wait_for in self.arrived | self.done, _RENDEZVOUS_S)

    def wait_done(self, name: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: name in self.done, _RENDEZVOUS_S)

    def run(self, run: int, **fns) -> dict[str, object]:
        """Start ``fns`` together, the second one (first in odd tens of runs) ``run % 10``
        times 5 ms late."""
        names = self.names = list(fns)
        RACE["racers"] = self
        late = {names[(run // 10 + 1) % 2]: (run % 10) * 0.005}

        def go(name, fn):
            try:
                self.start.wait()
                time.sleep(late.get(name, 0.0))
                self.outcome[name] = fn()
            except BaseException as exc:  # noqa: BLE001 - the outcome is what the test checks
                self.outcome[name] = exc
            finally:
                with self.cond:
                    self.done.add(name)
                    self.cond.notify_all()

        threads = [threading.Thread(target=go, args=(n, f), daemon=True) for n, f in fns.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(4 * _RENDEZVOUS_S)
            assert not t.is_alive(), "a racer hangs"
        return self.outcome


@pytest.fixture(autouse=True)
def lock_write_gate(monkeypatch):
    """Route every lock-object write of a racer thread through ``Racers.lock_write``; the test
    puts its current Racers in ``RACE["racers"]``."""
    RACE.clear()

    def gated(method):
        real = getattr(Storage, method, None)
        if real is None:   # a lock that never makes this call
            return

        def call(self, relpath, *args, **kwargs):
            racers = RACE.get("racers")
            if relpath == LOCK_NAME and racers is not None and (
                    threading.current_thread().name in racers.names):
                racers.lock_write(threading.current_thread().name)
            return real(self, relpath, *args, **kwargs)

        monkeypatch.setattr(Storage, method, call)

    for method in ("delete", "replace_if_match", "write_atomic"):
        gated(method)


RACE: dict = {}


@pytest.fixture(params=["s3", "gcs", "az", "local"])
def where(request, tmp_path):
    """(base URL, storage options) of the output: a fresh S3 or GCS bucket (generation
    preconditions instead of ETags) or Azure container, or a local folder (the same rules hold for the flock of
    a local output)."""
    if request.param in ("s3", "gcs", "az"):
        bucket = request.getfixturevalue(f"{request.param}_bucket")
        return bucket.url, bucket.storage_options
    return str(tmp_path / "out"), None


def _clean_loss(exc: object) -> None:
    """A lost race: one OutputLockedError of one line, nothing else."""
    assert isinstance(exc, OutputLockedError), repr(exc)
    assert "\n" not in str(exc), exc
    assert "holds" in str(exc) or "lost its lock" in str(exc), exc


def _stale_lock(st: Storage, pid: int) -> None:
    st.write_atomic(LOCK_NAME, json.dumps({"pid": pid, "host": socket.gethostname(),
                                           "since": "2026-01-01T00:00:00Z", "token": "dead",
                                           "command": "convert"}).encode())


def _verified(url: str, so: dict) -> str:
    report = verify(url, storage_options=so, deep=True)
    assert report.ok, report.findings
    assert not Storage(url, storage_options=so).exists(LOCK_NAME)
    return report.dataset_id


def _convert(inputs: str, url: str, so: dict, staging) -> object:
    return lambda: convert([inputs], url, storage_options=so, options=SMALL, overwrite=True,
                           progress=False, staging_dir=str(staging))


@pytest.fixture
def publish_rendezvous(monkeypatch):
    """Each convert that reaches publish waits for the other racer to reach it or end."""
    import zephon_store.write.convert as conv

    real = conv.publish_manifest
    state = {}

    def publish(*a, **k):
        me = threading.current_thread().name
        if me in state.get("other", {}):   # a racer, not the set-up of the run
            state["racers"].arrive(me, wait_for=state["other"][me])
        return real(*a, **k)

    monkeypatch.setattr(conv, "publish_manifest", publish)
    return state


@pytest.mark.parametrize("stale", [False, True], ids=["fresh-output", "stale-lock"])
def test_two_overwrite_converts_race_one_wins_and_the_dataset_verifies(
        where, corpora, dead_pid, tmp_path, publish_rendezvous, stale):
    a, b = corpora
    base, so = where
    ids = {}
    for run in range(_runs(base)):
        url = f"{base}/r{run}-{uuid.uuid4().hex[:6]}"
        st = Storage(url, storage_options=so)
        if stale:
            # A published dataset P (inputs a), then a convert that died holding the lock.
            ids["P"] = convert([a], url, storage_options=so, options=SMALL,
                               progress=False).dataset_id
            # As an older writer left it: without the rerun record, B's re-conversion of P's
            # inputs is a real one (with it, B would find nothing to do and end before A).
            st.delete(RECORD_NAME)
            _stale_lock(st, dead_pid)
        racers = Racers(2)
        publish_rendezvous.update(racers=racers, other={"A": "B", "B": "A"})
        # A replaces P by another dataset, B re-converts P's own inputs: if both ran at once,
        # A's removal of what only P referenced would take the files of B's manifest.
        out = racers.run(run, A=_named("A", _convert(b, url, so, tmp_path / "stA")),
                         B=_named("B", _convert(a, url, so, tmp_path / "stB")))
        won = {k: v.dataset_id for k, v in out.items() if not isinstance(v, BaseException)}
        for v in out.values():
            if isinstance(v, BaseException):
                _clean_loss(v)
        # Exactly one: both succeeding means both held the lock at once (B started while A
        # ran, its rendezvous keeps A from finishing first).
        assert len(won) == 1, (run, out)
        assert _verified(url, so) in won.values(), (run, out)


def test_gc_racing_a_convert_over_a_stale_lock_never_removes_its_shards(
        where, corpora, dead_pid, tmp_path, monkeypatch):
    import zephon_store.write.convert as conv
    import zephon_store.write.gc as gcmod

    a, b = corpora
    base, so = where
    state = {}
    real_publish, real_load = conv.publish_manifest, gcmod.load_manifest

    def publish(*args, **kwargs):
        # The convert's shards are written; let gc look for orphans now, then publish after it.
        if threading.current_thread().name == "C":
            state["racers"].arrive("C", wait_for="G")
            state["racers"].wait_done("G")
        return real_publish(*args, **kwargs)

    def load_manifest(*args, **kwargs):
        state["racers"].arrive("G", wait_for="C")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(conv, "publish_manifest", publish)
    monkeypatch.setattr(gcmod, "load_manifest", load_manifest)
    for run in range(_runs(base)):
        url = f"{base}/g{run}-{uuid.uuid4().hex[:6]}"
        p_id = convert([a], url, storage_options=so, options=SMALL, progress=False).dataset_id
        _stale_lock(Storage(url, storage_options=so), dead_pid)
        state["racers"] = racers = Racers(2)
        out = racers.run(run, C=_named("C", _convert(b, url, so, tmp_path / "stC")),
                         G=_named("G", functools.partial(gcmod.gc, url, storage_options=so)))
        for v in out.values():
            if isinstance(v, BaseException):
                _clean_loss(v)
        assert sum(not isinstance(v, BaseException) for v in out.values()) == 1, (run, out)
        final = _verified(url, so)
        converted = not isinstance(out["C"], BaseException)
        assert final == (out["C"].dataset_id if converted else p_id), (run, out)


def _named(name: str, fn):
    """``fn`` run under the thread name ``name`` (the rendezvous hooks key on it)."""
    def run():
        threading.current_thread().name = name
        return fn()
    return run


def test_a_command_that_loses_the_lock_exits_1_with_one_line(s3_bucket, corpora, capsys):
    """Through the CLI: convert and gc against a held S3 lock fail at once, exit 1, one line,
    and a lock found stale is not taken from a live holder."""
    from zephon_store.cli.main import main
    from zephon_store.write.lock import output_lock

    a, _ = corpora
    url, so = f"{s3_bucket.url}/held", s3_bucket.storage_options
    flags = ["--storage-options", json.dumps(so)]
    assert main(["convert", a, "-o", url, "--target-shard-size", "4KiB", *flags]) == 0
    capsys.readouterr()
    with output_lock(Storage(url, storage_options=so)) as lock:
        for argv in (["convert", a, "-o", url, "--overwrite", *flags], ["gc", url, *flags]):
            assert main(argv) == 1
            err = capsys.readouterr().err
            assert "holds" in err and LOCK_NAME in err and len(err.strip().splitlines()) == 1
        lock.check()   # still ours
    _verified(url, so)


def test_the_store_honours_the_conditional_writes_the_lock_relies_on(s3_bucket):
    """If-None-Match on PUT, If-Match on PUT and DELETE: a store (or a SeaweedFS upgrade) that
    ignored one would make the take-over or the release unsafe; this names which."""
    st = Storage(f"{s3_bucket.url}/cond", storage_options=s3_bucket.storage_options)
    assert st.create_exclusive("k", b"one") and not st.create_exclusive("k", b"two")
    data, etag = st.read_with_etag("k")
    assert data == b"one"
    assert not st.replace_if_match("k", b"x", '"0123456789abcdef0123456789abcdef"')
    assert st.replace_if_match("k", b"three", etag)
    assert not st.replace_if_match("k", b"four", etag)   # the ETag it was judged by is gone
    assert st.read_file("k") == b"three"
    assert not st.delete_if_match("k", etag) and st.exists("k")
    assert st.delete_if_match("k", st.read_with_etag("k")[1]) and not st.exists("k")
    assert not st.replace_if_match("k", b"five", etag) and not st.exists("k")
    assert not st.delete_if_match("k", etag)
