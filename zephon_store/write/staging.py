"""The converter's staging: the job key, the job folder and its :class:`StagingArea`.

A conversion stages parsed inputs and per-shard receipts in a folder keyed by a hash of
its output, inputs and options (the "job"), so rerunning the same command after a crash
reuses them; a different input or option is a different job and never reuses stale work.

Where: ``OUT/.zephon-staging/<job>`` for a local output, else
``$ZEPHON_CACHE_DIR/staging/<job>`` (or ``staging_dir/<job>``); when tasks run on other hosts
(Ray) and the output is remote, ``OUT/.zephon-staging/<job>`` on the object store. A job folder is only used
under the output's lock (:mod:`zephon_store.write.lock`) and holds ``.active`` flock-ed while a
convert runs in it, so ``zephon cache clear`` never removes a live one. Every temp file in it
carries the writing process's pid and a random part. A finished job's folder is first renamed
to ``.<job>.trash.<pid>`` and then removed, so a crash during cleanup never leaves a
half-deleted folder that a rerun would take for staged work.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import uuid
from dataclasses import asdict, is_dataclass

import numpy as np
import pyarrow as pa

from .. import __version__
from .._util.atomic import atomic_write
from .._util.hashing import xxh3_hex
from ..format.manifest import canonical_json
from ..ingest.options import input_stamp
from ..io.storage import Storage, is_local_url, retry_policy

STAGING_DIRNAME = ".zephon-staging"
_ACTIVE = ".active"
_OWNER = "output.json"
_TRASH = ".trash."


def job_desc(files, options, input_options, parse_fn, extra) -> dict:
    """What a conversion's output is a pure function of: each input's URL, size, format and
    stamp (:func:`~zephon_store.ingest.options.input_stamp`: a local file's mtime, an
    object's ETag, so an input edited in place is never taken for done), the writer and input
    options, the parse function, ``extra_manifest`` and this version of zephon."""
    return {
        "inputs": [[f.url, f.size, f.kind, f.compression, input_stamp(f)] for f in files],
        "write": options.to_dict(),
        "input": asdict(input_options) if is_dataclass(input_options) else repr(input_options),
        "parse": f"{parse_fn.__module__}.{getattr(parse_fn, '__qualname__', repr(parse_fn))}",
        "extra": extra,
        "zephon": __version__,
    }


def job_key(files, options, input_options, parse_fn, extra, output: str = "") -> str:
    """The staging folder's name: :func:`job_desc` plus the output (two outputs of the same
    inputs stage apart; S3 outputs share the user cache)."""
    desc = {**job_desc(files, options, input_options, parse_fn, extra), "output": output}
    return xxh3_hex(canonical_json(desc))[:16]


def job_dir(output: str, out: Storage, job: str, base: str | None) -> str:
    """Where a job stages: ``base/<job>``, else inside a local output, else the user cache."""
    if base:
        return os.path.join(base, job)
    if out.local:
        return os.path.join(out.root_url, STAGING_DIRNAME, job)
    return os.path.join(staging_root(), job)


def job_area(out: Storage, job: str, base: str | None, *, shared_hosts: bool) -> StagingArea:
    """The :class:`StagingArea` of ``job``: as :func:`job_dir`, except that when tasks may run
    on other hosts (``shared_hosts``) and the output is remote, the job stages beside the
    output (``OUT/.zephon-staging/<job>``), where every host reaches it and a rerun from any
    host finds the finished work."""
    if shared_hosts and not base and not out.local:
        return StagingArea(out.url(f"{STAGING_DIRNAME}/{job}"), out.storage_options)
    return StagingArea(job_dir(out.root_url, out, job, base))


def temp_name(path: str) -> str:
    """A name beside ``path`` no other process or thread uses: ``path.<pid>.<random>.tmp``."""
    return f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


def read_json(path: str):
    """The staged JSON at ``path``, or None when it is absent or unreadable (redo the work)."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def atomic_write_json(path: str, obj) -> None:
    """``obj`` as sorted-key JSON at ``path``, written by :func:`~zephon_store._util.atomic.atomic_write`."""
    atomic_write(path, json.dumps(obj, sort_keys=True).encode())


# -- the staging area ------------------------------------------------------------------------

class StagingArea:
    """One job's staging: a local folder or a prefix on an object store, by relative paths.

    Stage functions run in worker processes (or on other hosts) and see the job only through
    this object, which pickles to a few strings. Files are written to a local scratch path
    first (:meth:`scratch`), then published whole (:meth:`put`): a rename beside the target
    locally, one PUT on an object store; a reader never sees half a file.

    >>> area = StagingArea(tmp + "/job")
    >>> area.write_json("parsed/000000.json", {"rows": 3})
    >>> area.read_json("parsed/000000.json"), area.read_json("parsed/missing.json")
    ({'rows': 3}, None)
    >>> area.save_npy("parsed/000000.sizes.npy", np.arange(3))
    >>> area.load_npy("parsed/000000.sizes.npy").tolist(), area.exists("parsed/000000.sizes.npy")
    ([0, 1, 2], True)
    """

    def __init__(self, root: str, storage_options: dict | None = None) -> None:
        self.root = root
        self.storage_options = storage_options
        self.local = is_local_url(root)
        if self.local:
            self.root = os.path.abspath(root.removeprefix("file://"))
        self._storage: Storage | None = None

    def __getstate__(self) -> dict:
        return {"root": self.root, "storage_options": self.storage_options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"], state["storage_options"])

    def __repr__(self) -> str:
        return f"StagingArea({self.root!r})"

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            self._storage = shared_storage(self.root, self.storage_options)
        return self._storage

    @property
    def ipc_options(self) -> pa.ipc.IpcWriteOptions | None:
        """How staged Arrow files are written: plain locally (memory-mapped without a copy),
        zstd-compressed on an object store, where every staged byte is a PUT and later GETs
        (text compresses 3-5x; the shards written from it are the same either way)."""
        return None if self.local else pa.ipc.IpcWriteOptions(compression="zstd")

    def path(self, rel: str) -> str:
        """The local path of ``rel`` (local areas only)."""
        if not self.local:
            raise ValueError(f"{self.root} is remote: {rel} has no local path")
        return os.path.join(self.root, rel)

    def exists(self, rel: str) -> bool:
        if self.local:
            return os.path.exists(self.path(rel))
        return self.storage.exists(rel)

    def read_json(self, rel: str):
        """The JSON at ``rel``, or None when it is absent or unreadable (redo the work)."""
        if self.local:
            return read_json(self.path(rel))
        try:
            return json.loads(self.storage.read_file(rel))
        except (FileNotFoundError, ValueError):
            return None

    def write_json(self, rel: str, obj) -> None:
        """``obj`` as sorted-key JSON at ``rel``, published at once."""
        if self.local:
            atomic_write_json(self.path(rel), obj)
        else:
            self.storage.write_atomic(rel, json.dumps(obj, sort_keys=True).encode())

    def scratch(self, rel: str) -> str:
        """A local path no other process uses, to write ``rel`` into before :meth:`put`."""
        if self.local:
            os.makedirs(os.path.dirname(self.path(rel)), exist_ok=True)
            return temp_name(self.path(rel))
        from .scratch import scratch_dir

        # This process's own locked folder in the system temp folder: what a killed run
        # leaves there, `zephon cache clear` removes, never a live process's (write/scratch.py).
        return temp_name(os.path.join(scratch_dir(), rel.replace("/", "-")))

    def put(self, rel: str, local_path: str) -> None:
        """Publish the scratch file ``local_path`` at ``rel`` (it is moved, not copied)."""
        if self.local:
            os.replace(local_path, self.path(rel))
        else:
            self.storage.write_file_from_local(rel, local_path, move=True)

    def save_npy(self, rel: str, array: np.ndarray) -> None:
        tmp = self.scratch(rel) + ".npy"  # np.save appends .npy to other names
        np.save(tmp, array)
        self.put(rel, tmp)

    def load_npy(self, rel: str) -> np.ndarray:
        if self.local:
            return np.load(self.path(rel))
        return np.load(io.BytesIO(self.storage.read_file(rel)))

    def open_arrow(self, rel: str) -> pa.ipc.RecordBatchFileReader:
        """The Arrow IPC file at ``rel``: memory-mapped locally; remotely read through a
        buffer of :data:`~zephon_store.ingest.source.BLOCK_BYTES` over retried ranged GETs, so
        a task fetches only the batches it uses, in a few requests (Arrow's own reads are
        one per buffer: hundreds of tiny GETs per batch without it)."""
        if self.local:
            return pa.ipc.open_file(pa.memory_map(self.path(rel)))
        from ..ingest.source import BLOCK_BYTES, RangedReader

        st = self.storage
        reader = RangedReader(lambda a, b: st.read_range(rel, a, b), st.size(rel),
                              url=st.url(rel), policy=retry_policy(self.storage_options))
        return pa.ipc.open_file(pa.PythonFile(io.BufferedReader(reader, BLOCK_BYTES), mode="r"))

    # -- the job's life ------------------------------------------------------------------------
    def open_job(self, output: str) -> int | None:
        """Create the job for ``output``; locally mark it active (see :func:`open_job`)."""
        if self.local:
            return open_job(self.root, output)
        if self.read_json(_OWNER) is None:
            self.write_json(_OWNER, {"output": output})
        return None

    def remove_stale_jobs(self, output: str) -> int:
        """Remove the other jobs of ``output`` beside this one (under the output's lock)."""
        if self.local:
            return remove_stale_jobs(self.root, output)
        parent_url, name = self.root.rstrip("/").rsplit("/", 1)
        parent = Storage(parent_url, storage_options=self.storage_options)
        removed = 0
        for rel in parent.listdir():
            if rel != name:  # OUT/.zephon-staging holds only this output's jobs
                _remove_remote_tree(Storage(parent.url(rel),
                                            storage_options=self.storage_options))
                removed += 1
        return removed

    def present(self) -> bool:
        """Whether this job's folder exists (a killed run left it), whatever it holds."""
        if self.local:
            return os.path.isdir(self.root)
        return bool(self.storage.listdir(""))

    def holds_work(self) -> bool:
        """Whether an input was staged complete here (``parsed/<index>.json``): work a rerun
        reuses. A job that staged none is not worth keeping after a failure."""
        try:
            return any(name.endswith(".json") for name in os.listdir(self.path("parsed")))
        except OSError:
            return False

    def finish_job(self, fd: int | None) -> None:
        """Remove the finished job (see :func:`finish_job`)."""
        if self.local:
            finish_job(self.root, fd)
        else:
            _remove_remote_tree(self.storage)


def _remove_remote_tree(st: Storage) -> None:
    """Delete every object under ``st``'s root: one recursive listing, then bulk deletes
    (S3 DeleteObjects takes 1,000 keys a request). Best effort: the manifest is already
    published, and what a failure leaves is removed by the next convert into this output."""
    import logging

    fs = st.fs
    try:
        paths = fs.find(fs._strip_protocol(st.root_url))
        if paths:
            fs.rm(paths)
    except OSError as exc:
        logging.getLogger(__name__).warning(
            "could not remove the staging %s (%s); the next convert into this output does",
            st.root_url, exc)


_STORAGES: dict[tuple, Storage] = {}


def shared_storage(root: str, storage_options: dict | None) -> Storage:
    """One :class:`~zephon_store.io.storage.Storage` per process, root and options.

    Tasks arrive pickled, and each fresh ``Storage`` opens its own object-store client (a
    session and new connections: most of a small task's time on S3); a worker process
    reuses the one it already has.
    """
    key = (os.getpid(), root, json.dumps(storage_options or {}, sort_keys=True, default=repr))
    st = _STORAGES.get(key)
    if st is None:
        st = _STORAGES.setdefault(key, Storage(root, storage_options=storage_options))
    return st


# -- the job folder -------------------------------------------------------------------------

def open_job(path: str, output: str) -> int:
    """Create the job folder ``path`` for ``output`` and mark it active; returns the marker's
    fd (its ``flock`` lasts as long as this process holds it: :func:`finish_job` or death)."""
    import fcntl

    for sub in ("parsed", "done", "tmp"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    owner = os.path.join(path, _OWNER)
    if not os.path.exists(owner):
        atomic_write_json(owner, {"output": output})
    fd = os.open(os.path.join(path, _ACTIVE), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _owner_of(job: str) -> str | None:
    doc = read_json(os.path.join(job, _OWNER))
    return doc.get("output") if isinstance(doc, dict) else None


def _remove_tree(path: str) -> None:
    """Rename ``path`` out of the way (one atomic step), then delete it."""
    parent, name = os.path.split(path)
    trash = os.path.join(parent, f".{name.lstrip('.')}{_TRASH}{os.getpid()}.{uuid.uuid4().hex[:6]}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _rmdir_if_empty(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def remove_stale_jobs(job_path: str, output: str) -> int:
    """Delete the other job folders of ``output`` (other option sets, killed cleanups) beside
    ``job_path``; only call it under the output's lock. Returns how many were removed."""
    from .lock import is_locked

    parent = os.path.dirname(job_path)
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return 0
    in_output = os.path.basename(parent) == STAGING_DIRNAME  # OUT/.zephon-staging: all ours
    removed = 0
    for name in names:
        path = os.path.join(parent, name)
        if path == job_path or not os.path.isdir(path):
            continue
        if is_locked(os.path.join(path, _ACTIVE)):
            continue  # a live process: another output's job, or a cleanup still running
        if in_output or _TRASH in name or _owner_of(path) == output:
            _remove_tree(path)
            removed += 1
    return removed


def finish_job(job_path: str, fd: int | None) -> None:
    """Remove a finished job's folder (and ``.zephon-staging/`` itself once it is empty)."""
    _remove_tree(job_path)
    if fd is not None:
        os.close(fd)
    parent = os.path.dirname(job_path)
    if os.path.basename(parent) == STAGING_DIRNAME:
        _rmdir_if_empty(parent)


def staging_root(directory: str | None = None) -> str:
    """Where jobs of remote outputs stage: ``<cache dir>/staging``."""
    from ..io.cache import default_cache_dir

    return os.path.join(directory or default_cache_dir(), "staging")


def staging_info(directory: str | None = None) -> dict:
    """``{"staging_dir", "staging_jobs", "staging_bytes"}`` of the cache's staging folder."""
    root = staging_root(directory)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        names = []
    return {"staging_dir": root, "staging_jobs": len(names),
            "staging_bytes": sum(_tree_bytes(os.path.join(root, n)) for n in names)}


def staging_clear(directory: str | None = None) -> dict:
    """Remove every staged job in the cache not in use by a running convert.

    Returns ``{"cleared_staging_jobs", "cleared_staging_bytes", "staging_in_use"}``.
    """
    from .lock import is_locked

    root = staging_root(directory)
    cleared, freed, busy = 0, 0, 0
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if is_locked(os.path.join(path, _ACTIVE)):
                busy += 1
                continue
            freed += _tree_bytes(path)
            _remove_tree(path)
            cleared += 1
    return {"cleared_staging_jobs": cleared, "cleared_staging_bytes": freed,
            "staging_in_use": busy}


def _tree_bytes(path: str) -> int:
    size = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(dirpath, f)).st_size
    return size
