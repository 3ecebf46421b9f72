"""No run loses finished work and no output claims a configuration that did not make it: stage fingerprints
(refused or --force), `dmtp generate` appending and resuming, pretraining and drafter training finishing after a
kill at their last step."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from conftest import make_drafter

from dmtp.cli import main as cli_main
from dmtp.cli import pipeline, stages
from dmtp.cli.main import main as dmtp
from dmtp.io import one_writer, read_jsonl
from dmtp.models import tiny
from dmtp.schema import override
from dmtp.training import drafters as train_mod
from dmtp.training.drafters import TrainConfig, new_drafters, train_drafters
from dmtp.training.pretrain import PretrainConfig, TargetArch, build_target, pretrain
from dmtp.profiles import get_profile


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tiny.save(tgt, mtp, root / "target")
    tiny.save(tgt, mtp, root / "nomtp", with_mtp=False)
    make_drafter(tgt, "zero_init_residual").save(root / "zir")
    (root / "p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt_ids": [3 + i, 5, 7]}) + "\n"
                                          for i in range(5)))
    (root / "data.jsonl").write_text("".join(json.dumps({"ids": [3 + (i * 7 + j) % 90 for j in range(24)]}) + "\n"
                                             for i in range(6)))
    return root, tgt, mtp


# --- stage fingerprints ---------------------------------------------------------------------------------------
def test_fingerprint_differences_name_the_fields(tmp_path):
    old = stages.fingerprint({"train": TrainConfig(steps=6), "arch": {"hidden_size": 64}})
    new = stages.fingerprint({"train": TrainConfig(steps=200, stop_after=3), "arch": {"hidden_size": 128}})
    assert "stop_after" not in new["train"]  # run control is not configuration
    assert stages.differences(old, new) == ["train.steps: 6 -> 200", "arch.hidden_size: 64 -> 128"]
    out = tmp_path / "stage"
    u = stages.Unit(str(out), new, out / "fingerprint.json", [out])
    assert stages.check(u) is False  # nothing there yet
    out.mkdir()
    stages.record(stages.Unit(str(out), old, out / "fingerprint.json", [out]))
    (out / "weights").write_text("old")
    with pytest.raises(stages.StageMismatch, match=r"stage \(train.steps: 6 -> 200, arch.hidden_size: 64 -> 128\)"):
        stages.check(u)
    assert (out / "weights").exists()  # refused: nothing touched
    assert stages.check(u, force=True) is False and not out.exists()  # --force: the old output is gone


def test_a_corrupt_record_is_an_error_and_force_redoes_it(tmp_path):
    out = tmp_path / "stage"
    out.mkdir()
    (out / "weights").write_text("old")
    (out / "fingerprint.json").write_text('{"fingerprint": {"train": {"ste')  # cut by a full disk, say
    u = stages.Unit(str(out), {"train": {"steps": 6}}, out / "fingerprint.json", [out])
    with pytest.raises(stages.StageMismatch, match=r"fingerprint.json:1: not valid JSON"):
        stages.check(u)
    with pytest.raises(stages.StageMismatch, match="record cannot be read"):
        stages.preflight([u])
    assert (out / "weights").exists()
    assert stages.check(u, force=True) is False and not out.exists()


def test_pipeline_refuses_changed_settings_on_finished_stages(tmp_path, capsys):
    """A finished target and drafter (their records as the smoke profile writes them) and more steps / a wider
    target requested: refused before any work, naming the fields; no metadata is written."""
    from argparse import Namespace

    a = Namespace(profile="smoke", work=str(tmp_path / "w"), results=str(tmp_path / "r"), set=[], force=False,
                  stage="target,drafters")
    c = pipeline.Ctx(a)
    for s in ("target", "drafters"):
        for u in pipeline.units(c, s):
            # a curve run is finished with its annealed branches
            extra = pipeline.branches(c, u.run["run"], u.run["seed"]).values() if s == "drafters" else ()
            for d in (u.outputs[0], *extra):
                d.mkdir(parents=True)
                (d / "DONE").write_text("ok\n")
        for u in pipeline.units(c, s):  # a finished target keeps its record in its own folder
            stages.record(u)
    pipeline.main(a)  # the same configuration: nothing to do
    a.set = ["train.steps=200", "model.arch.hidden_size=128"]
    with pytest.raises(stages.StageMismatch) as e:
        pipeline.main(a)
    msg = str(e.value)
    assert "smoke/target (model.arch.hidden_size: 64 -> 128)" in msg
    assert "(model.arch.hidden_size: 64 -> 128, train.steps: 6 -> 200)" in msg and "--force" in msg
    assert not (tmp_path / "r").exists()
    # --force redoes the stages run, never their inputs: eval runs would claim drafters of 7 steps
    a.set, a.stage, a.force = ["train.steps=7"], "eval", True
    with pytest.raises(stages.StageMismatch, match=r"drafters/\w+ was made with another configuration than the one "
                       r"requested \(train.steps: 6 -> 7\): redo it \(--stage drafters --force\)"):
        pipeline.main(a)
    assert not list((tmp_path / "r").rglob("*.json*"))  # no run, no experiment.json claiming 7 steps
    # the profile's own units: an eval run depends on the drafter's training, an ar run only on the target's
    c = pipeline.Ctx(Namespace(profile="smoke", work=str(tmp_path / "w"), results=str(tmp_path / "r"),
                               set=["train.steps=7"]))
    ev = {u.want["run"]["method"]: u.want for u in pipeline.units(c, "eval")}
    assert ev["dflash"]["train"]["steps"] == 7 and "train" not in ev["ar"] and ev["mtp"]["eval.mtp_steps"] == 4


def test_train_refuses_a_finished_drafter_of_another_configuration(ckpt, tmp_path, capsys):
    root, _, _ = ckpt
    shutil.copy(root / "data.jsonl", tmp_path / "data.jsonl")
    base = ["train", "--target", str(root / "nomtp"), "--data", str(tmp_path / "data.jsonl"), "--out",
            str(tmp_path / "d"), "--variants", "dflash", "--batch-size", "2", "--max-len", "16",
            "--mask-token-id", "2"]
    dmtp(base + ["--steps", "1"])  # dflash reads no MTP head: a target without one is fine
    assert (tmp_path / "d" / "dflash" / "DONE").exists()
    before = (tmp_path / "d" / "dflash" / "drafter" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit) as e:
        dmtp(base + ["--steps", "2"])
    assert e.value.code == 2 and "train.steps: 1 -> 2" in capsys.readouterr().err
    assert (tmp_path / "d" / "dflash" / "drafter" / "model.safetensors").read_bytes() == before
    dmtp(base + ["--steps", "1"])  # the recorded settings: nothing to train
    assert "nothing to train" in capsys.readouterr().out
    data = (tmp_path / "data.jsonl").read_text()
    (tmp_path / "data.jsonl").write_text(data.replace("[3,", "[4,", 1))  # the same path and size, other tokens
    with pytest.raises(SystemExit):
        dmtp(base + ["--steps", "1"])
    assert "data.sha256: " in capsys.readouterr().err
    (tmp_path / "data.jsonl").write_text(data)
    dmtp(base + ["--steps", "2", "--force"])
    assert "2 steps" in (tmp_path / "d" / "dflash" / "DONE").read_text()


# --- dmtp generate: append and resume -------------------------------------------------------------------------
def test_generate_says_what_it_is_doing_before_its_first_record(ckpt, tmp_path, capsys):
    """While a user waits for the first record, one stderr line per phase, with the seconds since the command
    started: inputs checked, models loaded (and how long that took), the first batch decoding on which engine, the
    first records written."""
    import re

    root, _, _ = ckpt
    argv = ["generate", "--target", str(root / "target"), "--method", "mtp", "--prompts", str(root / "p.jsonl"),
            "--max-new-tokens", "4", "--batch-size", "2", "--out", str(tmp_path / "o.jsonl")]
    dmtp(argv)
    err = capsys.readouterr().err  # (tqdm's bars redraw with carriage returns and cursor moves around the lines)
    lines = re.findall(r"\[dmtp generate +[0-9.]+s\] [^\r\n]*", err)
    assert [re.sub(r"^\[dmtp generate +[0-9.]+s\] ", "", ln).split(":")[0].split(" in ")[0] for ln in lines] == [
        "inputs checked", "loaded the target and the MTP head", "decoding batch 1 of 3 on the hf engine",
        f"first 2 records written to {tmp_path / 'o.jsonl'}"]
    times = [float(re.match(r"\[dmtp generate +([0-9.]+)s\]", ln).group(1)) for ln in lines]
    assert times == sorted(times) and "5 prompts, 3 batch(es) of at most 2" in lines[0]


def test_generate_resumes_after_a_kill(ckpt, tmp_path, monkeypatch, capsys):
    """Killed after the first batch: the records of that batch are on disk; the rerun decodes the rest only and the
    file equals an uninterrupted run's (T > 0: every batch keeps its seed)."""
    root, _, _ = ckpt
    argv = ["generate", "--target", str(root / "target"), "--method", "mtp", "--prompts", str(root / "p.jsonl"),
            "--temperature", "0.7", "--max-new-tokens", "6", "--batch-size", "2", "--seed", "3"]
    dmtp(argv + ["--out", str(tmp_path / "whole.jsonl")])
    whole = read_jsonl(tmp_path / "whole.jsonl")
    assert [r["id"] for r in whole] == [f"p{i}" for i in range(5)] and all("prompt_ids" in r for r in whole)

    real, calls = cli_main.run_generate, []

    def killed_after_one_batch(*a, **k):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(cli_main, "run_generate", killed_after_one_batch)
    out = tmp_path / "o.jsonl"
    with pytest.raises(SystemExit) as e:
        dmtp(argv + ["--out", str(out)])
    assert e.value.code == 130 and "resumes" in capsys.readouterr().err
    assert [r["id"] for r in read_jsonl(out)] == ["p0", "p1"]
    with open(out, "a") as f:
        f.write('{"id": "p2", "outp')  # a line cut by the kill
    monkeypatch.setattr(cli_main, "run_generate", real)
    decoded = []
    monkeypatch.setattr(cli_main, "run_generate", lambda tgt, m, chunk, *a, **k: decoded.append(
        [p["id"] for p in chunk]) or real(tgt, m, chunk, *a, **k))
    dmtp(argv + ["--out", str(out)])
    assert decoded == [["p2", "p3"], ["p4"]]
    got = read_jsonl(out)
    assert [(r["id"], r["output_ids"], r["accepted"]) for r in got] == \
        [(r["id"], r["output_ids"], r["accepted"]) for r in whole]
    assert json.loads((tmp_path / "o.jsonl.meta.json").read_text())["finished"] is True
    dmtp(argv + ["--out", str(out)])
    assert "all 5 prompts already in" in capsys.readouterr().out


# --- Ctrl-C: exit 130 in one line, the saved state as it was ----------------------------------------------------
# a real SIGINT in the middle of writing trainer_state.pt (torch.save writes through a Python file object, so the
# interrupt arrives inside torch's writer, as a terminal's Ctrl-C during the save would)
CTRL_C_IN_SAVE = """
import sys
import dmtp.io

class Interrupted:
    def __init__(self, f):
        self.f, self.n = f, 0
    def write(self, b):
        self.n += 1
        if self.n == 2:  # what Python's SIGINT handler raises when Ctrl-C lands in this write; os.kill would let
            raise KeyboardInterrupt  # the kernel pick the thread, and the main thread then notices it later
        return self.f.write(b)
    def __getattr__(self, k):
        return getattr(self.f, k)
    def __enter__(self):
        return self
    def __exit__(self, *e):
        self.f.close()

def interrupting_open(path, mode="r", *a, **k):
    f = open(path, mode, *a, **k)
    return Interrupted(f) if "trainer_state.pt" in str(path) and "w" in mode else f

dmtp.io.open = interrupting_open
from dmtp.cli.main import main
main(sys.argv[1:])
"""
INTERRUPTED = "interrupted; the same command resumes from what was saved"


def _train_cmd(root, out, *extra):
    return ["train", "--target", str(root / "nomtp"), "--data", str(root / "data.jsonl"), "--out", str(out),
            "--variants", "dflash", "--batch-size", "2", "--max-len", "16", "--mask-token-id", "2", *extra]


def _python(*argv, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600, env=env, **kw)


def test_ctrl_c_during_a_state_save_leaves_the_state_before_it(ckpt, tmp_path):
    """Ctrl-C while trainer_state.pt is being written: exit 130 with the one line (not "cannot be written", not a
    traceback), the state of the save before in place, no temp file left; the same command then finishes."""
    root, _, _ = ckpt
    out = tmp_path / "d"
    assert _python("-m", "dmtp.cli", *_train_cmd(root, out, "--steps", "3", "--stop-after", "1")).returncode == 0
    state = out / "dflash" / "trainer_state.pt"
    before = state.read_bytes()
    r = _python("-c", CTRL_C_IN_SAVE, *_train_cmd(root, out, "--steps", "3"))
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"dmtp train: {INTERRUPTED}"
    assert "Traceback" not in r.stderr and "cannot be written" not in r.stderr
    assert state.read_bytes() == before and not list(state.parent.glob(".trainer_state.pt.*"))
    r = _python("-m", "dmtp.cli", *_train_cmd(root, out, "--steps", "3"))
    assert r.returncode == 0 and "resumed at step 1" in r.stdout + r.stderr, r.stderr
    assert "3 steps" in (out / "dflash" / "DONE").read_text()


# each rank's exit status, as the rank itself ends (torchrun does not report the statuses of ranks it stopped), through
# the command's own way out of a rank (`run_as_command`: os._exit once the command has ended)
RANK_EXIT = """
import os, sys
from dmtp.cli import main as cli

_exit, here = os._exit, sys.argv.pop(1)
def exit_noting(code):
    with open(os.path.join(here, "rank" + os.environ["RANK"]), "w") as f:
        f.write(str(code))
    _exit(code)
os._exit = exit_noting
cli.run_as_command()
"""


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(d))
    return out


@pytest.mark.parametrize("who", ["launcher", "ranks"])
def test_ctrl_c_under_torchrun_exits_130_on_every_rank(ckpt, tmp_path, who):
    """Ctrl-C at a 2-rank `dmtp.cli.torchrun` training: a terminal's SIGINT reaches the launcher alone (torch's agent
    passes it on), a scheduler's may reach the ranks themselves. Either way the launcher exits 130 and the whole run
    prints one line, no traceback. Every rank that ends by itself exits 130; a rank still inside a collective when the
    other has ended may instead be stopped by the agent's SIGTERM, which the launcher counts as interrupted
    (`interrupted_status`)."""
    import signal
    import time

    root, _, _ = ckpt
    (tmp_path / "rank_exit.py").write_text(RANK_EXIT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "d"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    p = subprocess.Popen([sys.executable, "-m", "dmtp.cli.torchrun", "--nproc_per_node=2", f"--master_port={port}",
                          str(tmp_path / "rank_exit.py"), str(tmp_path), *_train_cmd(root, out, "--steps", "100000")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        t0 = time.time()
        while not (out / "dflash" / "trainer_state.pt").exists():  # training under way on both ranks
            assert p.poll() is None and time.time() - t0 < 300, p.communicate()[1][-3000:]
            time.sleep(0.5)
        for pid in [p.pid] if who == "launcher" else _children(p.pid):
            os.kill(pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, err[-3000:]
    ended = {f.name: f.read_text() for f in tmp_path.glob("rank[0-9]")}
    assert ended and set(ended) <= {"rank0", "rank1"} and set(ended.values()) == {"130"}, ended
    assert "Traceback" not in err and [x for x in err.splitlines() if "interrupt" in x.lower()] == [
        f"dmtp train: {INTERRUPTED}"], err[-3000:]


def test_interrupted_launch_statuses():
    """The launcher's exit status from its ranks' statuses: interrupted ranks (SIGINT's 130 from `args.guard`, or
    killed by the signal) give the shell's status of an interrupted command; any other failure keeps torch's report."""
    from dmtp.cli.torchrun import interrupted_status

    assert interrupted_status([130, 130]) == 130 and interrupted_status([130, -2]) == 130
    assert interrupted_status([130, -15]) == 130  # the agent's SIGTERM to a rank still running after the first ended
    assert interrupted_status([-15, 143]) == 143 and interrupted_status([-15]) == 143
    assert interrupted_status([130, 1]) is None and interrupted_status([2]) is None and interrupted_status([]) is None


def test_one_writer_per_output(ckpt, tmp_path, capsys):
    """Two writers on one --out: while one holds it (here this process), a `dmtp generate` on it is refused naming
    the holder (pid, host) and writes nothing; a lock file left by a killed writer is free again; a file that holds
    an id twice is refused on a rerun."""
    root, _, _ = ckpt
    out = tmp_path / "o.jsonl"
    argv = ["generate", "--target", str(root / "target"), "--method", "ar", "--prompts", str(root / "p.jsonl"),
            "--max-new-tokens", "3", "--batch-size", "2", "--out", str(out)]
    with one_writer(out):
        p = subprocess.run([sys.executable, "-m", "dmtp.cli.main", *argv], capture_output=True, text=True,
                           timeout=300)
    assert p.returncode == 2 and f"being written by pid {os.getpid()} on {socket.gethostname()}" in p.stderr, \
        p.stderr[-2000:]
    assert not out.exists() and not (tmp_path / ".o.jsonl.lock").exists()
    with one_writer(tmp_path / "w" / "smoke" / "corpus"):  # the pipeline: one writer per stage output too
        with pytest.raises(SystemExit):
            dmtp(["pipeline", "--profile", "smoke", "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r"),
                  "--stage", "corpus"])
    assert "smoke/corpus: being written by pid" in capsys.readouterr().err
    (tmp_path / ".o.jsonl.lock").write_text("pid 999999 on elsewhere since 2026-01-01T00:00:00")  # its holder died
    dmtp(argv)
    assert [r["id"] for r in read_jsonl(out)] == [f"p{i}" for i in range(5)]
    assert not (tmp_path / ".o.jsonl.lock").exists()
    with open(out, "a") as f:
        f.write(out.read_text().splitlines(keepends=True)[0])  # p0 again, as two writers would have left it
    with pytest.raises(SystemExit):
        dmtp(argv)
    assert "id 'p0' is on lines 1 and 6; pass --force to start it afresh" in capsys.readouterr().err


def test_an_edited_prompt_file_is_another_configuration(ckpt, tmp_path, capsys):
    """The output's fingerprint holds what its prompts are, not where the file lies: an edit is refused (not kept as
    "already in"), and --force decodes the new prompt."""
    root, _, _ = ckpt
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [3, 5]}\n{"id": "b", "prompt_ids": [4]}\n')
    argv = ["generate", "--target", str(root / "target"), "--method", "ar", "--prompts", str(prompts),
            "--max-new-tokens", "3", "--out", str(tmp_path / "o.jsonl")]
    dmtp(argv)
    prompts.write_text('{"id": "a", "prompt_ids": [3, 6]}\n{"id": "b", "prompt_ids": [4]}\n')
    with pytest.raises(SystemExit):
        dmtp(argv)
    assert "made with another configuration (prompts_sha256: " in capsys.readouterr().err
    dmtp(argv + ["--force"])
    assert read_jsonl(tmp_path / "o.jsonl")[0]["prompt_ids"] == [3, 6]


# --- the ends of training -------------------------------------------------------------------------------------
def test_pretraining_state_outlives_training(tmp_path):
    """The resumable state is kept after the last step (the caller deletes it once the target is saved): a rerun
    after a kill during the held-out check or the save resumes at the end, with the same weights, no step redone."""
    arch = TargetArch(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, intermediate_size=64, max_position_embeddings=64)
    cfg = PretrainConfig(tokens=16 * 4 * 3, seq_len=16, batch_size=4, eval_tokens=16, log_every=1)
    toks = torch.randint(2, 100, (4000,)).numpy()
    torch.manual_seed(0)
    tgt, mtp = build_target(arch, 100, 0)
    hist, info = pretrain(tgt, mtp, toks, cfg, tmp_path, log=lambda m: None)
    assert info["finished"] and (tmp_path / "pretrain_state.pt").exists()
    assert torch.load(tmp_path / "pretrain_state.pt", weights_only=True)["step"] == 3
    torch.manual_seed(0)
    tgt2, mtp2 = build_target(arch, 100, 0)
    hist2, info2 = pretrain(tgt2, mtp2, toks, cfg, tmp_path, log=lambda m: None)
    assert info2["start_step"] == 3 and info2["tokens_trained"] == 0 and hist2 == hist
    for a, b in zip(tgt.model.state_dict().values(), tgt2.model.state_dict().values()):
        assert torch.equal(a, b)
    (tmp_path / "pretrain_state.pt").write_bytes(b"PK\x03\x04" + b"\x00" * 40)  # cut short by a kill or a full disk
    with pytest.raises(ValueError, match="pretrain_state.pt: cannot be read as saved training state .*remove it"):
        pretrain(tgt2, mtp2, toks, cfg, tmp_path, log=lambda m: None)


def test_drafter_killed_between_final_checkpoint_and_done(ckpt, tmp_path, monkeypatch):
    root, tgt, mtp = ckpt
    seqs = train_mod.load_sequences(root / "data.jsonl", 16, vocab_size=tgt.vocab_size)
    cfg = TrainConfig(steps=2, batch_size=2, max_len=16, anchors_per_seq=4, save_every=1, log_every=1)
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2)
    real = train_mod._finish

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod, "_finish", killed)
    with pytest.raises(KeyboardInterrupt):
        train_drafters(tgt, mtp, new_drafters(tgt, ["dflash"], base), seqs, cfg, tmp_path, log=lambda m: None)
    d = tmp_path / "dflash"
    assert (d / "drafter").exists() and not (d / "DONE").exists()  # the final checkpoint, no DONE: not finished
    monkeypatch.setattr(train_mod, "_finish", real)
    logs = []
    train_drafters(tgt, mtp, new_drafters(tgt, ["dflash"], base), seqs, cfg, tmp_path, log=logs.append)
    assert (d / "DONE").exists() and "marked done on a rerun" in (d / "DONE").read_text()
    assert not (d / "trainer_state.pt").exists() and len(json.loads((d / "history.json").read_text())) == 2
    assert logs == ["[train] dflash: resumed at step 2"]  # nothing retrained


# --- configs check themselves ---------------------------------------------------------------------------------
def test_configs_refuse_bad_values():
    from dmtp.checks import BadValue

    for bad, msg in [(dict(steps=0), "steps=0: expected an integer >= 1"), (dict(lr=float("nan")), "lr=nan"),
                     (dict(max_len=2), "max_len=2: expected an integer >= 4"), (dict(gamma=-1.0), "gamma=-1.0")]:
        with pytest.raises(BadValue, match=msg):
            TrainConfig(**bad)
    with pytest.raises(ValueError, match="expected at least one step's worth"):
        PretrainConfig(tokens=100, seq_len=64, batch_size=8)
    p = get_profile("smoke")
    with pytest.raises(ValueError, match=r"--set data.temperature=nan: expected 0 \(greedy\) or a finite number"):
        override(p, ["data.temperature=nan"])
    with pytest.raises(ValueError, match=r"--set eval.temperatures=\[0, -1\]: expected a non-empty"):
        override(p, ["eval.temperatures=[0, -1]"])
    assert override(p, ["train.steps=7"]).train.steps == 7
    # budgets written as a GPU run writes them: 1e8, 100_000_000; a fraction is not an integer
    assert override(p, ["data.corpus_bytes=1e8"]).data.corpus_bytes == 100_000_000
    assert override(p, ["pretrain.tokens=4_000_000"]).pretrain.tokens == 4_000_000
    with pytest.raises(ValueError, match=r"--set train.steps=2.5: expected an integer, got '2.5'"):
        override(p, ["train.steps=2.5"])


def test_jsonl_errors_name_file_and_line(tmp_path):
    from dmtp.io import read_jsonl

    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\n\n\n{"a": 2,\n')
    with pytest.raises(ValueError, match=rf"{f}:4: not valid JSON"):
        read_jsonl(f)


def test_copied_target_is_not_the_same_weights(ckpt, tmp_path):
    """A resumed run is tied to the weights it started with: a retrained (rewritten) checkpoint counts as changed."""
    root, _, _ = ckpt
    shutil.copytree(root / "target", tmp_path / "t")
    stamp = cli_main._modified(tmp_path / "t")
    import os
    import time

    f = tmp_path / "t" / "model.safetensors"
    os.utime(f, (time.time() + 5, time.time() + 5))
    assert cli_main._modified(tmp_path / "t") != stamp


def test_meta_records_the_engine_that_decoded(tmp_path, monkeypatch):
    """A decoded result's meta file holds the engine configuration as it ran on the machine ("auto" resolved) and the
    commit with the code's digest; no environment variable steers or labels it (a copy of the tree without .git: its REVISION file)."""
    from dmtp import io
    from dmtp.config import EngineConfig

    monkeypatch.setenv("DMTP_ENGINE", "flex")  # read by nothing
    io.write_meta(tmp_path / "a.json", {}, engine=EngineConfig(attention="dense"))
    meta = json.loads((tmp_path / "a.json").read_text())
    assert meta["engine"]["engine"] == "hf" and meta["engine"]["attention"] == "dense"  # on this CPU machine
    assert meta["engine"]["cache_write"] == "graph" and "switches" not in meta["env"]
    assert meta["env"]["git_sha"] == io.git_sha() != ""
    assert meta["env"]["source_digest"] == io.source_digest()  # the code that ran, also where a copy's .git is older
    io.write_meta(tmp_path / "b.json", {})
    assert "engine" not in json.loads((tmp_path / "b.json").read_text())


def test_a_copy_records_its_commit_only_when_its_code_matches_the_revision(tmp_path):
    """A tree copied without .git (to a cluster node) records the commit of its REVISION file only when its
    source digest equals the one `make revision` wrote beside it; a REVISION older than the code (not re-made after a
    commit) gives `<commit>+changed-<digest>`, no REVISION "unknown"."""
    from dmtp import io

    root = tmp_path / "copy"
    (root / "dmtp" / "sub").mkdir(parents=True)
    (root / "dmtp" / "a.py").write_text("x = 1\n")
    (root / "dmtp" / "sub" / "b.py").write_text("y = 2\n")
    (root / "pyproject.toml").write_text("[project]\n")
    assert io.git_sha(root) == "unknown"
    d = io.source_digest(root)
    assert len(d) == 12 and d == io.source_digest(root)
    (root / "REVISION").write_text(f"abc123 {d}\n")
    assert io.git_sha(root) == "abc123"
    (root / "dmtp" / "sub" / "b.py").write_text("y = 3\n")  # the code moved on, the REVISION did not
    d2 = io.source_digest(root)
    assert d2 != d and io.git_sha(root) == f"abc123+changed-{d2}"
    (root / "REVISION").write_text("abc123\n")  # a REVISION of one field (before digests): not verifiable
    assert io.git_sha(root).startswith("abc123+changed-")
    (root / "dmtp" / "__pycache__").mkdir()  # compiled files are not code
    (root / "dmtp" / "__pycache__" / "a.cpython-312.py").write_text("junk")
    assert io.source_digest(root) == d2


def test_a_copy_over_an_older_checkout_records_its_revision(tmp_path):
    """A tree copied over an older checkout keeps that checkout's .git: git calls the sources changed, and the
    REVISION whose digest equals the tree's names the commit (never `<old commit>-dirty`); with sources changed past
    the REVISION too, git's `-dirty` stands; a clean checkout is git's commit, whatever REVISION lies beside it."""
    import subprocess

    from dmtp import io

    root = tmp_path / "copy"
    (root / "dmtp").mkdir(parents=True)
    (root / "dmtp" / "a.py").write_text("x = 1\n")
    git = lambda *a: subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=root,  # noqa: E731
                                    check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "old")
    old = git("rev-parse", "HEAD")
    (root / "REVISION").write_text(f"abc123 {io.source_digest(root)}\n")
    assert io.git_sha(root) == old  # clean: git's commit
    (root / "dmtp" / "a.py").write_text("x = 2\n")  # the newer code copied over the old checkout
    (root / "REVISION").write_text(f"abc123 {io.source_digest(root)}\n")
    assert io.git_sha(root) == "abc123"
    (root / "dmtp" / "a.py").write_text("x = 3\n")  # changed past the REVISION as well
    assert io.git_sha(root) == f"{old}-dirty"


class _Payload:
    """A pickled object whose loading runs a shell command (what a crafted state file in a shared folder holds)."""
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_state_file_runs_nothing(ckpt, tmp_path):
    """State files load as plain data (weights_only): a state holding a pickled callable is refused with its file
    named, before anything in it runs, in drafter training and in pretraining; a state without a key it needs names
    the key."""
    root, tgt, mtp = ckpt
    seqs = train_mod.load_sequences(root / "data.jsonl", 16, vocab_size=tgt.vocab_size)
    cfg = TrainConfig(steps=2, batch_size=2, max_len=16, anchors_per_seq=4, save_every=1, log_every=1)
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2)
    marker = tmp_path / "ran"
    (tmp_path / "dflash").mkdir()
    state = tmp_path / "dflash" / "trainer_state.pt"
    torch.save({"model": {}, "opt": {}, "step": 1, "history": [], "x": _Payload(marker)}, state)
    with pytest.raises(ValueError, match=r"dflash/trainer_state.pt: cannot be read as saved training state"):
        train_drafters(tgt, mtp, new_drafters(tgt, ["dflash"], base), seqs, cfg, tmp_path, log=lambda m: None)
    assert not marker.exists()
    torch.save({"opt": {}, "step": 1, "history": []}, state)  # plain data, but not a state this trainer wrote
    with pytest.raises(ValueError, match=r"trainer_state.pt: saved training state without the key\(s\) 'model'"):
        train_drafters(tgt, mtp, new_drafters(tgt, ["dflash"], base), seqs, cfg, tmp_path, log=lambda m: None)
    arch = TargetArch(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, intermediate_size=64, max_position_embeddings=64)
    pcfg = PretrainConfig(tokens=16 * 4 * 3, seq_len=16, batch_size=4, eval_tokens=16, log_every=1)
    torch.save(_Payload(marker), tmp_path / "pretrain_state.pt")
    t2, m2 = build_target(arch, 100, 0)
    with pytest.raises(ValueError, match=r"pretrain_state.pt: cannot be read as saved training state"):
        pretrain(t2, m2, torch.randint(2, 100, (4000,)).numpy(), pcfg, tmp_path, log=lambda m: None)
    assert not marker.exists()


def test_ctrl_c_in_process_leaves_sigterm_as_it_was(monkeypatch):
    """Outside torchrun, `guard`'s Ctrl-C path exits 130 without touching SIGTERM's disposition (a process that
    catches the exit would otherwise pass an ignored SIGTERM to every child it starts); a torchrun rank ignores it."""
    import signal

    from dmtp.cli.args import guard

    def interrupted():
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as e:
        guard("dmtp test", interrupted)
    assert e.value.code == 130 and signal.getsignal(signal.SIGTERM) == before
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    try:
        with pytest.raises(SystemExit):
            guard("dmtp test", interrupted)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
