#!/usr/bin/env bash
# One H200 command (~5 min, no trained model needed): the training benchmark on the mini shape — pretraining tok/s
# and MFU, the nine drafters' steps/s, eager and compiled side by side -> $OUT/bench/{train,ratios,meta_train}.json —
# then the GPU tests of the compiled training paths and of the flex-attention mask (log: $OUT/tests.log).
set -uo pipefail
OUT=${OUT:-results/mini}; PY=python3
export PYTHONUNBUFFERED=1
t() { echo "[run] $(date +%T) $*"; }
mkdir -p $OUT/bench
[ -e $OUT/bench/ratios.json ] || cp results/mini/bench/ratios.json $OUT/bench/ 2>/dev/null  # merged, not replaced
t bench-train; timeout 320 $PY -m dmtp.cli.bench_train --profile mini --out $OUT/bench 2>&1 | grep -a "bench-train\|Error"
t tests; timeout 230 $PY -m pytest -p no:cacheprovider -q -rs tests/test_cuda.py tests/test_variants.py \
  -k "on_gpu or flex" 2>&1 | tee $OUT/tests.log | tail -15
t end
