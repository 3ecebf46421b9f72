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


def _stub(tmp_path):
    log, stub = tmp_path / "calls.txt", tmp_path / "py"
    stub.write_text(f"#!/usr/bin/env bash\n"
                    f"if [ \"$2\" = experiments.profiles ]; then exec {sys.executable} \"$@\"; fi\n"
                    f"echo \"$*\" >> {log}\n"
                    f"[ -n \"${{FAIL:-}}\" ] && [[ \"$*\" == *only_seeds=1* ]] && exit 1\nexit 0\n")
    stub.chmod(0o755)
    return log, dict(os.environ, PY=str(stub), PROFILE="smoke", WORK=str(tmp_path / "w"),
                     RESULTS=str(tmp_path / "r"), PYTHONPATH=str(ROOT))


def test_an_archive_is_packed_at_the_end_also_after_a_failed_part(tmp_path):
    """ARCHIVE=FILE: the first command and the tables pack it; a failing part still gets its tables and archive
    (which then says what is left), and the script exits 1."""
    log, env = _stub(tmp_path)
    r = subprocess.run(["bash", str(ROOT / "experiments" / "one_gpu.sh")], capture_output=True, text=True,
                       env=dict(env, FAIL="1", ARCHIVE="a.tgz"), cwd=ROOT, timeout=300)
    calls = log.read_text().splitlines()
    assert r.returncode == 1 and "a part failed" in r.stderr
    assert calls[0].endswith("--stage corpus,tokenizer,target,data --archive a.tgz")
    assert calls[-1].endswith("--stage tables --archive a.tgz")


def test_series_runs_realizations_side_by_side_each_packed(tmp_path):
    """experiments/series.sh K1 K2: one_gpu.sh per realization at once, the registered runs selected, each packed into
    ARCHIVES/r<k>.tgz, its exit code kept; a realization number that is not a number is refused."""
    log, env = _stub(tmp_path)
    arch = tmp_path / "arch"
    r = subprocess.run(["bash", str(ROOT / "experiments" / "series.sh"), "3", "4"], capture_output=True, text=True,
                       env=dict(env, ARCHIVES=str(arch)), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    calls = log.read_text().splitlines()
    for k in (3, 4):
        mine = [c for c in calls if f"realization={k} " in c]
        assert mine and all("ablation.only=ar,mtp,dflash,zero_init_residual,double_anchor_token_only" in c
                            for c in mine)
        assert any(c.endswith(f"--stage tables --archive {arch}/r{k}.tgz") for c in mine)
        assert (arch / f"r{k}.rc").read_text().strip() == "0"
    r = subprocess.run(["bash", str(ROOT / "experiments" / "series.sh"), "x"], capture_output=True, text=True,
                       env=dict(env, ARCHIVES=str(arch)), cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "not a number" in r.stderr


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
