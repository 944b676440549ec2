"""The step log read back: each rank's wait per step and its causes, summed and ranked, for
``zephon stats`` (text, JSON, a PNG plot).

A step log is what :class:`~zephon_store.observe.account.StepAccount` appends with
``ObserveOptions(step_log=...)``: lines ``{"kind": "zephon-steps", "version": 1, "rank": r,
"causes": [...], "steps": [[step, wait_ms, [ms per cause]], ...]}``.

>>> import json, os
>>> p = os.path.join(tmp, "steps.jsonl")
>>> _ = open(p, "w").write(json.dumps({"kind": "zephon-steps", "version": 1, "rank": 0,
...     "causes": ["fetch", "decode"], "steps": [[0, 50.0, [40.0, 10.0]], [1, 2.0, [0, 2.0]]]}))
>>> s = summarize(read_step_log([p]))
>>> s["ranks"][0]["wait_s"], s["ranks"][0]["causes"]["fetch"], s["ranks"][0]["slowest"][0]["step"]
(0.052, 0.04, 0)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .._util.regular import read_regular
from ..errors import ZephonError

__all__ = ["StepLogError", "StepRow", "read_step_log", "summarize"]

KIND = "zephon-steps"


class StepLogError(ZephonError, ValueError):
    """A step log that cannot be read (names the file and line)."""


@dataclass(frozen=True)
class StepRow:
    """One step of one rank: its wait in ``next()`` and the split, in seconds."""

    rank: int
    step: int
    wait_s: float
    causes: dict[str, float]


def read_step_log(paths: list[str]) -> list[StepRow]:
    """Every step of every rank in the step logs ``paths``, by rank then step."""
    rows: list[StepRow] = []
    for path in paths:
        try:
            raw = read_regular(path)
        except OSError as exc:
            raise StepLogError(f"{path}: cannot read the step log ({exc}); pass the file "
                               "ObserveOptions(step_log=...) or $ZEPHON_STEP_LOG named") from None
        for i, line in enumerate(raw.decode("utf-8", "replace").splitlines(), start=1):
            if line.strip():
                rows.extend(_rows(line, f"{path} line {i}"))
    if not rows:
        raise StepLogError(f"{', '.join(paths)}: no steps in the step log; a loader writes "
                           "one line per 50 steps and the rest when its stream ends")
    rows.sort(key=lambda r: (r.rank, r.step))
    return rows


def _rows(line: str, where: str) -> list[StepRow]:
    try:
        d = json.loads(line)
        if not isinstance(d, dict) or d.get("kind") != KIND:
            raise ValueError(f'not a step log line (no "kind": "{KIND}")')
        names, rank = [str(c) for c in d["causes"]], int(d["rank"])
        return [StepRow(rank, int(s), float(w) / 1e3,
                        {c: float(v) / 1e3 for c, v in zip(names, split, strict=True)})
                for s, w, split in d["steps"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise StepLogError(f"{where}: {exc}; a zephon step log holds lines written by the "
                           "loader (ObserveOptions(step_log=...)): pass that file") from None


def summarize(rows: list[StepRow], *, top: int = 5) -> dict:
    """Per rank: steps, total wait, the wait by cause, and the ``top`` slowest steps with
    their split, all in seconds (rounded to the millisecond)."""
    ranks: dict[int, dict] = {}
    for r in rows:
        acc = ranks.setdefault(r.rank, {"steps": 0, "wait_s": 0.0, "causes": {}, "rows": []})
        acc["steps"] += 1
        acc["wait_s"] += r.wait_s
        for c, v in r.causes.items():
            acc["causes"][c] = acc["causes"].get(c, 0.0) + v
        acc["rows"].append(r)
    out = {}
    for rank, acc in sorted(ranks.items()):
        slowest = sorted(acc.pop("rows"), key=lambda r: -r.wait_s)[:top]
        acc["wait_s"] = round(acc["wait_s"], 3)
        acc["causes"] = {c: round(v, 3) for c, v in acc["causes"].items()}
        acc["slowest"] = [{"step": r.step, "wait_s": round(r.wait_s, 3),
                           "cause": max(r.causes, key=r.causes.get) if r.causes else None,
                           "causes": {c: round(v, 3) for c, v in r.causes.items() if v}}
                          for r in slowest]
        out[rank] = acc
    return {"ranks": out}
