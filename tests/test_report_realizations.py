"""Several realizations of one experiment on synthetic artifacts: which folders are pooled (the experiment check),
realization-level inference and its wording (no ranking where the realizations disagree in sign), throughput over
realizations and the cost model, the report's order."""
import dataclasses
import json
import math
from itertools import takewhile

import numpy as np
import pandas as pd
import pytest

from dmtp.config.ablation import code
from dmtp.analysis.report import load, render_report, tables
from dmtp.analysis.report.synthetic import write_synthetic
from dmtp.cli.report import main as cli

RUNS = ["ar", "mtp", "dflash", "token_only", "fusion", "zero_init_residual", "double_anchor_token_only"]
# fusion above token_only in r1 and r2, below it in r3; dflash far below the rest in every realization
OFFSETS = {1: {"fusion": 0.1, "dflash": -0.3}, 2: {"fusion": 0.1, "dflash": -0.3}, 3: {"fusion": -0.2, "dflash": -0.3}}


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    res = tmp_path_factory.mktemp("real")
    for k in (1, 2, 3):
        write_synthetic(code(), res, "p", n=24, temps=(0, 1), methods=RUNS, curve=False, oracle=False, ood=True,
                        realization=k, offsets=OFFSETS[k],  # r2 stopped and resumed (run control): still pooled
                        experiment={"pretrain": {"tokens": 1000, "stop_after": 7 if k == 2 else 0}})
    write_synthetic(code(), res, "p", n=24, temps=(0, 1), methods=RUNS, curve=False, oracle=False, bench=False,
                    ood=True, realization=4, experiment={"pretrain": {"tokens": 1000}, "eval": {"new_tokens": 99}})
    for k, digest in ((1, "aaaa"), (2, "aaaa"), (3, "bbbb")):  # the target's corpus (target/meta.json)
        (res / "p" / f"r{k}" / "target").mkdir()
        (res / "p" / f"r{k}" / "target" / "meta.json").write_text(json.dumps({"corpus": {"train_digest": digest}}))
    (res / "p" / "r5").mkdir()  # no experiment.json: not a realization
    (res / "p" / "bench").mkdir()  # the committed random-weight shape timings live beside the realizations
    (res / "p" / "bench" / "overhead.csv").write_text(
        "method,stage,ms_per_round,batch\n8b-shape:dflash,round,8.2,8\n8b-shape:zero_init_residual,round,8.8,8\n"
        "8b-shape:dflash+dense,round,8.0,8\n8b-shape:ar@batch1,round,6.1,1\n")
    art = load("p", res, n_boot=300)
    return res, art, render_report("p", res, art).read_text()


def test_matching_realizations_are_pooled_the_others_named(pooled):
    res, art, text = pooled
    assert [r.name for r in art.realizations] == ["r1", "r2", "r3"]
    assert art.left_out == [("r4", "experiment differs from r3 in eval.new_tokens")]
    assert art.realizations[0].bench_commit == "synthetic-r1" and art.realizations[0].commits[0][0] == "synthetic-r1"
    s = art.natural.set_index(["dataset", "temperature", "method"])
    assert s.loc[("humaneval", 0.0, "dflash"), ["n_realizations", "n_seeds", "t_level", "n_units"]].tolist() == [
        3, 3, "realization", 3]
    assert s.loc[("humaneval", 0.0, "mtp"), "n_seeds"] == 1
    assert "**3 realizations (r1, r2, r3), pooled**" in text
    # the thresholds of both kinds of test the report makes: two-sided (pairwise, exploratory) and one-sided (primary)
    assert "rejects only beyond 4.30 standard errors" in text and "one-sided test beyond 2.92" in text
    assert "- r4: experiment differs from r3 in eval.new_tokens" in text
    assert [r.corpus for r in art.realizations] == ["aaaa", "aaaa", "bbbb"]
    assert "The pooled realizations' corpora differ** (aaaa, bbbb)" in text
    pw = pd.read_csv(res / "p" / "tables" / "pairwise_T0.csv")
    assert (pw.t_level == "realization").all() and (pw.n_units == 3).all() and (pw.n_realizations == 3).all()


def test_no_ranking_where_the_realizations_disagree(pooled):
    res, art, text = pooled
    r = tables.pair_row(art, "fusion", "token_only", 0.0)
    assert len(r["signs"]) == 3 and r["signs"][0] > 0 and r["signs"][2] < 0
    assert r["verdict"] == "fusion vs token_only: not resolved" and r["sign_agree"] < 3
    claims = pd.read_csv(res / "p" / "tables" / "claims.csv")
    ft = claims[claims.claim.str.startswith("fusion > token_only")]
    assert set(ft.verdict) == {"not resolved (exploratory)"} and len(ft) == 2  # T = 0 and 1
    lines = text.splitlines()
    ranks = [i for i, ln in enumerate(lines) if ln.startswith("- T=0: ")]
    won = [ln.strip() for i in ranks for ln in takewhile(lambda x: x.startswith("  - "), lines[i + 1:])]  # resolved
    assert ranks and not any("token_only" in ln.partition(" > ")[2] and ln.startswith("- fusion > ") for ln in won)
    # one sign in every realization, large against their spread: resolved (here against the claim); the same sign
    # but a spread as large as the mean (fusion in r3): not resolved
    dd = claims[claims.claim.str.startswith("DFlash > MTP415") & (claims.temperature == 0)].iloc[0]
    assert dd.verdict == "contrary (exploratory)" and dd.estimate < 0
    assert all(float(x) < 0 for x in dd.by_realization.split(" / "))
    fd = claims[claims.claim.str.startswith("P1 with the blog's DMTP model") & (claims.temperature == 0)].iloc[0]
    assert fd.verdict == "not resolved (exploratory)" and all(float(x) > 0 for x in fd.by_realization.split(" / "))
    assert set(claims.family) == {"exploratory"}  # a synthetic series is not the one the primary family names
    assert "indistinguishable" not in text and "≈" not in text and "best" not in text.lower()


def test_out_of_distribution_rows(pooled):
    res, art, text = pooled
    ood = pd.read_csv(res / "p" / "tables" / "ood.csv")
    assert set(ood.dataset) == {"humaneval", "pytests"} and set(ood.method) == {"mtp", "dflash", "fusion",
                                                                                  "zero_init_residual"}
    assert (ood.n_realizations == 3).all()
    claims = pd.read_csv(res / "p" / "tables" / "claims.csv")
    (row,) = claims[claims.claim.str.contains("outside the drafter's training distribution")].itertuples()
    assert row.test.startswith("difference in differences; t p = ") and "over 3 realizations" in row.test
    assert len(row.by_realization.split("/")) == 3 and row.family == "exploratory"
    assert "First-token gap `mtp` − `dflash`" in text


def test_throughput_and_cost_model_over_realizations(pooled):
    res, art, text = pooled
    tp = pd.read_csv(res / "p" / "tables" / "throughput.csv")
    assert list(dict.fromkeys(tp.realization)) == ["r1", "r2", "r3", "all"]
    allr = tp[tp.realization == "all"]
    assert (allr.n_repeats == 6).all() and (tp[tp.realization == "r2"].commit == "synthetic-r2").all()
    main = allr[(allr.method == "zero_init_residual") & (allr.temperature == 1) & (allr.batch_cap == 32)].iloc[0]
    assert main.gain_pct_lo <= main.gain_pct <= main.gain_pct_hi and main.blog_gain_pct == pytest.approx(18.77, 1e-3)
    cm = pd.read_csv(res / "p" / "tables" / "costmodel.csv")
    pm = cm[cm.kind == "predicted vs measured"]
    assert set(pm.realization) == {"r1", "r2", "r3"} and set(pm.batch_cap) == {1, 32}
    assert (pm.error_pct.abs() < 8).all()  # the synthetic bench is timed by the cost model itself, plus 2 % noise
    assert (pm[pm.method == "ar"].predicted_speedup == 1).all()
    pr = cm[cm.kind == "projection 8b-shape"].set_index(["realization", "batch_cap", "method"])
    assert pr.loc[("r1", 1, "ar"), "timing"] == "8b-shape:ar@batch1" and pr.loc[("r1", 1, "dflash"),
                                                                                  "round_ms_b8"] == 8.2
    assert ("r1", 1, "mtp") not in pr.index  # no 8B-shape timing of its own
    assert "Models: r1 at synthetic-r1; r2 at synthetic-r2; r3 at synthetic-r3." in text
    order = ["## What was found", "### The blog's claims", "## Throughput", "## Cost model", "## Code ablation",
             "## How the runs were made"]
    assert [text.index(h) for h in order] == sorted(text.index(h) for h in order)


def test_one_realization_folder_and_the_flat_layout(tmp_path):
    """A flat layout (realization 0) beside r2 with another experiment: two groups of one, the newest (r2) is pooled
    and r0 is named with what differs."""
    write_synthetic(code(), tmp_path, "q", n=4, temps=(0,), methods=["ar", "dflash"], curve=False, oracle=False,
                    bench=False, realization=2)
    write_synthetic(code(seeds=(0,)), tmp_path, "q", n=4, temps=(0,), methods=["ar", "dflash"], curve=False,
                    oracle=False, bench=False)
    art = load("q", tmp_path, n_boot=100)
    assert [r.name for r in art.realizations] == ["r2"] and set(art.runs.realization) == {2}
    assert json.loads((tmp_path / "q" / "r2" / "experiment.json").read_text())["realization"] == 2
    assert art.left_out == [("r0 (the flat layout)", "experiment differs from r2 in ablation.seeds")]
    alone = load("q/r2", tmp_path, n_boot=100)  # as the pipeline's tables stage renders one realization
    assert [r.name for r in alone.realizations] == ["r2"] and not alone.left_out
    (tmp_path / "q" / "runs").rename(tmp_path / "q" / "old")  # realization folders only: the CLI renders them
    cli(["tables", "--profile", "q", "--results", str(tmp_path)])
    assert (tmp_path / "q" / "tables" / "ablation_humaneval.csv").exists()


def test_a_realization_without_a_bench_is_projected_to_the_timed_shapes(tmp_path):
    """No throughput runs of its own: no predicted-vs-measured row, but the projections to every random-weight shape
    timed in results/<profile>/bench (here the profile's own `mini-shape`), by hand: decode only, one round time."""
    write_synthetic(code(), tmp_path, "s", n=6, temps=(0,), methods=["ar", "dflash", "zero_init_residual"],
                    curve=False, oracle=False, bench=False)
    (tmp_path / "s" / "bench").mkdir()
    pd.DataFrame([{"method": f"mini-shape:{m}", "stage": "round", "ms_per_round": ms, "batch": 8}
                  for m, ms in (("ar", 1.5), ("dflash", 1.8), ("zero_init_residual", 2.0))]
                 ).to_csv(tmp_path / "s" / "bench" / "overhead.csv", index=False)
    art = load("s", tmp_path, n_boot=100)
    cm = tables.costmodel(art).set_index(["kind", "batch_cap", "method"])
    assert set(cm.index.get_level_values("kind")) == {"projection mini-shape"}
    recs = art.runs[(art.runs.dataset == "humaneval") & (art.runs.temperature == 0) & (art.runs.seed == 0)
                    & (art.runs["mode"] == "natural")]
    rounds = {m: g.accepted.map(len).sum() for m, g in recs.groupby("method")}
    tokens = {m: g.output_tokens.sum() for m, g in recs.groupby("method")}
    # at cap 1 the requests run one after another: time = rounds x round time
    want = (tokens["zero_init_residual"] / (rounds["zero_init_residual"] * 2.0)) / (tokens["ar"] / (rounds["ar"] * 1.5))
    assert cm.loc[("projection mini-shape", 1, "zero_init_residual"), "predicted_speedup"] == pytest.approx(want)
    assert cm.loc[("projection mini-shape", 1, "ar"), "predicted_speedup"] == 1


def test_of_two_lone_experiments_the_newest_is_pooled(tmp_path):
    """Two realizations of different experiments, one each: the one whose target was written last is the report's,
    whatever its number (a check numbered 8 run after one numbered 9)."""
    from dmtp.analysis.report.data import match

    found = []
    for k, steps, when in ((8, 1000, "2026-12-02T02:36:00+0000"), (9, 500, "2026-12-01T22:15:00+0000")):
        p = tmp_path / f"r{k}"
        (p / "target").mkdir(parents=True)
        (p / "experiment.json").write_text(json.dumps({"train": {"steps": steps}, "realization": k}))
        (p / "target" / "meta.json").write_text(json.dumps({"written": when}))
        found.append((k, p))
    pooled, out = match(found)
    assert [k for k, _ in pooled] == [8] and out == [("r9", "experiment differs from r8 in train.steps")]


def test_a_compacted_realization_reads_as_the_plain_one(tmp_path):
    """`report compact` gzips a realization's record files; the loader reads them as the plain ones (the same
    tables), a run kept in both forms is refused as records met twice, and a cut-off .gz names its file."""
    import gzip
    import shutil

    for name in ("plain", "packed"):
        write_synthetic(code(), tmp_path / name, "p", n=12, temps=(0,), methods=["ar", "dflash", "zero_init_residual"],
                        curve=True, oracle=False, ood=False, realization=2)
    cli(["compact", "--profile", "p", "--results", str(tmp_path / "packed"), "--realization", "2"])
    runs = tmp_path / "packed" / "p" / "r2" / "runs"
    assert not list(runs.glob("**/*.jsonl")) and list(runs.glob("**/*.jsonl.gz"))
    a, b = (load("p", tmp_path / name, n_boot=50) for name in ("plain", "packed"))
    pd.testing.assert_frame_equal(a.runs, b.runs)
    assert a.curve is not None and len(a.curve) == len(b.curve)

    gz = next(runs.glob("*/dflash/*.jsonl.gz"))
    plain = gz.with_name(gz.name[:-3])
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    with pytest.raises(ValueError, match="already on"):
        load("p", tmp_path / "packed", n_boot=50)
    plain.unlink()
    shutil.copy(gz, tmp_path / "whole.gz")
    gz.write_bytes((tmp_path / "whole.gz").read_bytes()[:-20])
    with pytest.raises(ValueError, match=f"{gz.name}: not a readable gzip file"):
        load("p", tmp_path / "packed", n_boot=50)
    with pytest.raises(SystemExit):
        cli(["compact", "--profile", "p", "--results", str(tmp_path / "packed")])


def test_throughput_without_stage_times_borrows_another_realizations(tmp_path):
    """r2 timed its throughput but was killed before its stage times: its cost-model rows use r1's round times (the
    same experiment, so the same shapes), named in round_times_from; a batch whose round was not timed is flagged
    and left out of the summary's error range."""
    for k in (1, 2):
        write_synthetic(code(), tmp_path, "b", n=8, temps=(0,), methods=["ar", "dflash", "zero_init_residual"],
                        curve=False, oracle=False, realization=k)
    (tmp_path / "b" / "r2" / "bench" / "overhead.csv").unlink()
    p = tmp_path / "b" / "r1" / "bench" / "overhead.csv"
    ov = pd.read_csv(p)
    ov = ov[~((ov.method == "dflash") & (ov.batch == 32))]  # dflash's round never timed at B32
    ov.to_csv(p, index=False)
    art = load("b", tmp_path, n_boot=100)
    cm = tables.costmodel(art)
    pm = cm[cm.kind == "predicted vs measured"].set_index(["realization", "batch_cap", "method"])
    assert set(pm.loc["r2"].round_times_from) == {"r1"} and set(pm.loc["r1"].round_times_from) == {"r1"}
    assert not pm.loc[("r2", 32, "dflash"), "round_timed_at_cap"] and pm.loc[("r2", 1, "dflash"), "round_timed_at_cap"]
    from dmtp.analysis.report.summary import costmodel_lines

    b32 = next(x for x in costmodel_lines(art) if x.startswith("- B32"))
    assert "r2 with r1's stage times" in b32 and "`dflash` (r2)" in b32 and "extrapolated" in b32
    assert "1 method x realization rows whose round was timed at B32" not in b32  # zir r1 + zir r2: two rows
    assert "2 method x realization rows whose round was timed at B32" in b32


def test_admission_cost_is_the_median_over_repeats():
    """A repeat that compiled an admission shape (10x the host time) does not move the cost model's admission cost."""
    from dmtp.analysis.report.bench import admission_ms

    tp = pd.DataFrame({"method": ["ar"] * 3 + ["m"] * 3, "admit_s": [0.5, 0.3, 0.3, 3.0, 0.3, 0.32],
                       "groups": [10, 10, 10, 10, 10, 10]})
    assert admission_ms(tp) == pytest.approx({"ar": 30.0, "m": 32.0})
    assert admission_ms(tp.drop(columns="groups")) == {}


def test_stage_times_recovered_from_a_killed_bench_log(tmp_path):
    """`recover-overhead`: the stage times a killed bench printed become its overhead.csv (source named); a "no stage
    times" line gives none; a measured overhead.csv is never replaced; a log without stage times is an error."""
    from dmtp.analysis.report.bench import overhead_from_log

    log = ["[bench] throughput ar T=0 B1 #0: 532.4 tok/s\n",
           "[bench] overhead ar batch 1: verify 1.617, accept 0.014, round 1.642\n",
           "[bench] overhead mtp batch 32: drafter 0.225, verify 1.894, round 2.237\n",
           "[bench] overhead dflash batch 1: no stage times (at most 16 rounds: 12 tokens)\n",
           "[bench] kernel profile -> /x/profile_mini_ar_b32.txt\n"]
    rows = overhead_from_log(log)
    assert {(r["method"], r["batch"], r["stage"]): r["ms_per_round"] for r in rows} == {
        ("ar", 1, "verify"): 1.617, ("ar", 1, "accept"): 0.014, ("ar", 1, "round"): 1.642,
        ("mtp", 32, "drafter"): 0.225, ("mtp", 32, "verify"): 1.894, ("mtp", 32, "round"): 2.237}
    with pytest.raises(ValueError, match="no '\\[bench\\] overhead"):
        overhead_from_log(log[:1])
    write_synthetic(code(), tmp_path, "k", n=4, temps=(0,), methods=["ar", "mtp"], curve=False, oracle=False,
                    realization=2)
    real = tmp_path / "k" / "r2"
    (real / "logs").mkdir(exist_ok=True)
    (real / "logs" / "bench.txt").write_text("".join(log))
    args = ["recover-overhead", "--profile", "k", "--results", str(tmp_path), "--realization", "2"]
    with pytest.raises(SystemExit):  # the synthetic bench wrote a measured overhead.csv
        cli(args)
    measured = (real / "bench" / "overhead.csv").read_text()
    assert (real / "bench" / "overhead.csv").read_text() == measured
    (real / "bench" / "overhead.csv").unlink()
    cli(args)
    got = pd.read_csv(real / "bench" / "overhead.csv")
    assert len(got) == 6 and set(got.source) == {"logs/bench.txt"}


def test_throughput_pools_only_servers_set_up_alike():
    """Throughput repeats of several realizations pool (rows "all") only where their servers were set up alike
    (engine, admission group, prompt pass); otherwise each realization stands and the headline rows are the newest
    realization's."""
    from dmtp.analysis.report.bench import serving, throughput
    from dmtp.analysis.report.tables import headline_throughput

    def rows(k, prefill, ar, main):
        return [{"realization": k, "dataset": "humaneval", "temperature": 0.0, "batch_cap": 1, "repeat": rep,
                 "method": m, "tok_per_s": v + rep, "per_verify": tau, "engine": "compiled", "admit": 8,
                 "prefill": prefill} for rep in range(2) for m, v, tau in (("ar", ar, 1.0), ("dflash", main, 3.0))]

    alike = pd.DataFrame(rows(3, "compiled", 500, 1200) + rows(4, "compiled", 520, 1300))
    differ = pd.DataFrame(rows(3, "compiled", 500, 1200) + rows(4, "graphed", 520, 1600))
    assert serving(alike) == ("compiled", "8", "compiled") and serving(differ) is None
    pooled, apart = throughput(alike), throughput(differ)
    assert set(pooled.realization) == {"r3", "r4", "all"} and set(apart.realization) == {"r3", "r4"}
    assert (pooled[pooled.realization == "all"].n_repeats == 4).all()
    head = headline_throughput(apart)
    assert set(head.realization) == {"r4"} and head.set_index("method").tok_per_s["dflash"] == 1600.5
    assert set(headline_throughput(pooled).realization) == {"all"}


def test_throughput_pools_only_on_one_kind_of_device():
    """tok/s on an H100 and on an H200 are different quantities: realizations whose servers were set up alike but
    whose benches ran on different devices stand apart (no rows "all"), each row naming its device; on one device
    they pool as before. A cost-model row whose stage times come from another device says so."""
    from types import SimpleNamespace

    from dmtp.analysis.report.bench import throughput
    from dmtp.analysis.report.summary import _other_device

    rows = [{"realization": k, "dataset": "humaneval", "temperature": 0.0, "batch_cap": 1, "repeat": rep,
             "method": m, "tok_per_s": v + rep, "per_verify": tau, "engine": "compiled", "admit": 8,
             "prefill": "graphed"} for k in (6, 7) for rep in range(2) for m, v, tau in (("ar", 500, 1.0),
                                                                                         ("dflash", 900, 2.0))]
    tp = pd.DataFrame(rows)
    apart = throughput(tp, devices={"r6": "NVIDIA H200", "r7": "NVIDIA H100 80GB HBM3"})
    assert set(apart.realization) == {"r6", "r7"}
    assert dict(zip(apart.realization, apart.device)) == {"r6": "NVIDIA H200", "r7": "NVIDIA H100 80GB HBM3"}
    pooled = throughput(tp, devices={"r6": "NVIDIA H200", "r7": "NVIDIA H200"})
    assert set(pooled.realization) == {"r6", "r7", "all"} and set(pooled.device) == {"NVIDIA H200"}
    assert set(throughput(tp).realization) == {"r6", "r7", "all"}  # no device recorded anywhere: as before
    groups = tp.assign(requests=[16 if k == 6 else 64 for k in tp.realization])  # B1 over 16 and over 64 prompts
    assert set(throughput(groups).realization) == {"r6", "r7"}
    assert set(throughput(tp.assign(requests=16)).realization) == {"r6", "r7", "all"}
    row = SimpleNamespace(device="NVIDIA H200", round_times_device="NVIDIA H100 80GB HBM3")
    assert _other_device(row) == " (timed on NVIDIA H100 80GB HBM3, throughput on NVIDIA H200)"
    assert _other_device(SimpleNamespace(device="NVIDIA H200", round_times_device="NVIDIA H200")) == ""
    assert _other_device(SimpleNamespace(device=float("nan"), round_times_device="NVIDIA H200")) == ""


def test_servers_timed_beside_the_plain_ones_do_not_split_the_pool():
    """Rows <method>@beside<L> (`bench --beside`: the same server with newcomers prefilled beside the decode) stand as
    rows of their own, with a speed-up over the same repeats' AR; they do not keep the plain servers of realizations
    set up alike from pooling."""
    from dmtp.analysis.report.bench import throughput

    def rows(k, beside):
        out = [{"realization": k, "dataset": "humaneval", "temperature": 0.0, "batch_cap": 32, "repeat": rep,
                "method": m, "tok_per_s": v + rep, "per_verify": tau, "engine": "compiled", "admit": 8,
                "prefill": "graphed", "admit_beside": 0} for rep in range(2)
               for m, v, tau in (("ar", 500, 1.0), ("zero_init_residual", 900, 3.0))]
        return out + ([dict(r, method=r["method"] + "@beside2", tok_per_s=r["tok_per_s"] * 1.1, admit_beside=2)
                       for r in out] if beside else [])

    df = throughput(pd.DataFrame(rows(5, True) + rows(6, False)))
    assert set(df.realization) == {"r5", "r6", "all"}
    b = df[(df.realization == "r5") & (df.method == "zero_init_residual@beside2")].iloc[0]
    assert b.speedup == pytest.approx(1.1 * 900 / 500, rel=0.01) and b.n_repeats == 2


def test_the_summary_says_what_each_server_variant_changed(monkeypatch):
    """A variant row's sentence names its settings in words (`bench --server-variants beside2+flight1`); a variant
    name this version does not know is quoted as it stands."""
    from types import SimpleNamespace

    from dmtp.analysis.report import summary
    from dmtp.analysis.report.bench import throughput

    base = [{"realization": 6, "dataset": "humaneval", "temperature": 0.0, "batch_cap": 1, "repeat": 0, "method": m,
             "tok_per_s": v, "per_verify": tau, "engine": "compiled", "admit": 8, "prefill": "graphed",
             "admit_beside": 0, "in_flight": 2}
            for m, v, tau in (("ar", 600, 1.0), ("zero_init_residual", 1500, 2.9), ("dflash", 1100, 2.1))]
    variants = [dict(base[1], method="zero_init_residual@beside2+flight1", tok_per_s=1560, admit_beside=2, in_flight=1),
                dict(base[0], method="ar@warp9", tok_per_s=610)]
    tab = throughput(pd.DataFrame(base + variants), "zero_init_residual", "dflash")
    monkeypatch.setattr(summary.T, "throughput_table", lambda art: tab.assign(blog_gain_pct=float("nan")))
    art = SimpleNamespace(spec=SimpleNamespace(main_method="zero_init_residual", drafter_baseline="dflash"),
                          overhead=None)
    text = "\n".join(summary.throughput_lines(art))
    assert ("`zero_init_residual@beside2+flight1` (the same server with the next newcomers prefilled beside the decode "
            "(`engine.admit_beside` = 2), 1 round copy in flight before the host waits (`engine.in_flight` = 1), "
            "timed side by side) 1560 tok/s against 1500, 2.60x AR against 2.50x.") in text
    assert "`ar@warp9` (the same server with the settings `warp9`" in text


def test_the_summary_says_what_tau_a_missed_speedup_goal_needs(monkeypatch):
    """The main method's throughput sentence at a cap with a speed-up goal (T = 0, B1: 2.5x, the largest cap: 2x)
    turns the measured speed-up into a cost per verify round (tau / speed-up, in AR steps, admissions and ride-along
    included) and says what tau the goal needs at that cost; at T = 1, or a cap between, there is no goal to say."""
    from types import SimpleNamespace

    from dmtp.analysis.report import summary
    from dmtp.analysis.report.bench import throughput

    rows = [{"realization": 7, "dataset": "humaneval", "temperature": t, "batch_cap": cap, "repeat": 0, "method": m,
             "tok_per_s": v * (cap / 2 if cap > 1 else 1), "per_verify": tau, "engine": "compiled", "admit": 8,
             "prefill": "graphed", "admit_beside": 0, "in_flight": 2}
            for t in (0.0, 1.0) for cap in (1, 8, 32)
            for m, v, tau in (("ar", 600, 1.0), ("zero_init_residual", 1260, 2.72), ("dflash", 1050, 2.05))]
    tab = throughput(pd.DataFrame(rows), "zero_init_residual", "dflash")
    monkeypatch.setattr(summary.T, "throughput_table", lambda art: tab.assign(blog_gain_pct=float("nan")))
    art = SimpleNamespace(spec=SimpleNamespace(main_method="zero_init_residual", drafter_baseline="dflash"),
                          overhead=None)
    lines = summary.throughput_lines(art)
    need = {ln.split(" (")[0]: ln for ln in lines if "would need" in ln}
    assert sorted(need) == ["- T=0, B1", "- T=0, B32"]  # no goal at B8 or at T = 1
    # 2.10x AR at tau 2.72: a verify round costs 1.30 AR steps; 2.5x needs 2.5 x 1.295 = 3.24, 2x needs 2.59
    assert ("Its cost per verify round, end to end, is 1.30 AR steps (tau / speed-up), so the 2.5x goal would need "
            "tau >= 3.24 per verify at that cost (it has 2.72)") in need["- T=0, B1"]
    assert "so the 2x goal would need tau >= 2.59 per verify" in need["- T=0, B32"]


def test_a_server_only_prompt_pass_is_the_same_experiment():
    """engine.prefill "graphed" graphs only a server's newcomers; `generate` (data, evaluation) runs the compiled
    pass under it, so realizations that differ only there are one experiment (and the pipeline's record
    fingerprints agree); "hf" against "compiled" is another experiment."""
    from dmtp.analysis.report.data import experiment_key
    from dmtp.cli.pipeline import fingerprints
    from dmtp.config import EngineConfig
    from dmtp.profiles import get_profile

    exp = {"name": "mini", "engine": {"prefill": "compiled", "admit": 8}, "realization": 3}
    assert experiment_key(exp) == experiment_key(dict(exp, engine={"prefill": "graphed", "admit": 8}, realization=4))
    assert experiment_key(exp) != experiment_key(dict(exp, engine={"prefill": "hf", "admit": 8}))
    assert EngineConfig(prefill="graphed").records_key() == EngineConfig(prefill="compiled").records_key()
    p = get_profile("mini")
    q = dataclasses.replace(p, engine=p.engine.with_(prefill="compiled" if p.engine.prefill == "graphed" else "graphed"))
    assert fingerprints(p)["drafters"] == fingerprints(q)["drafters"]
    # newcomers prefilled beside the decode: a server-only setting, and a realization recorded before it existed
    # (its experiment.json without the key) is the same experiment
    beside = dict(exp, engine={"prefill": "compiled", "admit": 8, "admit_beside": 2}, realization=6)
    assert experiment_key(exp) == experiment_key(beside)
    q = dataclasses.replace(p, engine=p.engine.with_(admit_beside=p.engine.admit_beside + 2))
    assert fingerprints(p) == fingerprints(q)


def test_the_decode_only_gain_ratio_is_the_round_ratios_bound():
    """With no admission cost the tok/s gain is the per-verify gain over the round ratio: equal rounds give ratio 1,
    a dearer round less (r4, B1: a per-verify gain of 1.590 at a round ratio of 1.059 gives 0.85)."""
    from dmtp.analysis.report.bench import decode_only_ratio

    assert decode_only_ratio(1.5, 1.0) == pytest.approx(1.0)
    assert decode_only_ratio(1.590, 1.059) == pytest.approx(0.85, abs=0.005)
    assert decode_only_ratio(1.5, 1.5) == pytest.approx(0.0) and math.isnan(decode_only_ratio(1.0, 1.05))


def test_mini_as_it_stands_is_a_new_series(tmp_path):
    """`mini` as it stands (the unlikelihood step, the pinned pure-Python corpus, prompts answered twice, fixed kernel
    choices) is another experiment than the committed r2-r4 and r5-r7, which the report pools apart, and made at a
    declared records revision, which theirs predate; they differ in those fields alone."""
    import json
    from pathlib import Path

    from dmtp import RECORDS_REVISION
    from dmtp.analysis.report.data import differences, experiment_key
    from dmtp.experiment import write_experiment
    from dmtp.profiles import get_profile

    results = Path(__file__).resolve().parent.parent / "results" / "mini"
    if not (results / "r4" / "experiment.json").exists():
        pytest.skip("no committed r4")
    p = get_profile("mini")
    assert (p.pretrain.unloop_steps, p.pretrain.unloop_alpha, p.pretrain.unloop_negatives) == (300, 1.0, "loop")
    assert p.engine.tuning == "fixed"
    now = json.loads(write_experiment(tmp_path / "experiment.json", dataclasses.replace(p, realization=5)).read_text())
    assert now["records_revision"] == RECORDS_REVISION
    new = ("data.corpus_sources", "data.corpus_digest", "data.prompts", "data.samples", "engine.tuning")
    for k, extra in ((4, ("pretrain.unloop_",)), (7, ())):
        old = json.loads((results / f"r{k}" / "experiment.json").read_text())
        assert "records_revision" not in old
        diff = differences(experiment_key(old), experiment_key(now))
        assert all(d.startswith(new + extra) for d in diff), diff
        assert "data.corpus_sources" in diff and "engine.tuning" in diff


def test_costmodel_check_predicts_one_realization_from_another_realizations_round_times(pooled, tmp_path):
    """experiments/costmodel_check.py: r1's measured speed-ups from r2's round times (the synthetic bench times each
    realization by the same round costs, so the prediction lands within the repeats' noise); a realization without
    throughput runs, or one without stage times, is named, not guessed."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = pooled[0] / "p"
    out = tmp_path / "cm.csv"
    r = subprocess.run([sys.executable, "-m", "experiments.costmodel_check", "--records", str(res / "r1"), "--times",
                        str(res / "r2"), "--out", str(out)], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out)
    assert set(df.round_times_from) == {"r2"} and set(df.records) == {"r1"}
    spec = df[df.method != "ar"]
    assert len(spec) >= 2 and set(df.batch_cap) == {1, 32} and spec.error_pct.abs().max() < 10
    assert (df[df.method == "ar"].predicted_speedup == 1).all() and "largest |error|" in r.stdout
    r = subprocess.run([sys.executable, "-m", "experiments.costmodel_check", "--records", str(res / "r4"), "--times",
                        str(res / "r2")], capture_output=True, text=True, cwd=root)  # r4: no bench
    assert r.returncode != 0 and "throughput.csv is missing" in r.stderr


def test_a_throughput_claim_needs_three_repeats(tmp_path):
    """The blog's B32 claim within one realization is read on at least MIN_REPEATS timing repeats: one repeat (a
    benchmark cut short) leaves it not resolved whatever its sign, and the test column says the rule."""
    from dmtp.analysis.report import claims as C

    write_synthetic(code(), tmp_path, "one", n=6, temps=(0, 1), methods=["ar", "dflash", "zero_init_residual"],
                    curve=False, oracle=False, repeats=1)
    art = load("one", tmp_path, n_boot=100)
    (row,) = C.throughput_rows(art)
    assert row["verdict"] == "within one realization (r0): not resolved (exploratory; 1 repeats)"
    assert row["estimate"] != 0 and "median of 1 timing repeat of one trained pair" in row["test"]
    assert f"at least {C.MIN_REPEATS} repeats" in row["test"] and pd.isna(row["estimate_lo"])


def test_admit_sweep_predicts_each_group_size_on_and_beside_the_decode(tmp_path):
    """experiments/admit_sweep.py on the committed r5 records and r4 round times: an admission's cost fitted to r5's
    profiles (group of 1 at B1, of 8 at B32: fixed + per newcomer, the measured device times recovered), each group
    size predicted with admission on the decode and hidden beside it; fewer groups as they grow, admission hidden never
    slower, AR the unit of every speed-up."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "results" / "mini"
    if not (root / "r5" / "bench" / "admission_profile.csv").exists():
        pytest.skip("no committed r5 benchmark")
    out = tmp_path / "sweep.csv"
    r = subprocess.run([sys.executable, "-m", "experiments.admit_sweep", "--records", str(root / "r5"), "--times",
                        str(root / "r4"), "--cap", "32", "--groups", "1,8", "--lags", "2", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out)
    prof = pd.read_csv(root / "r5" / "bench" / "admission_profile.csv").set_index(["method", "group"]).device_ms
    dec = df[df.admission == "decode"].set_index(["method", "admit"])
    for m in ("ar", "zero_init_residual"):
        fixed, each = dec.loc[(m, 1), "admit_fixed_ms"], dec.loc[(m, 1), "admit_each_ms"]
        assert fixed + each == pytest.approx(prof[(m, 1)]) and fixed + 8 * each == pytest.approx(prof[(m, 8)])
    key = ["method", "admit", "lag"]
    both = df[df.admission == "decode"].merge(df[df.admission == "beside"], on=key, suffixes=("_dec", "_bes"))
    assert (both.tok_per_s_bes >= both.tok_per_s_dec).all()
    assert (df[df.method == "ar"].speedup == 1).all()
    g = df.set_index(["method", "admission", "admit"]).groups
    assert g[("ar", "decode", 1)] > g[("ar", "decode", 8)] > 1  # a group takes every free slot, at least `admit`


def test_draft_limit_estimates_each_runs_tau_with_its_counts_cut(pooled):
    """experiments/draft_limit.py: per run and limit, the realization's pooled histogram (HumanEval, T = 0, natural,
    seed 0) with each round's count cut at n, beside its per-verify tau and the share of rounds past n; bad runs and
    limits are named."""
    import subprocess
    import sys
    from pathlib import Path

    from dmtp.analysis import metrics as M
    from dmtp.analysis.report.data import read_runs

    root = Path(__file__).resolve().parents[1]
    real = pooled[0] / "p" / "r1"
    r = subprocess.run([sys.executable, "-m", "experiments.draft_limit", "--records", str(real), "--limits", "2,4",
                        "--out", str(real.parent / "dl.csv")], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(real.parent / "dl.csv")
    runs = read_runs(real)
    g = runs[(runs.dataset == "humaneval") & (runs.temperature == 0) & (runs["mode"] == "natural") & (runs.seed == 0)]
    assert set(df.run) == set(g[g.k > 1].method) and set(df.limit) == {2, 4}
    for row in df.itertuples():
        h = sum(np.asarray(x) for x in g[g.method == row.run]["hist"])
        assert row.tau == pytest.approx(M.per_verify(h))
        assert row.tau_capped == pytest.approx(M.capped_per_verify(h, row.limit))
        assert row.tau_capped <= row.tau and row.rounds == h.sum()
        assert row.rounds_above_limit_pct == pytest.approx(100 * h[row.limit + 1:].sum() / h.sum())
    for args, words in ((["--runs", "nosuch"], "no humaneval T = 0 natural seed-0 records of nosuch"),
                        (["--limits", "0"], "expected integers >= 1"), (["--limits", "a"], "comma list of integers")):
        r = subprocess.run([sys.executable, "-m", "experiments.draft_limit", "--records", str(real), *args],
                           capture_output=True, text=True, cwd=root)
        assert r.returncode != 0 and words in r.stderr, r.stderr


def test_the_claims_table_is_said_in_words():
    """Below the claims table each family is said in words: each verdict a bullet with its claims, each claim in a few
    words at its temperature with our estimate; a claim of a direction not resolved says whether every realization has
    its sign, the opposite one, or mixed signs; a closeness claim (TOST) reads no sign."""
    from dmtp.analysis.report.claims import _row, claim_label, verdict_lines

    rows = [("primary", "P1: DMTP > DFlash at T = 0: `zero_init_residual` − `dflash`", 0.0, 0.703,
             "+0.842 / +0.585 / +0.683", "one-sided", "interim (3 of 6 realizations): rejects at 0.05 after Holm"),
            ("primary", "P3: DMTP > MTP415 at T = 0: `zero_init_residual` − `mtp`", 0.0, 0.024,
             "-0.126 / +0.007 / +0.190", "one-sided", "interim (3 of 6 realizations): not resolved"),
            ("exploratory", "DFlash > MTP415 on code (open reproduction 27B: 6.424 > 4.698): `dflash` − `mtp`", 0.0,
             -0.68, "-0.968 / -0.578 / -0.492", "t", "contrary (exploratory)"),
            ("exploratory", "fusion > token_only (blog Code ablation +5.12 %): `fusion` − `token_only`", 0.0, 0.112,
             "+0.163 / +0.077 / +0.095", "t", "not resolved (exploratory)"),
            ("exploratory", "Nov 9: 「零初始化残差与直接融合的效果接近」 — the zero-initialised residual (the current "
             "main method) performs close to direct fusion: `zero_init_residual` − `fusion`", 0.0, 0.044,
             "+0.028 / +0.020 / +0.084", "TOST within ±0.058", "not resolved (exploratory)")]
    df = pd.DataFrame(rows, columns=["family", "claim", "temperature", "estimate", "by_realization", "test", "verdict"])
    signs = [[float(x) for x in b.split(" / ")] for b in df.by_realization]
    df = df.assign(kind=["direction"] * 4 + ["closeness"], unit=[""] * 5,
                   n_realizations_claim_sign=[sum(x > 0 for x in v) for v in signs],
                   n_realizations_opposite_sign=[sum(x < 0 for x in v) for v in signs])
    assert claim_label(rows[4][1]) == "the zero-initialised residual performs close to direct fusion"
    text = "\n".join(verdict_lines(df))
    prim, _, expl = text.partition("Exploratory")
    assert "Primary family (pre-registered, Holm over its claims):" in prim
    assert ("- **interim (3 of 6 realizations): rejects at 0.05 after Holm**:\n"
            "  - P1: DMTP > DFlash at T = 0 (+0.703)") in prim
    assert "  - P3: DMTP > MTP415 at T = 0 (+0.024; the realizations differ in sign)" in prim
    assert "- **contrary (exploratory)**:\n  - DFlash > MTP415 on code at T = 0 (-0.680)" in expl
    assert "  - fusion > token_only at T = 0 (+0.112; the claim's sign in every realization)" in expl
    assert "  - the zero-initialised residual performs close to direct fusion at T = 0 (+0.044)" in expl
    assert "holds" not in text and all(len(ln) < 300 for ln in text.splitlines())
    row = _row("exploratory", "c: `a` − `b`", 0.0, {"diff": 0.1, "diff_lo": 0.0, "diff_hi": 0.2,
                                                    "signs": [0.3, -0.1, float("nan")]}, "t", "x", unit="%")
    assert (row["family"], row["kind"], row["unit"], row["n_realizations_claim_sign"],
            row["n_realizations_opposite_sign"]) == ("exploratory", "direction", "%", 1, 1)
