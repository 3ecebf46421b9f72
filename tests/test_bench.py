"""The stage timer sees every stage of a round, once per round, through the one decode loop."""
import pytest
from conftest import make_drafter

from dmtp.cli.bench.common import StageTimer
from dmtp.engine.decode import generate
from dmtp.engine.methods import build_method


def test_stage_timer_covers_every_stage(models):
    tgt, mtp = models
    m = build_method("zero_init_residual", tgt, drafter=make_drafter(tgt, "zero_init_residual"), mtp=mtp)
    m.timer = StageTimer(cuda=False)
    res = generate(tgt, m, [[5, 7, 9], [4, 8, 1, 2]], 0.0, 30, eos_ids=())
    rounds = len(m.timer.rounds)
    assert rounds == max(len(r.accepted) for r in res) and rounds > 4
    ms = m.timer.ms_per_round(skip=2)
    assert {"round", "verify", "drafter", "mtp", "t1_prep", "drafter_ctx"} <= set(ms)
    assert all(v > 0 for v in ms.values())
    assert ms["round"] >= max(ms["verify"], ms["drafter"])  # stages nest inside the round


def test_the_overhead_part_times_given_with_its_mtp_chain(models):
    """`given` through `stage_times` (the overhead part's timing, the cost model's round times): its MTP chain is a
    stage of its own (`mtp_chain`, beside the drafter, the MTP advance and the block's prep), timed once per round,
    and a fixed count of 0 runs no chain; the draft side (`DRAFT_STAGES`) counts it."""
    from dmtp.cli.bench.common import DRAFT_STAGES, stage_times

    tgt, mtp = models
    d = make_drafter(tgt, "given")
    ms, res = stage_times(tgt, build_method("given-p0.3", tgt, drafter=d, mtp=mtp), [[5, 7, 9], [4, 8, 1, 2]], 40,
                          skip=2)
    assert {"round", "verify", "mtp_chain", "t1_prep", "drafter", "mtp", "drafter_ctx"} <= set(ms)
    assert all(v > 0 for v in ms.values()) and "mtp_chain" in DRAFT_STAGES
    assert ms["round"] >= ms["mtp_chain"] + ms["drafter"]  # stages nest inside the round
    assert all(len(r.output_ids) == 40 for r in res)  # EOS ignored: the timed rounds are the whole decode
    none, _ = stage_times(tgt, build_method("given-g0", tgt, drafter=d, mtp=mtp), [[5, 7, 9]], 20, skip=2)
    assert "mtp_chain" not in none and {"t1_prep", "drafter"} <= set(none)


def test_stage_timer_reports_the_median_round():
    """One stalled round moves the mean, not the reported per-round time; a stage run twice in a round counts both."""
    t = StageTimer(cuda=False)
    for i in range(9):
        stall = 1.0 if i == 5 else 0.0
        t.rounds.append({"round": [(0.0, 0.002 + stall)], "verify": [(0.0, 0.001), (0.0, 0.0005)]})
    ms = t.ms_per_round(skip=0)
    assert ms["round"] == pytest.approx(2.0) and ms["verify"] == pytest.approx(1.5)
    assert t.ms_per_round(skip=8)["round"] == pytest.approx(2.0)


def test_ratios_recomputed_from_throughput_csv(tmp_path):
    """`--parts ratios` from throughput.csv's interleaved runs: each method / AR as the median of the per-repeat ratios
    (the main method at T = 0 against its goal: 2.5x at B1, 2x at the largest cap), and DMTP's throughput gain over
    DFlash against its per-verify gain at every cap (the goal at the largest); a rerun replaces the records of the
    same setup and name and keeps every other record."""
    import json

    from dmtp.analysis import ratios as RT
    from dmtp.cli import bench

    out = tmp_path / "bench"
    out.mkdir(parents=True)
    rows = ["method,temperature,batch_cap,repeat,tok_per_s,per_verify"]
    for rep, scale in enumerate((1.0, 0.9, 1.1)):  # the machine drifts by repeat: the ratios do not
        for m, tok, tau in (("ar", 40.0, 1.0), ("dflash", 100.0, 2.0), ("zero_init_residual", 130.0, 2.5)):
            rows += [f"{m},0.0,1,{rep},{tok * scale / 2},{tau}", f"{m},0.0,32,{rep},{tok * scale},{tau}"]
    (out / "throughput.csv").write_text("\n".join(rows) + "\n")
    name = "throughput gain / per-verify gain (zero_init_residual vs dflash)"
    RT.write(out / "ratios.json", [RT.Ratio("smoke", name, -1.0, ">=", 0.95, condition="B32, T=0"),
                                   RT.Ratio("smoke", "other", 1.0)])
    bench.main(["--parts", "ratios", "--profile", "smoke", "--out", str(out)])
    r = {(x.name, x.condition): x for x in RT.read(out / "ratios.json")}
    new = r[(name, "B32, T=0")]
    assert new.value == pytest.approx(1.2) and new.met and new.goal == 0.95
    assert r[(name, "B1, T=0")].goal is None
    assert new.note.startswith("throughput +30.0% (per repeat 1.300") and new.note.endswith("per-verify +25.0%")
    speed = r[("zero_init_residual tok/s / AR tok/s", "B32, T=0")]
    assert speed.value == pytest.approx(3.25) and speed.goal == 2.0 and speed.met
    assert r[("zero_init_residual tok/s / AR tok/s", "B1, T=0")].goal == 2.5
    assert r[("dflash tok/s / AR tok/s", "B1, T=0")].goal is None and ("other", "") in r
    assert any(x["target"] == f"smoke {name} (B32, T=0)" for x in json.loads((out / "ratios.json").read_text()))


def test_batch1_baselines_and_regeneration(models):
    """The side-by-side rows (engine, the loop on the HF layers, HF's static-cache and plain generate) and the
    regeneration row, as typed ratio records, on CPU (the fast-eager engine stands in for the compiled one)."""
    from dmtp.cli.bench.baselines import batch1_baselines, regeneration, regeneration_ratio

    tgt, _ = models
    rows, ratios = batch1_baselines(tgt, [5, 7, 9], 6, 4.3e12, "tiny", engines=("fast-eager", "hf"), repeats=3)
    assert [r["system"] for r in rows] == ["engine-fast-eager", "engine-hf", "hf-static", "hf-loop"]
    assert all(r["tokens"] == 6 and r["identical_to_engine_hf"] for r in rows)
    assert all(r["repeats"] == 3 and r["tok_per_s_min"] <= r["tok_per_s"] <= r["tok_per_s_max"] for r in rows)
    assert all("3 repeats" in r.note for r in ratios if r.name != "AR tok/s / HBM bound")
    assert {(r.setup, r.name, r.condition, r.direction, r.goal) for r in ratios} == {
        ("tiny", "AR tok/s / HBM bound", "batch 1", "report", None),
        ("tiny", "engine AR / HF static-cache compiled generate", "batch 1", ">=", 1.6),
        ("tiny", "engine AR compiled / on the HF layers", "batch 1", "report", None),
        ("tiny", "engine AR / HF AR loop", "batch 1", ">=", 15)}
    row = regeneration(tgt, [[5, 7, 9], [4, 8]] * 4, 0.8, 6, "tiny", engine="hf")
    assert row["output_tokens"] == 48 and row["batch"] == 8 and row["ms_per_step"] > 0
    r = regeneration_ratio(row, "tiny")
    assert (r.target, r.direction, r.goal, r.unit) == ("tiny regeneration tok/s (batch 8)", ">=", 3e5, "tok/s")


def test_spread_and_median_of_repeats():
    from dmtp.cli.bench.common import median, spread

    assert spread([2.0]) == "2.000" and spread([3.0, 1.0, 2.0]) == "2.000 [1.000, 3.000]"
    assert spread([1.0, 4.0]) == "2.500 [1.000, 4.000]" and median([1.0, 4.0, 2.0, 3.0]) == 2.5


def test_overhead_rows_merge_by_setup(tmp_path):
    """overhead.csv keeps the rows of every setup a run does not measure again (trained target, 8b-shape,
    mini-shape); the round goal is 1.10 on the mini shape, 1.04 elsewhere."""
    import pandas as pd

    from dmtp.cli.bench.common import merge_overhead, round_goal

    path = tmp_path / "overhead.csv"
    row = {"stage": "round", "ms_per_round": 1.0, "batch": 8, "rounds": 8, "device": "cpu"}
    merge_overhead(path, [{**row, "method": m} for m in ("dflash", "zero_init_residual")])
    merge_overhead(path, [{**row, "method": "8b-shape:dflash"}])
    merge_overhead(path, [{**row, "method": "mini-shape:dflash", "ms_per_round": 2.0}])
    merge_overhead(path, [{**row, "method": "mini-shape:dflash+dense", "ms_per_round": 3.0}])
    merge_overhead(path, [{**row, "method": "dflash", "ms_per_round": 4.0}])
    got = pd.read_csv(path)
    assert list(got.method) == ["dflash", "8b-shape:dflash", "mini-shape:dflash+dense"]
    assert list(got.ms_per_round) == [4.0, 1.0, 3.0]
    assert (round_goal("mini"), round_goal("8b-shape"), round_goal("smoke")) == (1.10, 1.04, 1.04)


def test_kernel_sweep_times_both_kernels_at_each_context(models):
    """kernels.csv rows: one per (context, kernel), the same tokens decoded; one dense / flex record per context; a
    context longer than the target's positions is refused by name (on CPU the fast-eager engine stands in)."""
    from dmtp.cli.bench.baselines import kernel_sweep

    tgt, _ = models
    rows, ratios = kernel_sweep(tgt, [16, 40], 6, "tiny", engine="fast-eager", low=2)
    assert [(r["context"], r["kernel"]) for r in rows] == [(16, "flex"), (16, "dense"), (40, "flex"), (40, "dense")]
    assert all(r["tokens"] == 6 and r["tok_per_s"] > 0 and r["capacity"] >= r["context"] for r in rows)
    assert [r.name for r in ratios] == ["AR dense / flex attention, context 16", "AR dense / flex attention, context 40"]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        kernel_sweep(tgt, [tgt.config.max_position_embeddings + 1], 6, "tiny", engine="fast-eager", low=2)


def test_round_floor_adds_the_mtp_head_and_lm_head_reads(models):
    """The floor of DMTP round / DFlash round: the MTP head's and the LM head's weight bytes read once per round at the
    given bandwidth, added to DFlash's round; an untied target's LM head counts in full (its own matrix)."""
    from dmtp.cli.bench.common import round_floor, t1_bytes_per_round

    tgt, mtp = models
    head = tgt.model.lm_head.weight
    mtp_bytes = sum(p.numel() * p.element_size() for p in mtp.parameters())
    assert mtp_bytes > 0 and t1_bytes_per_round(tgt, mtp) == mtp_bytes + head.numel() * head.element_size()
    r = round_floor(tgt, mtp, 2.0, 1e9, "tiny", "x round / y round", "batch 8")
    extra_ms = t1_bytes_per_round(tgt, mtp) / 1e9 * 1e3
    assert r.value == pytest.approx(1 + extra_ms / 2.0, abs=1e-4) and r.direction == "report"
    assert r.name == "x round / y round, weight-read floor" and "MTP head + T1 LM head" in r.note


def test_engine_setting_labels():
    """Engine labels name configs derived from the default: "+dense" the dense attention kernel, "+gw" the K/V write
    inside the graphs (else outside them), "+tuned" Inductor's autotuned kernels; `label_of` reads a config back; an
    unknown option is named."""
    from dmtp.cli.bench.common import engine_setting, label_of
    from dmtp.config import EngineConfig

    e = engine_setting("compiled+dense+gw")
    assert (e.engine, e.attention, e.cache_write, e.tuning) == ("compiled", "dense", "graph", "fixed")
    assert engine_setting("compiled").cache_write == "eager" and engine_setting("hf").engine == "hf"
    assert engine_setting("compiled+tuned").tuning == "autotune"
    assert engine_setting("compiled+timed").tuning == "default"
    for label in ("compiled", "compiled+dense", "compiled+dense+gw", "compiled+tuned", "compiled+timed", "hf"):
        assert label_of(engine_setting(label)) == label
    # "auto": the write inside the graph with dense attention; the library's default kernels are the fixed ones
    assert label_of(EngineConfig(attention="dense")) == "compiled+dense+gw"
    assert label_of(EngineConfig(attention="dense", tuning="default")) == "compiled+dense+gw+timed"
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['fast'\]"):
        engine_setting("compiled+fast")


def test_b1_engines_put_the_runs_own_engine_first():
    """Batch 1 times the library's default engine first (fixed kernel choices, flex attention) beside the autotuned
    kernels; a profile's own engine goes first instead, once."""
    from dmtp.cli.bench.common import B1_ENGINES, b1_engines
    from dmtp.config import EngineConfig

    assert b1_engines() == B1_ENGINES and B1_ENGINES[0] == "compiled" and "compiled+tuned" in B1_ENGINES
    own = b1_engines(EngineConfig(attention="dense", tuning="default"))  # the profile's own engine first
    assert own[0] == "compiled+dense+gw+timed" and own.count("compiled+dense+gw+timed") == 1 and own[-1] == "hf"
    assert "compiled+tuned" in own


def test_admission_profile_times_a_graphed_pass_beside_the_compiled_one(models, tmp_path):
    """`admission_profile` on a server with the padded (graphed) prompt pass: host times of both passes side by
    side, after an untimed round of the same admissions, and the two passes' first tokens compared."""
    from dmtp.cli.bench.profiling import admission_profile
    from dmtp.config import EngineConfig
    from dmtp.engine.server import Server

    tgt, mtp = models
    prompts = [[5, 7, 9], [4, 8, 1, 2], [10, 20, 30, 40, 50]]
    srv = Server(tgt, build_method("ar", tgt), 2, 64, max_new_tokens=6,
                 engine=EngineConfig(engine="fast-eager", prefill="graphed", attention="dense"))
    srv.run(prompts)
    res = admission_profile(srv, prompts, tmp_path / "adm.txt", n=3)
    assert res["group"] == 1 and res["host_ms"] > 0 and res["compiled_host_ms"] > 0 and res["first_tokens_equal"] == 3
    assert srv.prompt_pass is not None  # put back after the compiled pass's turn
    head = (tmp_path / "adm.txt").read_text().splitlines()[0]
    assert "group of 1" in head and "graphed prompt pass" in head and "first tokens equal in 3 of 3" in head
    assert "host time, by operator:" in (tmp_path / "adm.txt").read_text()  # the table sorted by host time
    srv.eng = srv.eng.with_(admit=2)  # a server admitting pairs is profiled on pairs
    res = admission_profile(srv, prompts, tmp_path / "adm2.txt", n=2)
    assert res["group"] == 2 and res["first_tokens_equal"] == 4


def test_a_prepared_server_captures_no_prompt_pass_while_serving(models):
    """`Server.prepare` runs the prompt pass of every (group, length) bucket newcomers of the given length can meet;
    serving then meets no new bucket, and decodes as before."""
    from dmtp.config import EngineConfig
    from dmtp.engine.server import Server

    tgt, mtp = models
    prompts = [[5, 7, 9], [4, 8, 1, 2], list(range(3, 80)), [10, 20, 30, 40, 50], [60]]
    eng = EngineConfig(engine="fast-eager", prefill="graphed", attention="dense")
    ref = [r.output_ids for r in Server(tgt, build_method("ar", tgt), 3, 128, max_new_tokens=6, engine=eng).run(prompts)]
    srv = Server(tgt, build_method("ar", tgt), 3, 128, max_new_tokens=6, engine=eng)
    srv.prepare(max(len(p) for p in prompts))
    pp = srv.prompt_pass
    assert pp.met == {(g, t) for g in (1, 2, 3) for t in (64, 128)} == set(pp.buckets(77, 128))
    before = set(pp.met)
    assert [r.output_ids for r in srv.run(prompts)] == ref and pp.met == before
    assert Server(tgt, build_method("ar", tgt), 3, 128, engine=eng.with_(prefill="compiled")).prepare(77) == 0


def test_batch1_rows_name_the_kernels_that_differ_from_the_runs_own():
    """Beside an autotuned first engine every untuned row says so; beside an untuned one (the library's default) the
    tuned row says it is autotuned; the options are named as before."""
    from dmtp.cli.bench.baselines import other_words

    first = "engine-compiled+tuned"
    assert other_words("engine-compiled", first) == ", untuned kernels"
    assert other_words("engine-compiled+dense+gw", first) == (", dense attention, K/V write in the graph, "
                                                               "untuned kernels")
    assert other_words("engine-compiled+tuned", "engine-compiled+dense+gw") == ", autotuned kernels"
    assert other_words("engine-compiled+dense", "engine-compiled") == ", dense attention"


def test_bench_lines_carry_their_time_since_the_start(monkeypatch, tmp_path):
    """bench's stdout stamps each line that starts with "[bench]" (one print: its text and its newline come as two
    writes) with the seconds since the bench began, so a log cut by a time limit shows what took the time; other lines
    pass unchanged, the report's overhead parser still reads the stamped lines, and `main` puts stdout back."""
    import io
    import sys

    from dmtp.analysis.report.bench import overhead_from_log
    from dmtp.cli import bench
    from dmtp.cli.bench.common import Stamped

    clock = iter([100.0, 103.4, 250.6])
    monkeypatch.setattr("dmtp.cli.bench.common.time.perf_counter", lambda: next(clock))
    raw = io.StringIO()
    out = Stamped(raw)  # t0 = 100
    print("[bench] ar B1: 4 prompt-pass graphs captured at start-up", file=out)
    out.write("a warning\n[bench] overhead ar batch 1: verify 1.617, round 1.642\nno [bench] mid-line\n")
    assert raw.getvalue().splitlines() == ["[+3s] [bench] ar B1: 4 prompt-pass graphs captured at start-up",
                                           "a warning", "[+151s] [bench] overhead ar batch 1: verify 1.617, round 1.642",
                                           "no [bench] mid-line"]
    assert out.getvalue() == raw.getvalue()  # everything but write is the wrapped stream's
    rows = overhead_from_log(raw.getvalue().splitlines(keepends=True))
    assert [(r["method"], r["batch"], r["stage"]) for r in rows][:1] == [("ar", 1, "verify")]
    monkeypatch.undo()
    before = sys.stdout
    with pytest.raises(SystemExit):  # an error inside the run (no --target): stdout is put back all the same
        bench.main(["--parts", "throughput", "--profile", "smoke", "--out", str(tmp_path / "b")])
    assert sys.stdout is before


def test_a_speed_up_over_other_text_than_ars_says_so():
    """At T = 0 in bf16 a drafting method's output leaves AR's at top-2 ties and its tok/s is then over other text
    (r21's B1 bench: 911 tokens against AR's 720): the speed-up's note says how many requests equal AR's and the
    tokens against AR's, and with the tau on the prefixes shared with AR's outputs (`per_verify_shared`) a report line
    estimates the speed-up on AR's own text; a method whose every output equals AR's gets neither; the report's
    throughput rows and sentence carry the same."""
    from types import SimpleNamespace

    import pandas as pd

    from dmtp.config.ablation import code
    from dmtp.analysis.report.bench import throughput
    from dmtp.analysis.report.summary import workload_words
    from dmtp.cli.bench.trained import throughput_ratios

    rows = []
    for rep in range(3):
        rows += [dict(method="ar", tok_per_s=500.0, per_verify=1.0, output_tokens=720, equal_ar=16),
                 dict(method="dflash", tok_per_s=1000.0, per_verify=2.0, output_tokens=720, equal_ar=16,
                      per_verify_shared=2.0),
                 dict(method="zero_init_residual", tok_per_s=1250.0 + rep, per_verify=3.2, output_tokens=911,
                      equal_ar=14, per_verify_shared=2.8)]
    tp = pd.DataFrame([{**r, "temperature": 0.0, "batch_cap": 1, "repeat": i // 3, "requests": 16,
                        "dataset": "humaneval"} for i, r in enumerate(rows)])
    got = {x.name: x for x in throughput_ratios(tp, code(), "mini")}
    main = got["zero_init_residual tok/s / AR tok/s"]
    assert main.value == pytest.approx(2.502) and main.goal == 2.5
    assert "outputs: 14 of 16 requests equal to AR's, 911 tokens against AR's 720 (+26.5%)" in main.note
    est = got["zero_init_residual tok/s / AR tok/s on AR's outputs (estimate)"]
    assert est.value == pytest.approx(2.502 * 2.8 / 3.2, rel=1e-3) and "2.80 vs 3.20" in est.note
    assert main.met and est.goal == 2.5 and not est.met  # met over other text only: the estimate on AR's misses
    assert "outputs" not in got["dflash tok/s / AR tok/s"].note
    assert "dflash tok/s / AR tok/s on AR's outputs (estimate)" not in got
    tab = throughput(tp.assign(realization=21), "zero_init_residual", "dflash").set_index("method")
    z = tab.loc["zero_init_residual"]
    assert (z.equal_ar, z.requests) == (14, 16) and z.tokens_vs_ar_pct == pytest.approx(100 * (911 / 720 - 1))
    assert z.speedup_on_ar_outputs == pytest.approx(2.502 * 2.8 / 3.2, rel=1e-3)
    assert workload_words(SimpleNamespace(**tab.loc["dflash"].to_dict())) == ""
    words = workload_words(SimpleNamespace(**z.to_dict()))
    assert words.startswith(" Outputs: 14 of 16 requests equal to AR's, +26.5 % tokens against AR's. On AR's "
                            "outputs ~2.19x (repeats 2.19–2.19)") and words.endswith("shared with them.")
    assert workload_words(SimpleNamespace(speedup=2.0)) == ""  # a table from before the columns


def test_shape_engines_put_the_named_labels_beside_the_profiles_own():
    """`--mini-shape --shape-engines compiled+tuned`: every method's rounds on the autotuned kernels beside the
    profile's own (fixed kernels), derived from the profile's engine (its dtype kept); without labels, the compiled
    defaults and the HF layers as before; without part `engines`, the profile's own alone."""
    from dmtp.cli.bench.common import label_of
    from dmtp.cli.bench.shapes import shape_engines
    from dmtp.config import EngineConfig

    own = EngineConfig(engine="compiled", dtype="bf16")
    got = shape_engines(own, ["compiled", "compiled+tuned", "compiled+timed"], True)
    assert list(got) == ["", "@compiled+tuned", "@compiled+timed"]  # "compiled" is the profile's own: once
    assert got["@compiled+tuned"].tuning == "autotune" and got["@compiled+timed"].tuning == "default"
    assert {e.dtype for e in got.values()} == {"bf16"} and label_of(got[""]) == "compiled"
    assert list(shape_engines(own, None, True)) == ["", "@hf"]
    assert list(shape_engines(own.with_(tuning="autotune"), None, True)) == ["", "@compiled", "@hf"]
    assert list(shape_engines(own, ["compiled+tuned"], False)) == [""]


def test_shape_engines_flag_takes_engine_labels_only(capsys):
    from dmtp.cli.bench import main

    with pytest.raises(SystemExit) as e:
        main(["--mini-shape", "--shape-engines", "compiled+fast", "--out", "/nonexistent/x"])
    assert e.value.code == 2 and "unknown option(s) ['fast']" in capsys.readouterr().err


def test_shape_methods_are_the_ones_mini_shape_times(tmp_path, capsys):
    from dmtp.cli.bench import main

    with pytest.raises(SystemExit) as e:
        main(["--mini-shape", "--shape-methods", "zero_init_residual,fusion", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--shape-methods: fusion: --mini-shape times ar, dflash, zero_init_residual" in err
    assert not (tmp_path / "o").exists()
