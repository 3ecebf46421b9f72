"""The open reproduction's stage rates at the paper's depth, on one GPU: regeneration, drafter training and
evaluation tokens/s on a random-weight stand-in of the profile's target (the `experiments/paper_width.py` stand-in),
each in steady state, written as a rates file that `dmtp dryrun --rates` turns into the protocol's projected time.

    regen  the data stage's decode: AR at the profile's data batch and temperature, `--regen-prompt` random prompt
           tokens, exactly `--regen-new` new tokens; a warm-up batch of `--warmup-new` tokens first, then the timed one
    eval   the evaluation's decode of `--eval-method` (a random drafter beside the random MTP head) at the protocol's
           batch cap, T = 0, warm-up then timed; random weights accept no draft, so this is the round rate, which the
           projection multiplies by the blog's acceptance length
    train  `--train-steps` steps of one drafter at the setting the memory model plans for the stand-in on this card
           (its accumulation cut to `--accumulation`), compiled; tokens/s from the median step after the first

Depth: the full depth where the planned training fits the card, else the largest that does, labelled as such. The
decode stages run on the engine the profile's target decodes on (`EngineConfig`).

Writes <out>/rates.json (the rates file: `dmtp.analysis.projection.read_rates` reads it) and <out>/rates.md.

    python -m experiments.paper_rates --tiny --out /tmp/rates                      # CPU, width 64: ~40 s
    python -m experiments.paper_rates --out results/qwen3.6-27b/rates/h200         # one H200: 64 layers, ~5 min
    python -m experiments.paper_rates --out results/qwen3.6-27b/rates/h100         # one H100: 44 layers, labelled
"""
from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import torch
import transformers

from dmtp.engine.methods import AR, build_method
from dmtp.engine.runner import run_generate
from dmtp.cli.args import at_least
from dmtp.cli.bench.common import timed
from dmtp.io import git_sha, write_json, write_text
from dmtp.profiles import get_profile
from dmtp.training.drafters import new_drafters
from experiments import paper_width as pw

STAGES = ("regen", "eval", "train")  # in the order they run (training, the largest in memory, last)


def prompts(n: int, length: int, vocab: int, seed: int) -> list[dict]:
    """n prompts of `length` random token ids (a fixed seed)."""
    g = torch.Generator().manual_seed(seed)
    return [{"id": str(i), "prompt_ids": torch.randint(0, vocab, (length,), generator=g).tolist()} for i in range(n)]


def timed_decode(tgt, method, rows, temperature: float, new: int, warmup_new: int, engine, dev) -> dict:
    """A warm-up batch of `warmup_new` tokens, then the timed batch of exactly `new` tokens a request (mode fixed):
    wall seconds, tokens, rounds (the batch's verify rounds: its longest request's) and the rates."""
    def once(n):
        return timed(dev, lambda: run_generate(tgt, method, rows, temperature, n, [], len(rows), seed=0, mode="fixed",
                                               engine=engine))

    _, warm_s = once(warmup_new)
    recs, wall = once(new)
    tokens = sum(len(r["output_ids"]) for r in recs)
    rounds = max(len(r["accepted"]) for r in recs)
    return {"tok_per_s_per_gpu": tokens / wall, "rounds_per_s": rounds / wall, "tokens": tokens, "rounds": rounds,
            "timed_s": wall, "warmup_s": warm_s, "batch": len(rows), "prompt_tokens": len(rows[0]["prompt_ids"]),
            "new_tokens": new, "tokens_per_round": tokens / (rounds * len(rows)), "steady": True}


def stage_regen(tgt, a, prof, dev) -> dict:
    d = prof.data
    rows = prompts(a.regen_batch or d.batch, a.regen_prompt, tgt.vocab_size, a.seed)
    out = timed_decode(tgt, AR(), rows, d.temperature, a.regen_new, a.warmup_new, prof.engine, dev)
    return {**out, "method": "ar", "temperature": d.temperature}


def stage_eval(tgt, mtp, base, a, prof, layers: int, dev, dtype) -> dict:
    b = {**base, "num_target_layers": layers, "target_layer_ids": [], "seed": a.seed}
    drafter = new_drafters(tgt, [a.eval_method], b)[a.eval_method].to(dtype).eval()
    method = build_method(a.eval_method, tgt, drafter=drafter, mtp=mtp)
    rows = prompts(a.eval_batch or prof.eval.batch, a.eval_prompt, tgt.vocab_size, a.seed + 1)
    out = timed_decode(tgt, method, rows, 0.0, a.eval_new, a.warmup_new, prof.engine, dev)
    del method, drafter
    gc.collect()
    return {**out, "method": a.eval_method, "temperature": 0.0}


def stage_train(tgt, mtp, base, a, cfg, layers: int, dev, card_gib: float | None, global_batch: int) -> dict:
    """One drafter's steps at the plan for this depth on this card (paper_width's row), its rate and peak."""
    t = argparse.Namespace(seq_len=a.seq_len, anchors=a.anchors, variant=a.eval_method, steps=a.train_steps,
                           compile=a.compile, seed=a.seed, memory_trace=False, accumulation=a.accumulation,
                           micro_batch=0, batch=1, fsdp="off", grad_sync="last")
    d = pw.spec(cfg, base, t.variant)
    plan = pw.planned(cfg, d, t, card_gib or 1e6, global_batch, layers)
    info = pw.apply_plan(t, plan)
    with tempfile.TemporaryDirectory(prefix="paper_rates.") as work:
        row = pw.run_row(tgt, mtp, base, t, layers, plan.setting.checkpointing, dev, Path(work), Path(work))
    return {"tok_per_s_per_gpu": row["tokens_per_s"], "step_s": row["step_s"], "first_step_s": row["first_step_s"],
            "steps": t.steps, "micro_batch": t.micro_batch, "accumulation": t.batch // t.micro_batch,
            "seq_len": t.seq_len, "anchors": t.anchors, "drafters": 1, "variant": t.variant,
            "checkpointing": plan.setting.checkpointing, "fsdp": t.fsdp, "plan": info["line"],
            "predicted_bytes": plan.terms["total"], "max_allocated": row.get("max_allocated"),
            "steady": row["step_s"] is not None, "losses": row["losses"]}


def render(rec: dict) -> str:
    r, m = rec["rates"], rec["machine"]
    depth = f"{rec['layers']} of {rec['full_layers']} layers" + ("" if rec["layers"] == rec["full_layers"] else
                                                                   " (cut to what one card trains)")
    card = f" ({m['card_gib']:.0f} GiB)" if m["card_gib"] else ""
    lines = [f"Stage rates of the {rec['profile']} stand-in (random weights, {depth}) on {m['device']}{card}, "
             f"commit {rec['commit']}", "",
             "| stage | tokens/s per GPU | setting | steady state |", "|:--|---:|:--|:--|"]
    for k in STAGES:
        if k not in r:
            continue
        s = r[k]
        if k == "train":
            what = (f"1 drafter ({s['variant']}), micro-batch {s['micro_batch']} x {s['accumulation']}, "
                    f"{s['seq_len']} tokens, checkpointing {'on' if s['checkpointing'] else 'off'}, step "
                    f"{s['step_s']:.2f} s (first, compiling: {s['first_step_s']:.1f} s)")
        else:
            what = (f"{s['method']} at batch {s['batch']}, {s['prompt_tokens']} prompt + {s['new_tokens']} new "
                    f"tokens, {s['rounds_per_s']:.2f} rounds/s, {s['tokens_per_round']:.2f} tokens a round")
        lines.append(f"| {k} | {s['tok_per_s_per_gpu']:,.0f} | {what} | "
                     f"{'after a warm-up' if k != 'train' else 'median step after the first'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.paper_rates", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for rates.json and rates.md")
    ap.add_argument("--tiny", action="store_true", help="width 64, 8 layers, short sequences (the CPU check)")
    ap.add_argument("--profile", default="qwen3.6-27b", choices=pw.PROFILES)
    ap.add_argument("--stages", default=",".join(STAGES), help="which rates to measure, of " + ",".join(STAGES))
    ap.add_argument("--layers", type=int, default=0, help="stand-in depth (0: the full depth where training fits the "
                    "card, else the largest that does)")
    ap.add_argument("--regen-batch", type=int, default=0, help="0: the profile's data.batch")
    ap.add_argument("--eval-batch", type=int, default=0, help="0: the profile's eval.batch (the protocol's cap, 32)")
    ap.add_argument("--eval-method", default="zero_init_residual", help="the drafter decoded (and trained)")
    for flag, default, what in (("regen-prompt", 512, "prompt tokens of a regeneration request"),
                                ("regen-new", 256, "new tokens of a regeneration request (timed batch)"),
                                ("eval-prompt", 512, None), ("eval-new", 128, None),
                                ("warmup-new", 16, "new tokens of each decode stage's warm-up batch"),
                                ("train-steps", 3, None), ("accumulation", 2, "at most this many micro-batches a step"),
                                ("seq-len", 2048, None), ("anchors", 512, None)):
        ap.add_argument(f"--{flag}", type=at_least(1), default=default, help=what)
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    stages = [s for s in a.stages.split(",") if s]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        ap.error(f"--stages {a.stages}: expected some of {','.join(STAGES)}")
    if a.tiny:
        a.seq_len, a.anchors = min(a.seq_len, 64), min(a.anchors, 8)
        a.regen_prompt, a.regen_new, a.eval_prompt, a.eval_new = (min(x, 16) for x in (
            a.regen_prompt, a.regen_new, a.eval_prompt, a.eval_new))
        a.warmup_new, a.regen_batch, a.eval_batch = min(a.warmup_new, 2), a.regen_batch or 4, a.eval_batch or 4
        a.train_steps = min(a.train_steps, 2)
    prof = get_profile(a.profile)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    card = torch.cuda.get_device_properties(dev).total_memory / pw.GIB if dev.type == "cuda" else None
    cfg = pw.stand_in_config(a.tiny, a.profile)
    base = pw.drafter_base(cfg, a.tiny, a.profile)
    global_batch = 2 if a.tiny else prof.train.batch_size
    d = pw.spec(cfg, base, a.eval_method)  # the full depth where the one-card training plan fits, else the largest
    layers = a.layers or pw.largest_depth(cfg, lambda n: not card or pw.planned(cfg, d, a, card, global_batch, n).fits)
    if layers < 5:
        ap.error(f"not even a 5-layer {a.profile} stand-in trains on this card by the memory model")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rec = {"format": "dmtp-rates/1", "profile": a.profile, "weights": "random", "layers": layers,
           "full_layers": cfg["num_hidden_layers"],
           "machine": {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "card_gib": card,
                       "gpus": 1, "torch": torch.__version__, "transformers": transformers.__version__,
                       "kernels": pw.kernels()},
           "commit": git_sha(), "settings": vars(a), "rates": {}}
    out = Path(a.out)
    t0 = time.perf_counter()
    tgt, mtp = pw.build(cfg, layers, dev, dtype, a.seed)
    rec["build_s"] = time.perf_counter() - t0
    for s in (s for s in STAGES if s in stages):
        t1 = time.perf_counter()
        if s == "regen":
            rec["rates"][s] = stage_regen(tgt, a, prof, dev)
        elif s == "eval":
            rec["rates"][s] = stage_eval(tgt, mtp, base, a, prof, layers, dev, dtype)
        else:
            rec["rates"][s] = stage_train(tgt, mtp, base, a, cfg, layers, dev, card, global_batch)
        rec["rates"][s]["stage_s"] = time.perf_counter() - t1
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        rec["wall_s"] = time.perf_counter() - t0
        write_json(out / "rates.json", rec)  # after each stage: a later stage's failure keeps the earlier rates
        write_text(out / "rates.md", render(rec))
    print(render(rec))
    print(f"written {out / 'rates.json'} in {rec['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
