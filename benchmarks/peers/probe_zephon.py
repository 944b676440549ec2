#!/usr/bin/env python3
"""The experiments behind the "why" notes of docs/benchmarks_peers.md, on the run's corpora.

Each probe isolates one cause and prints what it measured (run after ``run.py`` built the
corpora; ``--mb`` picks them)::

    .venv-bench/bin/python benchmarks/peers/probe_zephon.py decode-cache   # seq read vs cache size
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py --system zephonraw getitem  # uncompressed
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py resume         # first batch vs prefetch
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py getitem        # where ds[i] spends time
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py s3             # GETs of an S3 pass
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py costs          # hash/decode/python split
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py overlap        # hash and convert at once
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py rowgroups --kind text  # resume vs rg size
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py codecs --kind tokens   # codec decode cost
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py narrow --kind tokens   # uint16 windows
    .venv-bench/bin/python benchmarks/peers/probe_zephon.py views --kind text      # string_view pages

Timings are single measurements in one process (medians where repeated): they explain
the benchmark's numbers, they are not the benchmark.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import corpus as corpus_mod  # noqa: E402
from common import BATCH, HERE, ROOT, vm_kb  # noqa: E402

SYSTEM = "zephon"   # which copy the probes read: --system zephon (zstd) or zephonraw


def _path(kind: str, mb: int, system: str | None = None) -> str:
    return os.path.join(corpus_mod.corpus_dir(kind, mb), "formats", system or SYSTEM)


def _warm(dataset: str) -> None:
    """Read every shard of ``dataset`` once, so a probe starts from the page cache."""
    for f in sorted(glob.glob(os.path.join(dataset, "shards", "*.parquet"))):
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass


def _rg_span(rg) -> tuple[int, int]:
    """File offsets ``[start, end)`` of a row group's bytes (``RowGroupMetaData``)."""
    cols = [rg.column(c) for c in range(rg.num_columns)]
    starts = [c.dictionary_page_offset or c.data_page_offset for c in cols]
    return min(starts), max(s + c.total_compressed_size for s, c in zip(starts, cols))


def _loader(ds, kind, *, shuffle, **kw):
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    return ZephonLoader(ds, global_batch=BATCH[kind], world_size=1, rank=0,
                        order=OrderOptions(seed=0, shuffle=shuffle), **kw)


def decode_cache_child(kind: str, mb: int, cache_mb: int) -> None:
    from zephon_store import open_dataset

    ds = open_dataset(_path(kind, mb), decode_cache_bytes=cache_mb << 20)
    t0 = time.perf_counter()
    n = sum(len(b[kind]) for b in _loader(ds, kind, shuffle=False, collate=None, epochs=1.0))
    print(f"{kind}: sequential pass, decode cache {cache_mb} MiB "
          f"(now {ds.decode_cache_bytes >> 20} MiB): {n} samples in "
          f"{time.perf_counter() - t0:.3f} s, peak RSS {vm_kb('VmHWM') >> 10} MB", flush=True)


def probe_decode_cache(kind: str, mb: int) -> None:
    """A fresh process per run, alternating the default (256 MiB) and an 8 MiB cache.

    Since the planned decode-ahead pipeline (``zephon_store/load/pipeline.py``) the loader holds
    the row groups it reads itself and drops them after their last use, bypassing the
    dataset's decode cache (``read_row_group(keep=False)``), and no longer grows it: the
    two should now take the same time and memory. A difference means the loader's reads
    went through the cache again.
    """
    for _ in range(3):
        for cache_mb in (256, 8):
            subprocess.run([sys.executable, __file__, "decode-cache-child", "--kind", kind,
                            "--mb", str(mb), "--cache-mb", str(cache_mb), "--system", SYSTEM],
                           env=dict(os.environ, PYTHONPATH=ROOT), check=True)


def probe_resume(kind: str, mb: int) -> None:
    import numpy as np

    from zephon_store import open_dataset
    from zephon_store.order import Order, OrderOptions

    for shuffle in (False, True):
        ds = open_dataset(_path(kind, mb))
        cur = ds.num_samples // 2 // BATCH[kind] * BATCH[kind]
        order = Order(ds.manifest.rg_rows, OrderOptions(seed=0, shuffle=shuffle))
        ids = order.sample_at(np.arange(cur, cur + BATCH[kind]))
        t0 = time.perf_counter()
        ds.take(ids)
        bare = (time.perf_counter() - t0) * 1e3
        print(f"{kind} {'shuffled' if shuffle else 'sequential'}: the first batch after the "
              f"cursor reads {len(np.unique(ds.locate(ids).row_group))} of "
              f"{ds.manifest.num_row_groups} row groups; a bare take() of it: {bare:.1f} ms")
        for prefetch, pbytes in ((1, 0), (4, 0), (1, 64 << 20), (4, 64 << 20)):
            times = []
            for _ in range(4):
                ld = _loader(open_dataset(_path(kind, mb)), kind, shuffle=shuffle,
                             prefetch=prefetch, prefetch_bytes=pbytes)
                t0 = time.perf_counter()
                ld.load_state_dict(dict(ld.state_dict(), cursor=cur))
                it = iter(ld)
                next(it)
                times.append((time.perf_counter() - t0) * 1e3)
                it.close()
            print(f"  prefetch={prefetch} prefetch_bytes={pbytes >> 20} MiB: load_state_dict + "
                  f"first batch, median of 3 after one warm-up: "
                  f"{statistics.median(times[1:]):.1f} ms", flush=True)


def probe_getitem(kind: str, mb: int) -> None:
    import numpy as np

    from zephon_store import open_dataset

    ds = open_dataset(_path(kind, mb))
    rg_rows = int(ds.manifest.rg_rows[0])
    idx = np.random.default_rng(1).integers(0, 20 * rg_rows, 1000).tolist()  # 20 cached rgs
    for i in idx:
        ds[i]

    def bench(label, f):
        ts = []
        for i in idx:
            t0 = time.perf_counter_ns()
            f(i)
            ts.append(time.perf_counter_ns() - t0)
        print(f"  {label:52s} p50 {sorted(ts)[len(ts) // 2] / 1e3:7.1f} µs")

    def direct(i):
        loc = ds.locate([i])
        t = ds.read_row_group(int(loc.row_group[0]))
        return t.slice(int(loc.row_in_group[0]), 1).to_pylist()[0]

    t0 = ds.read_row_group(0)
    print(f"{kind}: single-sample reads from row groups already in the decode cache")
    bench("ds[i]  (scalar lookup, one-row slice)", lambda i: ds[i])
    bench("ds.take([i])", lambda i: ds.take([i]))
    bench("ds.locate([i])", lambda i: ds.locate([i]))
    bench("locate + cached row group + slice + to_pylist", direct)
    bench("slice(1).to_pylist() alone", lambda i: t0.slice(i % rg_rows, 1).to_pylist()[0])


def probe_s3(kind: str, mb: int) -> None:
    import run
    import sys_zephon
    from s3_server import SeaweedServer

    from zephon_store.io import cache as cache_mod
    from zephon_store.io import storage as storage_mod

    stats: dict = collections.defaultdict(lambda: [0, 0.0])
    lock = threading.Lock()

    def wrap(cls, name):
        orig = getattr(cls, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                with lock:
                    stats[name][0] += 1
                    stats[name][1] += time.perf_counter() - t0
        setattr(cls, name, timed)

    wrap(storage_mod.Storage, "read_range")
    wrap(cache_mod.ChunkCache, "put")
    with SeaweedServer() as srv:
        run.upload(srv, kind, {SYSTEM: _path(kind, mb)}, [SYSTEM])
        so = run.server_options(srv)
        url = run._s3_url(SYSTEM, kind)
        cache = os.path.join(corpus_mod.corpus_dir(kind, mb), "work", "probe-cache")
        shutil.rmtree(cache, ignore_errors=True)
        t0 = time.perf_counter()
        sys_zephon.s3_read(kind, url, so, cache)
        wall = time.perf_counter() - t0
        print(f"{kind}: ZephonLoader sequential pass over S3 in {wall:.2f} s")
        for name, (calls, secs) in stats.items():
            print(f"  {name:12s} {calls:5d} calls, {secs:.2f} s in total, "
                  f"{secs / calls * 1e3:.1f} ms each ({secs / wall:.2f} in flight on average)")
        import s3fs

        from zephon_store import open_dataset

        m = open_dataset(_path(kind, mb)).manifest
        fs = s3fs.S3FileSystem(key=so["key"], secret=so["secret"],
                               endpoint_url=so["endpoint_url"], skip_instance_cache=True)
        paths = [url.removeprefix("s3://") + "/" + m.shard_path(s) for s in range(m.num_shards)]
        from concurrent.futures import ThreadPoolExecutor

        ranges = [(p, o) for p in paths for o in range(0, fs.size(p), 8 << 20)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            got = sum(len(b) for b in pool.map(
                lambda a: fs.cat_file(a[0], start=a[1], end=a[1] + (8 << 20)), ranges))
        print(f"  the same shards as {len(ranges)} GETs of 8 MiB, 4 threads: {got / 1e6:.0f} MB "
              f"in {time.perf_counter() - t0:.2f} s")
        shutil.rmtree(cache, ignore_errors=True)
        for pbytes in (256 << 20,):
            ld = _loader(url, kind, shuffle=False, collate=None, epochs=1.0,
                         storage_options=so, cache=cache, prefetch_bytes=pbytes)
            t0 = time.perf_counter()
            sum(1 for _ in ld)
            print(f"  ZephonLoader with prefetch_bytes={pbytes >> 20} MiB: "
                  f"{time.perf_counter() - t0:.2f} s")
        shutil.rmtree(cache, ignore_errors=True)


def probe_costs(kind: str, mb: int) -> None:
    """One pass over every row group of both copies, split into its memory passes.

    hash: xxh3 of the row group's bytes (the integrity check); decode: pyarrow's Parquet
    decode into Arrow buffers (plus, for token windows, the zero-copy view back to lists);
    python: the batch conversion a training loop gets (text to ``str``; tokens are numpy
    views, nothing to convert). Medians of 3 passes, each after re-reading the files.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    import xxhash

    from zephon_store import open_dataset
    from zephon_store._util.decode import decode_table

    b = BATCH[kind]
    for system in ("zephon", "zephonraw"):
        path = _path(kind, mb, system)
        m = open_dataset(path).manifest
        files = sorted(glob.glob(os.path.join(path, "shards", "*.parquet")))
        runs: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(3):
            _warm(path)
            tables, t_hash, t_dec = [], 0.0, 0.0
            for f in files:
                buf = pa.memory_map(f).read_buffer()
                pf = pq.ParquetFile(pa.BufferReader(buf))
                for i in range(pf.num_row_groups):
                    start, end = _rg_span(pf.metadata.row_group(i))
                    t0 = time.perf_counter()
                    xxhash.xxh3_128_hexdigest(memoryview(buf)[start:end])
                    t1 = time.perf_counter()
                    tables.append(m.to_logical(pf.read_row_group(i)))
                    t_hash += t1 - t0
                    t_dec += time.perf_counter() - t1
            t0 = time.perf_counter()
            for t in tables:
                for s in range(0, t.num_rows, b):
                    decode_table(t.slice(s, b))
            runs["hash"].append(t_hash)
            runs["decode"].append(t_dec)
            runs["python"].append(time.perf_counter() - t0)
            del tables
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"{kind} {system}: hash {med['hash']:.3f} s, decode {med['decode']:.3f} s, "
              f"python {med['python']:.3f} s, sum {sum(med.values()):.3f} s per pass "
              f"({m.num_samples} samples, {m.num_row_groups} row groups)")


def probe_pass(kind: str, mb: int) -> None:
    """The loader's own pass split up: decode alone, conversion alone, then both pipelined.

    decode: the pipeline's decode of every row group in one thread (hash check, then
    pages.py or pyarrow); convert: cutting every batch from those decoded row groups (text to
    ``str``, windows as numpy); pipeline: a ``BatchPipeline`` pass (decode threads + this
    thread), wall and process CPU time. If the pipeline's wall is near decode + convert,
    the two did not overlap (the GIL). Medians of 3, each after re-reading the files.
    """
    import numpy as np

    from zephon_store import open_dataset
    from zephon_store.load.pipeline import BatchPipeline, _Step, plan_rows
    from zephon_store.load.stream import RankStream, Topology
    from zephon_store.order import OrderOptions

    b = BATCH[kind]
    for system in ("zephon", "zephonraw"):
        path = _path(kind, mb, system)
        runs: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(3):
            _warm(path)
            ds = open_dataset(path)
            stream = RankStream(ds, OrderOptions(shuffle=False), Topology(b))
            pipe = BatchPipeline(stream, 0, range(ds.num_samples // b))
            t0 = time.perf_counter()
            decoded = [pipe._decode(rg) for rg in range(ds.manifest.num_row_groups)]
            t1 = time.perf_counter()
            for i in range(ds.num_samples // b):
                ids = np.arange(i * b, (i + 1) * b)
                rgs, runs_, inv, rows = plan_rows(ds.manifest, ids)
                pipe._assemble(_Step(i, i, ids, rgs, runs_, inv, rows),
                               [decoded[r] for r in rgs])
            t2 = time.perf_counter()
            del decoded
            ds = open_dataset(path)
            stream = RankStream(ds, OrderOptions(shuffle=False), Topology(b))
            c0, t3 = time.process_time(), time.perf_counter()
            for _ in BatchPipeline(stream, 0, range(ds.num_samples // b)):
                pass
            runs["decode"].append(t1 - t0)
            runs["convert"].append(t2 - t1)
            runs["pipeline"].append(time.perf_counter() - t3)
            runs["pipeline_cpu"].append(time.process_time() - c0)
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"{kind} {system}: decode {med['decode']:.3f} s + convert {med['convert']:.3f} s "
              f"in one thread; pipelined {med['pipeline']:.3f} s wall, "
              f"{med['pipeline_cpu']:.3f} s CPU")


def probe_overlap(kind: str, mb: int) -> None:
    """Does the integrity check overlap with the conversion to Python? Bytes, not the GIL.

    On the uncompressed copy, from memory: ``hash`` is the xxh3 of every row group (what a
    decode thread does before trusting bytes; the hasher releases the GIL); ``convert``
    makes the Python objects a pass hands out (text: ``to_pylist``; windows: a numpy copy).
    Each alone, then both at once in two threads of one process and in two processes. If
    two processes, which share nothing but the machine, slow each other as much as two
    threads do, the limit is memory bandwidth, not the GIL. Medians of 5.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import xxhash

    path = _path(kind, mb, "zephonraw")
    files = sorted(glob.glob(os.path.join(path, "shards", "*.parquet")))
    ranges, cols = [], []
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        pf = pq.ParquetFile(pa.py_buffer(data))
        for i in range(pf.num_row_groups):
            start, end = _rg_span(pf.metadata.row_group(i))
            ranges.append(memoryview(data)[start:end])
            cols.append(pf.read_row_group(i, columns=[kind]).column(0).combine_chunks())
    views = [np.frombuffer(c.buffers()[1], dtype=np.int32) if kind == "tokens" else None
             for c in cols]

    def hash_all() -> float:
        t0 = time.perf_counter()
        for r in ranges:
            xxhash.xxh3_128(r).hexdigest()
        return time.perf_counter() - t0

    def convert_all() -> float:
        t0 = time.perf_counter()
        for c, v in zip(cols, views):
            if v is None:
                c.to_pylist()
            else:
                v.copy()
        return time.perf_counter() - t0

    def in_threads() -> tuple[float, float]:
        got: dict[str, float] = {}
        t = threading.Thread(target=lambda: got.__setitem__("h", hash_all()))
        t.start()
        c = convert_all()
        t.join()
        return got["h"], c

    def in_processes() -> tuple[float, float]:
        r, w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.read(go_r, 1)
            os.write(w, f"{hash_all():.6f}".encode())
            os._exit(0)
        os.write(go_w, b"x")
        c = convert_all()
        h = float(os.read(r, 64).decode())
        os.waitpid(pid, 0)
        for fd in (r, w, go_r, go_w):
            os.close(fd)
        return h, c

    runs: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(5):
        runs["hash alone"].append(hash_all())
        runs["convert alone"].append(convert_all())
        h, c = in_threads()
        runs["threads: hash"].append(h)
        runs["threads: convert"].append(c)
        h, c = in_processes()
        runs["processes: hash"].append(h)
        runs["processes: convert"].append(c)
    mb_ = sum(len(r) for r in ranges) / 1e6
    print(f"{kind} ({mb_:.0f} MB of row groups, {len(ranges)} row groups), medians of 5, s:")
    for k, v in runs.items():
        print(f"  {k:20s} {statistics.median(v):.3f}")


def probe_rowgroups(kind: str, mb: int) -> None:
    """Row-group size against the shuffled resume and the sequential pass (zstd default).

    Converts the corpus again with ``row_group_bytes`` of 1 MiB (the default), 512 KiB and
    256 KiB, then, the sizes interleaved: the shuffled first batch after a resume at 50%
    (``load_state_dict`` + ``next``, a freshly opened dataset each time; median of 5) and a
    sequential loader pass (median of 3). Smaller row groups make the first batch decode
    less; the price is more per-row-group work on every pass.
    """
    import tempfile

    from zephon_store import convert, open_dataset
    from zephon_store.write.shardwriter import WriteOptions

    inputs = sorted(glob.glob(os.path.join(corpus_mod.corpus_dir(kind, mb), "input", "*")))
    sizes = (1 << 20, 512 << 10, 256 << 10)
    work = tempfile.mkdtemp(dir=corpus_mod.corpus_dir(kind, mb), prefix="rowgroups-")
    try:
        paths = {}
        for size in sizes:
            paths[size] = os.path.join(work, str(size))
            convert(inputs, paths[size], progress=False,
                    options=WriteOptions(row_group_bytes=size))
            _warm(paths[size])
        resume: dict[int, list[float]] = collections.defaultdict(list)
        passes: dict[int, list[float]] = collections.defaultdict(list)
        for rep in range(5):
            for size in sizes:
                ds = open_dataset(paths[size])
                cur = ds.num_samples // 2 // BATCH[kind] * BATCH[kind]
                ld = _loader(ds, kind, shuffle=True)
                t0 = time.perf_counter()
                ld.load_state_dict(dict(ld.state_dict(), cursor=cur))
                it = iter(ld)
                next(it)
                resume[size].append((time.perf_counter() - t0) * 1e3)
                it.close()
                if rep < 3:
                    ld = _loader(open_dataset(paths[size]), kind, shuffle=False, collate=None,
                                 epochs=1.0)
                    t0 = time.perf_counter()
                    for _ in ld:
                        pass
                    passes[size].append(time.perf_counter() - t0)
        for size in sizes:
            m = open_dataset(paths[size]).manifest
            print(f"{kind} row_group_bytes={size >> 10} KiB ({m.num_row_groups} row groups): "
                  f"shuffled resume, first batch {statistics.median(resume[size]):.1f} ms "
                  f"({min(resume[size]):.1f}-{max(resume[size]):.1f}); sequential pass "
                  f"{statistics.median(passes[size]):.3f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def probe_codecs(kind: str, mb: int) -> None:
    """Decompression cost of token windows by codec, and of the same ids stored as uint16.

    The first 20 row groups of the uncompressed copy (token windows, int32), compressed in
    memory with each codec; best of 5 decompressions each. The last line is the same ids
    narrowed to uint16 (they fit when the vocabulary has at most 65,536 ids) under zstd 3,
    plus the widening back to int32 a reader would pay. Not a Zephon format today.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind != "tokens":
        print(f"{kind}: the codecs probe is for token windows (--kind tokens)")
        return
    first = sorted(glob.glob(os.path.join(_path(kind, mb, "zephonraw"), "shards", "*.parquet")))[0]
    col = pq.ParquetFile(first).read_row_groups(list(range(20))).column(0).combine_chunks()
    raw = col.buffers()[1].to_pybytes()

    def best_of(codec: pa.Codec, data: bytes) -> tuple[int, float]:
        comp = codec.compress(data, asbytes=True)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            codec.decompress(comp, decompressed_size=len(data))
            times.append(time.perf_counter() - t0)
        return len(comp), min(times)

    print(f"{kind}: {len(raw) / 1e6:.1f} MB of int32 ids (20 row groups)")
    for name, level in (("zstd", 1), ("zstd", 3), ("zstd", 9), ("lz4", None)):
        codec = pa.Codec(name) if level is None else pa.Codec(name, compression_level=level)
        n, t = best_of(codec, raw)
        print(f"  {name} {level if level is not None else ''}: ratio {len(raw) / n:.2f}, "
              f"decompress {t * 1e3:.1f} ms ({len(raw) / t / 1e9:.2f} GB/s out)")
    ids = np.frombuffer(raw, dtype=np.int32)
    if int(ids.max()) >= 1 << 16:
        print(f"  uint16: ids up to {int(ids.max())} do not fit")
        return
    narrow = ids.astype(np.uint16)
    n, t = best_of(pa.Codec("zstd", compression_level=3), narrow.tobytes())
    widen = []
    for _ in range(5):
        t0 = time.perf_counter()
        narrow.astype(np.int32)
        widen.append(time.perf_counter() - t0)
    print(f"  uint16 + zstd 3: {n / 1e6:.1f} MB, decompress {t * 1e3:.1f} ms, widen to int32 "
          f"{min(widen) * 1e3:.1f} ms (max id {int(ids.max())})")


def probe_narrow(kind: str, mb: int) -> None:
    """Token windows as uint16 against int32, both zstd (the default), through the loader.

    Writes the corpus's windows cast to ``uint16`` (they fit when the vocabulary has at most
    65,536 ids; GPT-2's has 50,257) and converts them with default options; Zephon keeps
    the type, so they are stored as ``fixed_size_binary(2 x 2049)``. Then sequential and
    shuffled loader passes over both copies, interleaved, medians of 5; a training loop
    would widen a batch with ``.long()`` for its embedding either way.
    """
    import tempfile

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon_store import convert, open_dataset

    if kind != "tokens":
        print(f"{kind}: the narrow probe is for token windows (--kind tokens)")
        return
    inp = sorted(glob.glob(os.path.join(corpus_mod.corpus_dir(kind, mb), "input", "*")))
    work = tempfile.mkdtemp(dir=corpus_mod.corpus_dir(kind, mb), prefix="narrow-")
    try:
        narrow_in = os.path.join(work, "tokens_u16.parquet")
        with pq.ParquetWriter(narrow_in, pa.schema(
                [(kind, pa.list_(pa.uint16(), 2049))]), compression="zstd") as w:
            for f in inp:
                pf = pq.ParquetFile(f)
                for i in range(pf.num_row_groups):
                    col = pf.read_row_group(i).column(kind).combine_chunks()
                    ids = np.asarray(col.values)
                    if int(ids.max()) >= 1 << 16:
                        print(f"{kind}: ids up to {int(ids.max())} do not fit uint16")
                        return
                    w.write_table(pa.table({kind: pa.FixedSizeListArray.from_arrays(
                        pa.array(ids.astype(np.uint16)), 2049)}))
        paths = {"int32": _path(kind, mb, "zephon"), "uint16": os.path.join(work, "zephon")}
        convert([narrow_in], paths["uint16"], progress=False)
        for p in paths.values():
            _warm(p)
        runs: dict[tuple[str, bool], list[float]] = collections.defaultdict(list)
        for _ in range(5):
            for name, p in paths.items():
                for shuffle in (False, True):
                    ld = _loader(open_dataset(p), kind, shuffle=shuffle, collate=None,
                                 epochs=1.0)
                    t0 = time.perf_counter()
                    n = sum(len(b[kind]) for b in ld)
                    runs[(name, shuffle)].append(time.perf_counter() - t0)
        for name, p in paths.items():
            mb_disk = sum(os.path.getsize(f) for f in glob.glob(
                os.path.join(p, "shards", "*.parquet"))) / 1e6
            seq, shuf = (statistics.median(runs[(name, s)]) for s in (False, True))
            print(f"{kind} {name} (zstd, {mb_disk:.0f} MB on disk): sequential pass "
                  f"{seq:.3f} s ({n / seq:,.0f} samples/s), shuffled {shuf:.3f} s "
                  f"({n / shuf:,.0f} samples/s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _string_views(buf, column):
    """A PLAIN, null-free string column chunk as ``string_view`` arrays over its pages.

    Each value's 4-byte length is read in Python (the values follow each other, so the
    scan is sequential), then one 16-byte view per value points into the page: no copy of
    the text. ``None`` where :mod:`zephon_store.read.pages` does not read the chunk.
    """
    import struct

    import numpy as np
    import pyarrow as pa

    from zephon_store.read.pages import _pages, _Unsupported

    unpack = struct.Struct("<I").unpack_from
    chunks = []
    try:
        for n, values in _pages(buf, 0, column, 1):
            mv = memoryview(values)
            starts, lens = np.empty(n, np.int64), np.empty(n, np.int64)
            pos = 0
            for i in range(n):
                (length,) = unpack(mv, pos)
                starts[i], lens[i] = pos + 4, length
                pos += 4 + length
            if pos != values.size:
                return None
            page = np.frombuffer(values, np.uint8)
            head = page[np.minimum(starts[:, None] + np.arange(12), page.size - 1)]
            views = np.zeros((n, 16), np.uint8)
            views.view(np.int32)[:, 0] = lens
            short = lens <= 12                      # inline: the value itself, zero-padded
            views[:, 4:] = np.where(short[:, None] & (np.arange(12) < lens[:, None]), head, 0)
            views[~short, 4:8] = head[~short, :4]   # else a 4-byte prefix, buffer 0, offset
            views.view(np.int32)[~short, 3] = starts[~short]
            chunks.append(pa.Array.from_buffers(pa.string_view(), n,
                                                [None, pa.py_buffer(views), values]))
    except _Unsupported:
        return None
    return pa.chunked_array(chunks, type=pa.string_view())


def probe_views(kind: str, mb: int) -> None:
    """Text without pyarrow's copy: ``string_view`` arrays over the pages, against pyarrow.

    For every row group of both copies: the xxh3 check first (as the loader does, so the
    mapped pages are touched there), then (a) pyarrow decodes the text column into a
    ``string`` array and ``to_pylist`` makes the ``str``; (b) the page is scanned in Python
    into a ``string_view`` array over the same bytes (:func:`_string_views`) and
    ``to_pylist`` makes the ``str`` from there ("pages" includes the decompression of a
    zstd page). pyarrow's decode releases the GIL; the scan holds it. Medians of 3 passes,
    the lists compared once.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon_store._util.hashing import xxh3_hex

    if kind != "text":
        print(f"{kind}: the views probe is for text (--kind text)")
        return
    for system in ("zephon", "zephonraw"):
        files = sorted(glob.glob(os.path.join(_path(kind, mb, system), "shards", "*.parquet")))
        runs: dict[str, list[float]] = collections.defaultdict(list)
        for rep in range(3):
            t = collections.Counter()
            for f in files:
                buf = pa.memory_map(f).read_buffer()
                pf = pq.ParquetFile(pa.BufferReader(buf))
                ci = pf.schema_arrow.names.index(kind)
                for i in range(pf.num_row_groups):
                    meta = pf.metadata.row_group(i)
                    start, end = _rg_span(meta)
                    t0 = time.perf_counter()
                    xxh3_hex(memoryview(buf)[start:end])
                    t1 = time.perf_counter()
                    arrow = pf.read_row_group(i, columns=[kind], use_threads=False).column(0)
                    t2 = time.perf_counter()
                    from_arrow = arrow.to_pylist()
                    t3 = time.perf_counter()
                    views = _string_views(buf, meta.column(ci))
                    t4 = time.perf_counter()
                    if views is None:
                        print(f"{kind} {system}: pages not readable as views ({f}, {i})")
                        return
                    from_views = views.to_pylist()
                    t5 = time.perf_counter()
                    if rep == 0 and from_views != from_arrow:
                        raise AssertionError(f"views differ from pyarrow in {f} row group {i}")
                    t.update(hash=t1 - t0, decode=t2 - t1, convert=t3 - t2, scan=t4 - t3,
                             convert_views=t5 - t4)
            for k, v in t.items():
                runs[k].append(v)
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"{kind} {system}: hash {med['hash']:.3f} s; pyarrow: decode {med['decode']:.3f}"
              f" s (no GIL) + str {med['convert']:.3f} s = "
              f"{med['decode'] + med['convert']:.3f} s; views: pages + scan {med['scan']:.3f} s"
              f" + str {med['convert_views']:.3f} s = "
              f"{med['scan'] + med['convert_views']:.3f} s per pass", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=["decode-cache", "resume", "getitem", "s3", "costs",
                                      "pass", "overlap", "rowgroups", "codecs", "narrow",
                                      "views", "decode-cache-child"])
    ap.add_argument("--kind", choices=["text", "tokens", "all"], default="all")
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--cache-mb", type=int, default=256)
    ap.add_argument("--system", choices=["zephon", "zephonraw"], default="zephon",
                    help="the copy to probe: default WriteOptions or compression='none'")
    a = ap.parse_args()
    global SYSTEM
    SYSTEM = a.system
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    sys.path.insert(0, HERE)
    import pyarrow as pa

    import zephon_store.torch  # noqa: F401

    pa.array([1]).to_numpy()   # pyarrow's first to_numpy() imports pandas: not work
    if a.probe == "decode-cache-child":
        decode_cache_child(a.kind, a.mb, a.cache_mb)
        os._exit(0)
    for kind in (["text", "tokens"] if a.kind == "all" else [a.kind]):
        {"decode-cache": probe_decode_cache, "resume": probe_resume, "getitem": probe_getitem,
         "s3": probe_s3, "costs": probe_costs, "pass": probe_pass,
         "overlap": probe_overlap, "rowgroups": probe_rowgroups,
         "codecs": probe_codecs, "narrow": probe_narrow,
         "views": probe_views}[a.probe](kind, a.mb)
    os._exit(0)   # skip teardown with pyarrow/torch threads alive (see child.py)


if __name__ == "__main__":
    main()
