"""One staged input: what the parse phase (or a re-staging pass such as token packing) left in
the staging folder for one input file, and the one place its JSON form is read and written.

Its files are ``<base>.arrow`` (the rows, Arrow IPC; absent when it holds none),
``<base>.sizes.npy`` (every row's size before compression, which the shard cuts use) and
``<base>.json`` (this record, written last: the done marker).

>>> s = StagedInput(index=3, url="a.jsonl", rows=0, input_bytes=10, schema_b64=None)
>>> StagedInput.from_dict(s.to_dict()) == s, s.base_path("/st")
(True, '/st/parsed/000003')
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import pyarrow as pa

from ..format.manifest import schema_from_base64
from .staging import read_json

__all__ = ["StagedInput", "read_staged"]


@dataclass(frozen=True)
class StagedInput:
    """One input's staged rows.

    ``base``: where its files live, relative to the staging folder (default
    ``parsed/<index>``; packing stages ``packed/<index>``). ``first_window``: for packed
    windows, the number of the first window this input holds.
    """

    index: int
    url: str
    rows: int
    input_bytes: int
    schema_b64: str | None
    stats: dict = field(default_factory=dict)
    base: str | None = None
    first_window: int | None = None

    @property
    def schema(self) -> pa.Schema:
        return schema_from_base64(self.schema_b64)

    def base_path(self, staging: str) -> str:
        """The path prefix of this input's ``.arrow``/``.sizes.npy``/``.json`` files."""
        return os.path.join(staging, self.base or os.path.join("parsed", f"{self.index:06d}"))

    def complete(self, staging: str) -> bool:
        """True when every file it stands for is still there (a cleanup killed half way by an
        older version could leave the record without its data)."""
        base = self.base_path(staging)
        needed = [base + ".sizes.npy"] + ([base + ".arrow"] if self.rows else [])
        return all(os.path.exists(p) for p in needed)

    def restaged(self, **changes) -> StagedInput:
        """This input's provenance (index, url, input bytes, parse stats) with new rows."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = {"index": self.index, "url": self.url, "rows": self.rows,
             "input_bytes": self.input_bytes, "schema_b64": self.schema_b64, "stats": self.stats}
        if self.base is not None:
            d["base"] = self.base
        if self.first_window is not None:
            d["first_window"] = self.first_window
        return d

    @classmethod
    def from_dict(cls, d: dict) -> StagedInput:
        return cls(index=int(d["index"]), url=d["url"], rows=int(d["rows"]),
                   input_bytes=int(d["input_bytes"]), schema_b64=d.get("schema_b64"),
                   stats=d.get("stats") or {}, base=d.get("base"),
                   first_window=d.get("first_window"))


def read_staged(path: str) -> StagedInput | None:
    """The staged input recorded at ``path``, or None when absent or unreadable (redo it)."""
    d = read_json(path)
    try:
        return StagedInput.from_dict(d) if d is not None else None
    except (KeyError, TypeError, ValueError):
        return None
