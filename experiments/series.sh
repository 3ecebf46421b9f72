#!/usr/bin/env bash
# Realizations of the registered `mini` series, several at once on one GPU: each is `experiments/one_gpu.sh` with its
# own realization number and the registered runs (`ablation.only` is outside the experiment key, so they pool with
# full realizations), packed into $ARCHIVES/r<k>.tgz for `dmtp land` when it ends, finished or not. Fixed kernel
# choices make every chain's records independent of the others on the card (`tests/test_load_independence.py`); two
# chains at once gave 1.41x the throughput of one, and three do not fit an 80 GB card (`experiments/chains_check.py`,
# LOG.md 2026-12-07).
#   bash experiments/series.sh 1 2                      # r1 and r2 side by side; logs and archives in archives/
#   RUNS=ar,dflash ARCHIVES=/shared bash experiments/series.sh 3
#   DIRECTIONS=1 bash experiments/series.sh 3           # then the closing directions' study on r3's target and data
#       (`python -m dmtp.profiles mini directions`), into results/mini-directions, packed into r3-directions.tgz:
#       dmtp land archives/r3-directions.tgz --results results/mini-directions
# Exit 0 when every realization finished; each one's exit code is in $ARCHIVES/r<k>.rc.
set -uo pipefail
PY=${PY:-python}; PROFILE=${PROFILE:-mini}; ARCHIVES=${ARCHIVES:-archives}
RUNS=${RUNS:-ar,mtp,dflash,zero_init_residual,double_anchor_token_only}  # the primary family's runs (registered.py)
DIRECTIONS_RESULTS=${DIRECTIONS_RESULTS:-results/$PROFILE-directions}
[ $# -ge 1 ] || { echo "usage: bash experiments/series.sh K [K ...]   (realization numbers)" >&2; exit 2; }
mkdir -p "$ARCHIVES"
pids=()
for k in "$@"; do
  [[ $k =~ ^[0-9]+$ ]] || { echo "series.sh: realization '$k' is not a number" >&2; exit 2; }
  ( t0=$(date +%s)
    PY=$PY PROFILE=$PROFILE ARCHIVE="$ARCHIVES/r$k.tgz" bash experiments/one_gpu.sh realization="$k" \
      ablation.only="$RUNS" > "$ARCHIVES/r$k.log" 2>&1
    rc=$?; echo $rc > "$ARCHIVES/r$k.rc"
    echo "[series] r$k exit $rc after $(( $(date +%s) - t0 )) s"
    if [ -n "${DIRECTIONS:-}" ] && [ $rc -eq 0 ]; then  # outside the registered key: a results folder of its own
      SETS=(); for s in $($PY -m dmtp.profiles "$PROFILE" directions realization="$k"); do SETS+=(--set "$s"); done
      $PY -m dmtp.cli pipeline --profile "$PROFILE" --work "${WORK:-work}" --results "$DIRECTIONS_RESULTS" \
        --set realization="$k" "${SETS[@]}" --archive "$ARCHIVES/r$k-directions.tgz" \
        > "$ARCHIVES/r$k-directions.log" 2>&1
      d=$?; echo $d > "$ARCHIVES/r$k-directions.rc"
      echo "[series] r$k directions exit $d after $(( $(date +%s) - t0 )) s"
    fi ) &
  pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
for k in "$@"; do
  [ "$(cat "$ARCHIVES/r$k.rc" 2>/dev/null)" = 0 ] || rc=1
  [ -z "${DIRECTIONS:-}" ] || [ "$(cat "$ARCHIVES/r$k-directions.rc" 2>/dev/null)" = 0 ] || rc=1
done
exit $rc
