"""`mtp`: the target's native MTP head as the drafter (chained k steps), and the MTP state every method that drafts
T1 from the MTP keeps (`MTPState`: its private KV cache and the hidden that predicts the next T1)."""
from __future__ import annotations

from pathlib import Path

import torch

from dmtp.config import EngineConfig
from dmtp.engine import verify as V
from dmtp.engine.methods.base import Method, register_method
from dmtp.models import fast
from dmtp.models.cache import KVCache
from dmtp.models.mtp import MTPHead



def tuned_head(target, path: Path):
    """The MTP head trained with a drafter (`Variant.trains_mtp`), from its checkpoint folder's mtp.safetensors."""
    if not (path / "mtp.safetensors").exists():
        raise FileNotFoundError(f"drafter checkpoint {path}: no mtp.safetensors (its variant trains the MTP head and "
                                "saves it there)")
    return MTPHead.load(target, path)

class MTPState:
    """Private MTP KV cache and h = the MTP hidden g at position a-1 (the one that predicts the next T1), kept in
    place. T1 = argmax LMHead(h) (or a sample, `verify.Draw`) is computed where it is used (`t1_head`), kept in `t1`."""

    def __init__(self, head, batch, capacity, screen=None, draw: V.Draw | None = None, engine="hf",
                 eng: EngineConfig | None = None):
        own = engine != "hf" and fast.layer_problem(head.layers[0]) is None
        self.head, self.cache, self.screen = head, KVCache(batch, capacity, fast=own), screen
        self.eng = eng or EngineConfig()
        self.draw = draw or V.Draw()
        self.h = None  # [B, H]
        self.t1 = None  # [B]

    def step(self, emb_next, hidden, pos):
        """The MTP layer over decode rows: the compiled engine's forward on a cache it reads, else the HF layer's."""
        if self.cache.fast:
            return fast.mtp_forward(self.head, emb_next, hidden, pos, self.cache, self.eng)
        return self.head(emb_next, hidden, pos, self.cache)

    def t1_head(self, h):
        """T1 from h: the target's LM head and argmax (a sample when drafting by sampling), or the screened head
        (`screen.T1Screen`) when set."""
        t1 = self.draw.pick(self.head.target.lm_head(h), 0) if self.screen is None else self.screen(h)
        self.t1.copy_(t1)
        return self.t1

    @torch.no_grad()
    def prefill(self, ids, plen, anchor, hidden):
        """Positions 0..P-1 consume E(x_1..x_{P-1}, A) and h^L_0..h^L_{P-1}. Returns g [B, Pmax, H]."""
        B, T = ids.shape
        nxt = torch.cat([ids[:, 1:], ids[:, :1]], 1).clone()
        nxt[torch.arange(B, device=ids.device), plen - 1] = anchor  # no host index: capturable
        pos = torch.arange(T, device=ids.device)[None].expand(B, T)
        g = self.head(self.head.target.embed(nxt), hidden, pos, self.cache)
        self.h = g[torch.arange(B, device=g.device), plen - 1].clone()
        self.t1 = anchor.clone()
        return g

    @torch.no_grad()
    def advance(self, lens, emitted, hidden, n_acc):
        """Rows at a..a+k consume the committed stream x_{a+1..} = y_0..y_k and h^L_a..h^L_{a+k}; rows past n are
        scratch (overwritten before anything can see them). Keeps h = g at row n. Returns g [B, k+1, H]."""
        r = emitted.shape[1]
        pos = lens[:, None] + torch.arange(r, device=lens.device)
        g = self.step(self.head.target.embed(emitted), hidden, pos)
        self.h.copy_(g[torch.arange(g.shape[0], device=g.device), n_acc])
        return g

    def absorb(self, dst, other: "MTPState", src):
        self.cache.copy_rows(other.cache, dst, src)
        self.h[dst], self.t1[dst] = other.h[src], other.t1[src]

    @torch.no_grad()
    def chain(self, lens, k, confidence: bool = False):
        """MTP-k: T1 from h, then k-1 chained steps feeding g back as the hidden (tentative rows at a..); each step
        consumes the token just drafted (argmax, or its sample: the chain is an autoregressive proposal).
        `confidence`: also each step's top probability [B, k] (softmax of its logits at T = 1, which depends only on
        the tokens drawn before the step; T1 then through the full LM head, not a screen) for `given`'s rule."""
        if confidence:
            logits = self.head.target.lm_head(self.h)
            tok = self.t1.copy_(self.draw.pick(logits, 0))
            conf = [torch.softmax(logits.float(), -1).amax(-1)]
        else:
            tok = self.t1_head(self.h)
        cands, g = [tok.clone()], self.h
        for j in range(1, k):
            pos = (lens + j - 1)[:, None]
            g = self.step(self.head.target.embed(tok[:, None]), g[:, None], pos)[:, 0]
            logits = self.head.target.lm_head(g)
            tok = self.draw.pick(logits, j)
            cands.append(tok)
            if confidence:
                conf.append(torch.softmax(logits.float(), -1).amax(-1))
        return (torch.stack(cands, 1), torch.stack(conf, 1)) if confidence else torch.stack(cands, 1)


@register_method
class MTPMethod(Method):
    """MTP-k: T1 from the MTP hidden, then k-1 steps of the MTP layer chained on its own drafts (MTP415: k = 4)."""
    name = "mtp"
    uses_mtp_steps = True

    def __init__(self, head, k=4, screen=None, label: str | None = None):
        self.k, self.head, self.screen = k, head, screen
        if label:
            self.name = label

    @classmethod
    def needs_mtp(cls, drafter=None):
        return True

    @classmethod
    def build(cls, name, target, drafter=None, mtp=None, mtp_steps=4, screen=None, label=None):
        if mtp is None:
            raise ValueError("method 'mtp' needs the target's native MTP head")
        return cls(mtp, mtp_steps, screen, label)

    @classmethod
    def load(cls, run, target, mtp=None, drafters=None, mtp_steps=4, screen=None, label=None):
        """`mtp`, or `mtp.<run>`: MTP-k with the head trained beside run <run>'s drafter (`zero_init_residual_joint`:
        <drafters>/<run>/drafter/mtp.safetensors), the control of what tuning the head buys."""
        own = run.partition(".")[2]
        if own:
            if drafters is None:
                raise ValueError(f"method {run!r} needs a drafters folder (<drafters>/{own}/drafter)")
            mtp = tuned_head(target, Path(drafters) / own / "drafter")
        return cls.build(run, target, mtp=mtp, mtp_steps=mtp_steps, screen=screen, label=label or run)

    def limit(self, drafts):
        """MTP-k with k = `drafts` (`mtp-k3` = `--mtp-steps 3`): the chain's first `drafts` steps."""
        if not isinstance(drafts, int) or drafts < 1:
            raise ValueError(f"method {self.name!r}: drafts must be a whole number >= 1, got {drafts!r}")
        self.k = drafts
        return self

    def compiles(self, eng):
        return fast.layer_problem(self.head.layers[0]) is None

    def prefill(self, st, ids, plen, out):
        self.mtp = MTPState(self.head, ids.shape[0], st.capacity, self.screen, self.draw, st.engine, st.eng)
        self.mtp.prefill(ids, plen, st.anchor, out.hidden)

    def propose(self, st):  # the chained MTP is this method's drafter
        return self.run("drafter", lambda lens: self.mtp.chain(lens, self.k), st.lens)

    def commit(self, st, out, emitted, n_acc):
        self.run("mtp", self.mtp.advance, st.lens, emitted, out.hidden, n_acc)

    def absorb(self, dst, other, src):
        self.mtp.absorb(dst, other.mtp, src)
