"""The paper-width proof script (`experiments/paper_width.py`) end to end on the CPU at tiny width and depth: both
rows (activation checkpointing off and on) train through FSDP2 at world size 1 with the same losses, the memory
model's prediction beside them, the Gated DeltaNet path and timings recorded, the JSON and the table written."""
import json

import pytest

from experiments import paper_width


def test_paper_width_tiny_end_to_end(tmp_path):
    paper_width.main(["--tiny", "--out", str(tmp_path)])
    rec = json.loads((tmp_path / "paper_width.json").read_text())
    rows = rec["rows"]
    assert [(r["layers"], r["checkpointing"], r["ran"]) for r in rows] == [(8, False, True), (8, True, True)]
    assert rows[0]["losses"] == pytest.approx(rows[1]["losses"], rel=1e-6)  # recomputation changes no number
    for r in rows:
        assert len(r["losses"]) == 2 and r["step_s"] > 0 and r["feature_s"] > 0 and r["checkpoint_s"] >= 0
        assert r["predicted"]["total"] > r["predicted"]["target"] > 0
    assert rows[1]["predicted"]["layers"] < rows[0]["predicted"]["layers"]
    assert rec["kernels"]["gated_delta_rule"] in ("fla", "torch fallback") and rec["gdn_bench_s"]["torch"] > 0
    assert rec["setting"]["True"]["shard_drafters"] and rec["setting"]["True"]["world"] == 1
    assert rec["target_config"]["vocab_size"] == 248320 and rec["commit"] and rec["torch"]
    table = (tmp_path / "paper_width.md").read_text()
    assert "| 8 | off | yes |" in table and "| 8 | on | yes |" in table


def test_paper_width_rows_record_rate_and_profile(tmp_path):
    """The tiny run above also records its training rate and which profile it stands in for; the CPU has no peak
    counter, so the per-step peaks are None there (not zeros)."""
    paper_width.main(["--tiny", "--out", str(tmp_path), "--checkpointing", "off", "--steps", "3"])
    rec = json.loads((tmp_path / "paper_width.json").read_text())
    (row,) = rec["rows"]
    assert rec["profile"] == "qwen3.6-27b" and rec["plan"] is None and rec["settings"]["fsdp"] == "on"
    assert row["tokens_per_s"] == pytest.approx(64 / row["step_s"]) and row["step_peaks"] is None


def test_moe_stand_in_trains_at_tiny_size(tmp_path):
    """The Qwen3.6-35B-A3B stand-in (hybrid Gated DeltaNet + MoE, 256 experts, 8 routed + a shared one) at width 64:
    the drafter trains on its features, and the memory model's prediction counts the experts."""
    from dmtp.memory import target_params

    paper_width.main(["--tiny", "--profile", "qwen3.6-35b-a3b", "--out", str(tmp_path), "--checkpointing", "off"])
    rec = json.loads((tmp_path / "paper_width.json").read_text())
    cfg = rec["target_config"]
    assert cfg["model_type"] == "qwen3_5_moe_text" and cfg["num_experts"] == 256 and cfg["num_experts_per_tok"] == 8
    assert rec["experts_implementation"] and "Experts: transformers'" in (tmp_path / "paper_width.md").read_text()
    (row,) = rec["rows"]
    assert row["ran"] and len(row["losses"]) == 2
    assert all(0 < x < 13 for x in row["losses"])  # about ln V = 12.4 at random weights
    assert row["predicted"]["target"] == target_params(cfg)["total"] * 2
    assert rec["drafter"]["hidden_size"] == 64


def test_stand_in_matches_the_memory_model_parameter_count():
    """The MoE stand-in built by transformers (and its MTP head) has exactly the parameters the memory model counts."""
    import torch

    from dmtp.memory import target_params

    for profile in paper_width.PROFILES:
        cfg = paper_width.stand_in_config(True, profile)
        tgt, mtp = paper_width.build(cfg, 8, torch.device("cpu"), torch.float32, 0)
        n = sum(p.numel() for p in tgt.model.parameters()) + sum(p.numel() for p in mtp.parameters())
        assert n == target_params(cfg)["total"], profile


def test_plan_runs_the_one_card_setting(tmp_path):
    """--plan GB runs what `dmtp dryrun --gpus 1 --gpu-mem GB` plans: its micro-batch, no FSDP on one card, the
    accumulation cut to --accumulation; the prediction is that setting's."""
    from dmtp.memory import plan_training

    paper_width.main(["--tiny", "--plan", "0.5", "--global-batch", "8", "--accumulation", "2", "--out", str(tmp_path),
                      "--checkpointing", "off"])
    rec = json.loads((tmp_path / "paper_width.json").read_text())
    cfg = paper_width.stand_in_config(True)
    d = paper_width.spec(cfg, paper_width.drafter_base(cfg, True), "zero_init_residual")
    want = plan_training(cfg, d, gpus=1, gpu_gb=0.5, seq_len=64, anchors=8, global_batch=8)
    p, st = rec["plan"], rec["settings"]
    assert p["line"] == want.line() and p["accumulation"] == want.accumulation and p["accumulation_run"] == 2
    assert st["micro_batch"] == want.setting.micro_batch and st["batch"] == 2 * want.setting.micro_batch
    assert st["fsdp"] == "off" and not rec["setting"]["False"]["shard_drafters"]
    (row,) = rec["rows"]
    assert row["ran"] and row["predicted"]["drafter_compute"] == d.params * 2  # the unsharded bf16 compute copy
    assert "--gpu-mem 0.5" in (tmp_path / "paper_width.md").read_text()


def test_plan_that_fits_nothing_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        paper_width.main(["--tiny", "--plan", "0.1", "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "--plan 0.1: the memory model fits no setting" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_step_peaks_read_each_step_apart():
    """The schedule `train_drafters` calls once a step: the learning rate of `lr_at`, and the peak of each step on
    its own (read, then reset, at each call; the last read by close)."""
    import torch

    from dmtp.config import TrainConfig
    from dmtp.training.drafters import lr_at

    cfg = TrainConfig(steps=3, batch_size=1, max_len=8, anchors_per_seq=1)
    counter = {"peak": 0, "log": []}
    fake = iter([5, 9, 7])

    def reset():
        counter["log"].append("reset")
        counter["peak"] = 0

    def read():
        counter["log"].append("read")
        return counter["peak"]

    sp = paper_width.StepPeaks(cfg, torch.device("cpu"), read=read, reset=reset)
    for step in range(3):
        assert sp(step) == lr_at(step, cfg)
        counter["peak"] = next(fake)  # the step's work
    assert sp.close() == [5, 9, 7]
    assert counter["log"] == ["reset", "read", "reset", "read", "reset", "read"]
    assert paper_width.StepPeaks(cfg, torch.device("cpu")).close() is None  # no counter on the CPU


def test_peak_report_names_the_allocations_live_at_the_peak():
    """A hand-made allocation trace: the peak is where C joins B (A freed before), 350 bytes above the start; the
    report lists C's site, then B's, with the baseline added; a free of memory made before the trace is counted
    apart."""
    from experiments.memory_peak import peak_report, peak_state

    own = [{"filename": "/src/dmtp/training/drafters.py", "line": 500, "name": "step"}]
    torch_ = [{"filename": "/venv/torch/nn/functional.py", "line": 10, "name": "linear"}]
    exp = [{"filename": "/venv/torch/_tensor.py", "line": 3, "name": "clone"},
           {"filename": "/src/experiments/paper_width.py", "line": 42, "name": "run_row"}]
    trace = [{"action": "alloc", "addr": 1, "size": 100, "frames": own},
             {"action": "alloc", "addr": 2, "size": 150, "frames": torch_},
             {"action": "free_requested", "addr": 1, "size": 100},
             {"action": "free_completed", "addr": 1, "size": 100},
             {"action": "alloc", "addr": 3, "size": 200, "frames": exp},
             {"action": "free_requested", "addr": 99, "size": 1000},  # made before the recording
             {"action": "free_requested", "addr": 3, "size": 200},
             {"action": "alloc", "addr": 4, "size": 120, "frames": own}]
    top, live, n = peak_state(trace)
    assert top == 350 and set(live) == {2, 3} and n["unseen_frees"] == 1 and n["unseen_bytes"] == 1000
    text = peak_report({"device_traces": [trace]}, baseline=10**9)
    lines = text.splitlines()
    assert lines[0].startswith("peak 1.00 GB allocated = 1.00 GB before the recording + 0.00 GB made inside it")
    sites = lines[3:]
    assert "experiments/paper_width.py:42 run_row | torch/_tensor.py:3 clone" in sites[0]
    assert "- | nn/functional.py:10 linear" in sites[1] and len(sites) == 2


def test_paper_rates_tiny_writes_a_rates_file_the_projection_reads(tmp_path):
    """experiments/paper_rates.py at width 64 on the CPU: regeneration, evaluation and training rates of the
    stand-in, each timed after its warm-up (or first step), written as a rates file that `read_rates` accepts; random
    weights accept no draft, so evaluation emits about one token a round (the bonus)."""
    from dmtp.analysis.projection import project_rates, read_rates
    from experiments import paper_rates

    paper_rates.main(["--tiny", "--out", str(tmp_path)])
    rec = read_rates(tmp_path / "rates.json")
    r = rec["rates"]
    assert set(r) == {"regen", "eval", "train"} and rec["layers"] == rec["full_layers"] == 8
    assert r["regen"]["method"] == "ar" and r["regen"]["batch"] == 4 and r["regen"]["tokens"] == 4 * 16
    assert r["regen"]["tok_per_s_per_gpu"] == pytest.approx(64 / r["regen"]["timed_s"])
    assert r["eval"]["method"] == "zero_init_residual" and r["eval"]["tokens_per_round"] < 1.2
    assert r["eval"]["rounds_per_s"] == pytest.approx(r["eval"]["rounds"] / r["eval"]["timed_s"])
    t = r["train"]
    assert t["tok_per_s_per_gpu"] == pytest.approx(t["micro_batch"] * t["accumulation"] * 64 / t["step_s"])
    assert t["fsdp"] == "off" and t["steps"] == 2 and all(0 < x < 13 for x in t["losses"])
    assert project_rates(rec, gpus=8)["hours"]["total_h"] > 0
    assert "| train |" in (tmp_path / "rates.md").read_text()


def test_paper_rates_refuses_an_unknown_stage(tmp_path, capsys):
    from experiments import paper_rates

    with pytest.raises(SystemExit) as e:
        paper_rates.main(["--tiny", "--out", str(tmp_path / "o"), "--stages", "regen,decode"])
    assert e.value.code == 2 and "--stages regen,decode: expected some of regen,eval,train" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
