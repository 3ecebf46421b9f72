"""The T = 1 end-to-end gap to the blog, decomposed per realization (tables/t1_gap): DMTP's tok/s gain over DFlash at
the largest timed batch cap against the blog's (+18.77 % tok/s for +18.78 % acceptance, 35B, B32), split into

    per-verify gain g_tau   (tau per verify round, main / baseline, measured in the same timed runs)
    round ratio rr          (a DMTP round's device time over DFlash's, trained models, same batch: overhead.csv)
    decode only             (1 + g_tau) / rr - 1: the gain if admission cost nothing
    admission and the rest  end-to-end gain - decode only (admissions, ride-along rounds, host work)

and two cost-model readings at T = 1 (dmtp.analysis.costmodel, decode only): on the trained models' round times
(a check of the decode-only line) and the projection to the 8B shape (random-weight stage times at batch 8, this
realization's T = 1 acceptance) — a projection, not a measurement.

    from dmtp.analysis.report import load, blog_gap
    art = load("mini"); print(blog_gap.table(art))
"""
from __future__ import annotations

import math

import pandas as pd

from dmtp.analysis import metrics as M
from dmtp.analysis import reference as R
from dmtp.analysis.report import bench as B
from dmtp.analysis.report import tables as T
from dmtp.analysis.report.data import Artifacts, pooled_hist, select


def _eval_tau_gain(recs: pd.DataFrame, main: str, base: str) -> float:
    """100 (per-verify tau of main / of base - 1) over the evaluation's records (every round pooled)."""
    tau = {m: M.per_verify(pooled_hist(g)[1]) for m, g in recs.groupby("method") if m in (main, base)}
    return 100 * (tau[main] / tau[base] - 1) if main in tau and base in tau else math.nan


def _gain(rows: list[dict], cap: int, main: str, base: str) -> float:
    """100 (predicted speed-up of main / of base - 1) at cap from cost-model rows; nan when either is absent."""
    got = {r["method"]: r["predicted_speedup"] for r in rows if r["batch_cap"] == cap}
    return 100 * (got[main] / got[base] - 1) if main in got and base in got else math.nan


def table(art: Artifacts) -> pd.DataFrame | None:
    """One row per realization with a T = 1 throughput row of the main method at its largest cap, then the blog's."""
    df, main, base = T.main_gains(art, 1.0), art.spec.main_method, art.spec.drafter_baseline
    if df is None:
        return None
    ov = art.overhead if art.overhead is not None else pd.DataFrame(columns=["realization", "method", "stage"])
    rows = []
    for r in df.itertuples():
        if r.batch_cap != df[df.realization == r.realization].batch_cap.max():
            continue
        k = T.realization_number(r.realization) or 0
        cap = int(r.batch_cap)
        mine = ov[(ov.realization == k)]
        rt = mine[(mine.stage == "round") & (mine.batch == cap)].set_index("method").ms_per_round \
            if len(mine) else pd.Series(dtype=float)
        rr = float(rt[main] / rt[base]) if main in rt and base in rt else math.nan
        dec = 100 * ((1 + r.per_verify_gain_pct / 100) / rr - 1) if not math.isnan(rr) else math.nan
        recs = B.timed_records(select(art.runs, realization=k), 1.0)
        trained = B.predicted(recs, mine, caps=(cap,)) if len(mine) and len(recs) else []
        shape = ov[ov.method.astype(str).str.startswith(B.SHAPE + ":")]
        proj = B.projection(recs, shape, caps=(cap,)) if len(shape) and len(recs) else []
        rows.append({"realization": r.realization, "device": getattr(r, "device", ""), "batch_cap": cap,
                     "n_repeats": r.n_repeats, "gain_pct": r.gain_pct, "gain_pct_min": r.gain_pct_lo,
                     "gain_pct_max": r.gain_pct_hi, "per_verify_gain_pct": r.per_verify_gain_pct,
                     "eval_per_verify_gain_pct": _eval_tau_gain(recs, main, base) if len(recs) else math.nan,
                     "round_ratio": rr, "decode_only_gain_pct": dec,
                     "admission_and_rest_pts": r.gain_pct - dec if not math.isnan(dec) else math.nan,
                     "costmodel_trained_gain_pct": _gain(trained, cap, main, base),
                     "projection_8b_shape_gain_pct": _gain(proj, cap, main, base)})
    if not rows:
        return None
    blog = R.table("throughput").set_index(["workload", "method"]).tok_per_s
    ov_b = R.table("overhead")
    ov_b = ov_b[(ov_b.workload == "Code") & (ov_b.stage == "round")].set_index("method").ms_per_round
    g_tau = R.blog_value("main", "humaneval", "dmtp_vs_dflash_pct")
    rr = float(ov_b["dmtp"] / ov_b["dflash"])
    rows.append({"realization": "blog (35B, 4xH200 TP4, SGLang; round times at batch 8)", "device": "H200",
                 "batch_cap": 32, "n_repeats": math.nan,
                 "gain_pct": T.pct(blog["Code", "dmtp"], blog["Code", "dflash"]), "gain_pct_min": math.nan,
                 "gain_pct_max": math.nan, "per_verify_gain_pct": g_tau, "round_ratio": rr,
                 "decode_only_gain_pct": 100 * ((1 + g_tau / 100) / rr - 1)})
    out = pd.DataFrame(rows)
    out["admission_and_rest_pts"] = out.gain_pct - out.decode_only_gain_pct
    return T.save(art, "t1_gap", out, "The T = 1 end-to-end gap to the blog, decomposed",
                  "gain_pct = the main method's tok/s over the drafter baseline's at T = 1 and the largest timed cap "
                  "(median of per-repeat ratios; min / max: the timing repeats of one trained pair, not an interval); "
                  "per_verify_gain_pct = the same for tau per verify round; eval_per_verify_gain_pct = the same "
                  "from the evaluation's T = 1 records (HumanEval, seed 0: other samples than the timed runs'); "
                  "round_ratio = the main method's round time "
                  "over the baseline's (trained models, that batch; the blog: its batch-8 table); decode_only_gain_pct "
                  "= (1 + per-verify gain) / round ratio - 1; admission_and_rest_pts = gain_pct - decode_only; "
                  "costmodel_trained_gain_pct = the cost model on the trained models' round times and the T = 1 "
                  "records, decode only; projection_8b_shape_gain_pct = the same records on the 8B-shape round times "
                  "(random weights, batch 8): a projection, not a measurement.", models="bench")


def lines(art: Artifacts) -> list[str]:
    """REPORT.md's section: a few sentences and the table."""
    df = table(art)
    if df is None:
        return []
    out = ["## The T = 1 end-to-end gap to the blog", ""]
    blog = df.iloc[-1]
    out += [f"The blog gains {blog.gain_pct:+.2f} % tok/s at B32, T = 1 for {blog.per_verify_gain_pct:+.2f} % "
            f"acceptance; its DMTP round costs x{blog.round_ratio:.3f} DFlash's at batch 8.", ""]
    for r in df.iloc[:-1].itertuples():
        s = (f"- {r.realization}{T.text_cell(r.device, ', ')}, B{r.batch_cap}: {r.gain_pct:+.1f} % tok/s (median of "
             f"{int(r.n_repeats)} timing repeat{'s' * (r.n_repeats != 1)}) for {r.per_verify_gain_pct:+.1f} % "
             "per-verify tau.")
        gap, tau = blog.gain_pct - r.gain_pct, blog.per_verify_gain_pct - r.per_verify_gain_pct
        s += (f" Of its {gap:.1f}-point gap to the blog, {tau:.1f} points are the smaller per-verify gain and "
              f"{gap - tau:.1f} the cost side.")
        if not math.isnan(r.round_ratio):
            s += (f" Its round ratio x{r.round_ratio:.3f} leaves {r.decode_only_gain_pct:+.1f} % decode only; the "
                  f"end-to-end gain differs from that by {r.admission_and_rest_pts:+.1f} points (admission, "
                  "ride-along rounds, host work).")
        if not math.isnan(r.eval_per_verify_gain_pct):
            s += f" The evaluation's T = 1 records give {r.eval_per_verify_gain_pct:+.1f} % per-verify tau"
            s += (f", the cost model on them {r.costmodel_trained_gain_pct:+.1f} % decode only."
                  if not math.isnan(r.costmodel_trained_gain_pct) else " (no stage times of its own to model them).")
        if not math.isnan(r.projection_8b_shape_gain_pct):
            s += (f" Projected to the 8B shape (a projection, decode only): "
                  f"{r.projection_8b_shape_gain_pct:+.1f} %.")
        out.append(s)
    out += ["", f"The blog's end-to-end gain exceeds its own decode-only bound from the batch-8 round ratio by "
               f"{blog.admission_and_rest_pts:.1f} points: at its B32 (TP4) a DMTP round must cost about what a "
               "DFlash round does."]
    return out + ["", T.to_markdown(df), ""]
