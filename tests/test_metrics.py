"""Metrics on hand-made counts with answers worked out by hand (docs/METHOD.md, "Metrics")."""
import math

import numpy as np
import pytest

from dmtp.analysis import metrics as M
from dmtp.analysis import reference as R

FLAT = [1] * 8  # one round with each of 0..7 accepted


def test_histogram():
    assert M.histogram([0, 7, 3, 3], 7) == [1, 0, 0, 2, 0, 0, 0, 1]
    assert M.histogram([], 4) == [0] * 5
    assert M.histogram([0, 0], 0) == [2]  # AR: k = 0
    with pytest.raises(ValueError):
        M.histogram([5], 4)


def test_per_verify_and_first_token():
    assert M.per_verify(FLAT) == 1 + 28 / 8  # 4.5
    assert M.per_verify([0] * 7 + [5]) == 8  # every round full: 7 drafts + bonus
    assert M.per_verify([3, 0, 0, 0, 0]) == 1  # every round rejected: only the correction
    assert M.per_verify([1, 0, 0, 1]) == 1 + 3 / 2
    assert math.isnan(M.per_verify([0, 0]))
    assert M.first_token(FLAT) == 7 / 8
    assert M.first_token([1, 3]) == 0.75
    assert math.isnan(M.first_token([0, 0, 0]))


def test_capped_per_verify_cuts_each_round_at_the_limit():
    # rounds accepting 0..7 once each: cut at 4 -> 0 1 2 3 4 4 4 4 -> 1 + 22 / 8
    assert M.capped_per_verify(FLAT, 4) == 1 + 22 / 8
    assert M.capped_per_verify(FLAT, 7) == M.per_verify(FLAT) == M.capped_per_verify(FLAT, 9)
    assert M.capped_per_verify(FLAT, 0) == 1
    for n in range(8):  # = 1 + S_1 + ... + S_n
        assert M.capped_per_verify(FLAT, n) == pytest.approx(1 + sum(M.cumulative(FLAT)[:n]))
    assert math.isnan(M.capped_per_verify([0, 0], 1))
    with pytest.raises(ValueError, match="n=-1"):
        M.capped_per_verify(FLAT, -1)


def test_per_request_differs_from_per_verify():
    # request a: rounds 0, 7 -> 4.5; request b: one round of 3 -> 4; empty request skipped
    reqs = [[0, 7], [3], []]
    assert M.per_request(reqs) == pytest.approx((4.5 + 4) / 2)
    assert M.per_verify(M.histogram([0, 7, 3], 7)) == pytest.approx(1 + 10 / 3)  # pooled rounds weigh by length
    assert math.isnan(M.acceptance_length([]))
    assert math.isnan(M.per_request([[], []]))


def test_cumulative_and_conditional():
    assert M.cumulative(FLAT) == pytest.approx([7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])
    assert M.conditional(FLAT) == pytest.approx([7 / 8, 6 / 7, 5 / 6, 4 / 5, 3 / 4, 2 / 3, 1 / 2])
    assert M.cumulative([2, 1, 1]) == pytest.approx([0.5, 0.25])
    c = M.conditional([2, 0, 0])  # nothing ever accepted: c1 = 0, c2 = 0/0
    assert c[0] == 0 and math.isnan(c[1])
    # tau = 1 + sum_k P(L >= k)
    assert 1 + sum(M.cumulative(FLAT)) == pytest.approx(M.per_verify(FLAT))


def test_hist_from_conditional_roundtrip():
    h = [5, 3, 0, 2, 1, 0, 4, 9]
    back = M.hist_from_conditional(M.conditional(h), sum(h), percent=False)
    assert back == pytest.approx(h)
    assert M.hist_from_conditional([50, 50], 8) == pytest.approx([4, 2, 2])
    assert M.tau_from_conditional([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert M.tau_from_conditional(M.conditional(FLAT)) == pytest.approx(4.5)


def test_blog_code_conditional_rows_are_consistent():
    for method, n in (("dmtp", 434780), ("dflash", 523201)):
        row, rounds = R.conditional_row("humaneval", method if method == "dflash" else "dmtp")
        assert rounds == n
        h = M.hist_from_conditional(row, rounds)
        assert sum(h) == pytest.approx(n)
        assert min(h) > 0
        tau = M.tau_from_conditional(row, percent=True)
        assert tau == pytest.approx(M.per_verify(h))
        assert M.first_token(h) == pytest.approx(row[0] / 100)
        assert M.conditional(h) == pytest.approx([c / 100 for c in row])
        # different setting from the blog's B32 per-verify table, but the same model and workload: within 1%
        pv = R.table("per_request_vs_verify").set_index(["workload", "method"]).per_verify[("Code", method)]
        assert abs(tau / pv - 1) < 0.01
    assert M.tau_from_conditional(R.conditional_row("humaneval", "dmtp")[0], percent=True) == \
        pytest.approx(3.8216, abs=1e-4)


def test_bootstrap_ci_contains_point_and_shrinks():
    rng = np.random.default_rng(1)
    small, large = rng.normal(3, 1, 20), rng.normal(3, 1, 2000)
    p, lo, hi = M.bootstrap_ci(small)
    assert lo <= p <= hi and p == pytest.approx(small.mean())
    p2, lo2, hi2 = M.bootstrap_ci(large)
    assert lo2 <= p2 <= hi2
    assert hi2 - lo2 < (hi - lo) / 4  # ~ 1/sqrt(n): 10x narrower
    assert M.bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    assert all(math.isnan(x) for x in M.bootstrap_ci([]))
    assert M.bootstrap_ci(small, seed=3) == M.bootstrap_ci(small, seed=3)


def test_bootstrap_ci_stat_fn_over_records_and_rows():
    recs = [{"accepted": [7, 7]}, {"accepted": [0]}, {"accepted": [3, 3, 3]}]
    p, lo, hi = M.bootstrap_ci(recs, lambda rs: M.per_request([r["accepted"] for r in rs]), n_boot=500)
    assert p == pytest.approx((8 + 1 + 4) / 3) and lo <= p <= hi and 1 <= lo and hi <= 8
    H = np.array([M.histogram(r["accepted"], 7) for r in recs], float)  # per-request histogram rows
    p, lo, hi = M.bootstrap_ci(H, lambda h: M.first_token(h.sum(0)), n_boot=500)
    assert p == pytest.approx(5 / 6) and lo <= p <= hi


def _recs(values):
    # a request whose every round accepted v - 1 drafts has acceptance length v
    return [{"id": f"r{i}", "accepted": [v - 1] * 3} for i, v in enumerate(values)]


def test_paired_diff_exact():
    a, b = _recs([5, 4, 6, 3, 5, 4, 6, 5]), _recs([4, 3, 5, 2, 4, 3, 5, 4])
    r = M.paired_diff(a, b[::-1])  # pairing is by id, not by order
    assert r["n"] == 8 and r["diff"] == pytest.approx(1) and r["lo"] == r["hi"] == pytest.approx(1)
    assert r["p"] == pytest.approx(2 / 256)  # exact sign flip: only all-+ and all-- reach |mean| = 1
    r = M.paired_diff(_recs([2, 4]), _recs([3, 3]))  # d = -1, +1: mean 0
    assert r["diff"] == 0 and r["p"] == 1
    r = M.paired_diff(_recs([5, 5]), _recs([4]))  # only r0 is shared
    assert r["n"] == 1 and r["diff"] == 1
    assert M.paired_diff(_recs([5]), [])["n"] == 0


def test_paired_diff_monte_carlo():
    rng = np.random.default_rng(0)
    b = _recs(rng.integers(2, 6, 40).tolist())
    a = [{"id": r["id"], "accepted": [x + 1 for x in r["accepted"]]} for r in b]
    r = M.paired_diff(a, b, n_boot=999)
    assert r["diff"] == pytest.approx(1) and r["p"] == pytest.approx(1 / 1000)
    null = M.paired_diff(b, b)
    assert null["diff"] == 0 and null["p"] == 1


def test_per_verify_on_the_prefix_shared_with_the_reference():
    """per_verify_shared reads tau over the rounds whose tokens all lie inside the prefix each output shares with its
    reference (AR's output at T = 0): an output equal to AR's keeps every round; one that left AR's at a bf16 tie
    keeps the rounds before it (token 0 is the prefill's); lengths that do not pair are refused."""
    import math

    from dmtp.analysis.metrics import per_verify_shared, shared_prefix

    assert shared_prefix([1, 2, 3], [1, 2, 4]) == 2 and shared_prefix([1, 2], [1, 2, 3]) == 2
    assert shared_prefix([], [1]) == 0
    same = ([3, 1], [9, 1, 2, 3, 4, 5, 6], [9, 1, 2, 3, 4, 5, 6])  # rounds emit tokens 1-4 and 5-6
    assert per_verify_shared([same[0]], [same[1]], [same[2]]) == pytest.approx(1 + 4 / 2)
    # leaves AR's at token 5: the second round (tokens 5-6) is on other text, so only the first counts
    left = ([3, 7], [9, 1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 8], [9, 1, 2, 3, 4, 5, 6])
    assert per_verify_shared([left[0]], [left[1]], [left[2]]) == pytest.approx(4.0)
    both = per_verify_shared([same[0], left[0]], [same[1], left[1]], [same[2], left[2]])
    assert both == pytest.approx(1 + (3 + 1 + 3) / 3)  # pooled over the kept rounds, not averaged per request
    early = ([7], [9, 8, 8, 8, 8, 8, 8, 8, 8], [9, 1])  # leaves at token 1: no round inside the shared prefix
    assert math.isnan(per_verify_shared([early[0]], [early[1]], [early[2]]))
    with pytest.raises(ValueError, match="one of each per request"):
        per_verify_shared([[1]], [[1, 2]], [])
