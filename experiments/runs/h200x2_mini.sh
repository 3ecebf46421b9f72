#!/usr/bin/env bash
# The `mini` experiment on 2 x H200, in phases that run in the background (setsid) and survive the device command
# that starts them, so one ~25-minute allotment is used by several short commands that only start and watch:
#
#   bash experiments/runs/h200x2_mini.sh start1            # corpus + tokenizer (CPU) | bench-train (GPU 1), then the
#                                                          # target (GPU 0), then the on-policy data (both GPUs)
#   bash experiments/runs/h200x2_mini.sh start2 [SET...]   # drafters: seed 0 on GPU 0, seeds 1, 2 on GPU 1
#   bash experiments/runs/h200x2_mini.sh start3            # eval + curve: seed 0 on GPU 0, seeds 1, 2 on GPU 1; tables
#   bash experiments/runs/h200x2_mini.sh start4            # verify study (GPU 1) | engine benchmarks (GPU 0)
#   bash experiments/runs/h200x2_mini.sh watch SECONDS     # wait (at most SECONDS) for the running phase; log tails
#   bash experiments/runs/h200x2_mini.sh pack              # results/mini + logs -> $OUT/mini.tgz
#
# Work and results live under $HOME/dmtp (kept between the commands of one held machine); each phase runs from a copy
# of the tree taken when it starts. SET: extra `--set` assignments (e.g. train.steps=2000), remembered for later
# phases so that the evaluation asks for the drafters that were trained.
source "$(dirname "$0")/mini_common.sh"  # H W R L, sets, P, snap, bg, stamp
TR() { (cd $H/src && torchrun --standalone --nproc_per_node 2 -m dmtp.cli pipeline --profile mini --work $W \
        --results $R $(sets) "$@"); }
export -f TR

case "${1:-}" in
start1)
  snap
  bg bench_train "cd $H/src && CUDA_VISIBLE_DEVICES=1 timeout 400 python3 -m dmtp.cli.bench_train --profile mini \
      --out $R/mini/bench --steps 40 --warm 10"
  bg phase1 "P --stage corpus,tokenizer && CUDA_VISIBLE_DEVICES=0 P --stage target && \
      while [ ! -f $L/bench_train.rc ]; do sleep 2; done && TR --stage data" ;;
start2)
  shift; : > $H/sets; for s in "$@"; do echo "$s" >> $H/sets; done
  snap
  bg drafters0 "CUDA_VISIBLE_DEVICES=0 P --stage drafters --set ablation.only_seeds=0"
  bg drafters12 "CUDA_VISIBLE_DEVICES=1 P --stage drafters --set ablation.only_seeds=1,2" ;;
start3)
  snap
  bg eval0 "CUDA_VISIBLE_DEVICES=0 P --stage eval,curve --set ablation.only_seeds=0"
  bg eval12 "CUDA_VISIBLE_DEVICES=1 P --stage eval,curve --set ablation.only_seeds=1,2"
  bg tables "while [ ! -f $L/eval0.rc ] || [ ! -f $L/eval12.rc ]; do sleep 2; done; CUDA_VISIBLE_DEVICES=0 \
      P --stage tables" ;;
start4)
  snap
  bg verify "CUDA_VISIBLE_DEVICES=1 P --stage verify"
  bg bench "cd $H/src && CUDA_VISIBLE_DEVICES=0 timeout 500 python3 -m dmtp.cli.bench --target $W/mini/target \
      --drafters $W/mini/drafters --out $R/mini/bench" ;;
all)  # every phase in one background chain (no command between phases): data -> drafters -> eval -> tables
  shift; : > $H/sets; for s in "$@"; do echo "$s" >> $H/sets; done
  snap
  bg all "P --stage corpus,tokenizer && CUDA_VISIBLE_DEVICES=0 P --stage target && TR --stage data && \
      { CUDA_VISIBLE_DEVICES=0 P --stage drafters --set ablation.only_seeds=0 > $L/d0.txt 2>&1 & \
        CUDA_VISIBLE_DEVICES=1 P --stage drafters --set ablation.only_seeds=1,2 > $L/d12.txt 2>&1; wait; } && \
      { CUDA_VISIBLE_DEVICES=0 P --stage eval,curve --set ablation.only_seeds=0 > $L/e0.txt 2>&1 & \
        CUDA_VISIBLE_DEVICES=1 P --stage eval,curve --set ablation.only_seeds=1,2 > $L/e12.txt 2>&1; wait; } && \
      CUDA_VISIBLE_DEVICES=0 P --stage tables" ;;
watch)
  end=$(( $(date +%s) + ${2:-500} ))
  while [ $(date +%s) -lt $end ]; do
    running=0
    for f in $L/*.log; do n=$(basename $f .log); [ -f $L/$n.rc ] || running=1; done
    [ $running = 0 ] && break; sleep 5
  done
  for f in $L/*.log; do n=$(basename $f .log)
    echo "=== $n rc=$(cat $L/$n.rc 2>/dev/null || echo running)"; cat $f $L/*.txt 2>/dev/null | tr '\r' '\n' < $f | grep -av "^\s*$" | grep -a \
      "\[mini\]\|\[run\]\|\[bench\|\[train\]\|rror\|MISS\|MET" | tail -${3:-12}
  done
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader ;;
pack)
  cp $L/*.log $L/*.txt $R/mini/ 2>/dev/null; mkdir -p $R/mini/logs; mv $R/mini/*.log $R/mini/*.txt $R/mini/logs/ 2>/dev/null
  tar czf $OUT/mini.tgz -C $R mini; ls -la $OUT ;;
*) sed -n 2,16p "$0"; exit 2 ;;
esac
