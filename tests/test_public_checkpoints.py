"""Public DFlash checkpoints keep the reference semantics: no anchor window, sliding-attention layers with the
reference's per-query window and causal block (parity with the public reference arithmetic both ways, below and
beyond the window), `rope_scaling` computed as `transformers` computes it (or refused); our anchor window travels
in `layer_types`, where a public reader refuses it; old checkpoints keep their window; a public sliding drafter
trains and decodes; the MTP requirement follows the variant; no invented end-of-text id."""
import json

import pytest
import torch
from conftest import hf_greedy, make_drafter
from public_dflash import PublicDrafter, suite_block, write_public

from dmtp.models import tiny
from dmtp.models.attention import Rule
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.variants import REGISTRY


def _public(d: Drafter, path, **extra):
    """Save `d`, then rewrite its config.json as a public DFlash checkpoint's (no `dmtp_config`, no layer_types)."""
    d.save(path)
    cfg = json.loads((path / "config.json").read_text())
    for k in ("dmtp_config", "layer_types"):
        cfg.pop(k)
    cfg.update({"rope_scaling": None, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28})
    cfg.update(extra)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def _max_diff(ours, pub, starts=(2, 20), seed=0):
    """Max |hidden diff| of one block (4 slots) after each number of context rows in `starts`."""
    g = torch.Generator().manual_seed(seed)
    H, worst = ours.config.hidden_size, 0.0
    for start in starts:
        taps = torch.randn(1, start, len(ours.config.target_layer_ids) * H, generator=g)
        noise = torch.randn(1, ours.config.block_size, H, generator=g)
        worst = max(worst, (suite_block(ours, taps, noise, start) - pub.forward(taps, noise, start)).abs().max().item())
    return worst


# Qwen3.6 DFlash drafters: causal sliding layers then a bidirectional full-attention layer; DFlash2: all sliding,
# bidirectional (is_causal false); a sliding layer without use_sliding_window: causal, no window (HF drops it)
SLIDING = {"qwen3.6": dict(layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                           sliding_window=6, use_sliding_window=True),
           "bidirectional": dict(layer_types=["sliding_attention"] * 3, sliding_window=6, use_sliding_window=True,
                                 is_causal=False),
           "derived": dict(sliding_window=6, use_sliding_window=True, max_window_layers=1),
           "no use_sliding_window": dict(layer_types=["sliding_attention"] * 3, sliding_window=6)}


@pytest.mark.parametrize("kind", list(SLIDING))
def test_sliding_window_parity_both_ways(tmp_path, kind):
    """A public checkpoint with sliding-attention layers computes here what the public reference computes from the
    same files (0.0 in fp32) with 2 context rows (inside the window of 6) and 20 (beyond it); saved by us, the
    reference reads the same fields back and computes the same again."""
    path = write_public(tmp_path / "pub", **SLIDING[kind])
    ours = Drafter.load(path)
    assert _max_diff(ours, PublicDrafter(path)) == 0.0
    ours.save(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["layer_types"] == ours.config.resolved_layer_types() and saved["dmtp_config"]["window"] == 0
    assert _max_diff(Drafter.load(tmp_path / "ours"), PublicDrafter(tmp_path / "ours"), seed=1) == 0.0
    if kind == "qwen3.6":
        assert ours.config.rules() == (Rule(sliding=6, causal=True),) * 2 + (Rule(),)
    if kind == "no use_sliding_window":
        assert ours.config.rules() == (Rule(causal=True),) * 3 and saved["sliding_window"] is None


def test_sliding_window_binds_beyond_it_only(tmp_path):
    """The same weights without the window: equal with 2 context rows, different with 20 (the test has teeth)."""
    ours = Drafter.load(write_public(tmp_path / "pub", **SLIDING["bidirectional"]))
    wide = Drafter.load(write_public(tmp_path / "wide", **{**SLIDING["bidirectional"], "sliding_window": 10 ** 6}))
    g = torch.Generator().manual_seed(0)
    for start, same in ((2, True), (20, False)):
        taps, noise = torch.randn(1, start, 64, generator=g), torch.randn(1, 4, 32, generator=g)
        assert torch.equal(suite_block(ours, taps, noise, start), suite_block(wide, taps, noise, start)) == same


def test_anchor_window_travels_and_public_readers_refuse_it(tmp_path):
    """Our anchor window (METHOD.md: the same rows for every slot) is not the reference's per-query window, and no
    public field expresses it: the checkpoint names it in `layer_types`, which transformers' config validation (so
    the reference and the engines that read configs through it) refuses; we read it back unchanged."""
    torch.manual_seed(0)
    kw = dict(hidden_size=32, vocab_size=50, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, intermediate_size=64, num_target_layers=4, target_layer_ids=[1, 2], block_size=4)
    ours = Drafter(DrafterConfig(**kw, window=6))
    ours.save(tmp_path / "ours")
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert cfg["layer_types"] == ["anchor_window_attention"] * 2 and cfg["dmtp_config"]["window"] == 6
    with pytest.raises(Exception, match="layer_types"):
        PublicDrafter(tmp_path / "ours")
    back = Drafter.load(tmp_path / "ours")
    assert back.config.rules() == (Rule(window=6),) * 2
    # the two rules differ beyond the window: slot j of the reference's sees j rows less at the far end
    per_query = Drafter(DrafterConfig(**kw, window=0, layer_types=["sliding_attention"] * 2, sliding_window=6,
                                      is_causal=False))
    per_query.load_state_dict(ours.state_dict())
    g = torch.Generator().manual_seed(0)
    for start, same in ((2, True), (20, False)):
        taps, noise = torch.randn(1, start, 64, generator=g), torch.randn(1, 4, 32, generator=g)
        a, b = suite_block(back, taps, noise, start), suite_block(per_query, taps, noise, start)
        assert torch.equal(a[:, 0], b[:, 0]) == (start < 6) and torch.equal(a, b) == same


def test_checkpoints_written_before_layer_types_keep_their_window(tmp_path):
    torch.manual_seed(0)
    ours = Drafter(DrafterConfig(hidden_size=32, vocab_size=64, num_attention_heads=2, num_key_value_heads=1,
                                 head_dim=16, intermediate_size=32, num_hidden_layers=2, window=4))
    ours.save(tmp_path / "old")
    path = tmp_path / "old" / "config.json"
    cfg = json.loads(path.read_text())
    for k in ("layer_types", "use_sliding_window", "sliding_window"):
        cfg.pop(k)
    for k in ("block_size", "output_multiplier", "final_logit_softcapping"):
        cfg["dflash_config"].pop(k)
    path.write_text(json.dumps(cfg))
    old = Drafter.load(tmp_path / "old")
    assert old.config.rules() == (Rule(window=4),) * 2 and old.config.block_size == 8
    with torch.no_grad():
        assert torch.equal(_forward(old), _forward(ours))


def test_public_sliding_drafter_trains_and_decodes(models, tmp_path):
    """`--init-from` a public sliding-window DFlash drafter (the Qwen3.6 layout at the tiny target's width): the
    rules and weights are kept, a training step runs through them, decoding beyond the window stays lossless, and
    the checkpoint it saves keeps the public fields."""
    from dmtp.engine.decode import Batch
    from dmtp.engine.methods import build_method
    from dmtp.training.drafters import drafter_loss, extract, new_drafters, sample_anchors

    tgt, mtp = models
    if tgt.config.model_type != "qwen3":
        pytest.skip("the drafter side is under test: one target architecture suffices")
    path = write_public(tmp_path / "pub", hidden=tgt.hidden_size, vocab=tgt.vocab_size, layers=2, head_dim=16,
                        intermediate=128, target_layers=tgt.num_layers, block_size=8, mask_token_id=2,
                        layer_types=["sliding_attention", "full_attention"], sliding_window=5,
                        use_sliding_window=True)
    for variant in ("dflash", "zero_init_residual"):
        d = new_drafters(tgt, [variant], {"window": 4096}, init_from={variant: str(path)})[variant]
        assert d.config.rules() == (Rule(sliding=5, causal=True), Rule())
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, tgt.vocab_size, (2, 30), generator=g)
        lengths = torch.tensor([30, 24])
        anchors, valid = sample_anchors(lengths, 6, g)
        feats = extract(tgt, mtp, ids, lengths, d.config.target_layer_ids, need_g=variant != "dflash")
        d.train()
        drafter_loss(d, tgt, feats, anchors, valid, gamma=4.0)[0].backward()
        assert d.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
        d.eval()
        prompts = [[5, 7, 9, 11, 3, 8, 4], [4, 8]]
        batch = Batch(tgt, build_method(variant, tgt, drafter=d, mtp=mtp), prompts, 0.0, 13, set(),
                      torch.Generator().manual_seed(0))
        while not batch.finished:
            batch.step()
        assert [r.output_ids for r in batch.results] == [hf_greedy(tgt, p, 13) for p in prompts]
    d.save(tmp_path / "continued")
    cfg = json.loads((tmp_path / "continued" / "config.json").read_text())
    assert (cfg["layer_types"], cfg["sliding_window"], cfg["use_sliding_window"]) == (
        ["sliding_attention", "full_attention"], 5, True)


def _forward(d, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = d.config
    f = torch.randn(1, T, c.hidden_size, generator=g)
    ctx = d.context_kv(f, torch.arange(T)[None])
    anchors = torch.tensor([[T - 1]])
    block = torch.randn(1, 8, c.hidden_size, generator=g)
    return d(block, anchors + torch.arange(8), ctx, anchors)


def test_public_checkpoint_has_no_window(tmp_path):
    torch.manual_seed(0)
    ours = Drafter(DrafterConfig(hidden_size=32, vocab_size=64, num_attention_heads=2, num_key_value_heads=1,
                                 head_dim=16, intermediate_size=32, window=4))
    pub = Drafter.load(_public(ours, tmp_path / "pub"))
    assert pub.config.window == 0 and Drafter.load(tmp_path / "pub").config.variant == "dflash"
    with torch.no_grad():
        full = _forward(pub)
        pub.config.window = 10 ** 6
        assert torch.equal(_forward(pub), full)  # window 0 = every earlier position
        assert not torch.allclose(_forward(ours), full)  # our checkpoint keeps its own window of 4
    ours.save(tmp_path / "ours")
    assert Drafter.load(tmp_path / "ours").config.window == 4


@pytest.mark.parametrize("scaling", [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
                                     {"type": "linear", "factor": 2.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 512}])
def test_rope_scaling_is_honoured(tmp_path, scaling):
    """cos/sin equal the reference's `Qwen3RotaryEmbedding` of the same config; a checkpoint keeps them."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    torch.manual_seed(0)
    d = Drafter(DrafterConfig(hidden_size=32, vocab_size=64, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=16, intermediate_size=32, max_position_embeddings=2048))
    pub = Drafter.load(_public(d, tmp_path / "pub", rope_scaling=scaling))
    kind = scaling.get("rope_type", scaling.get("type"))
    assert pub.config.rope_scaling["rope_type"] == kind
    params = {k: v for k, v in scaling.items() if k != "type"} | {"rope_type": kind, "rope_theta": d.config.rope_theta}
    ref = Qwen3RotaryEmbedding(Qwen3Config(hidden_size=32, num_attention_heads=2, head_dim=16,
                                           max_position_embeddings=2048, rope_parameters=params))
    pos = torch.arange(3000)[None]
    for got, want in zip(pub.rope(pos, torch.float32), ref(torch.zeros(1), pos)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not torch.allclose(pub.rope(pos, torch.float32)[0], d.rope(pos, torch.float32)[0])
    pub.save(tmp_path / "again")
    assert Drafter.load(tmp_path / "again").config.rope_scaling == pub.config.rope_scaling


@pytest.mark.parametrize("extra,msg", [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "'longrope'"),
    ({"layer_types": ["chunked_attention"]}, r"layer_types \['chunked_attention'\]: expected 1 entries of"),
    ({"layer_types": ["full_attention"] * 2}, "expected 1 entries"),
    ({"layer_types": ["anchor_window_attention"]}, "without dmtp_config.window"),
    ({"use_sliding_window": True, "sliding_window": 0}, "sliding_window 0: expected a positive integer"),
    ({"is_causal": "yes"}, "is_causal 'yes'"),
    ({"dflash_config": {"input_embedding_scale": 2.0}}, "input_embedding_scale 2.0"),
])
def test_unsupported_semantics_are_refused(tmp_path, extra, msg):
    torch.manual_seed(0)
    d = Drafter(DrafterConfig(hidden_size=32, vocab_size=64, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=16, intermediate_size=32))
    path = _public(d, tmp_path / "pub")
    cfg = json.loads((path / "config.json").read_text()) | extra
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=rf"{path}/config.json: .*{msg}"):
        Drafter.load(path)


def test_mtp_requirement_follows_the_variant():
    """Readable on the class (deciding whether to load the MTP head before any drafter exists) and on instances."""
    assert REGISTRY["dflash"].needs_mtp is False
    assert all(cls.needs_mtp for name, cls in REGISTRY.items() if name != "dflash")
    tgt, _ = tiny.build("qwen3_5", seed=0)
    for name, cls in REGISTRY.items():
        assert make_drafter(tgt, name).injection.needs_mtp == cls.needs_mtp


def test_no_invented_end_of_text(tmp_path, capsys):
    """A target without tokenizer files and without an eos id in its config: an error asking for --eos; with
    --eos none it decodes --max-new-tokens exactly."""
    from dmtp.cli.main import main as dmtp
    from dmtp.io import read_jsonl

    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tgt.model.config.eos_token_id = None
    tgt.model.generation_config.eos_token_id = None
    tiny.save(tgt, mtp, tmp_path / "t")
    assert "eos_token_id" not in {k for k, v in json.loads((tmp_path / "t" / "config.json").read_text()).items()
                                  if v is not None}
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt_ids": [3, 4]}\n')
    argv = ["generate", "--target", str(tmp_path / "t"), "--method", "ar", "--prompts", str(tmp_path / "p.jsonl"),
            "--max-new-tokens", "5", "--out", str(tmp_path / "o.jsonl")]
    with pytest.raises(SystemExit):
        dmtp(argv)
    assert "no end-of-text id" in capsys.readouterr().err
    dmtp(argv + ["--eos", "none"])
    assert len(read_jsonl(tmp_path / "o.jsonl")[0]["output_ids"]) == 5


def _tiny_config(**kw):
    return DrafterConfig(hidden_size=32, vocab_size=50, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64, num_target_layers=4,
                         target_layer_ids=[1, 2], block_size=4, **kw)


def _trained_looking(c: DrafterConfig, seed=0) -> Drafter:
    """A drafter of config c with every weight moved off its initialisation (zero-initialised injections too)."""
    torch.manual_seed(seed)
    d = Drafter(c)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return d


def test_public_rule_trains_as_the_reference_computes(tmp_path):
    """`DrafterShape.attention = "public"` (the paper profiles' default, `dmtp train --attention public`) is z-lab's
    Qwen3.6 rule: causal sliding layers, then one bidirectional full-attention layer. A drafter of that shape saved by
    us is read by the public reference, which computes what we compute (0.0 in fp32) with context inside the window
    of 6 and beyond it; a public checkpoint of that layout reads back to the same rules; the anchor rule keeps its
    fields (the embedded profiles' drafters do not change)."""
    from dmtp.config import DrafterShape
    from dmtp.profiles import get_profile

    shape = DrafterShape(layers=3, attention="public", sliding_window=6)
    fields = shape.attention_fields()
    assert fields == dict(window=0, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                          sliding_window=6)
    mine = _trained_looking(_tiny_config(**fields))
    assert mine.config.rules() == (Rule(sliding=6, causal=True),) * 2 + (Rule(),)
    mine.save(tmp_path / "mine")
    saved = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert (saved["architectures"], saved["model_type"]) == (["DFlashDraftModel"], "qwen3")
    assert (saved["layer_types"], saved["sliding_window"], saved["use_sliding_window"]) == (
        fields["layer_types"], 6, True) and "is_causal" not in saved
    assert _max_diff(mine, PublicDrafter(tmp_path / "mine")) == 0.0  # ours -> the reference
    pub = write_public(tmp_path / "pub", **SLIDING["qwen3.6"])  # the reference's -> ours
    assert Drafter.load(pub).config.rules() == mine.config.rules()
    assert _max_diff(Drafter.load(pub), PublicDrafter(pub), seed=1) == 0.0
    # one layer: its full-attention layer alone; the anchor rule: the suite's window, as before
    assert DrafterShape(layers=1, attention="public").attention_fields() == dict(
        window=0, layer_types=["full_attention"], sliding_window=0)
    assert DrafterShape(layers=2).attention_fields() == dict(window=4096, layer_types=[], sliding_window=0)
    for name in ("qwen3.6-27b", "qwen3.6-35b-a3b"):
        d = get_profile(name).drafter
        assert (d.attention, d.sliding_window, d.layers) == ("public", 2048, 5)
    assert all(get_profile(n).drafter.attention == "anchor" for n in ("tiny", "mini", "smoke"))
    for bad in (dict(attention="sliding"), dict(attention="public", sliding_window=0)):
        with pytest.raises(ValueError, match="attention|sliding_window"):
            DrafterShape(**bad)


@pytest.mark.parametrize("variant,backbone", [("zero_init_residual", "dflash"), ("fusion", "dflash"),
                                              ("zero_init_residual", "dflash2"), ("token_only", "dflash")])
def test_dmtp_drafters_are_refused_by_public_readers(tmp_path, variant, backbone):
    """A DMTP drafter (T1 injected, any backbone) carries `architectures` / `model_type` of its own and its DFlash
    fields inside `dmtp_config`: the public reference refuses it (it needs `dflash_config.target_layer_ids`), and so
    does transformers' AutoConfig, through which vLLM, SGLang and AutoModel read a draft config; our loader reads it
    back exactly, old checkpoints (public names, top-level `dflash_config`) too. A plain DFlash drafter of the same
    shape keeps the public names and the reference computes it exactly."""
    from transformers import AutoConfig

    fields = dict(window=0, layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=6)
    kw = dict(conv_group_size=8, selector_topk=4, selector_dim=8) if backbone == "dflash2" else {}
    d = _trained_looking(_tiny_config(variant=variant, backbone=backbone, **fields, **kw))
    d.save(tmp_path / "dmtp")
    cfg = json.loads((tmp_path / "dmtp" / "config.json").read_text())
    want = "DMTPDFlash2DraftModel" if backbone == "dflash2" else "DMTPDraftModel"
    assert (cfg["architectures"], cfg["model_type"]) == ([want], "dmtp_drafter") and "dflash_config" not in cfg
    with pytest.raises(ValueError, match=r"dflash_config\.target_layer_ids"):
        PublicDrafter(tmp_path / "dmtp")
    with pytest.raises(ValueError, match="model type `dmtp_drafter`"):
        AutoConfig.from_pretrained(tmp_path / "dmtp")
    back = Drafter.load(tmp_path / "dmtp")
    assert (back.config.variant, back.config.backbone, back.config.rules()) == (variant, backbone, d.config.rules())
    assert back.config.target_layer_ids == [1, 2] and back.config.block_size == 4
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in d.state_dict().items())
    # written before the names: public names, dflash_config at the top level; read the same
    old = dict(cfg, architectures=["DFlash2DraftModel" if backbone == "dflash2" else "DFlashDraftModel"],
               model_type="qwen3", dflash_config=cfg["dmtp_config"]["dflash_config"],
               dmtp_config={k: v for k, v in cfg["dmtp_config"].items() if k != "dflash_config"})
    (tmp_path / "dmtp" / "config.json").write_text(json.dumps(old))
    assert Drafter.load(tmp_path / "dmtp").config == back.config
    # plain DFlash on the same backbone and attention: the public names, computed exactly by the reference
    plain = _trained_looking(_tiny_config(backbone=backbone, **fields, **kw))
    plain.save(tmp_path / "plain")
    cfg = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel" if backbone == "dflash2" else "DFlashDraftModel"]
    assert cfg["model_type"] == "qwen3" and AutoConfig.from_pretrained(tmp_path / "plain").model_type == "qwen3"
    if backbone == "dflash":
        assert _max_diff(plain, PublicDrafter(tmp_path / "plain")) == 0.0


def test_d2_recipe_continues_a_public_dflash2_drafter(tmp_path, capsys):
    """docs/DESIGN.md's DMTP(D2) recipe: `dmtp train --variants dmtp_d2 --init-from dmtp_d2=PATH` trains the
    ablation's run `dmtp_d2` (zero_init_residual on the dflash2 backbone) from a public DFlash2 checkpoint, beside a
    fresh `dflash` run on the same batches trained with `--attention public`; the first is a DMTP(D2) drafter keeping
    the checkpoint's attention, the second a drafter the public reference reads and computes exactly. A name that is
    neither a variant nor a run is one line naming both lists."""
    from conftest import token_seqs

    from dmtp.cli.main import main as dmtp

    tgt, mtp = tiny.build("qwen3", seed=0)
    target = tiny.save(tgt, mtp, tmp_path / "t")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"ids": s}) + "\n" for s in token_seqs(8)))
    pub = write_public(tmp_path / "pub", hidden=tgt.hidden_size, vocab=tgt.vocab_size, layers=2, head_dim=16,
                       intermediate=128, target_layers=tgt.num_layers, block_size=8, mask_token_id=2, dflash2=True,
                       layer_types=["sliding_attention"] * 2, sliding_window=6, use_sliding_window=True,
                       is_causal=False)
    out = tmp_path / "drafters"
    argv = ["train", "--target", str(target), "--data", str(data), "--out", str(out), "--steps", "2",
            "--batch-size", "2", "--max-len", "32", "--layers", "3", "--mask-token-id", "2"]
    dmtp(argv + ["--variants", "dflash,dmtp_d2", "--init-from", f"dmtp_d2={pub}", "--attention", "public",
                 "--sliding-window", "6"])
    d2 = Drafter.load(out / "dmtp_d2" / "drafter")
    c = d2.config
    assert (c.variant, c.backbone, c.rules()) == ("zero_init_residual", "dflash2", (Rule(sliding=6),) * 2)
    assert json.loads((out / "dmtp_d2" / "drafter" / "config.json").read_text())["architectures"] == [
        "DMTPDFlash2DraftModel"]
    start = Drafter.load(pub)  # the public layers were the starting point: trained, not re-initialised
    assert not torch.equal(d2.layers[0].self_attn.q_proj.weight, start.layers[0].self_attn.q_proj.weight)
    assert (d2.layers[0].self_attn.q_proj.weight - start.layers[0].self_attn.q_proj.weight).abs().max() < 0.05
    plain = Drafter.load(out / "dflash" / "drafter")
    assert (plain.config.backbone, plain.config.rules()) == ("dflash", (Rule(sliding=6, causal=True),) * 2 + (Rule(),))
    assert _max_diff(plain, PublicDrafter(out / "dflash" / "drafter")) == 0.0
    with pytest.raises(SystemExit):
        dmtp(argv + ["--variants", "dmtp_dd"])
    assert "unknown variant or run 'dmtp_dd'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dmtp(argv + ["--variants", "dmtp_d2", "--backbone", "dflash"])
    assert "run 'dmtp_d2' is zero_init_residual on the dflash2 backbone" in capsys.readouterr().err
