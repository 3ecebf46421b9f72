"""Block-drafting attention: one visibility rule, three backends (dense SDPA, flex attention, flash-attn).

Keys are laid out as [context rows (one per absolute position 0..C-1) ; block rows]. A query slot of block b sees
    context row j   iff  ctx_end[b] - window <= j < ctx_end[b]     (ctx_end = anchor position a; window from the anchor)
    block row r     iff  block_id[r] == b                          (bidirectional inside its own block, nothing else)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def visible(q_block, kv_idx, end, ctx_len: int, slots: int, window: int):
    """The rule above as a tensor predicate for a query of block `q_block` whose anchor is at `end` and key row
    `kv_idx` (broadcasts; the flex-attention mask_mod and the dense mask both call it). Block ids by arithmetic, not
    by indexing a table: inductor's CPU code generation fails on the gather."""
    is_ctx = kv_idx < ctx_len
    ctx_ok = is_ctx & (kv_idx < end) & (kv_idx >= end - window)
    blk_ok = (~is_ctx) & (torch.div(kv_idx - ctx_len, slots, rounding_mode="floor") == q_block)
    return ctx_ok | blk_ok


def dense_mask(ctx_end: torch.Tensor, slots: int, ctx_len: int, window: int) -> torch.Tensor:
    """[B, 1, N*S, C+N*S] bool for ctx_end [B, N] (N blocks of S slots per row of the batch)."""
    B, N = ctx_end.shape
    dev = ctx_end.device
    q_block = torch.arange(N * slots, device=dev) // slots  # [Q]
    kv_idx = torch.arange(ctx_len + N * slots, device=dev)  # [K]
    end = ctx_end[:, q_block][:, :, None]  # [B, Q, 1]
    return visible(q_block[:, None], kv_idx, end, ctx_len, slots, window)[:, None]


class _FlexRule:
    """The visibility rule as a flex-attention mask_mod for one batch shape, reading the anchors from a buffer it
    owns. Every batch of that shape copies its anchors in and reuses the same function, so compiled code that takes
    the block mask (training's `block_loss`) is traced once, not once per batch."""

    def __init__(self, B, N, slots, ctx_len, window, device):
        self.ends = ends = torch.zeros(B, N, dtype=torch.long, device=device)

        def mask_mod(b, h, q_idx, kv_idx):
            q_block = q_idx // slots
            return visible(q_block, kv_idx, ends[b, q_block], ctx_len, slots, window)

        self.mask_mod = mask_mod


_FLEX_RULES: dict[tuple, _FlexRule] = {}
_block_mask_fn = []


def flex_mask(ctx_end: torch.Tensor, slots: int, ctx_len: int, window: int):
    """Flex-attention `BlockMask` of the rule for ctx_end [B, N] (N blocks of S slots): 128 x 128 tiles that no query
    of the tile can see are skipped, the others evaluate `visible`; nothing of size Q x K is kept."""
    B, N = ctx_end.shape
    key = (B, N, slots, ctx_len, window, ctx_end.device)
    if key not in _FLEX_RULES:
        _FLEX_RULES[key] = _FlexRule(B, N, slots, ctx_len, window, ctx_end.device)
    rule = _FLEX_RULES[key]
    rule.ends.copy_(ctx_end)  # stream-ordered after every kernel that read the previous batch's anchors
    Q = N * slots
    make = create_block_mask
    if ctx_end.is_cuda:  # compiled (eager, it materialises the Q x K mask), one wrapper per process
        if not _block_mask_fn:
            _block_mask_fn.append(torch.compile(create_block_mask))
        make = _block_mask_fn[0]
    return make(rule.mask_mod, B, None, Q, ctx_len + Q, device=ctx_end.device)


def build_mask(ctx_end, slots, ctx_len, window, backend="sdpa", n_kv=None):
    """The visibility rule for one drafter forward, built once and shared by all its layers."""
    if backend == "flex" and ctx_end.is_cuda:
        return flex_mask(ctx_end, slots, ctx_len, window)
    return dense_mask(ctx_end, slots, ctx_len, window)


_flex_fn = []


def attend(q, k, v, mask, scale=None):
    """q [B, Hq, Q, D]; k, v [B, Hkv, C+Q, D]; mask from `build_mask` / `flex_mask` -> [B, Hq, Q, D]."""
    if not isinstance(mask, torch.Tensor):  # flex BlockMask: grouped-query attention without repeating K/V
        dev = q.device.type
        if torch.is_autocast_enabled(dev):  # as autocast casts SDPA's inputs: under autocast q and k leave their
            dt = torch.get_autocast_dtype(dev)  # RMSNorm (fp32 weight) in fp32 while v is bf16; flex wants one dtype
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
        if torch.compiler.is_compiling():  # inside a compiled caller (training's block_loss): traced with it
            fn = flex_attention
        else:  # eager callers get a compiled kernel (eager flex attention materialises the scores)
            if not _flex_fn:
                _flex_fn.append(torch.compile(flex_attention, dynamic=False))
            fn = _flex_fn[0]
        return fn(q, k, v, block_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
