"""Loop metrics and acceptance ceilings: hand-made numbers, brute force, and p_max from a tiny target."""
import itertools
import math
import random

import numpy as np
import pytest
import torch

from dmtp.analysis import metrics as M
from dmtp.analysis.oracle import oracle_ceiling, pmax_along, round_ceiling_run


def test_stopped_at_once():
    recs = [{"id": "a", "output_ids": [0]}, {"id": "b", "output_ids": [5, 0]}, {"id": "c", "output_ids": [7, 8]},
            {"id": "d", "output_ids": [3]}]
    assert M.stopped_at_once(recs, [0, 3]) == (0.5, ["a", "d"])
    assert M.stopped_at_once(recs, []) == (0.0, [])
    assert math.isnan(M.stopped_at_once([], [0])[0])


def test_repeat_rate():
    assert M.repeat_rate([1, 2, 3, 4, 1, 2, 3, 4], n=2) == 3 / 7  # 12 23 34 41 | 12 23 34 seen before
    assert M.repeat_rate([1, 2, 3, 4], n=2) == 0
    assert M.repeat_rate([7] * 10) == 2 / 3  # 3 eight-grams, all the same
    assert math.isnan(M.repeat_rate([1] * 7))  # no 8-gram
    assert M.repeat_rate(list(range(20)) * 2) == 13 / 33  # starts 20..32 repeat 0..12; 13..19 straddle: new


def naive_loop(t, min_tokens):
    """Brute force: the earliest start s such that t[s:] is p-periodic with >= 2 copies and >= min_tokens."""
    n = len(t)
    for s in range(n):
        L = n - s
        if L >= min_tokens and any(2 * p <= L and all(t[i] == t[i + p] for i in range(s, n - p))
                                   for p in range(1, L // 2 + 1)):
            return s
    return n


def test_trailing_loop():
    assert M.trailing_loop([5, 6] + [1, 2, 3] * 6) == 2  # 18 tokens of period 3
    assert M.trailing_loop([5, 6] + [1, 2, 3] * 5) == 17  # 15 < 16 tokens: not a loop
    assert M.trailing_loop([9] * 16) == 0 and M.trailing_loop([1] + [9] * 15) == 16
    assert M.trailing_loop(list(range(8)) + list(range(8)) + [0, 1]) == 0  # period 8: 2 copies + a partial
    assert M.trailing_loop(list(range(12)) + list(range(6)), min_tokens=4) == 18  # 1.5 copies is not a loop
    assert M.trailing_loop([]) == 0 and M.trailing_loop([4, 4], min_tokens=2) == 0
    rng = random.Random(0)
    for _ in range(300):  # random prefixes ending in random loops (sometimes none), small alphabet
        body = [rng.randrange(3) for _ in range(rng.randrange(0, 12))]
        period = [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
        t = body + period * rng.randrange(0, 6) + period[: rng.randrange(len(period))]
        for m in (2, 6, 16):
            assert M.trailing_loop(t, m) == naive_loop(t, m), (t, m)


def test_loopfree_acceptance_and_stats():
    # 1 prefill token + rounds of 3, 1, 4, 2 tokens: [1,4) [4,5) [5,9) [9,11); 10 tokens (the last round was cut)
    acc = [2, 0, 3, 1]
    assert M.round_spans(acc, 10) == [(1, 4), (4, 5), (5, 9), (9, 10)]
    assert M.acceptance_length_loopfree(acc, 5, 10) == 1 + 2 / 2  # rounds 0, 1 end by token 5
    assert M.acceptance_length_loopfree(acc, 8, 10) == 2  # round 2 reaches token 8: inside the loop
    assert M.acceptance_length_loopfree(acc, 10, 10) == M.acceptance_length(acc)  # no loop: every round
    assert math.isnan(M.acceptance_length_loopfree(acc, 3, 10))
    out = [1, 2, 3] + [4, 5] * 8 + [4]  # 20 tokens, the loop (period 2, 17 tokens) starts at 3
    rec = {"output_ids": out, "accepted": [1, 0, 3, 4, 2, 3, 1]}  # spans [1,3) [3,4) [4,8) ...
    s = M.loop_stats(rec)
    assert (s["loop_start"], s["loop_tokens"], s["loop_frac"]) == (3, 17, 17 / 20)
    assert s["acceptance_length_loopfree"] == 2  # only round 0 ([1, 3)) lies before token 3
    assert s["repeat_rate"] == pytest.approx(8 / 13)  # 13 eight-grams; from start 5 on all seen (period 2)
    free = {"output_ids": list(range(10)), "accepted": [3, 5]}
    summ = M.loop_summary([rec, free])
    assert summ["loop_frac"] == 17 / 30 and summ["n_loops"] == 1
    assert summ["acceptance_length_loopfree"] == pytest.approx((2 + 5) / 2)
    assert summ["repeat_rate"] == pytest.approx((8 / 13 + 0) / 2)


def brute_ceiling(pmax_lists, k):
    vals = [[math.prod(p[t + i] for i in range(j)) for j in range(1, k + 1)]
            for p in pmax_lists for t in range(1, len(p) - k + 1)]
    return [sum(v[j] for v in vals) / len(vals) for j in range(k)]


def test_ceiling_hand_made_and_brute_force():
    assert M.ceiling([[1, 0.5, 0.5, 0.5, 1]], 2) == pytest.approx([0.5, (0.25 + 0.25 + 0.5) / 3])
    assert M.ceiling([[0.9] * 10], 3) == pytest.approx([0.9, 0.81, 0.729])
    assert all(math.isnan(c) for c in M.ceiling([[0.5] * 3], 3))  # no full window
    rng = np.random.default_rng(0)
    lists = [rng.uniform(0.2, 1, rng.integers(2, 30)) for _ in range(20)]
    c = M.ceiling(lists, 7)
    assert c == pytest.approx(brute_ceiling(lists, 7))
    assert all(a >= b for a, b in itertools.pairwise(c))  # monotone in the draft position
    assert M.ceiling([np.ones(12)], 7) == [1.0] * 7


def test_round_ceiling_hand_made():
    pmax = [1, 0.9, 0.8, 0.7, 0.6, 0.5]  # output indices 0..5
    c = M.round_ceiling(pmax, [2, 0, 1], 3)  # rounds start at output 1, 4, 5
    assert c["rounds"] == 3 and c["reach"] == [3, 2, 1]
    # j=1: p[1] + p[4] + p[5]; j=2 (rounds with L >= 1: 0, 2): p[2] + p[6 -> past the end: 1]; j=3: p[3]
    assert c["bound"] == pytest.approx([0.9 + 0.6 + 0.5, 0.8 + 1.0, 0.7])


# --- with a tiny target -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_models():
    from dmtp.models import tiny

    return tiny.build("qwen3_5", seed=0)


def test_pmax_along_equals_brute_force(tiny_models):
    tgt, _ = tiny_models
    prompts, outputs = [[5, 7, 9, 11], [4]], [[3, 8, 8, 20, 1], [6, 6, 7]]
    got = pmax_along(tgt, prompts, outputs, 0.7, batch_size=1)
    assert [len(g) for g in got] == [5, 3]
    for g, b in zip(got, pmax_along(tgt, prompts, outputs, 0.7, batch_size=2)):
        assert b == pytest.approx(g, rel=1e-5)  # padding changes nothing but the fp32 reduction order
    for p, o, g in zip(prompts, outputs, got):
        for t in range(len(o)):
            with torch.no_grad():
                logits = tgt.model(torch.tensor([p + o[:t]])).logits[0, -1].float()
            assert g[t] == pytest.approx(float(torch.softmax(logits / 0.7, -1).max()), rel=1e-5)
    cold = pmax_along(tgt, prompts, outputs, 1e-4)
    assert all(np.allclose(g, 1.0) for g in cold) and all(np.all(g == 1) for g in pmax_along(tgt, prompts, outputs, 0))


def test_ceilings_on_runs(tiny_models):
    from conftest import make_drafter

    from dmtp.engine.methods import build_method
    from dmtp.engine.runner import run_generate

    tgt, mtp = tiny_models
    rows = [{"id": str(i), "prompt_ids": p} for i, p in enumerate([[5, 7, 9], [4, 8], [10, 20, 30, 40], [33]])]
    prompt_ids = {r["id"]: r["prompt_ids"] for r in rows}
    ar = run_generate(tgt, build_method("ar", tgt), rows, 1.0, 24, [], 4, seed=3)
    c = oracle_ceiling(tgt, ar, prompt_ids, 1.0, k=7)
    pm = pmax_along(tgt, [r["prompt_ids"] for r in rows], [r["output_ids"] for r in ar], 1.0)
    assert c["cumulative"] == pytest.approx(brute_ceiling(pm, 7)) and c["windows"] == 4 * (24 - 7)
    assert c["acceptance_length"] == pytest.approx(1 + sum(c["cumulative"]))
    assert 0 < c["cumulative"][-1] <= c["cumulative"][0] < 1
    cold = pmax_along(tgt, [r["prompt_ids"] for r in rows], [r["output_ids"] for r in ar], 1e-4)
    assert M.ceiling(cold, 7) == pytest.approx([1.0] * 7, abs=1e-3)  # T -> 0: every draft position at 1
    with pytest.raises(ValueError, match="ar records at T=0.5"):
        oracle_ceiling(tgt, ar, prompt_ids, 0.5)
    with pytest.raises(KeyError, match="no prompt ids"):
        oracle_ceiling(tgt, ar, {}, 1.0)
    d = build_method("dflash", tgt, drafter=make_drafter(tgt, "dflash"))
    for temp in (0.0, 1.0):
        recs = run_generate(tgt, d, rows, temp, 24, [], 4, seed=3)
        b = round_ceiling_run(tgt, recs, prompt_ids, temp, k=7)
        hist = M.histogram([a for r in recs for a in r["accepted"]], 7)
        assert b["rounds"] == sum(hist) and b["reach"] == [sum(hist[j - 1:]) for j in range(1, 8)]
        if temp == 0:  # p_max = 1: the bound is the rounds that reached draft j, >= those that accepted it
            assert b["bound"] == b["reach"] and all(x >= y for x, y in zip(b["cumulative"], M.cumulative(hist)))
        assert all(0 <= x <= 1 for x in b["conditional"] if not math.isnan(x))
