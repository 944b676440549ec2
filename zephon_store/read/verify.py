"""Offline integrity checks of a dataset. Reports every finding; never modifies anything.

Checks, in order: the manifest parses and matches its JSON Schema; ``dataset_id`` matches
its content; each side table is present and matches its hash and schema; the tables agree
with the totals; then, per shard (in parallel): present, right size, right xxh3, every
row group's and the footer's xxh3, the footer parses with the row counts and schema the
manifest records (the storage schema: the logical ``schema`` with the manifest's
``storage`` encodings applied); with ``deep``, every row group decodes and converts to the
logical schema. A damaged format-v4 row-group chunk is a finding that stops nothing: every
shard is still checked, its row groups in that chunk by the shard's own hash and footer only
(a warning names them). A format-v6 document table is checked like the row-group index
(:mod:`.verify_documents`).
"""

from __future__ import annotations

import functools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import resources

import pyarrow as pa
import pyarrow.parquet as pq

from .._util.hashing import xxh3_hex
from .._util.progress import progress_bar
from ..errors import ManifestError, UnsafePathError, ZephonError
from ..format.footer import chunk_range_problem
from ..format.manifest import (
    INDEX_DIR,
    MANIFEST_NAME,
    PARSE_ERRORS,
    Manifest,
    check_table_path,
    compute_dataset_id,
    is_dataset_file_name,
    load_side_table,
    missing_manifest_message,
    parse_manifest_json,
    read_index_file,
    require_regular_file,
    schema_from_json,
    shard_path,
    table_from_ipc,
    table_kind,
)
from ..io.storage import Storage
from .verify_codecs import auto_codec_problems, named_codec_problem, shard_codecs
from .verify_documents import check_documents


@dataclass
class Finding:
    """One problem: which shard (or ``None`` for the manifest), what kind, and details."""

    shard: str | None
    kind: str
    message: str
    # "warning" findings (orphans) are reported but leave ``ok`` True and the exit code 0.
    severity: str = "error"


@dataclass
class VerifyReport:
    """The result of :func:`verify`; ``to_dict()`` is the ``--json`` output."""

    dataset_id: str | None
    shards_checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "dataset_id": self.dataset_id,
                "shards_checked": self.shards_checked,
                "findings": [asdict(f) for f in self.findings]}


def manifest_json_schema() -> dict:
    """The JSON Schema of ``manifest.json`` (the same file as ``formats/manifest.schema.json``)."""
    text = resources.files("zephon_store.format").joinpath("manifest.schema.json").read_text()
    return json.loads(text)


def verify(url: str, *, deep: bool = False, storage_options: dict | None = None,
           workers: int = 4, progress: bool = False) -> VerifyReport:
    """Check the dataset at ``url``; return every finding.

    >>> report = verify(tiny_dataset, deep=True)
    >>> report.ok, report.shards_checked, [f.kind for f in report.findings]
    (True, 1, [])
    """
    st = Storage(url, storage_options=storage_options)
    report = VerifyReport(dataset_id=None)
    add = report.findings.append
    murl = st.url(MANIFEST_NAME)
    try:
        require_regular_file(st, MANIFEST_NAME, error=ManifestError)
        doc = parse_manifest_json(st.read_file(MANIFEST_NAME), murl)
    except FileNotFoundError as exc:
        # The advice that fits the cause: a wrong path, or an unfinished conversion.
        add(Finding(None, "missing_manifest", missing_manifest_message(st, murl, exc)))
        return report
    except ManifestError as exc:
        add(Finding(None, "manifest_json", str(exc)))
        return report
    report.dataset_id = doc.get("dataset_id")
    _check_json_schema(doc, murl, add)
    want = compute_dataset_id(doc)
    if doc.get("dataset_id") != want:
        add(Finding(None, "dataset_id", f"{murl}: dataset_id {doc.get('dataset_id')} does not "
                    f"match the manifest's content ({want}): the manifest was edited or corrupted"))
    tables = _load_tables(st, doc, murl, add)
    if tables is None:
        return report
    try:
        m = Manifest(doc, tables, url=murl, parallel=not st.local,
                     read_chunk=functools.partial(read_index_file, st, what="row-group chunk",
                                                  url=murl),
                     loader=functools.partial(load_side_table, st, doc, url=murl),
                     read_index=functools.partial(read_index_file, st, url=murl))
    except (ZephonError, KeyError, ValueError, pa.ArrowException) as exc:
        add(Finding(None, "manifest", f"{murl}: {exc}"))
        return report
    # dataset_id was reported above. Shards are checked against the tables only when their
    # indexes and offsets are safe to follow; counts that do not add up are reported and
    # each shard's footer is still compared with them.
    try:
        m.check_doc()
        m.check_layout()
    except ManifestError as exc:
        add(Finding(None, "manifest", str(exc)))
        return report
    # A damaged chunk leaves its row groups' byte ranges and hashes unknown; every shard is
    # still checked (its size, its hash, its footer, the other row groups): one report
    # holds every finding.
    bad_chunks = _check_chunks(m, add)
    try:
        m.check_counts()
        m.check_provenance(tables["provenance"])
    except ManifestError as exc:
        add(Finding(None, "manifest", str(exc)))
    shards = range(m.num_shards)
    per_shard: list[dict | None] = []
    with ThreadPoolExecutor(max(1, workers)) as pool, \
            progress_bar(progress, len(shards), "verify", unit="shard") as bar:
        for found, codecs in pool.map(lambda s: _check_shard(st, m, s, deep, bad_chunks),
                                      shards):
            report.findings.extend(found)
            report.shards_checked += 1
            per_shard.append(codecs)
            bar.update(1)
    _check_auto_codecs(m, per_shard, murl, add)
    check_documents(m, lambda kind, message: add(Finding(None, kind, message)))
    _check_orphans(st, m, add)
    return report


def _check_chunks(m: Manifest, add) -> frozenset[int]:
    """Format v4: every row-group chunk present, matching its hash and checked (each one's
    problem a finding), then every byte range across chunks. Returns the chunks whose row
    groups cannot be checked against the index (none for v1-v3)."""
    if m.details is None:
        return frozenset()
    bad = set()
    for c in range(m.details.num_chunks):
        try:
            m.details.ensure([c])
        except (ZephonError, OSError) as exc:
            add(Finding(None, "row_group_chunk", f"row-group chunk {c}: {exc}"))
            bad.add(c)
    if not bad:
        # Across chunk borders: only when every chunk holds values to compare.
        try:
            m.check_row_group_details()
        except ManifestError as exc:
            add(Finding(None, "manifest", str(exc)))
            bad.update(range(m.details.num_chunks))
    return frozenset(bad)


def _check_auto_codecs(m: Manifest, per_shard: list[dict | None], murl: str, add) -> None:
    """``compression="auto"``: the manifest's ``codecs`` record against every footer. Only
    when every footer was read: a missing or damaged shard is reported on its own."""
    if m.writer.get("compression") != "auto" or any(c is None for c in per_shard):
        return
    for problem in auto_codec_problems(m.codecs, per_shard):
        add(Finding(None, "codec_mismatch", f"{murl}: {problem}"))


def _check_orphans(st: Storage, m: Manifest, add) -> None:
    try:
        orphans = m.unreferenced(st.listdir)
    except (OSError, ZephonError) as exc:
        add(Finding(None, "orphan", f"{st.root_url}: could not list shards/ and index/ to look "
                    f"for unreferenced files: {exc}", severity="warning"))
        return
    for rel in orphans:
        if not is_dataset_file_name(rel):   # a folder or a user's file: gc never deletes it
            add(Finding(None, "orphan", f"{st.url(rel)} is not referenced by the manifest and "
                        "is not a name zephon writes; 'zephon gc' leaves it: remove it by hand "
                        "if it is not wanted there", severity="warning"))
            continue
        add(Finding(None, "orphan", f"{st.url(rel)} is not referenced by the manifest (left by "
                    f"an interrupted or replaced conversion); 'zephon gc {st.root_url}' removes "
                    "it", severity="warning"))


def _check_json_schema(doc: dict, murl: str, add) -> None:
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is a core dependency
        return
    validator = jsonschema.Draft202012Validator(manifest_json_schema())
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        add(Finding(None, "manifest_schema", f"{murl}: at {where}: {err.message}"))


def _load_tables(st: Storage, doc: dict, murl: str, add) -> dict | None:
    tables, ok = {}, True
    for kind in ("shards", "row_groups", "provenance"):
        refs = doc.get("tables")
        ref = refs.get(kind) if isinstance(refs, dict) else None
        ref = ref if isinstance(ref, dict) else {}
        try:
            path = check_table_path(ref.get("path"))
            if path != f"{INDEX_DIR}/{ref.get('xxh3')}.arrow":
                raise UnsafePathError(f"side table {path} is not named by its hash")
            require_regular_file(st, path, error=ManifestError)
            data = st.read_file(path)
            actual = xxh3_hex(data)
            if actual != ref.get("xxh3"):
                add(Finding(None, "side_table", f"{st.url(path)}: {kind} table xxh3 mismatch "
                            f"(expected {ref.get('xxh3')}, got {actual})"))
                ok = False
                continue
            tables[kind] = table_from_ipc(data, table_kind(doc, kind))
        except FileNotFoundError:
            add(Finding(None, "side_table", f"{kind} table {ref.get('path')} is missing"))
            ok = False
        except (ZephonError, pa.ArrowException) as exc:
            add(Finding(None, "side_table", f"{murl}: {kind} table: {exc}"))
            ok = False
    return tables if ok else None


def _check_shard(st: Storage, m: Manifest, s: int, deep: bool, bad_chunks: frozenset[int] = (
        frozenset())) -> tuple[list[Finding], dict[str, set[str]] | None]:
    """Shard ``s``'s findings, and the codecs its verified footer names per column (``None``
    when the footer could not be read). Row groups of ``bad_chunks`` (damaged v4 index
    chunks) are not checked against the index: a warning says so."""
    name = m.shard_name(s)
    try:
        rel = shard_path(name)
    except UnsafePathError as exc:
        return [Finding(name, "unsafe_path", str(exc))], None
    url = st.url(rel)
    try:
        require_regular_file(st, rel)
        data = st.read_file(rel)
    except FileNotFoundError:
        return [Finding(name, "missing_shard", f"{url} is missing")], None
    except OSError as exc:
        return [Finding(name, "read_error", f"{url}: {exc}")], None
    out: list[Finding] = []
    unknown = _unknown_row_groups(m, s, name, url, bad_chunks, out)
    sound = _check_shard_bytes(m, s, name, url, data, out, unknown)
    footer = _read_footer(m, s, name, url, data, out)
    if footer is None:
        return out, None
    md, schema = footer
    _check_footer_counts(m, s, name, url, md, sound, out, unknown)
    codecs = shard_codecs(md, schema)
    problem = (None if m.writer.get("compression") == "auto"
               else named_codec_problem(m.writer.get("compression"), codecs))
    if problem is not None:
        out.append(Finding(name, "codec_mismatch", f"{url}: {problem}"))
    try:
        want = m.storage_schema
    except ManifestError as exc:
        out.append(Finding(name, "schema_mismatch", f"{url}: {exc}"))
        return out, codecs
    if not schema.equals(want, check_metadata=False):
        what = "storage schema" if m.storage else "schema"
        out.append(Finding(name, "schema_mismatch", f"{url}: schema {schema} differs from the "
                           f"manifest's {what} {want}"))
    if deep and md.num_row_groups == int(m.shard_num_rgs[s]) and schema.equals(
            want, check_metadata=False):
        _decode_row_groups(m, name, url, data, md, sound, out)
    return out, codecs


def _unknown_row_groups(m: Manifest, s: int, name: str, url: str, bad_chunks: frozenset[int],
                        out: list[Finding]) -> set[int]:
    """The row groups of shard ``s`` (local indices) in ``bad_chunks``, with a warning naming
    them: the index's byte ranges and hashes for them cannot be trusted."""
    if not bad_chunks:
        return set()
    first, n = int(m.shard_first_rg[s]), int(m.shard_num_rgs[s])
    per_chunk = m.details.per_chunk
    unknown = {local for local in range(n) if (first + local) // per_chunk in bad_chunks}
    if unknown:
        chunks = sorted({(first + local) // per_chunk for local in unknown})
        out.append(Finding(name, "row_group_unchecked", (
            f"{url}: row groups {_spans(sorted(unknown))} not checked against the index: their "
            f"byte ranges and hashes are in damaged row-group chunk "
            f"{', '.join(map(str, chunks))} (reported above); the shard's size, hash and footer "
            "were checked"), severity="warning"))
    return unknown


def _spans(values: list[int]) -> str:
    """Sorted ``values`` as runs: ``[0, 1, 2, 5]`` is ``0..2, 5``."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def _check_shard_bytes(m: Manifest, s: int, name: str, url: str, data: bytes,
                       out: list[Finding], unknown: set[int] = frozenset()) -> set[int]:
    """Shard ``s``'s size, its hash against its name and each row group's hash (but those of
    ``unknown``: see :func:`_unknown_row_groups`); returns the row groups (local indices)
    safe to decode: those whose bytes match their hash and, when the whole shard matches its
    name (its bytes are the ones written), those of ``unknown`` too."""
    want_size = int(m.shard_bytes[s])
    if len(data) != want_size:
        out.append(Finding(name, "size_mismatch",
                           f"{url}: {len(data)} bytes, manifest says {want_size} (truncated or "
                           "replaced)"))
    actual = xxh3_hex(data)
    if actual != name:
        out.append(Finding(name, "hash_mismatch", f"{url}: xxh3 {actual} does not match its name"))
    first, n = int(m.shard_first_rg[s]), int(m.shard_num_rgs[s])
    sound = set(unknown) if actual == name else set()
    for local in range(n):
        if local in unknown:
            continue
        rg = first + local
        off, length = int(m.rg_offset[rg]), int(m.rg_length[rg])
        h = xxh3_hex(data[off:off + length])
        if h != m.rg_xxh3(rg) or off + length > len(data):
            out.append(Finding(name, "row_group_hash",
                               f"{url}: row group {local} (bytes {off}..{off + length}) xxh3 {h}, "
                               f"manifest says {m.rg_xxh3(rg)}"))
        else:
            sound.add(local)
    return sound


def _read_footer(m: Manifest, s: int, name: str, url: str, data: bytes,
                 out: list[Finding]) -> tuple[pq.FileMetaData, pa.Schema] | None:
    """Shard ``s``'s Parquet footer and its Arrow schema, parsed only when the footer's bytes
    match their hash; ``None`` (with a finding) when they do not or it does not parse."""
    want_size = int(m.shard_bytes[s])
    fo = int(m.footer_offset[s])
    if len(data) != want_size or xxh3_hex(data[fo:want_size]) != m.shard_footer_xxh3(s):
        # Damaged bytes are never parsed or decoded: Arrow's Parquet reader is not made
        # for hostile input (a fuzzed flip crashed the process).
        out.append(Finding(name, "footer_hash", f"{url}: footer bytes {fo}.. do not match "
                           "their xxh3; its row groups were not decoded"))
        return None
    try:
        md = pq.read_metadata(pa.BufferReader(b"PAR1" + data[fo:want_size]))
        schema = md.schema.to_arrow_schema()
    except PARSE_ERRORS as exc:
        out.append(Finding(name, "footer_unreadable", f"{url}: Parquet footer unreadable: {exc}"))
        return None
    return md, schema


def _check_footer_counts(m: Manifest, s: int, name: str, url: str, md: pq.FileMetaData,
                         sound: set[int], out: list[Finding],
                         unknown: set[int] = frozenset()) -> None:
    """The footer's row and row-group counts and each column chunk's byte range against the
    manifest (not for ``unknown``: their ranges are not known); a row group whose chunks
    reach outside its range leaves ``sound``."""
    first, n = int(m.shard_first_rg[s]), int(m.shard_num_rgs[s])
    if md.num_rows != int(m.shard_rows[s]):
        out.append(Finding(name, "row_count", f"{url}: footer holds {md.num_rows} rows, manifest "
                           f"says {int(m.shard_rows[s])}"))
    if md.num_row_groups != n:
        out.append(Finding(name, "row_count", f"{url}: footer holds {md.num_row_groups} row "
                           f"groups, manifest says {n}"))
        return
    for local in range(n):
        got, want = md.row_group(local).num_rows, int(m.rg_rows[first + local])
        if got != want:
            out.append(Finding(name, "row_count", f"{url}: row group {local} holds {got} rows,"
                               f" manifest says {want}"))
        if local in unknown:
            continue
        problem = chunk_range_problem(m, first + local, md.row_group(local))
        if problem is not None:
            out.append(Finding(name, "row_group_range", f"{url}: {problem}"))
            sound.discard(local)


def _decode_row_groups(m: Manifest, name: str, url: str, data: bytes, md: pq.FileMetaData,
                       sound: set[int], out: list[Finding]) -> None:
    """``verify --deep``: decode each sound row group into the logical schema."""
    pf = pq.ParquetFile(pa.BufferReader(data), metadata=md)
    for local in sorted(sound):
        try:
            # use_threads=False: Arrow's own CPU pool, once started, aborted some
            # processes at exit ("terminate called without an active exception", exit
            # 134) after a correct report; the shards are already checked in parallel.
            m.to_logical(pf.read_row_group(local, use_threads=False))
        except (ZephonError, *PARSE_ERRORS) as exc:
            out.append(Finding(name, "decode_error", f"{url}: row group {local} does not "
                               f"decode: {exc}"))


__all__ = ["Finding", "VerifyReport", "verify", "manifest_json_schema", "schema_from_json"]
