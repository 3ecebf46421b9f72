#!/usr/bin/env bash
# A profile end to end on one GPU, the drafters' training and evaluation split into processes that share it (each
# line of `python -m dmtp.profiles PROFILE parts`: the baselines, the first seed's main rows, its
# supplementary rows, the other seeds; each evaluates its runs as soon as they are trained), which keeps a small
# model's GPU busier than one process does. What `make ablation-code` runs on a CUDA machine.
#   bash experiments/one_gpu.sh [KEY=VALUE ...]        # PROFILE (default mini), WORK, RESULTS, PY; KEY=VALUE: --set
#   PROFILE=smoke bash experiments/one_gpu.sh           # the same on a CPU, in a minute
#   ARCHIVE=r3.tgz bash experiments/one_gpu.sh realization=3   # and pack results/<folder> at the end (`dmtp land`),
#                                                             # also when a part failed (the archive then says what is left)
# Every stage resumes: the same command after a kill goes on where it stopped (logs: $RESULTS/<folder>/logs/).
set -euo pipefail
PY=${PY:-python}; PROFILE=${PROFILE:-mini}; WORK=${WORK:-work}; RESULTS=${RESULTS:-results}
SETS=(); for s in "$@"; do SETS+=(--set "$s"); done
P() { $PY -m dmtp.cli pipeline --profile "$PROFILE" --work "$WORK" --results "$RESULTS" "$@"; }
FOLDER=$($PY -m dmtp.profiles "$PROFILE" folder "$@")
LOGS=$RESULTS/$FOLDER/logs; mkdir -p "$LOGS"
P ${SETS[@]+"${SETS[@]}"} --stage corpus,tokenizer,target,data ${ARCHIVE:+--archive "$ARCHIVE"}
i=0; pids=()
while read -r line; do
  part=(); keys=" "; for s in $line; do part+=(--set "$s"); keys+="${s%%=*} "; done
  # a key the part sets (its runs: the given selection's share) replaces the same key given on the command line
  outer=(); for s in "$@"; do [[ $keys == *" ${s%%=*} "* ]] || outer+=(--set "$s"); done
  P ${outer[@]+"${outer[@]}"} --stage drafters,eval,curve "${part[@]}" > "$LOGS/part$i.txt" 2>&1 & pids+=($!)
  i=$((i + 1))
done < <($PY -m dmtp.profiles "$PROFILE" parts "$@")
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || echo "[one_gpu] a part failed: see $LOGS/part*.txt" >&2
[ $rc -eq 0 ] || [ -n "${ARCHIVE:-}" ] || exit 1
P ${SETS[@]+"${SETS[@]}"} --stage tables ${ARCHIVE:+--archive "$ARCHIVE"}
exit $rc
