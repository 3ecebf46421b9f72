"""Synthetic artifacts in the real layout, for tests, notebooks and `python -m dmtp.cli.report demo`.

Each round accepts candidate j with a fixed per-method probability p (geometric, capped at k); requests differ by a
small per-request offset. Numbers mean nothing; they only exercise the renderers.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

P = {"ar": 0.0, "mtp": 0.78, "dflash": 0.70, "token_only": 0.74, "t1_residual": 0.75, "double_anchor_fusion": 0.76,
     "fusion": 0.765, "zero_init_residual": 0.77, "mask_residual": 0.745, "context_fusion": 0.73,
     "mtp_context": 0.72, "dflash2": 0.74, "dmtp_d2": 0.80}
K = {"ar": 0, "mtp": 4}


def request(rng, method: str, i: int, temp: float, p: float, n_rounds: int) -> dict:
    k = K.get(method, 7)
    q = np.clip(p + rng.normal(0, 0.05), 0, 0.99) if k else 0.0
    acc = [int(min(k, rng.geometric(1 - q) - 1)) if k else 0 for _ in range(n_rounds)]
    n_out = sum(acc) + n_rounds
    return {"id": f"req{i}", "method": method, "temperature": temp, "prompt_tokens": 32,
            "output_ids": [int(x) for x in rng.integers(0, 1000, n_out)], "accepted": acc,
            "n_candidates": k, "wall_s": round(0.01 * n_rounds, 4)}


def write_synthetic(results: str | Path = "results", profile: str = "synthetic", n: int = 8, seed: int = 0,
                    temps=(0, 1), methods=None, bench: bool = True) -> Path:
    """Write runs/ (ablation: humaneval8 at each of `temps` for every variant; main: gsm8k and mt_bench at T0;
    only `methods` when given) and, with bench=True, bench/throughput.csv and bench/overhead.csv under
    results/<profile>. Returns that folder."""
    root, rng = Path(results) / profile, np.random.default_rng(seed)
    plan = [("ablation", "humaneval8", t, m) for t in temps for m in P if m not in ("dflash2", "dmtp_d2")]
    plan += [("main", d, 0, m) for d in ("gsm8k", "mt_bench") for m in ("mtp", "dflash", "zero_init_residual",
                                                                         "dflash2", "dmtp_d2")]
    for exp, ds, t, m in plan:
        if methods is not None and m not in methods:
            continue
        path = root / "runs" / exp / m / f"{ds}_T{t:g}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [request(rng, m, i, t, P[m] - 0.05 * t, int(rng.integers(10, 30))) for i in range(n)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if bench:
        (root / "bench").mkdir(parents=True, exist_ok=True)
        lines = ["method,temperature,batch_cap,dataset,output_tokens,wall_s,tok_per_s"]
        for ds in ("humaneval", "gsm8k"):
            for m, speed in (("mtp", 1.1), ("dflash", 1.0), ("zero_init_residual", 1.18)):
                for b in (1, 2, 4, 8, 16, 32):
                    tok, wall = 4096 * b, 4096 * b / (100 * speed * b ** 0.7)
                    lines.append(f"{m},0,{b},{ds},{tok},{wall:.4f},{tok / wall:.2f}")
        (root / "bench" / "throughput.csv").write_text("\n".join(lines) + "\n")
        ov = {"dflash": {"drafter": 0.40, "verify": 8.4, "round": 8.9},
              "zero_init_residual": {"drafter": 0.40, "mtp": 0.22, "t1_prep": 0.28, "verify": 8.4, "round": 9.3}}
        (root / "bench" / "overhead.csv").write_text("method,stage,ms_per_round\n" + "".join(
            f"{m},{s},{v}\n" for m, st in ov.items() for s, v in st.items()))
    return root
