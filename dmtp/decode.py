"""One decode loop for every method: `ar`, `mtp` (chained native MTP, k steps), `dflash` and each DMTP variant.

A round (SPEC §6), for a batch of requests each at its own anchor position a (A = last committed token, not yet fed):
    cands = method.propose()                       # [B, k] draft tokens T1..Tk (k = 0 for ar)
    y     = target([A, T1..Tk] at a..a+k)          # the target's own token at every position (argmax or sample)
    n     = longest prefix with T_j == y_{j-1}     # accepted drafts
    emit y_0..y_n                                  # = T1..Tn + correction (or bonus when n = k)
    method.commit(n)                               # advance MTP / drafter context over committed rows only
Every emitted token is the target's own choice given the committed prefix, so at T = 0 the output is the target's
greedy output and at T > 0 it is distributed exactly as the target's samples (target-only verification).

    results = generate(target, build_method("zero_init_residual", target, drafter=d, mtp=m), prompts, 0.0, 128)
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field

import torch

from .cache import KVCache


@dataclass
class Result:
    output_ids: list[int]
    accepted: list[int] = field(default_factory=list)  # accepted draft count of every verify round
    wall_s: float = 0.0  # from the batch's start until this request finished


@dataclass
class State:
    lens: torch.Tensor  # [B] positions the target has processed (= anchor position a)
    anchor: torch.Tensor  # [B] A, the last committed token
    done: torch.Tensor  # [B] bool


# --- native MTP state -------------------------------------------------------------------------------------------
def no_timer(stage: str):
    """Stage timer hook (`bench.StageTimer` replaces it): a context manager per named stage."""
    return contextlib.nullcontext()


class MTPState:
    """Private MTP KV cache; after each commit, caches h_MTP (the g that predicts the next T1) and T1 = argmax."""

    def __init__(self, head, batch, capacity, timer=no_timer):
        self.head, self.cache, self.timer = head, KVCache(batch, capacity), timer
        self.h = None  # [B, H] g at position a-1
        self.t1 = None  # [B]

    def _set_next(self, g_rows, row):
        with self.timer("t1_prep"):  # T1 head: the LM head over the cached MTP hidden
            b = torch.arange(g_rows.shape[0], device=g_rows.device)
            self.h = g_rows[b, row]
            self.t1 = self.head.target.lm_head(self.h).argmax(-1)

    @torch.no_grad()
    def prefill(self, ids, plen, anchor, hidden):
        """Positions 0..P-1 consume E(x_1..x_{P-1}, A) and h^L_0..h^L_{P-1}. Returns g [B, Pmax, H]."""
        B, T = ids.shape
        nxt = torch.cat([ids[:, 1:], ids[:, :1]], 1).clone()
        nxt[torch.arange(B), plen - 1] = anchor
        pos = torch.arange(T, device=ids.device)[None].expand(B, T)
        g = self.head(self.head.target.embed(nxt), hidden, pos, self.cache)
        self._set_next(g, plen - 1)
        return g

    @torch.no_grad()
    def advance(self, lens, emitted, hidden, n_acc):
        """Rows at a..a+k consume the committed stream x_{a+1..} = y_0..y_k and h^L_a..h^L_{a+k}; rows past n are
        scratch (overwritten before anything can see them). Returns g [B, k+1, H]."""
        r = emitted.shape[1]
        pos = lens[:, None] + torch.arange(r, device=lens.device)
        with self.timer("mtp"):
            g = self.head(self.head.target.embed(emitted), hidden, pos, self.cache)
        self._set_next(g, n_acc)
        return g

    def absorb(self, dst, other: "MTPState", src):
        self.cache.copy_rows(other.cache, dst, src)
        self.h[dst], self.t1[dst] = other.h[src], other.t1[src]

    @torch.no_grad()
    def chain(self, lens, k):
        """MTP-k: T1 from the cache, then k-1 chained steps feeding g back as the hidden (tentative rows at a..)."""
        cands, g, tok = [self.t1], self.h, self.t1
        for j in range(1, k):
            pos = (lens + j - 1)[:, None]
            g = self.head(self.head.target.embed(tok[:, None]), g[:, None], pos, self.cache)[:, 0]
            tok = self.head.target.lm_head(g).argmax(-1)
            cands.append(tok)
        return torch.stack(cands, 1)


# --- methods ----------------------------------------------------------------------------------------------------
class Method:
    name = "ar"
    k = 0  # candidates per round
    taps = None  # target layers the method needs
    timer = staticmethod(no_timer)  # stage timer (benchmarks set it)

    def prefill(self, st: State, ids, plen, out):
        pass

    def propose(self, st: State) -> torch.Tensor:
        return st.lens.new_zeros(st.lens.shape[0], 0)

    def commit(self, st: State, out, emitted, n_acc):
        pass

    def absorb(self, dst, other: "Method", src):
        """Take rows `src` of another batch's state of this method into rows `dst` (dynamic batching)."""


class MTPMethod(Method):
    def __init__(self, head, k=4):
        self.name, self.k, self.head = "mtp", k, head

    def prefill(self, st, ids, plen, out):
        self.mtp = MTPState(self.head, ids.shape[0], st.capacity, self.timer)
        self.mtp.prefill(ids, plen, st.anchor, out.hidden)

    def propose(self, st):
        with self.timer("drafter"):  # the chained MTP is this method's drafter
            return self.mtp.chain(st.lens, self.k)

    def commit(self, st, out, emitted, n_acc):
        self.mtp.advance(st.lens, emitted, out.hidden, n_acc)

    def absorb(self, dst, other, src):
        self.mtp.absorb(dst, other.mtp, src)


class DrafterMethod(Method):
    """DFlash and every DMTP variant: the variant decides the block and whether the MTP is involved."""

    def __init__(self, drafter, head=None):
        self.drafter, self.head = drafter, head
        self.var = drafter.injection
        self.name = self.var.name
        self.k = drafter.config.num_candidates
        self.taps = drafter.config.target_layer_ids
        if self.var.needs_mtp and head is None:
            raise ValueError(f"variant {self.name!r} needs the target's native MTP head")
        lay = self.var.layout(self.k)
        self.offsets = torch.tensor(lay.offsets)
        self.predict = torch.tensor(lay.predict)

    def _write_ctx(self, taps, g, pos):
        f = self.drafter.context(taps, g)
        self.ctx.write_pos = pos
        for i, (k, v) in enumerate(self.drafter.context_kv(f, pos)):
            self.ctx.update(k, v, i)

    @torch.no_grad()
    def prefill(self, st, ids, plen, out):
        B, T = ids.shape
        self.ctx = KVCache(B, st.capacity)
        g = None
        if self.var.needs_mtp:
            self.mtp = MTPState(self.head, B, st.capacity, self.timer)
            g = self.mtp.prefill(ids, plen, st.anchor, out.hidden)
        self._write_ctx(out.taps, g, torch.arange(T, device=ids.device)[None].expand(B, T))

    @torch.no_grad()
    def propose(self, st):
        d, tgt = self.drafter, self.drafter_target
        with self.timer("t1_prep"):  # embeddings + the variant's fusion of E(T1) and h_MTP
            h = self.mtp.h if self.var.t1 else None
            e_t1 = tgt.embed(self.mtp.t1) if self.var.t1 else None
            e_mask = tgt.embed(torch.tensor([d.config.mask_token_id], device=st.lens.device))[0]
            block = d.block(tgt.embed(st.anchor), e_t1, h, e_mask)  # [B, S, H]
        with self.timer("drafter"):
            bpos = st.lens[:, None] + self.offsets.to(st.lens.device)
            ctx = [(self.ctx.k[i], self.ctx.v[i]) for i in range(len(d.layers))]
            hid = d(block, bpos, ctx, st.lens[:, None])
            hid = hid[:, self.predict.to(hid.device)]  # predicting slots -> argmax, or the DFlash2 path from A / T1
            pred = d.select(tgt.lm_head(hid), hid, self.mtp.t1 if self.var.t1 else st.anchor)  # [B, #mask slots]
        return torch.cat([self.mtp.t1[:, None], pred], 1) if self.var.t1 else pred

    @torch.no_grad()
    def commit(self, st, out, emitted, n_acc):
        g = self.mtp.advance(st.lens, emitted, out.hidden, n_acc) if self.var.needs_mtp else None
        pos = st.lens[:, None] + torch.arange(emitted.shape[1], device=st.lens.device)
        with self.timer("drafter_ctx"):
            self._write_ctx(out.taps, g, pos)

    def absorb(self, dst, other, src):
        self.ctx.copy_rows(other.ctx, dst, src)
        if self.var.needs_mtp:
            self.mtp.absorb(dst, other.mtp, src)


def build_method(name: str, target, drafter=None, mtp=None, mtp_steps: int = 4) -> Method:
    if name == "ar":
        return Method()
    if name == "mtp":
        if mtp is None:
            raise ValueError("method 'mtp' needs the target's native MTP head")
        return MTPMethod(mtp, mtp_steps)
    from .variants import get_variant

    get_variant(name)  # unknown names fail here with the list of known ones
    if drafter is None:
        raise ValueError(f"method {name!r} needs --drafter")
    if drafter.config.variant != name:
        raise ValueError(f"drafter was built as variant {drafter.config.variant!r}, not {name!r}")
    from .drafter import check_compatible

    check_compatible(drafter, target)
    m = DrafterMethod(drafter, mtp)
    m.drafter_target = target
    return m


# --- the loop ---------------------------------------------------------------------------------------------------
def _pick(logits, temperature, gen):
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(probs.shape[:-1])


class Batch:
    """Requests decoding together: one target cache, one method state (a copy of `method`), one `State`.
    `generate` runs one batch to the end; `serve` keeps `cap` slots busy by prefilling newcomers as a batch of their
    own and moving their rows into the free slots (`absorb`)."""

    @torch.no_grad()
    def __init__(self, target, method: Method, prompts, temperature, max_new_tokens, eos, gen, capacity=None,
                 t0=None):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        dev = self.dev = target.device
        self.target, self.method = target, copy.copy(method)  # the copy holds this batch's MTP / drafter state
        self.temperature, self.max_new_tokens, self.eos, self.gen = temperature, max_new_tokens, eos, gen
        self.t0 = time.perf_counter() if t0 is None else t0
        B = len(prompts)
        plen = torch.tensor([len(p) for p in prompts], device=dev)
        T = int(plen.max())
        ids = torch.zeros(B, T, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p, device=dev)
        cap = capacity or T + max_new_tokens + 2 * (method.k + 1)
        self.cache = KVCache(B, cap)
        pos = torch.arange(T, device=dev)[None].expand(B, T)
        out = target.forward(ids, pos, self.cache, taps=method.taps, lengths=plen)  # lengths: padding stays out
        first = _pick(out.logits[torch.arange(B, device=dev), plen - 1], temperature, gen)  # of GDN states
        st = self.st = State(lens=plen.clone(), anchor=first, done=torch.zeros(B, dtype=torch.bool, device=dev))
        st.capacity = cap
        self.results = [Result([int(t)]) for t in first.tolist()]
        for b, r in enumerate(self.results):
            if r.output_ids[-1] in eos or max_new_tokens <= 1:
                st.done[b] = True
                r.wall_s = time.perf_counter() - self.t0
        self.method.prefill(st, ids, plen, out)
        self.ar = torch.arange(method.k + 1, device=dev)

    @property
    def finished(self) -> bool:
        return bool(self.st.done.all())

    @torch.no_grad()
    def step(self):
        """One round for every live request (finished ones ride along; their rows are ignored)."""
        st, method, timer, B = self.st, self.method, self.method.timer, len(self.results)
        with timer("round"):
            live = ~st.done
            cands = method.propose(st)  # [B, k]
            with timer("verify"):
                out = self.target.forward(torch.cat([st.anchor[:, None], cands], 1), st.lens[:, None] + self.ar,
                                          self.cache, taps=method.taps)
                y = _pick(out.logits, self.temperature, self.gen)  # [B, k+1]: the target's token after each prefix
                n_acc = (cands == y[:, : method.k]).long().cumprod(1).sum(1)  # [B]
            now = time.perf_counter() - self.t0
            for b, (n, row, done) in enumerate(zip(n_acc.tolist(), y.tolist(), st.done.tolist())):
                if done:
                    continue
                r = self.results[b]
                r.accepted.append(n)
                for tok in row[: n + 1]:
                    r.output_ids.append(tok)
                    if tok in self.eos or len(r.output_ids) >= self.max_new_tokens:
                        st.done[b] = True
                        r.wall_s = now
                        break
            self.cache.commit(n_acc + 1)  # hybrid targets: linear-attention states after A + accepted drafts
            method.commit(st, out, y, n_acc)
            st.anchor = y[torch.arange(B, device=self.dev), n_acc]
            st.lens = torch.where(live, st.lens + n_acc + 1, st.lens)

    def absorb(self, slots: list[int], other: "Batch"):
        """Move `other`'s requests (all of its rows, in order) into this batch's `slots` (same capacity)."""
        dst = torch.tensor(slots, device=self.dev)
        src = torch.arange(len(slots), device=self.dev)
        self.cache.copy_rows(other.cache, dst, src)
        for f in ("lens", "anchor", "done"):
            getattr(self.st, f)[dst] = getattr(other.st, f)[src]
        self.method.absorb(dst, other.method, src)
        for s, r in zip(slots, other.results):
            self.results[s] = r


@torch.no_grad()
def generate(target, method: Method, prompts: list[list[int]], temperature: float = 0.0,
             max_new_tokens: int = 128, eos_ids=(), seed: int = 0, progress=None) -> list[Result]:
    """Decode a batch of prompts (token id lists of any lengths) with `method`; returns one Result per prompt."""
    gen = torch.Generator(device=target.device).manual_seed(seed)
    batch = Batch(target, method, prompts, temperature, max_new_tokens, set(int(e) for e in eos_ids), gen)
    while not batch.finished:
        batch.step()
        if progress is not None:
            progress(int(batch.st.done.sum()))
    return batch.results


@torch.no_grad()
def serve(target, method: Method, prompts: list[list[int]], cap: int, temperature: float = 0.0,
          max_new_tokens: int = 128, eos_ids=(), seed: int = 0) -> list[Result]:
    """Dynamic batching: at most `cap` requests in flight; as soon as requests finish, the next ones in arrival
    order are prefilled together and take their slots. `wall_s` of a result counts from the start of the group
    (queueing included)."""
    if cap < 1:
        raise ValueError("batch cap must be >= 1")
    gen = torch.Generator(device=target.device).manual_seed(seed)
    eos = set(int(e) for e in eos_ids)
    capacity = max(len(p) for p in prompts) + max_new_tokens + 2 * (method.k + 1)
    t0 = time.perf_counter()
    queue = list(range(len(prompts)))
    out: list[Result | None] = [None] * len(prompts)
    first, queue = queue[:cap], queue[cap:]
    batch = Batch(target, method, [prompts[i] for i in first], temperature, max_new_tokens, eos, gen, capacity, t0)
    owner = list(first)  # slot -> request index (None: free)
    while True:
        free = []
        for s, done in enumerate(batch.st.done.tolist()):
            if done and owner[s] is not None:
                out[owner[s]], owner[s] = batch.results[s], None
            if owner[s] is None:
                free.append(s)
        if queue and free:
            join, queue = queue[: len(free)], queue[len(free):]
            nb = Batch(target, method, [prompts[i] for i in join], temperature, max_new_tokens, eos, gen, capacity,
                       t0)
            batch.absorb(free[: len(join)], nb)
            for s, i in zip(free, join):
                owner[s] = i
            continue  # newcomers may already be finished (EOS as the first token)
        if all(o is None for o in owner):
            return out
        batch.step()
