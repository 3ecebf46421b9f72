"""Training throughput, the eager and the compiled path side by side in one run (`make bench-train`): target
pretraining (tokens/s, MFU) and drafter training (steps/s, every variant of the ablation side by side), each through
the real training loop with `compile="off"` and then `"auto"`. Between them pretraining runs the compiled path with
the plain LM-head loss (`fused_ce="off"`) and the drafters the compiled path's former structure (`per_drafter`: one
compiled region per drafter), so the fused loss and the one-region step are measured against them in the same run.

    python -m dmtp.cli.bench_train --profile mini --out results/mini/bench          # H200: a few minutes
    python -m dmtp.cli.bench_train --profile smoke --out /tmp/bt --steps 8 --warm 2  # CPU smoke, ~1 min (all eager)

The target has the profile's shape and random weights, the tokens are random (a step's speed does not depend on
them). Rates are steady-state: from the history record at step `--warm` to the last one (each record is taken after
its values were read back, so the GPU has caught up). MFU = tokens/s x training FLOPs per token
(`pretrain.train_flops_per_token`) / the device's dense bf16 peak (`training.common.peak_flops`).

train.json    per path: steps timed, steady rate, wall time of the whole call (compile included), MFU; pretraining
              also the peak of allocated GPU memory (`peak_gib`)
ratios.json   the ratio records, merged by target name with what `dmtp.cli.bench` wrote
profile_train_<part>.txt   --kernel-profile N: device time by kind of kernel and the profiler's table over --warm + N
              steps of the part's last path
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from dmtp.analysis.kernels import summary as kernel_summary
from dmtp.analysis.ratios import Ratio, merge, read, write
from dmtp.checks import require
from dmtp.cli.args import compile_cache_flag, use_compile_cache
from dmtp.experiment import drafter_config
from dmtp.io import write_json, write_meta, write_text
from dmtp.training.common import peak_flops
from dmtp.training.drafters import new_drafters, train_drafters
from dmtp.training.pretrain import build_target, pretrain, train_flops_per_token
from dmtp.profiles import resolve

# the paths: (pretraining config settings, drafter-training config settings); None: the part has no such path
PATHS = {"eager": (dict(compile="off", fused_ce="off"), dict(compile="off")),
         "compiled_plain_ce": (dict(compile="auto", fused_ce="off"), None),
         "per_drafter": (None, dict(compile="auto", one_region=False)),
         "compiled": (dict(compile="auto", fused_ce="auto"), dict(compile="auto", one_region=True))}
GOALS = {"mfu": 0.35, "drafter_speedup": 4.0}  # goals: >= 35 % MFU; drafter steps/s >= 4x the eager path
# measured on an H200 with the eager paths alone (before the compiled ones existed): printed beside the new numbers
BEFORE = {"mini": {"pretrain": "0.56 M tok/s", "drafters": "~5 steps/s"}}


def steady_rate(hist: list[dict], warm: int, count: str) -> tuple[float, int]:
    """(units of `count` per second, steps timed) between the first record at or after step `warm` and the last."""
    recs = [h for h in hist if h["step"] >= warm]
    require(len(recs) >= 2, f"need two history records from step {warm} on, got {len(recs)}: raise --steps")
    a, b = recs[0], recs[-1]
    return (b[count] - a[count]) / (b["elapsed_s"] - a["elapsed_s"]), b["step"] - a["step"]


def random_target(prof, dev: str, frozen: bool = False):
    """The profile's target and MTP head with random weights (seed 0) on `dev`; `frozen`: in eval mode, no grads."""
    torch.manual_seed(0)
    tgt, mtp = build_target(prof.model.arch, prof.data.vocab_size, eos_id=0)
    for m in (tgt.model, mtp):
        m.to(dev)
        if frozen:
            m.eval().requires_grad_(False)
    return tgt, mtp


def quietly(train, *args):
    """(train(*args, a temporary folder, log=nothing), wall seconds)."""
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        out = train(*args, tmp, log=lambda *_: None)
    return out, time.time() - t0


def bench_pretrain(prof, dev: str, path: str, steps: int, warm: int) -> dict:
    """`steps` pretraining steps of the profile's target (random weights and tokens) on one process."""
    tgt, mtp = random_target(prof, dev)
    p = prof.pretrain
    tokens = np.random.default_rng(0).integers(0, prof.data.vocab_size, 4_000_000).astype(np.int32)
    cfg = replace(p, tokens=steps * p.batch_size * p.seq_len, log_every=warm, save_every=10 ** 9, stop_after=0,
                  **PATHS[path][0])
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    (hist, info), wall = quietly(pretrain, tgt, mtp, tokens, cfg)
    mem = torch.cuda.max_memory_allocated() / 2 ** 30 if dev == "cuda" else None
    rate, timed = steady_rate(hist, warm, "tokens")
    flops, peak = train_flops_per_token(tgt, mtp, p.seq_len), peak_flops(dev)
    return {"tokens_per_s": rate, "steps_timed": timed, "wall_s": wall, "compiled": info["compiled"],
            "fused_ce": info["fused_ce"], "peak_gib": mem, "flops_per_token": flops, "peak_flops": peak,
            "mfu": rate * flops / peak if peak else None, "batch": p.batch_size, "seq_len": p.seq_len}


def bench_drafters(prof, dev: str, path: str, steps: int, warm: int) -> dict:
    """`steps` drafter-training steps of every variant of the ablation side by side (the profile's drafter shape and
    recipe, bf16 autocast on GPU), on a random-weight target and random sequences of max_len / 2 .. max_len tokens."""
    tgt, mtp = random_target(prof, dev, frozen=True)
    t, rng = prof.train, random.Random(0)
    seqs = [[rng.randrange(prof.data.vocab_size) for _ in range(rng.randrange(t.max_len // 2, t.max_len + 1))]
            for _ in range(4 * t.batch_size)]
    variants = list(prof.ablation.variants)
    drafters = new_drafters(tgt, variants, dict(drafter_config(prof, tgt.config, mask_token_id=1), seed=t.seed))
    cfg = replace(t, steps=steps, log_every=warm, save_every=10 ** 9, stop_after=0, amp_bf16=dev == "cuda",
                  **PATHS[path][1])
    hist, wall = quietly(train_drafters, tgt, mtp, drafters, seqs, cfg)
    rate, timed = steady_rate(hist[variants[-1]], warm, "step")  # the last drafter's record closes its step
    return {"steps_per_s": rate, "steps_timed": timed, "wall_s": wall, "drafters": len(drafters),
            "batch": t.batch_size, "max_len": t.max_len, "anchors_per_seq": t.anchors_per_seq}


def record(setup: str, name: str, value: float, direction: str = "report", goal: float | None = None,
           note: str = "") -> Ratio:
    """One typed ratio record (`dmtp.analysis.ratios`), printed as it is made."""
    r = Ratio(setup, name, round(float(value), 4), direction, goal, note=note)
    print(f"[bench-train] {'MET ' if r.met else 'MISS'} {r.target}: {r.value:.3f} (goal {r.goal_text}) {note}",
          flush=True)
    return r


def ratio_records(label: str, res: dict) -> list[Ratio]:
    """The ratio records of a run's results (paths that failed left out)."""
    out, before, pre, dr = [], BEFORE.get(label, {}), res.get("pretrain", {}), res.get("drafters", {})
    if "eager" in pre and "compiled" in pre:
        e, c = pre["eager"], pre["compiled"]
        out.append(record(label, "pretraining tok/s, compiled / eager", c["tokens_per_s"] / e["tokens_per_s"],
                          note=f"{c['tokens_per_s'] / 1e6:.3f} M vs {e['tokens_per_s'] / 1e6:.3f} M tok/s"
                          + (f" (before: {before['pretrain']})" if before else "")))
        if c["mfu"] is not None:
            out.append(record(label, "pretraining MFU (compiled, bf16)", c["mfu"], ">=", GOALS["mfu"],
                              f"{c['flops_per_token'] / 1e6:.1f} MFLOP/token x {c['tokens_per_s'] / 1e6:.3f} M "
                              f"tok/s / {c['peak_flops'] / 1e12:.0f} TFLOP/s; eager {e['mfu']:.3f}"))
    if "compiled" in pre and "compiled_plain_ce" in pre:
        c, pl = pre["compiled"], pre["compiled_plain_ce"]
        mfu = f"; MFU {c['mfu']:.3f} vs {pl['mfu']:.3f}" if c["mfu"] is not None else ""
        off = "" if c["fused_ce"] else " (fused_ce auto: off on this device, both rows the plain loss)"
        out.append(record(label, "pretraining tok/s, fused / plain LM-head loss (compiled)",
                          c["tokens_per_s"] / pl["tokens_per_s"],
                          note=f"{c['tokens_per_s'] / 1e6:.3f} M vs {pl['tokens_per_s'] / 1e6:.3f} M tok/s{mfu}{off}"))
    if "eager" in dr and "compiled" in dr:
        e, c = dr["eager"], dr["compiled"]
        out.append(record(label, f"drafter training steps/s, {c['drafters']} drafters side by side, compiled / eager",
                          c["steps_per_s"] / e["steps_per_s"], ">=", GOALS["drafter_speedup"],
                          f"{c['steps_per_s']:.2f} vs {e['steps_per_s']:.2f} steps/s"
                          + (f" (before: {before['drafters']})" if before else "")))
    if "per_drafter" in dr and "compiled" in dr:
        p, c = dr["per_drafter"], dr["compiled"]
        out.append(record(label, "drafter training steps/s, one compiled region / one per drafter",
                          c["steps_per_s"] / p["steps_per_s"],
                          note=f"{c['steps_per_s']:.2f} vs {p['steps_per_s']:.2f} steps/s"))
    return out


def profile_part(fn, prof, dev: str, path: str, steps: int, warm: int, file: Path) -> None:
    """Where a training step's time goes: `fn` (bench_pretrain or bench_drafters) for `steps` steps under torch
    profiler; device time by kind of kernel and the profiler's table written to `file`."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as p:
        fn(prof, dev, path, steps, warm)
    write_text(file, kernel_summary(p.key_averages(), f"{fn.__name__}, {path} path, {steps} steps, {dev}"))
    print(f"[bench-train] kernel profile -> {file}", flush=True)


def bench_train(profile: str, out: str | Path, steps: int = 40, warm: int = 10, parts=("pretrain", "drafters"),
                paths=tuple(PATHS), drafter_steps: int | None = None, kernel_profile: int = 0) -> list[Ratio]:
    """Run the benchmark, write train.json (+ meta) and merge the ratio records into ratios.json; returns them. A part
    runs the `paths` it has (`PATHS`), in the order given; a failing path is recorded with its error. `kernel_profile`
    > 0: then each part's last path again for that many steps under the profiler (profile_train_<part>.txt)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    prof = resolve(profile)
    out = Path(out)
    res: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__}
    t0 = time.time()
    for part, fn, n in [("pretrain", bench_pretrain, steps), ("drafters", bench_drafters, drafter_steps or steps)]:
        if part not in parts:
            continue
        run = [p for p in paths if PATHS[p][part == "drafters"] is not None]
        for path in run:
            try:
                r = fn(prof, dev, path, n, warm)
            except Exception as e:  # noqa: BLE001 - recorded, and the other paths still measured
                r = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print(f"[bench-train] {profile} {part} {path}: {json.dumps(r)}", flush=True)
            res.setdefault(part, {})[path] = r
            if dev == "cuda":
                torch.cuda.empty_cache()
        if kernel_profile and run:
            profile_part(fn, prof, dev, run[-1], warm + max(kernel_profile, 2), warm,  # 2: a rate to measure
                         out / f"profile_train_{part}.txt")
    ok = {p: {k: v for k, v in r.items() if "error" not in v} for p, r in res.items() if isinstance(r, dict)}
    recs = ratio_records(profile, ok)
    write_json(out / "train.json", res)
    write_meta(out / "meta_train.json", {"profile": profile, "steps": steps, "warm": warm, "parts": list(parts),
                                         "paths": {p: PATHS[p] for p in paths}, "pretrain": asdict(prof.pretrain),
                                         "train": asdict(prof.train)}, wall_s=time.time() - t0)
    write(out / "ratios.json", merge(read(out / "ratios.json"), recs))
    return recs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="mini" if torch.cuda.is_available() else "smoke")
    ap.add_argument("--out", required=True, help="bench folder, e.g. results/mini/bench")
    ap.add_argument("--steps", type=int, default=40, help="steps per path (pretraining; drafters too unless "
                                                          "--drafter-steps)")
    ap.add_argument("--drafter-steps", type=int, help="drafter-training steps per path")
    ap.add_argument("--warm", type=int, default=10, help="steps before the timed window (compile, warm-up)")
    ap.add_argument("--parts", default="pretrain,drafters", help="pretrain, drafters or both")
    ap.add_argument("--paths", default=",".join(PATHS), help="any of eager, compiled_plain_ce (pretraining only), "
                    "per_drafter (drafters only), compiled")
    ap.add_argument("--kernel-profile", type=int, default=0, metavar="STEPS",
                    help="then the last path of each part again, --warm + STEPS steps under the profiler: device "
                         "time by kind of kernel -> profile_train_<part>.txt")
    compile_cache_flag(ap)
    a = ap.parse_args(argv)
    use_compile_cache(a.compile_cache)  # before anything compiles
    parts, paths = a.parts.split(","), a.paths.split(",")
    bad = sorted(set(parts) - {"pretrain", "drafters"}) + sorted(set(paths) - set(PATHS))
    if bad:
        ap.error(f"unknown part or path: {', '.join(bad)}")
    if a.steps <= a.warm or (a.drafter_steps or a.steps) <= a.warm:
        ap.error(f"--steps must exceed --warm ({a.warm}): the rate is measured after the warm-up")
    bench_train(a.profile, a.out, a.steps, a.warm, parts, paths, a.drafter_steps, a.kernel_profile)


if __name__ == "__main__":
    main()
