"""The order is pinned: golden vectors in formats/order/, and checkpoints of another algorithm
refused.

Every case of ``formats/order/*.json`` is recomputed from its inputs by the code the loader
runs. A difference means the order changed: that needs a new algorithm number
(``ORDER_ALGORITHM`` or ``MIXTURE_ALGORITHM``), so checkpoints of the old order are refused
instead of resuming into another one (docs/order.md, "Algorithm stability").
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

from tests.helpers import ROOT
from zephon_store.errors import StateMismatchError
from zephon_store.order import assign, interleave
from zephon_store.order import order as order_mod
from zephon_store.order.assign import step_owners
from zephon_store.order.mixture import MIXTURE_ALGORITHM
from zephon_store.order.order import ORDER_ALGORITHM, Order, OrderOptions
from zephon_store.testing import order_vectors as ov

VECTORS = pathlib.Path(ROOT) / "formats" / "order"
GOLDEN_TEXT = str(pathlib.Path(ROOT) / "formats" / "golden" / "v2" / "text")


def _pinned(filename: str) -> dict:
    return json.loads((VECTORS / filename).read_text())


def _cases(*filenames: str) -> list:
    return [pytest.param(f, c, id=f"{f}:{c['name']}")
            for f in filenames for c in _pinned(f)["cases"]]


def _changed_order_message(problem: str) -> str:
    return (f"{problem}\nThe order changed while the code still calls it order algorithm "
            f"{ORDER_ALGORITHM} and mixture algorithm {MIXTURE_ALGORITHM}. {ov.RULE} If the "
            "change was not meant, fix the code instead.")


# ------------------------------------------------------------------------- the vectors


def test_the_vectors_exist_for_every_part_of_the_order():
    assert sorted(p.name for p in VECTORS.glob("*.json")) == sorted(ov.FILES)
    total = sum((VECTORS / f).stat().st_size for f in ov.FILES)
    assert 10_000 < total < 400_000, total


@pytest.mark.parametrize("filename", sorted(ov.FILES))
def test_the_vectors_pin_the_current_algorithm_numbers(filename):
    pinned = _pinned(filename)["algorithms"]
    assert pinned == {"order": ORDER_ALGORITHM, "mixture": MIXTURE_ALGORITHM}, (
        f"formats/order/{filename} pins algorithms {pinned}, the code implements order "
        f"{ORDER_ALGORITHM} and mixture {MIXTURE_ALGORITHM}: after a bump, regenerate the "
        "vectors with 'python -m zephon_store.testing.order_vectors --write'")


@pytest.mark.parametrize("filename", sorted(ov.FILES))
def test_every_defined_case_is_pinned_with_its_inputs(filename):
    defined = {c["name"]: c["input"] for c in ov.FILES[filename]()}
    pinned = {c["name"]: c["input"] for c in _pinned(filename)["cases"]}
    assert json.loads(json.dumps(defined)) == pinned


@pytest.mark.parametrize("filename,case", _cases("sample_at.json", "mixture.json", "ranks.json",
                                                 "lanes_auto.json"))
def test_order_vector(filename, case):
    problem = ov.check_case(filename, case)
    assert problem is None, _changed_order_message(problem)


@pytest.mark.parametrize("filename,case", _cases("loader.json"))
def test_loader_vector(filename, case):
    """Whole runs of ZephonLoader: lanes="auto" resolved for the topology, the rank rule,
    the order and, for a mixture, the file's seed and a stage in steps."""
    pytest.importorskip("torch")
    problem = ov.check_case(filename, case)
    assert problem is None, _changed_order_message(problem)


def test_the_worked_example_of_docs_order_md_is_pinned():
    case = next(c for c in _pinned("sample_at.json")["cases"]
                if c["name"] == "docs/order.md worked example")
    assert case["output"]["ids"][:24] == [7, 21, 8, 4, 22, 11, 6, 23, 9, 5, 20, 10,
                                          19, 14, 2, 16, 15, 0, 17, 13, 1, 18, 12, 3]
    assert case["output"]["ids"][24:30] == [21, 3, 14, 23, 0, 15]


@pytest.mark.parametrize("filename,case", _cases("sample_at.json"))
def test_scalar_and_vectorised_sample_at_agree(filename, case):
    """One call over every position (several epochs: the stacked-tables path), one call
    per position, the positions reversed, and one call per range on a fresh Order."""
    inp = case["input"]
    rows = np.asarray(inp["rg_rows"], dtype=np.int64)
    positions = np.concatenate([np.arange(*r) for r in inp["positions"]])
    expected = case["output"]["ids"]
    order = Order(rows, OrderOptions(**inp["options"]))
    assert [int(order.sample_at(int(p))) for p in positions] == expected
    assert order.sample_at(positions[::-1])[::-1].tolist() == expected
    fresh = Order(rows, OrderOptions(**inp["options"]))
    per_range = [fresh.sample_at(np.arange(*r)) for r in inp["positions"]]
    assert np.concatenate(per_range).tolist() == expected
    # The inverse `zephon where` and the audit use lands on the same positions.
    epochs = positions // order.num_samples
    assert order.positions_of(np.asarray(expected), epochs).tolist() == positions.tolist()


@pytest.mark.parametrize("filename,case", [c for c in _cases("mixture.json")
                                           if "order" not in c.values[1]["input"]])
def test_the_inverse_of_the_interleave_reads_the_pinned_vectors(filename, case):
    """MixtureSchedule.position_of (the audit's way back) inverts the pinned interleave."""
    inp, out = case["input"], case["output"]
    sched = ov.schedule(inp)
    positions = np.concatenate([np.arange(*r) for r in inp["positions"]])
    source, index = np.asarray(out["source"]), np.asarray(out["index"])
    for k in np.unique(source).tolist():
        sel = source == k
        assert sched.position_of(k, index[sel]).tolist() == positions[sel].tolist()


@pytest.mark.parametrize("filename,case", [c for c in _cases("ranks.json")
                                           if c.values[1]["input"]["kind"] != "workers"
                                           and c.values[1]["input"]["kind"] != "tail"])
def test_the_simulator_reads_the_pinned_rank_rule(filename, case):
    """``zephon plan``'s view (step_owners, one sort of the whole step) agrees."""
    inp = case["input"]
    n = inp.get("world_size", inp.get("participants"))
    for cursor, owners in zip(inp["cursors"], case["output"]["owners"]):
        got = step_owners(cursor, inp["global_batch"], n, lanes=inp["lanes"],
                          ranks_per_node=inp["ranks_per_node"])
        assert got.tolist() == owners


# The vectors catch a change of each part: perturb it, and the check must fail.

def _problems(filename: str, *, only=None) -> list[str]:
    return [p for c in _pinned(filename)["cases"]
            if (only is None or only(c["input"])) and (p := ov.check_case(filename, c))]


def test_a_changed_permutation_fails_the_vectors(monkeypatch):
    monkeypatch.setattr(order_mod, "_TAG_WINDOW", order_mod._TAG_WINDOW + 1)
    problems = _problems("sample_at.json")
    assert len(problems) >= 10 and "ids[" in problems[0]


def test_a_changed_rank_rule_fails_the_vectors(monkeypatch):
    assign._lane_order_cached.cache_clear()
    assign._slot_offsets.cache_clear()
    monkeypatch.setattr(assign, "_GOLDEN_STEP", 0.5)
    try:
        problems = _problems("ranks.json", only=lambda i: i["kind"] == "ranks")
    finally:
        assign._lane_order_cached.cache_clear()
        assign._slot_offsets.cache_clear()
    assert problems and "owners[" in problems[0]


def test_a_changed_interleave_fails_the_vectors(monkeypatch):
    def rounding_down(n, left, total):   # floor(n*L/M) instead of rounding to nearest
        return (n * left) // total
    monkeypatch.setattr(interleave, "_left_count", rounding_down)
    assert _problems("mixture.json", only=lambda i: "order" not in i)


def test_a_changed_auto_lane_count_fails_the_vectors(monkeypatch):
    monkeypatch.setattr(order_mod, "AUTO_LANES_PER_NODE", 4)
    assert _problems("lanes_auto.json")


# ------------------------------------------------------------------------- the generator


def _copy_vectors(tmp_path) -> pathlib.Path:
    out = tmp_path / "order"
    shutil.copytree(VECTORS, out)
    return out


def test_check_names_the_changed_vector_and_the_rule(tmp_path, capsys):
    out = _copy_vectors(tmp_path)
    doc = json.loads((out / "lanes_auto.json").read_text())
    doc["cases"][2]["output"]["lanes"] += 1
    (out / "lanes_auto.json").write_text(json.dumps(doc))
    assert ov.main(["--check", "--dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert doc["cases"][2]["name"] in err and "new algorithm number" in err


def test_write_refuses_to_change_a_vector_under_the_same_algorithm(tmp_path, capsys):
    out = _copy_vectors(tmp_path)
    doc = json.loads((out / "lanes_auto.json").read_text())
    doc["cases"][0]["output"]["lanes"] = 3
    doctored = json.dumps(doc)
    (out / "lanes_auto.json").write_text(doctored)
    assert ov.main(["--write", "--dir", str(out)]) == 1
    assert "new algorithm number" in capsys.readouterr().err
    assert (out / "lanes_auto.json").read_text() == doctored     # nothing written


def test_write_regenerates_the_vectors_of_another_algorithm_number(tmp_path):
    out = _copy_vectors(tmp_path)
    doc = json.loads((out / "lanes_auto.json").read_text())
    doc["algorithms"]["order"] = ORDER_ALGORITHM - 1
    doc["cases"][0]["output"]["lanes"] = 3
    (out / "lanes_auto.json").write_text(json.dumps(doc))
    assert ov.main(["--write", "--dir", str(out)]) == 0
    assert (out / "lanes_auto.json").read_text() == (VECTORS / "lanes_auto.json").read_text()


# ------------------------------------------------------------------------- checkpoints


def _text_loader(**kw):
    from zephon_store import BatchOptions, as_numpy
    from zephon_store.torch import ZephonLoader

    return ZephonLoader(GOLDEN_TEXT, global_batch=4, batch=BatchOptions(collate=as_numpy), **kw)


@pytest.mark.parametrize("algorithm", [ORDER_ALGORITHM + 1, 0, True, 1.0, "1"])
def test_a_checkpoint_of_another_order_algorithm_is_refused(algorithm):
    pytest.importorskip("torch")
    loader = _text_loader(seed=3)
    state = loader.state_dict()
    state["order"]["algorithm"] = algorithm
    with pytest.raises(StateMismatchError) as err:
        _text_loader(seed=3).load_state_dict(state)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"order algorithm {algorithm!r}" in msg and f"order algorithm {ORDER_ALGORITHM}" in msg


def test_a_checkpoint_of_another_mixture_algorithm_is_refused():
    pytest.importorskip("torch")
    from zephon_store import BatchOptions, as_numpy
    from zephon_store.format.mixture_file import MixtureSpec
    from zephon_store.torch import ZephonLoader

    spec = {"sources": [{"name": "a", "url": "formats/golden/v2/text", "weight": "1/2"},
                        {"name": "b", "url": "formats/golden/v1/text", "weight": "1/2"}]}

    def loader():
        return ZephonLoader(MixtureSpec.from_dict(spec, base_dir=str(ROOT)), global_batch=4,
                            batch=BatchOptions(columns=["id"], collate=as_numpy))

    first = loader()
    next(iter(first))
    state = first.state_dict()
    mixture = json.loads(state["mixture"])
    mixture["schedule"]["algorithm"] = MIXTURE_ALGORITHM + 1
    state["mixture"] = json.dumps(mixture)
    with pytest.raises(StateMismatchError) as err:
        loader().load_state_dict(state)
    msg = str(err.value)
    assert "\n" not in msg
    assert (f"mixture algorithm {MIXTURE_ALGORITHM + 1}" in msg
            and f"mixture algorithm {MIXTURE_ALGORITHM}" in msg)


def test_a_checkpoint_of_this_algorithm_resumes():
    pytest.importorskip("torch")
    first = _text_loader(seed=3)
    batches = iter(first)
    next(batches)
    resumed = _text_loader(seed=3)
    resumed.load_state_dict(first.state_dict())
    assert resumed.state_dict()["order"]["algorithm"] == ORDER_ALGORITHM
    assert next(iter(resumed))["id"].tolist() == next(batches)["id"].tolist()


@pytest.mark.parametrize("algorithm", [True, 1.0, "1", ORDER_ALGORITHM + 1])
def test_order_options_of_another_algorithm_are_refused(algorithm):
    """The same exactness for every reader of options (run logs, plan, the live loader)."""
    with pytest.raises(ValueError, match=f"order algorithm {algorithm!r} is not known"):
        OrderOptions(algorithm=algorithm)
    with pytest.raises(ValueError, match="is not known"):
        OrderOptions.from_dict({**OrderOptions().to_dict(), "algorithm": algorithm})
