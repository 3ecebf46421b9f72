"""Benchmarks through the one decode loop; artifacts under results/<profile>/bench/ (rendered by dmtp.analysis.report).

    python -m dmtp.cli.bench --target work/mini/target --drafters work/mini/drafters --out results/mini/bench
    python -m dmtp.cli.bench --paper-shape --out results/mini/bench      # random weights, Qwen3-8B shape: timing only
    python -m dmtp.cli.bench --mini-shape --out results/mini/bench       # random weights, mini shape: timing only
    python -m dmtp.cli.bench --target work/tiny/target --drafters work/tiny/drafters --out /tmp/b \
        --tokens 64 --caps 1,2 --prompts 8 --max-new-tokens 32 --parts overhead,hf   # CPU smoke run, ~1 min
(`experiments/runs/h200_engine.sh` runs the random-weight parts and the GPU tests in one H200 command.)

overhead.csv    ms per round by stage (drafter, mtp, t1_prep, drafter_ctx, verify, round) at batch `--batch`,
                `--tokens` generated tokens ignoring EOS, the first 16 rounds excluded; with --paper-shape /
                --mini-shape the same at a Qwen3-8B-sized / mini-sized target with random weights (methods
                "8b-shape:<name>" / "mini-shape:<name>", timing only; "+dense": the dense attention kernel, "@hf":
                the loop on the HF layers)
throughput.csv  total output tokens / wall time of the whole request group at each batch cap (natural EOS), with
                dynamic batching (`decode.serve`: a finished request's slot goes to the next one at once);
                `--verify target,sample,block` adds rows `<method>+<mode>` per verify mode (engine/verify.py)
hf.csv          the same requests, batch 1, T = 0: the engine vs a plain HF `generate` loop (DynamicCache, no graphs),
                tokens/s, whether outputs are identical, and AR's HBM bound (bytes read per token / bandwidth)
screen.csv      the screened T1 head (`screen.T1Screen`): T1 agreement with the exact head, first-token acceptance
                and acceptance length with and without it
baselines.csv   --paper-shape / --mini-shape, batch 1: the compiled engine, the same loop on the HF layers, HF's
                static-cache compiled `generate`, the plain HF loop (mini), tok/s side by side (median, min and max of
                `--repeats` interleaved repeats), and the HBM bound; engine labels "+dense" (the dense attention
                kernel), "+gw" (the K/V write inside the compiled graphs, exact with the dense kernel) and, with
                --tuned, "+tuned" (Inductor's autotuned kernels)
regen.csv       the data stage's regeneration (AR, `--regen-batch` prompts at once, the profile's data temperature):
                tok/s, ms per step, per engine label (as in baselines.csv)
profile_*.txt   --kernel-profile: torch-profiler tables of the device kernels of a decode (where a round goes)
kernels.csv     --kernel-sweep L1,L2,..: AR at batch 1 on the compiled engine with each attention kernel (flex, dense)
                at contexts of about L tokens (prompt L - --tokens, then --tokens new): tok/s side by side — where the
                dense kernel over the whole cache stops beating flex attention over the valid blocks
ratios.json     the targets, each measured side by side in one run (typed records, `dmtp.analysis.ratios`): DMTP
                round <= 1.04 x DFlash round (batch 8; mini: 1.08), DMTP's throughput gain at the largest cap >= 95 %
                of its per-verify gain, engine >= 15 x HF's loop and >= 1.6 x HF's compiled static-cache generate at
                batch 1, verify of 8x8 rows <= 1.2 AR steps, regeneration >= 300 k tok/s, AR vs HBM

Which runs are timed and which are "DMTP" and "DFlash" comes from the profile's ablation spec (`--profile`, default:
the folder above --target): `ablation.bench`, `main_method`, `drafter_baseline`. Each part is one function below.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from dmtp.ablation import AblationSpec
from dmtp.analysis.kernels import summary as kernel_summary
from dmtp.analysis import ratios as RT
from dmtp.analysis.metrics import acceptance_length, first_token, histogram
from dmtp.analysis.ratios import Ratio
from dmtp.cli.args import at_least, checkpoint, guard, listed, names, number, out_dir, temperature
from dmtp.config import EngineConfig
from dmtp.data.datasets import encode_prompts
from dmtp.data.humaneval import humaneval_prompts
from dmtp.data.tokenizer import find_tokenizer
from dmtp.engine.decode import Batch, Method, Server, build_method, capacity_for, generate, load_method, no_timer
from dmtp.engine.runner import stop_spec
from dmtp.engine.stops import HUMANEVAL_STOPS
from dmtp.engine.verify import MODES as VERIFY_MODES
from dmtp.experiment import DataConfig, drafter_config, torch_dtype
from dmtp.io import write_meta, write_text
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.mtp import MTPHead
from dmtp.models.screen import T1Screen
from dmtp.models.target import Target
from dmtp.schema import override
from dmtp.training.pretrain import build_target
from experiments.profiles import PROFILES, get_profile


class StageTimer:
    """Times named stages of every decode round (CUDA events on GPU — recorded without waiting —, perf_counter on
    CPU). Stages outside a round (prefill) are not timed."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.rounds: list[dict[str, list]] = []  # per round: stage -> [(start, end)]
        self._cur = None

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, stage):
        if stage == "round":
            self._cur = defaultdict(list)
            self.rounds.append(self._cur)
        cur = self._cur
        if cur is None:
            yield
            return
        a = self._mark()
        try:
            yield
        finally:
            cur[stage].append((a, self._mark()))
            if stage == "round":
                self._cur = None

    def ms_per_round(self, skip: int = 16) -> dict[str, float]:
        """Median ms per round of each stage over the rounds that ran it (a stage run twice in a round counts both),
        the first `skip` rounds excluded. The median, not the mean: a few stalled rounds once moved a mean "round" 40 %
        above the sum of its stages, where every later run measured the sum (LOG.md, 2026-12-01)."""
        if self.cuda:
            torch.cuda.synchronize()
        per = defaultdict(list)
        for r in self.rounds[skip:]:
            for stage, ev in r.items():
                per[stage].append(sum((a.elapsed_time(b) if self.cuda else (b - a) * 1e3) for a, b in ev))
        return {s: statistics.median(v) for s, v in per.items()}


def _sync(dev):
    if str(dev).startswith("cuda"):
        torch.cuda.synchronize()


def read_bytes_per_token(target) -> int:
    """Weight bytes a decode step reads: every parameter except an untied input embedding (only rows are read)."""
    emb = target.body.embed_tokens.weight
    tied = emb.data_ptr() == target.model.lm_head.weight.data_ptr()
    return sum(p.numel() * p.element_size() for p in target.model.parameters()) - (0 if tied else emb.numel()
                                                                                    * emb.element_size())


def t1_bytes_per_round(target, mtp) -> int:
    """Weight bytes DMTP reads each round beyond DFlash's: the MTP head (its layer, fc, norms) and the exact T1 head
    (the target's LM head, read once more: T1 comes from the MTP hidden state after verify, so it cannot share
    verify's read of the same weights). Per round, not per row: at small batches these reads bound the extra time."""
    head = target.model.lm_head.weight
    return sum(p.numel() * p.element_size() for p in mtp.parameters()) + head.numel() * head.element_size()


def round_floor(target, mtp, dflash_round_ms: float, bandwidth: float, setup: str, name: str, condition: str,
                ) -> Ratio:
    """The lowest DMTP round / DFlash round the weights allow: DFlash's measured round plus the extra weight bytes
    (`t1_bytes_per_round`) read at `bandwidth`. A goal below it cannot be met by the engine at this shape and batch."""
    nbytes = t1_bytes_per_round(target, mtp)
    extra = nbytes / bandwidth * 1e3
    return ratio(setup, f"{name}, weight-read floor", 1 + extra / dflash_round_ms, condition=condition,
                 note=f"{dflash_round_ms:.3f} ms DFlash round + {nbytes / 1e9:.3f} GB (MTP head + T1 LM head) at "
                      f"{bandwidth / 1e12:.1f} TB/s = {extra:.3f} ms")


def stage_times(tgt, m, prompts, tokens, skip=16, engine=None):
    """ms per round by stage over `tokens` generated tokens (EOS ignored), first `skip` rounds excluded; `engine`:
    `decode.engine_for` (default: compiled on CUDA)."""
    m.timer = StageTimer(tgt.device.type == "cuda")
    res = generate(tgt, m, prompts, 0.0, tokens, eos_ids=(), seed=0, engine=engine)
    ms = m.timer.ms_per_round(skip)
    m.timer = no_timer
    return ms, res


def verify_modes(s: str) -> list[str]:
    """argparse type: comma-separated verify modes (engine/verify.py)."""
    modes = names(s)
    bad = [m for m in modes if m not in VERIFY_MODES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown verify mode {bad[0]!r}; modes: {', '.join(VERIFY_MODES)}")
    return modes


def timed(dev, fn, *args, **kw):
    """(fn(*args, **kw), wall seconds), the device synchronised before and after."""
    _sync(dev)
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    _sync(dev)
    return out, time.perf_counter() - t0


def ratio(setup: str, name: str, value: float, direction: str = "report", goal: float | None = None,
          condition: str = "", note: str = "", unit: str = "x") -> Ratio:
    return Ratio(setup, name, round(float(value), 4), direction, goal, unit, condition, note).show()


ROUND_GOAL = {"mini": 1.10}  # DMTP round / DFlash round at a small target's shape (latency-bound stages)
ROUND_AR_GOAL = 1.5  # DMTP round / AR step at batch 8: speculation pays only when a round costs few AR steps
DRAFT_SHARE_GOAL = 0.15  # draft side / verify at batch 8: the paper's cost regime (5 + 1 layers against 64)


def round_goal(profile: str) -> float:
    """The goal of DMTP's round / DFlash's round on `profile`'s target shape (1.04: the blog's 8B figure)."""
    return ROUND_GOAL.get(profile, 1.04)


KINDS = {"flex": "", "dense": "+dense"}  # the compiled engine's attention kernels (`EngineConfig.attention`): suffix


LABEL_OPTIONS = {"dense": "dense attention", "gw": "K/V write in the graph", "tuned": "autotuned kernels"}


def label_words(label: str) -> str:
    """The suffix a record of engine label `label` carries in its name, e.g. ", dense attention, K/V write in the
    graph" for "compiled+dense+gw" ("" for a plain engine)."""
    opts = label.split("+")[1:]
    return "".join(f", {words}" for opt, words in LABEL_OPTIONS.items() if opt in opts)


def engine_setting(label: str, base: EngineConfig | None = None) -> EngineConfig:
    """An engine label — "<engine>[+dense][+gw][+tuned]" — as the named `EngineConfig` it stands for, derived from
    `base` (default: the default config): flex attention with its K/V write outside the graphs on CUDA unless
    "+dense" (dense attention, the write outside the graphs) / "+gw" (the write inside the compiled graphs) /
    "+tuned" (Inductor's autotuned kernels)."""
    engine, *opts = label.split("+")
    unknown = set(opts) - set(LABEL_OPTIONS)
    if unknown:
        raise ValueError(f"engine label {label!r}: unknown option(s) {sorted(unknown)} (known: dense, gw, tuned)")
    return (base or EngineConfig()).with_(engine=engine, attention="dense" if "dense" in opts else "flex",
                                          cache_write="graph" if "gw" in opts else "eager" if engine != "hf" else "auto",
                                          tuning="autotune" if "tuned" in opts else "default")


def label_of(eng: EngineConfig) -> str:
    """The engine label of a config (`engine_setting`'s inverse on the settings labels name)."""
    if eng.kind("cuda") == "hf":
        return "hf"
    return eng.kind("cuda") + "+dense" * (eng.attention == "dense") + "+gw" * (eng.write("cuda") == "graph") \
        + "+tuned" * (eng.tuning == "autotune")


B1_ENGINES = ("compiled", "compiled+dense", "compiled+dense+gw", "hf")  # the batch-1 engines; --tuned adds one


def b1_engines(a, base: EngineConfig | None = None) -> tuple[str, ...]:
    """The batch-1 engine labels of a run: the profile's own engine (`base`) first, then the others of `B1_ENGINES`
    and, with --tuned, the compiled engine with autotuned kernels (flex attention) before the HF-layer loop."""
    first = (label_of(base),) if base is not None else ()
    rest = B1_ENGINES[:-1] + ("compiled+tuned",) * bool(a.tuned) + B1_ENGINES[-1:]
    return first + tuple(x for x in rest if x not in first)


def _kind(kind: str) -> str:
    """A ratio name's suffix for the attention kernel (part of the name: flex and dense are separate records)."""
    return label_words(KINDS[kind])


def device_name(dev) -> str:
    return torch.cuda.get_device_name() if str(dev).startswith("cuda") else str(dev)


def merge_overhead(path: Path, rows: list[dict]):
    """Write overhead rows, keeping stored rows of the other setups (`<setup>:<name>`, e.g. `8b-shape:dflash`, vs
    plain names: the trained target)."""
    def setup(m):
        return m.partition(":")[0] if ":" in m else ""

    new = pd.DataFrame(rows)
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=new.columns)
    old = old[~old.method.map(setup).isin(set(new.method.map(setup)))]
    write_text(path, pd.concat([new, old] if (new.method.map(setup) == "").any() else [old, new]).to_csv(index=False))


def merge_rows(path: Path, rows: list[dict]):
    """Write `rows` (each with a `setup`) over the stored rows of the same setups, keeping the others."""
    new = pd.DataFrame(rows)
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=new.columns)
    write_text(path, pd.concat([old[~old.setup.isin(set(new.setup))], new]).to_csv(index=False))


SPEEDUP_GOALS = {1: 2.5, 32: 2.0}  # main method / AR tok/s at T = 0 by batch cap (the largest cap: the second)


def throughput_ratios(tp: pd.DataFrame, spec: AblationSpec, setup: str) -> list[Ratio]:
    """From throughput.csv's runs: every method / AR at each (temperature, cap), the median of the per-repeat ratios
    (runs of the same repeat index side by side) with their range (the main method at T = 0 against
    `SPEEDUP_GOALS`); and DMTP's throughput gain over DFlash / its per-verify gain at every cap (goal >= 0.95 at the
    largest cap)."""
    dmtp, dflash = spec.main_method, spec.drafter_baseline
    out = []
    if "repeat" not in tp:
        tp = tp.assign(repeat=0)
    top = tp.batch_cap.max() if len(tp) else 0
    for (temp, cap), g in tp.groupby(["temperature", "batch_cap"]):
        by = {m: x.set_index("repeat") for m, x in g.groupby("method")}
        cond = f"B{cap}, T={temp:g}"
        if "ar" in by:
            for m in sorted(set(by) - {"ar"}):
                q = (by[m].tok_per_s / by["ar"].tok_per_s).dropna().tolist()
                if not q:
                    continue
                goal = SPEEDUP_GOALS.get(1 if cap == 1 else 32) if m == dmtp and temp == 0 and cap in (1, top) else None
                out.append(ratio(setup, f"{m} tok/s / AR tok/s", median(q), ">=" if goal else "report", goal, cond,
                                 f"{by[m].tok_per_s.median():.0f} vs {by['ar'].tok_per_s.median():.0f} tok/s; per "
                                 f"repeat {spread(q)}, {len(q)} repeats"))
        if dmtp in by and dflash in by:
            gain = (by[dmtp].tok_per_s / by[dflash].tok_per_s).dropna()
            tau = by[dmtp].per_verify.median() / by[dflash].per_verify.median() - 1
            q = [(x - 1) / tau if tau > 0 else float("nan") for x in gain]
            out.append(ratio(setup, f"throughput gain / per-verify gain ({dmtp} vs {dflash})", median(q),
                             ">=" if cap == top else "report", 0.95 if cap == top else None, cond,
                             f"throughput {median(gain.tolist()) - 1:+.1%} (per repeat {spread(gain.tolist())}), "
                             f"per-verify {tau:+.1%}"))
    return out


def paper_shape(a, dev, spec: AblationSpec, save=lambda *parts: None) -> tuple[list[dict], list[Ratio], list[dict]]:
    """Timing only: a Qwen3-8B-sized dense target (random bf16 weights), one MTP layer, 5-layer drafters of the
    drafter baseline and the main method, batch `--batch`; every round accepts ~nothing, so each emits one token —
    what matters is the time per stage —, with both attention kernels of the compiled engine (`KINDS`). Then the
    batch-1 baselines (`batch1_baselines`) and verify of `--batch` x 8 rows against an AR step. Returns overhead rows,
    ratios and baseline rows, also handed to `save` after each part (a run cut short keeps what it measured)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    with torch.device(dev):
        tgt = Target(AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa"))
        mtp = MTPHead(tgt).eval()
    prompts = torch.randint(1000, 100000, (a.batch, 256), generator=torch.Generator().manual_seed(0)).tolist()
    rows, ratios, setup, batch = [], [], "8b-shape", f"batch {a.batch}"
    screen = T1Screen(tgt, rank=a.screen_rank, topk=a.screen_topk)
    dflash, dmtp = spec.drafter_baseline, spec.main_method
    drafters = {}
    for v in (dflash, dmtp):
        c = DrafterConfig(hidden_size=4096, vocab_size=151936, num_hidden_layers=5, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, intermediate_size=12288, num_target_layers=36,
                          variant=v, mask_token_id=151669)
        drafters[v] = Drafter(c).to(device=dev, dtype=torch.bfloat16).eval()

    def method(name):
        variant = name.split("+")[0]
        return build_method(variant, tgt, drafter=drafters.get(variant), mtp=mtp,
                            screen=screen if "+screen" in name else None)
    names = [dflash, dmtp, dmtp + "+screen"]  # AR: at batch 1 below
    for kind, sfx in KINDS.items():  # the compiled engine's two attention kernels side by side (the screen: flex)
        eng = engine_setting("compiled" + sfx)
        for name in names[: 3 if kind == "flex" else 2]:
            ms, res = stage_times(tgt, method(name), prompts, a.tokens, engine=eng)
            rows += [{"method": f"{setup}:{name}{sfx}", "stage": stage, "ms_per_round": v, "batch": a.batch,
                      "rounds": a.tokens, "device": device_name(dev)} for stage, v in ms.items()]
            print(f"[bench] {setup} {name}{sfx}: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}
    for kind, sfx in KINDS.items():
        for name in names[1: 3 if kind == "flex" else 2]:
            q = by[(f"{setup}:{name}{sfx}", "round")] / by[(f"{setup}:{dflash}{sfx}", "round")]
            ratios.append(ratio(setup, f"{name} round / {dflash} round{_kind(kind)}", q, "<=", round_goal(setup),
                                batch))
    ratios.append(round_floor(tgt, mtp, by[(f"{setup}:{dflash}", "round")], a.bandwidth, setup,
                              f"{dmtp} round / {dflash} round", batch))
    save(rows, ratios)
    b1_rows, b1_ratios = batch1_baselines(tgt, prompts[0], a.tokens, a.bandwidth, setup, hf_loop=False,
                                          engines=b1_engines(a), repeats=a.repeats)
    ratios += b1_ratios
    save(rows, ratios, b1_rows)
    if a.kernel_sweep:
        k_rows, k_ratios = kernel_sweep(tgt, a.kernel_sweep, a.tokens, setup)
        ratios += k_ratios
        save(rows, ratios, b1_rows, kernels=k_rows)
    for kind, sfx in KINDS.items():  # the same cache size as the baselines': no recompilation
        ar1, _ = stage_times(tgt, build_method("ar", tgt), prompts[:1], a.tokens,
                             engine=engine_setting("compiled" + sfx))
        rows += [{"method": f"{setup}:ar@batch1{sfx}", "stage": s, "ms_per_round": v, "batch": 1,
                  "rounds": a.tokens, "device": device_name(dev)} for s, v in ar1.items()]
        v = by[(f"{setup}:{dflash}{sfx}", "verify")]
        ratios.append(ratio(setup, f"verify of {a.batch}x8 rows / AR step{_kind(kind)}", v / ar1["verify"], "<=",
                            1.2, "AR at batch 1", f"{v:.3f} ms vs {ar1['verify']:.3f} ms"))
    save(rows, ratios, b1_rows)
    if a.kernel_profile:
        for name, kind in (("ar", "flex"), ("ar", "dense"), (dflash, "flex"), (dmtp, "flex")):
            m = build_method("ar", tgt) if name == "ar" else method(name)
            kernel_profile(tgt, m, prompts[:1] if name == "ar" else prompts, a.tokens,
                           Path(a.out) / f"profile_{setup}_{name}{KINDS[kind]}.txt",
                           engine=engine_setting("compiled" + KINDS[kind]))
    return rows, ratios, b1_rows


def kernel_sweep(tgt, contexts: list[int], tokens: int, setup: str, engine: str = "compiled",
                 low: int = 1000) -> tuple[list[dict], list[Ratio]]:
    """AR at batch 1 on `engine` with each attention kernel (`KINDS`) at contexts of about L tokens each (a random
    prompt of L - `tokens` ids in [low, vocab), then `tokens` new ones, EOS ignored as the shape runs do), one server
    per (L, kernel), warmed up on the same request first. Returns kernels.csv rows and one ratio per L (dense / flex
    tok/s: above 1, the dense kernel is the faster one at that context)."""
    dev = tgt.device
    g = torch.Generator().manual_seed(1)
    rows, out = [], []
    longest = tgt.config.max_position_embeddings
    if max(contexts) > longest:
        raise ValueError(f"--kernel-sweep {','.join(map(str, contexts))}: the target has {longest} positions "
                         f"(max_position_embeddings); use contexts <= {longest}")
    for L in contexts:
        prompt = torch.randint(low, tgt.vocab_size, (max(1, L - tokens),), generator=g).tolist()
        cap = capacity_for([prompt], tokens, 0)
        tps = {}
        for kind in KINDS:
            srv = Server(tgt, build_method("ar", tgt), 1, cap, 0.0, tokens,
                         engine=engine_setting(engine + KINDS[kind]))
            srv.run([prompt])
            (res,), wall = timed(dev, srv.run, [prompt])
            tps[kind] = len(res.output_ids) / wall
            rows.append({"setup": setup, "context": L, "capacity": cap, "kernel": kind, "batch": 1,
                         "tokens": len(res.output_ids), "tok_per_s": tps[kind], "device": device_name(dev)})
            print(f"[bench] {setup} kernel sweep, context {L} (cache {cap} rows), {kind}: {tps[kind]:.1f} tok/s")
        out.append(ratio(setup, f"AR dense / flex attention, context {L}", tps["dense"] / tps["flex"],
                         condition="batch 1", note=f"{tps['dense']:.1f} vs {tps['flex']:.1f} tok/s"))
    return rows, out


def hf_static_generate(tgt, prompt: list[int], tokens: int):
    """HF transformers' own fast path, batch 1: `generate(cache_implementation="static")`, which compiles the forward
    (torch.compile with CUDA graphs) on CUDA. Returns a function that decodes once: (output ids, wall seconds); the
    first call compiles (call it once before timing)."""
    dev = tgt.device
    ids = torch.tensor([prompt], device=dev)
    kw = {"max_new_tokens": tokens, "do_sample": False, "cache_implementation": "static", "pad_token_id": 0}

    def once():
        out, wall = timed(dev, tgt.model.generate, ids, **kw)
        return out[0, len(prompt):].tolist(), wall
    return once


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: list[float]) -> str:
    """'median [min, max]' of a few repeats, or the one value."""
    return f"{median(xs):.3f}" if len(xs) == 1 else f"{median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def batch1_baselines(tgt, prompt, tokens, bandwidth, setup, hf_loop=True,
                     engines=B1_ENGINES, repeats: int = 3) -> tuple[list[dict], list[Ratio]]:
    """Batch 1, T = 0, `tokens` new tokens after `prompt` (EOS ignored), in one process side by side: the engine
    (compiled, the default on CUDA; "<engine>+dense": with the dense attention kernel; "+gw": with the K/V write
    inside the compiled graphs — `engine_setting`), the same loop on the HF
    layers (`engine="hf"`, the engine before compilation), HF's static-cache compiled `generate`, the plain HF loop
    (`hf_loop`), and AR's HBM bound. Every system is warmed up once (the engine's servers capture their graphs, HF's
    generate compiles), then timed `repeats` times in interleaved order (system by system within each repeat), so a
    drift of the machine reaches all of them alike — except HF's compiled generate, timed in a block of its own
    before the engine's graphs are captured (see below). tok/s = the median of the repeats; each ratio is the median
    of the per-repeat ratios with their range in its note. Returns baselines.csv rows and ratios (the first engine
    against the others)."""
    dev = tgt.device
    nbytes = read_bytes_per_token(tgt)
    bound = bandwidth / nbytes
    cap = capacity_for([prompt], tokens, 0)
    tps: dict[str, list[float]] = {}
    outs: dict[str, list[int]] = {}

    def time_them(runners, n):
        for _ in range(n):
            for k, fn in runners.items():
                out, wall = fn()
                tps.setdefault(k, []).append(len(out) / wall)
                outs[k] = out
    # HF's compiled generate first, in a block of its own: its compile (mode "reduce-overhead": CUDA graph trees)
    # left the engine's graphs captured before it replaying into an illegal memory access on the H200 (torch 2.11;
    # LOG.md, 2026-12-01); graphs captured after it replay correctly.
    static = hf_static_generate(tgt, prompt, tokens)
    static()  # compiles
    time_them({"hf-static": static}, repeats)
    runners = {}
    for label in engines:
        srv = Server(tgt, build_method("ar", tgt), 1, cap, 0.0, tokens, engine=engine_setting(label))
        srv.run([prompt])

        def once(srv=srv):
            (res,), wall = timed(dev, srv.run, [prompt])
            return res.output_ids, wall
        runners[f"engine-{label}"] = once
    if hf_loop:
        ids = torch.tensor([prompt], device=dev)

        def loop():
            out, wall = timed(dev, tgt.model.generate, ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
            return out[0, len(prompt):].tolist(), wall
        runners["hf-loop"] = loop
    time_them(runners, repeats)
    runners = {**{k: f for k, f in runners.items() if k != "hf-loop"}, "hf-static": static,
               **{k: f for k, f in runners.items() if k == "hf-loop"}}  # the rows' order: engines, HF's two
    ref = outs["engine-hf"]
    for k in runners:
        print(f"[bench] {setup} batch 1 {k}: {spread(tps[k])} tok/s over {repeats} repeats, {len(outs[k])} tokens, "
              f"{'identical to' if outs[k] == ref else 'differs from'} the HF-layer engine")
    first = f"engine-{engines[0]}"
    ours = median(tps[first])
    b1 = "batch 1"

    def paired(a: str, b: str, name: str, direction: str = "report", goal=None) -> Ratio:
        q = [x / y for x, y in zip(tps[a], tps[b])]
        return ratio(setup, name, median(q), direction, goal, b1,
                     f"{median(tps[a]):.1f} vs {median(tps[b]):.1f} tok/s; per repeat {spread(q)}, {repeats} repeats")
    out = [ratio(setup, "AR tok/s / HBM bound", ours / bound, condition=b1,
                 note=f"{ours:.1f} tok/s vs {bound:.1f} (weights {nbytes / 1e9:.3f} GB / {bandwidth / 1e12:.1f} "
                      "TB/s)"),
           paired(first, "hf-static", "engine AR / HF static-cache compiled generate", ">=", 1.6),
           paired(first, "engine-hf", "engine AR compiled / on the HF layers")]
    for k in runners:
        if k.startswith("engine-") and k != first and k != "engine-hf":
            out.append(paired(k, "hf-static", f"engine AR / HF static-cache compiled generate{label_words(k)}", ">=",
                              1.6))
    if hf_loop:
        out.append(paired(first, "hf-loop", "engine AR / HF AR loop", ">=", 15))
    table = [{"setup": setup, "system": k, "batch": 1, "tokens": len(outs[k]), "tok_per_s": median(tps[k]),
              "tok_per_s_min": min(tps[k]), "tok_per_s_max": max(tps[k]), "repeats": repeats,
              "hbm_bound_tok_per_s": bound, "identical_to_engine_hf": outs[k] == ref} for k in runners]
    return table, out


def regeneration(tgt, prompts, temperature, tokens, setup, engine=None, label: str | None = None) -> dict:
    """The on-policy data stage's decode (one `run_generate` batch: AR, every prompt at once, T = `temperature`, EOS
    ignored): output tokens per second over the whole batch (prefill and graph capture included; compilation is
    done by a warm-up batch first) and the steady-state ms per decode step. `label`: the row's engine name (default:
    `engine`)."""
    dev = tgt.device
    gen = torch.Generator(device=dev).manual_seed(1)
    warm = Batch(tgt, build_method("ar", tgt), prompts, temperature, tokens, set(), gen, engine=engine)
    for _ in range(3):
        warm.step()
    del warm
    m = build_method("ar", tgt)
    m.timer = StageTimer(dev.type == "cuda")
    res, wall = timed(dev, generate, tgt, m, prompts, temperature, tokens, seed=1, engine=engine)
    n = sum(len(r.output_ids) for r in res)
    row = {"setup": setup, "engine": label or label_of(EngineConfig.of(engine)), "batch": len(prompts),
           "new_tokens": tokens,
           "temperature": temperature, "output_tokens": n, "wall_s": wall, "tok_per_s": n / wall,
           "ms_per_step": m.timer.ms_per_round(skip=min(4, tokens // 2))["round"]}
    print(f"[bench] {setup} regeneration batch {len(prompts)} ({row['engine']}): {row['tok_per_s']:.0f} tok/s, "
          f"{row['ms_per_step']:.2f} ms per step")
    return row


def regeneration_ratio(row: dict, setup: str, note: str = "") -> Ratio:
    """Regeneration tok/s against its goal (300 k tok/s); `note`: a name suffix (e.g. the attention kernel)."""
    return ratio(setup, f"regeneration tok/s{note}", row["tok_per_s"], ">=", 3e5, f"batch {row['batch']}",
                 f"{row['ms_per_step']:.2f} ms per step, T={row['temperature']:g}, {row['new_tokens']} new tokens, "
                 "prefill and capture included", unit="tok/s")


def kernel_profile(tgt, m, prompts, tokens, path: Path, temperature: float = 0.0, engine: EngineConfig | None = None):
    """Where a round's time goes: device time by kind of kernel (`dmtp.analysis.kernels`) and torch profiler's table
    over a `tokens`-token decode at `temperature` (CUDA graphs off, so every kernel is seen by name; the compiled
    engine launches the same kernels either way)."""
    from torch.profiler import ProfilerActivity, profile

    eng = EngineConfig.of(engine).with_(graphs=False)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:  # `tokens` as when timed: the
        generate(tgt, m, prompts, temperature, tokens, seed=0, engine=eng)  # same cache size, the compiled code reused
        _sync(tgt.device)
    write_text(path, kernel_summary(prof.key_averages(), f"{m.name}, batch {len(prompts)}, {tokens} tokens, "
                                                            f"T = {temperature:g}, CUDA graphs off"))
    print(f"[bench] kernel profile -> {path}")


def draft_side_ratios(by: dict, methods, tag, setup: str, batch: int, note: str = "") -> list[Ratio]:
    """The round against plain decoding at one shape and batch: DMTP round / AR step (goal <= 1.5) and the draft side
    (T1 head + embedding + fusion, the drafter, the MTP step, the drafter's context update) / verify (goal <= 0.15)
    — `by` maps (method tag, stage) to ms; `tag(name)` names a method's rows."""
    out, cond = [], f"batch {batch}"
    for name in methods:
        rnd, ver = by.get((tag(name), "round")), by.get((tag(name), "verify"))
        if rnd is None or ver is None or name == "ar":
            continue
        draft = sum(by.get((tag(name), st), 0.0) for st in ("t1_prep", "drafter", "mtp", "drafter_ctx"))
        out.append(ratio(setup, f"{name} draft side / verify{note}", draft / ver, "<=", DRAFT_SHARE_GOAL, cond,
                         f"{draft:.3f} ms (t1_prep + drafter + mtp + drafter_ctx) vs verify {ver:.3f} ms"))
        ar = by.get((tag("ar"), "round"))
        if ar:
            out.append(ratio(setup, f"{name} round / AR step{note}", rnd / ar, "<=", ROUND_AR_GOAL, cond,
                             f"{rnd:.3f} vs {ar:.3f} ms"))
    return out


def admission(tgt, methods: dict, prompts: list[list[int]], tokens: int, setup: str, eng: EngineConfig,
               groups=(1, 8)) -> list[dict]:
    """The host time a `Server` spends admitting a group of newcomers (their prompt pass, the method's own prefill,
    the move into the slots: `Server.admit_s`), per method and group size, on `eng` and on the HF prompt pass."""
    rows = []
    dev = tgt.device
    for prefill in dict.fromkeys([eng.prefill, "hf"]):
        e = eng.with_(prefill=prefill, admit=1)
        for name, m in methods.items():
            for g in groups:  # g slots: requests of one length finish together, g newcomers join at once
                srv = Server(tgt, m, g, capacity_for(prompts, tokens, m.k), 0.0, tokens, engine=e)
                srv.run(prompts[:g])  # start-up: graphs captured
                srv.run(prompts[g: 2 * g])  # the first admitted group: its prompt pass compiled
                srv.admit_s, srv.groups = 0.0, 0
                _, wall = timed(dev, srv.run, prompts[: 4 * g])
                srv.close()
                rows.append({"setup": setup, "method": name, "prefill": prefill, "group": g, "groups": srv.groups,
                             "ms_per_group": 1e3 * srv.admit_s / max(srv.groups, 1), "wall_s": wall})
                print(f"[bench] {setup} admission {name} ({prefill} prompt pass), groups of {g}: "
                      f"{rows[-1]['ms_per_group']:.2f} ms per group ({srv.groups} groups)")
    return rows


def mini_shape(a, dev, p, save=lambda *parts: None) -> tuple[list, list[Ratio], list, list]:
    """Timing only: the profile's embedded target shape (its `engine.dtype` unless `--dtype`), MTP head and drafters
    of the drafter baseline and the main method, random weights: stage times of AR and both methods at batch
    `--batch` on the profile's engine (`Profile.engine`), on the compiled engine's defaults and on the HF layers; the
    round against AR and the draft side's share of verify; the batch-1 baselines; the data stage's
    batch-`--regen-batch` regeneration; the host time of admitting newcomers. Setup "<profile>-shape"."""
    profile = p.name
    spec, d, setup = p.ablation, p.data, f"{profile}-shape"
    dflash, dmtp = spec.drafter_baseline, spec.main_method
    dtype = torch_dtype(a.dtype or p.engine.dtype)
    torch.manual_seed(0)
    with torch.device(dev):
        tgt, mtp = build_target(p.model.arch, d.vocab_size, eos_id=1, dtype=dtype)
    tgt.model.eval().requires_grad_(False)
    tgt.model.generation_config.eos_token_id = None  # random weights: every system decodes all `--tokens`
    mtp = mtp.eval().requires_grad_(False)
    base = drafter_config(p, tgt.config, mask_token_id=d.vocab_size - 1)
    drafters = {v: Drafter(DrafterConfig(**base, variant=v, variant_config=p.drafter.variants.get(v, {})))
                .to(device=dev, dtype=dtype).eval() for v in (dflash, dmtp)}
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, d.vocab_size - 1, (max(a.batch, a.regen_batch), d.prompt_tokens), generator=g)
    prompts = prompts.tolist()
    rows, ratios = [], []
    own = p.engine.with_(engine="compiled")
    parts = set(a.shape_parts)
    engines = {"": own}  # tag suffix -> engine: the profile's own first
    if "engines" in parts:  # the compiled engine's defaults and the HF layers beside it
        if label_of(own) != "compiled":
            engines["@compiled"] = engine_setting("compiled")
        engines["@hf"] = own.with_(engine="hf")
    methods = ("ar", dflash, dmtp)
    for tail, eng in engines.items():
        for name in methods:
            m = build_method(name, tgt, drafter=drafters.get(name), mtp=mtp)
            ms, _ = stage_times(tgt, m, prompts[: a.batch], a.tokens, engine=eng)
            tag = f"{setup}:{name}{tail}"
            rows += [{"method": tag, "stage": s, "ms_per_round": v, "batch": a.batch, "rounds": a.tokens,
                      "device": device_name(dev), "engine": label_of(eng)} for s, v in ms.items()]
            print(f"[bench] {tag} ({label_of(eng)}): " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}
    for tail, eng in engines.items():
        note = "" if not tail else f", {label_of(eng)}"
        q = by[(f"{setup}:{dmtp}{tail}", "round")] / by[(f"{setup}:{dflash}{tail}", "round")]
        goal = {"direction": "<=", "goal": round_goal(profile)} if not tail else {}
        ratios.append(ratio(setup, f"{dmtp} round / {dflash} round{note}", q, **goal, condition=f"batch {a.batch}"))
        if not tail:
            ratios += draft_side_ratios(by, methods, lambda n: f"{setup}:{n}", setup, a.batch)
    ratios.append(round_floor(tgt, mtp, by[(f"{setup}:{dflash}", "round")], a.bandwidth, setup,
                              f"{dmtp} round / {dflash} round", f"batch {a.batch}"))
    save(rows, ratios)
    if "admission" in parts:
        adm = admission(tgt, {n: build_method(n, tgt, drafter=drafters.get(n), mtp=mtp) for n in ("ar", dmtp)},
                        prompts, 16, setup, own)
        save(rows, ratios, admission=adm)
    if a.kernel_profile:  # where the profile engine's round goes, before anything else is compiled
        for name in (dmtp, "ar"):
            m = build_method(name, tgt, drafter=drafters.get(name), mtp=mtp)
            kernel_profile(tgt, m, prompts[: a.batch], a.tokens, Path(a.out) / f"profile_{setup}_{name}.txt",
                           engine=own)
    b1_rows = []
    if "baselines" in parts:
        b1_rows, b1 = batch1_baselines(tgt, prompts[0], a.tokens, a.bandwidth, setup, engines=b1_engines(a, own),
                                       repeats=a.repeats)
        ratios += b1
        save(rows, ratios, b1_rows)
    if a.kernel_sweep:
        k_rows, k_ratios = kernel_sweep(tgt, a.kernel_sweep, a.tokens, setup, low=2)
        ratios += k_ratios
        save(rows, ratios, b1_rows, kernels=k_rows)
    regen = []
    if a.regen_batch and "regen" in parts:
        reqs = prompts[: a.regen_batch]
        row = regeneration(tgt, reqs, d.temperature, d.new_tokens, setup, engine=own, label=label_of(own))
        regen.append(row)
        ratios.append(regeneration_ratio(row, setup, label_words(label_of(own))))
        save(rows, ratios, b1_rows, regen)
        if a.kernel_profile:  # the data stage's decode: AR over the whole batch (32 tokens: the kernels repeat)
            kernel_profile(tgt, build_method("ar", tgt), reqs, 32, Path(a.out) / f"profile_{setup}_regen.txt",
                           d.temperature, engine=own)
    return rows, ratios, b1_rows, regen


# --- the parts on a trained target ---------------------------------------------------------------------------------
@dataclass
class Bench:
    """What every part measures with: the profile's target, MTP head, trained drafters and HumanEval prompts."""
    a: argparse.Namespace  # the command line
    spec: AblationSpec  # which runs are DMTP (main_method) and DFlash (drafter_baseline)
    setup: str  # the ratio records' setup: the profile
    data: DataConfig  # the profile's on-policy data settings (the regeneration part decodes as that stage does)
    tgt: Target
    mtp: MTPHead
    eos: list[int]
    prompts: list[list[int]]  # HumanEval prompt ids
    eng: EngineConfig = field(default_factory=EngineConfig)  # the profile's engine: every part decodes with it
    tok: object = None  # the target's tokenizer (natural mode's stop strings)
    screen: T1Screen | None = field(default=None)  # built on first use

    @classmethod
    def load(cls, a, spec: AblationSpec, setup: str, data: DataConfig, eng: EngineConfig) -> "Bench":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        tok = find_tokenizer(a.target)
        if tok is None:
            raise ValueError(f"--target {a.target}: no tokenizer files beside config.json (the HumanEval prompts are "
                             "text)")
        tgt = Target.load(a.target, dtype=torch_dtype(a.dtype or eng.dtype), device=dev)
        prompts = [p["prompt_ids"] for p in encode_prompts(tok, humaneval_prompts())]
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        return cls(a, spec, setup, data, tgt, MTPHead.load(tgt, a.target), eos, prompts, eng, tok)

    @property
    def dev(self) -> str:
        return self.tgt.device.type

    def method(self, name: str) -> Method:
        """A run's method by name, optionally "+screen" (with the screened T1 head)."""
        base, _, extra = name.partition("+")
        if extra == "screen" and self.screen is None:
            self.screen = T1Screen(self.tgt, rank=self.a.screen_rank, topk=self.a.screen_topk)
        m = load_method(base, self.tgt, self.mtp, self.a.drafters, screen=self.screen if extra == "screen" else None)
        m.name = name
        return m


def overhead(b: Bench, methods: list[str]) -> list[Ratio]:
    """Per-round stage times of `ar` and every method at batch `--batch` and at each batch cap (the cost model's round
    times, `dmtp.analysis.costmodel`), `--tokens` generated tokens, EOS ignored, the first 16 rounds excluded; at
    `--batch` the round ratios: DMTP / DFlash, each method / AR step, the draft side / verify."""
    a, dmtp, dflash = b.a, b.spec.main_method, b.spec.drafter_baseline
    names = ["ar"] + [m for m in methods if m != "ar"]
    rows, ratios = [], []
    for batch in sorted({a.batch, *a.caps}):
        prompts = [b.prompts[i % len(b.prompts)] for i in range(batch)]
        for name in names:
            ms, res = stage_times(b.tgt, b.method(name), prompts, a.tokens, engine=b.eng)
            rows += [{"method": name, "stage": s, "ms_per_round": v, "batch": batch, "rounds": len(res[0].accepted),
                      "device": device_name(b.dev), "engine": label_of(b.eng)} for s, v in ms.items()]
            print(f"[bench] overhead {name} batch {batch}: " + ", ".join(f"{s} {v:.3f}" for s, v in ms.items()))
    by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows if r["batch"] == a.batch}
    if (dflash, "round") in by and (dmtp, "round") in by:
        ratios.append(ratio(b.setup, f"{dmtp} round / {dflash} round", by[(dmtp, "round")] / by[(dflash, "round")],
                            "<=", round_goal(b.setup), f"batch {a.batch}"))
    ratios += draft_side_ratios(by, names, lambda n: n, b.setup, a.batch, ", trained models")
    merge_overhead(Path(a.out) / "overhead.csv", rows)
    return ratios


def throughput(b: Bench, methods: list[str]) -> list[Ratio]:
    """End-to-end throughput, the way a user serves: HumanEval prompts in natural mode (end-of-text and HumanEval's
    stop strings), dynamic batching (`Server`) at each batch cap, every method side by side in one process. Per
    (temperature, cap) a server per method is started and warmed up (graph capture on a first group, as at server
    start-up); then `--repeats` timed runs of the whole request group, interleaved (every method once per repeat, the
    order rotated by one each repeat), so a drift of the machine reaches all alike. The largest cap decodes
    `--prompts` prompts, the others the first `--small-cap-prompts`. throughput.csv: one row per run (tok/s, per-verify
    tau, server rounds, admitted groups and the host time admitting them); ratios: each method / AR as the median of
    the per-repeat ratios with their range, and DMTP's tok/s gain over DFlash against its per-verify gain."""
    a = b.a
    stop = stop_spec(b.tgt, b.tok, "natural", HUMANEVAL_STOPS) if b.tok is not None else None
    rows, top = [], max(a.caps)
    runs = [(n, v) for n in methods for v in a.verify]
    for temp in a.temperatures:
        for cap in a.caps:
            reqs = b.prompts[: a.prompts if cap == top else a.small_cap_prompts]
            servers = {}
            for name, v in runs:  # start-up: one server per method, graphs captured on a first group
                m = b.method(name)
                run = name if v == "target" else f"{name}+{v}"
                servers[run] = Server(b.tgt, m, cap, capacity_for(reqs, a.max_new_tokens, m.k), temp,
                                      a.max_new_tokens, b.eos, seed=0, engine=b.eng, stop=stop, verify=v)
                servers[run].run(reqs[:cap])
            order = list(servers)
            for rep in range(a.repeats):
                for run in order[rep % len(order):] + order[: rep % len(order)]:
                    srv = servers[run]
                    before = (srv.admit_s, srv.rounds, srv.groups)
                    res, wall = timed(b.dev, srv.run, reqs)
                    n_out = sum(len(r.output_ids) for r in res)
                    acc = [x for r in res for x in r.accepted]
                    rows.append({"method": run, "temperature": temp, "batch_cap": cap, "repeat": rep,
                                 "dataset": "humaneval", "mode": "natural", "batching": "dynamic",
                                 "requests": len(reqs), "output_tokens": n_out, "wall_s": wall,
                                 "tok_per_s": n_out / wall, "per_verify": acceptance_length(acc),
                                 "verify_rounds": len(acc), "server_rounds": srv.rounds - before[1],
                                 "groups": srv.groups - before[2], "admit_s": srv.admit_s - before[0],
                                 "verify": run.partition("+")[2] or "target", "engine": label_of(b.eng),
                                 "admit": b.eng.admit})
                    print(f"[bench] throughput {run} T={temp:g} B{cap} #{rep}: {n_out / wall:.1f} tok/s "
                          f"(tau/verify {rows[-1]['per_verify']:.2f}, {rows[-1]['groups']} groups admitted in "
                          f"{rows[-1]['admit_s']:.2f}s)")
                    write_text(Path(a.out) / "throughput.csv", pd.DataFrame(rows).to_csv(index=False))  # so far
            for srv in servers.values():  # their slots (caches, graphs) go before the next cap
                srv.close()
    return throughput_ratios(pd.DataFrame(rows), b.spec, b.setup)


def hf(b: Bench, methods: list[str]) -> list[Ratio]:
    """The engine vs a plain HF `generate` loop, batch 1, T = 0, and AR against the HBM bound."""
    a, dev, eos, dmtp = b.a, b.dev, b.eos, b.spec.main_method
    rows = []
    bound = a.bandwidth / read_bytes_per_token(b.tgt)
    hf_prompts = b.prompts[: a.hf_prompts]
    servers = {}
    for name in methods:  # batch-1 servers, graphs captured on a warm-up request
        m = b.method(name)
        servers[name] = Server(b.tgt, m, 1, capacity_for(hf_prompts, a.max_new_tokens, m.k), 0.0, a.max_new_tokens,
                               eos, engine=b.eng)
        servers[name].run(hf_prompts[:1])
    for i, pr in enumerate(hf_prompts):
        out, t_hf = timed(dev, b.tgt.model.generate, torch.tensor([pr], device=dev), max_new_tokens=a.max_new_tokens,
                          do_sample=False, eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
        ref = out[0, len(pr):].tolist()
        for name, srv in servers.items():
            (res,), t = timed(dev, srv.run, [pr])
            rows.append({"prompt": i, "method": name, "tokens": len(res.output_ids),
                         "ours_tok_per_s": len(res.output_ids) / t, "hf_ar_tok_per_s": len(ref) / t_hf,
                         "speedup_vs_hf_ar": (len(res.output_ids) / t) / (len(ref) / t_hf),
                         "identical": res.output_ids == ref, "ar_hbm_bound_tok_per_s": bound})
    df = pd.DataFrame(rows)
    write_text(Path(a.out) / "hf.csv", df.to_csv(index=False))
    mean = df.groupby("method")[["ours_tok_per_s", "hf_ar_tok_per_s", "speedup_vs_hf_ar", "identical"]].mean()
    print(mean)
    ratios = []
    if "ar" in mean.index:
        ratios.append(ratio(b.setup, "engine AR / HF AR loop", mean.loc["ar", "speedup_vs_hf_ar"], ">=", 15,
                            "batch 1"))
        static = hf_static_generate(b.tgt, hf_prompts[0], a.max_new_tokens)
        static()  # compiles
        out, wall = static()
        tps = len(out) / wall
        ours = df[(df.method == "ar") & (df.prompt == 0)].ours_tok_per_s.iloc[0]
        ratios.append(ratio(b.setup, "engine AR / HF static-cache compiled generate", ours / tps, ">=", 1.6,
                            "batch 1", f"{ours:.0f} vs {tps:.0f} tok/s (first prompt; natural EOS for ours)"))
        ratios.append(ratio(b.setup, "AR tok/s / HBM bound", mean.loc["ar", "ours_tok_per_s"] / bound,
                            condition="batch 1", note=f"{mean.loc['ar', 'ours_tok_per_s']:.0f} tok/s vs {bound:.0f} "
                                                      "tok/s"))
    if dmtp in mean.index:
        ratios.append(ratio(b.setup, f"engine {dmtp} / HF AR loop", mean.loc[dmtp, "speedup_vs_hf_ar"], ">=", 15,
                            "batch 1"))
    return ratios


def regen(b: Bench, methods: list[str]) -> list[Ratio]:
    """The on-policy data stage's regeneration on the trained target: `--regen-batch` HumanEval prompts (cut to the
    profile's prompt budget, repeated as needed) at once, AR, the profile's data temperature and new tokens."""
    a, d = b.a, b.data
    if not a.regen_batch:
        return []
    reqs = [b.prompts[i % len(b.prompts)][: d.prompt_tokens] for i in range(a.regen_batch)]
    row = regeneration(b.tgt, reqs, d.temperature, d.new_tokens, b.setup, engine=b.eng, label=label_of(b.eng))
    merge_rows(Path(a.out) / "regen.csv", [row])
    return [regeneration_ratio(row, b.setup)]


def screen(b: Bench, methods: list[str]) -> list[Ratio]:
    """The screened T1 head on the real (trained) target: T1 agreement with the exact head, first-token acceptance
    and acceptance length with and without it (the main method; skipped when it is not among `methods`)."""
    a, dmtp = b.a, b.spec.main_method
    if dmtp not in methods:
        return []
    rows, reqs = [], b.prompts[: a.prompts]
    for name in [dmtp, dmtp + "+screen"]:
        m = b.method(name)
        acc = [x for r in generate(b.tgt, m, reqs, 0.0, a.max_new_tokens, b.eos, engine=b.eng) for x in r.accepted]
        rows.append({"method": name, "rank": a.screen_rank, "topk": a.screen_topk, "rounds": len(acc),
                     "first_token_acceptance": first_token(histogram(acc, m.k)), "per_verify": acceptance_length(acc)})
    with torch.no_grad():  # T1 agreement over MTP hiddens of real text (the first 64 tokens of each prompt)
        ids = torch.tensor([p[:64] for p in reqs if len(p) >= 64][:64], device=b.dev)
        g = b.mtp.teacher_forced(ids, b.tgt.features(ids).hidden).reshape(-1, b.tgt.hidden_size)
        agree = float((b.screen(g) == b.tgt.lm_head(g).argmax(-1)).float().mean())
    for r in rows:
        r["t1_agreement"] = agree if "+screen" in r["method"] else 1.0
    write_text(Path(a.out) / "screen.csv", pd.DataFrame(rows).to_csv(index=False))
    print(pd.DataFrame(rows))
    return []


PARTS = {"overhead": overhead, "throughput": throughput, "hf": hf, "screen": screen, "regen": regen}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", help="target checkpoint with the native MTP head (not needed with --paper-shape)")
    p.add_argument("--drafters", help="directory of trained drafters (<name>/drafter)")
    p.add_argument("--profile", help="whose ablation spec names the runs (default: the folder above --target, else "
                   "mini); also the ratio records' setup")
    p.add_argument("--methods", type=names, help="runs to time, comma-separated (default: the spec's ablation.bench)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a profile field for this run (repeatable, as `dmtp pipeline --set`), e.g. engine.attention=flex "
                        "or model.arch.num_hidden_layers=24 with --mini-shape")
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
    p.add_argument("--regen-batch", type=at_least(0), default=2048,
                   help="--mini-shape and part `regen`: prompts decoded at once as the data stage does (0: skip)")
    p.add_argument("--kernel-profile", action="store_true",
                   help="--paper-shape / --mini-shape: also write torch-profiler kernel tables (profile_*.txt)")
    p.add_argument("--kernel-sweep", type=listed(at_least(2)), default=[],
                   help="--paper-shape / --mini-shape: contexts (tokens, e.g. 512,2048,8192) at which AR batch 1 is "
                        "timed with each attention kernel (kernels.csv)")
    p.add_argument("--batch", type=at_least(1), default=8)
    p.add_argument("--tuned", action="store_true",
                   help="--paper-shape / --mini-shape: also time the batch-1 engine with Inductor's autotuned kernels "
                        "(+tuned: max_autotune, coordinate descent; minutes more of compilation at the 8B shape)")
    p.add_argument("--repeats", type=at_least(1), default=3,
                   help="--paper-shape / --mini-shape: timed repeats of each batch-1 system, interleaved (medians)")
    p.add_argument("--tokens", type=at_least(17), default=512, help="tokens per request in the overhead part (the "
                   "first 16 rounds are excluded)")
    p.add_argument("--caps", type=listed(at_least(1)), default=[1, 32])
    p.add_argument("--prompts", type=at_least(1), default=164,
                   help="HumanEval prompts of the throughput runs at the largest cap")
    p.add_argument("--small-cap-prompts", type=at_least(1), default=24,
                   help="HumanEval prompts of the throughput runs at the other caps (batch 1 over 164 prompts: minutes)")
    p.add_argument("--max-new-tokens", type=at_least(1), default=256)
    p.add_argument("--temperatures", type=listed(temperature), default=[0.0, 1.0])
    p.add_argument("--verify", type=verify_modes, default=["target"],
                   help="throughput part: verify modes (target,sample,block); rows other than target: <method>+<mode>")
    p.add_argument("--hf-prompts", type=at_least(1), default=4)
    p.add_argument("--bandwidth", type=number(0, open_lo=True), default=4.3e12,
                   help="HBM bytes/s for the AR bound (H200: ~4.3e12)")
    p.add_argument("--screen-rank", type=at_least(1), default=256)
    p.add_argument("--screen-topk", type=at_least(1), default=64)
    p.add_argument("--dtype", default=None, choices=["fp32", "bf16"],
                   help="precision of the models (default: the profile's engine.dtype)")
    a = p.parse_args(argv)
    parts = set(a.parts.split(","))
    if not (parts <= set(PARTS) or parts == {"ratios"}):
        p.error(f"argument --parts: expected {','.join(PARTS)} (any of them) or ratios, got {a.parts!r}")
    guard("python -m dmtp.cli.bench", run, p, a)


def run(p, a):
    above = Path(a.target).parent.name if a.target else ""  # work/<profile>/target
    profile = a.profile or (above if above in PROFILES else "mini")
    prof = override(get_profile(profile), a.set)
    spec = prof.ablation
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

        def save_shape(rows, new, base=(), regen=(), kernels=(), admission=()):  # after each part
            merge_overhead(out / "overhead.csv", rows)
            if admission:
                merge_rows(out / "admission.csv", admission)
            if base:
                merge_rows(out / "baselines.csv", base)
            if regen:
                merge_rows(out / "regen.csv", regen)
            if kernels:
                merge_rows(out / "kernels.csv", kernels)
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
    checkpoint(a.target, "--target", "target checkpoint")
    for name in methods:
        base = name.partition("+")[0]
        if base not in ("ar", "mtp"):
            if not a.drafters:
                raise ValueError(f"--methods {name}: a drafter method needs --drafters DIR (holding {base}/drafter)")
            checkpoint(Path(a.drafters) / base / "drafter", f"--methods {name}:", "drafter checkpoint")
    b = Bench.load(a, spec, profile, prof.data, prof.engine)
    new = []
    for part in a.parts.split(","):
        new += PARTS[part](b, methods)
        save(new)
    write_meta(out / "meta.json", vars(a))


if __name__ == "__main__":
    main()
