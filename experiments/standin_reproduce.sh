#!/usr/bin/env bash
# `dmtp reproduce` on the paper-width stand-in, one GPU: qwen3.6-27b's target config cut to 4 layers with random
# weights (bf16, mtp.* keys, tokenizer padded to 248,320 with a chat template), 8 prompts of each evaluation set and
# 64 OpenPerfectBlend-format prompts (local copies in their published formats), 128 new tokens, 1-layer drafters
# (the five runs of dmtp/config/ablation.py, zero_init_residual continued from a public-layout DFlash checkpoint) trained
# 3 epochs at global batch 8, eager. Random weights never stop by themselves: the run measures each stage's wall time
# and the regeneration's tok/s per GPU (stages.json), never acceptance; the projection of the full protocol's time
# from them is written beside (labelled a projection).
#   experiments/standin_reproduce.sh DIR     # DIR receives stages.json, projection.txt, REPORT.md, tables/, metas
# PROFILE, BUILD (the stand-in's build flags) and SIZES (the --set flags) change the sizes; the chain at CPU toy size:
#   PROFILE=open-tiny BUILD="--tiny --rows 4 --train-rows 12" SIZES="" experiments/standin_reproduce.sh /tmp/x
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
START=$(date +%s)
stamp() { echo "[standin] $(date +%T) +$(( $(date +%s) - START ))s $*"; }
DIR=${1:?usage: experiments/standin_reproduce.sh DIR}
IN=${STANDIN:-/tmp/standin}
PROFILE=${PROFILE:-qwen3.6-27b}
BUILD=${BUILD:---device cuda --layers 4 --rows 8 --train-rows 64}
SIZES=${SIZES-"--set data.prompts=64 --set data.new_tokens=128 --set data.batch=64 --set drafter.layers=1
  --set train.batch_size=8 --set train.anchors_per_seq=32 --set train.max_len=512 --set train.compile=off
  --set train.log_every=4 --set eval.sets={\"gsm8k\":8,\"math500\":8,\"humaneval\":8,\"alpaca\":8,\"mtbench\":8}
  --set eval.new_tokens=128"}
mkdir -p "$DIR"
stamp "build the stand-in under $IN"
[ -f "$IN/done" ] || { $PY -m experiments.reproduce_standin build --out "$IN" $BUILD > "$IN.flags" \
  && touch "$IN/done"; } || exit 1
WORK=$IN/work
save() {  # the small outputs (no checkpoints) into DIR, after every stage: a cut run keeps what it measured
  cp "$WORK/stages.json" "$DIR/" 2>/dev/null
  [ -f "$WORK/data/train.meta.json" ] && cp "$WORK/data/train.meta.json" "$DIR/"
  [ -f "$WORK/drafters/meta.json" ] && cp "$WORK/drafters/meta.json" "$DIR/drafters.meta.json"
  [ -d "$WORK/runs" ] && (cd "$WORK" && find runs -name '*.meta.json' | tar cf - -T -) | (cd "$DIR" && tar xf -)
  [ -f "$WORK/REPORT.md" ] && cp -r "$WORK/REPORT.md" "$WORK/tables" "$DIR/"
  return 0
}
for stage in regen train eval report; do
  stamp "reproduce --stage $stage"
  # shellcheck disable=SC2086  # (flags split on purpose)
  $PY -m dmtp.cli reproduce --profile "$PROFILE" --target "$IN/target" --work "$WORK" $(cat "$IN.flags") \
    --init-from "$IN/dflash" --stage $stage $SIZES 2>&1 | grep -v 'it/s]$'; rc=${PIPESTATUS[0]}
  save
  [ "$rc" = 0 ] || { stamp "stage $stage failed ($rc)"; exit "$rc"; }
done
$PY -m experiments.reproduce_standin project "$WORK/stages.json" --gpus 8 --json "$DIR/projection.json" \
  | tee "$DIR/projection.txt"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$DIR/gpu.csv" 2>/dev/null
stamp done
