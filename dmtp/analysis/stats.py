"""Uncertainty over drafter seeds AND requests, paired comparisons, and the Holm correction. Pure numpy.

A method's score is a matrix x[s, r]: the per-request acceptance length of request r (the same prompts for every
method) under the drafter trained with seed s (seed s of every method sees the same data stream, so two methods'
seed-s rows are paired). What varies between re-runs of the whole experiment is both the seed and, for the
population of prompts, the request; the two-level bootstrap resamples both:

    draw seeds   S* ~ uniform with replacement from the n_s seeds
    draw requests R* ~ uniform with replacement from the n_r requests (one draw shared by all seeds: same prompts)
    statistic    mean over S* x R* of x[s, r]           (nan cells, e.g. a request with no rounds, are skipped)

A paired comparison of a vs b uses d[s, r] = a[s, r] - b[s, r] on the seeds both have (matched by seed value) and
the same bootstrap; its two-sided p-value is 2 * min(P*(mean <= 0), P*(mean >= 0)) over the draws, floored at
1 / (n_boot + 1). With one seed it reduces to the request bootstrap. With few seeds (3) the seed level of the
bootstrap is coarse: intervals are honest about what 3 seeds can show, not sharper.

Many comparisons: `holm` adjusts a family of p-values (Holm-Bonferroni step-down; strong FWER control), and
`verdict` words a difference only as far as the adjusted p-value carries it.

    >>> x = np.array([[3.0, 4.0, 5.0], [3.2, 4.1, 5.3]])
    >>> round(seed_request_ci(x)[0], 3)
    4.1
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

NAN = float("nan")


def _draws(n_s: int, n_r: int, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_s, size=(n_boot, n_s)), rng.integers(0, n_r, size=(n_boot, n_r))


def _boot_means(x: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Two-level bootstrap means of x[s, r] (nan-skipping), one per draw."""
    n_s, n_r = x.shape
    si, ri = _draws(n_s, n_r, n_boot, seed)
    vals = np.where(np.isnan(x), 0.0, x)
    cnt = (~np.isnan(x)).astype(float)
    # sum over the drawn seeds and drawn requests: gather rows, then columns (counts handle repeats and nans)
    rows_v, rows_c = vals[si], cnt[si]  # [n_boot, n_s, n_r]
    tot_v = np.take_along_axis(rows_v, ri[:, None, :].repeat(n_s, 1), 2).sum((1, 2))
    tot_c = np.take_along_axis(rows_c, ri[:, None, :].repeat(n_s, 1), 2).sum((1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return tot_v / tot_c


def as_matrix(x) -> np.ndarray:
    """x as a float matrix [seeds, requests] (a 1-D sequence = one seed)."""
    a = np.asarray(x, float)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2:
        raise ValueError(f"expected [seeds, requests] values, got shape {a.shape}")
    return a


def seed_request_ci(x, n_boot: int = 4000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of x[s, r] over seeds and requests and its two-level percentile bootstrap interval."""
    a = as_matrix(x)
    if np.isnan(a).all():
        return NAN, NAN, NAN
    point = float(np.nanmean(a))
    boots = _boot_means(a, n_boot, seed)
    lo, hi = np.nanpercentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return point, float(lo), float(hi)


def paired(a, b, n_boot: int = 4000, seed: int = 0, alpha: float = 0.05) -> dict:
    """Paired a - b over matched seeds (rows) and requests (columns): {diff, lo, hi, p, n_seeds, n_requests}.

    a, b: [seeds, requests] matrices whose rows are the SAME seeds in the same order and columns the same requests
    (`matrices` builds them from records). p: two-sided two-level bootstrap p-value (see the module docstring)."""
    a, b = as_matrix(a), as_matrix(b)
    if a.shape != b.shape:
        raise ValueError(f"paired comparison needs matching [seeds, requests] shapes, got {a.shape} vs {b.shape}")
    d = a - b
    if np.isnan(d).all():
        return {"diff": NAN, "lo": NAN, "hi": NAN, "p": NAN, "n_seeds": a.shape[0], "n_requests": a.shape[1]}
    boots = _boot_means(d, n_boot, seed)
    boots = boots[~np.isnan(boots)]
    lo, hi = np.percentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    p = 2 * min((boots <= 0).mean(), (boots >= 0).mean())
    p = float(min(1.0, max(p, 1 / (len(boots) + 1))))
    return {"diff": float(np.nanmean(d)), "lo": float(lo), "hi": float(hi), "p": p,
            "n_seeds": a.shape[0], "n_requests": a.shape[1]}


def holm(pvals: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order: sort ascending, p_(i) * (m - i) (i from 0), running
    maximum, capped at 1. nan p-values are left out of the family and stay nan."""
    p = np.asarray(pvals, float)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    adj = np.full(len(p), NAN)
    running = 0.0
    for i, j in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, p[j] * (m - i)))
        adj[j] = running
    return adj.tolist()


def verdict(name_a: str, name_b: str, diff: float, p_adj: float, level: float = 0.05) -> str:
    """Words for one comparison, no stronger than the adjusted test: 'a > b', 'a < b' or 'a ≈ b (not resolved)'."""
    if np.isnan(p_adj) or np.isnan(diff):
        return f"{name_a} vs {name_b}: no data"
    if p_adj < level:
        return f"{name_a} {'>' if diff > 0 else '<'} {name_b}"
    return f"{name_a} ≈ {name_b} (not resolved)"


def pairwise(scores: dict[str, np.ndarray], n_boot: int = 4000, seed: int = 0, level: float = 0.05,
             pairs: Sequence[tuple[str, str]] | None = None) -> list[dict]:
    """Every pair (or the given pairs) of methods compared with `paired`, Holm-adjusted over the whole family.

    scores: method -> [seeds, requests] matrix (rows = the same seeds for every method). Returns one dict per pair:
    a, b, diff, lo, hi, p, p_holm, verdict, n_seeds, n_requests."""
    pairs = list(pairs) if pairs is not None else list(combinations(list(scores), 2))
    rows = [dict(a=a, b=b, **paired(scores[a], scores[b], n_boot=n_boot, seed=seed)) for a, b in pairs]
    for r, q in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = q
        r["verdict"] = verdict(r["a"], r["b"], r["diff"], q, level)
    return rows


def matrices(per_seed: dict[str, dict[int, dict[str, float]]]) -> tuple[dict[str, np.ndarray], list[int], list[str]]:
    """method -> {seed -> {request id -> value}} into method -> [seeds, requests] matrices over the seeds and
    requests that EVERY method has (so rows and columns pair up). Returns (matrices, seeds, request ids).
    Baselines without a drafter seed (ar, mtp) are passed with one seed and broadcast to every seed row."""
    drafted = [m for m, d in per_seed.items() if len(d) > 1]
    seeds = sorted(set.intersection(*(set(per_seed[m]) for m in drafted))) if drafted else \
        sorted(set.intersection(*(set(d) for d in per_seed.values())))
    ids = sorted(set.intersection(*(set(r) for d in per_seed.values() for r in d.values())))
    out = {}
    for m, d in per_seed.items():
        rows = [d[s] if s in d else next(iter(d.values())) for s in seeds] if len(d) == 1 else [d[s] for s in seeds]
        out[m] = np.array([[row[i] for i in ids] for row in rows], float)
    return out, seeds, ids
