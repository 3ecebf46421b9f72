"""The research protocol in the report: seeds and modes read from the run names, seed x request intervals, loop
columns, requests without a verify round, Holm-worded pairwise tests, the control, ceilings at T > 0, learning
curves, the blog's numbers set beside `fusion` — on hand-made artifacts (known answers) and the synthetic demo."""
import json
import math
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from dmtp.config.ablation import code
from dmtp.analysis import metrics as M
from dmtp.analysis import stats as S
from dmtp.analysis.report import figures, load, render_report, summary, tables
from dmtp.analysis.report.data import read_runs
from dmtp.analysis.report.synthetic import TOKENS_PER_STEP, write_synthetic
from dmtp.cli.report import main as cli
from dmtp.config import AblationSpec


def spec_file(root, spec, subsets=None):
    root.mkdir(parents=True, exist_ok=True)
    ev = {"subsets": subsets} if subsets else {}
    (root / "experiment.json").write_text(json.dumps({"ablation": asdict(spec), "eval": ev}))


def run(root, method, name, accepted: dict, outputs: dict | None = None, k=7, exp="ablation", **fields):
    """runs/<exp>/<method>/<name>.jsonl; accepted = {id: per-round counts}; outputs = {id: output ids} (default:
    distinct tokens, one per emitted token)."""
    path = root / "runs" / exp / method / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, acc in accepted.items():
        out = (outputs or {}).get(i, list(range(1 + sum(acc) + len(acc))))
        rows.append({"id": i, "accepted": acc, "output_ids": out, "n_candidates": k, "wall_s": 0.1, **fields})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_names_give_mode_and_seed_records_win(tmp_path):
    root = tmp_path / "p"
    run(root, "dflash", "humaneval_T1_fixed_s2", {"a": [1]})
    run(root, "dflash", "humaneval_T0.6", {"a": [1]})
    run(root, "fusion", "humaneval_T0_s1", {"a": [1]}, seed=5, mode="fixed")  # the record's own fields win
    r = read_runs(root).set_index(["method", "temperature"])
    assert tuple(r.loc[("dflash", 1.0), ["mode", "seed"]]) == ("fixed", 2)
    assert tuple(r.loc[("dflash", 0.6), ["mode", "seed"]]) == ("natural", 0)
    assert tuple(r.loc[("fusion", 0.0), ["mode", "seed"]]) == ("fixed", 5)
    run(root, "dflash", "humaneval_Tx", {"a": [1]})
    with pytest.raises(ValueError, match=r"humaneval_Tx.jsonl: expected a file name <dataset>_T<temperature>"):
        read_runs(root)


@pytest.fixture
def seeded(tmp_path):
    """dflash with 2 seeds (one zero-round request in seed 1), mtp (one seed), fixed-mode dflash."""
    root = tmp_path / "s"
    spec_file(root, AblationSpec(baselines=("mtp",), main=("dflash",), drafter_baseline="dflash", seeds=(0, 1)))
    loop = [9, 8] + [1, 2, 3, 4] * 6  # 26 tokens, a period-4 loop from token 2
    run(root, "dflash", "humaneval_T1", {"a": [3, 0], "b": [1]}, outputs={"a": loop}, stop_reason="length")
    run(root, "dflash", "humaneval_T1_s1", {"a": [5], "b": []}, outputs={"b": [0]}, stop_reason="eos")
    run(root, "dflash", "humaneval_T1_fixed", {"a": [7, 7], "b": [7]})
    run(root, "mtp", "humaneval_T1", {"a": [4], "b": [0]}, k=4)
    return tmp_path


def test_seeds_pooled_with_intervals_loops_and_zero_rounds(seeded):
    art = load("s", seeded, n_boot=300)
    s = art.summary.set_index(["mode", "method"])
    d = s.loc[("natural", "dflash")]
    # per-request acceptance: seed 0: a = 1 + 3/2 = 2.5, b = 2; seed 1: a = 6, b = no round (nan, skipped)
    assert d.acceptance_length == pytest.approx((2.5 + 2 + 6) / 3)
    assert d.acceptance_length_lo <= d.acceptance_length <= d.acceptance_length_hi
    assert (d.n_seeds, d.seeds, d.n_requests, d.n_zero_round, d.zero_round_ids) == (2, [0, 1], 2, 1, ["b"])
    assert d.per_verify == pytest.approx(1 + (3 + 0 + 1 + 5) / 4) and d.n_rounds == 4
    assert d.first_token == pytest.approx(3 / 4)
    # the loop columns are metrics.loop_summary over every record of the run (both seeds)
    loop = [9, 8] + [1, 2, 3, 4] * 6
    recs = [{"output_ids": loop, "accepted": [3, 0]}, {"output_ids": [0, 1, 2], "accepted": [1]},
            {"output_ids": list(range(7)), "accepted": [5]}, {"output_ids": [0], "accepted": []}]
    want = M.loop_summary(recs)
    assert want["n_loops"] == 1 and want["loop_frac"] == pytest.approx(24 / (26 + 3 + 7 + 1))
    for c in ("repeat_rate", "loop_frac", "acceptance_length_loopfree", "n_loops"):
        assert d[c] == pytest.approx(want[c])
    assert d.length_frac == pytest.approx(2 / 4)  # seed 0 stopped by the length cap
    assert s.loc[("fixed", "dflash"), "acceptance_length"] == pytest.approx(8)
    assert (s.loc[("natural", "mtp"), "n_seeds"], s.loc[("natural", "mtp"), "k"]) == (1, 4)


def test_ablation_tables_and_zero_round_listing(seeded):
    art = load("s", seeded, n_boot=300)
    path = render_report("s", seeded, art)
    ab = pd.read_csv(seeded / "s" / "tables" / "ablation_humaneval.csv").set_index("method")
    assert {"n_seeds", "repeat_rate", "loop_frac", "acceptance_length_loopfree", "n_zero_round"} <= set(ab)
    assert (ab.loc["dflash", "n_seeds"], ab.loc["dflash", "n_zero_round"], ab.loc["mtp", "n_seeds"]) == (2, 1, 1)
    # mtp (one seed, no drafter) is set beside both dflash seeds: pairs (a: 5-2.5, 5-6), (b: 1-2); b in seed 1: none
    assert ab.loc["mtp", "vs_dflash"] == pytest.approx(np.mean([5 - 2.5, 1 - 2, 5 - 6]))
    fixed = pd.read_csv(seeded / "s" / "tables" / "ablation_humaneval_fixed.csv")
    assert list(fixed.method) == ["dflash"] and fixed.acceptance_length[0] == pytest.approx(8)
    text = path.read_text()
    assert "### Code ablation — humaneval — fixed-length mode" in text and "MODE FIXED" in text
    assert "## Requests without a verify round" in text
    assert "- ablation/humaneval T=1 natural: `b` — in dflash@s1" in text
    assert "Requests without a verify round (first token ended them): 1 — listed below." in text
    z = pd.read_csv(seeded / "s" / "tables" / "zero_round.csv")
    assert z[["method", "seed", "id", "mode"]].values.tolist() == [["dflash", 1, "b", "natural"]]


@pytest.fixture
def ranked(tmp_path):
    """3 seeds x 12 requests: big = ctrl = small + 2 exactly; twin = small +- 1/4 on alternate requests (mean 0);
    mtp one seed."""
    root = tmp_path / "r"
    spec_file(root, AblationSpec(baselines=("mtp",), main=("small", "twin", "big"), controls=("ctrl",),
                                 drafter_baseline="small", main_method="big", blog_method="twin", seeds=(0, 1, 2)))
    rng = np.random.default_rng(0)
    for s in (0, 1, 2):
        suf = f"_s{s}" if s else ""
        base = {f"r{i}": [int(x) for x in rng.integers(1, 3, 4)] for i in range(12)}
        run(root, "small", f"humaneval_T0{suf}", base)
        run(root, "big", f"humaneval_T0{suf}", {i: [a + 2 for a in acc] for i, acc in base.items()})
        run(root, "twin", f"humaneval_T0{suf}", {i: acc[:-1] + [acc[-1] + (1 if j % 2 else -1)]
                                                 for j, (i, acc) in enumerate(base.items())})
        run(root, "ctrl", f"humaneval_T0{suf}", {i: [a + 2 for a in acc] for i, acc in base.items()})
    run(root, "mtp", "humaneval_T0", {f"r{i}": [1, 1, 1, 1] for i in range(12)}, k=4)
    return tmp_path


def test_pairwise_holm_wording(ranked):
    art = load("r", ranked, n_boot=300)
    text = render_report("r", ranked, art).read_text()
    pw = pd.read_csv(ranked / "r" / "tables" / "pairwise_T0.csv")
    assert len(pw) == 10 and set(pw.a) | set(pw.b) == {"mtp", "small", "twin", "big", "ctrl"}  # 5 rows: C(5, 2)
    assert (pw.n_seeds == 3).all() and (pw.n_requests == 12).all()
    assert pw.holm_p.tolist() == pytest.approx(S.holm(pw.diff_p.tolist()))
    assert (pw.holm_p >= pw.diff_p).all() and (pw.diff_lo <= pw["diff"]).all() and (pw["diff"] <= pw.diff_hi).all()
    r = pw.set_index(["a", "b"])
    assert r.loc[("small", "big"), "diff"] == pytest.approx(-2) and r.loc[("small", "big"), "holm_p"] < 0.05
    assert r.loc[("small", "big"), "verdict"] == "small < big"
    assert r.loc[("big", "ctrl"), "diff"] == 0 and r.loc[("big", "ctrl"), "verdict"] == "big vs ctrl: not resolved"
    assert r.loc[("small", "twin"), "diff"] == pytest.approx(0) and r.loc[("small", "twin"), "holm_p"] >= 0.05
    # the seed-level t-test beside the bootstrap (one realization, 3 seeds), Holm over the same family
    assert (pw.t_level == "seed").all() and (pw.n_units == 3).all() and (pw.n_realizations == 1).all()
    assert pw.holm_t_p.tolist() == pytest.approx(S.holm(pw.t_p.tolist()))
    assert r.loc[("small", "big"), "diff_tlo"] == pytest.approx(-2) == r.loc[("small", "big"), "diff_thi"]
    assert "- T=0: " in text and "small < big" in text and "pairs are not resolved" in text
    assert "1 realization (r0): rankings are within-realization" in text
    assert "best" not in text.lower() and "indistinguishable" not in text and "≈" not in text
    # the blog's claims, set beside the spec's blog run ("twin"); the main method ("big") "close to" it: the TOST
    # shows +2 far outside the 2 % margin -> contrary; the control pair not resolved; one realization: every verdict
    # says so, none is stronger than exploratory
    claims = pd.read_csv(ranked / "r" / "tables" / "claims.csv")
    close = claims[claims.test.str.startswith("TOST")].iloc[0]
    assert close.estimate == pytest.approx(2) and "(2 % of `twin`)" in close.test
    assert close.verdict == "within one realization (r0): contrary (exploratory)"
    ctrl = claims[claims.claim.str.startswith("control")].iloc[0]
    assert ctrl.estimate == 0 and ctrl.verdict == "within one realization (r0): not resolved (exploratory)"
    assert "The control `ctrl` is `big` without" in text and not claims.verdict.str.contains("holds").any()
    assert len(claims[claims.claim.str.contains("`big` − `twin`")]) == 1  # the closeness claim only
    main = pd.read_csv(ranked / "r" / "tables" / "main_acceptance.csv").iloc[0]
    assert main.main_vs_dmtp == pytest.approx(main["main"] - main.dmtp)


def test_ceiling_table(tmp_path):
    root = tmp_path / "c"
    spec_file(root, code())
    run(root, "dflash", "humaneval_T1", {"a": [0, 1, 2], "b": [7]})  # P(L>=1) = 3/4, P(L>=2) = 2/4, ...
    run(root, "ar", "humaneval_T1", {"a": [0, 0], "b": [0]}, k=0)
    (root / "oracle").mkdir()
    C = [0.9 ** j for j in range(1, 8)]
    (root / "oracle" / "humaneval_T1.json").write_text(json.dumps(
        {"cumulative": C, "acceptance_length": 1 + sum(C), "windows": 10, "dataset": "humaneval", "temperature": 1}))
    art = load("c", tmp_path, n_boot=100)
    (df,) = tables.ceiling(art)
    m, c = df[df.source == "measured"].set_index("method").loc["dflash"], df[df.source == "ceiling"].iloc[0]
    assert [m[f"P{j}"] for j in range(1, 8)] == pytest.approx([75, 50, 25, 25, 25, 25, 25])
    assert m.per_verify == pytest.approx(1 + 10 / 4)
    assert m.of_ceiling_pct == pytest.approx(100 * 2.5 / sum(C))
    assert [c[f"P{j}"] for j in range(1, 8)] == pytest.approx([100 * x for x in C])
    assert c.per_verify == pytest.approx(1 + sum(C))
    assert "ar" not in set(df.method)  # no candidates, no per-position acceptance
    (png,) = figures.ceiling(art)
    assert png.name == "ceiling_T1.png" and png.stat().st_size > 1000


def test_learning_curve_rows(tmp_path):
    spec = code(budgets=(10, 100), curve=("dflash", "fusion"))
    write_synthetic(spec, tmp_path, "lc", n=5, temps=(0,), bench=False,
                    methods=["ar", "mtp", "dflash", "fusion", "zero_init_residual"])
    art = load("lc", tmp_path, n_boot=200)
    df = tables.learning_curve(art, n_boot=200)
    # 2 methods x (3 seeds + pooled) x 3 steps (10, 100, final 200) + the MTP reference row
    assert len(df) == 2 * 4 * 3 + 1
    assert list(df.columns[:4]) == ["method", "seed", "step", "train_tokens"]
    assert {"acceptance_length", "lo", "hi"} <= set(df.columns)
    assert (df.lo <= df.acceptance_length).all() and (df.acceptance_length <= df.hi).all()
    d = df[(df.method == "dflash") & (df.step == 100)].set_index("seed")
    assert d.loc["0", "train_tokens"] == 100 * TOKENS_PER_STEP and d.loc["all", "train_tokens"] == 100 * TOKENS_PER_STEP
    cv = art.curve[(art.curve.method == "dflash") & (art.curve.step == 100)]
    assert d.loc["all", "acceptance_length"] == pytest.approx(cv.acceptance_length.mean())
    assert d.loc["1", "acceptance_length"] == pytest.approx(cv[cv.seed == 1].acceptance_length.mean())
    ref = df[df.method == "mtp"].iloc[0]
    assert math.isnan(ref.train_tokens) and ref.acceptance_length == pytest.approx(
        art.natural.set_index(["dataset", "temperature", "method"]).loc[("humaneval", 0.0, "mtp"), "acceptance_length"])
    (png,) = figures.learning_curve(art)
    assert png.name == "learning_curve.png" and png.stat().st_size > 1000
    # the last increment (step 100 -> 200), paired over seeds and requests, by hand for its point estimate
    inc = tables.curve_increments(art, n_boot=200).set_index("method")
    assert list(inc.index) == ["dflash", "fusion"] and (inc.from_step == 100).all() and (inc.to_step == 200).all()
    last, before = (art.curve[(art.curve.method == "fusion") & (art.curve.step == k)] for k in (200, 100))
    pair = last.merge(before, on=["seed", "id"], suffixes=("", "_b"))
    assert inc.loc["fusion", "diff"] == pytest.approx((pair.acceptance_length - pair.acceptance_length_b).mean())
    assert inc.loc["fusion", "t_level"] == "seed" and inc.loc["fusion", "n_units"] == 3
    assert (inc.p_holm >= inc.p).all() and (inc.lo <= inc["diff"]).all() and (inc["diff"] <= inc.hi).all()
    # the gains per budget over the drafter baseline and against the native MTP head, and their change
    gaps = tables.curve_gaps(art, n_boot=200)
    per = gaps[gaps.step != "change"]
    assert sorted(per[per.method == "fusion"].step.astype(int)) == [10, 100, 200]
    f, d = (art.curve[(art.curve.method == m) & (art.curve.step == 100)] for m in ("fusion", "dflash"))
    pair = f.merge(d, on=["seed", "id"], suffixes=("", "_d"))
    row = per[(per.method == "fusion") & (per.step == 100)].iloc[0]
    assert row.vs_base == pytest.approx((pair.acceptance_length - pair.acceptance_length_d).mean())
    assert row.vs_base_pct == pytest.approx(100 * (pair.acceptance_length.mean() / pair.acceptance_length_d.mean() - 1))
    assert per[per.method == "dflash"].vs_base.isna().all() and per.vs_mtp.notna().all()
    ch = gaps[gaps.step == "change"].iloc[0]
    gain = {k: per[(per.method == "fusion") & (per.step == k)].vs_base.iloc[0] for k in (10, 200)}
    assert ch.method == "fusion" and ch.vs_base == pytest.approx(gain[200] - gain[10])
    assert ch.vs_base_p_holm >= ch.vs_base_p and len(gaps[gaps.step == "change"]) == 1
    text = "\n".join(summary.gap_lines(art))
    assert "`fusion` − `dflash` by budget" in text and "Change of `fusion`'s gain from step 10 to 200" in text


def test_blog_method_is_a_run_of_the_spec():
    assert code().blog_run == "fusion" and AblationSpec(main=("x",), main_method="x").blog_run == "x"
    with pytest.raises(ValueError, match="ablation.blog_method = 'nope' is not a run"):
        code(blog_method="nope")


def test_demo_renders_every_protocol_table(tmp_path):
    cli(["demo", "--profile", "demo", "--results", str(tmp_path)])
    root = tmp_path / "demo"
    names = {p.stem for p in (root / "tables").glob("*.csv")}
    assert {"pairwise_T0", "pairwise_T0.6", "pairwise_T1", "ceiling_T0.6", "ceiling_T1", "learning_curve",
            "zero_round", "ablation_code", "ablation_humaneval", "ablation_humaneval_fixed"} <= names
    figs = {p.stem for p in (root / "figures").glob("*.png")}
    assert {"learning_curve", "ceiling_T0.6", "ceiling_T1"} <= figs
    ab = pd.read_csv(root / "tables" / "ablation_humaneval.csv")
    t0 = ab[ab.temperature == 0].set_index("method")
    assert t0.loc["zero_init_residual", "n_seeds"] == 3 and t0.loc["double_anchor_token_only", "n_seeds"] == 3
    assert t0.loc["mask_residual", "n_seeds"] == 1 and t0.loc["double_anchor_token_only", "table"] == "control"
    assert (ab.acceptance_length_lo <= ab.acceptance_length).all() and (ab.acceptance_length
                                                                           <= ab.acceptance_length_hi).all()
    assert t0.n_zero_round.sum() == 0 and (ab[ab.temperature == 1].set_index("method").n_zero_round
                                           == ab[ab.temperature == 1].set_index("method").n_seeds).all()
    fixed = pd.read_csv(root / "tables" / "ablation_humaneval_fixed.csv")
    assert set(fixed.method) == set(code().main_table) and (fixed.loop_frac > 0.4).all()  # every fixed output loops
    z = pd.read_csv(root / "tables" / "zero_round.csv")
    assert set(z.id) == {"HumanEval/7"} and set(z.temperature) == {0.6, 1.0} and set(z.dataset) == {"humaneval"}
    text = (root / "REPORT.md").read_text()
    order = ["## What was found", "### The blog's claims", "![main_acceptance_T0]", "## Throughput", "## Cost model",
             "## Code ablation", "## How the runs were made", "## Artifacts"]
    assert [text.index(h) for h in order] == sorted(text.index(h) for h in order)
    assert "The control `double_anchor_token_only` is `zero_init_residual` without" in text
    assert "(`fusion`), which is set beside it on each contrast" in text
