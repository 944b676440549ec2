"""ZephonDataLoader in TorchTitan 0.3.0: build, batches, checkpoint with DCP, elastic resume.

The main test runs ``torchrun`` (gloo, CPU): 12 steps at DP=2 with TorchTitan's own
CheckpointManager saving after step 6, then resumes that checkpoint at DP=3 and at DP=1 and
shows the consumed windows continue exactly as in the uninterrupted run, token for token.
The dataset is small (under 48 windows), so the runs cross an epoch boundary.

TorchTitan main (Grain era) is not on PyPI, so CI exercises its API against stand-ins of its
data classes (``test_main_api_with_stand_in_classes``); the optional ``make test-titan-main``
runs the same driver against main's real classes, and the resume test against main too
(``test_torchtitan_main.py``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.helpers import ROOT, two_stage_mixture
from tests.integration.torchtitan_worker import make_packed_dataset

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))

SEQ_LEN = 32
LOCAL_BATCH = 2
SEED = 11
STATE_KEYS = {"version", "dataset_id", "seed", "order", "cursor", "step"}


def _has_torchtitan() -> bool:
    try:
        import torchtitan.components.dataloader  # noqa: F401
    except ImportError:
        return False
    return True


needs_torchtitan = pytest.mark.skipif(
    not _has_torchtitan(),
    reason="torchtitan is not importable; install it with "
           "pip install 'zephon_store[torchtitan]' (make env does)")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """(root with tokenizer.json, dataset URL, every window [N, L+1], doc_starts per window)."""
    root = str(tmp_path_factory.mktemp("titan"))
    url = make_packed_dataset(root, seq_len=SEQ_LEN, windows=40)
    from zephon_store.read.dataset import open_dataset

    ds = open_dataset(url)
    table = ds.take(range(ds.num_samples))
    windows = np.array(table.column("tokens").to_pylist(), dtype=np.int64)
    starts = table.column("doc_starts").to_pylist()
    assert 24 < ds.num_samples < 48, ds.num_samples  # a 48-window run crosses an epoch
    assert len({tuple(w) for w in windows}) == len(windows), "windows must be distinct"
    return root, url, windows, starts


def _torchrun(nproc: int, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", os.path.join(HERE, "torchtitan_worker.py"), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"


def _traced(out: str, world: int, dataset: str):
    """``[(step, rank, record, positions, traced)]`` of one run: each rank's delivered
    record (``<out>/rank<r>.jsonl``) with the positions and the trace of its step from the
    run log (``<out>/audit`` is the Config's ``audit_dir``, so the log is there), by the
    library's run accounting (what ``zephon trace`` prints)."""
    from zephon_store.load.runlog import RUNLOG_NAME
    from zephon_store.runs.accounting import RunContext
    from zephon_store.runs.audit import rank_positions, segment_at

    ctx = RunContext(dataset, os.path.join(out, "audit", RUNLOG_NAME))
    records = {}
    for rank in range(world):
        with open(os.path.join(out, f"rank{rank}.jsonl")) as fh:
            for r in map(json.loads, fh):
                assert r["world_size"] == world and r["rank"] == rank
                records[r["step"] - 1, rank] = r       # train_state.step counts from 1
    steps = sorted({s for s, _ in records})
    assert {r for _, r in records} == set(range(world)) and len(records) == len(steps) * world
    out_ = []
    for t in ctx.trace(steps, end_step=steps[-1] + 1):
        seg = segment_at(ctx.segments, t.step)
        parts = rank_positions(seg, ctx.order_for(seg), t.step)
        assert t.reached and t.world_size == world
        for rank in range(world):
            src = t.sources[rank] if t.sources else [None] * len(t.ranks[rank])
            out_.append((t.step, rank, records[t.step, rank], parts[rank].tolist(),
                         list(zip(src, t.ranks[rank]))))
    return out_


def _consumed(out: str, world: int, dataset: str) -> dict[int, tuple[int, list, list]]:
    """Position -> (sample id, window tokens, positions) over every rank of one run: ids
    and positions from the run log, windows and positions as the batches delivered them."""
    got: dict[int, tuple[int, list, list]] = {}
    for _, _, rec, positions, traced in _traced(out, world, dataset):
        for p, (_, s), w, pos in zip(positions, traced, rec["windows"], rec["positions"],
                                     strict=True):
            assert p not in got, f"position {p} consumed twice"
            got[p] = (s, w, pos)
    return got


def _windows(url: str) -> np.ndarray:
    from zephon_store.read.dataset import open_dataset

    ds = open_dataset(url)
    return np.array(ds.take(range(ds.num_samples)).column("tokens").to_pylist(), dtype=np.int64)


def _expected_positions(doc_starts: list[int]) -> list[int]:
    out, last = [], 0
    for i in range(SEQ_LEN):
        if i in doc_starts:
            last = i
        out.append(i - last)
    return out


@needs_torchtitan
def test_resume_on_other_dp_degrees_continues_exactly(packed, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    from tests.helpers.stateful import assert_exactly_once_per_epoch

    _, url, windows, starts = packed
    n = len(windows)
    ckpt = str(tmp_path / "dump")
    common = ["--dataset", url, "--ckpt", ckpt, "--seq-len", str(SEQ_LEN),
              "--local-batch", str(LOCAL_BATCH), "--seed", str(SEED)]
    # Uninterrupted DP=2 run, 12 steps of global batch 4; checkpoint after step 6.
    _torchrun(2, *common, "--out", str(tmp_path / "ref"), "--steps", "12", "--save-at", "6")
    ref = _consumed(str(tmp_path / "ref"), 2, url)
    assert sorted(ref) == list(range(48))
    assert assert_exactly_once_per_epoch({p: v[0] for p, v in ref.items()}, n) == 1
    for p, (sid, window, pos) in ref.items():
        # The batch TorchTitan sees is the stored window of the sample the run log places
        # there: input = w[:-1], labels = w[1:], positions restart where a document begins.
        assert window == windows[sid].tolist(), p
        assert pos == _expected_positions(starts[sid]), p
    assert any(pos != list(range(SEQ_LEN)) for _, _, pos in ref.values())

    # TorchTitan's DCP checkpoint holds one replicated copy of the loader state.
    meta = FileSystemReader(os.path.join(ckpt, "checkpoint", "step-6")).read_metadata()
    keys = [k for k in meta.state_dict_metadata if k.startswith("dataloader.")]
    assert "dataloader.cursor" in keys
    assert all(k in ("dataloader.version", "dataloader.dataset_id", "dataloader.seed",
                     "dataloader.cursor", "dataloader.step") or k.startswith("dataloader.order.") for k in keys), keys

    # Resume the step-6 checkpoint (cursor 24) at DP=3 (global batch 6) and DP=1 (batch 2).
    for world in (3, 1):
        out = str(tmp_path / f"dp{world}")
        _torchrun(world, *common, "--out", out, "--steps", str(24 // (LOCAL_BATCH * world)),
                  "--load-step", "6")
        with open(os.path.join(out, f"summary-dp{world}.json")) as fh:
            summary = json.load(fh)
        assert summary["start_cursor"] == 24 and summary["state"]["cursor"] == 48
        assert set(summary["state"]) == STATE_KEYS
        resumed = _consumed(out, world, url)
        assert sorted(resumed) == list(range(24, 48)), f"DP={world}: repeats or gaps"
        for p in range(24, 48):
            assert resumed[p] == ref[p], f"DP={world}: position {p} differs from the reference"


def _consumed_mixture(out: str, world: int, mix: str,
                      windows: dict) -> dict[int, tuple[str, int]]:
    """Position -> (source, the source's own window id) over every rank of a mixture run,
    from the run log; every delivered window is that source's window."""
    got: dict[int, tuple[str, int]] = {}
    for _, _, rec, positions, traced in _traced(out, world, mix):
        for p, (k, s), w in zip(positions, traced, rec["windows"], strict=True):
            assert p not in got, f"position {p} consumed twice"
            assert w == windows[k][s].tolist(), (p, k, s)
            got[p] = (k, s)
    return got


@needs_torchtitan
def test_mixture_checkpoint_resumes_at_another_dp_degree(packed, tmp_path):
    """A two-source mixture (a second stage from step 3) through TorchTitan's checkpointer:
    saved after step 4 at DP=2, resumed at DP=3; the resumed positions hold the same
    (source, window) as the uninterrupted DP=2 run, and the stage kept its sample start."""
    from torch.distributed.checkpoint import FileSystemReader

    _, url, _, _ = packed
    other = make_packed_dataset(str(tmp_path / "other"), seq_len=SEQ_LEN, windows=20)
    mix = two_stage_mixture(tmp_path / "mix.json", {"big": (url, [0.75, 0.25]),
                                                    "small": (other, [0.25, 0.75])})
    ckpt = str(tmp_path / "dump")
    common = ["--mixture", str(mix), "--ckpt", ckpt, "--seq-len", str(SEQ_LEN),
              "--local-batch", str(LOCAL_BATCH), "--seed", str(SEED)]
    _torchrun(2, *common, "--out", str(tmp_path / "ref"), "--steps", "10", "--save-at", "4")
    windows = {"big": packed[2], "small": _windows(other)}
    ref = _consumed_mixture(str(tmp_path / "ref"), 2, str(mix), windows)
    assert sorted(ref) == list(range(40)) and {k for k, _ in ref.values()} == {"big", "small"}
    meta = FileSystemReader(os.path.join(ckpt, "checkpoint", "step-4")).read_metadata()
    assert "dataloader.mixture" in meta.state_dict_metadata

    out = str(tmp_path / "dp3")
    _torchrun(3, *common, "--out", out, "--steps", "4", "--load-step", "4")
    with open(os.path.join(out, "summary-dp3.json")) as fh:
        summary = json.load(fh)
    assert summary["start_cursor"] == 16 and summary["state"]["cursor"] == 40
    stages = json.loads(summary["state"]["mixture"])["schedule"]["stages"]
    assert [st["start"] for st in stages] == [0, 12]    # step 3 of global batch 4
    resumed = _consumed_mixture(out, 3, str(mix), windows)
    assert sorted(resumed) == list(range(16, 40))
    assert all(resumed[p] == ref[p] for p in resumed)

    # The override selects a mixture too (no dataset needed).
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    from zephon_store.integrations.torchtitan_override import use_zephon

    cfg = use_zephon(HuggingFaceTextDataLoader.Config(), mixture=str(mix))
    assert (cfg.mixture, cfg.dataset) == (str(mix), "")


# -- in-process: every-step checkpoints through the shared helper ---------------------------
def _loader_factory(url, **config):
    from zephon_store.integrations.torchtitan import ZephonDataLoader

    def make_loader(*, world_size, rank, num_workers, global_batch):
        return ZephonDataLoader.Config(dataset=url, seed=SEED, window_blocks=2, lanes=6,
                                       num_workers=num_workers, **config).build(
            dp_world_size=world_size, dp_rank=rank, tokenizer=None, seq_len=SEQ_LEN,
            local_batch_size=global_batch // world_size)

    return make_loader


def _window_ids(windows):
    """``ids_of(batch)``: the index in ``windows`` of every window a batch holds."""
    index = {tuple(w): i for i, w in enumerate(windows.tolist())}

    def ids_of(batch) -> list[int]:
        inputs, labels = batch
        full = np.concatenate([inputs["input"].numpy(), labels[:, -1:].numpy()], axis=1)
        return [index[tuple(w)] for w in full.tolist()]

    return ids_of


@needs_torchtitan
def test_every_step_checkpoint_restores_with_any_world_size_and_workers(packed):
    from tests.helpers.stateful import Segment, assert_matches_reference, run_segments

    _, url, windows, _ = packed
    ids_of = _window_ids(windows)
    make_loader = _loader_factory(url)
    gb, steps = 6, 14
    base = run_segments(make_loader, [Segment(world_size=1, steps=steps)], global_batch=gb,
                        ids_of=ids_of)
    assert all(set(s) == STATE_KEYS for s in base.states)
    reference = [i for s in base.steps for i in s.ids[0]]
    for k in range(0, steps, 3):
        for world, workers in ((2, 0), (3, 0), (6, 0), (2, 1)):
            resumed = run_segments(make_loader, [Segment(world, steps - k - 1, workers)],
                                   global_batch=gb, state=base.states[k], ids_of=ids_of)
            assert_matches_reference(base.steps[:k + 1] + resumed.steps, reference)
    # Restarts that also change the global batch (TorchTitan: another local batch size).
    mixed = run_segments(make_loader, [Segment(2, 3), Segment(3, 2, global_batch=12),
                                       Segment(1, 3, global_batch=2)],
                         global_batch=gb, ids_of=ids_of)
    assert_matches_reference(mixed.steps, reference)
    assert mixed.final_state["cursor"] == 48


@needs_torchtitan
def test_load_state_dict_while_iterating_applies_at_the_next_iter(packed):
    """A open iterator is closed by load_state_dict and never moves the loaded cursor."""
    _, url, windows, _ = packed
    ids = _window_ids(windows)
    make_loader = _loader_factory(url)
    source = make_loader(world_size=1, rank=0, num_workers=0, global_batch=2)
    it = iter(source)
    reference = [ids(next(it)) for _ in range(8)]
    source2 = make_loader(world_size=1, rank=0, num_workers=0, global_batch=2)
    it2 = iter(source2)
    for _ in range(2):
        next(it2)
    saved = source2.state_dict()                 # cursor 4
    loader = make_loader(world_size=1, rank=0, num_workers=0, global_batch=2)
    live = iter(loader)
    for _ in range(6):
        next(live)
    loader.load_state_dict(saved)
    assert loader.state_dict()["cursor"] == 4 == loader.cursor
    with pytest.raises(StopIteration):
        next(live)
    assert loader.state_dict()["cursor"] == 4
    fresh = iter(loader)
    assert [ids(next(fresh)) for _ in range(2)] == reference[2:4]
    assert loader.state_dict()["cursor"] == 8
    loader.close()


# -- errors, selection, optional extra -----------------------------------------------------
@needs_torchtitan
def test_seq_len_mismatch_and_missing_dataset_are_clear(packed, monkeypatch, tmp_path):
    from zephon_store.integrations.torchtitan import ZephonDataLoader

    _, url, _, _ = packed
    with pytest.raises(ValueError, match=r"seq_len 32 .*training.seq_len is 64.*--training.seq_len 32"):
        ZephonDataLoader.Config(dataset=url).build(dp_world_size=1, dp_rank=0, tokenizer=None,
                                                   seq_len=64, local_batch_size=2)
    monkeypatch.delenv("ZEPHON_DATASET", raising=False)
    with pytest.raises(ValueError, match="needs a dataset"):
        ZephonDataLoader.Config().build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32,
                                        local_batch_size=2)
    with pytest.raises(ValueError, match="storage_options must be a JSON object"):
        ZephonDataLoader.Config(dataset=url, storage_options="[1]")
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"stages": [{"name": "s", "start": {"samples": 0}}],
                               "sources": [{"name": "a", "url": url, "weights": [1]}]}))
    with pytest.raises(ValueError, match="is a mixture file; pass it as --dataloader.mixture"):
        ZephonDataLoader.Config(dataset=str(mix)).build(
            dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=2)
    monkeypatch.setenv("ZEPHON_DATASET", url)
    dl = ZephonDataLoader.Config().build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32,
                                         local_batch_size=2)
    assert dl.state_dict()["cursor"] == 0


@needs_torchtitan
def test_real_tokenizer_is_checked_against_the_dataset(packed, caplog):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from zephon_store.integrations.torchtitan import ZephonDataLoader

    root, url, _, _ = packed
    tok = HuggingFaceTokenizer.Config().build(tokenizer_path=root)
    with caplog.at_level(logging.WARNING, logger="zephon_store"):
        dl = ZephonDataLoader.Config(dataset=url).build(dp_world_size=1, dp_rank=0,
                                                        tokenizer=tok, seq_len=32,
                                                        local_batch_size=2)
        inputs, _ = next(iter(dl))
    dl.close()
    assert "vocabulary" not in caplog.text
    assert int(inputs["input"].max()) < tok.get_vocab_size()

    class OtherTokenizer:
        def get_vocab_size(self):
            return 128256

    with caplog.at_level(logging.WARNING, logger="zephon_store"):
        ZephonDataLoader.Config(dataset=url).build(dp_world_size=1, dp_rank=0,
                                                   tokenizer=OtherTokenizer(), seq_len=32,
                                                   local_batch_size=2)
    assert "500-token vocabulary" in caplog.text


@needs_torchtitan
def test_override_swaps_only_the_training_dataloader(packed, monkeypatch):
    from dataclasses import dataclass, field

    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.config import Configurable, OverrideConfig, apply_overrides
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    from zephon_store.integrations.torchtitan import ZephonDataLoader

    _, url, _, _ = packed
    monkeypatch.delenv("ZEPHON_DATASET", raising=False)

    # Stand-ins for Trainer.Config / Validator.Config (importing the trainer needs triton).
    @dataclass(kw_only=True, slots=True)
    class Validator(Configurable.Config):
        dataloader: BaseDataLoader.Config = field(
            default_factory=lambda: HuggingFaceTextDataLoader.Config(dataset="c4_validation"))

    @dataclass(kw_only=True, slots=True)
    class Root(Configurable.Config):
        dataloader: BaseDataLoader.Config = field(
            default_factory=HuggingFaceTextDataLoader.Config)
        validator: Validator = field(default_factory=Validator)

    target = "zephon_store.integrations.torchtitan_override.use_zephon"
    root = Root()
    apply_overrides(OverrideConfig(imports=[(target, {"dataset": url, "seed": 7})]), root)
    assert isinstance(root.dataloader, ZephonDataLoader.Config)
    assert (root.dataloader.dataset, root.dataloader.seed) == (url, 7)
    assert isinstance(root.validator.dataloader, HuggingFaceTextDataLoader.Config)
    dl = root.dataloader.build(dp_world_size=2, dp_rank=1, tokenizer=None, seq_len=32,
                               local_batch_size=2)
    assert next(iter(dl))[0]["input"].shape == (2, 32)
    dl.close()

    # Without kwargs the URL comes from --dataloader.dataset_path (or .dataset, or the env).
    root = Root()
    root.dataloader.dataset_path = url
    apply_overrides(OverrideConfig(imports=[target]), root)
    assert root.dataloader.dataset == url
    with pytest.raises(ValueError, match="no dataset given"):
        apply_overrides(OverrideConfig(imports=[target]), Root())
    with pytest.raises(TypeError, match="unknown ZephonDataLoader.Config field"):
        apply_overrides(OverrideConfig(imports=[(target, {"datset": url})]), Root())


@needs_torchtitan
def test_config_function_through_config_manager(packed):
    pytest.importorskip("triton", reason="TorchTitan 0.3.0's llama3 config registry imports "
                        "triton (pip install triton); zephon_llama3_debug imports it lazily")
    from torchtitan.config import ConfigManager

    from zephon_store.integrations.torchtitan import ZephonDataLoader

    _, url, _, _ = packed
    cfg = ConfigManager().parse_args([
        "--module", "zephon_store.integrations.torchtitan", "--config", "zephon_llama3_debug",
        "--dataloader.dataset", url, "--dataloader.seed", "7", "--training.seq_len", "32"])
    assert isinstance(cfg.dataloader, ZephonDataLoader.Config)
    assert (cfg.dataloader.dataset, cfg.dataloader.seed) == (url, 7)


def test_optional_extra():
    """Importing zephon_store imports no TorchTitan; without it the integration names the extra."""
    code = textwrap.dedent("""
        import sys
        import zephon_store, zephon_store.integrations
        import zephon_store.integrations.titan_batches
        assert "torchtitan" not in sys.modules, "zephon_store imported torchtitan"
        sys.modules["torchtitan"] = None  # as if it were not installed
        try:
            import zephon_store.integrations.torchtitan
        except zephon_store.MissingExtraError as exc:
            assert "zephon_store[torchtitan]" in str(exc), exc
            print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.stdout.strip() == "ok", proc.stderr


# -- TorchTitan main (Grain era): stand-in classes ------------------------------------------
_FAKE_CONFIG = """
from dataclasses import dataclass, fields, replace


class Configurable:
    @dataclass(kw_only=True, slots=True)
    class Config:
        def build(self, **kwargs):
            overlap = {f.name for f in fields(self)} & kwargs.keys()
            assert not overlap, overlap
            return self._owner(config=replace(self), **kwargs)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "Config" in cls.__dict__:
            cls.__dict__["Config"]._owner = cls
"""

# As in main's components/data/loader.py: an empty Config, abstract __iter__, close().
_FAKE_LOADER = """
from abc import ABC, abstractmethod
from dataclasses import dataclass

from torch.distributed.checkpoint.stateful import Stateful

from torchtitan.config import Configurable


class BaseDataLoader(Stateful, ABC, Configurable):
    @dataclass(kw_only=True, slots=True)
    class Config(Configurable.Config):
        pass

    @abstractmethod
    def __iter__(self): ...

    def close(self) -> None:
        pass
"""

_MAIN_DRIVER = """
import json, sys
import torch
from zephon_store.integrations.torchtitan import TORCHTITAN_API, ZephonDataLoader
import torchtitan.components.data.loader as loader_mod
assert TORCHTITAN_API == "data" and issubclass(ZephonDataLoader, loader_mod.BaseDataLoader)
url, seq_len = sys.argv[1], int(sys.argv[2])
out = {}
for world in (2, 3):
    dls = [ZephonDataLoader.Config(dataset=url, seed=5).build(
        dp_world_size=world, dp_rank=r, tokenizer=None, max_context_length=64,
        num_tokens_per_batch=2 * seq_len) for r in range(world)]
    its = [iter(dl) for dl in dls]
    rows = []
    for step in range(2):
        for it in its:
            input_dict, labels = next(it)
            # What main's Trainer.train_step does with a batch:
            n = input_dict.pop("num_valid_tokens")
            model_kwargs = {**input_dict, "labels": labels}
            assert set(model_kwargs) == {"input", "positions", "labels"}, set(model_kwargs)
            assert getattr(input_dict, "num_valid_tokens") == n == labels.numel() == 2 * seq_len
            assert input_dict["input"].shape == (2 * seq_len,) == input_dict["positions"].shape
            assert int(input_dict["positions"][0]) == int(input_dict["positions"][seq_len]) == 0
            assert torch.equal(input_dict["input"].view(2, seq_len)[:, 1:],
                               labels.view(2, seq_len)[:, :-1])
            rows += torch.cat([input_dict["input"].view(2, seq_len),
                               labels.view(2, seq_len)[:, -1:]], 1).tolist()
    states = [dl.state_dict() for dl in dls]
    assert all(s == states[0] for s in states) and states[0]["cursor"] == 2 * 2 * world
    for dl in dls:
        dl.close()
    out[world] = rows
try:
    ZephonDataLoader.Config(dataset=url).build(dp_world_size=1, dp_rank=0, tokenizer=None,
                                               max_context_length=64, num_tokens_per_batch=33)
    raise SystemExit("a token batch that is not whole windows was accepted")
except ValueError as exc:
    assert "not a multiple" in str(exc)
print(json.dumps(out))
"""


@needs_torchtitan
def test_main_api_with_stand_in_classes(packed, tmp_path):
    """Flat batches and build kwargs of TorchTitan main, against stand-ins of its classes
    (checked against the real ones by test_torchtitan_main.py, make test-titan-main)."""
    _, url, windows, _ = packed
    fake = tmp_path / "fake"
    files = {"torchtitan/__init__.py": "", "torchtitan/components/__init__.py": "",
             "torchtitan/components/data/__init__.py": "",
             "torchtitan/config/__init__.py": _FAKE_CONFIG,
             "torchtitan/components/data/loader.py": _FAKE_LOADER}
    for rel, text in files.items():
        path = fake / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), ROOT]))
    proc = subprocess.run([sys.executable, "-c", _MAIN_DRIVER, url, str(SEQ_LEN)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    known = {tuple(w) for w in windows.tolist()}
    for world, rows in out.items():
        assert len(rows) == 2 * 2 * int(world) and all(tuple(r) in known for r in rows)
        assert len({tuple(r) for r in rows}) == len(rows)


@needs_torchtitan
def test_run_log_in_the_checkpoint_folder_and_deny_list_labels_ignored(packed, tmp_path):
    from types import SimpleNamespace

    from zephon_store.integrations.torchtitan import IGNORE_INDEX, with_zephon
    from zephon_store.load.runlog import read_run_log
    from zephon_store.runs.accounting import RunContext

    _, url, windows, _ = packed
    trainer = SimpleNamespace(dump_folder=str(tmp_path / "out"),
                              checkpoint=SimpleNamespace(enable=True, folder="checkpoint"))
    cfg = with_zephon(trainer, dataset=url, seed=7,
                      deny_list=str(tmp_path / "deny.txt")).dataloader
    run_log = str(tmp_path / "out" / "checkpoint" / "zephon-runlog.jsonl")
    assert cfg.run_log == run_log
    denied = [1, 5, 9, 13, 17]
    (tmp_path / "deny.txt").write_text("\n".join(map(str, denied)))
    dl = cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ_LEN,
                   local_batch_size=4)
    it = iter(dl)
    seen_masked = 0
    for _ in range(6):
        inputs, labels = next(it)
        for row, label_row in zip(inputs["input"].tolist(), labels.tolist()):
            # A denied window's tokens never reach the model: its input is zeros (and its
            # labels the ignore index); every other row is a window of the dataset.
            denied_row = row == [0] * SEQ_LEN
            assert (label_row == [IGNORE_INDEX] * SEQ_LEN) == denied_row
            if not denied_row:
                (sid,) = [i for i, w in enumerate(windows.tolist()) if w[:-1] == row]
                assert sid not in denied
            seen_masked += denied_row
    dl.close()
    # The run log says which windows the batches held: exactly the listed ones are zeros.
    traced = RunContext(url, run_log).trace(range(6), end_step=6)
    assert seen_masked == sum(m for t in traced for m in t.masked[0]) > 0
    assert all(m == (i in denied) for t in traced for i, m in zip(t.ranks[0], t.masked[0]))
    assert not any(w.tolist() == [0] * SEQ_LEN for w in windows[:, :-1])
    (seg,) = read_run_log(run_log, dataset_id=dl.dataset.dataset_id)
    assert (seg.first_step, seg.cursor, seg.global_batch, seg.deny_list["count"]) == (
        0, 0, 4, len(denied))


@needs_torchtitan
def test_audit_dir_is_the_run_logs_folder(packed, tmp_path):
    """``audit_dir`` places the run log (the one record of what was consumed): ``zephon
    audit`` passes on it and its trace is what the batches held; a second, different
    ``run_log`` is refused; with_zephon leaves the log where audit_dir puts it."""
    from types import SimpleNamespace

    from zephon_store.cli.main import main as zephon
    from zephon_store.integrations.torchtitan import ZephonDataLoader, with_zephon
    from zephon_store.runs.accounting import RunContext

    _, url, windows, _ = packed
    audit = tmp_path / "audit"
    dl = ZephonDataLoader.Config(dataset=url, seed=SEED, audit_dir=str(audit)).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ_LEN, local_batch_size=3)
    ids_of, it = _window_ids(windows), iter(dl)
    got = [ids_of(next(it)) for _ in range(20)]          # 60 windows: past an epoch
    dl.close()
    assert sorted(os.listdir(audit)) == ["zephon-runlog.jsonl"]
    log = str(audit / "zephon-runlog.jsonl")
    assert [t.ranks[0] for t in RunContext(url, log).trace(range(20), end_step=20)] == got
    assert zephon(["audit", url, "--log", log, "--end-step", "20"]) == 0

    with pytest.raises(ValueError, match="name two run logs"):
        ZephonDataLoader.Config(dataset=url, audit_dir=str(audit), run_log=str(tmp_path / "x"))
    same = ZephonDataLoader.Config(dataset=url, audit_dir=str(audit), run_log=log)
    assert same.run_log_path() == log
    trainer = SimpleNamespace(dump_folder=str(tmp_path / "out"),
                              checkpoint=SimpleNamespace(enable=True, folder="checkpoint"))
    cfg = with_zephon(trainer, dataset=url, audit_dir=str(audit)).dataloader
    assert (cfg.run_log, cfg.run_log_path()) == ("", log)


@needs_torchtitan
@pytest.mark.parametrize("layout", ["rows", "flat"])
def test_best_fit_padding_is_never_a_label(tmp_path, layout):
    """Best-fit windows end in padding (formats/golden/v6/bestfit: 67 padded tokens over 38
    windows): its labels are the ignore index, every other label is the next real token, and
    positions restart at every segment (each piece of a document)."""
    from types import SimpleNamespace

    from zephon_store.integrations.torchtitan import IGNORE_INDEX, with_zephon
    from zephon_store.read.dataset import open_dataset

    url = os.path.join(ROOT, "formats", "golden", "v6", "bestfit")
    table = open_dataset(url).take(range(38))
    windows = np.array(table.column("tokens").to_pylist(), dtype=np.int64)
    num_tokens = table.column("num_tokens").to_pylist()
    starts = table.column("doc_starts").to_pylist()
    trainer = SimpleNamespace(dump_folder=str(tmp_path / "out"),
                              checkpoint=SimpleNamespace(enable=False, folder="checkpoint"))
    cfg = with_zephon(trainer, dataset=url, seed=3).dataloader
    kw = (dict(seq_len=15, local_batch_size=2) if layout == "rows"
          else dict(max_context_length=15, num_tokens_per_batch=30))
    dl = cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, **kw)
    padded, it = 0, iter(dl)
    for _ in range(19):   # one epoch: 38 windows, 2 a step
        inputs, labels = next(it)
        rows = inputs["input"].reshape(-1, 15).tolist()
        for row, lab, pos in zip(rows, labels.reshape(-1, 15).tolist(),
                                 inputs["positions"].reshape(-1, 15).tolist()):
            (k,) = [i for i, w in enumerate(windows.tolist()) if w[:-1] == row]
            n = num_tokens[k]
            want = [t if j + 1 < n else IGNORE_INDEX for j, t in enumerate(windows[k, 1:])]
            assert lab == want
            assert pos == _expected_positions(starts[k])[:15]
            padded += 16 - n
        if layout == "flat":
            assert inputs.num_valid_tokens == int((labels != IGNORE_INDEX).sum())
    dl.close()
    assert padded > 0
