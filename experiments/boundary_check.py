"""HumanEval through `ar` in both evaluation modes, on a trained target: how many prompts stop at once (the prompt
boundary check: at most 1 % at T = 0), how requests end, and how loopy the outputs are. Writes one JSON.

    python -m experiments.boundary_check --target work/mini/target --out results/mini/boundary_check.json
    python -m experiments.boundary_check --target work/smoke/target --out /tmp/bc.json --n 4 \
        --max-new-tokens 16   # CPU, after `dmtp pipeline --profile smoke --stage corpus,tokenizer,target`
"""
import argparse
import collections
import time

import torch

from dmtp.analysis.metrics import loop_summary, stopped_at_once
from dmtp.data.datasets import humaneval_prompts
from dmtp.data.tokenizer import load_tokenizer
from dmtp.engine.methods import AR
from dmtp.engine.runner import run_generate
from dmtp.engine.stops import HUMANEVAL_STOPS
from dmtp.io import write_json
from dmtp.models.target import Target

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--target", required=True, help="a target checkpoint with its tokenizer (work/<profile>/target)")
ap.add_argument("--out", required=True)
ap.add_argument("--n", type=int, default=164, help="the first N HumanEval prompts")
ap.add_argument("--max-new-tokens", type=int, default=256)
ap.add_argument("--temperatures", default="0,1")
a = ap.parse_args()
dev = "cuda" if torch.cuda.is_available() else "cpu"
tok = load_tokenizer(a.target)  # StaleTokenizer for a target trained on the old pre-tokenizer
tgt = Target.load(a.target, device=dev)
rows = [{"id": p["id"], "prompt_ids": tok(p["prompt"], add_special_tokens=False)["input_ids"]}
        for p in humaneval_prompts(a.n)]
eos = [tok.eos_token_id]
out = {"target": a.target, "n": len(rows), "max_new_tokens": a.max_new_tokens, "runs": []}
for temp in (float(t) for t in a.temperatures.split(",")):
    for mode, stops in (("natural", HUMANEVAL_STOPS), ("fixed", ())):
        t0 = time.time()
        recs = run_generate(tgt, AR(), rows, temp, a.max_new_tokens, eos, len(rows), tok=tok, mode=mode,
                            stop_strings=stops, desc=f"ar {mode} T{temp:g}")
        frac, ids = stopped_at_once(recs, eos)
        run = {"temperature": temp, "mode": mode, "stopped_at_once": frac, "stopped_at_once_ids": ids,
               "stop_reason": dict(collections.Counter(r["stop_reason"] for r in recs)),
               "mean_output_tokens": sum(len(r["output_ids"]) for r in recs) / len(recs),
               **loop_summary(recs),
               "wall_s": round(time.time() - t0, 1)}
        out["runs"].append(run)
        print({k: v for k, v in run.items() if k != "stopped_at_once_ids"}, flush=True)
write_json(a.out, out)
