"""Block-drafting attention: one visibility rule per drafter layer, two backends (dense SDPA, flex attention).

Keys are laid out as [context rows (one per absolute position 0..C-1) ; block rows]. Block b has its anchor at
position a = ctx_end[b] and S slots at positions a+first .. a+first+S-1 (`first`: 0 when slot 0 is the anchor A,
1 for single-anchor layouts that start at T1). Slot j of block b, at position p = a + first + j, sees
    context row k   iff  k < a                          (strictly before the anchor: the target has processed them)
                    and  k >= a - window                (`Rule.window`, the suite's anchor window, METHOD.md: the same
                                                         rows for every slot of the block; 0: no limit)
                    and  p - k < sliding                (`Rule.sliding`, the public DFlash `sliding_attention` window:
                                                         measured from each slot's own position; 0: no limit)
    block row i     iff  it belongs to block b          (no other block is visible)
                    and  i <= j                         (`Rule.causal`; else bidirectional inside the block)
                    and  j - i < sliding, and i - j < sliding unless causal   (the same sliding window, both ways)
The public reference (z-lab/dflash `_attention_mask`) applies exactly these per-query conditions to its key rows
[cache rows 0..a-1 ; block rows a..a+S-1] (their indices are their positions), so a sliding layer of a public
checkpoint computes here what it computes there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


@dataclass(frozen=True)
class Rule:
    """What one drafter layer lets a block slot see (module docstring)."""
    window: int = 0  # anchor window: context rows a-window..a-1 for every slot (0: every row before a)
    sliding: int = 0  # per-query window of public `sliding_attention` layers (0: none)
    causal: bool = False  # slot j sees block slots i <= j only (public sliding layers unless `is_causal` is false)


def _rule(rule) -> Rule:
    """A `Rule`, or an int: the anchor window alone (the rule of the suite's own drafters)."""
    return rule if isinstance(rule, Rule) else Rule(window=int(rule))


def visible(q_idx, kv_idx, end, ctx_len: int, slots: int, rule: Rule, first: int = 0):
    """The rule above as a tensor predicate for query row `q_idx` (block q_idx // slots, slot q_idx % slots) whose
    anchor is at `end` and key row `kv_idx` (broadcasts; the flex-attention mask_mod and the dense mask both call
    it). Block ids by arithmetic, not by indexing a table: inductor's CPU code generation fails on the gather."""
    q_block, q_slot = torch.div(q_idx, slots, rounding_mode="floor"), q_idx % slots
    is_ctx = kv_idx < ctx_len
    ctx_ok = is_ctx & (kv_idx < end)
    r = kv_idx - ctx_len  # block row index; its slot r % slots
    blk_ok = (~is_ctx) & (torch.div(r, slots, rounding_mode="floor") == q_block)
    if rule.window:
        ctx_ok = ctx_ok & (kv_idx >= end - rule.window)
    if rule.causal:
        blk_ok = blk_ok & (r % slots <= q_slot)
    if rule.sliding:
        ctx_ok = ctx_ok & (end + first + q_slot - kv_idx < rule.sliding)
        blk_ok = blk_ok & (q_slot - r % slots < rule.sliding)
        if not rule.causal:
            blk_ok = blk_ok & (r % slots - q_slot < rule.sliding)
    return ctx_ok | blk_ok


def dense_mask(ctx_end: torch.Tensor, slots: int, ctx_len: int, rule, first: int = 0) -> torch.Tensor:
    """[B, 1, N*S, C+N*S] bool for ctx_end [B, N] (N blocks of S slots per row of the batch)."""
    B, N = ctx_end.shape
    dev = ctx_end.device
    q_idx = torch.arange(N * slots, device=dev)  # [Q]
    kv_idx = torch.arange(ctx_len + N * slots, device=dev)  # [K]
    end = ctx_end[:, q_idx // slots][:, :, None]  # [B, Q, 1]
    return visible(q_idx[:, None], kv_idx, end, ctx_len, slots, _rule(rule), first)[:, None]


class _FlexRule:
    """The visibility rule as a flex-attention mask_mod for one batch shape, reading the anchors from a buffer it
    owns. Every batch of that shape copies its anchors in and reuses the same function, so compiled code that takes
    the block mask (training's `block_loss`) is traced once, not once per batch."""

    def __init__(self, B, N, slots, ctx_len, rule, first, device):
        self.ends = ends = torch.zeros(B, N, dtype=torch.long, device=device)

        def mask_mod(b, h, q_idx, kv_idx):
            return visible(q_idx, kv_idx, ends[b, q_idx // slots], ctx_len, slots, rule, first)

        self.mask_mod = mask_mod


_FLEX_RULES: dict[tuple, _FlexRule] = {}
_block_mask_fn = []


def flex_mask(ctx_end: torch.Tensor, slots: int, ctx_len: int, rule, first: int = 0):
    """Flex-attention `BlockMask` of the rule for ctx_end [B, N] (N blocks of S slots): 128 x 128 tiles that no query
    of the tile can see are skipped, the others evaluate `visible`; nothing of size Q x K is kept."""
    B, N = ctx_end.shape
    rule = _rule(rule)
    key = (B, N, slots, ctx_len, rule, first, ctx_end.device)
    if key not in _FLEX_RULES:
        _FLEX_RULES[key] = _FlexRule(B, N, slots, ctx_len, rule, first, ctx_end.device)
    fr = _FLEX_RULES[key]
    fr.ends.copy_(ctx_end)  # stream-ordered after every kernel that read the previous batch's anchors
    Q = N * slots
    make = create_block_mask
    if ctx_end.is_cuda:  # compiled (eager, it materialises the Q x K mask), one wrapper per process
        if not _block_mask_fn:
            _block_mask_fn.append(torch.compile(create_block_mask))
        make = _block_mask_fn[0]
    return make(fr.mask_mod, B, None, Q, ctx_len + Q, device=ctx_end.device)


def build_mask(ctx_end, slots, ctx_len, rule, backend="sdpa", first: int = 0):
    """The visibility rule for one drafter forward, built once and shared by the layers that follow it."""
    if backend == "flex" and ctx_end.is_cuda:
        return flex_mask(ctx_end, slots, ctx_len, rule, first)
    return dense_mask(ctx_end, slots, ctx_len, rule, first)


def layer_masks(rules: tuple[Rule, ...], ctx_end, slots, ctx_len, backend="sdpa", first: int = 0):
    """Masks for a drafter whose layers follow `rules` (one per layer): one mask when every layer has the same rule
    (the suite's drafters), else a list with one entry per layer (each distinct rule built once)."""
    built = {}
    for r in rules:
        if r not in built:
            built[r] = build_mask(ctx_end, slots, ctx_len, r, backend, first)
    return built[rules[0]] if len(built) == 1 else [built[r] for r in rules]


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
