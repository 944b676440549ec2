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
    InputError,
    InputNotFoundError,
    IntegrityError,
    LiveTopologyError,
    ManifestError,
    MissingExtraError,
    MixtureError,
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
    "ChunkCache": ("io.cache", "ChunkCache"),
    "DecodedDiskCache": ("read.decoded_disk", "DecodedDiskCache"),
    "CoalesceOptions": ("io.coalesce", "CoalesceOptions"),
    "Dataset": ("read.dataset", "Dataset"),
    "InputOptions": ("ingest.options", "InputOptions"),
    "LoaderState": ("load.state", "LoaderState"),
    "MixedDataset": ("load.mixed", "MixedDataset"),
    "MixtureSchedule": ("order.mixture", "MixtureSchedule"),
    "MixtureSpec": ("format.mixture_file", "MixtureSpec"),
    "Order": ("order.order", "Order"),
    "OrderOptions": ("order.order", "OrderOptions"),
    "PackingOptions": ("write.packing", "PackingOptions"),
    "RetryPolicy": ("io.retry", "RetryPolicy"),
    "Topology": ("order.topology", "Topology"),
    "WriteOptions": ("write.shardwriter", "WriteOptions"),
    "cache_clear": ("io.cache", "cache_clear"),
    "audit_stream": ("load.audit", "audit_stream"),
    "cache_info": ("io.cache", "cache_info"),
    "check_state": ("load.state", "check_state"),
    "convert": ("write.convert", "convert"),
    "gc": ("write.gc", "gc"),
    "load_mixture_file": ("format.mixture_file", "load_mixture_file"),
    "open_dataset": ("read.dataset", "open_dataset"),
    "open_mixture": ("load.mixed", "open_mixture"),
    "verify": ("read.verify", "verify"),
}

__all__ = [
    "AccessDeniedError",
    "ChunkCache",
    "CoalesceOptions",
    "Dataset",
    "DecodedDiskCache",
    "DiskFullError",
    "InputError",
    "InputNotFoundError",
    "InputOptions",
    "IntegrityError",
    "LiveTopologyError",
    "LoaderState",
    "ManifestError",
    "MissingExtraError",
    "MixedDataset",
    "MixtureError",
    "MixtureSchedule",
    "MixtureSpec",
    "Order",
    "OrderOptions",
    "OutputExistsError",
    "OutputLockedError",
    "PackingOptions",
    "RayAddressError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "SeqOutOfRangeError",
    "ShardNotFoundError",
    "SourceExhaustedError",
    "StateMismatchError",
    "StorageError",
    "StorageOptionsError",
    "Topology",
    "UnsafePathError",
    "WorkerLostError",
    "WriteOptions",
    "ZephonError",
    "__version__",
    "audit_stream",
    "cache_clear",
    "cache_info",
    "check_state",
    "convert",
    "gc",
    "load_mixture_file",
    "open_dataset",
    "open_mixture",
    "verify",
]


def __getattr__(name: str):
    # Lazy so `import zephon_store` stays cheap and free of optional dependencies.
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(f"module 'zephon_store' has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(__all__)
