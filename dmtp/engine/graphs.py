"""CUDA graphs for the decode loop's stages: captured on first use, replayed every later round.

A stage is a function of tensors. Its first call runs it once eagerly on a side stream (lazy initialisation —
cuBLAS workspaces, cache buffers — must not happen inside a capture), then captures it into a graph whose inputs are
static copies of the call's inputs; every later call copies the new inputs into those copies (skipped when the caller
passes the very tensor the graph reads, e.g. another graph's output or a persistent state buffer) and replays.
The outputs are the graph's own tensors, overwritten by the next replay: consume them within the round.

What this asks of a stage (the decode loop is written this way, and the capture itself enforces the first two):
  - no host synchronisation (`.item()`, `.tolist()`, data-dependent shapes) and no host-to-device copies;
  - every tensor it reads or writes that is not an input is persistent (preallocated caches, state buffers updated
    in place), because the graph replays the addresses it saw at capture;
  - running it twice with the same inputs is harmless (the warm-up run precedes the captured one): stages write
    cache rows at positions given by their inputs and state buffers from their inputs, so a rerun rewrites the same
    values; a stage that updates state from its own old value (the loop's bookkeeping: counters, done flags) names
    those tensors in `updates`, and the warm-up's updates are undone before the capture.
All stages of one batch share one memory pool and replay in the order they were captured.

Streams. A captured cuBLAS call keeps the workspace of the stream it was captured on (torch keeps one workspace per
(handle, stream)), so two graphs that may replay at the same time on two streams must have been captured on two
different CUDA streams, or both write one workspace: the round's stages and a server's prompt pass beside them
(`EngineConfig.admit_beside`). torch hands out its streams round-robin from a pool of 32 per priority, so a new
`torch.cuda.Stream()` can be an old one again: `capture_stream()` is the stream every `Graphs` captures on unless told
otherwise (its warm-up runs there too), and `distinct_stream(*others)` draws one whose CUDA stream none of `others` is.
"""
from __future__ import annotations

import torch

_CAPTURE: dict[int, object] = {}  # device index -> the default capture stream of `Graphs`
POOL = 32  # streams per priority in torch's pool (handed out round-robin)


def capture_stream(device=None):
    """The stream `Graphs` capture on by default (one per device, made on first use): the rounds' stages."""
    dev = None if device is None else torch.device(device)
    idx = torch.cuda.current_device() if dev is None or dev.index is None else dev.index
    if idx not in _CAPTURE:
        with torch.cuda.device(idx):
            _CAPTURE[idx] = torch.cuda.Stream()
    return _CAPTURE[idx]


def distinct_stream(*others, device=None):
    """A new stream from torch's pool whose CUDA stream is none of `others`' (None entries ignored): a stream whose
    work (or whose captured graphs' cuBLAS workspace) may run beside theirs."""
    taken = {s.cuda_stream for s in others if s is not None}
    for _ in range(POOL * 2 + 1):
        s = torch.cuda.Stream() if device is None else torch.cuda.Stream(device)
        if s.cuda_stream not in taken:
            return s
    raise RuntimeError(f"torch's stream pool has no stream besides {len(taken)} taken ones")


class Graphs:
    """`stream`: the stream graphs are captured on (default `capture_stream()`); graphs that replay beside another
    `Graphs`' must be captured on a stream of their own (`distinct_stream`, module docstring)."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = enabled
        self.stream = (stream if stream is not None else capture_stream()) if enabled else None
        self.pool = torch.cuda.graph_pool_handle() if enabled else None
        self.graphs: dict[str, tuple] = {}  # stage -> (graph, static inputs, outputs)
        self.keep: set[int] = set()  # data_ptrs of persistent tensors that a graph may read in place

    def persistent(self, *tensors):
        """Declare state buffers that live as long as the batch and are updated in place (read without a copy)."""
        self.keep.update(t.data_ptr() for t in tensors)

    def __call__(self, stage: str, fn, *inputs, compile=None, updates=()):
        """Run (or replay) stage `fn`; `compile` (fn -> compiled fn, e.g. `fast.compile_fn`): applied before the stage
        runs (torch.compile caches per code object — a lambda or method of any batch — and input shapes)."""
        if compile is not None and (not self.enabled or stage not in self.graphs):
            fn = compile(fn)
        if not self.enabled:
            return fn(*inputs)
        ent = self.graphs.get(stage)
        if ent is None:
            static = [x if x.data_ptr() in self.keep else x.clone() for x in inputs]
            saved = [t.clone() for t in updates]
            side = self.stream  # the warm-up's cuBLAS calls use the workspace its graph will keep
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(*static)
            torch.cuda.current_stream().wait_stream(side)
            for t, s in zip(updates, saved):
                t.copy_(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                out = fn(*static)
            for t in _tensors(out):  # later stages read this stage's outputs in place
                self.keep.add(t.data_ptr())
            self.graphs[stage] = ent = (graph, static, out)
        graph, static, out = ent
        for s, x in zip(static, inputs):
            if s.data_ptr() != x.data_ptr():
                s.copy_(x)
        graph.replay()
        return out


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if hasattr(out, "__dataclass_fields__"):
        return [t for f in out.__dataclass_fields__ for t in _tensors(getattr(out, f))]
    return []
