"""torch.compile's first run said out loud: a line before it ("compiling ..."), its wall time and what the compile
cache held after. On a fresh GPU machine the first decode of a method compiles and autotunes for minutes before its
first record; the same shapes in a later process read Inductor's caches (compiled graphs, autotuning results, Triton
kernels) and start in seconds. Where those caches live is the entry point's setting (`dmtp/cli/args.py`,
`--compile-cache`), given to torch there; this module reads only torch's own state.

    with announce("the decode graphs of dflash for batch 32", active=engine == "compiled"):
        batch = Batch(...); batch.step()      # the first round compiles and captures every stage
"""
from __future__ import annotations

import contextlib
import sys
import time

_SAID: set[str] = set()  # what this process has announced: each compile is said once


def counts() -> dict[str, int]:
    """torch's counters so far in this process: graphs dynamo made, and Inductor's compiled-graph cache (FX graph
    cache) hits, misses and bypasses."""
    from torch._dynamo.utils import counters

    ind = counters["inductor"]
    return {"graphs": int(counters["stats"]["unique_graphs"]), "hits": int(ind["fxgraph_cache_hit"]),
            "misses": int(ind["fxgraph_cache_miss"]), "bypassed": int(ind["fxgraph_cache_bypass"])}


def cache_dir() -> str:
    """The directory Inductor keeps its caches in, as torch resolves it (the entry point's `--compile-cache`)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_dir

    return inductor_dir()


def _sync():
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def announce(what: str, active: bool = True, out=None):
    """Around the first run of something compiled: when `active` and not yet said in this process, one line before
    (what it compiles, where the cache is) and one after (its wall time, the graphs made, the cache's hits and
    misses), to `out` (default stderr). Otherwise nothing."""
    if not active or what in _SAID:
        yield
        return
    _SAID.add(what)
    out = out or sys.stderr
    print(f"compiling {what} (the first run on a machine: ~1-3 min on a GPU; later runs read the compile cache "
          f"{cache_dir()})", file=out, flush=True)
    before, t0 = counts(), time.perf_counter()
    yield
    _sync()
    after = counts()
    d = {k: after[k] - before[k] for k in after}
    bypassed = f", {d['bypassed']} not cacheable" if d["bypassed"] else ""
    print(f"compiled {what} in {time.perf_counter() - t0:.1f} s: {d['graphs']} graphs, compile cache {d['hits']} "
          f"hits / {d['misses']} misses{bypassed}", file=out, flush=True)
