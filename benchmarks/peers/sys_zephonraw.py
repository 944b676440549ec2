"""Zephon, uncompressed: the same library as ``sys_zephon``, shards written with
``WriteOptions(compression="none")`` (every other option default).

The profile for local NVMe: no zstd to undo on every read, at several times the bytes on
disk (the same class as LitData's raw chunks and HF's Arrow files, which are uncompressed
too). Only the conversion differs; every read goes through the same code as ``sys_zephon``.
"""

from __future__ import annotations

from .sys_zephon import (  # noqa: F401  (the child looks these up on this module)
    dataloader,
    random_access,
    random_access_take,
    read,
    resume,
    resume_state,
    s3_read,
)


def convert(kind: str, inp: str, out: str, workers: int = 1) -> None:
    from zephon_store import convert as zconvert
    from zephon_store.write.shardwriter import WriteOptions

    zconvert([inp], out, workers=workers, progress=False,
             options=WriteOptions(compression="none"))
