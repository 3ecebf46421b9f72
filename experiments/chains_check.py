"""Can several realizations' chains share one GPU? K copies of a reduced `mini` chain (target, on-policy data, two
drafters, HumanEval at T = 0) run at once as K processes on one card, for each K given: each stage's wall time per
chain, and whether every chain's outputs (target and drafter weights, data, evaluation records) equal the lone
chain's bit for bit.

    python -m experiments.chains_check --work /tmp/cw --out /tmp/chains                     # K = 1, 2, 3 (one GPU)
    python -m experiments.chains_check --work /tmp/cw --out /tmp/chains --k 1,2 --profile smoke   # CPU, a minute
    python -m experiments.chains_check --work /tmp/cw --out /tmp/t --k 1 --stages target   # two lone pretrainings

The corpus and tokenizer are built once in --work and copied into each chain's work folder; each chain runs `--stage
target,data,drafters,eval` with the slice's settings (--set replaces the same key). Writes OUT/chains.json and
OUT/chains.csv (K, chain, stage, seconds) and prints per K the median stage times, the throughput gain K x t1 / tK
and the chains whose outputs differ. An untimed lone chain runs first (unless `--no-warm-up`) so K = 1 is not charged
the compiles; its outputs are compared too. A failed chain is recorded with its error line. For a differing chain,
where its target parted from the lone chain's is printed (`--set pretrain.log_every=1` for every step), and so is
every op PyTorch's warn-only mode reported as nondeterministic. Exit status 0 only when every chain finished with the
lone chain's outputs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dmtp.io import environment, iter_jsonl, write_json, write_text

SLICE = {  # a reduced chain of the profile: every stage, each a minute or less on one GPU
    "mini": ["pretrain.tokens=4000000", "pretrain.unloop_steps=20", "data.prompts=2048", "data.samples=1",
             "train.steps=100", "train.save_every=100", "ablation.only=ar,dflash,zero_init_residual",
             "ablation.seeds=[0]", "eval.temperatures=[0.0]", "eval.ood={}"],
    "smoke": ["ablation.only=ar,dflash", "ablation.seeds=[0]", "eval.temperatures=[0.0]", "eval.modes=[\"natural\"]",
              "eval.subsets={}"],
}
STAGES = ("target", "data", "drafters", "eval")
NONDETERMINISTIC = re.compile(r"[^\n]*(does not have a deterministic implementation|defaults to a non-deterministic"
                              r" algorithm)[^\n]*")  # PyTorch's warnings in warn-only deterministic mode
RECORD_KEYS = ("id", "output_ids", "accepted", "stop_reason")  # what a record says was decoded (no timings)


def pipeline(profile: str, work: Path, results: Path, stages: str, sets: list[str]) -> list[str]:
    return [sys.executable, "-m", "dmtp.cli", "pipeline", "--profile", profile, "--work", str(work), "--results",
            str(results), "--stage", stages] + [x for s in sets for x in ("--set", s)]


def folder(profile: str, sets: list[str]) -> str:
    out = subprocess.run([sys.executable, "-m", "dmtp.profiles", profile, "folder", *sets], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def digests(work: Path, results: Path) -> dict[str, str]:
    """What a chain made, as digests: weights files whole, the data and the records by what they decoded."""
    out = {}
    for p in sorted(work.rglob("*.safetensors")):
        out[str(p.relative_to(work))] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    for p in sorted(list(work.rglob("data/train.jsonl")) + list(results.rglob("runs/**/*.jsonl"))):
        h = hashlib.sha256()
        for _, r in iter_jsonl(p):
            h.update(json.dumps([r.get(k) for k in RECORD_KEYS]).encode())
        root = work if p.is_relative_to(work) else results
        out[str(p.relative_to(root))] = h.hexdigest()[:16]
    return out


def first_difference(a: Path, b: Path) -> str | None:
    """Where two chains' targets part (`a`, `b`: their results/<profile>/<realization>/target folders): the first
    logged step of pretraining, then of the unlikelihood step, whose values differ (timings, `*_s`, aside), else the
    held-out evaluation; None when every logged value agrees. A first difference at step 0 points at the forward
    pass or the data, a later one at the backward pass or the optimizer."""
    def read(d: Path, name: str):
        return json.loads((d / name).read_text()) if (d / name).exists() else None

    for name in ("pretrain_history.json", "unloop_history.json"):
        for ra, rb in zip(read(a, name) or [], read(b, name) or []):
            diff = [f"{k} {v!r} vs {rb.get(k)!r}" for k, v in ra.items() if not k.endswith("_s") and rb.get(k) != v]
            if diff:
                return f"{name.split('_')[0]} step {ra.get('step')}: {', '.join(diff)}"
    ha, hb = read(a, "heldout.json") or {}, read(b, "heldout.json") or {}
    for part in ("before_unloop", None):
        xa, xb = (ha.get(part, {}), hb.get(part, {})) if part else (ha, hb)
        diff = [f"{k} {v!r} vs {xb.get(k)!r}" for k, v in xa.items() if isinstance(v, float) and not k.endswith("_s")
                and xb.get(k) != v]
        if diff:
            return f"held-out evaluation{' before the unlikelihood step' if part else ''}: {', '.join(diff)}"
    return None


def run_k(k: int, a, base: Path, sub: str, sets: list[str], tag: str = "") -> list[dict]:
    """K chains at once; per chain its stage times, wall time and output digests."""
    procs = []
    for i in range(1, k + 1):
        d = Path(a.out) / (tag or f"k{k}") / f"c{i}"
        shutil.rmtree(d, ignore_errors=True)
        (d / "work" / sub).mkdir(parents=True)
        for name in ("corpus", "tokenizer", "tokens", "preflight.json"):
            src = base / sub / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, d / "work" / sub / name)
        cmd = pipeline(a.profile, d / "work", d / "results", a.stages, sets)
        procs.append((i, d, time.perf_counter(), subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                                  text=True)))
    out = []
    for i, d, t0, p in procs:
        text = p.communicate()[0]
        rc = p.returncode
        wall = time.perf_counter() - t0
        write_text(d / "log.txt", text)
        name = f"{tag or f'K={k}'} chain {i}"
        row = {"k": k, "chain": i, "wall_s": round(wall, 1), "target": str(d / "results" / sub / "target"),
               **({"tag": tag} if tag else {})}
        if rc:  # recorded, and the other counts still run: e.g. K chains that do not fit the card's memory
            err = next((x for x in reversed(text.splitlines()) if "error" in x), f"exit {rc}")[:300]
            print(f"{name} failed (exit {rc}): {err}", flush=True)
            out.append(dict(row, stages={}, failed=err, digests={}))
            continue
        times = {m.group(1): float(m.group(2)) for m in re.finditer(r"stage (\w+) done in ([\d.]+)s", text)}
        row["nondeterministic"] = sorted({m.group(0).strip()[:200] for m in NONDETERMINISTIC.finditer(text)})
        for line in row["nondeterministic"]:  # PyTorch's warn-only mode names each op it could not make deterministic
            print(f"{name} warned: {line}", flush=True)
        out.append(dict(row, stages=times, digests=digests(d / "work", d / "results")))
        print(f"{name}: {wall:.0f} s ({', '.join(f'{s} {t:.0f}' for s, t in times.items())})", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="where the corpus and tokenizer are built once")
    ap.add_argument("--out", required=True, help="chains' folders, chains.json, chains.csv")
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--k", default="1,2,3", help="chain counts, in order (the first is the reference: 1)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="replaces the same key of the slice")
    ap.add_argument("--stages", default=",".join(STAGES), help="the stages each chain runs, from the target "
                    f"on (default {','.join(STAGES)}; target alone: do two processes pretrain the same target?)")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="no untimed lone chain first (its "
                    "compiles fill the cache, so K = 1 is timed as warm as the chains after it)")
    a = ap.parse_args(argv)
    ks = [int(x) for x in a.k.split(",")]
    if ks[0] != 1:
        raise SystemExit("--k: the first count is the lone chain, 1")
    given = {x.split("=", 1)[0] for x in a.set}  # a key given here replaces the slice's
    sets = [x for x in SLICE.get(a.profile, []) if x.split("=", 1)[0] not in given] + a.set
    base = Path(a.work)
    sub = folder(a.profile, sets)
    t0 = time.perf_counter()
    subprocess.run(pipeline(a.profile, base, base / "results", "corpus,tokenizer", sets), check=True)
    prep = time.perf_counter() - t0
    warm = run_k(1, a, base, sub, sets, tag="warm-up") if a.warm_up else []  # fills the compile cache: K = 1 then
    # starts as warm as the chains after it; its outputs are compared too (a cold compile against a cached one)
    rows = [r for k in ks for r in run_k(k, a, base, sub, sets)]
    ref = rows[0]
    if "failed" in ref:
        raise SystemExit(f"the lone chain failed: {ref['failed']}")
    rows = warm + rows
    for r in rows:
        r["differs"] = [] if "failed" in r else sorted(x for x in set(ref["digests"]) | set(r["digests"])
                              if ref["digests"].get(x) != r["digests"].get(x))
        if r["differs"]:
            r["first_difference"] = first_difference(Path(ref["target"]), Path(r["target"]))
    summary = []
    for k in ks:
        mine = [r for r in rows if r["k"] == k and "tag" not in r]
        ok = [r for r in mine if "failed" not in r]
        med = lambda f: statistics.median(map(f, ok)) if ok else float("nan")  # noqa: E731
        row = {"k": k, "wall_s": med(lambda r: r["wall_s"]),
               "chains_differing": [r["chain"] for r in mine if r["differs"]],
               "chains_failed": [r["chain"] for r in mine if "failed" in r]}
        row |= {s: med(lambda r: r["stages"].get(s, float("nan"))) for s in STAGES}
        row["throughput_x"] = round(k * ref["wall_s"] / row["wall_s"], 2) if ok and not row["chains_failed"] \
            else float("nan")  # a count with a failed chain did not deliver K chains' outputs
        summary.append(row)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    write_json(Path(a.out) / "chains.json", {"profile": a.profile, "sets": sets, "prepare_s": round(prep, 1),
                                              "environment": environment(), "summary": summary,
                                              "chains": [{k: v for k, v in r.items() if k != "digests"} | {
                                                  "outputs": len(r["digests"])} for r in rows]})
    table = [["k", "chain", "stage", "seconds"]]
    for r in rows:
        table += [[r["k"], r["chain"], s, t] for s, t in [*r["stages"].items(), ("wall", r["wall_s"])]]
    write_text(Path(a.out) / "chains.csv", "".join(",".join(map(str, x)) + "\n" for x in table))
    print(f"{'K':>2} {'wall':>7} " + " ".join(f"{s:>9}" for s in STAGES) + "  through.  differ")
    for row in summary:
        print(f"{row['k']:>2} {row['wall_s']:7.0f} " + " ".join(f"{row[s]:9.1f}" for s in STAGES)
              + f"  {row['throughput_x']:6.2f}x  {row['chains_differing'] or 'none'}"
              + (f"  failed: {row['chains_failed']}" if row["chains_failed"] else ""))
    n = len(ref["digests"])
    print(f"outputs compared per chain: {n}; differing: "
          + ("; ".join(f"{label(r)}: {len(r['differs'])} ({r['differs'][:3]})"
                       for r in rows if r["differs"]) or "none"))
    for r in rows:
        if r.get("first_difference"):
            print(f"{label(r)} parts from the lone chain at the {r['first_difference']}")
    return {"summary": summary, "differing": {label(r): r["differs"] for r in rows if r["differs"]},
            "failed": {label(r): r["failed"] for r in rows if "failed" in r},
            "first_difference": {label(r): r["first_difference"] for r in rows if r.get("first_difference")},
            "warned": {label(r): r["nondeterministic"] for r in rows if r.get("nondeterministic")}}


def label(r: dict) -> str:
    """A chain's name in the printed lines and the result: "warm-up c1", "K=2 c1"."""
    return f"{r.get('tag') or 'K=%d' % r['k']} c{r['chain']}"


if __name__ == "__main__":
    res = main()
    raise SystemExit(1 if res["differing"] or res["failed"] else 0)  # a check: 0 only when every chain agreed
