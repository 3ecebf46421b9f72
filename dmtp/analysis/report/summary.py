"""REPORT.md's findings, from the rendered tables: a short claims summary in plain sentences, the claims table
(claims.py: the pre-registered primary family, then the exploratory rows), the acceptance table with its rankings,
the control, the out-of-distribution comparison, ceilings, learning curves, the throughput and cost-model sentences,
and the listing of requests without a verify round.

Wording rules. A claim of the blog is worded as claims.py says: "holds" only for a primary claim on its registered
series with its registered number of realizations; every other row is exploratory ("consistent", "contrary", "not
resolved"), and a claim resting on one realization reads "within one realization". A ranking "a > b" is written
only where the pairwise verdict carries it (tables/pairwise_T<t>.csv, `stats.holm_family`: the pairwise family,
every pair at every temperature of the dataset, Holm over all of them): the hierarchical bootstrap and the t-test at
the top level both reject, and with several realizations every realization's own difference has that sign. Every
other pair is "not resolved": a non-rejection is never called equal. Nothing is called "best". Throughput sentences
are per realization (each realization's own bench, on its own card; repeats are timing repeats of one trained
pair): every pooled realization that timed a throughput row has its own sentence.

    from dmtp.analysis.report import load, tables, summary
    art = load("mini"); tables.render(art); print("\n".join(summary.findings(art)))
"""
from __future__ import annotations

import math

import pandas as pd

from dmtp.analysis import stats as S
from dmtp.analysis.ratios import speedup_goal
from dmtp.analysis.report import bench as B
from dmtp.analysis.report import claims as C
from dmtp.analysis.report import figures
from dmtp.analysis.report import registered as REG
from dmtp.analysis.report import tables as T
from dmtp.analysis.report.data import Artifacts, select, summarize
from dmtp.config.engine import describe_variant


def ci(v: float, lo: float, hi: float, signed: bool = False) -> str:
    """'3.120 [3.010, 3.230]' (signed: '+0.120 [-0.010, +0.230]'); '—' for nan."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    f = "+.3f" if signed else ".3f"
    return f"{v:{f}} [{lo:{f}}, {hi:{f}}]"


def direction(verdict: str) -> int:
    """+1 for 'a > b', -1 for 'a < b', 0 for 'not resolved' (or no data)."""
    return 1 if " > " in verdict else -1 if " < " in verdict else 0


def acceptance_table(art: Artifacts, dataset: str) -> list[str]:
    """Compared rows x temperatures: acceptance length t [95% t-interval]; bootstrap [95% CI], units."""
    s = art.ablation(dataset)
    temps = sorted(set(s.temperature))
    rows = [m for m in art.spec.runs() if m in set(s.method)] + sorted(set(s.method) - set(art.spec.runs()))
    out = ["| method | group | realizations x seeds | " + " | ".join(f"T={t:g}" for t in temps) + " |",
           "|---|---|---|" + "---|" * len(temps)]
    for m in rows:
        g = s[s.method == m].set_index("temperature")

        def cell(t):
            if t not in g.index:
                return "—"
            v, lo, hi, tlo, thi = (g.loc[t, f"acceptance_length{x}"] for x in ("", "_lo", "_hi", "_tlo", "_thi"))
            tci = "" if pd.isna(tlo) else f" t [{tlo:.3f}, {thi:.3f}];"
            return f"{v:.3f}{tci} bootstrap [{lo:.3f}, {hi:.3f}]"
        out.append(f"| {m} | {art.spec.group(m)} | {int(g.n_realizations.max())} x {int(g.n_seeds.max())} | "
                   + " | ".join(cell(t) for t in temps) + " |")
    return out


def family_size(art: Artifacts, dataset: str) -> int:
    """Tests in the pairwise family of a dataset: its pairs at every temperature (the rows of tables/pairwise_T*)."""
    return sum(int((pd.read_csv(p).dataset == dataset).sum()) for p in art.tables.glob("pairwise_T*.csv"))


def holm_threshold(n_units: int, m: int, level: float = S.LEVEL) -> str:
    """What resolving any pair of a family of m two-sided t-tests over n units needs, in words: Holm's first step
    tests the smallest p at level / m, so |t| must exceed the t quantile at 1 - level / (2 m) with n - 1 degrees of
    freedom ('' below 2 units or with one test)."""
    if n_units < 2 or m < 2:
        return ""
    return (f"at {n_units - 1} degree{'s' * (n_units != 2)} of freedom Holm over the {m} tests of the family needs "
            f"|t| > {S.t_quantile(n_units, level / m):.1f} for its first rejection (one test alone: "
            f"{S.t_quantile(n_units, level):.2f})")


def rankings(art: Artifacts, t: float, dataset: str) -> str:
    """The resolved orderings at T (the pairwise verdicts) and how many pairs are not resolved; where none is, the
    |t| Holm's first step needs at this family size and number of units (`holm_threshold`): a pair not resolved is
    not shown equal."""
    df = T.read_table(art, f"pairwise_T{t:g}")
    if df is None:
        return ""
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
    if not won:
        units = int(df.n_units.max()) if "n_units" in df and len(df) else 0
        need = holm_threshold(units, family_size(art, dataset))
        return (f"- T={t:g}: no pair is resolved ({len(df)} pairs)" + (f": {need}" if need else "")
                + "; not resolved is not equal.")
    return f"- T={t:g}: {rest}; resolved:" + "".join(f"\n  - {w}" for w in won)


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
        return (f"**1 realization ({names}): rankings are within-realization**. They describe this target and its "
                f"on-policy data; another realization may not reproduce them. Inference: {level} beside the "
                "bootstrap over seeds and requests.")
    return (f"**{n} realizations ({names}), pooled**: a ranking is worded only where it holds across realizations. "
            f"The realization-level paired t-test (Holm) and the hierarchical bootstrap must both reject, and every "
            f"realization's own difference must have the same sign. With {n} realizations the t-tests have {n - 1} "
            f"degree(s) of freedom: a two-sided test at 5 % (the pairwise tables, the exploratory rows) rejects "
            f"only beyond {S.t_quantile(n):.2f} standard errors of the realization means, the primary family's "
            f"one-sided test beyond {S.t_quantile(n, 2 * S.LEVEL):.2f}; more after Holm's correction. A difference of "
            "the size of the spread between realizations cannot be resolved, whatever the seeds and requests show.")


def who(art: Artifacts) -> str:
    """Which of our rows the blog's DMTP numbers are set beside, and why."""
    sp = art.spec
    if sp.blog_method and sp.blog_method != sp.main_method:
        return (f"The main method is `{sp.main_method}`; every DMTP number of the blog comes from single-anchor fusion "
                f"(`{sp.blog_run}`), which is set beside it on each contrast, exploratory. The blog's statements about "
                "the main method: dmtp/analysis/reference.json `main_method`.")
    return (f"This experiment's spec names no `blog_method`, so the blog's DMTP numbers are set beside the main method "
            f"`{sp.blog_run}` (experiment.json written before `ablation.blog_method` existed: re-run the pipeline's "
            "tables stage to write it).")


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
    r = select(art.runs, experiment="ablation", temperature=0, mode="natural", seed=0, dataset=["humaneval", *ood],
               method={m for runs in ood.values() for m in runs})
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
    out = [f"In and out of distribution (T = 0, seed 0; tables/ood.csv): {', '.join(f'`{o}`' for o in ood)} consists "
           "of test functions of the corpus — pretrained on by the target, never in the drafters' data.", "",
           T.to_markdown(df.drop(columns=["acceptance_length_tlo", "acceptance_length_thi"]))]
    g = C.ood_gaps(art)
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
    df = T.read_table(art, "learning_curve", dtype={"seed": str})
    if df is None:
        return []
    pooled = df[(df.seed == "all") & (df.method != "mtp")]
    out = []
    for m in sorted(set(pooled.method), key=art.rank):
        g = pooled[pooled.method == m].sort_values("train_tokens")
        a, b = g.iloc[0], g.iloc[-1]
        out.append(f"- `{m}`: {ci(a.acceptance_length, a.lo, a.hi)} at {a.train_tokens / 1e6:.2f} M tokens → "
                   f"{ci(b.acceptance_length, b.lo, b.hi)} at {b.train_tokens / 1e6:.2f} M tokens ({len(g)} budgets).")
    inc = T.read_table(art, "curve_increments")
    for r in (inc.itertuples() if inc is not None else ()):
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
    df = T.read_table(art, "curve_gaps", dtype={"step": str})
    if df is None:
        return []
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


def primary_lines(art: Artifacts, df: pd.DataFrame) -> list[str]:
    """The primary family in plain sentences: on its registered series how many of the realizations it needs are
    here and each claim's verdict; on any other series that none of this is the registered test, why (`off_series`),
    and the same contrasts as exploratory readings."""
    fam, n = REG.PRIMARY, C.n_realizations(art)
    head = f"The pre-registered primary family (P1-P4, on `{fam.claims[0].a}`) is decided only on {fam.series}"
    prim = df[df.family == C.PRIMARY_FAMILY]
    if len(prim):
        out = [f"{head}, at {fam.min_realizations} realizations: {n} of {fam.min_realizations} are here"
               + (", so each verdict is an interim reading." if n < fam.min_realizations else "."), ""]
    else:
        why = ("one realization of it decides nothing" if art.on_registered else
               f"this report pools another series ({C.off_series(art)})")
        out = [f"{head}, at {fam.min_realizations} realizations: {len(art.registered)} of {fam.min_realizations} are "
               f"here. Nothing below is the registered test: {why}. Its P1-P4 rows are the same contrasts, "
               "exploratory" + (", with the one-sided test printed as a reading." if n > 1 else "."), ""]
        prim = df[df.claim.str.match(r"P[1-4] \(")]
    for r in prim.itertuples():
        out.append(f"- {C.claim_label(r.claim)}: {r.estimate:+.3f} acceptance length, t [{r.estimate_tlo:+.3f}, "
                   f"{r.estimate_thi:+.3f}]: {r.verdict}{T.text_cell(getattr(r, 'reading', ''), '; ')}.")
    return out + ([""] if len(prim) else [])


NAMED = 4  # exploratory rows surviving Holm in one direction are named in the summary when at most this many


def exploratory_lines(df: pd.DataFrame, art: Artifacts | None = None) -> list[str]:
    """The exploratory rows read together: those against the blog, each with its Holm p over the family, and how
    many point which way before and after Holm over every exploratory row (`claims`' holm_p); a single realization
    (of a smoke run) says so before the count (`claims.one`)."""
    ex = df[df.family == C.EXPLORATORY]
    with_p = ex[ex.holm_p.notna()] if "holm_p" in ex else ex.iloc[:0]
    holm = lambda r: (f"; Holm p = {r.holm_p:.3g} over the {len(with_p)} exploratory rows"  # noqa: E731
                      if "holm_p" in ex and not pd.isna(r.holm_p) else "")
    against = ex[ex.verdict.str.contains("contrary")]
    agree = ex[ex.verdict.str.contains("consistent")]
    out = []
    if len(against):
        out += ["Against the blog (exploratory):", "",
                *[f"- {C.label_at(r)} ({r.estimate:+.3f}{T.text_cell(r.unit, ' ')}{holm(r)})."
                  for r in against.itertuples()], ""]
    kept = {w: ex[ex.verdict.str.contains(w) & (ex.holm_p < S.LEVEL)] if "holm_p" in ex else ex.iloc[:0]
            for w in ("consistent", "contrary")}
    point = lambda k: f"{k} point{'s' * (k == 1)}"  # noqa: E731
    said = (f"{C.one(art) if art is not None else ''}of {len(ex)} exploratory rows, {point(len(agree))} the blog's way "
            f"and {len(against)} against it, each at its own unadjusted 5 % level (correlated tests, several on the "
            f"same runs); the rest are not resolved. Read together (Holm over the {len(with_p)} rows with a p-value), "
            f"{point(len(kept['consistent']))} the blog's way and {len(kept['contrary'])} against it"
            + "".join(f"; {w}: " + ", ".join(C.label_at(r) for r in g.itertuples())
                      for w, g in kept.items() if 0 < len(g) <= NAMED)
            + ".")
    out += [said[:1].upper() + said[1:], ""]
    return out


def in_short(art: Artifacts, df: pd.DataFrame | None) -> list[str]:
    """REPORT.md's opening: the claims in plain sentences (the primary family, what runs against the blog, the
    throughput each realization timed), each sentence short, each resting on realizations this report holds."""
    if df is None:
        return []
    n = C.n_realizations(art)
    names = ", ".join(r.name for r in art.realizations) or "one realization"
    exp, steps = C.series(art)
    out = ["## In short", "", f"This report rests on {n} realization{'s' * (n != 1)} ({names}) of `{exp or 'this'}` "
           f"at {steps} drafter training steps; every number below comes from them.", ""]
    out += primary_lines(art, df) + exploratory_lines(df, art)
    tab = T.throughput_table(art)
    if tab is not None and art.spec.main_method:
        t0 = tab[(tab.method == art.spec.main_method) & (tab.temperature == 0) & (tab.realization != "all")]
        for real, g in t0.groupby("realization", sort=False):
            dev = g.device.iloc[0] if "device" in g and isinstance(g.device.iloc[0], str) else ""
            caps = "; ".join(f"{r.speedup:.2f}x AR at B{r.batch_cap}" for r in g.sort_values("batch_cap").itertuples())
            out.append(f"- Within one realization ({real}{', ' + dev if dev else ''}), T = 0: "
                       f"`{art.spec.main_method}` {caps} (median of {int(g.n_repeats.max())} timing repeats).")
    return out + [""]


def findings(art: Artifacts) -> list[str]:
    """REPORT.md's first section: the claims table, then per primary dataset the acceptance table, the rankings
    and the control; the out-of-distribution comparison; the ceilings; the learning curve."""
    prim = T.primary(art)
    if not prim:
        return []
    df = C.claims(art)
    out = [*in_short(art, df), "## What was found", "", T.made_by(art), "", scope(art), "",
           "### The blog's claims and the control (tables/claims.csv)", "", who(art), "", *C.claims_lines(art, df),
           *[f"- {text}." for _, _, text in control_pairs(art)], ""]
    out += figures.links(art, "main_acceptance_T*")[:2]  # the headline figure: the lowest temperature's
    for ds in prim:
        temps = sorted(set(art.ablation(ds).temperature))
        out += [f"### Acceptance length on `{ds}`", "", "Mode natural; incl. bonus; realizations and seeds pooled; "
                "t [95% t-interval over the top level's units]; bootstrap [95% hierarchical bootstrap CI over "
                "realizations, seeds and requests]:", "", *acceptance_table(art, ds), "",
                "Rankings, only as far as the pairwise verdicts support them (tables/pairwise_T*.csv; the pairwise "
                "family: every pair at every temperature, Holm over all of them; exploratory):", "",
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
    """The throughput section's sentences, one item per realization that timed it (never pooled across
    realizations) and (T, cap); then each server variant timed beside."""
    df = T.throughput_table(art)
    sp = art.spec
    if df is None:
        return []
    out = []
    own = df[df.realization != "all"]
    for r in own[(own.method == sp.main_method) & own.gain_pct.notna()].itertuples():
        bound = _decode_only(art, r.realization, r.batch_cap, sp.main_method, sp.drafter_baseline,
                             1 + r.per_verify_gain_pct / 100)
        on = T.text_cell(getattr(r, "device", ""), ", ")
        out.append(f"- T={r.temperature:g}, B{r.batch_cap} ({r.realization}{on}, {r.n_repeats} timing repeat"
                   f"{'s' * (r.n_repeats != 1)} of one trained pair): `{sp.main_method}` {r.tok_per_s:.0f} tok/s, "
                   f"{r.speedup:.2f}x AR (repeats {r.speedup_lo:.2f}–{r.speedup_hi:.2f})." + workload_words(r)
                   + f" Over `{sp.drafter_baseline}`: {r.gain_pct:+.1f} % tok/s (repeats {r.gain_pct_lo:+.1f} to "
                   f"{r.gain_pct_hi:+.1f}) for {r.per_verify_gain_pct:+.1f} % per-verify tau (ratio "
                   f"{r.gain_over_per_verify:.2f})."
                   + (f" Blog (35B, 4xH200 TP4, SGLang): {r.blog_gain_pct:+.2f} % tok/s for "
                      f"{r.blog_per_verify_gain_pct:+.2f} % acceptance." if not pd.isna(r.blog_gain_pct) else "")
                   + bound + need_line(r, own))
    for r in own[own.method.astype(str).str.contains("@")].itertuples():
        name, _, variant = r.method.partition("@")
        base = own[(own.method == name) & (own.realization == r.realization)
                   & (own.temperature == r.temperature) & (own.batch_cap == r.batch_cap)]
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
    """' Outputs: 14 of 16 requests equal to AR's, +26.5 % tokens against AR's. On AR's outputs ~2.13x (repeats ..),
    estimated ...' for a T = 0 throughput row whose outputs left AR's at bf16 ties (`bench.throughput`'s equal_ar,
    tokens_vs_ar_pct, speedup_on_ar_outputs), else ''."""
    eq, req = getattr(r, "equal_ar", math.nan), getattr(r, "requests", math.nan)
    if pd.isna(eq) or pd.isna(req) or eq >= req:
        return ""
    tok = getattr(r, "tokens_vs_ar_pct", math.nan)
    est = getattr(r, "speedup_on_ar_outputs", math.nan)
    return (f" Outputs: {eq:.0f} of {req:.0f} requests equal to AR's"
            + (f", {tok:+.1f} % tokens against AR's" if not pd.isna(tok) else "") + "."
            + (f" On AR's outputs ~{est:.2f}x (repeats {r.speedup_on_ar_outputs_lo:.2f}–"
               f"{r.speedup_on_ar_outputs_hi:.2f}), estimated from its tau on the prefixes shared with them."
               if not pd.isna(est) else ""))


def need_line(r, pooled: pd.DataFrame) -> str:
    """' Its cost per verify round, end to end, is ... AR steps (tau / speed-up), so the ...x goal would need tau
    >= ....' for a main-method row with a speed-up goal (`ratios.speedup_goal`), or ''."""
    caps = pooled[pooled.realization == r.realization].batch_cap
    goal = speedup_goal(int(r.batch_cap), int(caps.max()), float(r.temperature)) if len(caps) else None
    if goal is None or not r.speedup > 0 or not r.per_verify > 0:
        return ""
    cost = r.per_verify / r.speedup
    return (f" Its cost per verify round, end to end, is {cost:.2f} AR steps (tau / speed-up), so the {goal:g}x goal "
            f"would need tau >= {goal * cost:.2f} per verify at that cost (it has {r.per_verify:.2f}).")


def _decode_only(art: Artifacts, realization: str, cap: int, main: str, base: str, tau_gain: float) -> str:
    """' With no admission cost, ...' from the realization's own round times at this batch (overhead.csv), or ''."""
    ov, k = art.overhead, T.realization_number(realization)
    if ov is None or k is None or "batch" not in ov:
        return ""
    rt = ov[(ov.realization == k) & (ov.stage == "round") & (ov.batch == cap)].set_index("method").ms_per_round
    if main not in rt or base not in rt:
        return ""
    rr = float(rt[main] / rt[base])
    return (f" With no admission cost, its round ratio x{rr:.3f} ({rt[main]:.3f} vs {rt[base]:.3f} ms, trained "
            f"models, batch {cap}) would give a ratio of {B.decode_only_ratio(tau_gain, rr):.2f}.")


def _other_device(r) -> str:
    """' (timed on <device>, throughput on <device>)' for a cost-model row whose stage times ran on another kind of
    device than its throughput, else ''."""
    mine, timed = (str(getattr(r, c, "") or "") for c in ("device", "round_times_device"))
    mine, timed = ("" if x == "nan" else x for x in (mine, timed))
    return f" (timed on {timed}, throughput on {mine})" if mine and timed and mine != timed else ""


def costmodel_lines(art: Artifacts) -> list[str]:
    df = T.read_table(art, "costmodel")
    if df is None:
        return []
    out = []
    m = df[df.kind == "predicted vs measured"]
    if "round_timed_at_cap" not in m:
        m = m.assign(round_timed_at_cap=True)
    hid = m.beside_ms.fillna(0) > 0 if "beside_ms" in m else pd.Series(False, index=m.index)
    not_ar = m.method.astype(str).str.split("@").str[0] != "ar"  # AR's own rows (any server variant's): 1
    for cap, g in m[not_ar].groupby("batch_cap"):
        ok = g[g.round_timed_at_cap.astype(bool)]
        err = ok.error_pct.abs()
        borrowed = sorted({f"{r.realization} with {r.round_times_from}'s" + _other_device(r) for r in g.itertuples()
                           if isinstance(r.round_times_from, str) and r.round_times_from != r.realization}
                          if "round_times_from" in g else ())
        head = (f"error {err.min():.1f}–{err.max():.1f} % (|error|, {len(ok)} method x realization rows whose round "
                f"was timed at B{cap}{'; ' + ', '.join(borrowed) + ' stage times' if borrowed else ''})"
                if len(ok) else f"no method's round was timed at B{cap}")
        out.append(f"- B{cap}: predicted vs measured speed-up over AR, {head}:"
                   + "".join(f"\n  - `{r.method}` ({r.realization}): {r.predicted_speedup:.2f}x predicted, "
                             f"{r.measured_speedup:.2f}x measured"
                             + ("" if r.round_timed_at_cap else " (round not timed at this batch: extrapolated)")
                             for r in g.itertuples()))
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
        out.append(f"- Projection to the {where}, B{cap} (a projection, not a measurement: decode only, random-weight "
                   "stage times at batch 8 used at every batch, this realization's acceptance):"
                   + "".join(f"\n  - `{r.method}` ({r.realization}): {r.predicted_speedup:.2f}x AR"
                             for r in g.itertuples()))
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
            by_ids.setdefault(tuple(sorted(map(str, gs.id))), []).append(f"{m}@{f'r{r}' if multi else ''}s{seed}")
        for ids, runs in by_ids.items():
            out.append(f"- {exp}/{ds} T={t:g} {mode}: {', '.join(f'`{i}`' for i in ids)} — in {', '.join(runs)}")
    return out + [""]
