"""Do identical `dmtp generate` commands give identical records on one GPU? The compile-cache check's shape, decoded
five ways and compared token for token with the first:

    cold     a process with an empty compile cache (compiles, and under "autotune" times kernels)
    warm     a second process reading that cache
    fresh    a third process with another empty cache, while another process keeps the card busy
    inproc   one process decoding the batch twice (runtime nondeterminism alone)

    python -m experiments.determinism_check --out /tmp/det                            # the engine's default tuning
    python -m experiments.determinism_check --out /tmp/det2 --engine tuning=autotune  # another setting
    python -m experiments.determinism_check --out /tmp/det3 --temperature 0.8         # sampled, as the data stage
    python -m experiments.determinism_check --out /tmp/det --hidden 64 --layers 2 --prompts 2 --max-new-tokens 4 \
        --engine engine=fast-eager                                                    # CPU smoke (seconds)

Writes OUT/determinism.json (each run's times; per comparison the prompts whose tokens differ and where) and prints a
table.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from dmtp.io import environment, read_jsonl, write_json
from experiments.compile_cache_check import build, run_once, shape_arguments

LOAD = """
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("busy", flush=True)
while True:
    a = (a @ a).clamp_(-1, 1)
"""

TWICE = """
import json, sys, torch
from dmtp.cli.main import load_models
from dmtp.config import EngineConfig
from dmtp.engine.methods import build_method
from dmtp.engine.runner import run_generate
from dmtp.io import read_jsonl, write_jsonl
from dmtp.models import torch_dtype
from dmtp.schema import override
target, drafter, method, dtype, prompts, n_new, out, engine, temp = sys.argv[1:10]
dev = "cuda" if torch.cuda.is_available() else "cpu"
tgt, mtp, d = load_models(target, drafter if method not in ("ar", "mtp") else None, method, dev, torch_dtype(dtype))
m = build_method(method, tgt, drafter=d, mtp=mtp)
eng = override(EngineConfig(dtype=dtype), json.loads(engine), "--engine")
rows = read_jsonl(prompts)
for k in (1, 2):
    recs = run_generate(tgt, m, rows, float(temp), int(n_new), [], len(rows), 0, engine=eng)
    write_jsonl(f"{out}{k}.jsonl", recs)
"""


def outputs(path: Path) -> dict[str, list[int]]:
    return {r["id"]: r["output_ids"] for r in read_jsonl(path)}


def compare(a: dict, b: dict) -> dict:
    """Prompts whose outputs differ, and where each first differs."""
    diff = {}
    for k in a:
        x, y = a[k], b.get(k, [])
        if x != y:
            diff[k] = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
    return {"prompts": len(a), "differ": len(diff), "first_positions": sorted(diff.values())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    shape_arguments(ap)
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: sampled (the seed fixed), as the data stage")
    ap.add_argument("--no-load", action="store_true", help="the fresh run without a busy card")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    target, drafter = build(out, a)
    runs, recs = [], {}
    caches = {"cold": out / "cache1", "warm": out / "cache1", "fresh": out / "cache2"}
    for c in (out / "cache1", out / "cache2"):
        shutil.rmtree(c, ignore_errors=True)
    for k, (name, cache) in enumerate(caches.items(), 1):
        load = None
        if name == "fresh" and torch.cuda.is_available() and not a.no_load:
            load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
            assert load.stdout.readline().strip() == "busy"
        try:
            r = run_once(out, k, target, drafter, cache, a)
        finally:
            if load is not None:
                load.kill()
                load.wait()
        runs.append({"name": name, **r, "loaded": load is not None})
        recs[name] = outputs(out / f"run{k}.jsonl")
        print(f"{name:6s} first record {r['first_record_s']:6.1f} s, wall {r['wall_s']:6.1f} s", flush=True)
    t0 = time.perf_counter()
    eng = dict(e.split("=", 1) for e in a.engine)
    subprocess.run([sys.executable, "-c", TWICE, str(target), str(drafter), a.method, a.dtype,
                    str(out / "prompts.jsonl"), str(a.max_new_tokens), str(out / "inproc"),
                    json.dumps([f"{k}={v}" for k, v in eng.items()]), str(a.temperature)], check=True,
                   env={**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": str(out / "cache1")})
    runs.append({"name": "inproc", "wall_s": round(time.perf_counter() - t0, 2)})
    recs["inproc1"], recs["inproc2"] = outputs(out / "inproc1.jsonl"), outputs(out / "inproc2.jsonl")
    pairs = {f"cold vs {n}": compare(recs["cold"], recs[n]) for n in ("warm", "fresh", "inproc1")}
    pairs["inproc1 vs inproc2"] = compare(recs["inproc1"], recs["inproc2"])
    res = {"config": vars(a), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "environment": environment(), "runs": runs, "comparisons": pairs,
           "identical": all(p["differ"] == 0 for p in pairs.values())}
    write_json(out / "determinism.json", res)
    for name, p in pairs.items():
        print(f"{name:20s} {p['differ']:3d} of {p['prompts']} prompts differ"
              + (f" (first at positions {p['first_positions']})" if p["differ"] else ""))
    print(f"identical: {res['identical']}; written {out / 'determinism.json'}")
    return res


if __name__ == "__main__":
    main()
