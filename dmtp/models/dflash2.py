"""DFlash2 backbone (docs/METHOD.md) in the public DFlash2 layout: block-internal dynamic convolutions around every
sublayer and a top-k candidate selector, orthogonal to the injection variants.

`DrafterConfig.backbone = "dflash2"` adds to a plain DFlash drafter (any injection variant; zero_init_residual x
dflash2 is DMTP(D2)) the weights of the public DFlash2 checkpoints (`DFlash2DraftModel`, z-lab/dflash):
    layers.N.attention_conv.{base_kernel [2, K, H], kernel_projection.weight [2*K*G, H]}   (also layers.N.mlp_conv)
    candidate_selector.{predecessor_codebook [V, r], successor_codebook [V, r], hidden_projection.weight [r, H]}
with K = `conv_kernel_size` taps (2), G = H / `conv_group_size` channel groups, r = `selector_dim` (256).

    conv  d = P x_t reshaped [2, K, G]  (P = kernel_projection, from the sublayer's normed input x_t)
          pre(x)_t  = sum_o (base[0, o] + d[0, o, g(c)]) * x_{t-o}       o = 0..K-1, per channel c in group g(c)
          post(y)_t = sum_o (base[1, o] + d[1, o, g(c)]) * y_{t-o}       y = the sublayer's output, d from its input
          x_{t-o} = 0 before the block's first slot: nothing crosses a block (the reference runs one block at a time)
    layer h = x + post(Attn(pre(norm1 x)));  out = h + post'(MLP(pre'(norm2 h)))
    sel   score(p, c) = logit(c) + <pred[p] * (W_h h_slot), succ[c]>     c in top-k(logits at the slot)
          path: p_0 = last given token (A for dflash, T1 for DMTP); T_j = argmax_c score(p_{j-1}, c); p_j = T_j
    loss  CE over the top-k set at every predicting slot whose label is in it, p = the data's previous token
The logits are the drafter's (`Drafter.logits`: the target's LM head, times `output_multiplier`, soft-capped).
Initialisation (ours; the public checkpoints come trained): the identity. base[., 0] = 1, base[., o>0] = 0,
P = 0, pred = 0: a fresh dflash2 drafter computes exactly the plain DFlash drafter with the same weights, and a
DFlash checkpoint loads into it unchanged.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dmtp.models.layers import Layer


class _Projection(nn.Module):
    """A bias-free linear map whose construction draws no random numbers (the drafter initialises it last, so the
    base weights of a dflash2 drafter equal a same-seed dflash drafter's)."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d_out, d_in))

    def forward(self, x):
        return F.linear(x, self.weight)


class DynamicConv(nn.Module):
    """Grouped dynamic causal convolution over the slots of each block: a static per-channel kernel plus a
    per-slot, per-group kernel predicted from the sublayer's input; one pair (pre, post) per sublayer."""

    def __init__(self, hidden: int, taps: int, group_size: int):
        super().__init__()
        if hidden % group_size:
            raise ValueError(f"conv_group_size {group_size} must divide hidden_size {hidden}")
        self.taps, self.groups = taps, hidden // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, taps, hidden))  # [pre|post, tap, channel]
        self.kernel_projection = _Projection(hidden, 2 * taps * self.groups)  # x_t -> [pre|post, tap, group]
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0  # tap 0 passes x_t through: the identity
        nn.init.zeros_(self.kernel_projection.weight)

    def _convolve(self, x, dyn, base, slots: int):
        """sum_o (base[o] + dyn[o]) * x_{t-o} within each block; x [B, Q, H], dyn [B, Q, K, G], base [K, H]. The
        two terms are accumulated one after the other, tap by tap, in the reference's order (bitwise parity)."""
        B, Q, H = x.shape
        G = self.groups
        xb = x.view(B, Q // slots, slots, G, H // G)
        dyn = dyn.reshape(B, Q // slots, slots, self.taps, G, 1)
        out = torch.zeros_like(xb)
        for o in range(self.taps):
            shifted = xb if o == 0 else F.pad(xb[:, :, :-o], (0, 0, 0, 0, o, 0))  # x_{t-o}, 0 before the block
            out = out + base[o].view(G, H // G).to(x.dtype) * shifted
            out = torch.addcmul(out, dyn[:, :, :, o], shifted)
        return out.view(B, Q, H)

    def pre(self, x, slots: int):
        """(pre(x), the post-sublayer kernel predicted from x)."""
        d = self.kernel_projection(x).view(*x.shape[:-1], 2, self.taps, self.groups)
        return self._convolve(x, d[..., 0, :, :], self.base_kernel[0], slots), d[..., 1, :, :]

    def post(self, y, dyn, slots: int):
        return self._convolve(y, dyn, self.base_kernel[1], slots)


class Layer2(Layer):
    """A drafter layer with a `DynamicConv` around its attention and around its MLP sublayer."""

    def __init__(self, c):
        super().__init__(c)
        self.attention_conv = DynamicConv(c.hidden_size, c.conv_kernel_size, c.conv_group_size)
        self.mlp_conv = DynamicConv(c.hidden_size, c.conv_kernel_size, c.conv_group_size)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask, slots=None):
        h, d = self.attention_conv.pre(self.input_layernorm(x), slots)
        x = x + self.attention_conv.post(self.self_attn(h, cos, sin, ctx_k, ctx_v, mask), d, slots)
        h, d = self.mlp_conv.pre(self.post_attention_layernorm(x), slots)
        return x + self.mlp_conv.post(self.mlp(h), d, slots)


class Selector(nn.Module):
    """Path selector over the top-k candidates of each predicting slot (`candidate_selector.*` of the public
    layout): predecessor / successor codebooks [V, r] and a hidden projection H -> r."""

    def __init__(self, c):
        super().__init__()
        self.k = c.selector_topk
        self.hidden_projection = _Projection(c.hidden_size, c.selector_dim)  # W_h
        # plain tensors, named as the public checkpoints store them (no `.weight`); initialised by the drafter, last
        self.predecessor_codebook = nn.Parameter(torch.zeros(c.vocab_size, c.selector_dim))
        self.successor_codebook = nn.Parameter(torch.zeros(c.vocab_size, c.selector_dim))

    def reset_parameters(self):
        nn.init.normal_(self.hidden_projection.weight, std=0.02)
        nn.init.zeros_(self.predecessor_codebook)  # transitions start at exactly 0 -> the plain argmax path
        nn.init.normal_(self.successor_codebook, std=0.02)  # (one codebook non-zero so the other gets a gradient)

    def scores(self, logits, hid, prev):
        """logits [..., V] (the drafter's), hid [..., H], prev [...] -> (score [..., k], candidates [..., k]),
        candidates sorted by logit (so with zero transitions, index 0 is the argmax)."""
        return self._scores(logits, self.hidden_projection(hid.to(self.successor_codebook.dtype)), prev)

    def _scores(self, logits, z, prev):  # z = W_h h, projected already
        unary, cand = logits.float().topk(min(self.k, logits.shape[-1]), -1)
        return self.rescore(unary, cand, z, prev)

    def rescore(self, unary, cand, z, prev):
        """The scores of the top-k candidates `cand` [..., k] whose logits are `unary` [..., k] (fp32): unary plus the
        transition from prev, z = W_h h projected already."""
        trans = torch.einsum("...r,...kr->...k", (self.predecessor_codebook[prev] * z).float(),
                             self.successor_codebook[cand].float())
        return unary + trans, cand

    @torch.no_grad()
    def forward(self, logits, hid, prev):
        """Greedy walk from the anchor: logits [B, P, V] and hid [B, P, H] at the P predicting slots in order, prev
        [B] the block's last given token -> tokens [B, P]. Every slot's W_h h in one product (as the reference)."""
        z = self.hidden_projection(hid.to(self.successor_codebook.dtype))
        out = []
        for j in range(logits.shape[1]):
            s, cand = self._scores(logits[:, j], z[:, j], prev)
            prev = cand.gather(-1, s.argmax(-1, keepdim=True))[:, 0]
            out.append(prev)
        return torch.stack(out, 1)


def selector_loss(sel: Selector, logits, hid, prev, labels, w, norm=None, topk=None):
    """Teacher-forced CE over the top-k set: rows [M] of block slots with the drafter's logits [M, V], hidden
    [M, H], the data's previous token prev [M], labels [M] (-100: no loss) and position weights w [M]. A row whose
    label is not among its top-k carries no selector loss (the selector cannot pick it):

        loss = sum_rows w * [label in top-k] * CE_topk / norm

    with the main loss's normaliser `norm` (default: these rows' weight mass, w.sum()). The term adds over rows, so
    micro-batches and ranks that take the global batch's normaliser (divided by the ranks) sum to the whole batch's
    term exactly; a normaliser of the covered rows' mass would depend on every row's top-k, known only after every
    forward of the step. Masked rather than indexed, so the shapes do not depend on the data (no host sync, one
    compiled graph). Statistics as counts on the device, summed over micro-batches and ranks before any ratio:
    sel_covered (labelled rows whose label is in the top-k), sel_hits (of those, the selector's pick is the label).
    topk: (values [M, k] fp32, indices [M, k]) of the logits, made elsewhere (the fused LM-head loss, chunk by chunk)
    instead of `logits` (then None)."""
    if topk is None:
        s, cand = sel.scores(logits, hid, prev)
    else:
        s, cand = sel.rescore(*topk, sel.hidden_projection(hid.to(sel.successor_codebook.dtype)), prev)
    hit = cand == labels[:, None]
    has = hit.any(-1)  # never for label -100
    idx = hit.float().argmax(-1)
    if norm is None:
        norm = w.sum().clamp(min=1e-6)
    loss = (F.cross_entropy(s, idx, reduction="none") * (w * has)).sum() / norm
    hits = ((s.argmax(-1) == idx) & has).sum()
    return loss, {"sel_loss": loss.detach(), "sel_covered": has.sum().float(), "sel_hits": hits.float()}


def is_dflash2(key: str) -> bool:
    """Whether a checkpoint key belongs to the DFlash2 parts."""
    return key.startswith("candidate_selector.") or ".attention_conv." in key or ".mlp_conv." in key


def reset_parameters(drafter) -> None:
    """Initialise a drafter's DFlash2 parts (called by `Drafter.reset_parameters` after everything else)."""
    for m in drafter.modules():
        if isinstance(m, (DynamicConv, Selector)):
            m.reset_parameters()
