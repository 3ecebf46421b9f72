"""The public DFlash / DFlash2 reference arithmetic (z-lab/dflash `dflash/model.py`: `DFlashDraftModel`,
`DFlash2DraftModel`), restated independently of the suite for the parity tests.

It drafts one block the way the reference's `dflash_generate` does: the keys of every layer are the K/V of all
context rows so far (the draft cache holds rows 0..start-1, each at its own position) followed by the block's, so
query i of the block sits at key index and position start + i. A layer's mask is the reference's
`_attention_mask` over those indices: causal (key <= query) when the layer is causal, `query - key < window` in
sliding layers and, when not causal, `key - query < window` too; full-attention layers that are not causal get no
mask at all. A layer is causal when `is_causal` says so, else when it is a sliding layer.

A checkpoint folder is read as the reference reads it: config.json through transformers' `Qwen3Config` (which keeps
`sliding_window` only with `use_sliding_window` and derives `layer_types` when absent; another `model_type` is only
warned about), draft values from `dflash_config` first, then the top level, `target_layer_ids` required (the
reference's `DFlashDraftModel.__init__` raises without them); DFlash2's codebooks stored without `.weight`.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import Qwen3Config
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half


class PublicDrafter:
    def __init__(self, path: Path):
        raw = json.loads((Path(path) / "config.json").read_text())
        self.cfg = Qwen3Config.from_dict(raw)  # what `from_pretrained` builds; an unknown layer type fails here
        if self.value("target_layer_ids") is None:
            raise ValueError("Draft config must define dflash_config.target_layer_ids.")
        self.sd = load_file(str(Path(path) / "model.safetensors"))
        self.dflash2 = "DFlash2DraftModel" in raw.get("architectures", [])
        self.head_dim = self.cfg.head_dim
        self.rotary = Qwen3RotaryEmbedding(self.cfg)

    def value(self, name, default=None):
        return (getattr(self.cfg, "dflash_config", None) or {}).get(name, getattr(self.cfg, name, default))

    def _norm(self, key, dim):
        n = Qwen3RMSNorm(dim, eps=self.cfg.rms_norm_eps)
        n.weight.data = self.sd[key]
        return n

    def _layer_rule(self, i):
        kind = self.cfg.layer_types[i] if self.cfg.layer_types else "full_attention"
        causal = getattr(self.cfg, "is_causal", None)
        causal = kind == "sliding_attention" if causal is None else bool(causal)
        return causal, self.cfg.sliding_window if kind == "sliding_attention" else None

    @staticmethod
    def _mask(q_len, k_len, causal, window):
        q = k_len - q_len + torch.arange(q_len)[:, None]
        k = torch.arange(k_len)[None, :]
        seen = torch.ones(q_len, k_len, dtype=torch.bool)
        if causal:
            seen &= k <= q
        if window is not None:
            seen &= q - k < window
            if not causal:
                seen &= k - q < window
        return seen[None, None]

    def _conv(self, x, dyn, base, group):
        """sum over taps o of (base[o] + dyn[o]) * x_{t-o} over the block's slots (x_{t-o} = 0 before the block)."""
        B, L, H = x.shape
        G = H // group
        xs = x.view(B, L, G, group)
        dyn = dyn.reshape(B, L, base.shape[0], G, 1)
        out = torch.zeros_like(xs)
        for o in range(base.shape[0]):
            v = xs if o == 0 else torch.cat([torch.zeros_like(xs[:, :o]), xs[:, :-o]], 1)
            out = out + base[o].view(1, 1, G, group) * v
            out = torch.addcmul(out, dyn[:, :, o], v)
        return out.view_as(x)

    def _conv_pair(self, prefix, x):
        """(pre(x), the post-sublayer kernel) of layers.N.{attention,mlp}_conv."""
        K, group = int(self.value("conv_kernel_size")), int(self.value("conv_group_size"))
        base = self.sd[prefix + ".base_kernel"]
        dyn = F.linear(x, self.sd[prefix + ".kernel_projection.weight"]).view(*x.shape[:-1], 2, K, -1)
        return self._conv(x, dyn[..., 0, :, :], base[0], group), (dyn[..., 1, :, :], base[1], group)

    def _attention(self, i, x, ctx, cos, sin):
        p, c, D = f"layers.{i}.self_attn.", self.cfg, self.head_dim
        B, S, _ = x.shape
        q = self._norm(p + "q_norm.weight", D)(F.linear(x, self.sd[p + "q_proj.weight"]).view(B, S, -1, D))
        q = q.transpose(1, 2)
        k = torch.cat([F.linear(ctx, self.sd[p + "k_proj.weight"]), F.linear(x, self.sd[p + "k_proj.weight"])], 1)
        v = torch.cat([F.linear(ctx, self.sd[p + "v_proj.weight"]), F.linear(x, self.sd[p + "v_proj.weight"])], 1)
        k = self._norm(p + "k_norm.weight", D)(k.view(B, k.shape[1], -1, D)).transpose(1, 2)
        v = v.view(B, v.shape[1], -1, D).transpose(1, 2)
        cq, sq = cos[:, None, -S:], sin[:, None, -S:]
        q = q * cq + rotate_half(q) * sq
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        causal, window = self._layer_rule(i)
        mask = self._mask(S, k.shape[2], causal, window) if causal or window is not None else None
        module = SimpleNamespace(is_causal=causal, num_key_value_groups=c.num_attention_heads // c.num_key_value_heads,
                                 training=False)
        o, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=D ** -0.5)
        return F.linear(o.reshape(B, S, -1), self.sd[p + "o_proj.weight"])

    def _mlp(self, i, x):
        mlp = Qwen3MLP(self.cfg)
        mlp.load_state_dict({k[len(f"layers.{i}.mlp."):]: v for k, v in self.sd.items()
                             if k.startswith(f"layers.{i}.mlp.")})
        return mlp(x)

    @torch.no_grad()
    def forward(self, target_hidden, noise, start: int):
        """Normed hidden states [1, S, H] of the block `noise` [1, S, H] (embeddings) at positions start..start+S-1
        after the context rows 0..start-1 with tapped target states target_hidden [1, start, K*H]."""
        H = self.cfg.hidden_size
        ctx = self._norm("hidden_norm.weight", H)(F.linear(target_hidden, self.sd["fc.weight"]))
        cos, sin = self.rotary(noise, torch.arange(start + noise.shape[1])[None])
        x = noise
        for i in range(self.cfg.num_hidden_layers):
            h = self._norm(f"layers.{i}.input_layernorm.weight", H)(x)
            if self.dflash2:
                h, post = self._conv_pair(f"layers.{i}.attention_conv", h)
            a = self._attention(i, h, ctx, cos, sin)
            x = x + (self._conv(a, *post) if self.dflash2 else a)
            h = self._norm(f"layers.{i}.post_attention_layernorm.weight", H)(x)
            if self.dflash2:
                h, post = self._conv_pair(f"layers.{i}.mlp_conv", h)
            m = self._mlp(i, h)
            x = x + (self._conv(m, *post) if self.dflash2 else m)
        return self._norm("norm.weight", H)(x)

    def logits(self, hidden, head):
        out = F.linear(hidden, head) * float(self.value("output_multiplier", 1.0))
        cap = self.value("final_logit_softcapping")
        if cap is not None and float(cap) > 0:
            out = torch.tanh(out / float(cap)) * float(cap)
        return out

    @torch.no_grad()
    def propose(self, hidden, anchor, head):
        """DFlash2's greedy path [1, P] over the predicting slots' hidden [1, P, H] from the anchor token id [1],
        and each slot's {candidate: score}."""
        logits = self.logits(hidden, head)
        unary, cand = torch.topk(logits, int(self.value("selector_top_k")), dim=-1, sorted=False)
        z = F.linear(hidden, self.sd["candidate_selector.hidden_projection.weight"])
        pred, succ = self.sd["candidate_selector.predecessor_codebook"], self.sd["candidate_selector.successor_codebook"]
        prev, path, scores = anchor, [], []
        for j in range(hidden.shape[1]):
            s = unary[:, j] + torch.einsum("br,bkr->bk", pred[prev] * z[:, j], succ[cand[:, j]])
            scores.append(dict(zip(cand[0, j].tolist(), s[0].tolist())))
            prev = cand[:, j].gather(-1, s.argmax(-1, keepdim=True))[:, 0]
            path.append(prev)
        return torch.stack(path, 1), scores


@torch.no_grad()
def suite_block(d, taps, noise, start: int):
    """The suite drafter `d` on the same block: context rows 0..start-1, block slots at start.. (anchor at start)."""
    ctx = d.context_kv(d.context(taps, None), torch.arange(start)[None])
    return d(noise, start + torch.arange(noise.shape[1])[None], ctx, torch.tensor([[start]]))


def write_public(path: Path, *, hidden=32, vocab=50, layers=3, heads=4, kv_heads=2, head_dim=8, intermediate=64,
                 taps=(1, 2), target_layers=4, block_size=4, mask_token_id=3, dflash2=False, seed=0, **config):
    """A tiny random drafter written as the public code writes one (`config` adds or overrides config.json fields:
    layer_types, sliding_window, use_sliding_window, is_causal, ...; DFlash2: kernel 2, groups of 8, rank 8, top 4)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    sd = {"fc.weight": rand(hidden, len(taps) * hidden), "hidden_norm.weight": 1 + rand(hidden),
          "norm.weight": 1 + rand(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        sd.update({p + "input_layernorm.weight": 1 + rand(hidden), p + "post_attention_layernorm.weight": 1 + rand(hidden),
                   p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
                   p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
                   p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
                   p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
                   p + "self_attn.q_norm.weight": 1 + rand(head_dim), p + "self_attn.k_norm.weight": 1 + rand(head_dim),
                   p + "mlp.gate_proj.weight": rand(intermediate, hidden), p + "mlp.up_proj.weight": rand(intermediate, hidden),
                   p + "mlp.down_proj.weight": rand(hidden, intermediate)})
        if dflash2:
            for conv in ("attention_conv", "mlp_conv"):
                sd[p + conv + ".base_kernel"] = rand(2, 2, hidden, scale=0.5) + torch.tensor([1.0, 0.0])[None, :, None]
                sd[p + conv + ".kernel_projection.weight"] = rand(2 * 2 * hidden // 8, hidden)
    dc = {"target_layer_ids": list(taps), "mask_token_id": mask_token_id, "block_size": block_size}
    if dflash2:
        sd.update({"candidate_selector.hidden_projection.weight": rand(8, hidden, scale=1.0),
                   "candidate_selector.predecessor_codebook": rand(vocab, 8, scale=1.0),
                   "candidate_selector.successor_codebook": rand(vocab, 8, scale=1.0)})
        dc.update(conv_kernel_size=2, conv_group_size=8, selector_rank=8, selector_top_k=4, output_multiplier=0.5,
                  final_logit_softcapping=3.0)
    cfg = {"architectures": ["DFlash2DraftModel" if dflash2 else "DFlashDraftModel"], "model_type": "qwen3",
           "hidden_size": hidden, "vocab_size": vocab, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": intermediate,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "attention_bias": False,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "num_target_layers": target_layers,
           "tie_word_embeddings": False, "dflash_config": dc, **config}
    from safetensors.torch import save_file

    Path(path).mkdir(parents=True)
    (Path(path) / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(Path(path) / "model.safetensors"))
    return Path(path)
