"""`given`: adaptive multi-step MTP (the blog's closing direction "自适应多步 MTP"). The MTP head proposes T1..Tg by
chaining, g chosen per round and per request by its own confidence; the drafter proposes the rest of the block in one
parallel pass, conditioned on the g given tokens and on the MTP hidden that predicted T1.

One fixed-shape block, whatever g (0 <= g <= G = `max_given`):

    [A:a, G_1:a+1 .. G_G:a+G, M:a+G+1 .. M:a+7]      G_j = (j == 1: E(T1) + W[RMS_e(E(T1)) ; RMS_m(sg h_MTP)],
                                                           as zero_init_residual;  j > 1: E(T_j))   for j <= g
                                                     G_j = M                                        for j > g

Every slot past g predicts (T_{g+1}..T_7); the round's drafts are T1..Tg from the chain, then the drafter's. g = 0 is
the drafter's own first token (a DFlash block), as legal a choice as g = G. Training draws g per anchor
(`base.given_counts`; the given tokens are the data's, teacher-forced, as T1 is for every DMTP variant) and puts
the loss on the slots after it. Decoding runs the MTP chain for G steps and chooses g per request: the leading
steps whose top probability (softmax at T = 1, read before the step's token is drawn) is at least `threshold`, then
one drafter pass (`DrafterMethod`; run names `given-p0.8` and `given-g2` decode with another threshold or a fixed
count: `engine.methods.split_rule`). g depends only on tokens drawn before the slot it decides, so speculative
sampling stays exact with q_j the chain's law at slots j <= g and the drafter's after (`verify.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dmtp.checks import at_least, check, require
from dmtp.models.variants.base import Fuse, Layout, Variant, register


@dataclass
class GivenConfig:
    max_given: int = 3  # G: the most tokens the MTP chain gives a block (training draws g in 0..G per anchor)
    threshold: float = 0.6  # decoding: chain while the MTP's top probability is at least this (0: always G tokens;
    # above 1: none, the drafter's own block)

    def __post_init__(self):
        check(self, max_given=at_least(1))
        require(isinstance(self.threshold, (int, float)) and not isinstance(self.threshold, bool)
                and self.threshold >= 0, f"given.threshold={self.threshold!r}: expected a probability >= 0 (above 1: "
                "the MTP gives no token)")


@register
class Given(Variant):
    """[A, G_1..G_G, M...]: the first g slots the MTP chain's tokens (the first fused as zero_init_residual's), g per
    block; every slot after g predicts."""

    name = "given"
    description = "adaptive multi-step MTP: T1..Tg from the MTP chain (g per round by its confidence), the rest drafted"
    anchor, t1 = True, True
    Config = GivenConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        require(self.config.max_given < cfg.block_size - 1, f"variant 'given': max_given={self.config.max_given} "
                f"leaves the drafter no slot of its block of {cfg.block_size - 1} candidates")
        self.fuse = Fuse(cfg.hidden_size, cfg.rms_norm_eps, zero_init=True)

    def reset_parameters(self):
        self.fuse.reset_parameters()

    def layout(self, num_candidates: int) -> Layout:
        most = (self.config if isinstance(self, Variant) else self.Config()).max_given  # the class: its default
        kinds = ("A",) + ("G",) * most + ("M",) * (num_candidates - most)
        return Layout(kinds, tuple(range(len(kinds))))

    def block(self, e_anchor, e_t1, h_mtp, e_mask, num_candidates: int, given=None) -> torch.Tensor:
        """e_t1 [..., n, H]: E(T_1..T_n) of the chain (n <= G: a shorter chain gives fewer); given [...]: g <= n."""
        lay = self.layout(num_candidates)
        m = e_mask.expand_as(e_anchor)
        first = e_t1[..., 0, :]
        toks = [first + self.fuse(first, h_mtp.detach())] + list(e_t1[..., 1:, :].unbind(-2))  # sg: as every variant
        parts = [e_anchor]
        for j in range(lay.given):
            parts.append(torch.where((given > j)[..., None], toks[j], m) if j < len(toks) else m)
        parts += [m] * (lay.slots - len(parts))
        return torch.stack(parts, dim=-2)
