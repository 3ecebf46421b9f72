"""The bench side of the report, pure over DataFrames (tables.py renders them): end-to-end throughput from the timed
repeats of bench/throughput.csv, and the cost model's predicted vs measured speed-ups (dmtp.analysis.costmodel).

Throughput (per realization; with several, also every repeat of every realization pooled, realization "all"):
tok/s = median [min, max] over the timed repeats; speed-up over AR = median [min, max] of the per-repeat ratios
(the same repeat index: runs side by side, interleaved); the main method's gain over the drafter baseline likewise,
beside its per-verify gain (the ratio of per-verify taus of the same repeats).

Cost model (one realization): `costmodel.predict` on that realization's eval records (HumanEval, T = 0, natural,
seed 0; the first `requests` records of the timed cap), its trained models' round times per batch (overhead.csv,
stage "round") and the admission cost measured by the throughput runs (admit_s / groups), against the measured
speed-up at each timed cap; and the projections to the shapes timed with random weights (SHAPES: the 8B shape,
the profile's own `--mini-shape`): their stage times at batch 8 x the realization's records, decode only (no
admission cost; batch 8's round time at every batch) — also for a realization without a bench of its own.

    rows = throughput(tp, main="zero_init_residual", base="dflash")
    pred = predicted_vs_measured(records, tp, ov)      # one realization's
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from dmtp.analysis.costmodel import predict
from dmtp.analysis.metrics import speedup_on_ar_outputs
from dmtp.analysis.report.data import select

KEY = ["dataset", "temperature", "batch_cap"]
# the setups projected to (random weights: timing only) -> the runs whose timing there has another label than
# "<setup>:<run>": 8b-shape, a Qwen3-8B-sized target with 5-layer drafters (AR: its batch-1 step); mini-shape, the
# profile's own shape (`bench --mini-shape`)
SHAPES = {"8b-shape": {"ar": "8b-shape:ar@batch1"}, "mini-shape": {}}
SHAPE = "8b-shape"  # the paper-scale one
SHAPE_BATCH = 8  # the batch their stage times were taken at


def spread(x) -> tuple[float, float, float]:
    """(median, min, max) of the finite values (nan when none)."""
    v = np.asarray(list(x), float)
    v = v[np.isfinite(v)]
    return (float(np.median(v)), float(v.min()), float(v.max())) if len(v) else (math.nan,) * 3


def per_repeat(tp: pd.DataFrame, main: str = "", base: str = "") -> pd.DataFrame:
    """bench/throughput.csv rows (any realizations) with `speedup` = tok/s over AR's in the same realization,
    dataset, temperature, cap and repeat, and on the main method's rows `gain` and `per_verify_gain` = its tok/s and
    per-verify tau over the drafter baseline's of the same repeat (nan where the partner is absent)."""
    tp = tp.assign(**{c: tp[c] if c in tp else v for c, v in (("repeat", 0), ("realization", 0),
                                                               ("per_verify", np.nan))})
    on = ["realization", *KEY, "repeat"]
    ar = tp[tp.method == "ar"][on + ["tok_per_s"] + (["output_tokens"] if "output_tokens" in tp else [])].rename(
        columns={"tok_per_s": "ar_tok_per_s", "output_tokens": "ar_tokens"})
    b = tp[tp.method == base][on + ["tok_per_s", "per_verify"]].rename(
        columns={"tok_per_s": "base_tok_per_s", "per_verify": "base_per_verify"})
    df = tp.merge(ar, on=on, how="left").merge(b, on=on, how="left")
    df["speedup"] = df.tok_per_s / df.ar_tok_per_s
    if "ar_tokens" in df:  # the workload against AR's: bf16 outputs leave AR's at top-2 ties (`workload_note`)
        df["tokens_vs_ar"] = df.output_tokens / df.ar_tokens
    if "per_verify_shared" in df:  # the speed-up on AR's own text, estimated
        df["speedup_on_ar_outputs"] = speedup_on_ar_outputs(df.speedup, df.per_verify_shared, df.per_verify)
    is_main = (df.method == main) & bool(main)
    df["gain"] = np.where(is_main, df.tok_per_s / df.base_tok_per_s, np.nan)
    df["per_verify_gain"] = np.where(is_main, df.per_verify / df.base_per_verify, np.nan)
    return df


SERVING = ("engine", "admit", "prefill", "admit_beside", "in_flight")  # how a throughput run's servers were set up
# (throughput.csv columns; a column a CSV lacks: it was written before the setting existed, and pools only with such)


def serving(tp: pd.DataFrame) -> tuple | None:
    """The one server set-up (SERVING values) of every throughput row, or None when the rows differ in it."""
    cols = [c for c in SERVING if c in tp]
    keys = {tuple(r) for r in tp[cols].fillna("").astype(str).itertuples(index=False)} if cols else {()}
    return next(iter(keys)) if len(keys) == 1 else None


def throughput(tp: pd.DataFrame, main: str = "", base: str = "", commits: dict | None = None,
               devices: dict | None = None) -> pd.DataFrame:
    """One row per (realization, dataset, temperature, batch cap, method): n_repeats, tok_per_s [min, max],
    speedup over AR [min, max], per_verify (median), and for the main method gain_pct [min, max] over the drafter
    baseline, per_verify_gain_pct and gain_over_per_verify (tok/s gain / per-verify gain); `commits`: "r<k>" -> the
    commit its bench ran at (column `commit`); `devices`: "r<k>" -> the device it ran on (column `device`). At T = 0
    the drafting methods' rows say whose workload they decoded: equal_ar (the fewest requests equal to AR's output in
    any repeat) of requests, tokens_vs_ar_pct (their output tokens against AR's), and where the bench kept the tau on
    the prefixes shared with AR's outputs, speedup_on_ar_outputs [min, max] (an estimate). With
    several realizations whose servers were set up alike (`serving`: engine, admission group, prompt pass) on one
    kind of device (tok/s on an H100 and on an H200 are different quantities), over request groups of one size at
    each (temperature, cap) (B1 over 16 prompts and over 64 are different workloads), rows "all" pool every repeat;
    otherwise each realization stands alone."""
    df = per_repeat(tp, main, base)
    units = [(f"r{k}", g) for k, g in df.groupby("realization", sort=True)]
    plain = df[~df.method.astype(str).str.contains("@")]  # a server variant timed beside them (`bench
    # --server-variants`)
    known = {n: (devices or {}).get(n, "") for n, _ in units}
    one_device = len(set(known.values())) == 1  # "" for all: no device recorded anywhere (older benches)
    same_work = "requests" not in plain or (plain.groupby(KEY).requests.nunique(dropna=True) <= 1).all()
    if len(units) > 1 and serving(plain) is not None and one_device and same_work:  # repeats pool only where every
        units.append(("all", df))  # server was set up alike, on one kind of device, over the same request groups
        known["all"] = next(iter(known.values()))
    rows = []
    for name, d in units:
        for (ds, t, cap, m), g in d.groupby(KEY + ["method"], sort=True):
            tok, su = spread(g.tok_per_s), spread(g.speedup)
            row = {"realization": name, "commit": (commits or {}).get(name, ""), "device": known[name],
                   "dataset": ds, "temperature": t,
                   "batch_cap": cap, "method": m, "n_repeats": len(g), **_triple("tok_per_s", tok),
                   **_triple("speedup", su), "per_verify": float(g.per_verify.median())}
            if m != "ar" and "equal_ar" in g and g.equal_ar.notna().any():  # T = 0: AR's workload or not
                row.update(equal_ar=int(g.equal_ar.min()), requests=int(g.requests.max()),
                           tokens_vs_ar_pct=100 * (float(g.tokens_vs_ar.median()) - 1) if "tokens_vs_ar" in g
                           else math.nan)
                if "speedup_on_ar_outputs" in g and g.speedup_on_ar_outputs.notna().any():
                    row.update(**_triple("speedup_on_ar_outputs", spread(g.speedup_on_ar_outputs)))
            if m == main:
                gain, tau = spread(100 * (g.gain - 1)), spread(100 * (g.per_verify_gain - 1))
                row.update(**_triple("gain_pct", gain), per_verify_gain_pct=tau[0],
                           gain_over_per_verify=gain[0] / tau[0] if tau[0] else math.nan)
            rows.append(row)
    gains = ["gain_pct", "gain_pct_lo", "gain_pct_hi", "per_verify_gain_pct", "gain_over_per_verify"]
    df = pd.DataFrame(rows)
    return df.assign(**{c: math.nan for c in gains if c not in df})  # the main method or its baseline untimed


_OVERHEAD_LINE = re.compile(r"\[bench\] overhead (\S+) batch (\d+): (.+)$")


def overhead_from_log(lines) -> list[dict]:
    """overhead.csv rows from a bench log's "[bench] overhead <method> batch <B>: <stage> <ms>, ..." lines (for a run
    killed before the part wrote its CSV: the stage times it printed as it measured them); a "no stage times" line
    gives none. Raises ValueError when no line parses."""
    rows = []
    for line in lines:
        m = _OVERHEAD_LINE.search(line.rstrip("\n"))
        if not m or m.group(3).startswith("no stage times"):
            continue
        for part in m.group(3).split(", "):
            stage, _, ms = part.rpartition(" ")
            rows.append({"method": m.group(1), "stage": stage, "ms_per_round": float(ms), "batch": int(m.group(2))})
    if not rows:
        raise ValueError("no '[bench] overhead <method> batch <B>: <stage> <ms>, ...' line in the log")
    return rows


def _triple(name: str, v: tuple) -> dict:
    return {name: v[0], f"{name}_lo": v[1], f"{name}_hi": v[2]}


def decode_only_ratio(per_verify_gain: float, round_ratio: float) -> float:
    """The tok/s gain over per-verify gain a method would reach with no admission cost: its tok/s gain is then its
    per-verify gain (a ratio, e.g. 1.55) over its round ratio against the baseline's round (e.g. 1.05)."""
    return (per_verify_gain / round_ratio - 1) / (per_verify_gain - 1) if per_verify_gain != 1 else math.nan


def round_times(ov: pd.DataFrame) -> dict[str, dict[int, float]]:
    """method -> {batch: ms per round} from overhead.csv rows (stage "round"; no batch column: batch 8)."""
    ov = ov[ov.stage == "round"]
    batch = ov["batch"] if "batch" in ov else pd.Series(8, index=ov.index)
    return {m: {int(b): float(v) for b, v in zip(batch[g.index], g.ms_per_round)} for m, g in ov.groupby("method")}


def timed_records(runs: pd.DataFrame, temperature: float = 0.0) -> pd.DataFrame:
    """The eval records the cost model reads (`predicted_vs_measured`'s `runs`): the ablation's HumanEval at T (0
    unless told), natural mode, drafter seed 0 — the workload the throughput runs time."""
    return select(runs, experiment="ablation", dataset="humaneval", temperature=temperature, mode="natural", seed=0)


def _records(runs: pd.DataFrame) -> dict[str, list[dict]]:
    """method -> the cost model's records ({accepted, output_ids}: only their lengths are read), in file order."""
    return {m: [{"accepted": a, "output_ids": range(n)} for a, n in zip(g.accepted, g.output_tokens)]
            for m, g in runs.groupby("method", sort=False)}


def predicted_vs_measured(runs: pd.DataFrame, tp: pd.DataFrame, ov: pd.DataFrame) -> list[dict]:
    """One realization: at T = 0 and each timed cap, every method with eval records (`runs`: HumanEval, T = 0,
    natural, seed 0, in file order), round times (`ov`: its trained models' overhead.csv rows) and throughput runs
    (`tp`), beside AR: the predicted speed-up (`costmodel.predict` on the first `requests` records, the measured
    round time per batch and admission cost per group) against the measured one (median [min, max] of the repeats),
    error_pct = 100 (predicted / measured - 1). round_timed_at_cap: the method's round was timed at that batch (else
    `round_time` holds the nearest timed batch's: an extrapolation, not a validation). A finished request rides along
    for the servers' `engine.in_flight` rounds (`costmodel.simulate`'s lag; 2 where the runs predate the setting: the
    engine's fixed value then).

    Admission per group = what it held the decode (`admission_ms`) + the device time of the prompt passes run beside
    the decode (`beside_ms`, `engine.admit_beside`), charged in full: the overlap's worth is not a stage time the bench
    measures. predicted_speedup_hidden: the same with the beside prompt passes wholly hidden (0 ms), the other
    bound.
    A server variant timed beside the plain servers (`bench --server-variants`: rows "<method>@<variant>") is
    predicted against its own AR ("ar@<variant>"), its rows named so."""
    times = round_times(ov[~ov.method.str.contains(":")])
    recs = _records(runs)
    t0 = tp[tp.temperature == 0]
    variant = t0.method.astype(str).str.partition("@")[2]
    rows = []
    for v in sorted(set(variant)):  # "" (the plain servers) first
        tv = per_repeat(t0[variant == v].assign(method=lambda d: d.method.astype(str).str.partition("@")[0]))
        for cap, g in tv.groupby("batch_cap", sort=True):
            n = int(g.requests.max()) if "requests" in g else None
            have = [m for m in sorted(set(g.method)) if m in recs and m in times]
            if "ar" not in have:
                continue
            admit_ms, bes = admission_ms(g), beside_ms(g)
            admit = int(g.admit.iloc[0]) if "admit" in g else 1
            plain = g[g.method == "ar"]  # the servers' host lag: engine.in_flight (2 before it was a setting)
            lag = int(plain.in_flight.iloc[0]) if "in_flight" in plain and plain.in_flight.notna().any() else 2
            sub = {m: recs[m] for m in have}
            pred = predict(sub, times, int(cap), n, {m: admit_ms.get(m, 0.0) + bes.get(m, 0.0) for m in have},
                           admit, lag)
            hidden = predict(sub, times, int(cap), n, admit_ms, admit, lag) if any(bes.values()) else pred
            for m in have:
                meas = spread(g[g.method == m].speedup)
                rows.append({"kind": "predicted vs measured", "method": m + (f"@{v}" if v else ""),
                             "batch_cap": int(cap),
                             "n_requests": min(n or len(recs[m]), len(recs[m])), **_triple("measured_speedup", meas),
                             "predicted_speedup": pred[m]["speedup"],
                             "error_pct": 100 * (pred[m]["speedup"] / meas[0] - 1) if meas[0] else math.nan,
                             "measured_tok_per_s": spread(g[g.method == m].tok_per_s)[0],
                             "predicted_tok_per_s": pred[m]["tok_per_s"], "admit_ms": admit_ms.get(m, 0.0),
                             "beside_ms": bes.get(m, 0.0), "predicted_speedup_hidden": hidden[m]["speedup"],
                             "round_timed_at_cap": int(cap) in times[m],
                             **{f"round_ms_b{b}": x for b, x in sorted(times[m].items())}})
    return rows


def admission_ms(tp: pd.DataFrame) -> dict[str, float]:
    """method -> ms per admitted group (`Server.admit_s`: device time on CUDA): the median over the timed repeats of
    admit_s / groups (a repeat that compiled an admission shape is an outlier the median sets aside; a pooled mean
    let one such repeat double it)."""
    return _per_group_ms(tp, "admit_s")


def beside_ms(tp: pd.DataFrame) -> dict[str, float]:
    """method -> ms per admitted group of prompt passes run beside the decode (`Server.beside_s`, device time;
    `engine.admit_beside`): the median over the timed repeats of beside_s / groups; {} for runs without the column
    (admission then held the decode for all of its time, in `admit_s`)."""
    return _per_group_ms(tp[tp.beside_s.notna()], "beside_s") if "beside_s" in tp else {}


def _per_group_ms(tp: pd.DataFrame, col: str) -> dict[str, float]:
    """method -> the median over the timed repeats of 1e3 x `col` (seconds) / groups, over repeats that admitted a
    group; {} without the column."""
    if not {col, "groups"} <= set(tp):
        return {}
    ok = tp[tp.groups > 0]
    return {m: float(np.median(1e3 * x[col] / x.groups)) for m, x in ok.groupby("method")}


def predicted(runs: pd.DataFrame, ov: pd.DataFrame, caps=(1, 32)) -> list[dict]:
    """A realization whose trained models were timed (`ov`: its overhead.csv rows, round times per batch) but whose
    throughput was not: the cost model's speed-up over AR at each cap on all its T = 0 records, decode only (no
    admission cost): a prediction, not a measurement."""
    times = round_times(ov[~ov.method.str.contains(":")])
    return _predicted_rows(_records(runs), times, caps, "predicted, trained models' stage times (decode only)",
                        lambda m: {f"round_ms_b{b}": v for b, v in sorted(times[m].items())})


def _predicted_rows(recs: dict, times: dict, caps, kind: str, extra) -> list[dict]:
    """The cost model's rows of kind `kind` at each cap, decode only (no admission cost), for every method with
    records and round times, beside AR (none without AR's); `extra(method)`: the row's own columns."""
    have = [m for m in recs if m in times]
    if "ar" not in have:
        return []
    rows = []
    for cap in caps:
        pred = predict({m: recs[m] for m in have}, times, cap)
        rows += [{"kind": kind, "method": m, "batch_cap": cap, "n_requests": len(recs[m]),
                  "predicted_speedup": pred[m]["speedup"], "predicted_tok_per_s": pred[m]["tok_per_s"],
                  "admit_ms": 0.0, **extra(m)} for m in have]
    return rows


def projection(runs: pd.DataFrame, ov: pd.DataFrame, caps=(1, 32), shape_name: str = SHAPE) -> list[dict]:
    """The realization's records (as in `predicted_vs_measured`) x a shape's round times at batch 8 (rows
    "<shape>:<run>", the labels of SHAPES), decode only, that one round time at every batch: the predicted
    speed-up over AR at each cap, for every run with a timing at that shape."""
    times = round_times(ov)
    recs = _records(runs)
    label = {m: SHAPES.get(shape_name, {}).get(m, f"{shape_name}:{m}") for m in recs}
    # batch 8's round time (AR at the 8B shape: its batch-1 step), used at every batch
    shape = {m: {SHAPE_BATCH: times[lab].get(SHAPE_BATCH, next(iter(times[lab].values())))}
             for m, lab in label.items() if lab in times}
    return _predicted_rows(recs, shape, caps, f"projection {shape_name}",
                        lambda m: {f"round_ms_b{SHAPE_BATCH}": shape[m][SHAPE_BATCH], "timing": label[m]})
