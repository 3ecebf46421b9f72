"""What a batch of requests decoding together holds, and everything around its rounds (`decode.Batch` adds the
round itself): the prompt pass into preallocated caches, the device-side record of outputs and accept counts, the
host's view of which requests finished (pinned copies read a round or two later, never waited for), the first
forward's finiteness check, the stages run as CUDA graphs (`graphs.py`), and moving requests into and out of slots
(`absorb`, `harvest`) for the server (`server.py`). Also the engine choices a batch resolves (`engine_for`) and the
record of one request (`Result`).
"""
from __future__ import annotations

import collections
import copy
import functools
import time
import weakref
from dataclasses import dataclass, field

import torch

from dmtp.config import EngineConfig
from dmtp.engine import verify as V
from dmtp.engine.graphs import Graphs
from dmtp.engine.methods import Method, State
from dmtp.engine.stops import StopStrings, cut_rounds
from dmtp.models import fast
from dmtp.models.cache import KVCache
from dmtp.models.finite import nonfinite


@dataclass
class Result:
    output_ids: list[int]
    accepted: list[int] = field(default_factory=list)  # accepted draft count of every verify round
    wall_s: float = 0.0  # from the batch's start until the host saw this request finish
    stop_reason: str = "length"  # "eos" (ends in an end-of-text id) | "stop" (a stop string, `stops.py`) | "length"


def target_token(logits, temperature, gen):
    """The target's token: argmax, or a sample by the exponential race (argmax p/E, E ~ Exp(1) i.i.d. is distributed
    as Categorical(p)) — no host synchronisation, unlike torch.multinomial's checks."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    race = torch.empty_like(probs).exponential_(generator=gen)
    return (probs / race).argmax(-1)


def to_device(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """A host tensor on `dev` without a host synchronisation: on CUDA through pinned memory, non-blocking (a copy from
    pageable memory waits for every kernel queued before it; the pinned block is not reused before the copy is done)."""
    if dev.type != "cuda" or not t.numel():  # an empty tensor copies nothing
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


class _Arrived:
    """The event of a copy that has already arrived (off CUDA every copy is synchronous)."""
    def query(self) -> bool:
        return True

    def synchronize(self):
        pass


def to_host(tensors: list[torch.Tensor], bufs: list[torch.Tensor] | None = None):
    """Queue copies of device tensors to the host without waiting: (event, host tensors), the host tensors valid once
    the event has completed (`bufs`: pinned landing buffers to reuse; default: fresh ones). Off CUDA: fresh copies,
    arrived."""
    if not tensors or tensors[0].device.type != "cuda":  # a copy, never a view of a tensor the loop updates
        return _Arrived(), [t.clone() for t in tensors]
    if bufs is None:
        bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    for buf, t in zip(bufs, tensors):
        buf.copy_(t, non_blocking=True)
    ev = torch.cuda.Event()
    ev.record()
    return ev, bufs


def use_graphs(target, method: Method, eng: EngineConfig) -> bool:
    """CUDA graphs on CUDA for full-attention targets (hybrid targets keep a per-round history of linear states whose
    selection is host-side) unless `eng.graphs` is off."""
    return target.device.type == "cuda" and not target.hybrid and method.graphable and eng.graphs


def engine_for(target, eng: EngineConfig | str | None = None) -> str:
    """The decode engine that runs (`EngineConfig.engine` resolved on the target's device): "compiled" (`fast.py`'s
    forwards, compiled, under the CUDA graphs), "fast-eager" (`fast.py`'s forwards uncompiled) or "hf" (the HF layers
    with dense masks: the reference). A target `fast.py` does not support (hybrid, MoE) always decodes on "hf"."""
    kind = EngineConfig.of(eng).kind(target.device.type)
    return "hf" if fast.target_problem(target) else kind


def method_engine(method: Method, engine: str, eng: EngineConfig, dev: torch.device) -> str:
    """Where a method's own caches (MTP layer, drafter context) run: the fast path only where its stages compile; on
    CUDA an uncompiled fast forward cannot be captured (flex attention builds its block mask on the host)."""
    return engine if (engine == "compiled" and method.compiles(eng)) or dev.type != "cuda" else "hf"


def capacity_for(prompts: list[list[int]], max_new_tokens: int, k: int) -> int:
    """Cache rows per request: the longest prompt, the new tokens, and two blocks of k+1 rows (a verify may write a
    whole block past the last committed row; a finished request rides along for one more)."""
    return max(len(p) for p in prompts) + max_new_tokens + 2 * (k + 1)


class Slots:
    """Requests decoding together, and everything around their rounds (`decode.Batch` adds the round): one target
    cache, one method state (a copy of `method`), one `State`, the device-side record of outputs, and the host's
    view of them. `generate` runs one batch to the end; `serve` keeps `cap` slots busy by prefilling newcomers as a
    batch of their own and moving their rows into the free slots (`absorb`). `engine`: the `EngineConfig` (default:
    the default config); with the compiled engine every stage but verify is compiled whole (verify's target compiles
    per layer). `stop`: stop strings matched on the host (`stops.py`); a request ends a round or two after its stop
    string and is cut exactly. `verify`: target | sample | block (`verify.py`)."""
    @torch.no_grad()
    def __init__(self, target, method: Method, prompts, temperature, max_new_tokens, eos, gen, capacity=None,
                 t0=None, graphs: bool | None = None, engine: EngineConfig | None = None,
                 stop: StopStrings | None = None, verify: str = "target", prompt_pass=None):
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
        plen = to_device(torch.tensor([len(p) for p in prompts]), dev)  # no host synchronisation: a server admits
        # newcomers while its running rounds are still queued on the device
        ids, out, cap = self._prefill(prompts, plen, capacity, engine, prompt_pass)
        first = target_token(out.logits[:, 0], temperature, gen)
        self.eos = to_device(torch.tensor(sorted(eos), dtype=torch.long), dev)
        self.eos_ids = set(eos)
        done = torch.isin(first, self.eos) | (max_new_tokens <= 1)
        own = method_engine(method, self.engine, self.eng, dev)
        compiles = method.compiles(self.eng)
        st = self.st = State(lens=plen.clone(), anchor=first, done=done, capacity=cap, engine=own, eng=self.eng)
        # device-side record: output tokens, count, accept count of every round
        self.out = torch.zeros(B, max_new_tokens + k + 1, dtype=torch.long, device=dev)
        self.out[:, 0] = first
        self.n_out = torch.ones(B, dtype=torch.long, device=dev)
        self.acc = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
        self.n_rounds = torch.zeros(B, dtype=torch.long, device=dev)
        self.ar = torch.arange(k + 1, device=dev)
        if prompt_pass is not None:  # its graph of the method's prefill, for the newcomers it just prefilled
            prompt_pass.prefill_method(self.method, st, ids, plen, out)
        else:
            self.method.prefill(st, ids, plen, out)
        self._checks: collections.deque = collections.deque()  # (event, host flag): a first forward not finite
        self._check_finite(out.logits, *self.method.buffers())
        self.graphs = Graphs(use_graphs(target, self.method, self.eng) if graphs is None else graphs)
        self.graphs.persistent(st.lens, st.anchor, st.done, *self.method.buffers())
        self.compile = self.engine == "compiled" and compiles  # stages other than verify, compiled whole
        run = weakref.WeakMethod(self._run)  # the copy runs its stages through this batch; a weak reference, so the
        # batch (its caches, its graphs' memory) goes as soon as it is dropped, not at a garbage collection
        self.method.run = lambda stage, fn, *inputs, updates=(): run()(stage, fn, *inputs, updates=updates)
        self._host_view(B, stop, first)

    def _prefill(self, prompts, plen, capacity, engine, prompt_pass):
        """The prompts' forward into a fresh cache (`self.cache`), on the engine `engine` resolves to (`self.eng`,
        `self.engine`): (the padded prompt ids on the device, the forward's output, cache rows per request)."""
        B, T, dev = len(prompts), max(len(p) for p in prompts), self.dev
        need = capacity_for(prompts, self.max_new_tokens, self.method.k)
        cap = capacity or need
        if cap < need:
            raise ValueError(f"cache capacity {cap} < longest prompt {T} + {self.max_new_tokens} new tokens + 2 blocks")
        self.eng = EngineConfig.of(engine)
        self.engine = engine_for(self.target, self.eng)
        if self.engine != "hf":  # flex attention reads whole 128-row blocks
            cap = fast.round_capacity(cap)
        ids = torch.zeros(B, T, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.as_tensor(p)
        ids = to_device(ids, dev)  # one copy for the whole group
        pos = torch.arange(T, device=dev)[None].expand(B, T)
        taps = self.method.taps
        if prompt_pass is not None:  # a server's newcomers: the graphed pass (`prompts.py`), its cache rows viewed
            out, self.cache = prompt_pass(ids, plen, cap)
        elif self.engine == "compiled" and self.eng.prefill != "hf":  # fast.py's layers, one dynamic-shape graph
            self.cache = KVCache(B, cap, fast=True)
            out = fast.prefill_forward(self.target, ids, pos, self.cache, taps, plen)
        else:
            # lengths: padding stays out of GDN states; logits only at each prompt's last position
            self.cache = KVCache(B, cap, fast=self.engine != "hf")
            out = self.target.forward(ids, pos, self.cache, taps=taps, lengths=plen, logits_at=plen - 1)
        return ids, out, cap

    def _host_view(self, B: int, stop: StopStrings | None, first: torch.Tensor):
        """What the host knows: done flags as of some earlier round (pinned copies, read without waiting), and the
        first token's copy queued like a round's."""
        self.wall: list[float | None] = [None] * B
        self._seen = torch.zeros(B, dtype=torch.bool)
        self._pending: collections.deque = collections.deque()  # (event, host copies, slots, generations)
        self._ring: list[torch.Tensor] = []  # pinned landing buffers, made on the first round (newcomers never step)
        self._turn = 0
        self._gens: tuple[int, ...] = (0,) * B  # per slot: how many times it took newcomers (`absorb`); a copy in
        # flight describes the occupants of the generations it was queued under, and the host skips a slot's row of
        # it once the slot has new occupants
        self.match = [stop.match() for _ in range(B)] if stop is not None else None  # host-side, per request
        self._stopped = torch.zeros(B, dtype=torch.bool)  # requests the host ended at a stop string
        # the host sees the first token too (a stop string may end there): queued like a round's, not waited for
        self._y, self._emitted = first[:, None], torch.ones(B, dtype=torch.long, device=self.dev)
        self._publish(ring=False)
        self._y = self._emitted = None  # the last round's tokens [B, k+1] and count appended [B] (stop strings)

    def _check_finite(self, *tensors):
        """Queue a check that the first forward's logits (and the method's state after its prefill: the MTP hidden)
        are finite: one device-side flag copied to the host without waiting, read by `poll` before the done flags
        queued after it. So the host refuses a batch whose first forward is NaN before it sees any of its requests
        finished, and the decode loop gains no synchronisation."""
        bad = torch.zeros((), dtype=torch.bool, device=self.dev)
        for t in tensors:
            if t.is_floating_point():
                bad = bad | ~torch.isfinite(t).all()
        self._checks.append(to_host([bad[None]]))

    def _read_checks(self, wait: bool = False):
        """Raise if a first-forward check that has arrived (all of them with `wait`) found non-finite numbers."""
        while self._checks and (wait or self._checks[0][0].query()):
            ev, (flag,) = self._checks.popleft()
            ev.synchronize()
            if bool(flag[0]):
                raise ValueError(nonfinite("", f"the first forward of a decode ({self.method.name}, engine "
                                               f"{self.engine}) gives non-finite logits or states", self.target))

    def _run(self, stage, fn, *inputs, updates=()):
        with self.method.timer(stage):
            compile = self.compile and stage != "verify"  # verify's target is compiled per layer (`fast.py`)
            return self.graphs(stage, fn, *inputs, updates=updates,
                               compile=functools.partial(fast.compile_fn, device=self.dev, tuning=self.eng.tuning)
                               if compile else None)

    # --- what the host knows --------------------------------------------------------------------------------------
    def _see(self, done_host: torch.Tensor, y=None, emitted=None, slots=None, gens=None):
        """Host view of one round: its done flags and, with stop strings, the tokens it appended (y[i, :emitted[i]]).
        Row i describes slot `slots[i]` (default: slot i) under generation `gens[i]`; a row whose slot has taken
        newcomers since (`absorb`) describes its former occupant and is skipped."""
        n = done_host.shape[0]
        whole = slots is None and gens is self._gens  # this batch's round, no slot refilled since: every row counts
        idx = torch.arange(n) if slots is None else torch.as_tensor(slots, dtype=torch.long)
        ok = None if whole else torch.tensor([g == self._gens[s] for g, s in zip(gens, idx.tolist())])
        if self.match is not None and y is not None:
            rows = emitted.ne(0) if ok is None else emitted.ne(0) & ok
            for i in rows.nonzero().flatten().tolist():
                s = int(idx[i])
                if not self._stopped[s] and self.match[s].feed(y[i, : int(emitted[i])].tolist()):
                    self._stopped[s] = True
                    self.st.done[s: s + 1].fill_(True)  # no sync; rounds already queued still run for s
        if whole:
            done = done_host | self._stopped
            new = done & ~self._seen
        else:
            done = done_host | self._stopped[idx]
            new = ok & done & ~self._seen[idx]
        if new.any():
            now = time.perf_counter() - self.t0
            for i in new.nonzero().flatten().tolist():
                self.wall[int(idx[i])] = now
        if whole:
            self._seen = done  # replaced, never written into: a caller may hold the last poll's flags
        else:
            seen = self._seen.clone()
            seen[idx[ok]] = done[ok]
            self._seen = seen

    def _publish(self, ring: bool = True):
        """Queue a copy of the done flags (with stop strings: the round's tokens and counts) to the host, no wait. At
        most `engine.in_flight` (default 2) stay in flight (`poll`): with 2 the host waits for the round before last
        while the GPU runs the last one. `ring`:
        the round's pinned landing buffers (reused); off, fresh ones (the first token's, of other shapes)."""
        src = [self.st.done] + ([self._y, self._emitted] if self.match is not None else [])
        bufs = None
        if ring and self.dev.type == "cuda":
            if not self._ring:
                self._ring = [[torch.zeros(t.shape, dtype=t.dtype, pin_memory=True) for t in src]
                              for _ in range(self.eng.in_flight + 2)]  # a buffer is read before its turn comes again
            bufs = self._ring[self._turn % len(self._ring)]
            self._turn += 1
        ev, bufs = to_host(src, bufs)
        self._pending.append((ev, bufs, None, self._gens))

    def poll(self, wait: bool = False) -> torch.Tensor:
        """Done flags [B] (host) as of the newest round whose copy has arrived; `wait` = as of the last round. A
        first-forward check queued before them is read first (`_check_finite`)."""
        self._read_checks(wait)
        while self._pending and (wait or len(self._pending) > self.eng.in_flight or self._pending[0][0].query()):
            ev, bufs, slots, gens = self._pending.popleft()
            ev.synchronize()
            self._read_checks()  # queued before this copy on its stream: arrived with it
            self._see(*bufs, slots=slots, gens=gens)
        return self._seen

    @property
    def finished(self) -> bool:
        return bool(self.poll().all())

    def _result(self, b: int, out: list[int], acc: list[int], wall: float) -> Result:
        """Request b's record; a stop string cuts it after the token that completes it (`stops.py`)."""
        return _make_result(out, acc, wall, self.match[b].found if self.match is not None else None, self.eos_ids)

    @property
    def results(self) -> list[Result]:
        self.poll(wait=True)
        n_out, n_rounds = self.n_out.tolist(), self.n_rounds.tolist()
        out, acc = self.out.cpu(), self.acc.cpu()
        return [self._result(b, out[b, : n_out[b]].tolist(), acc[b, : n_rounds[b]].tolist(),
                             self.wall[b] if self.wall[b] is not None else time.perf_counter() - self.t0)
                for b in range(len(n_out))]

    def absorb(self, slots: list[int], other: "Slots"):
        """Move `other`'s requests (all of its rows, in order) into this batch's `slots` (same capacity), without a
        host synchronisation: the copies are queued behind the rounds in flight, whose host copies still describe the
        slots' former occupants (skipped by generation, `_see`); `other`'s own copies in flight (its first tokens)
        now describe `slots`."""
        dst = to_device(torch.tensor(slots), self.dev)
        src = slice(0, len(slots))  # the first rows: views, no gather kernel per tensor (64 at 32 layers)
        self.cache.copy_rows(other.cache, dst, src)
        for f in ("lens", "anchor", "done"):
            getattr(self.st, f)[dst] = getattr(other.st, f)[src]
        for f in ("out", "n_out", "acc", "n_rounds"):
            getattr(self, f)[dst] = getattr(other, f)[src]
        self.method.absorb(dst, other.method, src)
        gens = list(self._gens)
        for b, s in enumerate(slots):
            self.wall[s] = other.wall[b]
            if self.match is not None:
                self.match[s] = other.match[b]
            gens[s] += 1
        self._gens = tuple(gens)
        seen = self._seen.clone()  # `_see` replaces `_seen`, never writes into it
        seen[slots] = other._seen[: len(slots)]
        self._seen = seen
        self._stopped[slots] = other._stopped[: len(slots)]
        self._checks.extend(other._checks)  # its first forward's check, read before its first tokens
        other._checks.clear()
        for ev, bufs, rows, _ in other._pending:  # `other` never absorbed: its rows are its requests, in order
            into = list(slots) if rows is None else [slots[r] for r in rows]
            self._pending.append((ev, bufs, into, tuple(self._gens[s] for s in into)))
        other._pending.clear()

    def harvest(self, slots: list[int]) -> "Harvest":
        """Queue a copy of the records of the finished requests in `slots` to the host, no wait (`Harvest.results`
        reads them): the slots can take newcomers at once, the copy being queued before anything they write."""
        return Harvest(self, slots)


class Harvest:
    """The records of finished requests on their way to the host (`Batch.harvest`): one gather and one copy for the
    group, the host-side parts (wall time, stop-string match) taken when the request was seen finished."""

    def __init__(self, batch: Slots, slots: list[int]):
        self.width = batch.out.shape[1]
        self.eos_ids = batch.eos_ids
        self.found = [batch.match[s].found if batch.match is not None else None for s in slots]
        self.wall = [batch.wall[s] or 0.0 for s in slots]
        idx = to_device(torch.tensor(slots), batch.dev)
        packed = torch.cat([batch.out[idx], batch.acc[idx], batch.n_out[idx, None], batch.n_rounds[idx, None]], 1)
        self.event, (self.host,) = to_host([packed])

    def results(self) -> list[Result]:
        self.event.synchronize()
        rows, w = self.host.tolist(), self.width
        return [_make_result(r[: r[-2]], r[w: w + r[-1]], wall, found, self.eos_ids)
                for r, wall, found in zip(rows, self.wall, self.found)]


def _make_result(out: list[int], acc: list[int], wall: float, found, eos_ids) -> Result:
    """A request's record: cut after the token that completes a stop string (`found`, `stops.py`), else as emitted;
    the accept counts cut with it (a round cut at end-of-text or the length cap: its count too)."""
    if found is not None:
        return Result(out[: found[1]], cut_rounds(acc, found[1]), wall, "stop")
    eos = bool(out) and out[-1] in eos_ids
    return Result(out, cut_rounds(acc, len(out)), wall, "eos" if eos else "length")


def check_token_ids(prompts, vocab_size: int) -> None:
    """A prompt id outside [0, vocab_size) fails here, named, not as a device-side assert in the embedding."""
    for i, p in enumerate(prompts):
        if len(p) and 0 <= min(p) and max(p) < vocab_size:  # the common case, in C
            continue
        bad = [int(t) for t in p if not 0 <= int(t) < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside the target's vocabulary of {vocab_size}: {bad[:5]}"
                             " (a tokenizer of another model?)")
