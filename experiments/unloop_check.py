"""Sequence-level unlikelihood on a trained target, against a control of the same steps without it: AR's loops on
HumanEval (T = 0, natural mode) and held-out quality before and after `dmtp.training.unloop` (the rows of
docs/DESIGN.md, "Loops and the unlikelihood step"). Settings not given are the profile's.

    dmtp pipeline --profile tiny --stage corpus,tokenizer,target --work work     # the target (CPU, ~5 min)
    python -m experiments.unloop_check --work work/tiny --profile tiny --alpha 0 \
        --prompt-len 64 --new 96 --eval-new 128                                     # the control (~6 min)
    python -m experiments.unloop_check --work work/tiny --profile tiny --alpha 1 [--ngram 16 | --negatives loop] \
        --prompt-len 64 --new 96 --eval-new 128
    python -m experiments.unloop_check --table results/mini/r<k>/unloop/*.json    # the arms as one markdown table

On one GPU: `dmtp pipeline --profile mini --stage corpus,tokenizer,target --set pretrain.unloop_steps=0`, then the
arms on that target (`--work work/mini`), each writing its own JSON.
"""
import argparse
import json
import os
import time
from dataclasses import asdict, replace

import numpy as np
import torch

from dmtp.config import NEGATIVES
from dmtp.data.datasets import encode_prompts, humaneval_prompts
from dmtp.data.tokenizer import load_tokenizer
from dmtp.io import environment, write_json
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target
from dmtp.training.common import compiled
from dmtp.training.pretrain import compile_layers, evaluate
from dmtp.training.unloop import loop_check, unloop
from dmtp.profiles import PROFILES

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--work", help="a profile's work folder (target/ and tokens/ in it)")
ap.add_argument("--profile", default="tiny", help="its profile (the pretraining settings)")
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--alpha", type=float, default=1.0, help="0: the control (the same steps, no unlikelihood term)")
ap.add_argument("--lr", type=float, help="default: the profile's (0.1 x the pretraining peak)")
ap.add_argument("--prompt-len", type=int, help="corpus tokens per pool prompt (default: the profile's)")
ap.add_argument("--new", type=int, help="decoded tokens per continuation of the pool (default: the profile's)")
ap.add_argument("--ngram", type=int, help="n of the n-gram negatives (default: the profile's)")
ap.add_argument("--negatives", choices=NEGATIVES, help="which tokens are negatives (default: the profile's)")
ap.add_argument("--eval-new", type=int, help="HumanEval tokens per request (default: the profile's eval.new_tokens)")
ap.add_argument("--n", type=int, default=164, help="the first N HumanEval prompts")
ap.add_argument("--out", help="a JSON with both measurements")
ap.add_argument("--before", metavar="JSON", help="the pretrained target's measurement: read from JSON when it exists "
                "(an earlier arm on the same target wrote it), else measured and written there")
ap.add_argument("--table", nargs="+", metavar="JSON", help="print the arms' JSONs (--out) as one table and exit")
a = ap.parse_args()


def negatives_name(negatives: str, ngram: int) -> str:
    return "loop negatives" if negatives == "loop" else f"{ngram}-grams"


def table(paths: list[str]) -> str:
    """One markdown row per arm (sorted by alpha), after the pretrained target's own row (the first arm's "before"):
    the goals' columns (loop_frac, requests ended by a stop, of n) and held-out quality."""
    res = sorted((json.load(open(p)) for p in paths),
                 key=lambda r: (r["settings"]["alpha"], r["settings"]["negatives"], r["settings"]["ngram"]))
    rows = ["| target | loop_frac | ended | held-out loss | top-1 | MTP top-1 | seconds |",
            "|---|---|---|---|---|---|---|"]

    def row(name: str, m: dict, seconds: str = "") -> str:
        return (f"| {name} | {m['loop_frac']:.3f} | {m['ended']} / {m['n']} | {m['target_loss']:.3f} | "
                f"{100 * m['target_top1']:.2f} % | {100 * m['mtp_top1']:.2f} % | {seconds} |")

    if res:
        rows.append(row("pretrained", res[0]["before"]))
    for r in res:
        st = r["settings"]
        kind = negatives_name(st["negatives"], st["ngram"])
        name = f"+ {st['steps']} steps, alpha {st['alpha']:g}" + (f", {kind}" if st["alpha"] else " (control)")
        rows.append(row(name, r["after"], f"{r['seconds']:.0f}" if "seconds" in r else ""))
    return "\n".join(rows)


if a.table:
    print(table(a.table))
    raise SystemExit(0)
if not a.work:
    ap.error("--work is required (or --table)")
torch.manual_seed(0)
prof = PROFILES[a.profile]()
pc = prof.pretrain
a.lr = a.lr if a.lr is not None else (pc.unloop_lr or 0.1 * pc.lr)
a.prompt_len = a.prompt_len or pc.unloop_prompt_len
a.new = a.new or pc.unloop_new
a.ngram = a.ngram or pc.unloop_ngram
a.negatives = a.negatives or pc.unloop_negatives
a.eval_new = a.eval_new or prof.eval.new_tokens
tok = load_tokenizer(f"{a.work}/target")
dev = "cuda" if torch.cuda.is_available() else "cpu"
tgt = Target.load(f"{a.work}/target", dtype=torch.float32, device=dev)
mtp = MTPHead.load(tgt, f"{a.work}/target")
train = np.load(f"{a.work}/tokens/train.npy", mmap_mode="r", allow_pickle=False)
held = np.asarray(np.load(f"{a.work}/tokens/heldout.npy", mmap_mode="r", allow_pickle=False))
eos = tok.convert_tokens_to_ids("<|endoftext|>")
rows = encode_prompts(tok, humaneval_prompts()[:a.n])


def measure(tag: str) -> dict:
    ev = evaluate(tgt, mtp, held, prof.pretrain.seq_len, 100_000)
    out = dict(loop_check(tgt, rows, a.eval_new, eos, tok), **{k: ev[k] for k in ("target_loss", "target_top1",
                                                                                   "mtp_top1")})
    print(tag, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}), flush=True)
    return out


if a.before and os.path.exists(a.before):
    res = {"before": json.load(open(a.before))}
    print("before (read from " + a.before + ")", json.dumps(res["before"]), flush=True)
else:
    res = {"before": measure("before")}
    if a.before:
        write_json(a.before, res["before"])
if compiled(pc.compile, tgt.device):  # as pretraining does: an arm's steps cost what the target stage's would
    compile_layers(tgt, mtp)
cfg = replace(prof.pretrain, unloop_steps=a.steps, unloop_alpha=a.alpha, unloop_lr=a.lr, unloop_prompt_len=a.prompt_len,
              unloop_new=a.new, unloop_ngram=a.ngram, unloop_negatives=a.negatives, log_every=25)
t0 = time.time()
unloop(tgt, mtp, train, cfg, eos_id=eos)
res["seconds"] = time.time() - t0
res["after"] = measure(f"after {a.steps} steps, alpha {a.alpha}, {negatives_name(a.negatives, a.ngram)} "
                       f"({res['seconds']:.0f} s)")
if a.out:
    write_json(a.out, dict(res, settings={k: v for k, v in vars(a).items() if k != "table"}, unloop=asdict(cfg),
                           env=environment()))  # the pretraining settings the step ran with, the commit
