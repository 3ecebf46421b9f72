"""The parts on a trained target (`--target`, `--drafters`), each a function of the run's `Bench` and the runs it
times: `overhead` (stage times per round), `throughput` (end to end, dynamic batching, every method side by side),
`hf` (batch 1 against HF's loops), `regen` (the data stage's regeneration), `screen` (the screened T1 head)."""
from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from dmtp.analysis.metrics import (acceptance_length, first_token, histogram, per_verify_shared,
                                   speedup_on_ar_outputs)
from dmtp.analysis.ratios import Ratio, speedup_goal
from dmtp.cli.bench.baselines import hf_generate, regeneration, regeneration_ratio
from dmtp.cli.bench.common import (device_name, label_of, median, merge_overhead, merge_rows, ratio,
                                   read_bytes_per_token, round_goal, spread, stage_times, timed)
from dmtp.cli.bench.profiling import admission_profile, kernel_profile
from dmtp.cli.bench.shapes import by_stage, draft_side_ratios
from dmtp.config import AblationSpec, DataConfig, EngineConfig
from dmtp.config.engine import describe_variant, server_variant
from dmtp.data.datasets import encode_prompts, humaneval_prompts
from dmtp.data.tokenizer import find_tokenizer
from dmtp.engine.decode import generate
from dmtp.engine.slots import capacity_for
from dmtp.engine.methods import AR, Method, load_method, split_drafts
from dmtp.engine.runner import compiled_graphs, stop_spec
from dmtp.engine.server import Server
from dmtp.engine.stops import HUMANEVAL_STOPS
from dmtp.io import write_csv
from dmtp.models import torch_dtype
from dmtp.models.mtp import MTPHead
from dmtp.models.screen import T1Screen
from dmtp.models.target import Target


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
        return load_method(base, self.tgt, self.mtp, self.a.drafters, screen=self.screen if extra == "screen" else None,
                           label=name)


def cap_requests(b: Bench, cap: int) -> list[list[int]]:
    """The requests the throughput part serves at batch cap `cap`: `--prompts` at the largest cap, else the first
    `--small-cap-prompts`."""
    return b.prompts[: b.a.prompts if cap == max(b.a.caps) else b.a.small_cap_prompts]


def overhead(b: Bench, methods: list[str]) -> list[Ratio]:
    """Per-round stage times of `ar` and every method at batch `--batch` and at each batch cap (the cost model's
    inputs), EOS ignored, the first 16 rounds excluded; the round ratios at `--batch`. At a batch cap the throughput
    part's shapes (its requests, `--max-new-tokens`), so each method compiles once per cap; else `--tokens` tokens.
    The largest batch first, the kernel profiles last: a run cut short keeps the cost model's inputs."""
    a, dmtp, dflash = b.a, b.spec.main_method, b.spec.drafter_baseline
    names = [AR.name] + [m for m in methods if m != AR.name]  # the reference first
    rows, ratios, profiles = [], [], []
    for batch in sorted({a.batch, *a.caps}, reverse=True):
        reqs = cap_requests(b, batch) if batch in a.caps else b.prompts
        prompts = [reqs[i % len(reqs)] for i in range(batch)]
        tokens = a.max_new_tokens if batch in a.caps else a.tokens
        for name in names:
            m = b.method(name)
            capacity = capacity_for(reqs, tokens, m.k) if batch in a.caps else None
            ms, res = stage_times(b.tgt, m, prompts, tokens, engine=b.eng, capacity=capacity)
            rows += [{"method": name, "stage": s, "ms_per_round": v, "batch": batch, "rounds": len(res[0].accepted),
                      "device": device_name(b.dev), "engine": label_of(b.eng)} for s, v in ms.items()]
            times = ", ".join(f"{s} {v:.3f}" for s, v in ms.items())
            print(f"[bench] overhead {name} batch {batch}: " + (times or f"no stage times (at most 16 rounds: {tokens} "
                                                                         "tokens)"))
            if rows:  # so far: a run cut short keeps what it timed
                merge_overhead(Path(a.out) / "overhead.csv", rows)
            if a.kernel_profile and batch == a.batch and name in (AR.name, dflash, dmtp):  # where the rounds go
                profiles.append((m, prompts, tokens, Path(a.out) / f"profile_{b.setup}_{name}_b{batch}.txt",
                                 capacity))
    for m, prompts, tokens, path, capacity in profiles:  # after every stage time
        kernel_profile(b.tgt, m, prompts, tokens, path, engine=b.eng, capacity=capacity)
    by = by_stage([r for r in rows if r["batch"] == a.batch])
    if (dflash, "round") in by and (dmtp, "round") in by:
        ratios.append(ratio(b.setup, f"{dmtp} round / {dflash} round", by[(dmtp, "round")] / by[(dflash, "round")],
                            "<=", round_goal(b.setup), f"batch {a.batch}"))
    ratios += draft_side_ratios(by, names, lambda n: n, b.setup, a.batch, ", trained models")
    return ratios


def throughput(b: Bench, methods: list[str], late: bool = False) -> list[Ratio]:
    """End-to-end throughput, the way a user serves: HumanEval prompts in natural mode (end-of-text and HumanEval's
    stop strings), dynamic batching (`Server`) at each batch cap, every method side by side in one process: servers
    started as a serving engine starts (`start_servers`), then `--repeats` timed runs of the whole request group,
    interleaved (`serve_repeats`). The largest cap decodes `--prompts` prompts at every temperature, the others the
    first `--small-cap-prompts` at `--small-cap-temperatures`. `--kernel-profile`: at the first temperature, where an
    admission's time goes (`admission_profile`, admission_profile.csv). The temperatures of `--late-temperatures` are
    left to the part `throughput-late` (`late`), which appends its rows to throughput.csv."""
    a, out = b.a, Path(b.a.out)
    stop = stop_spec(b.tgt, b.tok, "natural", HUMANEVAL_STOPS) if b.tok is not None else None
    path = out / "throughput.csv"
    prior = pd.read_csv(path).to_dict("records") if late and path.exists() else []  # the first part's rows
    rows, admissions, top = [], [], max(a.caps)
    variant_methods = [m for m in (a.variant_methods or [AR.name, b.spec.main_method]) if m in methods]
    small = a.temperatures if a.small_cap_temperatures is None else a.small_cap_temperatures

    def save():  # so far: a run cut short keeps what it timed
        write_csv(path, pd.DataFrame(prior + rows))

    for temp in [t for t in a.temperatures if (t in a.late_temperatures) == late]:
        for cap in [c for c in a.caps if c == top or temp in small]:
            reqs = cap_requests(b, cap)
            runs = [(n, v, "") for n in methods for v in a.verify]  # (method, verify mode, server variant)
            if temp == a.temperatures[0]:
                runs += [(n, "target", x) for x in a.server_variants for n in variant_methods]
            servers = start_servers(b, runs, reqs, cap, temp, stop)
            first = len(rows)
            outs, accs = serve_repeats(b, servers, reqs, temp, cap, rows, save)
            if (AR.name, 0) in outs:
                equal_ar(rows[first:], outs, accs, cap)
                save()
            if a.kernel_profile and temp == a.temperatures[0]:  # where an admission's host time goes
                for run in (r for r in (AR.name, b.spec.main_method) if r in servers):
                    adm = admission_profile(servers[run], reqs, out / f"profile_admission_{b.setup}_{run}_b{cap}.txt")
                    admissions.append({"method": run, "batch_cap": cap, "prefill": b.eng.prefill, **adm})
                    write_csv(out / "admission_profile.csv", pd.DataFrame(admissions))
            for srv in servers.values():  # their slots (caches, graphs) go before the next cap
                srv.close()
    return throughput_ratios(pd.DataFrame(rows), b.spec, b.setup) + admission_ratios(admissions, b.setup)


def serve_repeats(b: Bench, servers: dict, reqs: list[list[int]], temp: float, cap: int, rows: list[dict],
                  save) -> tuple[dict, dict]:
    """`--repeats` timed runs of the whole request group on every server, interleaved (every run once per repeat, the
    order rotated by one each repeat) so that a drift of the machine reaches all alike: a throughput.csv row per run
    appended to `rows` (then `save()`), with what the server spent on it (`counters`). Returns the T = 0 outputs and
    accepted counts by (run, repeat)."""
    order, outs, accs = list(servers), {}, {}
    for rep in range(b.a.repeats):
        for run in order[rep % len(order):] + order[: rep % len(order)]:
            srv = servers[run]
            before = counters(srv)
            res, wall = timed(b.dev, srv.run, reqs)
            n_out = sum(len(r.output_ids) for r in res)
            spent = {k: v - before[k] for k, v in counters(srv).items()}
            if temp == 0:
                outs[run, rep] = [r.output_ids for r in res]
                accs[run, rep] = [r.accepted for r in res]
            acc = [x for r in res for x in r.accepted]
            rows.append({"method": run, "temperature": temp, "batch_cap": cap, "repeat": rep, "dataset": "humaneval",
                         "mode": "natural", "batching": "dynamic", "requests": len(reqs), "output_tokens": n_out,
                         "wall_s": wall, "tok_per_s": n_out / wall, "per_verify": acceptance_length(acc),
                         "verify_rounds": len(acc), **spent, "verify": run.partition("@")[0].partition("+")[2]
                         or "target", "engine": label_of(b.eng), "admit": b.eng.admit, "prefill": b.eng.prefill,
                         "admit_beside": srv.eng.admit_beside, "in_flight": srv.eng.in_flight})
            print(f"[bench] throughput {run} T={temp:g} B{cap} #{rep}: {n_out / wall:.1f} tok/s (tau/verify "
                  f"{rows[-1]['per_verify']:.2f}, {rows[-1]['groups']} groups admitted in {rows[-1]['admit_s']:.2f}s)")
            save()
    return outs, accs


def start_servers(b: Bench, runs: list[tuple[str, str, str]], reqs: list[list[int]], cap: int, temp: float,
                  stop) -> dict:
    """Run name -> a server per (method, verify mode, server variant), started as a serving engine starts: its graphed
    prompt pass captured for every bucket (else the timed runs would capture them), then one untimed run of the whole
    request group (graphs for every batch the timed runs meet). A server variant whose start-up fails is left out."""
    a, servers = b.a, {}
    for name, v, x in runs:
        m = b.method(name)
        run = (name if v == "target" else f"{name}+{v}") + (f"@{x}" if x else "")
        servers[run] = srv = Server(b.tgt, m, cap, capacity_for(reqs, a.max_new_tokens, m.k), temp, a.max_new_tokens,
                                    b.eos, seed=0, engine=b.eng.with_(**server_variant(x)) if x else b.eng, stop=stop,
                                    verify=v)
        try:
            n = srv.prepare(max(len(r) for r in reqs))  # a graphed prompt pass: every bucket captured now
            if n:
                print(f"[bench] {run} B{cap}: {n} prompt-pass graphs captured at start-up")
            srv.run(reqs)
        except Exception as e:  # noqa: BLE001 - a variant beside the measurement must not end it
            if not x:
                raise
            print(f"[bench] {run} B{cap}: left out, its start-up failed: " + f"{type(e).__name__}: {e}".splitlines()[0])
            srv.close()
            del servers[run]
    return servers


def equal_ar(rows: list[dict], outs: dict, accs: dict, cap: int) -> None:
    """T = 0: per row, the requests whose output equals AR's, and the per-verify tau on AR's own text."""
    ref = outs[AR.name, 0]
    for r in rows:
        got = outs[r["method"], r["repeat"]]
        r["equal_ar"] = sum(x == y for x, y in zip(got, ref))
        r["ar_output_tokens"] = sum(len(x) for x in ref)
        r["per_verify_shared"] = per_verify_shared(accs[r["method"], r["repeat"]], got, ref)
    print(f"[bench] T=0 B{cap}: requests equal to {AR.name}'s output, output tokens and tau on the prefixes shared "
          f"with it, per run: " + ", ".join(f"{r['method']} #{r['repeat']} {r['equal_ar']}/{r['requests']} "
                                            f"{r['output_tokens']}/{r['ar_output_tokens']} {r['per_verify_shared']:.2f}"
                                            for r in rows))


def admission_ratios(admissions: list[dict], setup: str) -> list[Ratio]:
    """A graphed prompt pass's admission against the compiled pass's on the same server, per method and cap."""
    return [ratio(setup, f"{r['method']} admission, graphed / compiled prompt pass",
                  r["host_ms"] / r["compiled_host_ms"],
                  condition=f"batch cap {r['batch_cap']}, groups of {r.get('group', 1)}",
                  note=f"{r['host_ms']:.2f} vs {r['compiled_host_ms']:.2f} ms host; first tokens equal in "
                       f"{r['first_tokens_equal']}")
            for r in admissions if "compiled_host_ms" in r]


def counters(srv: Server) -> dict:
    """What a server has spent so far (a timed run's row takes the difference): rounds stepped, groups admitted and
    their time, graphs compiled, prompt-pass graphs captured (a timed run should capture none)."""
    return {"server_rounds": srv.rounds, "groups": srv.groups, "admit_s": srv.admit_s,
            "admit_host_s": srv.admit_host_s, "beside_s": srv.beside_s, "graphs": compiled_graphs(),
            "captures": srv.prompt_pass.captured if srv.prompt_pass is not None else 0}


def throughput_ratios(tp: pd.DataFrame, spec: AblationSpec, setup: str) -> list[Ratio]:
    """From throughput.csv's runs, per (temperature, cap): every method / AR as the median of the per-repeat ratios
    with their range (the main method against `speedup_goal`), a run beside its plain run (a server variant, its first
    drafts only), DMTP's throughput gain over DFlash / its per-verify gain (goal >= 0.95 at the largest cap). At T = 0
    a method whose outputs left AR's has its workload in the note and an estimate on AR's text (`on_ar_outputs`)."""
    dmtp, dflash = spec.main_method, spec.drafter_baseline
    out = []
    if "repeat" not in tp:
        tp = tp.assign(repeat=0)
    top = tp.batch_cap.max() if len(tp) else 0
    for (temp, cap), g in tp.groupby(["temperature", "batch_cap"]):
        by = {m: x.set_index("repeat") for m, x in g.groupby("method")}
        cond = f"B{cap}, T={temp:g}"
        if AR.name in by:
            for m in sorted(set(by) - {AR.name}):
                q = (by[m].tok_per_s / by[AR.name].tok_per_s).dropna().tolist()
                if not q:
                    continue
                goal = speedup_goal(cap, top, temp) if m == dmtp else None
                work = workload_note(by[m], by[AR.name])
                out.append(ratio(setup, f"{m} tok/s / AR tok/s", median(q), ">=" if goal else "report", goal, cond,
                                 f"{by[m].tok_per_s.median():.0f} vs {by[AR.name].tok_per_s.median():.0f} tok/s; per "
                                 f"repeat {spread(q)}, {len(q)} repeats" + (f"; {work}" if work else "")))
                est = on_ar_outputs(by[m], by[AR.name])
                if work and est:
                    out.append(ratio(setup, f"{m} tok/s / AR tok/s on AR's outputs (estimate)", median(est),
                                     ">=" if goal else "report", goal, cond,  # a goal met over other text only is
                                     f"the speed-up x tau on the prefixes shared with AR's outputs / tau "
                                     f"({by[m].per_verify_shared.median():.2f} vs {by[m].per_verify.median():.2f}); "
                                     f"per repeat {spread(est)}"))
        for m in sorted(by):  # a run beside the same run plain: a server variant (Server-only settings, side by
            base, _, variant = m.partition("@")  # side) or its first drafts only (`<run>-k<n>`)
            run, n = split_drafts(m)
            if variant and base in by:
                words = describe_variant(variant)
            elif n is not None and run in by:
                base, words = run, (f"its first {n} drafts verified per round; per-verify tau "
                                    f"{by[m].per_verify.median():.2f} vs {by[run].per_verify.median():.2f}")
            else:
                continue
            q = (by[m].tok_per_s / by[base].tok_per_s).dropna().tolist()
            if q:
                out.append(ratio(setup, f"{m} tok/s / {base} tok/s", median(q), "report", None, cond,
                                 f"{words}; per repeat {spread(q)}, {len(q)} repeats"))
        if dmtp in by and dflash in by:
            gain = (by[dmtp].tok_per_s / by[dflash].tok_per_s).dropna()
            tau = by[dmtp].per_verify.median() / by[dflash].per_verify.median() - 1
            q = [(x - 1) / tau if tau > 0 else float("nan") for x in gain]
            out.append(ratio(setup, f"throughput gain / per-verify gain ({dmtp} vs {dflash})", median(q),
                             ">=" if cap == top else "report", 0.95 if cap == top else None, cond,
                             f"throughput {median(gain.tolist()) - 1:+.1%} (per repeat {spread(gain.tolist())}), "
                             f"per-verify {tau:+.1%}"))
    return out


def workload_note(m: pd.DataFrame, ar: pd.DataFrame) -> str:
    """'' when a method's T = 0 runs decoded AR's workload (every request equal to AR's output), else what differs:
    requests equal to AR's and output tokens against AR's (in bf16 an output leaves AR's at a top-2 tie). Rows of one
    (temperature, cap), indexed by repeat."""
    if "equal_ar" not in m or m.equal_ar.isna().all():
        return ""
    eq, req = int(m.equal_ar.min()), int(m.requests.max())
    tok, ref = float(m.output_tokens.median()), float(ar.output_tokens.median())
    if eq == req or not ref:
        return ""
    return (f"outputs: {eq} of {req} requests equal to AR's, {tok:.0f} tokens against AR's {ref:.0f} "
            f"({tok / ref - 1:+.1%})")


def on_ar_outputs(m: pd.DataFrame, ar: pd.DataFrame) -> list[float]:
    """Per repeat, the tok/s speed-up over AR scaled by per_verify_shared / per_verify: the speed-up on AR's own text
    (first order: a round costs the same whatever it accepts); [] without per_verify_shared."""
    if "per_verify_shared" not in m or m.per_verify_shared.isna().all():
        return []
    q = speedup_on_ar_outputs(m.tok_per_s / ar.tok_per_s, m.per_verify_shared, m.per_verify)
    return q.dropna().tolist()


def hf(b: Bench, methods: list[str]) -> list[Ratio]:
    """The engine vs a plain HF `generate` loop, batch 1, T = 0, and AR against the HBM bound."""
    a, dev, eos, dmtp = b.a, b.dev, b.eos, b.spec.main_method
    bound = a.bandwidth / read_bytes_per_token(b.tgt)
    hf_prompts, rows, servers = b.prompts[: a.hf_prompts], [], {}
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
            ours, theirs = len(res.output_ids) / t, len(ref) / t_hf
            rows.append({"prompt": i, "method": name, "tokens": len(res.output_ids), "ours_tok_per_s": ours,
                         "hf_ar_tok_per_s": theirs, "speedup_vs_hf_ar": ours / theirs,
                         "identical": res.output_ids == ref, "ar_hbm_bound_tok_per_s": bound})
    df = pd.DataFrame(rows)
    write_csv(Path(a.out) / "hf.csv", df)
    mean = df.groupby("method")[["ours_tok_per_s", "hf_ar_tok_per_s", "speedup_vs_hf_ar", "identical"]].mean()
    print(mean)
    ratios = []
    if AR.name in mean.index:
        ratios.append(ratio(b.setup, "engine AR / HF AR loop", mean.loc[AR.name, "speedup_vs_hf_ar"], ">=", 15,
                            "batch 1"))
        static = hf_generate(b.tgt, hf_prompts[0], a.max_new_tokens)
        static()  # compiles
        out, wall = static()
        tps, ar = len(out) / wall, mean.loc[AR.name, "ours_tok_per_s"]
        ours = df[(df.method == AR.name) & (df.prompt == 0)].ours_tok_per_s.iloc[0]
        ratios.append(ratio(b.setup, "engine AR / HF static-cache compiled generate", ours / tps, ">=", 1.6,
                            "batch 1", f"{ours:.0f} vs {tps:.0f} tok/s (first prompt; natural EOS for ours)"))
        ratios.append(ratio(b.setup, "AR tok/s / HBM bound", ar / bound, condition="batch 1",
                            note=f"{ar:.0f} tok/s vs {bound:.0f} tok/s"))
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
    write_csv(Path(a.out) / "screen.csv", pd.DataFrame(rows))
    print(pd.DataFrame(rows))
    return []


PARTS = {"overhead": overhead, "throughput": throughput, "hf": hf, "screen": screen, "regen": regen,
         "throughput-late": functools.partial(throughput, late=True)}
