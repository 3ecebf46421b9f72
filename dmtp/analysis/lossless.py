"""Losslessness at T = 0: each method's output against `ar`'s (the target's own greedy decoding in the same
precision), and, where they differ, how near a tie the target was at the first differing position.

In fp32 every method must match exactly. In bf16 a verify forward of k+1 rows and the AR forward of one row round
differently, so a near-tie can flip; `top2_gap` (the target's logit gap between its two best tokens at that position,
from an uncached pass over the shared prefix) says how near.

    python -m dmtp.cli.lossless --target work/mini/target --methods ar,mtp --dtype bf16 --n 40 \
        --max-new-tokens 128 --out results/mini/lossless_bf16     # add --drafters D for drafter methods
"""
from __future__ import annotations

import torch


def first_divergence(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(ref: dict[str, list[int]], recs: list[dict], method: str, dataset: str) -> tuple[dict, list[dict]]:
    """One summary row for `method` and the divergences (id, position, both tokens) against `ref` (id -> ar ids)."""
    flips = []
    for r in recs:
        a, b = ref[r["id"]], r["output_ids"]
        i = first_divergence(a, b)
        if i is not None:
            flips.append({"method": method, "dataset": dataset, "id": r["id"], "position": i,
                          "ar_token": a[i] if i < len(a) else None, "token": b[i] if i < len(b) else None})
    row = {"method": method, "dataset": dataset, "n": len(recs), "identical": len(recs) - len(flips),
           "divergent": ";".join(f"{f['id']}@{f['position']}" for f in flips)}
    return row, flips


@torch.no_grad()
def top2_gap(target, seq: list[int]) -> float:
    """The target's top-1 minus top-2 logit after `seq` (prompt + the shared output prefix)."""
    top = target.features(torch.tensor([seq], device=target.device)).logits[0, -1].topk(2).values
    return float(top[0] - top[1])
