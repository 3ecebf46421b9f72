"""Seed x request intervals, paired two-level bootstrap tests, Holm correction: hand-made numbers."""
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
    rows = {(r["a"], r["b"]): r for r in S.pairwise(scores)}
    assert rows[("big", "base")]["verdict"] == "big > base"
    assert rows[("small", "base")]["verdict"] == "small ≈ base (not resolved)"
    assert all(r["p_holm"] >= r["p"] for r in rows.values())


def test_matrices_pair_seeds_and_requests_and_broadcast_baselines():
    per_seed = {"mtp": {0: {"a": 3.0, "b": 4.0, "c": 9.0}},
                "x": {0: {"a": 1.0, "b": 2.0}, 1: {"a": 1.5, "b": 2.5}, 2: {"a": 1.0, "b": 2.0, "c": 0.0}}}
    mats, seeds, ids = S.matrices(per_seed)
    assert seeds == [0, 1, 2] and ids == ["a", "b"]
    assert mats["mtp"].tolist() == [[3.0, 4.0]] * 3
    assert mats["x"].tolist() == [[1.0, 2.0], [1.5, 2.5], [1.0, 2.0]]
