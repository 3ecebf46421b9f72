"""The paper-width proof on one GPU: drafter training steps on a random-weight stand-in of a paper target
(`--profile`: Qwen3.6-27B, or the hybrid MoE Qwen3.6-35B-A3B), peak GPU memory and step time beside the memory model's
prediction (`dmtp.memory`) for exactly that setting, with and without activation checkpointing.

The stand-in is the profile's target_config with random bf16 weights and a random native MTP head, its depth cut to
`--layers` (the hybrid pattern kept); the drafter is the profile's 5-layer paper drafter of `--variant`. Inputs are
random token ids over the whole vocabulary. Random weights make acceptance meaningless: the run proves mechanics,
memory and time.

The setting: by default one sequence a step under FSDP2 in a process group of one; `--plan GB` takes the one `dmtp
dryrun --gpus 1 --gpu-mem GB` plans for the full depth on one card (its accumulation cut to `--accumulation`: the
peak does not depend on it, the step time scales with it).

Per row (depth x activation checkpointing): `--steps` steps through `train_drafters` (the final gathered checkpoint
timed), the peak allocated and reserved memory over the steps and of each step, the steady step time (median after
the first) and tokens/s, and the model's terms. `--memory-trace` writes the allocations live at each row's peak, by
site (`experiments/memory_peak.py`), to <out>/peak_L<layers>_ckpt<0|1>.txt. Depth: the full depth where the model
says it fits the card, else the largest that does (`--layers 0`); the full-depth rows are then recorded as not run,
with their prediction. Also timed: the target's feature pass; recorded: which Gated DeltaNet path ran (`fla`
kernels, or transformers' torch fallback; causal-conv1d likewise).

Writes <out>/paper_width.json (settings, device, versions, commit, rows) and <out>/paper_width.md (the table).

    python -m experiments.paper_width --tiny --out /tmp/pw                   # CPU, tiny width/depth: ~20 s
    python -m experiments.paper_width --tiny --profile qwen3.6-35b-a3b --out /tmp/pw35   # CPU, the MoE stand-in
    python -m experiments.paper_width --out results/paper_width/h100         # one H100: the largest depth that fits
    python -m experiments.paper_width --out DIR --plan 141 --accumulation 2 --steps 3 --memory-trace  # one H200: the
                                          # full 64 layers at the one-card plan (micro-batch 8), both rows
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from dmtp.cli.args import at_least, failure, number
from dmtp.cli.bench.common import timed
from dmtp.config import TrainConfig
from dmtp.experiment import drafter_config
from dmtp.io import git_sha, write_json, write_text
from dmtp.memory import USABLE, TrainSetting, capacity, drafter_ce_chunk, plan_training, train_terms, with_layers
from dmtp.models.drafter import DrafterConfig, default_target_layer_ids
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target
from dmtp.profiles import get_profile
from dmtp.training.drafters import extract, lr_at, new_drafters, spec_of, train_drafters
from experiments.memory_peak import peak_report, recording

GIB = 2 ** 30


PROFILES = ("qwen3.6-27b", "qwen3.6-35b-a3b")  # the paper targets with a stand-in


def stand_in_config(tiny: bool, profile: str = "qwen3.6-27b") -> dict:
    """The profile's target config; tiny: the same layer pattern, vocabulary and expert count at width 64."""
    cfg = dict(get_profile(profile).scale.target_config)
    if tiny:
        cfg.update(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                   linear_num_value_heads=2, linear_num_key_heads=1, linear_key_head_dim=16,
                   linear_value_head_dim=16, num_hidden_layers=8, layer_types=cfg["layer_types"][:8],
                   rope_parameters={**cfg["rope_parameters"], "mrope_section": [2, 1, 1]})
        cfg.update(dict(moe_intermediate_size=16, shared_expert_intermediate_size=16) if cfg.get("num_experts")
                   else dict(intermediate_size=128))
    return cfg


def drafter_base(cfg: dict, tiny: bool, profile: str = "qwen3.6-27b") -> dict:
    """The profile's 5-layer drafter on this target (tiny: width 64, 4/2 heads of 16, FFN 128)."""
    kw = dict(cfg)
    base = drafter_config(get_profile(profile), AutoConfig.for_model(kw.pop("model_type"), **kw))
    if tiny:
        base.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128)
    return base


def spec(cfg: dict, base: dict, variant: str):
    """The memory model's view of the drafter (built on the meta device: exact counts, the variant's slots)."""
    return spec_of([DrafterConfig(**{k: v for k, v in base.items() if k in DrafterConfig.__dataclass_fields__},
                                  variant=variant)])


def setting(a, checkpointing: bool, d):
    micro = a.micro_batch or a.batch
    rows = micro * a.anchors * d.slots
    return TrainSetting(world=1, micro_batch=micro, seq_len=a.seq_len, anchors=a.anchors, shard_target=False,
                        shard_drafters=a.fsdp == "on", checkpointing=checkpointing,
                        ce_chunk=drafter_ce_chunk("auto", 0, rows, d.vocab), accumulation=a.batch // micro,
                        defer_sync=a.grad_sync == "last")


def predict(cfg: dict, layers: int, d, a, checkpointing: bool) -> dict:
    """The model's terms for the stand-in at `layers` layers and drafter spec d (its shape does not depend on the
    depth: K = 5 taps wherever they are)."""
    return train_terms(with_layers(cfg, layers), d, setting(a, checkpointing, d))


def planned(cfg: dict, d, a, gpu_gb: float, global_batch: int, layers: int | None = None):
    """The setting `dmtp dryrun --gpus 1 --gpu-mem gpu_gb` plans for the stand-in (full depth unless `layers`) on one
    card (`memory.plan_training`, as `cli.dryrun.fit_section` calls it, for this drafter)."""
    return plan_training(with_layers(cfg, layers or cfg["num_hidden_layers"]), d, gpus=1, gpu_gb=gpu_gb,
                         seq_len=a.seq_len, anchors=a.anchors, global_batch=global_batch)


def apply_plan(a, plan) -> dict:
    """The plan's setting as this script's arguments (micro-batch, batch = micro-batch x accumulation, the latter cut
    to `--accumulation` when given, FSDP, gradient sync); what was planned and what runs, for the record."""
    s = plan.setting
    acc = min(plan.accumulation, a.accumulation or plan.accumulation)
    a.micro_batch, a.batch = s.micro_batch, s.micro_batch * acc
    a.fsdp, a.grad_sync = ("on" if s.shard_drafters else "off"), s.grad_sync
    return {"line": plan.line(), "fits": plan.fits, "micro_batch": s.micro_batch, "accumulation": plan.accumulation,
            "accumulation_run": acc, "checkpointing": s.checkpointing, "fsdp": a.fsdp, "grad_sync": a.grad_sync,
            "total": plan.terms["total"]}


def largest_depth(cfg: dict, fits) -> int:
    """The most layers (of the full depth) n for which fits(n); 0 when not even 5 do."""
    return next((n for n in range(cfg["num_hidden_layers"], 4, -1) if fits(n)), 0)


def kernels() -> dict:
    """Which Gated DeltaNet path transformers takes: its fallback decorators import these packages when present."""
    out = {}
    for pkg in ("fla", "causal_conv1d"):
        try:
            out[pkg] = importlib.util.find_spec(pkg) and getattr(importlib.import_module(pkg), "__version__", "present")
        except Exception as e:  # importable in name, broken at import: transformers falls back too
            out[pkg] = f"import failed: {type(e).__name__}"
    ok = {k: v is not None and not str(v).startswith("import failed") for k, v in out.items()}
    return out | {"gated_delta_rule": "fla" if ok["fla"] else "torch fallback",
                  "conv1d": "causal_conv1d" if ok["causal_conv1d"] else "torch fallback"}


def gdn_bench(cfg: dict, batch: int, seq_len: int, dev, dtype, repeats: int = 3) -> dict:
    """Seconds of one Gated DeltaNet layer's chunked delta rule at the stand-in's shapes (q, k repeated to the value
    heads, as the layer calls it): transformers' torch reference, and flash-linear-attention's kernel where `fla`
    imports; times the number of GDN layers gives a feature pass's share."""
    import inspect

    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    nv, dk, dv = cfg["linear_num_value_heads"], cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    g = torch.Generator(device=dev).manual_seed(0)
    q, k = (torch.randn(batch, seq_len, nv, dk, device=dev, dtype=dtype, generator=g) for _ in range(2))
    v = torch.randn(batch, seq_len, nv, dv, device=dev, dtype=dtype, generator=g)
    decay = -torch.rand(batch, seq_len, nv, device=dev, generator=g).float()
    beta = torch.rand(batch, seq_len, nv, device=dev, dtype=dtype, generator=g)
    impls = {"torch": inspect.unwrap(m.torch_chunk_gated_delta_rule)}
    with contextlib.suppress(Exception):  # not installed, or broken: the torch path is what runs
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        impls |= {"fla": chunk_gated_delta_rule} if dev.type == "cuda" else {}
    with torch.no_grad():
        out = {name: median_s(lambda: fn(q, k, v, g=decay, beta=beta, use_qk_l2norm_in_kernel=True), dev, repeats)
               for name, fn in impls.items()}
    out["gdn_layers"] = sum(t == "linear_attention" for t in cfg["layer_types"])
    return out


def build(cfg: dict, layers: int, device, dtype, seed: int, experts: str = "default"):
    """The random-weight stand-in at `layers` layers and its random MTP head, on `device`; an MoE target's experts
    through transformers' `experts` implementation ("default": transformers' choice, as `Target.load` gets it;
    "eager": a loop over the experts hit; "grouped_mm", "batched_mm")."""
    kw = with_layers(cfg, layers)
    hf = AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            hf, dtype=dtype, attn_implementation="sdpa",
            **({"experts_implementation": experts} if kw.get("num_experts") and experts != "default" else {}))
    tgt = Target(model)
    return tgt, MTPHead(tgt)


def median_s(fn, dev, repeats: int = 3) -> float:
    """Median seconds of `repeats` calls of fn() after a first one that warms up (kernels, autotuning)."""
    return statistics.median([timed(dev, fn)[1] for _ in range(repeats + 1)][1:])


class StepPeaks:
    """The learning-rate schedule of `train_drafters` (`lr_at`, unchanged), which it calls at the start of every
    step: each call also reads the device's peak allocated bytes since the previous call and resets the peak, so
    `peaks[k]` is step k+1's own peak (the last, read by `close`, includes the final checkpoint's gather and write).
    read / reset: the peak counter (default torch.cuda's, on CUDA; none elsewhere)."""

    def __init__(self, cfg, dev, read=None, reset=None):
        cuda = dev.type == "cuda"
        self.cfg, self.peaks, self.calls = cfg, [], 0
        self.read = read or ((lambda: torch.cuda.max_memory_allocated(dev)) if cuda else None)
        self.reset = reset or ((lambda: torch.cuda.reset_peak_memory_stats(dev)) if cuda else (lambda: None))

    def __call__(self, step: int) -> float:
        if self.calls and self.read:
            self.peaks.append(self.read())
        self.calls += 1
        self.reset()
        return lr_at(step, self.cfg)

    def close(self) -> list[int] | None:
        if self.calls and self.read:
            self.peaks.append(self.read())
        return self.peaks if self.read else None


def run_row(tgt, mtp, base: dict, a, layers: int, checkpointing: bool, dev, work: Path, out: Path) -> dict:
    g = torch.Generator().manual_seed(a.seed)
    seqs = [torch.randint(0, tgt.vocab_size, (a.seq_len,), generator=g).tolist() for _ in range(a.batch)]
    b = {**base, "num_target_layers": layers, "target_layer_ids": [], "seed": a.seed}
    drafters = new_drafters(tgt, [a.variant], b)
    cfg = TrainConfig(steps=a.steps, batch_size=a.batch, max_len=a.seq_len, anchors_per_seq=a.anchors,
                      amp_bf16=dev.type == "cuda", compile=a.compile, fsdp=a.fsdp, shard_target="off",
                      activation_checkpointing=checkpointing, log_every=1, save_every=a.steps,
                      micro_batch=a.micro_batch, grad_sync=a.grad_sync)
    name = f"L{layers}_ckpt{int(checkpointing)}"
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    peaks = StepPeaks(cfg, dev)
    trace = recording(dev) if a.memory_trace else contextlib.nullcontext()
    t0 = time.perf_counter()
    with trace as rec:
        hist = train_drafters(tgt, mtp, drafters, seqs, cfg, work / name, log=lambda *_: None,
                              schedule=peaks)[a.variant]
    wall = time.perf_counter() - t0
    row = {"layers": layers, "checkpointing": checkpointing, "ran": True, "steps": a.steps, "wall_s": wall,
           "losses": [h["loss"] for h in hist], "first_step_s": hist[0]["elapsed_s"], "step_peaks": peaks.close()}
    if rec is not None:
        row["peak_report"] = f"peak_{name}.txt"
        write_text(out / row["peak_report"], peak_report(
            rec.snapshot, rec.baseline, title=f"{layers} layers, activation checkpointing "
                                              f"{'on' if checkpointing else 'off'}, {a.steps} steps"))
    gaps = [y["elapsed_s"] - x["elapsed_s"] for x, y in zip(hist, hist[1:])]
    row["step_s"] = statistics.median(gaps) if gaps else None
    row["tokens_per_s"] = a.batch * a.seq_len / row["step_s"] if row["step_s"] else None
    row["checkpoint_s"] = wall - hist[-1]["elapsed_s"]  # the gathered checkpoint of the last step, written
    if dev.type == "cuda":
        row["max_allocated"] = torch.cuda.max_memory_allocated(dev)
        row["max_reserved"] = torch.cuda.max_memory_reserved(dev)
    del drafters
    gc.collect()
    shutil.rmtree(work / name, ignore_errors=True)
    return row


def render(rec: dict) -> str:
    gb = lambda x: "-" if x is None else f"{x / 1e9:.1f}"  # noqa: E731
    s = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    st = rec["settings"]
    micro = st["micro_batch"] or st["batch"]
    lines = [f"Paper-width stand-in ({rec['profile']} config, random weights) on {rec['device']}, "
             f"{st['batch']} x {st['seq_len']} tokens a step (micro-batch {micro} x {st['batch'] // micro}), "
             f"{st['anchors']} anchors, drafter {st['variant']} (5 layers), "
             f"{'FSDP2 world 1' if st['fsdp'] == 'on' else 'one process, no FSDP'}; GDN path: "
             f"{rec['kernels']['gated_delta_rule']}, conv: {rec['kernels']['conv1d']}; commit {rec['commit']}", ""]
    if rec.get("plan"):
        p = rec["plan"]
        lines += [f"The plan of `dmtp dryrun --gpus 1 --gpu-mem {st['plan']:g}` for the full depth: {p['line']}",
                  f"Run at its micro-batch {p['micro_batch']} with {p['accumulation_run']} of its {p['accumulation']} "
                  "accumulation steps a step (the peak does not depend on their number).", ""]
    if rec.get("experts_implementation"):
        lines += [f"Experts: transformers' {rec['experts_implementation']!r} implementation.", ""]
    lines += ["| layers | act. ckpt | ran | predicted GB | max allocated GB | max reserved GB | allocated / "
              "predicted | peak GB: first step / steady / last + checkpoint | step s | tokens/s | first step s | "
              "checkpoint s | feature pass s |",
              "|---:|:--|:--|---:|---:|---:|---:|:--|---:|---:|---:|---:|---:|"]
    b = rec.get("gdn_bench_s")
    for r in rec["rows"]:
        p, m = r["predicted"]["total"], r.get("max_allocated")
        pk = r.get("step_peaks")
        peaks = "-" if not pk else (f"{gb(pk[0])} / {gb(max(pk[1:-1])) if len(pk) > 2 else '-'} / "
                                    f"{gb(pk[-1]) if len(pk) > 1 else '-'}")
        tps = r.get("tokens_per_s")
        lines.append(f"| {r['layers']} | {'on' if r['checkpointing'] else 'off'} | {'yes' if r['ran'] else 'no'} | "
                     f"{gb(p)} | {gb(m)} | {gb(r.get('max_reserved'))} | "
                     f"{'-' if m is None else f'{m / p:.2f}'} | {peaks} | {s(r.get('step_s'))} | "
                     f"{'-' if tps is None else f'{tps:,.0f}'} | {s(r.get('first_step_s'))} | "
                     f"{s(r.get('checkpoint_s'))} | {s(r.get('feature_s'))} |")
    if b:
        lines += ["", f"One Gated DeltaNet layer's chunked delta rule at these shapes ({b['gdn_layers']} such layers "
                      "in the stand-in): " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in b.items()
                                                      if k != "gdn_layers")]
    traced = [r["peak_report"] for r in rec["rows"] if r.get("peak_report")]
    if traced:
        lines += ["", "The allocations live at each row's peak, by the code that made them: " + ", ".join(traced)]
    bad = [r for r in rec["rows"] if r.get("oom")]
    lines += [f"Out of memory: {r['layers']} layers, checkpointing {'on' if r['checkpointing'] else 'off'} "
              f"({r['oom']})" for r in bad]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.paper_width", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for paper_width.json and paper_width.md")
    ap.add_argument("--tiny", action="store_true", help="width 64, 8 layers (the CPU check of the whole script)")
    ap.add_argument("--profile", default="qwen3.6-27b", choices=PROFILES, help="the paper target to stand in for")
    ap.add_argument("--plan", type=number(0), default=0, metavar="GB", help="run what `dmtp dryrun --gpus 1 "
                    "--gpu-mem GB` plans for the full depth (overrides --batch, --micro-batch, --fsdp, --grad-sync)")
    ap.add_argument("--accumulation", type=at_least(0), default=0, help="with --plan: at most this many micro-batches")
    ap.add_argument("--global-batch", type=at_least(0), default=0, help="with --plan: the global batch (0: the "
                    "profile's)")
    ap.add_argument("--fsdp", default="on", choices=["on", "off"], help="train.fsdp (off: `dmtp train` on one GPU)")
    ap.add_argument("--memory-trace", action="store_true", help="CUDA: the allocations live at each row's peak")
    ap.add_argument("--experts", default="default", choices=["default", "eager", "grouped_mm", "batched_mm"],
                    help="an MoE target's experts implementation in transformers (default: its choice)")
    ap.add_argument("--layers", type=int, default=0, help="stand-in depth (0: the full depth if it fits, else the "
                    "largest that does)")
    ap.add_argument("--steps", type=int, default=4, help="training steps per row (the first compiles)")
    ap.add_argument("--batch", type=int, default=1, help="sequences per step")
    ap.add_argument("--micro-batch", type=int, default=0, help="sequences per forward/backward (0: the whole batch)")
    ap.add_argument("--grad-sync", default="last", choices=["last", "every"], help="with accumulation: FSDP2's "
                    "reduce-scatter after the last micro-batch or after every one")
    ap.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    ap.add_argument("--anchors", type=int, default=512, help="anchors per sequence (the profile's)")
    ap.add_argument("--variant", default="zero_init_residual", help="the drafter's variant (needs the MTP head)")
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"], help="train.compile")
    ap.add_argument("--checkpointing", default="both", choices=["both", "off", "on"], help="rows to run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="default: cuda when available")
    a = ap.parse_args(argv)
    if a.tiny:
        a.seq_len, a.anchors, a.steps = min(a.seq_len, 64), min(a.anchors, 8), min(a.steps, 2)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.memory_trace and dev.type != "cuda":
        ap.error(f"--memory-trace records CUDA allocations; the device is {dev}")
    cfg = stand_in_config(a.tiny, a.profile)
    base = drafter_base(cfg, a.tiny, a.profile)
    full = cfg["num_hidden_layers"]
    card = torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else None
    cap = capacity(card / GIB) if card else float("inf")
    d = spec(cfg, base, a.variant)
    plan = None
    if a.plan:
        p = planned(cfg, d, a, a.plan, a.global_batch or get_profile(a.profile).train.batch_size)
        if not p.fits:
            ap.error(f"--plan {a.plan:g}: the memory model fits no setting on one card of {a.plan:g} GiB ({p.line()})")
        plan = apply_plan(a, p)
    # without checkpointing: the larger of the two rows
    depth = a.layers or largest_depth(cfg, lambda n: predict(cfg, n, d, a, False)["total"] <= cap)
    if depth < 5:
        raise SystemExit(f"not even a 5-layer stand-in fits {card / 1e9:.1f} GB by the memory model")
    ckpts = {"both": (False, True), "off": (False,), "on": (True,)}[a.checkpointing]
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rec = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "card_bytes": card,
           "planned_bytes": None if card is None else cap, "usable_share": USABLE, "torch": torch.__version__,
           "transformers": transformers.__version__, "commit": git_sha(), "settings": vars(a) | {"depth": depth},
           "profile": a.profile, "plan": plan, "target_config": cfg, "drafter": base, "kernels": kernels(),
           "rows": []}
    t0 = time.perf_counter()
    out = Path(a.out)

    def save():
        rec["wall_s"] = time.perf_counter() - t0
        write_json(out / "paper_width.json", rec)
        write_text(out / "paper_width.md", render(rec))

    tries = 0
    while True:  # the model's depth; where a row runs out of memory, 4 layers less (at most twice), if not --layers
        t1 = time.perf_counter()
        tgt, mtp = build(cfg, depth, dev, dtype, a.seed, a.experts)
        rec["build_s"] = time.perf_counter() - t1
        rec["experts_implementation"] = getattr(tgt.model.config, "_experts_implementation", None) \
            if cfg.get("num_experts") else None
        g = torch.Generator().manual_seed(a.seed)
        micro = a.micro_batch or a.batch  # the feature pass of one micro-batch, as a step makes it
        ids = torch.randint(0, tgt.vocab_size, (micro, a.seq_len), generator=g).to(dev)
        taps, lengths = default_target_layer_ids(depth, base["num_hidden_layers"]), torch.full((micro,), a.seq_len)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):  # features, no logits
            feature_s = median_s(lambda: extract(tgt, mtp, ids, lengths, taps, True), dev)
        del ids
        try:
            rec["gdn_bench_s"] = gdn_bench(with_layers(cfg, depth), micro, a.seq_len, dev, dtype)
        except Exception as e:  # a side measurement: recorded, the proof goes on
            rec["gdn_bench_error"] = failure(e)
        oom = False
        with tempfile.TemporaryDirectory(prefix="paper_width.") as work:
            for ck in ckpts:
                try:
                    row = run_row(tgt, mtp, base, a, depth, ck, dev, Path(work), out)
                except torch.OutOfMemoryError as e:
                    row = {"layers": depth, "checkpointing": ck, "ran": False, "oom": str(e).splitlines()[0],
                           "max_allocated": torch.cuda.max_memory_allocated(dev),
                           "max_reserved": torch.cuda.max_memory_reserved(dev)}
                    oom = True
                row.update(predicted=predict(cfg, depth, d, a, ck), feature_s=feature_s)
                rec["rows"].append(row)
                save()
                if oom:
                    break
        if not oom or a.layers or tries == 2:
            break
        del tgt, mtp
        gc.collect()
        torch.cuda.empty_cache()
        depth, tries = depth - 4, tries + 1
        rec["settings"]["depth"] = depth
    if depth < full:  # the full depth, predicted only
        for ck in ckpts:
            rec["rows"].append({"layers": full, "checkpointing": ck, "ran": False,
                                "predicted": predict(cfg, full, d, a, ck),
                                "why": "the memory model puts it above the card's planned memory"})
    rec["setting"] = {str(ck): asdict(setting(a, ck, d)) for ck in ckpts}
    save()
    print(render(rec))
    print(json.dumps({"out": str(out), "wall_s": round(rec["wall_s"], 1)}))


if __name__ == "__main__":
    main()
