"""The throughput cost model (dmtp.analysis.costmodel) on hand-made schedules."""
import pytest

from dmtp.analysis.costmodel import predict, round_time, simulate


def test_round_time_interpolates_between_measured_batches():
    t = round_time({1: 1.0, 8: 1.7, 32: 2.9})
    assert t(1) == 1.0 and t(8) == pytest.approx(1.7) and t(20) == pytest.approx(2.3) and t(64) == 2.9 and t(0) == 1.0
    with pytest.raises(ValueError):
        round_time({})


def test_schedule_by_hand():
    """cap 2, requests of 3, 1, 2 rounds, 1 ms per round whatever the batch: step 1 runs requests 0 and 1; request 1
    ends, request 2 joins; steps 2-3 run 0 and 2, both end at step 3 -> 3 steps, 2 admitted groups."""
    out = simulate([3, 1, 2], cap=2, t=lambda b: 1.0, tokens=[4, 2, 3], t_admit_ms=0.5)
    assert out["steps"] == 3 and out["groups"] == 2
    assert out["time_s"] == pytest.approx((3 * 1.0 + 2 * 0.5) / 1e3)
    assert out["tok_per_s"] == pytest.approx(9 / out["time_s"])
    assert out["mean_live"] == pytest.approx(2.0)


def test_admission_in_groups_waits_for_free_slots():
    """admit=2: the second newcomer waits until two slots are free (or the queue's rest fits)."""
    one = simulate([1, 4, 1, 1], cap=2, t=lambda b: 1.0, admit=1)
    two = simulate([1, 4, 1, 1], cap=2, t=lambda b: 1.0, admit=2)
    assert one["groups"] == 3 and two["groups"] == 2 and two["steps"] >= one["steps"]


def test_batch_one_is_the_sum_of_rounds():
    """At cap 1 requests run one after another: time = sum of their rounds' times; a request that ended at its
    prefill token costs its admission only."""
    out = simulate([5, 0, 2], cap=1, t=lambda b: 2.0, tokens=[6, 1, 3], t_admit_ms=1.0)
    assert out["steps"] == 7 and out["groups"] == 3 and out["time_s"] == pytest.approx((7 * 2.0 + 3 * 1.0) / 1e3)


def test_speedup_over_ar():
    """A method emitting 4 tokens per round at 1.5x AR's step time: 4 / 1.5 = 2.67x AR at batch 1."""
    ar = [{"accepted": [0] * 40, "output_ids": [1] * 41}]
    m = [{"accepted": [3] * 10, "output_ids": [1] * 41}]
    p = predict({"ar": ar, "m": m}, {"ar": {1: 1.0}, "m": {1: 1.5}}, cap=1)
    assert p["m"]["speedup"] == pytest.approx(40 / 15) and p["ar"]["speedup"] == 1.0


def test_a_finished_request_rides_along_until_the_host_sees_it():
    """lag = 2 (the server's in_flight, GPU ahead of the host): at cap 1 each request holds its slot 2 more steps,
    an end-of-text at the first token included; at cap 2 a late-freed slot delays its newcomer."""
    out = simulate([5, 0, 2], cap=1, t=lambda b: 2.0, tokens=[6, 1, 3], t_admit_ms=1.0, lag=2)
    assert out["steps"] == 7 + 3 * 2 and out["time_s"] == pytest.approx(((7 + 6) * 2.0 + 3 * 1.0) / 1e3)
    assert simulate([3, 1, 2], cap=2, t=lambda b: 1.0, lag=1)["steps"] == 5  # lag 0: 3 steps (test_schedule_by_hand)
    ar = [{"accepted": [0] * 40, "output_ids": [1] * 41}]
    m = [{"accepted": [3] * 10, "output_ids": [1] * 41}]
    p = predict({"ar": ar, "m": m}, {"ar": {1: 1.0}, "m": {1: 1.5}}, cap=1, lag=2)
    assert p["m"]["speedup"] == pytest.approx((40 + 2) / (1.5 * (10 + 2)))  # riding costs the method more


def test_a_group_pays_a_fixed_cost_and_a_cost_per_newcomer():
    """t_admit_each_ms: an admission costs t_admit_ms + t_admit_each_ms per newcomer of its group (a prompt pass
    grows with the group). cap 2, requests of 3, 1, 2 rounds (test_schedule_by_hand): groups of 2 then 1."""
    out = simulate([3, 1, 2], cap=2, t=lambda b: 1.0, t_admit_ms=0.5, t_admit_each_ms=0.25)
    assert out["groups"] == 2 and out["time_s"] == pytest.approx((3 * 1.0 + 2 * 0.5 + 3 * 0.25) / 1e3)


def test_prompt_passes_beside_the_decode_are_charged_in_full_and_a_variant_is_read_against_its_own_ar():
    """bench.predicted_vs_measured at cap 1: each request costs (rounds + in_flight) round times plus its group's
    admission, where admission = admit_s / groups + beside_s / groups (the prompt passes run beside the decode,
    charged at their full device time); predicted_speedup_hidden leaves the beside time out. A server variant's rows
    ("<m>@<v>") are predicted and measured against "ar@<v>", not against the plain AR."""
    import pandas as pd
    import pytest

    from dmtp.analysis.report.bench import predicted_vs_measured

    recs = {"ar": [10, 20], "m": [4, 6]}  # rounds per request; output tokens 10 + 20 for both
    runs = pd.DataFrame([{"method": k, "accepted": [1] * r, "output_tokens": t}
                         for k, rr in recs.items() for r, t in zip(rr, (10, 20))])
    ov = pd.DataFrame([{"method": k, "stage": "round", "ms_per_round": ms, "batch": 1}
                       for k, ms in (("ar", 1.0), ("m", 2.0))])
    tp = pd.DataFrame([{"method": k, "temperature": 0, "batch_cap": 1, "repeat": 0, "dataset": "humaneval",
                        "requests": 2, "groups": 2, "admit_s": a, "beside_s": b, "tok_per_s": tps, "admit": 1,
                        "in_flight": f, "per_verify": 1.0, "wall_s": 30 / tps}
                       for k, a, b, tps, f in (("ar", 0.002, 0.004, 100.0, 2), ("m", 0.002, 0.006, 150.0, 2),
                                               ("ar@v", 0.0, 0.0, 50.0, 1), ("m@v", 0.0, 0.0, 150.0, 1))])
    rows = {r["method"]: r for r in predicted_vs_measured(runs, tp, ov)}
    assert set(rows) == {"ar", "m", "ar@v", "m@v"}
    # plain: lag 2; AR 34 rounds x 1 ms + 2 x (1 + 2) ms; m 14 rounds x 2 ms + 2 x (1 + 3) ms
    ar_t, m_t = 34 + 2 * 3, 28 + 2 * 4
    assert rows["m"]["predicted_speedup"] == pytest.approx(ar_t / m_t)
    assert rows["m"]["predicted_speedup_hidden"] == pytest.approx((34 + 2) / (28 + 2))
    assert rows["m"]["beside_ms"] == pytest.approx(3.0) and rows["m"]["admit_ms"] == pytest.approx(1.0)
    assert rows["m"]["error_pct"] == pytest.approx(100 * (ar_t / m_t / 1.5 - 1))
    # the variant: lag 1, no admission cost; measured against ar@v (150 / 50 = 3), not against the plain AR (1.5)
    assert rows["m@v"]["measured_speedup"] == pytest.approx(3.0)
    assert rows["m@v"]["predicted_speedup"] == pytest.approx(32 / (12 * 2.0))
