"""One torchrun rank of the TorchTitan resume test (tests/integration/test_torchtitan.py).

Each rank builds ``ZephonDataLoader`` through TorchTitan's config machinery
(``ZephonDataLoader.Config(...).build(dp_world_size=, dp_rank=, tokenizer=, seq_len=,
local_batch_size=)``, the call ``Trainer.__init__`` makes), a tiny model with TorchTitan's
optimizer and LR-scheduler containers, and TorchTitan's own ``CheckpointManager``; then it
runs training steps over gloo:

- ``--save-at K``: save a checkpoint after step K (``CheckpointManager.save``: DCP, the
  ``dataloader`` entry flattened exactly as the trainer's checkpoints are);
- ``--load-step K``: first load that checkpoint (``CheckpointManager.load``), possibly at
  another data-parallel degree.

Every consumed batch is written to ``<out>/rank<r>.jsonl``: the step, the loader's cursor
after it, and the windows and positions rebuilt from ``input``/``labels``. The config's
``audit_dir`` (``<out>/audit``) holds the run log, from which the test traces the sample
ids and positions of each rank's step (the library's record; the windows delivered must be
those samples'), so it can compare runs token by token.

Also importable: :func:`make_packed_dataset` builds the small packed dataset the tests use.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import sysconfig


def make_packed_dataset(root: str, *, seq_len: int = 32, windows: int = 400) -> str:
    """Train a small byte-level BPE on stdlib sources; pack stdlib paragraphs into about
    ``windows`` windows of ``seq_len + 1`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from zephon_store.write.convert import convert
    from zephon_store.write.packing import PackingOptions, packing_convert_kwargs
    from zephon_store.write.shardwriter import WriteOptions

    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    texts = [open(f, encoding="utf-8", errors="replace").read() for f in files[:20]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(os.path.join(root, "raw"), exist_ok=True)
    tok_path = os.path.join(root, "tokenizer.json")
    tok.save(tok_path)
    paras, budget = [], windows * (seq_len + 1)
    for p in (p for t in texts[10:] for p in t.split("\n\n") if p.strip()):
        budget -= len(tok.encode(p, add_special_tokens=False).ids) + 2
        if budget < 0:
            break
        paras.append(p)
    for k in range(3):
        with open(os.path.join(root, "raw", f"part-{k}.jsonl"), "w") as fh:
            for p in paras[k::3]:
                fh.write(json.dumps({"text": p}) + "\n")
    out = os.path.join(root, "ds")
    convert([os.path.join(root, "raw")], out,
            options=WriteOptions(row_group_rows=4, row_group_bytes=None,
                                 target_shard_bytes=16 << 10),
            **packing_convert_kwargs(PackingOptions(tokenizer=tok_path, seq_len=seq_len,
                                                    strategy="concat")))
    return out


class TrainState:
    """The trainer's ``train_state`` entry: the step counter."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, sd: dict) -> None:
        self.step = int(sd["step"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="")
    p.add_argument("--mixture", default="", help="a mixture file instead of --dataset")
    p.add_argument("--ckpt", required=True, help="TorchTitan dump folder (checkpoints below)")
    p.add_argument("--out", required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--local-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True, help="steps to run in this process")
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--load-step", type=int, default=0)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--num-workers", type=int, default=0)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.optimizer import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw

    from zephon_store.integrations.torchtitan import ZephonDataLoader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    audit = os.path.join(args.out, "audit")
    dataloader = ZephonDataLoader.Config(
        dataset=args.dataset, mixture=args.mixture, seed=args.seed, window_blocks=2, lanes=6, audit_dir=audit,
        num_workers=args.num_workers,
    ).build(dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=args.seq_len,
            local_batch_size=args.local_batch, snapshot_every_n_steps=1)

    torch.manual_seed(0)
    model = torch.nn.Linear(args.seq_len, 1)
    opt_cfg = default_adamw(lr=1e-3)
    opt_cfg.implementation = "for-loop"  # "fused" is CUDA-only
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

    if args.load_step:
        assert ckpt.load(step=args.load_step), "checkpoint not loaded"
        assert train_state.step == args.load_step, train_state.step
    start_cursor = dataloader.cursor

    os.makedirs(args.out, exist_ok=True)
    records = open(os.path.join(args.out, f"rank{rank}.jsonl"), "a")
    it = iter(dataloader)
    for _ in range(args.steps):
        inputs, labels = next(it)
        assert set(inputs) == {"input", "positions"}, sorted(inputs)
        assert inputs["input"].shape == labels.shape == (args.local_batch, args.seq_len)
        assert inputs["input"].dtype == labels.dtype == torch.int64
        assert torch.equal(inputs["input"][:, 1:], labels[:, :-1])
        loss = model(inputs["input"].float() / 1000).sum()
        loss.backward()
        for param in model.parameters():  # a DP all-reduce, as the trainer's FSDP would do
            dist.all_reduce(param.grad)
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        train_state.step += 1
        windows = torch.cat([inputs["input"], labels[:, -1:]], dim=1)
        records.write(json.dumps({
            "step": train_state.step, "world_size": world, "rank": rank,
            "cursor_after": dataloader.cursor, "windows": windows.tolist(),
            "positions": inputs["positions"].tolist()}) + "\n")
        if args.save_at:
            ckpt.save(curr_step=train_state.step)
        dist.barrier()
    records.close()
    dataloader.close()
    states = [None] * world
    dist.all_gather_object(states, dataloader.state_dict())
    assert all(s == states[0] for s in states), states
    if rank == 0:
        with open(os.path.join(args.out, f"summary-dp{world}.json"), "w") as fh:
            json.dump({"start_cursor": start_cursor, "state": states[0]}, fh)
    ckpt.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
