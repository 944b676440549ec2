#!/usr/bin/env bash
# TorchTitan 0.3.0 + zephon on GPUs: stop a run at step 10, resume it on another number of
# GPUs, and check that the data and the loss curve continue as in an uninterrupted run.
#
#   scripts/torchtitan_gpu_run.sh [WORKDIR]            (default WORKDIR: /tmp/zephon-titan)
#
# Needs: CUDA GPUs; a Python ($PYTHON, default python3) with torch, torchtitan==0.3.0 (and
# triton, which its llama3 registry imports) and this repo installed:
#   pip install -e '.[torchtitan,tokenize]'
# Environment: NGPU (default: all visible GPUs), STEPS (20), STOP (10), SEQ_LEN (512),
# LOCAL_BATCH (8), WORKERS (conversion processes, 4).
#
# 1. tokenizer (BPE, 2000 tokens) + corpus (the Python standard library), no downloads;
# 2. zephon convert --tokenizer --seq-len: windows of SEQ_LEN+1 tokens;
# 3. run R: llama3_debugmodel, STEPS steps on NGPU GPUs, uninterrupted;
# 4. run A: the same, stopped after step STOP (--training.steps STOP, with
#    --lr_scheduler.total_steps STEPS so the LR schedule is R's) with a full checkpoint;
# 5. run B: resumes A's checkpoint on NGPU/2 GPUs (1 GPU: same GPU, half the local batch and
#    two gradient-accumulation steps) up to step STEPS; the global batch stays the same;
# 6. compare: every stream position consumed exactly once with the same window in R and in
#    A+B (the loader's audit log, `_seq` ids per position), and the loss curves.
# The loader is selected with the override (no config edits); section "Selecting the loader"
# of docs/torchtitan.md shows the --module/--config alternative.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(dirname "$HERE")"
PY="${PYTHON:-python3}"
WORK="${1:-/tmp/zephon-titan}"
NGPU="${NGPU:-$("$PY" -c 'import torch; print(torch.cuda.device_count())')}"
STEPS="${STEPS:-20}"
STOP="${STOP:-10}"
SEQ_LEN="${SEQ_LEN:-512}"
LOCAL_BATCH="${LOCAL_BATCH:-8}"
WORKERS="${WORKERS:-4}"

if [ "$NGPU" -lt 1 ]; then
  echo "no CUDA GPU visible; TorchTitan's trainer needs one (see docs/torchtitan.md)" >&2
  exit 2
fi
DP_A="$NGPU"
if [ "$NGPU" -ge 2 ]; then
  DP_B=$((NGPU / 2)); LOCAL_BATCH_B="$LOCAL_BATCH"
else
  DP_B=1; LOCAL_BATCH_B=$((LOCAL_BATCH / 2))
  echo "note: one GPU, so the resume changes the local batch ($LOCAL_BATCH -> $LOCAL_BATCH_B," \
       "2 gradient-accumulation steps), not the data-parallel degree" >&2
fi
GLOBAL_BATCH=$((LOCAL_BATCH * DP_A))
if [ $((GLOBAL_BATCH % (LOCAL_BATCH_B * DP_B))) -ne 0 ]; then
  echo "global batch $GLOBAL_BATCH is not a multiple of $LOCAL_BATCH_B x $DP_B" >&2; exit 2
fi

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$WORK"
# Only what this script writes: WORKDIR may hold other files.
(cd "$WORK" && rm -rf assets corpus ds ref run ref-audit run-audit ref.log run.log convert.json)
echo "== 1. tokenizer and corpus"
"$PY" "$HERE/torchtitan_gpu_check.py" prep --assets "$WORK/assets" --corpus "$WORK/corpus"

echo "== 2. convert with packing (seq_len $SEQ_LEN)"
"$PY" -m zephon_store.cli.main convert "$WORK/corpus" --output "$WORK/ds" \
  --tokenizer "$WORK/assets/tokenizer.json" --seq-len "$SEQ_LEN" --workers "$WORKERS" --json \
  | tee "$WORK/convert.json"

# train DP LOCAL_BATCH STEPS DUMP_FOLDER AUDIT_DIR [extra TorchTitan flags...]
train() {
  local dp="$1" lbs="$2" steps="$3" dump="$4" audit="$5"; shift 5
  local zephon="{\"dataset\": \"$WORK/ds\", \"seed\": 7, \"audit_dir\": \"$audit\"}"
  mkdir -p "$dump"
  "$PY" -m torch.distributed.run --standalone --nproc_per_node="$dp" --local-ranks-filter 0 \
    --role rank --tee 3 \
    -m torchtitan.train --module llama3 --config llama3_debugmodel \
    --override.imports "zephon_store.integrations.torchtitan_override.use_zephon=$zephon" \
    --hf_assets_path "$WORK/assets" --dump_folder "$dump" \
    --training.seq_len "$SEQ_LEN" --training.local_batch_size "$lbs" \
    --training.global_batch_size "$GLOBAL_BATCH" --training.steps "$steps" \
    --lr_scheduler.total_steps "$STEPS" --metrics.log_freq 1 \
    --metrics.disable_color_printing --debug.seed 42 "$@" 2>&1 | tee -a "$dump.log"
}

echo "== 3. run R: $STEPS steps on $DP_A GPU(s), uninterrupted"
train "$DP_A" "$LOCAL_BATCH" "$STEPS" "$WORK/ref" "$WORK/ref-audit"

echo "== 4. run A: stop after step $STOP with a checkpoint ($DP_A GPU(s))"
CKPT=(--checkpoint.enable --checkpoint.interval "$STOP" --checkpoint.folder checkpoint
      --checkpoint.no-last-save-model-only)
train "$DP_A" "$LOCAL_BATCH" "$STOP" "$WORK/run" "$WORK/run-audit" "${CKPT[@]}"
test -f "$WORK/run/checkpoint/step-$STOP/.metadata" || {
  echo "run A wrote no checkpoint at step $STOP" >&2; exit 1; }

echo "== 5. run B: resume on $DP_B GPU(s), local batch $LOCAL_BATCH_B, up to step $STEPS"
train "$DP_B" "$LOCAL_BATCH_B" "$STEPS" "$WORK/run" "$WORK/run-audit" "${CKPT[@]}"

echo "== 6. compare"
"$PY" "$HERE/torchtitan_gpu_check.py" compare --dataset "$WORK/ds" --ref-audit "$WORK/ref-audit" \
  --run-audit "$WORK/run-audit" --ref-log "$WORK/ref.log" --run-log "$WORK/run.log" \
  --steps "$STEPS" --global-batch "$GLOBAL_BATCH" --resume-step "$STOP"
