"""Data-parallel check: the profile's target pretrained on the same token budget by 1 process and by N processes
(torchrun, one per GPU), each in its own scratch folder, from the corpus and tokenizer already in the work folder.
N ranks should follow the 1-rank loss curve (same global batch, same data) in less time.

    dmtp pipeline --profile mini --stage corpus,tokenizer          # once (skipped when present)
    python -m experiments.dpcheck --profile mini --tokens 20000000 --out results/mini/multigpu    # N = the GPUs (>= 2)
    python -m experiments.dpcheck ... --control --control-seed 1          # + a noise floor: two more 1-process runs
    python -m experiments.dpcheck ... --split 60                          # + N processes to step 60, then 1 resumes
    python -m experiments.dpcheck --profile mini --replot results/mini/multigpu/curves.csv --out results/mini/multigpu
    python -m experiments.dpcheck --profile mini --pool run1/curves.csv run2/curves.csv --out results/mini/multigpu

Writes into --out: curves.csv (step, loss, mtp_loss, world: the history, averaged over ranks), summary.json (wall
seconds, training tokens/s per world size, speed-up, max and mean |difference| between the smoothed curves, held-out
losses) and loss_curves.png. Each run is exactly `dmtp pipeline --stage target` (1 process, then `python -m
dmtp.cli.torchrun`): what `make target NGPU=N` runs.

Noise floor. --control repeats the 1-process run (same seed: GPU nondeterminism amplified by training; bit-identical
on CPU); --control-seed S runs it with pretrain.seed=S (the seed-to-seed spread, the honest floor). Each control is
compared with the 1-process run as the N-process run is (curves.csv world "1-control", "1-control-seed<S>"; dashed).
Verdict: "within noise" when the N-vs-1 max and mean |smoothed difference| are both <= NOISE_FACTOR x the control's
+ NOISE_ATOL (float rounding), else "outside noise"; the reference is the seed control when there is one. It cannot
exclude a smaller bias: the signed mean difference per quarter of the run shows whether a difference keeps one sign.

Resume. --split K adds N processes stopped after step K, finished by 1 process (world "Nto1@K"), compared like a
control (summary.json "split").

Speed. The headline speed-up is the steady rate (tokens/s from 10 % of the run to its end): the whole-run rate
includes start-up, which is slower on a fresh machine.

--pool A/curves.csv B/curves.csv ... compares every pair of runs of several dpcheck runs of one configuration
(folders name the runs), grouped into "1 vs 1" (same-seed repeats: the nondeterminism floor), "N vs 1", "N vs N" and
"seed S vs 1"; writes pool.json and pool.png, "within noise" when the means over the N-vs-1 pairs are both <=
NOISE_FACTOR x the 1-vs-1 means + NOISE_ATOL.

--replot CURVES_CSV rebuilds loss_curves.png and summary_from_curves.json (difference statistics and verdict, no
timings) from a curves.csv, without training.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from dmtp.checks import require
from dmtp.io import environment, file_sha256, write_figure, write_json, write_text
from dmtp.schema import override
from dmtp.profiles import get_profile


def _log(msg):
    print(f"[dpcheck] {msg}", flush=True)


NOISE_FACTOR = 1.5  # the N-vs-1 difference may be this many times a control's ...
NOISE_ATOL = 1e-3  # ... plus this (nats) and still be "within noise"
REPEAT = "1-control"  # curves.csv / summary labels of the control runs


def run_kind(w) -> tuple[str, str | None]:
    """What a run label (curves.csv `world`) names: ("1", None), ("N", "<n>"), ("repeat", None), ("seed", "<S>") or
    ("split", "<n>to1@<K>")."""
    if isinstance(w, int):
        return ("1", None) if w == 1 else ("N", str(w))
    if w == REPEAT:
        return "repeat", None
    if w.startswith(REPEAT + "-seed"):
        return "seed", w[len(REPEAT) + 5:]
    if "to1@" in w:
        return "split", w
    raise ValueError(f"unknown run label {w!r}")


def run_world(world: int, prof, work: Path, scratch: Path, sets: list[str], label=None, fresh: bool = True,
              collect: bool = True) -> dict | None:
    """One `pipeline --stage target` run on `world` processes in scratch/world<label> (fresh: from nothing; else
    resuming what is there); returns its wall time, history and held-out (collect), or None (a stopped first part)."""
    label = world if label is None else label
    d = scratch / f"world{label}"
    wdir = d / "work" / prof.name
    if fresh:
        shutil.rmtree(d, ignore_errors=True)
        wdir.mkdir(parents=True)
        for name in ("tokenizer", "tokens"):  # the shared inputs, read-only
            (wdir / name).symlink_to((work / prof.name / name).resolve(), target_is_directory=True)
    launch = [sys.executable] if world == 1 else \
        [sys.executable, "-m", "dmtp.cli.torchrun", "--standalone", f"--nproc_per_node={world}"]
    cmd = launch + ["-m", "dmtp.cli.main", "pipeline", "--profile", prof.name, "--work", str(d / "work"),
                    "--results", str(d / "results"), "--stage", "target"] + [x for s in sets for x in ("--set", s)]
    _log(f"world {label}: {' '.join(cmd)}")
    t0 = time.time()
    p = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"))  # output streams through
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"the {label} run ({world} process(es)) failed (exit {p.returncode}); its output is above")
    if not collect:
        _log(f"world {label}: {world} process(es), {wall:.1f}s wall, stopped")
        return None
    res = d / "results" / prof.name / "target"
    ev = json.loads((res / "heldout.json").read_text())
    _log(f"world {label}: {wall:.1f}s wall, {ev['tokens_per_s']:,.0f} training tokens/s, "
         f"held-out loss {ev['target_loss']:.4f}")
    return {"wall_s": wall, "history": json.loads((res / "pretrain_history.json").read_text()), "heldout": ev}


def steady_tokens_per_s(history: list[dict]) -> float | None:
    """Training tokens/s between the history point at ~10 % of the run and the last one (no start-up steps)."""
    if len(history) < 3:
        return None
    a, b = history[len(history) // 10], history[-1]
    return (b["tokens"] - a["tokens"]) / (b["elapsed_s"] - a["elapsed_s"]) if b["elapsed_s"] > a["elapsed_s"] else None


def smooth(y, window: int):
    """Centred moving average over `window` history points (shorter at the ends)."""
    return pd.Series(y, dtype=float).rolling(window, center=True, min_periods=1).mean().to_numpy()


def _stats(diff, steps) -> dict:
    a = np.abs(diff)
    return {"steps": [int(steps[0]), int(steps[-1])], "max_abs": float(a.max()), "mean_abs": float(a.mean()),
            "mean_signed": float(diff.mean())}


def pair_diff(ref: list[dict], other: list[dict], window: int) -> dict:
    """|loss difference| of `other` against `ref` (two histories) after smoothing, at their common steps: whole run
    and per quarter of the common steps; signed = other - ref."""
    r = {h["step"]: h["loss"] for h in ref}
    steps = [h["step"] for h in other if h["step"] in r]
    require(steps, "two curves without a common step")
    a = smooth([r[s] for s in steps], window)
    b = smooth([h["loss"] for h in other if h["step"] in r], window)
    diff = b - a
    q = [i for i in np.array_split(np.arange(len(steps)), 4) if len(i)]
    return {"points": len(steps), **{k: v for k, v in _stats(diff, steps).items() if k != "steps"},
            "max_rel": float((np.abs(diff) / np.abs(a)).max()), "final_smoothed": [float(a[-1]), float(b[-1])],
            "quarters": [_stats(diff[i], [steps[j] for j in i]) for i in q]}


def compare(runs: dict, window: int) -> dict:
    """Every other curve (N ranks, controls) against the 1-rank curve: `pair_diff` by run label."""
    return {str(w): pair_diff(runs[1]["history"], r["history"], window) for w, r in runs.items() if w != 1}


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def verdict(diff: dict, n) -> dict | None:
    """N-vs-1 against the control runs in `diff` (see the module doc for the rule); None without a control."""
    controls = [k for k in diff if k.startswith(REPEAT)]
    if not controls:
        return None
    d = diff[str(n)]
    per = {}
    for c in controls:
        lim = {k: NOISE_FACTOR * diff[c][k] + NOISE_ATOL for k in ("max_abs", "mean_abs")}
        per[c] = {"max_abs": diff[c]["max_abs"], "mean_abs": diff[c]["mean_abs"],
                  **{f"ratio_{k}": ratio(d[f"{k}_abs"], diff[c][f"{k}_abs"]) for k in ("max", "mean")},
                  "verdict": "within noise" if all(d[k] <= lim[k] for k in lim) else "outside noise"}
    ref = next((c for c in controls if c != REPEAT), REPEAT)
    return {"verdict": per[ref]["verdict"], "reference": ref,
            "rule": f"within noise iff the {n}-vs-1 max and mean |smoothed loss difference| are both <= "
                    f"{NOISE_FACTOR} x the reference control's + {NOISE_ATOL} (reference: the seed control when "
                    f"present, else the same-seed repeat)",
            "factor": NOISE_FACTOR, "atol": NOISE_ATOL, "n_vs_1": {k: d[k] for k in ("max_abs", "mean_abs")},
            "controls": per}


def legend(w) -> str:
    kind, arg = run_kind(w)
    if kind == "repeat":
        return "1 process, repeat (control)"
    if kind == "seed":
        return f"1 process, seed {arg} (control)"
    if kind == "split":
        n, k = arg.split("to1@")
        return f"{n} processes to step {k}, then 1 (resumed)"
    return f"{w} process{'es' if w != 1 else ''}"


def plot(runs: dict, window: int, path: Path, title: str):
    fig = Figure(figsize=(7, 6.5))
    ax, dx = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ref = {h["step"]: h["loss"] for h in runs[1]["history"]}
    for w, r in runs.items():
        steps = [h["step"] for h in r["history"]]
        loss = [h["loss"] for h in r["history"]]
        ls = "--" if isinstance(w, str) else "-"  # the controls dashed
        line, = ax.plot(steps, smooth(loss, window), ls=ls, label=legend(w))
        if ls == "-":
            ax.plot(steps, loss, color=line.get_color(), alpha=0.25, lw=0.8)
        if w != 1:
            common = [s for s in steps if s in ref]
            d = smooth([dict(zip(steps, loss))[s] for s in common], window) - smooth([ref[s] for s in common], window)
            dx.plot(common, d, color=line.get_color(), ls=ls)
    ax.set_ylabel("training loss (main CE)")
    ax.legend()
    ax.set_title(title, fontsize=9)
    dx.axhline(0, color="k", lw=0.5)
    dx.set_xlabel("step (same global batch)")
    dx.set_ylabel("run - 1 process\n(smoothed)")
    fig.tight_layout()
    write_figure(path, fig, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.dpcheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--tokens", type=int, help="pretraining token budget of each run (required unless --replot)")
    ap.add_argument("--out", required=True, help="folder for curves.csv, summary.json, loss_curves.png")
    ap.add_argument("--work", default="work", help="work folder holding <profile>/tokenizer and <profile>/tokens")
    ap.add_argument("--nproc", type=int, help="processes of the data-parallel run (default: the GPUs, else 2)")
    ap.add_argument("--scratch", help="where the runs train (default: <work>/<profile>/dpcheck)")
    ap.add_argument("--points", type=int, default=100, help="history points per run (sets pretrain.log_every)")
    ap.add_argument("--smooth", type=int, default=0, help="moving-average window in history points (0: points/20)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="profile override for all runs")
    ap.add_argument("--control", action="store_true", help=f"also repeat the 1-process run: world {REPEAT!r}")
    ap.add_argument("--control-seed", type=int, metavar="S", help=f"also a 1-process run with pretrain.seed=S: world "
                    f"'{REPEAT}-seedS'")
    ap.add_argument("--split", type=int, metavar="K", help="also N processes to step K, then 1 to the end: 'Nto1@K'")
    ap.add_argument("--replot", metavar="CURVES_CSV", help="no training: replot this curves.csv into --out")
    ap.add_argument("--pool", nargs="+", metavar="CURVES_CSV", help="no training: pool several dpcheck runs' curves")
    a = ap.parse_args(argv)
    try:
        pool(a) if a.pool else replot(a) if a.replot else run(a)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
        print(f"dpcheck: error: {e}", file=sys.stderr)
        sys.exit(2)


def _title(prof, runs: dict, n, diff: dict, head: str, speed: str = "") -> str:
    t = f"{prof.name}: {head}, global batch {prof.pretrain.batch_size}\n{n} processes: {speed}max |smoothed loss " \
        f"diff| {diff[str(n)]['max_abs']:.3g}, mean {diff[str(n)]['mean_abs']:.3g}"
    kinds = {w: run_kind(w) for w in runs}
    c = [f"{'repeat' if k == 'repeat' else 'seed ' + arg} {diff[w]['max_abs']:.3g}, {diff[w]['mean_abs']:.3g}"
         for w, (k, arg) in kinds.items() if k in ("repeat", "seed")]
    sp = [f"{w}: {diff[w]['max_abs']:.3g}, {diff[w]['mean_abs']:.3g}" for w, (k, _) in kinds.items() if k == "split"]
    return t + ("\ncontrol 1-process runs (max, mean): " + "; ".join(c) if c else "") + \
        ("\nresumed on 1 process (max, mean): " + "; ".join(sp) if sp else "")


def read_curves(path: Path, strict: bool = True) -> dict:
    """curves.csv back into {world: {"history": [...]}} (world an int, or a control's label); strict: exactly the
    curves of world 1 and one N > 1 (and any controls)."""
    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: no such curves.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"step", "loss", "mtp_loss", "world"} <= set(rows[0]):
        raise ValueError(f"{path}: not a dpcheck curves.csv (columns step,loss,mtp_loss,world)")
    runs = {}
    for r in rows:
        w = int(r["world"]) if r["world"].isdigit() else r["world"]
        runs.setdefault(w, {"history": []})["history"].append(
            {"step": int(r["step"]), "loss": float(r["loss"]), "mtp_loss": float(r["mtp_loss"])})
    worlds = [w for w in runs if isinstance(w, int) and w > 1]
    if strict and (1 not in runs or len(worlds) != 1):
        raise ValueError(f"{path}: needs the curves of world 1 and of one N > 1, has {sorted(map(str, runs))}")
    return runs


def replot(a):
    prof = get_profile(a.profile)
    override(prof, a.set)
    src = Path(a.replot)
    runs = read_curves(src)
    n = next(w for w in runs if isinstance(w, int) and w > 1)
    window = a.smooth or max(1, len(runs[1]["history"]) // 20)
    diff = compare(runs, window)
    steps = len(runs[1]["history"])
    out = Path(a.out)
    summary = {"source": f"recomputed from {src.name} (no training): loss-difference statistics only; the timings, "
                         "speed-ups and held-out losses are not in curves.csv",
               "curves_csv": str(src), "curves_csv_sha256": file_sha256(src),
               "profile": prof.name, "nproc": n, "history_points": steps, "last_step": runs[1]["history"][-1]["step"],
               "global_batch": prof.pretrain.batch_size, "seq_len": prof.pretrain.seq_len,
               "smooth_window_points": window, "loss_difference": diff[str(n)],
               "control_loss_difference": {k: v for k, v in diff.items() if k != str(n)}, "noise": verdict(diff, n)}
    summary["verdict"] = summary["noise"]["verdict"] if summary["noise"] else None
    write_json(out / "summary_from_curves.json", summary)
    plot(runs, window, out / "loss_curves.png",
         _title(prof, runs, n, diff, f"{summary['last_step'] + 1} steps (replotted from {src.name})"))
    d = diff[str(n)]
    _log(f"replot of {src}: |smoothed loss difference| {n} vs 1 process max {d['max_abs']:.2e} mean "
         f"{d['mean_abs']:.2e} (signed {d['mean_signed']:+.2e})"
         + (f"; {summary['verdict']}" if summary["verdict"] else "") + f"; wrote {out}")
    return summary


# --- pooled check over several dpcheck runs ------------------------------------------------------------------------
def pool_groups(files: list[Path]) -> tuple[dict, int]:
    """The curves of several dpcheck runs (same profile, token budget and seed), labelled '<folder>:<world>' and
    grouped: "1" (every same-seed 1-process run: world 1 and the repeat controls), "<N>" (the N-process runs), "seed
    S" (seed controls) and "<N>to1@<K>" (split runs); and N."""
    runs, ns = {}, set()
    for f in files:
        for w, r in read_curves(f, strict=False).items():
            label = f"{f.parent.name}:{w}"
            if label in runs:
                raise ValueError(f"two runs labelled {label!r}: give curves.csv files in differently named folders")
            kind, arg = run_kind(w)
            if kind == "N":
                ns.add(w)
            group = "1" if kind in ("1", "repeat") else "seed " + arg if kind == "seed" else arg
            runs[label] = {"group": group, "kind": kind, "history": r["history"]}
    ones = [k for k, r in runs.items() if r["group"] == "1"]
    require(len(ns) == 1, f"--pool needs runs of exactly one N > 1 process count, found {sorted(ns) or 'none'}")
    require(len(ones) >= 2, f"--pool needs at least two same-seed 1-process runs (the nondeterminism floor), found "
                            f"{ones}: pool two dpcheck runs, or one run with --control")
    return runs, ns.pop()


def pool_compare(runs: dict, n: int, window: int) -> dict:
    """Pairwise smoothed loss differences, by kind of pair: "1 vs 1" (same-seed 1-process repeats: the noise floor),
    "N vs 1", "N vs N", "seed S vs 1"; per kind the pairs and the mean, min and max of their max and mean |diff|."""
    kinds = {}
    for (ka, a), (kb, b) in itertools.combinations(runs.items(), 2):
        ga, gb = a["group"], b["group"]
        if ga != "1" and gb == "1":
            (ka, a, ga), (kb, b, gb) = (kb, b, gb), (ka, a, ga)
        if ga != "1" and ga != gb:
            continue  # e.g. N vs a seed control: not a question the check asks
        kind = f"{gb} vs {ga}"
        d = pair_diff(a["history"], b["history"], window)
        kinds.setdefault(kind, []).append({"ref": ka, "other": kb, **{k: d[k] for k in
                                           ("points", "max_abs", "mean_abs", "mean_signed")}})
    first = ("1 vs 1", f"{n} vs 1", f"{n} vs {n}")
    order = lambda k: first.index(k) if k in first else 3 if k.startswith("seed") else 4  # noqa: E731
    out = {}
    for kind, pairs in sorted(kinds.items(), key=lambda kv: (order(kv[0]), kv[0])):
        agg = {f"{s}_{k}": f([p[k] for p in pairs]) for k in ("max_abs", "mean_abs")
               for s, f in (("mean", lambda v: sum(v) / len(v)), ("min", min), ("max", max))}
        agg["mean_mean_signed"] = sum(p["mean_signed"] for p in pairs) / len(pairs)  # a bias keeps one sign
        out[kind] = {"pairs": pairs, "n_pairs": len(pairs), **agg}
    floor, test = out["1 vs 1"], out[f"{n} vs 1"]
    lim = {k: NOISE_FACTOR * floor[f"mean_{k}"] + NOISE_ATOL for k in ("max_abs", "mean_abs")}
    v = "within noise" if all(test[f"mean_{k}"] <= lim[k] for k in lim) else "outside noise"
    return {"nproc": n, "kinds": out, "verdict": v,
            "rule": f"within noise iff the mean over the {n}-vs-1 pairs of max and of mean |smoothed loss diff| are "
                    f"both <= {NOISE_FACTOR} x the same means over the same-seed 1-vs-1 pairs + {NOISE_ATOL}",
            **{f"ratio_{k}": ratio(test[f"mean_{k}_abs"], floor[f"mean_{k}_abs"]) for k in ("max", "mean")}}


def plot_pool(runs: dict, res: dict, window: int, path: Path, title: str):
    fig = Figure(figsize=(11, 6.5))
    ax = fig.subplot_mosaic([["c", "p"], ["d", "p"]], gridspec_kw={"width_ratios": [2.2, 1], "height_ratios": [3, 1.3]})
    ones = [r for r in runs.values() if r["group"] == "1"]
    common = sorted(set.intersection(*[{h["step"] for h in r["history"]} for r in ones]))
    mean1 = np.mean([smooth([dict((h["step"], h["loss"]) for h in r["history"])[s] for s in common], window)
                     for r in ones], axis=0)
    ref = dict(zip(common, mean1))
    colour = {"1": colormaps["Blues"], str(res["nproc"]): colormaps["Oranges"]}
    seen = {}
    for label, r in runs.items():
        g = r["group"]
        i = seen[g] = seen.get(g, -1) + 1
        c = colour[g](0.45 + 0.5 * i / max(1, len(runs))) if g in colour else "0.5"
        ls = {"seed": "--", "split": "-."}.get(r["kind"], "-")
        c = "C2" if r["kind"] == "split" else c
        steps = [h["step"] for h in r["history"]]
        y = smooth([h["loss"] for h in r["history"]], window)
        name = f"{label} ({'1 process' if g == '1' else g + ' processes' if r['kind'] == 'N' else g})"
        ax["c"].plot(steps, y, color=c, ls=ls, lw=1.2, label=name)
        keep = [j for j, s in enumerate(steps) if s in ref]
        ax["d"].plot([steps[j] for j in keep], [y[j] - ref[steps[j]] for j in keep], color=c, ls=ls, lw=1)
    ax["c"].set_ylabel("training loss (main CE), smoothed")
    ax["c"].legend(fontsize=7)
    ax["c"].set_title(title, fontsize=9)
    ax["d"].axhline(0, color="k", lw=0.5)
    ax["d"].set_xlabel("step (same global batch)")
    ax["d"].set_ylabel("run - mean of the\n1-process runs")
    kinds = list(res["kinds"])
    for x, kind in enumerate(kinds):
        for p in res["kinds"][kind]["pairs"]:
            ax["p"].plot(x - 0.1, p["max_abs"], "v", color="C3", alpha=0.7)
            ax["p"].plot(x + 0.1, p["mean_abs"], "o", color="C0", alpha=0.7)
    ax["p"].plot([], [], "v", color="C3", label="max |diff| of a pair")
    ax["p"].plot([], [], "o", color="C0", label="mean |diff| of a pair")
    ax["p"].set_xticks(range(len(kinds)), kinds, rotation=20, fontsize=8)
    ax["p"].set_ylabel("smoothed loss difference (nats)")
    ax["p"].set_title(f"pairs of runs: {res['verdict']}", fontsize=9)
    ax["p"].legend(fontsize=7)
    fig.tight_layout()
    write_figure(path, fig, dpi=120)


def pool(a):
    prof = get_profile(a.profile)
    override(prof, a.set)
    files = [Path(f) for f in a.pool]
    runs, n = pool_groups(files)
    first = next(iter(runs.values()))["history"]
    window = a.smooth or max(1, len(first) // 20)
    res = pool_compare(runs, n, window)
    out = Path(a.out)
    summary = {"source": "pooled from the curves.csv files below (no training)", "profile": prof.name,
               "curves_csv": {str(f): file_sha256(f) for f in files},
               "runs": {k: r["group"] for k, r in runs.items()}, "smooth_window_points": window, **res}
    write_json(out / "pool.json", summary)
    k1, kn = res["kinds"]["1 vs 1"], res["kinds"][f"{n} vs 1"]
    plot_pool(runs, res, window, out / "pool.png",
              f"{prof.name}: {len(runs)} runs from {len(files)} dpcheck run(s); mean over pairs of max / mean "
              f"|smoothed diff|\nsame-seed 1 vs 1: {k1['mean_max_abs']:.3g} / {k1['mean_mean_abs']:.3g} "
              f"({k1['n_pairs']} pairs); {n} vs 1: {kn['mean_max_abs']:.3g} / {kn['mean_mean_abs']:.3g} "
              f"({kn['n_pairs']} pairs)")
    for kind, v in res["kinds"].items():
        _log(f"{kind}: {v['n_pairs']} pair(s), max |smoothed diff| mean {v['mean_max_abs']:.3g} (range "
             f"{v['min_max_abs']:.3g}-{v['max_max_abs']:.3g}), mean |smoothed diff| mean {v['mean_mean_abs']:.3g} "
             f"(range {v['min_mean_abs']:.3g}-{v['max_mean_abs']:.3g}), signed mean {v['mean_mean_signed']:+.3g}")
    _log(f"{n} vs 1 process: {res['verdict']} against the same-seed 1-process repeats; wrote {out}")
    return summary


def run(a):
    prof = get_profile(a.profile)
    require(a.tokens is not None, "--tokens is required (unless --replot)")
    work = Path(a.work)
    need = [work / prof.name / f for f in ("tokenizer/tokenizer.json", "tokens/train.npy", "tokens/heldout.npy")]
    if missing := [str(p) for p in need if not p.exists()]:
        raise FileNotFoundError(f"missing {', '.join(missing)}: run `dmtp pipeline --profile {prof.name} --work "
                                f"{work} --stage corpus,tokenizer` first")
    gpus = torch.cuda.device_count()
    n = a.nproc or (gpus if gpus > 1 else 2)
    require(n >= 2, f"--nproc {n}: the data-parallel run needs at least 2 processes")
    require(not (gpus and n > gpus), f"--nproc {n} but only {gpus} GPU(s) are visible")
    step_tokens = prof.pretrain.seq_len * prof.pretrain.batch_size
    steps = a.tokens // step_tokens
    require(steps >= 2, f"--tokens {a.tokens}: less than two steps of {step_tokens} tokens "
                        f"({prof.pretrain.batch_size} x {prof.pretrain.seq_len})")
    if a.split is not None and not 0 < a.split < steps:
        raise ValueError(f"--split {a.split}: the switch step must lie inside the run's {steps} steps")
    if prof.pretrain.batch_size % n:
        raise ValueError(f"the profile's global batch {prof.pretrain.batch_size} is not divisible by {n} processes")
    sets = [f"pretrain.tokens={a.tokens}"] + a.set
    for key, val in (("log_every", max(1, steps // a.points)), ("save_every", steps + 1)):  # no periodic state
        if not any(x.startswith(f"pretrain.{key}=") for x in a.set):
            sets.append(f"pretrain.{key}={val}")
    override(prof, sets)  # fail here on a bad --set, not inside the first run
    seed = prof.pretrain.seed
    scratch = Path(a.scratch) if a.scratch else work / prof.name / "dpcheck"
    plan = [(1, 1, sets), (n, n, sets)]
    if a.control:
        plan.append((REPEAT, 1, sets))
    if a.control_seed is not None:
        plan.append((f"{REPEAT}-seed{a.control_seed}", 1, sets + [f"pretrain.seed={a.control_seed}"]))
    _log(f"{prof.name}: {a.tokens:,} tokens = {steps} steps of {step_tokens:,} tokens, 1 vs {n} processes "
         f"({'nccl, ' + str(gpus) + ' GPU(s)' if gpus else 'gloo, CPU'})"
         + (f", controls {', '.join(str(w) for w, _, _ in plan[2:])}" if plan[2:] else "") + f"; scratch {scratch}")
    runs = {w: run_world(world, prof, work, scratch, s, label=w) for w, world, s in plan}
    split = f"{n}to1@{a.split}" if a.split else None
    if split:  # n processes to step K (resumable state), then 1 process resumes to the end
        run_world(n, prof, work, scratch, sets + [f"pretrain.stop_after={a.split}"], label=split, collect=False)
        runs[split] = run_world(1, prof, work, scratch, sets, label=split, fresh=False)

    window = a.smooth or max(1, len(runs[1]["history"]) // 20)
    diff = compare(runs, window)
    out = Path(a.out)
    rows = ["step,loss,mtp_loss,world"] + [f"{h['step']},{h['loss']:.6f},{h['mtp_loss']:.6f},{w}"
                                           for w, r in runs.items() for h in r["history"]]
    write_text(out / "curves.csv", "\n".join(rows) + "\n")
    per = {str(w): {"wall_s": round(r["wall_s"], 2), "tokens_per_s": r["heldout"]["tokens_per_s"],
                    "steady_tokens_per_s": steady_tokens_per_s(r["history"]),
                    "pretrain_wall_s": r["heldout"]["wall_s"], "train_tokens": r["heldout"]["train_tokens"],
                    "heldout_loss": r["heldout"]["target_loss"], "heldout_mtp_loss": r["heldout"]["mtp_loss"],
                    "heldout_tokens": r["heldout"]["heldout_tokens"]} for w, r in runs.items()}
    if split:  # its speed is the resumed part's only: not a rate of the whole run
        per[split].update(tokens_per_s=None, steady_tokens_per_s=None, first_world=n, switch_step=a.split,
                          then_world=1)
    for w, _, _ in plan[2:]:
        per[w].update(control="repeat" if w == REPEAT else "seed", seed=seed if w == REPEAT else a.control_seed)
    noise = verdict(diff, n)
    summary = {"profile": prof.name, "tokens": a.tokens, "steps": steps, "global_batch": prof.pretrain.batch_size,
               "seq_len": prof.pretrain.seq_len, "nproc": n, "backend": "nccl" if gpus else "gloo", "seed": seed,
               "runs": per,
               "speedup_tokens_per_s": per[str(n)]["tokens_per_s"] / per["1"]["tokens_per_s"],
               "speedup_steady_tokens_per_s": per[str(n)]["steady_tokens_per_s"] / per["1"]["steady_tokens_per_s"]
               if per[str(n)]["steady_tokens_per_s"] and per["1"]["steady_tokens_per_s"] else None,
               "speedup_wall": per["1"]["wall_s"] / per[str(n)]["wall_s"],
               "smooth_window_points": window, "loss_difference": diff[str(n)],
               "heldout_loss_difference": per[str(n)]["heldout_loss"] - per["1"]["heldout_loss"],
               "control_loss_difference": {k: v for k, v in diff.items() if k != str(n)},
               "control_heldout_loss_difference": {w: per[w]["heldout_loss"] - per["1"]["heldout_loss"]
                                                   for w, _, _ in plan[2:]},
               "noise": noise, "verdict": noise["verdict"] if noise else None,
               "split": {"label": split, "loss_difference": diff[split],
                         "heldout_loss_difference": per[split]["heldout_loss"] - per["1"]["heldout_loss"]}
               if split else None,
               "scratch": str(scratch), "env": environment()}
    write_json(out / "summary.json", summary)
    steady = summary["speedup_steady_tokens_per_s"]
    plot(runs, window, out / "loss_curves.png",
         _title(prof, runs, n, diff, f"{a.tokens / 1e6:g} M tokens",
                f"x{steady:.2f} steady tokens/s, " if steady else f"x{summary['speedup_tokens_per_s']:.2f} tokens/s, "))
    _log((f"speed-up x{steady:.2f} (steady training tokens/s), " if steady else "speed-up ")
         + f"x{summary['speedup_tokens_per_s']:.2f} (training tokens/s incl. start-up), x{summary['speedup_wall']:.2f} "
         f"(wall); |smoothed loss difference| max {diff[str(n)]['max_abs']:.2e} mean {diff[str(n)]['mean_abs']:.2e}; "
         f"held-out {per['1']['heldout_loss']:.4f} vs {per[str(n)]['heldout_loss']:.4f}; wrote {out}")
    for w, _, _ in plan[2:]:
        _log(f"control {w}: |smoothed loss difference| vs 1 process max {diff[w]['max_abs']:.2e} mean "
             f"{diff[w]['mean_abs']:.2e}; held-out {per[w]['heldout_loss']:.4f}")
    if split:
        d = diff[split]
        _log(f"{split} ({n} processes to step {a.split}, then 1 resumes): |smoothed loss difference| vs 1 process max "
             f"{d['max_abs']:.2e} mean {d['mean_abs']:.2e}; held-out {per[split]['heldout_loss']:.4f}")
    if noise:
        _log(f"{n} vs 1 process: {noise['verdict']} (reference {noise['reference']}: x{NOISE_FACTOR} + {NOISE_ATOL})")
    return summary


if __name__ == "__main__":
    main()
