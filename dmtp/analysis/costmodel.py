"""What a method buys in tokens per second at a shape: end-to-end throughput predicted from a run's acceptance and a
shape's measured stage times (pure functions; no torch).

The server (`server.Server`) steps every live request one round at a time. With `rounds_i` = the verify rounds of
request i (its record's `accepted` list: one count per round) and `t(B)` = the measured round time at B live
requests, a request group of dynamic batching at cap C takes

    T = sum over server steps s of t(B_s)  +  G * t_admit

B_s = requests live at step s (the schedule below fixes it), G = admitted newcomer groups, t_admit = the time an
admission holds the decode (prompt pass + moving the rows into the slots; measured by the throughput bench as
`Server.admit_s` / groups: on CUDA the admissions' device time between events, since admission stopped waiting on
the host; host time with its synchronisations before; 0 in a decode-only projection). Throughput = output tokens /
T, and a speed-up is the ratio of two such predictions on the same requests, AR included (AR: one round per token
after the first). `t(B)` is piecewise linear between the measured batches (flat beyond them): at these shapes a
round is latency-bound, so it barely grows with B.

    t = round_time({1: 1.31, 8: 1.35, 32: 1.52})             # ms per round at 1, 8, 32 live requests
    simulate([40, 12, 33], cap=2, t=t)["tok_per_s"]          # needs tokens= for tok/s
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Sequence


def round_time(points: dict[int, float]) -> Callable[[int], float]:
    """ms per round as a function of the live batch: linear between the measured batches, flat outside them."""
    if not points:
        raise ValueError("round_time: no measured batch")
    xs = sorted(points)
    ys = [points[x] for x in xs]

    def t(b: int) -> float:
        if b <= xs[0]:
            return ys[0]
        if b >= xs[-1]:
            return ys[-1]
        i = bisect_left(xs, b)
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (b - x0) / (x1 - x0)
    return t


def simulate(rounds: Sequence[int], cap: int, t: Callable[[int], float], tokens: Sequence[int] | None = None,
             t_admit_ms: float = 0.0, admit: int = 1, lag: int = 0, t_admit_each_ms: float = 0.0) -> dict:
    """The server's schedule on requests needing `rounds[i]` rounds each, in arrival order: at most `cap` live; a
    newcomer group joins when at least min(`admit`, queue) slots are free or nothing runs (`Server.run`'s rule), and
    costs `t_admit_ms` + `t_admit_each_ms` per newcomer in it; every step costs t(live). A request finishing at
    step s frees its slot for step s + 1 + `lag`: it rides along (its row frozen) until the host sees it finish,
    `engine.in_flight` rounds when the GPU runs ahead of the host (measured on mini at B1: exactly 2 per request). Returns time_s,
    steps, groups, mean live requests per step (riding rows included: they fill the slot) and, with `tokens`,
    tok_per_s."""
    if cap < 1:
        raise ValueError(f"cap={cap}: expected at least 1")
    queue = list(range(len(rounds)))
    left: dict[int, int] = {}  # slot -> rounds left of its request
    free = list(range(min(cap, len(rounds)) if rounds else 0))
    ms, steps, groups, live_sum = 0.0, 0, 0, 0
    while queue or left:
        if queue and free and (len(free) >= min(admit, len(queue)) or not left):
            join = queue[: len(free)]
            queue = queue[len(free):]
            for i in join:
                slot = free.pop(0)
                if rounds[i] + lag > 0:
                    left[slot] = rounds[i] + lag
                else:  # a request that ended at its prefill token, seen at once: no round
                    free.append(slot)
            ms += t_admit_ms + t_admit_each_ms * len(join)
            groups += 1
            continue
        if not left:
            continue
        ms += t(len(left))
        steps += 1
        live_sum += len(left)
        for slot in list(left):
            left[slot] -= 1
            if left[slot] == 0:
                del left[slot]
                free.append(slot)
        free.sort()
    out = {"time_s": ms / 1e3, "steps": steps, "groups": groups, "mean_live": live_sum / steps if steps else 0.0}
    if tokens is not None:
        out["tok_per_s"] = sum(tokens) / out["time_s"] if out["time_s"] > 0 else float("nan")
    return out


def predict(records: dict[str, list[dict]], times: dict[str, dict[int, float]], cap: int, n: int | None = None,
            t_admit_ms: dict[str, float] | None = None, admit: int = 1, lag: int = 0) -> dict[str, dict]:
    """Predicted throughput of every method of `records` (name -> its records: `accepted`, `output_ids`) at `cap` on
    the first `n` requests, from `times` (name -> {batch: ms per round}); with `ar` among them each prediction gets
    `speedup` = its tok/s over AR's. `t_admit_ms`: name -> ms per admitted group (default 0: decode only); `lag`: the
    rounds a finished request rides along (`simulate`)."""
    out = {}
    for name, recs in records.items():
        if name not in times:
            continue
        recs = recs[:n] if n else recs
        rounds = [len(r["accepted"]) for r in recs]
        tokens = [len(r["output_ids"]) for r in recs]
        out[name] = simulate(rounds, cap, round_time(times[name]), tokens,
                             (t_admit_ms or {}).get(name, 0.0), admit, lag)
    if "ar" in out:
        for name, p in out.items():
            p["speedup"] = p["tok_per_s"] / out["ar"]["tok_per_s"]
    return out
