"""No run loses finished work and no output claims a configuration that did not make it: stage fingerprints
(refused or --force), `dmtp generate` appending and resuming, pretraining and drafter training finishing after a
kill at their last step."""
import json
import os
import shutil

import pytest
import torch
from conftest import make_drafter

from dmtp.cli import main as cli_main
from dmtp.cli import pipeline, stages
from dmtp.cli.main import main as dmtp
from dmtp.io import read_jsonl
from dmtp.models import tiny
from dmtp.schema import override
from dmtp.training import drafters as train_mod
from dmtp.training.drafters import TrainConfig, new_drafters, train_drafters
from dmtp.training.pretrain import PretrainConfig, TargetArch, build_target, pretrain
from experiments.profiles import get_profile


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


def test_pipeline_refuses_changed_settings_on_finished_stages(tmp_path, capsys):
    """A finished target and drafter (their records as the smoke profile writes them) and more steps / a wider
    target requested: refused before any work, naming the fields; no metadata is written."""
    from argparse import Namespace

    a = Namespace(profile="smoke", work=str(tmp_path / "w"), results=str(tmp_path / "r"), set=[], force=False,
                  stage="target,drafters")
    c = pipeline.Ctx(a)
    for s in ("target", "drafters"):
        for u in pipeline.units(c, s):
            u.outputs[0].mkdir(parents=True)
            (u.outputs[0] / "DONE").write_text("ok\n")
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
    # the profile's own units: an eval run depends on the drafter's training, an ar run only on the target's
    c = pipeline.Ctx(Namespace(profile="smoke", work=str(tmp_path / "w"), results=str(tmp_path / "r"),
                               set=["train.steps=7"]))
    ev = {u.want["run"]["method"]: u.want for u in pipeline.units(c, "eval")}
    assert ev["dflash"]["train"]["steps"] == 7 and "train" not in ev["ar"] and ev["mtp"]["eval.mtp_steps"] == 4


def test_train_refuses_a_finished_drafter_of_another_configuration(ckpt, tmp_path, capsys):
    root, _, _ = ckpt
    base = ["train", "--target", str(root / "nomtp"), "--data", str(root / "data.jsonl"), "--out",
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
    dmtp(base + ["--steps", "2", "--force"])
    assert "2 steps" in (tmp_path / "d" / "dflash" / "DONE").read_text()


# --- dmtp generate: append and resume -------------------------------------------------------------------------
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
    assert torch.load(tmp_path / "pretrain_state.pt", weights_only=False)["step"] == 3
    torch.manual_seed(0)
    tgt2, mtp2 = build_target(arch, 100, 0)
    hist2, info2 = pretrain(tgt2, mtp2, toks, cfg, tmp_path, log=lambda m: None)
    assert info2["start_step"] == 3 and info2["tokens_trained"] == 0 and hist2 == hist
    for a, b in zip(tgt.model.state_dict().values(), tgt2.model.state_dict().values()):
        assert torch.equal(a, b)


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


def test_meta_records_the_decode_switches(tmp_path, monkeypatch):
    """A meta file says which path made its result: every DMTP_* switch set for the process (not the git sha, kept on
    its own), none when none is set."""
    from dmtp.io import write_meta

    for k in [k for k in os.environ if k.startswith("DMTP_")]:
        monkeypatch.delenv(k)
    write_meta(tmp_path / "a.json", {})
    assert "switches" not in json.loads((tmp_path / "a.json").read_text())["env"]
    monkeypatch.setenv("DMTP_ENGINE", "hf")
    monkeypatch.setenv("DMTP_CACHE_WRITE", "eager")
    monkeypatch.setenv("DMTP_GIT_SHA", "abc")
    write_meta(tmp_path / "b.json", {})
    env = json.loads((tmp_path / "b.json").read_text())["env"]
    assert env["switches"] == {"DMTP_CACHE_WRITE": "eager", "DMTP_ENGINE": "hf"} and env["git_sha"] == "abc"
