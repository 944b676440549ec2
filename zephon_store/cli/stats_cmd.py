"""``zephon stats STEPLOG...``: the data wait per step and its causes, from the step logs a
run wrote (docs/observe.md)."""

from __future__ import annotations

from .common import emit


def add_stats_parser(sub) -> None:
    p = sub.add_parser("stats", help="the time the training loop waited for data per step, "
                       "by cause, from the step logs a run wrote (ObserveOptions(step_log=))")
    p.add_argument("step_logs", nargs="+", metavar="STEPLOG",
                   help="step log files (one per rank, or one for rank 0)")
    p.add_argument("--top", type=int, default=5, metavar="N", help="slowest steps shown")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="also plot the wait per step by cause (needs matplotlib)")
    p.add_argument("--json", action="store_true")


def cmd_stats(args) -> int:
    from ..observe.steplog import read_step_log, summarize

    rows = read_step_log(args.step_logs)
    out = summarize(rows, top=args.top)
    if args.png:
        from ..observe.plot import plot_waits

        plot_waits(rows, args.png)
        out["png"] = args.png
    if args.json:
        emit({"ranks": {str(k): v for k, v in out["ranks"].items()},
              **({"png": out["png"]} if "png" in out else {})})
        return 0
    for rank, r in out["ranks"].items():
        total = r["wait_s"] or 1e-12
        split = ", ".join(f"{c} {v:.3f} s ({100 * v / total:.0f}%)"
                          for c, v in sorted(r["causes"].items(), key=lambda kv: -kv[1]) if v)
        print(f"rank {rank}: {r['steps']} steps, waited {r['wait_s']:.3f} s in next(): "
              f"{split or 'nothing'}")
        for s in r["slowest"]:
            print(f"  step {s['step']}: {s['wait_s']:.3f} s, mostly {s['cause']}")
    if "png" in out:
        print(f"plot: {out['png']}")
    return 0
