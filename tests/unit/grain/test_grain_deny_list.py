"""A takedown reaches Grain's random-access source as it reaches every loader: a denied id
never reaches a ``MapDataset`` pipeline over ``ZephonSource``, with or without Grain's process
workers, for a dataset and for a mixture (docs/loader.md, "Every feature in every front end")."""

from __future__ import annotations

import json

import grain
import numpy as np
import pytest

from tests.helpers import DENY, MARK, takedown_sources, two_stage_mixture
from zephon_store.grain import ZephonSource
from zephon_store.load.denylist import MASK_KEY, DenyListError
from zephon_store.order import OrderOptions

NAMES = ["web", "code"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("grain_deny")
    web, code = takedown_sources(root)
    deny = root / "web.deny.json"
    deny.write_text(json.dumps({"ids": DENY["web"]}))
    mix = two_stage_mixture(root / "mix.json", {"web": (web, [0.8, 0.4]),
                                                "code": (code, [0.2, 0.6])})
    return {"web": web, "deny": str(deny), "mix": mix}


def _check(records: list[dict], denied: set) -> None:
    """Every record: denied ones (by ``(source, own id)``) blanked and flagged, the others
    intact and unflagged; no marked text anywhere; some denied ones read (all of them when
    the records hold every sample)."""
    seen, keys = set(), set()
    for r in records:
        key = (NAMES[int(r.get("_source", 0))], int(r["_seq"]))
        keys.add(key)
        if key in denied:
            seen.add(key)
            assert bool(r[MASK_KEY]) and r["text"] == "" and int(r["n"]) == 0, r
        else:
            assert not bool(r[MASK_KEY]) and r["text"] == f"{key[0]} {key[1]}", r
            assert int(r["n"]) == key[1]
        assert MARK not in r["text"]
    assert seen == denied & keys and seen


def _web_denied() -> set:
    return {("web", i) for i in DENY["web"]}


def _all_denied() -> set:
    return {(name, i) for name, ids in DENY.items() for i in ids}


def test_a_dataset_in_a_map_dataset_pipeline(data):
    src = ZephonSource(data["web"], with_seq=True, deny_list=data["deny"])
    ds = grain.MapDataset.source(src).shuffle(seed=1)
    _check([ds[i] for i in range(len(ds))], _web_denied())
    # Batched reads (Grain's _getitems, and read_batch) blank the same rows.
    _check(src._getitems(list(range(len(src)))), _web_denied())
    batch = ZephonSource(data["web"], deny_list=data["deny"]).read_batch(DENY["web"] + [1])
    assert batch[MASK_KEY].tolist() == [True, True, True, False]
    assert batch["text"] == ["", "", "", "web 1"] and batch["n"].tolist() == [0, 0, 0, 1]


def test_a_dataset_with_grain_process_workers(data):
    src = ZephonSource(data["web"], order=OrderOptions(seed=2), with_seq=True,
                       deny_list=data["deny"])
    ds = (grain.MapDataset.source(src).to_iter_dataset()
          .mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    records = list(ds)
    assert len(records) == len(src)
    _check(records, _web_denied())


def test_a_mixture_indexed_by_its_order_with_and_without_workers(data):
    src = ZephonSource(data["mix"], order=OrderOptions(seed=3), with_seq=True, global_batch=6,
                       deny_list={name: {"ids": ids} for name, ids in DENY.items()})
    ds = grain.MapDataset.source(src)
    _check([ds[i] for i in range(len(ds))], _all_denied())
    workers = ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    _check(list(workers), _all_denied())


def test_a_mixture_by_id_and_a_list_file_per_source(data, tmp_path):
    path = tmp_path / "mix.deny.json"
    path.write_text(json.dumps({"sources": {"code": {"ids": DENY["code"]}}}))
    src = ZephonSource(data["mix"], with_seq=True, global_batch=6, deny_list=str(path))
    records = src._getitems(np.arange(len(src)))
    # Only code's ids are denied: web's marked rows are read as they are.
    _check([r for r in records if int(r["_source"]) == 1], {("code", i) for i in DENY["code"]})
    web = [r for r in records if int(r["_source"]) == 0]
    assert len(web) == 60 and not any(bool(r[MASK_KEY]) for r in web)
    assert sum(MARK in r["text"] for r in web) == len(DENY["web"])


def test_a_list_for_other_data_is_refused(data, tmp_path):
    with pytest.raises(DenyListError, match="names the lists of a mixture"):
        ZephonSource(data["web"], deny_list={"web": {"ids": DENY["web"]}})
    with pytest.raises(DenyListError, match="outside the dataset"):
        path = tmp_path / "far.json"
        path.write_text(json.dumps({"ids": [60]}))
        ZephonSource(data["web"], deny_list=str(path))
