"""One staged input: what the parse phase (or a re-staging pass such as token packing) left in
the staging folder for one input file, and the one place its JSON form is read and written.

Its files are ``<base>.arrow`` (the rows, Arrow IPC; absent when it holds none),
``<base>.sizes.npy`` (every row's size before compression, which the shard cuts use) and
``<base>.json`` (this record, written last: the done marker). Paths are relative to the
job's :class:`~zephon_store.write.staging.StagingArea`.

>>> s = StagedInput(index=3, url="a.jsonl", rows=0, input_bytes=10, schema_b64=None)
>>> StagedInput.from_dict(s.to_dict()) == s, s.rel
(True, 'parsed/000003')
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from ..format.manifest import schema_from_base64
from .staging import StagingArea

__all__ = ["StagedInput", "arrow_batch_rows", "read_staged"]


@dataclass(frozen=True)
class StagedInput:
    """One input's staged rows.

    ``base``: where its files live, relative to the staging folder (default
    ``parsed/<index>``; packing stages ``packed/<index>``). ``first_window``: for packed
    windows, the number of the first window this input holds. ``batch_rows``: the rows of
    each record batch of the ``.arrow`` file, so a task reads only the batches it needs.
    """

    index: int
    url: str
    rows: int
    input_bytes: int
    schema_b64: str | None
    stats: dict = field(default_factory=dict)
    base: str | None = None
    first_window: int | None = None
    batch_rows: tuple[int, ...] | None = None

    @property
    def schema(self) -> pa.Schema:
        return schema_from_base64(self.schema_b64)

    @property
    def rel(self) -> str:
        """The staging-relative prefix of this input's ``.arrow``/``.sizes.npy``/``.json``."""
        return self.base or f"parsed/{self.index:06d}"

    def complete(self, area: StagingArea) -> bool:
        """True when every file it stands for is still there (a cleanup killed half way by an
        older version could leave the record without its data)."""
        needed = [self.rel + ".sizes.npy"] + ([self.rel + ".arrow"] if self.rows else [])
        return all(area.exists(p) for p in needed)

    def read_rows(self, area: StagingArea, start: int, n: int) -> pa.Table:
        """Rows ``[start, start + n)`` of this input, reading only the batches that hold them."""
        reader = area.open_arrow(self.rel + ".arrow")
        if self.batch_rows is None:
            return reader.read_all().slice(start, n)
        ends = np.cumsum(self.batch_rows)
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, start + n - 1, side="right"))
        batches = [reader.get_batch(j) for j in range(first, last + 1)]
        skip = start - (int(ends[first - 1]) if first else 0)
        return pa.Table.from_batches(batches, schema=reader.schema).slice(skip, n)

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
        if self.batch_rows is not None:
            d["batch_rows"] = list(self.batch_rows)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> StagedInput:
        return cls(index=int(d["index"]), url=d["url"], rows=int(d["rows"]),
                   input_bytes=int(d["input_bytes"]), schema_b64=d.get("schema_b64"),
                   stats=d.get("stats") or {}, base=d.get("base"),
                   first_window=d.get("first_window"),
                   batch_rows=tuple(d["batch_rows"]) if d.get("batch_rows") is not None else None)


def read_staged(area: StagingArea, rel: str) -> StagedInput | None:
    """The staged input recorded at ``rel``, or None when absent or unreadable (redo it)."""
    d = area.read_json(rel)
    try:
        return StagedInput.from_dict(d) if d is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def arrow_batch_rows(path: str) -> tuple[int, ...]:
    """The rows of each record batch of the local Arrow IPC file ``path`` (memory-mapped)."""
    reader = pa.ipc.open_file(pa.memory_map(path))
    return tuple(reader.get_batch(j).num_rows for j in range(reader.num_record_batches))
