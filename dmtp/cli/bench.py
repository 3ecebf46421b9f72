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
                "8b-shape:<name>" / "mini-shape:<name>", timing only; "@hf": the loop on the HF layers)
throughput.csv  total output tokens / wall time of the whole request group at each batch cap (natural EOS), with
                dynamic batching (`decode.serve`: a finished request's slot goes to the next one at once)
hf.csv          the same requests, batch 1, T = 0: the engine vs a plain HF `generate` loop (DynamicCache, no graphs),
                tokens/s, whether outputs are identical, and AR's HBM bound (bytes read per token / bandwidth)
screen.csv      the screened T1 head (`screen.T1Screen`): T1 agreement with the exact head, first-token acceptance
                and acceptance length with and without it
baselines.csv   --paper-shape / --mini-shape, batch 1: the compiled engine, the same loop on the HF layers, HF's
                static-cache compiled `generate`, the plain HF loop (mini), tok/s side by side, and the HBM bound
regen.csv       the data stage's regeneration (AR, `--regen-batch` prompts at once, T = 0.8): tok/s, ms per step
profile_*.txt   --kernel-profile: torch-profiler tables of the device kernels of a decode (where a round goes)
ratios.json     the targets, each measured side by side in one run: DMTP round <= 1.04 x DFlash round (batch 8; mini:
                1.08), DMTP's B32 throughput gain >= 95 % of its per-verify gain, engine >= 15 x HF's loop and
                >= 1.6 x HF's compiled static-cache generate at batch 1, verify of 8x8 rows <= 1.2 AR steps,
                regeneration >= 300 k tok/s, AR vs HBM
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import time
from collections import defaultdict
from pathlib import Path

import torch

from dmtp.cli.args import at_least, checkpoint, guard, listed, names, number, out_dir
from dmtp.data.humaneval import humaneval_prompts
from dmtp.data.tokenizer import find_tokenizer
from dmtp.engine.decode import Batch, Server, build_method, capacity_for, generate, load_method, no_timer
from dmtp.engine.fuse import fuse
from dmtp.io import write_meta, write_text
from dmtp.models import fast
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.mtp import MTPHead
from dmtp.models.screen import T1Screen
from dmtp.models.target import Target
from dmtp.training.pretrain import build_target
from experiments.profiles import mini


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
        """Mean ms per round of each stage (a stage run twice in a round counts both), the first `skip` rounds
        excluded."""
        if self.cuda:
            torch.cuda.synchronize()
        tot, n = defaultdict(float), defaultdict(int)
        for r in self.rounds[skip:]:
            for stage, ev in r.items():
                tot[stage] += sum((a.elapsed_time(b) if self.cuda else (b - a) * 1e3) for a, b in ev)
                n[stage] += 1
        return {s: tot[s] / n[s] for s in tot}


def _sync(dev):
    if str(dev).startswith("cuda"):
        torch.cuda.synchronize()


def read_bytes_per_token(target) -> int:
    """Weight bytes a decode step reads: every parameter except an untied input embedding (only rows are read)."""
    emb = target.body.embed_tokens.weight
    tied = emb.data_ptr() == target.model.lm_head.weight.data_ptr()
    return sum(p.numel() * p.element_size() for p in target.model.parameters()) - (0 if tied else emb.numel()
                                                                                    * emb.element_size())


def stage_times(tgt, m, prompts, tokens, skip=16, engine=None):
    """ms per round by stage over `tokens` generated tokens (EOS ignored), first `skip` rounds excluded."""
    m.timer = StageTimer(tgt.device.type == "cuda")
    res = generate(tgt, m, prompts, 0.0, tokens, eos_ids=(), seed=0, engine=engine)
    ms = m.timer.ms_per_round(skip)
    m.timer = no_timer
    return ms, res


def timed(dev, fn):
    _sync(dev)
    t0 = time.perf_counter()
    out = fn()
    _sync(dev)
    return out, time.perf_counter() - t0


def ratio(name, value, target, ok, note=""):
    r = {"target": name, "value": round(float(value), 4), "goal": target, "met": bool(ok), "note": note}
    print(f"[bench] {'MET ' if ok else 'MISS'} {name}: {value:.3f} (goal {target}) {note}")
    return r


KINDS = {"flex": "", "dense": "+dense"}  # the compiled engine's attention kernels (`fast.ATTENTION`): name suffix


def _kind(kind):
    return "" if kind == "flex" else ", dense attention"


def merge_overhead(path: Path, rows: list[dict]):
    """Write overhead rows, keeping stored rows of the other setups (`<setup>:<name>`, e.g. `8b-shape:dflash`, vs
    plain names: the trained target)."""
    import pandas as pd

    def setup(m):
        return m.partition(":")[0] if ":" in m else ""

    new = pd.DataFrame(rows)
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=new.columns)
    old = old[~old.method.map(setup).isin(set(new.method.map(setup)))]
    write_text(path, pd.concat([new, old] if (new.method.map(setup) == "").any() else [old, new]).to_csv(index=False))


def merge_rows(path: Path, rows: list[dict]):
    """Write `rows` (each with a `setup`) over the stored rows of the same setups, keeping the others."""
    import pandas as pd

    new = pd.DataFrame(rows)
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=new.columns)
    write_text(path, pd.concat([old[~old.setup.isin(set(new.setup))], new]).to_csv(index=False))


def throughput_ratios(tp, dmtp: str, label: str) -> list[dict]:
    """At the largest batch cap measured for both: DMTP's throughput gain over DFlash / its per-verify gain."""
    out = []
    for temp, g in tp.groupby("temperature"):
        g = g.set_index(["method", "batch_cap"])
        caps = [c for c in sorted(set(g.index.get_level_values(1))) if ("dflash", c) in g.index and (dmtp, c) in g.index]
        if not caps:
            continue
        cap = caps[-1]
        gain = g.loc[(dmtp, cap), "tok_per_s"] / g.loc[("dflash", cap), "tok_per_s"] - 1
        tau = g.loc[(dmtp, cap), "per_verify"] / g.loc[("dflash", cap), "per_verify"] - 1
        out.append(ratio(f"{label} T={temp:g} B{cap} throughput gain / per-verify gain ({dmtp} vs dflash)",
                         gain / tau if tau > 0 else float("nan"), ">= 0.95", bool(tau > 0 and gain / tau >= 0.95),
                         f"throughput {gain:+.1%}, per-verify {tau:+.1%}"))
    return out


def fuse_compare(tgt, others, methods: dict, eager: dict, prompts, tokens, label, dev, prefix="",
                 dmtp="zero_init_residual"):
    """Stage times of `methods` (name -> Method) with the target (and `others`: MTP head, drafters) fused by
    `fuse.fuse`, beside their unfused times measured earlier in the same process (`eager`: name -> (stage_times ms,
    output ids)): overhead rows '<prefix><name>+fused', ratios fused/unfused round per method and fused DMTP / fused
    DFlash round, and whether each method's tokens are unchanged. The methods must be built on the modules in
    `others` (they are the ones fused)."""
    rows, ratios = [], []
    with fuse(tgt, *others) as fusion:
        print(f"[bench] {label}: {fusion}")
        for name, m in methods.items():
            t0 = time.perf_counter()
            stage_times(tgt, m, prompts[:1], 8, skip=0)  # compiles this method's new shapes
            t_compile = time.perf_counter() - t0
            ms, res = stage_times(tgt, m, prompts, tokens)
            same = [r.output_ids for r in res] == eager[name][1]
            for stage, v in ms.items():
                rows.append({"method": f"{prefix}{name}+fused", "stage": stage, "ms_per_round": v,
                             "batch": len(prompts), "rounds": tokens,
                             "device": torch.cuda.get_device_name() if dev == "cuda" else dev})
            q = ms["round"] / eager[name][0]["round"]
            print(f"[bench] {label} {name}+fused (first call {t_compile:.1f}s, outputs "
                  f"{'identical' if same else 'DIFFER'}): " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
            ratios.append(ratio(f"{label} {name} fused round / unfused round (batch {len(prompts)})", q, "report",
                                True, f"{eager[name][0]['round']:.3f} -> {ms['round']:.3f} ms; outputs "
                                      f"{'identical' if same else 'differ'}"))
    by = {r["method"]: r["ms_per_round"] for r in rows if r["stage"] == "round"}
    if f"{prefix}{dmtp}+fused" in by and f"{prefix}dflash+fused" in by:
        q = by[f"{prefix}{dmtp}+fused"] / by[f"{prefix}dflash+fused"]
        ratios.append(ratio(f"{label} fused {dmtp} round / fused dflash round (batch {len(prompts)})", q, "<= 1.04",
                            q <= 1.04))
    return rows, ratios


def paper_shape(a, dev, save=lambda *parts: None) -> tuple[list[dict], list[dict], list[dict]]:
    """Timing only: a Qwen3-8B-sized dense target (random bf16 weights), one MTP layer, 5-layer drafters, batch
    `--batch`; every round accepts ~nothing, so each emits one token — what matters is the time per stage. Then
    the batch-1 baselines and the verify-vs-AR-step ratio. Returns overhead rows, ratios, baseline rows, also handed
    to `save` after each part (a run cut short keeps what it measured)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    with torch.device(dev):
        tgt = Target(AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa"))
        mtp = MTPHead(tgt).eval()
    prompts = torch.randint(1000, 100000, (a.batch, 256), generator=torch.Generator().manual_seed(0)).tolist()
    rows, ratios = [], []
    screen = T1Screen(tgt, rank=a.screen_rank, topk=a.screen_topk)
    drafters = {}
    for v in ("dflash", "zero_init_residual"):
        c = DrafterConfig(hidden_size=4096, vocab_size=151936, num_hidden_layers=5, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, intermediate_size=12288, num_target_layers=36,
                          variant=v, mask_token_id=151669)
        drafters[v] = Drafter(c).to(device=dev, dtype=torch.bfloat16).eval()

    def method(name):
        variant = name.split("+")[0]
        return build_method(variant, tgt, drafter=drafters.get(variant), mtp=mtp,
                            screen=screen if "+screen" in name else None)
    names = ["dflash", "zero_init_residual", "zero_init_residual+screen"]  # AR: at batch 1 below
    eager = {}
    for kind in KINDS:  # the compiled engine's two attention kernels, side by side (the screen: flex only)
        with fast.attention(kind):
            for name in names[: 3 if kind == "flex" else 2]:
                ms, res = stage_times(tgt, method(name), prompts, a.tokens)
                if kind == "flex":
                    eager[name] = (ms, [r.output_ids for r in res])
                for stage, v in ms.items():
                    rows.append({"method": f"8b-shape:{name}{KINDS[kind]}", "stage": stage, "ms_per_round": v,
                                 "batch": a.batch, "rounds": a.tokens,
                                 "device": torch.cuda.get_device_name() if dev == "cuda" else dev})
                print(f"[bench] 8b-shape {name}{KINDS[kind]}: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    if a.fuse:
        f_rows, f_ratios = fuse_compare(tgt, [mtp, *drafters.values()], {n: method(n) for n in names[:2]}, eager,
                                        prompts, a.tokens, "8b-shape", dev, prefix="8b-shape:")
        rows += f_rows
        ratios += f_ratios
    by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}
    for kind, sfx in KINDS.items():
        for name in names[1: 3 if kind == "flex" else 2]:
            q = by[(f"8b-shape:{name}{sfx}", "round")] / by[(f"8b-shape:dflash{sfx}", "round")]
            ratios.append(ratio(f"8b-shape {name} round / dflash round (batch {a.batch}){_kind(kind)}", q, "<= 1.04",
                                q <= 1.04))
    save(rows, ratios)
    b1_rows, b1_ratios = batch1_baselines(tgt, prompts[0], a.tokens, a.bandwidth, "8b-shape", hf_loop=False)
    ratios += b1_ratios
    save(rows, ratios, b1_rows)
    for kind, sfx in KINDS.items():
        with fast.attention(kind):  # the same cache size as the baselines': no recompilation
            ar1, _ = stage_times(tgt, build_method("ar", tgt), prompts[:1], a.tokens)
        rows += [{"method": f"8b-shape:ar@batch1{sfx}", "stage": s, "ms_per_round": v, "batch": 1,
                  "rounds": a.tokens, "device": torch.cuda.get_device_name() if dev == "cuda" else dev}
                 for s, v in ar1.items()]
        q = by[(f"8b-shape:dflash{sfx}", "verify")] / ar1["verify"]
        ratios.append(ratio(f"8b-shape verify of {a.batch}x8 rows / AR step (batch 1){_kind(kind)}", q, "<= 1.2",
                            q <= 1.2, f"{by[(f'8b-shape:dflash{sfx}', 'verify')]:.3f} ms vs {ar1['verify']:.3f} ms"))
    save(rows, ratios, b1_rows)
    if a.kernel_profile:
        for name, kind in (("ar", "flex"), ("ar", "dense"), ("dflash", "flex"), ("zero_init_residual", "flex")):
            with fast.attention(kind):
                kernel_profile(tgt, method(name), prompts[:1] if name == "ar" else prompts, a.tokens,
                               Path(a.out) / f"profile_8b-shape_{name}{KINDS[kind]}.txt")
    save(rows, ratios, b1_rows)
    return rows, ratios, b1_rows


def hf_static_generate(tgt, prompt: list[int], tokens: int):
    """HF transformers' own fast path, batch 1: `generate(cache_implementation="static")`, which compiles the forward
    (torch.compile with CUDA graphs) on CUDA. Called once to compile, then timed. Returns (tok/s, output ids)."""
    dev = tgt.device
    ids = torch.tensor([prompt], device=dev)
    kw = dict(max_new_tokens=tokens, do_sample=False, cache_implementation="static", pad_token_id=0)
    tgt.model.generate(ids, **kw)
    out, wall = timed(dev, lambda: tgt.model.generate(ids, **kw)[0, len(prompt):].tolist())
    return len(out) / wall, out


def batch1_baselines(tgt, prompt, tokens, bandwidth, label, hf_loop=True,
                     engines=("compiled", "compiled+dense", "hf")) -> tuple[list[dict], list[dict]]:
    """Batch 1, T = 0, `tokens` new tokens after `prompt` (EOS ignored), in one process side by side: the engine
    (compiled, the default on CUDA), the same loop on the HF layers (`engine="hf"`, the engine before compilation),
    HF's static-cache compiled `generate`, the plain HF loop (`hf_loop`), and AR's HBM bound. The engine's servers
    capture their graphs on a warm-up request first, as a serving engine does at start-up."""
    dev = tgt.device
    nbytes = read_bytes_per_token(tgt)
    bound = bandwidth / nbytes
    cap = capacity_for([prompt], tokens, 0)
    rows = {}
    for engine in engines:  # "<engine>+dense": the compiled engine with its dense attention kernel
        with fast.attention("dense" if engine.endswith("+dense") else "flex"):
            srv = Server(tgt, build_method("ar", tgt), 1, cap, 0.0, tokens, engine=engine.split("+")[0])
            srv.run([prompt])
            res, wall = timed(dev, lambda: srv.run([prompt])[0])
        rows[f"engine-{engine}"] = (len(res.output_ids) / wall, res.output_ids)
    rows["hf-static"] = hf_static_generate(tgt, prompt, tokens)
    if hf_loop:
        ref, wall = timed(dev, lambda: tgt.model.generate(torch.tensor([prompt], device=dev), max_new_tokens=tokens,
                                                          do_sample=False, pad_token_id=0)[0, len(prompt):].tolist())
        rows["hf-loop"] = (len(ref) / wall, ref)
    ours = rows[f"engine-{engines[0]}"][0]
    for k, (tps, out) in rows.items():
        print(f"[bench] {label} batch 1 {k}: {tps:.1f} tok/s, {len(out)} tokens, "
              f"{'identical to' if out == rows['engine-hf'][1] else 'differs from'} the HF-layer engine")
    out = [ratio(f"{label} AR batch-1 tok/s / HBM bound", ours / bound, "report", True,
                 f"{ours:.1f} tok/s vs {bound:.1f} (weights {nbytes / 1e9:.3f} GB / {bandwidth / 1e12:.1f} TB/s)"),
           ratio(f"{label} engine AR / HF static-cache compiled generate, batch 1", ours / rows["hf-static"][0],
                 ">= 1.6", ours / rows["hf-static"][0] >= 1.6, f"{ours:.1f} vs {rows['hf-static'][0]:.1f} tok/s"),
           ratio(f"{label} engine AR compiled / on the HF layers, batch 1", ours / rows["engine-hf"][0], "report",
                 True, f"{ours:.1f} vs {rows['engine-hf'][0]:.1f} tok/s")]
    for k in rows:
        if k.endswith("+dense"):
            q = rows[k][0] / rows["hf-static"][0]
            out.append(ratio(f"{label} engine AR / HF static-cache compiled generate, batch 1, dense attention", q,
                             ">= 1.6", q >= 1.6, f"{rows[k][0]:.1f} vs {rows['hf-static'][0]:.1f} tok/s"))
    if hf_loop:
        q = ours / rows["hf-loop"][0]
        out.append(ratio(f"{label} engine AR / HF AR loop, batch 1", q, ">= 15", q >= 15,
                         f"{ours:.1f} vs {rows['hf-loop'][0]:.1f} tok/s"))
    table = [{"setup": label, "system": k, "batch": 1, "tokens": len(o), "tok_per_s": t, "hbm_bound_tok_per_s": bound,
              "identical_to_engine_hf": o == rows["engine-hf"][1]} for k, (t, o) in rows.items()]
    return table, out


def regeneration(tgt, prompts, temperature, tokens, label, engine=None) -> dict:
    """The on-policy data stage's decode (one `run_generate` batch: AR, every prompt at once, T = `temperature`, EOS
    ignored): output tokens per second over the whole batch (prefill and graph capture included; compilation is
    done by a warm-up batch first) and the steady-state ms per decode step."""
    dev = tgt.device
    gen = torch.Generator(device=dev).manual_seed(1)
    warm = Batch(tgt, build_method("ar", tgt), prompts, temperature, tokens, set(), gen, engine=engine)
    for _ in range(3):
        warm.step()
    del warm
    m = build_method("ar", tgt)
    m.timer = StageTimer(dev.type == "cuda")
    res, wall = timed(dev, lambda: generate(tgt, m, prompts, temperature, tokens, seed=1, engine=engine))
    n = sum(len(r.output_ids) for r in res)
    row = {"setup": label, "engine": engine or "default", "batch": len(prompts), "new_tokens": tokens,
           "temperature": temperature, "output_tokens": n, "wall_s": wall, "tok_per_s": n / wall,
           "ms_per_step": m.timer.ms_per_round(skip=min(4, tokens // 2))["round"]}
    print(f"[bench] {label} regeneration batch {len(prompts)} ({row['engine']}): {row['tok_per_s']:.0f} tok/s, "
          f"{row['ms_per_step']:.2f} ms per step")
    return row


def regeneration_ratio(row, label, note="") -> dict:
    return ratio(f"{label} regeneration tok/s, batch {row['batch']}{note}", row["tok_per_s"], ">= 300000",
                 row["tok_per_s"] >= 3e5, f"{row['ms_per_step']:.2f} ms per step, T={row['temperature']:g}, "
                                          f"{row['new_tokens']} new tokens, prefill and capture included")


def kernel_profile(tgt, m, prompts, tokens, path: Path):
    """Where a round's time goes: torch profiler's table of device kernels over a `tokens`-token decode (CUDA graphs
    off, so every kernel is seen by name; the compiled engine launches the same kernels either way)."""
    from torch.profiler import ProfilerActivity, profile

    os.environ["DMTP_CUDA_GRAPHS"] = "0"
    try:  # `tokens` as when timed: the same cache size, so the compiled code is reused
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            generate(tgt, m, prompts, 0.0, tokens)
            _sync(tgt.device)
    finally:
        os.environ.pop("DMTP_CUDA_GRAPHS")
    avg = prof.key_averages()
    try:
        table = avg.table(sort_by="device_time_total", row_limit=30)
    except (AttributeError, KeyError, ValueError):
        table = avg.table(sort_by="cuda_time_total", row_limit=30)
    write_text(path, f"{m.name}, batch {len(prompts)}, {tokens} tokens, CUDA graphs off\n{table}\n")
    print(f"[bench] kernel profile -> {path}")


def mini_shape(a, dev, save=lambda *parts: None) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """Timing only: the `mini` profile's target shape (21.5 M parameters, fp32 as the profile decodes), MTP head and
    2-layer drafters with random weights: stage times of ar / dflash / DMTP at batch `--batch` on the compiled engine
    and on the HF layers, the batch-1 baselines, and the data stage's batch-`--regen-batch` regeneration."""
    p = mini()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    torch.manual_seed(0)
    with torch.device(dev):
        tgt, mtp = build_target(p.arch, p.vocab_size, eos_id=1, dtype=dtype)
    tgt.model.eval().requires_grad_(False)
    tgt.model.generation_config.eos_token_id = None  # random weights: every system decodes all `--tokens`
    mtp = mtp.eval().requires_grad_(False)
    drafters = {v: Drafter(DrafterConfig(
        hidden_size=p.arch.hidden_size, vocab_size=p.vocab_size, num_hidden_layers=p.drafter_layers,
        num_attention_heads=p.drafter_heads, num_key_value_heads=p.drafter_kv_heads, head_dim=p.arch.head_dim,
        intermediate_size=p.drafter_intermediate, num_target_layers=p.arch.num_hidden_layers, variant=v,
        mask_token_id=p.vocab_size - 1)).to(device=dev, dtype=dtype).eval() for v in ("dflash", "zero_init_residual")}
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, p.vocab_size - 1, (max(a.batch, a.regen_batch), p.data_prompt_tokens), generator=g)
    prompts = prompts.tolist()
    rows, ratios = [], []
    dev_name = torch.cuda.get_device_name() if dev == "cuda" else dev
    for engine in ("compiled", "compiled+dense", "hf"):
        for name in ("dflash", "zero_init_residual"):  # AR: the batch-1 baselines below
            m = build_method(name, tgt, drafter=drafters.get(name), mtp=mtp)
            with fast.attention("dense" if engine.endswith("+dense") else "flex"):
                ms, _ = stage_times(tgt, m, prompts[: a.batch], a.tokens, engine=engine.split("+")[0])
            tag = f"mini-shape:{name}" + {"compiled": "", "compiled+dense": "+dense", "hf": "@hf"}[engine]
            rows += [{"method": tag, "stage": s, "ms_per_round": v, "batch": a.batch, "rounds": a.tokens,
                      "device": dev_name} for s, v in ms.items()]
            print(f"[bench] {tag}: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}
    for sfx, goal, note in (("", "<= 1.08", ""), ("+dense", "<= 1.08", ", dense attention"),
                            ("@hf", "report", ", HF layers")):
        q = by[(f"mini-shape:zero_init_residual{sfx}", "round")] / by[(f"mini-shape:dflash{sfx}", "round")]
        ratios.append(ratio(f"mini-shape zero_init_residual round / dflash round (batch {a.batch}){note}", q, goal,
                            goal == "report" or q <= 1.08))
    save(rows, ratios)
    base, b1 = batch1_baselines(tgt, prompts[0], a.tokens, a.bandwidth, "mini-shape")
    ratios += b1
    save(rows, ratios, base)
    regen = []
    if a.regen_batch:
        row = regeneration(tgt, prompts[: a.regen_batch], p.data_temperature, p.data_new_tokens, "mini-shape")
        row["engine"] = "compiled"
        regen.append(row)
        ratios.append(regeneration_ratio(row, "mini-shape"))
        with fast.attention("dense"):
            row = regeneration(tgt, prompts[: a.regen_batch], p.data_temperature, p.data_new_tokens, "mini-shape")
        row["engine"] = "compiled+dense"
        regen.append(row)
        ratios.append(regeneration_ratio(row, "mini-shape", ", dense attention"))
        row = regeneration(tgt, prompts[: a.regen_batch], p.data_temperature, 16, "mini-shape", engine="hf")
        regen.append(row)
        ratios.append(ratio(f"mini-shape regeneration ms per step, HF layers / compiled (batch {a.regen_batch})",
                            row["ms_per_step"] / regen[0]["ms_per_step"], "report", True,
                            f"{row['ms_per_step']:.2f} vs {regen[0]['ms_per_step']:.2f} ms (HF layers: 16 tokens)"))
    save(rows, ratios, base, regen)
    if a.kernel_profile:
        for name, kind in (("zero_init_residual", "flex"), ("zero_init_residual", "dense")):
            m = build_method(name, tgt, drafter=drafters.get(name), mtp=mtp)
            with fast.attention(kind):
                kernel_profile(tgt, m, prompts[: a.batch], a.tokens,
                               Path(a.out) / f"profile_mini-shape_{name}{KINDS[kind]}.txt")
    save(rows, ratios, base, regen)
    return rows, ratios, base, regen


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", help="target checkpoint with the native MTP head (not needed with --paper-shape)")
    p.add_argument("--drafters", help="directory of trained drafters (<name>/drafter)")
    p.add_argument("--methods", type=names, default=names("ar,mtp,dflash,t1_residual,zero_init_residual"))
    p.add_argument("--dmtp", default="zero_init_residual", help="the DMTP method the ratio targets are about")
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default="overhead,throughput,hf,screen,regen",
                   help="any of overhead,throughput,hf,screen,regen; `ratios` alone recomputes ratios.json from the "
                        "CSVs")
    p.add_argument("--paper-shape", action="store_true", help="only the random-weight Qwen3-8B-shape timing run")
    p.add_argument("--mini-shape", action="store_true",
                   help="only the random-weight mini-shape timing run (stage times, batch-1 baselines, regeneration)")
    p.add_argument("--regen-batch", type=at_least(0), default=2048,
                   help="--mini-shape and part `regen`: prompts decoded at once as the data stage does (0: skip)")
    p.add_argument("--kernel-profile", action="store_true",
                   help="--paper-shape / --mini-shape: also write torch-profiler kernel tables (profile_*.txt)")
    p.add_argument("--batch", type=at_least(1), default=8)
    p.add_argument("--tokens", type=at_least(17), default=512, help="tokens per request in the overhead part (the "
                   "first 16 rounds are excluded)")
    p.add_argument("--caps", type=listed(at_least(1)), default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--prompts", type=at_least(1), default=164, help="HumanEval prompts for the throughput runs")
    p.add_argument("--max-new-tokens", type=at_least(1), default=256)
    p.add_argument("--temperatures", type=listed(number(0)), default=[0.0, 1.0])
    p.add_argument("--hf-prompts", type=at_least(1), default=4)
    p.add_argument("--bandwidth", type=number(0, open_lo=True), default=4.3e12,
                   help="HBM bytes/s for the AR bound (H200: ~4.3e12)")
    p.add_argument("--screen-rank", type=at_least(1), default=256)
    p.add_argument("--screen-topk", type=at_least(1), default=64)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--fuse", action="store_true",
                   help="overhead part and --paper-shape: also time every method with its layers' small pieces "
                        "compiled (dmtp.engine.fuse), beside the unfused run")
    a = p.parse_args(argv)
    parts = set(a.parts.split(","))
    if not (parts <= {"overhead", "throughput", "hf", "screen", "regen"} or parts == {"ratios"}):
        p.error(f"argument --parts: expected overhead,throughput,hf,screen,regen (any of them) or ratios, "
                f"got {a.parts!r}")
    guard("python -m dmtp.cli.bench", run, p, a)


def run(p, a):
    import json

    import pandas as pd

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = out_dir(a.out)
    ratios_path = out / "ratios.json"
    ratios = json.loads(ratios_path.read_text()) if ratios_path.exists() else []

    def keep(new):  # a rerun replaces the targets it measures again (a throughput ratio: at whichever batch cap)
        same = lambda t: re.sub(r" B\d+ throughput gain", " throughput gain", t)  # noqa: E731
        return [r for r in ratios if same(r["target"]) not in {same(n["target"]) for n in new}] + new

    if a.paper_shape or a.mini_shape:
        def save(rows, new, base=(), regen=()):  # after each part
            merge_overhead(out / "overhead.csv", rows)
            if base:
                merge_rows(out / "baselines.csv", base)
            if regen:
                merge_rows(out / "regen.csv", regen)
            write_text(ratios_path, json.dumps(keep(new), indent=2))
            write_meta(out / f"meta_{'paper' if a.paper_shape else 'mini'}_shape.json", vars(a))

        (paper_shape if a.paper_shape else mini_shape)(a, dev, save)
        return
    if a.parts == "ratios":
        new = throughput_ratios(pd.read_csv(out / "throughput.csv"), a.dmtp, out.parent.name)
        write_text(ratios_path, json.dumps(keep(new), indent=2))
        return
    if not a.target:
        p.error("--target is required (or --paper-shape / --mini-shape)")
    checkpoint(a.target, "--target", "target checkpoint")
    for name in a.methods:
        base = name.partition("+")[0]
        if base not in ("ar", "mtp"):
            if not a.drafters:
                raise ValueError(f"--methods {name}: a drafter method needs --drafters DIR (holding {base}/drafter)")
            checkpoint(Path(a.drafters) / base / "drafter", f"--methods {name}:", "drafter checkpoint")
    tok = find_tokenizer(a.target)
    if tok is None:
        raise ValueError(f"--target {a.target}: no tokenizer files beside config.json (the HumanEval prompts are "
                         "text)")
    label = Path(a.target).parent.name  # the profile: work/<profile>/target
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    tgt = Target.load(a.target, dtype=dtype, device=dev)
    mtp = MTPHead.load(tgt, a.target)
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    prompts = [tok(x["prompt"], add_special_tokens=False)["input_ids"] for x in humaneval_prompts()]
    screen = None

    def method(name):  # a run name, optionally with "+screen" (the screened T1 head)
        nonlocal screen
        base, _, extra = name.partition("+")
        if extra == "screen" and screen is None:
            screen = T1Screen(tgt, rank=a.screen_rank, topk=a.screen_topk)
        m = load_method(base, tgt, mtp, a.drafters, screen=screen if extra == "screen" else None)
        m.name = name
        return m

    methods = a.methods
    parts = a.parts.split(",")
    new = []

    def save_ratios():  # after every part: a run cut short keeps what it measured
        write_text(ratios_path, json.dumps(keep(new), indent=2))
    if "overhead" in parts:  # 1. per-round stage breakdown at batch `--batch`, fixed length, EOS ignored
        rows, built, eager = [], {}, {}  # built, eager: kept for --fuse
        for name in methods:
            m = method(name)
            ms, res = stage_times(tgt, m, prompts[: a.batch], a.tokens)
            if a.fuse:
                built[name], eager[name] = m, (ms, [r.output_ids for r in res])
            rows += [{"method": name, "stage": s, "ms_per_round": v, "batch": a.batch,
                      "rounds": len(res[0].accepted), "device": torch.cuda.get_device_name() if dev == "cuda" else dev}
                     for s, v in ms.items()]
            print(f"[bench] overhead {name}: " + ", ".join(f"{s} {v:.3f}" for s, v in ms.items()))
        by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}
        if ("dflash", "round") in by and (a.dmtp, "round") in by:
            q = by[(a.dmtp, "round")] / by[("dflash", "round")]
            goal = 1.08 if label == "mini" else 1.04  # a 21.5 M target: a round is a few hundred microseconds
            new.append(ratio(f"{label} {a.dmtp} round / dflash round (batch {a.batch})", q, f"<= {goal}", q <= goal))
        if a.fuse:  # the same methods (the same module objects) unfused above, fused now
            f_rows, f_ratios = fuse_compare(tgt, [mtp] + [getattr(m, "drafter", None) for m in built.values()],
                                            built, eager, prompts[: a.batch], a.tokens, label, dev, dmtp=a.dmtp)
            rows += f_rows
            new += f_ratios
        merge_overhead(out / "overhead.csv", rows)
    save_ratios()
    if "throughput" in parts:  # 2. throughput at each batch cap with dynamic batching, natural EOS
        rows = []
        reqs = prompts[: a.prompts]
        for temp in a.temperatures:
            for name in methods:
                m = method(name)
                capacity = capacity_for(reqs, a.max_new_tokens, m.k)
                for cap in a.caps:
                    # a server per cap; its first group (cap requests) captures the graphs, as at server start-up
                    srv = Server(tgt, m, cap, capacity, temp, a.max_new_tokens, eos, seed=0)
                    srv.run(reqs[:cap])
                    res, wall = timed(dev, lambda: srv.run(reqs))
                    n_out = sum(len(r.output_ids) for r in res)
                    acc = [x for r in res for x in r.accepted]
                    rows.append({"method": name, "temperature": temp, "batch_cap": cap, "dataset": "humaneval",
                                 "batching": "dynamic", "requests": len(reqs), "output_tokens": n_out,
                                 "wall_s": wall, "tok_per_s": n_out / wall,
                                 "per_verify": 1 + sum(acc) / max(1, len(acc))})
                    print(f"[bench] throughput {name} T={temp:g} B{cap}: {n_out / wall:.1f} tok/s "
                          f"(tau/verify {rows[-1]['per_verify']:.2f})")
                    write_text(out / "throughput.csv", pd.DataFrame(rows).to_csv(index=False))  # so far
                    del srv
        new += throughput_ratios(pd.DataFrame(rows), a.dmtp, label)  # throughput.csv: written after every cap
    save_ratios()
    if "hf" in parts:  # 3. the engine vs a plain HF loop, batch 1, T = 0
        rows = []
        bound = a.bandwidth / read_bytes_per_token(tgt)
        hf_prompts = prompts[: a.hf_prompts]
        servers = {}
        for name in methods:  # batch-1 servers, graphs captured on a warm-up request
            m = method(name)
            servers[name] = Server(tgt, m, 1, capacity_for(hf_prompts, a.max_new_tokens, m.k), 0.0,
                                   a.max_new_tokens, eos)
            servers[name].run(hf_prompts[:1])
        for i, pr in enumerate(hf_prompts):
            ref, t_hf = timed(dev, lambda: tgt.model.generate(
                torch.tensor([pr], device=dev), max_new_tokens=a.max_new_tokens, do_sample=False,
                eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)[0, len(pr):].tolist())
            for name, srv in servers.items():
                res, t = timed(dev, lambda: srv.run([pr])[0])
                rows.append({"prompt": i, "method": name, "tokens": len(res.output_ids),
                             "ours_tok_per_s": len(res.output_ids) / t, "hf_ar_tok_per_s": len(ref) / t_hf,
                             "speedup_vs_hf_ar": (len(res.output_ids) / t) / (len(ref) / t_hf),
                             "identical": res.output_ids == ref, "ar_hbm_bound_tok_per_s": bound})
        df = pd.DataFrame(rows)
        write_text(out / "hf.csv", df.to_csv(index=False))
        mean = df.groupby("method")[["ours_tok_per_s", "hf_ar_tok_per_s", "speedup_vs_hf_ar", "identical"]].mean()
        print(mean)
        if "ar" in mean.index:
            new.append(ratio(f"{label} engine AR / HF AR loop, batch 1", mean.loc["ar", "speedup_vs_hf_ar"], ">= 15",
                             mean.loc["ar", "speedup_vs_hf_ar"] >= 15))
            tps, _ = hf_static_generate(tgt, hf_prompts[0], a.max_new_tokens)
            ours = df[(df.method == "ar") & (df.prompt == 0)].ours_tok_per_s.iloc[0]
            new.append(ratio(f"{label} engine AR / HF static-cache compiled generate, batch 1", ours / tps, ">= 1.6",
                             ours / tps >= 1.6, f"{ours:.0f} vs {tps:.0f} tok/s (first prompt; natural EOS for ours)"))
            new.append(ratio(f"{label} AR batch-1 tok/s / HBM bound", mean.loc["ar", "ours_tok_per_s"] / bound, "report",
                             True, f"{mean.loc['ar', 'ours_tok_per_s']:.0f} tok/s vs {bound:.0f} tok/s"))
        if a.dmtp in mean.index:
            new.append(ratio(f"{label} engine {a.dmtp} / HF AR loop, batch 1", mean.loc[a.dmtp, "speedup_vs_hf_ar"],
                             ">= 15", mean.loc[a.dmtp, "speedup_vs_hf_ar"] >= 15))
    save_ratios()
    if "regen" in parts and a.regen_batch:  # 5. the data stage's large-batch regeneration, on the trained target
        reqs = [prompts[i % len(prompts)][:128] for i in range(a.regen_batch)]
        row = regeneration(tgt, reqs, 0.8, 256, label)
        merge_rows(out / "regen.csv", [row])
        new.append(regeneration_ratio(row, label))
    save_ratios()
    if "screen" in parts and a.dmtp in methods:  # 4. the screened T1 head on the real (trained) target
        rows = []
        reqs = prompts[: a.prompts]
        for name in [a.dmtp, a.dmtp + "+screen"]:
            m = method(name)
            res = generate(tgt, m, reqs, 0.0, a.max_new_tokens, eos)
            acc = [x for r in res for x in r.accepted]
            rows.append({"method": name, "rank": a.screen_rank, "topk": a.screen_topk, "rounds": len(acc),
                         "first_token_acceptance": sum(x > 0 for x in acc) / len(acc),
                         "per_verify": 1 + sum(acc) / len(acc)})
        with torch.no_grad():  # T1 agreement over MTP hiddens of real text (the first 64 tokens of each prompt)
            ids = torch.tensor([p[:64] for p in reqs if len(p) >= 64][:64], device=dev)
            g = mtp.teacher_forced(ids, tgt.features(ids).hidden).reshape(-1, tgt.hidden_size)
            agree = float((screen(g) == tgt.lm_head(g).argmax(-1)).float().mean())
        for r in rows:
            r["t1_agreement"] = agree if "+screen" in r["method"] else 1.0
        write_text(out / "screen.csv", pd.DataFrame(rows).to_csv(index=False))
        print(pd.DataFrame(rows))
    save_ratios()
    write_meta(out / "meta.json", vars(a))


if __name__ == "__main__":
    main()
