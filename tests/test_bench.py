"""The stage timer sees every stage of a round, once per round, through the one decode loop."""
import pytest
from conftest import make_drafter

from dmtp.cli.bench import StageTimer
from dmtp.engine.decode import build_method, generate


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
    assert ms["round"] >= ms["verify"] + ms["drafter"]  # stages nest inside the round


def test_ratios_recomputed_from_throughput_csv(tmp_path):
    """`--parts ratios`: throughput gain / per-verify gain at the largest cap both methods have; a rerun replaces the
    entry of the same profile and temperature measured at another cap and keeps every other target."""
    import json

    from dmtp.cli import bench

    out = tmp_path / "prof" / "bench"  # the label is the profile folder's name
    out.mkdir(parents=True)
    rows = ["method,temperature,batch_cap,dataset,output_tokens,wall_s,tok_per_s,per_verify"]
    for m, tok, tau in (("dflash", 100.0, 2.0), ("zero_init_residual", 130.0, 2.5)):
        rows += [f"{m},0.0,1,humaneval,1,1,{tok / 2},{tau}", f"{m},0.0,32,humaneval,1,1,{tok},{tau}"]
    (out / "throughput.csv").write_text("\n".join(rows) + "\n")
    (out / "ratios.json").write_text(json.dumps([
        {"target": "prof T=0 B1 throughput gain / per-verify gain (zero_init_residual vs dflash)",
         "value": -1.0, "goal": ">= 0.95", "met": False},
        {"target": "other", "value": 1.0, "goal": "", "met": True}]))
    bench.main(["--parts", "ratios", "--out", str(out)])
    r = {x["target"]: x for x in json.loads((out / "ratios.json").read_text())}
    assert set(r) == {"other", "prof T=0 B32 throughput gain / per-verify gain (zero_init_residual vs dflash)"}
    new = r["prof T=0 B32 throughput gain / per-verify gain (zero_init_residual vs dflash)"]
    assert new["value"] == pytest.approx(1.2) and new["met"] and new["note"] == "throughput +30.0%, per-verify +25.0%"


def test_batch1_baselines_and_regeneration(models):
    """The side-by-side rows (engine, the loop on the HF layers, HF's static-cache and plain generate) and the
    regeneration row, on CPU (the uncompiled flex engine stands in for the compiled one)."""
    from dmtp.cli.bench import batch1_baselines, regeneration, regeneration_ratio

    tgt, _ = models
    rows, ratios = batch1_baselines(tgt, [5, 7, 9], 6, 4.3e12, "tiny", engines=("flex", "hf"))
    assert [r["system"] for r in rows] == ["engine-flex", "engine-hf", "hf-static", "hf-loop"]
    assert all(r["tokens"] == 6 and r["identical_to_engine_hf"] for r in rows)
    assert {r["target"] for r in ratios} == {
        "tiny AR batch-1 tok/s / HBM bound", "tiny engine AR / HF static-cache compiled generate, batch 1",
        "tiny engine AR compiled / on the HF layers, batch 1", "tiny engine AR / HF AR loop, batch 1"}
    row = regeneration(tgt, [[5, 7, 9], [4, 8]] * 4, 0.8, 6, "tiny", engine="hf")
    assert row["output_tokens"] == 48 and row["batch"] == 8 and row["ms_per_step"] > 0
    r = regeneration_ratio(row, "tiny")
    assert r["target"] == "tiny regeneration tok/s, batch 8" and r["goal"] == ">= 300000"
