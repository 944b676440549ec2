"""Orphans: files under ``shards/`` and ``index/`` that the manifest does not reference.

They are left by a convert that was killed and then run with other options, by a convert
into an output that held another dataset before ``--overwrite`` existed, or by hand. They
are harmless to readers (nothing names them) but cost storage. ``verify`` reports them as
warnings (``kind: "orphan"``); :func:`gc` removes them, under the output's lock so it never
runs while a convert is writing shards its coming manifest will name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import ManifestError
from ..format.manifest import MANIFEST_NAME, load_manifest
from ..io.storage import Storage
from .lock import output_lock


@dataclass
class GcResult:
    """What :func:`gc` removed (or, with ``dry_run``, would remove); ``to_dict()`` is the CLI's
    ``--json`` output."""

    url: str
    dry_run: bool
    removed: list[str] = field(default_factory=list)
    bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def gc(url: str, *, dry_run: bool = False, storage_options: dict | None = None) -> GcResult:
    """Remove the orphans of the dataset at ``url``; with ``dry_run`` only list them.

    Takes the output's lock (:class:`~zephon_store.errors.OutputLockedError` while a convert
    runs) and needs a manifest that loads (``ManifestError`` otherwise: without it every file
    would look unreferenced).

    >>> import os, shutil
    >>> ds = shutil.copytree(tiny_dataset, os.path.join(tmp, "ds"))
    >>> open(os.path.join(ds, "shards", "orphan.parquet"), "wb").close()
    >>> gc(ds, dry_run=True).removed   # a URL works too: gc("s3://bucket/ds")
    ['shards/orphan.parquet']
    >>> gc(ds).removed, os.path.exists(os.path.join(ds, "shards", "orphan.parquet"))
    (['shards/orphan.parquet'], False)
    """
    st = Storage(url, storage_options=storage_options)
    if not st.exists(MANIFEST_NAME):
        raise ManifestError(f"{st.url(MANIFEST_NAME)} not found: gc only cleans a published "
                            "dataset (without a manifest every file would look unreferenced)")
    with output_lock(st, command="gc"):
        orphans = load_manifest(st).unreferenced(st.listdir)
        result = GcResult(url=st.root_url, dry_run=dry_run, removed=orphans,
                          bytes=sum(st.size(rel) for rel in orphans))
        if not dry_run:
            for rel in orphans:
                st.delete(rel)
    return result


__all__ = ["GcResult", "gc"]
