"""Verification modes at T > 0 on a profile's trained models: every method x verify mode x temperature, decoded with
dynamic batching at each batch cap (acceptance from the records, throughput from the wall time), beside the
target-only ceiling. Artifacts under results/<profile>/verify/, rendered by `dmtp.analysis.report.verify`.

    python -m dmtp.cli.verify --profile mini          # work/mini -> results/mini/verify (one H200, ~13 min)
    python -m dmtp.cli.verify --profile mini --set 'verify.temperatures=[0.6]'   # one temperature; reruns resume
    dmtp pipeline --profile mini --stage verify      # the same, as a pipeline stage (not part of `--stage all`)
    python -m dmtp.cli.verify --profile smoke --work /tmp/w --results /tmp/r   # CPU, after the smoke pipeline, ~3 min

runs/<method>/<verify>/humaneval_T<t>.jsonl   one record per request and timed repeat at the largest cap (the
                      `dmtp generate` schema with verify, batch_cap, repeat); .meta.json beside it holds the group's
                      throughput rows (every cap and repeat) and the settings
throughput.csv        method, verify, temperature, batch_cap, repeat, requests, output_tokens, wall_s, tok_per_s,
                      per_verify (gathered from the groups' meta files)
oracle.csv            temperature, k, position, ceiling: the target-only ceiling along the ar trajectory
                      (`dmtp.analysis.oracle.oracle_ceiling`; position 0 holds the acceptance-length ceiling)
A group is skipped when its records are newer than the models it measures, so a run cut short resumes.
"""
from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import torch

from dmtp.cli.bench import timed
from dmtp.data.humaneval import humaneval_prompts
from dmtp.data.tokenizer import load_tokenizer
from dmtp.engine.decode import Server, capacity_for, load_method
from dmtp.engine.verify import check
from dmtp.io import read_jsonl, write_json, write_jsonl, write_meta, write_text
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target
from experiments.profiles import VerifyStudy, get_profile, override

try:  # the target-only ceiling (another part of the suite); absent: oracle.csv is not written and the report says so
    from dmtp.analysis.oracle import oracle_ceiling
except ImportError:
    oracle_ceiling = None


def group_path(out: Path, method: str, verify: str, temperature: float, dataset: str = "humaneval") -> Path:
    return out / "runs" / method / verify / f"{dataset}_T{temperature:g}.jsonl"


def fresh(path: Path, dep: Path) -> bool:
    return path.exists() and (not dep.exists() or path.stat().st_mtime >= dep.stat().st_mtime)


def run_group(tgt, m, prompts: list[dict], temperature: float, verify: str, cfg: VerifyStudy, eos, log=print):
    """One (method, verify, temperature): a Server per cap, its graphs captured on a first group of `cap` requests,
    then `cfg.repeats` timed runs (the server's generator continues: every repeat draws fresh samples). Returns
    (records of the largest cap, throughput rows of every cap)."""
    dev = tgt.device
    recs, rows = [], []
    top = max(cfg.caps)
    for cap in cfg.caps:
        reqs = prompts[: cfg.prompts if cap == top else cfg.small_cap_prompts]
        ids = [p["prompt_ids"] for p in reqs]
        srv = Server(tgt, m, cap, capacity_for(ids, cfg.max_new_tokens, m.k), temperature, cfg.max_new_tokens, eos,
                     seed=cfg.seed, verify=verify)
        srv.run(ids[:cap])  # warm-up: graph capture, as at server start-up
        for rep in range(cfg.repeats):
            res, wall = timed(dev, partial(srv.run, ids))
            n_out = sum(len(r.output_ids) for r in res)
            acc = [a for r in res for a in r.accepted]
            rows.append({"method": m.name, "verify": verify, "temperature": temperature, "batch_cap": cap,
                         "repeat": rep, "requests": len(ids), "output_tokens": n_out, "wall_s": wall,
                         "tok_per_s": n_out / wall, "per_verify": 1 + sum(acc) / max(1, len(acc))})
            log(f"verify {m.name:<20} {verify:<6} T={temperature:g} B{cap} #{rep}: {n_out / wall:8.1f} tok/s, "
                f"per-verify tau {rows[-1]['per_verify']:.3f}")
            if cap == top:
                recs += [{"id": p["id"], "method": m.name, "temperature": temperature, "verify": verify,
                          "prompt_tokens": len(p["prompt_ids"]), "output_ids": r.output_ids, "accepted": r.accepted,
                          "n_candidates": m.k, "wall_s": round(r.wall_s, 4), "batch_cap": cap, "repeat": rep,
                          "dataset": "humaneval"} for p, r in zip(reqs, res)]
        del srv
    return recs, rows


def study(tgt, mtp, drafters: Path, prompts: list[dict], cfg: VerifyStudy, out: Path, eos, mtp_steps: int = 4,
          deps: dict | None = None, log=print):
    """Every group of `cfg` not already fresh under `out`, then throughput.csv and oracle.csv. `deps`: method ->
    the file whose mtime its results must postdate (a checkpoint's DONE)."""
    for v in cfg.modes:
        check(v)
    deps, cache = deps or {}, {}
    for temp in cfg.temperatures:
        for name in cfg.methods:
            for v in cfg.modes:
                path = group_path(out, name, v, temp)
                if fresh(path, deps.get(name, Path("/nonexistent"))):
                    continue
                if name not in cache:  # a method object is reusable: each server works on a copy
                    cache[name] = load_method(name, tgt, mtp, drafters, mtp_steps)
                t0 = time.time()
                recs, rows = run_group(tgt, cache[name], prompts, temp, v, cfg, eos, log)
                write_jsonl(path, recs)
                write_meta(path.with_suffix(".meta.json"), {"method": name, "verify": v, "temperature": temp,
                                                             "study": vars(cfg)},
                           wall_s=time.time() - t0, throughput=rows)
    gather(out)
    ceilings(tgt, out, prompts, log)


def gather(out: Path) -> Path:
    """throughput.csv from every group's meta file."""
    import pandas as pd

    rows = [r for p in sorted((out / "runs").glob("*/*/*.meta.json")) for r in json.loads(p.read_text())["throughput"]]
    path = out / "throughput.csv"
    write_text(path, pd.DataFrame(rows).to_csv(index=False))
    return path


def ceilings(tgt, out: Path, prompts: list[dict], log=print):
    """oracle.csv: the target-only ceiling at every temperature whose ar x target records exist (the trajectory),
    for every number of candidates the methods under `out` draft (7, MTP415's 4)."""
    if oracle_ceiling is None:
        log("verify: dmtp.analysis.oracle is not available: no oracle.csv (the report's ceiling column stays empty)")
        return
    ks = sorted({read_jsonl(p)[0]["n_candidates"] for p in (out / "runs").glob("*/*/*.jsonl") if p.stat().st_size}
                - {0})
    ids = {p["id"]: p["prompt_ids"] for p in prompts}
    rows = []
    for path in sorted((out / "runs" / "ar" / "target").glob("humaneval_T*.jsonl")):
        recs = [r for r in read_jsonl(path) if r["repeat"] == 0]
        if not recs:
            continue
        temp = recs[0]["temperature"]
        for k in ks:
            c = oracle_ceiling(tgt, recs, ids, temp, k)
            rows += [{"temperature": temp, "k": k, "position": j + 1, "ceiling": v}
                     for j, v in enumerate(c["cumulative"])]
            rows.append({"temperature": temp, "k": k, "position": 0, "ceiling": c["acceptance_length"]})
    if rows:
        import pandas as pd

        write_text(out / "oracle.csv", pd.DataFrame(rows).to_csv(index=False))


def humaneval_ids(tok, n: int) -> list[dict]:
    return [{"id": p["id"], "prompt_ids": tok(p["prompt"], add_special_tokens=False)["input_ids"]}
            for p in humaneval_prompts(n)]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dmtp.cli.verify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, help="work/<profile> holds target, tokenizer, drafters")
    ap.add_argument("--work", default="work")
    ap.add_argument("--results", default="results")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a profile field, e.g. 'verify.temperatures=[1.0]' or verify.repeats=3")
    a = ap.parse_args(argv)
    p = override(get_profile(a.profile), a.set or [])
    work, out = Path(a.work) / p.name, Path(a.results) / p.name / "verify"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[p.target_dtype]
    tgt = Target.load(work / "target", dtype=dtype, device=dev)
    mtp = MTPHead.load(tgt, work / "target")
    tok = load_tokenizer(work / "tokenizer")
    deps = {m: work / "target" / "DONE" if m in ("ar", "mtp") else work / "drafters" / m / "DONE"
            for m in p.verify.methods}
    t0 = time.time()
    study(tgt, mtp, work / "drafters", humaneval_ids(tok, p.verify.prompts), p.verify, out, [tok.eos_token_id],
          p.mtp_steps, deps)
    write_json(out / "meta.json", {"profile": p.name, "study": vars(p.verify), "wall_s": time.time() - t0})


if __name__ == "__main__":
    main()
