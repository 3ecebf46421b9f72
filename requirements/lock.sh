#!/usr/bin/env bash
# requirements/cpu.lock: every package of a CPU environment at its exact version (pip freeze, the suite's own
# editable install left out), so that `make venv` and CI resolve the same environment.
#   bash requirements/lock.sh [PYTHON]          # default .venv/bin/python; `make lock` runs it
set -euo pipefail
PY=${1:-.venv/bin/python}
cd "$(dirname "$0")/.."
$PY -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else "a CUDA torch: lock a CPU environment")'
{
  echo "# The CPU test environment, every package pinned: \`make venv\` installs it (torch's CPU build: pip finds it"
  echo "# on the index TORCH_INDEX names), then the suite without dependencies. Written by requirements/lock.sh from"
  echo "# a Python $($PY -c 'import platform; print(platform.python_version())') environment; do not edit by hand."
  $PY -m pip freeze --exclude-editable --all | grep -v -i -E '^(pip|setuptools|wheel)==' | LC_ALL=C sort -f
} > requirements/cpu.lock.tmp
mv requirements/cpu.lock.tmp requirements/cpu.lock
echo "requirements/cpu.lock: $(grep -vc '^#' requirements/cpu.lock) packages"
