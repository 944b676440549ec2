"""Convert raw corpora into content-hashed shards plus a manifest.

Three phases, each a pure function of the inputs and options, so the output is
byte-identical for any ``workers`` and any executor (:mod:`executors`: local processes, Ray):

1. **parse** (one task per input file): records -> Arrow IPC in the job's staging area, with
   every row's size (:mod:`rowsize`);
2. **cut** (the driver, cheap): cut the concatenated stream into row groups and shards
   (:mod:`layout`) from the staged sizes alone;
3. **write** (one task per shard): Parquet to a temp file, hash it, publish it as
   ``shards/<hash>.parquet`` (rename locally, one PUT on object stores), then a receipt.

Tasks read inputs from their URLs and write to the staging area or the output themselves;
the driver only plans, cuts and publishes, so no rows pass through it.

``manifest.json`` is published last. Killing the converter at any moment and rerunning the
same command reuses every parsed input and every published shard whose bytes still hash to
its name (the staging folder is keyed by a hash of the output, inputs and options) and
finishes with identical output; a damaged shard or side table is rewritten.

One convert at a time per output: the output's lock (:mod:`lock`) is taken before anything
else. The output (and its staging) is never read as an input, and an output that holds a
different dataset is replaced only with ``overwrite=True``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, is_dataclass

import numpy as np
import pyarrow as pa

from .._util.progress import progress_bar, progress_note
from ..errors import DiskFullError, InputError, OutputExistsError
from ..format.encoding import ElementNullError
from ..format.manifest import schema_from_base64, schema_to_base64, shard_path
from ..ingest import InputFile, InputOptions, InputStats, expand_inputs, read_input, unify_schemas
from ..ingest.schema import conform_batch
from ..io.storage import Storage
from .documents import DOCUMENT_PARTS
from .engines import make_executor
from .executors import Executor, LocalExecutor
from .layout import Cutter, ShardCut
from .lock import output_lock
from .publish import check_output, publish_manifest, stored_intact
from .rerun import job_fingerprint, record_job, unchanged_output
from .rowsize import table_row_nbytes
from .shardwriter import ShardInfo, WriteOptions, write_shard
from .stage_times import StageTimes, stage
from .staged import StagedInput, arrow_batch_rows, read_staged
from .staging import STAGING_DIRNAME, StagingArea, job_area, job_key, shared_storage


@dataclass
class ConvertResult:
    """What :func:`convert` did; ``to_dict()`` is the CLI's ``--json`` summary."""

    url: str
    dataset_id: str
    num_samples: int
    num_shards: int
    num_row_groups: int
    total_bytes: int
    input_files: int
    input_bytes: int
    shards_reused: int
    inputs_reused: int
    skipped: dict = field(default_factory=dict)
    skip_examples: list = field(default_factory=list)
    seconds: float = 0.0
    engine: str = "local"
    workers: int = 1
    stages: dict = field(default_factory=dict)  # phase -> wall seconds (plan, parse, ..., publish)
    # True for a rerun over this same conversion's intact output: no input read, nothing
    # written (zephon_store.write.rerun)
    unchanged: bool = False
    # kind of work -> seconds summed over every task (stage_times.WORK: read, size, ...,
    # hash, write, publish); tasks that ran at once can add up to more than the wall time
    work_seconds: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# A parse function turns one input into Arrow batches. The default reads records; packing
# (zephon_store.write.packing) swaps in tokenization. It must be a module-level callable so
# worker processes can import it.
ParseFn = Callable[[InputFile, InputOptions, "dict | None", InputStats], Iterable[pa.RecordBatch]]


# A restream pass re-stages the parsed inputs as a whole (token packing cuts windows across
# them): ``restream(files, staged, area, executor) -> (staged, schema, found)``, where
# ``found`` completes entries of ``extra_manifest`` (see :func:`_with_found`), except its
# DOCUMENT_PARTS: the staged parts of a document table, written at publish.
Restream = Callable[[list[InputFile], "list[StagedInput]", StagingArea, Executor],
                    "tuple[list[StagedInput], pa.Schema, dict]"]


def _default_parse(f: InputFile, options: InputOptions, storage_options, stats: InputStats):
    return read_input(f, options=options, storage_options=storage_options, stats=stats)


def convert(
    inputs: list[str] | str,
    output: str,
    *,
    options: WriteOptions | None = None,
    input_options: InputOptions | None = None,
    workers: int | None = None,
    storage_options: dict | None = None,
    input_storage_options: dict | None = None,
    progress: bool | None = None,
    staging_dir: str | None = None,
    parse_fn: ParseFn | None = None,
    extra_manifest: dict | None = None,
    restream: Restream | None = None,
    overwrite: bool = False,
    engine: str = "local",
    ray_address: str | None = None,
    executor: Executor | None = None,
) -> ConvertResult:
    """Convert ``inputs`` (paths, globs, directories, fsspec URLs) into a dataset at ``output``.

    >>> import os
    >>> r = convert([tiny_jsonl], os.path.join(tmp, "ds"), options=WriteOptions(row_group_rows=10))
    >>> r.num_samples, r.num_shards, r.num_row_groups, r.dataset_id
    (100, 1, 10, 'xxh3:...')

    Globs and URLs work the same way: ``convert(["corpus/*.jsonl.zst"], "s3://bucket/ds")``.

    ``storage_options`` configure the output's filesystem; ``input_storage_options`` the
    inputs' (defaults to ``storage_options``). ``progress`` shows a bar (default: on a TTY).
    ``engine`` runs the stages: ``"local"`` (``workers`` processes of this host, default 1)
    or ``"ray"`` (Ray tasks, ``workers`` at a time, default the cluster's CPUs, on the cluster
    at ``ray_address``, else on a local Ray instance started for this call;
    :mod:`~zephon_store.write.ray_engine`); ``executor`` passes any other
    :class:`~zephon_store.write.executors.Executor`. The output does not depend on either.
    An output holding a different dataset raises
    :class:`~zephon_store.errors.OutputExistsError` unless ``overwrite``; another convert
    into the same output raises :class:`~zephon_store.errors.OutputLockedError`.
    """
    t0 = time.perf_counter()
    options = options or WriteOptions()
    input_options = input_options or InputOptions()
    if executor is None:
        executor = make_executor(engine, workers=workers, ray_address=ray_address)
    if isinstance(inputs, str):
        inputs = [inputs]
    in_so = storage_options if input_storage_options is None else input_storage_options
    parse_fn = parse_fn or _default_parse

    stages: dict[str, float] = {}
    work = StageTimes()
    out = Storage(output, storage_options=storage_options)
    made = _check_local_output(out)
    try:
        return _convert_locked(out, output, inputs, in_so, options, input_options, parse_fn,
                               executor, progress, staging_dir, extra_manifest, restream,
                               overwrite, stages, work, t0)
    except BaseException:
        if made:   # a failed convert leaves no folder behind that it made itself
            with contextlib.suppress(OSError):
                os.rmdir(out.root_url)
        raise


def _check_local_output(out: Storage) -> bool:
    """Whether this convert makes a local output's folder (it does not exist yet); a local
    output that is a file is an :class:`~zephon_store.errors.OutputExistsError`."""
    if not out.local:
        return False
    if os.path.exists(out.root_url) and not os.path.isdir(out.root_url):
        raise OutputExistsError(f"{out.root_url} is a file, not a dataset folder; pass as the "
                                "output a new folder or one that holds a dataset")
    return not os.path.exists(out.root_url)


def _convert_locked(out, output, inputs, in_so, options, input_options, parse_fn, executor,
                    progress, staging_dir, extra_manifest, restream, overwrite, stages, work,
                    t0):
    """:func:`convert` under the output's lock."""
    # First: a second convert (or an S3 output without credentials) fails before any work.
    with output_lock(out) as lock:
        files = expand_inputs(list(inputs), storage_options=in_so, options=input_options,
                              exclude=_own_roots(out, staging_dir))
        fingerprint = job_fingerprint(files, options, input_options, parse_fn, extra_manifest)
        job = job_key(files, options, input_options, parse_fn, extra_manifest, out.root_url)
        area = job_area(out, job, staging_dir, shared_hosts=executor.shared_hosts)
        # A rerun over this job's own intact output has nothing to do, unless a killed run
        # left staging behind (the normal path below removes it).
        done = None if area.present() or _staging_left(out) else \
            unchanged_output(out, fingerprint)
        if done is not None:
            if area.local:   # a cleanup killed after the last publish left its trash
                area.remove_stale_jobs(out.root_url)
            stages["plan"] = time.perf_counter() - t0
            return _result(output, done, files, [], (len(files), done.num_shards), executor,
                           stages, work, t0, unchanged=True)
        check_output(out, files, options, overwrite=overwrite)
        active = _on_disk(area.root, lambda: area.open_job(out.root_url))
        try:
            area.remove_stale_jobs(out.root_url)
            stages["plan"] = time.perf_counter() - t0
            metas, cuts, infos, schema, reuse, found = _stage_and_write(
                files, out, area, options, input_options, in_so, parse_fn, executor,
                progress, restream, stages, work)
            t1 = time.perf_counter()
            documents = found.pop(DOCUMENT_PARTS, None)
            result = _on_disk(area.root, lambda: publish_manifest(
                out, files, metas, cuts, infos, schema, options, input_options,
                _with_found(extra_manifest, found), overwrite=overwrite, lock=lock,
                documents=None if documents is None else (documents, area)))
            record_job(out, result.dataset_id, fingerprint)
            stages["publish"] = time.perf_counter() - t1
            work.add("publish", stages["publish"])
        except BaseException:
            if active is not None:
                os.close(active)  # the staged work stays for a rerun ...
            if area.local and not area.holds_work():
                area.finish_job(None)   # ... unless there is none: no input was staged
            raise
        area.finish_job(active)
    return _result(output, result, files, metas, reuse, executor, stages, work, t0)


def _result(output: str, manifest, files, metas, reuse, executor: Executor,
            stages: dict[str, float], work: StageTimes, t0: float, *,
            unchanged: bool = False) -> ConvertResult:
    """What :func:`convert` returns: the published manifest's totals, what was reused and
    skipped, the wall time of each phase and the seconds of each kind of work (``t0``: when
    the call began)."""
    inputs_reused, shards_reused = reuse
    return ConvertResult(
        url=output, dataset_id=manifest.dataset_id, num_samples=manifest.num_samples,
        num_shards=manifest.num_shards, num_row_groups=manifest.num_row_groups,
        total_bytes=manifest.total_bytes, input_files=len(files),
        input_bytes=sum(f.size for f in files), shards_reused=shards_reused,
        inputs_reused=inputs_reused, skipped=manifest.skipped,
        skip_examples=[e for m in metas for e in m.stats.get("examples", [])][:10],
        seconds=round(time.perf_counter() - t0, 3), engine=_engine_name(executor),
        workers=executor.workers,
        stages={k: round(v, 3) for k, v in stages.items()}, unchanged=unchanged,
        work_seconds=work.rounded())


def _engine_name(executor: Executor) -> str:
    return "local" if isinstance(executor, LocalExecutor) else type(executor).__name__.removesuffix(
        "Executor").lower()


def _stage_and_write(files, out, area, options, input_options, in_so, parse_fn, executor,
                     progress, restream, stages, work):
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        stages[name] = now - t
        t = now

    with contextlib.ExitStack() as running:
        with progress_note(progress, f"start: {_engine_name(executor)} workers"):
            running.enter_context(executor)
        lap("start")  # starting workers (a local Ray instance takes seconds)
        metas, inputs_reused = _parse_all(files, area, input_options, in_so, parse_fn, executor,
                                          progress, work)
        lap("parse")
        if not any(m.rows for m in metas):
            raise InputError(f"no records found in {len(files)} input file(s) ({files[0].url}, "
                             "...); nothing to convert", path=files[0].url)
        schema = unify_schemas([(f.url, m.schema) for f, m in zip(files, metas) if m.rows > 0])
        found: dict = {}
        if restream is not None:
            # A global pass over the parsed stream (token packing) that re-stages the rows and
            # returns what it learnt for the manifest (the packing totals).
            metas, schema, found = restream(files, metas, area, executor)
            lap("restream")
            work.add("pack", stages["restream"])
        cuts = _cut_shards(metas, area, options)
        lap("cut")
        infos, shards_reused = _write_all(cuts, metas, area, schema, options, out, executor,
                                          progress, work)
        lap("write")
        if options.compression == "auto":
            found = {**found, "codecs": _codec_counts(infos)}
    return metas, cuts, infos, schema, (inputs_reused, shards_reused), found


def _with_found(extra: dict | None, found: dict) -> dict | None:
    """``extra_manifest`` completed by what the restream pass found: each entry of ``found``
    extends the object of the same name (``{"packing": {"num_tokens": ...}}``)."""
    if not found:
        return extra
    merged = dict(extra or {})
    for key, value in found.items():
        old = merged.get(key)
        both = isinstance(old, dict) and isinstance(value, dict)
        merged[key] = {**old, **value} if both else value
    return merged


def _codec_counts(infos) -> dict[str, dict[str, int]]:
    """What ``compression="auto"`` chose: column -> codec -> number of shards (the manifest's
    ``codecs``; formats/SPEC.md, "Compression")."""
    out: dict[str, dict[str, int]] = {}
    for info in infos:
        for column, codec in info.codecs.items():
            out.setdefault(column, {})
            out[column][codec] = out[column].get(codec, 0) + 1
    return {c: dict(sorted(v.items())) for c, v in sorted(out.items())}


def _staging_left(out: Storage) -> bool:
    """Whether a local output holds a staging folder (a killed run's, of any job)."""
    return out.local and os.path.exists(os.path.join(out.root_url, STAGING_DIRNAME))


def _own_roots(out: Storage, staging_dir: str | None) -> list[str]:
    """What a convert into ``out`` must never read as input: the output and its staging."""
    roots = [out.root_url] + ([os.path.abspath(staging_dir)] if staging_dir else [])
    # A local path may reach the same folder through a symlink; name it both ways.
    return roots + [os.path.realpath(r) for r in roots if "://" not in r]


def _on_disk(path: str, fn):
    """Run ``fn`` (it writes under ``path``); a full disk becomes a clear DiskFullError."""
    try:
        return fn()
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC or "No space left on device" in str(exc):
            raise DiskFullError(
                errno.ENOSPC, f"no space left on device ({exc}); free space on that disk "
                f"(this job stages under {path}; stage elsewhere with staging_dir=, or "
                "$ZEPHON_CACHE_DIR for remote outputs), then rerun the same command to resume"
            ) from exc
        raise


# -- phase 1: parse ------------------------------------------------------------------------
def _parse_all(files, area, input_options, so, parse_fn, executor, progress, work):
    tasks = [(i, f, area, input_options, so, parse_fn) for i, f in enumerate(files)]
    metas: list[StagedInput | None] = [None] * len(files)
    t0, rows, parsed, reused = time.perf_counter(), 0, 0, 0
    with progress_bar(progress, sum(f.size for f in files), "parse") as bar:
        for meta, was_reused, seconds in executor.map(_parse_one, tasks, name="parse"):
            metas[meta.index] = meta
            work.merge(seconds)
            rows += meta.rows
            reused += was_reused
            bar.update(meta.input_bytes)
            parsed += 1
            # Strings: tqdm prints a number in its shortest form (30000 as 3e+4).
            bar.set_postfix(inputs=f"{parsed}/{len(files)}", samples=f"{rows:,}",
                            reused=str(reused),
                            samples_per_s=f"{rows / max(time.perf_counter() - t0, 1e-9):,.0f}")
    return metas, reused


def _parse_one(task) -> tuple[StagedInput, bool, dict[str, float]]:
    """Parse and stage one input: its record, whether it was reused, and the seconds of
    its work by kind (:mod:`stage_times`)."""
    # A rerun reuses an input staged complete; the check runs here, in the task, so the
    # driver makes no request per input.
    meta = read_staged(task[2], f"parsed/{task[0]:06d}.json")
    if meta is not None and meta.complete(task[2]):
        return meta, True, {}
    times = StageTimes()
    with times.active():
        meta = _on_disk(task[2].root, lambda: _parse_staged(task))
    return meta, False, times.seconds


def _parse_staged(task) -> StagedInput:
    i, f, area, input_options, so, parse_fn = task
    stats = InputStats()
    base = f"parsed/{i:06d}"
    rows, sizes, schema = 0, [], None
    writer = None
    tmp = area.scratch(f"{base}.arrow")
    batches = iter(parse_fn(f, input_options, so, stats))
    try:
        while True:
            with stage("read"):   # a tokenizing parse_fn charges its own part to "tokenize"
                batch = next(batches, None)
            if batch is None:
                break
            if batch.num_rows == 0:
                continue
            if writer is None:
                schema = batch.schema
                writer = pa.ipc.new_file(tmp, schema, options=area.ipc_options)
            elif not batch.schema.equals(schema):
                # Chunks of one file may infer different types; unify within the file.
                schema = unify_schemas([(f.url, schema), (f.url, batch.schema)])
                writer.close()
                writer = _rewrite_with_schema(tmp, schema, area.ipc_options)
                batch = conform_batch(pa.Table.from_batches([batch]), schema).to_batches()[0]
            with stage("stage"):
                writer.write_batch(batch)
            with stage("size"):
                sizes.append(table_row_nbytes(batch))
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    if rows == 0 and input_options.on_error != "skip":
        raise InputError(
            f"{f.url}: input holds no records; remove it from the inputs or pass "
            "--on-error skip to ignore empty inputs", path=f.url)
    batch_rows = None
    if writer is not None:
        batch_rows = arrow_batch_rows(tmp)
        area.put(f"{base}.arrow", tmp)
    area.save_npy(f"{base}.sizes.npy", np.concatenate(sizes) if sizes else np.zeros(0, np.int64))
    meta = StagedInput(index=i, url=f.url, rows=rows, input_bytes=f.size,
                       schema_b64=schema_to_base64(schema) if schema is not None else None,
                       stats=_stats_dict(stats), batch_rows=batch_rows)
    area.write_json(f"{base}.json", meta.to_dict())
    return meta


def _rewrite_with_schema(path: str, schema: pa.Schema, options: pa.ipc.IpcWriteOptions | None):
    old = pa.ipc.open_file(pa.memory_map(path)).read_all()
    os.replace(path, path + ".old")
    w = pa.ipc.new_file(path, schema, options=options)
    for b in conform_batch(old, schema).to_batches():
        w.write_batch(b)
    os.remove(path + ".old")
    return w


def _stats_dict(stats) -> dict:
    if hasattr(stats, "to_dict"):
        return stats.to_dict()
    if is_dataclass(stats):
        return asdict(stats)
    return dict(vars(stats))


# -- phase 2: cut --------------------------------------------------------------------------
# Row-size files fetched ahead of the cut from a remote staging area: one GET each, so
# sequential fetches would cost a round trip per input (30,000 inputs: minutes, docs/scale.md).
_SIZES_AHEAD = 16


def _cut_shards(metas, area: StagingArea, options: WriteOptions) -> list[ShardCut]:
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    cutter = Cutter(row_group_rows=options.row_group_rows, row_group_bytes=options.row_group_bytes,
                    target_shard_bytes=options.target_shard_bytes)
    rels = [m.rel + ".sizes.npy" for m in metas if m.rows]
    if area.local:
        for rel in rels:
            cutter.feed(area.load_npy(rel))
        return cutter.finish()
    with ThreadPoolExecutor(_SIZES_AHEAD, thread_name_prefix="zephon-sizes") as pool:
        ahead: deque = deque()
        for rel in rels:  # at most _SIZES_AHEAD files in memory, fed in input order
            ahead.append(pool.submit(area.load_npy, rel))
            if len(ahead) >= _SIZES_AHEAD:
                cutter.feed(ahead.popleft().result())
        while ahead:
            cutter.feed(ahead.popleft().result())
    return cutter.finish()


def _pieces(cut: ShardCut, input_starts: np.ndarray, input_rows: np.ndarray):
    """(input index, local row start, count) pieces that make up one shard's rows."""
    pieces, start, end = [], cut.row_start, cut.row_start + cut.rows
    i = int(np.searchsorted(input_starts, start, side="right") - 1)
    while start < end:
        while input_rows[i] == 0 or start >= input_starts[i] + input_rows[i]:
            i += 1
        local = start - int(input_starts[i])
        n = min(end - start, int(input_rows[i]) - local)
        pieces.append((i, local, n))
        start += n
    return pieces


# -- phase 3: write ------------------------------------------------------------------------
def _write_all(cuts, metas, area, schema, options, out, executor, progress, work):
    input_rows = np.array([m.rows for m in metas], dtype=np.int64)
    input_starts = np.concatenate([[0], np.cumsum(input_rows)[:-1]]).astype(np.int64)
    infos: list[ShardInfo | None] = [None] * len(cuts)
    schema_b64 = schema_to_base64(schema)
    tasks = []
    for p in cuts:
        pieces = _pieces(p, input_starts, input_rows)
        # Only the staged inputs this shard reads travel with its task.
        tasks.append((p, pieces, area, {i: metas[i] for i, _, _ in pieces}, schema_b64,
                      options, out))
    reused = written = 0
    with progress_bar(progress, len(cuts), "write", unit="shard") as bar:
        for index, info, was_reused, seconds in executor.map(_write_one, tasks, name="write"):
            infos[index] = info
            work.merge(seconds)
            reused += was_reused
            written += info.bytes
            bar.update(1)
            bar.set_postfix(written=f"{written / 1e6:.1f}MB", reused=reused)
    return infos, reused


def _write_one(task):
    """Write one shard: ``(index, info, reused, seconds of its work by kind)``."""
    times = StageTimes()
    with times.active():
        index, info, reused = _on_disk(task[2].root, lambda: _write_staged(task))
    return index, info, reused, times.seconds


def _write_staged(task):
    cut, pieces, area, staged, schema_b64, options, out = task
    out = shared_storage(out.root_url, out.storage_options)
    # A rerun reuses a shard its receipt names while its bytes still hash to its name; the
    # check runs here, in the task, so the driver never reads a shard.
    receipt = area.read_json(f"done/{cut.index:06d}.json")
    if receipt is not None:
        info = ShardInfo.from_dict(receipt)
        if stored_intact(out, shard_path(info.name), info.bytes, info.name):
            return cut.index, info, True
    schema = schema_from_base64(schema_b64)
    with stage("stage"):
        parts = [conform_batch(staged[i].read_rows(area, local, n), schema)
                 for i, local, n in pieces]
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    tmp = area.scratch(f"tmp/{cut.index:06d}") + ".parquet"
    try:
        info = write_shard(table, cut.row_group_rows, tmp, options)  # encode, compress, hash
    except ElementNullError as exc:
        raise _input_error(exc, pieces, staged) from exc
    with stage("write"):
        rel = shard_path(info.name)
        # A shard already stored intact under its name (an earlier run's) is not written
        # again, and counts as reused.
        stored = stored_intact(out, rel, info.bytes, info.name)
        if not stored:   # absent or damaged: (re)write
            out.write_file_from_local(rel, tmp, move=True)
        if os.path.exists(tmp):
            os.remove(tmp)
        area.write_json(f"done/{cut.index:06d}.json", info.to_dict())
    return cut.index, info, stored


def _input_error(exc: ElementNullError, pieces, staged) -> InputError:
    """Name the input file and record behind a shard row the shard writer rejected."""
    starts = np.cumsum([0] + [n for _, _, n in pieces])
    k = int(np.searchsorted(starts, exc.row, side="right")) - 1
    i, local, _ = pieces[k]
    row = exc.row - int(starts[k])
    url = staged[i].url
    return InputError(f"{url} record {local + row} (0-based, after skipped records): column "
                      f"{exc.column!r}: {exc.detail}", path=url, row=local + row)
