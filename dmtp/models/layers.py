"""Building blocks of the drafter: Qwen3-convention RMSNorm, rotary embedding, and the decoder layer whose attention
takes keys/values from the context rows and its own block (`Attention.forward`), queries from block slots only.
The DFlash2 backbone (`dflash2.Layer2`) and the injection variants build on these."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dmtp.models.attention import attend


class RMSNorm(nn.Module):
    """Qwen3 convention: x / rms(x) * w, w initialised to 1."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype))


def rope_cos_sin(pos: torch.Tensor, dim: int, theta: float, dtype, inv_freq=None, scale: float = 1.0):
    """cos, sin [..., dim] at positions pos; inv_freq, scale: a scaled RoPE (`drafter.rope_frequencies`)."""
    inv = inv_freq if inv_freq is not None else \
        1.0 / (theta ** (torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim))
    f = pos.float()[..., None] * inv  # [..., dim/2]
    emb = torch.cat([f, f], -1)
    if scale != 1.0:
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):  # x [B, H, T, D], cos/sin [B, T, D]
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, c):  # c: a DrafterConfig
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def kv(self, x, cos, sin):
        """x [B, T, H] -> k, v [B, Hkv, T, D] (k normed and rotated at its absolute positions)."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, -1, self.c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.c.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, -1, self.c.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        bk, bv = self.kv(x, cos, sin)
        k, v = torch.cat([ctx_k, bk], 2), torch.cat([ctx_v, bv], 2)
        o = attend(q, k, v, mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, Q, -1))


class MLP(nn.Module):
    def __init__(self, c):  # c: a DrafterConfig
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):  # c: a DrafterConfig
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def context_kv(self, f, cos, sin):
        """The keys/values of context rows f [B, T, H] in this layer (`Attention.kv`): a method of the layer, so
        that a sharded layer (FSDP2) gathers its weights for it as for its forward."""
        return self.self_attn.kv(f, cos, sin)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask, slots=None):  # slots: used by dflash2.Layer2
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
