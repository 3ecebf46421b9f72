"""The stage timer sees every stage of a round, once per round, through the one decode loop."""
from conftest import make_drafter
from dmtp.bench import StageTimer
from dmtp.decode import build_method, generate


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
