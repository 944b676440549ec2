"""Zephon: content-hashed Parquet shards, a global sample manifest, and an elastically
deterministic loader whose sample order does not depend on how many machines read it.

>>> import zephon_store as z                                   # doctest: +SKIP
>>> z.convert(["corpus/*.jsonl.zst"], "/data/ds", workers=4)   # doctest: +SKIP
>>> ds = z.open_dataset("/data/ds")                            # doctest: +SKIP
>>> ds.take([0, 17, 42]).to_pylist()                           # doctest: +SKIP

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
    ManifestError,
    MissingExtraError,
    OutputExistsError,
    OutputLockedError,
    RetriesExhaustedError,
    SeqOutOfRangeError,
    ShardNotFoundError,
    StateMismatchError,
    StorageError,
    StorageOptionsError,
    UnsafePathError,
    ZephonError,
)

__all__ = [
    "__version__",
    "convert",
    "open_dataset",
    "verify",
    "gc",
    "RetryPolicy",
    "WriteOptions",
    "InputOptions",
    "OrderOptions",
    "ZephonError",
    "AccessDeniedError",
    "DiskFullError",
    "InputError",
    "InputNotFoundError",
    "IntegrityError",
    "ManifestError",
    "MissingExtraError",
    "OutputExistsError",
    "OutputLockedError",
    "RetriesExhaustedError",
    "SeqOutOfRangeError",
    "ShardNotFoundError",
    "StateMismatchError",
    "StorageError",
    "StorageOptionsError",
    "UnsafePathError",
]

_LAZY = {
    "convert": ("converter", "convert"),
    "open_dataset": ("reader", "open_dataset"),
    "verify": ("verify", "verify"),
    "gc": ("gc", "gc"),
    "RetryPolicy": ("retry", "RetryPolicy"),
    "WriteOptions": ("shardwriter", "WriteOptions"),
    "InputOptions": ("ingest", "InputOptions"),
    "OrderOptions": ("order", "OrderOptions"),
}


def __getattr__(name: str):
    # Lazy so `import zephon_store` stays cheap and free of optional dependencies.
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(f"module 'zephon_store' has no attribute {name!r}")
