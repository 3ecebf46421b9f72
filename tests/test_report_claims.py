"""The claims table's families and wording: the pre-registered primary family decides only on its registered series
(an experiment key and a records revision) with its registered number of realizations (fewer: interim), one
realization decides nothing and says so, every other row is exploratory, throughput is judged per card kind, a
contrast prints one interval everywhere, tests read unrounded values, and sentences that read a family read it
after Holm."""
import dataclasses
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dmtp.config.ablation import code
from dmtp.analysis import stats as S
from dmtp.analysis.report import claims as C
from dmtp.analysis.report import load, tables
from dmtp.analysis.report.data import experiment_key, series_key
from dmtp.analysis.report.registered import PRIMARY
from dmtp.analysis.report.synthetic import write_synthetic

RUNS = ["ar", "mtp", "dflash", "token_only", "double_anchor_fusion", "fusion", "zero_init_residual",
        "double_anchor_token_only"]
SERIES = PRIMARY.as_experiment()  # the series the primary family is registered on: its experiment key and revision


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
    key = PRIMARY.key
    assert key["name"] == "mini" and key["train"]["steps"] == 1000
    assert PRIMARY.registered_on(key, PRIMARY.records_revision)
    assert not PRIMARY.registered_on(key, None)  # records made before revisions were declared
    assert not PRIMARY.registered_on(key, PRIMARY.records_revision + "x")  # by other record-making code
    other = json.loads(json.dumps(key))
    other["train"]["steps"] = 4000
    assert not PRIMARY.registered_on(other, PRIMARY.records_revision)
    # the earlier mini series (r5-r7's experiment) shares the profile's name and step count, not the key
    r7 = series_key("results/mini/r7")
    assert r7[0]["name"] == "mini" and r7[0]["train"]["steps"] == 1000 and r7[1] is None
    assert not PRIMARY.registered_on(*r7)


def test_the_registered_key_is_the_mini_profile_as_it_stands():
    """registered.json is the experiment key `dmtp pipeline --profile mini` writes at this code's revision, whatever
    `realization` and run control (`ablation.only`) say; a change to the profile or a revision bump fails here
    (before the series' first realization: `python -m experiments.register_series --write`)."""
    from dmtp import RECORDS_REVISION
    from dmtp.experiment import write_experiment
    from dmtp.profiles import resolve
    from experiments.register_series import changes

    assert changes() == [] and PRIMARY.records_revision == RECORDS_REVISION
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        only = "ablation.only=ar,mtp,dflash,zero_init_residual,double_anchor_token_only"
        p = resolve("mini", ["realization=4", only])
        exp = json.loads(write_experiment(f"{d}/experiment.json", p).read_text())
    assert exp["records_revision"] == RECORDS_REVISION
    assert PRIMARY.registered_on(experiment_key(exp), exp["records_revision"])


def test_the_records_revision_travels_with_every_artifact(tmp_path):
    """experiment.json names it beside the profile (read back as the same profile), every meta.json in its env, and
    the report's table of realizations prints it ('before revisions' where a realization predates them)."""
    from dmtp import RECORDS_REVISION
    from dmtp.analysis.report import how
    from dmtp.experiment import read_experiment, records_revision, write_experiment
    from dmtp.io import read_json, write_meta
    from dmtp.profiles import resolve

    p = resolve("smoke")
    path = write_experiment(tmp_path / "experiment.json", p)
    assert records_revision(read_json(path)) == RECORDS_REVISION
    assert read_experiment(path) == dataclasses.replace(p, verify=p.study)  # as written: the study's runs named
    assert records_revision({"name": "mini"}) is None
    write_meta(tmp_path / "meta.json", {"x": 1})
    assert read_json(tmp_path / "meta.json")["env"]["records_revision"] == RECORDS_REVISION
    exp = {x: v for x, v in SERIES.items() if x != "records_revision"}
    for name, rev in (("now", RECORDS_REVISION), ("before", None)):
        write_synthetic(code(), tmp_path, name, n=4, temps=(0,), methods=["ar", "dflash"], curve=False, oracle=False,
                        bench=False, modes=("natural",), realization=1,
                        experiment=dict(exp, records_revision=rev) if rev else exp)
    now, before = ([x for x in how(load(name, tmp_path, n_boot=50)) if x.startswith("| r1 |")][0]
                   for name in ("now", "before"))
    assert now.endswith(f"| {RECORDS_REVISION} |") and before.endswith("| before revisions |")


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
    from dmtp.analysis.report import summary

    steps = dict(PRIMARY.key["train"], steps=4000)
    for k in (1, 2):
        write_synthetic(code(), tmp_path, "speed", n=8, temps=(0, 1), methods=RUNS, curve=False, oracle=False,
                        bench=False, modes=("natural",), realization=k, experiment=dict(SERIES, train=steps))
    art = load("speed", tmp_path, n_boot=100)
    tables.pairwise(art)
    df = C.claims(art)
    assert set(df.family) == {"exploratory"} and not df.verdict.str.contains("holds|interim").any()
    p1 = df[df.claim.str.startswith("P1 (")].iloc[0]
    assert "not the registered series" in p1.claim and "as the registered test reads it (not that test)" in p1.test
    assert art.registered == [] and not art.on_registered
    text = "\n".join(summary.in_short(art, df))
    assert f"decided only on {PRIMARY.series}, at 6 realizations: 0 of 6 are here" in text
    assert ("this report pools another series (its experiment differs in train.steps; records revision "
            f"{PRIMARY.records_revision})") in text
    assert "at least two realizations" not in text


def test_a_series_is_one_key_and_one_records_revision(tmp_path):
    """Realizations of one experiment key made at another records revision, or before revisions, are series of
    their own, named with the revision; the registered series is pooled wherever one of its realizations exists,
    even beside a larger earlier series, and counted as k of 6; realizations seen before registration are named."""
    from dmtp.analysis.report import summary

    for k, rev in ((5, None), (6, None), (7, None), (8, PRIMARY.records_revision), (9, "0")):
        exp = {x: v for x, v in SERIES.items() if x != "records_revision"}
        write_synthetic(code(), tmp_path, "mini", n=8, temps=(0,), methods=RUNS, curve=False, oracle=False,
                        bench=False, modes=("natural",), realization=k,
                        experiment=exp if rev is None else dict(exp, records_revision=rev))
    art = load("mini", tmp_path, n_boot=100)
    assert [r.name for r in art.realizations] == ["r8"] and art.registered == ["r8"] and art.on_registered
    assert [r.revision for r in art.realizations] == [PRIMARY.records_revision]
    why = dict(art.left_out)
    assert set(why) == {"r5", "r6", "r7", "r9"}
    rev = PRIMARY.records_revision
    assert why["r5"].startswith("the same experiment as r8, made by other record-making code (records made before "
                                f"revisions were declared; r8: records revision {rev})")
    assert f"(records revision 0; r8: records revision {rev})" in why["r9"]
    tables.pairwise(art)
    df = C.claims(art)
    text = "\n".join(summary.in_short(art, df))
    assert "one realization of it decides nothing" in text and "1 of 6 are here" in text
    # without it, the largest group (before revisions) is pooled: another series, seen before registration
    shutil.rmtree(tmp_path / "mini" / "r8")
    art = load("mini", tmp_path, n_boot=100)
    assert [r.name for r in art.realizations] == ["r5", "r6", "r7"] and not art.on_registered
    assert C.off_series(art) == ("the same experiment made by other record-making code (records made before revisions "
                                 "were declared); r5, r6, r7 were seen before the family was registered")


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
    assert list(blog.temperature) == [0.0] and blog.claim.str.contains("27B HumanEval: 6.424 > 4.698").all()
    # at T = 1 the blog's only row of the pair (35B Code) has MTP415 ahead: the row reads that direction
    t1 = df[df.claim.str.startswith("MTP415 > DFlash")].iloc[0]
    assert t1.temperature == 1.0 and "3.496 > 3.239" in t1.claim and t1.claim.endswith("`mtp` − `dflash`")
    # an order is said to agree, never to be the blog's, and whether the orders are the same is said
    assert rank.claim.str.startswith("the ablation's order agrees with the blog's").all()
    assert rank.claim.str.contains("the orders differ|the same order").all()


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
    # the size beside the direction: against the blog's +18.8 % (Code), and the share of the per-verify gain (+11.8 %:
    # 1.9 / 1.7) that became speed
    g = tab[(tab.realization == "r3") & (tab.method == "zero_init_residual")].iloc[0]
    share = 100 * g.gain_pct / g.per_verify_gain_pct
    assert h200["magnitude"] == (f"size: {g.gain_pct:+.1f} % tok/s against the blog's +18.8 %; {share:.0f} % of its "
                                 f"{g.per_verify_gain_pct:+.1f} % per-verify gain became speed (the blog's: 100 % of "
                                 "+18.8 %)")


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


def test_every_test_over_realizations_reads_unrounded_values(series):
    """The pairwise CSV prints each realization's difference to 3 decimals and keeps it unrounded beside
    (realization_diffs); the primary family's one-sided t reads the unrounded values."""
    from dmtp.analysis.report.data import group, per_unit

    art, df = series["six"]
    pw = pd.read_csv(art.tables / "pairwise_T0.csv", dtype=str)
    header = next(x for x in (art.tables / "pairwise_T0.md").read_text().splitlines() if x.startswith("| dataset"))
    assert "realization_diffs" in pw and "realization_diffs" not in header
    r = tables.pair_row(art, "zero_init_residual", "double_anchor_token_only", 0.0)
    cubes = S.matrices({m: per_unit(group(art, "ablation", "humaneval", 0.0, m))
                        for m in ("zero_init_residual", "double_anchor_token_only")})[0]
    own = np.nanmean(cubes["zero_init_residual"] - cubes["double_anchor_token_only"], axis=(1, 2))
    assert r["signs"] == pytest.approx(list(own), abs=1e-12) and r["signs"] != [round(x, 3) for x in own]
    p4 = df[df.claim.str.startswith("P4:")].iloc[0]
    assert f"p = {S.t_one_sided(own):.3g};" in p4.test
    assert p4.p == pytest.approx(S.t_one_sided(own), rel=1e-9)


def test_the_exploratory_rows_read_together_are_read_after_holm(series):
    from dmtp.analysis.report import summary

    art, df = series["three"]
    ex = df[df.family == "exploratory"]
    assert list(ex.holm_p.dropna()) == pytest.approx([x for x in S.holm(list(ex.p)) if not np.isnan(x)])
    assert df[df.family == "primary"].holm_p.isna().all()
    rank = ex[ex.kind == "rank"].iloc[0]
    assert rank.p == pytest.approx(float(rank.test.split("permutation p = ")[1].split(" ")[0]), rel=1e-2)
    text = "\n".join(summary.exploratory_lines(df))
    kept = int(((ex.holm_p < 0.05) & ex.verdict.str.contains("consistent")).sum())
    n_p = int(ex.p.notna().sum())
    agree = int(ex.verdict.str.contains("consistent").sum())
    point = lambda k: f"{k} point{'s' * (k == 1)}"  # noqa: E731
    assert f"Of {len(ex)} exploratory rows, {point(agree)} the blog's way" in text
    assert f"Read together (Holm over the {n_p} rows with a p-value), {point(kept)} the blog's way" in text
    table = "\n".join(C.claims_lines(art, df))  # each exploratory row with a p prints its Holm p beside it
    assert table.count("exploratory rows |") == table.count(f"over the {n_p} exploratory rows |") == n_p


def test_an_unresolved_family_says_what_resolving_needs():
    """The |t| Holm's first step needs, computed from the family size and the units: 3 realizations (2 degrees of
    freedom) and 56 tests need |t| > 33.4 (the two-sided 5 % / 56 quantile), one test alone 4.30."""
    from scipy import stats as st

    from dmtp.analysis.report import summary

    text = summary.holm_threshold(3, 56)
    need = st.t.ppf(1 - 0.05 / 112, 2)
    assert f"|t| > {need:.1f}" in text and need == pytest.approx(33.4, abs=0.05)
    assert "at 2 degrees of freedom Holm over the 56 tests" in text and "one test alone: 4.30" in text
    assert summary.holm_threshold(1, 56) == "" and summary.holm_threshold(3, 1) == ""
