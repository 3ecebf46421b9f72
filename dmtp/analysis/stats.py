"""Uncertainty over realizations, drafter seeds AND requests, paired comparisons, Holm, equivalence. Numpy + scipy.

A method's score is a cube x[r, s, q]: the per-request acceptance length of request q (the same prompts for every
method and every realization) under the drafter trained with seed s in realization r (an independent replication
of the whole experiment: its own target, on-policy data and drafter seeds). Two methods' cells (r, s, q) are
paired: the same target, the same data stream, the same prompt. A [seeds, requests] matrix is one realization, a
1-D sequence one seed. Missing seeds of a realization (a baseline has one) are rows of nan.

Point estimate: the mean over realizations of each realization's mean over its seed x request cells (nan cells,
e.g. a request with no rounds, skipped). The hierarchical bootstrap resamples every level of the design:

    draw realizations  R* ~ uniform with replacement from the n_r realizations
    draw seeds         within each drawn realization, its own seeds with replacement (as many draws as the most
                       seeds any realization has: every realization weighs the same)
    draw requests      Q* ~ uniform with replacement from the n_q requests (one draw shared by all: same prompts)
    statistic          mean over the drawn cells

A paired comparison of a vs b uses d = a - b on matched cells and the same bootstrap; its two-sided p-value is
2 * min(P*(mean <= 0), P*(mean >= 0)), floored at 1 / (n_boot + 1). With one realization it is the two-level
bootstrap over seeds and requests, with one seed the request bootstrap.

A bootstrap over 3 seeds or 3 realizations is coarse and understates their variance, so every comparison also
gets a t-test at its top level (`top_level`): the realization means when there are >= 2 realizations, else the
seed means, else the requests; with n units it has n - 1 degrees of freedom (3 realizations: |mean| must exceed
4.30 standard errors at 5 %, 2 realizations: 12.7). Each realization's own mean difference is reported too
(`signs`).

Many comparisons: `holm` adjusts a family of p-values (Holm-Bonferroni step-down; strong FWER control);
`holm_family` adjusts both tests of every row of a family and words each with `verdict`: a direction only where
both adjusted tests reject (an intersection-union test: p = the larger of the two) and, with several
realizations, every realization's difference has that sign; otherwise "not resolved". Equivalence ("close")
is a claim of its own: `paired(..., margin=m)` adds the two one-sided tests (TOST) of |d| < m.

    >>> x = np.array([[3.0, 4.0, 5.0], [3.2, 4.1, 5.3]])
    >>> round(seed_request_ci(x)[0], 3)
    4.1
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from itertools import combinations

import numpy as np

NAN = float("nan")
LEVEL = 0.05  # significance level of every test and (1 - LEVEL) intervals


def as_cube(x) -> np.ndarray:
    """x as a float cube [realizations, seeds, requests] (a matrix: one realization; a 1-D sequence: one seed)."""
    a = np.asarray(x, float)
    a = a[None] if a.ndim == 2 else a[None, None] if a.ndim == 1 else a
    if a.ndim != 3:
        raise ValueError(f"expected [realizations, seeds, requests] values, got shape {np.shape(x)}")
    return a


def _present(a: np.ndarray) -> np.ndarray:
    """[R, S] True where realization r has seed row s (not all nan)."""
    return ~np.isnan(a).all(2)


def mean(x) -> float:
    """The mean over realizations of each realization's mean over its cells (nan: no data)."""
    a = as_cube(x)
    per = [np.nanmean(r) for r in a if np.isfinite(r).any()]
    return float(np.mean(per)) if per else NAN


def _draws(a: np.ndarray, n_boot: int, seed: int) -> tuple:
    """Index arrays of the hierarchical bootstrap's cells of a[r, s, q] ([n_boot, R, S, Q] after broadcasting):
    realizations, each drawn realization's own present seeds, one request draw (module docstring)."""
    R, S, Q = a.shape
    have = _present(a)
    order = np.argsort(~have, axis=1, kind="stable")  # each realization's present seeds first
    n_s = np.maximum(have.sum(1), 1)
    rng = np.random.default_rng(seed)
    if R == 1:  # one realization: the two-level bootstrap (draws in the order of earlier versions)
        pos = rng.integers(0, n_s[0], size=(n_boot, 1, S))
        qi = rng.integers(0, Q, size=(n_boot, Q))
        ri = np.zeros((n_boot, 1), int)
    else:
        u = rng.random((n_boot, R, S))
        qi = rng.integers(0, Q, size=(n_boot, Q))
        ri = rng.integers(0, R, size=(n_boot, R))
        pos = (u * n_s[ri][..., None]).astype(int)
    si = np.take_along_axis(order[ri], pos, 2)  # [n_boot, R, S] seed indices of the drawn realizations
    return ri[:, :, None, None], si[:, :, :, None], qi[:, None, None, :]


def _boot_sums(v: np.ndarray, idx: tuple) -> np.ndarray:
    """Sum of v (nan as 0) over each draw's cells."""
    return np.where(np.isnan(v), 0.0, v)[idx].sum((1, 2, 3))


def _boot_means(a: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Hierarchical bootstrap means of a[r, s, q] (nan-skipping), one per draw."""
    idx = _draws(a, n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _boot_sums(a, idx) / _boot_sums((~np.isnan(a)).astype(float), idx)


def ratio_ci(num, den, n_boot: int = 4000, seed: int = 0, alpha: float = LEVEL) -> tuple[float, float, float]:
    """(sum num / sum den, lo, hi): a pooled ratio of counts over cells (e.g. rounds accepting >= 1 draft / rounds)
    with its hierarchical bootstrap interval (num and den drawn together; cells where den is nan: absent)."""
    num, den = as_cube(num), as_cube(den)
    if np.nansum(den) == 0:
        return NAN, NAN, NAN
    idx = _draws(den, n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        boots = _boot_sums(num, idx) / _boot_sums(den, idx)
    lo, hi = np.nanpercentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(np.nansum(num) / np.nansum(den)), float(lo), float(hi)


def seed_request_ci(x, n_boot: int = 4000, seed: int = 0, alpha: float = LEVEL) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of x (a cube, matrix or sequence) and its hierarchical percentile bootstrap
    interval over realizations, seeds and requests."""
    a = as_cube(x)
    if np.isnan(a).all():
        return NAN, NAN, NAN
    boots = _boot_means(a, n_boot, seed)
    lo, hi = np.nanpercentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return mean(a), float(lo), float(hi)


def top_level(x) -> tuple[str, np.ndarray]:
    """The units of the t-test: ("realization", the realization means) with >= 2 realizations holding data, else
    ("seed", the seed means) with >= 2 seeds, else ("request", the request values)."""
    a = as_cube(x)
    rs = [r for r in a if np.isfinite(r).any()]
    if len(rs) >= 2:
        return "realization", np.array([np.nanmean(r) for r in rs])
    if not rs:
        return "request", np.array([])
    seeds = [s for s in rs[0] if np.isfinite(s).any()]
    if len(seeds) >= 2:
        return "seed", np.array([np.nanmean(s) for s in seeds])
    return "request", seeds[0][np.isfinite(seeds[0])] if seeds else np.array([])


def t_test(v, alpha: float = LEVEL, margin: float | None = None) -> dict:
    """One-sample t over units v (paired differences): {mean, lo, hi, p, n, df} with the (1 - alpha) t-interval
    and the two-sided p of mean = 0; with `margin`, tost_p = the larger of the two one-sided p-values of
    mean <= -margin and mean >= margin (equivalence is shown when it is below alpha). Fewer than 2 units: nan."""
    from scipy import stats as st

    v = np.asarray(v, float)
    v = v[np.isfinite(v)]
    n = len(v)
    out = {"mean": float(v.mean()) if n else NAN, "lo": NAN, "hi": NAN, "p": NAN, "n": n, "df": max(n - 1, 0)}
    if margin is not None:
        out["tost_p"] = NAN
    if n < 2:
        return out
    se = v.std(ddof=1) / np.sqrt(n)
    m, df = out["mean"], n - 1
    if se == 0:  # every unit the same: the interval is a point
        out.update(lo=m, hi=m, p=0.0 if m != 0 else 1.0)
        if margin is not None:
            out["tost_p"] = 0.0 if abs(m) < margin else 1.0
        return out
    q = st.t.ppf(1 - alpha / 2, df)
    out.update(lo=float(m - q * se), hi=float(m + q * se), p=float(2 * st.t.sf(abs(m) / se, df)))
    if margin is not None:
        out["tost_p"] = float(max(st.t.sf((m + margin) / se, df), st.t.cdf((m - margin) / se, df)))
    return out


def _boot_p(boots: np.ndarray, at: float, side: str) -> float:
    """Bootstrap p of a one-sided test: P*(mean <= at) for side "le", P*(mean >= at) for "ge" (floored)."""
    p = (boots <= at).mean() if side == "le" else (boots >= at).mean()
    return float(min(1.0, max(p, 1 / (len(boots) + 1))))


def paired(a, b, n_boot: int = 4000, seed: int = 0, alpha: float = LEVEL, margin: float | None = None) -> dict:
    """Paired a - b over matched cells (realizations, seeds, requests): {diff, lo, hi, p} (hierarchical bootstrap:
    interval and two-sided p), {t_level, n_units, t_lo, t_hi, t_p} (the t-test at the top level), `signs` (each
    realization's mean difference, in order), n_realizations, n_seeds (the most any realization has), n_requests;
    with `margin`, the equivalence tests tost_p (bootstrap) and tost_t_p (t), each below alpha when |d| < margin
    is shown.

    a, b: cubes (or matrices, or sequences) with the SAME realizations, seeds and requests in the same order
    (`matrices` builds them from records)."""
    a, b = as_cube(a), as_cube(b)
    if a.shape != b.shape:
        raise ValueError(f"paired comparison needs matching [realizations, seeds, requests] shapes, got {a.shape} "
                         f"vs {b.shape}")
    d = a - b
    R, S, Q = d.shape
    out = {"diff": NAN, "lo": NAN, "hi": NAN, "p": NAN, "t_level": "", "n_units": 0, "t_lo": NAN, "t_hi": NAN,
           "t_p": NAN, "signs": [], "n_realizations": R, "n_seeds": S, "n_requests": Q}
    if margin is not None:
        out.update(tost_p=NAN, tost_t_p=NAN)
    if np.isnan(d).all():
        return out
    boots = _boot_means(d, n_boot, seed)
    boots = boots[~np.isnan(boots)]
    lo, hi = np.percentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    level, units = top_level(d)
    t = t_test(units, alpha, margin)
    out.update(diff=mean(d), lo=float(lo), hi=float(hi), p=min(1.0, 2 * min(_boot_p(boots, 0, "le"),
                                                                             _boot_p(boots, 0, "ge"))),
               t_level=level, n_units=t["n"], t_lo=t["lo"], t_hi=t["hi"], t_p=t["p"],
               signs=[float(np.nanmean(r)) for r in d if np.isfinite(r).any()])
    if margin is not None:
        out.update(tost_p=max(_boot_p(boots, -margin, "le"), _boot_p(boots, margin, "ge")), tost_t_p=t["tost_p"])
    return out


def did(a, b, n_boot: int = 4000, seed: int = 0, alpha: float = LEVEL) -> dict:
    """Difference in differences on two request sets: a[r, q], b[r, q'] are paired differences (e.g. mtp - dflash
    per request) on set A and set B in realizations r (the same realizations, in order). The statistic is the mean
    over realizations of mean_q a[r] - mean_q' b[r]; the bootstrap draws realizations (shared by both sets) and each
    set's requests on their own. The t-test: over the realizations' values with >= 2 realizations, else Welch's over
    the two sets' requests. Returns {diff, lo, hi, p, t_level, n_units, t_lo, t_hi, t_p, signs}."""
    from scipy import stats as st

    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"did: {a.shape[0]} vs {b.shape[0]} realizations")
    R = a.shape[0]
    per = np.nanmean(a, 1) - np.nanmean(b, 1)
    rng = np.random.default_rng(seed)
    ri = rng.integers(0, R, (n_boot, R)) if R > 1 else np.zeros((n_boot, 1), int)
    qa, qb = rng.integers(0, a.shape[1], (n_boot, a.shape[1])), rng.integers(0, b.shape[1], (n_boot, b.shape[1]))
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-nan draw: nan, dropped
        boots = (np.nanmean(a[ri[:, :, None], qa[:, None, :]], 2) - np.nanmean(b[ri[:, :, None], qb[:, None, :]], 2)
                 ).mean(1)
    boots = boots[np.isfinite(boots)]
    lo, hi = np.percentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    out = {"diff": float(per.mean()), "lo": float(lo), "hi": float(hi),
           "p": min(1.0, 2 * min(_boot_p(boots, 0, "le"), _boot_p(boots, 0, "ge"))), "signs": per.tolist()}
    if R >= 2:
        t = t_test(per, alpha)
        return dict(out, t_level="realization", n_units=t["n"], t_lo=t["lo"], t_hi=t["hi"], t_p=t["p"])
    x, y = a[0][np.isfinite(a[0])], b[0][np.isfinite(b[0])]
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    df = (va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1)) if va + vb > 0 else math.inf
    q = float(st.t.ppf(1 - alpha / 2, df))
    se = math.sqrt(va + vb)
    p = float(2 * st.t.sf(abs(out["diff"]) / se, df)) if se > 0 else float(out["diff"] == 0)
    return dict(out, t_level="request", n_units=len(x) + len(y), t_lo=out["diff"] - q * se,
                t_hi=out["diff"] + q * se, t_p=p)


def t_quantile(n: int, alpha: float = LEVEL) -> float:
    """How many standard errors a mean of n units must lie from 0 for the two-sided t-test to reject (nan: n < 2)."""
    from scipy import stats as st

    return float(st.t.ppf(1 - alpha / 2, n - 1)) if n >= 2 else NAN


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


def agree(signs: Sequence[float], diff: float) -> bool:
    """Every realization's difference has the sign of the pooled one (one realization: trivially)."""
    return all(np.sign(s) == np.sign(diff) for s in signs)


def verdict(name_a: str, name_b: str, diff: float, p_adj: float, level: float = LEVEL, same_sign: bool = True) -> str:
    """Words for one comparison, no stronger than its test: 'a > b' / 'a < b' where the adjusted p is below
    `level` and (several realizations) every realization agrees in sign; else 'a vs b: not resolved' (a
    non-rejection says nothing about closeness: that needs an equivalence test)."""
    if np.isnan(p_adj) or np.isnan(diff):
        return f"{name_a} vs {name_b}: no data"
    if p_adj < level and same_sign and diff != 0:
        return f"{name_a} {'>' if diff > 0 else '<'} {name_b}"
    return f"{name_a} vs {name_b}: not resolved"


def pairwise(scores: dict[str, np.ndarray], n_boot: int = 4000, seed: int = 0,
             pairs: Sequence[tuple[str, str]] | None = None) -> list[dict]:
    """Every pair (or the given pairs) of methods compared with `paired` (not yet adjusted: `holm_family`).

    scores: method -> cube (or [seeds, requests] matrix): the same realizations, seeds and requests for every
    method. Returns one dict per pair: a, b and `paired`'s fields."""
    pairs = list(pairs) if pairs is not None else list(combinations(list(scores), 2))
    return [dict(a=a, b=b, **paired(scores[a], scores[b], n_boot=n_boot, seed=seed)) for a, b in pairs]


def holm_family(rows: list[dict], level: float = LEVEL) -> list[dict]:
    """Holm over one family of `paired` rows (every comparison a summary reads), for the bootstrap p (p_holm) and
    the top-level t p (t_p_holm) alike; `verdict` from the larger of the two and the realizations' signs."""
    for r, qb, qt in zip(rows, holm([r["p"] for r in rows]), holm([r["t_p"] for r in rows])):
        r["p_holm"], r["t_p_holm"] = qb, qt
        both = max(qb, qt) if not np.isnan(qt) else qb  # no top-level t (one unit): the bootstrap alone
        r["verdict"] = verdict(r["a"], r["b"], r["diff"], both, level, agree(r["signs"], r["diff"]))
    return rows


def matrices(per_unit: dict[str, dict[tuple[int, int] | int, dict[str, float]]]
             ) -> tuple[dict[str, np.ndarray], list[tuple[int, list[int]]], list[str]]:
    """method -> {(realization, seed) or seed -> {request id -> value}} into method -> cubes [realizations, seeds,
    requests] over the realizations every method has, in each the seeds every drafted method has (a method with
    one seed in a realization, e.g. a baseline without a drafter, is broadcast to every seed row), and the requests
    every method has in every unit (so cells pair up). Returns (cubes, [(realization, seeds)], request ids)."""
    units = {m: {(k if isinstance(k, tuple) else (0, k)): v for k, v in d.items()} for m, d in per_unit.items()}
    by_r = {m: {} for m in units}
    for m, d in units.items():
        for (r, s), v in d.items():
            by_r[m].setdefault(r, {})[s] = v
    reals = sorted(set.intersection(*(set(d) for d in by_r.values()))) if by_r else []
    layout = []
    for r in reals:
        drafted = [m for m in by_r if len(by_r[m][r]) > 1]
        seeds = sorted(set.intersection(*(set(by_r[m][r]) for m in (drafted or by_r))))
        layout.append((r, seeds))
    ids = sorted(set.intersection(*(set(v) for d in units.values() for v in d.values())), key=str) if units else []
    n_s = max((len(s) for _, s in layout), default=0)
    out = {}
    for m in units:
        cube = np.full((len(layout), n_s, len(ids)), NAN)
        for i, (r, seeds) in enumerate(layout):
            d = by_r[m][r]
            for j, s in enumerate(seeds):
                row = d[s] if s in d else next(iter(d.values()))  # one seed: broadcast
                cube[i, j] = [row[q] for q in ids]
        out[m] = cube
    return out, layout, ids


def t_one_sided(v) -> float:
    """p of the one-sided one-sample t-test of mean(v) > 0 (a registered claim's direction), n - 1 degrees of
    freedom; nan with fewer than 2 finite units; every unit equal: 0 if positive, else 1."""
    from scipy import stats as st

    v = np.asarray(v, float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return NAN
    se = v.std(ddof=1) / np.sqrt(len(v))
    if se == 0:
        return 0.0 if v.mean() > 0 else 1.0
    return float(st.t.sf(v.mean() / se, len(v) - 1))


def spearman(x, y) -> float:
    """Spearman's rank correlation (average ranks for ties); nan with fewer than 3 pairs or a constant side."""
    from scipy import stats as st

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return NAN
    return float(np.corrcoef(st.rankdata(x), st.rankdata(y))[0, 1])


def rank_agreement(x, y, n_perm: int = 20000, seed: int = 0) -> dict:
    """Spearman's rho of x against y and the one-sided permutation p of rho >= observed (x's labels permuted against
    y): every permutation when there are at most 8 values (8! = 40,320), else n_perm random ones (floored at
    1 / (n_perm + 1)). {rho, p, n, exact}. One test replaces the n (n - 1) / 2 pairwise ones that an order would
    otherwise need."""
    from itertools import permutations

    from scipy import stats as st

    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = spearman(x, y)
    n = len(x)
    if np.isnan(rho):
        return {"rho": NAN, "p": NAN, "n": n, "exact": False}
    rx, ry = st.rankdata(x), st.rankdata(y)
    exact = n <= 8
    perms = (np.array(list(permutations(range(n))), int) if exact
             else np.argsort(np.random.default_rng(seed).random((n_perm, n)), axis=1))
    px = rx[perms]  # [n_perm, n]: x's ranks permuted
    px = px - px.mean(1, keepdims=True)
    cy = ry - ry.mean()
    rhos = (px @ cy) / (np.sqrt((px ** 2).sum(1)) * np.sqrt((cy ** 2).sum()))
    hits = int((rhos >= rho - 1e-12).sum())
    p = hits / len(perms) if exact else (hits + 1) / (len(perms) + 1)
    return {"rho": rho, "p": float(p), "n": n, "exact": exact}
