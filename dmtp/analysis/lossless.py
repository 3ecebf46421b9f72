"""Losslessness at T = 0 (the one comparison the pipeline's `tables` stage and `python -m dmtp.cli.lossless` share):
each method's output records against `ar`'s, the first differing position of each request, and the target's top-1
minus top-2 logit there (`top2_gap`: how near a tie it was; bf16 verify and AR forwards round differently).

    rows, flips = compare_runs({"0": [5, 6]}, {"dflash": [{"id": "0", "output_ids": [5, 7]}]}, "humaneval")
    # rows: [{"method": "dflash", "n": 1, "identical": 0, "divergent": "0@1", ...}]; flips: one, at position 1
"""
from __future__ import annotations

import copy
import warnings

import torch

from dmtp.models.target import segmented


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


TIE = 2 ** -5  # the rule: a flip is a top-2 tie when top-1 - top-2 <= TIE * max(1, |top-1|): the rounding of a bf16
# forward (8 mantissa bits: 2^-8 relative per value, summed over a layer's reductions) moves logits by that much when
# the batch shape changes how a kernel accumulates; an fp32 forward must show no flip at all
SHAPES = (0, 1, 4, 8)  # rows appended after the flip's position in the measured bf16 passes (`bf16_error`): each row
# count a different GEMM shape, as AR's one-row step and a verify's k + 1 rows are


def add_top2_gaps(target, flips: list[dict], prompt_ids: dict[str, list[int]], refs: dict[str, dict]) -> None:
    """Set each flip's `top2_gap` at its position (prompt + the shared `ar` prefix), where its prompt is known, and
    whether it is a tie of the target's reduced precision, two ways:
    - `tie_rule`: the gap within `TIE` of the top-1 logit (a bound on bf16 rounding, relative to the logit);
    - `tie_measured`: the two tokens' margin in fp32 (`fp32_margin`: AR's token minus the method's, the target's
      own bf16 weights computed in fp32) is no larger than the bf16 forward's measured error on that margin there
      (`bf16_error`: the largest |bf16 margin - fp32 margin| over uncached passes of `SHAPES` row counts), so bf16
      rounding alone can order the two either way. It holds where the rule's bound, relative to the top-1 logit, is
      too tight (small logits); the engine's cached passes round more than these, so it errs towards "no tie".
    `tie` = either. An fp32 target's flip is never a tie. refs: dataset -> (id -> ar output ids)."""
    known = [f for f in flips if f["id"] in prompt_ids]
    reduced = target.dtype != torch.float32
    wide = None
    if reduced and known:
        try:
            wide = _upcast(target)
        except Exception as e:  # noqa: BLE001 - the rule still judges every flip; say why the measurement is missing
            warnings.warn(f"lossless: no fp32 copy of the target ({type(e).__name__}: {e}); ties judged by the rule "
                          "alone")
    rows, margins = {}, {}  # every method (and seed) of a run flips at the same few positions: each measured once
    for f in known:
        ref = refs[f["dataset"]][f["id"]]
        seq = prompt_ids[f["id"]] + ref[: f["position"]]
        at = (f["dataset"], f["id"], f["position"])
        if at not in rows:
            rows[at] = logits_after(target, seq)  # the top-2 gap and the unpadded bf16 margin read this one pass
        gap, top = f["top2_gap"], f["top1_logit"] = _gap(rows[at])
        f["tie_rule"] = reduced and gap <= TIE * max(1.0, abs(top))
        f["tie_measured"] = False
        pair = (f.get("ar_token"), f.get("token"))
        if wide is not None and None not in pair and (at, pair) not in margins:
            tail = ref[f["position"]: f["position"] + max(SHAPES)]
            tail = tail + [pair[0]] * (max(SHAPES) - len(tail))  # rows after the position: they do not reach it
            try:
                exact = margin(wide, seq, pair)
                narrow = [_margin(rows[at], pair)] + [margin(target, seq + tail[:j], pair, at=len(seq) - 1)
                                                      for j in SHAPES if j]
                margins[at, pair] = exact, max(abs(m - exact) for m in narrow)
            except Exception as e:  # noqa: BLE001 - as above: the rule judges what cannot be measured
                warnings.warn(f"lossless: the tie at {at} was not measured ({type(e).__name__}: {e}); the rest are "
                              "judged by the rule alone")
                wide = None
        if (at, pair) in margins:
            exact, err = f["fp32_margin"], f["bf16_error"] = margins[at, pair]
            f["tie_measured"] = abs(exact) <= err
        f["tie"] = bool(f["tie_rule"] or f["tie_measured"])


def _upcast(target):
    """An fp32 copy of a reduced-precision target (the reference its bf16 margins are measured against). On a GPU
    only where it takes at most half the free memory (a paper-scale target's copy would not fit beside it)."""
    need = 4 * sum(p.numel() for p in target.model.parameters())
    if target.device.type == "cuda" and need > torch.cuda.mem_get_info(target.device)[0] // 2:
        raise MemoryError(f"an fp32 copy needs {need / 2**30:.1f} GiB, more than half the free device memory")
    wide = copy.deepcopy(target)
    for m in wide.model.modules():  # a copied wrapper (`target.segmented`) still calls the original's forward
        if getattr(m, "_dmtp_segmented", False):
            del m.forward, m._dmtp_segmented
            segmented(m)
    wide.model.float()
    if wide.dtype != torch.float32:
        raise RuntimeError(f"an fp32 copy of the target is still {wide.dtype}")
    return wide


@torch.no_grad()
def logits_after(target, seq: list[int], at: int = -1) -> torch.Tensor:
    """The target's fp32 logits [V] at row `at` (default: the last) of an uncached pass over `seq`."""
    return target.features(torch.tensor([seq], device=target.device)).logits[0, at].float()


def _gap(logits: torch.Tensor) -> tuple[float, float]:
    top = logits.topk(2).values
    return float(top[0] - top[1]), float(top[0])


def _margin(logits: torch.Tensor, pair: tuple[int, int]) -> float:
    return float(logits[pair[0]] - logits[pair[1]])


def margin(target, seq: list[int], pair: tuple[int, int], at: int | None = None) -> float:
    """The target's logit of pair[0] minus that of pair[1] at row `at` (default: the last) of an uncached pass over
    `seq`."""
    return _margin(logits_after(target, seq, -1 if at is None else at), pair)


def top2_gap(target, seq: list[int]) -> tuple[float, float]:
    """The target's top-1 minus top-2 logit after `seq` (prompt + the shared output prefix), and the top-1 logit."""
    return _gap(logits_after(target, seq))
