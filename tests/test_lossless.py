"""The losslessness check: divergence positions and the target's top-2 gap where outputs first differ."""
import torch

from dmtp.analysis.lossless import compare, first_divergence, top2_gap
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
    assert abs(top2_gap(tgt, seq) - float(top[0] - top[1])) < 1e-4
    assert top2_gap(tgt, seq) >= 0
