"""Tables: each renderer reads an Artifacts bundle and writes tables/<name>.csv + .md; returns the DataFrame, or
None (with a printed note) when its data is absent. Ratios are derived here, from the stored counts.

Blog values printed beside ours: temperature 0 rows use the open reproduction (27B, T = 0), other temperatures
the internal 35B table (T = 1); our dataset names map onto the blog's via dmtp.analysis.reference, our methods onto
the blog's columns via the experiment's ablation spec (`art.spec`: its `blog_method`, single-anchor fusion, is the
blog's "dmtp"; the main method is shown beside it as "main").

Seeds are pooled (data.summarize); every comparison is paired over seeds and requests (dmtp.analysis.stats), and
the pairwise tables Holm-correct each temperature's family of tests. The acceptance tables are mode natural;
mode fixed (fixed length, end-of-text ignored) has its own ablation table.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from dmtp.ablation import GROUPS
from dmtp.analysis import metrics as M
from dmtp.analysis import reference as R
from dmtp.analysis import stats as S
from dmtp.analysis.report.data import (
    Artifacts,
    group,
    load,
    missing_runs,
    paired_runs,
    per_seed,
    pooled_throughput,
    seed_matrix,
)

OPEN_LABEL = {"mtp": "MTP415", "dflash": "DFlash", "dmtp_d": "DMTP(D)", "dflash2": "DFlash2", "dmtp_d2": "DMTP(D2)"}


# --- our runs -> the blog's columns (from the ablation spec) -------------------------------------------------------
def blog_name(art: Artifacts, method: str) -> str:
    """The blog's name for one of our methods: "dmtp" for the run its DMTP numbers come from (`blog_run`)."""
    return "dmtp" if method == art.spec.blog_run else method


def main_columns(art: Artifacts) -> dict[str, str]:
    """Main-table column -> our run: DFlash (the drafter baseline), native MTP, DMTP (the blog's DMTP model,
    `blog_run`) and, when it is another run, the current main method ("main")."""
    sp = art.spec
    cols = {"dflash": sp.drafter_baseline, "mtp": "mtp", "dmtp": sp.blog_run}
    if sp.main_method and sp.main_method != sp.blog_run:
        cols["main"] = sp.main_method
    return {c: m for c, m in cols.items() if m}


def open_columns(art: Artifacts) -> dict[str, str]:
    """The blog's open-reproduction columns -> our runs (the DFlash2 ones: the backbone runs of the same two; DMTP on
    DFlash2: that of the blog run, else that of the main method)."""
    sp = art.spec
    cols = {"mtp": "mtp", "dflash": sp.drafter_baseline, "dmtp_d": sp.blog_run,
            "dflash2": sp.backbone_run(sp.drafter_baseline, "dflash2"),
            "dmtp_d2": sp.backbone_run(sp.blog_run, "dflash2") or sp.backbone_run(sp.main_method, "dflash2")}
    return {c: m for c, m in cols.items() if m}


def pct(x: float, ref: float) -> float:
    """100 * (x / ref - 1), elementwise; nan where ref is 0 or nan."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = 100 * (np.asarray(x, float) / np.asarray(ref, float) - 1)
    r = np.where(np.isfinite(r), r, np.nan)
    return float(r) if r.ndim == 0 else r


def blog_acceptance(dataset: str, temperature: float, blog_method: str) -> float:
    return R.blog_value("open_repro" if temperature == 0 else "main", dataset, blog_method)


def blog_first_token(dataset: str, temperature: float, blog_method: str) -> float:
    """Blog first-token acceptance in percent: open-repro table at T = 0, else c1 of the conditional table."""
    if temperature == 0:
        t, d, m = R.table("first_token"), R.open_dataset(dataset), blog_method
        return float(t.loc[t.dataset == d, m].iloc[0]) if d in set(t.dataset) and m in t.columns else math.nan
    row = R.conditional_row(dataset, blog_method)
    return row[0][0] if row else math.nan


def fmt(v, col: str) -> str:
    """p-values 3 significant digits, percentages 2 decimals (signed for gains/differences), else 3 decimals."""
    if not isinstance(v, (float, np.floating)):
        return str(v)
    if math.isnan(v):
        return "—"
    if col == "temperature":
        return f"{v:g}"
    if (col.startswith("n_") or col in ("step", "train_tokens")) and float(v).is_integer():
        return str(int(v))
    if col.endswith("_p"):
        return f"{v:.3g}"
    signed = any(w in col for w in ("rel", "vs_", "gain", "diff"))
    return f"{v:{'+' if signed else ''}.{2 if 'pct' in col or col.startswith('rel') else 3}f}"


def to_markdown(df: pd.DataFrame) -> str:
    """Markdown table; a column c with c_lo and c_hi beside it is printed as one cell "c [lo, hi]"."""
    cols = [c for c in df.columns if not (c.endswith(("_lo", "_hi")) and c[:-3] in df.columns)]
    ci = {c for c in cols if c + "_lo" in df.columns and c + "_hi" in df.columns}
    cell = lambda row, c: fmt(row[c], c) + (f" [{fmt(row[c + '_lo'], c)}, {fmt(row[c + '_hi'], c)}]"
                                            if c in ci and not pd.isna(row[c]) else "")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(row, c) for c in cols) + " |" for _, row in df.iterrows()]
    return "\n".join(lines) + "\n"


def save(art: Artifacts, name: str, df: pd.DataFrame, title: str, note: str = "") -> pd.DataFrame:
    art.tables.mkdir(parents=True, exist_ok=True)
    df.to_csv(art.tables / f"{name}.csv", index=False)
    (art.tables / f"{name}.md").write_text(f"### {title}\n\n" + (f"{note}\n\n" if note else "") + to_markdown(df))
    return df


def skip(what: str):
    print(f"[report] skip {what}: no data")


def _ci(row, col: str, name: str | None = None) -> dict:
    """{name: row[col], name_lo: row[col_lo], name_hi: row[col_hi]}."""
    name = name or col
    return {name: row[col], f"{name}_lo": row[f"{col}_lo"], f"{name}_hi": row[f"{col}_hi"]}


def _paired(art, key, a: str, b: str, prefix: str) -> dict:
    """Paired difference a - b of per-request acceptance length over the seeds and requests both runs have
    (data.paired_runs): prefix, _lo, _hi, _p."""
    r = paired_runs(art, key, a, b) if a != b else {}
    return {prefix: r.get("diff", math.nan), f"{prefix}_lo": r.get("lo", math.nan),
            f"{prefix}_hi": r.get("hi", math.nan), f"{prefix}_p": r.get("p", math.nan)}


# --- tables ------------------------------------------------------------------------------------------------------
LOOP_COLS = ["repeat_rate", "loop_frac", "acceptance_length_loopfree", "n_loops", "length_frac"]


def ablation(art: Artifacts) -> list[pd.DataFrame] | None:
    """The ablation (experiment `ablation`), one table per dataset and mode (natural: `ablation_<name>`, fixed:
    `ablation_<name>_fixed`): a row per method and temperature, in the spec's row groups (`table`; a method the
    spec does not name: "other"), seeds pooled (n_seeds) with intervals over seeds and requests, relative to the
    spec's reference row (percent), paired differences vs the reference and vs the drafter baseline, the loop
    columns and the requests without a verify round (n_zero_round; listed by id in REPORT.md)."""
    s = art.summary
    s = s[s.experiment == "ablation"] if len(s) else s
    if s.empty:
        return skip("ablation table")
    ref_m, base_m = art.spec.reference or "reference", art.spec.drafter_baseline or "baseline"
    out = []
    for (ds, mode), g in s.groupby(["dataset", "mode"]):
        rows = []
        for (t,), gt in g.groupby(["temperature"]):
            ref = gt.set_index("method").acceptance_length.get(art.spec.reference, math.nan)
            key = ("ablation", ds, t, mode)
            for _, r in gt.iterrows():
                rows.append({"method": r.method, "temperature": t, **_ci(r, "acceptance_length"),
                             "per_verify": r.per_verify, **_ci(r, "first_token"),
                             f"rel_to_{ref_m}": pct(r.acceptance_length, ref), "n_seeds": r.n_seeds,
                             "n_requests": r.n_requests, "n_zero_round": r.n_zero_round, "n_rounds": r.n_rounds,
                             **{c: r[c] for c in LOOP_COLS},
                             "blog_value": R.ablation_value(r.method),
                             "blog_rel_pct": R.ablation_value(r.method, "rel_to_token_only_pct"),
                             "table": art.spec.group(r.method),
                             **_paired(art, key, r.method, ref_m, f"vs_{ref_m}"),
                             **_paired(art, key, r.method, base_m, f"vs_{base_m}")})
        df = pd.DataFrame(rows)
        order = {m: i for i, m in enumerate(sorted(set(df.method), key=art.rank))}
        df = df.iloc[np.lexsort((df.temperature, df.method.map(order), df.table.map(GROUPS.index)))]
        note = ("Mode natural (stop at end-of-text or a HumanEval stop string): the acceptance table. "
                if mode == "natural" else "MODE FIXED (end-of-text ignored, fixed length: the blog's throughput "
                "setting; outputs may run into loops): not the acceptance table. ")
        note += ("acceptance_length = per-request mean incl. bonus, pooled over n_seeds drafter seeds; [lo, hi] = "
                 "two-level bootstrap 95% CI over seeds and requests; "
                 f"rel_to_{ref_m} in percent; vs_* = paired (by seed and request) mean difference of per-request "
                 "acceptance length with bootstrap CI and two-sided bootstrap p (vs_*_p, not multiplicity-corrected: "
                 "see the pairwise tables). repeat_rate = mean 8-gram repeat rate; loop_frac = share of emitted "
                 "tokens inside a trailing exact loop; acceptance_length_loopfree = the same mean over rounds "
                 "before any loop; length_frac = share of requests stopped by the length cap; n_zero_round = "
                 "requests (x seeds) without a verify round (listed in REPORT.md). "
                 "blog_value: the blog's Code ablation (8 inputs), relative to token_only.")
        # the blog's Code ablation used 8 code inputs: our `humaneval8` view is *the* ablation_code table
        name = ("ablation_code" if ds == "humaneval8" else f"ablation_{ds}") + ("_fixed" if mode == "fixed" else "")
        title = f"Code ablation — {ds}" + (" — fixed-length mode" if mode == "fixed" else "")
        out.append(save(art, name, df.reset_index(drop=True), title, note))
    return out


def _groups(art: Artifacts, methods) -> list[tuple[tuple, pd.DataFrame]]:
    s = art.natural
    s = s[s.method.isin(methods)] if len(s) else s
    return list(s.groupby(["experiment", "dataset", "temperature"], sort=True)) if len(s) else []


def main_acceptance(art: Artifacts) -> pd.DataFrame | None:
    """DFlash / native MTP / DMTP (the spec's drafter baseline, mtp, main method) per dataset, gain of DMTP over
    DFlash, blog values beside."""
    cols = main_columns(art)
    if {"dflash", "dmtp"} - set(cols):
        return skip("main acceptance table (the spec names no main method or drafter baseline)")
    rows = []
    for key, g in _groups(art, cols.values()):
        by = g.set_index("method")
        row = dict(zip(["experiment", "dataset", "temperature"], key))
        for col, m in cols.items():
            row.update(_ci(by.loc[m], "acceptance_length", col) if m in by.index else {col: math.nan})
        row["gain_pct"] = pct(row["dmtp"], row["dflash"])
        row.update(_paired(art, key, cols["dmtp"], cols["dflash"], "dmtp_vs_dflash"))
        if "main" in cols:  # the current main method against the blog's DMTP model and against DFlash
            row["main_gain_pct"] = pct(row["main"], row["dflash"])
            row.update(_paired(art, key, cols["main"], cols["dmtp"], "main_vs_dmtp"))
        for col in cols:
            row[f"blog_{col}"] = blog_acceptance(key[1], key[2], col)
        row["blog_gain_pct"] = blog_acceptance(key[1], key[2], "dmtp_vs_dflash_pct")  # as the blog prints it
        rows.append(row)
    if not rows:
        return skip("main acceptance table")
    df = pd.DataFrame(rows).dropna(axis=1, how="all")
    main = (f"; main = {cols['main']} (the current main method, no blog number of its own: the blog says it is "
            "'close to fusion')") if "main" in cols else ""
    return save(art, "main_acceptance", df, "Acceptance length: DFlash vs native MTP vs DMTP",
                f"Mode natural. Per-request mean incl. bonus, seeds pooled, bootstrap 95% CI over seeds and requests; "
                f"dmtp = {cols['dmtp']} (the model behind every DMTP number of the blog){main}; dflash = "
                f"{cols['dflash']}. *_vs_* = paired differences. blog_*: open reproduction at T=0, internal 35B "
                "table otherwise.")


def first_token(art: Artifacts) -> pd.DataFrame | None:
    """First-token acceptance 1 - h[0]/sum h (percent) per dataset and method, bootstrap CI over requests."""
    s = art.natural
    s = s[s.k > 0] if len(s) else s
    if s.empty:
        return skip("first-token table")
    df = s[["experiment", "dataset", "temperature", "method"]].copy()
    for c in ("first_token", "first_token_lo", "first_token_hi"):
        df[c.replace("first_token", "first_token_pct")] = 100 * s[c]
    df["n_rounds"] = s.n_rounds
    df["blog_pct"] = [blog_first_token(d, t, blog_name(art, m)) for d, t, m in zip(s.dataset, s.temperature,
                                                                                   s.method)]
    return save(art, "first_token", df.reset_index(drop=True), "First-token acceptance (%)",
                "P(L>=1) over verify rounds (bonus excluded), bootstrap 95% CI over requests.")


def position(art: Artifacts) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """Cumulative P(L>=k) and conditional P(L>=k | L>=k-1), k = 1..7, in percent; the conditional table also
    carries the blog's rows (source = blog) for the workloads our datasets map to."""
    s = art.natural
    s = s[s.k > 0] if len(s) else s
    if s.empty:
        return skip("per-position tables")
    base = s[["experiment", "dataset", "temperature", "method", "n_rounds"]].reset_index(drop=True)
    K = 7
    pad = lambda v: (list(v) + [math.nan] * K)[:K]
    cum = pd.concat([base, pd.DataFrame([pad(100 * np.array(M.cumulative(h))) for h in s["hist"]],
                                        columns=[f"k{k}" for k in range(1, K + 1)])], axis=1)
    cond = pd.concat([base, pd.DataFrame([pad(100 * np.array(M.conditional(h))) for h in s["hist"]],
                                         columns=[f"c{k}" for k in range(1, K + 1)])], axis=1)
    cond.insert(0, "source", "ours")
    blog = R.table("conditional")
    wl = {R.workload(d) for d in s.dataset} - {None}
    blog = blog[blog.workload.isin(wl)].rename(columns={"workload": "dataset"}).assign(source="blog")
    cond = pd.concat([cond, blog], ignore_index=True)[cond.columns]
    save(art, "cumulative", cum, "Cumulative acceptance P(L>=k) (%)", "Per verify round, bonus excluded.")
    save(art, "conditional", cond, "Conditional acceptance P(L>=k | L>=k-1) (%)",
         "source=blog rows: the blog's conditional table (35B, T=1; dmtp = T1 fusion) for the mapped workload.")
    return cum, cond


def per_request_vs_verify(art: Artifacts) -> pd.DataFrame | None:
    """Per-request mean acceptance length vs per-verify tau (pooled over all rounds), blog values beside."""
    s = art.natural
    s = s[s.k > 0] if len(s) else s
    if s.empty:
        return skip("per-request vs per-verify table")
    df = s[["experiment", "dataset", "temperature", "method", "n_requests", "n_rounds"]].copy()
    df["per_request"], df["per_verify"] = s.acceptance_length, s.per_verify
    df["diff"] = df.per_request - df.per_verify
    blog = R.table("per_request_vs_verify")
    look = {(w, m): (a, b) for w, m, a, b in blog.itertuples(index=False)}
    bl = [look.get((R.workload(d), blog_name(art, m)), (math.nan, math.nan)) if t != 0 else (math.nan, math.nan)
          for d, t, m in zip(s.dataset, s.temperature, s.method)]
    df["blog_per_request"], df["blog_per_verify"] = [b[0] for b in bl], [b[1] for b in bl]
    return save(art, "per_request_vs_verify", df.reset_index(drop=True), "Per-request vs per-verify acceptance length",
                "per_request: mean of each request's own tau; per_verify: 1 + sum k*h[k] / sum h over all rounds.")


def throughput(art: Artifacts) -> pd.DataFrame | None:
    """tok/s per (dataset, temperature, batch cap) and method, DMTP gain over DFlash, blog B32 beside."""
    if art.throughput is None or art.throughput.empty:
        return skip("throughput table (bench/throughput.csv)")
    df = pooled_throughput(art.throughput).pivot_table(index=["dataset", "temperature", "batch_cap"],
                                                       columns="method", values="tok_per_s")
    df = df[sorted(df.columns, key=art.rank)].reset_index()
    df.columns.name = None
    dmtp, dflash = art.spec.main_method, art.spec.drafter_baseline
    if dmtp and dflash and {dflash, dmtp} <= set(df.columns):
        df["gain_pct"] = pct(df[dmtp], df[dflash])
    blog = R.table("throughput")
    look = {(w, m, b): v for w, m, b, v, _ in blog.itertuples(index=False)}
    for m in ("dflash", "dmtp"):
        df[f"blog_{m}"] = [look.get((R.workload(d), m, b), math.nan) for d, b in zip(df.dataset, df.batch_cap)]
    return save(art, "throughput", df.dropna(axis=1, how="all"), "End-to-end throughput (tok/s)",
                "Total output tokens / wall time of the whole request group; blog: B32, 4xH200 TP4 (35B, T=1).")


def overhead(art: Artifacts) -> pd.DataFrame | None:
    """ms per round by stage and method (ours), with the blog's §6.5 rows beside (method blog:<workload>:<m>)."""
    if art.overhead is None or art.overhead.empty:
        return skip("overhead table (bench/overhead.csv)")
    stages = ["drafter", "mtp", "t1_prep", "drafter_ctx", "verify", "round"]
    ours = art.overhead.pivot_table(index="method", columns="stage", values="ms_per_round")
    blog = R.table("overhead").assign(method=lambda b: "blog:" + b.workload + ":" + b.method)
    blog = blog.pivot_table(index="method", columns="stage", values="ms_per_round", dropna=False)
    df = pd.concat([ours.loc[sorted(ours.index, key=art.rank)], blog])
    df = df[[c for c in stages if c in df.columns]].reset_index()
    df.columns.name = None
    dflash = art.spec.drafter_baseline
    if "round" in df and dflash:  # against the DFlash row of the same setup ("8b-shape:" rows: random weights,
        # timing only; "+fused" rows: layers fused by dmtp.engine.fuse, against DFlash fused)
        setup = [(p, m.endswith("+fused")) for p, m in zip(df.method.str.rpartition(":")[0],
                                                             df.method.str.rpartition(":")[2])]
        ref = {s: r for s, m, r in zip(setup, df.method.str.rpartition(":")[2], df["round"])
               if m in (dflash, dflash + "+fused")}
        df["round_vs_dflash_ms"] = [r - ref.get(s, math.nan) for s, r in zip(setup, df["round"])]
        df["round_vs_dflash"] = [r / ref.get(s, math.nan) for s, r in zip(setup, df["round"])]
        df.loc[df.method.str.startswith("blog:"), ["round_vs_dflash_ms", "round_vs_dflash"]] = math.nan
    return save(art, "overhead", df, "Per-round overhead (ms/round)",
                "Batch 8, CUDA graphs, 512 tokens ignoring EOS, first 16 rounds excluded (blog §6.5 setting). "
                "8b-shape: a Qwen3-8B-sized target with random weights, 5-layer drafters (timing only).")


def open_repro(art: Artifacts) -> pd.DataFrame | None:
    """The blog's open-reproduction layout: MTP415, DFlash, DMTP(D), DFlash2, DMTP(D2) per dataset present."""
    cols = open_columns(art)
    if set(OPEN_LABEL) - set(cols):
        return skip("open-reproduction table (the spec names no DFlash2 runs of the drafter baseline and main method)")
    blog_col = {"dmtp_d": "dmtp"}  # the blog's open_repro table calls DMTP(D) "dmtp"
    rows = []
    for key, g in _groups(art, cols.values()):
        by = g.set_index("method").acceptance_length
        row = dict(zip(["experiment", "dataset", "temperature"], key))
        row.update({c: by.get(m, math.nan) for c, m in cols.items()})
        row["dmtp_d_vs_dflash_pct"] = pct(row["dmtp_d"], row["dflash"])
        row["dmtp_d2_vs_dflash2_pct"] = pct(row["dmtp_d2"], row["dflash2"])
        for c in cols:  # the blog's table is at T=0
            row[f"blog_{c}"] = R.blog_value("open_repro", key[1], blog_col.get(c, c)) if key[2] == 0 else math.nan
        rows.append(row)
    if not rows:
        return skip("open-reproduction table")
    return save(art, "open_repro", pd.DataFrame(rows), "Open-reproduction layout (per-request acceptance length)",
                "Columns: " + ", ".join(f"{c} = {OPEN_LABEL[c]} ({m})" for c, m in cols.items())
                + "; blog_*: Qwen3.6-27B, T=0.")


# --- research protocol: pairwise tests, the control, ceilings at T > 0, learning curves, zero-round requests ---------
def primary(art: Artifacts) -> list[str]:
    """The ablation's datasets that are not views of another (experiment.json eval.subsets), natural mode."""
    s = art.natural
    ds = sorted(set(s[s.experiment == "ablation"].dataset)) if len(s) else []
    own = [d for d in ds if d not in (art.subsets or {})]
    return own or ds


def compared(art: Artifacts, dataset: str, temperature: float) -> list[str]:
    """The pairwise-test rows present at (dataset, T): the spec's drafting baselines, main and control runs."""
    s = art.natural
    have = set(s[(s.experiment == "ablation") & (s.dataset == dataset) & (s.temperature == temperature)].method)
    return [m for m in art.spec.compared if m in have]


def pairwise(art: Artifacts, n_boot: int = 4000) -> list[pd.DataFrame] | None:
    """tables/pairwise_T<t>: every pair of the compared rows (`compared`) on each primary dataset, paired over seeds
    and requests (stats.matrices: the requests and seeds every row has; a baseline without a drafter set beside
    every seed), Holm-corrected over the temperature's family (stats.pairwise), worded by stats.verdict."""
    out = []
    for t in sorted(set(art.natural.temperature)) if len(art.natural) else []:
        rows = []
        for ds in primary(art):
            methods = compared(art, ds, t)
            if len(methods) < 2:
                continue
            mats = S.matrices({m: per_seed(group(art, "ablation", ds, t, m)) for m in methods})[0]
            est = {m: float(np.nanmean(x)) if np.isfinite(x).any() else math.nan for m, x in mats.items()}
            for r in S.pairwise(mats, n_boot=n_boot):
                rows.append({"dataset": ds, "temperature": t, "a": r["a"], "b": r["b"], "a_value": est[r["a"]],
                             "b_value": est[r["b"]], "diff": r["diff"], "diff_lo": r["lo"], "diff_hi": r["hi"],
                             "diff_p": r["p"], "holm_p": r["p_holm"], "verdict": r["verdict"],
                             "n_seeds": r["n_seeds"], "n_requests": r["n_requests"]})
        if rows:
            out.append(save(art, f"pairwise_T{t:g}", pd.DataFrame(rows), f"Pairwise tests at T={t:g} (natural mode)",
                            "diff = a - b of per-request acceptance length, paired by seed and request (seeds and "
                            "requests every row has; a baseline without a drafter set beside every seed); [lo, hi] "
                            "= two-level bootstrap 95% CI; diff_p = two-sided bootstrap p; holm_p = Holm-adjusted "
                            "over all pairs at this temperature. verdict: '>' / '<' only where holm_p < 0.05, "
                            "'≈ (not resolved)' = indistinguishable at this power."))
    return out or skip("pairwise tables (fewer than two compared rows)")


def pair_row(art: Artifacts, a: str, b: str, t: float, dataset: str | None = None) -> dict | None:
    """The pairwise-table row of a vs b at T (either order; signs flipped to read a - b), or None."""
    path = art.tables / f"pairwise_T{t:g}.csv"
    if not path.exists():
        return None
    df = pd.read_csv(path)
    df = df[df.dataset == (dataset or primary(art)[0])] if len(df) else df
    for flip, (x, y) in ((1, (a, b)), (-1, (b, a))):
        r = df[(df.a == x) & (df.b == y)]
        if len(r):
            r = r.iloc[0].to_dict()
            lo, hi = sorted((flip * r["diff_lo"], flip * r["diff_hi"]))
            return dict(r, a=a, b=b, diff=flip * r["diff"], diff_lo=lo, diff_hi=hi, a_value=r["a_value" if flip > 0
                        else "b_value"], b_value=r["b_value" if flip > 0 else "a_value"],
                        verdict=S.verdict(a, b, flip * r["diff"], r["holm_p"]))
    return None


def ceiling(art: Artifacts) -> list[pd.DataFrame] | None:
    """tables/ceiling_T<t> (T > 0): each run's measured cumulative acceptance P(L>=j) per draft position (%, seeds
    pooled) beside the oracle ceiling C_j along the `ar` trajectory (oracle/<dataset>_T<t>.json), and per-verify
    tau beside 1 + sum_j C_j; of_ceiling_pct = (tau - 1) / sum_j C_j in percent."""
    if not art.oracle:
        return skip("ceiling tables (no oracle/*.json)")
    s = art.natural
    out = []
    for t in sorted({t for _, t in art.oracle if t > 0}):
        rows = []
        for (ds, tt), rec in sorted(art.oracle.items()):
            if tt != t:
                continue
            C = [float(c) for c in rec["cumulative"]]
            K = len(C)
            g = s[(s.experiment == "ablation") & (s.dataset == ds) & (s.temperature == t) & (s.k > 0)]
            for r in g.itertuples():
                cum = (list(100 * np.array(M.cumulative(r.hist))) + [math.nan] * K)[:K]
                rows.append({"dataset": ds, "temperature": t, "source": "measured", "method": r.method,
                             "n_seeds": r.n_seeds, **{f"P{j}": v for j, v in enumerate(cum, 1)},
                             "per_verify": r.per_verify, "acceptance_length": r.acceptance_length,
                             "of_ceiling_pct": 100 * (r.per_verify - 1) / sum(C) if sum(C) else math.nan})
            rows.append({"dataset": ds, "temperature": t, "source": "ceiling", "method": "oracle (ar path)",
                         "n_seeds": math.nan, **{f"P{j}": 100 * c for j, c in enumerate(C, 1)},
                         "per_verify": float(rec["acceptance_length"]), "acceptance_length": math.nan,
                         "of_ceiling_pct": 100.0})
        if rows:
            out.append(save(art, f"ceiling_T{t:g}", pd.DataFrame(rows), f"Acceptance vs its ceiling at T={t:g}",
                            "P_j = P(L >= j) per verify round (%), mode natural, seeds pooled. Ceiling row: C_j = "
                            "mean over windows of the product of the target's top-1 probabilities at T along the "
                            "`ar` output (dmtp.analysis.oracle): C_1 bounds first-token acceptance of any greedy "
                            "draft under target-only verification; for j >= 2 the product runs along the target's "
                            "sampled path, not the draft path, so it is a reference profile rather than a strict "
                            "bound (docs/DESIGN.md). per_verify = 1 + sum_j C_j; of_ceiling_pct = (tau - 1) / "
                            "sum_j C_j."))
    return out or skip("ceiling tables (no oracle file at T > 0)")


def learning_curve(art: Artifacts, n_boot: int = 2000) -> pd.DataFrame | None:
    """tables/learning_curve: acceptance length (T = 0, natural) vs drafter training tokens, one row per method x
    seed x step (request bootstrap CI), pooled rows (seed "all": two-level CI over seeds and requests at the step's
    mean training tokens), and the native-MTP reference row (runs/ablation/mtp/<dataset>_T0, step empty)."""
    cv = art.curve
    if cv is None or cv.empty:
        return skip("learning curve (no curve/)")
    rows = []
    for (m, step), g in cv.groupby(["method", "step"], sort=True):
        for seed, gs in g.groupby("seed", sort=True):
            est = M.bootstrap_ci(gs.acceptance_length.dropna().to_numpy(), n_boot=n_boot)
            rows.append({"method": m, "seed": str(seed), "step": step, "train_tokens": gs.train_tokens.iloc[0],
                         **dict(zip(["acceptance_length", "lo", "hi"], est)),
                         "n_requests": int((gs.n_rounds > 0).sum())})
        est = S.seed_request_ci(seed_matrix(g)[0], n_boot=n_boot)
        rows.append({"method": m, "seed": "all", "step": step, "train_tokens": g.groupby("seed").train_tokens.first()
                     .mean(), **dict(zip(["acceptance_length", "lo", "hi"], est)),
                     "n_requests": int(g.id[g.n_rounds > 0].nunique())})
    for ds in sorted(set(cv.dataset)):
        ref = group(art, "ablation", ds, 0.0, "mtp")
        if len(ref):
            est = M.bootstrap_ci(ref.acceptance_length.dropna().to_numpy(), n_boot=n_boot)
            rows.append({"method": "mtp", "seed": "0", "step": math.nan, "train_tokens": math.nan,
                         **dict(zip(["acceptance_length", "lo", "hi"], est)),
                         "n_requests": int((ref.n_rounds > 0).sum())})
    df = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(sorted(set(df.method), key=art.rank))}
    df = df.iloc[np.lexsort((df.seed == "all", df.train_tokens.fillna(-1), df.method.map(order)))]
    return save(art, "learning_curve", df.reset_index(drop=True), "Learning curve (HumanEval, T=0, natural mode)",
                "acceptance_length [lo, hi]: per-request mean incl. bonus; per seed a bootstrap 95% CI over "
                "requests, seed 'all' a two-level CI over seeds and requests (train_tokens: the seeds' mean). "
                "mtp: the native MTP head (no drafter budget), the reference line.")


def zero_rounds(art: Artifacts) -> pd.DataFrame | None:
    """tables/zero_round: every request without a verify round (its first token ended it), by experiment, dataset,
    temperature, mode, method and seed; views of another dataset (eval.subsets) are left out (their requests are
    the source's)."""
    r = art.runs
    z = r[(r.n_rounds == 0) & ~r.dataset.isin(list(art.subsets or {}))] if len(r) else r
    if z.empty:
        return None
    z = z[KEYS_ZERO].copy()
    z["rank"] = z.method.map(lambda m: art.rank(m))
    z = z.sort_values(["experiment", "dataset", "temperature", "mode", "rank", "seed", "id"]).drop(columns="rank")
    art.tables.mkdir(parents=True, exist_ok=True)
    z.to_csv(art.tables / "zero_round.csv", index=False)
    return z.reset_index(drop=True)


KEYS_ZERO = ["experiment", "dataset", "temperature", "mode", "method", "seed", "id"]


ALL = [ablation, main_acceptance, first_token, position, per_request_vs_verify, throughput, overhead, open_repro,
       pairwise, ceiling, learning_curve, zero_rounds]


def missing(art: Artifacts) -> list[tuple]:
    """Runs a table would want but the artifacts lack (printed, and listed in REPORT.md: never dropped silently):
    the spec's baselines and main rows (those of `only`, when it names a subset)."""
    sp = art.spec
    return missing_runs(art.runs, {"ablation": sp.selected(sp.baselines + sp.main + tuple(sp.continued))}, art.rank)


def render(art: Artifacts) -> None:
    for fn in ALL:
        fn(art)
    for exp, ds, t, m in missing(art):
        print(f"[report] missing runs: {exp}/{m}/{ds}_T{t:g}.jsonl (no rows for {m} in that table)")


def render_all(root: str | Path) -> Artifacts:
    """Every table of the profile folder results/<profile> (the pipeline's `tables` stage calls this)."""
    root = Path(root)
    art = load(root.name, root.parent)
    render(art)
    return art
