"""Annealed learning-curve points (`ablation.anneal`): a branch leaves its run with the run's full training state
and sees the run's own batches; only its learning rate differs (decayed linearly to ~0 by the budget)."""
import pytest
import torch
from conftest import token_seqs

from dmtp.config import AblationSpec
from dmtp.io import read_json
from dmtp.models import tiny
from dmtp.models.drafter import Drafter
from dmtp.training.drafters import (TrainConfig, branch_dir, decayed, lr_at, new_drafters, train_branch,
                                    train_drafters)



@pytest.fixture(scope="module")
def models():
    return tiny.build("qwen3_5", seed=0)


def _fresh(tgt):
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1)
    return new_drafters(tgt, ["zero_init_residual"], base)["zero_init_residual"]


def test_branch_steps():
    a = AblationSpec(main=("dflash",), budgets=(2, 10, 100), curve=("dflash",), anneal=0.2)
    assert [a.branch_step(b) for b in a.budgets] == [1, 8, 80]
    assert AblationSpec(main=("dflash",), budgets=(10,), curve=("dflash",), anneal=0).branch_step(10) == 10
    with pytest.raises(ValueError, match="ablation.anneal = 1.5"):
        AblationSpec(anneal=1.5)


def test_a_branch_is_its_run_until_the_learning_rate_differs(models, tmp_path):
    """The run (9 steps, snapshots after 4 and 6) saves branch states after steps 2 and 4. With the run's own
    schedule the branch to 4 lands on the run's snapshot at 4, weights exact (state and batches carried over); the
    annealed branch to 6 trains steps 4 and 5 at lr_at(4) x 2/2 and x 1/2, and ends elsewhere than the run."""
    tgt, mtp = models
    cfg = TrainConfig(steps=9, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1, save_every=100,
                      compile="off", snapshots=(4, 6))
    d = _fresh(tgt)
    train_drafters(tgt, mtp, {"zero_init_residual": d}, token_seqs(), cfg, tmp_path, log=lambda *_: None,
                   branches={4: 2, 6: 4})
    name = "zero_init_residual"
    for b in (4, 6):
        assert (branch_dir(tmp_path, b) / name / "trainer_state.pt").exists()
    snap = {b: Drafter.load(tmp_path / name / f"step{b}" / "drafter", device="cpu",
                         dtype=torch.float32).state_dict() for b in (4, 6)}

    same = _fresh(tgt)  # the branch to 4 with the run's own schedule: the run itself
    train_drafters(tgt, mtp, {name: same}, token_seqs(), TrainConfig(**{**cfg.__dict__, "steps": 4, "snapshots": ()}),
                   branch_dir(tmp_path, 4), log=lambda *_: None, schedule=lambda s: lr_at(s, cfg))
    for k, v in same.state_dict().items():
        torch.testing.assert_close(v, snap[4][k], rtol=0, atol=0, msg=k)

    annealed = _fresh(tgt)
    where = train_branch(tgt, mtp, {name: annealed}, token_seqs(), cfg, tmp_path, 6, 4, log=lambda *_: None) / name
    assert (where / "DONE").exists() and (where / "drafter").is_dir()
    hist = read_json(where / "history.json", list)
    top = lr_at(4, cfg)
    assert [h["step"] for h in hist][-2:] == [5, 6]
    assert [h["lr"] for h in hist][-2:] == pytest.approx([top, top / 2])
    assert [h["lr"] for h in hist][:4] == pytest.approx([lr_at(s, cfg) for s in range(4)])  # the run's, carried
    assert decayed(cfg, 4, 6)(5) == pytest.approx(top / 2)
    assert hist[-1]["tokens"] > hist[3]["tokens"] > 0
    moved = sum((v - snap[6][k]).abs().sum() for k, v in annealed.state_dict().items())
    assert lr_at(5, cfg) != pytest.approx(top / 2) and moved > 0  # another learning rate: other weights than the run's at the same step


def test_a_branch_without_its_state_is_a_named_error(models, tmp_path):
    tgt, mtp = models
    cfg = TrainConfig(steps=4, batch_size=4, max_len=40, anchors_per_seq=5, compile="off")
    with pytest.raises(ValueError, match="no branch state .*retrain it with --force"):
        train_branch(tgt, mtp, {"zero_init_residual": _fresh(tgt)}, token_seqs(), cfg, tmp_path, 3, 2)
