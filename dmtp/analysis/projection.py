"""The open reproduction's full time, projected from the stage rates a small `dmtp reproduce` run measured
(its stages.json): a projection, not a measurement. Each stage's time is its work at full size divided by the rate
measured at small size, so whatever makes the small run's rate unlike the full run's (shorter contexts, random
weights that never stop, another batch) passes into the projection; `render` says so beside the numbers.

    from dmtp.analysis.projection import FULL_27B, project, render
    print(render(project(json.load(open("runs/standin/stages.json")), FULL_27B, gpus=8)))
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class FullProtocol:
    """The full run's counts (SPEC §8 and the qwen3.6-27b profile)."""
    train_prompts: int = 1_420_909  # OpenPerfectBlend conversations regenerated
    regen_tokens_per_prompt: float = 2048.0  # generated tokens per prompt (the cap: an upper bound)
    epochs: int = 3  # passes over the regenerated sequences
    train_tokens_per_sequence: float = 2048.0  # tokens per training sequence (max_seq_len: an upper bound)
    drafter_runs: int = 5  # drafters trained side by side (dflash, fusion, zero_init_residual, dflash2, dmtp_d2)
    eval_requests: int = 480  # 80 prompts of GSM8K, MATH500, HumanEval, Alpaca, MT-Bench (two turns: 160)
    eval_tokens_per_request: float = 1024.0  # new tokens a turn (the cap: an upper bound)
    eval_methods: int = 6  # MTP415 and the five drafters


FULL_27B = FullProtocol()


def rates(stages: dict) -> dict:
    """Measured rates from a stages.json: regeneration tokens/s per GPU, training tokens x runs per second, and
    evaluation output tokens per second per (run, set) file, with the counts they come from."""
    s = stages.get("stages", {})
    out = {}
    if "regen" in s:
        r = s["regen"]
        steady = [x for x in r.get("steady_tok_per_s_per_gpu", []) if x]  # past the first batch (compiled)
        per_gpu = steady or [x for x in r.get("tok_per_s_per_gpu", []) if x]
        out["regen_tok_per_s_per_gpu"] = sum(per_gpu) / len(per_gpu) if per_gpu else math.nan
        out["regen_steady"] = bool(steady)
        out["regen_world"] = r.get("world", 1)
    if "train" in s:
        t = s["train"]
        work = t["train_tokens"] * len(t["runs"])  # token x drafter: the drafters share the target's features
        secs = t.get("train_s", t["wall_s"])  # the training loops alone, where recorded
        out["train_token_runs_per_s"] = work / secs if secs else math.nan
        out["train_runs"] = len(t["runs"])
        out["train_resumed"] = list(t.get("resumed", []))  # a resumed stage timed only part of its steps
        out["train_world"] = t.get("world", 1)
    if "eval" in s:
        f = s["eval"]["files"]
        tok, wall = sum(x["output_tokens"] for x in f), sum(x["wall_s"] for x in f)
        out["eval_tok_per_s"] = tok / wall if wall else math.nan
        out["eval_world"] = s["eval"].get("world", 1)
    return out


def project(stages: dict, full: FullProtocol = FULL_27B, gpus: int = 8) -> dict:
    """Hours each stage of the full protocol would take on `gpus` GPUs at the measured per-GPU rates (regen and
    evaluation split over GPUs with no loss; training's measured rate scaled by gpus / the GPUs it ran on), and the
    total. A stage the small run did not time is nan."""
    r = rates(stages)
    regen_tokens = full.train_prompts * full.regen_tokens_per_prompt
    train_work = full.epochs * full.train_prompts * full.train_tokens_per_sequence * full.drafter_runs
    eval_tokens = full.eval_requests * full.eval_tokens_per_request * full.eval_methods
    h = {
        "regen_h": regen_tokens / (r.get("regen_tok_per_s_per_gpu", math.nan) * gpus) / 3600,
        "train_h": train_work / (r.get("train_token_runs_per_s", math.nan) * gpus / r.get("train_world", 1)) / 3600,
        # whole (run, set) files are dealt to the GPUs: at most one GPU per file
        "eval_h": eval_tokens / (r.get("eval_tok_per_s", math.nan) * min(gpus, full.eval_methods * 5)) / 3600,
    }
    h["total_h"] = sum(h.values())
    return {"projection": True, "gpus": gpus, "full": asdict(full), "rates": r, "hours": h}


def render(p: dict) -> str:
    """Lines for a run's log: the rates measured, the counts assumed and the hours projected, labelled a projection."""
    r, h, f = p["rates"], p["hours"], p["full"]
    return "\n".join([
        f"PROJECTION (not a measurement) of the full open reproduction on {p['gpus']} GPUs, from measured rates:",
        f"  regen: {f['train_prompts']:,} prompts x {f['regen_tokens_per_prompt']:g} tokens at "
        f"{r.get('regen_tok_per_s_per_gpu', math.nan):,.0f} tok/s per GPU -> {h['regen_h']:,.1f} h"
        + ("" if r.get("regen_steady", True) else " (one batch a GPU: its rate includes compiling and tuning)"),
        f"  train: {f['epochs']} epochs x {f['train_prompts']:,} sequences x {f['train_tokens_per_sequence']:g} "
        f"tokens x {f['drafter_runs']} drafters at {r.get('train_token_runs_per_s', math.nan):,.0f} token-drafters/s "
        f"(on {r.get('train_world', 1)} GPU(s)) -> {h['train_h']:,.1f} h",
        f"  eval: {f['eval_requests']} requests x {f['eval_tokens_per_request']:g} tokens x {f['eval_methods']} "
        f"methods at {r.get('eval_tok_per_s', math.nan):,.0f} tok/s per GPU -> {h['eval_h']:,.2f} h",
        *([f"  (training resumed {', '.join(r['train_resumed'])} from a checkpoint: its rate is overstated)"]
          if r.get("train_resumed") else []),
        f"  total: {h['total_h']:,.1f} h. Rates measured at small size (short contexts, random weights that never stop,"
        " caps as upper bounds on lengths): the full run's rates differ.",
    ])
