"""One save/load check for every stateful loader (STYLE.md example 3).

A job is simulated in one process: a *segment* runs ``world_size`` ranks (one loader per
rank, explicit ``world_size``/``rank``) for some steps, then the job "restarts" and the next
segment, perhaps with another world size, worker count or global batch, resumes from the
previous segment's checkpoint. The state is taken after every step, checked to be identical
on every rank and round-tripped through JSON (so it is plain data) before it is loaded.

The stream a job consumed is then compared with an uninterrupted single-process run:

- step by step, the multiset of ids over all ranks equals the reference ids at the step's
  positions ``[cursor, cursor + B)``;
- by position, the ids of each complete epoch ``[e*N, (e+1)*N)`` are each id exactly once.

The loader under test is made by ``make_loader(world_size=, rank=, num_workers=,
global_batch=)`` and must offer ``__iter__``, ``state_dict()`` and ``load_state_dict()``;
``ids_of(batch)`` reads the sample ids of a batch (``_seq`` by default).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MakeLoader = Callable[..., Any]


def seq_ids(batch: dict) -> list[int]:
    """The ``_seq`` ids of a batch (tensor or numpy array)."""
    return [int(x) for x in batch["_seq"].tolist()]


def json_roundtrip(state: dict) -> dict:
    """The state as a fresh copy that went through JSON: proof it is plain data."""
    return json.loads(json.dumps(state))


@dataclass(frozen=True)
class Segment:
    """One stretch of a job between two restarts."""

    world_size: int
    steps: int
    num_workers: int = 0
    global_batch: int | None = None  # None: the job's default


@dataclass
class Step:
    """One global step: the cursor before it, the topology it ran with, each rank's ids."""

    cursor: int
    global_batch: int
    world_size: int
    num_workers: int
    ids: list[list[int]]

    @property
    def union(self) -> Counter:
        return Counter(i for rank_ids in self.ids for i in rank_ids)


@dataclass
class Run:
    steps: list[Step] = field(default_factory=list)
    states: list[dict] = field(default_factory=list)  # after every step, JSON round-tripped

    @property
    def final_state(self) -> dict | None:
        return self.states[-1] if self.states else None


def run_segments(make_loader: MakeLoader, segments: Iterable[Segment], *, global_batch: int,
                 state: dict | None = None, ids_of: Callable[[dict], list[int]] = seq_ids,
                 cursor_of: Callable[[dict], int] = lambda s: s["cursor"]) -> Run:
    """Run ``segments`` one after the other, each resuming from the last checkpoint."""
    run = Run()
    for seg in segments:
        batch = seg.global_batch or global_batch
        loaders = [make_loader(world_size=seg.world_size, rank=r, num_workers=seg.num_workers,
                               global_batch=batch) for r in range(seg.world_size)]
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(json_roundtrip(state))
        cursor = cursor_of(loaders[0].state_dict())
        iters = [iter(loader) for loader in loaders]
        try:
            for _ in range(seg.steps):
                ids = [ids_of(next(it)) for it in iters]
                states = [json_roundtrip(loader.state_dict()) for loader in loaders]
                assert all(s == states[0] for s in states), \
                    f"ranks disagree on the state after cursor {cursor}: {states}"
                assert cursor_of(states[0]) == cursor + batch, (
                    f"cursor {cursor_of(states[0])} after one step from {cursor} with global "
                    f"batch {batch}; it must count consumed samples")
                run.steps.append(Step(cursor, batch, seg.world_size, seg.num_workers, ids))
                run.states.append(states[0])
                cursor += batch
                state = states[0]
        finally:
            for it in iters:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        if seg.steps == 0 and state is None:
            state = json_roundtrip(loaders[0].state_dict())
    return run


def reference_ids(make_loader: MakeLoader, *, global_batch: int, samples: int) -> list[int]:
    """Id at every position ``[0, samples)`` from an uninterrupted single-process run."""
    steps = -(-samples // global_batch)
    run = run_segments(make_loader, [Segment(world_size=1, steps=steps)],
                       global_batch=global_batch)
    flat = [i for step in run.steps for i in step.ids[0]]
    return flat[:samples]


def assert_matches_reference(steps: Sequence[Step], reference: Sequence[int]) -> None:
    """Every step's multiset of ids equals the reference at its positions; no gaps."""
    expected_cursor = steps[0].cursor if steps else 0
    for k, step in enumerate(steps):
        assert step.cursor == expected_cursor, (
            f"step {k}: starts at cursor {step.cursor}, expected {expected_cursor} "
            f"({'gap' if step.cursor > expected_cursor else 'overlap'} after a restart)")
        want = Counter(reference[step.cursor:step.cursor + step.global_batch])
        assert len(reference) >= step.cursor + step.global_batch, "reference too short"
        got = step.union
        assert got == want, (
            f"step {k} (cursor {step.cursor}, W={step.world_size}, "
            f"num_workers={step.num_workers}): extra {sorted((got - want).elements())}, "
            f"missing {sorted((want - got).elements())}")
        expected_cursor += step.global_batch


def by_position(steps: Sequence[Step], positions_for: Callable[[int, int, int, int], Any]
                ) -> dict[int, int]:
    """Position -> id, from each rank's ids and ``positions_for(cursor, B, W, rank)``."""
    out: dict[int, int] = {}
    for step in steps:
        for rank, ids in enumerate(step.ids):
            pos = [int(p) for p in positions_for(step.cursor, step.global_batch,
                                                 step.world_size, rank)]
            assert len(pos) == len(ids), f"rank {rank} got {len(ids)} ids for {len(pos)} positions"
            for p, i in zip(pos, ids):
                assert p not in out, f"position {p} consumed twice"
                out[p] = i
    return out


def assert_exactly_once_per_epoch(ids_at: dict[int, int] | Sequence[int], num_samples: int
                                  ) -> int:
    """Each complete epoch's positions hold every id once; returns the epochs checked."""
    if not isinstance(ids_at, dict):
        ids_at = dict(enumerate(ids_at))
    if not ids_at:
        return 0
    lo, hi = min(ids_at), max(ids_at) + 1
    assert sorted(ids_at) == list(range(lo, hi)), "the consumed positions are not contiguous"
    checked = 0
    for epoch in range(-(-lo // num_samples), hi // num_samples):
        ids = [ids_at[p] for p in range(epoch * num_samples, (epoch + 1) * num_samples)]
        counts = Counter(ids)
        repeats = {i: c for i, c in counts.items() if c > 1}
        drops = set(range(num_samples)) - set(counts)
        assert not repeats and not drops, (
            f"epoch {epoch}: repeated {sorted(repeats)[:10]}, dropped {sorted(drops)[:10]}")
        checked += 1
    return checked


def assert_resumes_everywhere(make_loader: MakeLoader, *, global_batch: int, steps: int,
                              restore: Sequence[tuple[int, int]], reference: Sequence[int],
                              every: int = 1) -> int:
    """Checkpoint after every ``every``-th step of a W=1 run, restore it with each
    ``(world_size, num_workers)`` in ``restore``, run to the end and compare the whole
    stream with ``reference``. Returns the number of restores checked."""
    base = run_segments(make_loader, [Segment(world_size=1, steps=steps)],
                        global_batch=global_batch)
    assert_matches_reference(base.steps, reference)
    checked = 0
    for k in range(0, steps, every):
        state = base.states[k]
        for world_size, num_workers in restore:
            resumed = run_segments(
                make_loader, [Segment(world_size, steps - k - 1, num_workers)],
                global_batch=global_batch, state=state)
            assert_matches_reference(base.steps[:k + 1] + resumed.steps, reference)
            checked += 1
    return checked

