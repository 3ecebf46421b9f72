"""Hybrid targets (Gated DeltaNet + full attention, Qwen3.5/3.6 layout) and MoE targets (Qwen3.5/3.6-MoE layout):
checkpoints with the native MTP head, tapped features, exact linear-state rollback, lossless decoding vs HF."""
import pytest
import torch
from conftest import Oracle, hf_greedy, make_drafter
from safetensors import safe_open
from safetensors.torch import save_file

from dmtp.engine.decode import generate
from dmtp.engine.methods import build_method
from dmtp.models import tiny
from dmtp.models.cache import KVCache
from dmtp.models.mtp import MTPHead, safetensor_files
from dmtp.models.target import Target

PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60, 70, 80, 90]]
NEW = 20


@pytest.fixture(scope="module", params=["qwen3_5_hybrid", "qwen3_5_moe"])
def hybrid(request):
    tgt, mtp = tiny.build(request.param, seed=0)
    assert tgt.hybrid and tgt.layer_types.count("linear_attention") == 3
    return request.param, tgt, mtp, [hf_greedy(tgt, p, NEW) for p in PROMPTS]


def _keys(path):
    keys = set()
    for f in safetensor_files(path):
        with safe_open(str(f), framework="pt") as fh:
            keys |= set(fh.keys())
    return keys


def test_mtp_round_trip_and_taps(hybrid, tmp_path):
    arch, tgt, mtp, _ = hybrid
    forms = ["fused", "per_expert"] if arch == "qwen3_5_moe" else ["fused"]
    ids = torch.randint(3, tgt.vocab_size, (2, 12))
    h = tgt.features(ids).hidden
    for form in forms:
        path = tiny.save(tgt, mtp, tmp_path / form, experts=form)
        keys = _keys(path)
        assert {"mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.norm.weight"} <= keys
        if arch == "qwen3_5_moe":
            fused = "mtp.layers.0.mlp.experts.gate_up_proj" in keys
            assert fused == (form == "fused")
            assert ("mtp.layers.0.mlp.experts.7.gate_proj.weight" in keys) == (form == "per_expert")
        tgt2 = Target.load(path)
        mtp2 = MTPHead.load(tgt2, path)
        assert mtp2.fc.weight.shape == (tgt.hidden_size, 2 * tgt.hidden_size)
        for (n, a), (_, b) in zip(mtp.state_dict().items(), mtp2.state_dict().items()):
            assert torch.equal(a, b), (form, n)
        torch.testing.assert_close(tgt2.features(ids).hidden, h)
        torch.testing.assert_close(mtp2.teacher_forced(ids, h), mtp.teacher_forced(ids, h))
    if arch == "qwen3_5_moe":  # fused but stored transposed ([E, H, 2I] / [E, I, H], the Qwen3-VL-MoE convention)
        f = path / "model-mtp.safetensors"
        with safe_open(str(f), framework="pt") as fh:
            sd = {k: fh.get_tensor(k) for k in fh.keys()}
        sd = {k: (v.transpose(1, 2).contiguous() if k.endswith(("gate_up_proj", "down_proj")) and v.dim() == 3
                  else v) for k, v in sd.items()}
        save_file(sd, str(f), metadata={"format": "pt"})
        mtp3 = MTPHead.load(tgt, path)
        torch.testing.assert_close(mtp3.teacher_forced(ids, h), mtp.teacher_forced(ids, h))
    # tapped features: outputs of the tapped decoder layers (linear and full attention alike)
    out = tgt.features(ids, taps=[0, 1, 2])
    assert out.taps.shape == (2, 12, 3 * tgt.hidden_size)
    with torch.no_grad():
        hs = tgt.model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(out.taps[..., tgt.hidden_size: 2 * tgt.hidden_size], hs[2])


def _states(cache):
    return {l: (cache.conv[l].clone(), cache.rec[l].clone()) for l in cache.rec}


def test_linear_states_ragged_prefill_and_commit(hybrid):
    """Prefill of right-padded prompts keeps each request's own state; after a q-row verify, commit(n) leaves exactly
    the state of a cache that only ever saw the first n rows (requests differ in n)."""
    _, tgt, _, _ = hybrid
    torch.manual_seed(0)
    plen = torch.tensor([5, 2, 9])
    T, q = 9, 6
    ids = torch.randint(3, tgt.vocab_size, (3, T + q))
    pad = ids[:, :T].clone()
    for b, n in enumerate(plen.tolist()):
        pad[b, n:] = 0
    cache = KVCache(3, 32)
    tgt.forward(pad, torch.arange(T)[None].expand(3, T), cache, lengths=plen)
    ragged = _states(cache)
    n = torch.tensor([1, 6, 3])
    blk = torch.stack([ids[b, plen[b]: plen[b] + q] for b in range(3)])
    out = tgt.forward(blk, plen[:, None] + torch.arange(q), cache)
    cache.commit(n)
    for b in range(3):  # reference: request b alone, prompt then only its n committed rows
        ref = KVCache(1, 32)
        p = int(plen[b])
        tgt.forward(ids[b:b + 1, :p], torch.arange(p)[None], ref)
        for l, (c, r) in _states(ref).items():
            torch.testing.assert_close(ragged[l][0][b], c[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(ragged[l][1][b], r[0], rtol=1e-4, atol=1e-4)
        m = int(n[b])
        o = tgt.forward(blk[b:b + 1, :m], torch.tensor([[p + j for j in range(m)]]), ref)
        torch.testing.assert_close(out.logits[b, :m], o.logits[0], rtol=1e-4, atol=1e-4)
        for l in ref.rec:
            torch.testing.assert_close(cache.conv[l][b], ref.conv[l][0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(cache.rec[l][b], ref.rec[l][0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["mtp", "dflash", "zero_init_residual"])
def test_lossless_greedy_with_rollback(hybrid, name):
    from dmtp.training.drafters import extract

    arch, tgt, mtp, ref = hybrid
    if arch == "qwen3_5_moe" and name == "dflash":
        pytest.skip("MoE: mtp and zero_init_residual cover it")
    d = make_drafter(tgt, name) if name != "mtp" else None
    om = Oracle(build_method(name, tgt, drafter=d, mtp=mtp), ref)
    res = generate(tgt, om, PROMPTS, 0.0, NEW)
    assert [r.output_ids for r in res] == ref
    acc = [a for r in res for a in r.accepted]
    assert min(acc) == 0 and max(acc) == om.k and len(set(acc)) >= 3
    # the cached h_MTP equals a from-scratch teacher-forced recomputation over the final sequence
    for b, p in enumerate(PROMPTS):
        seq = torch.tensor([p + ref[b]])
        g = extract(tgt, mtp, seq, torch.tensor([seq.shape[1]]), None, need_g=True).g[0]
        for lens, done, _, m in om.log:
            if m is not None and not done[b]:
                torch.testing.assert_close(m[1][b], g[int(lens[b]) - 1], rtol=1e-3, atol=2e-3)  # kernel-path noise


@pytest.mark.parametrize("arch,experts", [("qwen3_5_hybrid", "fused"), ("qwen3_5_moe", "fused"),
                                          ("qwen3_5_moe", "per_expert")])
def test_vlm_checkpoint_layout(tmp_path, arch, experts):
    """Qwen3.5/3.6 ship as `Qwen3_5ForConditionalGeneration` / `Qwen3_5MoeForConditionalGeneration` (model_type
    qwen3_5 / qwen3_5_moe, nested text_config, vision tower, `model.language_model.*` keys, `mtp.*` beside them; the
    MoE's experts fused or one tensor per expert): `Target.load` takes the text model, `MTPHead.load` the head."""
    import transformers

    from dmtp.models.mtp import save_target_with_mtp

    moe = arch == "qwen3_5_moe"
    Config = transformers.Qwen3_5MoeConfig if moe else transformers.Qwen3_5Config
    VLM = transformers.Qwen3_5MoeForConditionalGeneration if moe else transformers.Qwen3_5ForConditionalGeneration
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2)
    torch.manual_seed(0)
    vlm = VLM(Config(text_config=tiny.target_config(arch).to_dict(), vision_config=vision)).eval()
    tgt0 = Target(vlm)
    mtp = MTPHead(tgt0)
    save_target_with_mtp(vlm, mtp, tmp_path / "vlm", experts=experts)
    keys = _keys(tmp_path / "vlm")
    assert any(k.startswith("model.language_model.layers.0.linear_attn") for k in keys)
    assert not moe or ("mtp.layers.0.mlp.experts.0.gate_proj.weight" in keys) == (experts == "per_expert")
    tgt = Target.load(tmp_path / "vlm")
    assert tgt.hybrid and tgt.model.config.model_type == ("qwen3_5_moe_text" if moe else "qwen3_5_text")
    ids = torch.randint(3, tgt.vocab_size, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(tgt.features(ids).logits, vlm(input_ids=ids).logits.float())
    h = tgt.features(ids).hidden
    torch.testing.assert_close(MTPHead.load(tgt, tmp_path / "vlm").teacher_forced(ids, h), mtp.teacher_forced(ids, h))


@pytest.mark.parametrize("vl", [False, True])
def test_a_fresh_moe_head_holds_initialised_experts(monkeypatch, vl):
    """transformers 5 builds the fused MoE experts on `torch.empty` and leaves their values to the model's
    `_init_weights`, which a bare MTP layer never meets: `MTPHead` gives them the family's init (normal, std =
    initializer_range), whatever the fresh memory held (here filled with NaN), for the text and the VL model."""
    import transformers

    cfg = tiny.target_config("qwen3_5_moe")
    if vl:
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                      temporal_patch_size=2, spatial_merge_size=2)
        model = transformers.Qwen3_5MoeForConditionalGeneration(
            transformers.Qwen3_5MoeConfig(text_config=cfg.to_dict(), vision_config=vision))
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    tgt = Target(model.eval())
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    torch.manual_seed(0)
    head = MTPHead(tgt)
    monkeypatch.undo()
    for name, p in head.named_parameters():
        assert bool(torch.isfinite(p).all()), name
    experts = head.layers[0].mlp.experts
    for p in (experts.gate_up_proj, experts.down_proj, head.layers[0].mlp.gate.weight):
        assert p.std().item() == pytest.approx(cfg.initializer_range, rel=0.2)
