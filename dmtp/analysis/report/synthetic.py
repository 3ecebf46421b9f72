"""Synthetic artifacts in the real layout, for tests, notebooks and `python -m dmtp.cli.report demo`.

The runs are those of an ablation spec (written to experiment.json as the pipeline does, with the `humaneval8` view
of eval.subsets). Each round accepts candidate j with a fixed per-run probability p (geometric, capped at k; higher
for runs later in the spec's order, lower at higher T, a little different per drafter seed, shifted per run by
`offsets`); requests differ by a small per-request offset. Written: ablation runs on `humaneval` (+ its first-8 view
`humaneval8`) in mode natural for every run and every seed of the main and control runs (files `_s<seed>`), in mode
fixed for the main-table runs (seed 0, `_fixed`); at T > 0 the last request stops at once (no verify round) in every
natural run; some outputs end in an exact loop (every fixed one); with `ood`, the out-of-distribution set `pytests`
at T = 0 for the runs of `OOD_RUNS` (drafters accept less there, the MTP head as much); learning-curve snapshots
(`curve/`, with train_tokens in .meta.json) whose p rises with the budget; oracle ceilings (`oracle/`) at T > 0; a
bench in the real schema (`bench/throughput.csv`: interleaved repeats at caps 1 and 32, timed by the cost model on
the runs' own records; `bench/overhead.csv` at batches 1, 8, 32 and, in the flat layout, 8B-shape rows; meta.json).
`realization=k` writes all of it to results/<profile>/r<k> with its own random stream. Numbers mean nothing; they
exercise the renderers.

    python -m dmtp.cli.report demo --profile demo      # writes results/demo, then renders it
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from dmtp.analysis.costmodel import round_time, simulate
from dmtp.analysis.report.data import DEFAULT_K
from dmtp.config import AblationSpec
from dmtp.io import write_text

EOS = 0  # the synthetic end-of-text id
BUDGETS = (125, 250, 500, 1000, 2000)  # curve snapshots when the spec names none; the final step is 2 x the last
TOKENS_PER_STEP = 32 * 384  # synthetic drafter training tokens per step
OOD_RUNS = ("ar", "mtp", "dflash", "fusion", "zero_init_residual")  # decoded on the synthetic `pytests`
ROUND_MS = {1: 1.0, 8: 1.1, 32: 1.3}  # AR's synthetic round time per batch; a drafting run adds DRAFT_MS
DRAFT_MS = {"mtp": 0.4, "dflash": 0.9}  # per round, on top of AR's; any other drafter: 1.2


def request(rng, method: str, i: int, temp: float, p: float, n_rounds: int, mode: str = "natural", seed: int = 0,
            loop: bool = False, stop_at_once: bool = False) -> dict:
    """One record: n_rounds rounds accepting geometric(p) candidates (capped at k); output = the prefill token +
    each round's accepted + 1; `loop`: the second half of the output is a period-4 exact loop; `stop_at_once`:
    end-of-text as the first token, no round."""
    k = DEFAULT_K.get(method, 7)
    base = {"id": f"HumanEval/{i}", "method": method, "temperature": temp, "mode": mode, "prompt_tokens": 32,
            "n_candidates": k, **({"seed": seed} if seed else {})}
    if stop_at_once:
        return dict(base, output_ids=[EOS], accepted=[], stop_reason="eos", wall_s=0.001)
    q = np.clip(p + rng.normal(0, 0.05), 0, 0.99) if k else 0.0
    acc = [int(min(k, rng.geometric(1 - q) - 1)) if k else 0 for _ in range(n_rounds)]
    n_out = 1 + sum(acc) + n_rounds
    out = [int(x) for x in rng.integers(1, 1000, n_out)]
    if loop:
        half = n_out // 2
        out = out[:half] + [out[half + j % 4] for j in range(n_out - half)]
    reason = "length" if mode == "fixed" or loop else ("stop" if i % 2 else "eos")
    return dict(base, output_ids=out, accepted=acc, stop_reason=reason, wall_s=round(0.01 * n_rounds, 4))


def _write(path: Path, rows: list[dict], meta: dict | None = None, env: dict | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    if meta is not None:  # as dmtp.io.write_meta
        write_text(path.with_suffix(".meta.json"), json.dumps({"config": meta, "env": env or {}}) + "\n")


def run_name(ds: str, temp: float, mode: str = "natural", seed: int = 0) -> str:
    """<dataset>_T<temp>[_fixed][_s<seed>].jsonl, as the pipeline names a run file."""
    return f"{ds}_T{temp:g}" + ("_fixed" if mode == "fixed" else "") + (f"_s{seed}" if seed else "") + ".jsonl"


def write_synthetic(spec: AblationSpec, results: str | Path = "results", profile: str = "synthetic", n: int = 8,
                    seed: int = 0, temps=(0, 1), methods=None, bench: bool = True, modes=("natural", "fixed"),
                    curve: bool = True, oracle: bool = True, realization: int = 0, offsets: dict | None = None,
                    ood: bool = False, experiment: dict | None = None, repeats: int = 2) -> Path:
    """Write experiment.json (the spec, eval.subsets, eval.ood with `ood`, `realization`, and `experiment`'s top-level
    sections merged in), runs/ (ablation: `humaneval` with n requests and its `humaneval8` view at each of `temps`,
    every run but the backbone runs, every seed of the main and control runs, and mode fixed for the main-table runs;
    main: gsm8k and mt_bench at T0 for the main-table and backbone runs; with `ood` pytests at T0 for OOD_RUNS; only
    `methods` when given; each with a .meta.json naming commit "synthetic-r<k>"), with curve=True curve/ (the spec's
    curve runs, else its drafter baseline, blog run and main method), with oracle=True oracle/ at each T > 0, and with
    bench=True bench/ (module docstring) under results/<profile> (realization 0) or results/<profile>/r<k>. `offsets`:
    run -> added to its acceptance probability. Returns that folder."""
    root = Path(results) / profile / (f"r{realization}" if realization else "")
    rng = np.random.default_rng(seed + 1000 * realization)
    root.mkdir(parents=True, exist_ok=True)
    env = {"git_sha": f"synthetic-r{realization}", "device": "synthetic"}
    ev = {"subsets": {"humaneval8": ["humaneval", 8]}, **({"ood": {"pytests": n}, "ood_runs": list(OOD_RUNS)}
                                                           if ood else {})}
    exp = {"ablation": asdict(spec), "eval": ev, "realization": realization}
    for key, v in (experiment or {}).items():
        exp[key] = {**exp.get(key, {}), **v} if isinstance(v, dict) else v
    write_text(root / "experiment.json", json.dumps(exp, indent=2) + "\n")
    keep = lambda m: methods is None or m in methods  # noqa: E731
    p = {m: 0.70 + 0.01 * (i % 12) + (offsets or {}).get(m, 0.0) for i, m in enumerate(spec.runs())}
    rounds = {i: int(rng.integers(10, 30)) for i in range(n)}
    plan = [("ablation", "humaneval", t, mode, m, s) for t in temps for mode in modes for m in spec.runs()
            if m not in spec.backbones and (mode == "natural" or m in spec.main_table)
            for s in (spec.seeds_of(m) if mode == "natural" else spec.seeds_of(m)[:1])]
    plan += [("main", d, 0, "natural", m, 0) for d in ("gsm8k", "mt_bench") for m in spec.main_table
             + tuple(spec.backbones)]
    plan += [("ablation", "pytests", 0, "natural", m, 0) for m in OOD_RUNS if ood and m in spec.runs()]
    written = {}
    for exp_name, ds, t, mode, m, s in plan:
        if not keep(m):
            continue
        ps = p[m] - 0.05 * t + 0.01 * (s % 3 - 1) - (0.1 if ds == "pytests" and m != "mtp" else 0)
        rows = [request(rng, m, i, t, ps, rounds[i] if mode == "natural" else 40, mode, s,
                        loop=mode == "fixed" or i % 3 == 0, stop_at_once=exp_name == "ablation" and mode == "natural"
                        and t > 0 and n > 1 and i == n - 1) for i in range(n)]
        meta = {"method": m, "dataset": ds, "temperature": t, "mode": mode, "seed": s}
        _write(root / "runs" / exp_name / m / run_name(ds, t, mode, s), rows, meta, env)
        written[exp_name, ds, t, mode, m, s] = rows
        if exp_name == "ablation" and ds == "humaneval":  # the first-8 view, as the pipeline writes it
            _write(root / "runs" / exp_name / m / run_name("humaneval8", t, mode, s),
                   [dict(r, dataset="humaneval8") for r in rows[:8]], dict(meta, dataset="humaneval8"), env)
    if curve:
        final = 2 * (spec.budgets or BUDGETS)[-1]
        for m in spec.curve or tuple(dict.fromkeys(x for x in (spec.drafter_baseline, spec.blog_run,
                                                                  spec.main_method) if x)):
            if not keep(m):
                continue
            for s in spec.seeds_of(m):
                for step in (spec.budgets or BUDGETS) + (final,):
                    # p rises with log budget to the run's final p
                    ps = p[m] - 0.25 * (1 - math.log(step) / math.log(final)) + 0.01 * (s % 3 - 1)
                    rows = [request(rng, m, i, 0.0, ps, rounds[i], "natural", s, loop=i % 3 == 0) for i in range(n)]
                    _write(root / "curve" / m / f"humaneval_T0_s{s}_step{step}.jsonl", rows,
                           {"method": m, "seed": s, "step": step, "train_tokens": step * TOKENS_PER_STEP}, env)
    if oracle:
        for t in (t for t in temps if t > 0):
            c = min(0.97, max(p.values()) - 0.05 * t + 0.1)  # above every run's p at T
            cum = [c ** j for j in range(1, 8)]
            (root / "oracle").mkdir(parents=True, exist_ok=True)
            write_text(root / "oracle" / f"humaneval_T{t:g}.json", json.dumps(
                {"cumulative": cum, "acceptance_length": 1 + sum(cum), "windows": 50 * n, "dataset": "humaneval",
                 "temperature": t}) + "\n")
    if bench:
        write_bench(root, spec, written, env, rng, repeats, shape=not realization)
    return root


def write_bench(root: Path, spec: AblationSpec, written: dict, env: dict, rng, repeats: int = 2,
                shape: bool = True) -> None:
    """bench/ in the real schema, consistent with the cost model: each timed run's wall time is
    `costmodel.simulate` on the run's own records (humaneval, seed 0, natural) with the synthetic round times (AR's
    ROUND_MS plus the run's DRAFT_MS), times a little noise per repeat; overhead.csv holds those round times at
    batches 1, 8, 32 (and the stages at batch 8), with `shape` the 8B-shape rows too; meta.json names the commit."""
    timed = [m for m in ("ar", "mtp", spec.drafter_baseline, spec.main_method) if m]
    ms = {m: {b: v + (DRAFT_MS.get(m, 1.2) if m != "ar" else 0.0) for b, v in ROUND_MS.items()} for m in timed}
    (root / "bench").mkdir(parents=True, exist_ok=True)
    tp = ["method,temperature,batch_cap,repeat,dataset,mode,batching,requests,output_tokens,wall_s,tok_per_s,"
          "per_verify,verify_rounds,server_rounds,groups,admit_s,verify,engine,admit"]
    for (exp, ds, t, mode, m, s), rows in sorted(written.items(), key=str):
        if (exp, ds, mode, s) != ("ablation", "humaneval", "natural", 0) or m not in timed:
            continue
        for cap in (1, 32):
            part = rows[: 4 if cap == 1 else len(rows)]
            rounds, tokens = [len(r["accepted"]) for r in part], [len(r["output_ids"]) for r in part]
            sim = simulate(rounds, cap, round_time(ms[m]), tokens)
            acc = [a for r in part for a in r["accepted"]]
            tau = 1 + sum(acc) / len(acc) if acc else 1.0
            for rep in range(repeats):
                wall = sim["time_s"] * (1 + 0.02 * rng.standard_normal())
                tp.append(f"{m},{t},{cap},{rep},humaneval,natural,dynamic,{len(part)},{sum(tokens)},{wall:.6f},"
                          f"{sum(tokens) / wall:.3f},{tau:.4f},{len(acc)},{sim['steps']},{sim['groups']},0.0,"
                          "target,compiled,1")
    write_text(root / "bench" / "throughput.csv", "\n".join(tp) + "\n")
    ov = ["method,stage,ms_per_round,batch,rounds,device,engine"]
    for m in timed:
        for b, v in ms[m].items():
            ov.append(f"{m},round,{v},{b},128,synthetic,compiled")
        ov += [f"{m},verify,{ROUND_MS[8]},8,128,synthetic,compiled"] + (
            [f"{m},drafter,{DRAFT_MS.get(m, 1.2)},8,128,synthetic,compiled"] if m != "ar" else [])
    if shape:  # random-weight timings at the 8B shape, batch 8 (AR's step at batch 1)
        ov += ["8b-shape:dflash,round,8.2,8,128,synthetic,compiled",
               f"8b-shape:{spec.main_method},round,8.8,8,128,synthetic,compiled",
               "8b-shape:ar@batch1,round,6.1,1,128,synthetic,compiled"]
    write_text(root / "bench" / "overhead.csv", "\n".join(ov) + "\n")
    write_text(root / "bench" / "meta.json", json.dumps({"config": {}, "env": env}) + "\n")


def write_synthetic_verify(results: str | Path = "results", profile: str = "synthetic", n: int = 12, seed: int = 0,
                           methods=("ar", "mtp", "dflash", "zero_init_residual"), temps=(0.6, 1.0),
                           modes=("target", "sample", "block"), caps=(1, 32)) -> Path:
    """A verification-mode study in the real layout under results/<profile>/verify (runs/<method>/<mode>/
    humaneval_T<t>.jsonl, throughput.csv, oracle.csv): per round candidate j is accepted with a fixed probability
    (higher for `sample` and `block` than for `target`, lower at higher T); `ar` drafts nothing; the last `ar`
    request of the first mode stops at once. Numbers mean nothing; they exercise the renderers. Returns the
    profile's folder."""
    root, rng = Path(results) / profile, np.random.default_rng(seed)
    base = root / "verify"
    root.mkdir(parents=True, exist_ok=True)
    exp = root / "experiment.json"  # the study's order of methods and modes, as the pipeline writes it
    spec = json.loads(exp.read_text()) if exp.exists() else {}
    spec["verify"] = {"methods": list(methods), "modes": list(modes), "temperatures": list(temps)}
    write_text(exp, json.dumps(spec, indent=2) + "\n")
    bonus = {"target": 0.0, "sample": 0.12, "block": 0.16}
    tp = ["method,verify,temperature,batch_cap,repeat,requests,output_tokens,wall_s,tok_per_s,per_verify"]
    for t in temps:
        for i, m in enumerate(methods):
            k = 0 if m == "ar" else DEFAULT_K.get(m, 7)
            for v in modes:
                p = min(0.95, 0.55 + 0.05 * i - 0.15 * t + bonus.get(v, 0.0))
                rows = []
                for j in range(n):
                    at_once = m == "ar" and v == modes[0] and j == n - 1
                    acc = [] if at_once else [min(k, int(rng.geometric(1 - p)) - 1) if k else 0
                                              for _ in range(int(rng.integers(8, 20)))]
                    rows.append({"id": f"HumanEval/{j}", "method": m, "temperature": t, "verify": v,
                                 "n_candidates": k, "accepted": acc, "output_ids": [1] * (1 + sum(a + 1 for a in acc)),
                                 "repeat": 0, "mode": "natural", "stop_reason": "eos"})
                _write(base / "runs" / m / v / f"humaneval_T{t:g}.jsonl", rows)
                tau = sum(a + 1 for r in rows for a in r["accepted"]) / max(1, sum(len(r["accepted"]) for r in rows))
                tok = sum(len(r["output_ids"]) for r in rows)
                for cap in caps:
                    wall = 1.0 / (cap ** 0.7)
                    tp.append(f"{m},{v},{t},{cap},0,{n},{tok},{wall:.4f},{tok / wall:.2f},{tau:.4f}")
    write_text(base / "throughput.csv", "\n".join(tp) + "\n")
    ks = sorted({0 if m == "ar" else DEFAULT_K.get(m, 7) for m in methods} - {0})
    orc = ["temperature,k,position,ceiling"]
    for t in temps:
        for k in ks:
            c = [0.9 - 0.2 * t] * k
            cum = [float(np.prod(c[: j + 1])) for j in range(k)]
            orc += [f"{t},{k},0,{1 + sum(cum)}"] + [f"{t},{k},{j + 1},{x}" for j, x in enumerate(cum)]
    write_text(base / "oracle.csv", "\n".join(orc) + "\n")
    return root
