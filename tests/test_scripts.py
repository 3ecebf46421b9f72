"""The GPU run scripts (experiments/runs/*.sh) parse and print their usage: the mini chain script answers a wrong
verb with it and exit 2 (a rehearsal on a CPU: `PROFILE=smoke HOME=/tmp/r bash experiments/runs/h200_mini.sh
study`), the others answer --help with it and start nothing."""
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


@pytest.mark.parametrize("script, words", [("h200_engine.sh", "STEPS"), ("h200_tests.sh", "shards")])
def test_usage_on_help(script, words, tmp_path):
    r = subprocess.run(["bash", str(RUNS / script), "--help"], capture_output=True, text=True, cwd=tmp_path,
                       env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and words in r.stdout and f"bash experiments/runs/{script}" in r.stdout, r.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written
