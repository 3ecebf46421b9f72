"""Losslessness at T = 0: each method's output against `ar`'s (the target's own greedy decoding in the same
precision), and, where they differ, how near a tie the target was at the first differing position.

In fp32 every method must match exactly. In bf16 a verify forward of k+1 rows and the AR forward of one row round
differently, so a near-tie can flip; `top2_gap` (the target's logit gap between its two best tokens at that position,
from an uncached pass over the shared prefix) says how near.

    python -m dmtp.cli.lossless --target work/mini/target --methods ar,mtp --dtype bf16 --n 40 \
        --max-new-tokens 128 --out results/mini/lossless_bf16     # add --drafters D for drafter methods
"""
from __future__ import annotations

import argparse

import pandas as pd
import torch

from dmtp.analysis.lossless import add_top2_gaps, compare
from dmtp.checks import require
from dmtp.cli.args import at_least, guard, method_checkpoints, names, out_dir
from dmtp.data.datasets import encode_prompts, humaneval_prompts
from dmtp.data.tokenizer import find_tokenizer
from dmtp.engine.methods import AR, load_method, method_class
from dmtp.engine.runner import run_generate
from dmtp.io import write_csv, write_meta
from dmtp.models import torch_dtype
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target, read_config


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dmtp.cli.lossless", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--drafters", help="directory of trained drafters (<name>/drafter) for drafter methods")
    p.add_argument("--methods", type=names, default=["ar", "mtp"], help="ar, mtp, or drafter folder names")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--n", type=at_least(1), default=40, help="the first N HumanEval prompts")
    p.add_argument("--max-new-tokens", type=at_least(1), default=128)
    p.add_argument("--batch-size", type=at_least(1), default=40)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    guard("python -m dmtp.cli.lossless", run, a)


def run(a):
    methods = [AR.name] + [m for m in a.methods if m != AR.name]  # the reference first
    # --- checked before any model is loaded ---
    out = out_dir(a.out)
    method_checkpoints(a.target, methods, a.drafters)
    tok = find_tokenizer(a.target)
    require(tok is not None, f"--target {a.target}: no tokenizer files beside config.json (the HumanEval prompts are "
                             "text)")
    eos = tok.eos_token_id if tok.eos_token_id is not None else read_config(a.target).eos_token_id
    require(eos is not None, f"--target {a.target}: neither the tokenizer nor config.json names an end-of-text token")
    eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    hp = humaneval_prompts(n=a.n)
    require(len(hp) >= a.n, f"--n {a.n}: HumanEval has {len(hp)} problems")
    # --- the work ---
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tgt = Target.load(a.target, dtype=torch_dtype(a.dtype), device=dev)
    mtp = MTPHead.load(tgt, a.target) if any(method_class(m).needs_mtp() for m in methods) else None
    prompts = encode_prompts(tok, hp)
    rows, flips, ref = [], [], None
    for name in methods:  # ar first: the reference
        m = load_method(name, tgt, mtp, a.drafters)
        recs = run_generate(tgt, m, prompts, 0.0, a.max_new_tokens, eos, a.batch_size, desc=name)
        if ref is None:
            ref = {r["id"]: r["output_ids"] for r in recs}
            continue
        row, f = compare(ref, recs, name, "humaneval")
        rows.append(row)
        flips += f
        print(f"[lossless] {a.dtype} {name}: {row['identical']}/{row['n']} identical to {AR.name}")
    add_top2_gaps(tgt, flips, {x["id"]: x["prompt_ids"] for x in prompts}, {"humaneval": ref})
    write_csv(out / "lossless.csv", pd.DataFrame(rows))
    cols = ["method", "dataset", "id", "position", "ar_token", "token", "top2_gap", "top1_logit", "tie_rule",
            "fp32_margin", "bf16_error", "tie_measured", "tie"]
    write_csv(out / "divergences.csv", pd.DataFrame(flips, columns=cols))
    write_meta(out / "meta.json", vars(a))
    if flips:
        print(pd.DataFrame(flips).to_string(index=False))


if __name__ == "__main__":
    main()
