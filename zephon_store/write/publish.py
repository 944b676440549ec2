"""Publish a conversion: side tables, then ``manifest.json`` last.

The manifest's presence means every shard and table it names is complete; it is written
with one atomic operation after everything it references (formats/SPEC.md). An output that
already holds a *different* dataset is replaced only with ``overwrite=True``; then, after the
new manifest is in place, what only the old one referenced is removed.

Deleting is bounded by names: only ``shards/<hash>.parquet`` and ``index/<hash>.arrow``
(:func:`~zephon_store.format.manifest.is_dataset_file_name`) are ever removed, so an old
manifest that names ``manifest.json``, a user's ``README.md`` or ``../x`` removes nothing.
Before the manifest goes out every object it names is checked present at its recorded size,
and the output's lock is re-checked (:meth:`~zephon_store.write.lock.HeldLock.check`) before
the manifest and before any delete.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, is_dataclass

import numpy as np
import pyarrow as pa

from .. import __version__
from .._util import arrow as arrowutil
from .._util.hashing import xxh3_file, xxh3_hex
from ..errors import OutputExistsError, ShardNotFoundError, StorageError, ZephonError
from ..format.chunks import ROW_GROUPS_PER_CHUNK, chunk_tables, index_table
from ..format.manifest import (
    INDEX_DIR,
    MANIFEST_NAME,
    PROVENANCE_TABLE_SCHEMA,
    ROW_GROUP_TABLE_SCHEMA,
    SHARD_DIR,
    SHARD_TABLE_SCHEMA,
    SIDE_TABLE_COMPRESSION,
    Manifest,
    is_dataset_file_name,
    load_manifest,
    parse_manifest_json,
    table_to_ipc,
)
from ..ingest.options import SKIP_KINDS
from ..io.storage import Storage

_log = logging.getLogger(__name__)


def _common_root(urls: list[str]) -> str:
    dirs = [u.rsplit("/", 1)[0] if "/" in u else "" for u in urls]
    root = os.path.commonpath(dirs) if all(d.startswith("/") for d in dirs) else _prefix(dirs)
    return root


def _prefix(dirs: list[str]) -> str:
    p = os.path.commonprefix(dirs)
    return p if all(d == p or d.startswith(p.rstrip("/") + "/") for d in dirs) else p.rsplit("/", 1)[0]


def _relative(url: str, root: str) -> str:
    if root and url.startswith(root.rstrip("/") + "/"):
        return url[len(root.rstrip("/")) + 1:]
    return url


def stored_intact(out: Storage, relpath: str, nbytes: int, xxh3: str) -> bool:
    """True when ``relpath`` holds exactly ``nbytes`` bytes whose xxh3 is ``xxh3``.

    The only test for reusing a stored shard or side table: a file of the right size can still
    hold wrong bytes (a damaged disk, an interrupted or concurrent writer), and reusing it
    would publish a manifest that fails ``verify``.
    """
    try:
        if out.size(relpath) != nbytes:
            return False
        if out.local:
            return xxh3_file(out.url(relpath)) == xxh3
        return xxh3_hex(out.read_file(relpath)) == xxh3
    except FileNotFoundError:
        return False


def _previous(out: Storage) -> dict | ZephonError | None:
    """The manifest document at ``out``: None when absent, the error when it does not parse."""
    try:
        raw = out.read_file(MANIFEST_NAME)
    except FileNotFoundError:
        return None
    try:
        return parse_manifest_json(raw, out.url(MANIFEST_NAME))
    except ZephonError as exc:
        return exc


def _owned(out: Storage) -> set[str] | None:
    """What the manifest at ``out`` references; None when it cannot be loaded or names a path
    no writer would (then nothing is removed on its account: ``zephon gc`` can once a
    readable manifest is in place)."""
    try:
        return load_manifest(out, check=False).referenced_paths()
    except (ZephonError, ValueError, KeyError, pa.ArrowException) as exc:
        _log.warning("the manifest being replaced at %s cannot be read or names paths no "
                     "conversion writes (%s); nothing it references is removed: run "
                     "'zephon gc %s' after this conversion to remove its unreferenced files",
                     out.url(MANIFEST_NAME), exc, out.root_url)
        return None


def _delete_owned(out: Storage, paths, lock) -> None:
    """Remove ``paths``, each only if it is a name a conversion writes, after re-checking the
    lock (a holder that lost it must not delete what the new holder's manifest names)."""
    paths = sorted(paths)
    if not paths:
        return
    if lock is not None:
        lock.check("removing what only the old manifest referenced (nothing was removed)")
    for rel in paths:
        if is_dataset_file_name(rel):
            out.delete(rel)
        else:   # referenced_paths refuses such names; never delete one whatever the caller
            _log.warning("not removing %s: only shards/<hash>.parquet and index/<hash>.arrow "
                         "are removed by a conversion", out.url(rel))


def check_referenced(out: Storage, m: Manifest) -> None:
    """Raise unless every shard and side table ``m`` names is stored at ``out`` with its
    recorded size: the manifest must never name a file that is not there (one listing of
    ``shards/`` and ``index/``, not a request per file)."""
    want = {m.shard_path(s): int(m.shard_bytes[s]) for s in range(m.num_shards)}
    want.update(m.table_sizes())
    have = {**out.sizes(SHARD_DIR), **out.sizes(INDEX_DIR)}
    for rel, nbytes in sorted(want.items()):
        size = have.get(rel)
        if size is None:
            raise ShardNotFoundError(
                f"{out.url(rel)} is missing right before publishing the manifest that names it "
                "(something removed it during this conversion: a gc, another convert, a "
                "person); nothing was published: rerun the same command")
        if size != nbytes:
            raise StorageError(
                f"{out.url(rel)} holds {size} bytes, not the {nbytes} written, right before "
                "publishing the manifest that names it (something changed it during this "
                "conversion); nothing was published: rerun the same command")


def inputs_doc(files) -> dict:
    """The manifest's ``inputs`` object for ``files``."""
    return {"count": len(files), "bytes": int(sum(f.size for f in files))}


def check_output(out: Storage, files, options, *, overwrite: bool) -> None:
    """Refuse at once, before any work, when ``out`` certainly holds another dataset: its
    manifest does not parse, or records other inputs or writer options (both are hashed into
    ``dataset_id``). Other differences show only at publish (:func:`publish_manifest`)."""
    if overwrite:
        return
    old = _previous(out)
    if old is None:
        return
    writer = json.loads(json.dumps(options.to_dict()))
    if not isinstance(old, dict) or old.get("writer") != writer or old.get("inputs") != inputs_doc(
            files):
        _refuse(out, old, None, None)


def publish_manifest(out: Storage, files, metas, cuts, infos, schema, options, input_options,
                      extra, *, overwrite: bool = False, lock=None,
                      documents=None) -> Manifest:
    """Write the side tables, then ``manifest.json`` (after :func:`check_referenced` and
    ``lock.check()``, a :class:`~zephon_store.write.lock.HeldLock`), then remove what only a
    replaced manifest referenced. ``documents``: ``(DocumentParts, StagingArea)`` of a
    packed dataset, whose document table is written first (its chunks straight to ``out``)."""
    sh_cols, rg_cols, row_start, rg_index = _index_columns(cuts, infos)
    root = _common_root([f.url for f in files])
    prov = _provenance(files, metas, cuts, root)
    index, chunk_blobs = row_group_index(rg_cols)
    tables = {
        "shards": _side_table(sh_cols, SHARD_TABLE_SCHEMA),
        "row_groups": index,
        "provenance": prov,
    }
    if documents is not None:
        parts, area = documents
        tables.update(parts.write(area, out, [_relative(f.url, root) for f in files],
                                  per_chunk=int(extra["documents_per_chunk"])))
    refs, blobs = _encode_tables(tables)
    blobs.update(chunk_blobs)
    doc = Manifest.build_doc(
        schema=schema, writer=options.to_dict(),
        totals={"num_samples": row_start, "num_shards": len(cuts), "num_row_groups": rg_index,
                "total_bytes": int(sum(sh_cols["bytes"]))},
        table_refs=refs,
        inputs=inputs_doc(files),
        skipped=_skipped(metas),
        # How inputs were read is recorded but not hashed: the shard bytes it produced are,
        # and a new (defaulted) reader option must not change the id of identical data.
        created_by={"library": f"zephon_store {__version__}", "pyarrow": pa.__version__,
                    "input_root": root,
                    "input_options": asdict(input_options) if is_dataclass(input_options) else {}},
        extra=extra,
        row_groups_per_chunk=ROW_GROUPS_PER_CHUNK,
    )
    m = Manifest(doc, tables, url=out.url(MANIFEST_NAME),
                 read_chunk=lambda h: blobs[f"{INDEX_DIR}/{h}.arrow"][0],
                 read_index=lambda h, what: out.read_file(f"{INDEX_DIR}/{h}.arrow",
                                                          expected_xxh3=h, what=what))
    m.check()
    m.check_row_group_details()
    old = _previous(out)
    replacing = old is not None and (not isinstance(old, dict)
                                     or old.get("dataset_id") != m.dataset_id)
    old_owned = _owned(out) if replacing else None
    if replacing and not overwrite:
        _refuse(out, old, old_owned, m, lock)
    for rel, (data, h) in blobs.items():
        if not stored_intact(out, rel, len(data), h):
            out.write_atomic(rel, data)
    _remove_stale_temps(out)
    check_referenced(out, m)
    if lock is not None:
        lock.check()
    # Written last: its presence means every shard and table it names is complete.
    out.write_atomic(MANIFEST_NAME, m.to_json())
    if old_owned is not None:
        _delete_owned(out, old_owned - m.referenced_paths(), lock)
    return m


def _index_columns(cuts, infos) -> tuple[dict, dict, int, int]:
    """The shard and row-group side tables' columns, in shard order, with the total rows and
    row groups."""
    sh_cols = {k: [] for k in SHARD_TABLE_SCHEMA.names}
    rg_cols = {k: [] for k in ROW_GROUP_TABLE_SCHEMA.names}
    row_start, rg_index = 0, 0
    for k, (cut, info) in enumerate(zip(cuts, infos)):
        assert info is not None and info.rows == cut.rows
        sh_cols["name"].append(info.name)
        sh_cols["bytes"].append(info.bytes)
        sh_cols["rows"].append(info.rows)
        sh_cols["row_start"].append(row_start)
        sh_cols["first_row_group"].append(rg_index)
        sh_cols["num_row_groups"].append(len(info.row_groups))
        sh_cols["footer_offset"].append(info.footer_offset)
        sh_cols["footer_xxh3"].append(bytes.fromhex(info.footer_xxh3))
        for rg in info.row_groups:
            rg_cols["shard"].append(k)
            rg_cols["rows"].append(rg.rows)
            rg_cols["row_start"].append(row_start)
            rg_cols["offset"].append(rg.offset)
            rg_cols["length"].append(rg.length)
            rg_cols["xxh3"].append(bytes.fromhex(rg.xxh3))
            row_start += rg.rows
            rg_index += 1
    return sh_cols, rg_cols, row_start, rg_index


def row_group_index(rg_cols: dict) -> tuple[pa.Table, dict]:
    """Format v4's row-group index over the row groups' columns and its chunk files
    ``{index/<xxh3>.arrow: (bytes, xxh3)}`` (formats/SPEC.md 4.1)."""
    n = len(rg_cols["rows"])
    digests = np.frombuffer(b"".join(rg_cols["xxh3"]), np.uint8).reshape(n, 16)
    blobs, refs = {}, []
    for chunk in chunk_tables(np.asarray(rg_cols["offset"], np.int64),
                              np.asarray(rg_cols["length"], np.int64), digests,
                              ROW_GROUPS_PER_CHUNK):
        data = table_to_ipc(chunk, compression=SIDE_TABLE_COMPRESSION)
        h = xxh3_hex(data)
        blobs[f"{INDEX_DIR}/{h}.arrow"] = (data, h)
        refs.append((bytes.fromhex(h), len(data)))
    table = index_table(np.asarray(rg_cols["rows"], np.int64),
                        np.asarray(rg_cols["length"], np.int64), refs, ROW_GROUPS_PER_CHUNK)
    return table, blobs


def _encode_tables(tables: dict) -> tuple[dict, dict]:
    """Each side table as Arrow IPC bytes at ``index/<xxh3>.arrow``: the manifest's table refs
    and ``{path: (bytes, xxh3)}`` to write."""
    refs, blobs = {}, {}
    for kind, table in tables.items():
        data = table_to_ipc(table, compression=SIDE_TABLE_COMPRESSION)
        h = xxh3_hex(data)
        rel = f"{INDEX_DIR}/{h}.arrow"
        blobs[rel] = (data, h)
        refs[kind] = {"path": rel, "xxh3": h, "bytes": len(data), "rows": table.num_rows}
    return refs, blobs


def _skipped(metas) -> dict[str, int]:
    """The manifest's ``skipped`` counts, summed over the inputs' read stats."""
    skipped = {kind: 0 for kind in SKIP_KINDS}
    skipped["empty_inputs"] = 0
    for m in metas:
        for kind in SKIP_KINDS:
            skipped[kind] += int(m.stats.get(kind, 0))
        skipped["empty_inputs"] += int(m.rows == 0)
    return skipped


def _refuse(out: Storage, old: dict | ZephonError, old_owned: set[str] | None,
            new: Manifest | None, lock=None) -> None:
    """Refuse to replace another dataset; first remove the shards only this run wrote, so the
    old dataset is left as it was (the job's staging stays for a rerun with overwrite)."""
    if old_owned is not None and new is not None:
        _delete_owned(out, {rel for rel in new.referenced_paths() - old_owned
                            if rel.startswith("shards/")}, lock)
    if isinstance(old, dict):
        samples = (old.get("totals") or {}).get("num_samples")
        this = (f"this conversion is {new.dataset_id}" if new is not None else
                "this conversion has other inputs or writer options")
        what = (f"a different dataset (dataset_id {old.get('dataset_id')}, {samples} samples; "
                f"{this})")
    else:
        what = f"a manifest that does not parse ({old})"
    raise OutputExistsError(
        f"{out.root_url} already holds {what}; pass overwrite=True (--overwrite) to replace it "
        "(what only the old manifest references is then removed), or choose another output")


def _provenance(files, metas, cuts, root) -> pa.Table:
    cols = {k: [] for k in PROVENANCE_TABLE_SCHEMA.names}
    shard_starts = np.array([p.row_start for p in cuts], dtype=np.int64)
    g = 0
    for f, m in zip(files, metas):
        rows = m.rows
        local = 0
        if rows == 0:
            cols["input"].append(_relative(f.url, root))
            cols["input_bytes"].append(f.size)
            cols["input_row_start"].append(0)
            cols["num_rows"].append(0)
            cols["shard"].append(-1)
            cols["row_start"].append(g)
        while local < rows:
            s = int(np.searchsorted(shard_starts, g, side="right") - 1)
            shard_end = cuts[s].row_start + cuts[s].rows
            n = min(rows - local, shard_end - g)
            cols["input"].append(_relative(f.url, root))
            cols["input_bytes"].append(f.size)
            cols["input_row_start"].append(local)
            cols["num_rows"].append(n)
            cols["shard"].append(s)
            cols["row_start"].append(g)
            local += n
            g += n
    return _side_table(cols, PROVENANCE_TABLE_SCHEMA)


def _side_table(cols: dict, schema: pa.Schema) -> pa.Table:
    build = {pa.int64(): arrowutil.i64, pa.string(): arrowutil.strings,
             pa.binary(16): arrowutil.binary16}
    return pa.Table.from_arrays([build[f.type](cols[f.name]) for f in schema], schema=schema)


_TEMP_RE = re.compile(r"^\.([0-9a-f]{32}\.(parquet|arrow)|manifest\.json)\..+\.tmp$")


def _remove_stale_temps(out: Storage) -> None:
    """Delete temp files a killed earlier run left beside shards and side tables.

    They are named ``.<hash>.<ext>.<random>.tmp`` or ``.manifest.json.<random>.tmp``
    (storage's temp-beside-target pattern)
    and only exist on local outputs; object stores get single PUTs and never see them.
    """
    if not out.local:
        return
    for sub in ("", "shards", "index"):
        d = os.path.join(out.root_url, sub)
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        for name in names:
            if _TEMP_RE.match(name):
                try:
                    os.remove(os.path.join(d, name))
                except FileNotFoundError:
                    pass
