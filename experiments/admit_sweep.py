"""What the admission group size (`engine.admit`) buys at a batch cap, by the cost model (a prediction): one
realization's HumanEval T = 0 records (drafter seed 0), another's round times (overhead.csv, as `costmodel_check`),
and an admission cost per group (fixed + per newcomer) fitted to admission_profile.csv. Each group size is predicted
with admission on the decode (that cost) and beside it (`engine.admit_beside`: `--beside-ms` per group), for each
number of rounds a finished request rides along (`--lags`: `engine.in_flight`).

    python -m experiments.admit_sweep --records results/mini/r<j> --times results/mini/r<k> --cap 32
"""
import argparse
from pathlib import Path

import pandas as pd

from dmtp.analysis.costmodel import round_time, simulate
from dmtp.analysis.report import bench as B
from dmtp.analysis.report.data import read_runs
from dmtp.io import write_csv

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--records", required=True, help="the realization whose records give each request's rounds")
ap.add_argument("--times", required=True, help="the realization whose bench/overhead.csv gives the round times")
ap.add_argument("--profile", help="admission_profile.csv (default: --records' bench/admission_profile.csv)")
ap.add_argument("--cap", type=int, default=32)
ap.add_argument("--methods", default="ar,dflash,zero_init_residual")
ap.add_argument("--groups", default="1,2,4,8,16")
ap.add_argument("--lags", default="2,1")
ap.add_argument("--beside-ms", type=float, default=0.3, help="what an admission beside the decode still holds it")
ap.add_argument("--out", help="CSV of the rows (default: print only)")
a = ap.parse_args()

root = Path(a.records)
prof = Path(a.profile) if a.profile else root / "bench" / "admission_profile.csv"
ovp = Path(a.times) / "bench" / "overhead.csv"
for p in (prof, ovp):
    if not p.exists():
        raise SystemExit(f"admit_sweep: {p} is missing")
methods = a.methods.split(",")
recs = B.timed_records(read_runs(root))
ov = pd.read_csv(ovp)
rt = B.round_times(ov[~ov.method.str.contains(":")])
adm = pd.read_csv(prof)
rows = []
for m in methods:
    g = recs[recs.method == m]
    if g.empty or m not in rt:
        raise SystemExit(f"admit_sweep: no records or round times of {m!r}")
    times = round_time(rt[m])
    # DFlash has no admission profile of its own: the main method's, the closest prefill
    own = adm[adm.method == (m if (adm.method == m).any() else "zero_init_residual")].sort_values("group")
    if len(own) < 2 or own.group.iloc[0] != 1:
        raise SystemExit(f"admit_sweep: {prof} has no group of 1 and larger group of {m!r} (or the main method)")
    d1, gn, dn = float(own.device_ms.iloc[0]), int(own.group.iloc[-1]), float(own.device_ms.iloc[-1])
    each = (dn - d1) / (gn - 1)
    fixed = d1 - each
    rounds, tokens = [len(x) for x in g.accepted], list(g.output_tokens)
    for lag in map(int, a.lags.split(",")):
        for where in ("decode", "beside"):
            for n in map(int, a.groups.split(",")):
                kw = (dict(t_admit_ms=fixed, t_admit_each_ms=each) if where == "decode"
                      else dict(t_admit_ms=a.beside_ms))
                p = simulate(rounds, a.cap, times, tokens, admit=n, lag=lag, **kw)
                rows.append({"method": m, "cap": a.cap, "lag": lag, "admission": where, "admit": n,
                             "tok_per_s": p["tok_per_s"], "mean_live": p["mean_live"], "groups": p["groups"],
                             "admit_fixed_ms": fixed if where == "decode" else a.beside_ms,
                             "admit_each_ms": each if where == "decode" else 0.0})
df = pd.DataFrame(rows)
ar = df[df.method == "ar"].set_index(["lag", "admission", "admit"]).tok_per_s
df["speedup"] = [r.tok_per_s / ar.get((r.lag, r.admission, r.admit), float("nan")) for r in df.itertuples()]
df = df.assign(records=root.name, round_times_from=Path(a.times).name)
print(df.pivot_table(index=["lag", "admission", "admit"], columns="method", values=["tok_per_s", "speedup"])
      .to_string(float_format=lambda x: f"{x:.3f}" if x < 100 else f"{x:.0f}"))
if a.out:
    write_csv(Path(a.out), df)
