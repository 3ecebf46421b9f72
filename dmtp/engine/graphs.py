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
"""
from __future__ import annotations

import torch


class Graphs:
    """`stream`: the stream graphs are captured on (default: torch's one default capture stream). A captured cuBLAS
    call keeps the workspace of the stream it was captured on, so graphs that replay concurrently on two streams
    (the round's stages and a server's prompt pass beside them, `EngineConfig.admit_beside`) must be captured on two
    streams, or both write one workspace."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = enabled
        self.stream = stream
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
            side = torch.cuda.Stream()
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
