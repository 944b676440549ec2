"""Takedowns without re-conversion: a deny list of samples, masked in the batches.

A deny list names samples by global id, or by provenance key (an input file the
conversion recorded; every sample converted from it is denied). The loader keeps the
cursor a plain count of positions and the order untouched: a denied sample still takes its
position, and the batch carries ``_masked`` (bool, one per sample) so the loss can ignore
it, as OLMo does for filtered instances. Nothing shifts, so ``trace`` and ``audit`` stay
exact; the list's identity (a hash of its sorted ids and the dataset id) and the mode go
into the run log, and a resume may change the list (the run log records the change).

File format (JSON): ``{"ids": [17, 42], "inputs": ["part-00.jsonl"]}`` (either key may be
missing); or plain text, one id per line (``#`` starts a comment).

>>> import os, json
>>> from zephon_store import open_dataset
>>> ds = open_dataset(tiny_dataset)
>>> path = os.path.join(tmp, "deny.json")
>>> _ = open(path, "w").write(json.dumps({"ids": [5, 3, 5]}))
>>> deny = load_deny_list(path, ds.manifest)
>>> deny.ids.tolist(), deny.masked(np.array([1, 3, 5, 7])).tolist()
([3, 5], [False, True, True, False])
>>> deny.identity.startswith("xxh3:"), deny.to_log()["count"]
(True, 2)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from .._util.hashing import xxh3_hex

__all__ = ["DenyList", "MASK_KEY", "load_deny_list", "provenance_ids"]

MASK_KEY = "_masked"
DENY_MODE = "mask"


@dataclass(frozen=True)
class DenyList:
    """Sorted, distinct sample ids to mask; ``path`` is where it was read from (or "")."""

    ids: np.ndarray
    dataset_id: str
    path: str = ""

    def __post_init__(self) -> None:
        ids = np.unique(np.asarray(self.ids, dtype=np.int64))
        object.__setattr__(self, "ids", ids)

    @property
    def identity(self) -> str:
        """``xxh3:...`` of the dataset id and the sorted ids: equal lists, equal identity."""
        return "xxh3:" + xxh3_hex(self.dataset_id.encode() + b"\0" + self.ids.tobytes())

    @property
    def mode(self) -> str:
        """``"mask"``: denied samples keep their positions and are flagged in ``_masked``."""
        return DENY_MODE

    def masked(self, ids: np.ndarray) -> np.ndarray:
        """For each sample id, whether it is denied (bool array, same shape)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.ids.size == 0:
            return np.zeros(ids.shape, dtype=bool)
        at = np.minimum(np.searchsorted(self.ids, ids), self.ids.size - 1)
        return self.ids[at] == ids

    def to_log(self) -> dict:
        """The run log's ``deny_list`` entry."""
        return {"id": self.identity, "mode": self.mode, "count": int(self.ids.size),
                "path": os.path.abspath(self.path) if self.path else ""}


def provenance_ids(manifest, inputs: list[str]) -> np.ndarray:
    """The ids of every sample converted from the named inputs (paths as the manifest's
    provenance records them, relative to the conversion's common root)."""
    prov = manifest.tables["provenance"]
    names = prov.column("input").to_pylist()
    start = prov.column("row_start").to_numpy()
    rows = prov.column("num_rows").to_numpy()
    known = set(names)
    unknown = [i for i in inputs if i not in known]
    if unknown:
        sample = sorted(known)[:5]
        raise ValueError(f"deny list names input(s) {unknown} that the dataset's provenance "
                         f"does not record; it records e.g. {sample}")
    want = set(inputs)
    parts = [np.arange(s, s + n, dtype=np.int64)
             for name, s, n in zip(names, start.tolist(), rows.tolist()) if name in want]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def load_deny_list(path: str, manifest) -> DenyList:
    """Read a deny list file (module docstring) for the dataset of ``manifest`` (ids
    checked against its size, input names against its provenance)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    ids: list[int] = []
    inputs: list[str] = []
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"deny list {path}: not valid JSON ({exc})") from exc
        unknown = sorted(set(doc) - {"ids", "inputs"})
        if unknown:
            raise ValueError(f"deny list {path}: unknown key(s) {unknown}; use \"ids\" and "
                             "\"inputs\"")
        ids = list(doc.get("ids", []))
        inputs = [str(i) for i in doc.get("inputs", [])]
    else:
        for n, line in enumerate(text.splitlines(), start=1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                ids.append(int(line))
            except ValueError:
                raise ValueError(f"deny list {path} line {n}: {line!r} is not a sample id"
                                 ) from None
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        raise ValueError(f"deny list {path}: ids must be integers")
    arr = np.asarray(ids, dtype=np.int64)
    n = manifest.num_samples
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
        bad = int(arr[(arr < 0) | (arr >= n)][0])
        raise ValueError(f"deny list {path}: id {bad} is outside the dataset's [0, {n})")
    if inputs:
        arr = np.concatenate([arr, provenance_ids(manifest, inputs)])
    return DenyList(arr, manifest.dataset_id, path)
