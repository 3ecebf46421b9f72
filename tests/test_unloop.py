"""Sequence-level unlikelihood fine-tuning (dmtp/training/unloop.py): the negative candidates are exactly the tokens of
repeated n-grams in the continuation, the loss is -log(1 - p) over them, and a few steps on a tiny target lower the
probability of the repeated tokens without touching the rest of the loss."""
import math

import numpy as np
import pytest
import torch

from dmtp.config import PretrainConfig, TargetArch
from dmtp.training.pretrain import build_target
from dmtp.training.unloop import repeat_candidates, unlikelihood, unloop


def test_candidates_are_the_repeated_ngrams_after_the_prompt():
    # prompt 1 2 3 | continuation 4 1 2 3 5 6 5 6 5 6
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 6, 5, 6, 5, 6]])
    c = repeat_candidates(ids, start=3, n=3)[0].tolist()
    # "1 2 3" repeats at positions 4-6 (its first copy is in the prompt); "5 6 5" first at 7-9, again at 9-11
    # (overlapping), "6 5 6" at 8-10 then 10-12
    want = [False] * 13
    for t in (4, 5, 6, 9, 10, 11, 12):
        want[t] = True
    assert c == want
    assert not repeat_candidates(torch.tensor([[1, 2, 3, 1, 2, 3]]), start=3, n=4).any()  # no 4-gram repeats
    # the prompt itself is never a candidate, even when it repeats
    assert not repeat_candidates(torch.tensor([[7, 7, 7, 7, 7, 8]]), start=5, n=2)[0, :5].any()


def test_unlikelihood_is_minus_log_one_minus_p_over_the_candidates():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    ids = torch.randint(0, 11, (2, 5))
    cand = torch.zeros(2, 5, dtype=torch.bool)
    cand[0, 2] = cand[1, 4] = True
    p = torch.softmax(logits, -1)
    want = -(math.log(1 - p[0, 1, ids[0, 2]]) + math.log(1 - p[1, 3, ids[1, 4]])) / 2
    assert abs(float(unlikelihood(logits, ids, cand)) - want) < 1e-5
    none = unlikelihood(logits.requires_grad_(), ids, torch.zeros_like(cand))
    assert float(none.detach()) == 0.0
    none.backward()  # no candidate: a zero loss that still backpropagates
    # p -> 1 stays finite (1 - p clamped)
    hot = torch.full((1, 2, 3), -1e4)
    hot[0, 0, 1] = 1e4
    assert math.isfinite(float(unlikelihood(hot, torch.tensor([[0, 1]]), torch.tensor([[False, True]]))))


def test_unloop_steps_lower_the_repeated_tokens_probability():
    """On a periodic corpus (pretraining alone teaches the model to repeat it), the same steps with the unlikelihood
    term (alpha 2) leave the repeated tokens of a fixed periodic sequence less probable than without it (alpha 0)."""
    rng = np.random.default_rng(0)
    tokens = np.tile(rng.integers(1, 40, size=12), 300)
    seq = torch.from_numpy(tokens[None, :48].astype(np.int64))
    cand = repeat_candidates(seq, start=8, n=4)
    assert cand[0, 12:].all()  # the second period on is repeats
    ul = {}
    for alpha in (0.0, 2.0):
        torch.manual_seed(0)
        tgt, mtp = build_target(TargetArch(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, head_dim=16, intermediate_size=64), 40, eos_id=0)
        cfg = PretrainConfig(tokens=4000, seq_len=16, batch_size=4, lr=1e-3, log_every=10, unloop_steps=40,
                             unloop_alpha=alpha, unloop_lr=3e-3, unloop_every=10, unloop_prompts=16,
                             unloop_prompt_len=8, unloop_new=16, unloop_batch=8)
        hist = unloop(tgt, mtp, tokens, cfg, eos_id=0, log=lambda s: None)
        assert [h["step"] for h in hist] == [0, 10, 20, 30, 39] and all(math.isfinite(h["ul"]) for h in hist)
        assert not tgt.model.training and not any(p.requires_grad for p in tgt.model.parameters())
        with torch.no_grad():
            ul[alpha] = float(unlikelihood(tgt.model(input_ids=seq).logits, seq, cand))
    assert ul[2.0] < 0.5 * ul[0.0], ul


def test_unlikelihood_settings_key_the_experiment_only_when_they_run():
    from dataclasses import asdict

    from dmtp.analysis.report.data import experiment_key
    from dmtp.cli.pipeline import fingerprints
    from dmtp.cli.stages import fingerprint
    from dmtp.profiles import PROFILES

    off, on = PROFILES["smoke"](), PROFILES["smoke"]()
    on.pretrain = PretrainConfig(**dict(asdict(on.pretrain), unloop_steps=10))
    old = {k: v for k, v in asdict(off.pretrain).items() if not k.startswith("unloop_")}  # written before them
    assert experiment_key({"pretrain": old}) == experiment_key({"pretrain": asdict(off.pretrain)})
    assert experiment_key({"pretrain": asdict(on.pretrain)}) != experiment_key({"pretrain": asdict(off.pretrain)})
    assert fingerprints(off)["target"]["pretrain"] == fingerprint(old)  # run control aside
    assert fingerprints(on)["target"]["pretrain"]["unloop_steps"] == 10


def test_loop_negatives_are_the_trailing_loop_past_its_first_copy():
    """`unloop_negatives="loop"`: only the tokens that copy the loop a continuation ends in (>= 16 tokens, >= 2 copies:
    the evaluation's loop_frac), from its second copy on; a row ending in no loop, and the prompt, have none."""
    from dmtp.analysis.metrics import loop_span
    from dmtp.training.unloop import loop_candidates, negatives

    block = list(range(10, 18))  # 8 tokens
    prompt = [1, 2, 3]
    looped = prompt + [4, 5] + block * 3 + block[:3]  # continuation: 4 5 | block x 3 + 3 tokens
    assert loop_span(looped[3:]) == (2, 8)
    rows = torch.tensor([looped, prompt + list(range(40, 69))])
    c = loop_candidates(rows, start=3)
    want = [False] * len(looped)
    for t in range(3 + 2 + 8, len(looped)):
        want[t] = True
    assert c[0].tolist() == want
    assert not c[1].any()
    # short repeats (a 4-gram twice) are n-gram negatives but no loop
    short = torch.tensor([prompt + [5, 6, 7, 8, 9, 5, 6, 7, 8, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]])
    assert negatives(short, 3, "ngram", 4).any() and not negatives(short, 3, "loop", 4).any()
    with pytest.raises(ValueError, match="unloop_negatives"):
        PretrainConfig(unloop_negatives="bigram")
