"""Forged and hostile manifests: every one is refused with a ManifestError (never a raw
Arrow/numpy/Python error, never wrong data), and special files never hang a reader."""

from __future__ import annotations

import json
import os
import shutil
import threading

import numpy as np
import pyarrow as pa
import pytest

from tests.helpers import converted
from zephon_store import (
    IntegrityError,
    ManifestError,
    UnsafePathError,
    ZephonError,
    open_dataset,
)
from zephon_store._util.hashing import xxh3_hex
from zephon_store.format.manifest import (
    ROW_GROUP_TABLE_SCHEMA,
    compute_dataset_id,
    shard_path,
    table_from_ipc,
    table_kind,
    table_to_ipc,
)
from zephon_store.read.verify import verify
from zephon_store.write.publish import row_group_index


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    converted(d, files=2, records=200, seed=3, target_shard_bytes=16 << 10, row_group_rows=20)
    return d / "ds"


@pytest.fixture(scope="module")
def pristine_v3(pristine, tmp_path_factory):
    """The same dataset laid out as format v3 (one row-group table; the shards are the same
    bytes): v3's checks of the columns v4 derives (shard, row_start) stay tested."""
    out = tmp_path_factory.mktemp("hostile3") / "ds"
    shutil.copytree(pristine, out)
    m = open_dataset(str(out)).manifest
    view = _v3_view(m)
    for rel in m.details.paths():
        os.unlink(out / rel)
    d = _doc(out)
    for kind, table in (("shards", m.tables["shards"]), ("row_groups", view),
                        ("provenance", m.tables["provenance"])):
        data = table_to_ipc(table)
        h = xxh3_hex(data)
        (out / f"index/{h}.arrow").write_bytes(data)
        d["tables"][kind] = {"path": f"index/{h}.arrow", "xxh3": h, "bytes": len(data),
                             "rows": table.num_rows}
    d["format_version"] = 3
    del d["row_groups_per_chunk"]
    d["dataset_id"] = compute_dataset_id(d)
    (out / "manifest.json").write_text(json.dumps(d))
    return out


def _v3_view(m) -> pa.Table:
    """A v4 manifest's row groups as v3's one table (fetches every chunk)."""
    m.details.load_all()
    digests = np.concatenate([m.details.chunk(c)[2] for c in range(m.details.num_chunks)])
    return pa.table([m.rg_shard, m.rg_rows, m.rg_row_start, np.asarray(m.rg_offset),
                     np.asarray(m.rg_length),
                     pa.Array.from_buffers(pa.binary(16), len(digests),
                                           [None, pa.py_buffer(digests.tobytes())])],
                    schema=ROW_GROUP_TABLE_SCHEMA)


@pytest.fixture()
def ds(pristine, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(pristine, out)
    return out


@pytest.fixture()
def ds3(pristine_v3, tmp_path):
    out = tmp_path / "ds3"
    shutil.copytree(pristine_v3, out)
    return out


@pytest.fixture(params=["v4", "v3"])
def any_ds(request, pristine, pristine_v3, tmp_path):
    out = tmp_path / "any"
    shutil.copytree(pristine if request.param == "v4" else pristine_v3, out)
    return out


def _doc(ds):
    return json.loads((ds / "manifest.json").read_text())


def forge(ds, *, doc=None, shards=None, row_groups=None, provenance=None):
    """Rewrite side tables and/or the JSON, then re-seal every hash and the dataset_id.

    The result is self-consistent as far as hashes go: only validation can refuse it.
    """
    d = _doc(ds)
    for kind, edit in (("shards", shards), ("row_groups", row_groups),
                       ("provenance", provenance)):
        if edit is None:
            continue
        ref = d["tables"][kind]
        if table_kind(d, kind) == "row_group_index":
            # v4: edit the row groups as v3's one table, then lay them out as v4 again
            # (shard and row_start are not stored: edits of them are lost).
            table = edit(_v3_view(open_dataset(str(ds)).manifest))
            table, blobs = row_group_index({k: table.column(k).to_pylist()
                                            for k in ("rows", "offset", "length", "xxh3")})
            for rel, (data, _) in blobs.items():
                (ds / rel).write_bytes(data)
        else:
            table = edit(table_from_ipc((ds / ref["path"]).read_bytes(), table_kind(d, kind)))
        data = table if isinstance(table, bytes) else table_to_ipc(table)
        h = xxh3_hex(data)
        (ds / f"index/{h}.arrow").write_bytes(data)
        d["tables"][kind] = {**ref, "path": f"index/{h}.arrow", "xxh3": h, "bytes": len(data)}
    if doc is not None:
        doc(d)
    d["dataset_id"] = compute_dataset_id(d)
    (ds / "manifest.json").write_text(json.dumps(d))


def set_col(name, fn, type_=None):
    def edit(t):
        values = t.column(name).to_pylist()
        fn(values)
        return t.set_column(t.schema.get_field_index(name), name,
                            pa.array(values, type_ or pa.int64()))
    return edit


def refused(ds, exc=ManifestError):
    """open_dataset raises ``exc``, and verify reports (does not raise)."""
    with pytest.raises(exc):
        open_dataset(str(ds))
    rep = verify(str(ds), deep=True)
    assert not rep.ok


def test_shard_name_with_trailing_newline_is_unsafe(ds):
    name = "0" * 32
    with pytest.raises(UnsafePathError):
        shard_path(name + "\n")
    assert shard_path(name) == f"shards/{name}.parquet"

    def newline(names):
        names[0] = names[0] + "\n"
    forge(ds, shards=set_col("name", newline, pa.string()))
    refused(ds, UnsafePathError)


def test_side_table_path_with_trailing_newline_is_unsafe(ds):
    def edit(d):
        d["tables"]["shards"]["path"] += "\n"
    forge(ds, doc=edit)
    refused(ds, UnsafePathError)


@pytest.mark.parametrize("shard", [999, -1, 1])
def test_row_group_pointing_at_another_or_no_shard(ds3, shard):
    def edit(values):
        values[0] = shard
    forge(ds3, row_groups=set_col("shard", edit))
    refused(ds3)


@pytest.mark.parametrize("column,delta", [("shard", 999), ("shard", -5), ("num_rows", 10**6),
                                          ("row_start", -1)])
def test_provenance_pointing_outside_the_shards(ds, column, delta):
    def edit(values):
        values[0] += delta
    forge(ds, provenance=set_col(column, edit))
    with pytest.raises(ManifestError, match="provenance"):
        _ = open_dataset(str(ds)).manifest.tables
    assert any("provenance" in f.message for f in verify(str(ds)).findings)


def _bump(name, index, delta, kind="row_groups"):
    def edit(values):
        values[index] += delta
    return {kind: set_col(name, edit)}


@pytest.mark.parametrize("edit", [
    _bump("offset", 1, 10**9),                 # past the end of its shard
    _bump("offset", 1, -10**6),                # before the start of the file
    _bump("length", 0, -10**6),                # negative length
    _bump("length", 2, 3),                     # overlaps the next row group
    _bump("offset", -1, 0) | _bump("length", -1, 10**6),   # runs into/over the footer
    _bump("footer_offset", 0, 10**9, "shards"),            # footer past the end
    _bump("first_row_group", 1, 1, "shards"),
    _bump("num_row_groups", 0, 1, "shards"),
    _bump("bytes", 0, -10**6, "shards"),
])
def test_side_table_offsets_and_counts_are_checked(any_ds, edit):
    forge(any_ds, **edit)
    if _doc(any_ds)["format_version"] >= 4 and "row_groups" in edit:
        # v4 refuses the chunk when it is fetched (row-group byte ranges are in chunks),
        # or at open when the index's sums already give it away.
        try:
            d = open_dataset(str(any_ds))
        except ManifestError:
            pass
        else:
            with pytest.raises(ManifestError):
                d.take(np.arange(d.num_samples))
        assert not verify(str(any_ds), deep=True).ok
        return
    refused(any_ds)


def test_row_counts_moved_between_row_groups(any_ds):
    """Totals still add up, but row groups disagree with their shard's footer."""
    def edit(values):
        values[0] += 1
        values[1] -= 1

    def start(values):
        values[1] += 1
    forge(any_ds, row_groups=lambda t: set_col("row_start", start)(set_col("rows", edit)(t)))
    d = open_dataset(str(any_ds))   # the tables are consistent with each other
    with pytest.raises(ManifestError, match="row"):
        d.take(np.arange(d.num_samples))
    assert not verify(str(any_ds)).ok


def test_huge_counts_do_not_overflow(ds):
    def edit(d):
        d["totals"]["num_samples"] = 10**30
    forge(ds, doc=edit)
    refused(ds)


def test_row_counts_that_wrap_around_int64(ds):
    """Four shards each 2**62 rows larger: int64 sums wrap to the true total."""
    def wrap(t):
        rows = np.array(t.column("rows").to_pylist(), dtype=np.int64)
        rows[:4] += np.int64(2**62)
        starts = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
        t = t.set_column(t.schema.get_field_index("rows"), "rows", pa.array(rows))
        return t.set_column(t.schema.get_field_index("row_start"), "row_start",
                            pa.array(starts))
    assert open_dataset(str(ds)).num_shards >= 4
    forge(ds, shards=wrap)
    refused(ds)


@pytest.mark.parametrize("edit", [
    lambda d: d["schema"].__setitem__("arrow_ipc_base64", "not base64!!"),
    lambda d: d["schema"].__setitem__("arrow_ipc_base64", "QUJDRA=="),
    lambda d: d.__setitem__("schema", []),
    lambda d: d.__setitem__("totals", "many"),
    lambda d: d["totals"].__setitem__("num_samples", "12"),
    lambda d: d["totals"].__setitem__("num_shards", True),
    lambda d: d["totals"].__setitem__("num_row_groups", 1.5),
    lambda d: d.__setitem__("tables", []),
    lambda d: d["tables"].__setitem__("shards", "index/x.arrow"),
    lambda d: d.__setitem__("format_version", True),
    lambda d: d.__setitem__("storage", {"id": "fixed_size_binary_le"}),
    lambda d: d.__setitem__("storage", []),
    lambda d: d.__setitem__("writer", []),
    lambda d: d["writer"].__setitem__("row_group_bytes", "1 MiB"),
    lambda d: d["writer"].__setitem__("row_group_rows", -3),
])
def test_malformed_json_fields_raise_manifest_error(ds, edit):
    forge(ds, doc=edit)
    refused(ds)


@pytest.mark.parametrize("table", [
    b"not an arrow file",
    pa.table({"name": pa.array([None], pa.string())}),
])
def test_unreadable_side_table_with_matching_hash(ds, table):
    forge(ds, shards=lambda t: table)
    refused(ds)


def test_side_table_with_nulls(ds3):
    def edit(values):
        values[0] = None
    forge(ds3, row_groups=set_col("rows", edit))
    refused(ds3)


def test_deeply_nested_manifest_json(ds):
    (ds / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(ds)


def test_schema_that_disagrees_with_the_shards(ds):
    """The manifest says ``id`` is a string; shards hold int64: refused, never read."""
    schema = open_dataset(str(ds)).schema
    forged = schema.set(schema.get_field_index("id"), pa.field("id", pa.string()))

    def edit(d):
        from zephon_store.format.manifest import schema_to_json
        d["schema"] = schema_to_json(forged)
    forge(ds, doc=edit)
    d = open_dataset(str(ds))
    with pytest.raises(ManifestError, match="schema"):
        d.take([0])
    with pytest.raises(ManifestError, match="schema"):
        d[0]
    assert not verify(str(ds)).ok


def test_row_group_range_that_is_not_where_the_footer_says(ds):
    """Row group 0's recorded range (and hash) stops 10 bytes short of its column chunks:
    only hashed bytes may be decoded, so it is refused, on the memory-mapped path too."""
    m = open_dataset(str(ds)).manifest
    off, length = int(m.rg_offset[0]), int(m.rg_length[0]) - 10
    shard = (ds / m.shard_path(int(m.rg_shard[0]))).read_bytes()

    def shorter(values):
        values[0] -= 10

    def rehash(values):
        values[0] = bytes.fromhex(xxh3_hex(shard[off:off + length]))
    forge(ds, row_groups=lambda t: set_col("length", shorter)(
        set_col("xxh3", rehash, pa.binary(16))(t)))
    for cache in (None, False):
        with pytest.raises(ManifestError, match="outside the hashed range"):
            open_dataset(str(ds), cache=cache).take([0])
    assert any(f.kind == "row_group_range" for f in verify(str(ds)).findings)


def _no_hang(fn):
    """Run ``fn`` in a thread; return what it raised. A hang fails (not a timing assertion:
    60 s is a bound on a call that must not block at all)."""
    box = []

    def run():
        try:
            fn()
            box.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert box, "the reader blocked on a special file"
    return box[0]


def test_manifest_that_is_a_fifo_or_device(ds):
    os.unlink(ds / "manifest.json")
    os.mkfifo(ds / "manifest.json")
    assert isinstance(_no_hang(lambda: open_dataset(str(ds))), ManifestError)
    os.unlink(ds / "manifest.json")
    os.symlink("/dev/zero", ds / "manifest.json")
    assert isinstance(_no_hang(lambda: open_dataset(str(ds))), ManifestError)
    rep = verify(str(ds))
    assert not rep.ok


@pytest.mark.parametrize("special", ["fifo", "zero", "dir"])
def test_shard_that_is_a_fifo_or_device(ds, special):
    d = open_dataset(str(ds))
    path = ds / d.manifest.shard_path(0)
    os.unlink(path)
    if special == "fifo":
        os.mkfifo(path)
    elif special == "zero":
        os.symlink("/dev/zero", path)
    else:
        os.mkdir(path)
    err = _no_hang(lambda: open_dataset(str(ds)).take([0]))
    assert isinstance(err, ZephonError), err
    rep = _no_hang(lambda: verify(str(ds), deep=True))
    assert rep is None


def test_side_table_that_is_a_fifo(ds):
    ref = _doc(ds)["tables"]["row_groups"]["path"]
    os.unlink(ds / ref)
    os.mkfifo(ds / ref)
    assert isinstance(_no_hang(lambda: open_dataset(str(ds))), ZephonError)


def test_expect_dataset_id_pins_the_dataset(ds):
    real = open_dataset(str(ds)).dataset_id
    assert open_dataset(str(ds), expect_dataset_id=real).dataset_id == real
    other = "xxh3:" + "0" * 32
    with pytest.raises(ManifestError, match=other):
        open_dataset(str(ds), expect_dataset_id=other)
    with pytest.raises(ValueError, match="expect_dataset_id"):
        open_dataset(str(ds), expect_dataset_id=real + "\n")


def test_pristine_dataset_still_reads(ds):
    d = open_dataset(str(ds))
    assert d.take(np.arange(d.num_samples)).num_rows == d.num_samples
    assert verify(str(ds), deep=True).ok


def test_integrity_error_is_a_zephon_error():
    assert issubclass(IntegrityError, ZephonError)


def test_storage_reads_refuse_a_fifo_without_blocking(tmp_path):
    """The descriptor's own type is checked (O_NONBLOCK open): no window between check and read."""
    from zephon_store.errors import StorageError
    from zephon_store.io.storage import Storage

    os.mkfifo(tmp_path / "f")
    st = Storage(str(tmp_path))
    with pytest.raises(StorageError, match="not a regular file"):
        st.read_file("f")
    with pytest.raises(StorageError, match="not a regular file"):
        st.read_range("f", 0, 4)


@pytest.mark.parametrize("path", ["README.md", "manifest.json", "../x", "shards/../../x",
                                  "/etc/passwd", "shards/" + "0" * 32 + ".parquet"])
def test_forged_side_table_path_makes_gc_refuse_and_verify_fail(ds, capsys, path):
    """A manifest whose side table path is not index/<hash>.arrow names a file gc or an
    overwrite might remove: gc refuses in one line, deletes nothing, verify reports it."""
    from zephon_store.cli.main import main

    (ds / "README.md").write_text("the user's notes")
    orphan = ds / "shards" / ("ab" * 16 + ".parquet")
    orphan.write_bytes(b"an orphan gc would remove")
    forge(ds, doc=lambda d: d["tables"]["provenance"].update(path=path))
    assert main(["gc", str(ds)]) == 1
    err = capsys.readouterr().err
    assert "tables.provenance" in err and repr(path) in err, err
    assert len(err.strip().splitlines()) == 1
    assert (ds / "README.md").exists() and (ds / "manifest.json").exists() and orphan.exists()
    assert not verify(str(ds)).ok
