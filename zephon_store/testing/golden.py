#!/usr/bin/env python3
"""The golden datasets' inputs and writer options; as a script, write the current version's.

``DATASETS`` is what ``tests/unit/format/test_golden.py`` converts again to check that the writer
still produces the golden bytes. Run from a checkout, the script writes the datasets of the
current format version into ``formats/golden/v<N>/``.

Each dataset is converted from small inputs defined here, and ``expected.json`` records
its dataset_id, sample count and every record, plus the pyarrow version that wrote it.
Tests read every golden version forever; rerun this only when bumping the format version.
Older versions' folders are never touched (their datasets were made by this file's
``DATASETS`` of that time; the text and nested inputs have not changed since v1).

    python -m zephon_store.testing.golden   # writes formats/golden/v<FORMAT_VERSION>/
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

from ..format.manifest import FORMAT_VERSION
from ..ingest import InputOptions
from ..read.dataset import open_dataset
from ..write.convert import convert
from ..write.packing import PackingOptions, packing_convert_kwargs
from ..write.rerun import RECORD_NAME
from ..write.shardwriter import WriteOptions

# The checkout this module lives in (zephon_store/testing/golden.py -> the repository root).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _text_inputs(d: str) -> list[str]:
    lines = [json.dumps({"id": i, "text": f"golden record {i} " + "ab" * (i % 7),
                         "lang": ["en", "de", "ja"][i % 3]}) for i in range(40)]
    with open(os.path.join(d, "a.jsonl"), "w") as f:
        f.write("\n".join(lines[:25]) + "\n")
    with open(os.path.join(d, "b.jsonl"), "w") as f:
        f.write("\n".join(lines[25:]) + "\n")
    return [os.path.join(d, "*.jsonl")]


def _nested_inputs(d: str) -> list[str]:
    t = pa.table({
        "k": pa.array(list(range(12)), pa.int32()),
        "tags": pa.array([[f"t{i}", f"u{i}"] if i % 4 else None for i in range(12)],
                         pa.list_(pa.string())),
        "pt": pa.array([{"x": float(i), "y": -i} for i in range(12)],
                       pa.struct([("x", pa.float64()), ("y", pa.int64())])),
        "ts": pa.array([datetime.datetime(2026, 1, 1, i) for i in range(12)],
                       pa.timestamp("us", tz="UTC")),
    })
    path = os.path.join(d, "nested.parquet")
    pq.write_table(t, path)
    return [path]


def _tokens_inputs(d: str) -> list[str]:
    # v2: fixed-size lists of numbers are stored as fixed_size_binary (formats/SPEC.md 3.1);
    # null rows, negative ids and an unsigned and a float column pin the byte layout.
    t = pa.table({
        "id": pa.array(range(30), pa.int64()),
        "tokens": pa.array([[(i * 9 + j) * (-1) ** j for j in range(9)] for i in range(30)],
                           pa.list_(pa.int32(), 9)),
        "pos": pa.array([[i, 65535 - i] for i in range(30)], pa.list_(pa.uint16(), 2)),
        "emb": pa.array([[i / 4, -i / 8, 0.5] if i % 5 else None for i in range(30)],
                        pa.list_(pa.float32(), 3)),
    }, schema=pa.schema([("id", pa.int64()),
                         pa.field("tokens", pa.list_(pa.int32(), 9), nullable=False),
                         ("pos", pa.list_(pa.uint16(), 2)),
                         ("emb", pa.list_(pa.float32(), 3))]))
    path = os.path.join(d, "tokens.parquet")
    pq.write_table(t, path)
    return [path]


def _docs_inputs(d: str) -> list[str]:
    # The default use_dictionary="auto": "text" (every value distinct) is written with plain
    # pages, "source" (3 values) with a dictionary.
    lines = [json.dumps({"text": f"document {i}: " + " ".join([f"w{i * j % 17}"
                                                               for j in range(i % 9)]),
                         "source": ["web", "books", "code"][i % 3]}) for i in range(20)]
    with open(os.path.join(d, "docs.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return [os.path.join(d, "docs.jsonl")]


def _auto_inputs(d: str) -> list[str]:
    # v3: compression="auto" (formats/SPEC.md, "Compression"): "text", "lang" and the small
    # token ids compress, so they are zstd-1; "noise" (sha256 bits) does not: none.
    import hashlib

    n = 40
    t = pa.table({
        "text": [f"record {i}: " + "the quick brown fox jumps over the lazy dog " * (1 + i % 4)
                 for i in range(n)],
        "lang": [["en", "de", "ja"][i % 3] for i in range(n)],
        "noise": pa.array([int.from_bytes(hashlib.sha256(b"n%d" % i).digest()[:8], "little")
                           for i in range(n)], pa.uint64()),
        "tokens": pa.array([[(i + j) % 50 for j in range(16)] for i in range(n)],
                           pa.list_(pa.int32(), 16)),
    })
    path = os.path.join(d, "auto.parquet")
    pq.write_table(t, path)
    return [path]


def _windows_inputs(d: str) -> list[str]:
    # v5: the defaults on token windows: byte planes (formats/SPEC.md 3.1) and, because LZ4
    # packs the planes of Zipf-distributed ids nearly as well as zstd-1, "auto" picks lz4
    # (3.2). The ids come from a seeded generator written out here, so the golden's input
    # never depends on numpy's random streams.
    ids, x = [], 12345
    for _ in range(48 * 256):
        x = (x * 1103515245 + 12345) % 2**31   # a fixed LCG; rank = a Zipf-like skew of it
        u = (x >> 8) / 2**23
        ids.append(int((50_257 ** u - 1) * 7919) % 50_257)
    t = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(pa.array(ids, pa.int32()), 256)})
    path = os.path.join(d, "windows.parquet")
    pq.write_table(t, path)
    return [path]


# v6: packed token windows with their document table (formats/SPEC.md 4.2). The tokenizer is
# a word-level one written here as JSON text, so its bytes (and the xxh3 the manifest records)
# never depend on the tokenizers library's version.
_WORDS = ["[UNK]", "<s>", "</s>"] + [f"w{i}" for i in range(29)]
_SPECIAL = ('{"id":%d,"content":"%s","single_word":false,"lstrip":false,"rstrip":false,'
            '"normalized":false,"special":true}')


def golden_tokenizer(d: str) -> str:
    """Write the golden word-level ``tokenizer.json`` (``w0``..``w28``, ``<s>``, ``</s>``) into
    ``d``; return its path."""
    vocab = ",".join(f'"{w}":{i}' for i, w in enumerate(_WORDS))
    text = ('{"version":"1.0","truncation":null,"padding":null,"added_tokens":['
            + _SPECIAL % (1, "<s>") + "," + _SPECIAL % (2, "</s>") + '],"normalizer":null,'
            '"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":null,"decoder":null,'
            '"model":{"type":"WordLevel","vocab":{' + vocab + '},"unk_token":"[UNK]"}}')
    path = os.path.join(d, "tokenizer.json")
    with open(path, "w") as f:
        f.write(text)
    return path


def _packed_inputs(d: str) -> list[str]:
    # Documents of 0 to 40 words (a window holds 16 tokens: some are split, one is empty),
    # over two inputs so spans and best-fit buffers cross an input border.
    x = 7
    for name, n in (("p0.jsonl", 14), ("p1.jsonl", 9)):
        with open(os.path.join(d, name), "w") as f:
            for _ in range(n):
                x = (x * 1103515245 + 12345) % 2**31
                words = [f"w{(x >> k) % 29}" for k in range(x % 41)]
                f.write(json.dumps({"text": " ".join(words)}) + "\n")
    golden_tokenizer(d)
    return [os.path.join(d, "p*.jsonl")]


def _packing(strategy: str):
    """The packing of a golden packed dataset, given the folder its inputs were written to."""
    def options(d: str) -> PackingOptions:
        return PackingOptions(tokenizer=os.path.join(d, "tokenizer.json"), seq_len=15,
                              strategy=strategy, buffer_windows=4)
    return options


# The first three were written before use_dictionary="auto" became the default; they pin
# use_dictionary=True so their bytes stay what they were. All four were written before
# compression="auto" and pin zstd (level 3). "auto" has the defaults.
DATASETS = {
    "text": (_text_inputs, WriteOptions(target_shard_bytes=800, row_group_rows=6,
                                        use_dictionary=True, compression="zstd"),
             InputOptions()),
    "nested": (_nested_inputs, WriteOptions(target_shard_bytes=400, row_group_bytes=150,
                                            use_dictionary=True, compression="zstd"),
               InputOptions()),
    "tokens": (_tokens_inputs, WriteOptions(target_shard_bytes=1000, row_group_rows=8,
                                            use_dictionary=True, compression="zstd"),
               InputOptions()),
    "docs": (_docs_inputs, WriteOptions(target_shard_bytes=900, row_group_rows=8,
                                        compression="zstd"), InputOptions()),
    "auto": (_auto_inputs, WriteOptions(target_shard_bytes=4000, row_group_rows=8),
             InputOptions()),
    # From v5: the default options on token windows.
    "windows": (_windows_inputs, WriteOptions(target_shard_bytes=24_000, row_group_rows=8),
                InputOptions()),
    # From v6: packed windows and their document table, both strategies.
    "packed": (_packed_inputs, WriteOptions(target_shard_bytes=1500, row_group_rows=8),
               InputOptions()),
    "bestfit": (_packed_inputs, WriteOptions(target_shard_bytes=1500, row_group_rows=8),
                InputOptions()),
}
# The packing of the packed datasets (a function of the folder their inputs are in).
PACKING = {"packed": _packing("concat"), "bestfit": _packing("best-fit")}


def golden_convert_kwargs(name: str, inputs_dir: str) -> dict:
    """The packing keyword arguments of golden dataset ``name`` (none for unpacked data)."""
    if name not in PACKING:
        return {}
    return packing_convert_kwargs(PACKING[name](inputs_dir))


def _jsonable(rec):
    return json.loads(json.dumps(rec, default=lambda o: o.isoformat()))


def main() -> None:
    out_root = os.path.join(ROOT, "formats", "golden", f"v{FORMAT_VERSION}")
    shutil.rmtree(out_root, ignore_errors=True)
    os.makedirs(out_root)
    expected = {"format_version": FORMAT_VERSION, "pyarrow": pa.__version__, "datasets": {}}
    for name, (make_inputs, wopts, iopts) in DATASETS.items():
        with tempfile.TemporaryDirectory() as tmp:
            inputs = make_inputs(tmp)
            out = os.path.join(out_root, name)
            res = convert(inputs, out, options=wopts, input_options=iopts,
                          **golden_convert_kwargs(name, tmp))
        # The rerun record names this run's temporary inputs: no part of the dataset.
        os.remove(os.path.join(out, RECORD_NAME))
        ds = open_dataset(out)
        expected["datasets"][name] = {
            "dataset_id": res.dataset_id, "num_samples": res.num_samples,
            "num_shards": res.num_shards,
            "records": [_jsonable(r) for r in ds.take(range(ds.num_samples)).to_pylist()],
        }
    with open(os.path.join(out_root, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps({k: v["dataset_id"] for k, v in expected["datasets"].items()}))


if __name__ == "__main__":
    main()
