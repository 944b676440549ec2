"""``zephon info mix.toml`` and ``zephon plan --mixture mix.toml``: a mixture, described and
simulated without reading a shard byte (manifests only). The library computes both
(:mod:`zephon_store.runs.plan_mixture`); this module parses and prints.
"""

from __future__ import annotations

from .common import UsageError, emit


def _start_text(stage: dict) -> str:
    ((unit, start),) = stage["start"].items()
    text = f"{unit} {start}"
    samples = stage["start_sample"]
    return text if unit == "samples" or samples is None else f"{text} (sample {samples})"


def cmd_mixture_info(args) -> int:
    """Describe a mixture file: its sources (size, dataset_id, cap) and stages (weights)."""
    from ..runs.plan_mixture import ID_NOTE, mixture_info

    info = mixture_info(args.url, getattr(args, "global_batch", None))
    if args.json:
        emit(info)
        return 0
    mixture_id = info["mixture_id"]
    print(f"mixture   {args.url} ({mixture_id if mixture_id is not None else ID_NOTE})")
    print(f"weights   in {info['weight_unit']}; exhaustion policy {info['exhaustion']}"
          + (f"; seed {info['seed']}" if info["seed"] is not None else ""))
    print("sources")
    for s in info["sources"]:
        cap = f", max_epochs {s['max_epochs']}" if s["max_epochs"] else ""
        print(f"  {s['name']}: {s['url']} {s['dataset_id']} {s['num_samples']} samples "
              f"({s['total_bytes'] / 1e6:.1f} MB){cap}")
    print("stages")
    for st in info["stages"]:
        weights = ", ".join(f"{n} {w}" for n, w in st["weights"].items())
        print(f"  {st['name']} from {_start_text(st)}: {weights}")
        sw = st.get("sample_weights")
        if sw:
            print("    as sample weights: " + ", ".join(f"{n} {w:.4g}" for n, w in sw.items()))
    if mixture_id is None:
        print("(stage starts in steps: pass --global-batch B to see them in samples)")
    return 0


def plan_mixture(args) -> int:
    """``zephon plan --mixture``: prints :func:`zephon_store.runs.plan_mixture.plan_mixture`
    (per stage the realised proportions, each source's epochs consumed and where a capped
    source runs out, plus the read figures of the simulator)."""
    from ..runs.plan_mixture import PlanRequestError
    from ..runs.plan_mixture import plan_mixture as plan

    if args.url is not None:
        raise UsageError("give a dataset URL or --mixture FILE, not both")
    try:
        made = plan(args.mixture, global_batch=args.global_batch, world_size=args.world_size,
                    ranks_per_node=args.ranks_per_node, cursor=args.cursor, steps=args.steps,
                    simulate_steps=args.simulate_steps, seed=args.seed,
                    shuffle=not args.no_shuffle, window_blocks=args.window_blocks)
    except PlanRequestError as exc:
        raise UsageError(str(exc)) from None
    out = made.to_dict()
    if args.json:
        emit(out)
        return 0
    names = [s["name"] for s in out["sources"]]
    print(f"mixture {args.mixture}: {len(names)} sources, {len(made.schedule.stages)} stages "
          f"({out['mixture_id']})")
    for r in out["stages"]:
        mark = " (after a source ran out)" if r["derived"] else ""
        print(f"stage {r['stage']}{mark}: samples [{r['start']}, {r['stop']}) from step "
              f"{r['start_step']}")
        for n in names:
            ep = r["epochs_consumed"][n]
            print(f"  {n}: weight {r['weights'][n]:.4g}, realised {r['proportions'][n]:.4g}"
                  + (f", {ep:.3g} epochs consumed by its end" if ep is not None else ""))
    for n, where in out["runs_out"].items():
        print(f"{n} runs out (max_epochs) " + ("never" if where is None else
                                               f"at sample {where['position']}, step "
                                               f"{where['step']}"))
    if out["end"] is not None:
        print(f"the mixture ends at sample {out['end']}: {out['end_reason']}; the loader reads "
              f"its full steps up to step {out['last_step']} and its loop ends there")
    for st in out["steps"]:
        print(f"step {st['step']} (cursor {st['cursor']}):")
        for r, pairs in enumerate(st["ranks"]):
            shown = [f"{n}:{i}" for n, i in pairs[:12]] + (["..."] if len(pairs) > 12 else [])
            print(f"  rank {r}: [{', '.join(shown)}]")
    print(f"read amplification {out['read_amplification']} over {out['simulated_steps']} "
          f"steps; row groups/step/node {out['distinct_row_groups_per_step_per_node']}; "
          f"cache footprint {out['cache_footprint_bytes_max'] / 1e6:.1f} MB")
    return 0
