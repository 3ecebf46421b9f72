#!/usr/bin/env bash
# One 2xH200 command (<= 10 min): the mini target's corpus + tokenizer, the 1-vs-2-GPU pretraining check, on-policy
# data and three drafters on 2 GPUs, then the decode-engine benchmarks on GPU 0. Expects the pretrained mini target at
# work/mini/target (or $TARGET); writes under $OUT (default: results/mini). Logged in LOG.md.
set -uo pipefail
OUT=${OUT:-results/mini}; P=mini; W=work/$P; PY=python3
TORCHRUN="$PY -m torch.distributed.run --standalone --nproc_per_node=2"
t() { echo "[run] $(date +%T) $*"; }
if [ -n "${TARGET:-}" ] && [ ! -e $W/target/DONE ]; then mkdir -p $W && cp -r "$TARGET" $W/target; fi
t corpus+tokenizer; $PY -m dmtp.cli pipeline --profile $P --stage corpus,tokenizer 2>&1 | tail -3
t dpcheck; $PY -m experiments.dpcheck --profile $P --tokens ${DP_TOKENS:-6000000} --out $OUT/multigpu 2>&1 | grep -v Warn | tail -8
t data; $TORCHRUN -m dmtp.cli pipeline --profile $P --stage data 2>&1 | grep -v -i warn | tail -4
cp $W/data/train.meta.json $OUT/data_meta.json 2>/dev/null
# only the drafters the benchmarks use (a subset of the ablation's runs)
ONLY="--set ablation.only=dflash,t1_residual,zero_init_residual"
t drafters; $TORCHRUN -m dmtp.cli pipeline --profile $P --stage drafters $ONLY 2>&1 | grep -v -i warn | tail -4 \
  || $PY -m dmtp.cli pipeline --profile $P --stage drafters $ONLY 2>&1 | tail -4
B="$PY -m dmtp.cli.bench --profile $P --target $W/target --drafters $W/drafters --out $OUT/bench --screen-rank 128 \
  --screen-topk 64"
t bench-1; CUDA_VISIBLE_DEVICES=0 $B --parts overhead,hf,screen --prompts 64 2>&1 | grep -v Loading | tail -25
t bench-2; CUDA_VISIBLE_DEVICES=0 $B --parts throughput --prompts 64 2>&1 | grep -v Loading | tail -70
t end
