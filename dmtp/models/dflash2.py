"""DFlash2 backbone (SPEC §9): block-internal dynamic convolution + a top-k path selector, orthogonal to the variants.

`DrafterConfig.backbone = "dflash2"` adds to a plain DFlash drafter (any injection variant; zero_init_residual x
dflash2 is DMTP(D2)):
    layers.N.conv_attn.*, layers.N.conv_mlp.*   `BlockConv` on the normed input of each attention / MLP sublayer
    selector.*                                   `Selector`: rescores the LM head's top-k candidates per slot
Both start as the identity (conv taps 0; transition codebook A = 0, bias 0): a fresh dflash2 drafter computes
exactly the plain DFlash drafter with the same weights, and a DFlash checkpoint loads into it unchanged.

    blk   [B, N*S, H]  N blocks of S contiguous slots
    conv  y_i = x_i + a_i * x_{i-1}         (same block only; x_{-1} = 0 at a block's first slot)
          a_i = tanh(W_a x_i + b_a)          one tap per channel group (G groups of H/G channels), W_a = b_a = 0
    sel   score(p, c) = log p_LM(c) + bias[c] + <A[p] * (W_h h_slot), B[c]>      c in top-k(LM logits at the slot)
          path: p_0 = last given token (A for dflash, T1 for DMTP); T_j = argmax_c score(p_{j-1}, c); p_j = T_j
    loss  CE over the top-k set at every predicting slot whose label is in it, p = the data's previous token
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dmtp.models.layers import Layer


class BlockConv(nn.Module):
    """Two-tap grouped dynamic depthwise convolution inside each block; the identity at initialisation."""

    def __init__(self, hidden: int, groups: int):
        super().__init__()
        if hidden % groups:
            raise ValueError(f"conv_groups {groups} must divide hidden_size {hidden}")
        self.groups = groups
        self.weight = nn.Parameter(torch.zeros(groups, hidden))  # W_a: x_i -> G taps (plain tensors, so the
        self.bias = nn.Parameter(torch.zeros(groups))  # drafter's std-0.02 nn.Linear init does not touch them)

    def reset_parameters(self):
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, slots: int) -> torch.Tensor:
        B, Q, H = x.shape
        a = torch.tanh(F.linear(x, self.weight, self.bias))  # [B, Q, G] taps predicted from the slot itself
        xb = x.view(B, Q // slots, slots, H)
        prev = F.pad(xb[:, :, :-1], (0, 0, 1, 0)).view(B, Q, self.groups, H // self.groups)  # x_{i-1}, 0 at slot 0
        return x + (a[..., None] * prev).view(B, Q, H)


class Layer2(Layer):
    """A drafter layer with a BlockConv on the (normed) input of its attention and of its MLP sublayer."""

    def __init__(self, c):
        super().__init__(c)
        self.conv_attn = BlockConv(c.hidden_size, c.conv_groups)
        self.conv_mlp = BlockConv(c.hidden_size, c.conv_groups)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask, slots=None):
        x = x + self.self_attn(self.conv_attn(self.input_layernorm(x), slots), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.conv_mlp(self.post_attention_layernorm(x), slots))


class Selector(nn.Module):
    """Path selector over the top-k LM-head candidates of each predicting slot (transition codebooks A, B [V, d])."""

    def __init__(self, c):
        super().__init__()
        self.k = c.selector_topk
        # plain tensors (not nn.Linear): the drafter initialises them last, in `reset_parameters` below
        self.W_h = nn.Parameter(torch.zeros(c.selector_dim, c.hidden_size))  # slot hidden -> d
        self.A = nn.Parameter(torch.zeros(c.vocab_size, c.selector_dim))  # previous-token codebook (zero init)
        self.B = nn.Parameter(torch.zeros(c.vocab_size, c.selector_dim))  # candidate codebook
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))  # learned per-token unary bias (zero init)

    def reset_parameters(self):
        nn.init.normal_(self.W_h, std=0.02)
        nn.init.zeros_(self.A)  # transitions start at exactly 0 -> the path is the plain argmax path
        nn.init.normal_(self.B, std=0.02)  # (one codebook non-zero so A gets a gradient)
        nn.init.zeros_(self.bias)

    def scores(self, logits, hid, prev):
        """logits [..., V], hid [..., H], prev [...] -> (score [..., k], candidates [..., k]), candidates sorted by
        LM-head probability (so with zero transitions, index 0 is the argmax)."""
        unary, cand = logits.float().log_softmax(-1).topk(min(self.k, logits.shape[-1]), -1)
        z = F.linear(hid.to(self.W_h.dtype), self.W_h)  # W_h h    [..., d]
        trans = torch.einsum("...d,...kd->...k", (self.A[prev] * z).float(), self.B[cand].float())
        return unary + self.bias[cand].float() + trans, cand

    @torch.no_grad()
    def forward(self, logits, hid, prev):
        """Greedy walk from the anchor: logits [B, P, V] and hid [B, P, H] at the P predicting slots in order, prev
        [B] the block's last given token -> tokens [B, P]."""
        out = []
        for j in range(logits.shape[1]):
            s, cand = self.scores(logits[:, j], hid[:, j], prev)
            prev = cand.gather(-1, s.argmax(-1, keepdim=True))[:, 0]
            out.append(prev)
        return torch.stack(out, 1)


def selector_loss(sel: Selector, logits, hid, prev, labels, w):
    """Teacher-forced CE over the top-k set: rows [M] of block slots with LM logits [M, V], drafter hidden [M, H],
    the data's previous token prev [M], labels [M] (-100: no loss) and position weights w [M]. Rows whose label is
    not among the top-k carry no selector loss; the rest are weighted like the main loss (normalised by their weight
    mass). Masked rather than indexed, so the shapes do not depend on the data (no host sync, one compiled graph);
    the statistics stay on the device."""
    s, cand = sel.scores(logits, hid, prev)
    hit = cand == labels[:, None]
    has = hit.any(-1)  # never for label -100
    idx = hit.float().argmax(-1)
    wh = w * has
    ce = F.cross_entropy(s, idx, reduction="none")
    loss = (ce * wh).sum() / wh.sum().clamp(min=1e-6)
    n = has.sum()
    cover = n / (labels >= 0).sum().clamp(min=1)
    acc = ((s.argmax(-1) == idx) & has).sum() / n.clamp(min=1)
    return loss, {"sel_loss": loss.detach(), "sel_cover": cover.float(), "sel_acc": acc.float()}


def reset_parameters(drafter) -> None:
    """Initialise a drafter's DFlash2 parts (called by `Drafter.reset_parameters` after everything else)."""
    for m in drafter.modules():
        if isinstance(m, (BlockConv, Selector)):
            m.reset_parameters()
