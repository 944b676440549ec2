"""``zephon info mix.toml`` and ``zephon plan --mixture mix.toml``: a mixture, described and
simulated without reading a shard byte (manifests only).
"""

from __future__ import annotations

from .common import UsageError, emit


def _open(path: str, global_batch: int | None):
    from ..errors import MixtureError
    from ..load.mixed import build_mixture, mixture_spec, open_sources

    spec = mixture_spec(path)
    sources = open_sources(spec)
    try:
        return spec, build_mixture(spec, sources, global_batch=global_batch)
    except MixtureError:
        if global_batch is not None or not any(st.unit == "steps" for st in spec.stages):
            raise
        return spec, None   # stage starts in steps: samples need --global-batch


_ID_NOTE = ("stage starts in steps: the mixture_id depends on the global batch (it hashes the "
            "stages in samples); pass --global-batch B")


def _start_text(st, samples: int | None) -> str:
    text = f"{st.unit} {st.start}"
    return text if st.unit == "samples" or samples is None else f"{text} (sample {samples})"


def cmd_mixture_info(args) -> int:
    """Describe a mixture file: its sources (size, dataset_id, cap) and stages (weights)."""
    spec, mix = _open(args.url, getattr(args, "global_batch", None))
    from ..load.mixed import open_sources

    sources = mix.sources if mix is not None else open_sources(spec)
    starts = [s for s, _ in mix.schedule.stages] if mix is not None else [None] * len(
        spec.stages)
    sample_weights = ([[float(w) for w in ws] for _, ws in mix.schedule.stages]
                      if mix is not None else None)
    info = {
        "mixture": args.url, "weight_unit": spec.weight_unit, "exhaustion": spec.exhaustion,
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
        info["mixture_id_note"] = _ID_NOTE
    if args.json:
        emit(info)
        return 0
    print(f"mixture   {args.url} ({mix.dataset_id if mix is not None else _ID_NOTE})")
    print(f"weights   in {spec.weight_unit}; exhaustion policy {spec.exhaustion}"
          + (f"; seed {spec.seed}" if spec.seed is not None else ""))
    print("sources")
    for s in info["sources"]:
        cap = f", max_epochs {s['max_epochs']}" if s["max_epochs"] else ""
        print(f"  {s['name']}: {s['url']} {s['dataset_id']} {s['num_samples']} samples "
              f"({s['total_bytes'] / 1e6:.1f} MB){cap}")
    print("stages")
    for j, st in enumerate(spec.stages):
        weights = ", ".join(f"{n} {w}" for n, w in info["stages"][j]["weights"].items())
        print(f"  {st.name} from {_start_text(st, starts[j])}: {weights}")
        sw = info["stages"][j].get("sample_weights")
        if sw:
            print("    as sample weights: " + ", ".join(f"{n} {w:.4g}" for n, w in sw.items()))
    if mix is None:
        print("(stage starts in steps: pass --global-batch B to see them in samples)")
    return 0


def plan_mixture(args) -> int:
    """``zephon plan --mixture``: per stage the realised proportions, each source's epochs
    consumed and where a capped source runs out, plus the read figures of the simulator."""
    from ..load.mixed import MixedOrder
    from ..load.simulate import rank_ids, simulate
    from ..order.assign import step_cursor
    from ..order.order import OrderOptions
    from ..order.topology import Topology
    from .common import build_options

    if args.url is not None:
        raise UsageError("give a dataset URL or --mixture FILE, not both")
    b = args.global_batch
    spec, mix = _open(args.mixture, b)
    # The file's seed unless --seed, and a disagreeing --seed refused: the loader's own rule.
    from ..errors import MixtureError
    from ..load.order_inputs import mixture_seed

    try:
        seed = mixture_seed(spec.seed, args.seed, origin=args.mixture)
    except MixtureError as exc:
        raise UsageError(str(exc)) from None
    kw = {"seed": seed, "shuffle": not args.no_shuffle}
    if args.window_blocks is not None:
        kw["window_blocks"] = args.window_blocks
    options = build_options(OrderOptions, **kw)
    topology = build_options(Topology, global_batch=b, world_size=args.world_size,
                             ranks_per_node=min(args.ranks_per_node, args.world_size))
    order = MixedOrder(mix, options)
    schedule = mix.schedule
    names = list(mix.names)
    # A mixture that ends (a capped source runs out, exhaustion "error") ends the loader's
    # stream there: it reads the full steps before the end, and so does this plan.
    end = schedule.end
    last_step = None if end is None else (end - args.cursor) // b - 1
    if last_step is not None and last_step < 0:
        raise UsageError(f"{args.mixture}: the mixture ends at sample {end} "
                         f"({schedule.end_reason()}), before a full step of {b} from --cursor "
                         f"{args.cursor}: the loader reads no step there")
    lo, hi = args.steps
    if last_step is not None:
        hi = min(hi, last_step + 1)
    steps = []
    for s in range(lo, hi):
        cursor = step_cursor(args.cursor, s, b)
        ranks = []
        for ids in rank_ids(order, topology, cursor):
            src, local = mix.split_ids(ids)
            ranks.append([[names[k], int(i)] for k, i in zip(src.tolist(), local.tolist())])
        steps.append({"step": s, "cursor": cursor, "ranks": ranks})
    sim_steps = args.simulate_steps
    if last_step is not None:
        sim_steps = min(sim_steps, last_step + 1) if sim_steps else last_step + 1
    sim = simulate(mix.manifest, options, topology, cursor=args.cursor, steps=sim_steps,
                   order=order, end=end)
    # The realised mix of each stage over the simulated span, or up to the last stage's
    # start plus one step when that reaches further.
    span_end = args.cursor + sim["simulated_steps"] * b
    stop = max(span_end, schedule.stages[-1][0] + b)
    if schedule.end is not None:
        stop = min(stop, schedule.end)
    stage_rows = []
    for row in schedule.realized(0, stop):
        stage_rows.append({
            "stage": row["name"], "start": row["start"], "stop": row["stop"],
            "start_step": row["start"] // b, "derived": row["derived"],
            "weights": dict(zip(names, row["weights"])),
            "proportions": dict(zip(names, [round(p, 6) for p in row["proportions"]])),
            "epochs_consumed": dict(zip(names, [None if e is None else round(e, 4)
                                                for e in row.get("epochs", [None] * len(names))])),
        })
    runs_out = {names[k]: (None if p is None else {"position": p, "step": p // b})
                for k, p in schedule.exhausted_at().items()}
    out = {"mixture": args.mixture, "mixture_id": mix.dataset_id,
           "sources": [{"name": n, "dataset_id": d.dataset_id, "num_samples": d.num_samples}
                       for n, d in zip(names, mix.sources)],
           "world_size": args.world_size, "global_batch": b, "order": options.to_dict(),
           "stages": stage_rows, "runs_out": runs_out, "end": end,
           "end_reason": schedule.end_reason(), "last_step": last_step, "steps": steps,
           **sim}
    if args.json:
        emit(out)
        return 0
    print(f"mixture {args.mixture}: {len(names)} sources, {len(schedule.stages)} stages "
          f"({mix.dataset_id})")
    for r in stage_rows:
        mark = " (after a source ran out)" if r["derived"] else ""
        print(f"stage {r['stage']}{mark}: samples [{r['start']}, {r['stop']}) from step "
              f"{r['start_step']}")
        for n in names:
            ep = r["epochs_consumed"][n]
            print(f"  {n}: weight {r['weights'][n]:.4g}, realised {r['proportions'][n]:.4g}"
                  + (f", {ep:.3g} epochs consumed by its end" if ep is not None else ""))
    for n, where in runs_out.items():
        print(f"{n} runs out (max_epochs) " + ("never" if where is None else
                                               f"at sample {where['position']}, step "
                                               f"{where['step']}"))
    if end is not None:
        print(f"the mixture ends at sample {end}: {schedule.end_reason()}; the loader reads "
              f"its full steps up to step {last_step} and its loop ends there")
    for st in steps:
        print(f"step {st['step']} (cursor {st['cursor']}):")
        for r, pairs in enumerate(st["ranks"]):
            shown = [f"{n}:{i}" for n, i in pairs[:12]] + (["..."] if len(pairs) > 12 else [])
            print(f"  rank {r}: {shown}")
    print(f"read amplification {sim['read_amplification']} over {sim['simulated_steps']} steps; "
          f"row groups/step/node {sim['distinct_row_groups_per_step_per_node']}; "
          f"cache footprint {sim['cache_footprint_bytes_max'] / 1e6:.1f} MB")
    return 0
