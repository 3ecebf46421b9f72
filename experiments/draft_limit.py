"""What a draft limit (`<run>-k<n>`: verify only a run's first n drafts per round) would keep of each run's
acceptance, estimated from a realization's records by cutting each round's accepted count at n
(`metrics.capped_per_verify`); `bench --methods <run>,<run>-k<n>` measures the real thing. Prints and writes (--out,
CSV) per run and limit: tau, tau capped at n, the change, and the share of rounds that accepted more than n.

    python -m experiments.draft_limit --records results/mini/r<k> --limits 4,5
    python -m experiments.draft_limit --records results/mini/r<k> --runs zero_init_residual --temperature 1
"""
import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from dmtp.analysis import metrics as M
from dmtp.analysis.report.data import pooled_hist, read_runs
from dmtp.io import write_csv

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--records", required=True, help="a realization (results/<profile>/r<k>: its runs/)")
ap.add_argument("--runs", default="", help="comma list of runs (default: every run with more than one draft)")
ap.add_argument("--limits", default="4,5", help="comma list of n (default 4,5)")
ap.add_argument("--dataset", default="humaneval")
ap.add_argument("--temperature", type=float, default=0.0)
ap.add_argument("--mode", default="natural")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--out", help="CSV of the rows (default: print only)")
a = ap.parse_args()

try:
    limits = sorted({int(x) for x in a.limits.split(",") if x.strip()})
except ValueError:
    raise SystemExit(f"draft_limit: --limits {a.limits!r}: expected a comma list of integers") from None
if not limits or min(limits) < 1:
    raise SystemExit(f"draft_limit: --limits {a.limits!r}: expected integers >= 1")
root = Path(a.records)
if not (root / "runs").is_dir():
    raise SystemExit(f"draft_limit: {root}/runs is missing (a realization: results/<profile>/r<k>)")
runs = read_runs(root)
sel = runs[(runs.dataset == a.dataset) & np.isclose(runs.temperature, a.temperature) & (runs["mode"] == a.mode)
           & (runs.seed == a.seed)]
names = [r for r in a.runs.split(",") if r] or sorted(set(sel[sel.k > 1].method))
unknown = [r for r in names if r not in set(sel.method)]
if unknown:
    raise SystemExit(f"draft_limit: no {a.dataset} T = {a.temperature:g} {a.mode} seed-{a.seed} records of "
                     f"{', '.join(unknown)} in {root}; runs there: {', '.join(sorted(set(sel.method))) or 'none'}")
rows = []
for name in names:
    k, hist = pooled_hist(sel[sel.method == name])
    tau = M.per_verify(hist)
    for n in limits:
        if n >= k:
            continue
        capped = M.capped_per_verify(hist, n)
        rows.append({"realization": root.name, "run": name, "drafts": k, "limit": n, "rounds": int(hist.sum()),
                     "tau": tau, "tau_capped": capped, "change_pct": 100 * (capped / tau - 1),
                     "rounds_above_limit_pct": 100 * hist[n + 1:].sum() / hist.sum()})
if not rows:
    raise SystemExit(f"draft_limit: no run drafts more than {max(limits)} tokens a round")
df = pd.DataFrame(rows)
print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
if a.out:
    write_csv(Path(a.out), df)
