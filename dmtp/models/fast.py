"""Decode forwards of the compiled engine, gpt-fast style: the target's, the MTP layer's and the drafter's decode steps
over the preallocated caches, with attention that reads only each request's valid rows.

Against the HF path (`Target.forward`, `MTPHead.forward`, `Drafter.forward`), the reference:
  - the weights are the HF modules' own (no copies): a layer here calls its `q_proj`, `q_norm`, `mlp`, ... and the
    modeling module's own `apply_rotary_pos_emb`; only the wiring of a Qwen3 / Qwen3.5 full-attention decoder layer is
    written out (Qwen3.5: the query projection carries a per-head output gate, o = attn * sigmoid(gate));
  - attention (`EngineConfig.attention`) is flex attention with a block mask built from the query positions
    inside the graph: the kernel visits only the 128-row key blocks a request can see (target / MTP: rows 0..p for a
    query at p; drafter: what its layer's `attention.Rule` shows it), GQA natively (no K/V repeated across the
    groups), and no dense mask over the cache; or "dense": two GQA-native matmuls over the whole cache with the
    visibility evaluated from indices inside the softmax kernel (no mask tensor either) — more rows read, cuBLAS at
    every size;
  - the drafter's block writes its K/V into the context cache at the block's own positions (rows >= the anchor a,
    which no query can see before `drafter_ctx` rewrites them with committed context), so a block attends to one
    range of cache rows instead of a concatenation [context ; block];
  - on CUDA with flex attention the K/V rows are written into the cache outside the compiled graphs
    (`EngineConfig.cache_write`): written inside a graph that then reads the cache with flex attention, they gave
    wrong attention outputs on the H200;
  - a layer's closing residual add is left to the next layer (`decoder_layer` returns (x, mlp); the next computes
    x + mlp), so it fuses with that layer's RMSNorm; the arithmetic is the HF layer's, add for add.
Every setting here is an argument (`EngineConfig`: kernel, cache write, tuning, drafter path), never a module global:
compiled code is guarded on it. The prompt pass runs the HF layers by default (prompt lengths vary) or, with
`EngineConfig.prefill = "compiled"`, `prefill_forward` (this module's layers, dense kernel, symbolic shapes); both
write the same cache rows. `target_forward(..., compile=True)` compiles the target per region: one `decoder_layer`
region shared by every layer (and by the MTP layer: same class) plus a prologue and an epilogue, so compile time does
not grow with depth; the decode loop compiles its other stages whole and captures everything as CUDA graphs
(`decode.Batch`). Uncompiled, the same forwards are the "fast-eager" engine.

Supported: dense full-attention Qwen3 / Qwen3.5 layers (`layer_problem`); hybrid (Gated DeltaNet) and MoE targets, and
DFlash2 drafters, stay on the HF path.

    out = target_forward(tgt, ids, pos, cache, taps=[1, 3], compile=False)   # == tgt.forward(ids, pos, cache, taps)
"""
from __future__ import annotations

import functools
import sys

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from dmtp.config import EngineConfig
from dmtp.models.attention import Rule
from dmtp.models.cache import KVCache
from dmtp.models.layers import apply_rope, rope_cos_sin
from dmtp.models.target import TargetOut

BLOCK = 128  # key rows per flex-attention block; a compiled cache's capacity is a multiple of it
RECOMPILE_LIMIT = 64  # static shapes: one entry per (batch, rows, capacity, settings) a process decodes with
# Inductor's options per `EngineConfig.tuning` (CUDA only): "autotune" benchmarks Inductor's Triton matmul templates
# against cuBLAS per shape (`max_autotune`, without Inductor's own CUDA graphs: the engine captures its own) and tunes
# the generated kernels' launch settings (`coordinate_descent_tuning`) — longer compiles; "fixed" is Inductor's
# `deterministic` mode: no on-device timing where it could change numerics (a reduction's block size and warps, matmul
# padding), each such choice a fixed function of the shape, so no kernel depends on what else runs on the card
TUNINGS = {"default": None, "fixed": {"deterministic": True},
           "autotune": {"max_autotune": True, "coordinate_descent_tuning": True}}
DEFAULT = EngineConfig()


def round_capacity(cap: int) -> int:
    return -(-cap // BLOCK) * BLOCK


# --- what runs here ---------------------------------------------------------------------------------------------
def layer_problem(layer) -> str | None:
    """None when `decoder_layer` computes this HF decoder layer exactly, else what it lacks."""
    attn = getattr(layer, "self_attn", None)
    if attn is None:
        return f"{type(layer).__name__} has no full attention (linear attention)"
    if not type(layer.mlp).__name__.endswith("MLP"):
        return f"{type(layer.mlp).__name__} (mixture of experts)"
    if getattr(attn, "sliding_window", None):
        return "sliding-window attention"
    if not all(hasattr(attn, n) for n in ("q_norm", "k_norm", "q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
        return f"{type(attn).__name__} is not a Qwen3-style attention"
    if not hasattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb"):
        return f"{type(attn).__module__} has no apply_rotary_pos_emb"
    return None


def target_problem(tgt) -> str | None:
    if tgt.hybrid:
        return "hybrid target (Gated DeltaNet layers)"
    return next((p for p in map(layer_problem, tgt.body.layers) if p), None)


def drafter_problem(drafter, eng: EngineConfig = DEFAULT) -> str | None:
    """None when `drafter_forward` may decode this drafter under `eng` (`eng.drafter = "hf"` keeps drafters on the HF
    drafter path). A compiled drafter can propose other drafts than the HF path without any losslessness test seeing
    it (the outputs stay identical): with the cache write inside the compiled graph and flex attention
    (`EngineConfig.cache_write`), DFlash's first-token acceptance on the trained `mini` drafters was 0.21 where the HF
    drafter path gives 0.86. With the write outside the graph the compiled drafter proposes the HF drafter's drafts on
    the H200 (tests/test_cuda.py::test_fast_drafter_proposes_what_hf_proposes) and, on the trained `mini` drafters,
    decodes with the HF path's acceptance round for round (dmtp/cli/diag.py)."""
    c = drafter.config
    if c.backbone != "dflash":
        return f"{c.backbone} backbone"
    if c.rope_scaling:
        return f"scaled RoPE ({c.rope_scaling.get('rope_type')})"
    if eng.drafter == "hf":
        return "EngineConfig.drafter = 'hf'"
    return None


# --- attention over the valid rows ------------------------------------------------------------------------------
def _block_mask(lo, hi, mask_mod, q: int, cap: int) -> BlockMask:
    """Key blocks holding rows lo..hi-1 of each request (lo, hi [B]); `mask_mod` decides row by row inside them."""
    n = cap // BLOCK
    first = lo.clamp(min=0) // BLOCK
    num = (hi - 1) // BLOCK - first + 1
    idx = (first[:, None] + torch.arange(n, device=lo.device)).clamp(max=n - 1)
    B = lo.shape[0]
    return BlockMask.from_kv_blocks(num.to(torch.int32).view(B, 1, 1), idx.to(torch.int32).view(B, 1, 1, n),
                                    BLOCK_SIZE=(BLOCK, BLOCK), mask_mod=mask_mod, seq_lengths=(q, cap),
                                    compute_q_blocks=False)


def causal(pos: torch.Tensor):
    """Queries at positions pos [B, q] see cache rows j <= their own position (target and MTP): (mask_mod, lo, hi)."""

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= pos[b, q_idx]

    return mask_mod, torch.zeros_like(pos[:, 0]), pos.max(1).values + 1


def window(anchor: torch.Tensor, bpos: torch.Tensor, rule: Rule):
    """What a drafter block at contiguous positions bpos [B, S] (anchor position a [B]) sees under one layer's
    `attention.Rule`, as `attention.visible` says: context rows k < a (a-window..a-1 under an anchor window), its own
    rows (k <= p for the query at position p when the block is causal), and under a sliding window only rows with
    p - k < sliding (and k - p < sliding in a bidirectional block). A single-anchor block starts at a+1: row a is not
    visible. The bounds are contiguous copies, not column views of bpos: a mask_mod's captured tensors are indexed by
    the kernel (a suspect of the CUDA-only wrong drafts, `drafter_problem`; unconfirmed)."""
    start, end = bpos[:, 0].contiguous(), bpos[:, -1].contiguous()
    W, SW, in_order = rule.window, rule.sliding, rule.causal

    def mask_mod(b, h, q_idx, kv_idx):
        a, p = anchor[b], start[b] + q_idx
        ctx = kv_idx < a
        if W:
            ctx = ctx & (kv_idx >= a - W)
        blk = (kv_idx >= start[b]) & (kv_idx <= end[b])
        if in_order:
            blk = blk & (kv_idx <= p)
        ok = ctx | blk
        if SW:
            ok = ok & (p - kv_idx < SW)
            if not in_order:
                ok = ok & (kv_idx - p < SW)
        return ok

    lo = anchor - W if W else start - (SW - 1) if SW else torch.zeros_like(anchor)
    return mask_mod, lo, end + 1


_flex_eager = torch.compiler.disable(flex_attention)


def attend(q, k, v, visibility, scale=None, kind: str = "flex"):
    """q [B, Hq, n, D] over cache buffers k, v [B, Hkv, cap, D], GQA native; `visibility` = (mask_mod, lo, hi) from
    `causal` / `window` (rows lo..hi-1 hold every visible row); `kind` = `EngineConfig.attention`. Flex: compiled on CUDA into the Triton template; on CPU
    Inductor's C++ template cannot read tensors computed inside the graph from a mask_mod, so a compiled CPU graph
    calls it eagerly (CPU is for tests: the compiled CPU path checks tracing and guards, the GPU tests the kernels)."""
    mask_mod, lo, hi = visibility
    if kind == "dense":
        return _dense(q, k, v, mask_mod, q.shape[-1] ** -0.5 if scale is None else scale)
    block_mask = _block_mask(lo, hi, mask_mod, q.shape[2], k.shape[2])
    fn = _flex_eager if q.device.type == "cpu" and torch.compiler.is_compiling() else flex_attention
    return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def _dense(q, k, v, mask_mod, scale):
    """softmax(q k^T * scale, over visible rows) v with query head h reading kv head h // G (as HF's repeat_kv), the
    G query heads of a kv head stacked as rows of one matmul; the mask is evaluated from indices inside the softmax."""
    B, Hq, n, D = q.shape
    Hkv, cap = k.shape[1], k.shape[2]
    G = Hq // Hkv
    ar = functools.partial(torch.arange, device=q.device)
    ok = mask_mod(ar(B)[:, None, None, None], None, ar(n)[None, None, :, None], ar(cap)[None, None, None, :])
    s = (q.reshape(B, Hkv, G * n, D) @ k.transpose(-1, -2)).view(B, Hkv, G, n, cap).float() * scale
    p = s.masked_fill(~ok[:, :, None], float("-inf")).softmax(-1).to(v.dtype)
    return (p.view(B, Hkv, G * n, cap) @ v).view(B, Hq, n, D)


def _write_rows(kbuf, vbuf, k, v, pos):
    """k, v [B, H, q, D] into cache buffers [B, H, cap, D] at rows pos [B, q] (in place, as `KVCache.update`)."""
    bi = torch.arange(k.shape[0], device=k.device)[:, None]
    kbuf[bi, :, pos] = k.transpose(1, 2).to(kbuf.dtype)
    vbuf[bi, :, pos] = v.transpose(1, 2).to(vbuf.dtype)


_write_eager = torch.compiler.disable(_write_rows)
# Where a compiled forward writes its K/V rows (`EngineConfig.write(device)`: "graph" inside the compiled graph,
# "eager" outside it). On CUDA (torch 2.11, H200) a graph that writes the cache and then reads it with flex attention
# gave wrong attention outputs, whatever the write (indexed or index_copy_ over flattened rows) and even when the rows
# written held the same values already; the same graph with the dense kernel, eager flex attention, and the write
# outside the graph were right. It made the
# compiled drafter propose wrong drafts and the compiled Qwen3 target diverge from HF greedy; CUDA graphs capture the
# eager write as any other kernel. So "auto" writes outside the graph on CUDA with flex attention only.


def _write(kbuf, vbuf, k, v, pos, write: str):
    (_write_eager if write == "eager" else _write_rows)(kbuf, vbuf, k, v, pos)


# --- the target's and the MTP's decoder layer -------------------------------------------------------------------
def decoder_layer(layer, x, delta, cos, sin, kbuf, vbuf, pos, rope, attn: str = "flex", write: str = "graph"):
    """One HF Qwen3 / Qwen3.5 full-attention decoder layer over rows at positions pos [B, q] whose input is x + delta
    (the previous layer's residual and its MLP output). Writes the rows' K/V into the layer's cache buffers and attends
    over rows <= each query's position (`attn`, `write`: the attention kernel and where the K/V rows are written,
    `EngineConfig`). Returns (x', mlp): the layer's output is x' + mlp."""
    a = layer.self_attn
    x = x + delta
    B, q, _ = x.shape
    D = a.head_dim
    h = layer.input_layernorm(x)
    qp = a.q_proj(h)
    gate = None
    if qp.shape[-1] == 2 * a.config.num_attention_heads * D:  # Qwen3.5: [query ; gate] per head
        qp, gate = qp.view(B, q, -1, 2 * D).chunk(2, -1)
        gate = gate.reshape(B, q, -1)
    qs = a.q_norm(qp.view(B, q, -1, D)).transpose(1, 2)
    ks = a.k_norm(a.k_proj(h).view(B, q, -1, D)).transpose(1, 2)
    vs = a.v_proj(h).view(B, q, -1, D).transpose(1, 2)
    qs, ks = rope(qs, ks, cos, sin)
    _write(kbuf, vbuf, ks, vs, pos, write)
    o = attend(qs, kbuf, vbuf, causal(pos), a.scaling, attn)
    o = o.transpose(1, 2).reshape(B, q, -1)
    if gate is not None:
        o = o * torch.sigmoid(gate)
    x = x + a.o_proj(o)
    return x, layer.mlp(layer.post_attention_layernorm(x))


def _rope_fn(layer):
    return sys.modules[type(layer.self_attn).__module__].apply_rotary_pos_emb


def _prologue(tgt, ids, pos):
    x = tgt.embed(ids)
    cos, sin = tgt.rope(x, pos)
    return x, torch.zeros_like(x), cos, sin


def _epilogue(norm, lm_head, x, delta):
    h = norm(x + delta)
    return h, lm_head(h.to(lm_head.weight.dtype)).float()


_COMPILED: dict = {}


def compile_options(device: torch.device, tuning: str = "default") -> dict | None:
    """torch.compile's Inductor options for `device` under `EngineConfig.tuning`: on CPU, flex attention's C++ template
    takes no fused epilogue, so template epilogue fusion is off there (and the tuning, a CUDA matter, is not applied)."""
    if tuning not in TUNINGS:
        raise ValueError(f"tuning={tuning!r}: expected one of {', '.join(TUNINGS)}")
    return TUNINGS[tuning] if device.type == "cuda" else {"epilogue_fusion": False}


def compile_fn(fn, device: torch.device, tuning: str = "default"):
    """torch.compile with static shapes and `compile_options` (the decode loop captures its own CUDA graphs)."""
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(fn, dynamic=False, options=compile_options(device, tuning))


def compiled(fn, device: torch.device, tuning: str = "default", dynamic: bool = False):
    """`compile_fn(fn)`, made once per process, device type, tuning and shape mode (each its own compiled function,
    which dynamo keeps apart by its backend). The settings a compiled function reads (attention kernel, cache write)
    are its arguments: dynamo guards on them, so another setting is another graph, never a stale one. `dynamic`:
    symbolic shapes (the prompt pass: one graph for every batch and prompt length)."""
    key = (fn, device.type, tuning if device.type == "cuda" else "default", dynamic)
    if key not in _COMPILED:
        if dynamic:
            opts = compile_options(device, tuning)
            _COMPILED[key] = torch.compile(fn, dynamic=True, options=opts)
        else:
            _COMPILED[key] = compile_fn(fn, device, tuning)
    return _COMPILED[key]


@torch.no_grad()
def target_forward(tgt, ids, pos, cache: KVCache, taps=None, compile: bool = False,
                   eng: EngineConfig = DEFAULT) -> TargetOut:
    """`Target.forward` for a decode step (ids, pos [B, q]) over a cache the prefill has filled: the same outputs."""
    if taps and max(taps) >= tgt.num_layers - 1:
        raise ValueError(f"tap layer ids must be < {tgt.num_layers - 1}, got {list(taps)}")
    pro, layer_fn, epi = (compiled(f, ids.device, eng.tuning) if compile else f
                          for f in (_prologue, decoder_layer, _epilogue))
    attn, write = eng.attention, eng.write(ids.device.type)
    x, delta, cos, sin = pro(tgt, ids, pos)
    rope = _rope_fn(tgt.body.layers[0])
    out = {}
    for i, layer in enumerate(tgt.body.layers):
        x, delta = layer_fn(layer, x, delta, cos, sin, cache.k[i], cache.v[i], pos, rope, attn, write)
        if taps and i in taps:
            out[i] = x + delta
    h, logits = epi(tgt.body.norm, tgt.model.lm_head, x, delta)
    return TargetOut(logits, h, torch.cat([out[i] for i in taps], -1) if taps else None)


@torch.no_grad()
def prefill_forward(tgt, ids, pos, cache: KVCache, taps, plen, compile: bool = True, rows: int | None = None
                    ) -> TargetOut:
    """`Target.forward(ids, pos, cache, taps, logits_at=plen - 1)` for the prompt pass of right-padded prompts
    (ids, pos [B, T], plen [B]) through this module's layers: the dense kernel, the K/V rows written inside the graph,
    compiled with symbolic shapes (`compile`: one graph for every batch size and prompt length, instead of the HF
    layers' eager kernels one by one). Rows past a prompt's end hold padding, as on the HF path: a row is rewritten
    by the first decode step that reaches its position, before any query can see it. Logits of each prompt's last
    row only ([B, 1, V]). `rows`: attend over the cache's first `rows` rows only, the prompt pass's own (prompts
    padded to `rows` positions: no query can see a later row), not the whole capacity (the graphed pass, whose
    shapes are fixed per bucket: `engine/prompts.py`)."""
    dev = ids.device
    layer_fn = compiled(decoder_layer, dev, dynamic=True) if compile else decoder_layer
    x, delta, cos, sin = _prologue(tgt, ids, pos)
    rope = _rope_fn(tgt.body.layers[0])
    out = {}
    for i, layer in enumerate(tgt.body.layers):
        a = layer.self_attn  # the cache buffers, made as the HF pass makes them on its first write
        kb, vb = cache._buffers(i, x.new_empty(x.shape[0], a.config.num_key_value_heads, 0, a.head_dim))
        if rows is not None:  # views: the rows are written into the cache all the same
            kb, vb = kb[:, :, :rows], vb[:, :, :rows]
        x, delta = layer_fn(layer, x, delta, cos, sin, kb, vb, pos, rope, "dense", "graph")
        if taps and i in taps:
            out[i] = x + delta
    h = tgt.body.norm(x + delta)
    last = h[torch.arange(h.shape[0], device=dev), plen - 1][:, None]
    logits = tgt.model.lm_head(last.to(tgt.model.lm_head.weight.dtype)).float()
    return TargetOut(logits, h, torch.cat([out[i] for i in taps], -1) if taps else None)


def mtp_forward(head, emb_next, hidden, pos, cache: KVCache, eng: EngineConfig = DEFAULT):
    """`MTPHead.forward` over its private cache (decode steps): g = norm(layer(fc([RMS_e(E) ; RMS_h(h)])))."""
    u = head.fc(torch.cat([head.pre_fc_norm_embedding(emb_next), head.pre_fc_norm_hidden(hidden)], dim=-1))
    cos, sin = head.target.rope(u, pos)
    layer = head.layers[0]
    x, mlp = decoder_layer(layer, u, torch.zeros_like(u), cos, sin, cache.k[0], cache.v[0], pos, _rope_fn(layer),
                           eng.attention, eng.write(u.device.type))
    return head.norm(x + mlp)


# --- the drafter ------------------------------------------------------------------------------------------------
def drafter_forward(d, block, bpos, cache: KVCache, anchor, eng: EngineConfig = DEFAULT):
    """`Drafter.forward` for one block per request at contiguous positions bpos [B, S] (anchor position a [B]), the
    context being the rows of `cache` (`context_kv` of committed positions): normed hidden states [B, S, H]."""
    c = d.config
    cos, sin = rope_cos_sin(bpos, c.head_dim, c.rope_theta, block.dtype)
    rules = c.rules()  # one visibility per distinct rule of the layers (the public rule: sliding, then full)
    vis = {r: window(anchor, bpos, r) for r in dict.fromkeys(rules)}
    B, S, _ = block.shape
    x = block
    write = eng.write(block.device.type)
    for i, layer in enumerate(d.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = apply_rope(a.q_norm(a.q_proj(h).view(B, S, -1, c.head_dim)).transpose(1, 2), cos, sin)
        k, v = a.kv(h, cos, sin)
        _write(cache.k[i], cache.v[i], k, v, bpos, write)
        o = attend(q, cache.k[i], cache.v[i], vis[rules[i]], kind=eng.attention)
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, S, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return d.norm(x)
