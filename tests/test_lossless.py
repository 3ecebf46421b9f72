"""The losslessness check: divergence positions and the target's top-2 gap where outputs first differ."""
import copy

import torch

from dmtp.analysis.lossless import SHAPES, TIE, add_top2_gaps, compare, first_divergence, margin, top2_gap
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
    assert flips[0]["tie_rule"] == (flips[0]["top2_gap"] <= TIE * max(1.0, abs(flips[0]["top1_logit"])))
    assert flips[0]["tie"] == (flips[0]["tie_rule"] or flips[0]["tie_measured"])


def _bf16_flip(tgt, a, b, prompt=(5, 7), ref=(9, 11, 3)):
    """A flip at output position 2 (AR's token a, the method's b) of a bf16 copy of `tgt`, measured."""
    flips = [{"id": "a", "dataset": "d", "position": 2, "ar_token": a, "token": b}]
    add_top2_gaps(tgt, flips, {"a": list(prompt)}, {"d": {"a": list(ref) + [a]}})
    return flips[0]


def test_a_measured_tie_is_a_margin_within_the_bf16_forwards_own_error():
    """`tie_measured`: AR's token minus the method's in an fp32 copy of the target (`fp32_margin`) within the bf16
    forward's measured error on that margin (`bf16_error`, over `SHAPES` row counts). Two tokens whose LM-head rows are
    equal tie in every precision (margin 0, error 0); the top-1 token against the last one is no tie; the measured
    error is the bf16 margins' largest distance from the fp32 one."""
    tgt, _ = tiny.build("qwen3", seed=0)
    seq = [5, 7, 9, 11]
    with torch.no_grad():
        logits = tgt.model(torch.tensor([seq])).logits[0, -1].float()
    order = logits.argsort(descending=True).tolist()
    assert abs(margin(tgt, seq, (order[0], order[-1])) - float(logits[order[0]] - logits[order[-1]])) < 1e-4
    tgt.model.to(torch.bfloat16)
    wide = copy.deepcopy(tgt)
    wide.model.float()  # the bf16 weights, computed in fp32: the reference for the bf16 forward's rounding
    exact = margin(wide, seq, (order[0], order[-1]))
    far = _bf16_flip(tgt, order[0], order[-1])
    assert far["tie_measured"] is False and far["tie"] is (far["tie_rule"] or False)
    assert abs(far["fp32_margin"] - exact) < 1e-5
    narrow = [margin(tgt, seq + [order[0]] * j, (order[0], order[-1]), at=len(seq) - 1) for j in SHAPES]
    assert abs(far["bf16_error"] - max(abs(m - exact) for m in narrow)) < 1e-5 and far["bf16_error"] > 0
    a, b = order[1], order[2]
    with torch.no_grad():
        w = tgt.model.get_output_embeddings().weight
        w[b] = w[a]  # identical rows: identical logits in any precision
    same = _bf16_flip(tgt, a, b)
    assert same["fp32_margin"] == 0 and same["bf16_error"] == 0 and same["tie_measured"] is True and same["tie"]
    assert tgt.dtype == torch.bfloat16  # the measurement upcasts a copy, never the target


def test_flips_at_one_position_are_measured_once_and_alike():
    """Every method of a run flips at the same positions: the second flip there reads the first's measurement."""
    tgt, _ = tiny.build("qwen3", seed=0)
    tgt.model.to(torch.bfloat16)
    flips = [{"method": m, "id": "a", "dataset": "d", "position": 2, "ar_token": 4, "token": 6} for m in ("x", "y")]
    calls = []
    orig = tgt.features
    tgt.features = lambda *a, **k: calls.append(1) or orig(*a, **k)
    add_top2_gaps(tgt, flips, {"a": [5, 7]}, {"d": {"a": [9, 11, 3]}})
    assert len(calls) == 1 + len(SHAPES)  # once for both flips: the top-2 pass (also the unpadded bf16 margin's), the
    # fp32 copy's (it copied the hook) and the padded bf16 margins
    keys = ("top2_gap", "top1_logit", "tie_rule", "fp32_margin", "bf16_error", "tie_measured", "tie")
    assert [flips[0][k] for k in keys] == [flips[1][k] for k in keys]


def _flip_with(monkeypatch, name, fn):
    """A bf16 flip measured with `dmtp.analysis.lossless.<name>` replaced by `fn`: (the flip, the warnings' texts)."""
    import warnings

    import dmtp.analysis.lossless as L

    monkeypatch.setattr(L, name, fn)
    tgt, _ = tiny.build("qwen3", seed=0)
    tgt.model.to(torch.bfloat16)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = _bf16_flip(tgt, 4, 6)
    return f, [str(x.message) for x in w]


def test_without_an_fp32_copy_the_rule_alone_judges_and_says_so(monkeypatch):
    """A target whose fp32 copy does not fit (a paper-scale one on its GPU) keeps the rule's judgement, with a
    warning naming why; nothing fails."""
    def no_room(target):
        raise MemoryError("an fp32 copy needs 108.0 GiB, more than half the free device memory")

    f, said = _flip_with(monkeypatch, "_upcast", no_room)
    assert any("108.0 GiB" in m and "rule alone" in m for m in said)
    assert "fp32_margin" not in f and f["tie_measured"] is False and f["tie"] is f["tie_rule"]


def test_the_fp32_copy_of_a_hybrid_target_runs_its_own_linear_attention():
    """A hybrid target's Gated DeltaNet layers carry an instance-level wrapper (`target.segmented`) whose closure holds
    the layer's own forward: copied as is, the fp32 copy's layers would call the bf16 original's (a dtype error). The
    copy re-wraps its own layers, so its margins are fp32's and the flip is measured."""
    from dmtp.analysis.lossless import _upcast

    tgt, _ = tiny.build("qwen3_5_hybrid", seed=0)
    tgt.model.to(torch.bfloat16)
    wide = _upcast(tgt)
    gdn = [m for m in wide.model.modules() if getattr(m, "_dmtp_segmented", False)]
    assert gdn and all(c.cell_contents.__self__ is m for m in gdn for c in m.forward.__closure__
                       if hasattr(c.cell_contents, "__self__"))
    assert wide.features(torch.tensor([[5, 7, 9, 11]])).logits.dtype == torch.float32
    f = _bf16_flip(tgt, 4, 6)
    assert "fp32_margin" in f and f["bf16_error"] >= 0 and tgt.dtype == torch.bfloat16


def test_a_measurement_that_fails_leaves_the_rule_and_a_warning(monkeypatch):
    """Whatever goes wrong inside a measurement (here: every margin raises) costs the measurement, never the tables
    stage: the flips keep the rule's judgement and a warning names the position."""
    def broken(*a, **k):
        raise RuntimeError("expected m1 and m2 to have the same dtype")

    f, said = _flip_with(monkeypatch, "margin", broken)
    assert any("same dtype" in m and "('d', 'a', 2)" in m for m in said)
    assert "fp32_margin" not in f and f["tie_measured"] is False and f["tie"] is f["tie_rule"]
