"""A mixture described and planned without reading a shard byte (manifests only): what
``zephon info mix.toml`` and ``zephon plan --mixture mix.toml`` print.

:func:`mixture_info` lists the sources (size, dataset_id, cap) and the stages (weights, and
their starts in samples where the global batch places them); :func:`plan_mixture` gives the
sample ids each rank reads at given steps, per stage the realised proportions and the epochs
each source consumed, where a capped source runs out, and the read figures of the simulator
(:mod:`zephon_store.runs.simulate`), through the loader's own order and seed rule.

>>> import os
>>> mix = os.path.join(tmp, "mix.toml")
>>> stages = '[[stages]]\\nname = "all"\\nstart = { samples = 0 }\\n'
>>> source = '[[sources]]\\nname = "{}"\\nurl = "{}"\\nweights = {{ all = 0.5 }}\\n'
>>> _ = open(mix, "w").write(stages + source.format("a", tiny_dataset)
...                          + source.format("b", tiny_dataset))
>>> info = mixture_info(mix)
>>> [s["name"] for s in info["sources"]], info["mixture_id"].startswith("mix:")
(['a', 'b'], True)
>>> plan = plan_mixture(mix, global_batch=4, world_size=2, steps=(0, 1))
>>> [len(ids) for ids in plan.to_dict()["steps"][0]["ranks"]]
[2, 2]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import MixtureError, ZephonError

ID_NOTE = ("stage starts in steps: the mixture_id depends on the global batch (it hashes the "
           "stages in samples); pass --global-batch B")


class PlanRequestError(ZephonError, ValueError):
    """A plan that cannot be made as asked: an order or topology option out of range, a
    seed that disagrees with the mixture file's, or a cursor past the mixture's end."""


def _open(path: str, global_batch: int | None):
    """``(parts, mixture)``: the file's :class:`~zephon_store.load.source.MixtureParts`
    and, through the normaliser, its mixture; None when stage starts in steps need a
    global batch and none was given."""
    from ..load.source import open_parts, open_source

    parts = open_parts(path, as_mixture=True)
    try:
        # No columns: a plan reads the order, never a record, so sources that hold
        # different columns plan as they train.
        return parts, open_source(parts, global_batch=global_batch, columns=())
    except MixtureError:
        if global_batch is not None or not any(st.unit == "steps" for st in parts.spec.stages):
            raise
        return parts, None   # stage starts in steps: samples need --global-batch


def mixture_info(path: str, global_batch: int | None = None) -> dict[str, Any]:
    """A mixture file described: its sources (size, dataset_id, cap) and stages (weights;
    with starts in steps, their start samples and ``mixture_id`` need ``global_batch``,
    and are None without it, ``mixture_id_note`` saying so).

    With the module's example file: ``mixture_info(mix, global_batch=512)["stages"][0]``
    has ``"start": {"samples": 0}`` and ``"start_sample": 0``.
    """
    parts, mix = _open(path, global_batch)
    spec, sources = parts.spec, parts.sources
    starts = [s for s, _ in mix.schedule.stages] if mix is not None else [None] * len(
        spec.stages)
    sample_weights = ([[float(w) for w in ws] for _, ws in mix.schedule.stages]
                      if mix is not None else None)
    info = {
        "mixture": path, "weight_unit": spec.weight_unit, "exhaustion": spec.exhaustion,
        "seed": spec.seed,
        "sources": [{"name": s.name, "url": s.url, "dataset_id": d.dataset_id,
                     "num_samples": d.num_samples, "num_row_groups": d.manifest.num_row_groups,
                     "total_bytes": d.manifest.total_bytes, "max_epochs": s.max_epochs,
                     "seq_len": (d.manifest.packing or {}).get("seq_len")}
                    for s, d in zip(spec.sources, sources)],
        "stages": [{"name": st.name, "start": {st.unit: st.start}, "start_sample": starts[j],
                    "weights": {s.name: str(s.weights[j]) for s in spec.sources},
                    **({"sample_weights": dict(zip(spec.source_names, sample_weights[j]))}
                       if sample_weights is not None and spec.weight_unit != "samples"
                       else {})}
                   for j, st in enumerate(spec.stages)],
    }
    # The id hashes the schedule in samples: with starts in steps, that needs the batch.
    info["mixture_id"] = mix.dataset_id if mix is not None else None
    if mix is None:
        info["mixture_id_note"] = ID_NOTE
    return info


@dataclass(frozen=True)
class MixturePlan:
    """:func:`plan_mixture`'s answer: ``to_dict()`` is ``zephon plan --mixture --json``'s
    document; ``schedule`` the mixture's :class:`~zephon_store.order.mixture.MixtureSchedule`."""

    document: dict[str, Any]
    schedule: Any

    def to_dict(self) -> dict[str, Any]:
        return self.document


def _plan_inputs(path: str, spec, *, global_batch: int, world_size: int,
                 ranks_per_node: int, seed: int | None, shuffle: bool,
                 window_blocks: int | None):
    """The order options (the file's seed unless ``seed``; a disagreeing one refused: the
    loader's own rule) and the topology, each refusal a :class:`PlanRequestError`."""
    from ..load.order_inputs import mixture_seed
    from ..order.order import OrderOptions
    from ..order.topology import Topology

    try:
        seed = mixture_seed(spec.seed, seed, origin=path)
    except MixtureError as exc:
        raise PlanRequestError(str(exc)) from None
    kw = {"seed": seed, "shuffle": shuffle}
    if window_blocks is not None:
        kw["window_blocks"] = window_blocks
    try:
        options = OrderOptions(**kw)
        topology = Topology(global_batch=global_batch, world_size=world_size,
                            ranks_per_node=min(ranks_per_node, world_size))
    except (ValueError, TypeError) as exc:
        raise PlanRequestError(str(exc)) from exc
    return options, topology


def _stage_rows(schedule, names: list[str], b: int, stop: int) -> list[dict]:
    """Per stage up to ``stop``: its span, weights, realised proportions, epochs consumed."""
    rows = []
    for row in schedule.realized(0, stop):
        rows.append({
            "stage": row["name"], "start": row["start"], "stop": row["stop"],
            "start_step": row["start"] // b, "derived": row["derived"],
            "weights": dict(zip(names, row["weights"])),
            "proportions": dict(zip(names, [round(p, 6) for p in row["proportions"]])),
            "epochs_consumed": dict(zip(names, [None if e is None else round(e, 4)
                                                for e in row.get("epochs", [None] * len(names))])),
        })
    return rows


def plan_mixture(path: str, *, global_batch: int, world_size: int, ranks_per_node: int = 8,
                 cursor: int = 0, steps: tuple[int, int] = (0, 2),
                 simulate_steps: int | None = None, seed: int | None = None,
                 shuffle: bool = True, window_blocks: int | None = None) -> MixturePlan:
    """The mixture file at ``path`` planned for ``world_size`` ranks reading ``global_batch``
    samples a step from ``cursor``: the ``[source, id]`` pairs per rank for ``steps`` (a
    range of steps), per stage the realised proportions, each source's epochs consumed and
    where a capped source runs out, plus the simulator's read figures. A mixture that ends
    (a capped source runs out, exhaustion "error") ends the plan where the loader's stream
    ends: after its last full step.

    With the module's example file, ``plan_mixture(mix, global_batch=4, world_size=2)
    .to_dict()["steps"][0]["ranks"][0]`` is rank 0's ``[source, id]`` pairs at step 0, such
    as ``[['a', 17], ['b', 3]]``.
    """
    from ..mix.mixed import MixedOrder
    from ..order.assign import step_cursor
    from .simulate import rank_ids, simulate

    b = global_batch
    parts, mix = _open(path, b)
    spec = parts.spec
    options, topology = _plan_inputs(path, spec, global_batch=b, world_size=world_size,
                                     ranks_per_node=ranks_per_node, seed=seed,
                                     shuffle=shuffle, window_blocks=window_blocks)
    order = MixedOrder(mix, options)
    schedule = mix.schedule
    names = list(mix.names)
    end = schedule.end
    last_step = None if end is None else (end - cursor) // b - 1
    if last_step is not None and last_step < 0:
        raise PlanRequestError(f"{path}: the mixture ends at sample {end} "
                               f"({schedule.end_reason()}), before a full step of {b} from "
                               f"--cursor {cursor}: the loader reads no step there")
    lo, hi = steps
    if last_step is not None:
        hi = min(hi, last_step + 1)
    planned = []
    for s in range(lo, hi):
        at = step_cursor(cursor, s, b)
        ranks = []
        for ids in rank_ids(order, topology, at):
            src, local = mix.split_ids(ids)
            ranks.append([[names[k], int(i)] for k, i in zip(src.tolist(), local.tolist())])
        planned.append({"step": s, "cursor": at, "ranks": ranks})
    sim_steps = simulate_steps
    if last_step is not None:
        sim_steps = min(sim_steps, last_step + 1) if sim_steps else last_step + 1
    sim = simulate(mix.row_group_table, options, topology, cursor=cursor, steps=sim_steps,
                   order=order, end=end)
    # The realised mix of each stage over the simulated span, or up to the last stage's
    # start plus one step when that reaches further.
    stop = max(cursor + sim["simulated_steps"] * b, schedule.stages[-1][0] + b)
    if schedule.end is not None:
        stop = min(stop, schedule.end)
    runs_out = {names[k]: (None if p is None else {"position": p, "step": p // b})
                for k, p in schedule.exhausted_at().items()}
    doc = {"mixture": path, "mixture_id": mix.dataset_id,
           "sources": [{"name": n, "dataset_id": d.dataset_id, "num_samples": d.num_samples}
                       for n, d in zip(names, mix.sources)],
           "world_size": world_size, "global_batch": b, "order": options.to_dict(),
           "stages": _stage_rows(schedule, names, b, stop), "runs_out": runs_out, "end": end,
           "end_reason": schedule.end_reason(), "last_step": last_step, "steps": planned,
           **sim}
    return MixturePlan(doc, schedule)
