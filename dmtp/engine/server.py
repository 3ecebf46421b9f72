"""Dynamic batching over persistent slots (`Server`, `serve`), on the decode loop's `Batch` (`decode.py`).

A server keeps at most `cap` requests in flight. As soon as the host sees requests finished, their records are copied
out (`Batch.harvest`) and the next requests in arrival order are prefilled together and moved into the freed slots
(`Batch.absorb`); nothing of it waits on the host. The next group may instead be prefilled beside the running
requests before its slots are free, and take them as soon as they are (`EngineConfig.admit_beside`).

    srv = Server(target, method, cap=32, capacity=capacity_for(prompts, 256, method.k), max_new_tokens=256)
    srv.prepare(max(len(p) for p in prompts))   # capture every prompt-pass bucket at start-up
    results = srv.run(prompts)                   # later groups replay the same slots and graphs
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dmtp.compiling import announce
from dmtp.config import EngineConfig
from dmtp.engine import verify as V
from dmtp.engine.decode import Batch, collect
from dmtp.engine.slots import Harvest, Result, capacity_for, check_token_ids, engine_for, method_engine, use_graphs
from dmtp.engine.graphs import capture_stream, distinct_stream
from dmtp.engine.methods import Method, State
from dmtp.engine.prompts import PromptPass
from dmtp.engine.stops import StopStrings
from dmtp.models import fast


@dataclass
class Joining:
    """A group of newcomers prefilled, not yet in slots (`Server._begin`, `_join`)."""
    batch: Batch  # their prefilled batch, absorbed at the join
    requests: list[int]  # their indices in the group being served
    rounds_left: int  # rounds the running requests decode before the join
    ready: object  # event after their prefill on the side stream (None off CUDA)


class Server:
    """Dynamic batching over persistent slots: at most `cap` requests in flight; as soon as the host sees requests
    finished, the next ones in arrival order are prefilled together and take their slots. The slots (caches, state,
    CUDA graphs) outlive a `run`, so a server captures its graphs once — as a serving engine does at start-up — and
    later request groups replay them. Slots = the first group's size, at most `cap`; `capacity` bounds prompt +
    `max_new_tokens` (+ 2 blocks) of every request; `verify` as in `generate`. Newcomers join in groups of at least
    `engine.admit` (`EngineConfig`): each group costs one prompt pass and one move into the slots, whatever its size.
    No admission waits on the host: its copies are pinned and non-blocking, the newcomers' first tokens reach the host
    like a round's, and finished records are copied out without waiting (`Batch.harvest`). With
    `engine.admit_beside` = L > 0 the next group (max(`engine.admit`, the slots free at its start) requests) is
    prefilled beside the running requests (on CUDA a second stream) before its slots are free, and joins once enough
    slots are free and at least L rounds after its prefill began: its prompt pass overlaps the decode instead of
    holding it, and no slot waits for it.
    `admit_s`: seconds admissions held the decode (on CUDA device time between events; elsewhere host time);
    `beside_s`: device seconds of the prefills run beside it; `admit_host_s`: host seconds spent queueing them;
    `rounds`, `groups`: rounds stepped and groups admitted; all summed over runs."""

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
        self.admit_host_s = 0.0  # host time spent queueing admissions (on CUDA `admit_s` is their device time)
        self.beside_s = 0.0  # device time of the prompt passes run beside the decode (`engine.admit_beside`)
        self._marks: list = []  # CUDA events around each admission not yet added to `admit_s` (or `beside_s`)
        # newcomers prefilled beside the decode (`engine.admit_beside`): on CUDA a second stream, which waits for the
        # last join before it reuses what that join read (the prompt pass's static buffers, its own freed memory)
        # (a stream of its own: eager cuBLAS calls there must not share the workspace the round graphs were captured
        # with, `graphs.py`)
        self.side = (distinct_stream(capture_stream(target.device), device=target.device)
                     if target.device.type == "cuda" and self.eng.admit_beside else None)
        self._joining: Joining | None = None
        self._joined = None  # event on the decode stream after the last join
        self.prompt_pass = self._prompt_pass()

    def _prompt_pass(self):
        """The newcomers' prompt pass under `engine.prefill = "graphed"` (`prompts.py`): on the compiled engine its
        CUDA graphs (CUDA, full-attention targets, `engine.graphs` on); on the uncompiled fast engine the same padded
        pass uncompiled and uncaptured (the CPU tests' path). None: the batch's own pass (the first batch's always)."""
        if self.eng.prefill != "graphed" or self.engine == "hf":
            return None
        compiled = self.engine == "compiled"
        graphs = compiled and use_graphs(self.target, self.method, self.eng)
        own = type(self.method).prefill is not Method.prefill  # a method with a prefill of its own (not AR)
        return PromptPass(self.target, self.method.taps, self.cap, graphs, compile=compiled,
                          method=self.method if own else None, beside=self.side)

    def close(self):
        """Let go of the slots (caches, state, CUDA graphs) now, not when the server goes."""
        compiled = self.batch is not None and self.batch.engine == "compiled"
        self.batch = self._joining = self._joined = None
        self.prompt_pass = self._prompt_pass()  # its graphs and static caches go too
        if compiled:
            collect()

    def prepare(self, longest: int) -> int:
        """Capture the graphed prompt pass of every bucket that newcomers of at most `longest` tokens can meet
        (`PromptPass.capture_all`), as a serving engine does at start-up; without a graphed pass nothing. Returns the
        graphs captured."""
        if self.prompt_pass is None:
            return 0
        self._joined = None  # the side stream's next prefill waits for these captures too (`run`)
        cap = fast.round_capacity(self.capacity)  # the rows every batch of this server has (`Batch`)
        dev = self.target.device
        z = torch.zeros(1, dtype=torch.long, device=dev)
        st = State(lens=z, anchor=z, done=z.bool(), capacity=cap, eng=self.eng,
                   engine=method_engine(self.method, self.engine, self.eng, dev))
        return self.prompt_pass.capture_all(longest, cap, dev, st)

    def _new(self, prompts, t0, graphs=None, prompt_pass=None):
        return Batch(self.target, self.method, prompts, self.temperature, self.max_new_tokens, self.eos, self.gen,
                     self.capacity, t0, graphs, self.eng, self.stop, self.verify, prompt_pass)

    @torch.no_grad()
    def admit(self, slots: list[int], prompts: list[list[int]], t0: float):
        """Prefill `prompts` as one group and move them into the free `slots` of the running batch (one per prompt),
        queued behind the rounds in flight without a host synchronisation. Its time counts in `admit_s` (on CUDA the
        device time between events around its work, settled at the end of `run`: the time the admission holds the
        stream; elsewhere host time), the group in `groups`."""
        self._begin(prompts, t0, [], beside=False)
        self._join(slots)

    def _mark_joined(self):
        """After newcomers took their slots on the decode stream: the side stream's next prefill waits for this point
        (it rewrites what they were read from)."""
        if self.side is not None:
            self._joined = torch.cuda.Event()
            self._joined.record()

    def _settle(self):
        """Add the device time of the admissions since the last call to `admit_s` (prefills beside the decode to
        `beside_s`); waits for their events."""
        for a, b, beside in self._marks:
            b.synchronize()
            if beside:
                self.beside_s += a.elapsed_time(b) / 1e3
            else:
                self.admit_s += a.elapsed_time(b) / 1e3
        self._marks = []

    def _marked(self, fn, beside: bool = False):
        """fn() between two timing events on the current stream (CUDA; elsewhere its host time counts in admit_s)."""
        if self.target.device.type != "cuda":
            t = time.perf_counter()
            out = fn()
            if not beside:
                self.admit_s += time.perf_counter() - t
            return out
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = fn()
        b.record()
        self._marks.append((a, b, beside))
        return out

    def _begin(self, prompts: list[list[int]], t0: float, reqs: list[int], beside: bool = True):
        """Prefill a group of newcomers, to take slots at `_join`. `beside`: beside the decode (`engine.admit_beside`:
        on CUDA their prompt pass is queued on the side stream and runs while the running requests decode, before
        their slots are free; they may join that many rounds later); off, on the decode stream, to join at once."""
        ta = time.perf_counter()

        def prefill():
            return self._new(prompts, t0, graphs=False, prompt_pass=self.prompt_pass)

        if not beside or self.side is None:  # off CUDA: the same order of events, nothing runs beside
            new, ready = self._marked(prefill), None
        else:
            if self._joined is not None:
                self.side.wait_event(self._joined)
            with torch.cuda.stream(self.side):
                new = self._marked(prefill, beside=True)
                ready = torch.cuda.Event()
                ready.record()
        self._joining = Joining(new, reqs, self.eng.admit_beside if beside else 0, ready)
        self.admit_host_s += time.perf_counter() - ta

    def _join(self, slots: list[int]) -> list[int]:
        """The newcomers prefilled by `_begin` take the free `slots` (one each, in order; the decode stream first waits
        for a prefill run beside it); returns their requests."""
        j, self._joining = self._joining, None
        ta = time.perf_counter()
        if j.ready is not None:
            torch.cuda.current_stream().wait_event(j.ready)
        self._marked(lambda: self.batch.absorb(slots, j.batch))
        self._mark_joined()
        self.admit_host_s += time.perf_counter() - ta
        self.groups += 1
        return j.requests

    @torch.no_grad()
    def run(self, prompts: list[list[int]]) -> list[Result]:
        """Decode a group of requests; `wall_s` of a result counts from the start of the group (queueing included).
        The compiled engine's first group compiles and captures the server's graphs (said and timed: `announce`)."""
        what = f"the serving graphs of {self.method.name} at batch cap {self.cap} (the first group's decode included)"
        with announce(what, active=self.engine == "compiled"):
            return self._run(prompts)

    def _run(self, prompts: list[list[int]]) -> list[Result]:
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
        if self._joined is None:  # the side stream's first prefill comes after everything queued so far (the first
            self._mark_joined()  # batch, a `prepare`'s captures)
        harvests: list[tuple[Harvest, list[int]]] = []  # records on their way to the host, and whose they are
        while True:
            done = batch.poll()
            finished = [s for s in range(len(owner)) if owner[s] is not None and done[s]]
            if finished:  # their records are copied out before any newcomer can overwrite the slots
                harvests.append((batch.harvest(finished), [owner[s] for s in finished]))
                for s in finished:
                    owner[s] = None
            free = [s for s in range(len(owner)) if owner[s] is None]
            busy = len(owner) - len(free)
            j = self._joining
            if j is not None and len(free) >= len(j.requests) and (j.rounds_left <= 0 or busy == 0):
                slots = free[: len(j.requests)]
                for s, i in zip(slots, self._join(slots)):
                    owner[s] = i
                continue  # newcomers may already be finished (EOS as the first token)
            if queue and j is None and self.eng.admit_beside and busy:  # the next group, prefilled beside the
                # running requests before its slots are free: max(admit, the slots free now), as the queue allows
                n = min(max(self.eng.admit, len(free)), len(queue), len(owner))
                join, queue = queue[:n], queue[n:]
                self._begin([prompts[i] for i in join], t0, join)
                continue
            if queue and free and j is None and (len(free) >= min(self.eng.admit, len(queue)) or busy == 0):
                join, queue = queue[: len(free)], queue[len(free):]
                slots = free[: len(join)]
                self.admit(slots, [prompts[i] for i in join], t0)
                for s, i in zip(slots, join):
                    owner[s] = i
                continue  # newcomers may already be finished (EOS as the first token)
            if busy == 0 and self._joining is None:
                break
            batch.step()
            self.rounds += 1
            if self._joining is not None:
                self._joining.rounds_left -= 1
        for h, whose in harvests:
            for i, r in zip(whose, h.results()):
                out[i] = r
        self._settle()
        return out


@torch.no_grad()
def serve(target, method: Method, prompts: list[list[int]], cap: int, temperature: float = 0.0,
          max_new_tokens: int = 128, eos_ids=(), seed: int = 0, engine: EngineConfig | None = None,
          stop: StopStrings | None = None, verify: str = "target") -> list[Result]:
    """Dynamic batching of one request group (a `Server` used once)."""
    capacity = capacity_for(prompts, max_new_tokens, method.k)
    server = Server(target, method, cap, capacity, temperature, max_new_tokens, eos_ids, seed, engine, stop, verify)
    return server.run(prompts)
