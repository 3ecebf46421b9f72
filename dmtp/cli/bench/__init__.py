"""Benchmarks through the one decode loop; artifacts under results/<profile>/bench/ (rendered by dmtp.analysis.report).

    python -m dmtp.cli.bench --target work/mini/target --drafters work/mini/drafters --out results/mini/bench
    python -m dmtp.cli.bench --paper-shape --out results/mini/bench      # random weights, Qwen3-8B shape: timing only
    python -m dmtp.cli.bench --mini-shape --out results/mini/bench       # random weights, mini shape: timing only
    python -m dmtp.cli.bench --mini-shape --shape-parts engines --shape-engines compiled+dense+gw+tuned \
        --shape-methods zero_init_residual --out DIR       # mini's fixed kernels beside the autotuned ones, steady
    python -m dmtp.cli.bench --target work/tiny/target --drafters work/tiny/drafters --out /tmp/b \
        --tokens 64 --caps 1,2 --prompts 8 --max-new-tokens 32 --parts overhead,hf   # CPU smoke run, ~1 min
(`make bench-shapes` runs the random-weight parts; `make test-gpu` the GPU tests.)

overhead.csv    ms per round by stage (drafter, mtp, mtp_chain, t1_prep, drafter_ctx, verify, round) at batch `--batch`,
                `--tokens` generated tokens ignoring EOS, the first 16 rounds excluded; with --paper-shape /
                --mini-shape the same at a Qwen3-8B-sized / mini-sized target with random weights (methods
                "8b-shape:<name>" / "mini-shape:<name>", timing only; "+dense": the dense attention kernel, "@hf":
                the loop on the HF layers)
throughput.csv  total output tokens / wall time of the whole request group at each batch cap (natural EOS), with
                dynamic batching (`server.serve`: a finished request's slot goes to the next one at once);
                `--verify target,sample,block` adds rows `<method>+<mode>` per verify mode (engine/verify.py)
hf.csv          the same requests, batch 1, T = 0: the engine vs a plain HF `generate` loop (DynamicCache, no graphs),
                tokens/s, whether outputs are identical, and AR's HBM bound (bytes read per token / bandwidth)
screen.csv      the screened T1 head (`screen.T1Screen`): T1 agreement with the exact head, first-token acceptance
                and acceptance length with and without it
baselines.csv   --paper-shape / --mini-shape, batch 1: the compiled engine, the same loop on the HF layers, HF's
                static-cache compiled `generate`, the plain HF loop (mini), tok/s side by side (median, min and max of
                `--repeats` interleaved repeats), and the HBM bound; engine labels "+dense" (the dense attention
                kernel), "+gw" (the K/V write inside the compiled graphs, exact with the dense kernel), "+tuned"
                (Inductor's autotuned kernels), "+timed" (Inductor's default heuristics, launch settings timed on
                the device); no option: the library's default, fixed kernel choices (the same records run to run)
regen.csv       the data stage's regeneration (AR, `--regen-batch` prompts at once, the profile's data temperature):
                tok/s, ms per step, per engine label (as in baselines.csv)
profile_*.txt   --kernel-profile: torch-profiler tables of the device kernels of a decode (where a round goes);
                profile_admission_*.txt (trained models' throughput part): one admission's host against device time
kernels.csv     --kernel-sweep L1,L2,..: AR at batch 1 on the compiled engine with each attention kernel (flex, dense)
                at contexts of about L tokens (prompt L - --tokens, then --tokens new): tok/s side by side — where the
                dense kernel over the whole cache stops beating flex attention over the valid blocks
ratios.json     the targets, each measured side by side in one run (typed records, `dmtp.analysis.ratios`): DMTP
                round <= 1.04 x DFlash round (batch 8; mini: 1.08), DMTP's throughput gain at the largest cap >= 95 %
                of its per-verify gain, engine >= 15 x HF's loop and >= 1.6 x HF's compiled static-cache generate at
                batch 1, verify of 8x8 rows <= 1.2 AR steps, regeneration >= 300 k tok/s, AR vs HBM

Which runs are timed and which are "DMTP" and "DFlash" comes from the profile's ablation spec (`--profile`, default:
the folder above --target): `ablation.bench`, `main_method`, `drafter_baseline`. One module per part: `trained`
(the parts on a trained target, `--parts`), `shapes` (`--paper-shape`, `--mini-shape`), `baselines` (batch 1 beside
HF's loops, the kernel sweep, regeneration), `profiling` (kernel profiles), `common` (timer, ratios, engine labels).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from dmtp.analysis import ratios as RT
from dmtp.cli.args import (at_least, compile_cache_flag, guard, listed, method_checkpoints, names, number, out_dir,
                           temperature, use_compile_cache)
from dmtp.cli.bench.common import Stamped, engine_setting, merge_overhead, merge_rows
from dmtp.cli.bench.shapes import mini_shape, paper_shape
from dmtp.cli.bench.trained import PARTS, Bench, throughput_ratios
from dmtp.config import VERIFY_MODES
from dmtp.config.engine import server_variant
from dmtp.io import write_meta
from dmtp.profiles import PROFILES, resolve


def server_variants(s: str) -> list[str]:
    """argparse type: comma-separated server variants (`config.engine.server_variant`: e.g. beside2+flight1)."""
    out = names(s)
    for v in out:
        try:
            server_variant(v)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return out


def engine_label(s: str) -> str:
    """argparse type: an engine label (`bench.common.engine_setting`: "<engine>[+dense][+gw][+tuned|+timed]")."""
    try:
        engine_setting(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


def verify_modes(s: str) -> list[str]:
    """argparse type: comma-separated verify modes (engine/verify.py)."""
    modes = names(s)
    bad = [m for m in modes if m not in VERIFY_MODES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown verify mode {bad[0]!r}; modes: {', '.join(VERIFY_MODES)}")
    return modes


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
                   help="a profile field for this run (repeatable, as `dmtp pipeline --set`), e.g. "
                        "engine.attention=flex or model.arch.num_hidden_layers=24 with --mini-shape")
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"any of {','.join(PARTS)}; `ratios` alone recomputes ratios.json from the CSVs")
    p.add_argument("--paper-shape", action="store_true", help="only the random-weight Qwen3-8B-shape timing run")
    p.add_argument("--mini-shape", action="store_true",
                   help="only the random-weight timing run at the profile's (default mini) target shape: stage times, "
                        "batch-1 baselines, regeneration")
    p.add_argument("--shape-parts", type=listed(str), default=["engines", "admission", "baselines", "regen"],
                   help="--mini-shape: beside the stage times on the profile's engine, any of engines (the same on the "
                        "compiled engine's defaults and the HF layers), admission, baselines, regen (default: all)")
    p.add_argument("--shape-engines", type=listed(engine_label), default=None, metavar="LABEL,LABEL",
                   help="--mini-shape, part engines: time every method's steady rounds on these engine labels beside "
                        "the profile's own instead of the compiled defaults and the HF layers, e.g. compiled+tuned "
                        "(autotuned kernels against the default fixed ones), compiled+timed")
    p.add_argument("--shape-methods", type=names, default=None, metavar="NAME,NAME",
                   help="--mini-shape: time only these of ar, the drafter baseline and the main method (default: all "
                        "three; the DMTP / DFlash round ratios need both drafters)")
    p.add_argument("--regen-batch", type=at_least(0), default=2048,
                   help="--mini-shape and part `regen`: prompts decoded at once as the data stage does (0: skip)")
    p.add_argument("--kernel-profile", action="store_true",
                   help="also write torch-profiler kernel tables (profile_*.txt): --paper-shape / --mini-shape; on "
                        "trained models: ar, DFlash and DMTP at --batch, and one admission of ar and DMTP per cap")
    p.add_argument("--kernel-sweep", type=listed(at_least(2)), default=[],
                   help="--paper-shape / --mini-shape: contexts (tokens, e.g. 512,2048,8192) at which AR batch 1 is "
                        "timed with each attention kernel (kernels.csv)")
    p.add_argument("--batch", type=at_least(1), default=8)
    p.add_argument("--repeats", type=at_least(1), default=3,
                   help="--paper-shape / --mini-shape: timed repeats of each batch-1 system, interleaved (medians)")
    p.add_argument("--tokens", type=at_least(17), default=512, help="tokens per request in the overhead part (the "
                   "first 16 rounds are excluded)")
    p.add_argument("--caps", type=listed(at_least(1)), default=[1, 32])
    p.add_argument("--prompts", type=at_least(1), default=164,
                   help="HumanEval prompts of the throughput runs at the largest cap")
    p.add_argument("--small-cap-prompts", type=at_least(1), default=24,
                   help="HumanEval prompts of the throughput runs at the other caps (batch 1 over 164 prompts: "
                        "minutes)")
    p.add_argument("--max-new-tokens", type=at_least(1), default=256)
    p.add_argument("--temperatures", type=listed(temperature), default=[0.0, 1.0])
    p.add_argument("--small-cap-temperatures", type=listed(temperature), default=None,
                   help="throughput part: the temperatures (of --temperatures) decoded at the caps below the largest "
                        "(default: all), e.g. 0 to time T = 1 at the largest cap only")
    p.add_argument("--late-temperatures", type=listed(temperature), default=[],
                   help="throughput part: temperatures (of --temperatures) left to the part throughput-late, e.g. "
                        "--parts throughput,overhead,throughput-late --late-temperatures 1 times the stage times "
                        "before T = 1")
    p.add_argument("--verify", type=verify_modes, default=["target"],
                   help="throughput part: verify modes (target,sample,block); rows other than target: <method>+<mode>")
    p.add_argument("--server-variants", type=server_variants, default=[],
                   help="throughput part: also serve with these Server-only settings (`config.engine.server_variant`: "
                        "beside<L> = engine.admit_beside L, flight<N> = engine.in_flight N, joined by '+', e.g. "
                        "beside2+flight1), at every cap and the first temperature, side by side with the others; rows "
                        "<method>@<variant>")
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
        if not torch.cuda.is_available():  # random-weight GPU timing: on a CPU it measures nothing (and 8B: 16 GB)
            raise ValueError(f"--{'paper' if a.paper_shape else 'mini'}-shape times the engine on a GPU, and torch "
                             f"{torch.__version__} sees no CUDA device here (the parts on a trained --target run on a "
                             "CPU)")
        dev = "cuda"

        def save_shape(rows, new, **parts):  # after each part: overhead.csv, <part>.csv, ratios.json, meta
            merge_overhead(out / "overhead.csv", rows)
            for name, part in parts.items():
                merge_rows(out / f"{name}.csv", part)
            save(new)
            write_meta(out / f"meta_{'paper' if a.paper_shape else 'mini'}_shape.json", vars(a))

        if a.paper_shape:
            paper_shape(a, dev, spec, save_shape)
        else:
            mini_shape(a, dev, prof, save_shape)
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
