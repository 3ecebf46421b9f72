"""tables/claims: every claim a report makes about the blog, each with one interval per contrast and a verdict word
no stronger than its test.

Two families, named in every row. The **primary family** (`registered.PRIMARY`: P1-P4) is decided only on the series
it is registered on (an experiment key and a records revision): a one-sided paired t-test over realizations, Holm
over the four, "holds" only with the registered number of realizations (fewer: "interim (k of n realizations)"). On
another series its contrasts are exploratory rows that print the same one-sided test as a reading. Every other row is
**exploratory**: its interval, its test with an unadjusted p, and one of "consistent" (both intervals on the claim's
side of 0 and every realization's own value there too), "contrary" (the same on the other side) or "not resolved",
each marked "(exploratory)". A sentence that reads the exploratory rows together reads them after Holm over all of
them (`holm_p`: over each row's p, the larger of its t and bootstrap p where it has both): unadjusted, two dozen
correlated tests find a direction by chance.

The wording rule, for every kind of claim: a claim resting on one realization reads "within one realization" (its
intervals cover seeds and requests, not the run-to-run spread of the whole experiment); a verdict across
realizations needs at least two. Throughput claims are made per kind of card and within the series whose
realizations timed them (a report pools one series): with one realization on a card kind the row gives the median
of its timing repeats and names their range as repeats (timer and run-to-run noise of one trained pair, not model
variation); with several it is a t-test over the realizations' medians.

One contrast, one interval: a - b on a primary dataset is the pairwise table's row (tables/pairwise_T*.csv), the
same numbers the acceptance tables print (`data.paired_runs` at `data.CONTRAST_BOOT` draws); the t-interval over
the top level's units first, the hierarchical bootstrap beside it.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from dmtp.analysis import reference as R
from dmtp.analysis import stats as S
from dmtp.analysis.report import bench as B
from dmtp.analysis.report import tables as T
from dmtp.analysis.report import registered as REG
from dmtp.analysis.report.data import (CONTRAST_BOOT, Artifacts, differences, first_of, paired_runs, per_unit,
                                       read_optional, revision_words, select, series_key)
from dmtp.analysis.report.registered import SMOKE, Family

# "close" = |a - b| below this share of b's acceptance length (the blog states no margin: docs/DESIGN.md, "Equivalence")
CLOSE_MARGIN_PCT = 2.0
PRIMARY_FAMILY, EXPLORATORY = "primary", "exploratory"
WORDS = {1: "consistent", -1: "contrary", 0: "not resolved"}


# --- the series, its realizations and one interval per contrast -----------------------------------------------------
def series(art: Artifacts) -> tuple[str, int | None]:
    """(experiment name, train.steps) of the pooled series (every pooled realization shares its experiment)."""
    root = next((r.root for r in art.realizations if (r.root / "experiment.json").exists()), art.root)
    e = read_optional(root, "experiment.json")
    return str(e.get("name", "")), e.get("train", {}).get("steps")


def n_realizations(art: Artifacts) -> int:
    return max(len(art.realizations), 1)


def one(art: Artifacts) -> str:
    """'within one realization (r<k>): ' for a one-realization report, else ''; a smoke series (`SMOKE`) says so
    in either case: its verdicts describe the pipeline's run, never the method."""
    smoke = series(art)[0] in SMOKE
    if n_realizations(art) > 1:
        return f"a smoke series ({n_realizations(art)} realizations): " if smoke else ""
    name = art.realizations[0].name if art.realizations else "the flat layout"
    return f"within one realization ({name}){' of a smoke run' if smoke else ''}: "


def contrast(art: Artifacts, dataset: str, t: float, a: str, b: str, margin: float | None = None) -> dict | None:
    """a - b of per-request acceptance length at (dataset, T): the pairwise table's row where the pair is in it (the
    interval the acceptance tables print), else `data.paired_runs` at the same number of draws. Keys: diff, diff_lo,
    diff_hi (bootstrap), diff_tlo, diff_thi (t), p (bootstrap, two-sided), t_p (t, two-sided), t_level, n_units,
    signs (each realization's own difference); with `margin`, tost_p and tost_t_p."""
    r = T.pair_row(art, a, b, t, dataset) if margin is None and dataset in T.primary(art) else None
    if r is not None:
        keys = ("diff", "diff_lo", "diff_hi", "diff_tlo", "diff_thi", "t_p", "t_level", "n_units", "signs")
        return {"p": r["diff_p"], **{k: r[k] for k in keys}}
    q = paired_runs(art, ("ablation", dataset, t), a, b, n_boot=CONTRAST_BOOT, margin=margin)
    return None if pd.isna(q["diff"]) else as_contrast(q)


def as_contrast(r: dict, scale: float = 1.0) -> dict:
    """`stats.paired` fields as a claims row reads them (diff, diff_lo, diff_hi, diff_tlo, diff_thi, signs), each
    times `scale` (100: a rate in points)."""
    return dict(r, diff=scale * r["diff"], diff_lo=scale * r["lo"], diff_hi=scale * r["hi"],
                diff_tlo=scale * r["t_lo"], diff_thi=scale * r["t_hi"], signs=[scale * x for x in r.get("signs", [])])


def direction_word(r: dict, n: int) -> int:
    """+1 (consistent) where both intervals lie above 0 and, with several realizations, every realization's own value
    is positive; -1 (contrary) the mirror image; 0 (not resolved) otherwise."""
    ints = [(lo, hi) for lo, hi in ((r.get("diff_tlo"), r.get("diff_thi")), (r.get("diff_lo"), r.get("diff_hi")))
            if lo is not None and not pd.isna(lo) and not pd.isna(hi)]
    if not ints:
        return 0
    signs = [x for x in r.get("signs", []) if not pd.isna(x)] if n > 1 else []
    if all(lo > 0 for lo, _ in ints) and all(x > 0 for x in signs):
        return 1
    if all(hi < 0 for _, hi in ints) and all(x < 0 for x in signs):
        return -1
    return 0


def explored(art: Artifacts, claim: str, t, r: dict, test: str | None = None, d: int | None = None, **kw) -> dict:
    """An exploratory row (`_row`, its keywords): the verdict word of `d` (default: `direction_word` of r over the
    report's realizations), said within one realization where the report has one; `test` default: `_p(r)`."""
    d = direction_word(r, n_realizations(art)) if d is None else d
    return _row(EXPLORATORY, claim, t, r, _p(r) if test is None else test, f"{one(art)}{WORDS[d]} (exploratory)", **kw)


def _row(family: str, claim: str, t, r: dict, test: str, verdict: str, kind: str = "direction",
         unit: str = "", p: float | None = None, magnitude: str = "") -> dict:
    """A claims-table row. `kind`: "direction" (a > b: positive = the claim's sign), "closeness" (TOST), "range" (the
    estimate inside the blog's range), "rank" (a rank correlation); `unit`: "", "%" or "pts"; `p`: the row's own
    p-value (default: the larger of its two-sided t and bootstrap p, `row_p`; nan: no single test), which the
    exploratory rows' Holm reads (`holm_p`, set by `claims`); `magnitude`: a sentence on the size against the
    blog's, printed beside the verdict; n_realizations_claim_sign / n_realizations_opposite_sign: how many
    realizations' own values (`signs`) have the claim's sign and the opposite one."""
    signs = [float(x) for x in r.get("signs", []) if not pd.isna(x)]
    return {"family": family, "claim": claim, "temperature": t, "estimate": r["diff"],
            "estimate_tlo": r.get("diff_tlo", math.nan), "estimate_thi": r.get("diff_thi", math.nan),
            "estimate_lo": r.get("diff_lo", math.nan), "estimate_hi": r.get("diff_hi", math.nan),
            "by_realization": r.get("by", T.signs_text(signs)), "test": test, "verdict": verdict, "kind": kind,
            "unit": unit, "n_realizations_claim_sign": sum(x > 0 for x in signs),
            "n_realizations_opposite_sign": sum(x < 0 for x in signs), "p": row_p(r) if p is None else p,
            "magnitude": magnitude}


def row_p(r: dict) -> float:
    """A contrast's p for a family of rows: the larger of its two-sided t p and bootstrap p (its verdict needs both
    intervals off 0), the one it has when it has one, nan with none."""
    ps = [float(r[k]) for k in ("t_p", "p") if r.get(k) is not None and not pd.isna(r.get(k))]
    return max(ps) if ps else math.nan


def _p(r: dict) -> str:
    """'t p = 0.012 over 3 realizations, bootstrap p = 0.0005 (two-sided, unadjusted)'."""
    t = f"t p = {r['t_p']:.3g} over {r.get('n_units', 0)} {r.get('t_level', '')}s, " if not pd.isna(
        r.get("t_p", math.nan)) else ""
    return f"{t}bootstrap p = {r['p']:.3g} (two-sided, unadjusted)"


# --- the primary family ---------------------------------------------------------------------------------------------
def off_series(art: Artifacts, fam: Family | None = None) -> str:
    """Why the pooled realizations are not the registered series, in words ('' when they are): what differs from the
    registered series, and which of them were seen before the family was written."""
    fam = fam or REG.PRIMARY
    if art.on_registered:
        return ""
    roots = [r.root for r in art.realizations] or [art.root]
    key, rev = series_key(roots[0]) or ({}, None)
    diff = differences(fam.key, key)
    if key.get("name") != fam.key.get("name"):  # another profile: its name says more than its fields
        diff = [f"the profile (`{key.get('name')}`)"]
    made = revision_words(rev)
    what = (f"its experiment differs in {first_of(diff, 3)}; {made}" if diff else
            f"the same experiment made by other record-making code ({made})")
    seen = [r.name for r in art.realizations if r.name in fam.seen_before and r.root.parent.name == fam.experiment]
    return what + (f"; {', '.join(seen)} {'were' if len(seen) > 1 else 'was'} seen before the family was registered"
                   if seen else "")


def primary_rows(art: Artifacts, fam: Family | None = None) -> list[dict]:
    """The registered claims: on their series a one-sided paired t over realizations, Holm over the family; on any
    other series the same contrasts as exploratory rows, the same one-sided test printed beside as a reading (not
    the registered test). The blog's own DMTP model (`beside`) follows each claim on the same contrast,
    exploratory."""
    fam = fam or REG.PRIMARY
    n = n_realizations(art)
    registered = art.on_registered and n > 1
    got = [(c, r) for c in fam.claims if (r := contrast(art, fam.dataset, c.temperature, c.a, c.b))]
    p1 = [S.t_one_sided(r["signs"]) if len(r["signs"]) > 1 else math.nan for _, r in got]
    out = []
    for (c, r), p, q in zip(got, p1, S.holm(p1)):
        pair = f"`{c.a}` − `{c.b}`"
        one_sided = (f"one-sided paired t over {len(r['signs'])} realizations, p = {p:.3g}; Holm p = {q:.3g} over the "
                     f"{len(got)} claims of the primary family")
        if registered:
            ok = q < fam.alpha
            v = "holds" if ok else "not resolved"
            if n < fam.min_realizations:
                v = f"interim ({n} of {fam.min_realizations} realizations): {'rejects at 0.05 after Holm' if ok else v}"
            out.append(_row(PRIMARY_FAMILY, f"{c.key}: {c.text}: {pair}", c.temperature, r, one_sided, v, p=p))
        else:
            why = ("not the registered series" if not art.on_registered
                   else "registered across realizations; one realization decides nothing")
            test = _p(r) + (f"; as the registered test reads it (not that test): {one_sided}" if not pd.isna(p) else "")
            out.append(explored(art, f"{c.key} ({why}): {c.text}: {pair}", c.temperature, r, test))
            out[-1]["reading"] = (f"read as the registered test would (not that test): one-sided p = {p:.3g}, Holm "
                                  f"p = {q:.3g} over the four" if not pd.isna(p) else "")
        if c.beside and (rb := contrast(art, fam.dataset, c.temperature, c.beside, c.b)):
            out.append(explored(art, f"{c.key} with the blog's DMTP model: `{c.beside}` − `{c.b}`", c.temperature,
                                rb))
    return out


# --- the exploratory rows -------------------------------------------------------------------------------------------
def blog_pairs(art: Artifacts) -> list[tuple[str, str, str, tuple]]:
    """(a, b, the claim "a > b" with the blog's numbers, temperatures) the primary family does not already decide: the
    blog's other claims, the control at the temperatures not registered, the backbone pair."""
    sp = art.spec
    dmtp, dflash, ref, main = sp.blog_run, sp.drafter_baseline, sp.reference, sp.main_method or sp.blog_run
    he = R.table("open_repro").set_index("dataset").loc["HumanEval"]
    code = R.table("main").set_index("workload").loc["Code"]
    rows = [
        (main, "mtp", f"DMTP > MTP415 (open reproduction 27B HumanEval, T = 0: {he.dmtp:.3f} vs {he.mtp:.3f}; 35B "
                      f"Code, T = 1: {code.dmtp:.3f} vs {code.mtp:.3f})", (1.0,)),
        (dflash, "mtp", f"DFlash > MTP415 on code at T = 0 (open reproduction 27B HumanEval: {he.dflash:.3f} > "
                        f"{he.mtp:.3f})", (0.0,)),
        ("mtp", dflash, f"MTP415 > DFlash on code at T = 1 (the blog's only T = 1 row of the pair, 35B Code: "
                        f"{code.mtp:.3f} > {code.dflash:.3f})", (1.0,)),
        (dmtp, ref, f"{dmtp} > {ref} (blog Code ablation +{R.ablation_value(dmtp, f'rel_to_{ref}_pct'):.2f} %)",
         (0.0, 1.0)),
    ]
    registered = {(c.a, c.b, c.temperature) for c in REG.PRIMARY.claims}
    for c in sp.controls:  # the main method against each control, at every temperature the primary family leaves
        if sp.main_method and c != sp.main_method:
            ts = tuple(t for t in (0.0, 1.0) if (sp.main_method, c, t) not in registered)
            rows.append((sp.main_method, c, f"control: {sp.main_method} > {c} (what the MTP hidden adds)", ts))
    d2, f2 = T.open_columns(art).get("dmtp_d2"), T.open_columns(art).get("dflash2")
    if d2 and f2:
        rows.append((d2, f2, f"DMTP(D2) > DFlash2 (open reproduction 27B HumanEval, T = 0: {he.dmtp_d2:.3f} vs "
                             f"{he.dflash2:.3f}, +{he.dmtp_d2_vs_dflash2_pct:.2f} %)", (0.0, 1.0)))
    return [(a, b, text, ts) for a, b, text, ts in rows if a and b and a != b]


def blog_rows(art: Artifacts, dataset: str, temps) -> list[dict]:
    return [explored(art, f"{text}: `{a}` − `{b}`", t, r) for a, b, text, ts in blog_pairs(art)
            for t in ts if t in temps and (r := contrast(art, dataset, t, a, b))]


def close_pairs(art: Artifacts) -> list[tuple[str, str, str]]:
    """The blog's two claims of closeness as (a, b, text): the Nov 9 note (the main method is close to single-anchor
    fusion) and the Nov 4 note (double and single anchor are close trained from scratch)."""
    sp, out = art.spec, []
    if sp.main_method and sp.main_method != sp.blog_run:
        out.append((sp.main_method, sp.blog_run, "Nov 9: 「零初始化残差与直接融合的效果接近」 — the zero-initialised "
                    "residual (the current main method) performs close to direct fusion"))
    if "double_anchor_fusion" in sp.runs() and sp.blog_run:
        out.append(("double_anchor_fusion", sp.blog_run, "Nov 4: 「双 anchor 与单 anchor 从头训练时效果接近」 — "
                    "double and single anchor perform close when trained from scratch"))
    return out


def close_rows(art: Artifacts, dataset: str, temps) -> list[dict]:
    """Each closeness claim at each T: TOST against ±CLOSE_MARGIN_PCT % of b (the bootstrap's and the top-level t's
    one-sided tests, the larger p, Holm over the claim's temperatures): consistent when it rejects; contrary when
    both 95 % intervals lie outside the margin; else not resolved (exploratory)."""
    s = art.ablation(dataset).set_index(["temperature", "method"])
    out = []
    for a, b, text in close_pairs(art):
        got = []
        for t in temps:
            if (t, b) not in s.index or (t, a) not in s.index:
                continue
            m = CLOSE_MARGIN_PCT / 100 * s.loc[(t, b), "acceptance_length"]
            if r := contrast(art, dataset, t, a, b, margin=m):
                got.append((t, m, r, max(r["tost_p"], r["tost_t_p"]) if not pd.isna(r["tost_t_p"]) else r["tost_p"]))
        for (t, m, r, p), q in zip(got, S.holm([p for *_, p in got])):
            far = all(lo > m or hi < -m for lo, hi in ((r["diff_lo"], r["diff_hi"]), (r["diff_tlo"], r["diff_thi"]))
                      if not pd.isna(hi))
            d = 1 if q < S.LEVEL else -1 if far else 0
            out.append(explored(art, f"{text}: `{a}` − `{b}`", t, r, f"TOST within ±{m:.3f} ({CLOSE_MARGIN_PCT:g} % "
                                f"of `{b}`), Holm p = {q:.3g} over {len(got)} temperatures", d, kind="closeness", p=p))
    return out


def first_rate(g: pd.DataFrame) -> pd.DataFrame:
    """The request rows with `first_rate` = rounds accepting >= 1 draft / rounds (nan: no round)."""
    return g.assign(first_rate=g.first_hits / g.n_rounds.where(g.n_rounds > 0))


def first_cubes(art: Artifacts, t: float, a: str, b: str, **eq) -> tuple | None:
    """`stats.matrices` of the per-request first-token acceptance of ablation runs a and b at T (natural mode, the
    rows `eq` selects); None unless both have requests."""
    r = select(first_rate(art.runs), experiment="ablation", temperature=t, mode="natural", **eq)
    units = {m: per_unit(r[r.method == m], "first_rate") for m in (a, b)}
    return S.matrices(units) if all(units.values()) else None


def first_token_rows(art: Artifacts, dataset: str, temps) -> list[dict]:
    """The first-token gap at T = 1, main method - drafter baseline, in points of first-token acceptance, against
    the blog's range over its six workloads (35B, T = 1, conditional table c1: DMTP - DFlash): consistent when both
    intervals lie inside the range, contrary when both lie wholly outside it."""
    sp = art.spec
    if 1.0 not in temps or not sp.main_method or not sp.drafter_baseline:
        return []
    c = R.table("conditional").set_index(["workload", "method"]).c1.unstack()
    gaps = (c["dmtp"] - c["dflash"]).dropna()
    lo, hi = float(gaps.min()), float(gaps.max())
    got = first_cubes(art, 1.0, sp.main_method, sp.drafter_baseline, dataset=dataset)
    if got is None:
        return []
    r = as_contrast(S.paired(got[0][sp.main_method], got[0][sp.drafter_baseline], n_boot=CONTRAST_BOOT), 100)  # points
    ints = [(a, b) for a, b in ((r["diff_tlo"], r["diff_thi"]), (r["diff_lo"], r["diff_hi"])) if not pd.isna(a)]
    d = 1 if all(lo <= a and b <= hi for a, b in ints) else -1 if all(b < lo or a > hi for a, b in ints) else 0
    return [explored(art, f"the first-token gap at T = 1 lies in the blog's range (35B, T = 1, six workloads: "
                     f"{lo:+.2f} to {hi:+.2f} points): `{sp.main_method}` − `{sp.drafter_baseline}`, first-token "
                     "acceptance per request, points", 1.0, r, f"both intervals inside [{lo:+.2f}, {hi:+.2f}]; "
                     + _p(r), d, kind="range", unit="pts", p=math.nan)]


def rank_rows(art: Artifacts, dataset: str, temps) -> list[dict]:
    """The ablation's order against the blog's Code ablation: Spearman's rho between our acceptance and the blog's
    over the variants both have, one-sided permutation test (`stats.rank_agreement`), each realization's own rho
    and the t-interval over them: consistent where the permutation test rejects and every realization's rho is
    positive (exploratory). One test in place of the 28 pairwise ones an order would need. A correlation is worded
    as agreement, never as the same order: the row says whether the pooled orders are the same (rho = 1)."""
    blog = R.table("ablation").set_index("method").acceptance_length
    out = []
    for t in temps:
        g = art.ablation(dataset, t).set_index("method")
        ms = [m for m in blog.index if m in g.index]
        if len(ms) < 3:
            continue
        ra = S.rank_agreement(g.loc[ms, "acceptance_length"].to_numpy(float), blog[ms].to_numpy(float))
        runs = select(art.runs, experiment="ablation", dataset=dataset, temperature=t, mode="natural", method=ms)
        per = runs.groupby(["realization", "method"]).acceptance_length.mean().unstack()
        rhos = [S.spearman(per.loc[k, ms].to_numpy(float), blog[ms].to_numpy(float)) for k in per.index
                if per.loc[k, ms].notna().all()]
        tt = S.t_test(rhos) if len(rhos) > 1 else {"lo": math.nan, "hi": math.nan, "p": math.nan, "n": len(rhos)}
        r = {"diff": ra["rho"], "diff_tlo": tt["lo"], "diff_thi": tt["hi"], "signs": rhos,
             "by": " / ".join(f"{x:+.3f}" for x in rhos)}
        d = 1 if ra["p"] < S.LEVEL and all(x > 0 for x in rhos) else 0
        same = "the same order" if ra["rho"] > 1 - 1e-9 else "the orders differ"
        out.append(explored(art, f"the ablation's order agrees with the blog's (Code ablation, {len(ms)} "
                            "variants: " + ", ".join(ms) + f"; a rank correlation, {same}): Spearman's rho of ours "
                            "against the blog's", t, r, f"one-sided permutation p = {ra['p']:.3g} "
                            f"({'every' if ra['exact'] else 'random'} order of the {len(ms)} variants); t-interval "
                            "over the realizations' own rho", d, kind="rank", p=ra["p"]))
    return out


def ood_gaps(art: Artifacts, a: str = "mtp", b: str | None = None, n_boot: int = 4000) -> dict | None:
    """The out-of-distribution comparison at T = 0, seed 0: per set (HumanEval, each `eval.ood` set) the paired
    gap a - b of per-request first-token acceptance, and the difference in differences (ood minus HumanEval) over
    the realizations both sets have (stats.did). None without an ood set holding both runs."""
    b = b or art.spec.drafter_baseline
    for ood in art.ood or {}:
        per = {}  # dataset -> ({realization: row of the cubes}, cubes)
        for ds in ("humaneval", ood):
            if (got := first_cubes(art, 0, a, b, dataset=ds, seed=0)) is not None:
                per[ds] = ({k: i for i, (k, _) in enumerate(got[1])}, got[0])
        if len(per) < 2:
            continue
        common = sorted(set(per["humaneval"][0]) & set(per[ood][0]))
        gap = {ds: S.paired(c[a], c[b], n_boot=n_boot) for ds, (_, c) in per.items()}
        d = {ds: (c[a] - c[b])[[idx[k] for k in common], 0] for ds, (idx, c) in per.items()}
        return {"a": a, "b": b, "ood": ood, "gap": gap, "did": S.did(d[ood], d["humaneval"], n_boot)}
    return None


def ood_rows(art: Artifacts) -> list[dict]:
    """Out of distribution: DMTP against MTP415 on each ood set (the blog's DMTP > MTP415, where the suite finds it
    reversed), and the native head's first-token advantage in and out of distribution (difference in differences)."""
    sp, out = art.spec, []
    for ood, runs in (art.ood or {}).items():
        for a in dict.fromkeys(x for x in (sp.main_method, sp.blog_run) if x in runs and "mtp" in runs):
            r = contrast(art, ood, 0.0, a, "mtp")
            if r:
                who = "DMTP" if a == sp.main_method else "the blog's DMTP model"
                out.append(explored(art, f"{who} > MTP415 out of distribution ({ood}: test functions the target "
                                    f"pretrained on, never in the drafters' data): `{a}` − `mtp`", 0.0, r))
    g = ood_gaps(art)
    if g is not None:
        r = as_contrast(g["did"])
        out.append(explored(art, f"the native MTP head's first-token advantage is largest outside the drafter's "
                            f"training distribution: (`{g['a']}` − `{g['b']}`) on {g['ood']} minus on humaneval "
                            "(first-token acceptance, per request, seed 0)", 0.0, r,
                            f"difference in differences; {_p(r)}"))
    return out


MIN_REPEATS = 3  # timing repeats a one-realization throughput row needs before the repeats' sign is read at all


def throughput_rows(art: Artifacts) -> list[dict]:
    """The blog's B32 claim (DMTP's tok/s gain over DFlash, T = 1) per kind of card, at the largest batch cap timed at
    T = 1 (the module docstring's rules); one realization: consistent / contrary when every one of at least
    MIN_REPEATS repeats has that sign."""
    sp, df = art.spec, T.main_gains(art, 1.0)
    if df is None or not len(df):
        return []
    reps = B.per_repeat(art.throughput, sp.main_method, sp.drafter_baseline)
    reps = reps[(reps.method == sp.main_method) & (reps.temperature == 1) & reps.gain.notna()]
    blog = R.table("throughput").set_index(["workload", "method"]).tok_per_s
    exp, steps = series(art)
    out = []
    for (ds, dev), g in df.groupby(["dataset", df.device.fillna("").astype(str)], sort=True):
        cap = g.batch_cap.max()
        g = g[g.batch_cap == cap]
        w = R.workload(ds)
        text = (f"DMTP's end-to-end gain over DFlash at B{cap}, T = 1 (blog {w}: {blog[w, 'dflash']:.0f} → "
                f"{blog[w, 'dmtp']:.0f} tok/s, {T.pct(blog[w, 'dmtp'], blog[w, 'dflash']):+.2f} % for "
                f"{R.blog_value('main', ds, 'dmtp_vs_dflash_pct'):+.2f} % acceptance, 35B on 4xH200)"
                if (w, "dmtp") in blog.index else f"DMTP's end-to-end gain over DFlash at B{cap}, T = 1")
        where = f"{dev or 'card not recorded'}, {exp or 'this'} series of {steps} steps"
        claim = f"{text}, on {where}: `{sp.main_method}` vs `{sp.drafter_baseline}` tok/s (%)"
        if len(g) > 1:
            gain, tt = float(np.mean(g.gain_pct)), S.t_test(list(g.gain_pct))
            r = {"diff": gain, "diff_tlo": tt["lo"], "diff_thi": tt["hi"], "signs": list(g.gain_pct),
                 "by": " / ".join(f"{x.realization} {x.gain_pct:+.1f}" for x in g.itertuples())}
            out.append(explored(art, claim, 1.0, r, f"t over {len(g)} realizations' median gains (each over its "
                                f"own timing repeats), p = {tt['p']:.3g} (two-sided, unadjusted)",
                                direction_word(r, len(g)), unit="%", p=tt["p"],
                                magnitude=magnitude(gain, float(np.mean(g.per_verify_gain_pct)), blog, ds)))
            continue
        x = g.iloc[0]
        k = int(T.realization_number(x.realization) or 0)
        mine = reps[(reps.realization == k) & (reps.batch_cap == cap) & (reps.dataset == ds)]
        gains = sorted(100 * (mine.gain - 1))
        d = (0 if len(gains) < MIN_REPEATS else 1 if min(gains) > 0 else -1 if max(gains) < 0 else 0)
        r = {"diff": x.gain_pct, "signs": [x.gain_pct],
             "by": f"{x.realization} repeats: " + ", ".join(f"{v:+.1f}" for v in gains)}
        out.append(_row(EXPLORATORY, claim, 1.0, r,
                        f"median of {len(gains)} timing repeat{'s' * (len(gains) != 1)} of one trained pair (timer "
                        f"and run-to-run noise, not model variation); read only with at least {MIN_REPEATS} repeats",
                        f"within one realization ({x.realization}): {WORDS[d]} (exploratory; {len(gains)} repeats)",
                        unit="%", p=math.nan, magnitude=magnitude(x.gain_pct, x.per_verify_gain_pct, blog, ds)))
    return out


def magnitude(gain: float, per_verify: float, blog: pd.Series, dataset: str) -> str:
    """The size of a tok/s gain beside its direction: against the blog's gain on the dataset's workload, and the
    share of the per-verify (acceptance) gain that became speed, ours and the blog's ('' without the numbers)."""
    if pd.isna(gain) or pd.isna(per_verify) or per_verify == 0:
        return ""
    out, share, w = f"size: {gain:+.1f} % tok/s", "", R.workload(dataset)
    if (w, "dmtp") in blog.index:
        b = T.pct(blog[w, "dmtp"], blog[w, "dflash"])
        acc = R.blog_value("main", dataset, "dmtp_vs_dflash_pct")
        out += f" against the blog's {b:+.1f} %"
        share = f" (the blog's: {100 * b / acc:.0f} % of {acc:+.1f} %)" if acc and not pd.isna(acc) else ""
    return out + f"; {100 * gain / per_verify:.0f} % of its {per_verify:+.1f} % per-verify gain became speed{share}"


def claims(art: Artifacts) -> pd.DataFrame | None:
    """tables/claims: the primary family, then every exploratory claim (the module docstring's rules)."""
    prim = T.primary(art)
    if not prim:
        return None
    ds = prim[0]
    temps = sorted(set(art.ablation(ds).temperature))
    rows = (primary_rows(art) + blog_rows(art, ds, temps) + close_rows(art, ds, temps)
            + first_token_rows(art, ds, temps) + rank_rows(art, ds, temps) + ood_rows(art) + throughput_rows(art))
    if not rows:
        return None
    df = pd.DataFrame(rows)
    ex = df.family == EXPLORATORY
    df["holm_p"] = math.nan
    df.loc[ex, "holm_p"] = S.holm(list(df.p[ex]))
    return T.save(art, "claims", df, "The blog's claims: the primary family, then exploratory",
                  f"family: primary = {REG.PRIMARY.name}; exploratory = every other row (unadjusted p, verdict "
                  "consistent / contrary / not resolved; p = the row's own p, the larger of its t and bootstrap p "
                  "where it has both; holm_p = p adjusted by Holm over every exploratory row with a p, what a "
                  "sentence reading them together uses). estimate = our value (acceptance length on "
                  f"{ds} unless the claim says otherwise); t [estimate_tlo, estimate_thi] = 95% t-interval over the "
                  "top level's units (realizations when there are several, else seeds); [estimate_lo, estimate_hi] = "
                  "hierarchical bootstrap 95% CI — the same interval the acceptance and pairwise tables print for the "
                  "same contrast; by_realization = each realization's own value (throughput: its timing repeats)."
                  + (" One realization: every verdict is within it." if n_realizations(art) == 1 else ""))


def fmt_estimate(r) -> str:
    """'+0.659 t [+0.324, +0.994]; bootstrap [+0.540, +0.810]' (the t-interval first), in the row's unit."""
    out = f"{r.estimate:+.3f}{T.text_cell(r.unit, ' ')}"
    if not pd.isna(r.estimate_tlo):
        out += f" t [{r.estimate_tlo:+.3f}, {r.estimate_thi:+.3f}]"
    if not pd.isna(r.estimate_lo):
        out += f"; bootstrap [{r.estimate_lo:+.3f}, {r.estimate_hi:+.3f}]"
    return out


def claims_lines(art: Artifacts, df: pd.DataFrame | None = None) -> list[str]:
    """The claims table as markdown and the verdicts in words (`df`: claims(art), computed here when not given)."""
    df = claims(art) if df is None else df
    if df is None:
        return []
    out = ["| family | claim | T | ours | by realization | test | verdict |", "|---|---|---|---|---|---|---|"]
    last = None
    m = int(df.holm_p.notna().sum()) if "holm_p" in df else 0
    for r in df.itertuples():
        holm = getattr(r, "holm_p", math.nan)
        test = r.test + (f"; Holm p = {holm:.3g} over the {m} exploratory rows" if not pd.isna(holm) else "")
        out.append(f"| {r.family} | {r.claim if r.claim != last else '〃'} | {r.temperature:g} | {fmt_estimate(r)} | "
                   f"{r.by_realization or '—'} | {test} | **{r.verdict}**{size_words(r)} |")
        last = r.claim
    return out + ["", *verdict_lines(df)]


def size_words(r) -> str:
    """'; <the row's magnitude sentence>' for a claims row that has one, else ''."""
    return T.text_cell(getattr(r, "magnitude", ""), "; ")


def claim_label(claim: str) -> str:
    """A claims-table row's claim in a few words: the text before its pair (": `a` − `b`"), without parentheses,
    after the dash of a quoted claim ("Nov 9: 「…」 — the zero-initialised residual (…) performs close to direct
    fusion" -> "the zero-initialised residual performs close to direct fusion")."""
    head = claim.rsplit(": ", 1)[0] if ": `" in claim else claim
    head = head.split(" — ", 1)[1] if " — " in head else head
    while re.search(r"\([^()]*\)", head):
        head = re.sub(r"\s*\([^()]*\)", "", head)
    return head.strip()


def label_at(r) -> str:
    """A claims row's claim in a few words (`claim_label`) at its temperature, unless the words name one."""
    label = claim_label(r.claim)
    return label if "T = " in label else f"{label} at T = {r.temperature:g}"


def verdict_lines(df: pd.DataFrame) -> list[str]:
    """The claims table in words, per family: each verdict a bullet, its claims under it (each at its T, with our
    estimate), and for a claim of a direction not resolved whether every realization's own value has its sign, the
    opposite sign, or mixed signs."""
    out = []
    for fam, title in ((PRIMARY_FAMILY, "Primary family (pre-registered, Holm over its claims)"),
                       (EXPLORATORY, "Exploratory (each at its unadjusted level; no claim is decided)")):
        g = df[df.family == fam] if "family" in df else df
        if not len(g):
            continue
        groups: dict[str, list[str]] = {}
        for r in g.itertuples():
            pos, neg = int(r.n_realizations_claim_sign), int(r.n_realizations_opposite_sign)
            sign = ""
            if "not resolved" in r.verdict and r.kind == "direction" and pos + neg > 1:
                sign = ("; the claim's sign in every realization" if neg == 0 else
                        "; the opposite sign in every realization" if pos == 0 else "; the realizations differ in sign")
            groups.setdefault(r.verdict, []).append(f"{label_at(r)} ({r.estimate:+.3f}{T.text_cell(r.unit, ' ')}{sign}"
                                                    f"{size_words(r)})")
        out += [f"{title}:", ""]
        for v, items in groups.items():
            out += [f"- **{v}**:", *[f"  - {x}" for x in items]]
        out.append("")
    return out
