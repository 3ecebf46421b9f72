#!/usr/bin/env bash
# One H200 command (<= 10 min): mini corpus + tokenizer, on-policy data, the dflash and zero_init_residual drafters
# (2 GPUs when present), then the end-to-end throughput benchmark (dynamic batching, caps 1..32, T = 0 and 1;
# env METHODS, PROMPTS, TEMPS narrow it).
set -uo pipefail
OUT=${OUT:-results/mini}; P=mini; W=work/$P; PY=python3
NG=$($PY -c "import torch; print(torch.cuda.device_count())")
RUN="$PY"; [ "$NG" -gt 1 ] && RUN="$PY -m torch.distributed.run --standalone --nproc_per_node=$NG"
t() { echo "[run] $(date +%T) $*"; }
if [ -n "${TARGET:-}" ] && [ ! -e $W/target/DONE ]; then mkdir -p $W && cp -r "$TARGET" $W/target; fi
t corpus+tokenizer; $PY -m dmtp.cli pipeline --profile $P --stage corpus,tokenizer 2>&1 | tail -2
t data; $RUN -m dmtp.cli pipeline --profile $P --stage data 2>&1 | grep -a "done\|data:" | tail -2
# only the drafters the benchmark uses (a subset of the ablation's runs)
t drafters; $RUN -m dmtp.cli pipeline --profile $P --stage drafters --set ablation.only=dflash,zero_init_residual \
  2>&1 | grep -a "done" | tail -2
t throughput; CUDA_VISIBLE_DEVICES=0 $PY -m dmtp.cli.bench --profile $P --target $W/target --drafters $W/drafters \
  --out $OUT/bench \
  --parts throughput --methods ${METHODS:-ar,mtp,dflash,zero_init_residual} --prompts ${PROMPTS:-40} \
  --temperatures ${TEMPS:-0,1} 2>&1 | grep -a "\[bench\]"
t end
