#!/usr/bin/env bash
# The GPU tests (tests/test_cuda.py) on one GPU in P pytest processes side by side (default 8): the tests are bound by
# compile time on the host (each graphed stage compiles anew), not by the GPU, so shards cut the wall time
# several-fold (H200, 8 shards: the 105 tests in ~6 min, where one process got through 33 in ~9 min).
# K (a pytest -k expression) picks a subset; FILES (default tests/test_cuda.py) the test files; BUDGET (seconds,
# default 540) bounds every shard; $OUT (a folder), if set, receives one log per shard. Prints each shard's summary
# line and the failures.
#     bash experiments/runs/h200_tests.sh                    # the whole file
#     K=verify_modes P=8 bash experiments/runs/h200_tests.sh
#     FILES="tests/test_cuda.py tests/test_variants.py" K="on_gpu or flex" bash experiments/runs/h200_tests.sh
source "$(dirname "$0")/common.sh"  # PY, stamp, usage, wheels
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
P=${P:-8}; BUDGET=${BUDGET:-540}; LOGS=${OUT:-/tmp/dmtp_tests}; FILES=${FILES:-tests/test_cuda.py}
export TOKENIZERS_PARALLELISM=false TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-2}
wheels
mkdir -p "$LOGS"
mapfile -t IDS < <($PY -m pytest $FILES --collect-only -p no:cacheprovider ${K:+-k "$K"} 2>/dev/null | grep "::")
echo "[tests] ${#IDS[@]} tests in $P shards, ${BUDGET} s each at most"
[ ${#IDS[@]} -eq 0 ] && { echo "[tests] nothing collected"; exit 1; }
pids=()
for s in $(seq 0 $((P - 1))); do
  mine=()
  for i in "${!IDS[@]}"; do [ $((i % P)) -eq $s ] && mine+=("${IDS[$i]}"); done
  [ ${#mine[@]} -eq 0 ] && continue
  timeout "$BUDGET" $PY -m pytest -o addopts= -q -p no:cacheprovider -rfE "${mine[@]}" > "$LOGS/shard$s.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for f in "$LOGS"/shard*.log; do
  echo "[tests] $(basename "$f"): $(grep -E "passed|failed|error" "$f" | tail -1)"
  grep -E "^FAILED|^ERROR" "$f"
done
[ $rc -eq 0 ] && echo "[tests] all shards passed" || echo "[tests] a shard failed or ran out of time (rc=$rc)"
exit $rc
