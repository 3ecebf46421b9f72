"""Paper-scale profiles: the dry run builds the target from its config, the MTP head and every drafter on the meta
device (no weights) and checks that the pieces fit."""
import json

import pytest

from dmtp.cli.dryrun import dryrun, render
from dmtp.profiles import MASK_TOKENS, PaperScale, get_profile


@pytest.mark.parametrize("name,billions,mtp_b", [("qwen3.6-27b", (26.5, 27.5), (0.3, 0.6)),
                                                 ("qwen3.6-35b-a3b", (34, 36), (0.6, 1.0))])
def test_paper_profile_dry_run(name, billions, mtp_b):
    r = dryrun(name)
    assert r["ok"], [c for c in r["checks"] if not c[1]]
    p, sc, P = r["profile"], r["profile"].scale, r["params"]
    assert billions[0] < P["target"] / 1e9 < billions[1] and mtp_b[0] < P["mtp"] / 1e9 < mtp_b[1]
    assert len(P["drafters"]) == 24  # 12 variants (9 + the control + given and the joint run's) x 2 backbones
    d = p.drafter
    assert d.layers == 5 and d.block_size == 8 and d.window == 4096 and sc.max_seq_len == 2048
    assert sc.global_batch == 128 and sc.epochs == 3 and p.engine.dtype == "bf16" and p.train.amp_bf16
    assert d.mask_token_id == MASK_TOKENS["qwen3_5"] and p.train.max_len == 2048
    L = r["config"].num_hidden_layers
    assert r["taps"] == ([1, 16, 31, 46, 61] if L == 64 else [1, 10, 19, 28, 37])
    assert r["config"].layer_types.count("full_attention") == L // 4
    text = render(r)
    assert "checks: 102/102 ok" in text and "assumptions" in text and sc.target_env in text


def test_dry_run_against_a_checkpoint_config(tmp_path, capsys):
    """--target: the checkpoint's own config.json (nested text_config, as Qwen3.6 ships) is built and compared."""
    from transformers import AutoConfig

    from dmtp.cli.main import main

    prof = get_profile("qwen3.6-27b")
    kw = dict(prof.scale.target_config)
    text = AutoConfig.for_model(kw.pop("model_type"), **kw).to_dict()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "architectures":
                                                  ["Qwen3_5ForConditionalGeneration"], "text_config": text}))
    with pytest.raises(SystemExit) as e:
        main(["dryrun", "--profile", "qwen3.6-27b", "--target", str(ckpt)])
    assert e.value.code == 0 and "checks: 102/102 ok" in capsys.readouterr().out
    text["linear_conv_kernel_dim"] = 3
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    with pytest.raises(SystemExit) as e:
        main(["dryrun", "--profile", "qwen3.6-27b", "--target", str(ckpt)])
    out = capsys.readouterr().out
    assert e.value.code == 1 and "FAILED config matches profile: linear_conv_kernel_dim: profile 4 != 3" in out
    # another model's config (fewer layers): long lists are named by their length or first difference, not printed
    text.update(num_hidden_layers=40, layer_types=text["layer_types"][:40], linear_conv_kernel_dim=4)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    with pytest.raises(SystemExit) as e:
        main(["dryrun", "--profile", "qwen3.6-27b", "--target", str(ckpt)])
    line = next(x for x in capsys.readouterr().out.splitlines() if "FAILED" in x)
    assert e.value.code == 1 and line.endswith("num_hidden_layers: profile 64 != 40, layer_types: profile 64 entries "
                                               "!= 40"), line
    text.update(num_hidden_layers=64, layer_types=["full_attention"] * 64)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    with pytest.raises(SystemExit) as e:
        main(["dryrun", "--profile", "qwen3.6-27b", "--target", str(ckpt)])
    assert "layer_types: profile [0] 'linear_attention' != 'full_attention'" in capsys.readouterr().out


def test_embedded_profiles_have_no_paper_scale():
    for name in ("tiny", "mini", "smoke"):
        assert get_profile(name).scale == PaperScale()
    with pytest.raises(ValueError, match="no paper-scale target config"):
        dryrun("tiny")


def test_train_takes_the_recipe_from_a_profile(tmp_path):
    """`dmtp train --profile P`: the profile fills every flag not given (here the smoke profile on a tiny target)."""
    import argparse

    from dmtp.cli.main import _train_profile, main
    from dmtp.models import tiny
    from dmtp.models.drafter import Drafter

    a = argparse.Namespace(profile="qwen3.6-27b", steps=None, batch_size=None, max_len=None, layers=None, lr=None,
                           gamma=None, mask_token_id=None, dtype=None, attention=None, sliding_window=None)
    _train_profile(a)
    assert (a.layers, a.max_len, a.mask_token_id, a.dtype, a.lr) == (5, 2048, 248070, "bf16", 6e-4)
    assert (a.attention, a.sliding_window) == ("public", 2048)  # the public Qwen3.6 drafters' rule
    a = argparse.Namespace(profile=None, steps=None, batch_size=3, max_len=None, layers=None, lr=None, gamma=None,
                           mask_token_id=None, dtype=None, attention=None, sliding_window=None)
    _train_profile(a)
    assert (a.steps, a.batch_size, a.layers, a.mask_token_id, a.dtype) == (200, 3, 1, 1, "fp32")  # the old defaults
    assert a.attention == "anchor"

    tgt, mtp = tiny.build("qwen3_5", seed=0)
    path = tiny.save(tgt, mtp, tmp_path / "t")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"ids": list(range(3, 40))}) + "\n" for _ in range(8)))
    main(["train", "--profile", "smoke", "--target", str(path), "--data", str(data), "--variants",
          "zero_init_residual", "--out", str(tmp_path / "dr"), "--steps", "2"])
    d = Drafter.load(next((tmp_path / "dr").rglob("config.json")).parent)
    smoke = get_profile("smoke")
    assert (d.config.num_hidden_layers, d.config.num_attention_heads, d.config.intermediate_size) == (
        smoke.drafter.layers, smoke.drafter.heads, smoke.drafter.intermediate)
    hist = json.loads(next((tmp_path / "dr").rglob("history.json")).read_text())
    assert hist[-1]["step"] == 2  # --steps overrides the profile's 6


def test_train_takes_the_mask_token_of_the_targets_family(tmp_path):
    """`dmtp train` without --mask-token-id or a profile: the id the public DFlash drafters of the target's family use
    (a Qwen3 target: 151669), where it lies inside the vocabulary; another family or a small vocabulary keeps 1."""
    import json

    from dmtp.cli.main import main as dmtp
    from dmtp.io import write_jsonl
    from dmtp.models import tiny
    from dmtp.profiles import family_mask_token

    assert family_mask_token("qwen3_5_moe_text", 248320) == 248070 == family_mask_token("qwen3_5", 248320)
    assert family_mask_token("qwen3_5_text", 96) is None and family_mask_token("llama", 10**6) is None
    tgt, mtp = tiny.build("qwen3", vocab=151936, hidden=32, layers=4, heads=2, kv_heads=1, head_dim=16, intermediate=64)
    tiny.save(tgt, mtp, tmp_path / "target")
    write_jsonl(tmp_path / "data.jsonl", [{"ids": list(range(3 + i, 27 + i))} for i in range(4)])
    dmtp(["train", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "data.jsonl"), "--variants", "dflash",
          "--steps", "1", "--batch-size", "2", "--max-len", "24", "--out", str(tmp_path / "d")])
    cfg = json.loads((tmp_path / "d" / "dflash" / "drafter" / "config.json").read_text())
    assert cfg["dflash_config"]["mask_token_id"] == 151669


def test_dry_run_prints_the_projection_of_a_rates_file(tmp_path, capsys):
    """`dmtp dryrun --rates FILE`: the projected time of each stage on --gpus cards, after the plan, labelled a
    projection; a rates file of another profile, or a broken one, is refused in one line before any work."""
    from dmtp.cli.main import main

    rec = {"format": "dmtp-rates/1", "profile": "qwen3.6-27b", "layers": 64, "full_layers": 64,
           "machine": {"device": "Synthetic GPU", "card_gib": 139.8},
           "rates": {"regen": {"tok_per_s_per_gpu": 1000.0}, "train": {"tok_per_s_per_gpu": 4000.0}}}
    f = tmp_path / "rates.json"
    f.write_text(json.dumps(rec))
    with pytest.raises(SystemExit) as e:
        main(["dryrun", "--profile", "qwen3.6-27b", "--gpus", "4", "--rates", str(f)])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "PROJECTION (not a measurement) of the full open reproduction on 4 GPU(s)" in out
    assert out.index("fit on 4 GPU(s)") < out.index("PROJECTION") and "eval: " in out and "-> -" in out
    for prof, text, why in (("qwen3.6-35b-a3b", json.dumps(rec), "measured on a stand-in of 'qwen3.6-27b'"),
                            ("qwen3.6-27b", "[]", "format: expected")):
        f.write_text(text)
        with pytest.raises(SystemExit) as e:
            main(["dryrun", "--profile", prof, "--rates", str(f)])
        err = capsys.readouterr()
        assert e.value.code == 2 and why in err.err and err.out == ""
