"""The error tree of zephon_store.

Every error a user can hit derives from :class:`ZephonError`. The ones a caller is
expected to handle also inherit the matching built-in, so ``except FileNotFoundError``
keeps working (the pyarrow convention, ``ArrowInvalid(ValueError, ArrowException)``).
Messages say what was wrong, where, and what to do.
"""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of every error raised by zephon_store."""


class InputError(ZephonError, ValueError):
    """A raw input could not be read: malformed record, undecodable bytes, schema drift.

    Attributes name the input (``path``) and the 1-based ``line`` or 0-based ``row``
    when known.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 row: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.row = row


class InputNotFoundError(ZephonError, FileNotFoundError):
    """An input path, glob or URL matched nothing."""


class ManifestError(ZephonError, ValueError):
    """A manifest is missing, malformed, fails its schema, or names an unsafe shard path."""


class UnsafePathError(ManifestError):
    """A manifest names a shard outside the dataset root (``..``, absolute path, other URL)."""


class ShardNotFoundError(ZephonError, FileNotFoundError):
    """A shard named by the manifest is absent from storage."""


class IntegrityError(ZephonError, OSError):
    """Bytes read from storage do not match the hash the manifest records.

    Carries ``url``, ``expected`` and ``actual`` so a caller can report or retry.
    """

    def __init__(self, message: str, *, url: str | None = None, expected: str | None = None,
                 actual: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.expected = expected
        self.actual = actual


class StorageError(ZephonError, OSError):
    """A storage operation failed after its retries (or failed permanently: 403, 404)."""


class AccessDeniedError(StorageError, PermissionError):
    """Storage refused the request (403, bad signature, missing credentials); never retried."""


class SeqOutOfRangeError(ZephonError, IndexError):
    """A global sequence number lies outside ``[0, num_samples)``."""


class StateMismatchError(ZephonError, ValueError):
    """A loader checkpoint does not match the dataset or order options it is loaded into."""


class MissingExtraError(ZephonError, ImportError):
    """An optional dependency is needed; the message names the extra to install."""


def require(module: str, extra: str):
    """Import ``module`` or raise :class:`MissingExtraError` naming ``pip install zephon_store[extra]``.

    >>> np = require("numpy", "core")
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(
            f"{module} is not installed; install it with: pip install 'zephon_store[{extra}]'"
        ) from exc


class RetriesExhaustedError(StorageError):
    """A storage operation kept failing transiently until its retry budget ran out.

    Carries ``url`` (when known), ``attempts``, ``elapsed`` (seconds since the first attempt)
    and ``last_error``; the message names all of them and how to allow more time.
    """

    def __init__(self, message: str, *, url: str | None = None, attempts: int = 0,
                 elapsed: float = 0.0, last_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.attempts = attempts
        self.elapsed = elapsed
        self.last_error = last_error


class StorageOptionsError(ZephonError, ValueError):
    """``storage_options`` hold a key or value the storage backend does not accept."""


class OutputLockedError(ZephonError, RuntimeError):
    """Another convert (or gc) holds the output's lock; the message names its pid, host and
    start time, and the lock file to remove if that process is gone."""


class OutputExistsError(ZephonError, FileExistsError):
    """The output already holds a different dataset; pass ``overwrite=True`` to replace it."""


class RayAddressError(ZephonError, ConnectionError):
    """No Ray cluster answers at the address given (``ray_address=``, ``--ray-address``):
    malformed, a host that does not resolve, nothing listening, or not a Ray cluster.

    Raised within seconds, before Ray's own connect (which retries for minutes) and before
    anything is written. Carries ``address``, ``reason`` and ``malformed`` (a usage error).
    """

    def __init__(self, address: str, reason: str, *, malformed: bool = False) -> None:
        super().__init__(f"Ray address {address!r}: {reason}")
        self.address = address
        self.reason = reason
        self.malformed = malformed


class WorkerLostError(ZephonError, RuntimeError):
    """A conversion task's worker process or node died more often than it may be retried
    (Ray's ``WorkerCrashedError``, ``NodeDiedError``, ...). The finished tasks stay staged:
    rerunning the same command resumes. The message names the task and Ray's reason."""


class DenyListError(ZephonError, ValueError):
    """A deny list, its copy beside a run log, or a run log's ``deny_list`` entry is
    unreadable or malformed (load/denylist.py); the message names the file, and the key or
    line. The CLI exits 2."""


class DiskFullError(StorageError):
    """A local disk filled up (ENOSPC) while staging or writing; the message names the path.

    ``errno`` is ``errno.ENOSPC``, so ``except OSError`` code that checks it keeps working.
    """


class MixtureError(ZephonError, ValueError):
    """A mixture file or schedule is invalid (unknown source, weights not summing to 1 or
    negative, a stage starting in the past), or a mixture checkpoint does not match it.

    Messages name the file and key path (or the stage and source) and say what to change.
    """


class SourceExhaustedError(MixtureError):
    """A source capped by ``max_epochs`` ran out under the ``"error"`` exhaustion policy.

    Carries ``source`` (its name or index) and ``position`` (the first mixture position that
    would need a sample past the cap).
    """

    def __init__(self, message: str, *, source: str | int | None = None,
                 position: int | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.position = position


class LiveTopologyError(ZephonError, ValueError):
    """The participants of a live-elastic step disagree (cursor, count or index), or the
    commit counter moved in a way no quorum explains; nothing of the step was read. The
    message says which and what to do (``docs/live-elastic.md``)."""


class NoDocumentTableError(ZephonError, LookupError):
    """A dataset has no document table (format v6, packed data only): it holds unpacked
    records, or was packed by an older writer. The message names the dataset and says to
    re-convert with ``--tokenizer``."""


class DocumentNotFoundError(ZephonError, KeyError):
    """A document named by input and record, or by the xxh3 of its text, is not in a
    dataset's document table; the message names the reference and the dataset."""

    def __str__(self) -> str:   # KeyError quotes its argument; this is a sentence
        return str(self.args[0]) if self.args else ""
