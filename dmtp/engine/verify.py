"""Verification of a round's drafts at T > 0: target-only, token-wise speculative sampling, block verification.

Notation for one round (a request at anchor A, drafts x_1..x_k, k = the method's candidates):
    p_i = the target's tempered distribution of the token after [A, x_1..x_i]   i = 0..k  (one verify forward)
    q_i = the distribution x_{i+1} was drawn from                               i = 0..k-1
The loop emits x_1..x_n and one more token y (correction, or bonus when n = k); `accepted` records n.

    target   drafts are argmaxes; the target samples y_i ~ p_i at every position, n = the longest prefix with
             x_{i+1} = y_i (METHOD.md). Exact for any drafts; accepts x_{i+1} with probability p_i(x_{i+1}).
    sample   token-wise speculative sampling (Leviathan et al. 2023, Chen et al. 2023): x_{i+1} ~ q_i; accept it
             with probability min(1, p_i(x)/q_i(x)) until the first rejection; at the rejected position draw y from
             the residual (p_i - q_i)+ / sum (p_i - q_i)+, after k acceptances the bonus y ~ p_k. Acceptance
             probability per position: 1 - TV(p_i, q_i), up to 1 where the target is uncertain.
    block    block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025):
             the same drafts, the longest prefix accepted jointly:
                 b_0 = 1,  b_i = min(1, b_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i))                i = 1..k
                 r_i = sum_v (b_i p_i(v) - q_i(v))+                                           i = 1..k-1
                 h_i = r_i / (r_i + 1 - b_i)  (i < k),   h_k = b_k
                 n   = max{i : eta_i < h_i} (0 if none), eta_i ~ U[0, 1) independent     (NOT stopped at a failure)
                 y   ~ (b_n p_n - q_n)+ normalised (n < k; n = 0 is the token-wise residual),  y ~ p_k (n = k)

Why both are exact (tests/test_verify.py checks it numerically). Write D_i(s) = P(the emitted tokens,
continued by the target's own samples, start with s_1..s_i, and n < i); Q(s_{<=i}) = prod_j q_{j-1}(s_j).
  - Block: P(n >= i | x_{<=i}) = b_i. True at i = k (h_k = b_k); for i < k, P(n >= i+1 | x_{<=i}) =
    sum_v q_i(v) min(1, b_i p_i(v)/q_i(v)) = sum_v min(q_i, b_i p_i) = b_i - r_i, and
    h_i + (1 - h_i)(b_i - r_i) = b_i with h_i as above. So P(n = i | x_{<=i}) = r_i, and with the residual
    P(n = i, y = v | x_{<=i}) = (b_i p_i(v) - q_i(v))+. Then for v = s_{i+1}:
        P(start s_{<=i+1}) = Q(s_{<=i}) [min(q_i(v), b_i p_i(v)) + (b_i p_i(v) - q_i(v))+] + D_i(s) p_i(v)
                           = [Q(s_{<=i}) b_i + D_i(s)] p_i(v) = p(s_{<=i}) p_i(v)   (induction from b_0 = 1, D_0 = 0)
  - Token-wise: the same with b_i replaced by prod_{j<=i} min(1, p_{j-1}(x_j)/q_{j-1}(x_j)) and the residual
    weighted by it, i.e. (p_i - q_i)+ times the prefix's acceptance probability.
  - Never worse: b_i >= the token-wise product (induction: min(1, b r) >= min(1, r) * b' when b >= b', b' <= 1), and
    E[n] = sum_i E[P(n >= i | x_{<=i})]. Sun et al. prove it optimal among verifiers that see p and q on the path;
    their two-token example (vocab {a, b}, p = (1/3, 2/3), q = (2/3, 1/3), k = 2) gives E[n] = 10/9 vs 11/9.
What the argument needs of q_i: the conditional law of x_{i+1} given everything already drawn (the context, x_{<=i})
is exactly q_i — q_i may depend on anything known before x_{i+1} is drawn, and on nothing drawn later. Each drafter
qualifies (docs/DESIGN.md, "Verification at T > 0"): MTP chained steps and the DFlash2 path walk condition on the
previous sampled token; the DFlash drafter's one parallel pass gives q_i that depend on the block input only.

At T = 0 every mode is the target-only rule (drafts argmax, accept on equality): the three coincide exactly there.
Randomness: exponential races (argmax w / E, E ~ Exp(1) i.i.d., picks v with probability w_v / sum w) and
uniforms drawn on the batch's generator into persistent buffers before each round (`Draw.refill`, eager); the
drafting stages and `Draw.accept` read them in place, so they run inside the CUDA graphs without a host sync.
"""
from __future__ import annotations

import torch

from dmtp.config import VERIFY_MODES


def check(verify: str) -> str:
    if verify not in VERIFY_MODES:
        raise ValueError(f"unknown verify mode {verify!r}; modes: {', '.join(VERIFY_MODES)}")
    return verify


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in fp32."""
    return torch.softmax(logits.float() / temperature, -1)


def race(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Index v with probability w_v / sum w (any non-negative weights, unnormalised): argmax w / E, E ~ Exp(1)."""
    return (weights / noise).argmax(-1)


def accept(mode: str, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor,
           noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (`sample`) or block verification (`block`) of drafts x [B, k] drawn from q [B, k, V]
    against the target's p [B, k+1, V]; u [B, k] ~ U[0, 1), noise [B, V] ~ Exp(1). Returns (y [B, k+1], n [B]):
    y_i = x_{i+1} for i < n, y_n the residual (or bonus) token; positions past n are scratch."""
    B, k = x.shape
    V = p.shape[-1]
    if k == 0:  # nothing drafted (ar): the bonus y_0 ~ p_0
        return race(p[:, 0], noise)[:, None], torch.zeros(B, dtype=torch.long, device=x.device)
    ar = torch.arange(1, k + 1, device=x.device)
    px = p[:, :k].gather(-1, x[..., None])[..., 0]  # p_{i-1}(x_i), i = 1..k
    qx = q.gather(-1, x[..., None])[..., 0].clamp(min=1e-30)  # q_{i-1}(x_i) > 0: x_i was drawn from q_{i-1}
    ratio = px / qx
    if mode == "sample":
        ok = (u < ratio).long()  # accepted with probability min(1, p/q)
        n = ok.cumprod(1).sum(1)  # up to the first rejection
        w = torch.ones(B, device=x.device)  # residual (p_n - q_n)+
    elif mode == "block":
        b, prev = [], torch.ones(B, device=x.device)
        for i in range(k):  # b_i = min(1, b_{i-1} p/q)
            prev = torch.clamp(prev * ratio[:, i], max=1.0)
            b.append(prev)
        b = torch.stack(b, 1)  # [B, k]
        r = (b[:, : k - 1, None] * p[:, 1:k] - q[:, 1:k]).clamp(min=0).sum(-1)  # r_i, i = 1..k-1
        den = r + 1 - b[:, : k - 1]
        h = torch.where(den > 0, r / den.clamp(min=1e-30), torch.zeros_like(r))  # r = 0, b = 1: any h is exact
        h = torch.cat([h, b[:, k - 1:]], 1)  # h_k = b_k
        n = torch.where(u < h, ar, 0).amax(1)  # the LAST i that passes, not the first failure
        w = torch.cat([torch.ones(B, 1, device=x.device), b], 1).gather(1, n[:, None])[:, 0]  # b_n, b_0 = 1
    else:
        raise ValueError(f"accept() is for the modes sample and block, not {mode!r}")
    # y from (w p_n - q_n)+ with q_k := 0, so n = k draws from p_k (the bonus); all-zero residual (p_n = q_n up to
    # rounding, a rejection of probability ~0): p_n
    qz = torch.cat([q, q.new_zeros(B, 1, V)], 1)
    idx = n[:, None, None].expand(B, 1, V)
    pn, qn = p.gather(1, idx)[:, 0], qz.gather(1, idx)[:, 0]
    res = (w[:, None] * pn - qn).clamp(min=0)
    res = torch.where(res.sum(-1, keepdim=True) > 0, res, pn)
    yn = race(res, noise)
    y = torch.cat([x, x.new_zeros(B, 1)], 1)
    y = torch.where(torch.arange(k + 1, device=x.device)[None] == n[:, None], yn[:, None], y)
    return y, n


class Draw:
    """How a batch's method picks its drafts and how the batch verifies them. `sampling` (verify sample or block
    at T > 0): drafts are samples of the tempered proposal, and their distributions are kept in `q` [B, k, V] for
    `accept`; otherwise drafts are argmaxes and the batch verifies target-only. Buffers are allocated on the first
    `refill` (before any stage is captured) and only updated in place after."""

    def __init__(self, verify: str = "target", temperature: float = 0.0, gen: torch.Generator | None = None):
        self.verify, self.temperature, self.gen = check(verify), temperature, gen
        self.sampling = verify != "target" and temperature > 0
        self.q = self.noise = self.u = self.last = None

    def refill(self, batch: int, k: int, vocab: int, device):
        """Fresh randomness for one round (eager, on the batch's generator; no host sync)."""
        if self.noise is None:
            self.noise = torch.empty(batch, max(k, 1), vocab, device=device)  # races of the k drafts
            self.q = torch.zeros(batch, k, vocab, device=device)  # their proposal distributions (written by stages)
            self.u = torch.empty(batch, k, device=device)  # acceptance uniforms / eta
            self.last = torch.empty(batch, vocab, device=device)  # the race of the residual / bonus token
        self.noise.exponential_(generator=self.gen)
        self.u.uniform_(generator=self.gen)
        self.last.exponential_(generator=self.gen)

    def buffers(self) -> list[torch.Tensor]:
        return [t for t in (self.noise, self.q, self.u, self.last) if t is not None]

    def pick(self, logits: torch.Tensor, pos: int) -> torch.Tensor:
        """Draft tokens at draft positions pos.. (logits [B, V] for one, [B, P, V] for P of them): argmax, or a
        sample of softmax(logits / T) whose distribution is kept in q[:, pos..]."""
        if not self.sampling:
            return logits.argmax(-1)
        probs = tempered(logits, self.temperature)
        if logits.dim() == 2:
            self.q[:, pos].copy_(probs)
            return race(probs, self.noise[:, pos])
        P = logits.shape[1]
        self.q[:, pos: pos + P].copy_(probs)
        return race(probs, self.noise[:, pos: pos + P])

    def walk(self, selector, logits: torch.Tensor, hid: torch.Tensor, prev: torch.Tensor, pos: int) -> torch.Tensor:
        """The DFlash2 path selector as a sampler: slot j draws from softmax(score(prev, c) / T) over its top-k
        candidates c (zero elsewhere), prev = the token just drawn — an autoregressive proposal, exact under
        `accept` (module docstring). At T -> 0 it is the greedy walk. logits [B, P, V], hid [B, P, H]."""
        out = []
        for j in range(logits.shape[1]):
            s, cand = selector.scores(logits[:, j], hid[:, j], prev)  # [B, K] log-scores, candidates
            probs = torch.softmax(s / self.temperature, -1)
            prev = cand.gather(-1, race(probs, self.noise[:, pos + j, : cand.shape[-1]])[:, None])[:, 0]
            self.q[:, pos + j].zero_().scatter_(-1, cand, probs)
            out.append(prev)
        return torch.stack(out, 1)

    def accept(self, logits: torch.Tensor, cands: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(y [B, k+1], n [B]) from the verify logits [B, k+1, V] and the drafts [B, k] (a capturable stage)."""
        p = tempered(logits, self.temperature)
        return accept(self.verify, p, self.q, cands, self.u, self.last)
