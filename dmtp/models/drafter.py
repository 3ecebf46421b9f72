"""DFlash block-diffusion drafter in the public DFlash checkpoint layout, with a pluggable injection variant.

Checkpoint: Qwen3-style `config.json` (+ `block_size`, `num_target_layers`, `layer_types`, `sliding_window`,
`dflash_config: {target_layer_ids, mask_token_id, ...}`, and our `dmtp_config: {variant, variant_config, window,
...}`; a DMTP drafter names itself `DMTPDraftModel` / `dmtp_drafter` and keeps `dflash_config` inside `dmtp_config`,
so public readers refuse it: `DMTP_ARCH`), weights `layers.N.*` (Qwen3 decoder layers), `fc` (K*H -> H, no bias),
`hidden_norm`, `norm`; injection weights under `injection.*`; the DFlash2 backbone's (`backbone="dflash2"`, see
`dflash2.py`) in the public DFlash2 layout, `layers.N.attention_conv.*`, `layers.N.mlp_conv.*` and
`candidate_selector.*`. No embedding or LM head: the target's are used, frozen.

Context feature f_i = hidden_norm(fc([h^{l_1}_i ; ... ; h^{l_K}_i])) (a variant may change it). Every layer attends
with queries from block slots only; keys/values are [k_proj(f_ctx) ; k_proj(block)] with k_norm + RoPE at absolute
positions. Visibility: one `attention.Rule` per layer (`DrafterConfig.rules`), from its `layer_types` entry.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn as nn

from dmtp.checks import at_least, check, gist, non_negative, positive, require
from dmtp.io import atomic_dir, save_safetensors
from dmtp.models.attention import Rule, layer_masks
from dmtp.models.dflash2 import Layer2, Selector, is_dflash2, reset_parameters
from dmtp.models.finite import rope_problem
from dmtp.models.layers import Layer, RMSNorm, rope_cos_sin
from dmtp.models.mtp import MTP_PREFIX
from dmtp.models.variants import get_variant
from dmtp.models.weights import check_finite, check_fits

# per-layer attention (`layer_types`): the public kinds, and the method's (METHOD.md), which public code cannot compute
FULL, SLIDING, ANCHOR = "full_attention", "sliding_attention", "anchor_window_attention"
LAYER_TYPES = (FULL, SLIDING, ANCHOR)
# `architectures` per backbone: the public names (z-lab's reference, SGLang and vLLM register them) for drafters those
# readers compute exactly (`Variant.public`), ours for every other variant, with a `model_type` no reader registers:
# vLLM and SGLang (the draft config through transformers' AutoConfig, the class through their registries) and
# transformers' AutoModel refuse it by name, and z-lab's `DFlashDraftModel.from_pretrained`, which only warns about
# the model type, finds no `dflash_config.target_layer_ids` (ours keep them in `dmtp_config.dflash_config`) and
# refuses too. Run as plain DFlash, such a drafter would drop `injection.*` and draft without T1.
PUBLIC_ARCH = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}
DMTP_ARCH = {"dflash": "DMTPDraftModel", "dflash2": "DMTPDFlash2DraftModel"}
DMTP_MODEL_TYPE = "dmtp_drafter"
DRAFTER_ARCHS = frozenset(PUBLIC_ARCH.values()) | frozenset(DMTP_ARCH.values())  # config.json names of a drafter
HEAD = "mtp_head."  # state-dict prefix of a trained MTP head attached to the drafter (`Drafter.mtp_head`)


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
    rope_scaling: dict | None = None  # HF rope parameters besides theta ({"rope_type": "yarn", "factor": 4, ...}):
    # linear, yarn and llama3 are honoured as `transformers` computes them; None: plain RoPE
    max_position_embeddings: int = 32768
    num_target_layers: int = 4  # depth of the target (to place the taps)
    target_layer_ids: list[int] = field(default_factory=list)  # tapped target layers; empty -> default spread
    mask_token_id: int = 0  # token whose (frozen) target embedding fills MASK slots
    block_size: int = 8  # slots of a DFlash block: 7 candidates + the anchor
    window: int = 4096  # context positions visible before the anchor, measured from the anchor, the same rows for
    # every slot (METHOD.md), in "anchor_window_attention" layers; 0: every earlier position
    layer_types: list[str] = field(default_factory=list)  # per layer: "full_attention" (every context position
    # before the anchor), "sliding_attention" (public DFlash: the `sliding_window` positions before each slot's own
    # position) or "anchor_window_attention" (the `window` above); empty: every layer "anchor_window_attention"
    # when window > 0, else "full_attention"
    sliding_window: int = 0  # public DFlash: window of "sliding_attention" layers, per query; 0: none
    is_causal: bool | None = None  # public DFlash: None -> causal block in "sliding_attention" layers only, the
    # others bidirectional; True / False -> every layer causal / bidirectional
    output_multiplier: float = 1.0  # public DFlash: the drafter's logits are LMHead(h) * output_multiplier, ...
    final_logit_softcapping: float = 0.0  # ... then cap * tanh(logits / cap) when cap > 0 (0: none)
    variant: str = "dflash"  # injection variant (registry name)
    variant_config: dict = field(default_factory=dict)  # the variant's own settings (fields of its Config; defaults
    # for those absent)
    attn_backend: str = "sdpa"  # "sdpa" (dense boolean mask, CPU/GPU) or "flex" (flex-attention block mask, CUDA)
    backbone: str = "dflash"  # "dflash" | "dflash2" (block conv + path selector, METHOD.md); orthogonal to `variant`
    conv_kernel_size: int = 2  # dflash2: taps of the dynamic block conv (public `conv_kernel_size`)
    conv_group_size: int = 16  # dflash2: channels per group sharing a predicted tap (public `conv_group_size`)
    selector_topk: int = 16  # dflash2: candidates per slot that the path selector rescores (`selector_top_k`)
    selector_dim: int = 256  # dflash2: width r of the codebooks [V, r] and of W_h: H -> r (`selector_rank`)
    selector_loss_weight: float = 0.1  # dflash2: weight of the selector's top-k cross-entropy in the loss

    def __post_init__(self):
        check(self, hidden_size=at_least(1), vocab_size=at_least(1), num_hidden_layers=at_least(1),
              num_attention_heads=at_least(1), num_key_value_heads=at_least(1), head_dim=at_least(2),
              intermediate_size=at_least(1), rms_norm_eps=positive, rope_theta=positive, num_target_layers=at_least(1),
              block_size=at_least(2), window=at_least(0), sliding_window=at_least(0), output_multiplier=positive,
              final_logit_softcapping=non_negative, conv_kernel_size=at_least(1), conv_group_size=at_least(1))
        require(self.head_dim % 2 == 0 and self.num_attention_heads % self.num_key_value_heads == 0,
                f"head_dim={self.head_dim} must be even and num_attention_heads={self.num_attention_heads} a multiple"
                f" of num_key_value_heads={self.num_key_value_heads}")
        require(0 <= self.mask_token_id < self.vocab_size, f"mask_token_id={self.mask_token_id}: expected a token "
                f"id in [0, vocab_size={self.vocab_size})")
        rope_frequencies(self)  # an unsupported rope_scaling fails here, when the config is read
        if self.backbone not in BACKBONES:
            raise ValueError(f"unknown backbone {self.backbone!r}; known: {', '.join(BACKBONES)}")
        if self.attn_backend not in ("sdpa", "flex"):
            raise ValueError(f"unknown attn_backend {self.attn_backend!r}: 'sdpa' (dense mask) or 'flex'")
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        require(not bad and len(self.layer_types) in (0, self.num_hidden_layers),
                f"layer_types {self.layer_types}: expected {self.num_hidden_layers} entries of {', '.join(LAYER_TYPES)}")
        require(ANCHOR not in self.layer_types or self.window > 0,
                f"layer_types {ANCHOR!r} needs window > 0 (the anchor window), got window={self.window}")
        require(self.is_causal in (None, True, False), f"is_causal {self.is_causal!r}: expected true, false or null")
        if not self.target_layer_ids:
            self.target_layer_ids = default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        # a tap indexes the target's hidden states: a negative one would count from the end, a fraction be cut
        require(isinstance(self.target_layer_ids, (list, tuple)) and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in self.target_layer_ids),
            f"target_layer_ids={self.target_layer_ids!r}: expected a list of target layer indices, integers >= 0")
        self.target_layer_ids = list(self.target_layer_ids)

    @property
    def num_candidates(self) -> int:
        return self.block_size - 1

    def resolved_layer_types(self) -> list[str]:
        return list(self.layer_types) or [ANCHOR if self.window else FULL] * self.num_hidden_layers

    def rules(self) -> tuple[Rule, ...]:
        """Per layer, what a block slot sees (`attention.Rule`): the anchor window in "anchor_window_attention"
        layers; the per-query `sliding_window` in "sliding_attention" layers; the block causal as `is_causal` says
        (None: sliding layers only, as the public reference)."""
        out = []
        for t in self.resolved_layer_types():
            causal = t == SLIDING if self.is_causal is None else self.is_causal
            out.append(Rule(window=self.window if t == ANCHOR else 0,
                            sliding=self.sliding_window if t == SLIDING else 0, causal=causal))
        return tuple(out)

    # public DFlash config.json <-> dataclass
    def to_hf_dict(self) -> dict:
        d = asdict(self)
        out = {k: d[k] for k in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
                                 "rope_theta", "max_position_embeddings", "block_size", "num_target_layers")}
        dflash2 = self.backbone == "dflash2"
        dc = {"target_layer_ids": self.target_layer_ids, "mask_token_id": self.mask_token_id,
              "block_size": self.block_size, "output_multiplier": self.output_multiplier,
              "final_logit_softcapping": self.final_logit_softcapping or None}
        if dflash2:  # the public DFlash2 names
            dc.update(conv_kernel_size=self.conv_kernel_size, conv_group_size=self.conv_group_size,
                      selector_top_k=self.selector_topk, selector_rank=self.selector_dim)
        # the visibility in the fields the public code and the serving engines read (HF's Qwen3Config keeps
        # `sliding_window` only with `use_sliding_window`); our anchor-window layers are named as such, a layer type
        # HF's config validation refuses: a public reader fails instead of computing another attention beyond the
        # window. A drafter the public readers would misread (`Variant.public` false) carries names of its own and
        # its DFlash fields under `dmtp_config` (PUBLIC_ARCH / DMTP_ARCH above)
        public = get_variant(self.variant).public
        dm = {"variant": self.variant, "window": self.window, "backbone": self.backbone,
              "variant_config": get_variant(self.variant).settings(self.variant_config)}
        out.update(architectures=[(PUBLIC_ARCH if public else DMTP_ARCH)[self.backbone]],
                   model_type="qwen3" if public else DMTP_MODEL_TYPE,
                   hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
                   layer_types=self.resolved_layer_types(), use_sliding_window=self.sliding_window > 0,
                   sliding_window=self.sliding_window or None, **({"dflash_config": dc} if public else {}),
                   dmtp_config=dm if public else dict(dm, dflash_config=dc))
        if self.is_causal is not None:
            out["is_causal"] = self.is_causal
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
        if dflash2:
            out["dmtp_config"]["selector_loss_weight"] = self.selector_loss_weight
        return out

    @classmethod
    def from_hf_dict(cls, d: dict) -> "DrafterConfig":
        archs = d.get("architectures") or []
        if archs and not DRAFTER_ARCHS & set(archs) and not (d.get("dflash_config") or d.get("dmtp_config")):
            raise ValueError(f"architectures {archs}: not a drafter checkpoint (a target model's?); expected one of "
                             f"{', '.join(sorted(DRAFTER_ARCHS))}, or a dflash_config")
        known = {f.name for f in fields(cls)} - {"layer_types", "sliding_window", "is_causal"}
        kw = {k: v for k, v in d.items() if k in known}
        dm = d.get("dmtp_config") or {}
        dc = d.get("dflash_config") or dm.get("dflash_config") or {}  # public drafters', or ours (DMTP_ARCH)

        def draft_value(name, default=None):  # as the reference reads them: dflash_config first, then top level
            return dc.get(name, d.get(name, default))

        kw["target_layer_ids"] = draft_value("target_layer_ids", [])
        kw["mask_token_id"] = draft_value("mask_token_id", 0)
        kw["block_size"] = draft_value("block_size", cls.block_size)
        kw["output_multiplier"] = draft_value("output_multiplier", 1.0)
        kw["final_logit_softcapping"] = draft_value("final_logit_softcapping") or 0.0
        for ours, public in (("conv_kernel_size", "conv_kernel_size"), ("conv_group_size", "conv_group_size"),
                             ("selector_topk", "selector_top_k"), ("selector_dim", "selector_rank")):
            if draft_value(public) is not None:
                kw[ours] = draft_value(public)
        if {PUBLIC_ARCH["dflash2"], DMTP_ARCH["dflash2"]} & set(d.get("architectures") or []):
            kw["backbone"] = "dflash2"
        kw.update(_attention_from_hf(d))
        kw.update({k: v for k, v in dm.items() if k in known})
        legacy = dm.get("lowrank_rank", d.get("lowrank_rank"))  # older checkpoints: one shared field, every variant
        own = get_variant(kw.get("variant", cls.variant)).settings({})
        if legacy is not None and "variant_config" not in dm and "rank" in own:
            kw["variant_config"] = {"rank": legacy}
        kw["rope_theta"], kw["rope_scaling"] = _rope_from_hf(d, cls.rope_theta)
        if "window" not in dm:  # not ours: no anchor window, the layers' own rules only
            kw["window"] = 0
            if ANCHOR in kw["layer_types"]:
                raise ValueError(f"layer_types {ANCHOR!r} without dmtp_config.window (the anchor window's size)")
        scale = draft_value("input_embedding_scale", 1.0)
        if scale != 1.0:
            raise ValueError(f"input_embedding_scale {scale}: only 1.0 (unscaled target embeddings) is supported")
        return cls(**kw)


BACKBONES = ("dflash", "dflash2")
STATIC_ROPE = ("linear", "yarn", "llama3")  # frequencies fixed at load (dynamic / longrope change with the length)


def _rope_from_hf(d: dict, default_theta: float) -> tuple[float, dict | None]:
    """(theta, scaling) from a config.json: `rope_theta` + `rope_scaling` (transformers 4) or `rope_parameters`."""
    rp = dict(d.get("rope_parameters") or {})
    theta = d.get("rope_theta", rp.pop("rope_theta", default_theta))
    scaling = dict(d.get("rope_scaling") or rp)
    scaling.pop("rope_theta", None)
    kind = scaling.pop("rope_type", scaling.pop("type", "default"))
    if kind == "default":  # plain RoPE; a partial rotary dim is not implemented
        partial = scaling.get("partial_rotary_factor", 1.0)
        if partial != 1.0:
            raise ValueError(f"partial_rotary_factor {partial}: only full rotary head dims are supported")
        return theta, None
    return theta, {"rope_type": kind, **scaling}


def rope_frequencies(c: "DrafterConfig"):
    """(inv_freq [head_dim/2] float32, attention scale) of a scaled RoPE, computed by `transformers` as the public
    DFlash code's `Qwen3RotaryEmbedding` does; None for plain RoPE. Unsupported kinds are refused."""
    why = rope_problem({**(c.rope_scaling or {}), "rope_theta": c.rope_theta})
    if why:  # a factor of 0 divides every position by zero
        raise ValueError(f"{why} (rope_scaling / rope_theta)")
    if not c.rope_scaling:
        return None
    kind = c.rope_scaling.get("rope_type", "default")
    if kind not in STATIC_ROPE:
        raise ValueError(f"rope_scaling {c.rope_scaling}: rope_type {kind!r} is not supported (supported: "
                         f"{', '.join(STATIC_ROPE)}; dynamic and longrope rescale with the sequence length)")
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = Qwen3Config(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads, head_dim=c.head_dim,
                     max_position_embeddings=c.max_position_embeddings,
                     rope_parameters={**c.rope_scaling, "rope_theta": c.rope_theta})
    try:
        inv, scale = ROPE_INIT_FUNCTIONS[kind](hf, None)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"rope_scaling {c.rope_scaling}: {type(e).__name__} {e}") from None
    return inv.float(), float(scale)


def _attention_from_hf(d: dict) -> dict:
    """`layer_types`, `sliding_window`, `is_causal` of a config.json as HF's Qwen3Config and the public reference
    read them: `sliding_window` counts only with `use_sliding_window` (a sliding layer without it is causal with no
    window); without `layer_types`, layers from `max_window_layers` on are sliding when a window is set, and with
    no window either the list stays empty (every layer: our anchor window when `dmtp_config.window` > 0, as in our
    checkpoints written before these fields, else full attention)."""
    sw = d.get("sliding_window") if d.get("use_sliding_window") else None
    types = d.get("layer_types")
    if types is None and sw is not None:
        types = [SLIDING if i >= d.get("max_window_layers", 28) else FULL for i in range(d.get("num_hidden_layers", 1))]
    if not isinstance(sw, (int, type(None))) or (sw is not None and sw < 1):
        raise ValueError(f"sliding_window {sw!r}: expected a positive integer or null")
    return {"layer_types": list(types or []), "sliding_window": sw or 0, "is_causal": d.get("is_causal")}


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
        layer, self.candidate_selector = Layer, None
        if c.backbone == "dflash2":
            layer, self.candidate_selector = Layer2, Selector(c)
        self.layers = nn.ModuleList([layer(c) for _ in range(c.num_hidden_layers)])
        self.fc = nn.Linear(K * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.injection = get_variant(c.variant)(c)
        self.mtp_head = None  # a trained copy of the MTP head (`Variant.trains_mtp`; `training.drafters.attach_head`),
        # saved beside the drafter's weights as mtp.safetensors in the target's `mtp.*` layout
        self.first_offset = self.layout.offsets[0]  # slot 0's position - the anchor's (a plain int: compiled code
        # that builds masks guards on its value, not on the variant's type)
        self._rope = rope_frequencies(c)  # scaled RoPE (a plain attribute: stays float32 whatever the dtype)
        self.reset_parameters()

    def reset_parameters(self):
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear) and not name.startswith("injection"):
                nn.init.normal_(m.weight, std=0.02)
        self.injection.reset_parameters()
        if self.selector is not None:  # DFlash2 parts last: the base weights equal a same-seed dflash drafter's
            reset_parameters(self)

    @property
    def selector(self) -> Selector | None:
        """The DFlash2 path selector (`candidate_selector.*`), None on the dflash backbone."""
        return self.candidate_selector

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

    def block(self, e_anchor, e_t1, h_mtp, e_mask, given=None):
        """Block input embeddings [..., S, H] for this drafter's variant (inputs in the target's dtype); `given`: the
        per-block count of MTP-chain tokens of a variant that lays out "G" slots (`variants/given.py`)."""
        c = self._cast
        kw = {} if given is None else {"given": given}
        return self.injection.block(c(e_anchor), c(e_t1), c(h_mtp), c(e_mask), self.config.num_candidates, **kw)

    def rope(self, pos, dtype):
        """(cos, sin) at absolute positions pos."""
        c = self.config
        if self._rope is None:
            return rope_cos_sin(pos, c.head_dim, c.rope_theta, dtype)
        inv, scale = self._rope
        if inv.device != pos.device:  # moved once, on the first (eager) call
            self._rope = inv, scale = inv.to(pos.device), scale
        return rope_cos_sin(pos, c.head_dim, c.rope_theta, dtype, inv_freq=inv, scale=scale)

    def context_kv(self, f, pos):
        """Per-layer (k, v) of context rows f [B, T, H] at absolute positions pos [B, T]."""
        cos, sin = self.rope(pos, f.dtype)
        return [layer.context_kv(f, cos, sin) for layer in self.layers]

    def masks(self, ctx_end, slots, ctx_len, backend=None):
        """The visibility of every layer (`attention.layer_masks` of `config.rules()`) for N blocks of S slots with
        anchors ctx_end [B, N] over ctx_len context rows; backend: the config's `attn_backend` unless given."""
        c = self.config
        return layer_masks(c.rules(), ctx_end, slots, ctx_len, backend or c.attn_backend, self.first_offset)

    def forward(self, block, block_pos, ctx_kv, ctx_end, mask=None):
        """block [B, N*S, H] embeddings of N blocks of S slots at absolute positions block_pos [B, N*S];
        ctx_kv from `context_kv` (rows = absolute positions 0..C-1); ctx_end [B, N] = anchor position a of each
        block; mask: the visibility built by the caller (`masks`; one mask for every layer, or one per layer),
        else built here. Returns normed hidden states [B, N*S, H] (`logits` of the target's LM head on them)."""
        slots = block.shape[1] // ctx_end.shape[1]
        cos, sin = self.rope(block_pos, block.dtype)
        if mask is None:
            mask = self.masks(ctx_end, slots, ctx_kv[0][0].shape[2])
        masks = mask if isinstance(mask, list) else [mask] * len(self.layers)
        x = block
        for layer, (ck, cv), m in zip(self.layers, ctx_kv, masks):
            x = layer(x, cos, sin, ck, cv, m, slots)
        return self.norm(x)

    def logits(self, lm_logits):
        """The drafter's logits from the target's LM head on its hidden states: times `output_multiplier`, then
        soft-capped (the public reference's `compute_logits`); the identity with the defaults."""
        c = self.config
        if c.output_multiplier != 1.0:
            lm_logits = lm_logits * c.output_multiplier
        if c.final_logit_softcapping > 0:
            lm_logits = torch.tanh(lm_logits / c.final_logit_softcapping) * c.final_logit_softcapping
        return lm_logits

    def select(self, logits, hid, prev_token):
        """Candidates [B, P] from the drafter's logits [B, P, V] at the P predicting slots: argmax (dflash) or the DFlash2
        path selector walked from prev_token [B] (the block's last given token: A, or T1 for DMTP variants)."""
        return logits.argmax(-1) if self.selector is None else self.selector(logits, hid, prev_token)

    # --- checkpoint I/O in the public DFlash format ------------------------------------------------------------------
    def save(self, path: str | Path, state: dict | None = None):
        """The checkpoint at `path` (atomic); state: the weights to write (default: this module's own; a sharded
        drafter's gathered state, `dist.full_state`). A trained MTP head (`mtp_head.*`) goes to mtp.safetensors as
        `mtp.*`, the target's layout (`MTPHead.load` reads it from the folder)."""
        with atomic_dir(path) as tmp:
            (tmp / "config.json").write_text(json.dumps(self.config.to_hf_dict(), indent=2))
            sd = {k: v.detach().cpu().contiguous() for k, v in (self.state_dict() if state is None else state).items()}
            head = {MTP_PREFIX + k[len(HEAD):]: sd.pop(k) for k in [k for k in sd if k.startswith(HEAD)]}
            save_safetensors(sd, tmp / "model.safetensors")
            if head:
                save_safetensors(head, tmp / "mtp.safetensors")

    @classmethod
    def load(cls, path: str | Path, device="cpu", dtype=torch.float32, **overrides) -> "Drafter":
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"no drafter checkpoint at {path} (config.json missing)")
        if not (path / "model.safetensors").exists():
            raise FileNotFoundError(f"drafter checkpoint {path}: model.safetensors missing")
        try:
            d = json.loads((path / "config.json").read_text())
            c = DrafterConfig.from_hf_dict(d)
        except (ValueError, TypeError) as e:  # not JSON, or a field out of range
            raise ValueError(f"drafter checkpoint {path}/config.json: {e}") from None
        if "variant" in overrides and "variant_config" not in overrides:  # settings belong to the stored variant
            overrides["variant_config"] = {}
        for k, v in overrides.items():
            setattr(c, k, v)
        m = cls(c)
        try:
            sd = load_file(str(path / "model.safetensors"))
            for k in [k for k in sd if k.startswith("candidate_selector.") and k.endswith("_codebook.weight")]:
                sd[k[:-len(".weight")]] = sd.pop(k)  # an nn.Embedding's key (the published files have none)
        except Exception as e:  # truncated / not safetensors (SafetensorError)
            raise ValueError(f"drafter checkpoint {path}/model.safetensors cannot be loaded: "
                             f"{gist(e)}") from None
        old = [k for k in sd if k.startswith("selector.") or ".conv_attn." in k or ".conv_mlp." in k]
        if old:
            raise ValueError(f"drafter checkpoint {path}: DFlash2 weights in the suite's former layout ({old[:3]}); "
                             "DFlash2 now reads and writes the public layout (attention_conv / mlp_conv, "
                             "candidate_selector), whose arithmetic differs: retrain it")
        # Loaded as another variant or backbone (`overrides`, a drafter to continue from): a plain DFlash checkpoint
        # has no injection weights, and the variant keeps its own initialisation (zero_init_residual then starts
        # exactly as the double-anchor token-only drafter); nor DFlash2 conv/selector weights: they keep their
        # identity initialisation (a dflash2 drafter then starts as that DFlash drafter). Loaded as itself: every
        # tensor its config needs is there.
        new = [k for k in m.state_dict() if k.startswith("injection.") or is_dflash2(k)] if overrides else []
        check_fits(f"drafter checkpoint {path}", m.state_dict(), sd, optional=new)
        check_finite(f"drafter checkpoint {path}", sd.items())
        m.load_state_dict(sd, strict=False)
        return m.to(device=device, dtype=dtype)


def check_compatible(drafter: Drafter, target) -> None:
    c = drafter.config
    if c.hidden_size != target.hidden_size:
        raise ValueError(f"drafter hidden_size {c.hidden_size} != target hidden_size {target.hidden_size}")
    if c.vocab_size != target.vocab_size:
        raise ValueError(f"drafter vocab_size {c.vocab_size} != target vocab_size {target.vocab_size}")
    if max(c.target_layer_ids) >= target.num_layers - 1:
        raise ValueError(f"drafter taps {c.target_layer_ids} exceed the target's {target.num_layers} layers")
