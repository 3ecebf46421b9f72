"""The run scripts (experiments/runs/*.sh) parse and print their usage: the mini chain script answers a wrong
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


def _left(tmp_path, *args, env=None):
    return subprocess.run(["bash", str(RUNS / "h200_mini.sh"), "left", *args], capture_output=True, text=True,
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", **(env or {})})


def test_mini_chain_left_sets_the_bench_end_from_the_allotment(tmp_path):
    """`left SECONDS` (the allotment's time left, from the last device command's lease) moves the chain's benchmark
    end to TAIL seconds before the allotment's, in seconds after the chain's start; bad input starts nothing."""
    import time
    r = _left(tmp_path, "900")  # no chain yet
    assert r.returncode == 2 and "no chain" in r.stdout
    logs = tmp_path / "dmtp" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for bad in ("", "12s", "-5"):
        r = _left(tmp_path, bad)
        assert r.returncode == 2 and "budget_left_s" in r.stdout, (bad, r.stdout)
    assert not (tmp_path / "dmtp" / "bench_until").exists()
    start = int(time.time()) - 500  # the chain started 500 s ago
    (logs / "all.start").write_text(f"{start}\n")
    (logs / "all.log").write_text("[run] 12:00:00 +1s corpus\n")
    r = _left(tmp_path, "1200", env={"TAIL": "300"})
    assert r.returncode == 0, r.stderr
    until = int((tmp_path / "dmtp" / "bench_until").read_text())
    assert abs(until - (500 + 1200 - 300)) <= 2 and "keeps its limit" not in r.stdout
    (logs / "all.log").write_text("[run] 12:00:00 +1s corpus\n[run] 12:15:00 +900s bench\n")
    r = _left(tmp_path, "800")  # the default TAIL; a bench already running keeps its limit, and says so
    until = int((tmp_path / "dmtp" / "bench_until").read_text())
    assert abs(until - (500 + 800 - 360)) <= 2 and "keeps its limit" in r.stdout


def _bench_run(tmp_path, until: int, *cmd):
    """`bench_run CMD` of the mini chain (its function definitions alone, START = now), BENCH_UNTIL = `until`."""
    import time
    text = (RUNS / "h200_mini.sh").read_text()
    defs = text[text.index("bench_s() {"): text.index("export -f bench_s bench_run")]
    script = f"H={tmp_path}; START={int(time.time())}; BENCH_UNTIL={until}\n{defs}\nbench_run {' '.join(cmd)}"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs timeout")
def test_mini_chain_leaves_a_benchmark_out_when_too_little_time_is_left(tmp_path):
    """A benchmark with less than BENCH_MIN (120 s) before its end does not start (a server's start-up alone takes
    longer, and the evaluation after it keeps its time); with enough left it runs under `timeout`."""
    mark = tmp_path / "ran"
    r = _bench_run(tmp_path, 60, "touch", str(mark))
    assert r.returncode == 0 and "left out" in r.stdout and not mark.exists(), r.stdout + r.stderr
    r = _bench_run(tmp_path, 600, "touch", str(mark))
    assert r.returncode == 0 and "left out" not in r.stdout and mark.exists(), r.stdout + r.stderr
    (tmp_path / "bench_until").write_text("30\n")  # `left` moved the end: it wins over BENCH_UNTIL
    mark.unlink()
    r = _bench_run(tmp_path, 600, "touch", str(mark))
    assert "left out" in r.stdout and not mark.exists()


def _session(sid: int) -> list[tuple[int, int]]:
    """(pid, process group) of every live process of session `sid` (zombies left out)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid=,sid=,stat="], capture_output=True, text=True).stdout
    return [(int(p), int(g)) for p, g, s, st in (ln.split()[:4] for ln in out.splitlines()) if int(s) == sid
            and not st.startswith("Z")]


@pytest.mark.skipif(shutil.which("timeout") is None or shutil.which("ps") is None, reason="needs timeout and ps")
def test_mini_chain_stop_ends_every_process_of_the_job_even_a_timeout_group(tmp_path):
    """`stop JOB` ends the job's whole session: `timeout` (the chain's benchmark runs under it) moves its command into
    a process group of its own, which a kill of the job's group alone leaves running."""
    import time
    logs = tmp_path / "dmtp" / "logs"
    logs.mkdir(parents=True)
    job = subprocess.Popen(["bash", "-c", "timeout 120 sleep 120 & sleep 120"], start_new_session=True)
    try:
        (logs / "j.pid").write_text(f"{job.pid}\n")
        for _ in range(50):  # the timeout group exists
            if len({g for _, g in _session(job.pid)}) >= 2:
                break
            time.sleep(0.1)
        assert len({g for _, g in _session(job.pid)}) >= 2
        r = subprocess.run(["bash", str(RUNS / "h200_mini.sh"), "stop", "j"], capture_output=True, text=True,
                           env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0 and "j stopped" in r.stdout, r.stderr
        job.wait(timeout=10)
        assert _session(job.pid) == []
    finally:
        if job.poll() is None:
            job.kill()


def test_gpu_test_failures_are_written_as_they_happen(tmp_path, monkeypatch):
    """The chain's GPU tests (PRE) run under a time limit that may cut pytest before its summary: with DMTP_FAILURES
    set, the test session appends each failure (test, phase, traceback) to that file when it is reported; passes add
    nothing, and without the variable nothing is written."""
    from conftest import pytest_runtest_logreport
    from types import SimpleNamespace

    log = tmp_path / "pre_failures.txt"
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
    script = (Path(__file__).parents[1] / "experiments/runs/h200_mini.sh").read_text()
    assert "DMTP_FAILURES=$L/pre_failures.txt" in script  # the chain's PRE tests keep their failures


def test_gpu_tests_script_reports_cut_shards_and_packs_its_logs_into_one_archive(tmp_path):
    """h200_tests.sh on a CPU with a test file of its own: a shard that ends prints pytest's summary and its failures;
    a shard cut by BUDGET says what passed before the cut and which test was running (pytest -v, unbuffered); with
    OUT set, every shard's log comes back in one archive ($OUT/TAG.tgz: a device command returns at most 8 files)."""
    import sys
    import tarfile

    (tmp_path / "test_fake.py").write_text(
        "import time\ndef test_ok(): pass\ndef test_bad(): assert 1 == 2\n"
        "def test_slow(): time.sleep(60)\ndef test_ok2(): pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -q\n")  # as the repository's pyproject.toml has
    env = {"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PY": sys.executable,
           "FILES": "test_fake.py", "P": "2", "BUDGET": "6", "TAG": "fake", "OUT": str(tmp_path / "out"),
           "LOGS": str(tmp_path / "logs" / "fake")}
    r = subprocess.run(["bash", str(RUNS / "h200_tests.sh")], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=120)
    out = r.stdout
    assert r.returncode == 1 and "4 tests in 2 shards, 6 s each at most" in out, out + r.stderr
    assert "shard0.log: cut at 6 s: 1 passed, 0 failed so far; running test_fake.py::test_slow" in out, out
    assert "1 failed, 1 passed" in out and "FAILED test_fake.py::test_bad" in out, out
    with tarfile.open(tmp_path / "out" / "fake.tgz") as t:
        assert sorted(t.getnames()) == ["fake", "fake/collect.log", "fake/shard0.log", "fake/shard1.log"]
    r = subprocess.run(["bash", str(RUNS / "h200_tests.sh")], capture_output=True, text=True, cwd=tmp_path,
                       env={**env, "K": "no_such_test"}, timeout=120)  # nothing collected: pytest's words shown
    assert r.returncode == 1 and "nothing collected; pytest's collection said:" in r.stdout, r.stdout
    assert "deselected" in r.stdout, r.stdout
    env["TAG"] = "a/b"
    r = subprocess.run(["bash", str(RUNS / "h200_tests.sh")], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "TAG must be" in r.stdout


def test_land_copies_a_packed_realization_compacts_and_reports_it(tmp_path):
    """land.sh TGZ: the realization an allotment packed lands in RESULTS/<profile>/r<k> (records compacted, its own
    REPORT.md and the pooled one rendered), the GPU tests' verdicts and failures are named, and a realization already
    landed is never overwritten."""
    import sys
    import tarfile

    from ablations.code import code
    from dmtp.analysis.report.synthetic import write_synthetic

    packed = write_synthetic(code(), tmp_path / "pack", "mini", n=4, temps=(0,), methods=["ar", "dflash"],
                             curve=False, oracle=False, bench=False, realization=7)
    (packed / "logs").mkdir()
    (packed / "logs" / "all.log").write_text("[run] 07:20:00 +2s corpus\n[run] 07:43:48 +1427s end\n")
    (packed / "logs" / "pre.txt").write_text("t.py::a PASSED\nt.py::b FAILED\n== 1 failed, 1 passed ==\n")
    (packed / "logs" / "pre_failures.txt").write_text("=== t.py::b (call)\nAssertionError: 1 == 2\n\n")
    tgz = tmp_path / "mini.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        t.add(tmp_path / "pack" / "mini", arcname="mini")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RESULTS": str(tmp_path / "res"), "PY": sys.executable,
           "PYTHONPATH": str(RUNS.parents[1])}
    run = lambda: subprocess.run(["bash", str(RUNS / "land.sh"), str(tgz)], capture_output=True, text=True,  # noqa: E731
                                 env=env, cwd=RUNS.parents[1])
    r = run()
    assert r.returncode == 0, r.stderr
    r7 = tmp_path / "res" / "mini" / "r7"
    assert (r7 / "REPORT.md").exists() and (tmp_path / "res" / "mini" / "REPORT.md").exists()
    assert list(r7.glob("runs/ablation/*/*.jsonl.gz")) and not list(r7.glob("runs/ablation/*/*.jsonl"))
    assert "GPU tests (logs/pre.txt): 1 passed, 1 failed" in r.stdout and "=== t.py::b (call)" in r.stdout
    (r7 / "NOTES.md").write_text("kept\n")
    again = run()
    assert again.returncode == 0 and "r7 is already in" in again.stdout and (r7 / "NOTES.md").read_text() == "kept\n"
    assert "the first free one is r1: start the next chain with realization=1" in again.stdout
    bad = subprocess.run(["bash", str(RUNS / "land.sh"), str(tmp_path / "none.tgz")], capture_output=True, text=True,
                         env=env)
    assert bad.returncode == 2 and "no such archive" in bad.stderr


def test_land_keeps_an_unfinished_chain_out_of_the_pool(tmp_path):
    """A `watch` snapshot packed before the chain ended (no 'end' stamp in logs/all.log: the machine was taken back
    later) is named and left out; with PARTIAL=1 it lands apart, as <profile>/partial/r<k>, which the pooled report
    never reads; a finished realization in the same archive lands as usual."""
    import sys
    import tarfile

    from ablations.code import code
    from dmtp.analysis.report.synthetic import write_synthetic

    for k, log in ((7, "[run] 07:20:00 +2s corpus\n[run] 07:43:48 +1427s end\n"),
                   (8, "[run] 08:53:07 +2s corpus\n[run] 09:10:16 +1031s bench\n")):
        packed = write_synthetic(code(), tmp_path / "pack", "mini", n=4, temps=(0,), methods=["ar", "dflash"],
                                 curve=False, oracle=False, bench=False, realization=k)
        (packed / "logs").mkdir()
        (packed / "logs" / "all.log").write_text(log)
    tgz = tmp_path / "mini.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        t.add(tmp_path / "pack" / "mini", arcname="mini")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RESULTS": str(tmp_path / "res"), "PY": sys.executable,
           "PYTHONPATH": str(RUNS.parents[1])}
    run = lambda **e: subprocess.run(["bash", str(RUNS / "land.sh"), str(tgz)], capture_output=True,  # noqa: E731
                                     text=True, env={**env, **e}, cwd=RUNS.parents[1])
    r = run()
    assert r.returncode == 0, r.stderr
    res = tmp_path / "res" / "mini"
    assert "r8: its chain had not ended" in r.stdout and "+1031s bench" in r.stdout and "PARTIAL=1" in r.stdout
    assert (res / "r7" / "REPORT.md").exists() and not (res / "r8").exists() and not (res / "partial").exists()
    r = run(PARTIAL="1")
    assert r.returncode == 0, r.stderr
    assert (res / "partial" / "r8" / "REPORT.md").exists() and not (res / "r8").exists(), r.stdout
    assert "r7 is already in" in r.stdout
    from dmtp.analysis.report.data import discover
    assert [k for k, _ in discover(res)] == [7]


def test_mini_chain_watch_packs_a_snapshot(tmp_path):
    """`watch` ends with a snapshot of what exists ($OUT/<profile>.tgz, written whole through a .tmp), so that a
    machine taken back during a later command still leaves the last one's results; it says whether the chain had
    ended, and SNAP=0 or no $OUT packs nothing."""
    import sys
    import tarfile

    h = tmp_path / "dmtp"
    (h / "logs").mkdir(parents=True)
    (h / "src").symlink_to(RUNS.parents[1])  # the chain's copy of the tree (`folder` asks experiments.profiles there)
    (h / "logs" / "all.start").write_text("0\n")
    (h / "logs" / "all.log").write_text("[run] 08:53:07 +2s corpus\n")
    (h / "logs" / "d1.txt").write_text("train:  10%|#  | 100/1000 [00:28<04:12,  3.57it/s]\r[mini] stage drafters\n")
    (h / "results" / "mini" / "r8" / "target").mkdir(parents=True)
    (h / "results" / "mini" / "r8" / "target" / "metrics.json").write_text("{}\n")
    out = tmp_path / "out"
    out.mkdir()
    env = {"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PY": sys.executable,
           "OUT": str(out)}
    watch = lambda **e: subprocess.run(["bash", str(RUNS / "h200_mini.sh"), "watch", "0"], capture_output=True,  # noqa: E731
                                       text=True, env={**env, **e}, cwd=RUNS.parents[1], timeout=120)
    (h / "sets").write_text("realization=8\n")
    r = watch()
    assert r.returncode == 0, r.stderr
    assert "=== all rc=running" in r.stdout and "[run] snapshot:" in r.stdout and "had not ended" in r.stdout, r.stdout
    with tarfile.open(out / "mini.tgz") as t:
        names = t.getnames()
        assert "mini/r8/target/metrics.json" in names and "mini/r8/logs/d1.txt" in names, names
        d1 = t.extractfile("mini/r8/logs/d1.txt").read().decode()
    assert "[mini] stage drafters" in d1 and "it/s" not in d1  # progress-bar lines dropped
    assert not list(out.glob("*.tmp"))
    (h / "logs" / "all.rc").write_text("0\n")
    r = watch()
    assert "the chain has ended" in r.stdout, r.stdout
    (out / "mini.tgz").unlink()
    for e in ({"SNAP": "0"}, {"OUT": ""}):
        r = watch(**e)
        assert r.returncode == 0 and "snapshot" not in r.stdout and not (out / "mini.tgz").exists(), (e, r.stdout)

