"""Renderers on hand-made artifacts in tmp_path (known answers), the synthetic demo, and the reference numbers."""
import json
import math
from dataclasses import asdict

import pandas as pd
import pytest

from dmtp.config.ablation import code
from dmtp.analysis import reference as R
from dmtp.analysis.report import figures, load, render_report, tables
from dmtp.analysis.report.synthetic import write_synthetic
from dmtp.cli.report import main as cli


def write_spec(root, spec):
    """experiment.json as the pipeline writes it (the report reads its `ablation`)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "experiment.json").write_text(json.dumps({"ablation": asdict(spec)}))


def write(root, exp, method, ds, temp, accepted: dict, k=None):
    """One artifact file; accepted = {request id: per-round accepted counts}."""
    path = root / "runs" / exp / method / f"{ds}_T{temp:g}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": i, "method": method, "temperature": temp, "prompt_tokens": 4, "accepted": acc, "wall_s": 0.1,
             "output_ids": list(range(1 + sum(acc) + len(acc))), **({"n_candidates": k} if k is not None else {})}
            for i, acc in accepted.items()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def hand(tmp_path):
    root = tmp_path / "hand"
    write_spec(root, code())
    # ablation, HumanEval first 8 (two here), T = 0
    write(root, "ablation", "token_only", "humaneval8", 0, {"a": [7, 7], "b": [0, 0]}, k=7)  # 8, 1 -> 4.5
    write(root, "ablation", "dflash", "humaneval8", 0, {"a": [3, 3], "b": [1]})  # 4, 2 -> 3.0; per-verify 10/3
    write(root, "ablation", "zero_init_residual", "humaneval8", 0, {"a": [7, 7], "b": [7]})  # 8
    write(root, "ablation", "mtp", "humaneval8", 0, {"a": [4, 0]})  # k = 4 by default
    write(root, "main", "dflash", "gsm8k", 0, {"a": [1, 1], "b": [3]})  # 2, 4 -> 3
    write(root, "main", "zero_init_residual", "gsm8k", 0, {"a": [3, 3], "b": [5]})  # 4, 6 -> 5
    write(root, "main", "fusion", "gsm8k", 0, {"a": [2, 2], "b": [4]})  # 3, 5 -> 4: the blog's DMTP model
    return tmp_path


def csv(tmp_path, name, profile="hand"):
    return pd.read_csv(tmp_path / profile / "tables" / f"{name}.csv")


def test_load_and_summary(hand):
    art = load("hand", hand, n_boot=200)
    s = art.summary.set_index(["experiment", "method"])
    assert s.loc[("ablation", "mtp"), "hist"] == [1, 0, 0, 0, 1] and s.loc[("ablation", "mtp"), "k"] == 4
    assert s.loc[("ablation", "dflash"), "acceptance_length"] == pytest.approx(3.0)
    assert s.loc[("ablation", "dflash"), "per_verify"] == pytest.approx(1 + 7 / 3)
    assert s.loc[("ablation", "token_only"), "first_token"] == pytest.approx(0.5)
    assert s.loc[("ablation", "token_only"), "n_rounds"] == 4
    for _, r in art.summary.iterrows():
        assert r.acceptance_length_lo <= r.acceptance_length <= r.acceptance_length_hi
        assert r.first_token_lo <= r.first_token <= r.first_token_hi


def test_tables(hand, capsys):
    art = load("hand", hand, n_boot=200)
    tables.render(art)
    ab = csv(hand, "ablation_code")
    assert list(ab.columns[:12]) == ["method", "temperature", "acceptance_length", "acceptance_length_lo",
                                     "acceptance_length_hi", "acceptance_length_tlo", "acceptance_length_thi",
                                     "per_verify", "first_token", "first_token_lo", "first_token_hi",
                                     "rel_to_token_only"]
    assert {"n_requests", "n_rounds", "blog_value", "vs_token_only", "vs_token_only_p", "vs_dflash"} <= set(ab)
    assert list(ab.method) == ["mtp", "dflash", "token_only", "zero_init_residual"]  # mtp: a baseline row
    assert list(ab.table) == ["baseline", "main", "main", "main"]
    ab = ab.set_index("method")
    assert ab.loc["dflash", "rel_to_token_only"] == pytest.approx(100 * (3 / 4.5 - 1))
    assert ab.loc["dflash", "blog_value"] == 3.360 and ab.loc["token_only", "rel_to_token_only"] == 0
    assert math.isnan(ab.loc["zero_init_residual", "blog_value"])
    assert ab.loc["dflash", "vs_token_only"] == pytest.approx(-1.5)  # (4-8 + 2-1) / 2
    # two requests, d = (-4, +1): the request bootstrap's mean is >= 0 only for the draw (+1, +1), 1 in 4 -> p = 2/4
    assert ab.loc["dflash", "vs_token_only_p"] == pytest.approx(0.5, abs=0.03)
    assert ab.loc["zero_init_residual", "vs_dflash"] == pytest.approx(5.0)  # (8-4 + 8-2) / 2
    assert ab.loc["dflash", "per_verify"] == pytest.approx(1 + 7 / 3)
    assert ab.loc["dflash", "n_requests"] == 2 and ab.loc["dflash", "n_rounds"] == 3

    main = csv(hand, "main_acceptance").set_index(["experiment", "dataset"])
    g = main.loc[("main", "gsm8k")]
    # dmtp = fusion (every DMTP number of the blog), main = zero_init_residual (the current main method)
    assert (g.dflash, g.dmtp, g.gain_pct) == pytest.approx((3, 4, 100 * (4 / 3 - 1)))
    assert (g.main, g.main_gain_pct) == pytest.approx((5, 100 * (5 / 3 - 1)))
    assert (g.blog_dflash, g.blog_dmtp, g.blog_gain_pct) == (4.318, 5.074, 17.50)  # T=0 -> open reproduction
    assert "blog_main" not in g  # the blog has no number of the main method's own
    assert g.dmtp_vs_dflash == pytest.approx(1) and g.main_vs_dmtp == pytest.approx(1)  # (3-2 + 5-4)/2, (4-3 + 6-5)/2

    ft = csv(hand, "first_token").set_index(["experiment", "method"])
    assert ft.loc[("ablation", "dflash"), "first_token_pct"] == pytest.approx(100)
    assert ft.loc[("ablation", "token_only"), "first_token_pct"] == pytest.approx(50)
    assert ft.loc[("ablation", "dflash"), "blog_pct"] == 90.47  # HumanEval DFlash at T=0

    cond = csv(hand, "conditional")
    tok = cond[(cond.source == "ours") & (cond.method == "token_only")].iloc[0]
    assert [tok[f"c{k}"] for k in range(1, 8)] == pytest.approx([50] + [100] * 6)
    blog = cond[(cond.source == "blog") & (cond.method == "dmtp")]
    assert set(blog.dataset) == {"Code", "Math"} and 434780 in set(blog.n_rounds)
    cum = csv(hand, "cumulative")
    mtp = cum[cum.method == "mtp"].iloc[0]
    assert [mtp[f"k{k}"] for k in range(1, 5)] == pytest.approx([50] * 4) and math.isnan(mtp.k5)

    pr = csv(hand, "per_request_vs_verify").set_index(["experiment", "method"])
    assert pr.loc[("ablation", "dflash"), ["per_request", "per_verify"]].tolist() == pytest.approx([3, 1 + 7 / 3])

    op = csv(hand, "open_repro").set_index("dataset")
    assert op.loc["gsm8k", "dmtp_d"] == 4 and op.loc["gsm8k", "blog_dmtp_d2"] == 5.371  # DMTP(D) = fusion
    assert math.isnan(op.loc["gsm8k", "dflash2"])

    md = (hand / "hand" / "tables" / "ablation_code.md").read_text()
    assert "| dflash | 0 | 3.000 t [" in md and "; bootstrap [" in md  # the t-interval first
    assert tables.throughput(art) is None and tables.overhead(art) is None
    assert "skip throughput" in capsys.readouterr().out


def test_rows_come_from_the_spec_and_none_is_dropped(hand):
    """A method the spec does not name is still a row (group "other", after the spec's rows); the spec's reference
    row, main method and drafter baseline set the relative columns and the main table."""
    write(hand / "hand", "ablation", "some_new_variant", "humaneval8", 0, {"a": [2, 2], "b": [0]})  # 3, 1 -> 2
    tables.render(load("hand", hand, n_boot=50))
    ab = csv(hand, "ablation_code")
    assert list(ab.method) == ["mtp", "dflash", "token_only", "zero_init_residual", "some_new_variant"]
    assert ab.set_index("method").loc["some_new_variant", "table"] == "other"
    assert ab.set_index("method").loc["some_new_variant", "rel_to_token_only"] == pytest.approx(100 * (2 / 4.5 - 1))

    # another spec: dflash is the reference row, token_only the main method (the blog's "dmtp" column)
    write_spec(hand / "hand", code(reference="dflash", main_method="token_only", blog_method="token_only",
                                   main=("dflash", "token_only"),
                                   main_table=("ar", "mtp", "dflash", "token_only"), bench=(),
                                   backbones={"dflash2": ("dflash", "dflash2")}))
    art = load("hand", hand, n_boot=50)
    tables.render(art)
    ab = csv(hand, "ablation_code").set_index("method")
    assert ab.loc["token_only", "rel_to_dflash"] == pytest.approx(50) and "rel_to_token_only" not in ab
    assert ab.loc["zero_init_residual", "table"] == "other"  # no longer a main row, still reported
    main = csv(hand, "main_acceptance").set_index(["experiment", "dataset"]).loc[("ablation", "humaneval8")]
    assert (main.dflash, main.dmtp) == pytest.approx((3.0, 4.5))
    assert tables.open_repro(art) is None  # no DFlash2 run of token_only in this spec


def test_without_experiment_json_every_row_is_kept(hand, capsys):
    (hand / "hand" / "experiment.json").unlink()
    art = load("hand", hand, n_boot=50)
    assert "experiment.json absent" in capsys.readouterr().out
    (ab,) = [df for df in tables.ablation(art) if set(df.method) >= {"dflash"}]
    assert set(ab.method) == {"mtp", "dflash", "token_only", "zero_init_residual"} and set(ab.table) == {"other"}
    assert tables.main_acceptance(art) is None and figures.main_acceptance(art) == []


def test_engine_ratios_render_typed_and_older_records(hand):
    from dmtp.analysis import ratios as RT

    bench = hand / "hand" / "bench"
    bench.mkdir(parents=True)
    old = {"target": "mini engine AR / HF AR loop, batch 1", "value": 7.19, "goal": ">= 10", "met": False,
           "note": ""}
    typed = RT.Ratio("mini", "zero_init_residual round / dflash round", 1.1756, "<=", 1.04, condition="batch 8")
    (bench / "ratios.json").write_text(json.dumps([old, typed.to_json()]))
    got = RT.read(bench / "ratios.json")
    assert got[1] == typed and (got[0].direction, got[0].goal, got[0].met) == (">=", 10.0, False)
    text = render_report("hand", hand, load("hand", hand, n_boot=50)).read_text()
    assert "| mini zero_init_residual round / dflash round (batch 8) | 1.176 | <= 1.04 | False |" in text
    assert "| mini engine AR / HF AR loop, batch 1 | 7.190 | >= 10 | False |" in text


TP_COLS = ["method", "temperature", "batch_cap", "repeat", "dataset", "requests", "output_tokens", "wall_s",
           "tok_per_s", "per_verify", "groups", "admit_s"]


def test_bench_tables_and_figure(hand):
    """Throughput from interleaved repeats: medians with [min, max], per-repeat ratios to AR and to DFlash, the
    per-verify gain beside the tok/s gain, the blog's B32 numbers on the T = 1 rows; overhead at batch 8."""
    bench = hand / "hand" / "bench"
    bench.mkdir(parents=True)
    rows = [("ar", 0, 32, 0, 100.0, 1.0), ("ar", 0, 32, 1, 110.0, 1.0),
            ("dflash", 0, 32, 0, 300.0, 3.0), ("dflash", 0, 32, 1, 330.0, 3.0),
            ("zero_init_residual", 0, 32, 0, 360.0, 3.6), ("zero_init_residual", 0, 32, 1, 363.0, 3.6),
            ("ar", 1, 32, 0, 90.0, 1.0), ("dflash", 1, 32, 0, 180.0, 1.8), ("zero_init_residual", 1, 32, 0, 198.0, 2.0)]
    pd.DataFrame([(m, t, c, r, "humaneval", 8, 800, 800 / v, v, pv, 1, 0.01) for m, t, c, r, v, pv in rows],
                 columns=TP_COLS).to_csv(bench / "throughput.csv", index=False)
    pd.DataFrame([("dflash", "drafter", 0.4, 8), ("dflash", "round", 9.0, 8), ("zero_init_residual", "drafter", 0.4, 8),
                  ("zero_init_residual", "mtp", 0.2, 8), ("zero_init_residual", "round", 9.5, 8),
                  ("zero_init_residual", "round", 99.0, 32)],  # another batch: not in the batch-8 table
                 columns=["method", "stage", "ms_per_round", "batch"]).to_csv(bench / "overhead.csv", index=False)
    art = load("hand", hand, n_boot=50)
    tp = tables.throughput(art).set_index(["temperature", "method"])
    z = tp.loc[(0, "zero_init_residual")]
    assert (z.realization, z.n_repeats, z.tok_per_s, z.tok_per_s_lo, z.tok_per_s_hi) == ("r0", 2, 361.5, 360, 363)
    assert (z.speedup, z.speedup_lo, z.speedup_hi) == pytest.approx((3.45, 3.3, 3.6))  # 360/100, 363/110
    assert (z.gain_pct, z.gain_pct_lo, z.gain_pct_hi) == pytest.approx((15, 10, 20))  # 360/300, 363/330
    assert z.per_verify_gain_pct == pytest.approx(20) and z.gain_over_per_verify == pytest.approx(0.75)
    assert tp.loc[(0, "dflash"), "speedup"] == pytest.approx(3.0) and math.isnan(tp.loc[(0, "dflash"), "gain_pct"])
    one = tp.loc[(1, "zero_init_residual")]
    assert one.gain_pct == pytest.approx(10) and one.per_verify_gain_pct == pytest.approx(100 * (2 / 1.8 - 1))
    assert one.blog_dmtp_tok_per_s == 6564.08 and one.blog_gain_pct == pytest.approx(18.77, abs=0.01)
    assert one.blog_per_verify_gain_pct == 18.78 and math.isnan(z.blog_gain_pct)  # the blog: T = 1 only
    assert "Models: r0 at" in (hand / "hand" / "tables" / "throughput.md").read_text()
    ov = tables.overhead(art).set_index("method")
    assert ov.loc["zero_init_residual", "round_vs_dflash_ms"] == pytest.approx(0.5)
    assert ov.loc["blog:Code:dmtp", "round"] == 9.318
    (png, _) = figures.throughput(art)
    assert png.stat().st_size > 1000
    (png,) = figures.overhead(art)
    assert png.name == "overhead.png" and png.stat().st_size > 1000


def test_figures_and_report(hand):
    art = load("hand", hand, n_boot=100)
    report = render_report("hand", hand, art)
    figs = {p.name: p.stat().st_size for p in (hand / "hand" / "figures").glob("*.png")}
    for name in ("main_acceptance_T0", "first_token_T0", "cumulative_T0", "conditional_T0"):
        assert figs[f"{name}.png"] > 1000
    assert "throughput_T0.png" not in figs and "open_repro_T0.png" not in figs  # no bench, no dflash2
    assert "overhead.png" not in figs
    text = report.read_text()
    assert "![main_acceptance_T0](figures/main_acceptance_T0.png)" in text
    assert "### Code ablation — humaneval8" in text and "Per-request vs per-verify" in text


def test_directions_rows_and_figure_appear_when_their_runs_exist(hand, tmp_path):
    """The closing directions' table and figure: absent without their runs; with `given` (and a fixed count),
    `zero_init_residual_joint` and MTP415 on its tuned head, one row per run, dataset and T with its acceptance length
    and first-token acceptance, paired differences from MTP415, DFlash and the main method on the same requests,
    and the figure (cumulative acceptance by position, the accepted-count shares), in REPORT.md's own section."""
    art = load("hand", hand, n_boot=100)
    assert tables.directions(art) is None and figures.directions(art) == []
    root = tmp_path / "dirs"
    spec = code(supplementary=("given", "zero_init_residual_joint"),
                baselines=("ar", "mtp", "mtp.zero_init_residual_joint"))
    write_spec(root, spec)
    for t in (0, 1):
        write(root, "ablation", "mtp", "humaneval", t, {"a": [4, 0], "b": [1]}, k=4)  # 3.0, 2.0 -> 2.5
        write(root, "ablation", "mtp.zero_init_residual_joint", "humaneval", t, {"a": [4, 4], "b": [2]}, k=4)  # 4.0
        write(root, "ablation", "dflash", "humaneval", t, {"a": [3, 3], "b": [1]})  # 4, 2 -> 3.0
        write(root, "ablation", "zero_init_residual", "humaneval", t, {"a": [5, 5], "b": [3]})  # 6, 4 -> 5.0
        write(root, "ablation", "given", "humaneval", t, {"a": [6, 6], "b": [4]})  # 7, 5 -> 6.0
        write(root, "ablation", "given-g2", "humaneval", t, {"a": [2, 2], "b": [0]})  # 3, 1 -> 2.0
        write(root, "ablation", "zero_init_residual_joint", "humaneval", t, {"a": [7, 5], "b": [3]})  # 7, 4 -> 5.5
    art = load("dirs", tmp_path, n_boot=100)
    report = render_report("dirs", tmp_path, art)
    df = csv(tmp_path, "directions", "dirs").set_index(["temperature", "method"])
    assert sorted(df.loc[0].index) == sorted(["given", "given-g2", "zero_init_residual_joint",
                                             "mtp.zero_init_residual_joint"])
    assert df.loc[(0, "given"), "acceptance_length"] == pytest.approx(6.0)
    assert df.loc[(0, "given"), "vs_dflash"] == pytest.approx(3.0)
    assert df.loc[(0, "given"), "vs_zero_init_residual"] == pytest.approx(1.0)
    assert df.loc[(0, "given-g2"), "vs_mtp"] == pytest.approx(-0.5)
    assert df.loc[(1, "mtp.zero_init_residual_joint"), "vs_mtp"] == pytest.approx(1.5)
    assert df.loc[(0, "zero_init_residual_joint"), "first_token_pct"] == pytest.approx(100.0)
    figs = {p.name: p.stat().st_size for p in (tmp_path / "dirs" / "figures").glob("directions_T*.png")}
    assert set(figs) == {"directions_T0.png", "directions_T1.png"} and min(figs.values()) > 1000
    text = report.read_text()
    assert "The blog's closing directions" in text and "![directions_T0](figures/directions_T0.png)" in text


def test_empty_profile_skips(tmp_path, capsys):
    (tmp_path / "none" / "runs").mkdir(parents=True)  # a profile folder without any run yet
    cli(["report", "--profile", "none", "--results", str(tmp_path)])
    assert "No run artifacts found" in (tmp_path / "none" / "REPORT.md").read_text()
    assert "skip" in capsys.readouterr().out


def test_unknown_profile_is_an_error(tmp_path, capsys):
    """A --profile (or --results) naming no artifacts is a one-line error, not an empty report."""
    with pytest.raises(SystemExit) as e:
        cli(["report", "--profile", "typo", "--results", str(tmp_path)])
    assert e.value.code == 2 and not (tmp_path / "typo").exists()
    assert f"{tmp_path / 'typo'} holds no artifacts" in capsys.readouterr().err


def test_missing_runs_are_listed(hand, capsys):
    """A method whose runs are missing is named (stdout and REPORT.md), never dropped silently."""
    (hand / "hand" / "runs" / "ablation" / "dflash" / "humaneval8_T0.jsonl").unlink()
    write(hand / "hand", "ablation", "dflash", "humaneval8", 1, {"a": [1]})  # dflash at T = 1 only
    cli(["report", "--profile", "hand", "--results", str(hand)])
    out = capsys.readouterr().out
    assert "missing runs: ablation/dflash/humaneval8_T0.jsonl" in out
    assert "missing runs: ablation/token_only/humaneval8_T1.jsonl" in out
    assert "- `runs/ablation/dflash/humaneval8_T0.jsonl`" in (hand / "hand" / "REPORT.md").read_text()


def test_synthetic_demo(tmp_path):
    write_synthetic(code(), tmp_path, "demo", n=4, temps=(0,), curve=False,
                    methods=["mtp", "dflash", "fusion", "zero_init_residual", "dflash2", "dmtp_d2"])
    art = load("demo", tmp_path, n_boot=50)
    tables.render(art)
    names = sorted(p.stem for p in (tmp_path / "demo" / "tables").glob("*.csv"))
    assert names == ["ablation_code", "ablation_code_fixed", "ablation_humaneval", "ablation_humaneval_fixed",
                     "conditional", "cumulative", "first_token", "main_acceptance", "open_repro", "overhead",
                     "pairwise_T0", "per_request_vs_verify", "throughput"]  # T0 only: no ceiling, no zero-round
    op = csv(tmp_path, "open_repro", "demo").query("experiment == 'main'")
    assert len(op) == 2 and op[["mtp", "dflash", "dflash2", "dmtp_d2"]].notna().all().all()
    assert op.dmtp_d.isna().all()  # DMTP(D) = fusion, which the Code spec evaluates on HumanEval only (main_table)
    (png,) = figures.open_repro(art)
    assert png.name == "open_repro_T0.png" and png.stat().st_size > 1000


def test_a_table_the_records_no_longer_support_is_gone_after_the_next_report(tmp_path):
    """The report clears its earlier tables and figures first: a table its records no longer give (here the bench's,
    once bench/ is gone; as when a folder's pooled realizations change) is not left behind to be read as current;
    the pipeline's lossless tables stay."""
    write_synthetic(code(), tmp_path, "demo", n=4, temps=(0,), curve=False, methods=["mtp", "dflash"])
    root = tmp_path / "demo"
    render_report("demo", tmp_path, load("demo", tmp_path, n_boot=50))
    assert (root / "tables" / "throughput.csv").exists() and list((root / "figures").glob("*.png"))
    (root / "tables" / "lossless_T0.csv").write_text("method,identical\ndflash,1\n")
    (root / "figures" / "from_an_older_run.png").write_bytes(b"x")
    import shutil

    shutil.rmtree(root / "bench")
    text = render_report("demo", tmp_path, load("demo", tmp_path, n_boot=50)).read_text()
    assert not (root / "tables" / "throughput.csv").exists() and "## Throughput" not in text
    assert not (root / "figures" / "from_an_older_run.png").exists()
    assert (root / "tables" / "lossless_T0.csv").exists() and (root / "tables" / "main_acceptance.csv").exists()


def test_reference_transcription_is_self_consistent():
    m = R.table("main")
    assert len(m) == 6 and m.set_index("workload").loc["Agent", "dmtp"] == 5.369
    for r in m.itertuples():  # the blog's rel % come from unrounded values: agree to rounding
        assert 100 * (r.dmtp / r.dflash - 1) == pytest.approx(r.dmtp_vs_dflash_pct, abs=0.03)
    ab = R.table("ablation").set_index("method")
    for meth, r in ab.iterrows():
        assert 100 * (r.acceptance_length / ab.loc["token_only", "acceptance_length"] - 1) == \
            pytest.approx(r.rel_to_token_only_pct, abs=0.03)
    op = R.table("open_repro")
    for r in op.itertuples():
        assert 100 * (r.dmtp / r.dflash - 1) == pytest.approx(r.dmtp_vs_dflash_pct, abs=0.03)
        assert 100 * (r.dmtp_d2 / r.dflash2 - 1) == pytest.approx(r.dmtp_d2_vs_dflash2_pct, abs=0.03)
    for r in R.table("first_token").itertuples():
        assert r.dmtp - r.dflash == pytest.approx(r.gap_pts, abs=0.015)
    tp = R.table("throughput").set_index(["workload", "method"]).tok_per_s
    assert 100 * (tp["Agent", "dmtp"] / tp["Agent", "dflash"] - 1) == pytest.approx(23.75, abs=0.01)
    ov = R.table("overhead").set_index(["workload", "method", "stage"]).ms_per_round
    assert ov["SWE", "dmtp", "round"] - ov["SWE", "dflash", "round"] == pytest.approx(0.550)
    assert R.table("conditional").n_rounds.tolist() == [523201, 434780, 473538, 404689, 54479, 41259, 22213, 17371,
                                                         4795, 3836, 2919, 2798]
    assert R.blog_value("main", "mt_bench", "dmtp") == 3.406
    assert R.blog_value("open_repro", "MT-Bench", "dmtp_d2") == 4.052
    assert math.isnan(R.blog_value("open_repro", "agent", "dflash"))


def test_the_report_says_whether_the_corpus_is_the_pinned_one(tmp_path):
    """How the runs were made: each realization's corpus digest against the profile's pinned `data.corpus_digest`
    (equal, or different in bold), or a line saying the profile pinned none."""
    from types import SimpleNamespace

    from dmtp.analysis.report import corpus_lines

    art = SimpleNamespace(root=tmp_path, realizations=[SimpleNamespace(name="r1", corpus="a" * 16),
                                                       SimpleNamespace(name="r2", corpus="b" * 16)])
    (tmp_path / "experiment.json").write_text(json.dumps({"data": {"corpus_digest": "a" * 16}}))
    text = " ".join(corpus_lines(art))
    assert "equal in r1" in text and f"**different** in r2 ({'b' * 16})" in text
    (tmp_path / "experiment.json").write_text(json.dumps({"data": {}}))
    assert "pinned no corpus digest" in " ".join(corpus_lines(art))


def test_a_smoke_series_and_a_random_target_say_so_first(hand):
    """A smoke series (`registered.SMOKE`) says so at the top of REPORT.md and of every table, once each, and words
    its verdicts within one smoke realization; a run on a random-weight target (stages.json `random_weights`, as
    `dmtp reproduce` writes it for the stand-in) says that acceptance is not measured there. A run of the method says
    neither."""
    from dmtp.analysis.report import claims

    root = hand / "hand"
    render_report("hand", hand, load("hand", hand, n_boot=50))
    plain = (root / "REPORT.md").read_text()
    assert "smoke run" not in plain.lower() and "Random weights" not in plain
    exp = json.loads((root / "experiment.json").read_text())
    (root / "experiment.json").write_text(json.dumps(dict(exp, name="tiny")))
    (root / "stages.json").write_text(json.dumps({"random_weights": True, "stages": {}}))
    art = load("hand", hand, n_boot=50)
    text = render_report("hand", hand, art).read_text()
    top = text.split("\n\n")[2]  # after the heading and the rendering line
    assert top.startswith("> **A smoke run** (`tiny`, the CPU profile") and text.count("**A smoke run**") == 1
    assert "Random weights: acceptance is not measured" in top
    for md in (root / "tables").glob("*.md"):
        lines = md.read_text().splitlines()
        assert lines[2].startswith("> **A smoke run**"), md.name  # under the title, before anything else
    assert claims.one(art) == "within one realization (r0) of a smoke run: "
    assert art.caveat_short == "a smoke run (tiny): not a finding about the method; random weights: acceptance not " \
        "measured"
    from matplotlib.figure import Figure

    fig = Figure()
    fig.suptitle("Verification at T = 1")
    figures.caveat_title(fig, art.caveat_short)  # what every figure of the series gets before it is written
    assert fig.get_suptitle() == "A smoke run (tiny): not a finding about the method; random weights: acceptance " \
        "not measured\nVerification at T = 1"


def test_notes_numbers_are_generated_from_the_tables(hand):
    """NOTES.md's generated block holds what the tables hold: rewritten by every report render, the prose around it
    untouched; the committed results/tiny/NOTES.md block is what its committed tables give."""
    from pathlib import Path

    from dmtp.analysis.report import notes

    root = hand / "hand"
    (root / "NOTES.md").write_text(f"# Notes\n\nProse.\n\n{notes.BEGIN}\nstale 1.194\n{notes.END}\n\nMore prose.\n")
    render_report("hand", hand, load("hand", hand, n_boot=50))
    text = (root / "NOTES.md").read_text()
    assert text.startswith("# Notes\n\nProse.\n\n") and text.endswith("\n\nMore prose.\n") and "1.194" not in text
    at = csv(hand, "ablation_code").set_index(["method", "temperature"]).acceptance_length
    assert f"| ablation_code | 0 | {at['dflash', 0]:.3f} | {at['mtp', 0]:.3f} | " in text
    assert notes.t1_runs(code())[:3] == ["token_only", "t1_residual", "double_anchor_fusion"]
    assert "dflash" not in notes.t1_runs(code()) and "dflash2" not in notes.t1_runs(code())
    tiny = Path(__file__).parents[1] / "results" / "tiny"
    committed = (tiny / "NOTES.md").read_text().split(notes.BEGIN)[1].split(notes.END)[0].strip()
    assert committed == notes.block(tiny)


@pytest.mark.parametrize("profile", ["tiny", "mini", "mini/r7"])
def test_the_committed_tables_are_what_the_report_renders_from_the_committed_records(tmp_path, monkeypatch,
                                                                                      profile):
    """The report rendered again over a copy of results/<profile> rewrites its tables (the ablation tables and the
    claims among them) with the committed bytes: every committed CSV and REPORT.md is what the report code makes of
    the committed records (so a rewrite of the report code is held to the committed results)."""
    import os
    import shutil
    import time
    from pathlib import Path

    src = Path(__file__).parents[1] / "results" / profile
    if not (src / "tables").is_dir():
        pytest.skip(f"no committed results/{profile}/tables")
    dst = tmp_path / "results" / profile
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("figures"))
    old = time.time() - 3600
    for f in (dst / "tables").iterdir():
        os.utime(f, (old, old))
    monkeypatch.chdir(tmp_path)  # the report names its folder as given: results/<profile>
    render_report(profile, "results")
    rewritten = {f.name for f in (dst / "tables").glob("*.csv") if f.stat().st_mtime > old + 60}
    assert {"claims.csv"} | {f.name for f in (src / "tables").glob("ablation_*.csv")} <= rewritten
    names = lambda root: sorted(f.name for f in (root / "tables").glob("*.csv"))  # noqa: E731
    assert names(dst) == names(src)
    for name in sorted(rewritten) + ["../REPORT.md"]:
        assert (dst / "tables" / name).read_text() == (src / "tables" / name).read_text(), name
