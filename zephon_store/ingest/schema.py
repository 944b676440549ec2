"""Schema rules: the few normalisations every input gets, unification across files, and casting a
batch to the unified schema."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ..errors import InputError


def normalize_type(t: pa.DataType) -> pa.DataType:
    """The type ``t`` is stored as: dictionaries decoded, view types made large, list items named.

    These are writer choices, not data: a pandas categorical, a polars ``string_view`` and a
    plain string column must unify, and Arrow cannot unify them as they come.

    >>> normalize_type(pa.dictionary(pa.int8(), pa.string()))
    DataType(string)
    """
    if pa.types.is_dictionary(t):
        return normalize_type(t.value_type)
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    if pa.types.is_list_view(t):
        return pa.list_(_item(t.value_field))
    if pa.types.is_large_list_view(t):
        return pa.large_list(_item(t.value_field))
    if pa.types.is_list(t):
        return pa.list_(_item(t.value_field))
    if pa.types.is_large_list(t):
        return pa.large_list(_item(t.value_field))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_item(t.value_field), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([_plain(f) for f in t])
    if pa.types.is_map(t):
        return pa.map_(normalize_type(t.key_type), _plain(t.item_field), t.keys_sorted)
    return t


def _item(f: pa.Field) -> pa.Field:
    # Parquet writers call a list's child "element", Arrow "item"; the name carries no data.
    return pa.field("item", normalize_type(f.type), f.nullable)


def _plain(f: pa.Field) -> pa.Field:
    return pa.field(f.name, normalize_type(f.type), f.nullable)


def normalize_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with :func:`normalize_type` applied and all schema and field metadata dropped.

    Metadata (pandas index descriptions, polars and HF feature tags) describes the writer;
    keeping it would make the same data from two writers produce different shards.
    """
    fields, columns, changed = [], [], batch.schema.metadata is not None
    for field, column in zip(batch.schema, batch.columns, strict=True):
        target = normalize_type(field.type)
        # Type equality ignores list child names, which normalize_type also fixes.
        if target != field.type or str(target) != str(field.type):
            column = column.cast(target)
            changed = True
        changed = changed or field.metadata is not None
        fields.append(pa.field(field.name, target, field.nullable))
        columns.append(column)
    if not changed:
        return batch
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def unify_schemas(schemas: Sequence[tuple[str, pa.Schema]]) -> pa.Schema:
    """One schema for all ``(url, schema)`` pairs, or an InputError naming both files and the column.

    Arrow's permissive promotion applies: int32+int64 -> int64, int+float -> float64,
    null -> anything, string+large_string -> large_string, struct fields are merged, and a
    column missing from some files is nullable. Fields keep the order of first appearance.

    >>> unify_schemas([("a.jsonl", pa.schema([("x", pa.int32())])),
    ...                ("b.jsonl", pa.schema([("x", pa.int64()), ("y", pa.string())]))])
    x: int64
    y: string
    >>> unify_schemas([("a.jsonl", pa.schema([("x", pa.int64())])),
    ...                ("b.jsonl", pa.schema([("x", pa.string())]))])
    Traceback (most recent call last):
    zephon_store.errors.InputError: column 'x' is int64 in a.jsonl but string in b.jsonl; make the types agree or convert the files separately
    """
    if not schemas:
        raise ValueError("unify_schemas needs at least one (url, schema) pair")
    plain = [(url, s.remove_metadata()) for url, s in schemas]
    try:
        unified = pa.unify_schemas([s for _, s in plain], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError):
        _raise_conflict(plain)
        raise
    # A column some file lacks gets nulls there, so it cannot stay NOT NULL.
    for i, field in enumerate(unified):
        if not field.nullable and any(s.get_field_index(field.name) < 0 for _, s in plain):
            unified = unified.set(i, field.with_nullable(True))
    return unified


def _raise_conflict(plain: list[tuple[str, pa.Schema]]) -> None:
    # Slow path: add one schema at a time to find which file and column break it.
    running = plain[0][1]
    for k, (url, schema) in enumerate(plain[1:], 1):
        for field in schema:
            i = running.get_field_index(field.name)
            if i < 0 or _merge(running.field(i).type, field.type):
                continue
            steps, t1, t2 = _conflict([field.name], running.field(i).type, field.type)
            other = "earlier files"
            for earlier_url, earlier in plain[:k]:  # name the first file that disagrees
                t = _type_at(earlier, steps)
                if t is not None and not _merge(t, t2):
                    other, t1 = earlier_url, t
                    break
            name = "".join(s if s == "[]" else f".{s}" for s in steps)[1:]
            raise InputError(
                f"column '{name}' is {t1} in {other} but {t2} in {url}; "
                f"make the types agree or convert the files separately", path=url)
        running = pa.unify_schemas([running, schema], promote_options="permissive")


def _merge(a: pa.DataType, b: pa.DataType) -> bool:
    try:
        pa.unify_schemas([pa.schema([("x", a)]), pa.schema([("x", b)])],
                         promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError):
        return False
    return True


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _conflict(steps: list[str], a: pa.DataType,
              b: pa.DataType) -> tuple[list[str], pa.DataType, pa.DataType]:
    """Descend into structs and lists to the innermost pair of types that do not unify."""
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        for field in b:
            i = a.get_field_index(field.name)
            if i >= 0 and not _merge(a.field(i).type, field.type):
                return _conflict([*steps, field.name], a.field(i).type, field.type)
    if _is_list(a) and _is_list(b) and not _merge(a.value_type, b.value_type):
        return _conflict([*steps, "[]"], a.value_type, b.value_type)
    return steps, a, b


def _type_at(schema: pa.Schema, steps: list[str]) -> pa.DataType | None:
    i = schema.get_field_index(steps[0])
    t = schema.field(i).type if i >= 0 else None
    for step in steps[1:]:
        if t is None:
            return None
        if step == "[]":
            t = t.value_type if _is_list(t) else None
        elif pa.types.is_struct(t) and t.get_field_index(step) >= 0:
            t = t.field(step).type
        else:
            t = None
    return t


def conform_batch(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.RecordBatch | pa.Table:
    """Cast ``batch`` to ``schema`` (from :func:`unify_schemas`): reorder, cast, add null columns.

    Works on record batches and tables alike (and returns the same kind).

    >>> b = pa.record_batch({"y": ["a"], "x": pa.array([1], pa.int32())})
    >>> schema = pa.schema([("x", pa.int64()), ("y", pa.string()), ("z", pa.bool_())])
    >>> conform_batch(b, schema).to_pylist()
    [{'x': 1, 'y': 'a', 'z': None}]
    """
    if batch.schema.equals(schema):
        return batch
    extra = set(batch.schema.names) - set(schema.names)
    if extra:
        raise ValueError(f"batch has columns {sorted(extra)} that the schema lacks")
    if not schema:
        return batch.select([])  # keeps num_rows, which from_arrays([]) would lose
    columns = []
    for field in schema:
        i = batch.schema.get_field_index(field.name)
        if i < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
        else:
            column = batch.column(i)
            columns.append(column if column.type == field.type else column.cast(field.type))
    make = pa.Table if isinstance(batch, pa.Table) else pa.RecordBatch
    return make.from_arrays(columns, schema=schema)
