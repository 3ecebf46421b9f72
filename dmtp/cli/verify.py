"""The verification-mode study: every method x verify mode x temperature of a profile's `verify` settings
(`VerifyConfig`), decoded with dynamic batching at each batch cap in the study's evaluation mode (natural or fixed),
beside the target-only ceiling. An opt-in pipeline stage; rendered by `dmtp.analysis.report.verify`.

    dmtp pipeline --profile mini --stage verify                    # one H200, ~14 min (two temperatures)
    dmtp pipeline --profile mini --stage verify --set verify.temperatures=0.6   # one temperature; reruns resume
    dmtp pipeline --profile mini --stage verify --set verify.eval_mode=fixed   # fixed length (redoes every group)
    make verify PROFILE=mini                                        # the stage, then the report
    dmtp pipeline --profile smoke --work /tmp/w --results /tmp/r --stage verify   # CPU, after the smoke pipeline

results/<profile>/verify/
  runs/<method>/<verify>/humaneval_T<t>.jsonl   a record per request and timed repeat at the largest cap (the
                      `dmtp generate` schema with verify, mode, stop_reason, batch_cap, repeat); its .meta.json:
                      the group's fingerprint and throughput rows (every cap and repeat)
  throughput.csv      those rows, gathered
  oracle.csv          temperature, k, position, ceiling: the target-only ceiling along the ar trajectory
                      (position 0: the acceptance-length ceiling)
"""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from dmtp.analysis.metrics import acceptance_length
from dmtp.analysis.oracle import oracle_ceiling
from dmtp.cli.args import failure
from dmtp.cli.bench.common import timed
from dmtp.config import VerifyConfig
from dmtp.engine.slots import capacity_for
from dmtp.engine.methods import AR, load_method
from dmtp.engine.server import Server
from dmtp.engine.stops import StopStrings
from dmtp.io import read_json, read_jsonl, write_csv, write_jsonl, write_meta


def groups(cfg: VerifyConfig) -> list[tuple[str, str, float]]:
    """(method, verify, temperature) of every group, in run order."""
    return [(m, v, t) for t in cfg.temperatures for m in cfg.methods for v in cfg.modes]


def group_path(out: Path, method: str, verify: str, temperature: float, dataset: str = "humaneval") -> Path:
    return out / "runs" / method / verify / f"{dataset}_T{temperature:g}.jsonl"


def run_group(tgt, m, prompts: list[dict], temperature: float, verify: str, cfg: VerifyConfig, eos,
              stop: StopStrings | None = None, log=print, engine=None):
    """One (method, verify, temperature): a Server per cap, warmed on `cap` requests, then `cfg.repeats` timed runs
    (each draws fresh samples). `eos`, `stop`: what ends a request in natural mode. Returns (records of the largest
    cap, throughput rows of every cap)."""
    eos = eos if cfg.eval_mode == "natural" else []
    recs, rows, top = [], [], max(cfg.caps)
    for cap in cfg.caps:
        reqs = prompts[: cfg.prompts if cap == top else cfg.small_cap_prompts]
        ids = [p["prompt_ids"] for p in reqs]
        srv = Server(tgt, m, cap, capacity_for(ids, cfg.max_new_tokens, m.k), temperature, cfg.max_new_tokens, eos,
                     seed=cfg.seed, stop=stop, verify=verify, engine=engine)
        srv.run(ids[:cap])  # warm-up: graph capture, as at server start-up
        for rep in range(cfg.repeats):
            res, wall = timed(tgt.device, srv.run, ids)
            n_out = sum(len(r.output_ids) for r in res)
            tau = acceptance_length([a for r in res for a in r.accepted])
            rows.append({"method": m.name, "verify": verify, "temperature": temperature, "batch_cap": cap,
                         "repeat": rep, "requests": len(ids), "output_tokens": n_out, "wall_s": wall,
                         "tok_per_s": n_out / wall, "per_verify": tau})
            log(f"verify {m.name:<20} {verify:<6} T={temperature:g} B{cap} #{rep}: {n_out / wall:8.1f} tok/s, "
                f"per-verify tau {tau:.3f}")
            if cap == top:
                recs += [{"id": p["id"], "method": m.name, "temperature": temperature, "verify": verify,
                          "prompt_tokens": len(p["prompt_ids"]), "output_ids": r.output_ids, "accepted": r.accepted,
                          "n_candidates": m.k, "wall_s": round(r.wall_s, 4), "mode": cfg.eval_mode,
                          "stop_reason": r.stop_reason, "batch_cap": cap, "repeat": rep, "dataset": "humaneval"}
                         for p, r in zip(reqs, res)]
        srv.close()
    return recs, rows


def study(tgt, mtp, drafters: Path, prompts: list[dict], cfg: VerifyConfig, out: Path, eos, mtp_steps: int = 4,
          stop: StopStrings | None = None, todo: list[tuple[str, str, float]] | None = None, want=None, log=print,
          engine=None):
    """Decode the groups `todo` (default: those without records under `out`), then write throughput.csv and
    oracle.csv. A failed group is reported, the others still run, then the study raises naming every failure.
    `want(method, verify, temperature)`: the fingerprint recorded in a group's meta (None: none)."""
    if todo is None:
        todo = [g for g in groups(cfg) if not group_path(out, *g).exists()]
    cache, failed = {}, []
    for name, v, temp in todo:
        path = group_path(out, name, v, temp)
        t0 = time.time()
        try:
            if name not in cache:  # a method object is reusable: each server works on a copy
                cache[name] = load_method(name, tgt, mtp, drafters, mtp_steps)
            recs, rows = run_group(tgt, cache[name], prompts, temp, v, cfg, eos, stop, log, engine)
        except Exception as e:  # noqa: BLE001 - the other groups still run; reported and raised below
            failed.append(f"{name} {v} T={temp:g}: {failure(e)}")
            log(f"verify FAILED {failed[-1]}")
            continue
        fp = {} if want is None else {"fingerprint": want(name, v, temp)}
        write_meta(path.with_suffix(".meta.json"), {"method": name, "verify": v, "temperature": temp,
                                                     "study": vars(cfg)},
                   wall_s=time.time() - t0, throughput=rows, engine=engine, **fp)  # before the records
        write_jsonl(path, recs)
    if metas := sorted((out / "runs").glob("*/*/*.meta.json")):  # throughput.csv from every group's meta file
        write_csv(out / "throughput.csv", pd.DataFrame([r for p in metas for r in read_json(p)["throughput"]]))
    if todo or not (out / "oracle.csv").exists():
        ceilings(tgt, out, prompts)
    if failed:
        raise RuntimeError(f"{len(failed)} verify-study group(s) failed (the others were written):\n  "
                           + "\n  ".join(failed))


def ceilings(tgt, out: Path, prompts: list[dict]):
    """oracle.csv: the target-only ceiling at every temperature with ar x target records (the trajectory), for every
    number of candidates the methods under `out` draft."""
    ks = sorted({read_jsonl(p)[0]["n_candidates"] for p in (out / "runs").glob("*/*/*.jsonl") if p.stat().st_size}
                - {0})
    ids = {p["id"]: p["prompt_ids"] for p in prompts}
    rows = []
    for path in sorted((out / "runs" / AR.name / "target").glob("humaneval_T*.jsonl")):
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
        write_csv(out / "oracle.csv", pd.DataFrame(rows))
