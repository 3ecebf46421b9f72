"""`dmtp` command line.

    dmtp variants
    dmtp generate --target PATH [--drafter PATH] --method NAME --prompts FILE.jsonl --temperature 0 \
        --max-new-tokens 128 --out out.jsonl
    dmtp generate --target PATH --method mtp --dataset gsm8k [--data-path FILE] --out gsm8k.jsonl
    dmtp train --target PATH --data tokens.jsonl --variants dflash,zero_init_residual --out DIR --steps 200
    dmtp train --profile qwen3.6-27b --target PATH --data train.jsonl --variants dflash,zero_init_residual --out DIR
    dmtp pipeline --profile tiny            # the embedded default end to end (what `make ablation-code` runs)
    dmtp dryrun --profile qwen3.6-27b       # paper scale on the meta device: shapes and parameter counts
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dmtp import dist
from dmtp.cli import dryrun, pipeline
from dmtp.data.datasets import load_prompts, spec
from dmtp.data.tokenizer import find_tokenizer
from dmtp.engine.decode import build_method
from dmtp.engine.runner import mtbench_generate, run_generate
from dmtp.io import read_jsonl, write_jsonl, write_meta
from dmtp.models.drafter import Drafter
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target
from dmtp.models.variants import REGISTRY, get_variant
from dmtp.training.drafters import TrainConfig, load_sequences, new_drafters, train_drafters
from experiments.profiles import get_profile


def _device(arg):
    import torch

    return arg or ("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(name):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def cmd_variants(a):
    w = max(map(len, REGISTRY))
    for name, cls in REGISTRY.items():
        print(f"{name:<{w}}  {cls.description}")


def load_models(target_path, drafter_path, method, device, dtype):
    """(target, mtp or None, drafter or None) for a method; each piece only when the method needs it."""
    tgt = Target.load(target_path, dtype=dtype, device=device)
    drafter = Drafter.load(drafter_path, device=device, dtype=dtype) if drafter_path else None
    needs_mtp = method == "mtp" or (drafter is not None and drafter.injection.needs_mtp)
    mtp = MTPHead.load(tgt, target_path) if needs_mtp else None
    return tgt, mtp, drafter


def read_prompts(path, tok=None):
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    rows = read_jsonl(path)
    out = []
    for i, r in enumerate(rows):
        if "prompt_ids" in r:
            ids = list(r["prompt_ids"])
        elif "prompt" in r:
            if tok is None:
                raise ValueError(f"{path}: line {i + 1} has a text prompt but the target has no tokenizer")
            ids = tok(r["prompt"], add_special_tokens=False)["input_ids"]
        else:
            raise ValueError(f"{path}: line {i + 1} needs `prompt` (text) or `prompt_ids`")
        out.append({"id": str(r.get("id", i)), "prompt_ids": ids})
    return out


def cmd_generate(a):
    import torch

    if bool(a.prompts) == bool(a.dataset):
        raise ValueError("give exactly one of --prompts FILE and --dataset NAME")
    dev = _device(a.device)
    tgt, mtp, drafter = load_models(a.target, a.drafter, a.method, dev, _dtype(a.dtype))
    tok = find_tokenizer(a.target)
    method = build_method(a.method, tgt, drafter=drafter, mtp=mtp, mtp_steps=a.mtp_steps)
    if a.dataset:  # a benchmark / training prompt set in its own format, chat template applied (data/datasets.py)

        if tok is None:
            raise ValueError(f"--dataset needs the target's tokenizer files beside {a.target}/config.json")
        prompts = load_prompts(a.dataset, tok, a.n, a.data_path)
    else:
        prompts = read_prompts(a.prompts, tok)[: a.n]
    eos = [int(e) for e in (a.eos.split(",") if a.eos else [])] or _eos_ids(tgt, tok)
    t0 = time.time()
    if a.dataset and spec(a.dataset)[0] == "mtbench":  # two turns, the second on the model's own first answer
        recs = mtbench_generate(tgt, method, tok, prompts, a.temperature, a.max_new_tokens, eos, a.batch_size, a.seed)
    else:
        recs = run_generate(tgt, method, prompts, a.temperature, a.max_new_tokens, eos, a.batch_size, a.seed, tok)
        for r, p in zip(recs, prompts) if a.dataset else ():  # prompt + output: on-policy training sequences
            r.update(dataset=p["dataset"], prompt_ids=p["prompt_ids"])
    write_jsonl(a.out, recs)
    write_meta(str(a.out) + ".meta.json", vars(a), wall_s=time.time() - t0)
    acc = [x for r in recs for x in r["accepted"]]
    if acc:
        print(f"{a.method}: {len(recs)} requests, {len(acc)} rounds, per-verify tau {1 + sum(acc) / len(acc):.3f}")
    torch.cuda.empty_cache() if torch.cuda.is_available() else None


def _eos_ids(tgt, tok):
    e = tgt.config.eos_token_id
    ids = [e] if isinstance(e, int) else list(e or [])
    if tok is not None and tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
    return sorted(set(ids))


def cmd_train(a):
    prof = _train_profile(a)
    _, _, rank_dev = dist.init()  # torchrun: one process per GPU, data-parallel over the global batch
    dev = rank_dev or _device(a.device)
    tgt = Target.load(a.target, dtype=_dtype(a.dtype), device=dev)
    variants = a.variants.split(",")

    need_mtp = any(get_variant(v).needs_mtp for v in variants)
    mtp = MTPHead.load(tgt, a.target) if need_mtp else None
    from dataclasses import replace

    cfg = replace(prof.train if prof else TrainConfig(), steps=a.steps, batch_size=a.batch_size, max_len=a.max_len,
                  lr=a.lr, gamma=a.gamma, seed=a.seed, stop_after=a.stop_after)
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=a.layers, mask_token_id=a.mask_token_id, seed=a.seed,
                **({"backbone": a.backbone} if a.backbone else {}))
    if prof is not None:  # the profile's drafter shape (paper scale: 5 layers at the target's width, block 8, ...)
        paper = bool(prof.scale.target_config)
        base.update(num_attention_heads=prof.drafter_heads, num_key_value_heads=prof.drafter_kv_heads,
                    head_dim=prof.scale.drafter_head_dim if paper else prof.arch.head_dim,
                    intermediate_size=prof.drafter_intermediate, block_size=prof.scale.block_size,
                    window=prof.scale.window,
                    rope_theta=(getattr(tgt.config, "rope_parameters", None) or {}).get("rope_theta", 1e6))
    init = dict(x.split("=", 1) for x in a.init_from.split(",")) if a.init_from else {}
    drafters = new_drafters(tgt, variants, base, init)
    train_drafters(tgt, mtp, drafters, load_sequences(a.data, cfg.max_len), cfg, a.out)


_TRAIN_DEFAULTS = dict(steps=200, batch_size=8, max_len=512, layers=1, lr=6e-4, gamma=4.0, mask_token_id=1,
                       dtype="fp32")


def _train_profile(a):
    """`dmtp train --profile NAME`: the profile's recipe fills every flag not given explicitly."""
    prof = None
    d = dict(_TRAIN_DEFAULTS)
    if a.profile:

        prof = get_profile(a.profile)
        t, sc = prof.train, prof.scale
        d.update(steps=t.steps, batch_size=t.batch_size, max_len=t.max_len, layers=prof.drafter_layers, lr=t.lr,
                 gamma=t.gamma)
        if sc.target_config:
            d.update(mask_token_id=sc.mask_token_id, dtype=sc.dtype)
    for k, v in d.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return prof


def main(argv=None):
    p = argparse.ArgumentParser(prog="dmtp", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("variants", help="list the injection variants").set_defaults(fn=cmd_variants)

    g = sub.add_parser("generate", help="decode prompts with one method through the single decode loop")
    g.add_argument("--target", required=True)
    g.add_argument("--drafter")
    g.add_argument("--method", required=True, help="ar | mtp | a variant name (see `dmtp variants`)")
    g.add_argument("--prompts", help="JSONL with `id` and `prompt` (text) or `prompt_ids`")
    g.add_argument("--dataset", help="instead of --prompts: gsm8k | math500 | humaneval | alpaca | mtbench (two turns) "
                   "| openperfectblend, chat template applied (dmtp/data/datasets.py)")
    g.add_argument("--data-path", help="local copy of --dataset (.json/.jsonl/.parquet or a folder); default "
                   "$DMTP_DATA_<NAME>, else the HF cache (offline)")
    g.add_argument("--n", type=int, help="only the first N prompts")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--mtp-steps", type=int, default=4, help="chained MTP steps for method mtp (MTP415: 4)")
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--eos", help="comma-separated EOS ids (default: the target's)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    g.add_argument("--device")
    g.add_argument("--out", required=True)
    g.set_defaults(fn=cmd_generate)

    t = sub.add_parser("train", help="train drafters (several variants on identical batches)")
    t.add_argument("--target", required=True)
    t.add_argument("--data", required=True, help="token JSONL (`dmtp generate` output or lines with `ids`)")
    t.add_argument("--variants", default="dflash")
    t.add_argument("--out", required=True)
    t.add_argument("--profile", help="take the drafter shape and training recipe from a profile (e.g. qwen3.6-27b); "
                   "explicit flags override it")
    t.add_argument("--steps", type=int, help="optimizer steps (default 200)")
    t.add_argument("--batch-size", type=int, help="sequences per step (default 8)")
    t.add_argument("--max-len", type=int, help="sequences cut to this many tokens (default 512)")
    t.add_argument("--layers", type=int, help="drafter layers (default 1)")
    t.add_argument("--backbone", choices=["dflash", "dflash2"], help="drafter backbone, SPEC §9 (default: dflash)")
    t.add_argument("--lr", type=float, help="peak learning rate (default 6e-4)")
    t.add_argument("--gamma", type=float, help="loss decay over candidates (default 4)")
    t.add_argument("--mask-token-id", type=int, help="MASK slot token (default 1)")
    t.add_argument("--init-from", help="variant=PATH,... continue from DFlash-format checkpoints")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--stop-after", type=int, default=0, help="checkpoint and stop after this step (resume later)")
    t.add_argument("--dtype", choices=["fp32", "bf16"], help="target precision (default fp32)")
    t.add_argument("--device")
    t.set_defaults(fn=cmd_train)

    pl = sub.add_parser("pipeline", help="embedded default end to end (corpus -> target -> drafters -> tables)")
    pl.add_argument("--profile", default=None, help="tiny | mini (default: mini with CUDA, else tiny)")
    pl.add_argument("--stage", default="all")
    pl.add_argument("--work", default="work", help="where checkpoints and intermediate data go")
    pl.add_argument("--results", default="results")
    pl.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a profile field, e.g. pretrain.tokens=20000000 or data_batch=512 (repeatable)")
    pl.set_defaults(fn=pipeline.main)

    dr = sub.add_parser("dryrun", help="paper-scale profile: target (config only), MTP head and every drafter on the "
                        "meta device; shape checks and a parameter summary, no weights")
    dr.add_argument("--profile", required=True, help="qwen3.6-27b | qwen3.6-35b-a3b")
    dr.add_argument("--target", help="checkpoint whose config.json to check (default: the profile's env var, else "
                    "the profile's config)")
    dr.set_defaults(fn=lambda a: sys.exit(dryrun.main(a)))

    a = p.parse_args(argv)
    try:
        a.fn(a)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"dmtp {a.cmd}: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
