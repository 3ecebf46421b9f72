"""Kernel profiles: where a decode's device time goes, by kind of kernel (`dmtp.analysis.kernels`), above torch
profiler's table (`profile_*.txt`)."""
from __future__ import annotations

from pathlib import Path

from dmtp.analysis.kernels import summary as kernel_summary
from dmtp.cli.bench.common import sync
from dmtp.config import EngineConfig
from dmtp.engine.decode import generate
from dmtp.io import write_text


def kernel_profile(tgt, m, prompts, tokens, path: Path, temperature: float = 0.0, engine: EngineConfig | None = None,
                   capacity: int | None = None):
    """Where a round's time goes: device time by kind of kernel (`dmtp.analysis.kernels`) and torch profiler's table
    over a `tokens`-token decode at `temperature` (CUDA graphs off, so every kernel is seen by name; the compiled
    engine launches the same kernels either way). `tokens` and `capacity` as when timed: the same shapes, the
    compiled code reused."""
    from torch.profiler import ProfilerActivity, profile

    eng = EngineConfig.of(engine).with_(graphs=False)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate(tgt, m, prompts, temperature, tokens, seed=0, engine=eng, capacity=capacity)
        sync(tgt.device)
    write_text(path, kernel_summary(prof.key_averages(), f"{m.name}, batch {len(prompts)}, {tokens} tokens, "
                                                            f"T = {temperature:g}, CUDA graphs off"))
    print(f"[bench] kernel profile -> {path}")
