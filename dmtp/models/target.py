"""Target adapter: any HF causal LM (Qwen3 dense, Qwen3.5/3.6 `qwen3_5[_text]`, `qwen3_5_moe`), frozen.

The HF decoder layers do the math; we only hand them our own KV cache (`cache.KVCache`) and our own 4-D masks, so
the same code serves every architecture HF ships and a rejected candidate costs nothing to roll back. Hybrid targets
(Gated DeltaNet linear-attention layers) additionally run each GDN layer segment by segment so the cache can keep the
exact recurrent state after any committed row (`cache.py` explains the scheme); `cache.commit(n)` selects it.

    tgt = Target.load("path/to/ckpt", dtype=torch.float32, device="cpu")
    out = tgt.forward(ids, pos, cache, taps=[1, 3])     # logits, post-norm last hidden h^L, tapped layer outputs
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from dmtp.checks import gist
from dmtp.models.cache import KVCache, causal_mask
from dmtp.models.finite import check_rope, nonfinite
from dmtp.models.weights import check_finite, refuse_misfit, tensor_index


PROBE = 32  # positions of the finite-logits probe at load (a degenerate RoPE can stay finite over the first few)


@dataclass
class TargetOut:
    logits: torch.Tensor | None  # [B, q, V] float32 (None: not asked for)
    hidden: torch.Tensor  # [B, q, H]  h^L: the last hidden state after the final norm
    taps: torch.Tensor | None  # [B, q, K*H]  outputs of the tapped decoder layers, concatenated in tap order


def _text_model(model: nn.Module) -> nn.Module:
    """The decoder stack (`embed_tokens`, `layers`, `norm`, `rotary_emb`) inside any supported causal LM."""
    inner = model.model
    return getattr(inner, "language_model", inner)


def read_config(path: str | Path):
    """A checkpoint's text config from its config.json alone (no weights): vocabulary, positions, eos, widths; RoPE
    settings that would make non-finite positions are refused (`finite.check_rope`)."""
    from transformers import AutoConfig

    _check_raw_config(path)
    try:
        cfg = AutoConfig.from_pretrained(str(path))
    except Exception as e:  # missing or broken config.json, an unknown model_type
        raise ValueError(f"{path}/config.json cannot be read: {gist(e)}") from None
    model_type = getattr(cfg, "model_type", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if not all(isinstance(getattr(cfg, k, None), int) for k in ("vocab_size", "hidden_size", "num_hidden_layers")):
        # a model_type whose config class keeps `text_config` as a plain object, or one without a text model's sizes
        raise ValueError(f"{path}/config.json: model_type {model_type!r} gives no text config "
                         "with integer vocab_size, hidden_size and num_hidden_layers (expected a Qwen3.5/3.6 "
                         "checkpoint's model_type, e.g. qwen3_5 or qwen3_5_moe)")
    _check_sizes(cfg, f"{path}/config.json")
    check_rope(cfg, f"{path}/config.json")
    return cfg


LAYER_TYPES = ("full_attention", "linear_attention")  # the decoder layers a target may hold
SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")  # a text model's, each >= 1
SOME_SIZES = ("num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings")  # >= 1 where set


def _check_sizes(cfg, where: str) -> None:
    """Every size of the text config a whole number >= 1 (0 heads divides by zero where the model is built), and the
    query heads a multiple of the key/value heads."""
    for k in SIZES + SOME_SIZES:
        v = getattr(cfg, k, None)
        if (k in SIZES or v is not None) and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{where}: {k}={v!r}: expected an integer >= 1")
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None)
    if kv is not None and heads % kv:
        raise ValueError(f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    unknown = sorted(set(getattr(cfg, "layer_types", None) or []) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(f"{where}: layer_types holds {unknown}: expected {' or '.join(LAYER_TYPES)} layers (the "
                         "target's decoder layers the suite runs: attention, Gated DeltaNet)")


def _check_raw_config(path: str | Path) -> None:
    """What config.json says before transformers reads it: a drafter checkpoint given as a target (it loads as a small
    Qwen3 model, then fails far from the cause), a dtype field that names no torch dtype (transformers' error names
    neither the file nor the field)."""
    from dmtp.models.drafter import DRAFTER_ARCHS

    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):  # unreadable: AutoConfig names the problem
        return
    if not isinstance(raw, dict):
        raise ValueError(f"{path}/config.json: expected a JSON object, got {type(raw).__name__}")
    archs = raw.get("architectures") or []
    if isinstance(archs, list) and DRAFTER_ARCHS & set(map(str, archs)):
        raise ValueError(f"{path}: a drafter checkpoint (config.json architectures {archs}), not a target model")
    _check_text_config(path, raw)
    for where, cfg in (("", raw), ("text_config.", raw.get("text_config"))):
        for key in ("dtype", "torch_dtype"):
            v = cfg.get(key) if isinstance(cfg, dict) else None
            if v is not None and not (isinstance(v, str) and isinstance(getattr(torch, v, None), torch.dtype)):
                raise ValueError(f"{path}/config.json: {where}{key}={v!r}: expected a torch dtype name (e.g. "
                                 "bfloat16)")


def _check_text_config(path, raw: dict) -> None:
    """A released (vision-language) layout keeps the text model's settings in `text_config`: without it transformers
    fills in its default text model (billions of parameters, allocated before any shape is compared)."""
    from transformers import CONFIG_MAPPING

    mt = raw.get("model_type")
    cls = CONFIG_MAPPING[mt] if isinstance(mt, str) and mt in CONFIG_MAPPING else None
    if cls is not None and "text_config" in (getattr(cls, "sub_configs", None) or {}) and \
            not isinstance(raw.get("text_config"), dict):
        got = "missing" if raw.get("text_config") is None else f"a {type(raw['text_config']).__name__}"
        raise ValueError(f"{path}/config.json: model_type {mt!r} keeps the text model's settings in `text_config`, "
                         f"which is {got}: expected an object with the text model's vocab_size, hidden_size, "
                         "num_hidden_layers, ... (as the released checkpoints ship it)")


# the text model's tensors of a checkpoint, under either layout: "model." (text) or "model.language_model."
# (released, vision-language); the MTP head (`mtp.*`, mtp.py) and a vision tower are not the text model's
_TEXT = re.compile(r"^(model\.language_model\.|model\.)")
_NOT_TEXT = ("mtp.", "model.visual.", "visual.")
_LAYER = re.compile(r"^layers\.(\d+)\.")


def _text_keys(names) -> dict[str, str]:
    """{name as the text model holds it (model.*, lm_head.weight): the checkpoint's name}."""
    return {("model." + _TEXT.sub("", k) if _TEXT.match(k) else k): k for k in names if not k.startswith(_NOT_TEXT)}


def _unmatched(want: dict, got: dict, name: dict) -> tuple[list, list]:
    """(missing, unexpected) checkpoint names: tensors of one side only. Inside a layer, those that add up to the
    model's element count are one layout of the same weights (experts stored one by one), not a misfit."""
    miss = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    layer = lambda k: (m.group(1) if (m := _LAYER.match(k.removeprefix("model."))) else None)  # noqa: E731
    for i in {layer(k) for k in miss + extra} - {None}:
        a = [k for k in miss if layer(k) == i]
        b = [k for k in extra if layer(k) == i]
        if a and b and sum(math.prod(want[k]) for k in a) == sum(math.prod(got[k][0]) for k in b):
            miss, extra = [k for k in miss if k not in a], [k for k in extra if k not in b]
    return miss, [name.get(k, k) for k in extra]


def check_weights(path: str | Path) -> str:
    """The checkpoint's tensors (their names, shapes and dtypes from the safetensors headers: nothing read or
    allocated) against the text model its config.json builds on the meta device: every tensor at its shape, none
    missing, none the model has no place for, each layer's tensors of the element count the config gives (a
    checkpoint may store experts one by one where the model fuses them), floating point wherever the model is.
    Refused in one line naming the checkpoint and the first tensors at fault (config.json itself first:
    `read_config`); returns a short note."""
    from transformers import AutoModelForCausalLM

    read_config(path)
    what = f"target checkpoint {path}"
    index = tensor_index(path, what)
    full = _full_config(path)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(full)
    except Exception as e:  # a config the model class rejects
        raise ValueError(f"{path}/config.json: its model cannot be built ({type(e).__name__}: {gist(e)})") from None
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    name = _text_keys(index)
    got = {k: index[c] for k, c in name.items()}
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in got:
        want.pop("lm_head.weight", None)  # the head is the embedding: a checkpoint may leave its copy out
    shapes = [(name[k], got[k][0], v) for k, v in want.items() if k in got and tuple(got[k][0]) != v]
    refuse_misfit(what, shapes, *_unmatched(want, got, name))
    ints = sorted(f"{name.get(k, k)} ({dt})" for k, (_, dt) in got.items() if not dt.startswith(("F", "BF")))
    if ints:
        raise ValueError(f"{what}: weights of a non-floating dtype where the model holds floating-point ones: "
                         f"{', '.join(ints[:3])}{f' and {len(ints) - 3} more' if len(ints) > 3 else ''}")
    n = sum(p.numel() for p in model.parameters())
    return f"{len(want)} tensors as config.json describes ({n:,} parameters)"


def target_checks(path: str | Path, mtp: bool = False, flag: str = "--target") -> list:
    """The early check of a target checkpoint (`dmtp.preflight`), one per checkpoint: its config.json (`read_config`),
    its weights against the model that config builds on the meta device (`check_weights`) and, with `mtp`, its
    native MTP head's layers against the count declared; from config.json and the safetensors headers alone."""
    from dmtp.models.mtp import check_mtp_weights
    from dmtp.preflight import Check

    def check():
        notes = [check_weights(path)] + ([check_mtp_weights(path, read_config(path))] if mtp else [])
        return "; ".join(notes)
    return [Check(flag, check)]


def _full_config(path):
    """The checkpoint's whole config (a released layout's too), as `Target.load` builds the model from it."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path))
    except Exception as e:
        raise ValueError(f"{path}/config.json cannot be read: {gist(e)}") from None


class Target(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.source: str | None = None  # the checkpoint folder it was loaded from (`load`), named in errors
        self.body = _text_model(model)
        self.config = self.body.config
        self.hidden_size = self.config.hidden_size
        self.num_layers = self.config.num_hidden_layers
        self.vocab_size = self.config.vocab_size
        self.layer_types = list(getattr(self.config, "layer_types", None) or ["full_attention"] * self.num_layers)
        unknown = set(self.layer_types) - set(LAYER_TYPES)
        if unknown:
            raise NotImplementedError(f"target has layer types {sorted(unknown)}; supported: full_attention, "
                                      "linear_attention (Gated DeltaNet)")
        self.hybrid = "linear_attention" in self.layer_types
        for layer, t in zip(self.body.layers, self.layer_types):
            if t == "linear_attention":
                segmented(layer.linear_attn)

    # --- loading -----------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, dtype=torch.float32, device="cpu", attn_implementation: str = "sdpa") -> "Target":
        """The checkpoint's model, refused (one line naming it) unless its RoPE settings are sound, its weights are
        exactly what config.json describes (transformers would re-initialise, drop or resize them with a report) and
        a forward pass gives finite logits (a probe of `PROBE` positions; every decode checks its own first forward
        too, `decode.Batch`)."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        path = Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"no HF checkpoint at {path} (config.json missing)")
        check_weights(path)  # the config against the weights' headers, before anything is allocated
        what, verbosity = f"target checkpoint {path}", hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its load report: the mismatches are named below instead
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=attn_implementation, output_loading_info=True,
                ignore_mismatched_sizes=True, use_safetensors=True)  # never a pickled weights file
        except Exception as e:  # a broken config.json or weights file (OSError, SafetensorError, ...)
            raise ValueError(f"{what} cannot be loaded: {gist(e)}") from None
        finally:
            hf_logging.set_verbosity(verbosity)
        own = lambda keys: [k for k in keys if not k.startswith("mtp.")]  # noqa: E731 (mtp.*: the head, mtp.py)
        refuse_misfit(what, info["mismatched_keys"], own(info["missing_keys"]), own(info["unexpected_keys"]))
        tgt = cls(model.to(device))
        tgt.source = str(path)
        check_rope(tgt.config, f"{path}/config.json")
        check_finite(what, tgt.model.named_parameters())
        n = min(PROBE, tgt.config.max_position_embeddings)
        ids = (torch.arange(n, device=tgt.device) % tgt.vocab_size)[None]
        if not bool(torch.isfinite(tgt.features(ids).logits).all()):
            raise ValueError(nonfinite(what, f"a forward pass of {n} positions gives non-finite logits in "
                                             f"{str(dtype).removeprefix('torch.')}", tgt))
        return tgt

    @property
    def device(self):
        return self.body.embed_tokens.weight.device

    @property
    def dtype(self):
        return self.body.embed_tokens.weight.dtype

    # --- shared frozen pieces (also used by the MTP head and the drafter) ----------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.body.embed_tokens(ids)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(h.to(self.dtype)).float()

    def rope(self, x: torch.Tensor, pos: torch.Tensor):
        """(cos, sin) for absolute positions pos [B, q], in the target's convention (mrope for qwen3_5)."""
        rot = self.body.rotary_emb
        if hasattr(rot, "mrope_section"):
            pos = pos[None].expand(3, *pos.shape)
        return rot(x, pos)

    def norm_class(self):
        return type(self.body.norm)

    @property
    def mask_free(self) -> bool:
        """Whole-sequence passes may leave the causal mask out: HF's SDPA attention then calls SDPA with
        `is_causal=True` (flash / cuDNN kernels, grouped-query attention without repeating K/V); eager attention
        would need the mask."""
        return self.config._attn_implementation == "sdpa"

    # --- forwards ------------------------------------------------------------------------------------------------
    def _run(self, ids, pos, mask, cache, taps, logits_at=None, logits=True):
        # linear-attention layers get no mask: padding is kept out of their states by `cache.begin(q, keep)`
        if taps and max(taps) >= self.num_layers - 1:
            raise ValueError(f"tap layer ids must be < {self.num_layers - 1} (HF replaces the last layer's output "
                             f"with the post-norm state), got {list(taps)}")
        out = self.body(
            input_ids=ids,
            position_ids=pos,
            attention_mask={"full_attention": mask, "sliding_attention": mask, "linear_attention": None},
            past_key_values=cache,
            use_cache=cache is not None,
            output_hidden_states=True,
        )
        hs = out.hidden_states  # embeddings, layer 0 .. layer L-1 (last entry replaced by the post-norm state)
        tapped = torch.cat([hs[l + 1] for l in taps], dim=-1) if taps else None
        h = out.last_hidden_state
        if not logits:
            return TargetOut(None, h, tapped)
        if logits_at is not None:  # one row per request: a prefill needs only the last prompt position's logits
            rows = h[torch.arange(h.shape[0], device=h.device), logits_at][:, None]
            return TargetOut(self.lm_head(rows), h, tapped)
        return TargetOut(self.lm_head(h), h, tapped)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, cache: KVCache, taps=None,
                lengths: torch.Tensor | None = None, logits_at: torch.Tensor | None = None) -> TargetOut:
        """Cached step: ids/pos [B, q]; rows are written at `pos` and see cache rows <= their own position.
        lengths [B]: real rows per request when known up front (prefill of right-padded prompts); otherwise a hybrid
        target's linear states wait for `cache.commit(n)` (full attention needs nothing). logits_at [B]: logits of
        that row only ([B, 1, V]; a long prefill would otherwise materialise [B, T, V])."""
        cache.write_pos = pos
        if not self.hybrid:
            return self._run(ids, pos, causal_mask(pos, cache.capacity), cache, taps, logits_at)
        cache.begin(ids.shape[1], lengths)
        try:
            return self._run(ids, pos, causal_mask(pos, cache.capacity), cache, taps, logits_at)
        finally:
            cache.end()

    @torch.no_grad()
    def features(self, ids: torch.Tensor, taps=None, logits: bool = True) -> TargetOut:
        """Uncached causal pass over whole sequences [B, T] (training features; right padding does not reach the real
        rows). No mask is materialised where the attention is causal by itself (`mask_free`). logits=False: hidden
        states and taps only (`mini`: the LM head is a fifth of the pass, and its fp32 logits the largest tensor)."""
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)[None].expand(B, T)
        return self._run(ids, pos, None if self.mask_free else causal_mask(pos, T), None, taps, logits=logits)


def segmented(gdn: nn.Module):
    """Wrap a Gated DeltaNet layer (instance-level, weights and state_dict untouched): with a cache that sets `cuts`,
    run rows [0, c1), [c1, c2), ... through HF's own forward and report the state after each cut (`KVCache.cut`).
    Every other caller (HF `generate`, uncached feature passes) gets the original forward."""
    if getattr(gdn, "_dmtp_segmented", False):
        return
    orig = gdn.forward

    def forward(hidden_states, cache_params=None, attention_mask=None, **kw):
        cuts = getattr(cache_params, "cuts", None)
        if not cuts:
            return orig(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kw)
        outs, start = [], 0
        for c in cuts:
            outs.append(orig(hidden_states[:, start:c], cache_params=cache_params, attention_mask=None, **kw))
            cache_params.cut(gdn.layer_idx, c)
            start = c
        return torch.cat(outs, 1)

    gdn.forward = forward
    gdn._dmtp_segmented = True
