"""Tiny random targets in the real HF layouts (Qwen3 dense, Qwen3.5 text, Qwen3.5/3.6 hybrid with Gated DeltaNet
layers, Qwen3.5/3.6 MoE) with a native MTP head, for tests and dry runs. Real checkpoints load through exactly the
same `Target.load` / `MTPHead.load` path.

    arch            layers (L = 4)                       MLP
    qwen3           full attention                       dense
    qwen3_5         full attention                       dense
    qwen3_5_hybrid  linear, linear, linear, full (3:1)   dense     (Qwen3.5/3.6 dense layout, e.g. Qwen3.6-27B)
    qwen3_5_moe     linear, linear, linear, full (3:1)   experts   (Qwen3.5/3.6 MoE layout, e.g. Qwen3.6-35B-A3B)
"""
from __future__ import annotations

from pathlib import Path

import torch

from dmtp.io import make_readable
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.mtp import MTPHead, save_target_with_mtp
from dmtp.models.target import Target
from dmtp.models.variants import get_variant


def target_config(arch: str = "qwen3_5", vocab: int = 96, hidden: int = 64, layers: int = 4, heads: int = 4,
                  kv_heads: int = 2, head_dim: int = 16, intermediate: int = 128, max_pos: int = 4096, eos: int = 1):
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                  max_position_embeddings=max_pos, tie_word_embeddings=False, eos_token_id=eos,
                  pad_token_id=0, bos_token_id=None)
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch in ("qwen3_5", "qwen3_5_hybrid", "qwen3_5_moe"):
        from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

        rot = int(head_dim * 0.25) // 2  # rotary half-dim, split over the 3 mrope sections (text: all equal)
        sec = [rot - 2 * (rot // 3), rot // 3, rot // 3]
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": sec,
                "mrope_interleaved": True}
        if arch == "qwen3_5":
            types = ["full_attention"] * layers
        else:  # every 4th layer full attention, the rest Gated DeltaNet (full_attention_interval = 4)
            types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
        # small Gated DeltaNet heads: 2 q/k heads, 4 v heads (GVA 2:1 as in Qwen3.6-35B-A3B), conv kernel 4
        linear = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                      linear_value_head_dim=8, linear_conv_kernel_dim=4)
        if arch == "qwen3_5_moe":
            moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32)
            common.pop("intermediate_size")
            return Qwen3_5MoeTextConfig(**common, **linear, **moe, layer_types=types, mtp_num_hidden_layers=1,
                                        rope_parameters=rope)
        return Qwen3_5TextConfig(**common, **linear, layer_types=types, mtp_num_hidden_layers=1,
                                 rope_parameters=rope)
    raise ValueError(f"unknown tiny architecture {arch!r} (qwen3, qwen3_5, qwen3_5_hybrid, qwen3_5_moe)")


def build(arch: str = "qwen3_5", seed: int = 0, dtype=torch.float32, std: float = 0.3, **kw):
    """(Target, MTPHead) with random weights; std > HF's 0.02 so the tiny model has peaked, non-trivial logits."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config(arch, **kw), dtype=dtype, attn_implementation="sdpa")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, std / max(1.0, p.shape[-1] / 64) ** 0.5)
    tgt = Target(model)
    mtp = MTPHead(tgt)
    with torch.no_grad():
        for n, p in mtp.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, std / max(1.0, p.shape[-1] / 64) ** 0.5)
    return tgt, mtp.requires_grad_(False).eval()


def drafter(tgt, variant: str, layers: int = 2, seed: int = 1, **kw) -> Drafter:
    """A small random drafter of `variant` for `tgt` (every injection weight non-zero, so every path is exercised;
    the low-rank variants at rank 8); `kw`: other DrafterConfig fields."""
    torch.manual_seed(seed)
    if "rank" in get_variant(variant).settings({}):  # the low-rank variants: r = 8
        kw = {"variant_config": {"rank": 8}, **kw}
    c = DrafterConfig(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                      num_target_layers=tgt.num_layers, variant=variant, mask_token_id=2, **kw)
    d = Drafter(c)
    # give zero-initialised injection weights some value so every path is exercised
    with torch.no_grad():
        for n, p in d.injection.named_parameters():
            if p.dim() >= 2 and p.abs().sum() == 0:
                p.normal_(0, 0.05)
    return d.eval()


def save(tgt, mtp, path: str | Path, with_mtp: bool = True, experts: str = "fused"):
    """experts (MoE only): "fused" as HF holds them, or "per_expert" as Qwen3.5/3.6-MoE checkpoints store them."""
    if with_mtp:
        save_target_with_mtp(tgt.model, mtp, path, experts=experts)
    else:
        tgt.model.save_pretrained(path)
        make_readable(path)  # save_pretrained's safetensors are 0600; weights are read by others
    return Path(path)
