"""Manifest accessors: every section a caller needs, so nobody outside format/ reads ``doc``."""

from __future__ import annotations

import ast
import json
import pathlib

import pyarrow as pa

from tests.helpers import ROOT
from zephon_store import open_dataset
from zephon_store.format.manifest import FORMAT_VERSION, schema_from_base64, schema_to_base64
from zephon_store.write.convert import convert
from zephon_store.write.shardwriter import WriteOptions

PKG = pathlib.Path(ROOT) / "zephon_store"


def test_accessors_return_the_document_sections(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i}", "i": i}) + "\n" for i in range(30))
                   + "{broken\n")
    from zephon_store.ingest import InputOptions
    convert([str(src)], str(tmp_path / "ds"), options=WriteOptions(row_group_rows=10),
            input_options=InputOptions(on_error="skip"))
    doc = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    with open_dataset(str(tmp_path / "ds")) as ds:
        m = ds.manifest
        assert m.format_version == doc["format_version"] == FORMAT_VERSION
        assert m.writer == doc["writer"] == WriteOptions(row_group_rows=10).to_dict()
        assert m.schema_fields == doc["schema"]["fields"]
        assert [f["name"] for f in m.schema_fields] == ["text", "i"]
        assert m.inputs == doc["inputs"] and m.inputs
        assert m.skipped == doc["skipped"] and m.skipped["malformed_json"] == 1
        assert m.created_by == doc["created_by"] and "library" in m.created_by
        assert m.packing is None


def test_schema_base64_round_trip():
    schema = pa.schema([("tokens", pa.list_(pa.int32())), ("s", pa.string())])
    text = schema_to_base64(schema)
    assert text.isascii()
    assert schema_from_base64(text).equals(schema)


def test_nobody_outside_format_reads_manifest_doc():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.parent.name == "format":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "doc":
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert offenders == []
