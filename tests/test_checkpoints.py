"""Checkpoint formats: native MTP keys inside the target's safetensors (Qwen3 and Qwen3.5 text layouts) and the
public DFlash drafter layout."""
import json

import pytest
import torch
from conftest import make_drafter
from safetensors import safe_open

from dmtp.models import tiny
from dmtp.models.drafter import Drafter, check_compatible, default_target_layer_ids
from dmtp.models.mtp import MTPHead, safetensor_files
from dmtp.models.target import Target


def test_mtp_round_trip(models, tmp_path):
    tgt, mtp = models
    path = tiny.save(tgt, mtp, tmp_path / "target")
    keys = set()
    for f in safetensor_files(path):
        with safe_open(str(f), framework="pt") as fh:
            keys |= set(fh.keys())
    H = tgt.hidden_size
    for k in ["mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.fc.weight",
              "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.down_proj.weight",
              "mtp.layers.0.input_layernorm.weight"]:
        assert k in keys, k
    tgt2 = Target.load(path)
    mtp2 = MTPHead.load(tgt2, path)
    assert mtp2.fc.weight.shape == (H, 2 * H)
    for (n, a), (_, b) in zip(mtp.state_dict().items(), mtp2.state_dict().items()):
        assert torch.equal(a, b), n
    ids = torch.randint(3, tgt.vocab_size, (2, 12))
    h = tgt.features(ids).hidden
    torch.testing.assert_close(tgt2.features(ids).hidden, h)
    torch.testing.assert_close(mtp2.teacher_forced(ids, h), mtp.teacher_forced(ids, h))


def test_norm_convention_follows_target(models):
    tgt, mtp = models
    zero_centred = tgt.config.model_type.startswith("qwen3_5")
    # Qwen3.5 norms compute x * (1 + w) with w initialised at 0; Qwen3 norms x * w with w at 1
    assert type(mtp.norm) is tgt.norm_class()
    fresh = MTPHead(tgt)
    assert torch.all(fresh.norm.weight == (0.0 if zero_centred else 1.0))


def test_checkpoint_without_mtp_is_a_clear_error(models, tmp_path):
    tgt, mtp = models
    path = tiny.save(tgt, mtp, tmp_path / "nomtp", with_mtp=False)
    tgt2 = Target.load(path)
    with pytest.raises(ValueError, match=rf"{tmp_path / 'nomtp'}.*no `mtp\.\*` weights"):
        MTPHead.load(tgt2, path)
    with pytest.raises(FileNotFoundError, match="config.json missing"):
        Target.load(tmp_path / "nothing")


def test_drafter_round_trip_in_dflash_format(models, tmp_path):
    tgt, mtp = models
    d = make_drafter(tgt, "zero_init_residual")
    d.save(tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    # a DMTP drafter: names of its own, its DFlash fields inside dmtp_config (public readers refuse it)
    assert (cfg["architectures"], cfg["model_type"]) == (["DMTPDraftModel"], "dmtp_drafter") and cfg["block_size"] == 8
    assert cfg["num_target_layers"] == tgt.num_layers and "dflash_config" not in cfg
    assert cfg["dmtp_config"]["dflash_config"] == {"target_layer_ids": d.config.target_layer_ids, "mask_token_id": 2,
                                                   "block_size": 8, "output_multiplier": 1.0,
                                                   "final_logit_softcapping": None}
    assert cfg["layer_types"] == ["anchor_window_attention"] * 2 and cfg["dmtp_config"]["window"] == 4096
    with safe_open(str(tmp_path / "d" / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.1.mlp.gate_proj.weight", "injection.fuse.proj.weight"} <= keys
    assert not any(k.startswith(("embed", "lm_head")) for k in keys)
    d2 = Drafter.load(tmp_path / "d")
    for (n, a), (_, b) in zip(d.state_dict().items(), d2.state_dict().items()):
        assert torch.equal(a, b), n
    # a plain DFlash checkpoint continues as any variant (new injection weights keep their initialisation)
    make_drafter(tgt, "dflash").save(tmp_path / "df")
    z = Drafter.load(tmp_path / "df", variant="zero_init_residual")
    assert z.config.variant == "zero_init_residual" and z.injection.fuse.proj.weight.abs().sum() == 0


def test_variant_settings_live_in_the_variant_config(models, tmp_path):
    """A variant's own hyperparameters (t1_residual: the low-rank r) are its Config, saved as
    dmtp_config.variant_config; checkpoints from before (a shared top-level `lowrank_rank`) still load."""
    tgt, _ = models
    d = make_drafter(tgt, "t1_residual")  # r = 8
    assert d.injection.config.rank == 8 and d.injection.lowrank.down.weight.shape[0] == 8
    d.save(tmp_path / "t1")
    cfg = json.loads((tmp_path / "t1" / "config.json").read_text())
    assert cfg["dmtp_config"]["variant_config"] == {"rank": 8} and "lowrank_rank" not in cfg["dmtp_config"]
    make_drafter(tgt, "dflash").save(tmp_path / "df")
    assert json.loads((tmp_path / "df" / "config.json").read_text())["dmtp_config"]["variant_config"] == {}
    for name in ("t1", "df"):  # the old layout: one `lowrank_rank` for every variant, no variant_config
        path = tmp_path / name / "config.json"
        old = json.loads(path.read_text())
        old["dmtp_config"].pop("variant_config")
        old["dmtp_config"]["lowrank_rank"] = 8
        path.write_text(json.dumps(old))
    d2 = Drafter.load(tmp_path / "t1")
    assert d2.config.variant_config == {"rank": 8}
    for (n, a), (_, b) in zip(d.state_dict().items(), d2.state_dict().items()):
        assert torch.equal(a, b), n
    assert Drafter.load(tmp_path / "df").config.variant_config == {}
    with pytest.raises(ValueError, match="variant 'dflash': unknown settings \\['rank'\\] \\(it has none\\)"):
        make_drafter(tgt, "dflash", variant_config={"rank": 8})


def test_artifacts_are_readable_by_others(models, tmp_path):
    """atomic_dir / atomic_path give what a plain mkdir / open gives (0755 / 0644 under umask 022), not the private
    0700 / 0600 of mkdtemp / mkstemp: a serving process of another user reads a trained drafter."""
    import os
    import stat

    from dmtp.io import atomic_path, write_json

    tgt, _ = models
    old = os.umask(0o022)
    try:
        d = make_drafter(tgt, "dflash")
        for _ in range(2):  # a new checkpoint, then one replacing it
            d.save(tmp_path / "run" / "drafter")
        write_json(tmp_path / "run" / "meta.json", {"a": 1})
        with atomic_path(tmp_path / "run" / "state.pt") as tmp:
            torch.save({"step": 1}, tmp)
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert modes == {"run": 0o755, "run/drafter": 0o755, "run/drafter/config.json": 0o644,
                     "run/drafter/model.safetensors": 0o644, "run/meta.json": 0o644, "run/state.pt": 0o644}


def test_mismatched_drafter_is_a_clear_error(models):
    tgt, _ = models
    d = make_drafter(tgt, "dflash")
    d.config.hidden_size = tgt.hidden_size * 2
    with pytest.raises(ValueError, match="hidden_size 128 != target hidden_size 64"):
        check_compatible(d, tgt)


def test_default_taps():
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(8, 2) == [1, 5]


def test_unknown_attention_backend_is_a_clear_error(models):
    tgt, _ = models
    with pytest.raises(ValueError, match="unknown attn_backend 'flash'"):
        make_drafter(tgt, "dflash", attn_backend="flash")
