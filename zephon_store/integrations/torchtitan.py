"""TorchTitan dataloader over a zephon dataset of packed token windows.

``ZephonDataLoader`` is a TorchTitan ``BaseDataLoader``: TorchTitan builds it from its config
(``ZephonDataLoader.Config``) and checkpoints it with the rest of the training state. Its
``state_dict()`` is the zephon loader state ``{version, dataset_id, seed, order, cursor, step}``
and nothing else: identical on every rank, with no ``dp_rank_N`` keys, so TorchTitan's DCP
checkpointer stores one copy and a run resumes on any data-parallel degree. TorchTitan's own
loaders store per-rank state and refuse a new degree.

Supported TorchTitan APIs, picked by what the trainer passes to ``build``:

- 0.3.0 (``components/dataloader.py``; tested): ``build(dp_world_size, dp_rank, tokenizer,
  seq_len, local_batch_size, ...)``; batches ``({"input", "positions"}: [B, L], labels)``.
- main after the Grain move (``components/data/loader.py``; tested at commit b5bcd76c by the
  optional ``make test-titan-main``): ``build(
  dp_world_size, dp_rank, tokenizer, max_context_length, num_tokens_per_batch)``; batches are
  flat token streams (see :mod:`zephon_store.integrations.titan_batches`).

Select it with ``--module zephon_store.integrations.torchtitan --config zephon_llama3_debug``
or with the override ``--override.imports zephon_store.integrations.torchtitan_override.use_zephon``
(docs/torchtitan.md). Needs the ``torchtitan`` extra.

>>> import os
>>> from zephon_store import convert
>>> from zephon_store.write.packing import PackingOptions, packing_convert_kwargs
>>> kw = packing_convert_kwargs(PackingOptions(tokenizer=tiny_tokenizer, seq_len=7))
>>> url = convert([tiny_jsonl], os.path.join(tmp, "ds"), **kw).url   # or "s3://b/ds"
>>> dl = ZephonDataLoader.Config(dataset=url, seed=7).build(
...     dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=7, local_batch_size=2)
>>> inputs, labels = next(iter(dl))
>>> inputs["input"].shape, labels.shape
(torch.Size([2, 7]), torch.Size([2, 7]))
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..errors import MissingExtraError, require

require("torch", "torch")
require("torchtitan", "torchtitan")

try:  # TorchTitan main (Grain era): components/data/loader.py owns BaseDataLoader.
    from torchtitan.components.data.loader import BaseDataLoader

    TORCHTITAN_API = "data"
except ImportError as _main_error:
    try:  # TorchTitan 0.3.0 (the last torchdata-based release)
        from torchtitan.components.dataloader import BaseDataLoader

        TORCHTITAN_API = "0.3"
    except ImportError as exc:
        raise MissingExtraError(
            "cannot import TorchTitan's BaseDataLoader from torchtitan.components.data.loader "
            f"({_main_error}) nor torchtitan.components.dataloader ({exc}); supported: "
            "torchtitan 0.3.0 and main; install with: pip install 'zephon_store[torchtitan]'"
        ) from exc

from ..io.cache import ChunkCache  # noqa: E402
from ..load.denylist import MASK_KEY  # noqa: E402
from ..load.options import BatchOptions, StopOptions, WorkerOptions, as_numpy  # noqa: E402
from ..load.runlog import RUNLOG_NAME  # noqa: E402
from ..load.source import MixtureParts, Source, open_parts, seed_of  # noqa: E402
from ..order.order import OrderOptions  # noqa: E402
from ..order.topology import Topology  # noqa: E402
from ..read.dataset import Dataset  # noqa: E402
from ..torch import ZephonLoader  # noqa: E402
from ..write.packing import DOC_STARTS_COLUMN, NUM_TOKENS_COLUMN, TOKENS_COLUMN  # noqa: E402
from .titan_batches import IGNORE_INDEX, TitanInputs, flat_batch, rows_batch  # noqa: E402

__all__ = ["ZephonDataLoader", "TORCHTITAN_API", "zephon_llama3_debug", "with_zephon",
           "dataset_seq_len"]

log = logging.getLogger("zephon_store")
# Read by zephon_llama3_debug() and the override when no dataset is given otherwise, so one
# exported variable reaches every torchrun rank.
DATASET_ENV = "ZEPHON_DATASET"
_DEFAULT_ORDER = OrderOptions()


def dataset_seq_len(dataset: Source | MixtureParts) -> int:
    """The ``L`` of a dataset of ``L + 1``-token windows (from its manifest or its schema);
    of a mixture (or its parts, :func:`~zephon_store.load.source.open_parts`), the ``L``
    all its sources share."""
    parts = dataset.parts()
    return _common_seq_len([d for _, d in parts], [n for n, _ in parts])


def _one_seq_len(dataset: Dataset) -> int:
    info = dataset.manifest.packing
    if info is not None and "seq_len" in info:
        return int(info["seq_len"])
    import pyarrow as pa

    if TOKENS_COLUMN not in dataset.schema.names:
        raise ValueError(f"dataset {dataset.url} has no {TOKENS_COLUMN!r} column (columns: "
                         f"{dataset.schema.names}); convert it with --tokenizer and --seq-len")
    t = dataset.schema.field(TOKENS_COLUMN).type
    if not pa.types.is_fixed_size_list(t) or t.list_size < 2:
        raise ValueError(f"dataset {dataset.url}: column {TOKENS_COLUMN!r} is {t}, not a "
                         "fixed-size list of token ids; convert it with --tokenizer and --seq-len")
    return t.list_size - 1


def _common_seq_len(sources, names) -> int:
    lens = {name: _one_seq_len(s) for name, s in zip(names, sources)}
    if len(set(lens.values())) != 1:
        raise ValueError(f"the mixture's sources hold windows of different lengths {lens}; "
                         "a batch needs one seq_len: re-convert them with one --seq-len")
    return next(iter(lens.values()))


class ZephonDataLoader(BaseDataLoader):
    """TorchTitan dataloader: this DP rank's share of each global batch of token windows.

    Global batch = ``local_batch_size * dp_world_size`` windows (0.3.0) or
    ``num_tokens_per_batch // L * dp_world_size`` (main). The cursor advances when a batch is
    handed to the trainer, so a checkpoint taken after step ``s`` resumes with the batch that
    follows it, whatever the new degree, local batch size or ``num_workers``.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset: str = ""
        """Dataset URL (local path, s3://..., any fsspec URL) of windows made by
        ``zephon convert --tokenizer ... --seq-len L``; defaults to $ZEPHON_DATASET."""

        mixture: str = ""
        """A mixture file (.toml/.json, docs/mixtures.md) to read instead of one dataset:
        packed sources of one seq_len, each with its own URL and storage options; stage
        starts in steps count global batches of this run. Its ``seed``, if set, applies
        when ``seed`` is left at 0 (0 means not given); another ``seed`` is refused."""

        seed: int = 0
        """Shuffle seed; part of the checkpoint (resuming with another seed is refused)."""

        shuffle: bool = True
        window_blocks: int = _DEFAULT_ORDER.window_blocks
        """Row groups per shuffle window (see docs/order.md)."""

        lanes: int | Literal["auto"] = _DEFAULT_ORDER.lanes
        """Order lanes P, or "auto": resolved by the loader at the run's first start from the
        dataset and the node count (see docs/order.md, "Locality at scale")."""

        storage_options: str = ""
        """fsspec storage options as a JSON object, e.g. '{"endpoint_url": "http://..."}'."""

        cache_dir: str = ""
        """Local disk cache for remote shards; empty = zephon's default location."""

        decoded_cache_dir: str = ""
        """A node-local folder keeping decoded row groups for later epochs and the node's
        other ranks (docs/loader.md, "The decoded cache"); empty: the one at
        $ZEPHON_DECODED_CACHE_DIR when that is set, else none."""

        num_workers: int = 0
        """0: prefetch with threads (default); N: N worker processes. Any value can resume
        any checkpoint."""

        prefetch: int = 4
        """Batches prepared ahead of the trainer."""

        infinite: bool = True
        """Epochs follow each other (each a fresh permutation); False: stop after one epoch
        (counted from position 0)."""

        positions: bool = True
        """Emit ``positions`` (per-document, from ``doc_starts``) as TorchTitan 0.3.0's loader
        does; Flex/varlen attention needs them."""

        documents: bool = False
        """Per-document attention data from zephon's one implementation
        (``BatchOptions(documents=True)``, docs/packing.md): ``positions`` restart at every
        document and at every blank (padding, taken-down) segment, whose labels are -100;
        the input dict carries ``cu_seqlens`` and ``max_seqlen`` as attributes. Needs a
        dataset packed with ``doc_starts``."""

        audit_dir: str = ""
        """A folder for the run log: set, and ``run_log`` left "", the run log is
        ``<audit_dir>/zephon-runlog.jsonl`` (``zephon trace --log`` of it gives each rank's
        sample ids per step). It once held per-rank files of ids; the run log is the one
        record of what was consumed. Setting both to two different files is refused."""

        run_log: str = ""
        """The run log (one JSON line per segment, written by global rank 0; ``zephon trace``,
        ``where`` and ``audit`` read it, docs/audit.md). :func:`with_zephon` puts it in the
        checkpoint folder when the config enables checkpointing (and no ``audit_dir`` is
        given); "" (default): ``audit_dir``'s, else none."""

        deny_list: str = ""
        """A deny list file (docs/audit.md): its windows keep their positions, their tokens
        never reach the model (the loader blanks them: the input is zeros) and their labels
        become TorchTitan's ignore index, so the loss skips them."""

        def __post_init__(self) -> None:
            if self.num_workers < 0:
                raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
            if self.prefetch < 1:
                raise ValueError(f"prefetch must be >= 1, got {self.prefetch}")
            self.order_options()  # validates seed, window_blocks, lanes
            self.storage_options_dict()
            self.run_log_path()

        def run_log_path(self) -> str:
            """The run log's path: ``run_log``, else ``<audit_dir>/zephon-runlog.jsonl``,
            else "" (none); ValueError when the two name different files."""
            in_dir = os.path.join(self.audit_dir, RUNLOG_NAME) if self.audit_dir else ""
            if self.run_log and in_dir and (os.path.abspath(self.run_log)
                                            != os.path.abspath(in_dir)):
                raise ValueError(
                    f"dataloader.run_log {self.run_log!r} and dataloader.audit_dir "
                    f"{self.audit_dir!r} name two run logs (audit_dir's is {in_dir!r}); the "
                    "run log is the one record of a run: set one of them")
            return self.run_log or in_dir

        def order_options(self) -> OrderOptions:
            return OrderOptions(seed=self.seed, shuffle=self.shuffle,
                                window_blocks=self.window_blocks, lanes=self.lanes)

        def storage_options_dict(self) -> dict | None:
            if not self.storage_options:
                return None
            try:
                value = json.loads(self.storage_options)
            except ValueError as exc:
                raise ValueError(f"storage_options must be a JSON object, got "
                                 f"{self.storage_options!r}: {exc}") from None
            if not isinstance(value, dict):
                raise ValueError(f"storage_options must be a JSON object, got "
                                 f"{self.storage_options!r}")
            return value

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer=None,
                 seq_len: int | None = None, local_batch_size: int | None = None,
                 max_context_length: int | None = None,
                 num_tokens_per_batch: int | None = None, **_: Any) -> None:
        # Other build kwargs (0.3.0's snapshot_every_n_steps) need no handling: the state is
        # one cursor, exact after every batch.
        self.config = config
        # The datasets first: the batch counts windows of their seq_len, and the columns
        # depend on what they hold; the loader's normaliser then makes the Source (a
        # mixture's stage starts in steps placed with this run's global batch).
        url, opened = self._open_parts(config)
        self._datasets = [d for _, d in opened.parts()]
        self.seq_len = dataset_seq_len(opened)
        if seq_len is not None and local_batch_size is not None:
            self.layout = "rows"
            if seq_len != self.seq_len:
                raise ValueError(
                    f"dataset {url} holds windows of seq_len {self.seq_len} (+1) tokens but the "
                    f"trainer's training.seq_len is {seq_len}; pass --training.seq_len "
                    f"{self.seq_len} or re-convert with --seq-len {seq_len}")
            rows = local_batch_size
        elif max_context_length is not None and num_tokens_per_batch is not None:
            self.layout = "flat"
            if self.seq_len > max_context_length:
                raise ValueError(
                    f"dataset {url} holds windows of seq_len {self.seq_len}, longer than the "
                    f"trainer's max_context_length {max_context_length}; re-convert with "
                    f"--seq-len {max_context_length} or raise max_context_length")
            if num_tokens_per_batch % self.seq_len:
                raise ValueError(
                    f"num_tokens_per_batch {num_tokens_per_batch} is not a multiple of the "
                    f"dataset's seq_len {self.seq_len}; a batch is whole windows")
            rows = num_tokens_per_batch // self.seq_len
        else:
            raise TypeError("ZephonDataLoader.build needs seq_len and local_batch_size "
                            "(TorchTitan 0.3.0) or max_context_length and num_tokens_per_batch "
                            "(TorchTitan main)")
        if rows < 1:
            raise ValueError(f"a batch must hold at least one window, got {rows}")
        self._check_tokenizer(tokenizer)
        columns = [TOKENS_COLUMN]
        if config.positions and all(DOC_STARTS_COLUMN in d.schema.names for d in self._datasets):
            columns.append(DOC_STARTS_COLUMN)
        columns += _padding_column(self._datasets)
        # Config.seed's default 0 means "not given": a mixture file's seed then applies, by
        # the source's own seed rule (the loader's); another seed is refused.
        order = config.order_options().replace(seed=seed_of(opened, config.seed or None))
        self.dp_world_size, self.dp_rank, self.rows = dp_world_size, dp_rank, rows
        self._loader = ZephonLoader(
            opened, topology=Topology(rows * dp_world_size, dp_world_size, dp_rank),
            order=order, batch=BatchOptions(columns=tuple(columns), collate=as_numpy,
                                            documents=config.documents),
            workers=WorkerOptions(num_workers=config.num_workers, prefetch=config.prefetch),
            stop=StopOptions(epochs=None if config.infinite else 1), run_log=self._run_log(),
            deny_list=config.deny_list or None)
        self.dataset = self._loader.dataset
        self._iter: Iterator | None = None

    @staticmethod
    def _open_parts(config: Config):
        """``(what is read, its datasets opened)``: ``config.mixture``'s sources, each with the
        mixture file's storage options, or ``config.dataset``
        (:func:`~zephon_store.load.source.open_parts`)."""
        cache = ChunkCache(config.cache_dir) if config.cache_dir else None
        decoded = config.decoded_cache_dir or None
        if config.mixture:
            if config.dataset:
                raise ValueError("set --dataloader.dataset or --dataloader.mixture, not both")
            return config.mixture, open_parts(config.mixture, cache=cache,
                                              decoded_cache=decoded, as_mixture=True)
        url = config.dataset or os.environ.get(DATASET_ENV, "")
        if not url:
            raise ValueError("ZephonDataLoader needs a dataset: set --dataloader.dataset "
                             f"URL or --dataloader.mixture FILE (or ${DATASET_ENV})")
        return url, open_parts(
            url, storage_options=config.storage_options_dict(), cache=cache,
            decoded_cache=decoded,
            no_mixture=f"dataset {url} is a mixture file; pass it as --dataloader.mixture "
                       "(its sources carry their own storage options)")

    def _run_log(self) -> str | None:
        """The run log this process writes: global rank 0's (one writer per job, whatever
        the mesh); None elsewhere or without one."""
        path = self.config.run_log_path()
        return path if path and _global_rank() == 0 else None

    def _check_tokenizer(self, tokenizer) -> None:
        for dataset in self._datasets:
            self._check_tokenizer_of(dataset, tokenizer)

    def _check_tokenizer_of(self, dataset, tokenizer) -> None:
        info = dataset.manifest.packing or {}
        expected = (info.get("tokenizer") or {}).get("vocab_size")
        get = getattr(tokenizer, "get_vocab_size", None)
        if expected is None or get is None:
            return
        try:
            actual = get()
        except Exception:  # a tokenizer without a loaded vocabulary: nothing to compare
            return
        if actual != expected:
            log.warning("zephon: the dataset was tokenized with a %d-token vocabulary (%s) but "
                        "the trainer's tokenizer has %d tokens; check --hf_assets_path",
                        expected, info["tokenizer"].get("file"), actual)

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[dict, Any]]:
        # A new iterator resumes at the cursor; the previous one (and its prefetch) ends.
        if self._iter is not None:
            self._iter.close()
        self._iter = self._batches()
        return self._iter

    def _batches(self) -> Iterator[tuple[dict, Any]]:
        shape = rows_batch if self.layout == "rows" else flat_batch
        positions = self.config.positions
        # A deny list naming documents turns the document fields on (the loader's rule).
        documents = self._loader.batch_options.documents
        for batch in self._loader:
            inputs, labels = shape(batch[TOKENS_COLUMN], batch.get(DOC_STARTS_COLUMN),
                                   positions=positions, num_tokens=batch.get(NUM_TOKENS_COLUMN),
                                   documents=batch if documents else None)
            masked = batch.get(MASK_KEY)
            if not documents and masked is not None and masked.any():
                inputs, labels = _ignore_rows(inputs, labels, masked)
            yield inputs, labels

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{version, dataset_id, seed, order, cursor, step}``: the same on every rank."""
        return self._loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict`` at the next ``iter()``.

        As :meth:`zephon_store.torch.ZephonLoader.load_state_dict`: a open iterator is
        closed (its next ``next()`` raises StopIteration) and never moves the loaded cursor.
        """
        # An empty state is what TorchTitan passes when the checkpoint has no dataloader.
        if not state_dict:
            return
        self._loader.load_state_dict(dict(state_dict))
        if self._iter is not None:
            self._iter.close()
            self._iter = None

    @property
    def cursor(self) -> int:
        """Samples (windows) consumed by the whole job so far."""
        return self._loader.cursor

    def close(self) -> None:
        if self._iter is not None:
            self._iter.close()
            self._iter = None


def _global_rank() -> int:
    """This process's rank in the whole job (not its data-parallel rank): one writer."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _padding_column(datasets) -> list[str]:
    """``[num_tokens]`` when the data is best-fit packed (its padding is then never a label),
    ``[]`` when no source is; a mixture of both kinds is refused."""
    padded = [NUM_TOKENS_COLUMN in d.schema.names for d in datasets]
    if all(padded):
        return [NUM_TOKENS_COLUMN]
    if any(padded):
        raise ValueError("the mixture mixes best-fit packed sources (with padding, a "
                         "num_tokens column) and concatenated ones; convert every source with "
                         "the same --packing")
    return []


def _ignore_rows(inputs, labels, masked):
    """Labels of deny-listed windows set to the loss's ignore index (-100)."""
    import torch

    rows = torch.from_numpy(np.asarray(masked, dtype=bool))
    labels = labels.clone()
    if labels.dim() == 2:
        labels[rows] = IGNORE_INDEX
        return inputs, labels
    per_row = labels.numel() // rows.numel()       # the flat layout: rows of L labels
    labels.view(rows.numel(), per_row)[rows] = IGNORE_INDEX
    return TitanInputs(dict(inputs), num_valid_tokens=int((labels != IGNORE_INDEX).sum())), labels


# -- config functions ----------------------------------------------------------------------
def with_zephon(config, **fields):
    """Return ``config`` (a TorchTitan ``Trainer.Config``) reading its data from zephon.

    ``fields`` are :class:`ZephonDataLoader.Config` fields; ``dataset`` defaults to
    ``$ZEPHON_DATASET``. When ``config`` enables checkpointing, ``run_log`` defaults to
    ``<dump_folder>/<checkpoint.folder>/zephon-runlog.jsonl``, beside the checkpoints it
    describes (unless ``audit_dir`` places it). The validator's dataloader is left alone.
    """
    fields.setdefault("dataset", os.environ.get(DATASET_ENV, ""))
    ckpt = getattr(config, "checkpoint", None)
    if getattr(ckpt, "enable", False) and not fields.keys() & {"run_log", "audit_dir"}:
        fields["run_log"] = os.path.join(getattr(config, "dump_folder", "."),
                                         getattr(ckpt, "folder", "checkpoint"), RUNLOG_NAME)
    config.dataloader = ZephonDataLoader.Config(**fields)
    return config


def zephon_llama3_debug():
    """TorchTitan's ``llama3_debugmodel`` config reading windows from a zephon dataset.

    Use: ``--module zephon_store.integrations.torchtitan --config zephon_llama3_debug
    --dataloader.dataset URL --training.seq_len L``. Importing TorchTitan's llama3 registry
    needs ``triton`` in 0.3.0, so it is imported here, not at module import.
    """
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    return with_zephon(llama3_debugmodel())
