"""The claims table's families and wording: the pre-registered primary family decides only on its registered series
with its registered number of realizations (fewer: interim), one realization decides nothing and says so, every other
row is exploratory, throughput is judged per card kind, and a contrast prints one interval everywhere."""
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from ablations.code import code
from dmtp.analysis import stats as S
from dmtp.analysis.report import claims as C
from dmtp.analysis.report import load, tables
from dmtp.analysis.report.registered import PRIMARY
from dmtp.analysis.report.synthetic import write_synthetic

RUNS = ["ar", "mtp", "dflash", "token_only", "double_anchor_fusion", "fusion", "zero_init_residual",
        "double_anchor_token_only"]
SERIES = {"name": "mini", "train": {"steps": 1000}}  # the series the primary family is registered on


def test_one_sided_t_and_rank_agreement_on_hand_made_numbers():
    # mean 2, sd sqrt(2/3), n 4: t = 2 / (0.8165 / 2) = 4.899 with 3 df, between the table's t(0.01) = 4.541 and
    # t(0.005) = 5.841; one-sided p = 0.00814
    p = S.t_one_sided([1.0, 2.0, 3.0, 2.0])
    assert 0.005 < p < 0.01 and p == pytest.approx(0.00814, abs=1e-5)
    assert S.t_one_sided([-1.0, -2.0, -3.0, -2.0]) == pytest.approx(1 - p)
    assert np.isnan(S.t_one_sided([1.0])) and S.t_one_sided([2.0, 2.0]) == 0.0
    same = S.rank_agreement([1, 2, 3, 4], [10, 20, 30, 40])  # the one order of 24 with rho = 1
    assert same["rho"] == pytest.approx(1.0) and same["p"] == pytest.approx(1 / 24) and same["exact"]
    rev = S.rank_agreement([4, 3, 2, 1], [10, 20, 30, 40])
    assert rev["rho"] == pytest.approx(-1.0) and rev["p"] == pytest.approx(1.0)
    # one swap of neighbours among 4: rho = 0.8, reached or beaten by 4 of the 24 orders (rho 1 and three at 0.8)
    one_swap = S.rank_agreement([1, 2, 4, 3], [10, 20, 30, 40])
    assert one_swap["rho"] == pytest.approx(0.8) and one_swap["p"] == pytest.approx(4 / 24)
    big = S.rank_agreement(np.arange(10), np.arange(10), n_perm=2000)
    assert not big["exact"] and big["p"] <= 2 / 2001


def test_the_primary_family_is_registered_as_data():
    assert [c.key for c in PRIMARY.claims] == ["P1", "P2", "P3", "P4"]
    assert {c.a for c in PRIMARY.claims} == {"zero_init_residual"}
    assert [(c.b, c.temperature) for c in PRIMARY.claims] == [("dflash", 0.0), ("dflash", 1.0), ("mtp", 0.0),
                                                              ("double_anchor_token_only", 0.0)]
    assert (PRIMARY.alpha, PRIMARY.min_realizations, PRIMARY.dataset) == (0.05, 6, "humaneval")
    assert PRIMARY.registered_on("mini", 1000) and not PRIMARY.registered_on("mini", 4000)
    assert not PRIMARY.registered_on("tiny", 1000)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """Six realizations of the registered series (zero_init_residual far above dflash in each), the same first
    three alone, and one realization alone."""
    res = tmp_path_factory.mktemp("series")
    for k in range(1, 7):
        write_synthetic(code(), res, "six", n=16, temps=(0, 1), methods=RUNS, curve=False, oracle=False, bench=False,
                        modes=("natural",), realization=k, experiment=SERIES,
                        offsets={"dflash": -0.25, "double_anchor_token_only": -0.05 * (k % 2)})
    for name, ks in (("three", (1, 2, 3)), ("one", (1,))):
        for k in ks:
            shutil.copytree(res / "six" / f"r{k}", res / name / f"r{k}")
    out = {}
    for name in ("six", "three", "one"):
        art = load(name, res, n_boot=200)
        tables.pairwise(art)
        out[name] = (art, C.claims(art))
    return out


def test_the_primary_family_decides_only_with_its_realizations(series):
    _, six = series["six"]
    prim = six[six.family == "primary"].set_index(six[six.family == "primary"].claim.str[:2])
    assert list(prim.index) == ["P1", "P2", "P3", "P4"]
    assert prim.loc["P1", "verdict"] == "holds" and prim.loc["P2", "verdict"] == "holds"
    assert "one-sided paired t over 6 realizations" in prim.loc["P1", "test"]
    assert "Holm p = " in prim.loc["P1", "test"] and "over the 4 claims of the primary family" in prim.loc["P1", "test"]
    assert set(prim.verdict) <= {"holds", "not resolved"}
    # Holm over the four: the adjusted p of the smallest is 4 x its one-sided p
    _, three = series["three"]
    p3 = three[three.family == "primary"]
    assert len(p3) == 4 and all(v.startswith("interim (3 of 6 realizations): ") for v in p3.verdict)
    assert not (three.verdict == "holds").any()
    # the blog's DMTP model beside each claim, exploratory
    beside = six[six.claim.str.contains("with the blog's DMTP model")]
    assert set(beside.family) == {"exploratory"} and beside.claim.str.contains("`fusion`").all()


def test_one_realization_says_so_and_never_holds(series):
    art, one = series["one"]
    assert len(art.realizations) == 1
    assert set(one.family) == {"exploratory"}
    assert one.verdict.str.startswith("within one realization (r1): ").all(), set(one.verdict)
    assert not one.verdict.str.contains("holds").any()
    p1 = one[one.claim.str.startswith("P1 (")].iloc[0]
    assert "one realization decides nothing" in p1.claim


def test_other_series_are_exploratory(tmp_path):
    for k in (1, 2):
        write_synthetic(code(), tmp_path, "speed", n=8, temps=(0, 1), methods=RUNS, curve=False, oracle=False,
                        bench=False, modes=("natural",), realization=k,
                        experiment={"name": "mini", "train": {"steps": 4000}})
    art = load("speed", tmp_path, n_boot=100)
    tables.pairwise(art)
    df = C.claims(art)
    assert set(df.family) == {"exploratory"} and not df.verdict.str.contains("holds|interim").any()
    assert df.claim.str.contains("registered on the mini series of 1000 steps; this is mini with 4000 steps").any()


def test_one_interval_per_contrast(series):
    """The claims row of fusion - dflash prints the interval the ablation table and the pairwise table print."""
    art, df = series["three"]
    ab = tables.ablation(art)[0]  # the first (dataset, mode) group: humaneval, natural
    row = df[df.claim.str.startswith("P1 with the blog's DMTP model") & (df.temperature == 0)].iloc[0]
    a = ab[(ab.method == "fusion") & (ab.temperature == 0)].iloc[0]
    assert (row.estimate, row.estimate_lo, row.estimate_hi, row.estimate_tlo, row.estimate_thi) == pytest.approx(
        (a.vs_dflash, a.vs_dflash_lo, a.vs_dflash_hi, a.vs_dflash_tlo, a.vs_dflash_thi))
    pw = tables.pair_row(art, "fusion", "dflash", 0.0)
    assert (pw["diff_lo"], pw["diff_hi"]) == pytest.approx((row.estimate_lo, row.estimate_hi))


def test_the_added_claims_are_tested(series):
    art, df = series["three"]
    rank = df[df.kind == "rank"]
    assert set(rank.temperature) == {0.0, 1.0} and rank.test.str.contains("one-sided permutation p = ").all()
    close = df[df.kind == "closeness"]
    assert close.claim.str.contains("double and single anchor").any() and close.test.str.contains("TOST").all()
    ft = df[df.kind == "range"].iloc[0]
    assert ft.unit == "pts" and ft.temperature == 1.0 and "+5.43 to +12.46 points" in ft.claim
    blog = df[df.claim.str.startswith("DFlash > MTP415")]
    assert blog.claim.str.contains("27B HumanEval").all() and blog.claim.str.contains("3.239 < 3.496").all()


def test_throughput_is_judged_per_card_kind(monkeypatch, tmp_path):
    """Two realizations timed on one card kind: a t-test over their medians; a third on another card: within one
    realization, its timing repeats listed as repeats, never as an interval."""
    from dmtp.analysis.report import bench as B

    rows = [{"realization": k, "dataset": "humaneval", "temperature": 1.0, "batch_cap": 32, "repeat": i, "method": m,
             "tok_per_s": v * (1 + 0.01 * i), "per_verify": tau}
            for k in (1, 2, 3) for i in range(3)
            for m, v, tau in (("ar", 10000, 1.0), ("zero_init_residual", 11000 + 100 * k, 1.9), ("dflash", 10000, 1.7))]
    tp = pd.DataFrame(rows)
    devices = {"r1": "H100", "r2": "H100", "r3": "H200"}
    tab = B.throughput(tp, "zero_init_residual", "dflash", devices=devices)
    monkeypatch.setattr(C.T, "throughput_table", lambda art: tab)
    art = SimpleNamespace(spec=SimpleNamespace(main_method="zero_init_residual", drafter_baseline="dflash"),
                          throughput=tp, realizations=[], root=tmp_path)
    out = {r["claim"].split(", on ")[1].split(",")[0]: r for r in C.throughput_rows(art)}
    assert set(out) == {"H100", "H200"}
    h100, h200 = out["H100"], out["H200"]
    assert "t over 2 realizations' median gains" in h100["test"] and not np.isnan(h100["estimate_tlo"])
    assert h100["by_realization"] == "r1 +11.0 / r2 +12.0"
    assert h200["verdict"] == "within one realization (r3): consistent (exploratory; 3 repeats)"
    assert h200["by_realization"].startswith("r3 repeats: +13.0") and np.isnan(h200["estimate_lo"])


def test_the_t1_gap_is_decomposed(tmp_path):
    """tables/t1_gap: per realization with a T = 1 throughput row at its largest cap, the decode-only gain is the
    per-verify gain over the round ratio of its own stage times, the rest is the end-to-end gain minus it; the blog's
    row from reference.json (+18.77 % for +18.78 %, rounds x1.045 at batch 8)."""
    from dmtp.analysis.report import blog_gap

    write_synthetic(code(), tmp_path, "g", n=8, temps=(0, 1), methods=["ar", "dflash", "zero_init_residual"],
                    curve=False, oracle=False, realization=1, modes=("natural",))
    art = load("g", tmp_path, n_boot=100)
    df = blog_gap.table(art)
    mine, blog = df.iloc[0], df.iloc[-1]
    assert mine.realization == "r1" and mine.batch_cap == 32 and len(df) == 2
    assert mine.decode_only_gain_pct == pytest.approx(100 * ((1 + mine.per_verify_gain_pct / 100)
                                                             / mine.round_ratio - 1))
    assert mine.admission_and_rest_pts == pytest.approx(mine.gain_pct - mine.decode_only_gain_pct)
    assert not np.isnan(mine.eval_per_verify_gain_pct)
    assert (blog.gain_pct, blog.per_verify_gain_pct) == pytest.approx((18.77, 18.78), abs=0.01)
    assert blog.round_ratio == pytest.approx(9.318 / 8.915)
    text = "\n".join(blog_gap.lines(art))
    assert "## The T = 1 end-to-end gap to the blog" in text and "points are the smaller per-verify gain" in text
