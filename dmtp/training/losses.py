"""Fused, chunked linear + cross-entropy: the LM-head loss without the [N, V] logits.

For hidden states h [N, H], LM-head weight W [V, H] and labels y [N] (rows labelled `ignore_index` left out, n rows
kept), the logits z = h W^T [N, V] are made `chunk` rows at a time, and each chunk yields its share of

    loss  = 1/n sum_i (lse_i - z_{i, y_i}),   lse_i = log sum_j exp z_ij        (fp32)
    dz_ij = (softmax(z_i)_j - [j = y_i]) / n  (0 on ignored rows)               (d loss / d z, made in the forward)
    dh    = dz W,   dW = dz^T h                                                 (per chunk; dW summed in fp32)

so a chunk's logits are freed before the next is made, and the backward pass only scales the stored dh, dW by the
loss's incoming gradient (a scalar). With row weights w (`row_weight`: the drafter loss's position decay) the loss is
the weighted sum  sum_i w_i (lse_i - z_{i, y_i})  and dz_ij = w_i (softmax(z_i)_j - [j = y_i]), left to the caller to
normalise. dW is neither made nor stored where the weight takes no gradient (a frozen LM head: the drafters').
The logits are made in the dtype the plain `lm_head(h)` would have (bf16 under autocast), logsumexp and softmax in
fp32, as `F.cross_entropy(lm_head(h).float(), y)` does. The three GEMMs are those of the plain path (its forward and
the two of its backward; two where dW is not needed): no FLOPs are added, only the fp32 [N, V] logits and their
gradient are never stored. The top-1 accuracy (argmax z_i = y_i) comes from the same pass, and so, with `topk` > 0,
each row's k largest logits and their indices (DFlash2's path selector rescores them): the values keep their gradient
path, d z_ic / d h_i = W_c, added in the backward from the stored indices (k rows of W a row, chunk by chunk).
"""
from __future__ import annotations

import functools

import torch

from dmtp.checks import require
from dmtp.config import CHUNK


def _chunk_terms(z: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, ignore_index: int,
                 row_weight: torch.Tensor | None = None):
    """One chunk: logits z [C, V], labels y [C], scale = 1/n (1 for a weighted sum), row_weight [C] fp32 or None
    (every row 1) -> (sum of the chunk's weighted token losses, correct top-1 count, dz [C, V] in z's dtype).
    Elementwise work and row reductions only, which Inductor fuses."""
    zf = z.float()
    lse = torch.logsumexp(zf, dim=-1)  # [C]
    keep = y != ignore_index
    y0 = torch.where(keep, y, 0)  # a valid index on ignored rows; their terms are zeroed below
    kw = keep if row_weight is None else keep * row_weight
    loss = ((lse - zf.gather(1, y0[:, None])[:, 0]) * kw).sum()
    correct = (zf.argmax(-1) == y).sum()  # never equal to ignore_index < 0
    onehot = torch.arange(z.shape[1], device=z.device) == y0[:, None]
    dz = (torch.exp(zf - lse[:, None]) - onehot.float()) * (kw * scale)[:, None]
    return loss, correct, dz.to(z.dtype)


@functools.cache
def _chunk_terms_cuda():
    """`_chunk_terms` through Inductor, which fuses its elementwise work into a few passes over the chunk's logits
    (eager, each op is a pass of its own); the last, shorter chunk compiles once more, with a dynamic row count. Made
    on first use (torch.compile's import alone takes seconds). The CPU runs the plain function."""
    return torch.compile(_chunk_terms)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, chunk: int, ignore_index: int, dtype: torch.dtype, row_weight=None,
                topk: int = 0):
        """h [N, H], weight [V, H], labels [N], row_weight [N] or None -> (loss, top-1 accuracy, top-k logits [N, k]
        fp32, their indices [N, k]; both [N, 0] with topk 0); the loss is the mean over the kept rows, or with row
        weights their weighted sum. dh (and dW where the weight takes a gradient) stored for the backward, with the
        top-k indices."""
        terms = _chunk_terms_cuda() if h.is_cuda else _chunk_terms
        need_h, need_w = ctx.needs_input_grad[:2]
        with torch.autocast(h.device.type, enabled=False):  # dtypes chosen by the caller, not by autocast
            hc, wc = h.to(dtype), weight.to(dtype)
            n = (labels != ignore_index).sum().clamp(min=1)  # a tensor: no host sync
            scale = 1.0 / n.float() if row_weight is None else torch.ones((), device=h.device)
            rw = None if row_weight is None else row_weight.detach().float()
            grad_h = torch.empty_like(hc) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            correct = torch.zeros((), dtype=torch.int64, device=h.device)
            vals = torch.empty(h.shape[0], topk, dtype=torch.float32, device=h.device)
            idx = torch.empty(h.shape[0], topk, dtype=torch.int64, device=h.device)
            for s in range(0, h.shape[0], chunk):
                hs = hc[s: s + chunk]
                z = hs @ wc.T
                if topk:  # as `z.float().topk(k)` over the whole [N, V] logits, row by row
                    vals[s: s + chunk], idx[s: s + chunk] = z.float().topk(topk, dim=-1)
                l, c, dz = terms(z, labels[s: s + chunk], scale, ignore_index,
                                 None if rw is None else rw[s: s + chunk])
                del z
                loss, correct = loss + l, correct + c
                if need_h:
                    grad_h[s: s + chunk] = dz @ wc
                if need_w:
                    grad_w += (dz.T @ hs).float()
        ctx.save_for_backward(grad_h, grad_w, idx, weight, h if topk and need_w else None)
        ctx.dtypes, ctx.chunk = (h.dtype, weight.dtype, dtype), chunk
        acc = correct / n  # fp32, as the plain path's mean over its correct flags
        ctx.mark_non_differentiable(acc, idx)
        return (loss / n if row_weight is None else loss), acc, vals, idx

    @staticmethod
    def backward(ctx, grad_loss, grad_acc, grad_vals, grad_idx):
        grad_h, grad_w, idx, weight, h = ctx.saved_tensors
        h_dtype, w_dtype, dtype = ctx.dtypes
        gh = None if grad_h is None else grad_h.to(h_dtype) * grad_loss
        gw = None if grad_w is None else grad_w * grad_loss
        if grad_vals is not None and idx.shape[1]:  # the top-k logits' gradient: d z_ic / d h_i = W_c, per chunk
            for s in range(0, idx.shape[0], ctx.chunk):
                g, i = grad_vals[s: s + ctx.chunk].to(dtype), idx[s: s + ctx.chunk]
                if gh is not None:
                    gh[s: s + ctx.chunk] += torch.einsum("nk,nkh->nh", g, weight[i].to(dtype)).to(h_dtype)
                if gw is not None:  # d z_ic / d W_c = h_i
                    gw.index_add_(0, i.flatten(), (g[..., None] * h[s: s + ctx.chunk, None].to(dtype))
                                  .flatten(0, 1).float())
        gw = None if gw is None else gw.to(w_dtype)
        return gh, gw, None, None, None, None, None, None


# Under torch.compile the call is a graph break and runs eagerly. Traced, the loop over chunks would unroll into one
# graph per token count, and Inductor, free to reorder the unrolled chunks, need not hold one chunk's logits at a time
# (the bound this function exists for); eager, the GPU runs the code the CPU tests check. The break costs a few kernel
# launches per step beside GEMMs of chunk x V x H; each chunk's elementwise work is still compiled
# (`_chunk_terms_cuda`). Under FSDP2 the weight's gradient reaches its reduce-scatter through autograd, as any eager
# op's does.
@torch.compiler.disable
def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int = CHUNK,
                         ignore_index: int = -100, row_weight: torch.Tensor | None = None, topk: int = 0):
    """(mean cross-entropy of the logits h @ weight.T against `labels`, top-1 accuracy), both over the rows whose
    label is not `ignore_index` (0 and 0 where there is none; F.cross_entropy gives NaN), `chunk` rows at a time.
    row_weight [...] (as labels; no gradient flows to it): the loss is instead sum_i row_weight_i CE_i over those
    rows, unnormalised (`F.cross_entropy(..., reduction="none")` times the weights, summed).
    h [..., H] (labels [...]), weight [V, H]: an LM head's weight, possibly tied to the input embedding (its gradient
    then adds to the embedding's). The logits take autocast's dtype where autocast is on (as `F.linear` would),
    else the inputs' common dtype; the loss is fp32, its gradients come in h's and weight's dtypes.
    topk > 0: also (values [..., k] fp32, indices [..., k]) of each row's k largest logits, as `z.float().topk(k)`
    of the whole logits gives them, the values differentiable (the gradient reaches h, and weight, through them)."""
    require(isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1,
            f"chunk={chunk!r}: expected an integer >= 1 (tokens per chunk)")
    require(weight.dim() == 2 and h.shape[-1:] == weight.shape[1:], f"weight {tuple(weight.shape)}: expected "
            f"[vocab, {h.shape[-1]}] for hidden states {tuple(h.shape)}")
    require(labels.shape == h.shape[:-1] and not labels.is_floating_point(), f"labels {tuple(labels.shape)} "
            f"{labels.dtype}: expected integer labels of shape {tuple(h.shape[:-1])} for hidden states "
            f"{tuple(h.shape)}")
    require(row_weight is None or (row_weight.shape == labels.shape and row_weight.is_floating_point()),
            f"row_weight {None if row_weight is None else tuple(row_weight.shape)}: expected floating-point weights "
            f"of the labels' shape {tuple(labels.shape)}")
    require(isinstance(topk, int) and 0 <= topk <= weight.shape[0], f"topk={topk!r}: expected 0..{weight.shape[0]}")
    dev = h.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else torch.result_type(h, weight)
    loss, acc, vals, idx = _LinearCrossEntropy.apply(h.reshape(-1, h.shape[-1]), weight, labels.reshape(-1), chunk,
                                                     ignore_index, dtype,
                                                     None if row_weight is None else row_weight.reshape(-1), topk)
    if not topk:
        return loss, acc
    return loss, acc, vals.reshape(*h.shape[:-1], topk), idx.reshape(*h.shape[:-1], topk)
