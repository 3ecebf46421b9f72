#!/usr/bin/env bash
# The GPU tests (tests/test_cuda.py) on one GPU in P pytest processes side by side (default 8): the tests are bound by
# compile time on the host (each graphed stage compiles anew), not by the GPU, so shards cut the wall time
# several-fold (H200, 8 shards: the 105 tests in ~6 min, where one process got through 33 in ~9 min).
# K (a pytest -k expression) picks a subset; FILES (default tests/test_cuda.py) the test files; BUDGET (seconds,
# default 540) bounds every shard. Each shard's log (pytest -v, unbuffered: a shard cut by BUDGET still shows what
# passed and which test was running) goes to LOGS (default /tmp/dmtp_tests/TAG); with $OUT set, the logs are packed
# into one archive, $OUT/TAG.tgz (TAG default tests: a device command brings back at most 8 files). Prints each
# shard's summary line (or where BUDGET cut it) and the failures.
#     bash experiments/runs/h200_tests.sh                    # the whole file
#     K=verify_modes P=8 bash experiments/runs/h200_tests.sh
#     TAG=beside K='ready_server or beside_the_decode' P=10 BUDGET=200 bash experiments/runs/h200_tests.sh
#     FILES="tests/test_cuda.py tests/test_variants.py" K="on_gpu or flex" bash experiments/runs/h200_tests.sh
source "$(dirname "$0")/common.sh"  # PY, stamp, usage, wheels
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
P=${P:-8}; BUDGET=${BUDGET:-540}; TAG=${TAG:-tests}; FILES=${FILES:-tests/test_cuda.py}
[[ $TAG =~ ^[A-Za-z0-9._-]+$ ]] || { echo "[tests] TAG must be letters, digits, '.', '_' or '-', got '$TAG'"; exit 2; }
LOGS=${LOGS:-/tmp/dmtp_tests/$TAG}
export TOKENIZERS_PARALLELISM=false TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-2}
wheels
mkdir -p "$LOGS" && rm -f "$LOGS"/shard*.log "$LOGS"/collect.log  # this run's alone (summary, archive)
# the repository's addopts (-q) would make this -qq, which lists counts per file instead of the test ids
$PY -m pytest $FILES --collect-only -q -o addopts= -p no:cacheprovider ${K:+-k "$K"} > "$LOGS/collect.log" 2>&1
mapfile -t IDS < <(grep "::" "$LOGS/collect.log")
echo "[tests] ${#IDS[@]} tests in $P shards, ${BUDGET} s each at most"
[ ${#IDS[@]} -eq 0 ] && { echo "[tests] nothing collected; pytest's collection said:"; tail -15 "$LOGS/collect.log"
                          exit 1; }
pids=()
for s in $(seq 0 $((P - 1))); do
  mine=()
  for i in "${!IDS[@]}"; do [ $((i % P)) -eq $s ] && mine+=("${IDS[$i]}"); done
  [ ${#mine[@]} -eq 0 ] && continue
  timeout "$BUDGET" $PY -m pytest -o addopts= -v -p no:cacheprovider -rfE "${mine[@]}" > "$LOGS/shard$s.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for f in "$LOGS"/shard*.log; do
  last=$(grep -aE "^=+ .*(passed|failed|error|no tests ran).* in [0-9.]+s" "$f" | tail -1)
  if [ -n "$last" ]; then echo "[tests] $(basename "$f"): $last"
  else  # cut by BUDGET: what finished, and the test that was running
    running=$(grep -aoE "^[^ ]+::[^ ]+" "$f" | tail -1)
    echo "[tests] $(basename "$f"): cut at ${BUDGET} s: $(grep -ac " PASSED" "$f") passed, $(grep -ac " FAILED\| ERROR" \
      "$f") failed so far; running ${running:-nothing yet (still collecting)}"
  fi
  grep -aE "^FAILED|^ERROR" "$f"
done
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && tar czf "$OUT/$TAG.tgz.tmp" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" \
    && mv "$OUT/$TAG.tgz.tmp" "$OUT/$TAG.tgz" && echo "[tests] logs: \$OUT/$TAG.tgz"
fi
[ $rc -eq 0 ] && echo "[tests] all shards passed" || echo "[tests] a shard failed or ran out of time (rc=$rc)"
exit $rc
