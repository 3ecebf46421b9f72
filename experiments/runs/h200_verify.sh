#!/usr/bin/env bash
# Verification modes at T > 0 on the trained mini (one H200). Expects work/mini/{target,tokenizer,drafters} with the
# dflash, fusion and zero_init_residual drafters (or $WORK pointing at a copy; $TARGET alone is not enough: the
# drafters are needed too). One device command per temperature keeps each under the 10-minute limit:
#   TEMPS=0.6 bash experiments/runs/h200_verify.sh     # ~7 min: 5 methods x 3 modes, caps 1 and 32, 2 timed repeats
#   TEMPS=1.0 bash experiments/runs/h200_verify.sh     # ~7 min, then the report renders both temperatures
#   CUDA_TESTS=1 TEMPS= bash experiments/runs/h200_verify.sh   # ~2 min: tests/test_cuda.py -k verify only
# Groups already done are skipped (a command cut short resumes). Artifacts: results/mini/verify/, rendered into
# results/mini/tables/verify*.{csv,md}, figures/verify_T*.png and the REPORT.md section.
set -uo pipefail
P=mini; WORK=${WORK:-work}; RESULTS=${RESULTS:-results}; PY=python3
t() { echo "[run] $(date +%T) $*"; }
if [ "${CUDA_TESTS:-0}" = 1 ]; then
  t cuda-tests; $PY -m pytest tests/test_cuda.py -q -k verify 2>&1 | tail -15
fi
for T in ${TEMPS-0.6 1.0}; do
  t "verify study T=$T"
  $PY -m dmtp.cli pipeline --profile $P --work "$WORK" --results "$RESULTS" --stage verify \
    --set "verify.temperatures=[$T]" 2>&1 | grep -a "verify \|error\|Error" | tail -40
done
t report; $PY -m dmtp.cli.report verify --profile $P --results "$RESULTS" 2>&1 | tail -3
cat "$RESULTS/$P/tables/verify.md" 2>/dev/null
t end
