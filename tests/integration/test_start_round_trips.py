"""A cold first batch in a few sequential round trips (issue 31, Done-when), counted, not timed.

Every request goes through the counting proxy with 50 ms of latency, which records when each
request arrived and when it was answered. The sequential round trips of a start are the
longest chain of requests each sent after the one before it was answered, among those answered
before the first batch was handed over and that it waited for (``s3_proxy.round_trips``): the
manifest, the side tables, and the requests that brought the row groups of its first step and
the footers of their shards, whoever of the node fetched them. What ran in parallel costs one round trip
whatever its count, and what ran meanwhile for later steps or other ranks costs none. Cold (a fresh cache folder each time): one process, one
process resuming at 50%, and (opt-in, ``ZEPHON_NODE_ROUND_TRIPS=1``: it needs a quiet machine)
every rank of a node of 4 ranks x 2 workers started together.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers.node_start import BATCH, METADATA, behind_proxy, node_start, start_corpus
from zephon_store import OrderOptions, Topology, open_dataset
from zephon_store.testing.s3_proxy import round_trips

pytestmark = pytest.mark.integration
pytest.importorskip("torch")

# 50 ms is the latency; the count does not depend on it (a request sent after another
# was answered chains at any latency), but a longer one keeps requests a process sends together
# from chaining when a busy host starts one of them late.
LATENCY = 0.2
# The bound is 4, and one process needs exactly that on format v4: the manifest; both
# side tables at once; the row-group chunk of the first step's row groups (their byte ranges
# and hashes, formats/SPEC.md 4.1) with the shards' footers; the row groups at once. (On v3
# the side tables held every byte range and it was 3; before the start work the side tables
# came one after the other: 4 on v3, which would be 5 now.)
MAX_ROUND_TRIPS = {"process": 4, "node": 4}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return start_corpus(tmp_path_factory.mktemp("rtcorpus"))


@pytest.fixture()
def slow_s3(corpus, s3_bucket, tmp_path):
    with behind_proxy(corpus, s3_bucket, labels=4) as (url, proxy):
        proxy.latency(LATENCY)
        yield url, s3_bucket, proxy, tmp_path


def _needed(ds, ranks: int, rank: int, cursor: int) -> dict[str, list[tuple[int, int]]]:
    """The byte ranges a rank's first batch reads: ``{"shards/<name>": [(lo, hi), ...]}``,
    its row groups and the footers of their shards (computed by the loader's own order)."""
    from zephon_store.load.share_reader import ShareReader

    m = ds.manifest
    reader = ShareReader(ds, OrderOptions(seed=3), Topology(BATCH * ranks, ranks, rank,
                                                           ranks_per_node=ranks),
                         start_cursor=cursor)
    out: dict[str, list[tuple[int, int]]] = {}
    for rg in reader.step_row_groups(0).tolist():
        shard = int(m.rg_shard[rg])
        spans = out.setdefault(m.shard_path(shard), [])
        spans.append((int(m.rg_offset[rg]), int(m.rg_offset[rg] + m.rg_length[rg])))
        spans.append((int(m.footer_offset[shard]), int(m.shard_bytes[shard])))
    return out


def _waited_for(reqs: list, needed: dict[str, list[tuple[int, int]]]) -> list:
    """The requests that brought what the first batch read: each metadata object's, and for
    each byte range it needs, the first answered request that covers the whole range (a
    coalesced GET spans the gaps between the row groups it wants, so overlapping is not
    enough; the node fetches each byte once)."""
    ok = sorted((q for q in reqs if q.status < 400), key=lambda q: q.t)
    out = {id(q): q for q in ok if METADATA.search(q.key)}
    for path, spans in needed.items():
        mine = [q for q in ok if q.key.endswith("/" + path) and q.span is not None]
        for lo, hi in spans:
            first = next((q for q in mine if q.span[0] <= lo and hi <= q.span[1]), None)
            if first is not None:
                out[id(first)] = first
    return list(out.values())


def _chains(ds, firsts: dict[int, float], reqs: list, cursor: int) -> dict[int, list[str]]:
    """Per rank: the chain of round trips its first batch waited for (any rank's requests:
    a rank may wait on a neighbour's fetch through the node's shared cache)."""
    out = {}
    for r, t in firsts.items():
        needed = _needed(ds, len(firsts), r, cursor)
        chain = round_trips(_waited_for(reqs, needed), until=t)
        out[r] = [f"L{q.label} {q.op} {q.key.split('/', 2)[-1][:24]} {q.span} "
                  f"@{q.start:.3f}-{q.t:.3f}" for q in chain]
    return out


NODE = pytest.mark.skipif(
    os.environ.get("ZEPHON_NODE_ROUND_TRIPS") != "1",
    reason="a node of 12 processes on a small shared host starts its workers seconds apart, "
           "which chains requests that are parallel in the code; run with "
           "ZEPHON_NODE_ROUND_TRIPS=1 on a quiet machine with >= 8 cores")


@pytest.mark.parametrize("ranks,workers,resume", [
    (1, 0, False), (1, 0, True), pytest.param(4, 2, False, marks=NODE)],
    ids=["one-process", "resume-50pct", "node-4x2"])
def test_cold_first_batch_in_few_round_trips(slow_s3, ranks, workers, resume):
    url, bucket, proxy, tmp = slow_s3
    cursor = 400 if resume else 0       # half of the corpus's 800 samples
    start = node_start(url, bucket, proxy, str(tmp / "cache"), ranks=ranks, workers=workers,
                       cursor=cursor)
    firsts, reqs = start.firsts, start.requests
    assert sorted(firsts) == list(range(ranks))
    chains = _chains(open_dataset(url, storage_options=bucket.storage_options, cache=False),
                     firsts, reqs, cursor)
    longest = max(chains.values(), key=len)
    assert len(longest) <= MAX_ROUND_TRIPS["node" if ranks > 1 else "process"], "\n".join(
        f"rank {r} ({len(c)} round trips):\n  " + "\n  ".join(c) for r, c in chains.items())
    print(f"{ranks}x{workers} cursor {cursor}: {len(reqs)} requests, round trips per rank "
          f"{ {r: len(c) for r, c in chains.items()} }; longest: {longest}")
