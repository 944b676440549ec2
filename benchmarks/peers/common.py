"""Shared helpers of the peer benchmark: paths, batch sizes, payload counting, imports."""

from __future__ import annotations

import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(ROOT, ".bench", "peers")
# System keys have no "_": run.py names extra cases "<system>_<variant>" (zephon_w2).
SYSTEMS = ("pyarrow", "zephon", "zephonraw", "mosaic", "litdata", "hf")
# The Zephon profiles: default WriteOptions (zstd) and compression="none" (sys_zephonraw).
ZEPHONS = ("zephon", "zephonraw")
LABELS = {"pyarrow": "raw pyarrow", "zephon": "Zephon", "zephonraw": "Zephon, uncompressed",
          "mosaic": "MosaicML Streaming", "litdata": "LitData", "hf": "HF datasets"}
# Samples per batch: 256 documents of text, 32 windows of 2049 tokens (~256 KiB), as in
# benchmarks/bench_loader.py.
BATCH = {"text": 256, "tokens": 32}
# The per-rank batch of the "_b8" read metrics: a training rank's batch is often 4-16
# samples, where the loader's per-step cost shows (issue 19).
SMALL_BATCH = 8
SEED = 0

# Offline and quiet: no timed section may wait on a version check or a hub request.
os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def import_streaming():
    """``import streaming`` (MosaicML) without torchvision.

    ``streaming/__init__.py`` imports ``streaming.vision``, which imports torchvision; the
    PyPI torchvision wheel is a CUDA build that cannot load against CPU torch (see
    setup_env.sh). Nothing here uses the vision datasets, so an empty module stands in.
    """
    if "streaming.vision" not in sys.modules:
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    import streaming

    return streaming


def count(batch, kind: str) -> int:
    """Samples in a batch dict (column -> list / array / tensor)."""
    col = batch["text"] if kind == "text" else batch["tokens"]
    return len(col)


def vm_kb(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmHWM: peak RSS, VmRSS: current)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    try:
        return v(dist)
    except PackageNotFoundError:
        return "not installed"
