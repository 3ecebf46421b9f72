"""Every injection variant: one interface, forward + backward, frozen parts stay frozen, zero-init identity."""
import math

import pytest
import torch
from conftest import make_drafter

from dmtp.models.attention import dense_mask
from dmtp.models.variants import NAMES, REGISTRY, get_variant
from dmtp.training.drafters import drafter_loss, extract, sample_anchors

NINE = ["dflash", "token_only", "t1_residual", "mask_residual", "context_fusion", "mtp_context", "fusion",
        "double_anchor_fusion", "zero_init_residual"]
CONTROLS = ["double_anchor_token_only"]  # zero_init_residual without the MTP hidden
BEYOND = ["given", "zero_init_residual_joint"]  # the blog's closing directions: adaptive multi-step MTP, joint training


def test_registry_has_exactly_the_nine_variants_and_the_control():
    """Every file of dmtp/models/variants/ is found (there is no import list); the nine of METHOD.md + the control, and
    the blog's next direction (`given`)."""
    assert sorted(NAMES) == sorted(NINE + CONTROLS + BEYOND)
    assert all(REGISTRY[n].description for n in NAMES)
    with pytest.raises(KeyError, match="unknown variant 'fuse'"):
        get_variant("fuse")


def test_the_variants_command_lists_the_registry_and_the_backbone_runs(capsys):
    """`dmtp variants`: every registered variant with its description, then the runs on another backbone by the
    variant they decode as (what `dmtp generate --method` takes for them)."""
    from dmtp.cli.main import main

    main(["variants"])
    out = capsys.readouterr().out.splitlines()
    assert [x.split()[0] for x in out[: len(NAMES)]] == sorted(NAMES)
    assert any(x.split() == ["dmtp_d2", "zero_init_residual", "on", "the", "dflash2", "backbone"] for x in out)
    assert any(x.split() == ["dflash2", "dflash", "on", "the", "dflash2", "backbone"] for x in out)


def test_layouts():
    lay = {n: get_variant(n).layout(get_variant(n), 7) for n in NAMES}
    assert lay["dflash"].kinds == ("A",) + ("M",) * 7 and lay["dflash"].offsets == tuple(range(8))
    assert lay["token_only"].kinds == ("T1",) + ("M",) * 6 and lay["token_only"].offsets == tuple(range(1, 8))
    assert lay["zero_init_residual"].kinds == ("A", "T1") + ("M",) * 6
    assert lay["zero_init_residual"].offsets == tuple(range(8))
    assert lay["given"].kinds == ("A", "G", "G", "G") + ("M",) * 4 and lay["given"].offsets == tuple(range(8))
    for n in NAMES:  # every variant proposes 7 candidates in total (given: g from the chain, 7 - g drafted)
        assert len(lay[n].predict) + lay[n].kinds.count("T1") == 7
        assert lay[n].given == (3 if n == "given" else 0)


def _batch(tgt, mtp, drafter, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, tgt.vocab_size, (2, 40), generator=g)
    lengths = torch.tensor([40, 31])
    anchors, valid = sample_anchors(lengths, 6, g)
    feats = extract(tgt, mtp, ids, lengths, drafter.config.target_layer_ids, need_g=True)
    return feats, anchors, valid


@pytest.mark.parametrize("name", NINE + CONTROLS + BEYOND)
def test_forward_backward_and_frozen(models, name):
    tgt, mtp = models
    d = make_drafter(tgt, name).train()
    feats, anchors, valid = _batch(tgt, mtp, d)
    loss, stats = drafter_loss(d, tgt, feats, anchors, valid, gamma=4.0)
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()
    for n, p in d.named_parameters():
        if n.startswith("fc.") and name == "mtp_context":
            continue  # mtp_context replaces the target-feature projection
        assert p.grad is not None, f"{name}: no gradient for {n}"
    inj = [p for n, p in d.named_parameters() if n.startswith("injection.")]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in inj)
    assert bool(inj) == (name not in ("dflash", "token_only") + tuple(CONTROLS))  # parameter-free injections
    frozen = list(tgt.parameters()) + list(mtp.parameters())
    assert all(not p.requires_grad and p.grad is None for p in frozen)


def test_zero_init_residual_is_double_anchor_token_only(models):
    tgt, mtp = models
    torch.manual_seed(3)
    from dmtp.models.drafter import Drafter

    d = Drafter(make_drafter(tgt, "zero_init_residual").config)  # fresh: W initialised to zero
    assert d.injection.fuse.proj.weight.abs().sum() == 0
    eA, eT, h, eM = (torch.randn(3, tgt.hidden_size) for _ in range(4))
    blk = d.block(eA, eT, h, eM[0])
    expect = torch.stack([eA, eT] + [eM[0].expand(3, -1)] * 6, dim=1)
    assert torch.equal(blk, expect)
    # ... and it can continue from a DFlash checkpoint: identical outputs to that DFlash drafter fed [A, T1, M x6]
    feats, anchors, valid = _batch(tgt, mtp, d)
    df = make_drafter(tgt, "dflash")
    d.load_state_dict({k: v for k, v in df.state_dict().items()}, strict=False)
    f = d.context(feats.taps, None)
    ctx = d.context_kv(f, torch.arange(40)[None].expand(2, 40))
    pos = anchors[:, :1] + torch.arange(8)
    blk = d.block(tgt.embed(feats.ids[:, 0]), tgt.embed(feats.ids[:, 1]), torch.randn(2, tgt.hidden_size),
                  tgt.embed(torch.tensor([2]))[0])
    out_z = d(blk, pos, ctx, anchors[:, :1])
    out_d = df(blk, pos, df.context_kv(df.context(feats.taps, None), torch.arange(40)[None].expand(2, 40)),
               anchors[:, :1])
    torch.testing.assert_close(out_z, out_d)
    # ... and the control variant builds exactly the block zero_init_residual starts from
    c = Drafter(make_drafter(tgt, "double_anchor_token_only").config)
    assert c.injection.layout(7) == d.injection.layout(7)
    assert torch.equal(c.block(eA, eT, h, eM[0]), expect)


def test_given_block_holds_the_first_g_chain_tokens_then_masks(models):
    """`given`'s block per count g: [A, E(T1) + W[...] (g >= 1), E(T2) .. E(Tg), M ...]; a chain shorter than G (a
    decode-time cap) leaves the slots past it MASK; at initialisation W = 0, so g = 1 is zero_init_residual's block."""
    tgt, _ = models
    from dmtp.models.drafter import Drafter

    torch.manual_seed(0)
    fresh = Drafter(make_drafter(tgt, "given").config)
    eA, eM, h = torch.randn(4, tgt.hidden_size), torch.randn(tgt.hidden_size), torch.randn(4, tgt.hidden_size)
    eT = torch.randn(4, 3, tgt.hidden_size)
    g = torch.tensor([0, 1, 2, 3])
    blk = fresh.block(eA, eT, h, eM, g)
    assert blk.shape == (4, 8, tgt.hidden_size)
    for b in range(4):
        expect = [eA[b]] + [eT[b, j] for j in range(g[b])] + [eM] * (7 - g[b])
        assert torch.equal(blk[b], torch.stack(expect))
    z = Drafter(make_drafter(tgt, "zero_init_residual").config)
    assert torch.equal(blk[1], z.block(eA[1:2], eT[1:2, 0], h[1:2], eM)[0])
    d = make_drafter(tgt, "given")  # W != 0: the first given slot fused, the later ones plain embeddings
    blk = d.block(eA, eT, h, eM, g)
    torch.testing.assert_close(blk[3, 1], eT[3, 0] + d.injection.fuse(eT[3, 0], h[3]))
    assert torch.equal(blk[3, 2:4], eT[3, 1:]) and not torch.equal(blk[3, 1], eT[3, 0])
    short = d.block(eA, eT[:, :2], h, eM, torch.tensor([2, 2, 2, 2]))  # a chain of 2 (`given-g2`)
    assert torch.equal(short[2:, :3], blk[2:, :3]) and torch.equal(short[:, 3:], eM.expand(4, 5, -1))


def reference_mask(ctx_end, slots, ctx_len, window):
    """The window by loops: block query sees context kv < a within `window` of a, and its own block, nothing else."""
    B, N = ctx_end.shape
    m = torch.zeros(B, N * slots, ctx_len + N * slots, dtype=torch.bool)
    for b in range(B):
        for n in range(N):
            a = int(ctx_end[b, n])
            for s in range(slots):
                q = n * slots + s
                for j in range(ctx_len):
                    m[b, q, j] = a - window <= j < a
                for r in range(slots):
                    m[b, q, ctx_len + n * slots + r] = True
    return m


@pytest.mark.parametrize("window", [4096, 5, 1])
def test_training_mask_matches_reference(window):
    ctx_end = torch.tensor([[1, 4, 9, 17], [2, 3, 11, 12]])
    got = dense_mask(ctx_end, 8, 20, window)[:, 0]
    assert torch.equal(got, reference_mask(ctx_end, 8, 20, window))


def test_flex_mask_matches_dense_when_available():
    if not torch.cuda.is_available():
        pytest.skip("flex attention backend runs on CUDA")
    from dmtp.models.attention import attend, build_mask

    q = torch.randn(2, 4, 32, 16, device="cuda")
    k = torch.randn(2, 4, 20 + 32, 16, device="cuda")
    v = torch.randn_like(k)
    ce = torch.tensor([[1, 4, 9, 17], [2, 3, 11, 12]], device="cuda")
    a = attend(q, k, v, build_mask(ce, 8, 20, 5, "sdpa"))
    b = attend(q, k, v, build_mask(ce, 8, 20, 5, "flex"))
    torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


def test_position_decayed_loss_weights(models):
    from dmtp.training.drafters import block_inputs

    tgt, mtp = models
    for name, first in [("dflash", 1), ("zero_init_residual", 2), ("token_only", 2)]:
        d = make_drafter(tgt, name)
        feats, anchors, valid = _batch(tgt, mtp, d)
        block, pos, labels, w = block_inputs(d, tgt, feats, anchors, valid, gamma=4.0)
        S = d.injection.layout(7).slots
        row_w, row_l, row_p = w[0, :S], labels[0, :S], pos[0, :S]
        ks = [k for k in range(1, 8) if k >= first]
        expect = torch.tensor([torch.exp(torch.tensor(-(k - 1) / 4.0)) for k in ks])
        torch.testing.assert_close(row_w[row_w > 0], expect)
        assert torch.equal(row_l[labels[0, :S] >= 0], feats.ids[0, row_p[labels[0, :S] >= 0]])


def test_given_trains_past_a_count_drawn_per_anchor(models):
    """`given`'s training blocks: g per anchor (`given_counts`, near uniform over 0..3 and the same on the host, where
    the loss normaliser is computed), the data's x_{a+1..a+g} in the given slots, the loss on the slots after them
    (candidate T_k weighted exp(-(k-1)/gamma), k > g) and none on the given ones."""
    from dmtp.models.variants.base import given_counts
    from dmtp.training.drafters import block_inputs, loss_weights

    tgt, mtp = models
    counts = given_counts(torch.arange(1, 4001), 3)
    assert set(counts.tolist()) == {0, 1, 2, 3} and all(900 < int((counts == g).sum()) < 1100 for g in range(4))
    d = make_drafter(tgt, "given")
    feats, anchors, valid = _batch(tgt, mtp, d)
    block, pos, labels, w = block_inputs(d, tgt, feats, anchors, valid, gamma=4.0)
    lay = d.injection.layout(7)
    _, host_w = loss_weights(lay, anchors, valid, feats.lengths, 4.0)
    assert torch.equal(host_w.reshape(w.shape), w)
    B, N = anchors.shape
    g, w, blk = given_counts(anchors, 3), w.reshape(B, N, 8), block.reshape(B, N, 8, -1)
    for b in range(B):
        for n in range(N):
            a, gn = int(anchors[b, n]), int(g[b, n])
            if not valid[b, n] or a + 8 > int(feats.lengths[b]):
                continue
            expect = [0.0] * (gn + 1) + [math.exp(-(k - 1) / 4.0) for k in range(gn + 1, 8)]
            torch.testing.assert_close(w[b, n], torch.tensor(expect))
            for j in range(2, gn + 1):  # later given slots: the data's token embeddings
                assert torch.equal(blk[b, n, j], tgt.embed(feats.ids[b, a + j]))
    loss, _ = drafter_loss(d, tgt, feats, anchors, valid, gamma=4.0)
    loss.backward()
    assert d.injection.fuse.proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("backbone", ["dflash", "dflash2"])
def test_no_fresh_weight_holds_uninitialised_memory(monkeypatch, backbone):
    """Fresh memory may hold anything, NaN included: with every `torch.empty` filled with NaN while they are built,
    every variant's drafter (both backbones) and the MTP head of every tiny target family come out finite: no
    parameter or buffer is left to whatever memory held."""
    from dmtp.models import tiny
    from dmtp.models.drafter import Drafter, DrafterConfig
    from dmtp.models.mtp import MTPHead

    targets = {arch: tiny.build(arch, seed=0)[0] for arch in ("qwen3", "qwen3_5", "qwen3_5_moe")}
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    built = {f"{arch} MTP head": MTPHead(tgt) for arch, tgt in targets.items()}
    tgt = targets["qwen3_5"]
    for name in NAMES:
        kw = {"variant_config": {"rank": 8}} if "rank" in get_variant(name).settings({}) else {}
        built[name] = Drafter(DrafterConfig(
            hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, intermediate_size=128, num_target_layers=tgt.num_layers,
            variant=name, mask_token_id=2, backbone=backbone, **kw))
    monkeypatch.undo()
    for what, module in built.items():
        bad = [n for n, t in [*module.named_parameters(), *module.named_buffers()]
               if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        assert not bad, (what, bad)
