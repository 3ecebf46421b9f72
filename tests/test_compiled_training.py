"""The compiled training paths on CPU (inductor): pretraining and drafter training follow their eager paths step by
step in fp32; the drafters of one backbone and block size share one compiled graph; the flex-attention block mask
gives the dense mask's loss; the FLOP count behind MFU, by hand; the training benchmark end to end. The GPU side
(flex attention with its backward pass) is in test_cuda.py."""
import json
import random

import numpy as np
import pytest
import torch
from conftest import compiled_graphs, make_drafter

from dmtp.cli.bench_train import bench_train, steady_rate
from experiments.profiles import get_profile
from dmtp.models import tiny
from dmtp.models.attention import flex_mask
from dmtp.training.common import compiled
from dmtp.training.drafters import (
    TrainConfig,
    block_loss,
    drafter_loss,
    extract,
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


def _seqs(n=12, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 96) for _ in range(rng.randrange(14, 40))] for _ in range(n)]


@pytest.fixture(scope="module")
def qwen3_5():
    return tiny.build("qwen3_5", seed=0)


def test_compiled_drafter_training_follows_eager(qwen3_5, tmp_path):
    """dflash and zero_init_residual (block of 8; one trained block input, one frozen) through the compiled path:
    the losses and weights of the eager path, and ONE compiled graph for both drafters."""
    tgt, mtp = qwen3_5
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1)
    runs = {}
    for flag in ("off", "on"):
        ds = new_drafters(tgt, ["dflash", "zero_init_residual"], base)
        cfg = TrainConfig(steps=4, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1, save_every=100,
                          compile=flag)
        graphs = compiled_graphs(block_loss)
        hist = train_drafters(tgt, mtp, ds, _seqs(), cfg, tmp_path / flag, log=lambda *_: None)
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
    the three pretraining paths and the drafters' two, the ratio records join what ratios.json already held, and a
    rerun replaces only the records it remakes."""
    (tmp_path / "ratios.json").write_text(json.dumps([{"target": "other", "value": 1.0, "goal": "report",
                                                       "met": True, "note": ""}]))
    recs = bench_train("smoke", tmp_path, steps=4, warm=1, drafter_steps=3)
    n = len(get_profile("smoke").ablation.variants)  # every variant of the ablation (main, supplementary, control)
    res = json.loads((tmp_path / "train.json").read_text())
    for part, key, paths in (("pretrain", "tokens_per_s", {"eager", "compiled_plain_ce", "compiled"}),
                             ("drafters", "steps_per_s", {"eager", "compiled"})):
        assert set(res[part]) == paths and all(r[key] > 0 for r in res[part].values()), res[part]
    assert res["pretrain"]["eager"]["mfu"] is None and res["drafters"]["eager"]["drafters"] == n  # CPU: no peak
    assert not any(r["fused_ce"] for r in res["pretrain"].values())  # fused_ce "auto": CUDA only
    pre, ce, dr = "smoke pretraining tok/s, compiled / eager", \
        "smoke pretraining tok/s, fused / plain LM-head loss (compiled)", \
        f"smoke drafter training steps/s, {n} drafters side by side, compiled / eager"
    assert [r.target for r in recs] == [pre, ce, dr] and recs[2].goal_text == ">= 4" and recs[2].value > 0
    assert "off on this device" in recs[1].note
    assert [r["target"] for r in json.loads((tmp_path / "ratios.json").read_text())] == ["other", pre, ce, dr]
    bench_train("smoke", tmp_path, steps=4, warm=1, parts=("pretrain",))
    assert [r["target"] for r in json.loads((tmp_path / "ratios.json").read_text())] == ["other", dr, pre, ce]


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
