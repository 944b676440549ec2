"""The recorder under the per-step account: exclusive nested causes, waits in another job's
proportions, a collect inside another, the counters, a cache lock's note."""

from __future__ import annotations

import threading
import time

import pytest

from zephon_store.io.cache import ChunkCache
from zephon_store.observe import causes
from zephon_store.observe.causes import CAUSES, Tally


def test_nested_causes_are_exclusive():
    with causes.collect() as t:
        with causes.timed("decode"):
            time.sleep(0.02)
            with causes.timed("fetch"):
                time.sleep(0.05)
    d = t.as_dict()
    assert 0.045 <= d["fetch"] < 0.2
    assert 0.015 <= d["decode"] < 0.045    # the fetch inside it is not decode time


def test_a_wait_counts_in_the_proportions_of_the_job_waited_for():
    other = Tally()
    other.add("throttle", 3.0)
    other.add("decode", 1.0)
    with causes.collect() as t:
        with causes.timed("decode"):
            causes.waited(0.4, other)
    assert t.as_dict()["throttle"] == pytest.approx(0.3)
    # 0.1 from the job's decode; the frame's own time excludes the 0.4 waited
    assert t.as_dict()["decode"] == pytest.approx(0.1, abs=0.01)


def test_an_empty_job_waited_for_counts_as_the_fallback():
    with causes.collect() as t:
        causes.waited(0.2, Tally(), "cache_lock")
        causes.waited(0.1, None)
    assert t.as_dict()["cache_lock"] == pytest.approx(0.2)
    assert t.as_dict()["other"] == pytest.approx(0.1)


def test_a_collect_inside_another_adds_to_it():
    with causes.collect() as outer:
        with causes.timed("transform"):
            with causes.collect() as inner, causes.timed("decode"):
                time.sleep(0.03)
    assert inner.as_dict()["decode"] >= 0.025
    assert outer.as_dict()["decode"] == inner.as_dict()["decode"]
    assert outer.as_dict()["transform"] < 0.02


def test_without_a_collect_nothing_is_recorded_and_nothing_breaks():
    with causes.timed("fetch"):
        pass
    causes.waited(1.0, None)
    assert causes.current() is None


def test_counters_add_up_across_threads():
    before = causes.counters().get("test.n", 0)
    threads = [threading.Thread(target=lambda: [causes.count("test.n") for _ in range(1000)])
               for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert causes.counters()["test.n"] - before == 4000


def test_a_tally_round_trips_and_garbage_is_none():
    t = Tally([float(i) for i in range(len(CAUSES))])
    assert Tally.decode(t.encode()).seconds == t.seconds
    assert Tally.decode(b"") is None and Tally.decode(b"x" * 80) is None


def test_a_waiter_on_a_cache_key_counts_the_holders_causes(tmp_path):
    """The holder of a key's lock was throttled; the thread that waited for it counts its
    wait as throttle, not as a lock."""
    cache = ChunkCache(str(tmp_path))
    key = "ab" * 16
    held = threading.Event()

    def holder():
        with causes.collect(), cache.key_lock(key):
            held.set()
            with causes.timed("throttle"):
                time.sleep(0.3)

    th = threading.Thread(target=holder)
    th.start()
    held.wait()
    with causes.collect() as t, cache.key_lock(key):
        pass
    th.join()
    d = t.as_dict()
    assert d["throttle"] >= 0.2 and d["cache_lock"] < 0.05, d
