"""Takedowns without re-conversion: a deny list of samples, blanked and masked in the batches.

A deny list names samples by global id, or by provenance key (an input file the
conversion recorded; every sample converted from it is denied). The loader keeps the
cursor a plain count of positions and the order untouched: a denied sample still takes its
position, but its bytes never leave the reader: every payload column of its row is blanked
(:func:`blank_denied`) before any transform or collate sees the batch, and the batch carries
``_masked`` (bool, one per sample) so the loss can ignore the row, as OLMo does for
filtered instances. Nothing shifts, so ``trace`` and ``audit`` stay exact; the list's
identity (a hash of its sorted ids and the dataset id) and the mode go into the run log,
with a content-addressed copy of the ids beside it (:func:`save_logged_copy`), so a resume
may change the list, even by editing the file in place, and every past segment stays
auditable.

File format (JSON): ``{"ids": [17, 42], "inputs": ["part-00.jsonl"]}`` (either key may be
missing); or plain text, one id per line (``#`` starts a comment). A mixture's list names
each source's own ids: ``{"sources": {"web": {"ids": [...], "inputs": [...]}}}``
(:func:`open_deny_list`, the loaders' one entry). Only a regular file is
read (a FIFO would block the reader forever).

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
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .._util.hashing import xxh3_hex
from .._util.regular import NotRegularFileError, read_regular
from ..errors import DenyListError

__all__ = ["DenyList", "DenyListError", "MASK_KEY", "MixtureIds", "blank_denied", "blank_value",
           "document_spans", "load_deny_list", "load_logged_copy", "logged_copy_path",
           "open_deny_list", "provenance_ids", "save_logged_copy"]

MASK_KEY = "_masked"
DENY_MODE = "mask"
# The logged copy of a list (save_logged_copy): its own kind, so a stray JSON is not taken
# for one.
COPY_KIND = "zephon-denylist"
COPY_VERSION = 1
# An identity as the run log holds it; anything else could name a path outside the copies'
# folder.
IDENTITY_RE = re.compile(r"xxh3:[0-9a-f]{32}")
# Ids are int64 positions in a dataset; a copy is checked against this bound when the
# dataset's size is not at hand (its identity is what binds it).
MAX_ID = 1 << 63


@dataclass(frozen=True)
class DenyList:
    """Sorted, distinct sample ids to mask; ``path`` is where it was read from (or "").

    A list that names documents (packed data with a document table) also holds their
    ``spans``: ``[k, 3]`` int64 rows ``(window, offset, length)``, sorted, in the ids'
    space (a mixture's: each source's windows at its offset); those tokens are blanked
    and the rest of each window trains (:func:`blank_documents`). ``documents``: the
    ``(source index or -1, document number)`` pairs they come from.
    """

    ids: np.ndarray
    dataset_id: str
    path: str = ""
    spans: np.ndarray | None = None
    documents: tuple = ()

    def __post_init__(self) -> None:
        ids = np.unique(np.asarray(self.ids, dtype=np.int64))
        object.__setattr__(self, "ids", ids)
        if self.spans is not None:
            spans = np.asarray(self.spans, dtype=np.int64).reshape(-1, 3)
            spans = np.unique(spans, axis=0) if spans.size else spans
            object.__setattr__(self, "spans", spans if spans.size else None)
        object.__setattr__(self, "documents", tuple(sorted({(int(k), int(d))
                                                            for k, d in self.documents})))

    @property
    def identity(self) -> str:
        """``xxh3:...`` of the dataset id and the sorted ids (and the documents' spans, when
        it names documents): equal lists, equal identity."""
        data = self.dataset_id.encode() + b"\0" + self.ids.tobytes()
        if self.spans is not None:
            data += b"\0documents\0" + self.spans.tobytes()
        return "xxh3:" + xxh3_hex(data)

    def spans_in(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(row, offset, length)`` of every denied document span in the windows ``ids``
        (row ``j``: ``ids[j]``); empty arrays when none.

        >>> d = DenyList([], "x", spans=[[7, 2, 3], [9, 0, 1]])
        >>> [a.tolist() for a in d.spans_in(np.array([9, 5, 7]))]
        [[0, 2], [0, 2], [1, 3]]
        """
        none = np.zeros(0, dtype=np.int64)
        if self.spans is None:
            return none, none, none
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        win = self.spans[:, 0]
        lo, hi = np.searchsorted(win, ids, "left"), np.searchsorted(win, ids, "right")
        count = hi - lo
        if not count.any():
            return none, none, none
        rows = np.repeat(np.arange(ids.size), count)
        at = np.concatenate([np.arange(a, b) for a, b in zip(lo[count > 0], hi[count > 0])])
        return rows, self.spans[at, 1], self.spans[at, 2]

    def blanked_tokens(self, ids: np.ndarray) -> np.ndarray:
        """Tokens of denied documents in each window of ``ids`` (int64, same shape)."""
        ids = np.asarray(ids, dtype=np.int64)
        rows, _, length = self.spans_in(ids)
        return np.bincount(rows, weights=length, minlength=ids.size).astype(np.int64).reshape(
            ids.shape)

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

    def check_for(self, manifest) -> None:
        """Raise :class:`DenyListError` unless this list is for the dataset of ``manifest``
        (a list made for another dataset would mask the wrong samples)."""
        where = f"deny list {self.path}" if self.path else "deny list"
        if self.dataset_id != manifest.dataset_id:
            raise DenyListError(f"{where} is for dataset {self.dataset_id}, not "
                                f"{manifest.dataset_id}; make it for the dataset the loader reads")
        if self.ids.size and not 0 <= int(self.ids[0]) <= int(self.ids[-1]) < manifest.num_samples:
            bad = int(self.ids[0]) if int(self.ids[0]) < 0 else int(self.ids[-1])
            raise DenyListError(f"{where}: id {bad} is outside the dataset's "
                                f"[0, {manifest.num_samples})")

    def with_spans(self, spans, documents) -> DenyList:
        """This list plus documents' ``spans`` (``[k, 3]``) and their ``documents`` pairs."""
        mine = np.zeros((0, 3), np.int64) if self.spans is None else self.spans
        return DenyList(self.ids, self.dataset_id, self.path,
                        np.concatenate([mine, np.asarray(spans, np.int64).reshape(-1, 3)]),
                        self.documents + tuple(documents))

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
        raise DenyListError(f"input(s) {unknown}: the dataset's provenance does not record "
                            f"them; it records e.g. {sample}")
    want = set(inputs)
    parts = [np.arange(s, s + n, dtype=np.int64)
             for name, s, n in zip(names, start.tolist(), rows.tolist()) if name in want]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _read_regular(path: str, what: str) -> str:
    """The text of the regular file ``path``; anything else (a FIFO, a device, a folder) is
    refused before a byte is read (:func:`~zephon_store._util.regular.read_regular`)."""
    try:
        data = read_regular(path)
    except NotRegularFileError:
        raise DenyListError(f"{what} {path}: not a regular file; pass a JSON or text file") \
            from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DenyListError(f"{what} {path}: not UTF-8 text ({exc})") from None


def _json(text: str, what: str, path: str):
    try:
        return json.loads(text)
    except RecursionError:
        raise DenyListError(f"{what} {path}: JSON nested too deeply") from None
    except ValueError as exc:
        raise DenyListError(f"{what} {path}: not valid JSON ({exc})") from None


def _checked_ids(ids: list, n: int, what: str) -> np.ndarray:
    """``ids`` as int64, each an int in ``[0, n)`` (checked as Python ints: an id beyond
    int64 is out of range, not an OverflowError)."""
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool):
            raise DenyListError(f"{what}: ids must be integers, got {i!r}")
        if not 0 <= i < n:
            raise DenyListError(f"{what}: id {i} is outside the dataset's [0, {n})")
    return np.asarray(ids, dtype=np.int64)


def load_deny_list(path: str, manifest, *, source: int = -1) -> DenyList:
    """Read a deny list file (module docstring) for the dataset of ``manifest`` (ids
    checked against its size, input names against its provenance); a malformed file raises
    :class:`DenyListError` naming it, and the key or line."""
    text = _read_regular(path, "deny list")
    where = f"deny list {path}"
    if text.lstrip().startswith("{"):
        return _from_doc(_json(text, "deny list", path), manifest, where, path, source)
    ids: list = []
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            ids.append(int(line))
        except ValueError:
            raise DenyListError(f"{where} line {n}: {line[:40]!r} is not a sample id") from None
    return DenyList(_checked_ids(ids, manifest.num_samples, where), manifest.dataset_id, path)


def _from_doc(doc, manifest, where: str, path: str = "", source: int = -1) -> DenyList:
    """A deny list from its JSON object ``{"ids": [...], "inputs": [...], "documents":
    [...]}`` (any key may be missing) for the dataset of ``manifest`` (mixture source
    ``source``; -1: one dataset)."""
    if not isinstance(doc, dict):
        raise DenyListError(f"{where}: expected an object with \"ids\" and/or \"inputs\", "
                            f"got {doc!r:.80}")
    unknown = sorted(set(doc) - {"ids", "inputs", "documents"})
    if unknown:
        raise DenyListError(f"{where}: unknown key(s) {unknown}; use \"ids\", \"inputs\" "
                            "and \"documents\""
                            + ("; a mixture's list names its sources under \"sources\""
                               if "sources" in doc else ""))
    ids = doc.get("ids", [])
    if not isinstance(ids, list):
        raise DenyListError(f"{where}: 'ids' must be a list of sample ids, got {ids!r:.80}")
    inputs = doc.get("inputs", [])
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise DenyListError(f"{where}: 'inputs' must be a list of input file names, got "
                            f"{inputs!r:.80}")
    arr = _checked_ids(ids, manifest.num_samples, where)
    if inputs:
        try:
            arr = np.concatenate([arr, provenance_ids(manifest, inputs)])
        except DenyListError as exc:
            raise DenyListError(f"{where}: {exc}") from None
    deny = DenyList(arr, manifest.dataset_id, path)
    if "documents" in doc:
        spans, docs = document_spans(doc["documents"], manifest, where)
        deny = deny.with_spans(spans, [(source, d) for d in docs])
    return deny


def document_spans(refs, manifest, where: str) -> tuple[np.ndarray, list[int]]:
    """``(spans [k, 3], document numbers)`` of the documents a deny list's ``documents``
    names (``{"input": ..., "record": ...}`` or ``{"xxh3": ...}``), from the dataset's
    document table; refused in one line naming the list and the reference."""
    from ..errors import DocumentNotFoundError, NoDocumentTableError
    from ..read.documents import DocumentTable

    if not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs):
        raise DenyListError(f"{where}: 'documents' must be a list of {{\"input\": FILE, "
                            f"\"record\": N}} or {{\"xxh3\": HASH}} objects, got {refs!r:.80}")
    try:
        table = DocumentTable(manifest)
    except NoDocumentTableError as exc:
        raise DenyListError(f"{where}: 'documents' needs a document table: {exc}") from None
    for ref in refs:
        record = ref.get("record")
        if "input" in ref and (not isinstance(record, int) or isinstance(record, bool)
                               or record < 0):
            raise DenyListError(f"{where}: document {ref!r:.80}: 'record' must be an int >= 0 "
                                "(the record's 0-based index in its input)")
    try:
        docs = table.resolve(refs)
    except (DocumentNotFoundError, ValueError) as exc:
        raise DenyListError(f"{where}: {str(exc).strip(chr(34) + chr(39))}") from None
    found = table.spans([d.id for d in docs])
    spans = np.stack([found.window, found.offset, found.length], axis=1)
    return spans, [d.id for d in docs]


# -- a mixture's list: one list per source, in the mixture's ids -----------------------------


@dataclass(frozen=True)
class MixtureIds:
    """The sample ids of a mixture as a deny list sees them: source ``k``'s id ``i`` is the
    mixture's id ``offsets[k] + i`` (the ids every batch's ``_seq``, ``trace`` and ``audit``
    use). ``dataset_id`` names the sources (their names and dataset ids, not the schedule,
    which a resume may extend), so a list stays valid across stages."""

    names: tuple[str, ...]
    manifests: tuple
    offsets: tuple[int, ...]
    num_samples: int

    @property
    def dataset_id(self) -> str:
        doc = [[n, m.dataset_id] for n, m in zip(self.names, self.manifests)]
        return "mixids:" + xxh3_hex(json.dumps(doc).encode())


def open_deny_list(deny_list, space) -> DenyList:
    """The loaders' one entry: ``deny_list`` as the user gave it, for the ids ``space`` (a
    dataset's manifest, or a mixture's :class:`MixtureIds`), checked against it.

    For one dataset: a file (module docstring), a list of sample ids or a :class:`DenyList`.
    For a mixture: a file ``{"sources": {"web": {"ids": [...], "inputs": [...]}, ...}}``
    naming each source's own sample ids and inputs, the same as a dict (whose values may
    also be a list of the source's sample ids, a list file's path or a source's
    :class:`DenyList`), or a :class:`DenyList` made for this mixture.
    Sources not named are not denied from.
    """
    if isinstance(deny_list, DenyList):
        if isinstance(space, MixtureIds) and deny_list.dataset_id != space.dataset_id:
            raise DenyListError(
                f"deny list {deny_list.path or ''} is for dataset {deny_list.dataset_id}, not "
                f"this mixture; pass {{source name: list}} for its sources {list(space.names)}")
        deny_list.check_for(space)
        return deny_list
    if not isinstance(space, MixtureIds):
        if isinstance(deny_list, Mapping):
            raise DenyListError("deny_list: a dict names the lists of a mixture's sources; for "
                                "one dataset pass a file, a list of sample ids or a DenyList")
        if _is_id_list(deny_list):
            return _from_doc({"ids": _id_list(deny_list)}, space, "deny list")
        return load_deny_list(str(deny_list), space)
    path, where = "", "deny list"
    if not isinstance(deny_list, Mapping):
        path = str(deny_list)
        where = f"deny list {path}"
        doc = _json(_read_regular(path, "deny list"), "deny list", path)
        if not isinstance(doc, dict) or set(doc) != {"sources"}:
            raise DenyListError(
                f"{where}: a mixture's deny list is a JSON object {{\"sources\": {{NAME: "
                f"{{\"ids\": [...], \"inputs\": [...]}}}}}} naming the sources "
                f"{list(space.names)} (a source's own ids, as 'zephon where' prints them)")
        deny_list = doc["sources"]
        if not isinstance(deny_list, dict):
            raise DenyListError(f"{where}: 'sources' must be an object, got {deny_list!r:.80}")
    return _mixture_list(deny_list, space, where, path)


def _is_id_list(value) -> bool:
    """Whether ``value`` is sample ids given inline (a list, tuple or integer array), not a
    file's path."""
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray)
                                                 and value.ndim == 1)


def _id_list(value) -> list:
    return value.tolist() if isinstance(value, np.ndarray) else list(value)


def _mixture_list(per_source: Mapping, space: MixtureIds, where: str, path: str) -> DenyList:
    unknown = sorted(set(per_source) - set(space.names))
    if unknown:
        raise DenyListError(f"{where}: source(s) {unknown} are not in the mixture; its "
                            f"sources are {list(space.names)}")
    parts = [np.zeros(0, dtype=np.int64)]
    spans: list[np.ndarray] = []
    documents: list[tuple[int, int]] = []
    for k, name in enumerate(space.names):
        if name not in per_source:
            continue
        given, manifest = per_source[name], space.manifests[k]
        at = f"{where}, source {name!r}"
        if isinstance(given, DenyList):
            given.check_for(manifest)
            one = given
        elif isinstance(given, Mapping):
            one = _from_doc(dict(given), manifest, at, source=k)
        elif _is_id_list(given):   # the source's own sample ids, as 'zephon where' prints them
            one = _from_doc({"ids": _id_list(given)}, manifest, at, source=k)
        else:
            try:
                one = load_deny_list(str(given), manifest, source=k)
            except DenyListError as exc:
                raise DenyListError(f"{at}: {exc}") from None
        parts.append(one.ids + space.offsets[k])
        if one.spans is not None:
            spans.append(one.spans + np.array([space.offsets[k], 0, 0]))
            documents += [(k, d) for _, d in one.documents]
    deny = DenyList(np.concatenate(parts), space.dataset_id, path)
    return deny.with_spans(np.concatenate(spans), documents) if spans else deny


# -- what a denied row looks like ------------------------------------------------------------


def blank_value(t: pa.DataType):
    """What a denied row holds in a column of Arrow type ``t`` when the batch gives that
    column as a Python list: ``""`` for text, ``b""`` for binary (zero bytes of the width for
    fixed-size binary), ``[]`` for variable lists, a list of blanks for fixed-size lists, 0
    for numbers, False for booleans, None (null) for anything else (structs, maps, dates).

    >>> [blank_value(t) for t in (pa.string(), pa.binary(3), pa.list_(pa.int32()),
    ...                           pa.list_(pa.int8(), 2), pa.float32(), pa.timestamp("s"))]
    ['', b'\\x00\\x00\\x00', [], [0, 0], 0, None]
    """
    if pa.types.is_dictionary(t):
        return blank_value(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return ""
    if pa.types.is_fixed_size_binary(t):
        return bytes(t.byte_width)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return b""
    if pa.types.is_fixed_size_list(t):
        return [blank_value(t.value_type) for _ in range(t.list_size)]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return []
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return 0
    if pa.types.is_boolean(t):
        return False
    return None


def blank_denied(batch: dict, masked: np.ndarray, types: Mapping[str, pa.DataType]) -> dict:
    """``batch`` with every payload column of the ``masked`` rows blanked, before anything
    else sees it: numpy columns (numbers, token windows) get zeros of the same shape, list
    columns :func:`blank_value` of the column's Arrow type (``types``: the dataset's
    selected columns; other keys, ``_seq``, ``_source``, ``_masked``, are the loader's and
    kept). The row keeps its place, so the batch size and every position stay. Arrays are
    copied before writing (they may be read-only views of decoded row groups); a batch
    without a denied row is returned as it is.

    >>> b = {"text": ["a", "secret"], "tokens": np.array([[1, 2], [3, 4]]), "_seq": np.array([0, 7])}
    >>> out = blank_denied(b, np.array([False, True]),
    ...                    {"text": pa.string(), "tokens": pa.list_(pa.int64(), 2)})
    >>> out["text"], out["tokens"].tolist(), out["_seq"].tolist()
    (['a', ''], [[1, 2], [0, 0]], [0, 7])
    """
    rows = np.flatnonzero(masked)
    if rows.size == 0:
        return batch
    out = dict(batch)
    for name, t in types.items():
        if name not in out:
            continue
        value = out[name]
        if isinstance(value, np.ndarray):
            value = value.copy()
            value[rows] = 0
        else:
            value = list(value)
            for r in rows.tolist():
                value[r] = blank_value(t)
        out[name] = value
    return out


# -- the run log's copy of each list ---------------------------------------------------------


def logged_copy_path(run_log: str, identity: str) -> str:
    """Where the run log ``run_log`` keeps the list ``identity``: the folder
    ``<run log>.denylists`` beside it, one file per identity (content-addressed, so two
    segments that honoured one list share it, and editing the list file changes nothing).

    >>> logged_copy_path("/ckpt/run.jsonl", "xxh3:" + "0" * 32)
    '/ckpt/run.jsonl.denylists/xxh3-00000000000000000000000000000000.json'
    """
    if not isinstance(identity, str) or not IDENTITY_RE.fullmatch(identity):
        raise DenyListError(f"deny list identity {identity!r:.80} is not xxh3:<32 hex digits>")
    return os.path.join(os.path.abspath(run_log) + ".denylists",
                        identity.replace(":", "-") + ".json")


def save_logged_copy(deny: DenyList, run_log: str) -> str:
    """Write ``deny``'s ids beside ``run_log`` (:func:`logged_copy_path`), atomically, unless
    a sound copy is there already (one that does not hash to its name is written again:
    the content is fixed by the name); return its path. Rank 0 calls this before the log
    line that names the list, so a line never names a copy that is not complete on disk."""
    from .._util.atomic import atomic_write

    path = logged_copy_path(run_log, deny.identity)
    try:
        sound = load_logged_copy(run_log, deny.to_log(), MAX_ID) is not None
    except DenyListError:
        sound = False
    if not sound:
        doc = {"kind": COPY_KIND, "version": COPY_VERSION, "id": deny.identity,
               "dataset_id": deny.dataset_id, "count": int(deny.ids.size),
               "path": os.path.abspath(deny.path) if deny.path else "",
               "ids": deny.ids.tolist()}
        if deny.spans is not None:   # the documents' spans as resolved: the run's list
            doc["spans"] = deny.spans.tolist()
            doc["documents"] = [list(d) for d in deny.documents]
        atomic_write(path, (json.dumps(doc) + "\n").encode())
    return path


def load_logged_copy(run_log: str, entry: dict, num_samples: int) -> DenyList | None:
    """The list a run log's ``deny_list`` ``entry`` names, from its copy beside the log; None
    when there is no copy (a log written before copies were kept). The copy's content must
    hash to the entry's identity, so an edited or swapped copy raises
    :class:`DenyListError` naming it."""
    path = logged_copy_path(run_log, entry["id"])
    if not os.path.lexists(path):
        return None
    what = "logged deny list copy"
    doc = _json(_read_regular(path, what), what, path)
    where = f"{what} {path}"
    if not isinstance(doc, dict) or doc.get("kind") != COPY_KIND:
        raise DenyListError(f"{where}: not a zephon deny list copy (no \"kind\": "
                            f"\"{COPY_KIND}\")")
    if doc.get("version") != COPY_VERSION:
        raise DenyListError(f"{where}: version {doc.get('version')!r:.20} is not supported "
                            f"(this zephon_store reads version {COPY_VERSION})")
    ids, dataset_id = doc.get("ids"), doc.get("dataset_id")
    if not isinstance(ids, list) or not isinstance(dataset_id, str):
        raise DenyListError(f"{where}: 'ids' must be a list and 'dataset_id' a string")
    spans, documents = doc.get("spans"), doc.get("documents", [])
    if spans is not None and not (isinstance(spans, list) and isinstance(documents, list)
                                  and all(isinstance(x, list) and len(x) == 3 for x in spans)
                                  and all(isinstance(x, list) and len(x) == 2
                                          for x in documents)):
        raise DenyListError(f"{where}: 'spans' must be [window, offset, length] triples and "
                            "'documents' [source, document] pairs")
    deny = DenyList(_checked_ids(ids, num_samples, where), dataset_id,
                    str(doc.get("path") or entry.get("path") or ""),
                    None if spans is None else np.array(spans, dtype=np.int64).reshape(-1, 3),
                    tuple(tuple(d) for d in documents))
    if deny.identity != entry["id"]:
        raise DenyListError(f"{where}: its ids hash to {deny.identity}, the run log names "
                            f"{entry['id']}; the copy was changed: restore it from a backup")
    return deny
