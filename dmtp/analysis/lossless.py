"""Losslessness at T = 0 (the one comparison the pipeline's `tables` stage and `python -m dmtp.cli.lossless` share):
each method's output records against `ar`'s, the first differing position of each request, and the target's top-1
minus top-2 logit there (`top2_gap`: how near a tie it was; bf16 verify and AR forwards round differently).

    rows, flips = compare_runs({"0": [5, 6]}, {"dflash": [{"id": "0", "output_ids": [5, 7]}]}, "humaneval")
    # rows: [{"method": "dflash", "n": 1, "identical": 0, "divergent": "0@1", ...}]; flips: one, at position 1
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


def compare_runs(ref: dict[str, list[int]], runs: dict[str, list[dict]], dataset: str) -> tuple[list[dict],
                                                                                               list[dict]]:
    """`compare` for every method of `runs` (name -> its records): one summary row each, all divergences."""
    rows, flips = [], []
    for method, recs in runs.items():
        row, f = compare(ref, recs, method, dataset)
        rows.append(row)
        flips += f
    return rows, flips


TIE = 2 ** -5  # a flip is a measured top-2 tie when top-1 - top-2 <= TIE * max(1, |top-1|): the rounding of a bf16
# forward (8 mantissa bits: 2^-8 relative per value, summed over a layer's reductions) moves logits by that much when
# the batch shape changes how a kernel accumulates; an fp32 forward must show no flip at all


def add_top2_gaps(target, flips: list[dict], prompt_ids: dict[str, list[int]], refs: dict[str, dict]) -> None:
    """Set each flip's `top2_gap` at its position (prompt + the shared `ar` prefix), where its prompt is known, and
    `tie`: whether the gap is within the rounding of the target's precision (`TIE`). refs: dataset -> (id -> ar
    output ids)."""
    for f in flips:
        if f["id"] in prompt_ids:
            ref = refs[f["dataset"]][f["id"]]
            gap, top = top2_gap(target, prompt_ids[f["id"]] + ref[: f["position"]])
            f["top2_gap"], f["top1_logit"] = gap, top
            f["tie"] = target.dtype != torch.float32 and gap <= TIE * max(1.0, abs(top))


@torch.no_grad()
def top2_gap(target, seq: list[int]) -> tuple[float, float]:
    """The target's top-1 minus top-2 logit after `seq` (prompt + the shared output prefix), and the top-1 logit."""
    top = target.features(torch.tensor([seq], device=target.device)).logits[0, -1].topk(2).values
    return float(top[0] - top[1]), float(top[0])
