"""How a run reads a source: its *plan* (order, seed rule, lanes, working set, end of the
stream, checkpoint entry, resume), apart from what is read (the
:class:`~zephon_store.read.source.Source`).

:class:`DatasetPlan` reads one dataset; :class:`MixedPlan` a mixture
(:class:`~zephon_store.mix.mixed.MixedDataset`) by its stage schedule.
:func:`~zephon_store.load.source.plan_of` gives a source's plan: it is the normaliser's
second half, and with :func:`~zephon_store.load.source.open_source` the one place that tells
a mixture from a dataset. The loader, its stream, the run accounting
(``trace``, ``where``, ``audit``), ``zephon plan`` and Grain's random-access source all read
through a plan, so they agree on every position (STYLE 22).

>>> from zephon_store import OrderOptions, open_dataset
>>> plan = DatasetPlan(open_dataset(tiny_dataset))
>>> plan.order(OrderOptions(seed=7)).sample_at([0, 1, 2]).tolist(), plan.state_entry()
([79, 41, 78], None)
>>> plan.order_seed(None), plan.end, plan.seq_fields([4, 2])["_seq"].tolist()
(0, None, [4, 2])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import MixtureError, StateMismatchError
from ..mix.mixed import SOURCE_KEY, MixedDataset, MixedOrder
from ..order.mixture import MixtureSchedule
from ..order.order import Order, OrderOptions
from ..order.topology import Topology
from .denylist import MixtureIds
from .order_inputs import mixture_seed

__all__ = ["DatasetPlan", "MixedPlan", "Plan", "SEQ_KEY"]

SEQ_KEY = "_seq"


@runtime_checkable
class Plan(Protocol):
    """How a run reads ``source`` (see the module docstring)."""

    source: Any

    def order(self, options: OrderOptions) -> Any:
        """Position -> sample id (``sample_at``, ``num_samples``, ``effective_lanes``...)."""
    def order_seed(self, given: int | None) -> int:
        """The seed rule: the seed the order uses when ``given`` (None: not given)."""
    def resolve_lanes(self, options: OrderOptions, topology: Topology) -> OrderOptions: ...
    def working_set_row_groups(self, order: Any, topology: Topology) -> int:
        """Row groups a rank reads from at the same time, in steady state."""
    @property
    def end(self) -> int | None:
        """The first position the data cannot serve (a capped mixture source ran out)."""
    def end_reason(self) -> str: ...
    def seq_fields(self, ids) -> dict[str, np.ndarray]:
        """What ``with_seq`` adds to a batch of sample ``ids``."""
    def deny_ids(self) -> Any:
        """The ids a deny list names: a dataset's manifest, or a mixture's
        :class:`~zephon_store.load.denylist.MixtureIds` (each source's own ids)."""
    def state_entry(self) -> dict | None:
        """The state's ``mixture`` entry (None: a version-1 state of one dataset)."""
    def resumed(self, saved: dict | None, cursor: int, *, step: int | None = None,
                global_batch: int | None = None) -> Plan: ...
    def check_ready(self) -> None: ...


class DatasetPlan:
    """One dataset read in its own order: seed 0 unless given, lanes resolved for the run's
    nodes, no end but the run's, nothing in the state beyond its own keys (version 1)."""

    end = None

    def __init__(self, dataset) -> None:
        self.source = dataset

    def order(self, options: OrderOptions) -> Order:
        """The :class:`~zephon_store.order.Order` over the dataset's row groups (its blocks)."""
        return Order(self.source.row_group_table.rg_rows, options)

    def order_seed(self, given: int | None) -> int:
        """The seed of the order: the one given (None: 0)."""
        return 0 if given is None else int(given)

    def resolve_lanes(self, options: OrderOptions, topology: Topology) -> OrderOptions:
        """``options`` with ``lanes="auto"`` resolved for this dataset and ``topology``."""
        if not options.is_auto:
            return options
        t, m = topology, self.source.row_group_table
        return options.resolved(m.num_row_groups, self.source.num_samples,
                                nodes=t.num_nodes, node_batch=t.global_batch // t.num_nodes)

    def working_set_row_groups(self, order, topology: Topology) -> int:
        """Row groups a rank reads from at the same time, in steady state.

        Each one must stay decoded until its last sample is read, or it is decoded again.
        Sequential: this step's row groups and the next's. Shuffled: every lane the rank
        reads is shuffled inside a window of ``window_blocks`` blocks' worth of samples,
        which straddles one more block, and meets the next window in one more. The rank
        rule gives a rank about ``lanes / world_size`` lanes (all of them at W = 1), plus
        one it shares with a neighbour when that does not divide.
        """
        m, t = self.source.row_group_table, topology
        mean_rows = max(1.0, m.num_samples / max(1, m.num_row_groups))
        step = int(np.ceil(t.local_batch / mean_rows)) + 1
        if not order.options.shuffle:
            return int(min(m.num_row_groups, 2 * step))
        lanes = order.effective_lanes
        lanes = min(lanes, -(-lanes // t.world_size) + (lanes % t.world_size != 0))
        return int(min(m.num_row_groups, lanes * (order.options.window_blocks + 2) + step))

    def end_reason(self) -> str:
        return ""

    def seq_fields(self, ids) -> dict[str, np.ndarray]:
        """``_seq``: the sample ids."""
        return {SEQ_KEY: np.asarray(ids, dtype=np.int64)}

    def deny_ids(self):
        """The manifest a deny list's sample ids are checked against."""
        return self.source.manifest

    def state_entry(self) -> None:
        """Nothing beyond the loader state's own keys (version 1)."""
        return None

    def resumed(self, saved, cursor: int, *, step: int | None = None,
                global_batch: int | None = None) -> DatasetPlan:
        """This plan, unchanged by a resume (its state entry is None)."""
        return self

    def check_ready(self) -> None:
        """Always ready: nothing waits for a checkpoint."""


class MixedPlan:
    """A mixture read by its stage schedule: the mixed order, the mixture file's seed rule,
    one lane per source, the end where a capped source runs out, the ``mixture`` entry of
    the checkpoint and the resume from one (docs/mixtures.md, "Using a mixture")."""

    def __init__(self, mix: MixedDataset) -> None:
        self.source = self.mix = mix

    def order(self, options: OrderOptions) -> MixedOrder:
        """The mixed order: the schedule picks (source, index), each source's order the sample."""
        return MixedOrder(self.mix, options)

    def order_seed(self, given: int | None) -> int:
        """The seed of the order: the mixture file's unless one is given; a given seed that
        disagrees with the file's is refused (:func:`~zephon_store.load.order_inputs.mixture_seed`)."""
        return mixture_seed(self.mix.seed, given,
                            origin=getattr(self.mix.spec, "origin", None) or "the mixture file")

    def resolve_lanes(self, options: OrderOptions, topology: Topology) -> OrderOptions:
        """``options`` as they are: a mixture's sources keep one lane each (Order's "auto")."""
        return options

    def working_set_row_groups(self, order: MixedOrder, topology: Topology) -> int:
        """Row groups a rank reads from at once: each source's working set (every lane of
        it, since the mixture's positions are sliced plainly), at its largest share of the
        batch over the stages. A source with weight 0 throughout reads nothing."""
        total = 0
        shares = np.max([[float(w) for w in ws] for _, ws in self.mix.schedule.stages], axis=0)
        for s, o, share in zip(self.mix.sources, order.source_orders, shares):
            if share == 0:
                continue
            m = s.manifest
            mean_rows = max(1.0, m.num_samples / max(1, m.num_row_groups))
            step = int(np.ceil(topology.local_batch * share / mean_rows)) + 1
            if o.options.shuffle:
                need = o.effective_lanes * (o.options.window_blocks + 2) + step
            else:
                need = 2 * step
            total += min(m.num_row_groups, need)
        return total

    @property
    def end(self) -> int | None:
        """The first position the mixture cannot serve (a capped source ran out under the
        ``"error"`` policy), or None."""
        return self.mix.schedule.end

    def end_reason(self) -> str:
        """Why the mixture ends at :attr:`end` (the schedule's words)."""
        return self.mix.schedule.end_reason()

    def seq_fields(self, ids) -> dict[str, np.ndarray]:
        """``_seq``: each source's own id; ``_source``: the source's index."""
        source, local = self.mix.split_ids(ids)
        return {SEQ_KEY: local, SOURCE_KEY: source}

    def deny_ids(self) -> MixtureIds:
        """The ids a deny list names: each source's own, placed at its ``id_offset``."""
        mix = self.mix
        return MixtureIds(tuple(mix.names), tuple(s.manifest for s in mix.sources),
                          tuple(int(o) for o in mix.id_offset), mix.num_samples)

    def check_ready(self) -> None:
        """Raise the error that keeps the mixture file from being read from its start: its
        stage starts, converted with this run's global batch, do not increase, and no
        checkpoint fixed them (:meth:`resumed`)."""
        if self.mix.pending_error is not None:
            raise MixtureError(f"{self.mix.pending_error}; resuming from a checkpoint that "
                               "began these stages keeps their sample positions")

    # -- checkpoint ------------------------------------------------------------------------
    def state_entry(self) -> dict:
        """The ``mixture`` entry of a checkpoint: each source's name, dataset_id and size,
        and the schedule with each source's consumed count at every stage boundary.

        It does not :meth:`check_ready`: a checkpointer asks for this entry as the template
        a checkpoint is loaded into, before the resume that fixes the stages."""
        mix = self.mix
        return {"sources": [{"name": n, "dataset_id": s.dataset_id,
                             "num_samples": s.num_samples}
                            for n, s in zip(mix.names, mix.sources)],
                "schedule": mix.schedule.to_dict()}

    def resumed(self, saved: dict, cursor: int, *, step: int | None = None,
                global_batch: int | None = None) -> MixedPlan:
        """This mixture continuing a checkpoint's (``saved``: its ``mixture`` entry) at
        ``cursor``, or :class:`~zephon_store.errors.StateMismatchError` saying what differs.

        Every checkpointed source must be here, at the same index, with the same dataset_id
        (sources may be added after them). The stages that started before the cursor must
        be this mixture's first stages, unchanged, and keep the samples the checkpoint
        began them at; this mixture's later stages then follow, each starting at or after
        the cursor: appended with
        :meth:`~zephon_store.order.mixture.MixtureSchedule.append_stage`, so every source
        continues from its consumed count and nothing is repeated or skipped. A later stage
        given in steps begins at that step of the run: ``step`` (the checkpoint's step
        count; default ``cursor // global_batch``) begins at ``cursor``, and each step
        takes ``global_batch`` samples (default: the one this mixture was opened with).
        """
        try:
            saved_sources = list(saved["sources"])
            saved_schedule = saved["schedule"]
            names = [str(s["name"]) for s in saved_sources]
            ids = [str(s["dataset_id"]) for s in saved_sources]
        except (KeyError, TypeError) as exc:
            raise StateMismatchError(f"loader state 'mixture' is malformed ({exc!r}); the "
                                     "checkpoint is corrupted") from exc
        for k, (name, did) in enumerate(zip(names, ids)):
            if name not in self.mix.names:
                raise StateMismatchError(
                    f"checkpoint mixture source {name!r} (dataset {did}) is missing from this "
                    f"mixture (sources {self.mix.names}); keep every source of the run, with "
                    "weight 0 in new stages to drop it")
            if self.mix.names[k] != name:
                raise StateMismatchError(
                    f"checkpoint mixture source {k} is {name!r} but this mixture's source {k} "
                    f"is {self.mix.names[k]!r}; keep the sources in their order and add new ones "
                    "at the end")
            if self.mix.sources[k].dataset_id != did:
                raise StateMismatchError(
                    f"mixture source {name!r} ({self.mix.sources[k].url}) holds dataset "
                    f"{self.mix.sources[k].dataset_id}, but the checkpoint read dataset {did}; "
                    "its data changed since the checkpoint: point it at the dataset the run "
                    "started with (or start a new run)")
        try:
            saved_sched = MixtureSchedule.from_dict(saved_schedule)
        except (MixtureError, TypeError, KeyError) as exc:
            raise StateMismatchError(f"loader state 'mixture' schedule is invalid: {exc}"
                                     ) from exc
        past = [(s, w) for s, w in saved_sched.stages if s < cursor]
        mine = self._schedule_at(past, cursor, step, global_batch)
        return MixedPlan(self.mix.with_schedule(
            self._continue(saved_sched, saved_schedule, cursor, mine)))

    def _schedule_at(self, past: list, cursor: int, step: int | None,
                     global_batch: int | None) -> MixtureSchedule:
        """This mixture's own schedule for a run resumed at ``cursor`` whose checkpoint
        began the stages ``past``: its stages in steps converted from the resume point, those
        of them already begun at the samples the checkpoint began them at."""
        spec = self.mix.spec
        if spec is None or not self.mix.schedule_inputs or not any(st.unit == "steps"
                                                        for st in spec.stages):
            # No start depends on the run's steps, or the schedule was given ready-made.
            return self.mix.config_schedule
        batch = global_batch or self.mix.schedule_inputs.get("global_batch")
        if step is None and batch:
            step = cursor // batch
        fixed = {j: start for j, (start, _) in enumerate(past)
                 if j < len(spec.stages) and spec.stages[j].unit == "steps"}
        try:
            starts = spec.stage_starts(
                global_batch=batch, tokens_per_sample=self.mix.schedule_inputs.get("tokens_per_sample"),
                step=step or 0, cursor=cursor, fixed=fixed)
        except MixtureError as exc:
            raise StateMismatchError(
                f"{exc} (resuming at step {step}, cursor {cursor}, global batch {batch}: a "
                "stage in steps begins at that step of the run); fix the stage starts") from None
        return self._schedule_from(starts)

    def _schedule_from(self, starts: Sequence[int]) -> MixtureSchedule:
        inputs = {k: v for k, v in self.mix.schedule_inputs.items()
                  if k in ("mean_sizes", "epoch_sizes")}
        return MixtureSchedule.from_spec(self.mix.spec, starts=starts, **inputs)

    def _continue(self, saved: MixtureSchedule, saved_dict: dict, cursor: int,
                  mine: MixtureSchedule) -> MixtureSchedule:
        if saved.policy != mine.policy:
            raise StateMismatchError(
                f"the checkpoint's exhaustion policy is {saved.policy!r}, this mixture's "
                f"{mine.policy!r}; resume with the checkpoint's policy")
        mine_sources = mine.to_dict()["sources"]
        for k, src in enumerate(saved_dict["sources"]):
            # A checkpoint that added a source at a resume recorded no epoch size for it
            # (before this was fixed); its data is pinned by dataset_id, so only a recorded
            # size or a cap can disagree.
            size_differs = src["epoch_size"] not in (None, mine_sources[k]["epoch_size"])
            if src["max_epochs"] != mine_sources[k]["max_epochs"] or size_differs:
                raise StateMismatchError(
                    f"mixture source {self.mix.names[k]!r}: the checkpoint caps it at "
                    f"max_epochs={src['max_epochs']} of {src['epoch_size']} samples, this "
                    f"mixture at {mine_sources[k]['max_epochs']} of "
                    f"{mine_sources[k]['epoch_size']}; keep the cap of the run")
        k_new = mine.num_sources
        past = [(s, w) for s, w in saved.stages if s < cursor]
        ours = mine.stages
        # A start in steps was converted to samples by the run that began the stage, and
        # _schedule_at kept that sample: changing the global batch does not move a stage
        # already begun.
        units = ([st.unit for st in self.mix.spec.stages] if self.mix.spec is not None
                 else ["samples"] * len(ours))
        for j, (start, weights) in enumerate(past):
            pad = (*weights, *[0] * (k_new - len(weights)))
            moved = j < len(ours) and units[j] == "samples" and ours[j][0] != start
            if j >= len(ours) or moved or tuple(ours[j][1]) != pad:
                have = (f"stage {j} starts at {ours[j][0]} with weights "
                        f"{[str(w) for w in ours[j][1]]}" if j < len(ours)
                        else f"only {len(ours)} stages")
                raise StateMismatchError(
                    f"the checkpoint (cursor {cursor}) consumed stage {j}, starting at "
                    f"{start} with weights {[str(w) for w in weights]}, but this mixture has "
                    f"{have}; stages that began before the cursor cannot change: keep them "
                    "as they were and add a stage starting at or after the cursor")
        if not past:
            return mine   # nothing consumed yet: this mixture's schedule as it is
        kept_sources = [{**src, "epoch_size": mine_sources[k]["epoch_size"]}
                        for k, src in enumerate(saved_dict["sources"])]
        kept = {**saved_dict, "sources": kept_sources, "stages": saved_dict["stages"][:len(past)]}
        out = MixtureSchedule.from_dict(kept)
        mine_stages = mine.to_dict()["stages"]
        sizes = dict(zip(self.mix.names, (s["epoch_size"] for s in mine_sources)))
        for j in range(len(past), len(ours)):
            start, weights = ours[j]
            if start < cursor:
                raise StateMismatchError(
                    f"stage {j} ({mine_stages[j]['name'] or 'unnamed'}) starts at {start}, "
                    f"before the checkpoint's cursor {cursor}, and the checkpoint has no such "
                    "stage: a stage boundary cannot be in the past; start it at or after "
                    f"{cursor}")
            if k_new > out.num_sources and mine_sources[out.num_sources]["max_epochs"]:
                raise StateMismatchError(
                    f"mixture source {self.mix.names[out.num_sources]!r} is added at resume with "
                    "max_epochs; a source added mid-run cannot be capped yet")
            by_name = dict(zip(self.mix.names, mine_stages[j]["weights"]))
            out = out.append_stage(start, by_name, cursor=cursor,
                                   name=mine_stages[j]["name"], epoch_sizes=sizes)
        if out.num_sources != k_new:
            raise StateMismatchError(
                f"sources {self.mix.names[out.num_sources:]} were added but no stage at or after "
                f"the cursor {cursor} gives them a weight; add one")
        return out

