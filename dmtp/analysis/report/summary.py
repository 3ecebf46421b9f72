"""REPORT.md's summary (first section) and the listing of requests without a verify round, from the rendered tables.

Every ranking is worded only as far as the Holm-corrected pairwise tests carry it (tables/pairwise_T<t>.csv,
`stats.verdict`): "a > b" where the adjusted p < 0.05, "a ≈ b (not resolved)" otherwise; nothing is called "best".
Which rows are the blog's DMTP model, the main method, the drafter baseline and the controls, the ablation spec says.

    from dmtp.analysis.report import load, tables, summary
    art = load("mini"); tables.render(art); print("\n".join(summary.summary(art)))
"""
from __future__ import annotations

import math

import pandas as pd

from dmtp.analysis import reference as R
from dmtp.analysis.report import tables as T
from dmtp.analysis.report.data import Artifacts


def ci(v: float, lo: float, hi: float, signed: bool = False) -> str:
    """'3.120 [3.010, 3.230]' (signed: '+0.120 [-0.010, +0.230]'); '—' for nan."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    f = "+.3f" if signed else ".3f"
    return f"{v:{f}} [{lo:{f}}, {hi:{f}}]"


def comparison(art: Artifacts, a: str, b: str, t: float, dataset: str) -> str:
    """'a − b = +0.12 [+0.05, +0.19] (+4.1 %), Holm p = 0.003: a > b' from the pairwise table, or '' if absent."""
    r = T.pair_row(art, a, b, t, dataset)
    if r is None:
        return ""
    rel = T.pct(r["a_value"], r["b_value"])
    return (f"`{a}` − `{b}` = {ci(r['diff'], r['diff_lo'], r['diff_hi'], True)} ({rel:+.1f} %), Holm p = "
            f"{r['holm_p']:.3g}: **{r['verdict']}**")


def acceptance_table(art: Artifacts, dataset: str) -> list[str]:
    """Compared rows x temperatures: acceptance length [95% CI over seeds and requests], n_seeds."""
    s = art.natural
    s = s[(s.experiment == "ablation") & (s.dataset == dataset)]
    temps = sorted(set(s.temperature))
    rows = [m for m in art.spec.runs() if m in set(s.method)] + sorted(set(s.method) - set(art.spec.runs()))
    out = ["| method | group | n_seeds | " + " | ".join(f"T={t:g}" for t in temps) + " |",
           "|---|---|---|" + "---|" * len(temps)]
    for m in rows:
        g = s[s.method == m].set_index("temperature")
        cells = [ci(*g.loc[t, ["acceptance_length", "acceptance_length_lo", "acceptance_length_hi"]])
                 if t in g.index else "—" for t in temps]
        out.append(f"| {m} | {art.spec.group(m)} | {int(g.n_seeds.max())} | " + " | ".join(cells) + " |")
    return out


def rankings(art: Artifacts, t: float, dataset: str) -> str:
    """The resolved orderings at T (Holm p < 0.05) and how many pairs are not resolved."""
    path = art.tables / f"pairwise_T{t:g}.csv"
    if not path.exists():
        return ""
    df = pd.read_csv(path)
    df = df[df.dataset == dataset]
    above: dict[str, list[str]] = {}  # winner -> the rows it is resolved above
    for r in df.itertuples():
        if r.holm_p < 0.05:
            hi, lo = (r.a, r.b) if r.diff > 0 else (r.b, r.a)
            above.setdefault(hi, []).append(lo)
    n = len(df) - sum(map(len, above.values()))
    won = [f"{m} > " + ", ".join(sorted(above[m], key=art.rank)) for m in sorted(above, key=art.rank)]
    rest = f"the other {n} of {len(df)} pairs are indistinguishable (Holm p ≥ 0.05)" if n else "every pair resolved"
    return f"- T={t:g}: " + ("; ".join(won) + f"; {rest}." if won else f"no pair is resolved ({len(df)} pairs).")


def blog_claims(art: Artifacts) -> list[tuple[str, str, str]]:
    """(a, b, the blog's claim): each of the blog's DMTP claims (single-anchor fusion = the spec's blog run) as the
    pair of our rows that tests it."""
    sp = art.spec
    dmtp, dflash, ref = sp.blog_run, sp.drafter_baseline, sp.reference
    ab = R.table("ablation").set_index("method").acceptance_length
    he = R.table("open_repro").set_index("dataset").loc["HumanEval"]
    code = f"Code ablation {ab.get('fusion', math.nan):.3f} vs {ab.get('dflash', math.nan):.3f}"
    claims = [
        (dmtp, dflash, f"DMTP > DFlash ({code}; open reproduction HumanEval {he.dmtp:.3f} vs {he.dflash:.3f}, "
                       f"+{he.dmtp_vs_dflash_pct:.2f} %)"),
        (dmtp, "mtp", f"DMTP > MTP415 (open reproduction HumanEval {he.dmtp:.3f} vs {he.mtp:.3f})"),
        (dflash, "mtp", f"DFlash > MTP415 on code (open reproduction HumanEval {he.dflash:.3f} vs {he.mtp:.3f})"),
        (dmtp, ref, f"fusion > {ref} (Code ablation "
                    f"+{R.ablation_value('fusion', 'rel_to_token_only_pct'):.2f} %)"),
    ]
    if sp.main_method and sp.main_method != dmtp:
        claims.append((sp.main_method, dmtp, "Nov 9: 「零初始化残差与直接融合的效果接近」 — the zero-initialised "
                                             "residual (the current main method) performs close to direct fusion"))
    return [(a, b, c) for a, b, c in claims if a and b]


def tested(art: Artifacts, pairs: list[tuple[str, str, str]], temps, dataset: str) -> list[str]:
    """One bullet per pair (its text), one sub-bullet per temperature with our paired, Holm-corrected test."""
    out = []
    for a, b, text in pairs:
        got = [(t, comparison(art, a, b, t, dataset)) for t in temps]
        got = [f"  - T={t:g}: {g}" for t, g in got if g]
        if got:
            out += [f"- {text}", *got]
    return out


def control_pairs(art: Artifacts) -> list[tuple[str, str, str]]:
    """The main method against each control run, with what the control isolates."""
    sp = art.spec
    return [(sp.main_method, c, f"`{sp.main_method}` vs the control `{c}`: the same drafter without what the main "
             "method adds (`double_anchor_token_only` = [A, E(T1), MASK x 6] without the MTP hidden, exactly "
             "`zero_init_residual` at initialisation): the difference isolates the effect of the MTP hidden")
            for c in sp.controls if sp.main_method]


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
    pooled = df[df.seed == "all"]
    out = []
    for m in sorted(set(pooled.method), key=art.rank):
        g = pooled[pooled.method == m].sort_values("train_tokens")
        a, b = g.iloc[0], g.iloc[-1]
        out.append(f"- `{m}`: {ci(a.acceptance_length, a.lo, a.hi)} at {a.train_tokens / 1e6:.2f} M tokens → "
                   f"{ci(b.acceptance_length, b.lo, b.hi)} at {b.train_tokens / 1e6:.2f} M tokens "
                   f"({len(g)} budgets).")
    ref = df[df.method == "mtp"]
    if len(ref):
        r = ref.iloc[0]
        out.append(f"- native MTP415 (reference line): {ci(r.acceptance_length, r.lo, r.hi)}.")
    return out


def summary(art: Artifacts) -> list[str]:
    """REPORT.md's first section: acceptance with intervals, resolved rankings, the blog's claims, the control,
    the ceilings, the learning curve, the requests without a verify round."""
    prim = T.primary(art)
    if not prim:
        return []
    out = ["## Summary", ""]
    for ds in prim:
        s = art.natural
        temps = sorted(set(s[(s.experiment == "ablation") & (s.dataset == ds)].temperature))
        out += [f"Acceptance length on `{ds}` (mode natural; incl. bonus; drafter seeds pooled; [95% CI over seeds "
                "and requests]):", "", *acceptance_table(art, ds), "",
                "Rankings, only as far as the Holm-corrected paired tests carry them (tables/pairwise_T*.csv):", "",
                *filter(None, (rankings(art, t, ds) for t in temps)), ""]
        claims = tested(art, blog_claims(art), temps, ds)
        if claims:
            sp = art.spec
            who = (f"so they are set beside `{sp.blog_run}`; the current main method `{sp.main_method}` has no "
                   "number of its own in the blog (its statements about it: dmtp/analysis/reference.json "
                   "`main_method`)") if sp.blog_method and sp.blog_method != sp.main_method else (
                f"but this experiment's spec names no `blog_method`, so they are set beside the main method "
                f"`{sp.blog_run}` (experiment.json written before `ablation.blog_method` existed: re-run the "
                "pipeline's tables stage to write it)")
            out += [f"The blog's claims. Every DMTP number of the blog comes from single-anchor fusion, {who}:",
                    "", *claims, ""]
        ctrl = tested(art, control_pairs(art), temps, ds)
        if ctrl:
            out += ["The control:", "", *ctrl, ""]
    cl = ceiling_lines(art)
    if cl:
        out += ["At T > 0 (tables/ceiling_T*.csv):", "", *cl, ""]
    cv = curve_lines(art)
    if cv:
        out += ["Learning curve (HumanEval, T=0; first → last budget, seeds pooled):", "", *cv, ""]
    z = T.zero_rounds(art)
    n = 0 if z is None else len(z)
    out += [f"Requests without a verify round (first token ended them): {n}" + (" — listed below." if n else "."),
            ""]
    return out


def zero_round_lines(art: Artifacts) -> list[str]:
    """Every request without a verify round, grouped: one line per (dataset, T, mode, set of ids) naming the runs
    (method and seeds) where they occur."""
    z = T.zero_rounds(art)
    if z is None:
        return []
    out = ["## Requests without a verify round", "",
           "Their first generated token ended them (end-of-text or a stop string): no acceptance length, kept in "
           "every count (n_zero_round). Full list: tables/zero_round.csv.", ""]
    for (exp, ds, t, mode), g in z.groupby(["experiment", "dataset", "temperature", "mode"], sort=True):
        by_ids: dict[tuple, list[str]] = {}
        for (m, seed), gs in g.groupby(["method", "seed"], sort=False):
            by_ids.setdefault(tuple(sorted(map(str, gs.id))), []).append(f"{m}@s{seed}")
        for ids, runs in by_ids.items():
            out.append(f"- {exp}/{ds} T={t:g} {mode}: {', '.join(f'`{i}`' for i in ids)} — in {', '.join(runs)}")
    return out + [""]
