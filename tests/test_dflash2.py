"""DFlash2 backbone (docs/METHOD.md) in the public DFlash2 layout: identity init, block-local convolution, the path
selector, training, checkpoints both ways with parity against the public reference arithmetic, DMTP(D2) from a public
DFlash2 drafter, losslessness of decoding with a dflash2 drafter, and the pipeline hook (DFlash2 / DMTP(D2))."""
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import hf_greedy, make_drafter
from public_dflash import PublicDrafter, suite_block, write_public

from dmtp.engine.decode import Batch
from dmtp.engine.methods import build_method
from dmtp.models.dflash2 import DynamicConv, Selector, is_dflash2, selector_loss
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.training.drafters import drafter_loss, extract, new_drafters, sample_anchors


def dflash2(tgt, variant, perturb=True, seed=1):
    """A dflash2 drafter; `perturb` gives the identity-initialised conv kernels and selector transitions real
    values."""
    d = make_drafter(tgt, variant, seed=seed, backbone="dflash2", selector_topk=8, selector_dim=16)
    if perturb:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in d.named_parameters():
                if is_dflash2(n):
                    sel = n.startswith("candidate_selector.")
                    p.add_(torch.randn(p.shape, generator=g) * (1.0 if sel else 0.3))
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
    assert not unexpected and missing and all(is_dflash2(k) for k in missing)
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
    S, N, H, group, K = 5, 3, 12, 4, 2
    conv = DynamicConv(H, K, group)
    x, y = torch.randn(2, N * S, H), torch.randn(2, N * S, H)
    pre, d = conv.pre(x, S)
    assert torch.equal(pre, x) and torch.equal(conv.post(y, d, S), y)  # the identity at initialisation
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    pre, d = conv.pre(x, S)
    post = conv.post(y, d, S)
    for t in range(N * S):  # out_t = sum_o (base[o] + dyn_t[o, group]) * x_{t-o}, nothing from before a block start
        dyn = (conv.kernel_projection.weight @ x[:, t].T).T.view(2, 2, K, H // group).repeat_interleave(group, -1)
        for out, src, side in ((pre, x, 0), (post, y, 1)):
            expect = sum((conv.base_kernel[side, o] + dyn[:, side, o]) * src[:, t - o] for o in range(K) if t % S >= o)
            torch.testing.assert_close(out[:, t], expect)
    x2 = x.clone()
    x2[:, S:2 * S] += torch.randn(2, S, H)  # perturb block 1 only
    pre2, _ = conv.pre(x2, S)
    assert torch.equal(pre2[:, :S], pre[:, :S]) and torch.equal(pre2[:, 2 * S:], pre[:, 2 * S:])
    assert not torch.allclose(pre2[:, S:2 * S], pre[:, S:2 * S])


@pytest.mark.parametrize("variant", ["dflash", "zero_init_residual"])
def test_drafter_blocks_stay_independent_with_conv(models, variant):
    """Nonzero conv taps: perturbing one block's inputs changes that block's outputs only."""
    tgt, _ = models
    d = dflash2(tgt, variant)
    assert all(p.abs().sum() > 0 for n, p in d.named_parameters() if is_dflash2(n))
    block, pos, ctx, ends = _inputs(tgt, d)
    S = d.layout.slots
    h = d(block, pos, ctx, ends)
    block2 = block.clone()
    block2[:, S:2 * S] += torch.randn(2, S, block.shape[-1])
    h2 = d(block2, pos, ctx, ends)
    torch.testing.assert_close(h2[:, :S], h[:, :S], rtol=0, atol=1e-6)
    torch.testing.assert_close(h2[:, 2 * S:], h[:, 2 * S:], rtol=0, atol=1e-6)
    assert not torch.allclose(h2[:, S:2 * S], h[:, S:2 * S])
    # the conv does act inside a block: the same drafter with identity convs gives other outputs
    d0 = dflash2(tgt, variant)
    for m in d0.modules():
        if isinstance(m, DynamicConv):
            m.reset_parameters()
    assert not torch.allclose(d0(block, pos, ctx, ends), h)


@torch.no_grad()
def reference_path(sel, logits, hid, prev):
    """The greedy walk by loops over rows, slots and candidates, straight from the score formula."""
    out = torch.zeros(logits.shape[:2], dtype=torch.long)
    A, B, W = sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight
    for b in range(logits.shape[0]):
        p = int(prev[b])
        for j in range(logits.shape[1]):
            lg, z = logits[b, j], W @ hid[b, j]
            best = max(lg.topk(sel.k).indices.tolist(), key=lambda c: float(lg[c] + (A[p] * z * B[c]).sum()))
            out[b, j] = p = best
    return out


def test_selector_path():
    torch.manual_seed(0)
    c = DrafterConfig(hidden_size=32, vocab_size=50, num_target_layers=4, selector_topk=6, selector_dim=8,
                      backbone="dflash2")
    sel = Selector(c)
    sel.reset_parameters()
    logits, hid, prev = torch.randn(4, 7, 50), torch.randn(4, 7, 32), torch.randint(0, 50, (4,))
    assert sel.predecessor_codebook.abs().sum() == 0 and sel.successor_codebook.abs().sum() > 0
    assert torch.equal(sel(logits, hid, prev), logits.argmax(-1))  # zero transitions: the plain argmax path
    with torch.no_grad():
        for p in sel.parameters():
            p.normal_()
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
    terms, hits = 0.0, 0
    A, B, W = sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight
    for m in [0, 1, 3, 4]:
        s = torch.stack([logits[m, c] + (A[prev[m]] * (W @ hid[m]) * B[c]).sum() for c in top[m].tolist()])
        i = top[m].tolist().index(int(labels[m]))
        terms, hits = terms + w[m] * -(s.log_softmax(0)[i]), hits + int(s.argmax() == i)
    # normalised by every labelled row's weight (4.45), the uncovered row's included: the term adds over rows
    torch.testing.assert_close(loss, terms / w.sum())
    assert (st["sel_covered"].item(), st["sel_hits"].item()) == (4, hits)
    # a given normaliser (the training loop's: the global batch's mass over the ranks); rows split in two parts sum
    # to the whole
    torch.testing.assert_close(selector_loss(sel, logits, hid, prev, labels, w, torch.tensor(9.0))[0], terms / 9)
    parts = [selector_loss(sel, logits[r], hid[r], prev[r], labels[r], w[r], w.sum())[0]
             for r in (slice(0, 2), slice(2, 5))]
    torch.testing.assert_close(sum(parts), loss)


def _loss(tgt, mtp, d):
    """The drafter loss of `d` on two seeded sequences (40 and 31 tokens), 6 anchors each: (loss, stats)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, tgt.vocab_size, (2, 40), generator=g)
    lengths = torch.tensor([40, 31])
    anchors, valid = sample_anchors(lengths, 6, g)
    feats = extract(tgt, mtp, ids, lengths, d.config.target_layer_ids, need_g=True)
    return drafter_loss(d, tgt, feats, anchors, valid, gamma=4.0)


@pytest.mark.parametrize("variant", ["zero_init_residual", "token_only"])
def test_forward_backward_dflash2_with_dmtp_variant(models, variant):
    tgt, mtp = models
    d = dflash2(tgt, variant, perturb=False).train()
    loss, stats = _loss(tgt, mtp, d)
    assert torch.isfinite(loss) and set(stats) == {"loss", "hits", "labelled", "sel_loss", "sel_covered", "sel_hits"}
    assert stats["sel_loss"] > 0 and 0 < stats["sel_covered"] <= stats["labelled"]
    loss.backward()
    for n, p in d.named_parameters():
        assert p.grad is not None, n
    for n in ["candidate_selector.predecessor_codebook", "layers.0.attention_conv.kernel_projection.weight",
              "layers.1.mlp_conv.base_kernel", "layers.1.attention_conv.base_kernel",
              "injection.fuse.proj.weight" if variant == "zero_init_residual" else "fc.weight"]:
        assert d.get_parameter(n).grad.abs().sum() > 0, n
    # the predecessor codebook is 0 at init: the first step moves it only (the successor codebook and the hidden
    # projection get gradients once it is non-zero, as in LoRA)
    sel = d.selector
    assert sel.successor_codebook.grad.abs().sum() == 0 and sel.hidden_projection.weight.grad.abs().sum() == 0
    assert all(p.grad is None for p in list(tgt.parameters()) + list(mtp.parameters()))
    moved = dflash2(tgt, variant).train()
    _loss(tgt, mtp, moved)[0].backward()  # the same seeded batch
    sel = moved.selector
    assert sel.successor_codebook.grad.abs().sum() > 0 and sel.hidden_projection.weight.grad.abs().sum() > 0
    # the selector term is weighted in: same batch with weight 0 gives the plain DFlash loss
    d.config.selector_loss_weight = 0.0
    plain, _ = _loss(tgt, mtp, d)
    assert loss.item() == pytest.approx(plain.item() + 0.1 * float(stats["sel_loss"]), rel=1e-5)


def test_checkpoint_round_trip(models, tmp_path):
    tgt, _ = models
    d = dflash2(tgt, "zero_init_residual")
    d.save(tmp_path / "d2")
    cfg = json.loads((tmp_path / "d2" / "config.json").read_text())
    # DMTP(D2): the public reference would walk its selector from A, not T1: names of its own (test_public_checkpoints)
    assert cfg["architectures"] == ["DMTPDFlash2DraftModel"] and cfg["dmtp_config"]["backbone"] == "dflash2"
    dc = cfg["dmtp_config"]["dflash_config"]
    assert {k: dc[k] for k in ("selector_top_k", "selector_rank", "conv_kernel_size",
                               "conv_group_size")} == {"selector_top_k": 8, "selector_rank": 16,
                                                       "conv_kernel_size": 2, "conv_group_size": 16}
    assert "selector_loss_weight" in cfg["dmtp_config"]
    d2 = Drafter.load(tmp_path / "d2")
    assert d2.config.backbone == "dflash2" and d2.config.selector_topk == 8
    assert d.state_dict().keys() == d2.state_dict().keys()
    assert all(torch.equal(v, d2.state_dict()[k]) for k, v in d.state_dict().items())
    assert {"layers.0.attention_conv.base_kernel", "layers.1.mlp_conv.kernel_projection.weight",
            "candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
            "candidate_selector.hidden_projection.weight"} <= set(d2.state_dict())
    # a plain DFlash checkpoint loads into a dflash2 drafter: the new parts keep their identity initialisation
    df = make_drafter(tgt, "dflash")
    df.save(tmp_path / "df")
    assert json.loads((tmp_path / "df" / "config.json").read_text())["dmtp_config"]["backbone"] == "dflash"
    z = Drafter.load(tmp_path / "df", variant="zero_init_residual", backbone="dflash2")
    assert z.selector is not None and z.selector.predecessor_codebook.abs().sum() == 0
    assert all(m.kernel_projection.weight.abs().sum() == 0 for m in z.modules() if isinstance(m, DynamicConv))
    block, pos, ctx, ends = _inputs(tgt, df)
    assert torch.equal(Drafter.load(tmp_path / "df", backbone="dflash2")(block, pos, ctx, ends),
                       df(block, pos, ctx, ends))
    with pytest.raises(ValueError, match="unknown backbone 'dflash3'"):
        DrafterConfig(hidden_size=64, vocab_size=96, backbone="dflash3")


SLIDING = dict(layer_types=["sliding_attention"] * 3, sliding_window=6, use_sliding_window=True, is_causal=False)


def _parity(ours, pub, seed=0):
    """Max |diff| of hidden states and logits over one block after 3 and after 20 context rows (window 6), the
    DFlash2 paths and every candidate's score; the paths must also differ from the plain argmax somewhere."""
    g = torch.Generator().manual_seed(seed)
    H, V = ours.config.hidden_size, ours.config.vocab_size
    head = torch.randn(V, H, generator=g)
    worst, rescored = 0.0, False
    for start in (3, 20):
        taps = torch.randn(1, start, len(ours.config.target_layer_ids) * H, generator=g)
        noise = torch.randn(1, ours.config.block_size, H, generator=g)
        want, got = pub.forward(taps, noise, start), suite_block(ours, taps, noise, start)
        lw, lg = pub.logits(want[:, 1:], head), ours.logits(F.linear(got[:, 1:], head))
        anchor = torch.randint(V, (1,), generator=g)
        path, scores = pub.propose(want[:, 1:], anchor, head)
        assert torch.equal(ours.select(lg, got[:, 1:], anchor), path)
        prev = torch.cat([anchor, path[0, :-1]])
        z = ours.selector.hidden_projection(got[:, 1:])  # every slot at once, as the walk projects them
        for j, want_s in enumerate(scores):
            s, cand = ours.selector._scores(lg[:, j], z[:, j], prev[j:j + 1])
            assert dict(zip(cand[0].tolist(), s[0].tolist())) == want_s
        rescored |= not torch.equal(path, lg.argmax(-1))
        worst = max(worst, (got - want).abs().max().item(), (lg - lw).abs().max().item())
    assert rescored
    return worst


def test_public_dflash2_layout_both_ways(tmp_path):
    """A DFlash2 drafter in the public layout (sliding bidirectional layers, kernel 2, groups of 8, rank-8
    codebooks, output multiplier and soft cap) computes here what the public reference computes from the same
    files (0.0 in fp32), and a dflash2 drafter of ours saved and read by the reference likewise."""
    path = write_public(tmp_path / "pub", dflash2=True, **SLIDING)
    ours = Drafter.load(path)
    c = ours.config
    assert (c.backbone, c.conv_kernel_size, c.conv_group_size, c.selector_topk, c.selector_dim) == ("dflash2", 2, 8, 4, 8)
    assert (c.output_multiplier, c.final_logit_softcapping, c.block_size) == (0.5, 3.0, 4)
    assert _parity(ours, PublicDrafter(path)) == 0.0
    # ours -> public: a trained-looking dflash2 drafter with the same attention, saved in the public layout
    torch.manual_seed(3)
    mine = Drafter(DrafterConfig(hidden_size=32, vocab_size=50, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=8, intermediate_size=64, num_target_layers=4,
                                 block_size=4, window=0, layer_types=["sliding_attention"] * 2, sliding_window=6,
                                 is_causal=False, backbone="dflash2", conv_group_size=8, selector_topk=4,
                                 selector_dim=8, output_multiplier=0.5, final_logit_softcapping=3.0))
    with torch.no_grad():
        for n, p in mine.named_parameters():
            p.add_(torch.randn_like(p) * (1.0 if n.startswith("candidate_selector.") else 0.2))
    mine.save(tmp_path / "mine")
    saved = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert saved["architectures"] == ["DFlash2DraftModel"] and saved["is_causal"] is False
    assert _parity(mine, PublicDrafter(tmp_path / "mine"), seed=1) == 0.0
    # the published files name the codebooks without `.weight`; a checkpoint saved from nn.Embedding has it
    from safetensors.torch import load_file, save_file

    sd = load_file(str(path / "model.safetensors"))
    sd["candidate_selector.successor_codebook.weight"] = sd.pop("candidate_selector.successor_codebook")
    save_file(sd, str(path / "model.safetensors"))
    assert torch.equal(Drafter.load(path).selector.successor_codebook, ours.selector.successor_codebook)


def test_former_dflash2_layout_is_refused(models, tmp_path):
    from safetensors.torch import load_file, save_file

    tgt, _ = models
    dflash2(tgt, "dflash").save(tmp_path / "d")
    sd = load_file(str(tmp_path / "d" / "model.safetensors"))
    sd["selector.A"] = sd.pop("candidate_selector.predecessor_codebook")
    save_file(sd, str(tmp_path / "d" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"/d: DFlash2 weights in the suite's former layout \(\['selector.A'\]\)"):
        Drafter.load(tmp_path / "d")


def test_dmtp_d2_starts_from_a_public_dflash2_drafter(models, tmp_path):
    """DMTP(D2) = zero_init_residual on the dflash2 backbone, continued from a public DFlash2 checkpoint: every
    public weight kept, the fusion at zero, a training step moves it, and decoding stays lossless."""
    tgt, mtp = models
    if tgt.config.model_type != "qwen3":
        pytest.skip("the drafter side is under test: one target architecture suffices")
    path = write_public(tmp_path / "pub", hidden=tgt.hidden_size, vocab=tgt.vocab_size, layers=2, head_dim=16,
                        intermediate=128, taps=(1, 2), target_layers=tgt.num_layers, block_size=8, mask_token_id=2,
                        dflash2=True, layer_types=["sliding_attention", "full_attention"], sliding_window=5,
                        use_sliding_window=True)
    d = new_drafters(tgt, ["dmtp_d2"], {}, init_from={"dmtp_d2": str(path)},
                     backbones={"dmtp_d2": ("zero_init_residual", "dflash2")})["dmtp_d2"]
    assert (d.config.variant, d.config.backbone) == ("zero_init_residual", "dflash2")
    from safetensors.torch import load_file

    sd = d.state_dict()
    assert all(torch.equal(v, sd[k]) for k, v in load_file(str(path / "model.safetensors")).items())
    assert d.injection.fuse.proj.weight.abs().sum() == 0
    d.train()
    loss, _ = _loss(tgt, mtp, d)
    loss.backward()
    assert d.injection.fuse.proj.weight.grad.abs().sum() > 0
    d.eval()
    with torch.no_grad():
        d.injection.fuse.proj.weight.normal_(0, 0.05)
    batch = Batch(tgt, build_method("zero_init_residual", tgt, drafter=d, mtp=mtp), PROMPTS, 0.0, 13, set(),
                  torch.Generator().manual_seed(0))
    while not batch.finished:
        batch.step()
    assert [r.output_ids for r in batch.results] == [hf_greedy(tgt, p, 13) for p in PROMPTS]


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
    from dmtp.config.ablation import code
    from dmtp.cli.pipeline import eval_plan
    from dmtp.schema import derive
    from dmtp.profiles import get_profile

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
