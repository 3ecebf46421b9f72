"""Target pretraining and on-policy data regeneration under torchrun (gloo, 2 CPU ranks), and `experiments.dpcheck`:
2 ranks follow 1 rank at the same global batch (and the control runs give the noise floor and its verdict; --replot
recomputes the statistics from curves.csv), a pretraining run stopped on 2 ranks finishes on 1 with the weights
of an uninterrupted run, and regenerated data is the same on 1 and 2 ranks."""
import json
import os
import subprocess
import sys

import pytest
import torch

from dmtp.io import read_jsonl

# 19 pretraining steps of 8 x 64 tokens, a history point per step; greedy data in batches of 4 (4 batches: 2 a rank)
SETS = ["pretrain.tokens=10000", "pretrain.log_every=1", "data.temperature=0", "data.batch=4", "data.new_tokens=16"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Corpus (a few stdlib packages), tokenizer and token files of the smoke profile, built in-process."""
    import email
    import json as json_pkg
    import logging
    from pathlib import Path

    from dmtp.data.corpus import build_corpus
    from dmtp.data.tokenizer import encode_corpus, load_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("dp")
    w = root / "work" / "smoke"
    build_corpus(w / "corpus", max_bytes=300_000, heldout_frac=0.2, progress=False,
                 roots=[str(Path(m.__file__).parent) for m in (email, json_pkg, logging)])
    train_tokenizer(w / "corpus" / "train.jsonl", w / "tokenizer", vocab_size=512, max_bytes=150_000, progress=False)
    tok = load_tokenizer(w / "tokenizer")
    for split in ("train", "heldout"):
        encode_corpus(w / "corpus" / f"{split}.jsonl", tok, w / "tokens" / f"{split}.npy", progress=False)
    return root


def _scratch(root, name, target=None):
    """A work folder sharing the corpus, tokenizer and tokens (and optionally a finished target)."""
    w = root / name / "work" / "smoke"
    w.mkdir(parents=True)
    for d in ("corpus", "tokenizer", "tokens"):
        (w / d).symlink_to(root / "work" / "smoke" / d, target_is_directory=True)
    if target is not None:
        (w / "target").symlink_to(target, target_is_directory=True)
    return root / name


def _pipeline(d, nproc, stage, sets=SETS):
    launch = [sys.executable] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = launch + ["-m", "dmtp.cli.main", "pipeline", "--profile", "smoke", "--work", str(d / "work"), "--results",
                    str(d / "results"), "--stage", stage] + [x for s in sets for x in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def dpcheck(work):
    """dpcheck 1 vs 2 ranks with the control (the 1-rank run repeated) and a split run (2 ranks to step 8, then 1)."""
    out = work / "dpcheck_out"
    cmd = [sys.executable, "-m", "experiments.dpcheck", "--profile", "smoke", "--work", str(work / "work"), "--tokens",
           "10000", "--nproc", "2", "--out", str(out), "--control", "--split", "8"] + \
        [x for s in SETS for x in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0, p.stderr[-3000:]
    return out, work / "work" / "smoke" / "dpcheck"


def test_dpcheck_two_ranks_follow_one(dpcheck):
    """dpcheck end to end; its 2-rank pretraining losses match the 1-rank ones step by step."""
    out, _ = dpcheck
    s = json.loads((out / "summary.json").read_text())
    assert s["nproc"] == 2 and s["backend"] == "gloo" and s["steps"] == 19
    assert set(s["runs"]) == {"1", "2", "1-control", "2to1@8"}
    assert all(r["tokens_per_s"] > 0 and r["wall_s"] > 0 for k, r in s["runs"].items() if k != "2to1@8")
    assert s["loss_difference"]["points"] == 19 and s["loss_difference"]["max_rel"] < 1e-6
    assert [q["steps"] for q in s["loss_difference"]["quarters"]] == [[0, 4], [5, 9], [10, 14], [15, 18]]
    assert s["heldout_loss_difference"] == pytest.approx(0, abs=1e-6 * s["runs"]["1"]["heldout_loss"])
    rows = (out / "curves.csv").read_text().splitlines()
    assert rows[0] == "step,loss,mtp_loss,world" and len(rows) == 1 + 4 * 19
    curve = {}
    for r in rows[1:]:
        curve.setdefault(r.split(",")[3], []).append(float(r.split(",")[1]))
    assert set(curve) == {"1", "2", "1-control", "2to1@8"}  # the worlds written as before, the others labelled
    assert curve["2"] == pytest.approx(curve["1"], rel=1e-6)
    # resumed on another world size: the whole history, equal to the uninterrupted 1-rank run
    assert curve["2to1@8"] == pytest.approx(curve["1"], rel=1e-6)
    sp = s["runs"]["2to1@8"]
    assert (sp["first_world"], sp["switch_step"], sp["then_world"], sp["tokens_per_s"]) == (2, 8, 1, None)
    assert s["split"]["label"] == "2to1@8" and s["split"]["loss_difference"]["max_rel"] < 1e-6
    assert "control" not in sp and "2to1@8" not in s["control_heldout_loss_difference"]
    meta = json.loads((dpcheck[1] / "world2to1@8" / "results" / "smoke" / "target" / "meta.json").read_text())
    assert meta["resumed_at_step"] == 8 and meta["world"] == 1
    assert (out / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_dpcheck_control_noise_floor(dpcheck):
    """On CPU the 1-rank repeat is bit-identical (control difference 0) and 2 ranks are "within noise" (they differ
    from 1 rank by float rounding only, under NOISE_ATOL)."""
    s = json.loads((dpcheck[0] / "summary.json").read_text())
    rep = s["control_loss_difference"]["1-control"]
    assert rep["max_abs"] == 0 and rep["mean_abs"] == 0 and s["control_heldout_loss_difference"]["1-control"] == 0
    assert s["runs"]["1-control"]["control"] == "repeat" and s["runs"]["1-control"]["seed"] == s["seed"] == 0
    n = s["noise"]
    assert s["verdict"] == n["verdict"] == "within noise" and n["reference"] == "1-control"
    assert n["controls"]["1-control"]["ratio_max"] is None  # a zero control: no ratio


def test_noise_verdict_rule():
    """within noise iff max and mean are both <= 1.5 x the reference control's (+ 1e-3); the seed control decides."""
    from experiments.dpcheck import verdict

    d = lambda mx, mn: {"max_abs": mx, "mean_abs": mn}  # noqa: E731
    assert verdict({"2": d(0.05, 0.04)}, 2) is None
    assert verdict({"2": d(0.05, 0.04), "1-control": d(0.04, 0.03)}, 2)["verdict"] == "within noise"
    assert verdict({"2": d(0.07, 0.04), "1-control": d(0.04, 0.03)}, 2)["verdict"] == "outside noise"
    assert verdict({"2": d(0.05, 0.05), "1-control": d(0.04, 0.03)}, 2)["verdict"] == "outside noise"
    v = verdict({"2": d(0.07, 0.05), "1-control": d(0.001, 0.001), "1-control-seed7": d(0.2, 0.1)}, 2)
    assert v["verdict"] == "within noise" and v["reference"] == "1-control-seed7"
    assert v["controls"]["1-control"]["verdict"] == "outside noise"


def test_dpcheck_replot(dpcheck, tmp_path):
    """--replot (no training, no work folder) recomputes the run's difference statistics from its curves.csv."""
    from experiments import dpcheck as dp

    out = dpcheck[0]
    s = json.loads((out / "summary.json").read_text())
    r = dp.main(["--profile", "smoke", "--work", str(tmp_path / "none"), "--replot", str(out / "curves.csv"),
                 "--out", str(tmp_path / "re")]) or json.loads((tmp_path / "re" / "summary_from_curves.json").read_text())
    assert r["source"].startswith("recomputed from curves.csv") and "runs" not in r and "speedup_wall" not in r
    assert r["nproc"] == 2 and r["smooth_window_points"] == s["smooth_window_points"]
    for a, b in [(r["loss_difference"], s["loss_difference"])] + \
            [(r["control_loss_difference"][k], v) for k, v in s["control_loss_difference"].items()]:
        for k in ("points", "max_abs", "mean_abs", "mean_signed"):  # curves.csv keeps 6 decimals
            assert a[k] == pytest.approx(b[k], abs=1e-5), k
        assert [q["steps"] for q in a["quarters"]] == [q["steps"] for q in b["quarters"]]
    assert r["verdict"] == s["verdict"] and set(r["control_loss_difference"]) == set(s["control_loss_difference"])
    assert (tmp_path / "re" / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_refused(work, tmp_path, capsys):
    """Clear errors: dpcheck without a corpus/tokenizer or with too few tokens; non-parallel stages under torchrun."""
    from dmtp.cli import pipeline
    from experiments import dpcheck

    for args, msg in [(["--work", str(tmp_path)], "--stage corpus,tokenizer` first"),
                      (["--work", str(work / "work"), "--tokens", "100"], "less than two steps"),
                      (["--work", str(work / "work"), "--set", "pretrain.tokenz=1"], "no field 'tokenz'")]:
        with pytest.raises(SystemExit):
            dpcheck.main(["--profile", "smoke", "--tokens", "10000", "--out", str(tmp_path / "o"), *args])
        assert msg in capsys.readouterr().err

    os.environ["WORLD_SIZE"] = "2"
    try:
        with pytest.raises(ValueError, match="run corpus,tokenizer in one process"):
            pipeline.main(type("A", (), {"stage": "corpus,tokenizer,target"})())
    finally:
        del os.environ["WORLD_SIZE"]


@pytest.fixture(scope="module")
def split(work):
    """Pretraining stopped after step 8 on 2 ranks, finished on 1 (then the greedy on-policy data, 1 rank)."""
    d = _scratch(work, "split")
    p = _pipeline(d, 2, "target", SETS + ["pretrain.stop_after=8"])
    assert "stopped after step 8/19" in p.stdout
    assert (d / "work" / "smoke" / "target_state" / "pretrain_state.pt").exists()
    assert not (d / "work" / "smoke" / "target").exists()
    from argparse import Namespace

    from dmtp.cli import pipeline

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks (OMP_NUM_THREADS=1): the greedy data must match bit for bit
    try:  # in-process: one process start less
        pipeline.main(Namespace(profile="smoke", work=str(d / "work"), results=str(d / "results"),
                                stage="target,data", set=SETS))
    finally:
        torch.set_num_threads(threads)
    meta = json.loads((d / "results" / "smoke" / "target" / "meta.json").read_text())
    assert meta["resumed_at_step"] == 8 and meta["world"] == 1
    return d


def _weights(path):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_target_resumes_on_another_world_size(dpcheck, split):
    """2 ranks (steps 1-8) then 1 rank (9-19): the losses and final weights of an uninterrupted 1-rank run."""
    ref = dpcheck[1] / "world1"
    a, b = _weights(ref / "work" / "smoke" / "target"), _weights(split / "work" / "smoke" / "target")
    assert a.keys() == b.keys() and any(k.startswith("mtp.") for k in a)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-3, atol=1e-4, msg=k)
    h1 = json.loads((ref / "results" / "smoke" / "target" / "pretrain_history.json").read_text())
    h2 = json.loads((split / "results" / "smoke" / "target" / "pretrain_history.json").read_text())
    assert [h["step"] for h in h2] == [h["step"] for h in h1]
    assert [h["loss"] for h in h2] == pytest.approx([h["loss"] for h in h1], rel=1e-6)


def test_data_two_ranks_identical(work, split):
    """Greedy on-policy data regenerated by 2 ranks (2 batches each) is the 1-rank file, record for record."""
    d = _scratch(work, "data2", target=split / "work" / "smoke" / "target")
    _pipeline(d, 2, "data")
    one = read_jsonl(split / "work" / "smoke" / "data" / "train.jsonl")
    two = read_jsonl(d / "work" / "smoke" / "data" / "train.jsonl")
    assert len(one) == 16 and any(r["output_ids"] for r in one)
    key = lambda r: (r["id"], r["prompt_ids"], r["output_ids"], r["accepted"])  # noqa: E731
    assert [key(r) for r in two] == [key(r) for r in one]
    meta = json.loads((d / "work" / "smoke" / "data" / "train.meta.json").read_text())
    assert meta["world"] == 2 and meta["config"]["batch"] == 4


def _curves(path, curves: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["step,loss,mtp_loss,world"] + [f"{s},{y:.6f},{y:.6f},{w}" for w, ys in curves.items()
                                           for s, y in enumerate(ys)]
    path.write_text("\n".join(rows) + "\n")


def test_pool_of_runs(tmp_path):
    """--pool: pairs grouped by kind, constant offsets measured exactly, the verdict against the same-seed repeats."""
    import numpy as np

    from experiments import dpcheck as dp

    base = list(np.linspace(9, 5, 40) + 0.05 * np.sin(np.arange(40)))
    off = lambda c: [y + c for y in base]  # noqa: E731
    _curves(tmp_path / "a" / "curves.csv", {1: off(0), 2: off(0.05)})
    _curves(tmp_path / "b" / "curves.csv", {1: off(0.04), 2: off(0.01), "1-control-seed1": off(0.3)})
    dp.main(["--profile", "smoke", "--out", str(tmp_path / "o"), "--pool", str(tmp_path / "a" / "curves.csv"),
             str(tmp_path / "b" / "curves.csv")])
    s = json.loads((tmp_path / "o" / "pool.json").read_text())
    assert s["runs"] == {"a:1": "1", "a:2": "2", "b:1": "1", "b:2": "2", "b:1-control-seed1": "seed 1"}
    k = s["kinds"]
    assert list(k) == ["1 vs 1", "2 vs 1", "2 vs 2", "seed 1 vs 1"]
    assert k["1 vs 1"]["n_pairs"] == 1 and k["1 vs 1"]["mean_max_abs"] == pytest.approx(0.04, abs=1e-5)
    # 2 vs 1: |0.05-0|, |0.05-0.04|, |0.01-0|, |0.01-0.04| -> mean 0.025, signed against the 1-process run
    assert k["2 vs 1"]["n_pairs"] == 4 and k["2 vs 1"]["mean_mean_abs"] == pytest.approx(0.025, abs=1e-5)
    assert sorted(round(p["mean_signed"], 4) for p in k["2 vs 1"]["pairs"]) == [-0.03, 0.01, 0.01, 0.05]
    assert all(p["ref"].endswith(":1") for p in k["2 vs 1"]["pairs"])
    assert k["2 vs 1"]["mean_mean_signed"] == pytest.approx(0.01, abs=1e-5)
    assert k["seed 1 vs 1"]["min_max_abs"] == pytest.approx(0.26, abs=1e-5)
    assert s["verdict"] == "within noise" and s["ratio_mean"] == pytest.approx(0.625, abs=1e-3)
    assert (tmp_path / "o" / "pool.png").read_bytes()[:4] == b"\x89PNG"

    _curves(tmp_path / "c" / "curves.csv", {1: off(0), 2: off(0.2)})  # far off the 0.04 floor
    dp.main(["--profile", "smoke", "--out", str(tmp_path / "o2"), "--pool", str(tmp_path / "a" / "curves.csv"),
             str(tmp_path / "b" / "curves.csv"), str(tmp_path / "c" / "curves.csv")])
    assert json.loads((tmp_path / "o2" / "pool.json").read_text())["verdict"] == "outside noise"


def test_pool_refuses_a_thin_or_mixed_pool(tmp_path, capsys):
    from experiments import dpcheck as dp

    _curves(tmp_path / "a" / "curves.csv", {1: [3, 2, 1], 2: [3, 2, 1]})
    _curves(tmp_path / "b" / "curves.csv", {1: [3, 2, 1], 4: [3, 2, 1]})
    _curves(tmp_path / "x" / "a" / "curves.csv", {1: [3, 2, 1], 2: [3, 2, 1]})
    for files, msg in [(["a"], "at least two same-seed 1-process runs"), (["a", "b"], "exactly one N > 1"),
                       (["a", "x/a"], "two runs labelled 'a:1'"), (["nope"], "no such curves.csv")]:
        with pytest.raises(SystemExit):
            dp.main(["--profile", "smoke", "--out", str(tmp_path / "o"), "--pool",
                     *[str(tmp_path / f / "curves.csv") for f in files]])
        assert msg in capsys.readouterr().err
