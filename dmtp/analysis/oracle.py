"""Acceptance ceilings at T > 0 for target-only verification with greedy (deterministic) drafts.

    from dmtp.analysis.oracle import oracle_ceiling, round_ceiling_run
    ar = read_jsonl("results/mini/runs/ablation/ar/humaneval_T1.jsonl")
    prompts = {p["id"]: tok(p["prompt"], add_special_tokens=False)["input_ids"] for p in humaneval_prompts()}
    c = oracle_ceiling(target, ar, prompts, temperature=1.0, k=7)   # {"cumulative": [C_1..C_7], ...}
    b = round_ceiling_run(target, dflash_records, prompts, temperature=1.0, k=7)
    # tiny, CPU:
    python -c "from dmtp.models import tiny; from dmtp.analysis.oracle import pmax_along; \
        t, _ = tiny.build(); print(pmax_along(t, [[5, 7, 9]], [[3, 4, 5, 6]], 1.0))"

Why a ceiling. In a round at context c the target samples y_1 ~ p(.|c) and the draft T1 is accepted iff y_1 = T1;
given that, y_2 ~ p(.|c, T1) is checked against T2, and so on. So for drafts fixed by c (greedy drafters, whatever
they condition on)
    P(L >= j | c) = prod_{i<j} p(T_{i+1} | c, T_1..T_i)  <=  prod_{i<j} p_max(c, T_1..T_i),
with p_max(x) = max_v softmax(logits(x) / T)_v, the target's top-1 probability at temperature T.

Two estimates of it, both from one teacher-forced, batched target forward over prompt + output ids (`pmax_along`):

1. `oracle_ceiling` (method-free, along the `ar` trajectory): C_j = mean over positions t of
   prod_{i<j} p_max[t+i] (`metrics.ceiling`), acceptance-length ceiling 1 + sum_j C_j. The `ar` output at T is a
   sample of the target's own law at T, and lossless decoding makes every method's output a sample of that same law,
   so the statistics of p_max along the `ar` path are those along any method's path; one path serves every method.
   What it covers: j = 1 is a true bound per round (P(T1 accepted | c) <= p_max(c)); averaging over all positions
   rather than over a method's round starts (which follow rejections, i.e. uncertain spots) probably errs high.
   What it does not: for j >= 2 the product runs along the target's SAMPLED continuation, while the bound above runs
   along the DRAFT continuation. On the event that T1..T_{j-1} were accepted the two coincide, but the expectation
   weighs paths differently: a drafter that steers into continuations where the target is more confident than on its
   typical path can exceed C_j (e.g. p(A|c) = p(B|c) = 1/2, after A the target is certain, after B uniform over 100
   tokens: drafting A then the certain token gives P(L >= 2) = 0.5 > C_2 = 0.5 x (0.5 x 1 + 0.5 x 0.01)). So C_j
   (j >= 2) is the profile of an idealised drafter accepted at p_max on every step of the target's own path, a
   reference line, not a theorem. It also says nothing at T = 0 (p_max = 1) and assumes target-only verification.
2. `round_ceiling_run` (per method, exact): along a method's OWN output, each round r that accepted >= j-1 drafts
   contributes p_max at the output index of draft j — there the context IS c, T_1..T_{j-1}, so
       P(L >= j) <= E[sum_r 1{L_r >= j-1} p_max_r,j] / E[rounds]
   holds for any greedy drafter (each round's term has conditional expectation >= that of 1{L_r >= j}). It bounds
   the conditional rates too: P(L >= j | L >= j-1) <= bound_j / reach_j (`metrics.round_ceiling`).
"""
from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from dmtp.analysis.metrics import ceiling, round_ceiling
from dmtp.engine.methods import AR


@torch.no_grad()
def pmax_along(target, prompts: list[list[int]], outputs: list[list[int]], temperature: float,
               batch_size: int = 8, progress: bool = False) -> list[np.ndarray]:
    """p_max[t] = max_v softmax(logits / T)_v of the target predicting output token t from prompt + output[:t], for
    every request; one teacher-forced forward per group of `batch_size` requests (right-padded, causal: padding is
    never seen by a real row). T <= 0: all ones (greedy acceptance is a yes/no). Memory: B x len x vocab floats."""
    if len(prompts) != len(outputs):
        raise ValueError(f"{len(prompts)} prompts but {len(outputs)} outputs")
    if temperature <= 0:
        return [np.ones(len(o)) for o in outputs]
    out = []
    for i in tqdm(range(0, len(prompts), batch_size), desc="p_max", disable=not progress, leave=False):
        seqs = [list(p) + list(o[:-1]) for p, o in zip(prompts[i: i + batch_size], outputs[i: i + batch_size])]
        ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long, device=target.device)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s, device=target.device)
        logits = target.features(ids).logits  # [B, L, V] float32
        for b, (p, o) in enumerate(zip(prompts[i: i + batch_size], outputs[i: i + batch_size])):
            rows = logits[b, len(p) - 1: len(p) - 1 + len(o)]  # the rows predicting output tokens 0..n-1
            out.append(torch.softmax(rows / temperature, -1).amax(-1).cpu().double().numpy())
    return out


def _paths(records, prompt_ids):
    missing = [r["id"] for r in records if r["id"] not in prompt_ids]
    if missing:
        raise KeyError(f"no prompt ids for {len(missing)} records (first: {missing[0]!r})")
    return [prompt_ids[r["id"]] for r in records], [r["output_ids"] for r in records]


def oracle_ceiling(target, ar_records: list[dict], prompt_ids: dict, temperature: float, k: int = 7,
                   batch_size: int = 8) -> dict:
    """The method-free ceiling along the `ar` trajectory at `temperature` (module docstring, 1.): `cumulative`
    [C_1..C_k], `acceptance_length` = 1 + sum_j C_j, `windows` (positions averaged). `prompt_ids`: id -> prompt ids."""
    bad = {(r["method"], r["temperature"]) for r in ar_records} - {(AR.name, temperature)}
    if bad:
        raise ValueError(f"the ceiling runs along {AR.name} records at T={temperature:g}, got (method, T) "
                         f"{sorted(bad)}")
    pm = pmax_along(target, *_paths(ar_records, prompt_ids), temperature, batch_size)
    cum = ceiling(pm, k)
    return {"cumulative": cum, "acceptance_length": 1 + sum(cum), "windows": sum(max(0, len(p) - k) for p in pm)}


def round_ceiling_run(target, records: list[dict], prompt_ids: dict, temperature: float, k: int,
                      batch_size: int = 8) -> dict:
    """The exact per-round bound for one method's run (module docstring, 2.): counts summed over requests
    (`rounds`, `reach`, `bound`) and `cumulative` [bound_j / rounds], `conditional` [bound_j / reach_j]."""
    pm = pmax_along(target, *_paths(records, prompt_ids), temperature, batch_size)
    tot = {"rounds": 0, "reach": [0] * k, "bound": [0.0] * k}
    for p, r in zip(pm, records):
        c = round_ceiling(p, r["accepted"], k)
        tot["rounds"] += c["rounds"]
        tot["reach"] = [a + b for a, b in zip(tot["reach"], c["reach"])]
        tot["bound"] = [a + b for a, b in zip(tot["bound"], c["bound"])]
    n = tot["rounds"]
    tot["cumulative"] = [b / n if n else float("nan") for b in tot["bound"]]
    tot["conditional"] = [b / m if m else float("nan") for b, m in zip(tot["bound"], tot["reach"])]
    return tot
