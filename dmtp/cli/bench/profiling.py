"""Kernel profiles: where a decode's device time goes, by kind of kernel (`dmtp.analysis.kernels`), above torch
profiler's table (`profile_*.txt`)."""
from __future__ import annotations

import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from dmtp.analysis.kernels import device_times, summary as kernel_summary
from dmtp.cli.bench.common import sync, timed
from dmtp.config import EngineConfig
from dmtp.engine.decode import generate
from dmtp.io import write_text


def kernel_profile(tgt, m, prompts, tokens, path: Path, temperature: float = 0.0, engine: EngineConfig | None = None,
                   capacity: int | None = None):
    """Where a round's time goes: device time by kind of kernel and torch profiler's table over a `tokens`-token decode
    (CUDA graphs off, so every kernel is seen by name). `tokens` and `capacity` as when timed: the compiled code
    reused."""
    eng = EngineConfig.of(engine).with_(graphs=False)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate(tgt, m, prompts, temperature, tokens, seed=0, engine=eng, capacity=capacity)
        sync(tgt.device)
    write_text(path, kernel_summary(prof.key_averages(), f"{m.name}, batch {len(prompts)}, {tokens} tokens, "
                                                            f"T = {temperature:g}, CUDA graphs off"))
    print(f"[bench] kernel profile -> {path}")


def admission_profile(srv, prompts: list[list[int]], path: Path, n: int = 4) -> dict:
    """Where an admission's time goes (`Server.admit_s`), on a server that has served `prompts`: `n` admissions of a
    group of the size the server admits into its first slots, timed on the host after one untimed round of the same
    admissions (buckets captured), then one under torch profiler. With a graphed prompt pass the same admissions also
    run through the compiled pass, and the newcomers' first tokens are compared. Writes host and device time, on a
    GPU the time by kind of kernel, and the profiler's table by host time to `path`; returns {group, host_ms,
    device_ms} (+ compiled_host_ms, first_tokens_equal with a graphed pass)."""
    dev = srv.target.device
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    g = max(1, min(srv.eng.admit, srv.cap, len(srv.batch.wall)))
    groups = [[prompts[(i * g + j) % len(prompts)] for j in range(g)] for i in range(n + 1)]

    def admit(group):  # into the first slots of a server whose requests all ended; (host s, the newcomers' firsts)
        _, wall = timed(dev, srv.admit, list(range(len(group))), group, time.perf_counter())
        return wall, srv.batch.out[: len(group), 0].tolist()

    for grp in groups[:n]:  # untimed: every group's shapes compiled and, with a graphed pass, its bucket captured
        admit(grp)
    host = [admit(grp) for grp in groups[:n]]
    res = {"group": g, "host_ms": 1e3 * _median([w for w, _ in host])}
    head = f"admission of a group of {g}, {srv.method.name}, server cap {srv.cap}: host {res['host_ms']:.2f} ms"
    if srv.prompt_pass is not None:
        graphed, srv.prompt_pass = srv.prompt_pass, None
        try:
            admit(groups[0])  # its shape compiled
            comp = [admit(grp) for grp in groups[:n]]
        finally:
            srv.prompt_pass = graphed
        res["compiled_host_ms"] = 1e3 * _median([w for w, _ in comp])
        res["first_tokens_equal"] = sum(x == y for a, b in zip(host, comp) for x, y in zip(a[1], b[1]))
        failed = f", capture failed: {graphed.failed}" if graphed.failed else ""
        head += (f" graphed prompt pass ({graphed.captured} graphs captured{failed}) against "
                 f"{res['compiled_host_ms']:.2f} ms compiled; first tokens equal in {res['first_tokens_equal']} of "
                 f"{n * g}")
    with profile(activities=acts) as prof:
        admit(groups[n])
    avg = prof.key_averages()
    res["device_ms"] = sum(t for _, t in device_times(avg)) / 1e3 if dev.type == "cuda" else float("nan")
    head += f" (median of {n}), device {res['device_ms']:.2f} ms (kernels under the profiler)\n\n"
    body = kernel_summary(avg, "device time by kind of kernel:", row_limit=25) if dev.type == "cuda" else ""
    write_text(path, head + body + "\nhost time, by operator:\n" + avg.table(sort_by="cpu_time_total", row_limit=40))
    print(f"[bench] {head.strip()} -> {path}")
    return res


def _median(xs):
    return sorted(xs)[len(xs) // 2]
