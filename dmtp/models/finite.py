"""Numbers that must stay finite: a target's RoPE settings checked when its config is read, and the one error for
non-finite logits or losses, naming what most likely made them (a NaN is an error whatever made it: NaN weights,
a degenerate RoPE scaling, an overflow in a narrow dtype).

    check_rope(cfg.rope_parameters, f"{path}/config.json")   # factor 0 -> "...: rope factor=0.0: expected ..."
    raise ValueError(nonfinite("target checkpoint x", "the first forward of a decode gives non-finite logits",
                               target))
"""
from __future__ import annotations

import math

# RoPE fields that scale or divide positions and frequencies: each a finite number > 0 when present
_POSITIVE = ("rope_theta", "factor", "attention_factor", "beta_fast", "beta_slow", "low_freq_factor",
             "high_freq_factor")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rope_problem(params) -> str | None:
    """What is wrong with a RoPE parameter dict (`rope_parameters` / `rope_scaling` of a config; transformers may
    nest one per layer type), or None. Every number must be finite; the scaling factors, the base and yarn's betas
    > 0; `partial_rotary_factor` in (0, 1]; llama3's high_freq_factor > low_freq_factor (it divides by their
    difference); longrope's factor lists positive; `original_max_position_embeddings` a positive integer."""
    if not params:
        return None
    if not isinstance(params, dict):
        return f"rope settings {params!r}: expected an object"
    if params and all(isinstance(v, dict) for v in params.values()):  # per layer type
        for kind, sub in params.items():
            why = rope_problem(sub)
            if why:
                return f"{kind}: {why}"
        return None
    kind = params.get("rope_type", params.get("type", "default"))
    for k, v in params.items():
        if _number(v) and not math.isfinite(v):
            return f"rope {k}={v!r}: expected a finite number"
        if k in _POSITIVE and v is not None and not (_number(v) and v > 0):
            return f"rope {k}={v!r} (rope_type {kind}): expected a finite number > 0"
    prf = params.get("partial_rotary_factor")
    if prf is not None and not (_number(prf) and 0 < prf <= 1):
        return f"rope partial_rotary_factor={prf!r}: expected a number in (0, 1]"
    omp = params.get("original_max_position_embeddings")
    if omp is not None and not (isinstance(omp, int) and not isinstance(omp, bool) and omp >= 1):
        return f"rope original_max_position_embeddings={omp!r}: expected an integer >= 1"
    lo, hi = params.get("low_freq_factor"), params.get("high_freq_factor")
    if _number(lo) and _number(hi) and hi <= lo:
        return f"rope high_freq_factor={hi!r} <= low_freq_factor={lo!r}: expected high > low (llama3 divides by " \
               "their difference)"
    for k in ("short_factor", "long_factor", "mrope_section"):
        v = params.get(k)
        if v is None:
            continue
        ok = isinstance(v, (list, tuple)) and all(_number(x) and math.isfinite(x) for x in v)
        if not ok or (k != "mrope_section" and not all(x > 0 for x in v)) or (k == "mrope_section"
                                                                              and not all(x >= 0 for x in v)):
            return f"rope {k}={v!r}: expected a list of finite numbers {'>= 0' if k == 'mrope_section' else '> 0'}"
    return None


def rope_settings(cfg) -> dict | None:
    """A transformers config's RoPE parameters (`rope_parameters` in transformers 5, `rope_scaling` and `rope_theta`
    before)."""
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    if params is None and getattr(cfg, "rope_theta", None) is not None:
        params = {"rope_theta": cfg.rope_theta}
    return dict(params) if isinstance(params, dict) else params


def check_rope(cfg, where: str) -> None:
    """Refuse (one line naming `where`) a config whose RoPE settings make non-finite positions (a scaling factor
    of 0 divides every position by zero: every logit NaN, every decoded token the same)."""
    why = rope_problem(rope_settings(cfg))
    if why:
        raise ValueError(f"{where}: {why} (RoPE scaling / rope_parameters)")


def likely_cause(target) -> str:
    """The most likely source of non-finite numbers in a target's forward: its RoPE settings when they are
    degenerate, float16's range when it runs in float16, else its weights or config.json."""
    cfg = getattr(target, "config", None)
    why = rope_problem(rope_settings(cfg)) if cfg is not None else None
    if why:
        return f"config.json {why}"
    dtype = str(getattr(target, "dtype", "")).removeprefix("torch.")
    if dtype == "float16":
        return "float16's range (activations over 65504 overflow): run it in bf16 or fp32"
    return f"its weights or config.json (NaN or infinity made by the arithmetic in {dtype or 'its dtype'}: e.g. a " \
           "degenerate RoPE scaling or norm weights too large)"


def nonfinite(what: str, event: str, target=None) -> str:
    """The error line for non-finite numbers: `what` (the checkpoint or run), `event` (where they appeared), the
    likely cause when a target is given."""
    src = getattr(target, "source", None)
    who = what or (f"target checkpoint {src}" if src else "the target")
    return f"{who}: {event} (NaN or infinity)" + (f"; likely cause: {likely_cause(target)}" if target is not None
                                                   else "")
