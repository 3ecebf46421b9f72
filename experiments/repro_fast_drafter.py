"""One drafter forward, the HF way and the compiled engine's ways, side by side (one call, no decode loop): where do
the compiled engine's drafts part from the HF drafter's? (LOG.md 2026-12-01: on CUDA they did, on CPU they do not.)

For a random drafter at the mini shape over a context cache of random committed rows, with B requests at different
anchors, prints the largest difference of the block's hidden states from `Drafter.forward` (dense mask) and the share
of argmax tokens that agree, for:
    control: a-1     the eager forward told every anchor one row early: what a visibility slip looks like
    eager            fast.drafter_forward, uncompiled (flex attention eager)
    compiled         the same through torch.compile (Triton flex attention on CUDA)
    compiled-dense   compiled, the engine's dense attention kernel instead of flex
    compiled forced-flex   compiled, flex attention's general Triton template forced (not the decoding one; CUDA)
    compiled all-blocks    compiled, every key block listed in the block mask (the mask_mod alone decides; CUDA)
    compiled pre-written   compiled over a cache into which the block's K/V were written beforehand (CUDA)
    compiled write-eager   compiled, the cache writes left out of the graph (DMTP_CACHE_WRITE=eager; CUDA)
    (every compiled and graphed row but write-eager writes inside the graph: DMTP_CACHE_WRITE=graph)
    graphed          compiled, captured in a CUDA graph and replayed with other anchors (CUDA only)

    python -m experiments.repro_fast_drafter                 # CUDA if present; ~1 min
"""
from __future__ import annotations

import argparse
import functools

import torch

from dmtp.models import fast
from dmtp.models.cache import KVCache
from dmtp.models.drafter import Drafter, DrafterConfig


def setup(dev, B, cap, hidden, vocab, seed=0, kv_heads=2):
    torch.manual_seed(seed)
    c = DrafterConfig(hidden_size=hidden, vocab_size=vocab, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=kv_heads, head_dim=64, intermediate_size=1408, num_target_layers=6,
                      variant="dflash", mask_token_id=2)
    d = Drafter(c).to(dev).eval()
    for w in d.parameters():  # weights of unit gain, so attention moves the output as much as the residual does
        if w.dim() == 2:
            torch.nn.init.normal_(w, std=w.shape[1] ** -0.5)
    emb = torch.nn.Embedding(vocab, hidden).to(dev)
    head = torch.nn.Linear(hidden, vocab, bias=False).to(dev)
    f = torch.randn(B, cap, hidden, device=dev)
    pos = torch.arange(cap, device=dev)[None].expand(B, cap)
    ctx = d.context_kv(f, pos)  # [(k, v)] per layer, rows 0..cap-1
    return d, emb, head, ctx


def fresh_cache(ctx, B, cap):
    cache = KVCache(B, cap, flex=True)
    for i, (k, v) in enumerate(ctx):
        cache.k[i], cache.v[i] = k.contiguous().clone(), v.contiguous().clone()
    return cache


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=512)
    ap.add_argument("--kv-heads", type=int, default=2, help="of 8 query heads (8: no grouped-query attention)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    fast.CACHE_WRITE = "graph"  # the write inside the compiled graph unless a row says otherwise
    dev, B, cap, S = torch.device(a.device), a.batch, a.capacity, 8
    d, emb, head, ctx = setup(dev, B, cap, 512, 8192, kv_heads=a.kv_heads)
    offs = torch.arange(S, device=dev)

    def inputs(seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        anchor = torch.randint(20, cap - 2 * S, (B,), generator=g).to(dev)
        tok = torch.randint(0, 8192, (B,), generator=g).to(dev)
        block = torch.cat([emb(tok)[:, None], emb(torch.full((B, S - 1), 2, device=dev))], 1)
        return block, anchor[:, None] + offs, anchor

    def reference(block, bpos, anchor):
        kv = [(k, v) for k, v in ctx]  # context rows 0..cap-1 (the dense mask shows rows < anchor)
        return d(block, bpos, kv, anchor[:, None])

    def report(name, out, ref):
        diff = (out - ref).abs().max().item()
        agree = (head(out).argmax(-1) == head(ref).argmax(-1)).float().mean().item()
        print(f"{name:<15} max |diff| {diff:.2e}   argmax agreement {agree:.4f}", flush=True)

    block, bpos, anchor = inputs(0)
    ref = reference(block, bpos, anchor)
    # control: the eager forward with every anchor one row early must differ (the check can see a visibility slip)
    report("control: a-1", fast.drafter_forward(d, block, bpos, fresh_cache(ctx, B, cap), anchor - 1), ref)
    report("eager", fast.drafter_forward(d, block, bpos, fresh_cache(ctx, B, cap), anchor), ref)
    step = torch.compile(fast.drafter_forward, dynamic=False)
    report("compiled", step(d, block, bpos, fresh_cache(ctx, B, cap), anchor), ref)
    with fast.attention("dense"):
        dense = torch.compile(fast.drafter_forward, dynamic=False)
        report("compiled-dense", dense(d, block, bpos, fresh_cache(ctx, B, cap), anchor), ref)
    if dev.type != "cuda":
        return
    plain = fast.flex_attention
    for name, opts in (("forced-flex", {"FORCE_USE_FLEX_ATTENTION": True}),):  # the non-decoding Triton template
        fast.flex_attention = functools.partial(plain, kernel_options=opts)
        torch._dynamo.reset()
        report(f"compiled {name}", torch.compile(fast.drafter_forward, dynamic=False)(
            d, block, bpos, fresh_cache(ctx, B, cap), anchor), ref)
    fast.flex_attention = plain
    # every key block listed (the mask_mod alone decides): is the block list at fault?
    blocks = fast._block_mask
    fast._block_mask = lambda lo, hi, mm, q, c: blocks(torch.zeros_like(lo), torch.full_like(hi, c), mm, q, c)
    torch._dynamo.reset()
    report("compiled all-blocks", torch.compile(fast.drafter_forward, dynamic=False)(
        d, block, bpos, fresh_cache(ctx, B, cap), anchor), ref)
    fast._block_mask = blocks
    # the block's K/V written beforehand (the eager forward writes the same rows): does flex read the rows the graph
    # writes before it, or the buffer as it was?
    pre = fresh_cache(ctx, B, cap)
    fast.drafter_forward(d, block, bpos, pre, anchor)
    torch._dynamo.reset()
    report("compiled pre-written", torch.compile(fast.drafter_forward, dynamic=False)(d, block, bpos, pre, anchor), ref)
    # the cache write outside the compiled graph (a graph break at each write: the engine's default on CUDA)
    fast.CACHE_WRITE = "eager"
    torch._dynamo.reset()
    report("compiled write-eager", torch.compile(fast.drafter_forward, dynamic=False)(
        d, block, bpos, fresh_cache(ctx, B, cap), anchor), ref)
    fast.CACHE_WRITE = "graph"
    torch._dynamo.reset()
    cache = fresh_cache(ctx, B, cap)
    sb, sp, sa = block.clone(), bpos.clone(), anchor.clone()
    step(d, sb, sp, cache, sa)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(d, sb, sp, cache, sa)
    for seed in (1, 2):
        block, bpos, anchor = inputs(seed)
        sb.copy_(block), sp.copy_(bpos), sa.copy_(anchor)
        for i, (k, v) in enumerate(ctx):  # the committed context again (the block wrote its rows into it)
            cache.k[i].copy_(k), cache.v[i].copy_(v)
        graph.replay()
        report(f"graphed ({seed})", out.clone(), reference(block, bpos, anchor))


if __name__ == "__main__":
    main()
