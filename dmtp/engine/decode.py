"""One decode loop for every method: `ar`, `mtp` (chained native MTP, k steps), `dflash` and each DMTP variant.

A round (SPEC §6), for a batch of requests each at its own anchor position a (A = last committed token, not yet fed):
    cands = method.propose()                       # [B, k] draft tokens T1..Tk (k = 0 for ar)
    y     = target([A, T1..Tk] at a..a+k)          # the target's own token at every position (argmax or sample)
    n     = longest prefix with T_j == y_{j-1}     # accepted drafts
    emit y_0..y_n                                  # = T1..Tn + correction (or bonus when n = k)
    method.commit(n)                               # advance MTP / drafter context over committed rows only
Every emitted token is the target's own choice given the committed prefix, so at T = 0 the output is the target's
greedy output and at T > 0 it is distributed exactly as the target's samples (target-only verification). With
`verify="sample"` or `"block"` at T > 0 the drafts are samples of each drafter's tempered distribution and the
round accepts by speculative sampling or block verification instead (`verify.py`); the law of the output is the same.

The engine (docs/DESIGN.md, "Decode engine"):
  - caches are preallocated (`cache.KVCache`); rejecting candidates is not advancing a length, never a copy;
  - the MTP has a private KV cache; its advance always runs k+1 rows at a..a+k (the committed stream's first n+1
    rows plus scratch rows that the next advance overwrites before anything can see them) — a fixed shape;
  - the drafter's context K/V lives in one cache with a row per absolute position; the 4096-position anchor window
    is a mask over it, not a copy;
  - outputs, accept counts, EOS and length checks are kept on the device; the host learns which requests finished
    from a pinned copy of the done flags that it reads a round or two later without waiting (no synchronisation per
    round in steady state); stop strings (`stop=`, `stops.py`) are matched on the host from pinned copies of each
    round's tokens that travel with those flags, and the record is cut exactly where the stop string ends;
  - on CUDA, the stages of a round — drafter, MTP advance, T1 head + embedding + fusion, verification, acceptance and
    record, drafter context, anchor/length update — are CUDA graphs captured per batch (serve: per batch cap) on first
    use (`graphs.py`);
  - the engine (`engine_for`): "compiled" on CUDA runs the models' decode steps through `models/fast.py` (attention
    over the valid cache rows, compiled regions) and compiles every other stage whole; "hf" runs the HF layers.

    results = generate(target, build_method("zero_init_residual", target, drafter=d, mtp=m), prompts, 0.0, 128)
"""
from __future__ import annotations

import collections
import contextlib
import copy
import functools
import time
import weakref
from dataclasses import dataclass, field

import torch

from dmtp.config import EngineConfig
from dmtp.engine import verify as V
from dmtp.engine.graphs import Graphs
from dmtp.engine.stops import StopStrings, cut_rounds
from dmtp.models import fast
from dmtp.models.cache import KVCache
from dmtp.models.drafter import Drafter, check_compatible
from dmtp.models.variants import get_variant


@dataclass
class Result:
    output_ids: list[int]
    accepted: list[int] = field(default_factory=list)  # accepted draft count of every verify round
    wall_s: float = 0.0  # from the batch's start until the host saw this request finish
    stop_reason: str = "length"  # "eos" (ends in an end-of-text id) | "stop" (a stop string, `stops.py`) | "length"


@dataclass
class State:
    lens: torch.Tensor  # [B] positions the target has processed (= anchor position a)
    anchor: torch.Tensor  # [B] A, the last committed token
    done: torch.Tensor  # [B] bool
    capacity: int = 0  # cache rows per request
    engine: str = "hf"  # where the method's own caches run (`engine_for`): "hf", "flex" or "compiled"
    eng: EngineConfig = field(default_factory=EngineConfig)  # the batch's engine settings


def no_timer(stage: str):
    """Stage timer hook (`bench.StageTimer` replaces it): a context manager per named stage."""
    return contextlib.nullcontext()


# --- native MTP state -------------------------------------------------------------------------------------------
class MTPState:
    """Private MTP KV cache and h = the MTP hidden g at position a-1 (the one that predicts the next T1), kept in
    place. T1 = argmax LMHead(h) (or a sample, `verify.Draw`) is computed where it is used (`t1_head`), kept in `t1`."""

    def __init__(self, head, batch, capacity, screen=None, draw: V.Draw | None = None, engine="hf",
                 eng: EngineConfig | None = None):
        flex = engine != "hf" and fast.layer_problem(head.layers[0]) is None
        self.head, self.cache, self.screen = head, KVCache(batch, capacity, flex=flex), screen
        self.eng = eng or EngineConfig()
        self.draw = draw or V.Draw()
        self.h = None  # [B, H]
        self.t1 = None  # [B]

    def step(self, emb_next, hidden, pos):
        """The MTP layer over decode rows: the compiled engine's forward on a flex cache, else the HF layer's."""
        if self.cache.flex:
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
        nxt[torch.arange(B), plen - 1] = anchor
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
    def chain(self, lens, k):
        """MTP-k: T1 from h, then k-1 chained steps feeding g back as the hidden (tentative rows at a..); each step
        consumes the token just drafted (argmax, or its sample: the chain is an autoregressive proposal)."""
        tok = self.t1_head(self.h)
        cands, g = [tok.clone()], self.h
        for j in range(1, k):
            pos = (lens + j - 1)[:, None]
            g = self.step(self.head.target.embed(tok[:, None]), g[:, None], pos)[:, 0]
            tok = self.draw.pick(self.head.target.lm_head(g), j)
            cands.append(tok)
        return torch.stack(cands, 1)


# --- methods ----------------------------------------------------------------------------------------------------
class Method:
    """A drafting method. The loop calls prefill once, then propose / commit every round. Work that should be timed
    or captured as a CUDA graph goes through `self.run(stage, fn, *tensors)` (see `graphs.py` for what a stage may
    do); the batch that owns the method's state replaces `run` with its timed, graphed version."""
    name = "ar"
    k = 0  # candidates per round
    taps = None  # target layers the method needs
    timer = staticmethod(no_timer)  # stage timer (benchmarks set it)
    draw = V.Draw()  # argmax drafts; the owning batch sets its own (`verify.Draw`: samples when verifying by sampling)
    graphable = True  # every stage obeys graphs.py's rules (a wrapper that inspects state on the host: False)

    def compiles(self, eng: EngineConfig) -> bool:
        """Every model it runs has a compiled-engine forward (`fast.py`) under `eng`: its stages compile whole."""
        return True

    def run(self, stage, fn, *inputs):
        with self.timer(stage):
            return fn(*inputs)

    def prefill(self, st: State, ids, plen, out):
        pass

    def buffers(self) -> list[torch.Tensor]:
        """State tensors (after prefill) that live as long as the batch and are only updated in place."""
        mtp = getattr(self, "mtp", None)
        return [mtp.h, mtp.t1] if mtp is not None else []

    def propose(self, st: State) -> torch.Tensor:
        return st.lens.new_zeros(st.lens.shape[0], 0)

    def commit(self, st: State, out, emitted, n_acc):
        pass

    def absorb(self, dst, other: "Method", src):
        """Take rows `src` of another batch's state of this method into rows `dst` (dynamic batching)."""


class MTPMethod(Method):
    def __init__(self, head, k=4, screen=None):
        self.name, self.k, self.head, self.screen = "mtp", k, head, screen

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


class DrafterMethod(Method):
    """DFlash and every DMTP variant: the variant decides the block and whether the MTP is involved."""

    def __init__(self, drafter, target, head=None, screen=None):
        self.drafter, self.target, self.head, self.screen = drafter, target, head, screen
        self.var = drafter.injection
        self.name = self.var.name
        self.k = drafter.config.num_candidates
        self.taps = drafter.config.target_layer_ids
        if self.var.needs_mtp and head is None:
            raise ValueError(f"variant {self.name!r} needs the target's native MTP head")
        lay = self.var.layout(self.k)
        self.offsets = torch.tensor(lay.offsets)
        self.predict = torch.tensor(lay.predict)

    def compiles(self, eng):
        return fast.drafter_problem(self.drafter, eng) is None and (
            not self.var.needs_mtp or fast.layer_problem(self.head.layers[0]) is None)

    @property
    def graphable(self):
        """The eager flex backend builds its block mask with torch.compile (not inside a CUDA graph); the compiled
        engine's drafter (a flex context cache) builds it from tensors."""
        return self.drafter.config.attn_backend == "sdpa" or getattr(getattr(self, "ctx", None), "flex", False)

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
        self.ctx = KVCache(B, st.capacity, flex=st.engine != "hf" and fast.drafter_problem(self.drafter, st.eng) is None)
        self.offsets, self.predict = self.offsets.to(dev), self.predict.to(dev)
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
        if self.ctx.flex:  # the compiled engine's drafter: the block's K/V go into the context cache at bpos
            hid = fast.drafter_forward(d, block, bpos, self.ctx, lens, self.eng)[:, self.predict]
        else:
            ctx = [(self.ctx.k[i], self.ctx.v[i]) for i in range(len(d.layers))]
            hid = d(block, bpos, ctx, lens[:, None])[:, self.predict]  # predicting slots
        logits, pos = d.logits(tgt.lm_head(hid)), int(self.var.t1)  # draft position of the first predicting slot
        if not self.draw.sampling:
            return d.select(logits, hid, prev)  # argmax, or the DFlash2 path walked from A / T1
        # samples: every slot from the one parallel pass (q_j depends on the block input only), or the DFlash2 walk
        return self.draw.pick(logits, pos) if d.selector is None else self.draw.walk(d.selector, logits, hid, prev, pos)

    @torch.no_grad()
    def propose(self, st):
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


def build_method(name: str, target, drafter=None, mtp=None, mtp_steps: int = 4, screen=None) -> Method:
    """`screen`: an optional `screen.T1Screen` replacing the full LM head for T1 (MTP and DMTP methods)."""
    if name == "ar":
        return Method()
    if name == "mtp":
        if mtp is None:
            raise ValueError("method 'mtp' needs the target's native MTP head")
        return MTPMethod(mtp, mtp_steps, screen)

    get_variant(name)  # unknown names fail here with the list of known ones
    if drafter is None:
        raise ValueError(f"method {name!r} needs --drafter")
    if drafter.config.variant != name:
        raise ValueError(f"drafter was built as variant {drafter.config.variant!r}, not {name!r}")

    check_compatible(drafter, target)
    return DrafterMethod(drafter, target, mtp, screen)


def load_method(name: str, target, mtp=None, drafters=None, mtp_steps: int = 4, screen=None) -> Method:
    """A method by its run name: `ar`, `mtp`, or the name of a trained drafter's folder `<drafters>/<name>/drafter`
    (e.g. `zero_init_residual_from_dflash`; its config says the variant), loaded in the target's precision."""
    if name in ("ar", "mtp"):
        return build_method(name, target, mtp=mtp, mtp_steps=mtp_steps, screen=screen)
    if drafters is None:
        raise ValueError(f"method {name!r} needs a drafters folder (<drafters>/{name}/drafter)")
    from pathlib import Path

    d = Drafter.load(Path(drafters) / name / "drafter", device=target.device, dtype=target.dtype).eval()
    m = build_method(d.config.variant, target, drafter=d, mtp=mtp, screen=screen)
    m.name = name
    return m


# --- the loop ---------------------------------------------------------------------------------------------------
def _pick(logits, temperature, gen):
    """The target's token: argmax, or a sample by the exponential race (argmax p/E, E ~ Exp(1) i.i.d. is distributed
    as Categorical(p)) — no host synchronisation, unlike torch.multinomial's checks."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    race = torch.empty_like(probs).exponential_(generator=gen)
    return (probs / race).argmax(-1)


def use_graphs(target, method: Method, eng: EngineConfig) -> bool:
    """CUDA graphs on CUDA for full-attention targets (hybrid targets keep a per-round history of linear states whose
    selection is host-side) unless `eng.graphs` is off."""
    return target.device.type == "cuda" and not target.hybrid and method.graphable and eng.graphs


ENGINES = ("hf", "flex", "compiled")


def engine_for(target, eng: EngineConfig | str | None = None) -> str:
    """The decode engine that runs (`EngineConfig.engine` resolved on the target's device): "compiled" (`fast.py`'s
    forwards, compiled, under the CUDA graphs), "flex" (`fast.py`'s forwards uncompiled) or "hf" (the HF layers with
    dense masks: the reference). A target `fast.py` does not support (hybrid, MoE) always decodes on "hf"."""
    kind = EngineConfig.of(eng).kind(target.device.type)
    return "hf" if fast.target_problem(target) else kind


def capacity_for(prompts: list[list[int]], max_new_tokens: int, k: int) -> int:
    """Cache rows per request: the longest prompt, the new tokens, and two blocks of k+1 rows (a verify may write a
    whole block past the last committed row; a finished request rides along for one more)."""
    return max(len(p) for p in prompts) + max_new_tokens + 2 * (k + 1)


class Batch:
    """Requests decoding together: one target cache, one method state (a copy of `method`), one `State`, and the
    device-side record of outputs. `generate` runs one batch to the end; `serve` keeps `cap` slots busy by prefilling
    newcomers as a batch of their own and moving their rows into the free slots (`absorb`). `engine`: the
    `EngineConfig` (default: the default config); with the compiled engine every stage but verify is compiled whole
    (verify's target compiles per layer).
    `stop`: stop strings matched on the host (`stops.py`); a request ends a round or two after its stop string and
    is cut exactly. `verify`: target | sample | block (`verify.py`)."""
    @torch.no_grad()
    def __init__(self, target, method: Method, prompts, temperature, max_new_tokens, eos, gen, capacity=None,
                 t0=None, graphs: bool | None = None, engine: EngineConfig | None = None,
                 stop: StopStrings | None = None, verify: str = "target"):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        check_token_ids(prompts, target.vocab_size)
        dev = self.dev = target.device
        self.target, self.method = target, copy.copy(method)  # the copy holds this batch's MTP / drafter state
        self.temperature, self.max_new_tokens, self.gen = temperature, max_new_tokens, gen
        self.draw = self.method.draw = V.Draw(verify, temperature, gen)  # this batch's drafts: argmax or samples
        if self.draw.sampling and getattr(method, "screen", None) is not None:
            raise ValueError(f"verify={verify!r} needs the full T1 distribution; the screened T1 head gives its argmax "
                             "only (use verify='target' with a screen)")
        self.t0 = time.perf_counter() if t0 is None else t0
        B, k = len(prompts), method.k
        plen = torch.tensor([len(p) for p in prompts], device=dev)
        T = max(len(p) for p in prompts)
        need = capacity_for(prompts, max_new_tokens, k)
        cap = capacity or need
        if cap < need:
            raise ValueError(f"cache capacity {cap} < longest prompt {T} + {max_new_tokens} new tokens + 2 blocks")
        self.eng = EngineConfig.of(engine)
        self.engine = engine_for(target, self.eng)
        if self.engine != "hf":  # flex attention reads whole 128-row blocks
            cap = fast.round_capacity(cap)
        ids = torch.zeros(B, T, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.as_tensor(p)
        ids = ids.to(dev)  # one copy for the whole group
        self.cache = KVCache(B, cap, flex=self.engine != "hf")
        pos = torch.arange(T, device=dev)[None].expand(B, T)
        if self.engine == "compiled" and self.eng.prefill == "compiled":  # fast.py's layers, one dynamic-shape graph
            out = fast.prefill_forward(target, ids, pos, self.cache, method.taps, plen)
        else:  # lengths: padding stays out of GDN states; logits only at each prompt's last position
            out = target.forward(ids, pos, self.cache, taps=method.taps, lengths=plen, logits_at=plen - 1)
        first = _pick(out.logits[:, 0], temperature, gen)
        self.eos = torch.tensor(sorted(eos), dtype=torch.long, device=dev)
        self.eos_ids = set(eos)
        done = torch.isin(first, self.eos) | (max_new_tokens <= 1)
        # the method's own caches (MTP layer, drafter context) take the fast path only where its stages compile: on
        # CUDA an uncompiled fast forward cannot be captured (flex attention builds its block mask on the host)
        compiles = method.compiles(self.eng)
        own = self.engine if (self.engine == "compiled" and compiles) or dev.type != "cuda" else "hf"
        st = self.st = State(lens=plen.clone(), anchor=first, done=done, capacity=cap, engine=own, eng=self.eng)
        # device-side record: output tokens, count, accept count of every round
        self.out = torch.zeros(B, max_new_tokens + k + 1, dtype=torch.long, device=dev)
        self.out[:, 0] = first
        self.n_out = torch.ones(B, dtype=torch.long, device=dev)
        self.acc = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
        self.n_rounds = torch.zeros(B, dtype=torch.long, device=dev)
        self.ar = torch.arange(k + 1, device=dev)
        self.method.prefill(st, ids, plen, out)
        self.graphs = Graphs(use_graphs(target, self.method, self.eng) if graphs is None else graphs)
        self.graphs.persistent(st.lens, st.anchor, st.done, *self.method.buffers())
        self.compile = self.engine == "compiled" and compiles  # stages other than verify, compiled whole
        run = weakref.WeakMethod(self._run)  # the copy runs its stages through this batch; a weak reference, so the
        # batch (its caches, its graphs' memory) goes as soon as it is dropped, not at a garbage collection
        self.method.run = lambda stage, fn, *inputs, updates=(): run()(stage, fn, *inputs, updates=updates)
        # what the host knows: done flags as of some earlier round (pinned copies, read without waiting)
        self.wall: list[float | None] = [None] * B
        self._seen = torch.zeros(B, dtype=torch.bool)
        self._pending: collections.deque = collections.deque()
        self._ring: list[torch.Tensor] = []  # pinned landing buffers, made on the first round (newcomers never step)
        self._turn = 0
        self.match = [stop.match() for _ in prompts] if stop is not None else None  # host-side, per request
        self._stopped = torch.zeros(B, dtype=torch.bool)  # requests the host ended at a stop string
        self._y = self._emitted = None  # the last round's tokens [B, k+1] and count appended [B] (stop strings)
        # the host sees the first token too: a stop string may end there
        self._see(done.cpu(), *((first[:, None].cpu(), torch.ones(B, dtype=torch.long)) if stop is not None else ()))

    def _run(self, stage, fn, *inputs, updates=()):
        with self.method.timer(stage):
            compile = self.compile and stage != "verify"  # verify's target is compiled per layer (`fast.py`)
            return self.graphs(stage, fn, *inputs, updates=updates,
                               compile=functools.partial(fast.compile_fn, device=self.dev, tuning=self.eng.tuning)
                               if compile else None)

    # --- what the host knows --------------------------------------------------------------------------------------
    def _see(self, done_host: torch.Tensor, y=None, emitted=None):
        """Host view of one round: its done flags and, with stop strings, the tokens it appended (y[b, :emitted[b]])."""
        if self.match is not None and y is not None:
            for b in emitted.nonzero().flatten().tolist():
                if not self._stopped[b] and self.match[b].feed(y[b, : int(emitted[b])].tolist()):
                    self._stopped[b] = True
                    self.st.done[b: b + 1].fill_(True)  # no sync; rounds already queued still run for b
            done_host = done_host | self._stopped
        new = done_host & ~self._seen
        if new.any():
            now = time.perf_counter() - self.t0
            for b in new.nonzero().flatten().tolist():
                self.wall[b] = now
        self._seen = done_host.clone()

    def _publish(self):
        """Queue a copy of the done flags to the host (no wait). At most 2 stay in flight: the host then waits for the
        round before last while the GPU runs the last one."""
        src = [self.st.done] + ([self._y, self._emitted] if self.match is not None else [])
        if self.dev.type != "cuda":
            self._see(*[t.cpu() for t in src])
            return
        if not self._ring:
            self._ring = [[torch.zeros(t.shape, dtype=t.dtype, pin_memory=True) for t in src] for _ in range(4)]
        bufs = self._ring[self._turn % len(self._ring)]
        self._turn += 1
        for buf, t in zip(bufs, src):
            buf.copy_(t, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._pending.append((ev, bufs))

    def poll(self, wait: bool = False) -> torch.Tensor:
        """Done flags [B] (host) as of the newest round whose copy has arrived; `wait` = as of the last round."""
        while self._pending and (wait or len(self._pending) > 2 or self._pending[0][0].query()):
            ev, bufs = self._pending.popleft()
            ev.synchronize()
            self._see(*bufs)
        return self._seen

    @property
    def finished(self) -> bool:
        return bool(self.poll().all())

    def _result(self, b: int, out: list[int], acc: list[int], wall: float) -> Result:
        """Request b's record; a stop string cuts it after the token that completes it (`stops.py`)."""
        found = self.match[b].found if self.match is not None else None
        if found is not None:
            return Result(out[: found[1]], cut_rounds(acc, found[1]), wall, "stop")
        eos = bool(out) and out[-1] in self.eos_ids  # a round cut at end-of-text or the length cap: its count too
        return Result(out, cut_rounds(acc, len(out)), wall, "eos" if eos else "length")

    def result(self, b: int) -> Result:
        n, r = int(self.n_out[b]), int(self.n_rounds[b])
        return self._result(b, self.out[b, :n].tolist(), self.acc[b, :r].tolist(), self.wall[b] or 0.0)

    @property
    def results(self) -> list[Result]:
        self.poll(wait=True)
        n_out, n_rounds = self.n_out.tolist(), self.n_rounds.tolist()
        out, acc = self.out.cpu(), self.acc.cpu()
        return [self._result(b, out[b, : n_out[b]].tolist(), acc[b, : n_rounds[b]].tolist(),
                             self.wall[b] if self.wall[b] is not None else time.perf_counter() - self.t0)
                for b in range(len(n_out))]

    # --- one round ------------------------------------------------------------------------------------------------
    def _verify(self, anchor, cands, lens):
        ids, pos = torch.cat([anchor[:, None], cands], 1), lens[:, None] + self.ar
        if self.cache.flex:  # the compiled engine: gpt-fast-style layers over the valid cache rows
            out = fast.target_forward(self.target, ids, pos, self.cache, self.method.taps, self.engine == "compiled",
                                      self.eng)
        else:
            out = self.target.forward(ids, pos, self.cache, taps=self.method.taps)
        return out, (out.logits.argmax(-1) if self.temperature <= 0 else None)

    @torch.no_grad()
    def step(self):
        """One round for every live request (finished ones ride along; their rows are ignored)."""
        st, method = self.st, self.method
        with method.timer("round"):
            if self.draw.sampling:  # this round's races and uniforms, drawn before any stage reads them
                self.draw.refill(st.lens.shape[0], method.k, self.target.vocab_size, self.dev)
            cands = method.propose(st)  # [B, k]
            out, y = self._run("verify", self._verify, st.anchor, cands, st.lens)
            record = (self.out, self.n_out, self.acc, self.n_rounds, st.done)
            if self.draw.sampling:  # speculative sampling / block verification against the drafts' q
                y, n_acc = self._run("accept", self.draw.accept, out.logits, cands)
                live, emitted = self._run("record", self._record_live, y, n_acc, updates=record)
            else:  # target-only: the target's own token after each prefix, the longest matching prefix accepted
                if y is None:
                    y = _pick(out.logits, self.temperature, self.gen)  # [B, k+1]
                n_acc, live, emitted = self._run("accept", self._accept, cands, y, updates=record)
            if self.match is not None:  # what the host's stop-string matcher reads (`_publish`)
                self._y, self._emitted = y, emitted
            if self.target.hybrid:
                self.cache.commit(n_acc + 1)  # linear-attention states after A + accepted drafts
            method.commit(st, out, y, n_acc)
            self._run("advance", self._advance, y, n_acc, live, updates=(st.anchor, st.lens))
        self._publish()

    def _accept(self, cands, y):
        """n = the longest prefix with T_j == y_{j-1} (accepted drafts) [B]; y_0..y_n recorded for live requests.
        Returns n, the live mask and the count appended per request [B] (a stage: the host keeps no reference to
        its temporaries; `step` hands y and the count to the stop-string matcher)."""
        n_acc = (cands == y[:, : cands.shape[1]]).long().cumprod(1).sum(1)
        live = ~self.st.done
        return n_acc, live, self._record(y, n_acc, live)

    def _record_live(self, y, n_acc):
        """The sampled-draft path's record stage (n and y from `verify.Draw.accept`): the live mask and the count
        appended per request [B]."""
        live = ~self.st.done
        return live, self._record(y, n_acc, live)

    def _advance(self, y, n_acc, live):
        """The next anchor A' = y_n at a' = a + n + 1 (after the method has committed rows a..a+n)."""
        self.st.anchor.copy_(y.gather(1, n_acc[:, None])[:, 0])
        self.st.lens.copy_(torch.where(live, self.st.lens + n_acc + 1, self.st.lens))

    def _record(self, y, n_acc, live):
        """Device-side: append y_0..y_n (cut at the first EOS and at max_new_tokens) and n to each live request;
        returns the count appended [B]."""
        emit = self.ar[None] <= n_acc[:, None]
        hit = emit & torch.isin(y, self.eos)
        first = torch.where(hit.any(1), hit.int().argmax(1), y.shape[1])  # index of the first emitted EOS
        cnt = torch.minimum(torch.minimum(n_acc + 1, first + 1), self.max_new_tokens - self.n_out)
        self.out.scatter_(1, (self.n_out[:, None] + self.ar).clamp(max=self.out.shape[1] - 1), y)
        self.acc.scatter_(1, self.n_rounds.clamp(max=self.acc.shape[1] - 1)[:, None], n_acc[:, None])
        self.n_rounds += live.long()
        emitted = torch.where(live, cnt, 0)
        self.n_out += emitted
        self.st.done |= live & ((first < cnt) | (self.n_out >= self.max_new_tokens))
        return emitted

    def absorb(self, slots: list[int], other: "Batch"):
        """Move `other`'s requests (all of its rows, in order) into this batch's `slots` (same capacity)."""
        self.poll(wait=True)  # copies still in flight describe the slots' previous occupants
        dst = torch.tensor(slots, device=self.dev)
        src = torch.arange(len(slots), device=self.dev)
        self.cache.copy_rows(other.cache, dst, src)
        for f in ("lens", "anchor", "done"):
            getattr(self.st, f)[dst] = getattr(other.st, f)[src]
        for f in ("out", "n_out", "acc", "n_rounds"):
            getattr(self, f)[dst] = getattr(other, f)[src]
        self.method.absorb(dst, other.method, src)
        for b, s in enumerate(slots):
            self.wall[s] = other.wall[b]
            if self.match is not None:
                self.match[s] = other.match[b]
        self._seen[slots] = other._seen[: len(slots)]  # `_see` replaces `_seen`, never writes into it
        self._stopped[slots] = other._stopped[: len(slots)]


def check_token_ids(prompts, vocab_size: int) -> None:
    """A prompt id outside [0, vocab_size) fails here, named, not as a device-side assert in the embedding."""
    for i, p in enumerate(prompts):
        if len(p) and 0 <= min(p) and max(p) < vocab_size:  # the common case, in C
            continue
        bad = [int(t) for t in p if not 0 <= int(t) < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside the target's vocabulary of {vocab_size}: {bad[:5]}"
                             " (a tokenizer of another model?)")


@torch.no_grad()
def generate(target, method: Method, prompts: list[list[int]], temperature: float = 0.0,
             max_new_tokens: int = 128, eos_ids=(), seed: int = 0, progress=None,
             engine: EngineConfig | None = None, stop: StopStrings | None = None,
             verify: str = "target") -> list[Result]:
    """Decode a batch of prompts (token id lists of any lengths) with `method`; returns one Result per prompt.
    A request ends at an id in `eos_ids`, at a stop string of `stop` (`stops.py`), or at `max_new_tokens`.
    `engine`: the `EngineConfig` (None: the default). `verify`: target (default) | sample | block — how drafts are drawn and accepted at
    T > 0 (`verify.py`)."""
    gen = torch.Generator(device=target.device).manual_seed(seed)
    batch = Batch(target, method, prompts, temperature, max_new_tokens, set(int(e) for e in eos_ids), gen,
                  engine=engine, stop=stop, verify=verify)
    while not batch.finished:
        batch.step()
        if progress is not None:
            progress(int(batch.poll().sum()))
    return batch.results


class Server:
    """Dynamic batching over persistent slots: at most `cap` requests in flight; as soon as the host sees requests
    finished, the next ones in arrival order are prefilled together and take their slots. The slots (caches, state,
    CUDA graphs) outlive a `run`, so a server captures its graphs once — as a serving engine does at start-up — and
    later request groups replay them. Slots = the first group's size, at most `cap`; `capacity` bounds prompt +
    `max_new_tokens` (+ 2 blocks) of every request; `verify` as in `generate`. Newcomers join in groups of at least
    `engine.admit` (`EngineConfig`): each group costs one prompt pass and one move into the slots, whatever its size.
    `admit_s` and `rounds`: host seconds spent admitting newcomers and rounds stepped, summed over runs."""

    def __init__(self, target, method: Method, cap: int, capacity: int, temperature: float = 0.0,
                 max_new_tokens: int = 128, eos_ids=(), seed: int = 0, engine: EngineConfig | None = None,
                 stop: StopStrings | None = None, verify: str = "target"):
        if cap < 1:
            raise ValueError("batch cap must be >= 1")
        self.verify = V.check(verify)
        self.target, self.method, self.cap, self.capacity = target, method, cap, capacity
        self.eng = EngineConfig.of(engine)
        self.engine = engine_for(target, self.eng)
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.eos, self.stop = set(int(e) for e in eos_ids), stop
        self.gen = torch.Generator(device=target.device).manual_seed(seed)
        self.batch: Batch | None = None
        self.admit_s, self.rounds, self.groups = 0.0, 0, 0

    def close(self):
        """Let go of the slots (caches, state, CUDA graphs) now, not when the server goes."""
        self.batch = None

    def _new(self, prompts, t0, graphs=None):
        return Batch(self.target, self.method, prompts, self.temperature, self.max_new_tokens, self.eos, self.gen,
                     self.capacity, t0, graphs, self.eng, self.stop, self.verify)

    @torch.no_grad()
    def run(self, prompts: list[list[int]]) -> list[Result]:
        """Decode a group of requests; `wall_s` of a result counts from the start of the group (queueing included)."""
        check_token_ids(prompts, self.target.vocab_size)  # the whole group, before its first request runs
        t0 = time.perf_counter()
        queue = list(range(len(prompts)))
        out: list[Result | None] = [None] * len(prompts)
        if self.batch is None:
            first, queue = queue[: self.cap], queue[self.cap:]
            self.batch = self._new([prompts[i] for i in first], t0)
            owner = list(first)  # slot -> request index (None: free)
        else:
            self.batch.t0 = t0
            owner = [None] * len(self.batch.wall)
        batch = self.batch
        while True:
            done = batch.poll()
            free = []
            for s in range(len(owner)):
                if owner[s] is not None and done[s]:
                    out[owner[s]], owner[s] = batch.result(s), None
                if owner[s] is None:
                    free.append(s)
            busy = len(owner) - len(free)
            if queue and free and (len(free) >= min(self.eng.admit, len(queue)) or busy == 0):
                join, queue = queue[: len(free)], queue[len(free):]
                ta = time.perf_counter()
                batch.absorb(free[: len(join)], self._new([prompts[i] for i in join], t0, graphs=False))
                self.admit_s += time.perf_counter() - ta
                self.groups += 1
                for s, i in zip(free, join):
                    owner[s] = i
                continue  # newcomers may already be finished (EOS as the first token)
            if all(o is None for o in owner):
                return out
            batch.step()
            self.rounds += 1


@torch.no_grad()
def serve(target, method: Method, prompts: list[list[int]], cap: int, temperature: float = 0.0,
          max_new_tokens: int = 128, eos_ids=(), seed: int = 0, engine: EngineConfig | None = None,
          stop: StopStrings | None = None, verify: str = "target") -> list[Result]:
    """Dynamic batching of one request group (a `Server` used once)."""
    capacity = capacity_for(prompts, max_new_tokens, method.k)
    server = Server(target, method, cap, capacity, temperature, max_new_tokens, eos_ids, seed, engine, stop, verify)
    return server.run(prompts)
