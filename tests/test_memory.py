"""The memory model (`dmtp.memory`): parameter counts by hand and against the models built on the meta device, each
training and evaluation term by hand, the fit check's order of settings, the auto rule of the fused drafter loss; the
drafter loss through the fused chunked LM-head loss equals the plain one (value, accuracy, every gradient), on the
eager path and through the compiled one-region step."""
import pytest
import torch

from dmtp import memory as M
from dmtp.memory import DrafterSpec, TrainSetting, drafter_spec, plan_training, target_params, train_terms

# a tiny hybrid Qwen3.5 config: one GDN layer, one attention layer, untied head, one MTP layer
CFG = dict(model_type="qwen3_5_text", vocab_size=10, hidden_size=8, num_hidden_layers=2,
           layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
           head_dim=4, intermediate_size=16, linear_num_value_heads=2, linear_num_key_heads=1,
           linear_key_head_dim=4, linear_value_head_dim=4, linear_conv_kernel_dim=4, tie_word_embeddings=False,
           mtp_num_hidden_layers=1)


def test_target_params_by_hand():
    attn = 8 * 2 * 8 + 2 * 8 * 4 + 8 * 8 + 2 * 4  # q (+ gate), k, v, o, q/k norms = 264
    gdn = 8 * 16 + 8 * 8 + 2 * 8 * 2 + 16 * 4 + 2 * 2 + 4 + 8 * 8  # qkv, z, b+a, conv, dt+A, norm, out = 360
    ffn = 3 * 8 * 16
    layers = (gdn + ffn + 16) + (attn + ffn + 16)
    mtp = 2 * 8 + 2 * 8 * 8 + attn + ffn + 2 * 8 + 8
    P = target_params(CFG)
    assert P == dict(embedding=80, lm_head=80, layers=layers, norm=8, mtp=mtp, total=168 + layers + mtp)
    assert target_params({**CFG, "tie_word_embeddings": True})["lm_head"] == 0
    moe = {**CFG, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 3,
           "shared_expert_intermediate_size": 5}
    assert M._ffn(moe) == 8 * 4 + 4 * 3 * 8 * 3 + 3 * 8 * 5 + 8  # router, experts, shared expert, its gate


@pytest.mark.parametrize("profile", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_param_counts_equal_the_built_models(profile):
    """The target (cut to 4 layers: every kind of layer), its MTP head and a paper drafter of the largest injection
    variant, built on the meta device: the formulas count every parameter."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from dmtp.experiment import drafter_config
    from dmtp.models.drafter import Drafter, DrafterConfig
    from dmtp.models.mtp import MTPHead
    from dmtp.models.target import Target
    from dmtp.profiles import get_profile

    p = get_profile(profile)
    cfg = M.with_layers(p.scale.target_config, 4)
    kw = dict(cfg)
    hf = AutoConfig.for_model(kw.pop("model_type"), **kw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
        mtp = MTPHead(Target(model))
        d = Drafter(DrafterConfig(**{**drafter_config(p, hf), "num_target_layers": 64}, variant="fusion"))
    P = target_params(cfg)
    assert P["total"] - P["mtp"] == sum(x.numel() for x in model.parameters())
    assert P["mtp"] == sum(x.numel() for x in mtp.parameters())
    dr = p.drafter
    spec = drafter_spec(cfg, dr.layers, dr.heads, dr.kv_heads, dr.head_dim, dr.intermediate, dr.block_size)
    assert spec.params == sum(x.numel() for x in d.parameters())


def test_paper_target_sizes():
    """Qwen3.6-27B: 26.90 B parameters + a 0.42 B MTP head, 54.6 GB in bf16 (the issue's 53.8 GB leaves the head
    out); its 5-layer drafter 1.78 B, 28.5 GB of fp32 weights, gradients and AdamW moments."""
    from dmtp.profiles import get_profile

    cfg = get_profile("qwen3.6-27b").scale.target_config
    P = target_params(cfg)
    assert P["total"] - P["mtp"] == 26_895_998_464 and P["mtp"] == 424_699_392
    d = drafter_spec(cfg, 5, 32, 8, 128, 17408, 8)
    assert d.params == 1_782_652_160 and d.params * 16 / 1e9 == pytest.approx(28.52, abs=0.01)


D = DrafterSpec(hidden=8, vocab=10, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, taps=2, slots=3,
                injection=5)


def test_train_terms_by_hand():
    assert D.layer_params == 2 * 8 * 8 + 2 * 8 * 4 + 8 + 3 * 8 * 16 + 16
    assert D.params == 2 * D.layer_params + 128 + 16 + 5
    P_t = target_params(CFG)["total"]
    s = TrainSetting(world=2, micro_batch=3, seq_len=5, anchors=4)
    t = train_terms(CFG, D, s)
    R, C = 3 * 4 * 3, 3 * 5  # block rows, context rows
    assert t["target"] == P_t * 2 and t["target_gathered"] == 0
    assert t["drafter_state"] == D.params * 16 / 2 and t["drafter_compute"] == 2 * D.layer_params * 6
    assert D.layer_params > D.root_params == 2 * 8 * 8 + 16 + 5
    assert t["features"] == C * 2 * 8 * 2 + C * 2 * 8 * 6 + C * 8 * 2
    assert t["feature_pass"] == C * max(3 * 16, 4 * (2 * 4 + 2 * 8), 32) * 2
    per_row = 12 * 8 + 4 * 8 + 6 * 16
    assert t["layers"] == R * 2 * per_row + 2 * C * 2 * 4 * 2
    assert t["logits"] == R * 10 * 12
    assert t["total"] == pytest.approx(sum(v for k, v in t.items() if k != "total"))
    sh = train_terms(CFG, D, TrainSetting(world=2, micro_batch=3, seq_len=5, anchors=4, shard_target=True,
                                          checkpointing=True, ce_chunk=7))
    layers = target_params(CFG)["layers"]
    gdn_layer = 360 + 3 * 8 * 16 + 16  # the largest decoder layer
    assert sh["target"] == (P_t - layers / 2) * 2 and sh["target_gathered"] == 2 * gdn_layer * 2
    assert sh["layers"] == R * 2 * 4 * 8 + R * per_row + 2 * C * 2 * 4 * 2
    assert sh["logits"] == R * 8 * 2 + 7 * 10 * 16
    one = train_terms(CFG, D, TrainSetting(world=1, micro_batch=3, seq_len=5, anchors=4, shard_drafters=False,
                                           shard_target=True))
    assert one["drafter_state"] == D.params * 16 and one["drafter_compute"] == D.params * 2
    assert one["target"] == P_t * 2 and one["target_gathered"] == 0  # nothing to shard over on one rank


def test_plan_order_and_refusal():
    """Replicated before sharded, no checkpointing before checkpointing, the largest micro-batch first; nothing fits:
    the smallest setting tried, fits=False, and one line naming the numbers."""
    big = dict(gpus=2, seq_len=5, anchors=4, global_batch=8)
    full = train_terms(CFG, D, TrainSetting(world=2, micro_batch=4, seq_len=5, anchors=4))["total"]
    p = plan_training(CFG, D, gpu_gb=full / M.GIB / M.USABLE * 1.001, **big)
    assert p.fits and p.setting.micro_batch == 4 and p.accumulation == 1 and not p.setting.shard_target
    assert not p.setting.checkpointing
    p = plan_training(CFG, D, gpu_gb=full / M.GIB / M.USABLE * 0.999, **big)
    assert p.fits and p.setting.micro_batch == 2 and p.accumulation == 2 and not p.setting.checkpointing
    tiny = plan_training(CFG, D, gpu_gb=1e-9, **big)
    # shard x checkpointing x (micro-batch 4 at once; 2 and 1 accumulated, reduced once a step or every micro-batch)
    assert not tiny.fits and len(tiny.tried) == 2 * 2 * (1 + 2 + 2)
    assert tiny.terms["total"] == min(t for _, t in tiny.tried) and tiny.setting.micro_batch == 1
    assert not tiny.setting.defer_sync and tiny.terms["grad_accum"] == 0
    assert tiny.setting.checkpointing and tiny.line().startswith("does NOT fit: target replicated")
    assert "GB of 0.0 GB per GPU" in tiny.line()
    with pytest.raises(ValueError, match="not divisible by 3 GPUs"):
        plan_training(CFG, D, gpu_gb=80, gpus=3, seq_len=5, anchors=4, global_batch=8)


def test_accumulation_terms_and_sync_order():
    """Under FSDP with accumulation and one reduce-scatter a step, each drafter's full fp32 gradient is held between
    micro-batches (P_d x 4 per drafter side by side); with one micro-batch, one process without FSDP or a
    reduce-scatter every micro-batch, nothing more. The plan tries once a step before every micro-batch at a
    micro-batch size, and a larger micro-batch before either at a smaller one."""
    kw = dict(world=2, micro_batch=2, seq_len=5, anchors=4, drafters=3)
    base = train_terms(CFG, D, TrainSetting(**kw, accumulation=2, defer_sync=False))
    held = train_terms(CFG, D, TrainSetting(**kw, accumulation=2))
    assert base["grad_accum"] == 0 and held["grad_accum"] == 3 * D.params * 4
    assert held["total"] - base["total"] == 3 * D.params * 4
    assert train_terms(CFG, D, TrainSetting(**kw))["grad_accum"] == 0  # one micro-batch
    assert train_terms(CFG, D, TrainSetting(**{**kw, "world": 1}, shard_drafters=False,
                                            accumulation=2))["grad_accum"] == 0
    big = dict(gpus=2, seq_len=5, anchors=4, global_batch=8, drafters=3, shard_target="off", checkpointing="off")
    gb = lambda t: t / M.GIB / M.USABLE  # noqa: E731
    p = plan_training(CFG, D, gpu_gb=gb(held["total"]) * 1.0001, **big)  # micro 4 no, micro 2 once a step: fits
    assert p.fits and p.setting.micro_batch == 2 and p.setting.defer_sync and p.accumulation == 2
    assert "gradients reduced once a step" in p.line()
    p = plan_training(CFG, D, gpu_gb=gb(held["total"]) * 0.9999, **big)  # only every micro-batch fits at 2
    assert p.fits and p.setting.micro_batch == 2 and not p.setting.defer_sync
    assert "gradients reduced every micro-batch" in p.line()
    p = plan_training(CFG, D, gpu_gb=gb(held["total"]) * 0.9999, grad_sync="last", **big)  # told once: micro 1
    assert p.fits and p.setting.micro_batch == 1 and p.setting.defer_sync and p.accumulation == 4
    with pytest.raises(ValueError, match="grad_sync='sometimes'"):
        plan_training(CFG, D, gpu_gb=80, grad_sync="sometimes", **big)


def test_paper_plain_logits_are_tens_of_gb():
    """At the paper profile (16 sequences per rank on 8 GPUs, 512 anchors, 8 slots, vocabulary 248,320) the plain
    loss's logits alone are ~195 GB per rank; "auto" fuses them, the tiny and mini shapes stay plain."""
    from dmtp.profiles import get_profile

    cfg = get_profile("qwen3.6-27b").scale.target_config
    d = drafter_spec(cfg, 5, 32, 8, 128, 17408, 8)
    t = train_terms(cfg, d, TrainSetting(world=8, micro_batch=16, seq_len=2048, anchors=512))
    assert t["logits"] == 16 * 512 * 8 * 248320 * 12 and t["logits"] > 190e9
    assert M.drafter_ce_chunk("auto", 0, 16 * 512 * 8, 248320) == M.ce_chunk_rows(248320) == 540
    assert M.drafter_ce_chunk("auto", 0, 32 * 64 * 8, 8192) == 0  # mini: 0.5 GiB of logits, plain
    assert M.drafter_ce_chunk("on", 100, 8, 10) == 100 and M.drafter_ce_chunk("off", 0, 10**9, 10**6) == 0
    with pytest.raises(ValueError, match="fused_ce='yes'"):
        M.drafter_ce_chunk("yes", 0, 1, 1)


def test_eval_terms_by_hand():
    t = M.eval_terms(CFG, D, batch=3, length=6, prefill=2)
    assert t["weights"] == (target_params(CFG)["total"] + D.params) * 2
    assert t["kv_cache"] == 3 * 6 * (2 * (2 * 1 * 4 * 2) + 2 * 2 * 1 * 4 * 2)  # attention + MTP layer, drafter
    assert t["linear_state"] == 3 * 1 * (2 * 4 * 4 * 4 + 16 * 3 * 2)
    assert t["verify_logits"] == 3 * 3 * 10 * 4
    assert t["prefill"] == 2 * 6 * max(48, 96, 32) * 2 + 2 * 6 * 8 * 4


def test_tables_render_every_row():
    from dmtp.profiles import get_profile

    p = get_profile("qwen3.6-27b")
    cfg, dr = p.scale.target_config, p.drafter
    text = M.render_tables({"27B": (cfg, drafter_spec(cfg, dr.layers, dr.heads, dr.kv_heads, dr.head_dim,
                                                      dr.intermediate, dr.block_size))})
    rows = [r for r in text.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert len(rows) == 4 * 2 * 2 + 2 * 2 and "| 8 | 80 | 2,048 | yes |" in text


# --- the fused drafter loss ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen3_5():
    from dmtp.models import tiny

    return tiny.build("qwen3_5", seed=0)


def _step(tgt, mtp, name, ce_chunk, multiplier=1.0):
    from conftest import token_seqs

    from dmtp.training.drafters import batches, drafter_features, drafter_loss, extract, new_drafters, sample_anchors

    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1, output_multiplier=multiplier, selector_topk=8, selector_dim=16)
    d = new_drafters(tgt, [name], base, backbones={"dmtp_d2": ("zero_init_residual", "dflash2")})[name]
    if d.selector is not None:  # transitions off zero (a fresh selector's predecessor codebook is 0)
        torch.nn.init.normal_(d.selector.predecessor_codebook, std=0.5, generator=torch.Generator().manual_seed(2))
    ids, lengths = next(batches(token_seqs(), 4, 0))
    anchors, valid = sample_anchors(lengths, 5, torch.Generator().manual_seed(0))
    taps = d.config.target_layer_ids
    feats = drafter_features(extract(tgt, mtp, ids, lengths, taps, True), taps, d)
    loss, stats = drafter_loss(d, tgt, feats, anchors, valid, 4.0, torch.tensor(3.7), ce_chunk=ce_chunk)
    loss.backward()
    return loss.detach(), stats, {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name,multiplier", [("dflash", 1.0), ("zero_init_residual", 1.0), ("dflash", 0.5),
                                             ("dmtp_d2", 1.0), ("dmtp_d2", 0.5)])
def test_fused_drafter_loss_equals_the_plain_one(qwen3_5, name, multiplier):
    """Chunks of 7 rows (a short last chunk), ignored slots, position-decayed weights and a given normaliser: the
    loss, accuracy and every drafter gradient of the materialised logits, within fp32 rounding. DMTP(D2): its
    selector rescores the top-k logits the chunks keep (its statistics and the selector's gradients too)."""
    tgt, mtp = qwen3_5
    ref = _step(tgt, mtp, name, 0, multiplier)
    got = _step(tgt, mtp, name, 7, multiplier)
    assert got[0].item() == pytest.approx(ref[0].item(), rel=1e-6) and got[1]["hits"].item() == ref[1]["hits"].item()
    assert got[1].keys() == ref[1].keys() and (name != "dmtp_d2" or "sel_loss" in got[1])
    for k in ref[1]:
        assert got[1][k].item() == pytest.approx(ref[1][k].item(), rel=1e-5), k
    assert got[2].keys() == ref[2].keys()
    for k in ref[2]:
        assert (got[2][k] - ref[2][k]).norm() <= 1e-5 * ref[2][k].norm() + 1e-12, k
    assert not tgt.model.lm_head.weight.requires_grad  # the frozen head: dW neither made nor stored


def test_fused_loss_through_the_compiled_one_region_step(qwen3_5, tmp_path, monkeypatch):
    """fused_ce="on" on the compiled path (one region, traced by AOTAutograd's eager backend: the fused loss is a
    graph break inside it): the eager path's losses and weights, step by step."""
    from conftest import token_seqs

    from dmtp.training import drafters as train_mod
    from dmtp.training.drafters import TrainConfig, drafters_loss_fused, new_drafters, train_drafters

    tgt, mtp = qwen3_5
    monkeypatch.setattr(train_mod, "_JOINT_FUSED", [torch.compile(drafters_loss_fused, backend="aot_eager",
                                                                  dynamic=False)])
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1)
    out = {}
    for flag, fused in (("off", "off"), ("on", "on")):
        ds = new_drafters(tgt, ["dflash", "zero_init_residual"], base)
        cfg = TrainConfig(steps=3, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1, save_every=100,
                          compile=flag, fused_ce=fused, ce_chunk=9)
        hist = train_drafters(tgt, mtp, ds, token_seqs(), cfg, tmp_path / flag, log=lambda *_: None)
        out[flag] = hist, {n: d.state_dict() for n, d in ds.items()}
    for n in ("dflash", "zero_init_residual"):
        assert [h["loss"] for h in out["on"][0][n]] == pytest.approx([h["loss"] for h in out["off"][0][n]], rel=1e-5)
        for k, w in out["off"][1][n].items():
            torch.testing.assert_close(out["on"][1][n][k], w, rtol=0, atol=2e-5, msg=k)


# --- the training stage's fit check (dmtp/cli/fit.py; CPU: configs and the meta device only) ------------------------
def _paper(profile="qwen3.6-27b", variants=("dflash", "zero_init_residual")):
    from transformers import AutoConfig

    from dmtp.experiment import drafter_config
    from dmtp.models.drafter import DrafterConfig
    from dmtp.profiles import get_profile

    p = get_profile(profile)
    kw = dict(p.scale.target_config)
    hf = AutoConfig.for_model(kw.pop("model_type"), **kw)
    return p, [DrafterConfig(**drafter_config(p, hf), variant=v) for v in variants]


def test_fit_check_refuses_in_one_line_and_resolves_the_target_sharding():
    from dataclasses import replace

    from dmtp.cli.fit import fit_training
    from dmtp.training.drafters import spec_of

    p, configs = _paper()
    cfg = p.scale.target_config
    spec = spec_of(configs)
    assert spec.slots == 8 and spec.params == 1_782_652_160  # zero_init_residual: block of 8, 2H^2 + 2H injection
    train = replace(p.train, batch_size=2, max_len=2048)
    with pytest.raises(ValueError) as e:  # one 80 GB card: the bf16 target and two drafters' AdamW state
        fit_training(cfg, configs, train, 1, 80 * M.GIB)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("training 2 drafter(s) on 1 GPU(s) of 80 GiB does NOT fit: ")
    assert "target 54.6" in msg and "drafter_state 57.0" in msg and "GB of 79.9 GB per GPU" in msg
    out, line = fit_training(cfg, configs[:1], train, 1, 141 * M.GIB)  # an H200 takes one
    assert out.shard_target == "off" and line.startswith("fits: target replicated")
    # 2 x 80 GB at 32K tokens, a sequence per GPU: the replicated target leaves no room, the sharded one fits
    out, line = fit_training(cfg, configs[:1], replace(train, max_len=32768), 2, 80 * M.GIB)
    assert out.shard_target == "on" and "target sharded" in line
    with pytest.raises(ValueError, match="--shard-target on"):  # told "off", it names the setting that fits
        fit_training(cfg, configs[:1], replace(train, max_len=32768, shard_target="off"), 2, 80 * M.GIB)
    # the global batch of 128 on 8 x 80 GB: the micro-batch left to the model (2 a GPU, 8 micro-batches) or set
    out, line = fit_training(cfg, configs[:1], replace(train, batch_size=128), 8, 80 * M.GIB)
    assert (out.micro_batch, out.shard_target, out.grad_sync) == (2, "off", "every")
    assert "micro-batch 2 x 8 accumulation x 8 GPU(s)" in line
    assert fit_training(cfg, configs[:1], replace(train, batch_size=128, micro_batch=1), 8, 80 * M.GIB)[0] \
        .micro_batch == 1
    with pytest.raises(ValueError, match=r"micro-batch 16 x 1 accumulation .* the model fits it with --micro-batch 2 "
                                         r"\(x 8 accumulation\) --shard-target off --grad-sync every$"):
        fit_training(cfg, configs[:1], replace(train, batch_size=128, micro_batch=16), 8, 80 * M.GIB)


def test_dryrun_says_whether_training_and_evaluation_fit(capsys):
    """`dmtp dryrun --gpus N --gpu-mem GB [--seq-len T]`: on 8 x 80 GB the paper drafter trains (the target
    replicated, the loss fused, a micro-batch and the accumulation to 128) and the result says so; on one 80 GB card
    at 32K tokens nothing fits, and the command exits 1."""
    from dmtp.cli.dryrun import dryrun, render
    from dmtp.cli.main import main

    r = dryrun("qwen3.6-27b", backbones=["dflash"], gpus=8, gpu_mem=80)
    f = r["fit"]
    assert r["ok"] and f["train"].fits and not f["train"].setting.shard_target and f["train"].setting.ce_chunk
    s = f["train"].setting
    assert s.micro_batch * f["train"].accumulation * 8 == 128 and f["seq_len"] == 2048
    text = render(r)
    assert "fit on 8 GPU(s) of 80 GiB" in text and "training, one drafter: fits: target replicated" in text
    # 2,048 tokens + the protocol's 1,024 new ones
    assert "evaluation (batch 32, 3,072 positions)" in text and "the largest batch that fits: " in text
    with pytest.raises(SystemExit) as e:
        main(["dryrun", "--profile", "qwen3.6-27b", "--gpus", "1", "--gpu-mem", "80", "--seq-len", "32768"])
    out = capsys.readouterr().out
    assert e.value.code == 1 and "training, one drafter: does NOT fit" in out and "32,768 tokens" in out


def test_dryrun_names_the_fewest_cards_that_fit(capsys):
    """Where a setting does not fit, `dmtp dryrun` names what would: for each card kind the fewest cards that train
    one drafter (the memory tables' rows: 27B at 2,048 tokens on 2 x 80 GiB or 1 x 141 GiB), and the cards
    evaluation fits; a setting that fits names nothing more."""
    from dmtp.cli.dryrun import dryrun, render

    r = dryrun("qwen3.6-27b", backbones=["dflash"], gpus=1, gpu_mem=80)
    (gb80, p80), (gb141, p141) = r["fit"]["fewest"]
    assert (gb80, p80.setting.world, p80.setting.micro_batch, p80.accumulation) == (80, 2, 1, 64)
    assert (gb141, p141.setting.world, p141.setting.micro_batch, p141.accumulation) == (141, 1, 8, 16)
    assert ("what would fit training one drafter, the fewest cards of each kind: 2 x 80 GiB (micro-batch 1 x 64 "
            "accumulation, target replicated, activation checkpointing off); 1 x 141 GiB") in render(r)
    r = dryrun("qwen3.6-35b-a3b", backbones=["dflash"], gpus=1, gpu_mem=80, seq_len=32768)
    assert "what would fit evaluation at batch 32: a card of 141 GiB" in render(r)
    assert "what would fit" not in render(dryrun("qwen3.6-27b", backbones=["dflash"], gpus=8, gpu_mem=80))


def test_pipeline_drafters_stage_checks_a_paper_profile(tmp_path, monkeypatch):
    """The pipeline's drafters stage on a paper profile (GPUs faked: the check reads the config and the card's size
    only): on one 80 GB card its drafters side by side are refused in one line; on 8 x 80 GB the three fit with the
    target replicated (resolved from "auto") at one sequence per GPU, 16 micro-batches reduced one by one (once a
    step would hold 3 x 7.1 GB of full gradients); on 8 x 141 GB at 8 sequences per GPU, reduced once a step."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from dmtp.cli import pipeline
    from dmtp.profiles import get_profile

    p = get_profile("qwen3.6-27b")
    kw = dict(p.scale.target_config)
    AutoConfig.for_model(kw.pop("model_type"), **kw).save_pretrained(tmp_path / "target")
    logs = []
    c = SimpleNamespace(p=p, work=tmp_path, log=logs.append)
    runs = [r for r in p.ablation.variants]
    card = {"gb": 80}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=card["gb"] * M.GIB))
    with pytest.raises(ValueError, match=rf"training {len(runs)} drafter\(s\) on 1 GPU\(s\) of 80 GiB does NOT fit"):
        pipeline._fit_check(c, {0: runs})
    monkeypatch.setattr(pipeline, "rank_world", lambda: (0, 8))
    assert pipeline._fit_check(c, {0: runs}) == {0: dict(micro_batch=1, shard_target="off", grad_sync="every")}
    assert logs and logs[-1].startswith("drafters, seed 0: memory model: fits: target replicated")
    assert "micro-batch 1 x 16 accumulation x 8 GPU(s), gradients reduced every micro-batch" in logs[-1]
    card["gb"] = 141
    assert pipeline._fit_check(c, {0: runs}) == {0: dict(micro_batch=8, shard_target="off", grad_sync="last")}


def test_the_docs_tables_are_the_models():
    """docs/memory-tables.md holds exactly what `experiments.memory_tables` renders (refresh: --write)."""
    from pathlib import Path

    from experiments.memory_tables import splice, tables

    text = (Path(__file__).parents[1] / "docs" / "memory-tables.md").read_text()
    assert splice(text, tables()) == text


def test_dmtp_train_refuses_before_loading_weights(tmp_path, monkeypatch, capsys):
    """`dmtp train --profile qwen3.6-27b` on one 80 GB GPU (faked: the check reads the config and the card's size;
    the weights file is empty, so any attempt to load it would fail otherwise): one line, exit 2, the numbers."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from dmtp.cli import args as cli_args
    from dmtp.cli.main import main
    from dmtp.profiles import get_profile

    kw = dict(get_profile("qwen3.6-27b").scale.target_config)
    AutoConfig.for_model(kw.pop("model_type"), **kw).save_pretrained(tmp_path / "target")
    (tmp_path / "target" / "model.safetensors").write_bytes(b"")
    (tmp_path / "d.jsonl").write_text('{"ids": [1, 2, 3, 4, 5, 6]}\n')
    monkeypatch.setattr(cli_args, "device", lambda name: "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=80 * M.GIB))
    from dmtp.cli import main as cli_main

    # the weights' headers are checked against the config first (tests/test_bad_inputs.py); this empty file has none
    monkeypatch.setattr(cli_main, "target_checks", lambda *a, **k: [])
    with pytest.raises(SystemExit) as e:
        main(["train", "--profile", "qwen3.6-27b", "--target", str(tmp_path / "target"), "--data",
              str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "out"), "--variants", "dflash,zero_init_residual",
              "--batch-size", "2"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert err.startswith("dmtp train: error: training 2 drafter(s) on 1 GPU(s) of 80 GiB does NOT fit: ")
    assert "drafter_state 57.0" in err and not list((tmp_path / "out").glob("tokens-*"))  # before the data, too


def test_dflash2_takes_the_fused_loss_in_the_model():
    """A DFlash2 drafter takes the fused loss (its selector's top-k made chunk by chunk); a soft-capped one (its
    logits bent) is not fusable: the model counts its plain logits, and a set of drafters holding one is counted so
    (they step one after another: the peak is the largest one's)."""
    from dataclasses import replace as dc_replace

    from dmtp.training.drafters import spec_of

    p, configs = _paper(variants=("dflash",))
    d2 = dc_replace(configs[0], backbone="dflash2")
    capped = dc_replace(configs[0], final_logit_softcapping=30.0)
    assert spec_of(configs).fusable and spec_of([d2]).fusable and spec_of(configs + [d2]).fusable
    assert not spec_of([capped]).fusable and not spec_of(configs + [capped]).fusable
    kw = dict(gpus=8, gpu_gb=141, seq_len=2048, anchors=512, global_batch=128, micro_batch=1)
    cfg = p.scale.target_config
    fused, plain = plan_training(cfg, spec_of([d2]), **kw), plan_training(cfg, spec_of([capped]), **kw)
    assert fused.setting.ce_chunk == 540 and plain.setting.ce_chunk == 0
    assert plain.terms["logits"] == 512 * 8 * 248320 * 12 and "LM-head loss plain" in plain.line()


def test_the_gpu_guide_quotes_what_the_models_compute():
    """docs/GPU.md's fewest cards are `dmtp dryrun`'s (`fewest_cards`, at the profiles' sequence length), and the
    `mini` size that results/mini/NOTES.md gives (README rounds it) is what the pipeline builds from the profile's
    `model.arch` (on the meta device)."""
    from pathlib import Path

    from transformers import AutoConfig

    from dmtp.cli.dryrun import fewest_cards
    from dmtp.cli.fit import run_configs
    from dmtp.training.drafters import spec_of
    from dmtp.training.pretrain import build_target
    from dmtp.profiles import get_profile

    doc = (Path(__file__).parents[1] / "docs" / "GPU.md").read_text()
    for name, label in (("qwen3.6-27b", "Qwen3.6-27B"), ("qwen3.6-35b-a3b", "Qwen3.6-35B-A3B")):
        p = get_profile(name)
        kw = dict(p.scale.target_config)
        cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
        one = spec_of([run_configs(p, cfg, ["dflash"])["dflash"]])
        fewest = " or ".join(f"{plan.setting.world} × {gb} GB" for gb, plan in
                             fewest_cards(cfg.to_dict(), one, p.train, p.scale.max_seq_len))
        assert f"| {label} (`{name}`) | {fewest.replace(' or ', ', or ', 1)} |" in doc, fewest
    with torch.device("meta"):
        tgt, mtp = build_target(get_profile("mini").model.arch, get_profile("mini").data.vocab_size, 0)
    n, m = sum(x.numel() for x in tgt.model.parameters()), sum(x.numel() for x in mtp.parameters())
    root = Path(__file__).parents[1]
    notes = " ".join((root / "results" / "mini" / "NOTES.md").read_text().split())  # the one place of mini's size
    assert f"{n:,} parameters ({n / 1e6:.1f} M) plus a native MTP head of {m:,} ({m / 1e6:.1f} M)" in notes
    readme = " ".join((root / "README.md").read_text().split())  # quoted the same, rounded
    assert f"({n / 1e6:.1f} M parameters + a {m / 1e6:.1f} M native MTP head)" in readme
