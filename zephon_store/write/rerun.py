"""A rerun that finds nothing to do: the record of the conversion that made an output.

After each publish, convert writes ``OUT/.zephon-convert.json``::

    {"format": 1, "dataset_id": "xxh3:...", "job": "<xxh3 of job_desc>"}

where ``job`` hashes :func:`~zephon_store.write.staging.job_desc`: every input's URL, size,
format and stamp (a local file's mtime, an object's ETag), the options, the parse function and
the zephon version. It names neither the output nor a time, so two outputs of the same inputs
hold the same bytes (the output stays byte-identical for any ``--workers`` and engine).

A rerun whose job hashes the same, over an output whose manifest has the recorded
``dataset_id`` and still holds every file that manifest names, would write exactly those
bytes again: :func:`unchanged_output` says so after one listing of the inputs, and convert
returns at once without reading an input. "Still holds" is checked as a reuse is checked
elsewhere: a local file by its size and the xxh3 its name is; an object by its size, in one
listing (``zephon verify --deep`` reads the bytes). Anything else (no record, another job, a
missing or damaged file, a manifest that does not load) is a normal convert, which reuses what
it can and rewrites what is damaged.

>>> import os
>>> from zephon_store.io.storage import Storage
>>> out = Storage(tmp + "/rerun-doc")
>>> os.makedirs(out.root_url)
>>> write_record(out, "xxh3:0123", "ab12")
>>> read_record(out)
{'dataset_id': 'xxh3:0123', 'format': 1, 'job': 'ab12'}
"""

from __future__ import annotations

import json
import os

from .._util.hashing import xxh3_hex
from ..errors import ZephonError
from ..format.manifest import INDEX_DIR, SHARD_DIR, Manifest, canonical_json, load_manifest
from ..io.storage import Storage
from .publish import stored_intact
from .staging import job_desc

RECORD_NAME = ".zephon-convert.json"
_FORMAT = 1

__all__ = ["RECORD_NAME", "job_fingerprint", "read_record", "record_job", "unchanged_output",
           "write_record"]


def job_fingerprint(files, options, input_options, parse_fn, extra) -> str | None:
    """The hash of :func:`~zephon_store.write.staging.job_desc`: equal for two conversions
    whose output is certainly the same, whatever their output, workers or engine. None when
    an input has no stamp (a store that lists no ETag): nothing then tells an object
    rewritten with the same size, so no rerun is taken for unchanged."""
    desc = job_desc(files, options, input_options, parse_fn, extra)
    if any(entry[-1] is None for entry in desc["inputs"]):
        return None
    return xxh3_hex(canonical_json(desc))


def record_job(out: Storage, dataset_id: str, job: str | None) -> None:
    """After a publish: :func:`write_record`, or remove an earlier record when this job has
    no fingerprint (so no rerun trusts it)."""
    if job is None:
        out.delete(RECORD_NAME)
    else:
        write_record(out, dataset_id, job)


def write_record(out: Storage, dataset_id: str, job: str) -> None:
    """Record, after a publish, that ``out``'s manifest (``dataset_id``) is what ``job`` makes."""
    doc = {"format": _FORMAT, "dataset_id": dataset_id, "job": job}
    out.write_atomic(RECORD_NAME, json.dumps(doc, sort_keys=True).encode() + b"\n")


def read_record(out: Storage) -> dict | None:
    """The record at ``out``; None when absent, unreadable or of another format (a normal
    convert follows, so a damaged record costs time, never correctness)."""
    try:
        doc = json.loads(out.read_file(RECORD_NAME))
    except (FileNotFoundError, ZephonError, ValueError, OSError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        return None
    return doc


def unchanged_output(out: Storage, job: str | None) -> Manifest | None:
    """The manifest at ``out`` when it is exactly what ``job`` would publish (see the module
    doc), else None."""
    if job is None:
        return None
    record = read_record(out)
    if record is None or record.get("job") != job:
        return None
    try:
        m = load_manifest(out)
    except (ZephonError, OSError, ValueError):
        return None
    if m.dataset_id != record.get("dataset_id"):
        return None
    want = {m.shard_path(s): int(m.shard_bytes[s]) for s in range(m.num_shards)}
    want.update(m.table_sizes())
    if out.local:
        return m if all(stored_intact(out, rel, n, _name_hash(rel)) for rel, n in want.items()) \
            else None
    have = {**out.sizes(SHARD_DIR), **out.sizes(INDEX_DIR)}
    return m if all(have.get(rel) == n for rel, n in want.items()) else None


def _name_hash(relpath: str) -> str:
    """The xxh3 a content-named file's name is (``shards/<hash>.parquet``)."""
    return os.path.basename(relpath).split(".", 1)[0]
