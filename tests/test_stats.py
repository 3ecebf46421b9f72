"""Realization x seed x request intervals, paired hierarchical bootstrap and t-tests, TOST, difference in differences,
Holm correction and the wording rule: hand-made numbers."""
import math

import numpy as np
import pytest

from dmtp.analysis import stats as S


def test_holm_matches_hand_computation():
    # sorted 0.01, 0.02, 0.04 (m = 3): 0.03, 0.04, 0.04 (running max); nan stays out of the family
    assert S.holm([0.04, 0.01, float("nan"), 0.02]) == pytest.approx([0.04, 0.03, float("nan"), 0.04], nan_ok=True)
    assert S.holm([0.5, 0.9]) == [1.0, 1.0]
    assert S.holm([]) == []


def test_ci_point_and_interval():
    x = np.array([[3.0, 4.0, 5.0], [3.2, 4.1, 5.3]])
    m, lo, hi = S.seed_request_ci(x)
    assert m == pytest.approx(x.mean()) and lo < m < hi
    # a constant matrix has a zero-width interval; nan cells are skipped
    assert S.seed_request_ci(np.full((3, 5), 2.0)) == (2.0, 2.0, 2.0)
    assert S.seed_request_ci([[1.0, np.nan], [3.0, np.nan]])[0] == 2.0


def test_seed_level_widens_the_interval():
    """Same request spread, but seeds that disagree: the two-level interval is wider than one seed's."""
    rng = np.random.default_rng(0)
    base = rng.normal(4, 0.3, 60)
    agree = np.stack([base, base, base])
    disagree = np.stack([base - 0.5, base, base + 0.5])
    w = lambda x: np.subtract(*S.seed_request_ci(x)[2:0:-1])
    assert w(disagree) > 2 * w(agree)


def test_paired_detects_a_consistent_shift_and_not_noise():
    rng = np.random.default_rng(1)
    a = rng.normal(4, 0.5, (3, 80))
    shifted = S.paired(a + 0.2, a)
    assert shifted["diff"] == pytest.approx(0.2) and shifted["p"] < 0.01 and shifted["lo"] > 0
    same = S.paired(a + rng.normal(0, 0.3, a.shape), a)
    assert same["p"] > 0.05 and same["lo"] < 0 < same["hi"]
    with pytest.raises(ValueError, match="matching"):
        S.paired(a, a[:, :10])


def test_pairwise_words_only_what_holm_supports():
    rng = np.random.default_rng(2)
    a = rng.normal(4, 0.5, (3, 100))
    noise = lambda: rng.normal(0, 0.5, a.shape)
    scores = {"big": a + 0.3 + noise(), "small": a + 0.02 + noise(), "base": a}
    rows = {(r["a"], r["b"]): r for r in S.holm_family(S.pairwise(scores))}
    assert rows[("big", "base")]["verdict"] == "big > base"
    assert rows[("small", "base")]["verdict"] == "small vs base: not resolved"
    assert all(r["p_holm"] >= r["p"] and r["t_p_holm"] >= r["t_p"] for r in rows.values())
    assert {r["t_level"] for r in rows.values()} == {"seed"}


def test_matrices_pair_units_and_requests_and_broadcast_baselines():
    per_seed = {"mtp": {0: {"a": 3.0, "b": 4.0, "c": 9.0}},
                "x": {0: {"a": 1.0, "b": 2.0}, 1: {"a": 1.5, "b": 2.5}, 2: {"a": 1.0, "b": 2.0, "c": 0.0}}}
    mats, layout, ids = S.matrices(per_seed)
    assert layout == [(0, [0, 1, 2])] and ids == ["a", "b"]
    assert mats["mtp"].tolist() == [[[3.0, 4.0]] * 3]
    assert mats["x"].tolist() == [[[1.0, 2.0], [1.5, 2.5], [1.0, 2.0]]]
    # (realization, seed) keys: realizations every method has; a realization with fewer seeds gets rows of nan
    units = {"mtp": {(1, 0): {"a": 1.0}, (2, 0): {"a": 2.0}, (3, 0): {"a": 5.0}},
             "x": {(1, 0): {"a": 0.0}, (1, 1): {"a": 1.0}, (2, 0): {"a": 4.0}}}
    mats, layout, ids = S.matrices(units)
    assert layout == [(1, [0, 1]), (2, [0])] and mats["mtp"].shape == (2, 2, 1)
    assert mats["mtp"][0, :, 0].tolist() == [1.0, 1.0] and mats["mtp"][1, 0, 0] == 2.0
    assert mats["x"][0, :, 0].tolist() == [0.0, 1.0] and math.isnan(mats["x"][1, 1, 0])


def _old_two_level(x, n_boot, seed):
    """The two-level bootstrap of earlier versions (seeds, then requests, one shared request draw)."""
    n_s, n_r = x.shape
    rng = np.random.default_rng(seed)
    si, ri = rng.integers(0, n_s, size=(n_boot, n_s)), rng.integers(0, n_r, size=(n_boot, n_r))
    vals, cnt = np.where(np.isnan(x), 0.0, x), (~np.isnan(x)).astype(float)
    tot_v = np.take_along_axis(vals[si], ri[:, None, :].repeat(n_s, 1), 2).sum((1, 2))
    tot_c = np.take_along_axis(cnt[si], ri[:, None, :].repeat(n_s, 1), 2).sum((1, 2))
    return tot_v / tot_c


def test_one_realization_is_the_two_level_bootstrap():
    x = np.random.default_rng(3).normal(4, 1, (3, 20))
    x[1, 4] = np.nan
    assert S._boot_means(S.as_cube(x), 500, 7) == pytest.approx(_old_two_level(x, 500, 7))


def test_realizations_weigh_the_same_and_widen_the_interval():
    # realization 0: 3 seeds of 2.0; realization 1: one seed of 4.0 (rows of nan): the mean of the two means
    c = np.full((2, 3, 4), np.nan)
    c[0], c[1, 0] = 2.0, 4.0
    assert S.mean(c) == 3.0 and S.seed_request_ci(c, n_boot=400)[0] == 3.0
    level, units = S.top_level(c)
    assert level == "realization" and units.tolist() == [2.0, 4.0]
    rng = np.random.default_rng(4)
    base = rng.normal(4, 0.3, (1, 3, 50))
    agree = np.concatenate([base, base, base])
    disagree = np.concatenate([base - 0.5, base, base + 0.5])
    w = lambda x: np.subtract(*S.seed_request_ci(x, n_boot=1000)[2:0:-1])
    assert w(disagree) > 3 * w(agree)


def test_t_test_by_hand():
    """Units 1, 2, 3: mean 2, se 1/sqrt(3), df 2, where the t CDF is 1/2 + t / (2 sqrt(2 + t^2)): the 97.5 % point
    is sqrt(1.805 / 0.0975) = 4.3027 and t = 2 sqrt(3) gives p = 1 - 2 sqrt(3) / sqrt(14) = 0.07418."""
    r = S.t_test([1.0, 2.0, 3.0])
    q = math.sqrt(1.805 / 0.0975)
    assert (r["mean"], r["n"], r["df"]) == (2.0, 3, 2)
    assert (r["lo"], r["hi"]) == pytest.approx((2 - q / math.sqrt(3), 2 + q / math.sqrt(3)))
    assert r["p"] == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14))
    assert S.t_quantile(3) == pytest.approx(q) and math.isnan(S.t_test([1.0])["lo"])
    # TOST: equivalence within +-5 (p = the larger one-sided p: at t = -3 sqrt(3)); not within +-2 (t = 0: 1/2)
    sf = lambda t: 0.5 - t / (2 * math.sqrt(2 + t * t))  # noqa: E731
    assert S.t_test([1.0, 2.0, 3.0], margin=5)["tost_p"] == pytest.approx(sf(3 * math.sqrt(3)))
    assert S.t_test([1.0, 2.0, 3.0], margin=2)["tost_p"] == pytest.approx(0.5)


def test_paired_reports_each_realization_and_the_top_level_t():
    a = np.zeros((3, 2, 5))
    b = a - np.array([1.0, 2.0, 3.0])[:, None, None]  # a - b = 1, 2, 3 in realizations 0, 1, 2
    r = S.paired(a, b, n_boot=500, margin=5)
    assert r["diff"] == 2 and r["signs"] == [1.0, 2.0, 3.0] and (r["t_level"], r["n_units"]) == ("realization", 3)
    assert r["t_p"] == pytest.approx(S.t_test([1.0, 2.0, 3.0])["p"])
    assert r["tost_t_p"] == pytest.approx(S.t_test([1.0, 2.0, 3.0], margin=5)["tost_p"])
    assert 1.0 <= r["lo"] <= r["hi"] <= 3.0  # the bootstrap over 3 realizations: between their means
    assert r["tost_p"] < 0.05  # every draw inside +-5


def test_verdict_needs_every_realization_and_never_says_equal():
    rows = S.holm_family([{"a": "x", "b": "y", "diff": 0.5, "p": 1e-4, "t_p": 1e-4, "signs": [0.9, 0.8, -0.2]},
                          {"a": "u", "b": "v", "diff": -0.5, "p": 1e-4, "t_p": 1e-4, "signs": [-0.4, -0.6]},
                          {"a": "s", "b": "t", "diff": 0.1, "p": 0.2, "t_p": 1e-4, "signs": [0.1]}])
    assert [r["verdict"] for r in rows] == ["x vs y: not resolved", "u < v", "s vs t: not resolved"]
    assert rows[0]["p_holm"] == pytest.approx(3e-4) and rows[2]["t_p_holm"] == pytest.approx(3e-4)
    assert S.verdict("a", "b", 0.0, 0.001) == "a vs b: not resolved"


def test_difference_in_differences():
    # per realization: set A's paired gap minus set B's = 1, 2, 3 -> the t-test of those three
    a = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    r = S.did(a, np.zeros((3, 4)), n_boot=500)
    assert r["diff"] == 2 and r["signs"] == [1.0, 2.0, 3.0] and r["t_level"] == "realization"
    assert r["t_p"] == pytest.approx(S.t_test([1.0, 2.0, 3.0])["p"])
    # one realization: Welch over the two sets' requests (here: variances 1/2 and 1/2, 2 requests each)
    one = S.did([[1.0, 2.0]], [[0.0, 1.0]], n_boot=500)
    assert one["diff"] == 1 and one["t_level"] == "request" and one["n_units"] == 4
    with pytest.raises(ValueError, match="realizations"):
        S.did(a, np.zeros((2, 4)))


def test_ratio_ci_pools_counts():
    """First-token acceptance = rounds accepting >= 1 draft / rounds, over every cell: 6 / 8."""
    m, lo, hi = S.ratio_ci([[1, 2, 3]], [[2, 2, 4]], n_boot=500)
    assert m == 0.75 and 0.5 <= lo <= m <= hi <= 1.0
    assert all(math.isnan(x) for x in S.ratio_ci([[0]], [[0]]))
