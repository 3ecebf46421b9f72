"""The cost model out of sample: one realization's measured speed-ups predicted from ANOTHER realization's round times
(overhead.csv) of the same shape and engine; a round's time depends on the shapes, not the weights. Prints and
writes (--out, CSV) the rows of `dmtp.analysis.report.bench.predicted_vs_measured`.

    python -m experiments.costmodel_check --records results/mini/r<j> --times results/mini/r<k> \
        --out results/mini/r<j>/bench/costmodel_with_r<k>_times.csv
"""
import argparse
from pathlib import Path

import pandas as pd

from dmtp.analysis.report import bench as B
from dmtp.analysis.report.data import read_runs
from dmtp.io import write_csv

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--records", required=True, help="the realization whose throughput is predicted (runs/, bench/)")
ap.add_argument("--times", required=True, help="the realization whose bench/overhead.csv gives the round times")
ap.add_argument("--out", help="CSV of the rows (default: print only)")
a = ap.parse_args()

root, other = Path(a.records), Path(a.times)
for p in (root / "bench" / "throughput.csv", other / "bench" / "overhead.csv"):
    if not p.exists():
        raise SystemExit(f"costmodel_check: {p} is missing (a realization with a benchmark: results/<profile>/r<k>)")
recs = B.timed_records(read_runs(root))
if recs.empty:
    raise SystemExit(f"costmodel_check: {root} holds no HumanEval T = 0 natural records of seed 0")
ov = pd.read_csv(other / "bench" / "overhead.csv")
rows = B.predicted_vs_measured(recs, pd.read_csv(root / "bench" / "throughput.csv"), ov[~ov.method.str.contains(":")])
if not rows:
    raise SystemExit("costmodel_check: no method has both throughput runs and round times (ar among them)")
df = pd.DataFrame(rows).assign(records=root.name, round_times_from=other.name)
cols = ["records", "round_times_from", "method", "batch_cap", "predicted_speedup", "measured_speedup", "error_pct",
        "admit_ms"]
print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
worst = df[df.method != "ar"].error_pct.abs().max()
print(f"largest |error| over the drafting methods: {worst:.1f} % (goal 10 %)")
if a.out:
    write_csv(Path(a.out), df)
