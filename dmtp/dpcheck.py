"""Data-parallel check: the profile's target pretrained on the same token budget by 1 process and by N processes
(torchrun, one per GPU), each in its own scratch folder, from the corpus and tokenizer already in the work folder.
N ranks should follow the 1-rank loss curve (same global batch, same data) in less time.

    dmtp pipeline --profile mini --stage corpus,tokenizer          # once (skipped when present)
    python -m dmtp.dpcheck --profile mini --tokens 20000000 --out results/mini/multigpu    # N = the GPUs (>= 2)
    python -m dmtp.dpcheck ... --control --control-seed 1          # + a noise floor: two more 1-process runs
    python -m dmtp.dpcheck --profile mini --replot results/mini/multigpu/curves.csv --out results/mini/multigpu

Writes into --out, atomically: curves.csv (step, loss, mtp_loss, world: the training history, averaged over ranks),
summary.json (wall seconds, training tokens/s per world size, speed-up, max and mean |loss difference| between the
smoothed curves, each run's final held-out loss) and loss_curves.png. Each run is exactly `dmtp pipeline --stage
target` (1 process, then `python -m torch.distributed.run`), so the check measures what `make target NGPU=N` runs.

Noise floor. --control runs the 1-process configuration again (same settings and seed: on GPU this measures
nondeterminism amplified by training; on CPU it is bit-identical), --control-seed S a 1-process run with
pretrain.seed=S (another initialisation and data order: the seed-to-seed spread, the honest noise floor); either or
both. Their curves are compared with the first 1-process run exactly as the N-process curve is (curves.csv world
"1-control" and "1-control-seed<S>"; dashed in the figure) and summary.json gets a verdict: "within noise" when the
N-vs-1 max and mean |smoothed loss difference| are both <= NOISE_FACTOR (1.5) x the control's plus NOISE_ATOL (1e-3,
float rounding: 2 CPU ranks differ from 1 by ~1e-7), else "outside noise". The reference control is the seed
control when there is one, else the repeat; every control's own verdict is listed too. "Within noise" means the
N-process curve is no further from the 1-process one than a control run is; it cannot exclude a smaller bias (the
signed mean difference, per quarter of the run, shows whether a difference keeps one sign).

--replot CURVES_CSV rebuilds loss_curves.png and summary_from_curves.json (the loss-difference statistics and the
verdict only, no timings) from an existing curves.csv with the same code, without training or a work folder.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _log(msg):
    print(f"[dpcheck] {msg}", flush=True)


NOISE_FACTOR = 1.5  # the N-vs-1 difference may be this many times a control's ...
NOISE_ATOL = 1e-3  # ... plus this (nats) and still be "within noise"
REPEAT = "1-control"  # curves.csv / summary labels of the control runs


def seed_label(seed: int) -> str:
    return f"{REPEAT}-seed{seed}"


def run_world(world: int, prof, work: Path, scratch: Path, sets: list[str], label=None) -> dict:
    """One fresh `pipeline --stage target` run on `world` processes; returns its wall time, history and held-out."""
    label = world if label is None else label
    d = scratch / f"world{label}"
    shutil.rmtree(d, ignore_errors=True)
    wdir = d / "work" / prof.name
    wdir.mkdir(parents=True)
    for name in ("tokenizer", "tokens"):  # the shared inputs, read-only
        (wdir / name).symlink_to((work / prof.name / name).resolve(), target_is_directory=True)
    launch = [sys.executable] if world == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    cmd = launch + ["-m", "dmtp.cli", "pipeline", "--profile", prof.name, "--work", str(d / "work"),
                    "--results", str(d / "results"), "--stage", "target"] + [x for s in sets for x in ("--set", s)]
    _log(f"world {label}: {' '.join(cmd)}")
    t0 = time.time()
    p = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"))  # output streams through
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"the {label} run ({world} process(es)) failed (exit {p.returncode}); its output is above")
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
    import pandas as pd

    return pd.Series(y, dtype=float).rolling(window, center=True, min_periods=1).mean().to_numpy()


def _stats(diff, steps) -> dict:
    import numpy as np

    a = np.abs(diff)
    return {"steps": [int(steps[0]), int(steps[-1])], "max_abs": float(a.max()), "mean_abs": float(a.mean()),
            "mean_signed": float(diff.mean())}


def compare(runs: dict, window: int) -> dict:
    """|loss difference| of every other curve (N ranks, controls) against the 1-rank curve, after smoothing, at the
    common steps: whole run and per quarter of the common steps; signed = other - 1 rank."""
    import numpy as np

    ref = {h["step"]: h["loss"] for h in runs[1]["history"]}
    out = {}
    for w, r in runs.items():
        if w == 1:
            continue
        steps = [h["step"] for h in r["history"] if h["step"] in ref]
        a = smooth([ref[s] for s in steps], window)
        b = smooth([h["loss"] for h in r["history"] if h["step"] in ref], window)
        diff = b - a
        q = [i for i in np.array_split(np.arange(len(steps)), 4) if len(i)]
        out[str(w)] = {"points": len(steps), **{k: v for k, v in _stats(diff, steps).items() if k != "steps"},
                       "max_rel": float((np.abs(diff) / np.abs(a)).max()),
                       "final_smoothed": [float(a[-1]), float(b[-1])],
                       "quarters": [_stats(diff[i], [steps[j] for j in i]) for i in q]}
    return out


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
                  "ratio_max": d["max_abs"] / diff[c]["max_abs"] if diff[c]["max_abs"] else None,
                  "ratio_mean": d["mean_abs"] / diff[c]["mean_abs"] if diff[c]["mean_abs"] else None,
                  "verdict": "within noise" if all(d[k] <= lim[k] for k in lim) else "outside noise"}
    ref = next((c for c in controls if c != REPEAT), REPEAT)
    return {"verdict": per[ref]["verdict"], "reference": ref,
            "rule": f"within noise iff the {n}-vs-1 max and mean |smoothed loss difference| are both <= "
                    f"{NOISE_FACTOR} x the reference control's + {NOISE_ATOL} (reference: the seed control when "
                    f"present, else the same-seed repeat)",
            "factor": NOISE_FACTOR, "atol": NOISE_ATOL, "n_vs_1": {k: d[k] for k in ("max_abs", "mean_abs")},
            "controls": per}


def legend(w) -> str:
    if w == REPEAT:
        return "1 process, repeat (control)"
    if isinstance(w, str) and w.startswith(REPEAT + "-seed"):
        return f"1 process, seed {w[len(REPEAT) + 5:]} (control)"
    return f"{w} process{'es' if w != 1 else ''}"


def plot(runs: dict, window: int, path: Path, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .io import atomic_path

    fig, (ax, dx) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
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
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dmtp.dpcheck", description=__doc__,
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
    ap.add_argument("--control", action="store_true",
                    help=f"also repeat the 1-process run (same seed): world {REPEAT!r}, the nondeterminism floor")
    ap.add_argument("--control-seed", type=int, metavar="S",
                    help=f"also a 1-process run with pretrain.seed=S: world '{REPEAT}-seedS', the seed-to-seed spread")
    ap.add_argument("--replot", metavar="CURVES_CSV", help="no training: loss_curves.png and summary_from_curves.json "
                                                           "into --out from this curves.csv")
    a = ap.parse_args(argv)
    try:
        replot(a) if a.replot else run(a)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
        print(f"dpcheck: error: {e}", file=sys.stderr)
        sys.exit(2)


def _title(prof, runs: dict, n, diff: dict, head: str, speed: str = "") -> str:
    t = f"{prof.name}: {head}, global batch {prof.pretrain.batch_size}\n{n} processes: {speed}max |smoothed loss " \
        f"diff| {diff[str(n)]['max_abs']:.3g}, mean {diff[str(n)]['mean_abs']:.3g}"
    c = [f"{'repeat' if w == REPEAT else 'seed ' + w[len(REPEAT) + 5:]} {diff[w]['max_abs']:.3g}, "
         f"{diff[w]['mean_abs']:.3g}" for w in runs if isinstance(w, str)]
    return t + ("\ncontrol 1-process runs (max, mean): " + "; ".join(c) if c else "")


def read_curves(path: Path) -> dict:
    """curves.csv back into {world: {"history": [...]}} (world an int, or a control's label)."""
    import csv

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
    if 1 not in runs or len(worlds) != 1:
        raise ValueError(f"{path}: needs the curves of world 1 and of one N > 1, has {sorted(map(str, runs))}")
    return runs


def replot(a):
    import hashlib

    from experiments.profiles import get_profile, override

    from .io import write_json

    prof = get_profile(a.profile)
    override(prof, a.set)
    src = Path(a.replot)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such curves.csv")
    runs = read_curves(src)
    n = next(w for w in runs if isinstance(w, int) and w > 1)
    window = a.smooth or max(1, len(runs[1]["history"]) // 20)
    diff = compare(runs, window)
    steps = len(runs[1]["history"])
    out = Path(a.out)
    summary = {"source": f"recomputed from {src.name} (no training): loss-difference statistics only; the timings, "
                         "speed-ups and held-out losses are not in curves.csv",
               "curves_csv": str(src), "curves_csv_sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
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


def run(a):
    import torch

    from experiments.profiles import get_profile, override

    from .io import environment, write_json, write_text

    prof = get_profile(a.profile)
    if a.tokens is None:
        raise ValueError("--tokens is required (unless --replot)")
    work = Path(a.work)
    need = [work / prof.name / "tokenizer" / "tokenizer.json", work / prof.name / "tokens" / "train.npy",
            work / prof.name / "tokens" / "heldout.npy"]
    if missing := [str(p) for p in need if not p.exists()]:
        raise FileNotFoundError(f"missing {', '.join(missing)}: run `dmtp pipeline --profile {prof.name} --work "
                                f"{work} --stage corpus,tokenizer` first")
    gpus = torch.cuda.device_count()
    n = a.nproc or (gpus if gpus > 1 else 2)
    if n < 2:
        raise ValueError(f"--nproc {n}: the data-parallel run needs at least 2 processes")
    if gpus and n > gpus:
        raise ValueError(f"--nproc {n} but only {gpus} GPU(s) are visible")
    step_tokens = prof.pretrain.seq_len * prof.pretrain.batch_size
    steps = a.tokens // step_tokens
    if steps < 2:
        raise ValueError(f"--tokens {a.tokens}: less than two steps of {step_tokens} tokens "
                         f"({prof.pretrain.batch_size} x {prof.pretrain.seq_len})")
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
        plan.append((seed_label(a.control_seed), 1, sets + [f"pretrain.seed={a.control_seed}"]))
    _log(f"{prof.name}: {a.tokens:,} tokens = {steps} steps of {step_tokens:,} tokens, 1 vs {n} processes "
         f"({'nccl, ' + str(gpus) + ' GPU(s)' if gpus else 'gloo, CPU'})"
         + (f", controls {', '.join(str(w) for w, _, _ in plan[2:])}" if plan[2:] else "") + f"; scratch {scratch}")
    runs = {w: run_world(world, prof, work, scratch, s, label=w) for w, world, s in plan}

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
    for w, _, _ in plan[2:]:
        per[w].update(control="repeat" if w == REPEAT else "seed",
                      seed=seed if w == REPEAT else a.control_seed)
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
               "scratch": str(scratch), "env": environment()}
    write_json(out / "summary.json", summary)
    plot(runs, window, out / "loss_curves.png",
         _title(prof, runs, n, diff, f"{a.tokens / 1e6:g} M tokens",
                f"x{summary['speedup_tokens_per_s']:.2f} tokens/s, "))
    _log(f"speed-up x{summary['speedup_tokens_per_s']:.2f} (training tokens/s), x{summary['speedup_wall']:.2f} "
         f"(wall); |smoothed loss difference| max {diff[str(n)]['max_abs']:.2e} mean {diff[str(n)]['mean_abs']:.2e}; "
         f"held-out {per['1']['heldout_loss']:.4f} vs {per[str(n)]['heldout_loss']:.4f}; wrote {out}")
    for w, _, _ in plan[2:]:
        _log(f"control {w}: |smoothed loss difference| vs 1 process max {diff[w]['max_abs']:.2e} mean "
             f"{diff[w]['mean_abs']:.2e}; held-out {per[w]['heldout_loss']:.4f}")
    if noise:
        _log(f"{n} vs 1 process: {noise['verdict']} (reference {noise['reference']}: x{NOISE_FACTOR} + {NOISE_ATOL})")
    return summary


if __name__ == "__main__":
    main()
