"""Benchmarks through the one decode loop; artifacts under results/<profile>/bench/ (rendered by dmtp.analysis.report).

    python -m dmtp.cli.bench --target work/mini/target --drafters work/mini/drafters --out results/mini/bench
    python -m dmtp.cli.bench --paper-shape --out results/mini/bench      # random weights, Qwen3-8B shape: timing only
    python -m dmtp.cli.bench --target work/tiny/target --drafters work/tiny/drafters --out /tmp/b \
        --tokens 64 --caps 1,2 --prompts 8 --max-new-tokens 32   # CPU smoke run, ~1 min

overhead.csv    ms per round by stage (drafter, mtp, t1_prep, drafter_ctx, verify, round) at batch `--batch`,
                `--tokens` generated tokens ignoring EOS, the first 16 rounds excluded; with --paper-shape the same
                at a Qwen3-8B-sized target with random weights (methods "8b-shape:<name>", timing only)
throughput.csv  total output tokens / wall time of the whole request group at each batch cap (natural EOS), with
                dynamic batching (`decode.serve`: a finished request's slot goes to the next one at once);
                `--verify target,sample,block` adds rows `<method>+<mode>` per verify mode (engine/verify.py)
hf.csv          the same requests, batch 1, T = 0: the engine vs a plain HF `generate` loop (DynamicCache, no graphs),
                tokens/s, whether outputs are identical, and AR's HBM bound (bytes read per token / bandwidth)
screen.csv      the screened T1 head (`screen.T1Screen`): T1 agreement with the exact head, first-token acceptance
                and acceptance length with and without it
ratios.json     the targets, each measured side by side in one run (typed records, `dmtp.analysis.ratios`): DMTP
                round <= 1.04 x DFlash round (batch 8), DMTP's throughput gain at the largest cap >= 95 % of its
                per-verify gain, engine >= 10 x HF at batch 1, AR vs HBM

Which runs are timed and which are "DMTP" and "DFlash" comes from the profile's ablation spec (`--profile`, default:
the folder above --target): `ablation.bench`, `main_method`, `drafter_baseline`. Each part is one function below.
"""
from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from dmtp.ablation import AblationSpec
from dmtp.analysis import ratios as RT
from dmtp.analysis.metrics import acceptance_length, first_token, histogram
from dmtp.analysis.ratios import Ratio
from dmtp.cli.args import at_least, checkpoint, guard, listed, names, number, out_dir
from dmtp.data.datasets import encode_prompts
from dmtp.data.humaneval import humaneval_prompts
from dmtp.data.tokenizer import find_tokenizer
from dmtp.engine.decode import Method, Server, build_method, capacity_for, generate, load_method, no_timer
from dmtp.engine.fuse import fuse
from dmtp.engine.verify import MODES as VERIFY_MODES
from dmtp.experiment import torch_dtype
from dmtp.io import write_meta, write_text
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.mtp import MTPHead
from dmtp.models.screen import T1Screen
from dmtp.models.target import Target
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


def stage_times(tgt, m, prompts, tokens, skip=16):
    """ms per round by stage over `tokens` generated tokens (EOS ignored), first `skip` rounds excluded."""
    m.timer = StageTimer(tgt.device.type == "cuda")
    res = generate(tgt, m, prompts, 0.0, tokens, eos_ids=(), seed=0)
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
          condition: str = "", note: str = "") -> Ratio:
    return Ratio(setup, name, round(float(value), 4), direction, goal, condition=condition, note=note).show()


def device_name(dev) -> str:
    return torch.cuda.get_device_name() if str(dev).startswith("cuda") else str(dev)


def merge_overhead(path: Path, rows: list[dict]):
    """Write overhead rows, keeping stored rows of the other setup (`8b-shape:<name>` vs plain names)."""
    new = pd.DataFrame(rows)
    paper = new.method.str.startswith("8b-shape:").any()
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=new.columns)
    old = old[old.method.str.startswith("8b-shape:") != paper]
    write_text(path, pd.concat([old, new] if paper else [new, old]).to_csv(index=False))


def throughput_ratios(tp: pd.DataFrame, spec: AblationSpec, setup: str) -> list[Ratio]:
    """At the largest batch cap measured for both: DMTP's throughput gain over DFlash / its per-verify gain."""
    dmtp, dflash = spec.main_method, spec.drafter_baseline
    out = []
    for temp, g in tp.groupby("temperature"):
        g = g.set_index(["method", "batch_cap"])
        caps = [c for c in sorted(set(g.index.get_level_values(1))) if (dflash, c) in g.index and (dmtp, c) in g.index]
        if not caps:
            continue
        cap = caps[-1]
        gain = g.loc[(dmtp, cap), "tok_per_s"] / g.loc[(dflash, cap), "tok_per_s"] - 1
        tau = g.loc[(dmtp, cap), "per_verify"] / g.loc[(dflash, cap), "per_verify"] - 1
        out.append(ratio(setup, f"T={temp:g} throughput gain / per-verify gain ({dmtp} vs {dflash})",
                         gain / tau if tau > 0 else float("nan"), ">=", 0.95, f"B{cap}",
                         f"throughput {gain:+.1%}, per-verify {tau:+.1%}"))
    return out


def fuse_compare(tgt, others, methods: dict, eager: dict, prompts, tokens, setup, spec: AblationSpec, prefix=""):
    """Stage times of `methods` (name -> Method) with the target (and `others`: MTP head, drafters) fused by
    `fuse.fuse`, beside their unfused times measured earlier in the same process (`eager`: name -> (stage_times ms,
    output ids)): overhead rows '<prefix><name>+fused', ratios fused/unfused round per method and fused DMTP / fused
    DFlash round, and whether each method's tokens are unchanged. The methods must be built on the modules in
    `others` (they are the ones fused)."""
    rows, ratios = [], []
    batch = f"batch {len(prompts)}"
    with fuse(tgt, *others) as fusion:
        print(f"[bench] {setup}: {fusion}")
        for name, m in methods.items():
            t0 = time.perf_counter()
            stage_times(tgt, m, prompts[:1], 8, skip=0)  # compiles this method's new shapes
            t_compile = time.perf_counter() - t0
            ms, res = stage_times(tgt, m, prompts, tokens)
            same = [r.output_ids for r in res] == eager[name][1]
            rows += [{"method": f"{prefix}{name}+fused", "stage": stage, "ms_per_round": v, "batch": len(prompts),
                      "rounds": tokens, "device": device_name(tgt.device)} for stage, v in ms.items()]
            print(f"[bench] {setup} {name}+fused (first call {t_compile:.1f}s, outputs "
                  f"{'identical' if same else 'DIFFER'}): " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
            ratios.append(ratio(setup, f"{name} fused round / unfused round", ms["round"] / eager[name][0]["round"],
                                condition=batch, note=f"{eager[name][0]['round']:.3f} -> {ms['round']:.3f} ms; "
                                                      f"outputs {'identical' if same else 'differ'}"))
    by = {r["method"]: r["ms_per_round"] for r in rows if r["stage"] == "round"}
    dmtp, dflash = (f"{prefix}{m}+fused" for m in (spec.main_method, spec.drafter_baseline))
    if dmtp in by and dflash in by:
        ratios.append(ratio(setup, f"fused {spec.main_method} round / fused {spec.drafter_baseline} round",
                            by[dmtp] / by[dflash], "<=", 1.04, batch))
    return rows, ratios


def paper_shape(a, dev, spec: AblationSpec) -> tuple[list[dict], list[Ratio]]:
    """Timing only: a Qwen3-8B-sized dense target (random bf16 weights), one MTP layer, 5-layer drafters of the
    drafter baseline and the main method, batch `--batch`; every round accepts ~nothing, so each emits one token —
    what matters is the time per stage."""
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
    names = ["ar", dflash, dmtp, dmtp + "+screen"]
    eager = {}
    for name in names:
        ms, res = stage_times(tgt, method(name), prompts, a.tokens)
        eager[name] = (ms, [r.output_ids for r in res])
        rows += [{"method": f"{setup}:{name}", "stage": stage, "ms_per_round": v, "batch": a.batch,
                  "rounds": a.tokens, "device": device_name(dev)} for stage, v in ms.items()]
        print(f"[bench] {setup} {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    if a.fuse:
        f_rows, f_ratios = fuse_compare(tgt, [mtp, *drafters.values()], {n: method(n) for n in names[:3]}, eager,
                                        prompts, a.tokens, setup, spec, prefix=f"{setup}:")
        rows += f_rows
        ratios += f_ratios
    for name in (dmtp, dmtp + "+screen"):
        q = eager[name][0]["round"] / eager[dflash][0]["round"]
        ratios.append(ratio(setup, f"{name} round / {dflash} round", q, "<=", 1.04, batch))
    # AR at batch 1 against the HBM bound
    res, wall = timed(dev, generate, tgt, build_method("ar", tgt), prompts[:1], 0.0, a.tokens)
    nbytes = read_bytes_per_token(tgt)
    bound = a.bandwidth / nbytes
    tps = len(res[0].output_ids) / wall
    ratios.append(ratio(setup, "AR tok/s / HBM bound", tps / bound, condition="batch 1",
                        note=f"{tps:.1f} tok/s vs {bound:.1f} (weights {nbytes / 1e9:.2f} GB / "
                             f"{a.bandwidth / 1e12:.1f} TB/s)"))
    return rows, ratios


# --- the parts on a trained target ---------------------------------------------------------------------------------
@dataclass
class Bench:
    """What every part measures with: the profile's target, MTP head, trained drafters and HumanEval prompts."""
    a: argparse.Namespace  # the command line
    spec: AblationSpec  # which runs are DMTP (main_method) and DFlash (drafter_baseline)
    setup: str  # the ratio records' setup: the profile
    tgt: Target
    mtp: MTPHead
    eos: list[int]
    prompts: list[list[int]]  # HumanEval prompt ids
    screen: T1Screen | None = field(default=None)  # built on first use

    @classmethod
    def load(cls, a, spec: AblationSpec, setup: str) -> "Bench":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        tok = find_tokenizer(a.target)
        if tok is None:
            raise ValueError(f"--target {a.target}: no tokenizer files beside config.json (the HumanEval prompts are "
                             "text)")
        tgt = Target.load(a.target, dtype=torch_dtype(a.dtype), device=dev)
        prompts = [p["prompt_ids"] for p in encode_prompts(tok, humaneval_prompts())]
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        return cls(a, spec, setup, tgt, MTPHead.load(tgt, a.target), eos, prompts)

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
    """Per-round stage breakdown at batch `--batch`, fixed length, EOS ignored (and, with --fuse, fused)."""
    a, dmtp, dflash = b.a, b.spec.main_method, b.spec.drafter_baseline
    prompts = b.prompts[: a.batch]
    rows, built, eager, ratios = [], {}, {}, []  # built, eager: kept for --fuse
    for name in methods:
        m = b.method(name)
        ms, res = stage_times(b.tgt, m, prompts, a.tokens)
        if a.fuse:
            built[name], eager[name] = m, (ms, [r.output_ids for r in res])
        rows += [{"method": name, "stage": s, "ms_per_round": v, "batch": a.batch, "rounds": len(res[0].accepted),
                  "device": device_name(b.dev)} for s, v in ms.items()]
        print(f"[bench] overhead {name}: " + ", ".join(f"{s} {v:.3f}" for s, v in ms.items()))
    by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}
    if (dflash, "round") in by and (dmtp, "round") in by:
        ratios.append(ratio(b.setup, f"{dmtp} round / {dflash} round", by[(dmtp, "round")] / by[(dflash, "round")],
                            "<=", 1.04, f"batch {a.batch}"))
    if a.fuse:  # the same methods (the same module objects) unfused above, fused now
        f_rows, f_ratios = fuse_compare(b.tgt, [b.mtp] + [getattr(m, "drafter", None) for m in built.values()],
                                        built, eager, prompts, a.tokens, b.setup, b.spec)
        rows += f_rows
        ratios += f_ratios
    merge_overhead(Path(a.out) / "overhead.csv", rows)
    return ratios


def throughput(b: Bench, methods: list[str]) -> list[Ratio]:
    """Throughput at each batch cap with dynamic batching, natural EOS; throughput.csv written after every cap. Each
    method runs once per `--verify` mode (rows other than target: `<method>+<mode>`, column `verify`)."""
    a = b.a
    rows, reqs = [], b.prompts[: a.prompts]
    for temp in a.temperatures:
        for name, v in [(n, v) for n in methods for v in a.verify]:
            m = b.method(name)
            run_name = name if v == "target" else f"{name}+{v}"
            capacity = capacity_for(reqs, a.max_new_tokens, m.k)
            for cap in a.caps:
                # a server per cap; its first group (cap requests) captures the graphs, as at server start-up
                srv = Server(b.tgt, m, cap, capacity, temp, a.max_new_tokens, b.eos, seed=0, verify=v)
                srv.run(reqs[:cap])
                res, wall = timed(b.dev, srv.run, reqs)
                n_out = sum(len(r.output_ids) for r in res)
                tau = acceptance_length([x for r in res for x in r.accepted])
                rows.append({"method": run_name, "temperature": temp, "batch_cap": cap, "dataset": "humaneval",
                             "batching": "dynamic", "requests": len(reqs), "output_tokens": n_out, "wall_s": wall,
                             "tok_per_s": n_out / wall, "per_verify": tau, "verify": v})
                print(f"[bench] throughput {run_name} T={temp:g} B{cap}: {n_out / wall:.1f} tok/s "
                      f"(tau/verify {tau:.2f})")
                write_text(Path(a.out) / "throughput.csv", pd.DataFrame(rows).to_csv(index=False))  # so far
                srv = None  # frees its slots (caches, graphs) before the next cap
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
                               eos)
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
        ratios.append(ratio(b.setup, "engine AR / HF AR loop", mean.loc["ar", "speedup_vs_hf_ar"], ">=", 10,
                            "batch 1"))
        ratios.append(ratio(b.setup, "AR tok/s / HBM bound", mean.loc["ar", "ours_tok_per_s"] / bound,
                            condition="batch 1", note=f"{mean.loc['ar', 'ours_tok_per_s']:.0f} tok/s vs {bound:.0f} "
                                                      "tok/s"))
    if dmtp in mean.index:
        ratios.append(ratio(b.setup, f"engine {dmtp} / HF AR loop", mean.loc[dmtp, "speedup_vs_hf_ar"], ">=", 10,
                            "batch 1"))
    return ratios


def screen(b: Bench, methods: list[str]) -> list[Ratio]:
    """The screened T1 head on the real (trained) target: T1 agreement with the exact head, first-token acceptance
    and acceptance length with and without it (the main method; skipped when it is not among `methods`)."""
    a, dmtp = b.a, b.spec.main_method
    if dmtp not in methods:
        return []
    rows, reqs = [], b.prompts[: a.prompts]
    for name in [dmtp, dmtp + "+screen"]:
        m = b.method(name)
        acc = [x for r in generate(b.tgt, m, reqs, 0.0, a.max_new_tokens, b.eos) for x in r.accepted]
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


PARTS = {"overhead": overhead, "throughput": throughput, "hf": hf, "screen": screen}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", help="target checkpoint with the native MTP head (not needed with --paper-shape)")
    p.add_argument("--drafters", help="directory of trained drafters (<name>/drafter)")
    p.add_argument("--profile", help="whose ablation spec names the runs (default: the folder above --target, else "
                   "mini); also the ratio records' setup")
    p.add_argument("--methods", type=names, help="runs to time, comma-separated (default: the spec's ablation.bench)")
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default="overhead,throughput,hf,screen",
                   help="any of overhead,throughput,hf,screen; `ratios` alone recomputes ratios.json from the CSVs")
    p.add_argument("--paper-shape", action="store_true", help="only the random-weight Qwen3-8B-shape timing run")
    p.add_argument("--batch", type=at_least(1), default=8)
    p.add_argument("--tokens", type=at_least(17), default=512, help="tokens per request in the overhead part (the "
                   "first 16 rounds are excluded)")
    p.add_argument("--caps", type=listed(at_least(1)), default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--prompts", type=at_least(1), default=164, help="HumanEval prompts for the throughput runs")
    p.add_argument("--max-new-tokens", type=at_least(1), default=256)
    p.add_argument("--temperatures", type=listed(number(0)), default=[0.0, 1.0])
    p.add_argument("--verify", type=verify_modes, default=["target"],
                   help="throughput part: verify modes (target,sample,block); rows other than target: <method>+<mode>")
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
    if not (parts <= set(PARTS) or parts == {"ratios"}):
        p.error(f"argument --parts: expected overhead,throughput,hf,screen (any of them) or ratios, got {a.parts!r}")
    guard("python -m dmtp.cli.bench", run, p, a)


def run(p, a):
    above = Path(a.target).parent.name if a.target else ""  # work/<profile>/target
    profile = a.profile or (above if above in PROFILES else "mini")
    spec = get_profile(profile).ablation
    out = out_dir(a.out)
    path = out / "ratios.json"
    stored = RT.read(path)

    def save(new):  # after every part: a run cut short keeps what it measured
        RT.write(path, RT.merge(stored, new))

    if a.paper_shape:
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        rows, new = paper_shape(a, dev, spec)
        merge_overhead(out / "overhead.csv", rows)
        save(new)
        write_meta(out / "meta_paper_shape.json", vars(a))
        return
    if a.parts == "ratios":
        save(throughput_ratios(pd.read_csv(out / "throughput.csv"), spec, profile))
        return
    if not a.target:
        p.error("--target is required (or --paper-shape)")
    methods = a.methods or list(spec.bench)
    checkpoint(a.target, "--target", "target checkpoint")
    for name in methods:
        base = name.partition("+")[0]
        if base not in ("ar", "mtp"):
            if not a.drafters:
                raise ValueError(f"--methods {name}: a drafter method needs --drafters DIR (holding {base}/drafter)")
            checkpoint(Path(a.drafters) / base / "drafter", f"--methods {name}:", "drafter checkpoint")
    b = Bench.load(a, spec, profile)
    new = []
    for part in a.parts.split(","):
        new += PARTS[part](b, methods)
        save(new)
    write_meta(out / "meta.json", vars(a))


if __name__ == "__main__":
    main()
