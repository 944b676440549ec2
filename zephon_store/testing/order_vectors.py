#!/usr/bin/env python3
"""Golden vectors of the order: fixed inputs, and what the loader's order code makes of them.

``formats/order/*.json`` hold, next to each other, the inputs of a case and its outputs:
stream positions -> sample ids (:meth:`Order.sample_at`), mixture positions -> (source, id)
(the stage schedule and :class:`~zephon_store.mix.mixed.MixedOrder`), which rank, node and
worker reads each position (:mod:`zephon_store.order.assign`), what ``lanes="auto"`` stands
for (:meth:`OrderOptions.resolved`), and whole runs of :class:`ZephonLoader` over the golden
datasets. ``tests/unit/order/test_order_golden.py`` recomputes every case from its inputs in CI.

The rule: the outputs may only change together with an algorithm number,
``ORDER_ALGORITHM`` (``zephon_store/order/order.py``: ``sample_at``, the rank rule and
``lanes="auto"``) or ``MIXTURE_ALGORITHM`` (``zephon_store/order/mixture.py``: the mixture
interleave). Checkpoints record both numbers and a loader refuses another one, so a run
never resumes into a different order that still calls itself the same algorithm.
``--write`` enforces it: it refuses to change an output while the numbers stay the same.

    python -m zephon_store.testing.order_vectors --check   # exit 1 if any output changed
    python -m zephon_store.testing.order_vectors --write   # after bumping an algorithm number
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import numpy as np

from ..order.assign import (
    batch_owner,
    batches_for_worker,
    positions_for_participant,
    positions_for_rank,
    tail_positions_for_rank,
)
from ..order.mixture import MIXTURE_ALGORITHM, MixtureSchedule
from ..order.order import ORDER_ALGORITHM, Order, OrderOptions

__all__ = ["FILES", "RULE", "VECTORS_DIR", "build", "check", "check_case", "compute", "main",
           "schedule", "write"]

# The checkout this module lives in (zephon_store/testing/ -> the repository root).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VECTORS_DIR = os.path.join(ROOT, "formats", "order")
RULE = ("Changing any output of these vectors needs a new algorithm number: ORDER_ALGORITHM "
        "(zephon_store/order/order.py) for sample_at, the rank rule and lanes='auto', "
        "MIXTURE_ALGORITHM (zephon_store/order/mixture.py) for the mixture interleave; "
        "checkpoints of the old number are then refused. Regenerate with "
        "'python -m zephon_store.testing.order_vectors --write' after the bump.")

_TEXT = [6, 6, 6, 6, 6, 6, 4]           # formats/golden/v2/text: 40 samples, last one short
_UNEVEN = [100, 3, 57, 1, 250, 64, 64, 9, 0, 31, 128, 2]
_MANY_SMALL = [(i * 7) % 5 + 1 for i in range(300)]      # 300 row groups of 1-5 rows
_BIG = [20] * 2000


def _ranges(*r: tuple[int, ...]) -> list[list[int]]:
    return [list(x) for x in r]


def _opts(seed=0, shuffle=True, window_blocks=8, lanes="auto") -> dict:
    return {"seed": seed, "shuffle": shuffle, "window_blocks": window_blocks, "lanes": lanes}


# ------------------------------------------------------------------------------- inputs

def _sample_at_cases() -> list[dict]:
    three_epochs = _ranges((0, 120))
    cases = [
        ("text sequential", _TEXT, _opts(shuffle=False), three_epochs),
        ("text shuffled default", _TEXT, _opts(), three_epochs),
        ("text seed 7", _TEXT, _opts(seed=7), three_epochs),
        ("text seed 2**64-1", _TEXT, _opts(seed=2**64 - 1), three_epochs),
        ("text window_blocks 1", _TEXT, _opts(seed=1, window_blocks=1), three_epochs),
        ("text window_blocks 2 lanes 4 (P = 2)", _TEXT, _opts(seed=1, window_blocks=2, lanes=4),
         three_epochs),
        ("text window_blocks 1 lanes 3", _TEXT, _opts(seed=5, window_blocks=1, lanes=3),
         three_epochs),
        ("text window_blocks 1 lanes 7", _TEXT, _opts(seed=5, window_blocks=1, lanes=7),
         three_epochs),
        ("text lanes 1", _TEXT, _opts(seed=5, lanes=1), three_epochs),
        ("docs/order.md worked example", [4] * 6, _opts(seed=7, window_blocks=1, lanes=3),
         _ranges((0, 48))),
        ("single row group", [50], _opts(seed=3, window_blocks=1, lanes=4),
         _ranges((0, 150))),
        ("single row group sequential", [50], _opts(shuffle=False), _ranges((45, 105))),
        ("uneven row groups", _UNEVEN, _opts(seed=11, window_blocks=2, lanes=3),
         _ranges((0, 96), (600, 720), (1418, 1436), (10**12, 10**12 + 24))),
        ("uneven row groups window_blocks 20", _UNEVEN, _opts(seed=11, window_blocks=20),
         _ranges((0, 64), (709, 773))),
        ("many small row groups", _MANY_SMALL, _opts(seed=2, window_blocks=4, lanes=8),
         _ranges((0, 96), (0, 895, 37), (895, 960), (5 * 895 + 3, 5 * 895 + 40),
                 (3 * 10**15, 3 * 10**15 + 16))),
        ("many small row groups default", _MANY_SMALL, _opts(seed=2), _ranges((0, 64))),
        ("2000 row groups lanes 64", _BIG, _opts(seed=9, lanes=64),
         _ranges((0, 128), (0, 40000, 997), (39990, 40070), (7 * 40000 + 5, 7 * 40000 + 21))),
        ("2000 row groups lanes 5040 (P = 240)", _BIG, _opts(seed=9, lanes=5040),
         _ranges((0, 64), (123456789, 123456789 + 16))),
    ]
    return [{"name": n, "input": {"rg_rows": rows, "options": o, "positions": p}}
            for n, rows, o, p in cases]


def _mixture_cases() -> list[dict]:
    first = _ranges((0, 40))
    cases = [
        {"name": "three sources, two stages", "input": {
            "names": ["web", "code", "math"],
            "stages": [[0, ["1/2", "3/10", "1/5"]], [10, ["1/5", "3/10", "1/2"]]],
            "positions": _ranges((0, 60), (10**12, 10**12 + 20))}},
        {"name": "thirds, then a source dropped", "input": {
            "names": ["a", "b", "c"],
            "stages": [[0, ["1/3", "1/3", "1/3"]], [7, ["7/10", "3/10", "0"]]],
            "positions": first}},
        {"name": "five sources, uneven weights", "input": {
            "names": ["a", "b", "c", "d", "e"],
            "stages": [[0, ["1/16", "3/16", "1/4", "1/8", "3/8"]]],
            "positions": _ranges((0, 64), (999983, 1000015))}},
        {"name": "capped source, renormalize", "input": {
            "names": ["big", "small"], "stages": [[0, ["1/2", "1/2"]]],
            "max_epochs": [None, 1], "epoch_sizes": [None, 10], "policy": "renormalize",
            "positions": first}},
        {"name": "capped source, error", "input": {
            "names": ["big", "small"], "stages": [[0, ["3/4", "1/4"]]],
            "max_epochs": [None, 2], "epoch_sizes": [None, 5], "policy": "error",
            "positions": _ranges((0, 42))}},
        {"name": "mixture file: a stage in samples and one in steps", "input": {
            "spec": {"stages": [{"name": "warmup", "start": {"samples": 0}},
                                {"name": "main", "start": {"samples": 12}},
                                {"name": "late", "start": {"steps": 5}}],
                     "sources": [{"name": "web", "url": "web", "weights": ["1/2", "1/4", "0"]},
                                 {"name": "code", "url": "code",
                                  "weights": ["1/2", "1/4", "1/2"]},
                                 {"name": "math", "url": "math",
                                  "weights": ["0", "1/2", "1/2"]}]},
            "global_batch": 8, "positions": _ranges((0, 60))}},
        {"name": "golden sources through MixedOrder", "input": {
            "spec": {"seed": 41,
                     "stages": [{"name": "s0", "start": {"samples": 0}},
                                {"name": "s1", "start": {"steps": 4}}],
                     "sources": [{"name": "text2", "url": "formats/golden/v2/text",
                                  "weights": ["1/2", "1/5"]},
                                 {"name": "text1", "url": "formats/golden/v1/text",
                                  "weights": ["1/4", "2/5"]},
                                 {"name": "tokens", "url": "formats/golden/v2/tokens",
                                  "weights": ["1/4", "2/5"], "max_epochs": 2}],
                     "exhaustion": "renormalize"},
            "global_batch": 6, "order": {"window_blocks": 1},
            "positions": _ranges((0, 100), (150, 200))}},
    ]
    return cases


def _ranks_cases() -> list[dict]:
    def rule(name, b, w, rpn, lanes, cursors):
        return {"name": name, "input": {"kind": "ranks", "global_batch": b, "world_size": w,
                                        "ranks_per_node": rpn, "lanes": lanes,
                                        "cursors": cursors}}

    def part(name, b, n, rpn, lanes, cursors):
        return {"name": name, "input": {"kind": "participants", "global_batch": b,
                                        "participants": n, "ranks_per_node": rpn,
                                        "lanes": lanes, "cursors": cursors}}

    return [
        rule("one rank", 8, 1, 1, 1, [0, 8]),
        rule("one lane, 4 ranks", 16, 4, 1, 1, [0, 16, 1000]),
        rule("4 lanes divide the batch", 8, 2, 1, 4, [0, 8, 13]),
        rule("2 nodes of 4, 16 lanes", 32, 8, 4, 16, [0, 32, 96, 1001]),
        rule("3 nodes of 2, 6 lanes, batch 12", 12, 6, 2, 6, [0, 12, 30]),
        rule("lanes do not divide the batch (interleaved)", 24, 6, 2, 10, [0, 24, 48, 77]),
        rule("5 nodes of 2, 7 lanes", 20, 10, 2, 7, [0, 20, 40, 60]),
        rule("8 ranks per node, 128 lanes", 64, 16, 8, 128, [0, 64, 640]),
        part("participants that do not divide the batch", 10, 3, 1, 1, [0, 10]),
        part("participants, lanes, nodes", 17, 5, 2, 6, [0, 17, 34]),
        part("more participants than positions", 3, 5, 1, 2, [0, 3]),
        {"name": "short last step", "input": {"kind": "tail", "cursor": 100, "end": 105,
                                              "world_size": 2, "ranks_per_node": 1,
                                              "lanes": 1}},
        {"name": "short last step with lanes", "input": {"kind": "tail", "cursor": 36,
                                                         "end": 47, "world_size": 4,
                                                         "ranks_per_node": 2, "lanes": 6}},
        {"name": "no workers", "input": {"kind": "workers", "num_workers": 0, "start": 0,
                                         "stop": 6}},
        {"name": "3 workers", "input": {"kind": "workers", "num_workers": 3, "start": 0,
                                        "stop": 14}},
        {"name": "4 workers after a resume", "input": {"kind": "workers", "num_workers": 4,
                                                       "start": 5, "stop": 19}},
    ]


def _lanes_auto_cases() -> list[dict]:
    rows = [  # num_blocks, num_samples, window_blocks, nodes, node_batch
        (20000, 400000, 8, 1, None), (20000, 400000, 8, 1, 64), (20000, 400000, 8, 8, 64),
        (20000, 400000, 8, 125, 64), (20000, 400000, 8, 128, 64), (2000, 40000, 8, 8, 64),
        (2000, 40000, 8, 64, 64), (2000, 40000, 8, 125, 64), (2000, 40000, 8, 128, 64),
        (2000, 40000, 8, 64, None), (2000, 40000, 8, 64, 12), (2000, 40000, 8, 3, 6),
        (100, 100, 8, 4, 4), (100, 100, 8, 20, 4), (100, 100, 8, 20, None), (7, 40, 1, 2, 4),
        (7, 40, 1, 3, 2), (7, 40, 8, 2, 4), (1, 50, 1, 4, 2), (10**6, 10**8, 4, 1000, 96),
    ]
    return [{"name": f"{nb} row groups, {n} samples, window_blocks {wb}, {m} nodes, "
                     f"node batch {nbatch}",
             "input": {"num_blocks": nb, "num_samples": n, "window_blocks": wb, "nodes": m,
                       "node_batch": nbatch}}
            for nb, n, wb, m, nbatch in rows]


def _loader_cases() -> list[dict]:
    text, docs, tokens = ("formats/golden/v2/text", "formats/golden/v2/docs",
                          "formats/golden/v2/tokens")

    def case(name, dataset, b, w, rpn, steps, **kw):
        return {"name": name, "input": {"dataset": dataset, "global_batch": b,
                                        "world_size": w, "ranks_per_node": rpn,
                                        "max_steps": steps, **kw}}

    mixture = {"seed": 5,
               "stages": [{"name": "a", "start": {"samples": 0}},
                          {"name": "b", "start": {"steps": 3}}],
               "sources": [{"name": "text", "url": text, "weights": ["3/4", "1/4"]},
                           {"name": "tokens", "url": tokens, "weights": ["1/4", "3/4"]}]}
    return [
        case("text, one rank, default order", text, 8, 1, 1, 12),
        case("text, sequential", text, 8, 2, 1, 6, order={"shuffle": False}),
        case("text, 4 ranks on 2 nodes, lanes auto", text, 8, 4, 2, 10, seed=3,
             order={"window_blocks": 1}),
        case("text, 6 ranks, 6 nodes, lanes auto", text, 12, 6, 1, 8, seed=3,
             order={"window_blocks": 1}),
        case("docs, lanes 2, 2 ranks", docs, 4, 2, 1, 12, seed=8,
             order={"window_blocks": 1, "lanes": 2}),
        case("tokens, 3 ranks, epochs 1.5, short last step", tokens, 6, 3, 3, None, seed=1,
             epochs=1.5, drop_last=False),
        case("mixture file with a seed and a stage in steps", mixture, 4, 2, 1, 15,
             columns=["id"]),
    ]


FILES: dict[str, Callable[[], list[dict]]] = {
    "sample_at.json": _sample_at_cases,
    "mixture.json": _mixture_cases,
    "ranks.json": _ranks_cases,
    "lanes_auto.json": _lanes_auto_cases,
    "loader.json": _loader_cases,
}
_ABOUT = {
    "sample_at.json": "Order(rg_rows, OrderOptions(**options)).sample_at(positions): the sample "
                      "id at each stream position (positions: [start, stop(, step)] ranges).",
    "mixture.json": "Mixture position -> (source, index in its own stream) by the stage "
                    "schedule; with golden sources, -> (source, the source's sample id) by "
                    "MixedOrder (seed from the file).",
    "ranks.json": "The rank rule: the rank (or participant) that reads each position of the "
                  "step at each cursor; the short last step; the DataLoader worker rule.",
    "lanes_auto.json": "OrderOptions(window_blocks=...).resolved(num_blocks, num_samples, "
                       "nodes=, node_batch=).lanes: what lanes='auto' stands for.",
    "loader.json": "ZephonLoader(dataset, with_seq=True) on each rank: the resolved order "
                   "options and the _seq (and _source) of every batch.",
}


# ------------------------------------------------------------------------------- outputs

def _positions(ranges: list[list[int]]) -> np.ndarray:
    return np.concatenate([np.arange(*r, dtype=np.int64) for r in ranges])


def _sample_at(inp: dict) -> dict:
    order = Order(np.asarray(inp["rg_rows"], dtype=np.int64), OrderOptions(**inp["options"]))
    return {"effective_lanes": order.effective_lanes, "window_samples": order.window_samples,
            "ids": order.sample_at(_positions(inp["positions"])).tolist()}


def schedule(inp: dict) -> MixtureSchedule:
    """The stage schedule of a ``mixture.json`` case's inputs (weights, or a mixture file)."""
    if "spec" not in inp:
        return MixtureSchedule([tuple(s) for s in inp["stages"]], names=inp["names"],
                               max_epochs=inp.get("max_epochs"),
                               epoch_sizes=inp.get("epoch_sizes"),
                               policy=inp.get("policy", "error"))
    from ..format.mixture_file import MixtureSpec

    spec = MixtureSpec.from_dict(inp["spec"])
    return MixtureSchedule.from_spec(spec, global_batch=inp["global_batch"],
                                     epoch_sizes=[40] * len(spec.sources))


def _mixture(inp: dict) -> dict:
    positions = _positions(inp["positions"])
    if "spec" in inp and "order" in inp:
        from ..format.mixture_file import MixtureSpec
        from ..load.source import open_mixture
        from ..mix.mixed import MixedOrder

        spec = MixtureSpec.from_dict(inp["spec"], base_dir=ROOT)
        with open_mixture(spec, global_batch=inp["global_batch"], columns=["id"]) as mix:
            order = MixedOrder(mix, OrderOptions(seed=spec.seed, **inp["order"]))
            source, ids = order.locate(positions)
            return {"starts": [s for s, _ in mix.schedule.stages], "end": mix.schedule.end,
                    "source": source.tolist(), "id": ids.tolist()}
    sched = schedule(inp)
    source, index = sched.locate(positions)
    return {"starts": [s for s, _ in sched.stages], "end": sched.end,
            "source": np.asarray(source).tolist(), "index": np.asarray(index).tolist()}


def _ranks(inp: dict) -> dict:
    kind = inp["kind"]
    if kind == "workers":
        n, start, stop = inp["num_workers"], inp["start"], inp["stop"]
        return {"batches": [list(batches_for_worker(k, n, start, stop))
                            for k in range(max(1, n))],
                "owner": [batch_owner(i, n) for i in range(start, stop)]}
    if kind == "tail":
        return {"positions": [tail_positions_for_rank(
            inp["cursor"], inp["end"], inp["world_size"], r, lanes=inp["lanes"],
            ranks_per_node=inp["ranks_per_node"]).tolist() for r in range(inp["world_size"])]}
    b, lanes, rpn = inp["global_batch"], inp["lanes"], inp["ranks_per_node"]
    n = inp["world_size"] if kind == "ranks" else inp["participants"]
    owners = []
    for cursor in inp["cursors"]:
        owner = np.full(b, -1, dtype=np.int64)
        for i in range(n):
            if kind == "ranks":   # the loader's call (RankStream.positions)
                mine = positions_for_rank(cursor, b, n, i, lanes=lanes, ranks_per_node=rpn)
            else:                 # live elasticity's replica groups
                mine = positions_for_participant(cursor, b, n, i, lanes=lanes,
                                                 ranks_per_node=rpn)
            owner[mine - cursor] = i
        owners.append(owner.tolist())
    return {"owners": owners}


def _lanes_auto(inp: dict) -> dict:
    options = OrderOptions(window_blocks=inp["window_blocks"])
    resolved = options.resolved(inp["num_blocks"], inp["num_samples"], nodes=inp["nodes"],
                                node_batch=inp["node_batch"])
    return {"lanes": resolved.lanes}


def _loader(inp: dict) -> dict:
    from ..format.mixture_file import MixtureSpec
    from ..load.options import BatchOptions, StopOptions, as_numpy
    from ..order.topology import Topology
    from ..torch.loader import ZephonLoader

    data = inp["dataset"]
    mixture = isinstance(data, dict)
    kw = {"seed": inp["seed"]} if "seed" in inp else {}
    if "order" in inp:
        kw = {"order": OrderOptions(**{"seed": inp.get("seed", 0), **inp["order"]})}
    out: dict = {"order": None, "seq": []}
    if mixture:
        out["source"] = []
    for rank in range(inp["world_size"]):
        dataset = (MixtureSpec.from_dict(data, base_dir=ROOT) if mixture
                   else os.path.join(ROOT, data))
        loader = ZephonLoader(
            dataset, topology=Topology(inp["global_batch"], inp["world_size"], rank,
                                       ranks_per_node=inp["ranks_per_node"]),
            batch=BatchOptions(columns=inp.get("columns"), with_seq=True, collate=as_numpy),
            stop=StopOptions(max_steps=inp.get("max_steps"), epochs=inp.get("epochs"),
                             drop_last=inp.get("drop_last", True)), **kw)
        batches = list(loader)
        out["order"] = loader.state_dict()["order"]
        out["seq"].append([b["_seq"].tolist() for b in batches])
        if mixture:
            out["source"].append([b["_source"].tolist() for b in batches])
        loader.dataset.close()
    return out


_COMPUTE: dict[str, Callable[[dict], dict]] = {
    "sample_at.json": _sample_at, "mixture.json": _mixture, "ranks.json": _ranks,
    "lanes_auto.json": _lanes_auto, "loader.json": _loader,
}


def compute(filename: str, inp: dict) -> dict:
    """The outputs of one case of ``filename`` (a key of :data:`FILES`) from its inputs."""
    return _COMPUTE[filename](inp)


def _algorithms() -> dict[str, int]:
    return {"order": ORDER_ALGORITHM, "mixture": MIXTURE_ALGORITHM}


def build(filename: str) -> dict:
    """The content of one vector file as this code computes it (inputs from :data:`FILES`)."""
    cases = [{**c, "output": compute(filename, c["input"])} for c in FILES[filename]()]
    return {"about": _ABOUT[filename], "rule": RULE, "algorithms": _algorithms(),
            "cases": cases}


# ------------------------------------------------------------------------------- files

def _dump(obj, pad: str = "") -> str:
    """JSON with short containers and lists of numbers on one line: readable, small diffs."""
    flat = json.dumps(obj)
    children = (list(obj.values()) if isinstance(obj, dict)
                else obj if isinstance(obj, list) else [])
    if len(flat) <= 60 or not any(isinstance(v, (dict, list)) for v in children):
        return flat
    inner = pad + " "
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {_dump(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return "[\n" + ",\n".join(inner + _dump(v, inner) for v in obj) + "\n" + pad + "]"


def _read(directory: str, filename: str) -> dict | None:
    path = os.path.join(directory, filename)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _first_difference(expected, got, where: str = "") -> str:
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in expected.keys() | got.keys():
            if expected.get(key) != got.get(key):
                return _first_difference(expected.get(key), got.get(key), f"{where}.{key}")
    if isinstance(expected, list) and isinstance(got, list):
        for i, (a, b) in enumerate(zip(expected, got)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
        if len(expected) != len(got):
            return f"{where or 'output'}: {len(expected)} values pinned, {len(got)} computed"
    return f"{where or 'output'}: pinned {expected!r}, computed {got!r}"


def check_case(filename: str, case: dict) -> str | None:
    """None when this code computes the outputs pinned in ``case``; else the first one that
    differs, in one line."""
    got = compute(filename, case["input"])
    if got == case["output"]:
        return None
    return f"{filename} case {case['name']!r}: " + _first_difference(case["output"], got)


def check(directory: str = VECTORS_DIR) -> list[str]:
    """One line per difference between the vector files in ``directory`` and this code."""
    problems = []
    for filename in FILES:
        pinned = _read(directory, filename)
        if pinned is None:
            problems.append(f"{filename}: missing from {directory}")
            continue
        if pinned["algorithms"] != _algorithms():
            problems.append(f"{filename}: pins algorithms {pinned['algorithms']}, the code "
                            f"implements {_algorithms()}; regenerate the vectors (--write)")
            continue
        problems += [p for case in pinned["cases"]
                     if (p := check_case(filename, case)) is not None]
        names = [c["name"] for c in FILES[filename]()]
        missing = [n for n in names if n not in {c["name"] for c in pinned["cases"]}]
        if missing:
            problems.append(f"{filename}: cases {missing} are defined but not pinned; "
                            "write them (--write)")
    return problems


def write(directory: str = VECTORS_DIR) -> list[str]:
    """Write every vector file; refused (nothing written, the reasons returned) when an
    output pinned for the same inputs would change under the same algorithm numbers."""
    built = {filename: build(filename) for filename in FILES}
    refused = []
    for filename, new in built.items():
        old = _read(directory, filename)
        if old is None or old["algorithms"] != new["algorithms"]:
            continue
        fresh = {c["name"]: c for c in new["cases"]}
        for case in old["cases"]:
            now = fresh.get(case["name"])
            if now and now["input"] == case["input"] and now["output"] != case["output"]:
                refused.append(f"{filename} case {case['name']!r}: "
                               + _first_difference(case["output"], now["output"]))
    if refused:
        return refused
    os.makedirs(directory, exist_ok=True)
    for filename, content in built.items():
        tmp = os.path.join(directory, f".{filename}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_dump(content) + "\n")
        os.replace(tmp, os.path.join(directory, filename))
    return []


def main(argv: list[str] | None = None) -> int:
    """``--check`` (the default) or ``--write`` the vectors; 0 ok, 1 differences, 2 usage."""
    parser = argparse.ArgumentParser(prog="python -m zephon_store.testing.order_vectors",
                                     description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare (the default)")
    mode.add_argument("--write", action="store_true", help="regenerate the vector files")
    parser.add_argument("--dir", default=VECTORS_DIR, help="the vectors' folder")
    args = parser.parse_args(argv)
    if args.write:
        refused = write(args.dir)
        for line in refused:
            print(f"refused: {line}", file=sys.stderr)
        if refused:
            print(f"order vectors not written: the outputs above changed under the same "
                  f"algorithm numbers {_algorithms()}. {RULE}", file=sys.stderr)
            return 1
        print(f"wrote {len(FILES)} order vector files to {args.dir}")
        return 0
    problems = check(args.dir)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(RULE, file=sys.stderr)
        return 1
    print(f"order vectors in {args.dir} match (algorithms {_algorithms()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
