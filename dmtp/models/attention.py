"""Block-drafting attention: one visibility rule, three backends (dense SDPA, flex attention, flash-attn).

Keys are laid out as [context rows (one per absolute position 0..C-1) ; block rows]. A query slot of block b sees
    context row j   iff  ctx_end[b] - window <= j < ctx_end[b]     (ctx_end = anchor position a; window from the anchor)
    block row r     iff  block_id[r] == b                          (bidirectional inside its own block, nothing else)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def visible(q_block, kv_idx, ctx_len, ctx_end, kv_block, window):
    """The rule above as a tensor predicate (broadcasts; also used verbatim as a flex-attention mask_mod)."""
    is_ctx = kv_idx < ctx_len
    end = ctx_end[q_block]
    ctx_ok = is_ctx & (kv_idx < end) & (kv_idx >= end - window)
    blk_ok = (~is_ctx) & (kv_block[(kv_idx - ctx_len).clamp(min=0)] == q_block)
    return ctx_ok | blk_ok


def dense_mask(ctx_end: torch.Tensor, slots: int, ctx_len: int, window: int) -> torch.Tensor:
    """[B, 1, N*S, C+N*S] bool for ctx_end [B, N] (N blocks of S slots per row of the batch)."""
    B, N = ctx_end.shape
    dev = ctx_end.device
    q_block = torch.arange(N * slots, device=dev) // slots  # [Q]
    kv_idx = torch.arange(ctx_len + N * slots, device=dev)  # [K]
    kv_block = torch.arange(N * slots, device=dev) // slots
    end = ctx_end[:, q_block][:, :, None]  # [B, Q, 1]
    is_ctx = kv_idx < ctx_len
    ctx_ok = is_ctx & (kv_idx < end) & (kv_idx >= end - window)
    blk_ok = (~is_ctx) & (kv_block[(kv_idx - ctx_len).clamp(min=0)] == q_block[:, None])
    return (ctx_ok | blk_ok)[:, None]


def build_mask(ctx_end, slots, ctx_len, window, backend="sdpa", n_kv=None):
    """The visibility rule for one drafter forward, built once and shared by all its layers."""
    if backend == "flex" and ctx_end.is_cuda:
        from torch.nn.attention.flex_attention import create_block_mask

        B, N = ctx_end.shape
        Q = N * slots
        kv_block = torch.arange(Q, device=ctx_end.device) // slots

        def mask_mod(b, h, q_idx, kv_idx):
            return visible(q_idx // slots, kv_idx, ctx_len, ctx_end[b], kv_block, window)

        return create_block_mask(mask_mod, B, None, Q, ctx_len + Q, device=ctx_end.device)
    return dense_mask(ctx_end, slots, ctx_len, window)


_flex_fn = []


def attend(q, k, v, mask, scale=None):
    """q [B, Hq, Q, D]; k, v [B, Hkv, C+Q, D]; mask from `build_mask` -> [B, Hq, Q, D]."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    from torch.nn.attention.flex_attention import flex_attention

    if not _flex_fn:
        _flex_fn.append(torch.compile(flex_attention, dynamic=False))
    return _flex_fn[0](q, k, v, block_mask=mask, scale=scale)
