"""The loader checkpoint: ``{version, dataset_id, seed, order, cursor}``, nothing else.

Identical on every rank, so a distributed checkpoint stores it once and any world size can
load it. ``cursor`` counts samples the training loop consumed, across epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import StateMismatchError
from ..order.order import OrderOptions

STATE_VERSION = 1
KEY_VERSION = "version"
KEY_DATASET_ID = "dataset_id"
KEY_SEED = "seed"
KEY_ORDER = "order"
KEY_CURSOR = "cursor"
STATE_KEYS = (KEY_VERSION, KEY_DATASET_ID, KEY_SEED, KEY_ORDER, KEY_CURSOR)
# Positions are int64 (numpy) everywhere: a cursor and the step after it must fit.
MAX_CURSOR = 2**63


@dataclass(frozen=True)
class LoaderState:
    """A parsed, validated loader state."""

    dataset_id: str
    order: OrderOptions
    cursor: int

    def to_dict(self) -> dict:
        return {KEY_VERSION: STATE_VERSION, KEY_DATASET_ID: self.dataset_id,
                KEY_SEED: self.order.seed, KEY_ORDER: self.order.to_dict(),
                KEY_CURSOR: int(self.cursor)}


def _plain(v):
    # torch.distributed.checkpoint may hand back 0-d tensors or numpy scalars for ints.
    if hasattr(v, "item") and callable(v.item):
        return v.item()
    return v


def check_state(state: dict, *, dataset_id: str, order: OrderOptions) -> LoaderState:
    """Validate a state dict against the data and options it is loaded into.

    Every key is checked; the error names the first wrong one and what to do.

    >>> check_state({"version": 1, "dataset_id": "xxh3:00", "seed": 0,
    ...              "order": OrderOptions().to_dict(), "cursor": 0},
    ...             dataset_id="xxh3:11", order=OrderOptions())
    Traceback (most recent call last):
    ...
    zephon_store.errors.StateMismatchError: checkpoint is for dataset xxh3:00, but the loader reads dataset xxh3:11; point the loader at the dataset the run started with (or start a new run)
    """
    if not isinstance(state, dict):
        raise StateMismatchError(f"loader state must be a dict, got {type(state).__name__}")
    missing = [k for k in STATE_KEYS if k not in state]
    extra = [k for k in state if k not in STATE_KEYS]
    if missing or extra:
        raise StateMismatchError(f"loader state keys: missing {missing}, unexpected {extra}; "
                                 f"expected exactly {list(STATE_KEYS)}")
    version = _plain(state[KEY_VERSION])
    if version != STATE_VERSION:
        raise StateMismatchError(f"loader state version {version!r} is not supported "
                                 f"(this zephon_store reads version {STATE_VERSION})")
    if state[KEY_DATASET_ID] != dataset_id:
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
    return LoaderState(dataset_id=dataset_id, order=saved, cursor=cursor)
