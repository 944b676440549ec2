"""Zephon: content-hashed Parquet shards, a global sample manifest, and an elastically
deterministic loader whose sample order does not depend on how many machines read it.

>>> import os, zephon_store as z
>>> result = z.convert([tiny_jsonl], os.path.join(tmp, "ds"))   # or "corpus/*.jsonl.zst", "s3://..."
>>> ds = z.open_dataset(result.url)
>>> ds.take([0, 17, 42]).to_pylist()
[{'id': 0, 'text': 'record 0'}, {'id': 17, 'text': 'record 17'}, {'id': 42, 'text': 'record 42'}]

Importing the package imports neither torch nor s3fs; they load when first needed.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    AccessDeniedError,
    DiskFullError,
    DocumentNotFoundError,
    InputError,
    InputNotFoundError,
    IntegrityError,
    LiveTopologyError,
    ManifestError,
    MissingExtraError,
    MixtureError,
    NoDocumentTableError,
    OutputExistsError,
    OutputLockedError,
    RayAddressError,
    RetriesExhaustedError,
    SeqOutOfRangeError,
    ShardNotFoundError,
    SourceExhaustedError,
    StateMismatchError,
    StorageError,
    StorageOptionsError,
    UnsafePathError,
    WorkerLostError,
    ZephonError,
)

# The public API: every name a user needs, importable from here. Internal modules live in
# the layer folders (docs/design.md) and may move; these names do not.
_LAZY = {
    "AuditReport": ("runs.audit", "AuditReport"),
    "AuditRequestError": ("runs.audit", "AuditRequestError"),
    "BatchOptions": ("load.options", "BatchOptions"),
    "ChunkCache": ("io.cache", "ChunkCache"),
    "CoalesceOptions": ("io.coalesce", "CoalesceOptions"),
    "ConsumedStep": ("runs.audit", "ConsumedStep"),
    "Dataset": ("read.dataset", "Dataset"),
    "DecodedDiskCache": ("read.decoded_disk", "DecodedDiskCache"),
    "DenyList": ("load.denylist", "DenyList"),
    "Executor": ("write.executors", "Executor"),
    "FillReport": ("read.fill", "FillReport"),
    "InputFile": ("ingest.options", "InputFile"),
    "InputOptions": ("ingest.options", "InputOptions"),
    "InputStats": ("ingest.options", "InputStats"),
    "Loader": ("load.loader", "Loader"),
    "LoaderState": ("load.state", "LoaderState"),
    "LocalExecutor": ("write.executors", "LocalExecutor"),
    "MixedDataset": ("mix.mixed", "MixedDataset"),
    "MixturePlan": ("runs.plan_mixture", "MixturePlan"),
    "MixtureSchedule": ("order.mixture", "MixtureSchedule"),
    "MixtureSpec": ("format.mixture_file", "MixtureSpec"),
    "Order": ("order.order", "Order"),
    "OrderOptions": ("order.order", "OrderOptions"),
    "PackingOptions": ("write.packing", "PackingOptions"),
    "ReadAheadOptions": ("load.options", "ReadAheadOptions"),
    "RetryPolicy": ("io.retry", "RetryPolicy"),
    "RunContext": ("runs.accounting", "RunContext"),
    "RunSegment": ("load.runlog", "RunSegment"),
    "Source": ("read.source", "Source"),
    "SourceOptions": ("load.options", "SourceOptions"),
    "StopOptions": ("load.options", "StopOptions"),
    "Storage": ("io.storage", "Storage"),
    "Topology": ("order.topology", "Topology"),
    "WorkerOptions": ("load.options", "WorkerOptions"),
    "WriteOptions": ("write.shardwriter", "WriteOptions"),
    "as_numpy": ("load.options", "as_numpy"),
    "audit_run": ("runs.audit", "audit_run"),
    "audit_stream": ("runs.audit", "audit_stream"),
    "cache_clear": ("io.cache", "cache_clear"),
    "cache_info": ("io.cache", "cache_info"),
    "check_state": ("load.state", "check_state"),
    "conform_batch": ("ingest.schema", "conform_batch"),
    "convert": ("write.convert", "convert"),
    "expand_inputs": ("ingest.files", "expand_inputs"),
    "fill_decoded_cache": ("read.fill", "fill_decoded_cache"),
    "gc": ("write.gc", "gc"),
    "load_deny_list": ("load.denylist", "load_deny_list"),
    "load_mixture_file": ("format.mixture_file", "load_mixture_file"),
    "make_executor": ("write.engines", "make_executor"),
    "mixture_info": ("runs.plan_mixture", "mixture_info"),
    "open_dataset": ("read.dataset", "open_dataset"),
    "open_documents": ("read.documents", "open_documents"),
    "open_mixture": ("load.source", "open_mixture"),
    "open_source": ("load.source", "open_source"),
    "packing_convert_kwargs": ("write.packing", "packing_convert_kwargs"),
    "plan_mixture": ("runs.plan_mixture", "plan_mixture"),
    "positions_for_participant": ("order.assign", "positions_for_participant"),
    "positions_for_rank": ("order.assign", "positions_for_rank"),
    "read_input": ("ingest.read", "read_input"),
    "read_run_log": ("load.runlog", "read_run_log"),
    "step_cursor": ("order.assign", "step_cursor"),
    "trace": ("runs.audit", "trace"),
    "unify_schemas": ("ingest.schema", "unify_schemas"),
    "verify": ("read.verify", "verify"),
    "where": ("runs.audit", "where"),
}

# The torch front ends, also in zephon_store.torch: reachable here, lazily, but left out of
# __all__ so that `from zephon_store import *` never imports torch (nor needs it installed).
_LAZY_TORCH = {
    "LiveZephonLoader": ("torch", "LiveZephonLoader"),
    "ZephonLoader": ("torch", "ZephonLoader"),
}

__all__ = [
    "AccessDeniedError",
    "AuditReport",
    "AuditRequestError",
    "BatchOptions",
    "ChunkCache",
    "CoalesceOptions",
    "ConsumedStep",
    "Dataset",
    "DecodedDiskCache",
    "DenyList",
    "DiskFullError",
    "DocumentNotFoundError",
    "Executor",
    "FillReport",
    "InputError",
    "InputFile",
    "InputNotFoundError",
    "InputOptions",
    "InputStats",
    "IntegrityError",
    "LiveTopologyError",
    "Loader",
    "LoaderState",
    "LocalExecutor",
    "ManifestError",
    "MissingExtraError",
    "MixedDataset",
    "MixtureError",
    "MixturePlan",
    "MixtureSchedule",
    "MixtureSpec",
    "NoDocumentTableError",
    "Order",
    "OrderOptions",
    "OutputExistsError",
    "OutputLockedError",
    "PackingOptions",
    "RayAddressError",
    "ReadAheadOptions",
    "RetriesExhaustedError",
    "RetryPolicy",
    "RunContext",
    "RunSegment",
    "SeqOutOfRangeError",
    "ShardNotFoundError",
    "Source",
    "SourceExhaustedError",
    "SourceOptions",
    "StateMismatchError",
    "StopOptions",
    "Storage",
    "StorageError",
    "StorageOptionsError",
    "Topology",
    "UnsafePathError",
    "WorkerLostError",
    "WorkerOptions",
    "WriteOptions",
    "ZephonError",
    "__version__",
    "as_numpy",
    "audit_run",
    "audit_stream",
    "cache_clear",
    "cache_info",
    "check_state",
    "conform_batch",
    "convert",
    "expand_inputs",
    "fill_decoded_cache",
    "gc",
    "load_deny_list",
    "load_mixture_file",
    "make_executor",
    "mixture_info",
    "open_dataset",
    "open_documents",
    "open_mixture",
    "open_source",
    "packing_convert_kwargs",
    "plan_mixture",
    "positions_for_participant",
    "positions_for_rank",
    "read_input",
    "read_run_log",
    "step_cursor",
    "trace",
    "unify_schemas",
    "verify",
    "where",
]

def __getattr__(name: str):
    # Lazy so `import zephon_store` stays cheap and free of optional dependencies.
    where = _LAZY.get(name) or _LAZY_TORCH.get(name)
    if where is not None:
        import importlib

        mod, attr = where
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(f"module 'zephon_store' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, *_LAZY_TORCH])
