"""The losslessness check: divergence positions and the target's top-2 gap where outputs first differ."""
import torch

from dmtp.analysis.lossless import TIE, add_top2_gaps, compare, first_divergence, top2_gap
from dmtp.models import tiny


def test_first_divergence_and_compare():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # one stopped early (EOS / length)
    ref = {"a": [1, 2, 3], "b": [4, 5]}
    row, flips = compare(ref, [{"id": "a", "output_ids": [1, 2, 3]}, {"id": "b", "output_ids": [4, 6]}], "mtp", "d")
    assert row == {"method": "mtp", "dataset": "d", "n": 2, "identical": 1, "divergent": "b@1"}
    assert flips == [{"method": "mtp", "dataset": "d", "id": "b", "position": 1, "ar_token": 5, "token": 6}]


def test_top2_gap_is_the_targets_own_margin():
    tgt, _ = tiny.build("qwen3", seed=0)
    seq = [5, 7, 9, 11]
    with torch.no_grad():
        logits = tgt.model(torch.tensor([seq])).logits[0, -1].float()
    top = logits.topk(2).values
    gap, top1 = top2_gap(tgt, seq)
    assert abs(gap - float(top[0] - top[1])) < 1e-4 and gap >= 0 and abs(top1 - float(top[0])) < 1e-4


def test_a_flip_is_a_tie_only_in_reduced_precision_and_within_its_rounding():
    """`tie`: the top-2 gap at the flip within TIE x |top-1| of a bf16 target; an fp32 flip is never a tie."""
    tgt, _ = tiny.build("qwen3", seed=0)
    flips = [{"id": "a", "dataset": "d", "position": 2}]
    add_top2_gaps(tgt, flips, {"a": [5, 7]}, {"d": {"a": [9, 11, 3]}})
    assert flips[0]["tie"] is False and flips[0]["top2_gap"] >= 0
    tgt.model.to(torch.bfloat16)
    add_top2_gaps(tgt, flips, {"a": [5, 7]}, {"d": {"a": [9, 11, 3]}})
    assert flips[0]["tie"] == (flips[0]["top2_gap"] <= TIE * max(1.0, abs(flips[0]["top1_logit"])))
