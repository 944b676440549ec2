"""What the suites share: the checkout's root, and child processes run as modules.

A child runs ``python -m benchmarks.<module>`` in ``.bench/`` (a folder holding no package)
with ``PYTHONPATH=<.bench/path>:<tree>``: ``.bench/path`` holds only a link to this
checkout's ``benchmarks`` package, so the harness is always this checkout's while the
``zephon_store`` measured is the tree's (this checkout's by default; an older checkout or
worktree for a before/after run: ``ZEPHON_BENCH_PKG``, ``ab_loader --before``). Nothing edits
``sys.path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
BENCH_DIR = os.path.join(ROOT, ".bench")
_HARNESS_PATH = os.path.join(BENCH_DIR, "path")


def _harness_path() -> str:
    """``.bench/path``, holding one link: ``benchmarks`` -> this checkout's package."""
    link = os.path.join(_HARNESS_PATH, "benchmarks")
    if not os.path.islink(link):
        os.makedirs(_HARNESS_PATH, exist_ok=True)
        tmp = f"{link}.{os.getpid()}"
        os.symlink(os.path.join(ROOT, "benchmarks"), tmp)
        os.replace(tmp, link)
    return _HARNESS_PATH


def child_env(pkg: str | None = None, base: dict | None = None, **extra: str) -> dict:
    """``base`` (default: this process's environment) with ``extra`` and a ``PYTHONPATH``
    that finds this checkout's ``benchmarks`` and ``pkg``'s ``zephon_store``."""
    env = dict(os.environ if base is None else base, **extra)
    env["PYTHONPATH"] = os.pathsep.join([_harness_path(), os.path.abspath(pkg or ROOT)])
    return env


def run_child(module: str, *args: str, pkg: str | None = None, env: dict | None = None,
              timeout: float = 1800) -> dict:
    """Run ``benchmarks.<module>`` with ``args`` and return the JSON of its last line;
    a failure raises ``RuntimeError`` with the end of its stderr."""
    env = child_env(pkg, env)
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args],
                         capture_output=True, text=True, cwd=BENCH_DIR, timeout=timeout,
                         env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed ({out.returncode}):\n"
                           f"{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_seconds(fn, runs: int) -> float:
    """The median wall time of ``runs`` calls of ``fn``, after one warm-up call."""
    import statistics
    import time

    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_results(name: str, results: list[dict], as_json: bool) -> None:
    """A suite's results: ``{name: results}`` as JSON, or one ``key=value`` line each."""
    import json

    if as_json:
        print(json.dumps({name: results}, indent=1))
        return
    for r in results:
        print(", ".join(f"{key}={val:.4g}" if isinstance(val, float) else f"{key}={val}"
                        for key, val in r.items()))
