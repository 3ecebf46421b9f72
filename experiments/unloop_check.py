"""Sequence-level unlikelihood on a trained target, against a control of the same steps without it: AR's loops on
HumanEval (T = 0, natural mode, HumanEval's stops) and held-out quality before and after `dmtp.training.unloop`.
The `tiny` rows of docs/DESIGN.md ("Loops and the unlikelihood step") come from it.

    dmtp pipeline --profile tiny --stage corpus,tokenizer,target --work work     # the target (CPU, ~5 min)
    python -m experiments.unloop_check --work work/tiny --profile tiny --alpha 0    # the control (~6 min)
    python -m experiments.unloop_check --work work/tiny --profile tiny --alpha 1 [--ngram 16]
"""
import argparse
import json
import time
from dataclasses import replace

import numpy as np
import torch

from dmtp.data.datasets import encode_prompts
from dmtp.data.humaneval import humaneval_prompts
from dmtp.data.tokenizer import load_tokenizer
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target
from dmtp.training.pretrain import evaluate
from dmtp.training.unloop import loop_check, unloop
from experiments.profiles import PROFILES

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--work", required=True, help="a profile's work folder (target/ and tokens/ in it)")
ap.add_argument("--profile", default="tiny", help="its profile (the pretraining settings)")
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--alpha", type=float, default=1.0, help="0: the control (the same steps, no unlikelihood term)")
ap.add_argument("--lr", type=float, default=3e-4)
ap.add_argument("--prompt-len", type=int, default=64)
ap.add_argument("--new", type=int, default=96, help="decoded tokens per continuation of the pool")
ap.add_argument("--ngram", type=int, default=4)
ap.add_argument("--eval-new", type=int, default=128, help="HumanEval tokens per request")
ap.add_argument("--n", type=int, default=164, help="the first N HumanEval prompts")
ap.add_argument("--out", help="a JSON with both measurements")
a = ap.parse_args()
torch.manual_seed(0)
prof = PROFILES[a.profile]()
tok = load_tokenizer(f"{a.work}/target")
dev = "cuda" if torch.cuda.is_available() else "cpu"
tgt = Target.load(f"{a.work}/target", dtype=torch.float32, device=dev)
mtp = MTPHead.load(tgt, f"{a.work}/target")
train = np.load(f"{a.work}/tokens/train.npy", mmap_mode="r")
held = np.asarray(np.load(f"{a.work}/tokens/heldout.npy", mmap_mode="r"))
eos = tok.convert_tokens_to_ids("<|endoftext|>")
rows = encode_prompts(tok, humaneval_prompts()[:a.n])


def measure(tag: str) -> dict:
    ev = evaluate(tgt, mtp, held, prof.pretrain.seq_len, 100_000)
    out = dict(loop_check(tgt, rows, a.eval_new, eos, tok), **{k: ev[k] for k in ("target_loss", "target_top1",
                                                                                   "mtp_top1")})
    print(tag, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}), flush=True)
    return out


res = {"before": measure("before")}
cfg = replace(prof.pretrain, unloop_steps=a.steps, unloop_alpha=a.alpha, unloop_lr=a.lr, unloop_prompt_len=a.prompt_len,
              unloop_new=a.new, unloop_ngram=a.ngram, log_every=25)
t0 = time.time()
unloop(tgt, mtp, train, cfg, eos_id=eos)
res["after"] = measure(f"after {a.steps} steps, alpha {a.alpha}, {a.ngram}-grams ({time.time() - t0:.0f} s)")
if a.out:
    from dmtp.io import write_json
    write_json(a.out, dict(res, settings=vars(a)))
