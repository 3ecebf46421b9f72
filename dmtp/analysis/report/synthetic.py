"""Synthetic artifacts in the real layout, for tests, notebooks and `python -m dmtp.cli.report demo`.

The runs are those of an ablation spec (written to experiment.json as the pipeline does). Each round accepts
candidate j with a fixed per-run probability p (geometric, capped at k; higher for runs later in the spec's order);
requests differ by a small per-request offset. Numbers mean nothing; they only exercise the renderers.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from dmtp.ablation import AblationSpec
from dmtp.analysis.report.data import DEFAULT_K


def request(rng, method: str, i: int, temp: float, p: float, n_rounds: int) -> dict:
    k = DEFAULT_K.get(method, 7)
    q = np.clip(p + rng.normal(0, 0.05), 0, 0.99) if k else 0.0
    acc = [int(min(k, rng.geometric(1 - q) - 1)) if k else 0 for _ in range(n_rounds)]
    n_out = sum(acc) + n_rounds
    return {"id": f"req{i}", "method": method, "temperature": temp, "prompt_tokens": 32,
            "output_ids": [int(x) for x in rng.integers(0, 1000, n_out)], "accepted": acc,
            "n_candidates": k, "wall_s": round(0.01 * n_rounds, 4)}


def write_synthetic(spec: AblationSpec, results: str | Path = "results", profile: str = "synthetic", n: int = 8,
                    seed: int = 0, temps=(0, 1), methods=None, bench: bool = True) -> Path:
    """Write experiment.json (the spec), runs/ (ablation: humaneval8 at each of `temps` for every run but the
    backbone runs; main: gsm8k and mt_bench at T0 for the main-table and backbone runs; only `methods` when given)
    and, with bench=True, bench/throughput.csv and bench/overhead.csv under results/<profile>. Returns that folder."""
    root, rng = Path(results) / profile, np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "experiment.json").write_text(json.dumps({"ablation": asdict(spec)}, indent=2) + "\n")
    p = {m: 0.70 + 0.01 * (i % 12) for i, m in enumerate(spec.runs())}
    plan = [("ablation", "humaneval8", t, m) for t in temps for m in spec.runs() if m not in spec.backbones]
    plan += [("main", d, 0, m) for d in ("gsm8k", "mt_bench") for m in spec.main_table + tuple(spec.backbones)]
    for exp, ds, t, m in plan:
        if methods is not None and m not in methods:
            continue
        path = root / "runs" / exp / m / f"{ds}_T{t:g}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [request(rng, m, i, t, p[m] - 0.05 * t, int(rng.integers(10, 30))) for i in range(n)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    timed = [(m, speed) for m, speed in (("mtp", 1.1), (spec.drafter_baseline, 1.0), (spec.main_method, 1.18)) if m]
    if bench:
        (root / "bench").mkdir(parents=True, exist_ok=True)
        lines = ["method,temperature,batch_cap,dataset,output_tokens,wall_s,tok_per_s"]
        for ds in ("humaneval", "gsm8k"):
            for m, speed in timed:
                for b in (1, 2, 4, 8, 16, 32):
                    tok, wall = 4096 * b, 4096 * b / (100 * speed * b ** 0.7)
                    lines.append(f"{m},0,{b},{ds},{tok},{wall:.4f},{tok / wall:.2f}")
        (root / "bench" / "throughput.csv").write_text("\n".join(lines) + "\n")
        ov = {spec.drafter_baseline: {"drafter": 0.40, "verify": 8.4, "round": 8.9},
              spec.main_method: {"drafter": 0.40, "mtp": 0.22, "t1_prep": 0.28, "verify": 8.4, "round": 9.3}}
        (root / "bench" / "overhead.csv").write_text("method,stage,ms_per_round\n" + "".join(
            f"{m},{s},{v}\n" for m, st in ov.items() if m for s, v in st.items()))
    return root
