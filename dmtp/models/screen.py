"""Screened T1 head: a cheap pass over the vocabulary, then exact rescoring of the survivors (seed §6.5's plan).

T1 = argmax_v W_v·h needs the whole output matrix W [V, H] every round — at a 152 K vocabulary and width 4096 that
is 1.2 GB of bf16 read per round, about 0.3 ms on an H200, as much as a whole MTP layer. The screen reads a rank-r
factorisation W ≈ A B instead (A [V, r], B [r, H], from a randomised SVD of W), keeps the top-k screened tokens,
and rescores them exactly with their own rows of W. T1 is exact whenever the true argmax survives the screen; when it
does not, T1 is just a different candidate — verification keeps decoding lossless either way. `bench` measures how
often T1 changes and what it does to first-token acceptance.

    screen = T1Screen(target, rank=256, topk=64)
    method = build_method("zero_init_residual", target, drafter=d, mtp=m, screen=screen)
"""
from __future__ import annotations

import torch


class T1Screen:
    def __init__(self, target, rank: int = 256, topk: int = 64, seed: int = 0):
        W = target.model.lm_head.weight.detach()
        if getattr(target.model.lm_head, "bias", None) is not None:
            raise NotImplementedError("screened T1 head: LM heads with a bias are not supported")
        V, H = W.shape
        if not 0 < rank < min(V, H) or not 0 < topk <= V:
            raise ValueError(f"screen rank {rank} must be in (0, {min(V, H)}) and topk {topk} in (0, {V}]")
        torch.manual_seed(seed)
        U, S, Vh = torch.svd_lowrank(W.float(), q=rank, niter=4)
        self.A = (U * S).to(W.dtype).contiguous()  # [V, r]
        self.B = Vh.T.to(W.dtype).contiguous()  # [r, H]
        self.W, self.topk, self.rank = W, topk, rank

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> T1 [N]: top-k of the rank-r scores, rescored exactly."""
        h = h.to(self.W.dtype)
        cand = ((h @ self.B.T) @ self.A.T).topk(self.topk, -1).indices  # [N, k]
        exact = torch.einsum("nh,nkh->nk", h.float(), self.W[cand].float())
        return cand.gather(1, exact.argmax(-1, keepdim=True))[:, 0]
