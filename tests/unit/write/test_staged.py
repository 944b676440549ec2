"""StagedInput: the one typed record of a staged input, and its JSON as earlier versions wrote it."""

from __future__ import annotations

import json

import pyarrow as pa

from zephon_store.format.manifest import schema_to_base64
from zephon_store.write.staged import StagedInput, read_staged
from zephon_store.write.staging import StagingArea

SCHEMA = pa.schema([("text", pa.string())])
PARSED = {"index": 2, "url": "file:///c/a.jsonl", "rows": 5, "input_bytes": 77,
          "schema_b64": schema_to_base64(SCHEMA), "stats": {"malformed_json": 1}}
PACKED = dict(PARSED, rows=3, base="packed/000002", first_window=9)


def test_json_round_trip_keeps_the_staged_keys():
    for d in (PARSED, PACKED, dict(PARSED, rows=0, schema_b64=None),
              dict(PACKED, batch_rows=[2, 1])):
        s = StagedInput.from_dict(json.loads(json.dumps(d)))
        assert s.to_dict() == d
    assert StagedInput.from_dict(PARSED).schema.equals(SCHEMA)


def test_paths_and_completeness(tmp_path):
    parsed, packed = StagedInput.from_dict(PARSED), StagedInput.from_dict(PACKED)
    assert (parsed.rel, packed.rel) == ("parsed/000002", "packed/000002")
    area = StagingArea(str(tmp_path))
    assert area.path(parsed.rel) == str(tmp_path / "parsed" / "000002")
    (tmp_path / "parsed").mkdir()
    (tmp_path / "parsed" / "000002.sizes.npy").write_bytes(b"")
    assert not parsed.complete(area)                      # rows but no .arrow
    assert parsed.restaged(rows=0).complete(area)
    (tmp_path / "parsed" / "000002.arrow").write_bytes(b"")
    assert parsed.complete(area)


def test_read_rows_reads_only_the_batches_that_hold_them(tmp_path):
    area = StagingArea(str(tmp_path))
    (tmp_path / "parsed").mkdir()
    table = pa.table({"text": [f"r{i}" for i in range(10)]})
    with pa.ipc.new_file(str(tmp_path / "parsed" / "000002.arrow"), table.schema) as w:
        for b in table.to_batches(max_chunksize=3):       # batches of 3, 3, 3, 1
            w.write_batch(b)
    for batch_rows in (None, (3, 3, 3, 1)):
        s = StagedInput.from_dict(dict(PARSED, rows=10)).restaged(batch_rows=batch_rows)
        for start, n in ((0, 10), (2, 5), (3, 3), (9, 1), (4, 0)):
            got = s.read_rows(area, start, n).column("text").to_pylist()
            assert got == table.column("text").to_pylist()[start:start + n], (batch_rows, start, n)


def test_restaged_keeps_provenance():
    s = StagedInput.from_dict(PARSED).restaged(rows=4, base="packed/000002", first_window=0)
    assert (s.index, s.url, s.input_bytes, s.stats) == (2, PARSED["url"], 77, PARSED["stats"])
    assert (s.rows, s.base, s.first_window) == (4, "packed/000002", 0)


def test_read_staged_redoes_what_it_cannot_read(tmp_path):
    area, p = StagingArea(str(tmp_path)), tmp_path / "x.json"
    assert read_staged(area, "x.json") is None
    p.write_text('{"index": 1}')
    assert read_staged(area, "x.json") is None
    p.write_text("{not json")
    assert read_staged(area, "x.json") is None
    p.write_text(json.dumps(PACKED))
    assert read_staged(area, "x.json") == StagedInput.from_dict(PACKED)
