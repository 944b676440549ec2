"""Helpers of scripts/torchtitan_gpu_run.sh: make the assets, then compare the runs.

``prep``: train a byte-level BPE tokenizer (vocabulary 2000, under the 2048 of TorchTitan's
llama3 debug model) on the Python standard library, write it with a tokenizer_config.json
naming BOS/EOS (TorchTitan's HuggingFaceTokenizer reads it), and write the corpus: one JSONL
record per standard-library module. Nothing is downloaded.

``compare``: given the run logs (in ``ZephonDataLoader.Config.audit_dir``) and the training
logs of an uninterrupted run and of a stopped-and-resumed run, check that every stream
position was consumed exactly once in both and held the same sample, and print the two loss
curves side by side. Exit status 1 on any data mismatch or a loss gap above ``--loss-tol``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import sysconfig

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
LOSS_RE = re.compile(r"step:\s*(\d+)\s+loss:\s*([-+0-9.eEnaif]+)")


def prep(args) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"),
                             recursive=True))
    texts = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            texts.append(fh.read())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts[: args.train_files], trainers.BpeTrainer(
        vocab_size=args.vocab_size, special_tokens=[BOS, EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(args.assets, exist_ok=True)
    tok.save(os.path.join(args.assets, "tokenizer.json"))
    with open(os.path.join(args.assets, "tokenizer_config.json"), "w") as fh:
        json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": False,
                   "add_eos_token": False}, fh)
    os.makedirs(args.corpus, exist_ok=True)
    docs, size = [], 0
    for f, text in zip(files, texts):
        if size >= args.max_bytes:
            break
        docs.append({"path": os.path.relpath(f, sysconfig.get_paths()["stdlib"]), "text": text})
        size += len(text)
    # Several inputs, so the conversion tokenizes in parallel (one input per worker task).
    per = -(-len(docs) // args.inputs)
    for k in range(0, len(docs), per):
        with open(os.path.join(args.corpus, f"stdlib-{k // per:03d}.jsonl"), "w") as fh:
            for d in docs[k:k + per]:
                fh.write(json.dumps(d) + "\n")
    n = len(docs)
    print(f"tokenizer ({tok.get_vocab_size()} tokens) in {args.assets}; {n} documents "
          f"({size / 1e6:.1f} MB) in {args.corpus}")
    return 0


def _consumed(dataset: str, audit_dir: str, total: int) -> dict[int, int]:
    """Position -> sample id over every rank of one run, from the run log in ``audit_dir``
    (``ZephonDataLoader.Config.audit_dir``), by the library's run accounting (what
    ``zephon trace`` prints); the library's audit must pass on it."""
    from zephon_store.load.runlog import RUNLOG_NAME
    from zephon_store.runs.accounting import RunContext
    from zephon_store.runs.audit import rank_positions, segment_at

    log = os.path.join(audit_dir, RUNLOG_NAME)
    if not os.path.exists(log):
        raise SystemExit(f"no run log {log}")
    ctx = RunContext(dataset, log)
    # The loader's steps are the trainer's micro-batches (local batch x DP windows each):
    # the run's end, in the last segment's steps.
    last = ctx.segments[-1]
    steps = last.first_step + (total - last.cursor) // last.global_batch
    report = ctx.audit(end_step=steps)
    if not report.ok:
        raise SystemExit(f"{log}: zephon audit fails: {report.to_dict()}")
    out: dict[int, int] = {}
    for t in ctx.trace(range(steps), end_step=steps):
        seg = segment_at(ctx.segments, t.step)
        for pos, ids in zip(rank_positions(seg, ctx.order_for(seg), t.step), t.ranks):
            for p, s in zip(pos.tolist(), ids):
                if p in out:
                    raise SystemExit(f"{log}: position {p} consumed twice (repeat)")
                out[p] = s
    return out


def _losses(logs: list[str]) -> dict[int, float]:
    out: dict[int, float] = {}
    for path in logs:
        with open(path, errors="replace") as fh:
            for line in fh:
                m = LOSS_RE.search(line)
                if m:
                    out.setdefault(int(m.group(1)), float(m.group(2)))
    return out


def compare(args) -> int:
    total = args.steps * args.global_batch
    ref = _consumed(args.dataset, args.ref_audit, total)
    run = _consumed(args.dataset, args.run_audit, total)
    ok = True
    for name, got in (("reference", ref), ("stopped+resumed", run)):
        if sorted(got) != list(range(total)):
            missing = sorted(set(range(total)) - set(got))[:10]
            extra = sorted(set(got) - set(range(total)))[:10]
            print(f"FAIL {name}: positions are not exactly [0, {total}): missing {missing}, "
                  f"extra {extra}")
            ok = False
    diff = [p for p in range(total) if ref.get(p) != run.get(p)]
    if diff:
        print(f"FAIL {len(diff)} positions hold other samples than in the reference, first "
              f"{diff[:10]}")
        ok = False
    else:
        print(f"OK   windows: all {total} positions consumed once, same sample as the "
              f"uninterrupted run ({args.steps} steps x global batch {args.global_batch})")
    lr, lrun = _losses(args.ref_log), _losses(args.run_log)
    print(f"{'step':>4}  {'reference':>10}  {'resumed':>10}  {'|diff|':>8}")
    worst = 0.0
    for step in range(1, args.steps + 1):
        a, b = lr.get(step), lrun.get(step)
        d = abs(a - b) if a is not None and b is not None else float("nan")
        worst = max(worst, d) if d == d else worst
        mark = "  <- resumed here" if step == args.resume_step + 1 else ""
        print(f"{step:>4}  {a if a is not None else float('nan'):>10.5f}  "
              f"{b if b is not None else float('nan'):>10.5f}  {d:>8.5f}{mark}")
    if len(lr) < args.steps or len(lrun) < args.steps:
        print(f"FAIL losses missing: reference has {len(lr)} steps, resumed run {len(lrun)}")
        ok = False
    elif worst > args.loss_tol:
        print(f"FAIL loss curves differ by up to {worst:.5f} (> --loss-tol {args.loss_tol})")
        ok = False
    else:
        print(f"OK   loss curves agree within {worst:.5f} (tolerance {args.loss_tol})")
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prep")
    a.add_argument("--assets", required=True)
    a.add_argument("--corpus", required=True)
    a.add_argument("--vocab-size", type=int, default=2000)
    a.add_argument("--train-files", type=int, default=400)
    # ~8 MB of source is ~3M tokens: 300+ steps of the debug run, converted in seconds.
    a.add_argument("--max-bytes", type=int, default=8_000_000)
    a.add_argument("--inputs", type=int, default=8, help="JSONL files to write")
    c = sub.add_parser("compare")
    c.add_argument("--dataset", required=True, help="the dataset both runs read")
    c.add_argument("--ref-audit", required=True)
    c.add_argument("--run-audit", required=True)
    c.add_argument("--ref-log", nargs="+", required=True)
    c.add_argument("--run-log", nargs="+", required=True)
    c.add_argument("--steps", type=int, required=True)
    c.add_argument("--global-batch", type=int, required=True)
    c.add_argument("--resume-step", type=int, required=True)
    # Another data-parallel degree changes the order of floating-point reductions, so the
    # resumed curve matches closely, not bitwise.
    c.add_argument("--loss-tol", type=float, default=0.05)
    args = p.parse_args(argv)
    return prep(args) if args.cmd == "prep" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
