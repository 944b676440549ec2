"""The conversion's stages as Ray tasks: :class:`RayExecutor`.

``convert(..., engine="ray")`` (``zephon convert ... --engine ray [--ray-address ADDR]``)
runs the same stage functions as the local engine, each call one Ray task, so the output is
the same byte for byte for any number of workers and nodes. Tasks read inputs from their URLs
and write staged pieces and shards to the job's staging area and the output themselves; what
comes back to the driver is a small record per task (rows, hashes, byte ranges).

Crash safety comes from the converter, not from Ray: every finished task has left its
result in the staging area (beside the output when it is remote) before it returns, so a
rerun after a killed driver or node redoes only unfinished tasks. Ray adds retries: a task
whose worker process or node died is run again (``max_retries``), which is safe because every
task publishes whole files under names that depend only on their content or task index. An
error raised by the stage itself (a bad record) is not retried: it reaches the caller as the
same exception the local engine raises (file and line), not wrapped.

Task names in the Ray dashboard are ``zephon <stage>[<task index>]``: ``zephon parse[3]``
parses the fourth input file (staged as ``parsed/000003``), ``zephon write[12]`` writes shard
12.

Ray is an optional extra (``pip install 'zephon_store[ray]'``); importing this module does
not import it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import require
from .executors import Executor

__all__ = ["RayExecutor"]

# A worker process or node that dies takes its task with it; Ray reruns such a task this
# many times before the conversion fails (the stages are idempotent).
DEFAULT_MAX_RETRIES = 3


class RayExecutor(Executor):
    """Run conversion stages as Ray tasks, at most ``workers`` at a time, results in order.

    ``address``: an existing cluster (``"auto"``, ``"127.0.0.1:6379"``, ``"ray://..."``);
    None starts a local Ray instance for the conversion and stops it afterwards.
    ``workers``: tasks in flight (default: the cluster's CPUs). ``cpus_per_task``: the CPUs
    Ray reserves for each task. ``init_options``: extra keyword arguments for ``ray.init``.

    >>> ex = RayExecutor(workers=2, address="127.0.0.1:6379")
    >>> ex.shared_hosts, ex.workers, ex.max_retries
    (True, 2, 3)
    """

    shared_hosts = True

    def __init__(self, *, workers: int | None = None, address: str | None = None,
                 max_retries: int = DEFAULT_MAX_RETRIES, cpus_per_task: float = 1.0,
                 init_options: dict | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if cpus_per_task <= 0:
            raise ValueError(f"cpus_per_task must be > 0, got {cpus_per_task}")
        self.address = address
        self.workers = workers or 0  # 0: the cluster's CPUs, known once connected
        self.max_retries = max_retries
        self.cpus_per_task = cpus_per_task
        self.init_options = dict(init_options or {})
        self._started = False
        self._ray: Any = None

    def __enter__(self) -> RayExecutor:
        ray = require("ray", "ray")
        self._ray = ray
        if not ray.is_initialized():
            opts = {"logging_level": logging.WARNING, "include_dashboard": False,
                    **self.init_options}
            if self.address is not None:
                opts.pop("include_dashboard")  # a setting of the cluster, not of a client
                ray.init(address=self.address, **opts)
            else:
                ray.init(num_cpus=self.workers or None, **opts)
            self._started = True
        if not self.workers:
            cpus = ray.cluster_resources().get("CPU", 1)
            self.workers = max(1, int(cpus // self.cpus_per_task))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any], *, name: str) -> Iterator[Any]:
        """``fn(task)`` as one Ray task per task, ``workers`` in flight, yielded in task order."""
        if self._ray is None:
            raise RuntimeError("RayExecutor.map outside 'with RayExecutor(...)'")
        return self._map(fn, list(tasks), name)

    def _map(self, fn, tasks: list, name: str) -> Iterator[Any]:
        ray = self._ray
        remote = ray.remote(fn)
        pending: dict[Any, int] = {}  # ref -> task index
        done: dict[int, Any] = {}
        submitted = 0
        try:
            for want in range(len(tasks)):
                while want not in done:
                    # Keep every slot busy, also while an earlier task holds up the order.
                    while submitted < len(tasks) and len(pending) < self.workers:
                        ref = remote.options(name=f"zephon {name}[{submitted}]",
                                             max_retries=self.max_retries,
                                             num_cpus=self.cpus_per_task).remote(tasks[submitted])
                        pending[ref] = submitted
                        submitted += 1
                    # One wait costs O(in flight) (thousands of refs on a large cluster): wait
                    # for a sixteenth of them (or half a second), not for each one.
                    ready, _ = ray.wait(list(pending), num_returns=max(1, len(pending) // 16),
                                        timeout=0.5)
                    for ref in ready:
                        done[pending.pop(ref)] = self._outcome(ref)
                ok, value = done.pop(want)
                if not ok:  # raised in task order, as the local engine does
                    raise value
                yield value
        finally:
            for ref in pending:  # an error or a closed generator: stop what still runs
                ray.cancel(ref, force=True)

    def _outcome(self, ref) -> tuple[bool, Any]:
        """``(True, result)``, or ``(False, error)``: a stage's own error as itself, not
        wrapped by Ray (a worker lost for good stays Ray's error)."""
        from ray.exceptions import RayTaskError

        try:
            return True, self._ray.get(ref)
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            err = cause if isinstance(cause, Exception) else exc
            err.__cause__ = None
            err.__suppress_context__ = True
            return False, err
        except Exception as exc:
            return False, exc
