"""Benchmarks through the one decode loop; artifacts under results/<profile>/bench/ (rendered by dmtp.analysis.report).

    python -m dmtp.cli.bench --target work/mini/target --drafters work/mini/drafters --out results/mini/bench
    python -m dmtp.cli.bench --paper-shape --out results/mini/bench      # random weights, Qwen3-8B shape: timing only
    python -m dmtp.cli.bench --mini-shape --out results/mini/bench       # random weights, mini shape: timing only
    python -m dmtp.cli.bench --mini-shape --shape-parts engines --shape-engines compiled+dense+gw+tuned \
        --shape-methods zero_init_residual --out DIR       # mini's fixed kernels beside the autotuned ones, steady
    python -m dmtp.cli.bench --target work/tiny/target --drafters work/tiny/drafters --out /tmp/b \
        --tokens 64 --caps 1,2 --prompts 8 --max-new-tokens 32 --parts overhead,hf   # CPU smoke run, ~1 min
(`make bench-shapes` runs the random-weight parts; `make test-gpu` the GPU tests.)

overhead.csv    ms per round by stage at batch `--batch` over `--tokens` tokens (EOS ignored, the first 16 rounds
                excluded); --paper-shape / --mini-shape: at a random-weight target of that shape, methods
                "8b-shape:<name>" / "mini-shape:<name>" ("+dense": the dense attention kernel, "@hf": the HF layers)
throughput.csv  output tokens / wall time of the whole request group at each batch cap (natural EOS, dynamic
                batching: `server.serve`); `--verify target,sample,block` adds rows `<method>+<mode>`
hf.csv          batch 1, T = 0: the engine vs a plain HF `generate` loop: tok/s, identical outputs, AR's HBM bound
screen.csv      the screened T1 head: T1 agreement with the exact head, acceptance with and without it
baselines.csv   --paper-shape / --mini-shape, batch 1: the engine, the loop on the HF layers, HF's static-cache
                compiled `generate`, the plain HF loop (mini): tok/s (median, min, max of `--repeats` interleaved
                repeats) and the HBM bound. Engine labels: "+dense" (dense attention), "+gw" (the K/V write inside the
                compiled graphs), "+tuned" (autotuned kernels), "+timed" (Inductor's heuristics, launch settings
                timed); none: the library's default, fixed kernel choices
regen.csv       the data stage's regeneration (AR, `--regen-batch` prompts at once): tok/s, ms per step, per engine
profile_*.txt   --kernel-profile: torch-profiler tables of a decode's kernels; profile_admission_*.txt: one
                admission's host against device time
kernels.csv     --kernel-sweep L1,L2,..: AR at batch 1 with each attention kernel at contexts of about L tokens
ratios.json     the targets, each measured side by side in one run (typed records, `dmtp.analysis.ratios`)

Which runs are timed and which are "DMTP" and "DFlash" comes from the profile's ablation spec (`--profile`, default:
the folder above --target): `ablation.bench`, `main_method`, `drafter_baseline`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from dmtp.analysis import ratios as RT
from dmtp.checks import require
from dmtp.cli.args import (at_least, compile_cache_flag, guard, listed, method_checkpoints, names, number, out_dir,
                           temperature, use_compile_cache)
from dmtp.cli.bench.common import Stamped, engine_setting, merge_overhead, merge_rows
from dmtp.cli.bench.shapes import mini_shape, paper_shape
from dmtp.cli.bench.trained import PARTS, Bench, throughput_ratios
from dmtp.config import VERIFY_MODES
from dmtp.config.engine import server_variant
from dmtp.io import write_meta
from dmtp.profiles import PROFILES, resolve


def checked(check, split: bool = False):
    """argparse type: the text (with `split`: its comma-separated names) once `check` accepted it (each name); a
    ValueError of `check` is argparse's error."""
    def parse(s):
        out = names(s) if split else s
        try:
            for x in out if split else [s]:
                check(x)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return out
    return parse


server_variants = checked(server_variant, split=True)  # `config.engine.server_variant`: e.g. beside2+flight1
engine_label = checked(engine_setting)  # "<engine>[+dense][+gw][+tuned|+timed]" (`bench.common.engine_setting`)
verify_modes = checked(lambda m: require(m in VERIFY_MODES, f"unknown verify mode {m!r}; modes: "
                                                            f"{', '.join(VERIFY_MODES)}"), split=True)


def main(argv=None):
    p = parser()
    a = p.parse_args(argv)
    parts = set(a.parts.split(","))
    if not (parts <= set(PARTS) or parts == {"ratios"}):
        p.error(f"argument --parts: expected {','.join(PARTS)} (any of them) or ratios, got {a.parts!r}")
    raw = sys.stdout
    sys.stdout = raw if isinstance(raw, Stamped) else Stamped(raw)  # each "[bench]" line with its time since the start
    try:
        guard("python -m dmtp.cli.bench", run, p, a)
    finally:
        sys.stdout = raw


def parser() -> argparse.ArgumentParser:
    """The benchmark's arguments."""
    p = argparse.ArgumentParser(prog="python -m dmtp.cli.bench", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", help="target checkpoint with the native MTP head (not needed with --paper-shape)")
    p.add_argument("--drafters", help="directory of trained drafters (<name>/drafter)")
    p.add_argument("--profile", help="whose ablation spec names the runs (default: the folder above --target, else "
                   "mini); also the ratio records' setup")
    p.add_argument("--methods", type=names, help="runs to time, comma-separated (default: the spec's ablation.bench)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a profile field for this run (repeatable, as `dmtp pipeline --set`)")
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"any of {','.join(PARTS)}; `ratios` alone recomputes ratios.json from the CSVs")
    p.add_argument("--paper-shape", action="store_true", help="only the random-weight Qwen3-8B-shape timing run")
    p.add_argument("--mini-shape", action="store_true",
                   help="only the random-weight timing run at the profile's (default mini) target shape")
    p.add_argument("--shape-parts", type=listed(str), default=["engines", "admission", "baselines", "regen"],
                   help="--mini-shape: beside the stage times on the profile's engine, any of engines (the same on "
                        "other engines), admission, baselines, regen (default: all)")
    p.add_argument("--shape-engines", type=listed(engine_label), default=None, metavar="LABEL,LABEL",
                   help="--mini-shape, part engines: these engine labels (e.g. compiled+tuned) beside the profile's "
                        "own instead of the compiled defaults and the HF layers")
    p.add_argument("--shape-methods", type=names, default=None, metavar="NAME,NAME",
                   help="--mini-shape: time only these of ar, the drafter baseline and the main method")
    p.add_argument("--regen-batch", type=at_least(0), default=2048,
                   help="--mini-shape and part `regen`: prompts decoded at once as the data stage does (0: skip)")
    p.add_argument("--kernel-profile", action="store_true", help="also write torch-profiler kernel tables")
    p.add_argument("--kernel-sweep", type=listed(at_least(2)), default=[],
                   help="--paper-shape / --mini-shape: contexts (tokens) at which AR batch 1 is timed with each "
                        "attention kernel (kernels.csv)")
    p.add_argument("--batch", type=at_least(1), default=8)
    p.add_argument("--repeats", type=at_least(1), default=3, help="timed repeats of each system, interleaved")
    p.add_argument("--tokens", type=at_least(17), default=512,
                   help="tokens per request in the overhead part (the first 16 rounds are excluded)")
    p.add_argument("--caps", type=listed(at_least(1)), default=[1, 32])
    p.add_argument("--prompts", type=at_least(1), default=164,
                   help="HumanEval prompts of the throughput runs at the largest cap")
    p.add_argument("--small-cap-prompts", type=at_least(1), default=24,
                   help="HumanEval prompts of the throughput runs at the other caps")
    p.add_argument("--max-new-tokens", type=at_least(1), default=256)
    p.add_argument("--temperatures", type=listed(temperature), default=[0.0, 1.0])
    p.add_argument("--small-cap-temperatures", type=listed(temperature), default=None,
                   help="throughput part: the temperatures decoded at the caps below the largest (default: all)")
    p.add_argument("--late-temperatures", type=listed(temperature), default=[],
                   help="throughput part: temperatures left to the part throughput-late")
    p.add_argument("--verify", type=verify_modes, default=["target"],
                   help="throughput part: verify modes (target,sample,block); rows other than target: <method>+<mode>")
    p.add_argument("--server-variants", type=server_variants, default=[],
                   help="throughput part: also serve with these Server-only settings (beside<L>, flight<N>, joined "
                        "by '+'), at every cap and the first temperature; rows <method>@<variant>")
    p.add_argument("--variant-methods", type=names, default=None,
                   help="the methods of the --server-variants rows (default: AR and the ablation's main method)")
    p.add_argument("--hf-prompts", type=at_least(1), default=4)
    p.add_argument("--bandwidth", type=number(0, open_lo=True), default=4.3e12,
                   help="HBM bytes/s for the AR bound (H200: ~4.3e12)")
    p.add_argument("--screen-rank", type=at_least(1), default=256)
    p.add_argument("--screen-topk", type=at_least(1), default=64)
    p.add_argument("--dtype", default=None, choices=["fp32", "bf16"],
                   help="precision of the models (default: the profile's engine.dtype)")
    compile_cache_flag(p)
    return p


def run(p, a):
    use_compile_cache(a.compile_cache)  # before anything compiles
    above = Path(a.target).parent.name if a.target else ""  # work/<profile>/target
    profile = a.profile or (above if above in PROFILES else "mini")
    prof = resolve(profile, a.set)
    spec = prof.ablation
    timed = ("ar", spec.drafter_baseline, spec.main_method)  # the methods --mini-shape times
    bad = [m for m in a.shape_methods or () if m not in timed]
    if bad:
        p.error(f"argument --shape-methods: {','.join(bad)}: --mini-shape times {', '.join(timed)} (profile "
                f"{profile})")
    out = out_dir(a.out)
    path = out / "ratios.json"
    stored = RT.read(path)

    def save(new):  # after every part: a run cut short keeps what it measured
        RT.write(path, RT.merge(stored, new))

    if a.paper_shape or a.mini_shape:
        shape = "paper" if a.paper_shape else "mini"
        if not torch.cuda.is_available():  # random-weight GPU timing: on a CPU it measures nothing (and 8B: 16 GB)
            raise ValueError(f"--{shape}-shape times the engine on a GPU, and torch {torch.__version__} sees no CUDA "
                             "device here (the parts on a trained --target run on a CPU)")

        def save_shape(rows, new, **parts):  # after each part: overhead.csv, <part>.csv, ratios.json, meta
            merge_overhead(out / "overhead.csv", rows)
            for name, part in parts.items():
                merge_rows(out / f"{name}.csv", part)
            save(new)
            write_meta(out / f"meta_{shape}_shape.json", vars(a))

        if a.paper_shape:
            paper_shape(a, "cuda", spec, save_shape)
        else:
            mini_shape(a, "cuda", prof, save_shape)
        return
    if a.parts == "ratios":
        save(throughput_ratios(pd.read_csv(out / "throughput.csv"), spec, profile))
        return
    if not a.target:
        p.error("--target is required (or --paper-shape / --mini-shape)")
    methods = a.methods or list(spec.bench)
    method_checkpoints(a.target, methods, a.drafters)
    b = Bench.load(a, spec, profile, prof.data, prof.engine)
    new, done, t0 = [], [], time.time()

    def record():  # before the first part and after each: a run cut short still says what produced it
        write_meta(out / "meta.json", vars(a), wall_s=time.time() - t0, engine=prof.engine, parts_done=done)

    record()
    for part in a.parts.split(","):  # in the order given (the first gets the time a --timeout leaves)
        new += PARTS[part](b, methods)
        save(new)
        done.append(part)
        record()
