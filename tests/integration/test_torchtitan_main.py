"""ZephonDataLoader against TorchTitan main's real classes (the optional ``make test-titan-main``).

TorchTitan main (the Grain era, ``torchtitan/components/data``) is not on PyPI and CI cannot
reach GitHub, so these tests run only under ``make test-titan-main TITAN_MAIN=SNAPSHOT``,
which builds ``.venv-titan-main`` with ``scripts/titan_main_env.sh`` and points
``$ZEPHON_TITAN_MAIN_VENV`` at it; elsewhere they skip, naming that command. The test
process runs in the project's venv (TorchTitan 0.3.0); every piece that touches TorchTitan
main runs in the main venv's Python:

- the DP 2 -> 3 -> 1 resume of ``test_torchtitan.py``, under ``torchrun`` (gloo, CPU) with
  main's ``CheckpointManager`` (``components/checkpointer``), its optimizer and LR-scheduler
  containers, and the loader built with the keywords main's ``Trainer.__init__`` passes
  (``max_context_length``, ``num_tokens_per_batch``): flat 1-D batches;
- the override applied to main's real ``llama3_debugmodel()`` ``Trainer.Config``, the config
  function parsed by main's ``ConfigManager``, and a batch through main's llama3 debug model
  and loss;
- the CI test's stand-in driver (``test_torchtitan.py::_MAIN_DRIVER``, which CI runs against
  stand-ins of main's classes) run unchanged against the real ones, so the stand-ins stay
  checked.

This file is also the ``torchrun`` worker (``python test_torchtitan_main.py --worker ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.integration

# Set by `make test-titan-main`: the plain suite never spends its time here, even where the
# venv exists.
VENV = os.environ.get("ZEPHON_TITAN_MAIN_VENV", "")
MAIN_PY = os.path.join(VENV, "bin", "python") if VENV else ""
SEQ_LEN = 32
ROWS = 2          # windows per rank per batch: num_tokens_per_batch = ROWS * SEQ_LEN
SEED = 11
STATE_KEYS = {"version", "dataset_id", "seed", "order", "cursor", "step"}

needs_main = pytest.mark.skipif(
    not (MAIN_PY and os.path.exists(MAIN_PY)),
    reason=(f"TorchTitan main's venv {VENV} is absent" if VENV else
            "TorchTitan main is an optional target (its venv is built from a snapshot of its "
            "repository; CI cannot reach GitHub)")
    + "; run: make test-titan-main TITAN_MAIN=<torchtitan source tree or bare git dir>")


def _main_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)


def _run_main(*args: str, timeout: int = 300) -> str:
    proc = subprocess.run([MAIN_PY, *args], env=_main_env(), capture_output=True, text=True,
                          timeout=timeout)
    what = "a driver script" if args[0] == "-c" else " ".join(args[:6])
    assert proc.returncode == 0, f"{what} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return proc.stdout


def _torchrun(nproc: int, *args: str) -> None:
    _run_main("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
              os.path.abspath(__file__), "--worker", *args)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """(dataset URL, every window [N, L+1]); 24 < N < 48, so a 48-window run crosses an epoch."""
    import numpy as np

    from tests.integration.torchtitan_worker import make_packed_dataset
    from zephon_store.read.dataset import open_dataset

    url = make_packed_dataset(str(tmp_path_factory.mktemp("titan-main")), seq_len=SEQ_LEN,
                              windows=40)
    ds = open_dataset(url)
    windows = np.array(ds.take(range(ds.num_samples)).column("tokens").to_pylist())
    assert 24 < len(windows) < 48 and len({tuple(w) for w in windows}) == len(windows)
    return url, windows


def _consumed(out: str, world: int, url: str) -> dict[int, tuple[int, list]]:
    """Position -> (sample id, delivered window) over every rank of one run: ids and positions
    from the run log by the library's run accounting (what ``zephon trace`` prints), windows
    as main's flat batches delivered them (``<out>/rank<r>.jsonl``)."""
    from zephon_store.runs.accounting import RunContext
    from zephon_store.runs.audit import rank_positions, segment_at

    records = {}
    for rank in range(world):
        with open(os.path.join(out, f"rank{rank}.jsonl")) as fh:
            for r in map(json.loads, fh):
                records[r["step"] - 1, rank] = r["windows"]   # train_state.step counts from 1
    steps = sorted({s for s, _ in records})
    ctx = RunContext(url, os.path.join(out, "zephon-runlog.jsonl"))
    got: dict[int, tuple[int, list]] = {}
    for t in ctx.trace(steps, end_step=steps[-1] + 1):
        assert t.reached and t.world_size == world
        parts = rank_positions(segment_at(ctx.segments, t.step), ctx.order_for(
            segment_at(ctx.segments, t.step)), t.step)
        for rank in range(world):
            for p, sid, w in zip(parts[rank].tolist(), t.ranks[rank], records[t.step, rank],
                                 strict=True):
                assert p not in got, f"position {p} consumed twice"
                got[p] = (int(sid), w)
    return got


@needs_main
def test_main_resume_on_other_dp_degrees_continues_exactly(packed, tmp_path):
    """TorchTitan main's CheckpointManager saves the loader after step 6 of a DP=2 run; the
    checkpoint resumes at DP=3 and DP=1 and the consumed windows continue exactly, token for
    token, as in the uninterrupted run (main's GrainDataLoader refuses both resumes)."""
    from torch.distributed.checkpoint import FileSystemReader

    from tests.helpers.stateful import assert_exactly_once_per_epoch

    url, windows = packed
    ckpt = str(tmp_path / "dump")
    common = ["--dataset", url, "--ckpt", ckpt, "--seed", str(SEED)]
    _torchrun(2, *common, "--out", str(tmp_path / "ref"), "--steps", "12", "--save-at", "6")
    ref = _consumed(str(tmp_path / "ref"), 2, url)
    assert sorted(ref) == list(range(48))
    assert assert_exactly_once_per_epoch({p: s for p, (s, _) in ref.items()}, len(windows)) == 1
    for p, (sid, window) in ref.items():   # the delivered tokens are the traced sample's
        assert window == windows[sid].tolist(), p

    meta = FileSystemReader(os.path.join(ckpt, "checkpoint", "step-6")).read_metadata()
    keys = sorted(k for k in meta.state_dict_metadata if k.startswith("dataloader."))
    assert "dataloader.cursor" in keys and not any("dp_rank" in k or "world_size" in k
                                                   for k in keys), keys

    for world in (3, 1):      # cursor 24: 24 windows left to position 48
        out = str(tmp_path / f"dp{world}")
        _torchrun(world, *common, "--out", out, "--steps", str(24 // (ROWS * world)),
                  "--load-step", "6")
        with open(os.path.join(out, "summary.json")) as fh:
            summary = json.load(fh)
        assert summary["start_cursor"] == 24 and summary["state"]["cursor"] == 48
        assert set(summary["state"]) == STATE_KEYS
        assert summary["torchtitan_api"] == "data"
        resumed = _consumed(out, world, url)
        assert sorted(resumed) == list(range(24, 48)), f"DP={world}: repeats or gaps"
        for p in range(24, 48):
            assert resumed[p] == ref[p], f"DP={world}: position {p} differs from the reference"


_CONFIG_DRIVER = r"""
import dataclasses, json, sys
import torch
from torchtitan.components.data.loader import BaseDataLoader, GrainDataLoader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.config import ConfigManager, OverrideConfig, apply_overrides
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from zephon_store.integrations.torchtitan import TORCHTITAN_API, ZephonDataLoader

url = sys.argv[1]
assert TORCHTITAN_API == "data" and issubclass(ZephonDataLoader, BaseDataLoader)
target = "zephon_store.integrations.torchtitan_override.use_zephon"

# The override on main's own llama3 debug config: the training loader is replaced, the
# validator keeps main's GrainDataLoader, repeat=False carries over as infinite=False.
cfg = llama3_debugmodel()
cfg.dataloader = dataclasses.replace(cfg.dataloader, repeat=False)
apply_overrides(OverrideConfig(imports=[(target, {"dataset": url, "seed": 7})]), cfg)
assert isinstance(cfg.dataloader, ZephonDataLoader.Config), type(cfg.dataloader)
assert (cfg.dataloader.dataset, cfg.dataloader.seed, cfg.dataloader.infinite) == (url, 7, False)
assert isinstance(cfg.validator.dataloader, GrainDataLoader.Config)
try:   # main's dataset field is a Grain graph, not a URL: no dataset is a clear error
    apply_overrides(OverrideConfig(imports=[target]), llama3_debugmodel())
    raise SystemExit("the override accepted a config without a dataset")
except ValueError as exc:
    assert "no dataset given" in str(exc), exc

# The config function through main's ConfigManager, then the loader built with the keywords
# Trainer.__init__ passes (training.max_context_length, num_tokens_per_microbatch_per_dp_rank).
cfg = ConfigManager().parse_args([
    "--module", "zephon_store.integrations.torchtitan", "--config", "zephon_llama3_debug",
    "--dataloader.dataset", url, "--dataloader.seed", "7",
    "--training.max_context_length", sys.argv[2],
    "--training.num_tokens_per_microbatch_per_dp_rank", sys.argv[3]])
assert isinstance(cfg.dataloader, ZephonDataLoader.Config) and cfg.dataloader.seed == 7
dl = cfg.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=None,
                          max_context_length=cfg.training.max_context_length,
                          num_tokens_per_batch=cfg.training.num_tokens_per_microbatch_per_dp_rank)
input_dict, labels = next(iter(dl))
n = cfg.training.num_tokens_per_microbatch_per_dp_rank
assert set(input_dict) == {"input", "positions"} and input_dict["input"].shape == (n,)
assert labels.shape == (n,) and int((labels != IGNORE_INDEX).sum()) == n

# Main's llama3 debug model and its loss on that batch, as Trainer.post_dataloading_process
# feeds it: Flex document masks from the positions. Forward only: Flex has no CPU backward.
model_config = model_registry("debugmodel").model
torch.manual_seed(0)
with torch.device("meta"):
    model = model_config.build()
model.to_empty(device="cpu")
model.init_states(buffer_device=None)
masks = model.get_attention_masks(positions=input_dict["positions"])
with torch.no_grad():
    logits = model(input_dict["input"], positions=input_dict["positions"],
                   attention_masks=masks)
    # The config's cross-entropy (its chunked wrapper needs the trainer's lm_head wiring).
    loss_fn = cfg.loss.loss_fn.build(compile_config=cfg.compile)
    loss, _ = loss_fn(logits, labels, torch.tensor(n))
assert torch.isfinite(loss), loss
print(json.dumps({"loss": float(loss), "mask": type(masks).__name__,
                  "state": dl.state_dict()}))
dl.close()
"""


@needs_main
def test_main_override_config_function_and_model(packed):
    """The override on main's real Trainer.Config, the config function through main's
    ConfigManager, a batch through main's llama3 debug model and loss."""
    url, _ = packed
    out = _run_main("-c", _CONFIG_DRIVER, url, str(SEQ_LEN), str(ROWS * SEQ_LEN))
    result = json.loads(out.strip().splitlines()[-1])
    assert result["state"]["cursor"] == ROWS and set(result["state"]) == STATE_KEYS
    assert result["loss"] > 0 and result["mask"] == "BlockMask"


@needs_main
def test_ci_stand_in_driver_passes_against_the_real_classes(packed):
    """test_torchtitan.py checks main's API in CI against stand-ins of its classes; the same
    driver, unchanged, passes against TorchTitan main itself."""
    from tests.integration import test_torchtitan

    url, windows = packed
    out = _run_main("-c", test_torchtitan._MAIN_DRIVER, url, str(SEQ_LEN))
    rows = json.loads(out.strip().splitlines()[-1])
    known = {tuple(w) for w in windows.tolist()}
    assert set(rows) == {"2", "3"} and all(tuple(r) in known for r in rows["3"])


# -- the torchrun worker (runs in the main venv) --------------------------------------------
def _build(args, world: int, rank: int):
    """The loader as main's Trainer builds it; main's optimizer, LR and checkpoint managers."""
    import torch
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

    from tests.integration.torchtitan_worker import TrainState  # the 0.3.0 worker's
    from zephon_store.integrations.torchtitan import ZephonDataLoader

    dataloader = ZephonDataLoader.Config(
        dataset=args.dataset, seed=args.seed, window_blocks=2, lanes=6,
        run_log=os.path.join(args.out, "zephon-runlog.jsonl"),
    ).build(dp_world_size=world, dp_rank=rank, tokenizer=None, max_context_length=SEQ_LEN,
            num_tokens_per_batch=ROWS * SEQ_LEN)
    torch.manual_seed(0)
    model = torch.nn.Linear(SEQ_LEN, 1)
    opt_cfg = default_adamw(lr=1e-3)
    opt_cfg.implementation = "for-loop"    # "fused" is CUDA-only
    optimizers = opt_cfg.build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(
        optimizers=optimizers, training_steps=1000)
    train_state = TrainState()
    ckpt = CheckpointManager.Config(
        enable=True, folder="checkpoint", interval=max(args.save_at, 1), keep_latest_k=0,
        last_save_model_only=False,
    ).build(dataloader=dataloader, model_parts=[model], optimizers=optimizers,
            lr_schedulers=schedulers, states={"train_state": train_state}, sd_adapter=None,
            base_folder=args.ckpt)
    return dataloader, model, optimizers, schedulers, train_state, ckpt


def _worker(argv) -> int:
    p = argparse.ArgumentParser()
    for name in ("--dataset", "--ckpt", "--out"):
        p.add_argument(name, required=True)
    for name, default in (("--steps", None), ("--save-at", 0), ("--load-step", 0),
                          ("--seed", SEED)):
        p.add_argument(name, type=int, default=default, required=default is None)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torchtitan.components.loss import IGNORE_INDEX

    from zephon_store.integrations.torchtitan import TORCHTITAN_API

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(args.out, exist_ok=True)
    dataloader, model, optimizers, schedulers, train_state, ckpt = _build(args, world, rank)
    if args.load_step:
        assert ckpt.load(step=args.load_step), "checkpoint not loaded"
        assert train_state.step == args.load_step, train_state.step
    start_cursor = dataloader.cursor
    n = ROWS * SEQ_LEN
    with open(os.path.join(args.out, f"rank{rank}.jsonl"), "a") as records:
        it = iter(dataloader)
        for _ in range(args.steps):
            input_dict, labels = next(it)
            # Main's batch contract (components/data/collators.py, Trainer.train_step):
            # 1-D token stream, every other key a model keyword, valid tokens from labels.
            assert set(input_dict) == {"input", "positions"}, sorted(input_dict)
            assert input_dict["input"].shape == labels.shape == (n,)
            assert int((labels != IGNORE_INDEX).sum()) == n
            x, y = input_dict["input"].view(ROWS, SEQ_LEN), labels.view(ROWS, SEQ_LEN)
            assert torch.equal(x[:, 1:], y[:, :-1])
            model(x.float() / 1000).sum().backward()
            for param in model.parameters():    # the DP all-reduce FSDP would do
                dist.all_reduce(param.grad)
            optimizers.step()
            schedulers.step()
            optimizers.zero_grad()
            train_state.step += 1
            records.write(json.dumps({"step": train_state.step,
                                      "windows": torch.cat([x, y[:, -1:]], 1).tolist()}) + "\n")
            if args.save_at:
                ckpt.save(curr_step=train_state.step)
            dist.barrier()
    dataloader.close()
    states = [None] * world
    dist.all_gather_object(states, dataloader.state_dict())
    assert all(s == states[0] for s in states), states
    if rank == 0:
        with open(os.path.join(args.out, "summary.json"), "w") as fh:
            json.dump({"start_cursor": start_cursor, "state": states[0],
                       "torchtitan_api": TORCHTITAN_API}, fh)
    ckpt.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.exit(_worker(sys.argv[2:]))
