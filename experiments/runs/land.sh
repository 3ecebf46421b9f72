#!/usr/bin/env bash
# land.sh TGZ [PROFILE]: the realizations an allotment packed (`h200_mini.sh pack`: TGZ = its $OUT/<profile>.tgz, a
# tar of results/<profile>) into results/<profile>/r<k>, on this machine: each new r<k> copied (one already here is
# never overwritten), its records compacted (.jsonl.gz), its own report rendered, then the pooled report of the
# profile; last, what to read first: the GPU tests' verdicts (logs/pre.txt, logs/pre_failures.txt), the chain's
# stamps and the benchmark's ratios.
# A realization whose chain had not ended (a `watch` snapshot from an allotment cut short: no 'end' stamp in its
# logs/all.log) never joins the pool: it is named and left out, or with PARTIAL=1 landed as <profile>/partial/r<k>.
#   bash experiments/runs/land.sh /path/to/files_at/mini.tgz          # RESULTS (default results), PY (python3)
source "$(dirname "$0")/common.sh"  # PY, usage
set -euo pipefail
case "${1:-}" in -h|--help) usage; exit 0 ;; "") usage; exit 2 ;; esac
TGZ=$1; PROFILE=${2:-mini}; RESULTS=${RESULTS:-results}
[ -f "$TGZ" ] || { echo "[land] $TGZ: no such archive" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tar xzf "$TGZ" -C "$tmp"
[ -d "$tmp/$PROFILE" ] || { echo "[land] $TGZ holds no $PROFILE/ folder (tar of results/<profile>)" >&2; exit 2; }
landed=()
for d in "$tmp/$PROFILE"/r*/; do
  [ -d "$d" ] || continue
  k=$(basename "$d"); k=${k#r}
  [[ $k =~ ^[0-9]+$ ]] || continue
  if ! grep -aq "^\[run\] .* end$" "$d/logs/all.log" 2>/dev/null; then
    # a snapshot (`watch`) of a chain that had not ended: its records may stop mid-stage, so it never joins the pool
    echo "[land] r$k: its chain had not ended when this archive was packed (no 'end' stamp in logs/all.log); the last"
    grep -ah "^\[run\]" "$d/logs/all.log" 2>/dev/null | tail -3 | sed 's/^/    /' || true
    if [ "${PARTIAL:-0}" != 1 ]; then
      echo "[land] r$k left out of $RESULTS/$PROFILE (PARTIAL=1 lands it apart, as $RESULTS/$PROFILE/partial/r$k," \
           "outside the pooled report)"; continue
    fi
    dest=$RESULTS/$PROFILE/partial/r$k
    if [ -e "$dest" ]; then echo "[land] $dest is already here: left as it is"; continue; fi
    mkdir -p "$RESULTS/$PROFILE/partial"
    cp -r "$d" "$dest.tmp" && mv "$dest.tmp" "$dest"
    echo "[land] r$k (unfinished) -> $dest"
    $PY -m dmtp.cli.report report --profile "$PROFILE/partial/r$k" --results "$RESULTS" 2>&1 \
      | grep -v "^\[report\] skip" || echo "[land] its own report could not be rendered (records cut mid-stage)"
    if [ -f "$dest/bench/ratios.json" ]; then $PY -m dmtp.analysis.ratios "$dest/bench/ratios.json" | tail -25 || true; fi
    continue
  fi
  if [ -e "$RESULTS/$PROFILE/r$k" ]; then
    free=1; while [ -e "$RESULTS/$PROFILE/r$free" ] || [ -e "$tmp/$PROFILE/r$free" ]; do free=$((free + 1)); done
    echo "[land] r$k is already in $RESULTS/$PROFILE: left as it is (a realization number names one realization;" \
         "the first free one is r$free: start the next chain with realization=$free)"; continue
  fi
  mkdir -p "$RESULTS/$PROFILE"
  cp -r "$d" "$RESULTS/$PROFILE/r$k.tmp" && mv "$RESULTS/$PROFILE/r$k.tmp" "$RESULTS/$PROFILE/r$k"
  $PY -m dmtp.cli.report compact --profile "$PROFILE" --realization "$k" --results "$RESULTS"
  $PY -m dmtp.cli.report report --profile "$PROFILE/r$k" --results "$RESULTS" | grep -v "^\[report\] skip" || true
  landed+=("$k")
done
[ ${#landed[@]} -gt 0 ] || { echo "[land] no new realization in $TGZ"; exit 0; }
$PY -m dmtp.cli.report report --profile "$PROFILE" --results "$RESULTS" | grep -v "^\[report\] skip" || true
for k in "${landed[@]}"; do
  r=$RESULTS/$PROFILE/r$k
  echo "=== r$k"
  grep -ah "^\[run\]" "$r/logs/all.log" 2>/dev/null | tail -12 || true
  if [ -f "$r/logs/pre.txt" ]; then
    echo "GPU tests (logs/pre.txt): $(grep -ac " PASSED" "$r/logs/pre.txt" || true) passed, $(grep -ac " FAILED" \
      "$r/logs/pre.txt" || true) failed; $(tail -1 "$r/logs/pre.txt")"
  fi
  if [ -s "$r/logs/pre_failures.txt" ]; then
    echo "failures with their tracebacks: $r/logs/pre_failures.txt"; grep -a "^=== " "$r/logs/pre_failures.txt" || true
  fi
  if [ -f "$r/bench/ratios.json" ]; then $PY -m dmtp.analysis.ratios "$r/bench/ratios.json" | tail -25; fi
done
exit 0
