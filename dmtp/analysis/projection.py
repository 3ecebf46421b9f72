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
    """The full run's counts (the qwen3.6-27b profile; docs/METHOD.md, "The blog's numbers")."""
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


# --- from rates measured at the paper's depth (experiments/paper_rates.py) -------------------------------------------
RATES_FORMAT = "dmtp-rates/1"
RATE_STAGES = ("regen", "train", "eval")
# the open reproduction's evaluated runs -> the blog's column (reference.json, open_repro) whose acceptance length
# a projection assumes for it; zero_init_residual has no number of its own ("close to fusion": fusion's, the blog's
# `dmtp`)
BLOG_COLUMN = {"mtp": "mtp", "dflash": "dflash", "fusion": "dmtp", "zero_init_residual": "dmtp", "dflash2": "dflash2",
               "dmtp_d2": "dmtp_d2"}


def read_rates(path) -> dict:
    """A rates file of `experiments/paper_rates.py`, checked: its format, the machine it came from, the depth, and
    for each stage present a positive `tok_per_s_per_gpu` (eval also `rounds_per_s` and `batch`). One line naming
    the file and the field otherwise (ValueError)."""
    import json
    from pathlib import Path

    p = Path(path)
    try:
        r = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"{p}: cannot be read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e.msg} at line {e.lineno})") from None

    def need(ok, field, what):
        if not ok:
            raise ValueError(f"{p}: {field}: expected {what}")

    need(isinstance(r, dict) and r.get("format") == RATES_FORMAT, "format", f"{RATES_FORMAT!r} (a rates file of "
         "experiments/paper_rates.py)")
    m = r.get("machine")
    need(isinstance(m, dict) and isinstance(m.get("device"), str), "machine.device", "the device's name")
    need(m.get("card_gib") is None or _positive(m["card_gib"]), "machine.card_gib", "the card's memory in GiB")
    for k in ("layers", "full_layers"):
        need(isinstance(r.get(k), int) and r[k] > 0, k, "a positive layer count")
    need(r["layers"] <= r["full_layers"], "layers", f"at most full_layers ({r['full_layers']})")
    rates = r.get("rates")
    need(isinstance(rates, dict) and rates and set(rates) <= set(RATE_STAGES), "rates",
         f"rates of some of {', '.join(RATE_STAGES)}")
    for k, s in rates.items():
        need(isinstance(s, dict) and _positive(s.get("tok_per_s_per_gpu")), f"rates.{k}.tok_per_s_per_gpu",
             "a positive number")
    if "eval" in rates:
        for f in ("rounds_per_s", "batch"):
            need(_positive(rates["eval"].get(f)), f"rates.eval.{f}", "a positive number")
    return r


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def blog_acceptance(runs=tuple(BLOG_COLUMN)) -> dict[str, float]:
    """Per evaluated run, the blog's open-reproduction acceptance length (Qwen3.6-27B, T = 0) averaged over its five
    sets, from the column `BLOG_COLUMN` names (reference.json, table open_repro)."""
    import json
    from pathlib import Path

    t = json.loads(Path(__file__).with_name("reference.json").read_text())["open_repro"]
    cols = t["columns"]
    return {run: sum(row[cols.index(BLOG_COLUMN[run])] for row in t["rows"]) / len(t["rows"]) for run in runs}


def project_rates(rates: dict, full: FullProtocol = FULL_27B, gpus: int = 8, tau: dict | None = None) -> dict:
    """Hours each stage of the full protocol takes on `gpus` cards at the per-GPU rates of a rates file
    (`read_rates`): regeneration tokens / (rate x gpus); training: every drafter run trained alone, tokens x epochs x
    runs / (rate x gpus); evaluation: per run its tokens / (rounds/s x batch x its acceptance length `tau`, default
    `blog_acceptance`), over at most one GPU per (run, set) file. A rate measured on fewer layers than the full depth
    is scaled by layers / full_layers (the target's share of the work grows with its depth; the drafter's does not,
    so the scaled time is an upper bound). A stage the file lacks is nan."""
    r, scale = rates["rates"], rates["layers"] / rates["full_layers"]
    tau = tau or blog_acceptance()
    runs = list(tau)
    rate = lambda k: r[k]["tok_per_s_per_gpu"] * scale if k in r else math.nan  # noqa: E731
    regen_tokens = full.train_prompts * full.regen_tokens_per_prompt
    train_work = full.epochs * full.train_prompts * full.train_tokens_per_sequence * full.drafter_runs
    run_tokens = full.eval_requests * full.eval_tokens_per_request
    h = {"regen_h": regen_tokens / (rate("regen") * gpus) / 3600,
         "train_h": train_work / (rate("train") * gpus) / 3600}
    if "eval" in r:
        per_round = r["eval"]["rounds_per_s"] * scale * r["eval"]["batch"]  # request-rounds a second on one GPU
        gpu_h = sum(run_tokens / (per_round * tau[run]) for run in runs) / 3600
        h["eval_h"] = gpu_h / min(gpus, len(runs) * 5)  # whole (run, set) files are dealt to the GPUs
    else:
        h["eval_h"] = math.nan
    h["total_h"] = sum(h.values())
    return {"projection": True, "gpus": gpus, "full": asdict(full), "scale": scale, "tau": tau, "hours": h,
            "machine": rates["machine"], "layers": rates["layers"], "full_layers": rates["full_layers"],
            "rates": {k: r[k]["tok_per_s_per_gpu"] for k in r} | (
                {"eval_rounds_per_s": r["eval"]["rounds_per_s"], "eval_batch": r["eval"]["batch"]}
                if "eval" in r else {}),
            "lengths": {k: (r[k]["prompt_tokens"], r[k]["new_tokens"]) for k in ("regen", "eval")
                        if k in r and "prompt_tokens" in r[k] and "new_tokens" in r[k]}}


def render_rates(p: dict, source: str = "") -> str:
    """`project_rates`'s answer as lines, labelled a projection, with the rates, the machine and depth they come from
    and the acceptance lengths assumed."""
    r, h, f, m = p["rates"], p["hours"], p["full"], p["machine"]
    card = f", {m['card_gib']:.0f} GiB" if m.get("card_gib") else ""
    depth = (f"{p['layers']} layers" if p["layers"] == p["full_layers"] else
             f"{p['layers']} of {p['full_layers']} layers, rates scaled by {p['scale']:.3f} (an upper bound on time)")
    def num(k, d=0):  # the rate measured, and where the depth was cut the rate the projection takes
        if k not in r:
            return "not measured"
        return f"{r[k]:,.{d}f}" + ("" if p["scale"] == 1 else f" (x {p['scale']:.3f} = {r[k] * p['scale']:,.{d}f})")

    hours = lambda k, d=1: "-" if math.isnan(h[k]) else f"{h[k]:,.{d}f} h"  # noqa: E731
    taus = ", ".join(f"{k} {v:.2f}" for k, v in p["tau"].items())
    at = {k: f" (measured at {a} prompt + {b} new tokens)" for k, (a, b) in p.get("lengths", {}).items()}
    return "\n".join([
        f"PROJECTION (not a measurement) of the full open reproduction on {p['gpus']} GPU(s) like the one measured "
        f"({m['device']}{card}; {source or 'rates file'}; random-weight stand-in, {depth}):",
        f"  regen: {f['train_prompts']:,} prompts x {f['regen_tokens_per_prompt']:g} tokens at {num('regen')} tok/s "
        f"per GPU{at.get('regen', '')} -> {hours('regen_h')}",
        f"  train: {f['epochs']} epochs x {f['train_prompts']:,} sequences x {f['train_tokens_per_sequence']:g} tokens"
        f" x {f['drafter_runs']} drafters, each alone, at {num('train')} tok/s per GPU (one drafter, steady steps) "
        f"-> {hours('train_h')}",
        f"  eval: {f['eval_requests']} requests x {f['eval_tokens_per_request']:g} tokens for each of "
        f"{len(p['tau'])} runs at {num('eval_rounds_per_s', 2)} rounds/s at batch "
        f"{r.get('eval_batch', '-')} per GPU{at.get('eval', '')} x the blog's acceptance length -> "
        f"{hours('eval_h', 2)}",
        f"  acceptance length assumed (random weights accept nothing; the blog's open-reproduction table, mean of "
        f"its five sets; zero_init_residual as fusion): {taus}",
        f"  total: {hours('total_h')}. Lengths at their caps (upper bounds); steady-state rates (compilation and "
        "warm-up excluded) of one card (training on several GPUs adds FSDP's communication, and the plan there may "
        "take another micro-batch).",
    ])
