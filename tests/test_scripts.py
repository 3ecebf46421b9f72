"""The GPU run scripts (experiments/runs/*.sh) parse, and the mini chain script answers a wrong phase with its usage
and exit 2 (a rehearsal on a CPU: `PROFILE=smoke HOME=/tmp/r bash experiments/runs/h200_mini.sh study`)."""
import shutil
import subprocess
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[1] / "experiments" / "runs"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.mark.parametrize("script", sorted(p.name for p in RUNS.glob("*.sh")))
def test_script_parses(script):
    r = subprocess.run(["bash", "-n", str(RUNS / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_mini_chain_usage(tmp_path):
    r = subprocess.run(["bash", str(RUNS / "h200_mini.sh"), "nonsense"], capture_output=True, text=True,
                       env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "study" in r.stdout and "watch SECONDS" in r.stdout
