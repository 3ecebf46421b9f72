"""Opt-in kernel fusion for decoding: `torch.compile` on the small pure-tensor pieces of every decoder layer.

At the sizes the suite trains itself, a decode round is bound by the number of kernels, not by bytes: an unfused HF
decoder layer launches ~74 small kernels per forward (RMSNorm in fp32 is five of them, rotary ten, SiLU-and-multiply
two, ...). CUDA graphs remove the launch gaps but not the kernels. `fuse` compiles the pieces that are pure functions
of their tensors and have no state — every `*RMSNorm` and `*MLP` module and the rotary helpers
(`apply_rotary_pos_emb` of each HF modeling module in use, the drafter's `apply_rope`) — so each becomes one or a few
Triton kernels. Attention and the KV cache stay as they are, so nothing about caching, masks or rollback changes.

    fusion = fuse(target, mtp_head, drafter)   # in place; the first call of each shape compiles (seconds)
    ...decode as usual (CUDA graphs capture the fused kernels)...
    fusion.undo()                              # back to the eager modules and functions

Shapes are dynamic (`dynamic=True`): prefill lengths do not recompile; the few specialisations dynamo still makes
(size 1 vs > 1, rank-3 hidden states vs rank-4 q/k heads through one norm class) fit under a raised recompile limit.
The outputs are the same computation with a different kernel schedule: in fp32 decoding stays token-identical to
the unfused target (tested); in bf16 a near-tie can round the other way, as between any two kernel schedules.
`bench --fuse` measures the effect side by side with the unfused engine in one run.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch
import torch.nn as nn

RECOMPILE_LIMIT = 64  # one norm class serves rank-3 hidden states and rank-4 q/k heads, batch 1 and B, q = 1 and k+1
PIECES = ("RMSNorm", "MLP")  # module class-name suffixes that are pure functions of their input
ROTARY = {"apply_rotary_pos_emb", "apply_rope"}  # module-level helpers looked up by name at call time


@dataclass
class Fusion:
    modules: list[nn.Module] = field(default_factory=list)
    functions: list[tuple[object, str, object]] = field(default_factory=list)  # (python module, name, original)
    limit: int | None = None  # dynamo's recompile limit before fusing

    def undo(self):
        for m in self.modules:
            m._compiled_call_impl = None  # what nn.Module.compile set
        for mod, name, orig in self.functions:
            setattr(mod, name, orig)
        if self.limit is not None:
            torch._dynamo.config.recompile_limit = self.limit
        self.modules, self.functions, self.limit = [], [], None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()

    def __str__(self):
        kinds = sorted({type(m).__name__ for m in self.modules})
        return (f"fused {len(self.modules)} modules ({', '.join(kinds)}) and "
                f"{len(self.functions)} functions ({', '.join(f'{m.__name__}.{n}' for m, n, _ in self.functions)})")


def fuse(*models: nn.Module | None, mode: str | None = None) -> Fusion:
    """Compile the fusable pieces of `models` (any of them None: skipped) in place; returns the handle to undo it.
    mode: torch.compile's mode (default: Inductor's default, no CUDA graphs of its own — the decode loop has them)."""
    f = Fusion(limit=torch._dynamo.config.recompile_limit)
    torch._dynamo.config.recompile_limit = max(f.limit, RECOMPILE_LIMIT)
    seen_mods, seen_fns = set(), set()
    for model in models:
        if model is None:
            continue
        for m in model.modules():
            if id(m) in seen_mods or not type(m).__name__.endswith(PIECES):
                continue
            seen_mods.add(id(m))
            m.compile(dynamic=True, fullgraph=True, mode=mode)
            f.modules.append(m)
            pymod = importlib.import_module(type(m).__module__)
            for name in ROTARY:
                fn = getattr(pymod, name, None)
                if callable(fn) and (pymod.__name__, name) not in seen_fns:
                    seen_fns.add((pymod.__name__, name))
                    setattr(pymod, name, torch.compile(fn, dynamic=True, fullgraph=True, mode=mode))
                    f.functions.append((pymod, name, fn))
    if not f.modules:
        f.undo()
        raise ValueError("nothing to fuse: no *RMSNorm or *MLP modules in the given models")
    return f
