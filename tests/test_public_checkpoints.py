"""Public DFlash checkpoints keep the reference semantics: no context window unless their config sets one,
`rope_scaling` computed as `transformers` computes it (or refused), sliding-attention layers refused; the MTP
requirement follows the variant; no invented end-of-text id."""
import json

import pytest
import torch
from conftest import make_drafter

from dmtp.models import tiny
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.variants import REGISTRY


def _public(d: Drafter, path, **extra):
    """Save `d`, then rewrite its config.json as a public DFlash checkpoint's (no `dmtp_config`)."""
    d.save(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("dmtp_config")
    cfg.update({"rope_scaling": None, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28})
    cfg.update(extra)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


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
    ({"layer_types": ["sliding_attention"], "sliding_window": 2048}, "only full-attention layers"),
    ({"use_sliding_window": True, "sliding_window": 2048, "max_window_layers": 0}, "only full-attention layers"),
    ({"is_causal": True}, "is_causal True"),
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
