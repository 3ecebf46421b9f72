"""The newcomers' prompt pass of a `Server` from CUDA graphs (`EngineConfig.prefill = "graphed"`).

Admitting a group of newcomers runs the target over their prompts. At a deep, narrow target the compiled pass
(`fast.prefill_forward`) is one dynamic-shape graph per layer, called once per layer from Python: its device work
is a few milliseconds, its host work (guards, the runtime wrapper, kernel launches) tens, and the decode loop waits
for it. Here the same compiled pass is captured into one CUDA graph per bucket — group size rounded up to a power
of two (at most the server's cap), prompt length rounded up to a multiple of `LENGTH_STEP` — and replayed.

Its attention reads the bucket's own cache rows (the padded prompt length), not the whole capacity: a prompt's
queries see no later row, and the score matrix no longer grows with `max_new_tokens`. Padding is exact for the rows
that count: padded prompts are right-padded (a row past a prompt's end holds padding, as on the unpadded pass, and is
rewritten by the first decode step that reaches it before any query sees it) and padded group rows are dropped.
What changes with the bucket is the shape of the kernels (a GEMM over more rows, a softmax over a longer, masked
row), so a request's prompt logits can differ from the unpadded pass in the last bits;
every method of a server shares the same pass, which is the losslessness that counts (each method against the
engine's own AR).

The pass writes its K/V rows into a static cache per group bucket; the newcomers' batch sees views of its first rows
and is absorbed into the running batch (`Batch.absorb`) before the next admission replays anything.

The method's own prefill (the MTP layer over the prompt, the drafter's context rows) is a second graph per bucket
(`prefill_method`): its first token comes between the two (a sample at T > 0 is drawn outside any graph). A copy of
the method per bucket holds the state that graph writes (its caches, the MTP hidden), and the newcomers' method takes
that state over (the attributes the prefill sets) until the next admission replays it.

Where a capture fails (a host synchronisation a new torch version puts inside a pass, say) the pass warns once and
runs uncaptured from then on: slower, never wrong.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings

import torch

from dmtp.engine.graphs import Graphs, capture_stream, distinct_stream
from dmtp.models import fast
from dmtp.models.cache import KVCache
from dmtp.models.target import TargetOut

LENGTH_STEP = 64  # prompt lengths are padded up to a multiple of this: a handful of graphs covers HumanEval


def group_bucket(n: int, cap: int) -> int:
    """The group size a group of `n` newcomers is padded to: the next power of two, at most `cap`."""
    if not 1 <= n <= cap:
        raise ValueError(f"a group of {n} newcomers does not fit a server of {cap} slots")
    return min(1 << (n - 1).bit_length(), cap)


def length_bucket(t: int, capacity: int, step: int = LENGTH_STEP) -> int:
    """The prompt length a group whose longest prompt has `t` tokens is padded to: a multiple of `step`, at most
    the cache's `capacity` rows (which holds the longest prompt)."""
    if not 1 <= t <= capacity:
        raise ValueError(f"a prompt of {t} tokens does not fit a cache of {capacity} rows")
    return min(-(-t // step) * step, capacity)


class PromptPass:
    """The graphed prompt pass of one server (one target, one method's taps, one cache capacity, `cap` slots).
    `graphs`: capture CUDA graphs (CUDA only); off, the same padded pass runs uncaptured (CPU tests).
    `compile`: the per-layer compiled forward (`fast.prefill_forward`), off on the uncompiled fast engine."""

    def __init__(self, target, taps, cap: int, graphs: bool, compile: bool = True, step: int = LENGTH_STEP,
                 method=None, beside=None):
        self.target, self.taps, self.cap, self.compile, self.step = target, taps, cap, compile, step
        self.method = method  # the server's method: its prefill graphed per bucket (None: the batch runs it)
        self.graph_method = method is not None  # off once its capture failed
        # captured on a stream of its own: its replays may run beside the round's graphs (on the server's stream
        # `beside`), and a captured cuBLAS call keeps its capture stream's workspace (`graphs.py`)
        own = distinct_stream(capture_stream(target.device), beside, device=target.device) if graphs else None
        self.graphs = Graphs(graphs, stream=own)
        self.copies: dict[tuple, object] = {}  # bucket key -> the method copy whose state the prefill graph writes
        self._last = None  # the last call's bucket: key, static inputs, full outputs, B, T
        self.state = None  # the `State` the method's prefill reads (capacity, engines), set by the first newcomers
        self.caches: dict[tuple[int, int], KVCache] = {}  # (group bucket, capacity) -> the static cache
        self.pos: dict[tuple[int, int], torch.Tensor] = {}  # (group, length bucket) -> static positions
        self.failed: str | None = None  # why capture was given up, if it was
        self.met: set[tuple[int, int]] = set()  # the (group, length) buckets run so far

    @property
    def captured(self) -> int:
        """Buckets whose prompt pass is captured so far."""
        return sum(k.startswith("prompt ") for k in self.graphs.graphs)

    def buckets(self, longest: int, capacity: int) -> list[tuple[int, int]]:
        """Every (group, length) bucket a server of this cap meets with prompts of at most `longest` tokens."""
        groups = sorted({group_bucket(n, self.cap) for n in range(1, self.cap + 1)})
        lengths = sorted({length_bucket(t, capacity, self.step) for t in range(1, longest + 1, self.step)}
                         | {length_bucket(longest, capacity, self.step)})
        return [(g, t) for g in groups for t in lengths]

    def capture_all(self, longest: int, capacity: int, device, state=None) -> int:
        """Capture every bucket of `buckets(longest, capacity)` now (a serving engine's start-up), so that no
        admission captures while requests wait; returns how many were new. Prompts of each bucket's shape: the graphs
        replay any prompts of their bucket. `state`: the `State` the method's prefill reads (needed to graph it)."""
        before = self.captured
        self.state = state if state is not None else self.state
        for g, t in self.buckets(longest, capacity):
            if (g, t) not in self.met:
                self(torch.ones(g, t, dtype=torch.long, device=device), torch.full((g,), t, device=device), capacity)
                if self.graph_method and self.state is not None:
                    self._method_stage(torch.ones(g, dtype=torch.long, device=device))
        return self.captured - before

    def __call__(self, ids: torch.Tensor, plen: torch.Tensor, capacity: int):
        """The prompt pass of right-padded prompts ids [B, T] (lengths plen [B]) into a cache of `capacity` rows per
        request: (TargetOut over the B rows and T positions, a KVCache of B rows viewing the static cache). The
        views are valid until the next call."""
        B, T = ids.shape
        Bb, Tb = group_bucket(B, self.cap), length_bucket(T, capacity, self.step)
        self.met.add((Bb, Tb))
        key = (Bb, capacity)
        if key not in self.caches:
            self.caches[key] = KVCache(Bb, capacity, fast=True)
        cache = self.caches[key]
        pos = self.pos.get((Bb, Tb))
        if pos is None:
            pos = self.pos[(Bb, Tb)] = torch.arange(Tb, device=ids.device)[None].expand(Bb, Tb).contiguous()
        x = ids.new_zeros(Bb, Tb)
        x[:B, :T] = ids
        p = plen.new_ones(Bb)  # padded group rows: a one-token prompt, dropped below
        p[:B] = plen

        def run(x, p):
            return fast.prefill_forward(self.target, x, pos, cache, self.taps, p, compile=self.compile, rows=Tb)

        stage = f"prompt {Bb}x{Tb}x{capacity}"
        out = self._graphed(stage, run, x, p, off=self._all_off)
        static = self.graphs.graphs[stage][1] if stage in self.graphs.graphs else [x, p]  # what the graph reads
        self._last = ((Bb, Tb, capacity), static[0], static[1], out, B, T)
        view = KVCache(B, capacity, fast=True)
        view.k = {i: t[:B] for i, t in cache.k.items()}
        view.v = {i: t[:B] for i, t in cache.v.items()}
        taps = out.taps[:B, :T] if out.taps is not None else None
        return type(out)(out.logits[:B], out.hidden[:B, :T], taps), view

    def _graphed(self, stage, fn, *inputs, off):
        """`fn(*inputs)` from its graph; a capture that fails calls `off` (what runs uncaptured from now on), warns
        once and runs `fn` uncaptured."""
        try:
            return self.graphs(stage, fn, *inputs)
        except Exception as e:  # noqa: BLE001 - any capture failure: the uncaptured pass is always right
            if not self.graphs.enabled:
                raise
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.failed = f"{stage}: {type(e).__name__}: {e}".splitlines()[0]
            warnings.warn(f"graphed prompt pass: capture failed ({self.failed}); it runs uncaptured from now on")
            off()
            return fn(*inputs)

    def _all_off(self):
        self.graphs = Graphs(False)

    def _method_off(self):  # the method's prefill runs as the batch runs it; the prompt pass keeps its graphs
        self.graph_method = False

    def _method_stage(self, anchor_b: torch.Tensor):
        """The method's prefill over the last call's bucket, from its graph, first tokens `anchor_b` [B]: returns
        the bucket's method copy, which holds the state."""
        key, x, p, out, B, T = self._last
        Bb = x.shape[0]
        m = self.copies.get(key)
        if m is None:
            m = self.copies[key] = copy.copy(self.method)
        a = anchor_b.new_zeros(Bb)
        a[:B] = anchor_b
        st0 = self.state

        def run(a, hidden, *taps):
            m.prefill(dataclasses.replace(st0, lens=p, anchor=a, done=torch.zeros_like(a, dtype=torch.bool)), x, p,
                      TargetOut(None, hidden, taps[0] if taps else None))
            return tuple(m.buffers())

        taps = () if out.taps is None else (out.taps,)
        self._graphed(f"method {key[0]}x{key[1]}x{key[2]}", run, a, out.hidden, *taps, off=self._method_off)
        return m

    def prefill_method(self, method, st, ids, plen, out):
        """`method.prefill(st, ids, plen, out)` for the newcomers of the last call (their first tokens st.anchor):
        from the bucket's graph where this pass graphs the method (`method` then takes over the state of the
        bucket's copy: every attribute its prefill sets), else run as is."""
        last = self._last
        if not self.graph_method or last is None or ids.shape != (last[4], last[5]):
            method.prefill(st, ids, plen, out)
            return
        self.state = st
        m = self._method_stage(st.anchor)  # a capture that fails here leaves the copy's state computed uncaptured
        for name in self.state_attrs(m):
            setattr(method, name, getattr(m, name))

    def state_attrs(self, m) -> list[str]:
        """The attributes of a method copy that its prefill sets (those that differ from the server's method)."""
        base, own = vars(self.method), ("run", "draw", "timer")  # the batch's own hooks stay the batch's
        return [k for k, v in vars(m).items() if k not in own and (k not in base or base[k] is not v)]
