"""DFlash2 backbone (SPEC §9): identity init, block-local convolution, the path selector, training, checkpoints,
losslessness of decoding with a dflash2 drafter, and the pipeline hook (DFlash2 / DMTP(D2))."""
import json

import pytest
import torch
from conftest import hf_greedy, make_drafter

from dmtp.engine.decode import Batch, build_method
from dmtp.models.dflash2 import BlockConv, Selector, selector_loss
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.training.drafters import drafter_loss, extract, new_drafters, sample_anchors


def dflash2(tgt, variant, perturb=True, seed=1):
    """A dflash2 drafter; `perturb` gives the identity-initialised conv taps and selector transitions real values."""
    d = make_drafter(tgt, variant, seed=seed, backbone="dflash2", selector_topk=8, selector_dim=16)
    if perturb:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in d.named_parameters():
                if ".conv_" in n or n.startswith("selector."):
                    p.copy_(torch.randn(p.shape, generator=g) * (1.0 if n.startswith("selector.") else 0.3))
    return d


def _inputs(tgt, d, n_blocks=3, seed=0):
    """Random context and N blocks of the drafter's layout: (block, pos, ctx_kv, ctx_end)."""
    g = torch.Generator().manual_seed(seed)
    B, T, H = 2, 30, tgt.hidden_size
    S = d.layout.slots
    taps = torch.randn(B, T, len(d.config.target_layer_ids) * H, generator=g)
    ctx = d.context_kv(d.context(taps, torch.randn(B, T, H, generator=g)), torch.arange(T)[None].expand(B, T))
    ends = torch.tensor([[4, 11, 20], [7, 9, 25]])[:, :n_blocks]
    pos = (ends[..., None] + torch.tensor(d.layout.offsets)).reshape(B, -1)
    return torch.randn(B, n_blocks * S, H, generator=g), pos, ctx, ends


@pytest.mark.parametrize("variant", ["dflash", "zero_init_residual"])
def test_identity_init_equals_dflash_with_the_same_weights(models, variant):
    tgt, _ = models
    d1 = make_drafter(tgt, variant)
    d2 = dflash2(tgt, variant, perturb=False)
    missing, unexpected = d2.load_state_dict(d1.state_dict(), strict=False)
    assert not unexpected and all(".conv_" in k or k.startswith("selector.") for k in missing)
    block, pos, ctx, ends = _inputs(tgt, d1)
    h1, h2 = d1(block, pos, ctx, ends), d2(block, pos, ctx, ends)
    assert torch.equal(h1, h2)
    logits = tgt.lm_head(h1)
    prev = torch.randint(0, tgt.vocab_size, (2,))
    assert torch.equal(d2.select(logits, h2, prev), logits.argmax(-1)) and torch.equal(d1.select(logits, h1, prev),
                                                                                       logits.argmax(-1))
    # fresh dflash2 drafters share the base weights of a same-seed dflash drafter (the DFlash2 parts init last)
    torch.manual_seed(5)
    a = Drafter(DrafterConfig(**{**d1.config.__dict__, "backbone": "dflash"}))
    torch.manual_seed(5)
    b = Drafter(DrafterConfig(**{**d1.config.__dict__, "backbone": "dflash2"}))
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_block_conv_formula_and_block_locality():
    torch.manual_seed(0)
    S, N, H, G = 5, 3, 12, 4
    conv = BlockConv(H, G)
    x = torch.randn(2, N * S, H)
    assert torch.equal(conv(x, S), x)  # identity at initialisation
    with torch.no_grad():
        conv.weight.normal_()
        conv.bias.normal_()
    y = conv(x, S)
    for i in range(N * S):  # y_i = x_i + a_i * x_{i-1}, a_i per group of H/G channels, nothing at a block start
        a = torch.tanh(x[:, i] @ conv.weight.T + conv.bias).repeat_interleave(H // G, -1)
        expect = x[:, i] + (a * x[:, i - 1] if i % S else 0)
        torch.testing.assert_close(y[:, i], expect)
    x2 = x.clone()
    x2[:, S:2 * S] += torch.randn(2, S, H)  # perturb block 1 only
    y2 = conv(x2, S)
    assert torch.equal(y2[:, :S], y[:, :S]) and torch.equal(y2[:, 2 * S:], y[:, 2 * S:])
    assert not torch.allclose(y2[:, S:2 * S], y[:, S:2 * S])


@pytest.mark.parametrize("variant", ["dflash", "zero_init_residual"])
def test_drafter_blocks_stay_independent_with_conv(models, variant):
    """Nonzero conv taps: perturbing one block's inputs changes that block's outputs only."""
    tgt, _ = models
    d = dflash2(tgt, variant)
    assert all(p.abs().sum() > 0 for n, p in d.named_parameters() if ".conv_" in n)
    block, pos, ctx, ends = _inputs(tgt, d)
    S = d.layout.slots
    h = d(block, pos, ctx, ends)
    block2 = block.clone()
    block2[:, S:2 * S] += torch.randn(2, S, block.shape[-1])
    h2 = d(block2, pos, ctx, ends)
    torch.testing.assert_close(h2[:, :S], h[:, :S], rtol=0, atol=1e-6)
    torch.testing.assert_close(h2[:, 2 * S:], h[:, 2 * S:], rtol=0, atol=1e-6)
    assert not torch.allclose(h2[:, S:2 * S], h[:, S:2 * S])
    # the conv does act inside a block: the same drafter with zero taps gives other outputs
    d0 = dflash2(tgt, variant)
    with torch.no_grad():
        for n, p in d0.named_parameters():
            if ".conv_" in n:
                p.zero_()
    assert not torch.allclose(d0(block, pos, ctx, ends), h)


@torch.no_grad()
def reference_path(sel, logits, hid, prev):
    """The greedy walk by loops over rows, slots and candidates, straight from the score formula."""
    out = torch.zeros(logits.shape[:2], dtype=torch.long)
    for b in range(logits.shape[0]):
        p = int(prev[b])
        for j in range(logits.shape[1]):
            lp = logits[b, j].log_softmax(-1)
            z = sel.W_h @ hid[b, j]
            best = max(lp.topk(sel.k).indices.tolist(),
                       key=lambda c: float(lp[c] + sel.bias[c] + (sel.A[p] * z * sel.B[c]).sum()))
            out[b, j] = p = best
    return out


def test_selector_path():
    torch.manual_seed(0)
    c = DrafterConfig(hidden_size=32, vocab_size=50, num_target_layers=4, selector_topk=6, selector_dim=8,
                      backbone="dflash2")
    sel = Selector(c)
    sel.reset_parameters()
    logits, hid, prev = torch.randn(4, 7, 50), torch.randn(4, 7, 32), torch.randint(0, 50, (4,))
    assert sel.A.abs().sum() == 0 and sel.bias.abs().sum() == 0 and sel.B.abs().sum() > 0
    assert torch.equal(sel(logits, hid, prev), logits.argmax(-1))  # zero transitions: the plain argmax path
    with torch.no_grad():
        sel.A.normal_()
        sel.B.normal_()
        sel.bias.normal_()
        sel.W_h.normal_()
    path = sel(logits, hid, prev)
    assert torch.equal(path, reference_path(sel, logits, hid, prev))
    assert not torch.equal(path, logits.argmax(-1))
    assert torch.equal(path, sel(logits, hid, prev))  # deterministic
    assert all(int(path[b, j]) in logits[b, j].topk(6).indices for b in range(4) for j in range(7))


def test_selector_loss_by_hand():
    torch.manual_seed(0)
    c = DrafterConfig(hidden_size=16, vocab_size=20, num_target_layers=4, selector_topk=4, selector_dim=8,
                      backbone="dflash2")
    sel = Selector(c)
    with torch.no_grad():
        for p in sel.parameters():
            p.normal_()
    logits, hid, prev = torch.randn(5, 20), torch.randn(5, 16), torch.randint(0, 20, (5,))
    top = logits.topk(4).indices
    outside = next(t for t in range(20) if t not in top[2])  # row 2: label outside the top-k -> no selector loss
    labels = torch.stack([top[0, 2], top[1, 0], torch.tensor(outside), top[3, 3], top[4, 1]])
    w = torch.tensor([1.0, 0.5, 0.7, 0.25, 2.0])
    loss, st = selector_loss(sel, logits, hid, prev, labels, w)
    terms, mass = 0.0, 0.0
    for m in [0, 1, 3, 4]:
        lp = logits[m].log_softmax(-1)
        s = torch.stack([lp[c] + sel.bias[c] + (sel.A[prev[m]] * (sel.W_h @ hid[m]) * sel.B[c]).sum()
                         for c in top[m].tolist()])
        i = top[m].tolist().index(int(labels[m]))
        terms, mass = terms + w[m] * -(s.log_softmax(0)[i]), mass + w[m]
    torch.testing.assert_close(loss, terms / mass)
    assert st["sel_cover"] == pytest.approx(0.8)


@pytest.mark.parametrize("variant", ["zero_init_residual", "token_only"])
def test_forward_backward_dflash2_with_dmtp_variant(models, variant):
    tgt, mtp = models
    d = dflash2(tgt, variant, perturb=False).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, tgt.vocab_size, (2, 40), generator=g)
    lengths = torch.tensor([40, 31])
    anchors, valid = sample_anchors(lengths, 6, g)
    feats = extract(tgt, mtp, ids, lengths, d.config.target_layer_ids, need_g=True)
    loss, stats = drafter_loss(d, tgt, feats, anchors, valid, gamma=4.0)
    assert torch.isfinite(loss) and {"loss", "acc", "sel_loss", "sel_cover", "sel_acc"} <= set(stats)
    assert stats["sel_loss"] > 0 and 0 < stats["sel_cover"] <= 1
    loss.backward()
    for n, p in d.named_parameters():
        assert p.grad is not None, n
    for n in ["selector.A", "selector.bias", "layers.0.conv_attn.weight", "layers.1.conv_mlp.bias",
              "injection.fuse.proj.weight" if variant == "zero_init_residual" else "fc.weight"]:
        assert d.get_parameter(n).grad.abs().sum() > 0, n
    # A = 0 at init: the first step moves A only (B and W_h get gradients once A is non-zero, as in LoRA)
    assert d.selector.B.grad.abs().sum() == 0 and d.selector.W_h.grad.abs().sum() == 0
    assert all(p.grad is None for p in list(tgt.parameters()) + list(mtp.parameters()))
    moved = dflash2(tgt, variant).train()
    drafter_loss(moved, tgt, feats, anchors, valid, gamma=4.0)[0].backward()
    assert moved.selector.B.grad.abs().sum() > 0 and moved.selector.W_h.grad.abs().sum() > 0
    # the selector term is weighted in: same batch with weight 0 gives the plain DFlash loss
    d.config.selector_loss_weight = 0.0
    plain, _ = drafter_loss(d, tgt, feats, anchors, valid, gamma=4.0)
    assert loss.item() == pytest.approx(plain.item() + 0.1 * float(stats["sel_loss"]), rel=1e-5)


def test_checkpoint_round_trip(models, tmp_path):
    tgt, _ = models
    d = dflash2(tgt, "zero_init_residual")
    d.save(tmp_path / "d2")
    cfg = json.loads((tmp_path / "d2" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["dmtp_config"]["backbone"] == "dflash2" and cfg["dmtp_config"]["selector_topk"] == 8
    assert cfg["dmtp_config"]["selector_dim"] == 16 and "selector_loss_weight" in cfg["dmtp_config"]
    d2 = Drafter.load(tmp_path / "d2")
    assert d2.config.backbone == "dflash2" and d2.config.selector_topk == 8
    assert d.state_dict().keys() == d2.state_dict().keys()
    assert all(torch.equal(v, d2.state_dict()[k]) for k, v in d.state_dict().items())
    assert {"layers.0.conv_attn.weight", "layers.1.conv_mlp.bias", "selector.A", "selector.B", "selector.W_h",
            "selector.bias"} <= set(d2.state_dict())
    # a plain DFlash checkpoint loads into a dflash2 drafter: the new parts keep their identity initialisation
    df = make_drafter(tgt, "dflash")
    df.save(tmp_path / "df")
    assert json.loads((tmp_path / "df" / "config.json").read_text())["dmtp_config"]["backbone"] == "dflash"
    z = Drafter.load(tmp_path / "df", variant="zero_init_residual", backbone="dflash2")
    assert z.selector is not None and z.selector.A.abs().sum() == 0
    assert all(p.abs().sum() == 0 for n, p in z.named_parameters() if ".conv_" in n)
    block, pos, ctx, ends = _inputs(tgt, df)
    assert torch.equal(Drafter.load(tmp_path / "df", backbone="dflash2")(block, pos, ctx, ends),
                       df(block, pos, ctx, ends))
    with pytest.raises(ValueError, match="unknown backbone 'dflash3'"):
        DrafterConfig(hidden_size=64, vocab_size=96, backbone="dflash3")


def test_new_drafters_backbone_from_configuration(models):
    tgt, _ = models
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, head_dim=16, intermediate_size=64, selector_dim=16, seed=3)
    ds = new_drafters(tgt, ["dflash", "dflash2", "dmtp_d2"], base,
                      backbones={"dflash2": ("dflash", "dflash2"), "dmtp_d2": ("zero_init_residual", "dflash2")})
    got = {n: (d.config.variant, d.config.backbone) for n, d in ds.items()}
    assert got == {"dflash": ("dflash", "dflash"), "dflash2": ("dflash", "dflash2"),
                   "dmtp_d2": ("zero_init_residual", "dflash2")}
    assert all(torch.equal(v, ds["dflash2"].state_dict()[k]) for k, v in ds["dflash"].state_dict().items())
    only = new_drafters(tgt, ["token_only"], {**base, "backbone": "dflash2"})["token_only"]
    assert (only.config.variant, only.config.backbone) == ("token_only", "dflash2")


PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60, 70, 80, 90]]  # ragged batch


@pytest.mark.parametrize("variant", ["dflash", "zero_init_residual"])
def test_lossless_greedy_with_dflash2(models, variant):
    """T = 0 output equals HF greedy decoding of the target; the selector really chooses the proposals, walked from
    A (dflash) or T1 (DMTP)."""
    tgt, mtp = models
    d = dflash2(tgt, variant)
    m = build_method(variant, tgt, drafter=d, mtp=mtp)
    calls = []
    inner = d.select

    def spy(logits, hid, prev):
        out = inner(logits, hid, prev)
        t1 = batch.method.mtp.t1.clone() if d.injection.t1 else None  # the batch's own copy of the method state
        calls.append((out, logits.argmax(-1), prev.clone(), t1))
        return out

    d.select = spy
    batch = Batch(tgt, m, PROMPTS, 0.0, 13, set(), torch.Generator().manual_seed(0))  # 13: max tokens in a block
    while not batch.finished:
        batch.step()
    res = batch.results
    assert [r.output_ids for r in res] == [hf_greedy(tgt, p, 13) for p in PROMPTS]
    assert calls and any(not torch.equal(path, am) for path, am, _, _ in calls)  # the selector changed proposals
    if d.injection.t1:
        assert all(torch.equal(prev, t1) for _, _, prev, t1 in calls)


def test_pipeline_trains_and_evaluates_the_backbone_methods():
    from ablations.code import code
    from dmtp.cli.pipeline import eval_plan
    from dmtp.schema import derive
    from experiments.profiles import get_profile

    assert code().backbones == {"dflash2": ("dflash", "dflash2"), "dmtp_d2": ("zero_init_residual", "dflash2")}
    for prof in ("smoke", "mini"):
        p = get_profile(prof)
        p = derive(p, eval=dict(sets={**p.eval.sets, "gsm8k": 4}))  # a set outside eval.all_methods_on
        plan = list(eval_plan(p))
        for ds in p.eval.sets:
            for temp in p.eval.temperatures:
                # (dataset, #prompts, temperature, mode, run, seed): natural mode, the first seed
                assert {(ds, temp, "dflash2"), (ds, temp, "dmtp_d2")} <= {(x[0], x[2], x[4]) for x in plan
                                                                         if x[3] == "natural"}
