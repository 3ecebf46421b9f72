"""Acceptance metrics as pure functions over raw counts (docs/METHOD.md, "Metrics"). No torch; numpy only.

A verify round accepts L in 0..K draft candidates (K = 7 for DFlash/DMTP, 4 for MTP415, 0 for AR) and always
commits one more token of the target's own (correction, or bonus when L = K). Everything derives from
    hist[j] = number of verify rounds with exactly j accepted candidates, j = 0..K
    per_verify  tau = 1 + sum_j j*hist[j] / sum_j hist[j]        (tokens per verify round, incl. the bonus)
    first_token     = 1 - hist[0] / sum_j hist[j]                 (P(L >= 1), excludes the bonus)
    cumulative  S_k = P(L >= k) = sum_{j>=k} hist[j] / sum hist   k = 1..K
    conditional c_k = P(L >= k | L >= k-1) = S_k / S_{k-1}        (S_0 = 1)
    tau = 1 + sum_k S_k = 1 + sum_k prod_{j<=k} c_j
Per-request acceptance length is each request's own tau averaged over requests (MT-Bench: over turns).

    >>> per_verify(histogram([0, 7, 3], k=7)), per_request([[0, 7], [3]]), first_token(histogram([0, 7, 3], 7))
    (4.333333333333334, 4.25, 0.6666666666666667)
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

NAN = float("nan")


def histogram(accepted: Sequence[int], k: int) -> list[int]:
    """hist[j] = #rounds with exactly j accepted candidates, j = 0..k."""
    h = [0] * (k + 1)
    for a in accepted:
        if not 0 <= a <= k:
            raise ValueError(f"accepted count {a} outside 0..{k}")
        h[a] += 1
    return h


def per_verify(hist: Sequence[float]) -> float:
    """tau = 1 + sum_j j*h[j] / sum_j h[j]; nan when there are no rounds."""
    n = sum(hist)
    return 1 + sum(j * h for j, h in enumerate(hist)) / n if n else NAN


def acceptance_length(accepted: Sequence[int]) -> float:
    """One request's own per-verify tau = 1 + mean(accepted); nan for a request with no rounds."""
    return 1 + sum(accepted) / len(accepted) if len(accepted) else NAN


def per_request(accepted_lists: Sequence[Sequence[int]]) -> float:
    """mean over requests of acceptance_length(request); requests with zero rounds are skipped."""
    vals = [acceptance_length(a) for a in accepted_lists if len(a)]
    return sum(vals) / len(vals) if vals else NAN


def capped_per_verify(hist: Sequence[float], n: int) -> float:
    """tau of the same rounds with each accepted count cut at n: 1 + sum_j min(j, n) h[j] / sum h = 1 + sum_{k<=n} S_k.
    An estimate of what verifying only the first n drafts (`<run>-k<n>`) keeps per verify: a limited run's later rounds
    start at other positions, so its own histogram differs. nan when there are no rounds."""
    if n < 0:
        raise ValueError(f"capped_per_verify: n={n}, expected >= 0")
    total = sum(hist)
    return 1 + sum(min(j, n) * h for j, h in enumerate(hist)) / total if total else NAN


def first_token(hist: Sequence[float]) -> float:
    """P(L >= 1) = 1 - h[0] / sum h; nan when there are no rounds."""
    n = sum(hist)
    return 1 - hist[0] / n if n else NAN


def cumulative(hist: Sequence[float]) -> list[float]:
    """[P(L >= k) for k = 1..K], P(L >= k) = sum_{j>=k} h[j] / sum h."""
    n = sum(hist)
    tail = np.cumsum(list(hist)[::-1])[::-1]  # tail[k] = sum_{j>=k} h[j]
    return [float(t / n) if n else NAN for t in tail[1:]]


def conditional(hist: Sequence[float]) -> list[float]:
    """[P(L >= k | L >= k-1) for k = 1..K] = tail[k] / tail[k-1]; nan when tail[k-1] = 0."""
    tail = np.cumsum(list(hist)[::-1])[::-1]
    return [float(tail[k] / tail[k - 1]) if tail[k - 1] else NAN for k in range(1, len(tail))]


def hist_from_conditional(cond: Sequence[float], n_rounds: float, percent: bool = True) -> list[float]:
    """Invert conditional(): S_k = prod_{j<=k} c_j, h[k] = n*(S_k - S_{k+1}) with S_0 = 1, S_{K+1} = 0.

    `cond` is a conditional row c_1..c_K, in percent by default (as the blog prints it). Returns floats."""
    c = np.asarray(cond, float) / (100.0 if percent else 1.0)
    s = np.concatenate([[1.0], np.cumprod(c), [0.0]])
    return [float(n_rounds * (s[k] - s[k + 1])) for k in range(len(c) + 1)]


def tau_from_conditional(cond: Sequence[float], percent: bool = False) -> float:
    """Per-verify tau = 1 + sum_k prod_{j<=k} c_j (fractions by default; percent=True for blog rows)."""
    c = np.asarray(cond, float) / (100.0 if percent else 1.0)
    return float(1 + np.cumprod(c).sum())


# --- uncertainty over requests -----------------------------------------------------------------------------------
def bootstrap_ci(values, stat_fn: Callable | None = None, n_boot: int = 2000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float, float]:
    """Percentile bootstrap over requests: draw n of the n items with replacement n_boot times, take stat_fn of
    each draw, return (stat_fn(all), lo, hi) with lo/hi the alpha/2 and 1-alpha/2 percentiles of the draws.

    values: per-request numbers (stat_fn None -> mean, vectorised), or per-request items of any kind (records,
    histogram rows) with stat_fn(draw) -> float, where draw is values[idx] for a numpy array and a list otherwise.
    """
    n = len(values)
    if n == 0:
        return NAN, NAN, NAN
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    if stat_fn is None:
        v = np.asarray(values, float)
        point, boots = float(v.mean()), v[idx].mean(1)
    else:
        take = (lambda i: values[i]) if isinstance(values, np.ndarray) else (lambda i: [values[j] for j in i])
        point, boots = float(stat_fn(values)), np.array([stat_fn(take(i)) for i in idx], float)
    lo, hi = np.nanpercentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return point, float(lo), float(hi)


def record_acceptance(record: dict) -> float:
    """Per-request acceptance length of one artifact record (a JSONL line with an `accepted` list)."""
    return acceptance_length(record["accepted"])


def paired_diff(a_records: Sequence[dict], b_records: Sequence[dict], value_fn: Callable = record_acceptance,
                n_boot: int = 2000, seed: int = 0, alpha: float = 0.05, key: str = "id") -> dict:
    """Paired comparison of method a vs b over the requests both ran (matched by record[key]).

    d_i = value_fn(a_i) - value_fn(b_i) (default: per-request acceptance length; pairs with a nan side dropped).
    diff = mean d_i; [lo, hi] = percentile bootstrap CI of the mean over pairs;
    p = two-sided paired sign-flip permutation test of H0 "d_i symmetric around 0":
        p = #{s in {-1,+1}^n : |mean(s*d)| >= |mean(d)|} / 2^n, exact for n <= 12, else Monte Carlo with n_boot
        random sign vectors (p = (1 + hits) / (1 + n_boot)).
    Returns {diff, lo, hi, p, n}."""
    b_by = {r[key]: r for r in b_records}
    d = np.array([value_fn(r) - value_fn(b_by[r[key]]) for r in a_records if r[key] in b_by], float)
    d = d[~np.isnan(d)]
    n = len(d)
    if n == 0:
        return {"diff": NAN, "lo": NAN, "hi": NAN, "p": NAN, "n": 0}
    diff, lo, hi = bootstrap_ci(d, n_boot=n_boot, seed=seed, alpha=alpha)
    obs = abs(d.mean()) - 1e-12  # tolerance so ties with the observed statistic count as extreme
    if n <= 12:
        signs = np.array(list(itertools.product([-1.0, 1.0], repeat=n)))
        p = float((np.abs(signs @ d / n) >= obs).mean())
    else:
        signs = np.random.default_rng(seed + 1).choice([-1.0, 1.0], size=(n_boot, n))
        p = float((1 + (np.abs(signs @ d / n) >= obs).sum()) / (1 + n_boot))
    return {"diff": diff, "lo": lo, "hi": hi, "p": p, "n": n}



# --- the outputs themselves: early stops, repetition, loops --------------------------------------------------------
def stopped_at_once(records: Sequence[dict], eos_ids) -> tuple[float, list]:
    """(fraction of requests whose first generated token is end-of-text, their ids). Such a request has no verify
    round and no acceptance length; a table must list it, never drop it silently."""
    eos = set(eos_ids)
    ids = [r["id"] for r in records if r["output_ids"] and r["output_ids"][0] in eos]
    return (len(ids) / len(records) if records else NAN), ids


def repeat_rate(tokens: Sequence[int], n: int = 8) -> float:
    """Fraction of the sequence's n-grams (starts i = 0..len-n) that already occurred at an earlier start j < i
    (overlaps allowed); nan when the sequence has no n-gram.
    >>> repeat_rate([1, 2, 1, 2, 1, 2], n=2)   # 12 21 12 21 12: the last three were seen before
    0.6"""
    grams = [tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1)]
    return (len(grams) - len(set(grams))) / len(grams) if grams else NAN


LOOP_MIN_TOKENS = 16  # a trailing loop spans at least this many tokens (and at least two copies of its period)


def loop_span(tokens: Sequence[int], min_tokens: int = LOOP_MIN_TOKENS) -> tuple[int, int]:
    """(start, period) of the exact loop the sequence ends in; (len(tokens), 0) when it ends in none.

    Rule: for a period p, the p-periodic suffix is the longest suffix with t[i] == t[i+p] for all its i < len-p;
    its length is p + Z[p] with Z the Z-function of the reversed sequence (Z[p] = longest common prefix of r and
    r[p:]). A period counts when that suffix holds >= 2 full copies (Z[p] >= p) and >= `min_tokens` tokens; the loop
    is the longest such suffix over all periods (the shortest period among equals), and a shorter suffix never counts
    as a loop.
    >>> loop_span([9, 8, 1, 2, 3, 1, 2, 3, 1, 2], min_tokens=6)    # "1 2 3" x 2 + "1 2": starts at 2, period 3
    (2, 3)
    """
    r = list(tokens)[::-1]
    n = len(r)
    z, lo, hi = [0] * n, 0, 0  # Z-function: z[i] = lcp(r, r[i:]); [lo, hi) the rightmost match window
    for i in range(1, n):
        if i < hi:
            z[i] = min(hi - i, z[i - lo])
        while i + z[i] < n and r[z[i]] == r[i + z[i]]:
            z[i] += 1
        if i + z[i] > hi:
            lo, hi = i, i + z[i]
    longest, period = 0, 0
    for p in range(1, n):
        if z[p] >= p and p + z[p] >= min_tokens and p + z[p] > longest:
            longest, period = p + z[p], p
    return n - longest, period


def trailing_loop(tokens: Sequence[int], min_tokens: int = LOOP_MIN_TOKENS) -> int:
    """Start of the exact loop the sequence ends in (`loop_span`); len(tokens) when it ends in none.
    >>> trailing_loop([9, 8, 1, 2, 3, 1, 2, 3, 1, 2], min_tokens=6)    # "1 2 3" x 2 + "1 2": starts at 2
    2
    """
    return loop_span(tokens, min_tokens)[0]


def round_spans(accepted: Sequence[int], n_tokens: int) -> list[tuple[int, int]]:
    """Output tokens [start, end) emitted by each verify round: token 0 comes from the prefill, round i emits
    accepted[i] + 1 tokens (the last round may be cut by end-of-text, a stop string or the length: end <= n_tokens)."""
    spans, s = [], 1
    for a in accepted:
        spans.append((min(s, n_tokens), min(s + a + 1, n_tokens)))
        s += a + 1
    return spans


def acceptance_length_loopfree(accepted: Sequence[int], loop_start: int, n_tokens: int) -> float:
    """Per-verify acceptance 1 + mean(accepted) over the rounds whose emitted tokens all lie before `loop_start`
    (`round_spans`); nan when no round does. With no loop (loop_start = n_tokens) it is `acceptance_length`."""
    keep = [a for a, (_, e) in zip(accepted, round_spans(accepted, n_tokens)) if e <= loop_start]
    return acceptance_length(keep)


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two outputs share (the length of the shorter when one begins the other)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def per_verify_shared(accepted_lists: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                      references: Sequence[Sequence[int]]) -> float:
    """Per-verify tau over the verify rounds whose emitted tokens all lie inside the prefix a request shares with its
    reference output (`round_spans`; AR's at T = 0), pooled over requests: 1 + sum(accepted) / rounds. A bf16 method
    whose output leaves AR's at a top-2 tie decodes other text from there (in one mini B1 benchmark 2 of 16 requests
    ran into 191 more tokens than AR's); this tau reads its acceptance on AR's own text only, and the tok/s speed-up
    times tau_shared / tau estimates the speed-up on AR's outputs (`speedup_on_ar_outputs`).
    Every request equal to its reference: the plain pooled tau. nan when no round lies inside a shared prefix."""
    if not len(accepted_lists) == len(outputs) == len(references):
        raise ValueError(f"per_verify_shared: {len(accepted_lists)} accepted lists, {len(outputs)} outputs and "
                         f"{len(references)} references: one of each per request")
    keep = []
    for acc, out, ref in zip(accepted_lists, outputs, references):
        p = shared_prefix(out, ref)  # len(out) when the output is its reference
        keep += [a for a, (_, e) in zip(acc, round_spans(acc, len(out))) if e <= p]
    return 1 + sum(keep) / len(keep) if keep else NAN


def speedup_on_ar_outputs(speedup, tau_shared, tau):
    """The speed-up on AR's own text, estimated: the measured tok/s speed-up x `per_verify_shared` / per-verify tau (a
    first-order estimate: a round costs the same whatever it accepts, so tok/s goes with tau). Scalars or aligned
    pandas Series alike; nan where `tau_shared` is nan. The one formula behind the bench's `... on AR's outputs
    (estimate)` ratios and the report's `speedup_on_ar_outputs` column."""
    return speedup * tau_shared / tau


def loop_stats(record: dict, n: int = 8, min_tokens: int = LOOP_MIN_TOKENS) -> dict:
    """One record's `repeat_rate` (n-grams), trailing loop (`loop_start`, `loop_tokens`, `loop_frac` = the fraction
    of its emitted tokens inside the loop) and `acceptance_length_loopfree`.

        stats = [loop_stats(r) for r in read_jsonl("results/mini/runs/ablation/dflash/humaneval_T0.jsonl")]
    """
    out, acc = record["output_ids"], record["accepted"]
    start = trailing_loop(out, min_tokens)
    return {"repeat_rate": repeat_rate(out, n), "loop_start": start, "loop_tokens": len(out) - start,
            "loop_frac": (len(out) - start) / len(out) if out else NAN,
            "acceptance_length_loopfree": acceptance_length_loopfree(acc, start, len(out))}


def loop_summary(records: Sequence[dict], n: int = 8, min_tokens: int = LOOP_MIN_TOKENS) -> dict:
    """A run's columns: `repeat_rate` (mean over requests with an n-gram), `loop_frac` (tokens inside trailing loops /
    all emitted tokens, pooled), `acceptance_length_loopfree` (mean over requests with a loop-free round, like
    `per_request`), and `n_loops` (requests that end in a loop)."""
    st = [loop_stats(r, n, min_tokens) for r in records]
    rates = [s["repeat_rate"] for s in st if not np.isnan(s["repeat_rate"])]
    free = [s["acceptance_length_loopfree"] for s in st if not np.isnan(s["acceptance_length_loopfree"])]
    total = sum(len(r["output_ids"]) for r in records)
    return {"repeat_rate": float(np.mean(rates)) if rates else NAN,
            "loop_frac": sum(s["loop_tokens"] for s in st) / total if total else NAN,
            "acceptance_length_loopfree": float(np.mean(free)) if free else NAN,
            "n_loops": sum(s["loop_tokens"] > 0 for s in st)}


# --- acceptance ceilings at T > 0 (dmtp/analysis/oracle.py computes p_max with the target) -------------------------
def ceiling(pmax_lists: Sequence[Sequence[float]], k: int) -> list[float]:
    """The p_max-product ceiling per draft position, pooled over requests: [C_1..C_k] with
        C_j = mean over windows t of prod_{i<j} pmax[t+i],
    pmax[t] = the target's top-1 probability for output token t along a sampled path (`oracle.pmax_along`). The
    windows of a request are t = 1..n-k (token 0 comes from the prefill; all k factors inside the output), the same
    for every j, so C is non-increasing in j. nan without any window. `oracle.py` says what it bounds."""
    rows = [np.cumprod(np.lib.stride_tricks.sliding_window_view(np.asarray(p, float)[1:], k), axis=1)
            for p in pmax_lists if len(p) > k]
    if not rows:
        return [NAN] * k
    return np.concatenate(rows).mean(0).tolist()


def round_ceiling(pmax: Sequence[float], accepted: Sequence[int], k: int) -> dict:
    """Counts for the per-round bound along a method's OWN output (exact for any drafter; `oracle.py`):
        rounds       number of verify rounds
        reach[j-1]   rounds with L >= j-1                            (j = 1..k)
        bound[j-1]   sum over those rounds of pmax[s + j - 1]         (s = the round's first drafted output index;
                     1 where that index lies past the output)
    so P(L >= j) <= bound[j-1] / rounds and P(L >= j | L >= j-1) <= bound[j-1] / reach[j-1]. Counts of several
    requests add up."""
    reach, bound = [0] * k, [0.0] * k
    n = len(pmax)
    for (s, _), a in zip(round_spans(accepted, 1 << 62), accepted):
        for j in range(1, k + 1):
            if a >= j - 1:
                reach[j - 1] += 1
                bound[j - 1] += float(pmax[s + j - 1]) if s + j - 1 < n else 1.0
    return {"rounds": len(accepted), "reach": reach, "bound": bound}
