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
    """`--parts ratios`: throughput gain / per-verify gain at the largest cap both methods have (the profile's main
    method vs its drafter baseline); a rerun replaces the record of the same setup and name measured at another cap
    and keeps every other record."""
    import json

    from dmtp.analysis import ratios as RT
    from dmtp.cli import bench

    out = tmp_path / "bench"
    out.mkdir(parents=True)
    rows = ["method,temperature,batch_cap,dataset,output_tokens,wall_s,tok_per_s,per_verify"]
    for m, tok, tau in (("dflash", 100.0, 2.0), ("zero_init_residual", 130.0, 2.5)):
        rows += [f"{m},0.0,1,humaneval,1,1,{tok / 2},{tau}", f"{m},0.0,32,humaneval,1,1,{tok},{tau}"]
    (out / "throughput.csv").write_text("\n".join(rows) + "\n")
    name = "T=0 throughput gain / per-verify gain (zero_init_residual vs dflash)"
    RT.write(out / "ratios.json", [RT.Ratio("smoke", name, -1.0, ">=", 0.95, condition="B1"),
                                   RT.Ratio("smoke", "other", 1.0)])
    bench.main(["--parts", "ratios", "--profile", "smoke", "--out", str(out)])
    r = {x.name: x for x in RT.read(out / "ratios.json")}
    assert set(r) == {"other", name}
    new = r[name]
    assert new.value == pytest.approx(1.2) and new.met and new.condition == "B32"
    assert new.note == "throughput +30.0%, per-verify +25.0%"
    assert json.loads((out / "ratios.json").read_text())[-1]["target"] == f"smoke {name} (B32)"
