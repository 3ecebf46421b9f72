"""DFlash and every DMTP injection variant: one method class for all of them, the variant (the drafter checkpoint's,
registered by name in dmtp/models/variants/) deciding the block, the context and whether the MTP is involved."""
from __future__ import annotations

from pathlib import Path

import torch

from dmtp.engine.methods.base import Method
from dmtp.engine.methods.mtp import MTPState, tuned_head
from dmtp.models import fast
from dmtp.models.cache import KVCache
from dmtp.models.drafter import Drafter, check_compatible
from dmtp.models.variants import get_variant


class DrafterMethod(Method):
    """DFlash and every DMTP variant: the variant decides the block and whether the MTP is involved."""
    needs_drafter = True

    def __init__(self, drafter, target, head=None, screen=None, label: str | None = None):
        head = drafter.mtp_head if drafter.mtp_head is not None else head  # a head trained with the drafter
        self.drafter, self.target, self.head, self.screen = drafter, target, head, screen
        self.var = drafter.injection
        self.name = label or self.var.name
        self.k = drafter.config.num_candidates
        self.taps = drafter.config.target_layer_ids
        if self.var.needs_mtp and head is None:
            raise ValueError(f"variant {self.var.name!r} needs the target's native MTP head")
        lay = self.var.layout(self.k)
        self.offsets = torch.tensor(lay.offsets)
        self.predict = torch.tensor(lay.predict)
        self.chained = lay.given > 0  # the variant lays out given slots: the MTP chain gives T1..Tg (`given`)
        self.most = lay.given  # the chain's steps per round, and the most it gives (`rule`)
        self.threshold = self.var.config.threshold if self.chained else None  # its count rule (`rule`)
        if self.chained and (screen is not None or drafter.config.backbone != "dflash"):
            raise ValueError(f"variant {self.var.name!r} reads the MTP's full distribution and walks no path: "
                             "no screened T1 head, the dflash backbone only")

    @classmethod
    def needs_mtp(cls, drafter=None):
        """The variant's need (`Variant.needs_mtp`; before its checkpoint is read: assumed)."""
        return drafter is None or drafter.injection.needs_mtp

    @classmethod
    def build(cls, name, target, drafter=None, mtp=None, mtp_steps=4, screen=None, label=None):
        get_variant(name)  # an unknown name fails here with the list of known ones
        if drafter is None:
            raise ValueError(f"method {name!r} needs --drafter")
        if drafter.config.variant != name:
            raise ValueError(f"drafter was built as variant {drafter.config.variant!r}, not {name!r}")
        check_compatible(drafter, target)
        return cls(drafter, target, mtp, screen, label)

    @classmethod
    def load(cls, run, target, mtp=None, drafters=None, mtp_steps=4, screen=None, label=None):
        """The trained drafter of `run` (`<drafters>/<run>/drafter`, e.g. `zero_init_residual_from_dflash`: its config
        names the variant), in the target's precision."""
        if drafters is None:
            raise ValueError(f"method {run!r} needs a drafters folder (<drafters>/{run}/drafter)")
        path = Path(drafters) / run / "drafter"
        d = Drafter.load(path, device=target.device, dtype=target.dtype).eval()
        if d.injection.trains_mtp:  # the head trained with it (`zero_init_residual_joint`), saved beside
            d.mtp_head = tuned_head(target, path)
        return cls.build(d.config.variant, target, drafter=d, mtp=mtp, screen=screen, label=label or run)

    def limit(self, drafts):
        """Verify the first `drafts` of the block's candidates (`zero_init_residual-k4`): the drafter still runs its
        whole block in one pass (it was trained on it), the LM head and the draw read only the slots kept, and the
        verify forward carries drafts + 1 rows per request. A DMTP variant's first draft is T1 from the MTP, so it
        keeps at least one of the drafter's (drafts >= 2; `mtp-k1` is T1 alone)."""
        full, low = self.drafter.config.num_candidates, 1 + int(self.var.t1 and not self.chained)
        if not isinstance(drafts, int) or not low <= drafts <= full:
            raise ValueError(f"method {self.name!r}: drafts must be a whole number in [{low}, {full}] (its drafter "
                             f"proposes {full} candidates{', the first T1 from the MTP' if self.var.t1 else ''}), "
                             f"got {drafts!r}")
        self.k = drafts
        return self

    def rule(self, threshold: float | None = None, most: int | None = None):
        """How a variant with given slots (`given`) chooses its count g per round: the leading MTP chain steps whose
        top probability is at least `threshold`, at most `most` (<= the trained G; the chain runs `most` steps). A
        fixed count n is threshold 0 with most n (run name `<run>-g<n>`; `<run>-p<t>`: threshold t)."""
        if not self.chained:
            raise ValueError(f"method {self.name!r}: its variant {self.var.name!r} takes no count of MTP-given tokens "
                             "(a -p<threshold> / -g<count> run name is for the variant 'given')")
        top = self.var.layout(self.drafter.config.num_candidates).given
        if most is not None and not (isinstance(most, int) and 0 <= most <= top):
            raise ValueError(f"method {self.name!r}: a given count must be a whole number in [0, {top}] (its "
                             f"drafter was trained with at most {top} given tokens), got {most!r}")
        if threshold is not None and not threshold >= 0:
            raise ValueError(f"method {self.name!r}: threshold {threshold!r}: expected a probability >= 0")
        self.threshold = self.threshold if threshold is None else float(threshold)
        self.most = self.most if most is None else most
        return self

    def compiles(self, eng):
        return fast.drafter_problem(self.drafter, eng) is None and (
            not self.var.needs_mtp or fast.layer_problem(self.head.layers[0]) is None)

    @property
    def graphable(self):
        """The drafter's own flex-attention backend builds its block mask with torch.compile (not inside a CUDA graph);
        the compiled engine's drafter (a context cache read by `fast.py`) builds it from tensors."""
        return self.drafter.config.attn_backend == "sdpa" or getattr(getattr(self, "ctx", None), "fast", False)

    def _write_ctx(self, taps, g, lens):
        pos = lens[:, None] + torch.arange(taps.shape[1], device=lens.device)
        f = self.drafter.context(taps, g)
        self.ctx.write_pos = pos
        for i, (k, v) in enumerate(self.drafter.context_kv(f, pos)):
            self.ctx.update(k, v, i)

    @torch.no_grad()
    def prefill(self, st, ids, plen, out):
        B, T = ids.shape
        dev = ids.device
        self.eng = st.eng
        own = st.engine != "hf" and fast.drafter_problem(self.drafter, st.eng) is None
        self.ctx = KVCache(B, st.capacity, fast=own)
        self.offsets, self.predict = self.offsets.to(dev), self.predict.to(dev)
        if getattr(self, "mask_id", None) is None or self.mask_id.device != dev:  # a host copy: once (capturable)
            self.mask_id = torch.tensor([self.drafter.config.mask_token_id], device=dev)
        g = None
        if self.var.needs_mtp:
            self.mtp = MTPState(self.head, B, st.capacity, self.screen, self.draw, st.engine, st.eng)
            g = self.mtp.prefill(ids, plen, st.anchor, out.hidden)
        self._write_ctx(out.taps, g, torch.zeros_like(plen))

    def _block(self, anchor, h=None):
        """Block embeddings [B, S, H]; DMTP variants: T1 head + embeddings + the variant's fusion of E(T1), h."""
        tgt, d = self.target, self.drafter
        e_t1 = tgt.embed(self.mtp.t1_head(h)) if self.var.t1 else None
        return d.block(tgt.embed(anchor), e_t1, h if self.var.t1 else None, tgt.embed(self.mask_id)[0])

    def _draft(self, block, lens, prev):
        d, tgt = self.drafter, self.target
        bpos = lens[:, None] + self.offsets
        if self.ctx.fast:  # the compiled engine's drafter: the block's K/V go into the context cache at bpos
            hid = fast.drafter_forward(d, block, bpos, self.ctx, lens, self.eng)[:, self.predict]
        else:
            ctx = [(self.ctx.k[i], self.ctx.v[i]) for i in range(len(d.layers))]
            hid = d(block, bpos, ctx, lens[:, None])[:, self.predict]  # predicting slots
        pos = int(self.var.t1 and not self.chained)  # draft position of the first predicting slot
        hid = hid[:, : self.k - pos]  # the slots of the drafts verified (all of them unless `limit`ed)
        logits = d.logits(tgt.lm_head(hid))
        if not self.draw.sampling:
            return d.select(logits, hid, prev)  # argmax, or the DFlash2 path walked from A / T1
        # samples: every slot from the one parallel pass (q_j depends on the block input only), or the DFlash2 walk
        return self.draw.pick(logits, pos) if d.selector is None else self.draw.walk(d.selector, logits, hid, prev, pos)

    def _chain(self, lens):
        """The MTP chain's `most` tokens [B, most], the count g [B] of its leading steps at least as confident as the
        threshold, and (drafting by sampling) the chain's proposal laws q [B, most, V], which the drafter's pass
        overwrites in `draw.q` before `_draft_given` takes them back for the slots the chain gave."""
        toks, conf = self.mtp.chain(lens, self.most, confidence=True)
        count = (conf >= self.threshold).long().cumprod(1).sum(1)
        return toks, count, *((self.draw.q[:, : self.most].clone(),) if self.draw.sampling else ())

    def _given_block(self, anchor, h, toks=None, count=None):
        tgt = self.target
        if toks is None:  # no chain (a count of 0): every given slot MASK
            toks, count = anchor[:, None], torch.zeros_like(anchor)
        return self.drafter.block(tgt.embed(anchor), tgt.embed(toks), h, tgt.embed(self.mask_id)[0], count)

    def _draft_given(self, block, lens, anchor, toks, count, *q):
        """Every slot drafted in one pass, then T_j = the chain's token where j <= g (its law in q where sampling)."""
        pred = self._draft(block, lens, anchor)
        n = min(self.most, pred.shape[1])
        mine = torch.arange(n, device=count.device)[None] < count[:, None]  # [B, n] slots the chain gave
        if q:
            self.draw.q[:, :n].copy_(torch.where(mine[..., None], q[0][:, :n], self.draw.q[:, :n]))
        return torch.cat([torch.where(mine, toks[:, :n], pred[:, :n]), pred[:, n:]], 1)

    def _propose_given(self, st):
        """T1..Tg from the MTP chain (g per request by its confidence), the rest of the block in one drafter pass."""
        if not self.most:  # a count of 0 (`-g0`): the drafter's own block, the chain not run
            block = self.run("t1_prep", self._given_block, st.anchor, self.mtp.h)
            return self.run("drafter", self._draft, block, st.lens, st.anchor)
        toks, count, *q = self.run("mtp_chain", self._chain, st.lens)
        block = self.run("t1_prep", self._given_block, st.anchor, self.mtp.h, toks, count)
        return self.run("drafter", self._draft_given, block, st.lens, st.anchor, toks, count, *q)

    @torch.no_grad()
    def propose(self, st):
        if self.chained:
            return self._propose_given(st)
        if not self.var.t1:  # DFlash: the block (A + mask embeddings) is built inside the drafter stage
            return self.run("drafter", lambda a, lens: self._draft(self._block(a), lens, a), st.anchor, st.lens)
        block = self.run("t1_prep", self._block, st.anchor, self.mtp.h)
        pred = self.run("drafter", self._draft, block, st.lens, self.mtp.t1)
        return torch.cat([self.mtp.t1[:, None], pred], 1)

    @torch.no_grad()
    def commit(self, st, out, emitted, n_acc):
        g = self.run("mtp", self.mtp.advance, st.lens, emitted, out.hidden, n_acc) if self.var.needs_mtp else None
        if g is None:
            self.run("drafter_ctx", lambda taps, lens: self._write_ctx(taps, None, lens), out.taps, st.lens)
        else:
            self.run("drafter_ctx", self._write_ctx, out.taps, g, st.lens)

    def absorb(self, dst, other, src):
        self.ctx.copy_rows(other.ctx, dst, src)
        if self.var.needs_mtp:
            self.mtp.absorb(dst, other.mtp, src)
