"""The shell entry points: experiments/one_gpu.sh (a profile on one GPU, its parts as processes sharing it) builds
the pipeline commands from the profile's parts; the test session keeps each failure as it happens (DMTP_FAILURES)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_one_gpu_runs_the_stages_then_one_process_per_part_then_the_tables(tmp_path):
    """With a stand-in interpreter that logs the pipeline commands (and answers experiments.profiles for real):
    the stages up to the data in one command, the drafters + evaluation + curve once per part of the profile (its
    --set assignments before the part's own), then the tables; a failing part fails the script, naming its log."""
    log = tmp_path / "calls.txt"
    stub = tmp_path / "py"
    stub.write_text(f"#!/usr/bin/env bash\n"
                    f"if [ \"$2\" = experiments.profiles ]; then exec {sys.executable} \"$@\"; fi\n"
                    f"echo \"$*\" >> {log}\n"
                    f"[ -n \"${{FAIL:-}}\" ] && [[ \"$*\" == *only_seeds=1* ]] && exit 1\nexit 0\n")
    stub.chmod(0o755)
    env = dict(os.environ, PY=str(stub), PROFILE="smoke", WORK=str(tmp_path / "w"), RESULTS=str(tmp_path / "r"),
               PYTHONPATH=str(ROOT))
    r = subprocess.run(["bash", str(ROOT / "experiments" / "one_gpu.sh"), "eval.new_tokens=8"], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    from experiments.profiles import get_profile, parts

    n = len(parts(get_profile("smoke")).splitlines())
    assert n == 4 and len(calls) == n + 2
    assert calls[0].endswith("--set eval.new_tokens=8 --stage corpus,tokenizer,target,data")
    assert calls[-1].endswith("--stage tables")
    middle = sorted(calls[1:-1])
    assert all("--set eval.new_tokens=8 --stage drafters,eval,curve --set ablation.only=" in c for c in middle)
    assert sum("ablation.only_seeds=1" in c for c in middle) == 1
    assert (tmp_path / "r" / "smoke" / "logs").is_dir()
    log.unlink()
    r = subprocess.run(["bash", str(ROOT / "experiments" / "one_gpu.sh")], capture_output=True, text=True,
                       env=dict(env, FAIL="1"), cwd=ROOT, timeout=300)
    assert r.returncode == 1 and "a part failed" in r.stderr and "--stage tables" not in log.read_text()


def test_test_failures_are_written_as_they_happen(tmp_path, monkeypatch):
    """A test run under a time limit (a job limit) may be cut before pytest's summary: with DMTP_FAILURES set, the
    test session appends each failure (test, phase, traceback) to that file when it is reported; passes add nothing,
    and without the variable nothing is written."""
    from conftest import pytest_runtest_logreport
    from types import SimpleNamespace

    log = tmp_path / "failures.txt"
    fail = SimpleNamespace(failed=True, nodeid="tests/test_cuda.py::test_x[qwen3-ar-2-2]", when="call",
                           longreprtext="AssertionError: assert [1, 2] == [1, 3]")
    ok = SimpleNamespace(failed=False, nodeid="tests/test_cuda.py::test_y", when="call", longreprtext="")
    monkeypatch.delenv("DMTP_FAILURES", raising=False)
    pytest_runtest_logreport(fail)
    assert not log.exists()
    monkeypatch.setenv("DMTP_FAILURES", str(log))
    for r in (ok, fail, SimpleNamespace(**{**vars(fail), "when": "setup", "nodeid": "t::z"})):
        pytest_runtest_logreport(r)
    text = log.read_text()
    assert text.count("=== ") == 2 and "test_x[qwen3-ar-2-2] (call)" in text and "t::z (setup)" in text
    assert "assert [1, 2] == [1, 3]" in text and "test_y" not in text
