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
    """With a stand-in interpreter that logs the pipeline commands (and answers dmtp.profiles for real):
    the stages up to the data in one command, the drafters + evaluation + curve once per part of the profile (its
    --set assignments before the part's own), then the tables; a failing part fails the script, naming its log."""
    log, env = _stub(tmp_path)
    r = subprocess.run(["bash", str(ROOT / "experiments" / "one_gpu.sh"), "eval.new_tokens=8"], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    from dmtp.profiles import get_profile, parts

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


# the pipeline's own reading of a command's --set assignments (a key given twice with two values is refused)
SETS_CHECK = """
import sys
from dmtp.profiles import get_profile
from dmtp.schema import override
a = sys.argv[1:]
sets = [a[i + 1] for i, x in enumerate(a) if x == "--set"]
try:
    override(get_profile(a[a.index("--profile") + 1]), sets)
except ValueError as e:
    sys.exit(f"dmtp pipeline: error: {e}")
"""


def _stub(tmp_path):
    """A stand-in interpreter: answers dmtp.profiles for real, reads each pipeline command's --set assignments as the
    pipeline does (exit 2 on a refusal), and logs the command."""
    log, stub = tmp_path / "calls.txt", tmp_path / "py"
    (tmp_path / "sets_check.py").write_text(SETS_CHECK)
    stub.write_text(f"#!/usr/bin/env bash\n"
                    f"if [ \"$2\" = dmtp.profiles ]; then exec {sys.executable} \"$@\"; fi\n"
                    f"{sys.executable} {tmp_path / 'sets_check.py'} \"$@\" || exit 2\n"
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
        parts = [c for c in mine if "--stage drafters" in c]
        assert len(mine) == len(parts) + 2 and parts  # corpus..data, each part, tables: each accepted by the pipeline
        assert all("ablation.only=ar,mtp,dflash,zero_init_residual,double_anchor_token_only" in c
                   for c in mine if c not in parts)
        assert sorted(c.split("ablation.only=")[1].split()[0] for c in parts) == [  # the profile's parts' shares
            "ar,mtp", "dflash,zero_init_residual,double_anchor_token_only",
            "dflash,zero_init_residual,double_anchor_token_only"]
        assert any(c.endswith(f"--stage tables --archive {arch}/r{k}.tgz") for c in mine)
        assert (arch / f"r{k}.rc").read_text().strip() == "0"
    r = subprocess.run(["bash", str(ROOT / "experiments" / "series.sh"), "x"], capture_output=True, text=True,
                       env=dict(env, ARCHIVES=str(arch)), cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "not a number" in r.stderr


def test_a_series_realization_runs_for_real_and_lands(tmp_path):
    """series.sh for real on the smoke profile: every registered run trained and evaluated, the archive complete,
    and `dmtp land` puts it beside the others with each run's records (what a GPU job of the mini series does);
    with DIRECTIONS=1 the closing directions' study follows on the same target and data, trains only its two new
    drafters (the registered ones reused) and lands into a results folder of its own."""
    env = dict(os.environ, PY=sys.executable, PROFILE="smoke", WORK=str(tmp_path / "w"), RESULTS=str(tmp_path / "r"),
               ARCHIVES=str(tmp_path / "a"), PYTHONPATH=str(ROOT), DIRECTIONS="1",
               DIRECTIONS_RESULTS=str(tmp_path / "dirs"))
    r = subprocess.run(["bash", str(ROOT / "experiments" / "series.sh"), "5"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr + (tmp_path / "a" / "r5.log").read_text()[-3000:]
    assert "[series] r5 exit 0" in r.stdout
    landed = tmp_path / "landed"
    r = subprocess.run([sys.executable, "-m", "dmtp.cli", "land", str(tmp_path / "a" / "r5.tgz"), "--results",
                        str(landed), "--no-report"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    runs = landed / "smoke" / "r5" / "runs" / "ablation"
    registered = {"ar", "mtp", "dflash", "zero_init_residual", "double_anchor_token_only"}
    assert {d.name for d in runs.iterdir()} == registered
    assert all(list((runs / n).glob("humaneval_T0.jsonl*")) for n in registered)
    assert (tmp_path / "a" / "r5-directions.rc").read_text().strip() == "0"
    study = (tmp_path / "a" / "r5-directions.log").read_text()
    assert "drafters, seed 0: given, zero_init_residual_joint\n" in study
    r = subprocess.run([sys.executable, "-m", "dmtp.cli", "land", str(tmp_path / "a" / "r5-directions.tgz"),
                        "--results", str(tmp_path / "landed-dirs"), "--no-report"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    extra = {d.name for d in (tmp_path / "landed-dirs" / "smoke" / "r5" / "runs" / "ablation").iterdir()}
    assert {"given", "given-g0", "given-g3", "zero_init_residual_joint", "mtp.zero_init_residual_joint"} <= extra
    assert (tmp_path / "landed-dirs" / "smoke" / "r5" / "tables" / "directions.csv").exists()


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


# --- README's commands, as a newcomer runs them --------------------------------------------------------------------
# Every command of README's ```bash blocks, in a fresh shell (no variable of this session, `source .venv/bin/activate`
# as README says), through its own entry point: `make` targets dry-run (`make -n`), `dmtp` / `dmtp-torchrun` commands
# through their --help there and their whole argument list through the same parsers here, the CPU rehearsal's build
# run for real. A command no rule covers fails the test; the commands not run are listed with their reason.
NOT_RUN = {
    "pip install -e '.[notebook]' && jupyter lab notebooks/":
        "installs from a package index, then opens a Jupyter server (the extra is declared: pyproject.toml)",
}
REHEARSE = "/tmp/rehearse"  # README's rehearsal folder, moved under the test's tmp_path


def _uncommented(line: str) -> str:
    """A shell line without its comment (a `#` outside quotes, at the start or after a blank)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def readme_commands() -> list[str]:
    """README's ```bash commands, continuation lines joined, comments dropped."""
    out, in_bash, pending = [], False, ""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_bash = not in_bash and line.strip() == "```bash"
            continue
        if not in_bash:
            continue
        line = _uncommented(line)
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        cmd = " ".join((pending + line).split())
        pending = ""
        if cmd:
            out.append(cmd)
    return out


def _fresh(venv: Path, cmd: str, tmp: Path):
    """`cmd` in a fresh login-less shell at the repository root, README's environment activated."""
    env = {"HOME": os.environ.get("HOME", str(tmp)), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    script = f"set -e; cd {ROOT}; source {venv}/bin/activate; {cmd}"
    return subprocess.run(["bash", "--noprofile", "--norc", "-c", script], capture_output=True, text=True, env=env,
                          timeout=600)


def _argv(venv: Path, cmd: str, tmp: Path) -> list[str]:
    """The argument list the shell makes of `cmd` (quotes removed, `$(...)` run)."""
    r = _fresh(venv, f"printf '%s\\0' {cmd}", tmp)
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\0")[:-1]


def _dmtp_args(argv: list[str]):
    """`dmtp` arguments parsed by `dmtp`'s own parser (an unknown flag or a bad value fails here, as it would there)."""
    from dmtp.cli.main import parser

    return parser().parse_args(argv)


def test_every_readme_command_runs_as_written(tmp_path):
    venv = next((v for v in (ROOT / ".venv", Path(sys.prefix)) if (v / "bin" / "activate").exists()), None)
    if venv is None:
        pytest.skip("no virtual environment with bin/activate (README's `make venv`) runs these tests")
    cmds = readme_commands()
    assert cmds[:2] == ["make venv", "source .venv/bin/activate"]  # the install step, then README's environment
    seen, helped = set(), set()
    for raw in cmds[2:]:
        cmd = raw.replace(REHEARSE, str(tmp_path / "rehearse"))
        words = cmd.split()
        if raw in NOT_RUN:
            seen.add(raw)
        elif words[0] == "make":  # the target exists and expands; what it runs is checked below where it is a dmtp
            r = _fresh(venv, f"make -n {cmd[len('make '):]}", tmp_path)
            assert r.returncode == 0, f"{raw}: {r.stderr}"
            for line in r.stdout.replace("\\\n", " ").splitlines():  # its recipes' lines, continuations joined
                if " -m dmtp.cli " in line:
                    _dmtp_args(_argv(venv, line.split(" -m dmtp.cli ", 1)[1], tmp_path))
        elif words[0] == "dmtp":
            a = _dmtp_args(_argv(venv, cmd[len("dmtp "):], tmp_path))
            helped.add(f"dmtp {a.cmd} --help")
        elif words[0] == "dmtp-torchrun":
            from torch.distributed.run import get_args_parser

            t = get_args_parser().parse_args(_argv(venv, cmd[len("dmtp-torchrun "):], tmp_path))
            assert t.module and t.training_script == "dmtp.cli", raw
            _dmtp_args(t.training_script_args)
            helped.add("dmtp-torchrun --help")
        elif words[:4] == ["python", "-m", "experiments.reproduce_standin", "build"]:  # CPU, seconds: for real
            r = _fresh(venv, cmd, tmp_path)
            assert r.returncode == 0 and (tmp_path / "rehearse" / "data.flags").exists(), f"{raw}: {r.stderr[-2000:]}"
        else:
            pytest.fail(f"README command without a rule here (run it, or list it in NOT_RUN with why): {raw}")
    assert seen == set(NOT_RUN), f"NOT_RUN lists commands README no longer has: {set(NOT_RUN) - seen}"
    for h in sorted(helped):  # each entry point, as installed in README's environment
        r = _fresh(venv, h, tmp_path)
        assert r.returncode == 0 and "usage:" in r.stdout, f"{h}: {r.stderr[-2000:]}"
    import tomllib

    assert "jupyterlab" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "notebook"]
