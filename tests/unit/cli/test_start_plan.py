"""``zephon plan --start-window``: the fleet's start estimated from the manifest alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zephon_store import convert, open_dataset
from zephon_store.cli.main import main
from zephon_store.io.coalesce import RowGroupSpan, coalesce_ranges
from zephon_store.write.shardwriter import WriteOptions


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan_start")
    (d / "a.jsonl").write_text("".join(json.dumps({"id": i, "text": "x" * (i % 50)}) + "\n"
                                       for i in range(4000)))
    convert([str(d / "a.jsonl")], str(d / "ds"),
            options=WriteOptions(row_group_rows=20, target_shard_bytes="16KiB"))
    return str(d / "ds")


def _plan(capsys, *args) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_start_requests_per_node_and_in_total(dataset, capsys):
    out = _plan(capsys, dataset, "--world-size", "32", "--global-batch", "256",
                "--ranks-per-node", "8", "--start-window", "2", "--steps", "0:1")
    st = out["start"]
    assert st["nodes"] == 4 and st["metadata_per_node"] == 3
    # From the plan's own ids: per node, 3 + its shards + its index chunks (format v4) + its
    # coalesced row-group GETs.
    ds = open_dataset(dataset)
    m = ds.manifest
    ranks = out["steps"][0]["ranks"]
    per_node = []
    for n in range(4):
        rgs = np.unique(ds.locate(np.concatenate(ranks[n * 8:(n + 1) * 8])).row_group)
        shards = np.unique(m.rg_shard[rgs]).size
        runs = len(coalesce_ranges(RowGroupSpan(int(g), int(m.rg_offset[g]),
                                                int(m.rg_length[g]), int(m.rg_shard[g]))
                                   for g in rgs))
        assert shards <= runs <= rgs.size   # a GET holds row groups of one shard
        chunks = np.unique(rgs // m.details.per_chunk).size
        assert chunks == 1 and st["index_chunks_per_node_max"] == 1
        per_node.append(3 + shards + chunks + runs)
    assert st["requests_total"] == sum(per_node)
    assert st["requests_per_node_max"] == max(per_node)
    assert st["gets_per_s"] == pytest.approx(sum(per_node) / 2, abs=0.1)
    assert st["hot_object_gets_per_s"] == 2.0
    # Before issue 31 each rank made 6 metadata requests of its own.
    assert st["before"]["metadata_per_node"] == 48
    assert st["before"]["requests_total"] == sum(per_node) + 4 * (48 - 3)


def test_a_thousand_nodes_and_the_prefix_limit(dataset, capsys):
    out = _plan(capsys, dataset, "--world-size", "1000", "--global-batch", "4000",
                "--ranks-per-node", "1", "--start-window", "1", "--steps", "0:1",
                "--simulate-steps", "1")
    st = out["start"]
    assert st["nodes"] == 1000
    assert st["fits_one_prefix"] == (st["requests_total"] <= 5500)
    assert st["min_window_s"] == pytest.approx(st["requests_total"] / 5500, abs=0.01)
    assert main(["plan", dataset, "--world-size", "8", "--global-batch", "8",
                 "--start-window", "1"]) == 0
    assert "requests per node" in capsys.readouterr().out
    assert main(["plan", dataset, "--world-size", "8", "--global-batch", "8",
                 "--start-window", "0"]) == 2
