"""The loader checkpoint: ``{version, dataset_id, seed, order, cursor, step}``, nothing else.

Identical on every rank, so a distributed checkpoint stores it once and any world size can
load it. ``cursor`` counts samples the training loop consumed, across epochs.

A mixture's checkpoint is version 2: the same keys plus ``mixture``, the sources' names and
dataset_ids and the stage schedule with each source's consumed count at every stage
boundary (:mod:`zephon_store.mix.mixed`), as one JSON string. A string, not a nested dict:
``torch.distributed.checkpoint`` loads in place into a template made by the loader being
resumed, whose schedule may have a stage more than the checkpoint's; one string value
loads whatever its length. Version 1 states (single datasets) load as before.

``step`` counts the global steps consumed since the run began (the run log numbers its
segments by it, independently of the cursor); a state saved before steps were counted has
none, and a resume then counts from ``cursor // global_batch``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import StateMismatchError
from ..order.mixture import MIXTURE_ALGORITHM
from ..order.order import ORDER_ALGORITHM, OrderOptions

STATE_VERSION = 1
KEY_VERSION = "version"
KEY_DATASET_ID = "dataset_id"
KEY_SEED = "seed"
KEY_ORDER = "order"
KEY_CURSOR = "cursor"
KEY_STEP = "step"   # optional: states written before steps were counted have none
STATE_KEYS = (KEY_VERSION, KEY_DATASET_ID, KEY_SEED, KEY_ORDER, KEY_CURSOR)
MIXTURE_STATE_VERSION = 2
KEY_MIXTURE = "mixture"
MIXTURE_STATE_KEYS = STATE_KEYS + (KEY_MIXTURE,)
# Positions are int64 (numpy) everywhere: a cursor and the step after it must fit.
MAX_CURSOR = 2**63


@dataclass(frozen=True)
class LoaderState:
    """A parsed, validated loader state."""

    dataset_id: str
    order: OrderOptions
    cursor: int
    mixture: dict | None = None   # a mixture's sources and schedule (version 2)
    step: int | None = None       # global steps consumed (None: a state saved before them)

    def to_dict(self) -> dict:
        out = {KEY_VERSION: STATE_VERSION, KEY_DATASET_ID: self.dataset_id,
               KEY_SEED: self.order.seed, KEY_ORDER: self.order.to_dict(),
               KEY_CURSOR: int(self.cursor)}
        if self.mixture is not None:
            out[KEY_VERSION] = MIXTURE_STATE_VERSION
            out[KEY_MIXTURE] = json.dumps(self.mixture, sort_keys=True, separators=(",", ":"))
        if self.step is not None:
            out[KEY_STEP] = int(self.step)
        return out

    def step_or(self, global_batch: int) -> int:
        """The state's step, or for a state saved without one ``cursor // global_batch``."""
        return self.cursor // global_batch if self.step is None else self.step


def _plain(v):
    # torch.distributed.checkpoint may hand back 0-d tensors or numpy scalars for ints.
    if hasattr(v, "item") and callable(v.item):
        return v.item()
    return v


def _check_algorithm(what: str, saved, current: int) -> None:
    """Refuse a checkpoint whose order (or mixture interleave) is another algorithm's.

    Another number means another position -> sample mapping (formats/order/ pins each), so
    resuming would read other samples than the run's; only the exact int matches (``True``
    and ``1.0`` compare equal to 1 but are not what a loader writes).
    """
    if type(saved) is int and saved == current:
        return
    raise StateMismatchError(
        f"checkpoint was written with {what} algorithm {saved!r}, but this zephon_store "
        f"implements {what} algorithm {current}: it would resume into another sample order; "
        "resume with the zephon_store version that wrote the checkpoint (or start a new run)")


def _check_step(state: dict) -> int | None:
    """The state's ``step`` (None when it has none), or StateMismatchError."""
    if KEY_STEP not in state:
        return None
    step = _plain(state[KEY_STEP])   # DCP may hand back a 0-d tensor
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise StateMismatchError(f"loader state 'step' must be an int >= 0, got {step!r}; the "
                                 "checkpoint is corrupted")
    return step


def _check_keys(state: dict, version, *, dataset_id: str, mixture: bool) -> None:
    """The state is of the kind the loader reads (one dataset or a mixture) and holds
    exactly its keys (``step`` optional)."""
    if (version == MIXTURE_STATE_VERSION) != mixture:
        saved = ("a mixture" if version == MIXTURE_STATE_VERSION
                 else f"dataset {state.get(KEY_DATASET_ID)}")
        reads = "a mixture" if mixture else f"dataset {dataset_id}"
        raise StateMismatchError(f"checkpoint (state version {version}) is for {saved}, but "
                                 f"the loader reads {reads}; point the loader at what the run "
                                 "started with")
    keys = MIXTURE_STATE_KEYS if mixture else STATE_KEYS
    missing = [k for k in keys if k not in state]
    extra = [k for k in state if k not in keys and k != KEY_STEP]
    if missing or extra:
        raise StateMismatchError(f"loader state keys: missing {missing}, unexpected {extra}; "
                                 f"expected exactly {list(keys)}")


def check_state(state: dict, *, dataset_id: str, order: OrderOptions,
                mixture: bool = False) -> LoaderState:
    """Validate a state dict against the data and options it is loaded into.

    Every key is checked (``step`` too, when the state has one: the returned state's
    ``step`` is None when it has not); the error names the first wrong one and what to do. Options
    with ``lanes="auto"`` accept the checkpoint's lane count (the returned state's
    ``order`` is the checkpoint's, which a resume must use). With
    ``mixture=True`` the state must be a mixture's (version 2); its ``mixture`` entry comes
    back parsed, and its sources and schedule are checked by
    :meth:`zephon_store.mix.mixed.MixedDataset.resumed` (the mixture's ``dataset_id`` changes
    when a stage is appended, so it is not compared here).

    >>> check_state({"version": 1, "dataset_id": "xxh3:00", "seed": 0,
    ...              "order": OrderOptions().to_dict(), "cursor": 0},
    ...             dataset_id="xxh3:11", order=OrderOptions())
    Traceback (most recent call last):
    ...
    zephon_store.errors.StateMismatchError: checkpoint is for dataset xxh3:00, but the loader reads dataset xxh3:11; point the loader at the dataset the run started with (or start a new run)
    """
    if not isinstance(state, dict):
        raise StateMismatchError(f"loader state must be a dict, got {type(state).__name__}")
    step = _check_step(state)
    version = _plain(state.get(KEY_VERSION))
    if version not in (STATE_VERSION, MIXTURE_STATE_VERSION):
        raise StateMismatchError(f"loader state version {version!r} is not supported "
                                 f"(this zephon_store reads versions {STATE_VERSION} and "
                                 f"{MIXTURE_STATE_VERSION})")
    _check_keys(state, version, dataset_id=dataset_id, mixture=mixture)
    mix = None
    if mixture:
        try:
            mix = json.loads(state[KEY_MIXTURE])
        except (TypeError, ValueError) as exc:
            raise StateMismatchError(f"loader state 'mixture' is not a JSON string: {exc}; "
                                     "the checkpoint is corrupted") from exc
        if not isinstance(mix, dict):
            raise StateMismatchError("loader state 'mixture' must hold a JSON object; the "
                                     "checkpoint is corrupted")
    # Before anything else is compared: under another algorithm nothing else means the same.
    saved_order = state[KEY_ORDER]
    if isinstance(saved_order, Mapping) and "algorithm" in saved_order:
        _check_algorithm("order", _plain(saved_order["algorithm"]), ORDER_ALGORITHM)
    schedule = mix.get("schedule") if mix is not None else None
    if isinstance(schedule, dict) and "algorithm" in schedule:
        _check_algorithm("mixture", schedule["algorithm"], MIXTURE_ALGORITHM)
    if not mixture and state[KEY_DATASET_ID] != dataset_id:
        raise StateMismatchError(
            f"checkpoint is for dataset {state[KEY_DATASET_ID]}, but the loader reads dataset "
            f"{dataset_id}; point the loader at the dataset the run started with (or start a "
            "new run)")
    try:
        saved = OrderOptions.from_dict({k: _plain(v) for k, v in dict(state[KEY_ORDER]).items()})
    except (TypeError, ValueError) as exc:
        raise StateMismatchError(f"loader state 'order' is invalid: {exc}") from exc
    if _plain(state[KEY_SEED]) != saved.seed:
        raise StateMismatchError(f"loader state 'seed' ({_plain(state[KEY_SEED])}) disagrees "
                                 f"with its order options (seed={saved.seed})")
    if order.is_auto:
        # "auto" lanes were resolved when the run first started; the checkpoint holds the
        # number, which the resumed run must keep (OrderOptions.resolved).
        order = order.replace(lanes=saved.lanes)
    if saved != order:
        diff = {k: (saved.to_dict()[k], order.to_dict()[k]) for k in saved.to_dict()
                if saved.to_dict()[k] != order.to_dict()[k]}
        raise StateMismatchError(
            "checkpoint order options differ from the loader's: "
            + ", ".join(f"{k}: checkpoint {a!r} vs loader {b!r}" for k, (a, b) in diff.items())
            + "; the sample order would change. Use the checkpoint's options to resume.")
    cursor = _plain(state[KEY_CURSOR])
    if not isinstance(cursor, int) or isinstance(cursor, bool) or not 0 <= cursor < MAX_CURSOR:
        raise StateMismatchError(f"loader state 'cursor' must be an int in [0, 2**63), got "
                                 f"{cursor!r}; the checkpoint is corrupted")
    return LoaderState(dataset_id=state[KEY_DATASET_ID] if mixture else dataset_id,
                       order=saved, cursor=cursor, mixture=mix, step=step)
