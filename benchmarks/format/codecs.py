"""Per column kind, each codec's ratio and CPU cost, measured in one process (``--what codecs``).

The tokens corpus is measured in both layouts of a window: ``tokens`` back to back (format
v2-v4) and ``tokens (byte planes)`` (v5's default); the byte-plane figures' read time
includes turning the planes back into int32 (``to_logical``), which the reader pays.
The code corpus gets one more column, ``noise``: 64 random int64 per row (a stand-in for
hashes, ids and embeddings). The grid's whole-pipeline cells spend most of their time outside the codec (parsing, hashing,
Python objects), so on a shared machine a codec's cost drowns in the noise there. Here each
column of a corpus sample (about 16 MB of rows, in Zephon's storage types) is written to an
in-memory Parquet file with each codec (1 MiB row groups and pages, no dictionary for text
and token windows) and read back to Arrow, in interleaved rounds; the figure is the fastest
of the rounds (the run least disturbed by other jobs). Also the ratio that
``compression="auto"`` computes for the column (``choose_codecs``'s sample), which decides.
"""

from __future__ import annotations

import os
import time

CODECS = {"none": ("none", None), "lz4": ("lz4", None), "snappy": ("snappy", None),
          "zstd-1": ("zstd", 1), "zstd-3": ("zstd", 3), "zstd-6": ("zstd", 6)}
SPLIT_NAME = "tokens (byte planes)"
ROUNDS = 5
SAMPLE_BYTES = 16 << 20


def _sample_table(kind: str, inp: str):
    """The sample in storage types, and the logical schema and encodings of its columns."""
    import pyarrow as pa

    from zephon_store.format.encoding import storage_encodings, to_storage

    from ..peers.sys_pyarrow import _read_input

    t = _read_input("tokens" if kind == "tokens" else "text", inp)
    rows = max(1, int(t.num_rows * min(1.0, SAMPLE_BYTES / max(1, t.nbytes))))
    t = t.slice(0, rows)
    t = pa.Table.from_batches(t.to_batches()).combine_chunks()
    if kind == "code":
        # A random-looking column (hashes, ids, embeddings): what "auto" stores plain.
        import numpy as np

        noise = np.random.default_rng(0).integers(0, 2**63, t.num_rows * 64)
        t = t.append_column("noise", pa.FixedSizeListArray.from_arrays(pa.array(noise), 64))
    if kind == "tokens":
        t = t.append_column(SPLIT_NAME, t.column("tokens"))
    enc = storage_encodings(t.schema, "binary")
    if kind == "tokens":
        enc[SPLIT_NAME] = storage_encodings(t.select([SPLIT_NAME]).schema, "split")[SPLIT_NAME]
    return to_storage(t, enc), t.schema, enc


def _round(col, name: str, codec: str, level, logical=None, enc=None) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon_store.format.encoding import FIXED_SIZE_BINARY_SPLIT, to_logical

    t = pa.table({name: col})
    plain = pa.types.is_string(col.type) or pa.types.is_fixed_size_binary(col.type)
    rows = max(1, int((1 << 20) * len(col) / max(1, col.nbytes)))
    sink = pa.BufferOutputStream()
    c0 = time.process_time()
    pq.write_table(t, sink, compression=codec, compression_level=level, row_group_size=rows,
                   data_page_size=1 << 20, use_dictionary=not plain)
    c1 = time.process_time()
    buf = sink.getvalue()
    c2 = time.process_time()
    back = pq.read_table(pa.BufferReader(buf), use_threads=False)
    if enc == FIXED_SIZE_BINARY_SPLIT:
        to_logical(back, logical, {name: enc})
    c3 = time.process_time()
    return {"bytes": buf.size, "write_s": c1 - c0, "read_s": c3 - c2}


def measure(kind: str, inp: str) -> dict:
    """Column -> codec -> {bytes, write_s, read_s} (fastest round), plus the auto ratio."""
    import pyarrow as pa

    from zephon_store.write.shardwriter import _sample

    t, logical, enc = _sample_table(kind, inp)
    out = {}
    for name in t.schema.names:
        col = t.column(name).combine_chunks()
        raw = _sample(t.column(name), t.schema.field(name))
        auto_ratio = len(raw) / max(1, pa.Codec("zstd", 1).compress(raw).size)
        best: dict = {}
        for _ in range(ROUNDS):
            for label, (codec, level) in CODECS.items():
                r = _round(col, name, codec, level, logical, enc.get(name))
                b = best.setdefault(label, r)
                best[label] = {"bytes": r["bytes"], "write_s": min(b["write_s"], r["write_s"]),
                               "read_s": min(b["read_s"], r["read_s"])}
        out[name] = {"arrow_bytes": col.nbytes, "auto_ratio": auto_ratio, "codecs": best,
                     "type": str(t.schema.field(name).type)}
    return {"columns": out, "pid": os.getpid()}
