"""``zephon verify``'s codec check: what each shard's footer says against the manifest.

A manifest states how its shards are compressed: ``writer.compression`` names one codec for
every column, or (``"auto"``, format version 3) the top-level ``codecs`` record counts, per
column, the shards written with each codec (``formats/SPEC.md`` 3.2). Readers never rely on
that statement (every column chunk names its codec in the footer), but ``zephon info``
prints it and users choose options from it, so ``verify`` checks that it is true: the codec
of every column chunk is read from the verified footer and compared.

Parquet records the codec, not its level, so ``zstd-1`` and ``zstd-3`` both read as ZSTD.

>>> import pyarrow as pa
>>> leaf_owners(pa.schema([("a", pa.int64()), ("s", pa.struct([("x", pa.int8()), ("y", pa.string())]))]))
['a', 's', 's']
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

# The writer's codec names (WriteOptions.compression, the labels in ``codecs``) as pyarrow's
# footer metadata spells them. "lz4" is written as Parquet's LZ4_RAW codec, which pyarrow
# names "LZ4" (Arrow's codec of that name; Parquet's legacy Hadoop-framed LZ4 reads as
# "LZ4_HADOOP"), so a dataset written with lz4 is stored as its manifest says.
PARQUET_CODEC = {"none": "UNCOMPRESSED", "zstd": "ZSTD", "lz4": "LZ4", "snappy": "SNAPPY",
                 "gzip": "GZIP", "brotli": "BROTLI"}


def _leaves(t: pa.DataType) -> int:
    """How many Parquet leaf columns an Arrow type is stored as."""
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return _leaves(t.value_type)
    return 1


def leaf_owners(schema: pa.Schema) -> list[str]:
    """The top-level column each Parquet leaf column belongs to, in footer order.

    Walks the Arrow schema rather than splitting leaf paths on ``.``: a column name may
    itself hold dots.
    """
    return [f.name for f in schema for _ in range(_leaves(f.type))]


def shard_codecs(md: pq.FileMetaData, schema: pa.Schema) -> dict[str, set[str]]:
    """``{top-level column: the Parquet codecs of its chunks}`` over every row group."""
    owners = leaf_owners(schema)
    out: dict[str, set[str]] = {name: set() for name in schema.names}
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(min(rg.num_columns, len(owners))):
            out[owners[j]].add(str(rg.column(j).compression).upper())
    return out


def named_codec_problem(compression: str, codecs: dict[str, set[str]]) -> str | None:
    """For ``writer.compression`` naming one codec: the first column stored otherwise."""
    want = PARQUET_CODEC.get(str(compression).lower())
    if want is None:
        return None   # a codec this check does not know; the footer still decodes it
    for column, got in codecs.items():
        if got - {want}:
            return (f"column {column!r} is stored {'/'.join(sorted(got))}, the manifest's "
                    f"writer.compression says {compression!r} ({want})")
    return None


def auto_codec_problems(claimed: dict | None, per_shard: list[dict[str, set[str]]]) -> list[str]:
    """For ``compression="auto"``: the columns whose shard counts per codec, read from the
    footers, differ from the manifest's ``codecs`` record (or that record is missing)."""
    if claimed is None:
        return ["the manifest's writer.compression is 'auto' but it has no 'codecs' record "
                "(formats/SPEC.md 3.2); re-convert the dataset"]
    found: dict[str, Counter] = {}
    for codecs in per_shard:
        for column, got in codecs.items():
            label = "/".join(sorted(got)) if len(got) != 1 else next(iter(got))
            found.setdefault(column, Counter())[label] += 1
    problems = []
    for column in sorted(set(found) | set(claimed)):
        said = claimed.get(column)
        want = Counter()
        if isinstance(said, dict):
            for label, n in said.items():
                want[PARQUET_CODEC.get(str(label).partition("-")[0], str(label))] += n
        got = found.get(column, Counter())
        if want != got:
            problems.append(
                f"column {column!r}: the manifest's codecs record says "
                f"{dict(sorted(want.items())) or 'nothing'} (shards per codec), the shard "
                f"footers hold {dict(sorted(got.items())) or 'no such column'}")
    return problems


__all__ = ["PARQUET_CODEC", "auto_codec_problems", "leaf_owners", "named_codec_problem",
           "shard_codecs"]
