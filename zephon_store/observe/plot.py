"""A PNG of the wait per step by cause (stacked), one panel per rank: for those who would
rather look than read. Needs matplotlib (the ``plot`` extra), imported here only."""

from __future__ import annotations

from ..errors import MissingExtraError
from .causes import CAUSES
from .steplog import StepRow

__all__ = ["plot_waits"]


def plot_waits(rows: list[StepRow], path: str) -> None:
    """Write ``path``: each rank's wait in ``next()`` per step, stacked by cause."""
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingExtraError("the plot needs matplotlib: pip install "
                                "'zephon_store[plot]' (or drop --png)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r.rank for r in rows})
    fig, axes = plt.subplots(len(ranks), 1, figsize=(10, 2.6 * len(ranks)), squeeze=False,
                             sharex=True)
    for ax, rank in zip(axes[:, 0], ranks):
        mine = [r for r in rows if r.rank == rank]
        steps = [r.step for r in mine]
        shown = [c for c in CAUSES if any(r.causes.get(c, 0) > 0 for r in mine)]
        ax.stackplot(steps, [[r.causes.get(c, 0.0) for r in mine] for c in shown],
                     labels=shown, step="mid")
        ax.set_ylabel(f"rank {rank}: wait (s)")
        ax.legend(loc="upper right", fontsize="small", ncol=min(5, max(1, len(shown))))
    axes[-1, 0].set_xlabel("step")
    fig.suptitle("zephon: time the training loop waited in next(), by cause")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
