"""`dmtp reproduce` end to end on the CPU: a tiny random target in the published Qwen3.5/3.6 hybrid layout (mtp.*
keys, a chat template in its tokenizer config), a public-layout DFlash checkpoint to continue from, and tiny local
copies of the six sets in their published formats. Every stage runs and the report's tables are rendered from the
records; a run SIGKILLed during regeneration (then resumed on 2 ranks) and during training (its evaluation then on
2 ranks) resumes to the same files, weights and records as an uninterrupted one. The released vision-language layout
(per-expert MoE) runs every stage in one 2-rank torchrun."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from dmtp.analysis.projection import FullProtocol, project, render
from dmtp.cli.main import main as dmtp
from dmtp.io import file_sha256, read_json, read_jsonl
from experiments import reproduce_standin as S
from dmtp.profiles import get_profile

RUNS = ["mtp", "dflash", "fusion", "zero_init_residual", "dflash2", "dmtp_d2"]
SETS = ["gsm8k", "math500", "humaneval", "alpaca", "mtbench"]

# run `dmtp` with a hook that SIGKILLs the process at a chosen point: after the first regeneration batch is appended
# to its shard, or while the second drafter's first training checkpoint is being written
KILLER = """
import os, signal, sys
mode = sys.argv[1]
if mode == "regen":
    from dmtp.cli import reproduce
    _append = reproduce.append_jsonl
    def append(path, rows):
        _append(path, rows)
        os.kill(os.getpid(), signal.SIGKILL)
    reproduce.append_jsonl = append
elif mode == "train":
    from dmtp.training import drafters
    _save, n = drafters.save_state, [0]
    def save_state(obj, path):  # the second checkpoint write: the first drafter's is in place, the next one's not
        n[0] += 1
        if n[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        _save(obj, path)
    drafters.save_state = save_state
from dmtp.cli.main import main
main(sys.argv[2:])
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    target = S.tiny_target(root / "target", arch="qwen3_5_hybrid")
    S.public_dflash(root / "dflash", target)
    files = S.write_sets(root / "data", n=4, n_train=12)
    return root, target, files


def _cmd(inputs, work, *extra):
    root, target, files = inputs
    return ["reproduce", "--profile", "open-tiny", "--target", str(target), "--work", str(work),
            *S.data_flags(files), "--init-from", str(root / "dflash"), *extra]


def _run(cmd, kill=None, nproc=1):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if nproc > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={port}",
                "-m", "dmtp.cli", *cmd]
    elif kill:
        argv = [sys.executable, "-c", KILLER, kill, *cmd]
    else:
        argv = [sys.executable, "-m", "dmtp.cli", *cmd]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def whole(inputs):
    """One uninterrupted run of every stage, in this process."""
    work = inputs[0] / "whole"
    dmtp(_cmd(inputs, work))
    return work


def test_every_stage_writes_the_report_layout(whole, inputs):
    w = whole
    train = read_jsonl(w / "data" / "train.jsonl")
    assert len(train) == 12 and all(set(r) == {"id", "prompt_ids", "output_ids", "stop_reason"} for r in train)
    tok = S.tokenizer()
    first = tok.decode(train[0]["prompt_ids"])  # the chat template of the tokenizer config, thinking off
    assert first.startswith("<|im_start|>user\n") and first.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not (w / "data" / "shards").exists()  # merged, then removed
    meta = read_json(w / "data" / "train.meta.json")
    assert meta["fingerprint"]["data.temperature"] == 0.0 and meta["env"]["git_sha"] and meta["engine"]
    store = w / "data" / "train.tokens"  # what training read: the merged file as a token store, converted once
    assert read_json(store / "store.json")["source"]["sha256"] == file_sha256(w / "data" / "train.jsonl")
    assert read_json(store / "store.json")["sequences"] == 12
    converted = (store / "store.json").stat().st_mtime_ns
    for run in RUNS[1:]:
        assert (w / "drafters" / run / "DONE").exists()
        hist = read_json(w / "drafters" / run / "history.json", list)
        assert hist[-1]["step"] == 6  # 2 epochs x 12 sequences / global batch 4
    zir = read_json(w / "drafters" / "zero_init_residual" / "fingerprint.json")["fingerprint"]
    assert zir["init_from"] == str((inputs[0] / "dflash").resolve())
    # continued from the public checkpoint: its layer weights are the start, not a fresh draw
    pub = load_file(str(inputs[0] / "dflash" / "model.safetensors"))
    fresh = load_file(str(w / "drafters" / "fusion" / "drafter" / "model.safetensors"))
    ours = load_file(str(w / "drafters" / "zero_init_residual" / "drafter" / "model.safetensors"))
    key = "layers.0.mlp.down_proj.weight"
    assert (ours[key] - pub[key]).abs().max() < (fresh[key] - pub[key]).abs().max()
    # evaluation: every run on every set, in runs/<experiment>/<run>/<set>_T0.jsonl, lossless at T = 0
    for ds in SETS:
        outs = {}
        for run in RUNS:
            f = w / "runs" / "open" / run / f"{ds}_T0.jsonl"
            recs = read_jsonl(f)
            m = read_json(f.with_suffix(".meta.json"))
            assert m["config"]["max_new_tokens"] == 16 and m["engine"] and m["fingerprint"]["run"]["dataset"] == ds
            assert all(r["temperature"] == 0 and r["stop_reason"] in ("eos", "length") for r in recs)
            outs[run] = [r["output_ids"] for r in recs]
        assert all(o == outs["mtp"] for o in outs.values()), ds  # every method emits the target's greedy output
        assert len(outs["mtp"]) == (8 if ds == "mtbench" else 4)  # MT-Bench: two turns each
    turn2 = [r for r in read_jsonl(w / "runs/open/mtp/mtbench_T0.jsonl") if r["turn"] == 2]
    answer = tok.decode([t for t in read_jsonl(w / "runs/open/mtp/mtbench_T0.jsonl")[0]["output_ids"]
                         if t != tok.eos_token_id], skip_special_tokens=True)
    assert answer in tok.decode(turn2[0]["prompt_ids"])  # turn 2 on the model's own first answer
    # the report: tables rendered from these records, the blog's numbers beside
    rep = (w / "REPORT.md").read_text()
    for title in ("Open-reproduction layout", "First-token acceptance", "Acceptance per position", "Per turn"):
        assert title in rep
    # the stand-in's weights are random: stages.json, the report's top and every table say acceptance is not measured
    assert read_json(w / "stages.json")["random_weights"] is True
    assert rep.split("\n\n")[2].startswith("> **Random weights: acceptance is not measured here.**")
    assert "**Random weights: acceptance is not measured here.**" in (w / "tables" / "open_repro.md").read_text()
    o = pd.read_csv(w / "tables" / "open_repro.csv", dtype={"turn": str})
    pooled = o[o.turn == "all"].set_index("dataset")
    assert sorted(pooled.index) == sorted(SETS) and {"mtp", "dflash_lo", "dmtp_d2_hi"} <= set(o.columns)
    assert pooled.loc["gsm8k", "blog_dmtp_d"] == 5.074
    assert sorted(o[o.dataset == "mtbench"].turn) == ["1", "2", "all"]  # MT-Bench per turn beside both pooled
    ft = pd.read_csv(w / "tables" / "first_token.csv")
    assert set(ft.method) == set(RUNS)
    assert ft[(ft.dataset == "gsm8k") & (ft.method == "fusion")].blog_pct.iloc[0] == 93.83
    t = pd.read_csv(w / "tables" / "turns.csv")
    assert sorted(set(t.turn)) == [1, 2] and set(t.method) == set(RUNS)
    for name in ("cumulative", "conditional"):
        assert set(pd.read_csv(w / "tables" / f"{name}.csv").method.dropna()) >= set(RUNS)
    assert (w / "figures" / "open_repro_T0.png").exists()
    st = read_json(w / "stages.json")["stages"]
    assert set(st) == {"regen", "train", "eval", "report"} and all(v["wall_s"] >= 0 for v in st.values())
    assert st["regen"]["tok_per_s_per_gpu"][0] > 0 and st["train"]["steps"] == 6
    assert len(st["eval"]["files"]) == len(RUNS) * len(SETS)
    # a second run finds everything done
    dmtp(_cmd(inputs, whole))
    again = read_json(w / "stages.json")["stages"]
    assert {k: again[k] for k in ("regen", "train", "eval")} == {k: st[k] for k in ("regen", "train", "eval")}
    assert st["train"]["groups"] == [RUNS[1:]]  # on the CPU: every run side by side unless --train-group
    assert (store / "store.json").stat().st_mtime_ns == converted


def test_the_moe_layout_runs_every_stage(tmp_path):
    """The same command on a tiny Qwen3.5-MoE target (the 35B-A3B layout: routed experts and a shared one in its
    fused, transposed storage, mtp.* keys): every stage, every run on every set, lossless at T = 0."""
    target = S.tiny_target(tmp_path / "target", arch="qwen3_5_moe")
    assert read_json(target / "config.json")["model_type"] == "qwen3_5_moe_text"
    S.public_dflash(tmp_path / "dflash", target)
    files = S.write_sets(tmp_path / "data", n=4, n_train=12)
    work = tmp_path / "work"
    dmtp(_cmd((tmp_path, target, files), work))
    for ds in SETS:
        outs = {run: [r["output_ids"] for r in read_jsonl(work / "runs" / "open" / run / f"{ds}_T0.jsonl")]
                for run in RUNS}
        assert all(o == outs["mtp"] for o in outs.values()) and len(outs["mtp"]) == (8 if ds == "mtbench" else 4), ds
    o = pd.read_csv(work / "tables" / "open_repro.csv", dtype={"turn": str})
    assert sorted(o[o.turn == "all"].dataset) == sorted(SETS)


def test_killed_runs_resume_to_the_same_result(whole, inputs):
    work = inputs[0] / "killed"
    p = _run(_cmd(inputs, work, "--stage", "regen"), kill="regen")
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    shard = work / "data" / "shards" / "rank0-of-1.jsonl"
    assert len(read_jsonl(shard)) == 4 and not (work / "data" / "train.jsonl").exists()
    with open(shard, "a") as f:
        f.write('{"id": "opb-4", "output_ids": [1')  # a line cut by a kill mid-write
    p = _run(_cmd(inputs, work, "--stage", "regen"), nproc=2)  # resumed on another number of ranks
    assert p.returncode == 0, p.stderr[-3000:]
    assert (work / "data" / "train.jsonl").read_bytes() == (whole / "data" / "train.jsonl").read_bytes()
    p = _run(_cmd(inputs, work, "--stage", "train"), kill="train")
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert not any((work / "drafters" / r / "DONE").exists() for r in RUNS[1:])
    assert (work / "drafters" / "dflash" / "trainer_state.pt").exists()  # at step 2; the others: not saved yet
    assert not (work / "drafters" / "fusion" / "trainer_state.pt").exists()
    # training resumes at its checkpoint: dflash, fusion and zero_init_residual under torchrun on 2 ranks (FSDP2), in
    # micro-batches of 1 sequence (2 a rank: gradient accumulation), then the two DFlash2 runs in this process as a
    # group of two: the same weights as all five together in one process (the micro-batch is run control: the
    # fingerprints do not change). DFlash2's selector term is normalised by its own rows' weight mass, so a rank or a
    # micro-batch of it is not the whole batch's exactly: those resume in one process, whole batches.
    exact = "ablation.only=dflash,fusion,zero_init_residual"
    p = _run(_cmd(inputs, work, "--stage", "train", "--set", exact, "--set", "train.micro_batch=1"), nproc=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2 rank(s)" in (work / "drafters" / "dflash" / "DONE").read_text()
    assert not (work / "drafters" / "dflash2" / "DONE").exists()
    dmtp(_cmd(inputs, work, "--train-group", "2", "--stage", "train"))
    assert read_json(work / "stages.json")["stages"]["train"]["groups"] == [["dflash2", "dmtp_d2"]]
    p = _run(_cmd(inputs, work, "--stage", "eval"), nproc=2)
    assert p.returncode == 0, p.stderr[-3000:]
    dmtp(_cmd(inputs, work, "--stage", "report"))
    assert (work / "REPORT.md").exists()
    for run in RUNS[1:]:
        a = load_file(str(whole / "drafters" / run / "drafter" / "model.safetensors"))
        b = load_file(str(work / "drafters" / run / "drafter" / "model.safetensors"))
        for k in a:  # (tests/test_fsdp.py: 2 ranks sum their rows in another order; atol 1e-5 at lr 6e-4)
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=f"{run} {k}")
    for run in RUNS:
        for ds in SETS:
            ra = read_jsonl(whole / "runs" / "open" / run / f"{ds}_T0.jsonl")
            rb = read_jsonl(work / "runs" / "open" / run / f"{ds}_T0.jsonl")
            assert [(r["id"], r["output_ids"], r["accepted"]) for r in rb] == \
                [(r["id"], r["output_ids"], r["accepted"]) for r in ra], (run, ds)
    shutil.rmtree(work)


def test_a_missing_set_is_named_in_one_line(inputs, tmp_path, capsys, monkeypatch):
    import datasets

    monkeypatch.delenv("DMTP_DATA_MTBENCH", raising=False)
    monkeypatch.delenv("DMTP_DATA_DOWNLOAD", raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty_cache")
    root, target, files = inputs
    flags = S.data_flags({k: v for k, v in files.items() if k != "mtbench"})
    with pytest.raises(SystemExit) as e:
        dmtp(["reproduce", "--profile", "open-tiny", "--target", str(target), "--work", str(tmp_path / "w"),
              *flags, "--stage", "eval"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert "evaluation set mtbench is missing: give a local copy with --data-path mtbench=PATH" in err
    with pytest.raises(SystemExit) as e:
        dmtp(["reproduce", "--profile", "open-tiny", "--target", str(target), "--work", str(tmp_path / "w"),
              "--stage", "regen"])
    assert e.value.code == 2 and "--data-path openperfectblend=PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        dmtp(["reproduce", "--profile", "qwen3.6-27b", "--target", str(target), *flags])
    assert e.value.code == 2 and "is made for a target of" in capsys.readouterr().err


def test_a_drafter_of_another_target_is_refused_before_any_work(inputs, tmp_path, capsys):
    """--init-from a public DFlash drafter made for another model (another width): one line naming both widths
    before regeneration, not a shape error once training starts."""
    root, target, files = inputs
    wide = S.public_dflash(tmp_path / "wide", target)
    cfg = read_json(wide / "config.json")
    (wide / "config.json").write_text(json.dumps(dict(cfg, hidden_size=2048)))
    work = tmp_path / "w"
    with pytest.raises(SystemExit) as e:
        dmtp(["reproduce", "--profile", "open-tiny", "--target", str(target), "--work", str(work),
              *S.data_flags(files), "--init-from", f"fusion={wide}"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and not (work / "data").exists()
    assert f"--init-from fusion={wide}: a drafter for a target of {{'hidden_size': 2048, 'vocab_size': 260}}, " \
        "--target has {'hidden_size': 64, 'vocab_size': 260}" in err
    (wide / "config.json").write_text(json.dumps(dict(cfg, dflash_config=dict(cfg["dflash_config"],
                                                                              target_layer_ids=[1, 20]))))
    with pytest.raises(SystemExit) as e:
        dmtp(["reproduce", "--profile", "open-tiny", "--target", str(target), "--work", str(work),
              *S.data_flags(files), "--init-from", str(wide)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and not (work / "data").exists()
    assert err.endswith(f"--init-from {wide}: a drafter for a deeper target (it reads layers [1, 20]), --target has "
                        "4 layers"), err


def test_paper_profiles_evaluate_with_the_blogs_protocol():
    for name in ("qwen3.6-27b", "qwen3.6-35b-a3b"):
        ev = get_profile(name).eval
        assert ev.sets == {s: 80 for s in SETS} and ev.new_tokens == 1024 and ev.batch == 32
        assert ev.temperatures == (0.0,) and ev.stops == () and ev.modes == ("natural",) and ev.mtp_steps == 4
        assert get_profile(name).ablation.runs() == tuple(RUNS)
    a = get_profile("qwen3.6-27b").ablation
    assert a.runs() == tuple(RUNS) and a.blog_run == "fusion" and a.backbones["dmtp_d2"] == ("zero_init_residual",
                                                                                            "dflash2")


def test_projection_from_measured_rates():
    """Hand-made rates: regen 1,000 tok/s per GPU, training 2 drafters x 1,000 tokens in 10 s on 1 GPU, evaluation
    600 tokens in 3 s."""
    stages = {"stages": {
        "regen": {"tok_per_s_per_gpu": [1000.0, 1000.0], "world": 2},
        "train": {"runs": ["a", "b"], "train_tokens": 1000, "wall_s": 10.0, "world": 1},
        "eval": {"files": [{"output_tokens": 400, "wall_s": 2.0}, {"output_tokens": 200, "wall_s": 1.0}],
                 "world": 1}}}
    full = FullProtocol(train_prompts=3600, regen_tokens_per_prompt=1000, epochs=1, train_tokens_per_sequence=100,
                        drafter_runs=2, eval_requests=36, eval_tokens_per_request=100, eval_methods=1)
    p = project(stages, full, gpus=2)
    assert p["rates"]["train_token_runs_per_s"] == 200.0 and p["rates"]["eval_tok_per_s"] == 200.0
    h = p["hours"]
    assert h["regen_h"] == pytest.approx(3600 * 1000 / 2000 / 3600)  # 0.5 h
    assert h["train_h"] == pytest.approx(3600 * 100 * 2 / 400 / 3600)  # 0.5 h
    assert h["eval_h"] == pytest.approx(3600 / 400 / 3600)  # 36 x 100 tokens at 200 tok/s x 2 GPUs
    assert h["total_h"] == pytest.approx(h["regen_h"] + h["train_h"] + h["eval_h"])
    assert render(p).startswith("PROJECTION (not a measurement)")


def rates_file(tmp_path, layers=64, **over):
    """A synthetic rates file (hand-made numbers, not a measurement) in experiments/paper_rates.py's format."""
    rec = {"format": "dmtp-rates/1", "profile": "qwen3.6-27b", "weights": "random", "layers": layers,
           "full_layers": 64, "machine": {"device": "Synthetic GPU", "card_gib": 139.8, "gpus": 1},
           "rates": {"regen": {"tok_per_s_per_gpu": 1000.0, "prompt_tokens": 512, "new_tokens": 256},
                     "train": {"tok_per_s_per_gpu": 4000.0},
                     "eval": {"tok_per_s_per_gpu": 320.0, "rounds_per_s": 10.0, "batch": 32, "prompt_tokens": 512,
                              "new_tokens": 128}}}
    rec.update(over)
    f = tmp_path / f"rates{layers}.json"
    f.write_text(json.dumps(rec))
    return f


def test_projection_from_a_rates_file(tmp_path):
    """Hours from per-GPU rates at full depth: regen tokens / (rate x GPUs); training, every drafter run alone;
    evaluation, per run its tokens / (rounds/s x batch x its acceptance length), over at most one GPU a file."""
    from dmtp.analysis.projection import project_rates, read_rates, render_rates

    full = FullProtocol(train_prompts=3600, regen_tokens_per_prompt=1000, epochs=2, train_tokens_per_sequence=100,
                        drafter_runs=3, eval_requests=36, eval_tokens_per_request=100, eval_methods=2)
    tau = {"mtp": 4.0, "zero_init_residual": 5.0}
    p = project_rates(read_rates(rates_file(tmp_path)), full, gpus=2, tau=tau)
    h = p["hours"]
    assert h["regen_h"] == pytest.approx(3600 * 1000 / (1000 * 2) / 3600)
    assert h["train_h"] == pytest.approx(2 * 3600 * 100 * 3 / (4000 * 2) / 3600)
    assert h["eval_h"] == pytest.approx((3600 / (320 * 4) + 3600 / (320 * 5)) / 2 / 3600)  # 320 request-rounds/s
    assert h["total_h"] == pytest.approx(h["regen_h"] + h["train_h"] + h["eval_h"])
    text = render_rates(p, source="r.json")
    assert text.startswith("PROJECTION (not a measurement) of the full open reproduction on 2 GPU(s) like the one "
                           "measured (Synthetic GPU, 140 GiB; r.json; random-weight stand-in, 64 layers)")
    assert "mtp 4.00, zero_init_residual 5.00" in text and "measured at 512 prompt + 256 new tokens" in text


def test_projection_scales_a_cut_depth_and_takes_the_blogs_acceptance(tmp_path):
    """Rates measured on 44 of 64 layers are scaled by 44/64 (labelled); the acceptance lengths default to the blog's
    open-reproduction table, mean of its five sets, zero_init_residual taking fusion's."""
    from dmtp.analysis.projection import blog_acceptance, project_rates, read_rates, render_rates

    tau = blog_acceptance()
    assert tau["mtp"] == pytest.approx((4.373 + 4.698 + 4.377 + 3.529 + 3.599) / 5)
    assert tau["zero_init_residual"] == tau["fusion"] == pytest.approx((5.074 + 6.795 + 4.968 + 3.358 + 3.76) / 5)
    assert set(tau) == {"mtp", "dflash", "fusion", "zero_init_residual", "dflash2", "dmtp_d2"}
    cut, whole = (project_rates(read_rates(rates_file(tmp_path, n)), gpus=8) for n in (44, 64))
    for k in ("regen_h", "train_h", "eval_h"):
        assert cut["hours"][k] == pytest.approx(whole["hours"][k] * 64 / 44)
    assert "44 of 64 layers, rates scaled by 0.688" in render_rates(cut)


@pytest.mark.parametrize("edit, field", [
    ({"format": "other"}, "format"), ({"layers": 70}, "layers"), ({"machine": {"card_gib": 80}}, "machine.device"),
    ({"rates": {"regen": {"tok_per_s_per_gpu": -1.0}}}, "rates.regen.tok_per_s_per_gpu"),
    ({"rates": {"eval": {"tok_per_s_per_gpu": 1.0, "batch": 32}}}, "rates.eval.rounds_per_s"),
    ({"rates": {"decode": {"tok_per_s_per_gpu": 1.0}}}, "rates")])
def test_a_bad_rates_file_is_named_with_its_field(tmp_path, edit, field):
    from dmtp.analysis.projection import read_rates

    f = rates_file(tmp_path, **edit)
    with pytest.raises(ValueError, match=rf"^{f}: {field}: expected"):
        read_rates(f)
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(ValueError, match=r"x.json: not JSON"):
        read_rates(tmp_path / "x.json")


def test_training_prompts_from_a_local_file(tmp_path):
    """--prompts: JSONL with `prompt` text (chat template applied) or `prompt_ids` (as given), parquet with
    `messages`; a row with none of them is named."""
    from dmtp.cli.reproduce import read_prompt_file

    tok = S.tokenizer()
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "a", "prompt": "Hi there"}) + "\n" + json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    rows = read_prompt_file(f, tok)
    assert [r["id"] for r in rows] == ["a", "1"] and rows[1]["prompt_ids"] == [5, 6, 7]
    assert tok.decode(rows[0]["prompt_ids"]) == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n" \
        "<think>\n\n</think>\n\n"
    pq = tmp_path / "p.parquet"
    pd.DataFrame({"messages": [[{"role": "system", "content": "x"}, {"role": "user", "content": "Q?"}]]}).to_parquet(pq)
    assert tok.decode(read_prompt_file(pq, tok)[0]["prompt_ids"]).startswith("<|im_start|>user\nQ?")
    f.write_text(json.dumps({"text": "no prompt field"}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl: row 1: expected `conversations`, `messages`, `prompt`"):
        read_prompt_file(f, tok)


def test_projection_prefers_the_steady_regeneration_rate():
    """A rank's first batch compiles and tunes its graphs: where ranks decoded more than one batch, the projection
    takes the rate past the first (steady_tok_per_s_per_gpu); with one batch a rank it takes the whole rate and says
    that it includes compiling."""
    full = FullProtocol(train_prompts=3600, regen_tokens_per_prompt=1000)
    one = {"stages": {"regen": {"tok_per_s_per_gpu": [250.0], "steady_tok_per_s_per_gpu": [None], "world": 1}}}
    two = {"stages": {"regen": {"tok_per_s_per_gpu": [250.0], "steady_tok_per_s_per_gpu": [1000.0], "world": 1}}}
    p1, p2 = project(one, full, gpus=1), project(two, full, gpus=1)
    assert p1["rates"]["regen_tok_per_s_per_gpu"] == 250.0 and not p1["rates"]["regen_steady"]
    assert p2["rates"]["regen_tok_per_s_per_gpu"] == 1000.0 and p2["rates"]["regen_steady"]
    assert p2["hours"]["regen_h"] == pytest.approx(3600 * 1000 / 1000 / 3600)
    assert "includes compiling" in render(p1).splitlines()[1] and "includes compiling" not in render(p2)


def test_the_vl_layout_runs_every_stage_on_two_ranks(tmp_path):
    """Qwen3.6's published layout (`Qwen3_5MoeForConditionalGeneration`: nested text_config, a vision tower,
    `model.language_model.*` keys, one tensor per expert, `mtp.*` beside) through the multi-GPU command on a fresh
    work folder: every stage in one torchrun of 2 ranks (the other ranks wait for rank 0's merged files between
    stages), lossless at T = 0, and the greedy output of the same weights saved in the text layout."""
    target = S.tiny_target(tmp_path / "target", arch="qwen3_5_moe", layout="vl", experts="per_expert")
    assert read_json(target / "config.json")["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    S.public_dflash(tmp_path / "dflash", target)
    files = S.write_sets(tmp_path / "data", n=4, n_train=12)
    work = tmp_path / "work"
    p = _run(_cmd((tmp_path, target, files), work, "--set", "ablation.only=mtp,zero_init_residual"), nproc=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert set(read_json(work / "stages.json")["stages"]) == {"regen", "train", "eval", "report"}
    recs = {run: {ds: read_jsonl(work / "runs" / "open" / run / f"{ds}_T0.jsonl") for ds in SETS}
            for run in ("mtp", "zero_init_residual")}
    for ds in SETS:
        assert [r["output_ids"] for r in recs["zero_init_residual"][ds]] == [r["output_ids"] for r in recs["mtp"][ds]]
    twin = S.tiny_target(tmp_path / "twin", arch="qwen3_5_moe")  # the same weights, text layout, fused experts
    out = tmp_path / "ar.jsonl"
    dmtp(["generate", "--target", str(twin), "--method", "ar", "--dataset", "gsm8k", "--data-path",
          str(files["gsm8k"]), "--max-new-tokens", "16", "--batch-size", "4", "--out", str(out)])
    ar = read_jsonl(out)
    want = [(r["id"], r["prompt_tokens"], r["output_ids"]) for r in recs["mtp"]["gsm8k"]]
    assert [(r["id"], len(r["prompt_ids"]), r["output_ids"]) for r in ar] == want
