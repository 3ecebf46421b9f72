"""REPORT.md's findings, from the rendered tables: the claims table, the acceptance table with its rankings, the
control, the out-of-distribution comparison, ceilings, learning curves, the throughput and cost-model sentences, and
the listing of requests without a verify round.

Wording rules. A ranking "a > b" is written only where the pairwise verdict carries it (tables/pairwise_T<t>.csv,
`stats.holm_family`): the hierarchical bootstrap and the t-test at the top level both reject after Holm over the
dataset's whole family (every pair at every temperature), and with several realizations every realization's own
difference has that sign. Every other pair is "not resolved": a non-rejection is never called equal. A claim of
closeness ("close", the Nov 9 note) is tested as one: two one-sided tests (TOST) against a stated margin
(`CLOSE_MARGIN_PCT` of the reference row), Holm over the claim's temperatures. Nothing is called "best".

    from dmtp.analysis.report import load, tables, summary
    art = load("mini"); tables.render(art); print("\n".join(summary.findings(art)))
"""
from __future__ import annotations

import math
import re

import pandas as pd

from dmtp.analysis import reference as R
from dmtp.analysis import stats as S
from dmtp.analysis.ratios import speedup_goal
from dmtp.analysis.report import bench as B
from dmtp.analysis.report import tables as T
from dmtp.analysis.report.data import Artifacts, paired_runs, per_unit, summarize
from dmtp.config.engine import describe_variant

# "close" = |a - b| below this share of b's acceptance length. The blog states no margin; 2 % is the size of the
# gaps between neighbouring variants that its Code ablation reports as differences (mask_residual +1.92 %,
# t1_residual +2.48 % over token_only) and about a tenth of DMTP's gain over DFlash there.
CLOSE_MARGIN_PCT = 2.0
VERDICT = {1: "holds", -1: "fails", 0: "not resolved"}


def ci(v: float, lo: float, hi: float, signed: bool = False) -> str:
    """'3.120 [3.010, 3.230]' (signed: '+0.120 [-0.010, +0.230]'); '—' for nan."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    f = "+.3f" if signed else ".3f"
    return f"{v:{f}} [{lo:{f}}, {hi:{f}}]"


def both(r: dict, signed: bool = True) -> str:
    """'+0.120 [+0.05, +0.19] t [+0.01, +0.23]': a difference with its bootstrap and t-intervals."""
    out = ci(r["diff"], r["diff_lo"], r["diff_hi"], signed)
    if not pd.isna(r.get("diff_tlo", math.nan)):
        out += f" t [{r['diff_tlo']:+.3f}, {r['diff_thi']:+.3f}]"
    return out


def direction(verdict: str) -> int:
    """+1 for 'a > b', -1 for 'a < b', 0 for 'not resolved' (or no data)."""
    return 1 if " > " in verdict else -1 if " < " in verdict else 0


def acceptance_table(art: Artifacts, dataset: str) -> list[str]:
    """Compared rows x temperatures: acceptance length [95% bootstrap CI] t [95% t-interval], units."""
    s = art.natural
    s = s[(s.experiment == "ablation") & (s.dataset == dataset)]
    temps = sorted(set(s.temperature))
    rows = [m for m in art.spec.runs() if m in set(s.method)] + sorted(set(s.method) - set(art.spec.runs()))
    out = ["| method | group | realizations x seeds | " + " | ".join(f"T={t:g}" for t in temps) + " |",
           "|---|---|---|" + "---|" * len(temps)]
    for m in rows:
        g = s[s.method == m].set_index("temperature")

        def cell(t):
            if t not in g.index:
                return "—"
            r = g.loc[t]
            tci = f" t [{r.acceptance_length_tlo:.3f}, {r.acceptance_length_thi:.3f}]" \
                if not pd.isna(r.acceptance_length_tlo) else ""
            return ci(r.acceptance_length, r.acceptance_length_lo, r.acceptance_length_hi) + tci
        out.append(f"| {m} | {art.spec.group(m)} | {int(g.n_realizations.max())} x {int(g.n_seeds.max())} | "
                   + " | ".join(cell(t) for t in temps) + " |")
    return out


def rankings(art: Artifacts, t: float, dataset: str) -> str:
    """The resolved orderings at T (the pairwise verdicts) and how many pairs are not resolved."""
    path = art.tables / f"pairwise_T{t:g}.csv"
    if not path.exists():
        return ""
    df = pd.read_csv(path)
    df = df[df.dataset == dataset]
    above: dict[str, list[str]] = {}  # winner -> the rows it is resolved above
    for r in df.itertuples():
        d = direction(r.verdict)
        if d:
            hi, lo = (r.a, r.b) if d > 0 else (r.b, r.a)
            above.setdefault(hi, []).append(lo)
    n = len(df) - sum(map(len, above.values()))
    won = [f"{m} > " + ", ".join(sorted(above[m], key=art.rank)) for m in sorted(above, key=art.rank)]
    rest = f"the other {n} of {len(df)} pairs are not resolved" if n else "every pair resolved"
    return f"- T={t:g}: " + ("; ".join(won) + f"; {rest}." if won else f"no pair is resolved ({len(df)} pairs).")


def scope(art: Artifacts) -> str:
    """What the rankings can claim: across realizations (and what 2-3 of them can resolve) or within one."""
    n = len(art.realizations)
    names = ", ".join(r.name for r in art.realizations)
    if n == 1:
        s = art.natural
        seeds = int(s.n_seeds.max()) if len(s) else 1
        level = (f"seed-level t-tests ({seeds} seeds: a difference must exceed {S.t_quantile(seeds):.2f} standard "
                 "errors of the seed means, more after Holm's correction)" if seeds > 1 else
                 "request-level tests (one drafter seed)")
        return (f"**1 realization ({names}): rankings are within-realization** — they hold for this target and its "
                f"on-policy data, and another realization may not reproduce them. Inference: {level} beside the "
                "bootstrap over seeds and requests.")
    return (f"**{n} realizations ({names}), pooled**: a ranking is worded only where it holds across realizations — "
            f"the realization-level paired t-test (Holm) and the hierarchical bootstrap both reject, and every "
            f"realization's own difference has the same sign. With {n} realizations the t-test has {n - 1} degree(s) "
            f"of freedom: a difference is resolved only when it exceeds {S.t_quantile(n):.2f} standard errors of the "
            "realization means (more after Holm's correction), i.e. when it is large and consistent against the "
            "spread between realizations; a "
            "difference of the size of that spread cannot be resolved, whatever the seeds and requests show.")


# --- the claims table -----------------------------------------------------------------------------------------------
def blog_claims(art: Artifacts) -> list[tuple[str, str, str]]:
    """(a, b, the blog's claim "a > b"): each of the blog's DMTP claims (single-anchor fusion = the spec's blog run) as
    the pair of our rows that tests it."""
    sp = art.spec
    dmtp, dflash, ref = sp.blog_run, sp.drafter_baseline, sp.reference
    ab = R.table("ablation").set_index("method").acceptance_length
    he = R.table("open_repro").set_index("dataset").loc["HumanEval"]
    code = f"Code ablation {ab.get(dmtp, math.nan):.3f} vs {ab.get(dflash, math.nan):.3f}"
    claims = [
        (dmtp, dflash, f"DMTP > DFlash ({code}; open reproduction HumanEval {he.dmtp:.3f} vs {he.dflash:.3f}, "
                       f"+{he.dmtp_vs_dflash_pct:.2f} %)"),
        (dmtp, "mtp", f"DMTP > MTP415 (open reproduction HumanEval {he.dmtp:.3f} vs {he.mtp:.3f})"),
        (dflash, "mtp", f"DFlash > MTP415 on code (open reproduction HumanEval {he.dflash:.3f} vs {he.mtp:.3f})"),
        (dmtp, ref, f"{dmtp} > {ref} (Code ablation +{R.ablation_value(dmtp, f'rel_to_{ref}_pct'):.2f} %)"),
    ]
    return [(a, b, c) for a, b, c in claims if a and b and a != b]


def who(art: Artifacts) -> str:
    """Which of our rows the blog's DMTP numbers are set beside, and why."""
    sp = art.spec
    if sp.blog_method and sp.blog_method != sp.main_method:
        return (f"Every DMTP number of the blog comes from single-anchor fusion, so they are set beside "
                f"`{sp.blog_run}`; the current main method `{sp.main_method}` has no number of its own in the blog (its "
                "statements about it: dmtp/analysis/reference.json `main_method`).")
    return (f"This experiment's spec names no `blog_method`, so the blog's DMTP numbers are set beside the main method "
            f"`{sp.blog_run}` (experiment.json written before `ablation.blog_method` existed: re-run the pipeline's "
            "tables stage to write it).")


def close_claim(art: Artifacts) -> tuple[str, str, str] | None:
    """The Nov 9 note: the main method performs close to direct fusion (the blog run)."""
    sp = art.spec
    if not sp.main_method or sp.main_method == sp.blog_run:
        return None
    return (sp.main_method, sp.blog_run, "Nov 9: 「零初始化残差与直接融合的效果接近」 — the zero-initialised residual (the "
            "current main method) performs close to direct fusion")


def _row(claim: str, t, r: dict, test: str, verdict: int, kind: str = "direction", unit: str = "") -> dict:
    """A claims-table row. `kind`: "direction" (a > b, positive = the claim's sign) or "closeness" (TOST: no sign);
    `unit`: the estimate's ("" or "%"); n_realizations_claim_sign / n_realizations_opposite_sign: how many
    realizations' own values (`signs`, shown in by_realization) have the claim's sign and the opposite one."""
    signs = [float(x) for x in r.get("signs", []) if not pd.isna(x)]
    return {"claim": claim, "temperature": t, "estimate": r["diff"], "estimate_lo": r["diff_lo"],
            "estimate_hi": r["diff_hi"], "estimate_tlo": r.get("diff_tlo", math.nan),
            "estimate_thi": r.get("diff_thi", math.nan), "by_realization": T.signs_text(r.get("signs", [])),
            "test": test, "verdict": VERDICT[verdict], "kind": kind, "unit": unit,
            "n_realizations_claim_sign": sum(x > 0 for x in signs),
            "n_realizations_opposite_sign": sum(x < 0 for x in signs)}


def order_rows(art: Artifacts, dataset: str, temps) -> list[dict]:
    """Each "a > b" claim (the blog's, then the control's) at each T: the pairwise rows' own p-values, Holm over this
    family of pre-specified comparisons (the claims table's sentence reads no other), worded as `stats.holm_family`
    does: holds / fails where both tests resolve the claim's direction and every realization agrees, else not
    resolved."""
    pairs = blog_claims(art) + [(a, b, f"control: {a} > {b} (what the MTP hidden adds)")
                                for a, b, _ in control_pairs(art)]
    got = [(text, t, r) for a, b, text in pairs for t in temps if (r := T.pair_row(art, a, b, t, dataset))]
    fam = S.holm_family([dict(r, p=r["diff_p"], t_p=r["t_p"]) for _, _, r in got])
    return [_row(f"{text}: `{r['a']}` − `{r['b']}`", t, r,
                 f"paired; Holm p = {r['p_holm']:.3g} (bootstrap) / {r['t_p_holm']:.3g} (t over {r['t_level']}s) "
                 f"over these {len(fam)} comparisons", direction(r["verdict"])) for (text, t, _), r in zip(got, fam)]


def close_rows(art: Artifacts, dataset: str, temps, n_boot: int = 2000) -> list[dict]:
    """The closeness claim at each T: TOST against ±CLOSE_MARGIN_PCT % of b (the bootstrap's and the top-level t's
    one-sided tests, the larger p, Holm over the temperatures): holds when it rejects; fails when both 95% intervals
    lie outside the margin; else not resolved."""
    c = close_claim(art)
    if c is None:
        return []
    a, b, text = c
    s = art.natural.set_index(["experiment", "dataset", "temperature", "method"])
    got = []
    for t in temps:
        if ("ablation", dataset, t, b) not in s.index or ("ablation", dataset, t, a) not in s.index:
            continue
        m = CLOSE_MARGIN_PCT / 100 * s.loc[("ablation", dataset, t, b), "acceptance_length"]
        r = paired_runs(art, ("ablation", dataset, t), a, b, n_boot, margin=m)
        p = max(r["tost_p"], r["tost_t_p"]) if not pd.isna(r["tost_t_p"]) else r["tost_p"]
        got.append((t, m, r, p))
    out = []
    for (t, m, r, _), q in zip(got, S.holm([p for *_, p in got])):
        far = all(not pd.isna(lo) and (lo > m or hi < -m) for lo, hi in ((r["lo"], r["hi"]), (r["t_lo"], r["t_hi"]))
                  if not pd.isna(hi))
        v = 1 if q < S.LEVEL else -1 if far else 0
        r = dict(r, diff_lo=r["lo"], diff_hi=r["hi"], diff_tlo=r["t_lo"], diff_thi=r["t_hi"])
        out.append(_row(f"{text}: `{a}` − `{b}`", t, r, f"TOST within ±{m:.3f} ({CLOSE_MARGIN_PCT:g} % of `{b}`), "
                        f"Holm p = {q:.3g} over {len(got)} temperatures", v, kind="closeness"))
    return out


def first_rate(g: pd.DataFrame) -> pd.DataFrame:
    """The request rows with `first_rate` = rounds accepting >= 1 draft / rounds (nan: no round)."""
    return g.assign(first_rate=g.first_hits / g.n_rounds.where(g.n_rounds > 0))


def ood_gaps(art: Artifacts, a: str = "mtp", b: str | None = None, n_boot: int = 4000) -> dict | None:
    """The out-of-distribution comparison at T = 0, seed 0: per set (HumanEval, each `eval.ood` set) the paired
    gap a - b of per-request first-token acceptance, and the difference in differences (ood minus HumanEval) over
    the realizations both sets have (stats.did). None without an ood set holding both runs."""
    b = b or art.spec.drafter_baseline
    r = first_rate(art.runs)
    r = r[(r.experiment == "ablation") & (r.temperature == 0) & (r["mode"] == "natural") & (r.seed == 0)]
    for ood in art.ood or {}:
        per = {}  # dataset -> ({realization: row of the cubes}, cubes)
        for ds in ("humaneval", ood):
            units = {m: per_unit(r[(r.dataset == ds) & (r.method == m)], "first_rate") for m in (a, b)}
            if all(units.values()):
                cubes, layout, _ = S.matrices(units)
                per[ds] = ({k: i for i, (k, _) in enumerate(layout)}, cubes)
        if len(per) < 2:
            continue
        common = sorted(set(per["humaneval"][0]) & set(per[ood][0]))
        gap = {ds: S.paired(c[a], c[b], n_boot=n_boot) for ds, (_, c) in per.items()}
        d = {ds: (c[a] - c[b])[[idx[k] for k in common], 0] for ds, (idx, c) in per.items()}
        return {"a": a, "b": b, "ood": ood, "gap": gap, "did": S.did(d[ood], d["humaneval"], n_boot)}
    return None


def ood_rows(art: Artifacts) -> list[dict]:
    g = ood_gaps(art)
    if g is None:
        return []
    r = g["did"]
    v = direction(S.verdict("x", "y", r["diff"], max(r["p"], r["t_p"]), same_sign=S.agree(r["signs"], r["diff"])))
    r = dict(r, diff_lo=r["lo"], diff_hi=r["hi"], diff_tlo=r["t_lo"], diff_thi=r["t_hi"])
    return [_row(f"the native MTP head's first-token advantage is largest outside the drafter's training "
                 f"distribution: (`{g['a']}` − `{g['b']}`) on {g['ood']} minus on humaneval (first-token acceptance, "
                 "per request, seed 0)", 0.0, r, f"difference in differences, t over {r['t_level']}s", v)]


MIN_REPEATS = 3  # a throughput claim is judged on at least this many repeats (all of one sign: p = 1/8 one-sided)


def throughput_rows(art: Artifacts) -> list[dict]:
    """The blog's B32 claim (DMTP's tok/s gain over DFlash, T = 1): our gain at T = 1 and the largest timed cap,
    every repeat of every realization: holds when every one is a gain, fails when none is, else not resolved; with
    fewer than MIN_REPEATS repeats, not resolved whatever their sign (one repeat of a B32 group says little)."""
    tab = T.throughput_table(art)
    sp = art.spec
    if tab is None or not sp.main_method:
        return []
    df = tab[(tab.method == sp.main_method) & (tab.temperature == 1) & tab.gain_pct.notna()]
    df = T.headline_throughput(df)
    blog = R.table("throughput").set_index(["workload", "method"]).tok_per_s
    out = []
    for r in df[df.batch_cap == df.batch_cap.max()].itertuples() if len(df) else []:
        w = R.workload(r.dataset)
        text = (f"DMTP's end-to-end gain over DFlash at B32, T = 1 (blog {w}: {blog[w, 'dflash']:.0f} → "
                f"{blog[w, 'dmtp']:.0f} tok/s, {T.pct(blog[w, 'dmtp'], blog[w, 'dflash']):+.2f} %, 35B on 4xH200)"
                if (w, "dmtp") in blog.index else "DMTP's end-to-end gain over DFlash, T = 1")
        mine = tab[(tab.method == sp.main_method) & (tab.temperature == 1) & (tab.batch_cap == r.batch_cap)
                   & (tab.dataset == r.dataset) & (tab.realization != "all")]
        v = 0 if r.n_repeats < MIN_REPEATS else 1 if r.gain_pct_lo > 0 else -1 if r.gain_pct_hi < 0 else 0
        out.append(_row(f"{text}: `{sp.main_method}` vs `{sp.drafter_baseline}` tok/s (%), B{r.batch_cap}", 1.0,
                        {"diff": r.gain_pct, "diff_lo": r.gain_pct_lo, "diff_hi": r.gain_pct_hi,
                         "signs": list(mine.gain_pct)},
                        f"median [min, max] of {r.n_repeats} repeat{'s' * (r.n_repeats != 1)}; holds if every "
                        f"repeat gains, of at least {MIN_REPEATS}", v, unit="%"))
    return out


def claims(art: Artifacts) -> pd.DataFrame | None:
    """tables/claims: every blog claim we test, our estimate with its intervals and each realization's value, the
    test, and whether it holds, fails or is not resolved (the module docstring's rules)."""
    prim = T.primary(art)
    if not prim:
        return None
    ds = prim[0]
    s = art.natural
    temps = sorted(set(s[(s.experiment == "ablation") & (s.dataset == ds)].temperature))
    rows = order_rows(art, ds, temps) + close_rows(art, ds, temps) + ood_rows(art) + throughput_rows(art)
    if not rows:
        return None
    return T.save(art, "claims", pd.DataFrame(rows), "The blog's claims and the control",
                  f"estimate = our difference (acceptance length on {ds} unless the claim says "
                  "otherwise) [hierarchical bootstrap 95% CI] t [95% t-interval at the top level]; by_realization = "
                  "each realization's own value. holds / fails: the test resolves the claim's direction (or, for "
                  "'close', shows equivalence within the stated margin / shows the difference outside it); not "
                  "resolved: it does neither.")


def claims_lines(art: Artifacts) -> list[str]:
    df = claims(art)
    if df is None:
        return []
    out = ["| claim | T | ours | by realization | test | verdict |", "|---|---|---|---|---|---|"]
    last = None
    for r in df.itertuples():
        est = both({"diff": r.estimate, "diff_lo": r.estimate_lo, "diff_hi": r.estimate_hi,
                    "diff_tlo": r.estimate_tlo, "diff_thi": r.estimate_thi})
        out.append(f"| {r.claim if r.claim != last else '〃'} | {r.temperature:g} | {est} | "
                   f"{r.by_realization or '—'} | {r.test} | **{r.verdict}** |")
        last = r.claim
    return out + ["", *verdict_lines(df), ""]


def claim_label(claim: str) -> str:
    """A claims-table row's claim in a few words: the text before its pair (": `a` − `b`"), without parentheses,
    after the dash of a quoted claim ("Nov 9: 「…」 — the zero-initialised residual (…) performs close to direct
    fusion" -> "the zero-initialised residual performs close to direct fusion")."""
    head = claim.rsplit(": ", 1)[0] if ": " in claim else claim
    head = head.split(" — ", 1)[1] if " — " in head else head
    return re.sub(r"\s*\([^()]*\)", "", head).strip()


def verdict_lines(df: pd.DataFrame) -> list[str]:
    """The claims table in words: which claims hold, which fail, which are not resolved (each at its T, with our
    estimate), and for a claim of a direction not resolved whether every realization's own value has its sign, the
    opposite sign, or mixed signs (a closeness claim has no sign to read)."""
    groups = {}
    for r in df.itertuples():
        pos, neg = int(r.n_realizations_claim_sign), int(r.n_realizations_opposite_sign)
        sign = ""
        if r.verdict == VERDICT[0] and r.kind == "direction" and pos + neg > 1:
            sign = ("; the claim's sign in every realization" if neg == 0 else
                    "; the opposite sign in every realization" if pos == 0 else "; the realizations differ in sign")
        label = claim_label(r.claim)
        at = "" if "T = " in label else f" at T = {r.temperature:g}"
        unit = f" {r.unit}" if isinstance(r.unit, str) and r.unit else ""
        groups.setdefault(r.verdict, []).append(f"{label}{at} ({r.estimate:+.3f}{unit}{sign})")
    return ["In words (each row above at its temperature; the estimate in parentheses): "
            + " ".join(f"**{v}**: " + ("; ".join(groups[v]) if v in groups else "none") + "."
                       for v in (VERDICT[1], VERDICT[-1], VERDICT[0]))]


# --- the other findings ---------------------------------------------------------------------------------------------
def control_pairs(art: Artifacts) -> list[tuple[str, str, str]]:
    """The main method against each control run, with what the control isolates."""
    sp = art.spec
    return [(sp.main_method, c, f"The control `{c}` is `{sp.main_method}` without what the main method adds "
             "(`double_anchor_token_only` = [A, E(T1), MASK x 6] without the MTP hidden, exactly `zero_init_residual` "
             "at initialisation): their difference isolates the effect of the MTP hidden")
            for c in sp.controls if sp.main_method and c != sp.main_method]


def ood_lines(art: Artifacts) -> list[str]:
    """Acceptance and first-token acceptance in and out of distribution (tables/ood.csv) and the gaps."""
    ood = art.ood or {}
    r = art.runs
    r = r[(r.experiment == "ablation") & (r.temperature == 0) & (r["mode"] == "natural") & (r.seed == 0)
          & r.dataset.isin(["humaneval", *ood]) & r.method.isin({m for runs in ood.values() for m in runs})]
    if r.empty or not set(ood) & set(r.dataset):
        return []
    s = summarize(r, spec=art.spec)
    df = s[s.k > 0][["dataset", "method", "n_realizations", "n_requests", "acceptance_length", "acceptance_length_lo",
                     "acceptance_length_hi", "acceptance_length_tlo", "acceptance_length_thi", "first_token",
                     "first_token_lo", "first_token_hi"]].reset_index(drop=True)
    T.save(art, "ood", df, "In and out of distribution (T = 0, natural mode, drafter seed 0)",
           "humaneval: the usual evaluation set; "
           + ", ".join(f"{o}: module-level test functions of the corpus's train split (the target pretrained on "
                       "them, the drafters' on-policy prompts never hold a test file; docs/DESIGN.md)" for o in ood)
           + ". Intervals as in the ablation table.")
    out = [f"In and out of distribution (T = 0, seed 0; tables/ood.csv): {', '.join(f'`{o}`' for o in ood)} holds "
           "test functions of the corpus — pretrained on by the target, never in the drafters' data.", "",
           T.to_markdown(df.drop(columns=["acceptance_length_tlo", "acceptance_length_thi"]))]
    g = ood_gaps(art)
    if g:
        gaps = "; ".join(f"{ds}: {ci(x['diff'], x['lo'], x['hi'], True)}" for ds, x in g["gap"].items())
        d = g["did"]
        out += [f"First-token gap `{g['a']}` − `{g['b']}` (per-request rate, paired): {gaps}; {g['ood']} minus "
                f"humaneval: {ci(d['diff'], d['lo'], d['hi'], True)} t [{d['t_lo']:+.3f}, {d['t_hi']:+.3f}] "
                f"(p = {d['p']:.3g} bootstrap, {d['t_p']:.3g} t over {d['t_level']}s).", ""]
    return out


def ceiling_lines(art: Artifacts) -> list[str]:
    out = []
    for p in sorted(art.tables.glob("ceiling_T*.csv")):
        df = pd.read_csv(p)
        for ds, g in df.groupby("dataset"):
            c = g[g.source == "ceiling"].iloc[0]
            m = g[g.source == "measured"].sort_values("per_verify", ascending=False)
            if len(m):
                top = m.iloc[0]
                first = g[g.source == "measured"].sort_values("P1", ascending=False).iloc[0]
                out.append(f"- T={c.temperature:g} ({ds}): the oracle profile along the `ar` path gives 1 + Σ C_j = "
                           f"{c.per_verify:.3f}, with C_1 = {c.P1:.1f} % (a strict bound on first-token acceptance; "
                           f"highest measured: {first.P1:.1f} %, {first.method}); the highest measured per-verify tau "
                           f"is {top.per_verify:.3f} ({top.method}), {top.of_ceiling_pct:.0f} % of the way from 1 to "
                           "1 + Σ C_j.")
    return out


def curve_lines(art: Artifacts) -> list[str]:
    p = art.tables / "learning_curve.csv"
    if not p.exists():
        return []
    df = pd.read_csv(p, dtype={"seed": str})
    pooled = df[(df.seed == "all") & (df.method != "mtp")]
    out = []
    for m in sorted(set(pooled.method), key=art.rank):
        g = pooled[pooled.method == m].sort_values("train_tokens")
        a, b = g.iloc[0], g.iloc[-1]
        out.append(f"- `{m}`: {ci(a.acceptance_length, a.lo, a.hi)} at {a.train_tokens / 1e6:.2f} M tokens → "
                   f"{ci(b.acceptance_length, b.lo, b.hi)} at {b.train_tokens / 1e6:.2f} M tokens "
                   f"({len(g)} budgets).")
    inc = art.tables / "curve_increments.csv"
    for r in (pd.read_csv(inc).itertuples() if inc.exists() else ()):
        resolved = r.p_holm < S.LEVEL and r.t_p_holm < S.LEVEL
        out.append(f"- `{r.method}`, the last increment (step {r.from_step} → {r.to_step}): "
                   f"{ci(r.diff, r.lo, r.hi, signed=True)} (bootstrap Holm p = {r.p_holm:.3g}, t over "
                   f"{r.n_units} {r.t_level}s Holm p = {r.t_p_holm:.3g}): "
                   + ("still rising." if resolved and r.diff > 0 else "a fall." if resolved else
                      "not resolved (not evidence that the curve has flattened, nor that it still rises)."))
    ref = df[(df.method == "mtp") & df.step.isna()]
    if len(ref):
        r = ref.iloc[0]
        out.append(f"- native MTP415 (reference line): {ci(r.acceptance_length, r.lo, r.hi)}.")
    return out + gap_lines(art)


def gap_lines(art: Artifacts) -> list[str]:
    """The curve's two questions: does the gain over the drafter baseline shrink as the drafters mature, and where
    does the baseline meet the native MTP head (tables/curve_gaps.csv)."""
    p = art.tables / "curve_gaps.csv"
    if not p.exists():
        return []
    df = pd.read_csv(p, dtype={"step": str})
    base, out = art.spec.drafter_baseline, []
    per = df[df.step != "change"].copy()
    per["k"] = per.step.astype(float)
    for m, g in per[per.method != base].groupby("method", sort=False):
        g = g.sort_values("k")
        out.append(f"- `{m}` − `{base}` by budget: " + "; ".join(
            f"{r.train_tokens / 1e6:.1f} M tokens {ci(r.vs_base, r.vs_base_lo, r.vs_base_hi, signed=True)} "
            f"({r.vs_base_pct:+.1f} %)" for r in g.itertuples()) + ".")
    for r in df[df.step == "change"].itertuples():
        resolved = r.vs_base_p_holm < S.LEVEL and r.t_p_holm < S.LEVEL
        verdict = ("it shrinks" if r.vs_base < 0 else "it grows") if resolved else "not resolved"
        out.append(f"- Change of `{r.method}`'s gain from step {int(r.from_step)} to {int(r.to_step)}: "
                   f"{ci(r.vs_base, r.vs_base_lo, r.vs_base_hi, signed=True)} (bootstrap Holm p = "
                   f"{r.vs_base_p_holm:.3g}, t over {r.t_level}s Holm p = {r.t_p_holm:.3g}): {verdict}.")
    b = per[per.method == base].sort_values("k")
    if "vs_mtp" in b and b.vs_mtp.notna().any():
        met = b[b.vs_mtp_hi >= 0]
        out.append(f"- `{base}` − MTP415 by budget: " + "; ".join(
            f"{r.train_tokens / 1e6:.1f} M {ci(r.vs_mtp, r.vs_mtp_lo, r.vs_mtp_hi, signed=True)}"
            for r in b.itertuples()) + (f". Its interval first reaches 0 at {met.train_tokens.iloc[0] / 1e6:.1f} M "
                                        "tokens." if len(met) else ": below the native head at every budget."))
    return out


def findings(art: Artifacts) -> list[str]:
    """REPORT.md's first section: the claims table, then per primary dataset the acceptance table, the rankings
    and the control; the out-of-distribution comparison; the ceilings; the learning curve."""
    prim = T.primary(art)
    if not prim:
        return []
    out = ["## What was found", "", T.made_by(art), "", scope(art), "",
           "### The blog's claims and the control (tables/claims.csv)", "",
           who(art), "", *claims_lines(art), *[f"- {text}." for _, _, text in control_pairs(art)], ""]
    heads = sorted(art.figures.glob("main_acceptance_T*.png"), key=lambda p: float(p.stem.rpartition("_T")[2]))
    if heads:
        out += [f"![{heads[0].stem}](figures/{heads[0].name})", ""]
    for ds in prim:
        s = art.natural
        temps = sorted(set(s[(s.experiment == "ablation") & (s.dataset == ds)].temperature))
        out += [f"### Acceptance length on `{ds}`", "", "Mode natural; incl. bonus; realizations and seeds pooled; "
                "[95% hierarchical bootstrap CI over realizations, seeds and requests] t [95% t-interval over the "
                "top level's units]:", "", *acceptance_table(art, ds), "",
                "Rankings, only as far as the pairwise verdicts carry them (tables/pairwise_T*.csv):", "",
                *filter(None, (rankings(art, t, ds) for t in temps)), ""]
    out += ood_lines(art)
    cl = ceiling_lines(art)
    if cl:
        out += ["At T > 0 (tables/ceiling_T*.csv):", "", *cl, ""]
    cv = curve_lines(art)
    if cv:
        out += ["Learning curve (HumanEval, T=0; first → last budget, realizations and seeds pooled):", "", *cv, ""]
    z = T.zero_rounds(art)
    n = 0 if z is None else len(z)
    out += [f"Requests without a verify round (first token ended them): {n}" + (" — listed below." if n else "."),
            ""]
    return out


def throughput_lines(art: Artifacts) -> list[str]:
    """The throughput section's sentences: per (T, cap), DMTP's tok/s gain over DFlash against its per-verify gain;
    the table (tables/throughput.md) follows them."""
    df = T.throughput_table(art)
    sp = art.spec
    if df is None:
        return []
    out = []
    pooled = T.headline_throughput(df)
    for r in pooled[(pooled.method == sp.main_method) & pooled.gain_pct.notna()].itertuples():
        bound = _decode_only(art, r.realization, r.batch_cap, sp.main_method, sp.drafter_baseline,
                             1 + r.per_verify_gain_pct / 100)
        dev = getattr(r, "device", "")
        on = f", {dev}" if isinstance(dev, str) and dev else ""
        out.append(f"- T={r.temperature:g}, B{r.batch_cap} ({r.realization}{on}, {r.n_repeats} repeats): "
                   f"`{sp.main_method}` {r.tok_per_s:.0f} tok/s, {r.speedup:.2f}x AR [{r.speedup_lo:.2f}, "
                   f"{r.speedup_hi:.2f}]" + workload_words(r)
                   + f"; tok/s gain over `{sp.drafter_baseline}` {r.gain_pct:+.1f} % "
                   f"[{r.gain_pct_lo:+.1f}, {r.gain_pct_hi:+.1f}] against a per-verify gain of "
                   f"{r.per_verify_gain_pct:+.1f} % (ratio {r.gain_over_per_verify:.2f})"
                   + (f"; blog (35B, 4xH200 TP4, SGLang): {r.blog_gain_pct:+.2f} % tok/s for "
                      f"{r.blog_per_verify_gain_pct:+.2f} % acceptance" if not pd.isna(r.blog_gain_pct) else "")
                   + bound + need_line(r, pooled) + ".")
    for r in pooled[pooled.method.astype(str).str.contains("@")].itertuples():
        name, _, variant = r.method.partition("@")
        base = pooled[(pooled.method == name) & (pooled.realization == r.realization)
                      & (pooled.temperature == r.temperature) & (pooled.batch_cap == r.batch_cap)]
        if len(base):
            try:
                how = describe_variant(variant)
            except ValueError:  # a variant of another version of the bench: its name says what it was
                how = f"the settings `{variant}`"
            out.append(f"- T={r.temperature:g}, B{r.batch_cap} ({r.realization}): `{r.method}` (the same server with "
                       f"{how}, timed side by side) {r.tok_per_s:.0f} tok/s against "
                       f"{base.tok_per_s.iloc[0]:.0f}, {r.speedup:.2f}x AR against {base.speedup.iloc[0]:.2f}x.")
    return out


def workload_words(r) -> str:
    """' (outputs: 14 of 16 requests equal to AR's, +26.5 % tokens against AR's; on AR's outputs ~2.13x [..],
    estimated)' for a T = 0 throughput row whose outputs left AR's at bf16 ties (`bench.throughput`'s equal_ar,
    tokens_vs_ar_pct, speedup_on_ar_outputs), else ''."""
    eq, req = getattr(r, "equal_ar", math.nan), getattr(r, "requests", math.nan)
    if pd.isna(eq) or pd.isna(req) or eq >= req:
        return ""
    tok = getattr(r, "tokens_vs_ar_pct", math.nan)
    est = getattr(r, "speedup_on_ar_outputs", math.nan)
    return (f" (outputs: {eq:.0f} of {req:.0f} requests equal to AR's"
            + (f", {tok:+.1f} % tokens against AR's" if not pd.isna(tok) else "")
            + (f"; on AR's outputs ~{est:.2f}x [{r.speedup_on_ar_outputs_lo:.2f}, {r.speedup_on_ar_outputs_hi:.2f}], "
               "estimated from its tau on the prefixes shared with them" if not pd.isna(est) else "") + ")")


def need_line(r, pooled: pd.DataFrame) -> str:
    """'; its cost per verify round, measured end to end, is ... AR steps: the goal of ...x would need tau >= ...'
    for a main-method row with a speed-up goal (`ratios.speedup_goal`), or ''. The cost is per-verify tau / speed-up
    (AR emits one token a step), admissions and ride-along rounds included; holding it fixed while tau changes is a
    first-order reading."""
    caps = pooled[pooled.realization == r.realization].batch_cap
    goal = speedup_goal(int(r.batch_cap), int(caps.max()), float(r.temperature)) if len(caps) else None
    if goal is None or not r.speedup > 0 or not r.per_verify > 0:
        return ""
    cost = r.per_verify / r.speedup
    return (f"; its cost per verify round, end to end, is {cost:.2f} AR steps (tau / speed-up), so the {goal:g}x goal "
            f"would need tau >= {goal * cost:.2f} per verify at that cost (it has {r.per_verify:.2f})")


def _decode_only(art: Artifacts, realization: str, cap: int, main: str, base: str, tau_gain: float) -> str:
    """'; with no admission cost ...' from the realization's own round times at this batch (overhead.csv), or ''."""
    ov, k = art.overhead, T.realization_number(realization)
    if ov is None or k is None or "batch" not in ov:
        return ""
    rt = ov[(ov.realization == k) & (ov.stage == "round") & (ov.batch == cap)].set_index("method").ms_per_round
    if main not in rt or base not in rt:
        return ""
    rr = float(rt[main] / rt[base])
    return (f"; with no admission cost its round ratio x{rr:.3f} ({rt[main]:.3f} vs {rt[base]:.3f} ms, trained "
            f"models, batch {cap}) would give a ratio of {B.decode_only_ratio(tau_gain, rr):.2f}")


def _other_device(r) -> str:
    """' (timed on <device>, throughput on <device>)' for a cost-model row whose stage times ran on another kind of
    device than its throughput, else ''."""
    mine, timed = (str(getattr(r, c, "") or "") for c in ("device", "round_times_device"))
    mine, timed = ("" if x == "nan" else x for x in (mine, timed))
    return f" (timed on {timed}, throughput on {mine})" if mine and timed and mine != timed else ""


def costmodel_lines(art: Artifacts) -> list[str]:
    p = art.tables / "costmodel.csv"
    if not p.exists():
        return []
    df = pd.read_csv(p)
    out = []
    m = df[df.kind == "predicted vs measured"]
    if "round_timed_at_cap" not in m:
        m = m.assign(round_timed_at_cap=True)
    hid = m.beside_ms.fillna(0) > 0 if "beside_ms" in m else pd.Series(False, index=m.index)
    not_ar = m.method.str.partition("@")[0] != "ar"  # AR's own rows (plain or a server variant's) are 1 by definition
    for cap, g in m[not_ar].groupby("batch_cap"):
        ok = g[g.round_timed_at_cap.astype(bool)]
        err = ok.error_pct.abs()
        borrowed = sorted({f"{r.realization} with {r.round_times_from}'s" + _other_device(r) for r in g.itertuples()
                           if isinstance(r.round_times_from, str) and r.round_times_from != r.realization}
                          if "round_times_from" in g else ())
        head = (f"error {err.min():.1f}–{err.max():.1f} % (|error|, {len(ok)} method x realization rows whose round "
                f"was timed at B{cap}{'; ' + ', '.join(borrowed) + ' stage times' if borrowed else ''})"
                if len(ok) else f"no method's round was timed at B{cap}")
        out.append(f"- B{cap}: predicted vs measured speed-up over AR, {head}: "
                   + "; ".join(f"`{r.method}` ({r.realization}) {r.predicted_speedup:.2f}x vs {r.measured_speedup:.2f}x"
                               + ("" if r.round_timed_at_cap else " (round not timed at this batch: extrapolated)")
                               for r in g.itertuples()) + ".")
    side = m[hid & not_ar]
    if len(side):  # the prompt passes run beside the decode: charged in full; wholly hidden, the other bound
        err = (100 * (side.predicted_speedup_hidden / side.measured_speedup - 1)).abs()
        out.append(f"- Prompt passes run beside the decode (`engine.admit_beside`) are charged at their full device "
                   f"time (beside_ms); wholly hidden they would give |error| {err.min():.1f}–{err.max():.1f} % "
                   f"({len(side)} rows).")
    pr = df[df.kind.str.startswith("projection")]
    for (kind, cap), g in pr[pr.method != "ar"].groupby(["kind", "batch_cap"], sort=False):
        shape = kind.removeprefix("projection ")
        where = {"8b-shape": "8B shape", "mini-shape": "profile's own shape"}.get(shape, shape)
        out.append(f"- Projection to the {where} (a prediction, not a measurement: random-weight stage times at batch "
                   f"8 used at every batch, decode only, this realization's acceptance), B{cap}: "
                   + "; ".join(f"`{r.method}` ({r.realization}) {r.predicted_speedup:.2f}x AR"
                               for r in g.itertuples()) + ".")
    return out


def zero_round_lines(art: Artifacts) -> list[str]:
    """Every request without a verify round, grouped: one line per (dataset, T, mode, set of ids) naming the runs
    (method, realization and seed) where they occur."""
    z = T.zero_rounds(art)
    if z is None:
        return []
    out = ["## Requests without a verify round", "", T.made_by(art), "",
           "Their first generated token ended them (end-of-text or a stop string): no acceptance length, kept in "
           "every count (n_zero_round). Full list: tables/zero_round.csv.", ""]
    multi = z.realization.nunique() > 1
    for (exp, ds, t, mode), g in z.groupby(["experiment", "dataset", "temperature", "mode"], sort=True):
        by_ids: dict[tuple, list[str]] = {}
        for (m, r, seed), gs in g.groupby(["method", "realization", "seed"], sort=False):
            by_ids.setdefault(tuple(sorted(map(str, gs.id))), []).append(f"{m}@" + (f"r{r}" if multi else "")
                                                                         + f"s{seed}")
        for ids, runs in by_ids.items():
            out.append(f"- {exp}/{ds} T={t:g} {mode}: {', '.join(f'`{i}`' for i in ids)} — in {', '.join(runs)}")
    return out + [""]
