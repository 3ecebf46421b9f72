#!/usr/bin/env bash
# One H200 command (<= 10 min): the compiled decode engine checked, then timed side by side with its baselines; every
# figure of the engine table lands in results/mini/bench (ratios.json beside each goal, overhead.csv, baselines.csv,
# regen.csv, profile_*.txt), written after each part so a step cut short keeps what it measured:
#   smoke    a tiny target decodes on the compiled engine as HF's greedy does (`python -m experiments.gpu_smoke`;
#            else stop: nothing is worth timing)
#   pipe     the `smoke` profile's pipeline end to end on the GPU with `mini`'s engine settings (bf16, dense kernel,
#            compiled prompt pass, grouped admission), then bench's overhead and throughput parts on its models:
#            every GPU path of a `mini` run (compiled pretraining with the fused loss, all drafters in one compiled
#            region, regeneration, evaluation, the server) in a minute or two, before a long run spends its time
#   paper    bench --paper-shape: Qwen3-8B shape, random weights: DMTP / DFlash rounds (exact and screened T1 head),
#            batch-1 engine vs HF's static-cache compiled generate and vs the same loop on the HF layers, verify of
#            8x8 rows vs an AR step, AR vs the HBM bound, kernel tables; with both attention kernels (flex, dense)
#   mini     bench --mini-shape: the mini shape, random weights: rounds, batch 1 vs HF's loop and compiled generate,
#            regeneration at batch 2048 (the data stage's decode), kernel tables; both attention kernels
#   train    bench_train --profile mini --kernel-profile 5: pretraining tok/s + MFU, drafter steps/s, eager vs
#            compiled, and where a compiled training step's time goes (profile_train_*.txt)
#   trained  a trained mini target at work/mini/target (or $TARGET) with drafters: bench overhead,hf,regen on it
#   tests    tests/test_cuda.py, a subset in the time left (stop strings on the compiled engine included; SUITE=all:
#            the whole file; TESTS_K: a pytest -k expression of your own, e.g. TESTS_K=verify_modes)
# SWEEP_PAPER / SWEEP_MINI: contexts for bench --kernel-sweep in the paper / mini step (off when unset). The batch-1
# baselines time the library's default engine (Inductor's autotuned kernels: the 8B shape's autotune ~2 min) beside
# Inductor's default kernels.
# STEPS (default smoke,paper,mini,train,trained,tests) picks steps, BUDGET (seconds, default 570) the time; $OUT
# (a folder), if set, receives engine.log and engine.tgz (the results folder). Ends with every ratio record of
# $RES/ratios.json, MET or MISS.
#     bash experiments/runs/h200_engine.sh
#     STEPS=smoke,trained,tests bash experiments/runs/h200_engine.sh     # once a trained mini target exists
source "$(dirname "$0")/common.sh"  # PY, stamp, usage, wheels, revision
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
RES=${RES:-results/mini/bench}; W=work/mini; BUDGET=${BUDGET:-570}
STEPS=",${STEPS:-smoke,paper,mini,train,trained,tests},"
export TOKENIZERS_PARALLELISM=false
wheels; revision  # HumanEval's prompts (the pipe and trained steps), the commit in every meta file
mkdir -p "$RES"
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
on() { [[ $STEPS == *",$1,"* ]]; }
BENCH="$PY -m dmtp.cli.bench --tokens 128 --batch 8 --kernel-profile --out $RES"
# SWEEP_PAPER / SWEEP_MINI (contexts, e.g. 512,2048,8192): AR batch 1 with each attention kernel per context
# (kernels.csv; each context compiles anew: ~1 min per context at the 8B shape)
SW_P=${SWEEP_PAPER:+--kernel-sweep $SWEEP_PAPER}; SW_M=${SWEEP_MINI:+--kernel-sweep $SWEEP_MINI}

smoke() { timeout 150 $PY -m experiments.gpu_smoke; }

pipe() {
  local w=/tmp/pipe_w r=/tmp/pipe_r e=(--set engine.dtype=bf16 --set engine.attention=dense
                                       --set engine.prefill=compiled --set engine.admit=2)
  rm -rf $w $r
  timeout ${PIPE_S:-300} $PY -m dmtp.cli pipeline --profile smoke --work $w --results $r "${e[@]}" 2>&1 \
    | grep -a "\[smoke\]\|rror" | tail -30 || return 1
  timeout 200 $PY -m dmtp.cli.bench --profile smoke "${e[@]}" --target $w/smoke/target --drafters $w/smoke/drafters \
    --out $RES/pipe --parts overhead,throughput --methods ar,mtp,dflash,zero_init_residual --caps 1,4 --prompts 8 \
    --small-cap-prompts 4 --repeats 2 --max-new-tokens 24 --tokens 32 2>&1 | grep -a "\[bench\]\|rror" | tail -30
}

main() {
  if on smoke; then stamp "smoke"; smoke || { stamp "smoke FAILED: stopping"; return 1; }; fi
  if on pipe; then stamp "pipe (the smoke pipeline on the GPU, mini's engine)"; pipe || stamp "pipe FAILED"; fi
  if on paper; then
    keep=60; on mini && keep=240
    stamp "bench --paper-shape"; timeout $(( $(left) - keep )) $BENCH --paper-shape $SW_P 2>&1 | grep -v -i "warn"
  fi
  if on mini; then stamp "bench --mini-shape"; timeout $(( $(left) - ${KEEP_MINI:-60} )) $BENCH --mini-shape $SW_M \
    ${SHAPE_PARTS:+--shape-parts $SHAPE_PARTS} 2>&1 | grep -v -i "warn"; fi
  if on train && [ "$(left)" -gt 200 ]; then
    stamp "bench_train"; timeout $(( $(left) - 30 )) $PY -m dmtp.cli.bench_train --profile mini --out "$RES" \
      --kernel-profile 5 ${TRAIN_ARGS:-} 2>&1 | grep -a "bench-train\|Error"
  fi
  if [ -n "${TARGET:-}" ] && [ ! -e $W/target/DONE ]; then mkdir -p $W && cp -r "$TARGET" $W/target; fi
  if on trained && [ -e $W/target/config.json ] && [ -d $W/drafters ] && [ "$(left)" -gt 60 ]; then
    stamp "bench on the trained target"
    timeout $(( $(left) - 30 )) $PY -m dmtp.cli.bench --target $W/target --drafters $W/drafters --out "$RES" \
      --parts overhead,hf,regen --methods ar,dflash,zero_init_residual 2>&1 | grep -v -i "warn"
  fi
  if on tests && [ "$(left)" -gt 20 ]; then
    stamp "tests ($(left) s left)"
    K="qwen3_5 and (zero_init_residual or dflash2) and (graphed_rounds or never_syncs or sampling_graphed)"
    K="$K or bf16 or large_batch or (server_captures and qwen3_5) or (stop_strings and zero_init_residual)"
    [ "${SUITE:-}" = all ] && K=""
    [ -n "${TESTS_K:-}" ] && K="$TESTS_K"
    timeout $(left) $PY -m pytest tests/test_cuda.py -q -x -p no:cacheprovider ${K:+-k "$K"} 2>&1 | tail -25
  fi
  stamp "end"
  if [ -f "$RES/ratios.json" ]; then $PY -m dmtp.analysis.ratios "$RES/ratios.json"; fi
}
if [ -n "${OUT:-}" ]; then
  main 2>&1 | tee "$OUT/engine.log"
  tar czf "$OUT/engine.tgz" "$RES"
else
  main
fi
