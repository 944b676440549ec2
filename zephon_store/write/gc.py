"""Orphans: files under ``shards/`` and ``index/`` that the manifest does not reference.

They are left by a convert that was killed and then run with other options, by a convert
into an output that held another dataset before ``--overwrite`` existed, or by hand. They
are harmless to readers (nothing names them) but cost storage. ``verify`` reports them as
warnings (``kind: "orphan"``); :func:`gc` removes them, under the output's lock so it never
runs while a convert is writing shards its coming manifest will name.

Only files named as a conversion names them (``shards/<hash>.parquet``,
``index/<hash>.arrow``) are ever removed; anything else there (a folder, a user's notes, a
link) is skipped and reported, never deleted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .._util.progress import progress_bar
from ..errors import ManifestError
from ..format.manifest import (
    INDEX_DIR,
    MANIFEST_NAME,
    SHARD_DIR,
    is_dataset_file_name,
    load_manifest,
)
from ..io.storage import Storage
from .lock import output_lock


@dataclass
class GcResult:
    """What :func:`gc` removed (or, with ``dry_run``, would remove), and what it left alone
    under ``shards/`` and ``index/`` because no conversion writes such a name (``skipped``);
    ``to_dict()`` is the CLI's ``--json`` output."""

    url: str
    dry_run: bool
    removed: list[str] = field(default_factory=list)
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def gc(url: str, *, dry_run: bool = False, storage_options: dict | None = None,
       progress: bool | None = False) -> GcResult:
    """Remove the orphans of the dataset at ``url``; with ``dry_run`` only list them.
    ``progress``: a bar of the files removed on stderr (None: when it is a terminal).

    Takes the output's lock (:class:`~zephon_store.errors.OutputLockedError` while a convert
    runs, or when the lock is lost before the first delete) and needs a manifest that loads
    (``ManifestError`` otherwise: without it every file would look unreferenced).

    >>> import os, shutil
    >>> ds = shutil.copytree(tiny_dataset, os.path.join(tmp, "ds"))
    >>> orphan = os.path.join(ds, "shards", "ab" * 16 + ".parquet")
    >>> open(orphan, "wb").close()
    >>> os.mkdir(os.path.join(ds, "shards", "notes"))   # not a name zephon writes: kept
    >>> r = gc(ds, dry_run=True)   # a URL works too: gc("s3://bucket/ds")
    >>> r.removed, r.skipped
    (['shards/abababababababababababababababab.parquet'], ['shards/notes'])
    >>> gc(ds).removed == r.removed, os.path.exists(orphan)
    (True, False)
    """
    st = Storage(url, storage_options=storage_options)
    if not st.exists(MANIFEST_NAME):
        raise ManifestError(f"{st.url(MANIFEST_NAME)} not found: gc only cleans a published "
                            "dataset (without a manifest every file would look unreferenced)")
    with output_lock(st, command="gc") as lock:
        kept = load_manifest(st).referenced_paths()
        files = {**st.sizes(SHARD_DIR), **st.sizes(INDEX_DIR)}
        result = GcResult(url=st.root_url, dry_run=dry_run)
        for rel in (r for sub in (SHARD_DIR, INDEX_DIR) for r in st.listdir(sub)):
            if rel in kept:
                continue
            if rel in files and is_dataset_file_name(rel):
                result.removed.append(rel)
                result.bytes += files[rel]
            else:
                result.skipped.append(rel)
        if not dry_run and result.removed:
            lock.check("removing orphans (nothing was removed)")
            with progress_bar(progress, len(result.removed), "gc", unit="file") as bar:
                for rel in result.removed:
                    st.delete(rel)
                    bar.update(1)
    return result


__all__ = ["GcResult", "gc"]
