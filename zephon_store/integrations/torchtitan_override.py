"""TorchTitan override that swaps the training dataloader for :class:`ZephonDataLoader`.

No config edits: activate it on any TorchTitan command line (the validator keeps its loader)::

    torchrun ... -m torchtitan.train --module llama3 --config llama3_debugmodel \\
        --override.imports 'zephon_store.integrations.torchtitan_override.use_zephon={"dataset": "/data/ds", "seed": 7}'

The keyword arguments are :class:`ZephonDataLoader.Config` fields. Without ``dataset`` the
URL comes from ``$ZEPHON_DATASET``, else ``--dataloader.dataset_path``, else
``--dataloader.dataset`` when it is a string that looks like a path or URL rather than a
TorchTitan dataset name (TorchTitan main's ``GrainDataLoader.Config.dataset`` is a dataset
graph, never a URL). ``num_workers`` and ``infinite`` are carried over from the replaced config
unless given; from TorchTitan main's ``GrainDataLoader.Config``, its ``repeat`` becomes
``infinite``.
"""

from __future__ import annotations

import dataclasses
import os

from torchtitan.config import override

from .torchtitan import DATASET_ENV, BaseDataLoader, ZephonDataLoader

__all__ = ["use_zephon"]

# (field of the replaced config, ZephonDataLoader.Config field): 0.3.0's HF loader has the
# first two; main's GrainDataLoader says ``repeat`` for what zephon calls ``infinite``.
_CARRIED = (("num_workers", "num_workers"), ("infinite", "infinite"), ("repeat", "infinite"))


def _dataset_from(cfg) -> str:
    env = os.environ.get(DATASET_ENV, "")
    if env:
        return env
    path = getattr(cfg, "dataset_path", None)
    if path:
        return path
    name = getattr(cfg, "dataset", "") or ""
    if not isinstance(name, str):   # main: a Grain dataset graph (DatasetConfig), no URL
        return ""
    # "c4_test" names a TorchTitan registry entry; "/data/ds" or "s3://b/ds" is ours.
    if "/" in name or "://" in name or os.path.isdir(name):
        return name
    return ""


@override(target=BaseDataLoader.Config, fqns=["dataloader"],
          description="zephon_store: elastic, replicated-cursor dataloader")
def use_zephon(cfg, **fields) -> ZephonDataLoader.Config:
    """Replace the trainer's ``dataloader`` config by a :class:`ZephonDataLoader.Config`."""
    valid = {f.name for f in dataclasses.fields(ZephonDataLoader.Config)}
    unknown = sorted(set(fields) - valid)
    if unknown:
        raise TypeError(f"use_zephon: unknown ZephonDataLoader.Config field(s) {unknown}; valid: "
                        f"{sorted(valid)}")
    if isinstance(cfg, ZephonDataLoader.Config):
        return dataclasses.replace(cfg, **fields)
    for theirs, ours in _CARRIED:
        if ours not in fields and hasattr(cfg, theirs):
            fields[ours] = getattr(cfg, theirs)
    if fields.get("mixture"):       # a mixture file instead of one dataset
        fields.setdefault("dataset", "")
    elif not fields.get("dataset"):
        fields["dataset"] = _dataset_from(cfg)
    if not fields["dataset"] and not fields.get("mixture"):
        raise ValueError(
            "use_zephon: no dataset given; pass it as --override.imports "
            "'zephon_store.integrations.torchtitan_override.use_zephon={\"dataset\": \"URL\"}', "
            f"export {DATASET_ENV}=URL, or pass --dataloader.dataset_path URL")
    return ZephonDataLoader.Config(**fields)
