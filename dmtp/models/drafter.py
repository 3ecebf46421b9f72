"""DFlash block-diffusion drafter in the public DFlash checkpoint layout, with a pluggable injection variant.

Checkpoint: Qwen3-style `config.json` (+ `block_size`, `num_target_layers`,
`dflash_config: {target_layer_ids, mask_token_id}`, and our `dmtp_config: {variant, ...}`), weights
`layers.N.*` (Qwen3 decoder layers), `fc` (K*H -> H, no bias), `hidden_norm`, `norm`; injection weights under
`injection.*`; the DFlash2 backbone's (`backbone="dflash2"`, see `dflash2.py`) under `layers.N.conv_attn.*`,
`layers.N.conv_mlp.*` and `selector.*`. No embedding or LM head: the target's are used, frozen.

Context feature f_i = hidden_norm(fc([h^{l_1}_i ; ... ; h^{l_K}_i])) (a variant may change it). Every layer attends
with queries from block slots only; keys/values are [k_proj(f_ctx) ; k_proj(block)] with k_norm + RoPE at absolute
positions. Visibility: `attention.visible`.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn as nn

from dmtp.io import atomic_dir
from dmtp.models.attention import build_mask
from dmtp.models.dflash2 import Layer2, Selector, reset_parameters
from dmtp.models.layers import Layer, RMSNorm, rope_cos_sin
from dmtp.models.variants import get_variant


@dataclass
class DrafterConfig:
    hidden_size: int  # must equal the target's hidden size (shares its embedding and LM head)
    vocab_size: int  # the target's vocabulary
    num_hidden_layers: int = 1  # drafter depth (paper: 5)
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 1024
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    num_target_layers: int = 4  # depth of the target (to place the taps)
    target_layer_ids: list[int] = field(default_factory=list)  # tapped target layers; empty -> default spread
    mask_token_id: int = 0  # token whose (frozen) target embedding fills MASK slots
    block_size: int = 8  # slots of a DFlash block: 7 candidates + the anchor
    window: int = 4096  # context positions visible before the anchor, measured from the anchor
    variant: str = "dflash"  # injection variant (registry name)
    lowrank_rank: int = 64  # rank r of the low-rank MLP in t1_residual / mask_residual
    attn_backend: str = "sdpa"  # "sdpa" (dense boolean mask, CPU/GPU) or "flex" (flex-attention block mask, CUDA)
    backbone: str = "dflash"  # "dflash" | "dflash2" (block conv + path selector, SPEC §9); orthogonal to `variant`
    conv_groups: int = 16  # dflash2: channel groups of the two-tap dynamic conv (one predicted tap per group)
    selector_topk: int = 16  # dflash2: LM-head candidates per slot that the path selector rescores
    selector_dim: int = 256  # dflash2: width d of the transition codebooks A, B [V, d] and of W_h: H -> d
    selector_loss_weight: float = 0.1  # dflash2: weight of the selector's top-k cross-entropy in the loss

    def __post_init__(self):
        if self.backbone not in BACKBONES:
            raise ValueError(f"unknown backbone {self.backbone!r}; known: {', '.join(BACKBONES)}")
        if self.attn_backend not in ("sdpa", "flex"):
            raise ValueError(f"unknown attn_backend {self.attn_backend!r}: 'sdpa' or 'flex' (a flash-attn path is "
                             "not implemented: the anchor-window + own-block mask needs per-block KV gathering)")
        if not self.target_layer_ids:
            self.target_layer_ids = default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        self.target_layer_ids = [int(x) for x in self.target_layer_ids]

    @property
    def num_candidates(self) -> int:
        return self.block_size - 1

    # public DFlash config.json <-> dataclass
    def to_hf_dict(self) -> dict:
        d = asdict(self)
        out = {k: d[k] for k in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
                                 "rope_theta", "max_position_embeddings", "block_size", "num_target_layers")}
        out.update(architectures=["DFlashDraftModel"], model_type="qwen3", hidden_act="silu", attention_bias=False,
                   tie_word_embeddings=False,
                   dflash_config={"target_layer_ids": self.target_layer_ids, "mask_token_id": self.mask_token_id},
                   dmtp_config={"variant": self.variant, "window": self.window, "lowrank_rank": self.lowrank_rank,
                                "backbone": self.backbone})
        if self.backbone == "dflash2":
            out["dmtp_config"].update({k: d[k] for k in ("conv_groups", "selector_topk", "selector_dim",
                                                         "selector_loss_weight")})
        return out

    @classmethod
    def from_hf_dict(cls, d: dict) -> "DrafterConfig":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        dc = d.get("dflash_config", {})
        kw["target_layer_ids"] = dc.get("target_layer_ids", d.get("target_layer_ids", []))
        kw["mask_token_id"] = dc.get("mask_token_id", d.get("mask_token_id", 0))
        kw.update({k: v for k, v in d.get("dmtp_config", {}).items() if k in known})
        if "rope_parameters" in d and "rope_theta" not in d:
            kw["rope_theta"] = d["rope_parameters"].get("rope_theta", cls.rope_theta)
        return cls(**kw)


BACKBONES = ("dflash", "dflash2")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """K = drafter depth taps spread evenly from layer 1 to L-3; one tap -> the middle layer."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


class Drafter(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()

        self.config = c
        K = len(c.target_layer_ids)
        layer, self.selector = Layer, None
        if c.backbone == "dflash2":

            layer, self.selector = Layer2, Selector(c)
        self.layers = nn.ModuleList([layer(c) for _ in range(c.num_hidden_layers)])
        self.fc = nn.Linear(K * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.injection = get_variant(c.variant)(c)
        self.reset_parameters()

    def reset_parameters(self):
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear) and not name.startswith("injection"):
                nn.init.normal_(m.weight, std=0.02)
        self.injection.reset_parameters()
        if self.selector is not None:  # DFlash2 parts last: the base weights equal a same-seed dflash drafter's

            reset_parameters(self)

    # --- the block ------------------------------------------------------------------------------------------------
    @property
    def layout(self):
        return self.injection.layout(self.config.num_candidates)

    @property
    def dtype(self):
        return self.norm.weight.dtype

    def _cast(self, x):
        return None if x is None else x.to(self.dtype)

    def context(self, taps, g):
        """Context features f [B, T, H] from tapped target states (and, for some variants, MTP hiddens g)."""
        return self.injection.context(self, self._cast(taps), self._cast(g))

    def block(self, e_anchor, e_t1, h_mtp, e_mask):
        """Block input embeddings [..., S, H] for this drafter's variant (inputs in the target's dtype)."""
        c = self._cast
        return self.injection.block(c(e_anchor), c(e_t1), c(h_mtp), c(e_mask), self.config.num_candidates)

    def context_kv(self, f, pos):
        """Per-layer (k, v) of context rows f [B, T, H] at absolute positions pos [B, T]."""
        cos, sin = rope_cos_sin(pos, self.config.head_dim, self.config.rope_theta, f.dtype)
        return [layer.self_attn.kv(f, cos, sin) for layer in self.layers]

    def forward(self, block, block_pos, ctx_kv, ctx_end):
        """block [B, N*S, H] embeddings of N blocks of S slots at absolute positions block_pos [B, N*S];
        ctx_kv from `context_kv` (rows = absolute positions 0..C-1); ctx_end [B, N] = anchor position a of each
        block. Returns normed hidden states [B, N*S, H] (apply the target's LM head for logits)."""
        slots = block.shape[1] // ctx_end.shape[1]
        cos, sin = rope_cos_sin(block_pos, self.config.head_dim, self.config.rope_theta, block.dtype)
        c = self.config
        mask = build_mask(ctx_end, slots, ctx_kv[0][0].shape[2], c.window, c.attn_backend)
        x = block
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, ck, cv, mask, slots)
        return self.norm(x)

    def select(self, logits, hid, prev_token):
        """Candidates [B, P] from LM-head logits [B, P, V] at the P predicting slots: argmax (dflash) or the DFlash2
        path selector walked from prev_token [B] (the block's last given token: A, or T1 for DMTP variants)."""
        return logits.argmax(-1) if self.selector is None else self.selector(logits, hid, prev_token)

    # --- checkpoint I/O in the public DFlash format ------------------------------------------------------------------
    def save(self, path: str | Path):
        from safetensors.torch import save_file

        with atomic_dir(path) as tmp:
            (tmp / "config.json").write_text(json.dumps(self.config.to_hf_dict(), indent=2))
            sd = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
            save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def load(cls, path: str | Path, device="cpu", dtype=torch.float32, **overrides) -> "Drafter":
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"no drafter checkpoint at {path} (config.json missing)")
        d = json.loads((path / "config.json").read_text())
        c = DrafterConfig.from_hf_dict(d)
        for k, v in overrides.items():
            setattr(c, k, v)
        m = cls(c)
        sd = load_file(str(path / "model.safetensors"))
        missing, unexpected = m.load_state_dict(sd, strict=False)
        # A plain DFlash checkpoint has no injection weights: the variant keeps its own initialisation
        # (zero_init_residual then starts exactly as the double-anchor token-only drafter); nor DFlash2 conv/selector
        # weights: they keep their identity initialisation (a dflash2 drafter then starts as that DFlash drafter).
        missing = [k for k in missing if not k.startswith(("injection.", "selector."))
                   and not re.match(r"layers\.\d+\.conv_(attn|mlp)\.", k)]
        if missing or unexpected:
            raise ValueError(f"drafter checkpoint {path}: missing {missing[:6]}, unexpected {unexpected[:6]}")
        return m.to(device=device, dtype=dtype)


def check_compatible(drafter: Drafter, target) -> None:
    c = drafter.config
    if c.hidden_size != target.hidden_size:
        raise ValueError(f"drafter hidden_size {c.hidden_size} != target hidden_size {target.hidden_size}")
    if c.vocab_size != target.vocab_size:
        raise ValueError(f"drafter vocab_size {c.vocab_size} != target vocab_size {target.vocab_size}")
    if max(c.target_layer_ids) >= target.num_layers - 1:
        raise ValueError(f"drafter taps {c.target_layer_ids} exceed the target's {target.num_layers} layers")
