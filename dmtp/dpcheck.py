"""Data-parallel check: the profile's target pretrained on the same token budget by 1 process and by N processes
(torchrun, one per GPU), each in its own scratch folder, from the corpus and tokenizer already in the work folder.
N ranks should follow the 1-rank loss curve (same global batch, same data) in less time.

    dmtp pipeline --profile mini --stage corpus,tokenizer          # once (skipped when present)
    python -m dmtp.dpcheck --profile mini --tokens 20000000 --out results/mini/multigpu    # N = the GPUs (>= 2)

Writes into --out, atomically: curves.csv (step, loss, mtp_loss, world: the training history, averaged over ranks),
summary.json (wall seconds, training tokens/s per world size, speed-up, max and mean |loss difference| between the
smoothed curves, each run's final held-out loss) and loss_curves.png. Each run is exactly `dmtp pipeline --stage
target` (1 process, then `python -m torch.distributed.run`), so the check measures what `make target NGPU=N` runs.
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


def run_world(world: int, prof, work: Path, scratch: Path, sets: list[str]) -> dict:
    """One fresh `pipeline --stage target` run on `world` processes; returns its wall time, history and held-out."""
    d = scratch / f"world{world}"
    shutil.rmtree(d, ignore_errors=True)
    wdir = d / "work" / prof.name
    wdir.mkdir(parents=True)
    for name in ("tokenizer", "tokens"):  # the shared inputs, read-only
        (wdir / name).symlink_to((work / prof.name / name).resolve(), target_is_directory=True)
    launch = [sys.executable] if world == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    cmd = launch + ["-m", "dmtp.cli", "pipeline", "--profile", prof.name, "--work", str(d / "work"),
                    "--results", str(d / "results"), "--stage", "target"] + [x for s in sets for x in ("--set", s)]
    _log(f"world {world}: {' '.join(cmd)}")
    t0 = time.time()
    p = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"))  # output streams through
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"the {world}-process run failed (exit {p.returncode}); its output is above")
    res = d / "results" / prof.name / "target"
    ev = json.loads((res / "heldout.json").read_text())
    _log(f"world {world}: {wall:.1f}s wall, {ev['tokens_per_s']:,.0f} training tokens/s, "
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


def compare(runs: dict, window: int) -> dict:
    """|loss difference| of every N-rank curve against the 1-rank curve, after smoothing, at the common steps."""
    import numpy as np

    ref = {h["step"]: h["loss"] for h in runs[1]["history"]}
    out = {}
    for w, r in runs.items():
        if w == 1:
            continue
        steps = [h["step"] for h in r["history"] if h["step"] in ref]
        a = smooth([ref[s] for s in steps], window)
        b = smooth([h["loss"] for h in r["history"] if h["step"] in ref], window)
        diff = np.abs(b - a)
        out[str(w)] = {"points": len(steps), "max_abs": float(diff.max()), "mean_abs": float(diff.mean()),
                       "max_rel": float((diff / np.abs(a)).max()), "final_smoothed": [float(a[-1]), float(b[-1])]}
    return out


def plot(runs: dict, window: int, path: Path, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .io import atomic_path

    fig, (ax, dx) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ref = {h["step"]: h["loss"] for h in runs[1]["history"]}
    for w, r in runs.items():
        steps = [h["step"] for h in r["history"]]
        loss = [h["loss"] for h in r["history"]]
        line, = ax.plot(steps, smooth(loss, window), label=f"{w} process{'es' if w > 1 else ''}")
        ax.plot(steps, loss, color=line.get_color(), alpha=0.25, lw=0.8)
        if w > 1:
            common = [s for s in steps if s in ref]
            d = smooth([dict(zip(steps, loss))[s] for s in common], window) - smooth([ref[s] for s in common], window)
            dx.plot(common, d, color=line.get_color())
    ax.set_ylabel("training loss (main CE)")
    ax.legend()
    ax.set_title(title, fontsize=9)
    dx.axhline(0, color="k", lw=0.5)
    dx.set_xlabel("step (same global batch)")
    dx.set_ylabel("N - 1 (smoothed)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dmtp.dpcheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--tokens", type=int, required=True, help="pretraining token budget of each run")
    ap.add_argument("--out", required=True, help="folder for curves.csv, summary.json, loss_curves.png")
    ap.add_argument("--work", default="work", help="work folder holding <profile>/tokenizer and <profile>/tokens")
    ap.add_argument("--nproc", type=int, help="processes of the data-parallel run (default: the GPUs, else 2)")
    ap.add_argument("--scratch", help="where the two runs train (default: <work>/<profile>/dpcheck)")
    ap.add_argument("--points", type=int, default=100, help="history points per run (sets pretrain.log_every)")
    ap.add_argument("--smooth", type=int, default=0, help="moving-average window in history points (0: points/20)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="profile override for both runs")
    a = ap.parse_args(argv)
    try:
        run(a)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
        print(f"dpcheck: error: {e}", file=sys.stderr)
        sys.exit(2)


def run(a):
    import torch

    from experiments.profiles import get_profile, override

    from .io import environment, write_json, write_text

    prof = get_profile(a.profile)
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
    scratch = Path(a.scratch) if a.scratch else work / prof.name / "dpcheck"
    _log(f"{prof.name}: {a.tokens:,} tokens = {steps} steps of {step_tokens:,} tokens, 1 vs {n} processes "
         f"({'nccl, ' + str(gpus) + ' GPU(s)' if gpus else 'gloo, CPU'}); scratch {scratch}")
    runs = {w: run_world(w, prof, work, scratch, sets) for w in (1, n)}

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
    summary = {"profile": prof.name, "tokens": a.tokens, "steps": steps, "global_batch": prof.pretrain.batch_size,
               "seq_len": prof.pretrain.seq_len, "nproc": n, "backend": "nccl" if gpus else "gloo",
               "runs": per,
               "speedup_tokens_per_s": per[str(n)]["tokens_per_s"] / per["1"]["tokens_per_s"],
               "speedup_steady_tokens_per_s": per[str(n)]["steady_tokens_per_s"] / per["1"]["steady_tokens_per_s"]
               if per[str(n)]["steady_tokens_per_s"] and per["1"]["steady_tokens_per_s"] else None,
               "speedup_wall": per["1"]["wall_s"] / per[str(n)]["wall_s"],
               "smooth_window_points": window, "loss_difference": diff[str(n)],
               "heldout_loss_difference": per[str(n)]["heldout_loss"] - per["1"]["heldout_loss"],
               "scratch": str(scratch), "env": environment()}
    write_json(out / "summary.json", summary)
    plot(runs, window, out / "loss_curves.png",
         f"{prof.name}: {a.tokens / 1e6:g} M tokens, global batch {prof.pretrain.batch_size}; "
         f"{n} processes: x{summary['speedup_tokens_per_s']:.2f} tokens/s, "
         f"max |smoothed loss diff| {diff[str(n)]['max_abs']:.3g}")
    _log(f"speed-up x{summary['speedup_tokens_per_s']:.2f} (training tokens/s), x{summary['speedup_wall']:.2f} "
         f"(wall); |smoothed loss difference| max {diff[str(n)]['max_abs']:.2e} mean {diff[str(n)]['mean_abs']:.2e}; "
         f"held-out {per['1']['heldout_loss']:.4f} vs {per[str(n)]['heldout_loss']:.4f}; wrote {out}")
    return summary


if __name__ == "__main__":
    main()
