"""The MTP head trained with the drafter (`zero_init_residual_joint`): its own weighted loss beside the drafter's, the
drafter reading the tuned head, the head saved with the checkpoint and decoding T1 (and MTP415 as `mtp.<run>`),
lossless; and `given` trained and decoded from its checkpoint."""
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import hf_greedy, make_drafter

from dmtp.engine.decode import generate
from dmtp.engine.methods import DrafterMethod, MTPMethod, load_method, method_class
from dmtp.models import tiny
from dmtp.models.mtp import MTPHead
from dmtp.training import drafters as T
from dmtp.training.drafters import TrainConfig, attach_head, drafter_loss, extract, new_drafters, train_drafters

PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [33]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target and three runs trained side by side for 4 steps: zero_init_residual, its joint twin, given."""
    root = tmp_path_factory.mktemp("joint")
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tiny.save(tgt, mtp, root / "target")
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, tgt.vocab_size, (int(n),), generator=g).tolist() for n in torch.randint(14, 30, (8,))]
    cfg = TrainConfig(steps=4, batch_size=4, max_len=32, anchors_per_seq=6, save_every=2, log_every=1, lr=3e-3)
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2)
    names = ["zero_init_residual", "zero_init_residual_joint", "given"]
    hist = train_drafters(tgt, mtp, new_drafters(tgt, names, base), seqs, cfg, root / "drafters", log=lambda m: None)
    return root, tgt, mtp, seqs, cfg, base, hist


def test_joint_loss_is_the_drafters_plus_the_weighted_head_loss(models):
    """drafter_loss of a joint drafter = zero_init_residual's loss on the features of its own head's g (stop-
    gradient) + mtp_weight x that head's next-token CE over every position of the sequences; gradients reach the
    copy, never the target's frozen head; a fresh copy's g is the frozen head's."""
    tgt, mtp = models
    d = attach_head(make_drafter(tgt, "zero_init_residual_joint").train(), mtp)
    assert d.mtp_head is not mtp and all(p.requires_grad for p in d.mtp_head.parameters())
    ids = torch.randint(3, tgt.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([24, 17])
    anchors, valid = T.sample_anchors(lengths, 5, torch.Generator().manual_seed(2))
    feats = extract(tgt, mtp, ids, lengths, d.config.target_layer_ids, need_g=True, keep_hidden=True)
    loss, stats = drafter_loss(d, tgt, feats, anchors, valid, gamma=4.0)
    tuned, head = T.head_loss(d, tgt, feats)
    torch.testing.assert_close(tuned.g, feats.g)  # the copy starts as the target's head
    logits = tgt.lm_head(d.mtp_head.teacher_forced(ids, feats.hidden))[:, :-1].float()
    ok = torch.arange(2, 24)[None] < lengths[:, None]
    ce = F.cross_entropy(logits[ok], ids[:, 2:][ok])
    torch.testing.assert_close(head, ce)
    plain = d.mtp_head
    d.mtp_head = None
    base, _ = drafter_loss(d, tgt, feats, anchors, valid, gamma=4.0)
    d.mtp_head = plain
    torch.testing.assert_close(loss, base + 0.1 * ce)
    assert stats["mtp_loss"] == pytest.approx(float(ce), rel=1e-5)
    assert stats["loss"] == pytest.approx(float(loss.detach()))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in d.mtp_head.parameters())
    assert all(p.grad is None for p in mtp.parameters())


def test_joint_run_saves_its_tuned_head_and_decodes_with_it(trained):
    root, tgt, mtp, *_ = trained
    run = root / "drafters" / "zero_init_residual_joint" / "drafter"
    assert (run / "mtp.safetensors").exists() and not (root / "drafters" / "zero_init_residual" / "drafter" /
                                                          "mtp.safetensors").exists()
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["architectures"] == ["DMTPDraftModel"] and cfg["dmtp_config"]["variant_config"] == {"mtp_weight": 0.1}
    head = MTPHead.load(tgt, run)
    moved = [k for k, v in head.state_dict().items() if not torch.equal(v, mtp.state_dict()[k])]
    assert moved  # trained: the tuned head is not the target's
    m = load_method("zero_init_residual_joint", tgt, mtp, root / "drafters")
    assert isinstance(m, DrafterMethod) and torch.equal(m.head.fc.weight, head.fc.weight)
    c = load_method("mtp.zero_init_residual_joint", tgt, mtp, root / "drafters", mtp_steps=4)
    assert method_class("mtp.zero_init_residual_joint") is MTPMethod and c.name == "mtp.zero_init_residual_joint"
    assert torch.equal(c.head.fc.weight, head.fc.weight) and c.k == 4
    ref = [hf_greedy(tgt, p, 19) for p in PROMPTS]
    for method in (m, c, load_method("given", tgt, mtp, root / "drafters"),
                   load_method("given-p0", tgt, mtp, root / "drafters")):
        assert [r.output_ids for r in generate(tgt, method, PROMPTS, 0.0, 19)] == ref, method.name
    plain = load_method("zero_init_residual", tgt, mtp, root / "drafters")
    assert plain.head is mtp  # the other runs decode with the target's head


def test_joint_history_logs_the_head_loss_and_a_checkpoint_without_its_head_is_refused(trained, tmp_path):
    root, tgt, mtp, *_, hist = trained
    assert all("mtp_loss" in h for h in hist["zero_init_residual_joint"])
    assert not any("mtp_loss" in h for h in hist["zero_init_residual"])
    import shutil

    shutil.copytree(root / "drafters" / "zero_init_residual_joint", tmp_path / "j")
    (tmp_path / "j" / "drafter" / "mtp.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no mtp.safetensors"):
        load_method("j", tgt, mtp, tmp_path)
    with pytest.raises(FileNotFoundError, match="no mtp.safetensors"):
        load_method("mtp.j", tgt, mtp, tmp_path)


def test_joint_training_resumes_to_the_uninterrupted_weights(trained, tmp_path):
    """Stopped after step 2 and resumed, the joint run ends with the weights (drafter and head) of the uninterrupted
    run: the head's parameters and optimizer state are in the trainer state."""
    root, tgt, mtp, seqs, cfg, base, _ = trained
    from dataclasses import replace

    names = ["zero_init_residual_joint"]
    train_drafters(tgt, mtp, new_drafters(tgt, names, base), seqs, replace(cfg, stop_after=2), tmp_path,
                   log=lambda m: None)
    assert (tmp_path / names[0] / "trainer_state.pt").exists()
    train_drafters(tgt, mtp, new_drafters(tgt, names, base), seqs, cfg, tmp_path, log=lambda m: None)
    for f in ("model.safetensors", "mtp.safetensors"):
        from safetensors.torch import load_file

        a = load_file(str(tmp_path / names[0] / "drafter" / f))
        b = load_file(str(root / "drafters" / names[0] / "drafter" / f))
        assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), f
