"""The compiled training paths on CPU (inductor): pretraining and drafter training follow their eager paths step by
step in fp32; the drafters of one backbone and block size share one compiled graph; every drafter of a step in one
compiled graph with one AdamW step (resumed from either path's checkpoints, drafters joining at other steps);
per-drafter clipping and optimizer state by hand; the flex-attention block mask gives the dense mask's loss;
the FLOP count behind MFU, by hand; the training benchmark end to end. The GPU side (flex attention with its backward
pass) is in test_cuda.py."""
import copy
import json
import shutil

import numpy as np
import pytest
import torch
from conftest import compiled_graphs, make_drafter, token_seqs

from dmtp.cli.bench_train import bench_train, steady_rate
from dmtp.profiles import get_profile
from dmtp.models import tiny
from dmtp.models.attention import flex_mask
from dmtp.training import drafters as train_mod
from dmtp.training.common import compiled
from dmtp.training.drafters import (
    TrainConfig,
    block_loss,
    clip_grad_norms_,
    drafter_loss,
    drafters_loss,
    extract,
    group_state,
    load_group_states,
    new_drafters,
    sample_anchors,
    train_drafters,
)
from dmtp.training.pretrain import PretrainConfig, TargetArch, build_target, pretrain, train_flops_per_token

ARCH = TargetArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  intermediate_size=128)


def test_compile_flag():
    assert compiled("auto", "cpu") is False and compiled("on", "cpu") is True and compiled("off", "cuda") is False
    assert compiled("auto", "cuda") is True
    with pytest.raises(ValueError, match="compile='yes'"):
        compiled("yes", "cpu")


def test_flops_per_token_by_hand():
    """6 N + 6 A d_q (T + 1) with N = layer and MTP matrices + 2 V H (both LM-head uses)."""
    torch.manual_seed(0)
    tgt, mtp = build_target(ARCH, vocab_size=100, eos_id=0)
    H, I, d_q, d_kv = 64, 128, 2 * 32, 1 * 32
    attn = H * 2 * d_q + 2 * H * d_kv + d_q * H  # q_proj carries the output gate (2 d_q), k, v, o
    layer = attn + 3 * H * I
    N = 2 * layer + (2 * H * H + layer) + 2 * 100 * H  # 2 layers, MTP (fc 2H -> H + one layer), LM head twice
    assert train_flops_per_token(tgt, mtp, 32) == 6 * N + 6 * 3 * d_q * 33


def _pretrain(tmp, compile_flag, fused_ce="off"):
    torch.manual_seed(0)
    tgt, mtp = build_target(ARCH, vocab_size=128, eos_id=0)
    tokens = np.random.default_rng(0).integers(1, 128, 20_000).astype(np.int64)
    cfg = PretrainConfig(tokens=5 * 4 * 32, seq_len=32, batch_size=4, log_every=1, bf16=False, compile=compile_flag,
                         warmup_frac=0.5, fused_ce=fused_ce, ce_chunk=48)  # 124 tokens a head: chunks 48, 48, 28
    hist, info = pretrain(tgt, mtp, tokens, cfg, tmp / f"{compile_flag}_{fused_ce}", log=lambda *_: None)
    return hist, info, {k: v.clone() for k, v in tgt.model.state_dict().items()}


def test_compiled_pretraining_and_fused_loss_follow_eager(tmp_path):
    """The eager step with the materialised logits, the eager step with the fused chunked loss and the compiled step
    with the fused loss (a graph break: body and MTP layer one graph, the loss eager) follow each other in fp32."""
    eager, info_e, w_e = _pretrain(tmp_path, "off")
    assert not info_e["compiled"] and not info_e["fused_ce"] and len(eager) == 5
    for compile_flag in ("off", "on"):
        run, info, w = _pretrain(tmp_path, compile_flag, "on")
        assert info["compiled"] == (compile_flag == "on") and info["fused_ce"] and len(run) == 5
        for key in ("loss", "mtp_loss"):
            assert [h[key] for h in run] == pytest.approx([h[key] for h in eager], rel=1e-5), (compile_flag, key)
        assert [(h["acc"], h["mtp_acc"]) for h in run] == [(h["acc"], h["mtp_acc"]) for h in eager]
        for k in w_e:  # Adam divides by sqrt(v): a near-zero gradient's rounding can move its weight by a good part
            torch.testing.assert_close(w[k], w_e[k], rtol=0, atol=2e-4, msg=k)  # of lr (2e-3): 10 % of one step



@pytest.fixture(scope="module")
def qwen3_5():
    return tiny.build("qwen3_5", seed=0)


def test_compiled_drafter_training_follows_eager(qwen3_5, tmp_path):
    """dflash and zero_init_residual (block of 8; one trained block input, one frozen) through the compiled path with
    a region per drafter (`one_region=False`): the losses and weights of the eager path, and ONE compiled graph of
    `block_loss` for both drafters."""
    tgt, mtp = qwen3_5
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1)
    runs = {}
    for flag in ("off", "on"):
        ds = new_drafters(tgt, ["dflash", "zero_init_residual"], base)
        cfg = TrainConfig(steps=4, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1, save_every=100,
                          compile=flag, one_region=False)
        graphs = compiled_graphs(block_loss)
        hist = train_drafters(tgt, mtp, ds, token_seqs(), cfg, tmp_path / flag, log=lambda *_: None)
        runs[flag] = hist, {n: d.state_dict() for n, d in ds.items()}, compiled_graphs(block_loss) - graphs
    assert runs["off"][2] == 0 and runs["on"][2] == 1
    for name in ("dflash", "zero_init_residual"):
        (he, we), (hc, wc) = [(r[0][name], r[1][name]) for r in (runs["off"], runs["on"])]
        assert [h["step"] for h in hc] == [1, 2, 3, 4]
        for key in ("loss", "acc", "grad_norm"):
            assert [h[key] for h in hc] == pytest.approx([h[key] for h in he], rel=1e-5), key
        for k in we:
            torch.testing.assert_close(wc[k], we[k], rtol=0, atol=2e-5, msg=k)
        assert json.loads((tmp_path / "on" / name / "history.json").read_text())[-1]["elapsed_s"] > 0


# --- the compiled step in one region (`TrainConfig.one_region`, the compiled path's default) ----------------------
MIX = ["dflash", "zero_init_residual", "token_only", "dmtp_d2"]  # both block layouts, the MTP hidden, DFlash2
BACKBONES = {"dmtp_d2": ("zero_init_residual", "dflash2")}


def _mix(tgt, names=MIX):
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1, selector_topk=8, selector_dim=16)
    return new_drafters(tgt, names, base, backbones=BACKBONES)


def _train(models, out, names=MIX, **kw):
    """4 steps of `names` side by side (clip 0.5: the gradients are clipped) -> per drafter (history, weights, initial
    weights)."""
    tgt, mtp = models
    ds = _mix(tgt, names)
    init = {n: {k: v.clone() for k, v in d.state_dict().items()} for n, d in ds.items()}
    cfg = TrainConfig(**{**dict(steps=4, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1, save_every=100,
                                clip=0.5, compile="on"), **kw})
    hist = train_drafters(tgt, mtp, ds, token_seqs(), cfg, out, log=lambda *_: None)
    return {n: (hist[n], d.state_dict(), init[n]) for n, d in ds.items()}


def _assert_follows(run, ref, names=MIX, rtol=1e-2):
    """Each drafter's losses and grad norms, and its weight updates w - w0 (per tensor, relative in norm: Adam divides
    by sqrt(v), so a near-zero gradient's rounding moves its weights by a part of lr whatever the thread count)."""
    for n in names:
        (hist, w, w0), (hist_ref, w_ref, _) = run[n], ref[n]
        for key in ("loss", "grad_norm"):
            assert [h[key] for h in hist] == pytest.approx([h[key] for h in hist_ref], rel=1e-5), (n, key)
        for k in w0:
            assert (w[k] - w_ref[k]).norm() <= rtol * (w_ref[k] - w0[k]).norm(), (n, k)


@pytest.fixture(scope="module")
def runs(qwen3_5, tmp_path_factory):
    """The mix for 4 steps on the eager path (the reference) and in one compiled region, with its number of graphs."""
    root = tmp_path_factory.mktemp("one_region")
    eager = _train(qwen3_5, root / "eager", compile="off")
    graphs = compiled_graphs(drafters_loss)
    one = _train(qwen3_5, root / "one")
    return {"eager": eager, "one": one, "graphs": compiled_graphs(drafters_loss) - graphs, "root": root}


def test_one_region_follows_the_per_drafter_path(runs):
    """Every drafter of the mix in ONE compiled graph with one AdamW step: the losses, grad norms and weights of the
    eager path, which trains them one by one (own loss, clip_grad_norm_, AdamW)."""
    assert runs["graphs"] == 1
    _assert_follows(runs["one"], runs["eager"])
    hist = runs["one"]["dmtp_d2"][0]
    assert [h["step"] for h in hist] == [1, 2, 3, 4] and "sel_acc" in hist[0]


def test_one_region_resumes(qwen3_5, runs, tmp_path):
    """Stopped after step 2 and resumed, in one region: the uninterrupted run (the same graph, no recompile). A
    checkpoint of either path resumes on the other (each drafter's own AdamW state either way)."""
    graphs = compiled_graphs(drafters_loss)
    _train(qwen3_5, tmp_path / "a", stop_after=2)
    _assert_follows(_train(qwen3_5, tmp_path / "a"), runs["one"], rtol=1e-5)
    _train(qwen3_5, tmp_path / "b", stop_after=2, compile="off")
    _assert_follows(_train(qwen3_5, tmp_path / "b"), runs["eager"])
    _train(qwen3_5, tmp_path / "c", stop_after=2)
    _assert_follows(_train(qwen3_5, tmp_path / "c", compile="off"), runs["eager"])
    assert compiled_graphs(drafters_loss) == graphs


def test_the_fused_step_leaves_the_plain_region_whole(qwen3_5, tmp_path, monkeypatch):
    """The fused LM-head loss's step (a graph break in the loop over drafters: that frame runs eagerly, a mark torch
    keeps on the code object) and then the plain one-region step in the same process: the plain step is still ONE
    graph of `drafters_loss` (traced by AOTAutograd's eager backend, as the compiled path's)."""
    monkeypatch.setattr(train_mod, "_JOINT_FUSED", [torch.compile(train_mod.drafters_loss_fused, backend="aot_eager",
                                                                  dynamic=False)])
    monkeypatch.setattr(train_mod, "_JOINT", [torch.compile(drafters_loss, backend="aot_eager", dynamic=False,
                                                            fullgraph=True)])
    names = ["dflash", "token_only"]
    for fused in ("on", "off"):
        graphs = compiled_graphs(drafters_loss)
        _train(qwen3_5, tmp_path / fused, names=names, steps=2, fused_ce=fused, ce_chunk=9)
    assert compiled_graphs(drafters_loss) - graphs == 1


@pytest.fixture(scope="module")
def traced():
    """`drafters_loss` through AOTAutograd's eager backend, as its own function (its own graphs): the same graph per
    set of drafters and joint backward as Inductor's, without a C++ build per set (minutes on two cores)."""
    fn = lambda *a: drafters_loss(*a)  # noqa: E731
    return fn, torch.compile(fn, backend="aot_eager", dynamic=False, fullgraph=True)


def test_drafters_at_different_steps(qwen3_5, runs, traced, tmp_path, monkeypatch):
    """dflash finished, zero_init_residual resumed at step 2, token_only and dmtp_d2 fresh: steps 1-2 train the fresh
    two in one region, steps 3-4 all three; dflash is left alone. Each follows its uninterrupted run."""
    fn, compiled_fn = traced
    monkeypatch.setattr(train_mod, "_JOINT", [compiled_fn])
    shutil.copytree(runs["root"] / "eager" / "dflash", tmp_path / "dflash")
    _train(qwen3_5, tmp_path, names=["zero_init_residual"], stop_after=2, compile="off")
    done = (tmp_path / "dflash" / "drafter" / "model.safetensors").read_bytes()
    run = _train(qwen3_5, tmp_path)
    assert compiled_graphs(fn) == 2  # {token_only, dmtp_d2}, then {zero_init_residual, token_only, dmtp_d2}
    assert (tmp_path / "dflash" / "drafter" / "model.safetensors").read_bytes() == done and run["dflash"][0] == []
    later = ["zero_init_residual", "token_only", "dmtp_d2"]
    _assert_follows(run, runs["eager"], names=later)
    assert all((tmp_path / n / "DONE").exists() for n in later)


def test_clip_grad_norms_is_clip_grad_norm_per_group():
    """One clip on the device for several parameter groups equals clip_grad_norm_ on each (a group above the limit
    is scaled to it, one below untouched, a parameter without a gradient skipped), and returns each group's norm."""
    g = torch.Generator().manual_seed(0)
    groups = [[torch.nn.Parameter(torch.zeros(s)) for s in shapes] for shapes in ([(3, 4), (5,)], [(2, 2)], [(7,)])]
    for gs, scale in zip(groups, (3.0, 0.01, 1.0)):
        for p in gs:
            p.grad = torch.randn(p.shape, generator=g) * scale
    groups[2].append(torch.nn.Parameter(torch.zeros(2)))  # no gradient
    ref = [[p.grad.clone() for p in gs if p.grad is not None] for gs in groups]
    want = []
    for gs, grads in zip(groups, ref):
        ps = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
        for p, x in zip(ps, grads):
            p.grad = x.clone()
        want.append((torch.nn.utils.clip_grad_norm_(ps, 1.0), [p.grad for p in ps]))
    norms = clip_grad_norms_(groups, 1.0)
    assert norms[0] > 1 > norms[1]
    for gs, n, (n_ref, grads) in zip(groups, norms, want):
        torch.testing.assert_close(n, n_ref, rtol=1e-6, atol=0)
        for p, x in zip([p for p in gs if p.grad is not None], grads):
            torch.testing.assert_close(p.grad, x, rtol=1e-6, atol=0)


def test_group_state_is_a_drafters_own_optimizer_state():
    """One AdamW with a param group per drafter steps each group as the drafter's own AdamW would; `group_state` is
    that optimizer's state dict, and `load_group_states` puts such state dicts back into a shared one."""
    g = torch.Generator().manual_seed(0)
    kw = dict(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), foreach=True)
    own = [[torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes] for shapes in ([(3, 4), (5,)], [(2,)])]
    opts = [torch.optim.AdamW(ps, **kw) for ps in own]

    def shared_copy():
        groups = [[torch.nn.Parameter(p.detach().clone()) for p in ps] for ps in own]
        return groups, torch.optim.AdamW([{"params": ps} for ps in groups], **kw)

    def step(groups, joint):  # the same random gradients into both, one step of each optimizer
        for ps, qs in zip(own, groups):
            for p, q in zip(ps, qs):
                p.grad = torch.randn(p.shape, generator=g)
                q.grad = p.grad.clone()
        for o in opts + [joint]:
            o.step()
        assert all(torch.equal(p, q) for ps, qs in zip(own, groups) for p, q in zip(ps, qs))

    groups, joint = shared_copy()
    step(groups, joint)
    for i, o in enumerate(opts):
        mine, theirs = group_state(joint, i), o.state_dict()
        assert mine["param_groups"] == theirs["param_groups"] and mine["state"].keys() == theirs["state"].keys()
        for j, st in theirs["state"].items():
            assert all(torch.equal(mine["state"][j][k], v) for k, v in st.items()), (i, j)
    groups, joint = shared_copy()  # state dicts as read from a checkpoint: copies, not the live tensors
    load_group_states(joint, {i: copy.deepcopy(o.state_dict()) for i, o in enumerate(opts)})
    step(groups, joint)
    with pytest.raises(ValueError, match="optimizer state of 2 parameters for a group of 1"):
        load_group_states(joint, {1: opts[0].state_dict()})


@pytest.mark.parametrize("name,window", [("dflash", 4096), ("dflash", 5), ("token_only", 7),
                                         ("zero_init_residual", 4096), ("dflash2", 4096), ("token_only", 0)])
def test_flex_block_mask_gives_the_dense_loss(qwen3_5, name, window):
    """The flex-attention block mask (forward only on CPU: flex attention has no CPU backward) gives the dense mask's
    loss over a batch padded to a longer context: both block layouts (8 slots from A, 7 from T1), a window shorter
    than the context, the DFlash2 backbone, and (window 0) public sliding-window layers, causal and bidirectional,
    one mask per layer. The mask depends on nothing else of a variant."""
    tgt, mtp = qwen3_5
    kw = {"backbone": "dflash2", "selector_topk": 8, "selector_dim": 16} if name == "dflash2" else {}
    if window == 0:
        kw = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5}
    d = make_drafter(tgt, "dflash" if name == "dflash2" else name, window=window, **kw)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, tgt.vocab_size, (2, 40), generator=g)
    lengths = torch.tensor([40, 31])
    anchors, valid = sample_anchors(lengths, 6, g)
    with torch.no_grad():
        dense, _ = drafter_loss(d, tgt, extract(tgt, mtp, ids, lengths, d.config.target_layer_ids, True), anchors,
                                valid, 4.0)
        padded = torch.nn.functional.pad(ids, (0, 24))
        feats = extract(tgt, mtp, padded, lengths, d.config.target_layer_ids, True)
        mask = [flex_mask(anchors, d.layout.slots, padded.shape[1], r, d.layout.offsets[0]) for r in d.config.rules()]
        flex, _ = drafter_loss(d, tgt, feats, anchors, valid, 4.0, mask=mask)
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-6)


def test_steady_rate_by_hand():
    hist = [{"step": 0, "tokens": 10, "elapsed_s": 5.0}, {"step": 10, "tokens": 110, "elapsed_s": 6.0},
            {"step": 20, "tokens": 210, "elapsed_s": 6.5}]
    assert steady_rate(hist, 10, "tokens") == (200.0, 10)  # compile and warm-up (the first record) left out
    with pytest.raises(ValueError, match="raise --steps"):
        steady_rate(hist, 11, "tokens")


def test_bench_train_end_to_end(tmp_path):
    """The training benchmark on CPU (smoke shapes; every path runs eager here, with the plain loss): train.json holds
    the three pretraining paths and the three of the drafters (per_drafter: theirs only; compiled_plain_ce:
    pretraining's only), the ratio records join what ratios.json already held, and a rerun replaces only the records
    it remakes."""
    (tmp_path / "ratios.json").write_text(json.dumps([{"target": "other", "value": 1.0, "goal": "report",
                                                       "met": True, "note": ""}]))
    recs = bench_train("smoke", tmp_path, steps=4, warm=1, drafter_steps=3)
    n = len(get_profile("smoke").ablation.variants)  # every variant of the ablation (main, supplementary, control)
    res = json.loads((tmp_path / "train.json").read_text())
    for part, key, paths in (("pretrain", "tokens_per_s", {"eager", "compiled_plain_ce", "compiled"}),
                             ("drafters", "steps_per_s", {"eager", "per_drafter", "compiled"})):
        assert set(res[part]) == paths and all(r[key] > 0 for r in res[part].values()), res[part]
    assert res["pretrain"]["eager"]["mfu"] is None and res["drafters"]["eager"]["drafters"] == n  # CPU: no peak
    assert not any(r["fused_ce"] for r in res["pretrain"].values())  # fused_ce "auto": CUDA only
    pre, ce, dr, one = "smoke pretraining tok/s, compiled / eager", \
        "smoke pretraining tok/s, fused / plain LM-head loss (compiled)", \
        f"smoke drafter training steps/s, {n} drafters side by side, compiled / eager", \
        "smoke drafter training steps/s, one compiled region / one per drafter"
    assert [r.target for r in recs] == [pre, ce, dr, one] and recs[2].goal_text == ">= 4" and recs[3].value > 0
    assert "off on this device" in recs[1].note
    assert [r["target"] for r in json.loads((tmp_path / "ratios.json").read_text())] == ["other", pre, ce, dr, one]
    bench_train("smoke", tmp_path, steps=4, warm=1, parts=("pretrain",))
    assert [r["target"] for r in json.loads((tmp_path / "ratios.json").read_text())] == ["other", dr, one, pre, ce]


def test_flex_attention_under_autocast():
    """Under bf16 autocast the drafter's q and k leave their RMSNorm in fp32 and v is bf16: flex attention gets one
    dtype, as SDPA does from autocast, and agrees with the dense mask."""
    from dmtp.models.attention import attend, dense_mask

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 48, 16, generator=g), torch.randn(2, 2, 20 + 48, 16, generator=g)
    v = torch.randn(2, 2, 20 + 48, 16, generator=g).bfloat16()
    ends = torch.tensor([[1, 4, 9, 17, 18, 19], [2, 3, 11, 12, 15, 19]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        flex, dense = attend(q, k, v, flex_mask(ends, 8, 20, 5)), attend(q, k, v, dense_mask(ends, 8, 20, 5))
    assert flex.dtype == dense.dtype == torch.bfloat16
    torch.testing.assert_close(flex.float(), dense.float(), rtol=2e-2, atol=2e-2)


def test_bench_train_kernel_profile(tmp_path):
    """--kernel-profile: each part's last path runs again under the profiler; the file gives time by kind of kernel
    (on the CPU: the operators), the matrix products among them, then the profiler's own table."""
    bench_train("smoke", tmp_path, steps=3, warm=1, paths=("compiled",), kernel_profile=2)
    for part in ("pretrain", "drafters"):
        text = (tmp_path / f"profile_train_{part}.txt").read_text()
        title, head, table = text.split("\n\n", 2)
        kinds = [line.split()[0] for line in head.splitlines()[1:]]
        assert title.startswith(f"bench_{part}, compiled path, 3 steps")
        assert "gemm" in kinds and len(kinds) == len(set(kinds)), head
        assert sum(float(line.split()[2].rstrip("%")) for line in head.splitlines()[1:]) == pytest.approx(100, abs=1)
        assert "Self CPU time total" in table
