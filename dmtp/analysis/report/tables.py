"""Tables: each renderer reads an Artifacts bundle and writes tables/<name>.csv + .md; returns the DataFrame, or
None (with a printed note) when its data is absent. Ratios are derived here, from the stored counts.

Blog values printed beside ours: temperature 0 rows use the open reproduction (27B, T = 0), other temperatures
the internal 35B table (T = 1); our dataset names map onto the blog's via dmtp.analysis.reference, our methods onto
the blog's columns via the experiment's ablation spec (`art.spec`: its `blog_method`, single-anchor fusion, is the
blog's "dmtp"; the main method is shown beside it as "main").

Realizations and seeds are pooled (data.summarize); every comparison is paired over realizations, seeds and
requests (dmtp.analysis.stats: a hierarchical bootstrap beside a t-test at the top level), and the pairwise tables
Holm-correct the family a summary sentence reads: every pair at every temperature of a dataset. The acceptance
tables are mode natural; mode fixed (fixed length, end-of-text ignored) has its own ablation table.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from dmtp.analysis import metrics as M
from dmtp.analysis import reference as R
from dmtp.analysis import stats as S
from dmtp.analysis.report import bench as B
from dmtp.analysis.report.data import (CONTRAST_BOOT, Artifacts, cube, group, missing_runs, paired_runs,
                                       per_unit, pooled_hist, select)
from dmtp.config import GROUPS
from dmtp.io import write_csv, write_text

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


def text_cell(v, prefix: str = "") -> str:
    """prefix + v for a non-empty text cell (empty text reads back from a CSV as nan), else ''."""
    return f"{prefix}{v}" if isinstance(v, str) and v else ""


def to_markdown(df: pd.DataFrame, fmt=fmt, open_interval: bool = True) -> str:
    """Markdown table, cells written by `fmt`; a column c with c_lo and c_hi beside it is printed as one cell
    "c [lo, hi]" (open_interval False: "c" alone where lo is nan), and with c_tlo and c_thi (its t-interval) as
    "c t [tlo, thi]; bootstrap [lo, hi]" (the t-interval first, as every report prints a contrast)."""
    cols = [c for c in df.columns if not (c.endswith(("_lo", "_hi")) and c[:-3] in df.columns)
            and not (c.endswith(("_tlo", "_thi")) and c[:-4] in df.columns)]
    ci = {c for c in cols if c + "_lo" in df.columns and c + "_hi" in df.columns}
    tci = {c for c in cols if c + "_tlo" in df.columns and c + "_thi" in df.columns}

    def cell(row, c):
        if pd.isna(row[c]) or c not in ci or not (open_interval or not pd.isna(row[c + "_lo"])):
            return fmt(row[c], c)
        boot = f"[{fmt(row[c + '_lo'], c)}, {fmt(row[c + '_hi'], c)}]"
        if c in tci and not pd.isna(row[c + "_tlo"]):
            return f"{fmt(row[c], c)} t [{fmt(row[c + '_tlo'], c)}, {fmt(row[c + '_thi'], c)}]; bootstrap {boot}"
        return f"{fmt(row[c], c)} {boot}"

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(row, c) for c in cols) + " |" for _, row in df.iterrows()]
    return "\n".join(lines) + "\n"


def save(art: Artifacts, name: str, df: pd.DataFrame, title: str, note: str = "", models: str = "runs",
         csv_only: tuple[str, ...] = ()) -> pd.DataFrame:
    """tables/<name>.csv and .md; the .md opens with what the series cannot show (`caveat_line`) and which models
    made it (`made_by`: "runs" or "bench"), and leaves out the `csv_only` columns (values for the code that reads the
    CSV, printed rounded in another column)."""
    write_csv(art.tables / f"{name}.csv", df)
    head = "\n".join(x for x in (caveat_line(art), made_by(art, models), note_items(note)) if x)
    write_text(art.tables / f"{name}.md", f"### {title}\n\n" + (f"{head}\n\n" if head else "")
               + to_markdown(df.drop(columns=[c for c in csv_only if c in df])))
    return df


def by_temperature(path: Path) -> tuple:
    """Sort key of a table / figure file: its name with the temperature after _T read as a number (T0 < T0.6 < T1)."""
    stem, _, rest = path.stem.partition("_T")
    num = re.match(r"[0-9.]*[0-9]", rest)
    return stem, float(num.group()) if num else -1.0, rest


def read_table(art: Artifacts, name: str, **kw) -> pd.DataFrame | None:
    """tables/<name>.csv as rendered (`kw`: pandas.read_csv's), None when absent: what the report's text reads."""
    path = art.tables / f"{name}.csv"
    return pd.read_csv(path, **kw) if path.exists() else None


def note_items(note: str, longest: int = 300) -> str:
    """A table's note as it reads: as it stands when short, else its sentences and '; '-separated definitions
    (outside brackets) as a bullet list, one an item, so no item runs on for hundreds of characters."""
    if len(note) <= longest:
        return note
    items, depth, cur = [], 0, ""
    for i, ch in enumerate(note):
        depth += (ch in "([") - (ch in ")]")
        cut = ch == ";" or (ch == "." and not re.search(r"(\be\.g|\bi\.e|\bvs|\d)$", cur))
        if cut and depth == 0 and note[i + 1:i + 2] == " ":
            items.append(cur.strip() + ("." if ch == "." else ""))
            cur = ""
            continue
        cur += ch
    items.append(cur.strip())
    return "\n".join(f"- {x}" for x in items if x)


def caveat_line(art: Artifacts) -> str:
    """The series' caveat (`Artifacts.caveat`) as the blockquote that opens REPORT.md and every table; "" without."""
    return f"> {art.caveat}\n" if art.caveat else ""


def made_by(art: Artifacts, what: str = "runs") -> str:
    """Which models a table comes from: the pooled realizations and the commits their run meta files record (most
    frequent first; `what` = "bench": the commit of each realization's bench/meta.json)."""
    def one(r):
        sha = r.bench_commit if what == "bench" else ", ".join(c for c, _ in r.commits[:2])
        return f"{r.name} at {sha or 'no recorded commit'}"
    return "Models: " + "; ".join(one(r) for r in art.realizations) + "." if art.realizations else ""


def skip(what: str, why: str = "no data", empty=None):
    """Say that a table or figure is not rendered, and why; returns `empty` (what its renderer returns then)."""
    print(f"[report] skip {what}: {why}")
    return empty


def _ci(row, col: str, name: str | None = None, scale: float = 1) -> dict:
    """{name: row[col], name_lo, name_hi} (and name_tlo, name_thi where row has the t-interval), each x `scale`."""
    return {f"{name or col}{s}": scale * row[f"{col}{s}"] for s in ("", "_lo", "_hi", "_tlo", "_thi")
            if s in ("", "_lo", "_hi") or f"{col}_tlo" in row}


PAIRED = {"": "diff", "_lo": "lo", "_hi": "hi", "_tlo": "t_lo", "_thi": "t_hi", "_p": "p"}  # column suffix -> field
BOOT = ("", "_lo", "_hi", "_p")  # the columns of a contrast read by its bootstrap alone


def prefixed(r: dict, prefix: str, suffixes=tuple(PAIRED)) -> dict:
    """`stats.paired` fields as table columns: prefix (the difference), _lo, _hi (bootstrap), _tlo, _thi (t at the
    top level), _p (bootstrap), those of `suffixes`; nan where r lacks one."""
    return {prefix + s: r.get(PAIRED[s], math.nan) for s in suffixes}


def _paired(art, key, a: str, b: str, prefix: str) -> dict:
    """Paired difference a - b of per-request acceptance length over the realizations, seeds and requests both runs
    have (data.paired_runs), as the columns `prefixed` names."""
    return prefixed(paired_runs(art, key, a, b) if a != b else {}, prefix)


# --- tables ------------------------------------------------------------------------------------------------------
LOOP_COLS = ["repeat_rate", "loop_frac", "acceptance_length_loopfree", "n_loops", "length_frac"]
ABLATION_COUNTS = ["n_realizations", "n_seeds", "n_requests", "n_zero_round", "n_rounds"]
ABLATION_NOTE = ("acceptance_length = per-request mean incl. bonus, pooled over n_realizations realizations x n_seeds "
                 "drafter seeds; [lo, hi] = hierarchical bootstrap 95% CI over realizations, seeds and requests; "
                 "t [lo, hi] = 95% t-interval over the top level's units (realizations when there are several, else "
                 "seeds); first_token: rounds accepting >= 1 draft / rounds, the same bootstrap; rel_to_{ref} in "
                 "percent; vs_* = paired (by realization, seed and request) mean difference of per-request acceptance "
                 "length with both intervals and the two-sided bootstrap p (vs_*_p, not multiplicity-corrected: see "
                 "the pairwise tables). repeat_rate = mean 8-gram repeat rate; loop_frac = share of emitted tokens "
                 "inside a trailing exact loop; acceptance_length_loopfree = the same mean over rounds before any "
                 "loop; length_frac = share of requests stopped by the length cap; n_zero_round = requests (x seeds) "
                 "without a verify round (listed in REPORT.md). blog_value: the blog's Code ablation (8 inputs), "
                 "relative to token_only.")


def ablation(art: Artifacts) -> list[pd.DataFrame] | None:
    """The ablation (experiment `ablation`), one table per dataset and mode (natural: `ablation_<name>`, fixed:
    `ablation_<name>_fixed`): a row per method and temperature, in the spec's row groups (`table`; a method the
    spec does not name: "other"); its columns: ABLATION_NOTE."""
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
                             f"rel_to_{ref_m}": pct(r.acceptance_length, ref),
                             **{c: r[c] for c in ABLATION_COUNTS + LOOP_COLS},
                             "blog_value": R.ablation_value(r.method),
                             "blog_rel_pct": R.ablation_value(r.method, "rel_to_token_only_pct"),
                             "table": art.spec.group(r.method),
                             **_paired(art, key, r.method, ref_m, f"vs_{ref_m}"),
                             **_paired(art, key, r.method, base_m, f"vs_{base_m}")})
        df = pd.DataFrame(rows)
        df = df.iloc[np.lexsort((df.temperature, art.order(df.method), df.table.map(GROUPS.index)))]
        note = ("Mode natural (stop at end-of-text or a HumanEval stop string): the acceptance table. "
                if mode == "natural" else "MODE FIXED (end-of-text ignored, fixed length: the blog's throughput "
                "setting; outputs may run into loops): not the acceptance table. ") + ABLATION_NOTE.format(ref=ref_m)
        # the blog's Code ablation used 8 code inputs: our `humaneval8` view is *the* ablation_code table
        name = ("ablation_code" if ds == "humaneval8" else f"ablation_{ds}") + ("_fixed" if mode == "fixed" else "")
        title = f"Code ablation — {ds}" + (" — fixed-length mode" if mode == "fixed" else "")
        out.append(save(art, name, df.reset_index(drop=True), title, note))
    return out


KEY = ["experiment", "dataset", "temperature"]  # a natural-mode table's row key (`_groups`)


def _groups(art: Artifacts, methods) -> list[tuple[tuple, pd.DataFrame]]:
    s = art.natural
    s = s[s.method.isin(methods)] if len(s) else s
    return list(s.groupby(KEY, sort=True)) if len(s) else []


def main_acceptance(art: Artifacts) -> pd.DataFrame | None:
    """DFlash / native MTP / DMTP (the spec's drafter baseline, mtp, main method) per dataset, gain of DMTP over
    DFlash, blog values beside."""
    cols = main_columns(art)
    if {"dflash", "dmtp"} - set(cols):
        return skip("main acceptance table (the spec names no main method or drafter baseline)")
    rows = []
    for key, g in _groups(art, cols.values()):
        by = g.set_index("method")
        row = dict(zip(KEY, key))
        for col, m in cols.items():
            row.update(_ci(by.loc[m], "acceptance_length", col) if m in by.index else {col: math.nan})
        row["gain_pct"] = pct(row["dmtp"], row["dflash"])
        row.update(_paired(art, key, cols["dmtp"], cols["dflash"], "dmtp_vs_dflash"))
        if "main" in cols:  # the current main method against the blog's DMTP model and against DFlash
            row["main_gain_pct"] = pct(row["main"], row["dflash"])
            row.update(_paired(art, key, cols["main"], cols["dmtp"], "main_vs_dmtp"))
        row.update({f"blog_{col}": blog_acceptance(key[1], key[2], col) for col in cols})
        row["blog_gain_pct"] = blog_acceptance(key[1], key[2], "dmtp_vs_dflash_pct")  # as the blog prints it
        rows.append(row)
    if not rows:
        return skip("main acceptance table")
    df = pd.DataFrame(rows).dropna(axis=1, how="all")
    main = (f"; main = {cols['main']} (the current main method, no blog number of its own: the blog says it is "
            "'close to fusion')") if "main" in cols else ""
    return save(art, "main_acceptance", df, "Acceptance length: DFlash vs native MTP vs DMTP",
                "Mode natural. Per-request mean incl. bonus, realizations and seeds pooled, hierarchical bootstrap 95% "
                "CI over realizations, seeds and requests (t: t-interval over the top level's units); dmtp = "
                f"{cols['dmtp']} (the model behind every DMTP number of the blog){main}; dflash = {cols['dflash']}. "
                "*_vs_* = paired differences. blog_*: open reproduction at T=0, internal 35B table otherwise.")


def first_token(art: Artifacts) -> pd.DataFrame | None:
    """First-token acceptance 1 - h[0]/sum h (percent) per dataset and method, hierarchical bootstrap CI."""
    s = art.drafting
    if s.empty:
        return skip("first-token table")
    df = s[[*KEY, "method"]].assign(**_ci(s, "first_token", "first_token_pct", 100), n_rounds=s.n_rounds)
    df["blog_pct"] = [blog_first_token(d, t, blog_name(art, m)) for d, t, m in zip(s.dataset, s.temperature, s.method)]
    return save(art, "first_token", df.reset_index(drop=True), "First-token acceptance (%)",
                "P(L>=1) over verify rounds (bonus excluded), realizations and seeds pooled; hierarchical bootstrap "
                "95% CI over realizations, seeds and requests.")


def direction_runs(art: Artifacts) -> tuple[list[str], list[str]]:
    """(the runs of the blog's closing directions present: `given` and its count rules, `zero_init_residual_joint`,
    MTP415 on its tuned head `mtp.<run>`; the references beside them: MTP415, the drafter baseline, the main
    method). Both empty when no direction run exists."""
    have = set(art.natural.method) if len(art.natural) else set()
    mine = sorted((m for m in have if m.split("-")[0] in DIRECTIONS or m.startswith("mtp.")), key=art.rank)
    refs = [m for m in ("mtp", art.spec.drafter_baseline, art.spec.main_method) if m and m in have]
    return (mine, refs) if mine else ([], [])


DIRECTIONS = ("given", "zero_init_residual_joint")  # variants of the blog's closing directions (docs/DESIGN.md)


def directions(art: Artifacts) -> pd.DataFrame | None:
    """The blog's closing directions (`direction_runs`) per dataset and temperature: acceptance length and
    first-token acceptance with their intervals, and the paired difference from each reference. Exploratory."""
    mine, refs = direction_runs(art)
    if not mine:
        return skip("directions table (no run of given / zero_init_residual_joint)")
    rows = []
    for key, g in _groups(art, mine + refs):
        by = g.set_index("method")
        for m in (m for m in mine if m in by.index):
            row = dict(zip(KEY, key), method=m, k=by.loc[m, "k"], **_ci(by.loc[m], "acceptance_length"),
                       **_ci(by.loc[m], "first_token", "first_token_pct", 100))
            for ref in (r for r in refs if r in by.index):
                row.update(_paired(art, key, m, ref, f"vs_{ref}"))
            rows.append(row)
    if not rows:
        return skip("directions table")
    return save(art, "directions", pd.DataFrame(rows), "The blog's closing directions (exploratory)",
                "Mode natural. given: T1..Tg from the MTP chain, g per round by its top probability "
                "(given-p<t>: threshold t; given-g<n>: always n); zero_init_residual_joint: the MTP head trained "
                "with the drafter on its own weighted loss; mtp.<run>: MTP415 on that run's tuned head. Acceptance "
                "length per request incl. bonus, hierarchical bootstrap 95% CI (t: over the top level's units); "
                "vs_<run>: paired difference (bootstrap and t intervals, p). Exploratory: no claim is decided here.")


def position(art: Artifacts) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """Cumulative P(L>=k) and conditional P(L>=k | L>=k-1), k = 1..7, in percent; the conditional table also
    carries the blog's rows (source = blog) for the workloads our datasets map to."""
    s = art.drafting
    if s.empty:
        return skip("per-position tables")
    base = s[[*KEY, "method", "n_rounds"]].reset_index(drop=True)

    def per_k(fn, col, K=7):
        pct = [(list(100 * np.array(fn(h))) + [math.nan] * K)[:K] for h in s["hist"]]
        return pd.concat([base, pd.DataFrame(pct, columns=[f"{col}{k}" for k in range(1, K + 1)])], axis=1)
    cum, cond = per_k(M.cumulative, "k"), per_k(M.conditional, "c")
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
    s = art.drafting
    if s.empty:
        return skip("per-request vs per-verify table")
    df = s[[*KEY, "method", "n_requests", "n_rounds"]].copy()
    df["per_request"], df["per_verify"] = s.acceptance_length, s.per_verify
    df["diff"] = df.per_request - df.per_verify
    blog = R.table("per_request_vs_verify")
    look = {(w, m): (a, b) for w, m, a, b in blog.itertuples(index=False)}
    bl = [look.get((R.workload(d), blog_name(art, m)), (math.nan, math.nan)) if t != 0 else (math.nan, math.nan)
          for d, t, m in zip(s.dataset, s.temperature, s.method)]
    df["blog_per_request"], df["blog_per_verify"] = [b[0] for b in bl], [b[1] for b in bl]
    return save(art, "per_request_vs_verify", df.reset_index(drop=True), "Per-request vs per-verify acceptance length",
                "per_request: mean of each request's own tau; per_verify: 1 + sum k*h[k] / sum h over all rounds.")


def realization_number(label) -> int | None:
    """k of a realization label "r<k>" (None for "all" and other labels)."""
    k = str(label).lstrip("r")
    return int(k) if k.isdigit() else None


def headline_throughput(tab: pd.DataFrame) -> pd.DataFrame:
    """The throughput rows a sentence or figure reads: every realization pooled ("all") where they could pool, else
    the newest realization's (by number)."""
    if not len(tab):
        return tab
    if (tab.realization == "all").any():
        return tab[tab.realization == "all"]
    newest = max(tab.realization, key=lambda r: realization_number(r) if realization_number(r) is not None else -1)
    return tab[tab.realization == newest]


def throughput_table(art: Artifacts) -> pd.DataFrame | None:
    """The throughput rows (bench.throughput) with the blog's B32 numbers beside the T = 1 rows of its batch cap
    (Code: the blog's dflash and dmtp tok/s and gain, and its per-verify gain from the acceptance table)."""
    if art.throughput is None or art.throughput.empty:
        return None
    sp = art.spec
    df = B.throughput(art.throughput, sp.main_method, sp.drafter_baseline,
                      {f"r{r.k}": r.bench_commit for r in art.realizations},
                      {f"r{r.k}": r.bench_device for r in art.realizations})
    blog = R.table("throughput")
    look = {(w, m, b): v for w, m, b, v, _ in blog.itertuples(index=False)}
    at = (df.temperature == 1) & (df.method == sp.main_method)
    for col, m in (("blog_dflash_tok_per_s", "dflash"), ("blog_dmtp_tok_per_s", "dmtp")):
        df[col] = [look.get((R.workload(d), m, b), math.nan) if a else math.nan
                   for d, b, a in zip(df.dataset, df.batch_cap, at)]
    df["blog_gain_pct"] = pct(df.blog_dmtp_tok_per_s, df.blog_dflash_tok_per_s)
    df["blog_per_verify_gain_pct"] = [R.blog_value("main", d, "dmtp_vs_dflash_pct") if a and not math.isnan(g)
                                      else math.nan for d, a, g in zip(df.dataset, at, df.blog_gain_pct)]
    df = df.iloc[np.lexsort((art.order(df.method), df.batch_cap, df.temperature, df.dataset,
                             df.realization == "all"))]
    return df.reset_index(drop=True)


def main_gains(art: Artifacts, temperature: float | None = None) -> pd.DataFrame | None:
    """Each realization's own rows of `throughput_table` (not the pooled "all") where the main method has a gain over
    the drafter baseline, at T when given; None without a bench or a main method."""
    tab = throughput_table(art)
    if tab is None or not art.spec.main_method:
        return None
    df = tab[(tab.method == art.spec.main_method) & tab.gain_pct.notna() & (tab.realization != "all")]
    return df if temperature is None else df[df.temperature == temperature]


def throughput(art: Artifacts) -> pd.DataFrame | None:
    """tables/throughput: `throughput_table`, its columns as the note reads them."""
    df = throughput_table(art)
    if df is None:
        return skip("throughput table (bench/throughput.csv)")
    sp = art.spec
    return save(art, "throughput", df.dropna(axis=1, how="all"), "End-to-end throughput (tok/s)",
                "Each row: the timed runs of one (realization, temperature, batch cap, method): the whole request "
                "group served with dynamic batching (natural mode, HumanEval's stop strings), repeats interleaved side "
                "by side; tok_per_s = median [min, max] over repeats; speedup = median [min, max] of the per-repeat "
                "tok/s ratios to AR; per_verify = median tau per verify round; at T = 0 equal_ar = the fewest requests "
                "whose output equals AR's in any repeat (bf16: the rest leave it at top-2 ties) of requests; "
                "tokens_vs_ar_pct = their output tokens against AR's (another workload than AR's when not 0); "
                "speedup_on_ar_outputs = the speed-up x its tau on the prefixes shared with AR's outputs / its tau (an "
                f"estimate of the speed-up on AR's own text; benches from 2026-12-06 on); on the {sp.main_method} rows "
                f"gain_pct = its tok/s over {sp.drafter_baseline}'s (median [min, max] of per-repeat ratios), "
                "per_verify_gain_pct the same for per-verify tau, gain_over_per_verify their ratio. realization 'all': "
                "every repeat of every realization pooled. blog_*: Qwen3.6-35B-A3B on 4xH200, TP4, SGLang, B32, T = 1 "
                "(Code) — another model and serving regime: compare directions and the gain against the per-verify "
                "gain, not tok/s.", models="bench")


def overhead(art: Artifacts) -> pd.DataFrame | None:
    """ms per round by stage and method at batch 8 (ours: the trained models, median over the pooled realizations;
    "<setup>:<method>" rows: random-weight shape timings), with the blog's §6.5 rows beside (blog:<workload>:<m>)."""
    if art.overhead is None or art.overhead.empty:
        return skip("overhead table (bench/overhead.csv)")
    stages = ["drafter", "mtp", "mtp_chain", "t1_prep", "drafter_ctx", "verify", "round"]
    ov = art.overhead
    ov = ov[ov.batch == B.SHAPE_BATCH] if "batch" in ov else ov
    ours = ov.pivot_table(index="method", columns="stage", values="ms_per_round", aggfunc="median")
    blog = R.table("overhead").assign(method=lambda b: "blog:" + b.workload + ":" + b.method)
    blog = blog.pivot_table(index="method", columns="stage", values="ms_per_round", dropna=False)
    df = pd.concat([ours.loc[sorted(ours.index, key=art.rank)], blog])
    df = df[[c for c in stages if c in df.columns]].reset_index()
    df.columns.name = None
    dflash = art.spec.drafter_baseline
    if "round" in df and dflash:  # against the DFlash row of the same setup and engine label ("+dense": the dense
        # attention kernel, "@hf": the HF layers)
        setup, _, name = (df.method.str.rpartition(":")[i] for i in (0, 1, 2))
        base = name.str.split(r"[+@]", n=1, regex=True).str[0]
        label = [n[len(b):] for n, b in zip(name, base)]
        ref = {(s, lb): r for s, b, lb, r in zip(setup, base, label, df["round"]) if b == dflash}
        df["round_vs_dflash_ms"] = [r - ref.get((s, lb), math.nan) for s, lb, r in zip(setup, label, df["round"])]
        df["round_vs_dflash"] = [r / ref.get((s, lb), math.nan) for s, lb, r in zip(setup, label, df["round"])]
        df.loc[df.method.str.startswith("blog:"), ["round_vs_dflash_ms", "round_vs_dflash"]] = math.nan
    return save(art, "overhead", df, "Per-round overhead (ms/round)",
                "Batch 8, CUDA graphs, EOS ignored, first 16 rounds excluded (blog §6.5 "
                "setting); plain names: the trained models, median over the pooled realizations. 8b-shape: a "
                "Qwen3-8B-sized target with random weights, 5-layer drafters (timing only); mini-shape: the mini "
                "shapes with random weights.", models="bench")


def costmodel_rows(art: Artifacts) -> pd.DataFrame | None:
    """Per pooled realization with a bench: the cost model's predicted vs measured speed-ups over AR at T = 0 and
    each timed cap (bench.predicted_vs_measured), then the projection to the 8B shape (bench.projection)."""
    if art.overhead is None:
        return None
    r, ov = art.runs, art.overhead
    tp = art.throughput if art.throughput is not None else pd.DataFrame(columns=["realization"])
    rows = []
    for real in art.realizations:
        recs = B.timed_records(r[r.realization == real.k])
        if recs.empty:
            continue
        mine_tp, mine_ov = tp[tp.realization == real.k], ov[ov.realization == real.k]
        timed = real  # the realization whose trained models' stage times are used
        if not mine_tp.empty and mine_ov.empty:  # throughput without stage times: another pooled realization's
            other = [x for x in art.realizations if x.k != real.k and not ov[ov.realization == x.k].empty]
            if other:  # the same kind of device first, then the nearest number
                timed = min(other, key=lambda x: (x.bench_device != real.bench_device, abs(x.k - real.k)))
                mine_ov = ov[ov.realization == timed.k]
        out = B.predicted_vs_measured(recs, mine_tp, mine_ov) if not (mine_tp.empty or mine_ov.empty) else []
        out = [dict(x, round_times_from=timed.name, device=real.bench_device, round_times_device=timed.bench_device)
               for x in out]
        if not out and not mine_ov.empty:  # its models timed, their throughput not: the prediction alone
            out = B.predicted(recs, mine_ov)
        for name in B.SHAPES:  # the shapes timed with random weights, this realization's acceptance
            out += B.projection(recs, ov[ov.method.str.startswith(name + ":")], shape_name=name)
        rows += [dict(x, realization=real.name, commit=real.bench_commit) for x in out]
    if not rows:
        return None
    df = pd.DataFrame(rows)
    lead = ["realization", "commit", "kind", "method", "batch_cap"]
    return df[lead + [c for c in df.columns if c not in lead]]


def costmodel(art: Artifacts) -> pd.DataFrame | None:
    """tables/costmodel: predicted vs measured speed-up per realization, and the 8B-shape projection."""
    df = costmodel_rows(art)
    if df is None:
        return skip("cost-model table (bench/throughput.csv, bench/overhead.csv and T = 0 eval records)")
    return save(art, "costmodel", df, "Cost model: predicted vs measured speed-up over AR (T = 0)",
                "predicted vs measured: dmtp.analysis.costmodel.predict on the realization's eval records (HumanEval, "
                "T = 0, natural, seed 0; the first n_requests, as the bench timed at that cap), its trained models' "
                "round time per batch and the admission cost the throughput runs measured; round_ms_b*: the round "
                "times (overhead.csv); round_times_from: the realization whose trained models were timed (another "
                "pooled one of the same shapes where this one has throughput but no stage times, on the same kind of "
                "device where one has them); device / round_times_device: the devices the throughput and the stage "
                "times ran on (a ratio of speed-ups read across two devices is an approximation); round_timed_at_cap "
                "false: that batch's round was not timed, the nearest timed batch's stands in (an extrapolation); "
                "admit_ms = median over repeats of admit_s / groups: what admission held the decode; beside_ms = the "
                "same of beside_s, the device time of the prompt passes run beside the decode, charged in full; "
                "predicted_speedup_hidden: with them wholly hidden, the other bound; rows <method>@<variant>: a server "
                "variant timed beside the plain servers, against its own AR; measured_speedup = median [min, max] of "
                "the per-repeat ratios; error_pct = 100 (predicted / measured - 1). predicted, trained models' stage "
                "times: the same model where the throughput was not measured, all T = 0 records, decode only (no "
                "admission cost): a prediction, not a measurement. projection 8b-shape: the same records x the "
                "8B-shape round times at batch 8 (random weights, flex attention; AR's step: 8b-shape:ar@batch1), "
                "decode only (no admission cost), the one round time used at every batch: a projection, not a "
                "measurement.", models="bench")


def open_repro(art: Artifacts) -> pd.DataFrame | None:
    """The blog's open-reproduction layout: MTP415, DFlash, DMTP(D), DFlash2, DMTP(D2) per dataset present."""
    cols = open_columns(art)
    if set(OPEN_LABEL) - set(cols):
        return skip("open-reproduction table (the spec names no DFlash2 runs of the drafter baseline and main method)")
    blog_col = {"dmtp_d": "dmtp"}  # the blog's open_repro table calls DMTP(D) "dmtp"
    rows = []
    for key, g in _groups(art, cols.values()):
        by = g.set_index("method")
        rows.append(_open_row(key, {c: [by["acceptance_length" + s].get(m, math.nan) for s in ("", "_lo", "_hi")]
                                    for c, m in cols.items()},  # the blog's table is at T=0
                              **{f"blog_{c}": R.blog_value("open_repro", key[1], blog_col.get(c, c)) if key[2] == 0
                                 else math.nan for c in cols}))
        rows += _turn_rows(art, key, cols)
    if not rows:
        return skip("open-reproduction table")
    df = pd.DataFrame(rows)
    if "turn" in df:  # pooled rows: every turn ("all")
        df.insert(3, "turn", df.pop("turn").map(lambda t: "all" if pd.isna(t) else str(int(t))))
    return save(art, "open_repro", df, "Open-reproduction layout (per-request acceptance length)",
                "Columns: " + ", ".join(f"{c} = {OPEN_LABEL[c]} ({m})" for c, m in cols.items())
                + "; [lo, hi]: hierarchical bootstrap 95% CI over realizations, seeds and requests (MT-Bench: each "
                "turn a request; its rows with a turn: that turn's requests alone); blog_*: Qwen3.6-27B, T=0.")


def _turn_rows(art: Artifacts, key: tuple, cols: dict[str, str]) -> list[dict]:
    """Rows of the open-reproduction layout for each turn of a multi-turn set (record ids "<question>:t<turn>"),
    each turn's requests alone; none for a single-turn set."""
    g = select(art.runs, experiment=key[0], dataset=key[1], temperature=key[2], mode="natural")
    turn = g.id.astype(str).str.extract(TURN, expand=False)
    if turn.isna().any() or turn.nunique() < 2:
        return []
    out = []
    for t in sorted(turn.unique(), key=int):
        subs = {c: g[(turn == t) & (g.method == m)] for c, m in cols.items()}
        out.append(_open_row(key, {c: S.seed_request_ci(cube(x), n_boot=2000) if len(x) else (math.nan,) * 3
                                   for c, x in subs.items()}, turn=int(t)))
    return out


def _open_row(key: tuple, ci: dict[str, tuple], **extra) -> dict:
    """A row of the open-reproduction layout: each column's value, lo, hi (`ci`), DMTP's gain on either backbone,
    then `extra`."""
    row = dict(zip(KEY, key))
    for c, v in ci.items():  # the value and its hierarchical bootstrap interval (printed "v [lo, hi]")
        row.update(zip([c, c + "_lo", c + "_hi"], v))
    return dict(row, dmtp_d_vs_dflash_pct=pct(row["dmtp_d"], row["dflash"]),
                dmtp_d2_vs_dflash2_pct=pct(row["dmtp_d2"], row["dflash2"]), **extra)


TURN = r":t(\d+)$"  # MT-Bench record ids "<question_id>:t<turn>" (engine.runner.mtbench_generate)


def turns(art: Artifacts) -> pd.DataFrame | None:
    """Multi-turn sets (MT-Bench) per turn: per-request acceptance length of each turn's requests, its hierarchical
    bootstrap interval, and first-token acceptance, per method; the blog reports the turns pooled."""
    r = art.runs
    r = r[(r["mode"] == "natural") & r.id.astype(str).str.contains(r":t\d+$")] if len(r) else r
    if r.empty:
        return skip("per-turn table (no multi-turn records)")
    r = r.assign(turn=r.id.astype(str).str.extract(TURN, expand=False).astype(int))
    rows = []
    for (exp, ds, t, m, turn), g in r.groupby(["experiment", "dataset", "temperature", "method", "turn"], sort=True):
        K, hist = pooled_hist(g)
        al = S.seed_request_ci(cube(g), n_boot=2000) if len(g) else (math.nan,) * 3
        rows.append({"experiment": exp, "dataset": ds, "temperature": t, "method": m, "turn": turn,
                     "n_requests": int((g.n_rounds > 0).sum()), "n_rounds": int(hist.sum()),
                     **dict(zip(["acceptance_length", "acceptance_length_lo", "acceptance_length_hi"], al)),
                     "first_token_pct": 100 * M.first_token(hist) if K > 0 and hist.sum() else math.nan})
    df = pd.DataFrame(rows)
    df = df.iloc[sorted(range(len(df)), key=lambda i: (df.experiment[i], df.dataset[i], df.temperature[i],
                                                       art.rank(df.method[i]), df.turn[i]))].reset_index(drop=True)
    return save(art, "turns", df, "Per turn (MT-Bench): per-request acceptance length",
                "Each turn's requests alone (turn 2 on the model's own first answer); [lo, hi]: hierarchical bootstrap "
                "95% CI; first_token_pct: rounds accepting >= 1 draft / rounds of that turn.")


# --- research protocol: pairwise tests, the control, ceilings at T > 0, learning curves, zero-round requests ---------
def primary(art: Artifacts) -> list[str]:
    """The ablation's datasets that are neither views of another (experiment.json eval.subsets) nor
    out-of-distribution sets (eval.ood), natural mode."""
    s = art.natural
    ds = sorted(set(s[s.experiment == "ablation"].dataset)) if len(s) else []
    own = [d for d in ds if d not in (art.subsets or {}) and d not in (art.ood or {})]
    return own or ds


def compared(art: Artifacts, dataset: str, temperature: float) -> list[str]:
    """The pairwise-test rows present at (dataset, T): the spec's drafting baselines, main and control runs."""
    have = set(art.ablation(dataset, temperature).method)
    return [m for m in art.spec.compared if m in have]


def signs_text(signs) -> str:
    """Each realization's mean difference, e.g. '+0.910 / +0.940 / -0.020'."""
    return " / ".join(f"{x:+.3f}" for x in signs)


def exact_text(signs) -> str:
    """Each realization's mean difference unrounded (Python's shortest round-trip form), ' / '-separated: what a
    test over realizations reads back (`read_exact`)."""
    return " / ".join(repr(float(x)) for x in signs)


def read_exact(text) -> list[float]:
    """The values `exact_text` wrote."""
    return [float(v) for v in str(text).split(" / ") if v not in ("", "nan")]


def pairwise(art: Artifacts, n_boot: int = CONTRAST_BOOT) -> list[pd.DataFrame] | None:
    """tables/pairwise_T<t>: every pair of the compared rows (`compared`) on each primary dataset, paired
    (stats.matrices), Holm-corrected over the dataset's whole family and worded by stats.holm_family."""
    temps = sorted(set(art.natural.temperature)) if len(art.natural) else []
    rows = []
    for ds in primary(art):
        family = []
        for t in temps:
            methods = compared(art, ds, t)
            if len(methods) < 2:
                continue
            mats = S.matrices({m: per_unit(group(art, "ablation", ds, t, m)) for m in methods})[0]
            est = {m: S.mean(x) for m, x in mats.items()}
            family += [dict(r, dataset=ds, temperature=t, a_value=est[r["a"]], b_value=est[r["b"]])
                       for r in S.pairwise(mats, n_boot=n_boot)]
        rows += S.holm_family(family)
    out = []
    for t in sorted({r["temperature"] for r in rows}):
        df = pd.DataFrame([{
            "dataset": r["dataset"], "temperature": t, "a": r["a"], "b": r["b"], "a_value": r["a_value"],
            "b_value": r["b_value"], **prefixed(r, "diff"), "t_p": r["t_p"], "holm_p": r["p_holm"],
            "holm_t_p": r["t_p_holm"], "t_level": r["t_level"], "n_units": r["n_units"],
            "n_realizations": len(r["signs"]), "sign_agree": sum(S.agree([x], r["diff"]) for x in r["signs"]),
            "by_realization": signs_text(r["signs"]), "verdict": r["verdict"], "n_seeds": r["n_seeds"],
            "n_requests": r["n_requests"], "realization_diffs": exact_text(r["signs"])}
            for r in rows if r["temperature"] == t])
        n = len(rows)
        out.append(save(art, f"pairwise_T{t:g}", df, f"Pairwise tests at T={t:g} (natural mode)",
                        "diff = a - b of per-request acceptance length, paired by realization, seed and request "
                        "(the units and requests every row has; a baseline without a drafter set beside every seed "
                        "of its realization); [lo, hi] = hierarchical bootstrap 95% CI, diff_p its two-sided p; "
                        "t [lo, hi] = 95% t-interval over the t_level units (realization means when there are "
                        "several realizations, else seed means), t_p its p; holm_p, holm_t_p = Holm-adjusted over "
                        f"the family of all {n} pairs x temperatures of the table's dataset; by_realization = each "
                        "realization's own difference, sign_agree = how many have the pooled sign. verdict: '>' / "
                        "'<' only where holm_p and holm_t_p are both < 0.05 and every realization agrees in sign; "
                        "otherwise 'not resolved' (no claim of closeness: that needs an equivalence test); "
                        "realization_diffs (CSV only) = by_realization unrounded, what every test over realizations "
                        "reads.", csv_only=("realization_diffs",)))
    return out or skip("pairwise tables (fewer than two compared rows)")


def pair_row(art: Artifacts, a: str, b: str, t: float, dataset: str | None = None) -> dict | None:
    """The pairwise-table row of a vs b at T (either order; signs flipped to read a - b: each realization's own
    difference unrounded, from `realization_diffs`), or None."""
    df = read_table(art, f"pairwise_T{t:g}", keep_default_na=False, na_values=[""],
                    dtype={"by_realization": str, "realization_diffs": str})
    if df is None:
        return None
    df = df[df.dataset == (dataset or primary(art)[0])] if len(df) else df
    for flip, (x, y) in ((1, (a, b)), (-1, (b, a))):
        r = df[(df.a == x) & (df.b == y)]
        if len(r):
            r = r.iloc[0].to_dict()
            lo, hi = sorted((flip * r["diff_lo"], flip * r["diff_hi"]))
            tlo, thi = sorted((flip * r["diff_tlo"], flip * r["diff_thi"]))
            exact = r.get("realization_diffs")  # unrounded (a table of before the column: the rounded values)
            signs = [flip * v for v in read_exact(exact if isinstance(exact, str) else r["by_realization"])]
            both = max(r["holm_p"], r["holm_t_p"]) if not pd.isna(r["holm_t_p"]) else r["holm_p"]
            return dict(r, a=a, b=b, diff=flip * r["diff"], diff_lo=lo, diff_hi=hi, diff_tlo=tlo, diff_thi=thi,
                        a_value=r["a_value" if flip > 0 else "b_value"], signs=signs,
                        b_value=r["b_value" if flip > 0 else "a_value"],
                        verdict=S.verdict(a, b, flip * r["diff"], both, same_sign=S.agree(signs, flip * r["diff"])))
    return None


def ceiling(art: Artifacts) -> list[pd.DataFrame] | None:
    """tables/ceiling_T<t> (T > 0): each run's measured cumulative acceptance P(L>=j) per draft position (%, seeds
    pooled) beside the oracle ceiling C_j along the `ar` trajectory (oracle/<dataset>_T<t>.json), and per-verify
    tau beside 1 + sum_j C_j; of_ceiling_pct = (tau - 1) / sum_j C_j in percent."""
    if not art.oracle:
        return skip("ceiling tables (no oracle/*.json)")
    out = []
    for t in sorted({t for _, t in art.oracle if t > 0}):
        rows = []
        for (ds, _), rec in sorted(x for x in art.oracle.items() if x[0][1] == t):
            C = [float(c) for c in rec["cumulative"]]
            K = len(C)
            g = select(art.drafting, experiment="ablation", dataset=ds, temperature=t)
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
                            "P_j = P(L >= j) per verify round (%), mode natural, seeds pooled. Ceiling row: C_j = mean "
                            "over windows of the product of the target's top-1 probabilities at T along the `ar` "
                            "output (dmtp.analysis.oracle): C_1 bounds first-token acceptance of any greedy draft "
                            "under target-only verification; for j >= 2 the product runs along the target's sampled "
                            "path, not the draft path, so it is a reference profile rather than a strict bound "
                            "(docs/DESIGN.md). per_verify = 1 + sum_j C_j; of_ceiling_pct = (tau - 1) / sum_j C_j."))
    return out or skip("ceiling tables (no oracle file at T > 0)")


def curve_increments(art: Artifacts, n_boot: int = 2000) -> pd.DataFrame | None:
    """tables/curve_increments: per learning-curve run, the last increment (the last budget minus the one before,
    HumanEval T = 0), paired; Holm over the runs (one family: the sentence "the curves have (not) flattened")."""
    cv = art.curve
    if cv is None or cv.empty:
        return skip("curve increments (no curve/)")
    rows = []
    for m, g in cv.groupby("method", sort=True):
        steps = sorted(set(g.step))
        if len(steps) < 2:
            continue
        a, b = (g[g.step == k] for k in steps[-2:])
        mats = S.matrices({"last": per_unit(b), "before": per_unit(a)})[0]
        r = S.paired(mats["last"], mats["before"], n_boot=n_boot)
        rows.append({"method": m, "from_step": steps[-2], "to_step": steps[-1],
                     "from_tokens": a.train_tokens.mean(), "to_tokens": b.train_tokens.mean(),
                     **{k: r[k] for k in ("diff", "lo", "hi", "p", "t_level", "n_units", "t_lo", "t_hi", "t_p",
                                          "n_requests")}, "signs": " ".join(f"{x:+.3f}" for x in r["signs"])})
    if not rows:
        return skip("curve increments (fewer than 2 budgets)")
    df = pd.DataFrame(rows)
    df["p_holm"] = S.holm(df.p.to_numpy())
    df["t_p_holm"] = S.holm(df.t_p.to_numpy())
    df = df.iloc[sorted(range(len(df)), key=lambda i: art.rank(df.method.iloc[i]))]
    return save(art, "curve_increments", df.reset_index(drop=True),
                "Learning curve: the last increment (HumanEval, T=0, natural mode)",
                "diff [lo, hi]: paired acceptance length at the last budget minus the budget before (same prompts, "
                "realizations and seeds), hierarchical bootstrap 95% CI and p; t_lo/t_hi/t_p: the t-test over the "
                "top level's units (t_level); Holm over the runs. Budgets below the final step are annealed "
                "branches when experiment.json's ablation.anneal > 0.")


def curve_gaps(art: Artifacts, n_boot: int = 2000) -> pd.DataFrame | None:
    """tables/curve_gaps: at every learning-curve budget, each curve run's paired gain over the drafter baseline and
    against the native MTP head (where DFlash meets MTP415); rows with step "change": the test of "DMTP's gain over
    DFlash shrinks as the drafters mature"."""
    cv, base = art.curve, art.spec.drafter_baseline
    if cv is None or cv.empty or base not in set(cv.method):
        return skip("curve gaps (no learning curve of the drafter baseline)")
    ds = sorted(set(cv.dataset))[0]
    ref = group(art, "ablation", ds, 0.0, "mtp")
    steps = sorted(set(cv[cv.method == base].step))
    rows, change = [], []
    for m in sorted(set(cv.method), key=art.rank):
        have = [k for k in steps if ((cv.method == m) & (cv.step == k)).any()]
        cells = {}
        for k in have:
            g, b = cv[(cv.method == m) & (cv.step == k)], cv[(cv.method == base) & (cv.step == k)]
            units = {"m": per_unit(g), "b": per_unit(b), **({"mtp": per_unit(ref)} if len(ref) else {})}
            cells[k] = mats = S.matrices(units)[0]
            row = {"method": m, "step": k, "train_tokens": g.train_tokens.mean(),
                   "acceptance_length": float(np.nanmean(mats["m"]))}
            if m != base:
                r = S.paired(mats["m"], mats["b"], n_boot=n_boot)
                row.update(prefixed(r, "vs_base", BOOT), vs_base_pct=float(pct(np.nanmean(mats["m"]),
                                                                               np.nanmean(mats["b"]))))
            if "mtp" in mats:
                row.update(prefixed(S.paired(mats["m"], mats["mtp"], n_boot=n_boot), "vs_mtp", BOOT))
            rows.append(row)
        if m != base and len(have) >= 2:
            a, b = cells[have[0]], cells[have[-1]]
            if a["m"].shape == b["m"].shape:  # the same cells at both budgets
                r = S.paired(b["m"] - b["b"], a["m"] - a["b"], n_boot=n_boot)
                change.append({"method": m, "step": "change", "from_step": have[0], "to_step": have[-1],
                               **prefixed(r, "vs_base", BOOT), "t_p": r["t_p"], "t_level": r["t_level"]})
    for key in ("vs_base_p", "t_p") if change else ():
        for c, h in zip(change, S.holm(np.array([c[key] for c in change]))):
            c[key + "_holm"] = float(h)
    df = pd.DataFrame(rows + change)
    return save(art, "curve_gaps", df, f"Learning curve: gains per budget ({ds}, T=0, natural mode)",
                f"vs_base [lo, hi], p: a run's paired acceptance length minus the drafter baseline's ({base}) at the "
                "same budget (same realizations, seeds, requests; hierarchical bootstrap), vs_base_pct: in % of the "
                "baseline's mean; vs_mtp: minus the native MTP head's (its T = 0 records, broadcast over seeds). "
                "step 'change': the gain at the last budget minus the gain at the first, paired (bootstrap p and the "
                "t-test at the top level, each Holm-corrected over the runs).")


def learning_curve(art: Artifacts, n_boot: int = 2000) -> pd.DataFrame | None:
    """tables/learning_curve: acceptance length (T = 0, natural) vs drafter training tokens, one row per method x
    seed x step (request bootstrap CI), pooled rows (seed "all": two-level CI over seeds and requests at the step's
    mean training tokens), and the native-MTP reference row (runs/ablation/mtp/<dataset>_T0, step empty)."""
    cv = art.curve
    if cv is None or cv.empty:
        return skip("learning curve (no curve/)")
    rows = []
    multi = cv.realization.nunique() > 1

    def row(m, seed, step, tokens, est, n_requests):
        return {"method": m, "seed": seed, "step": step, "train_tokens": tokens,
                **dict(zip(["acceptance_length", "lo", "hi"], est)), "n_requests": int(n_requests)}
    for (m, step), g in cv.groupby(["method", "step"], sort=True):
        for (r, seed), gs in g.groupby(["realization", "seed"], sort=True):
            rows.append(row(m, f"r{r}:{seed}" if multi else str(seed), step, gs.train_tokens.iloc[0],
                            M.bootstrap_ci(gs.acceptance_length.dropna().to_numpy(), n_boot=n_boot),
                            (gs.n_rounds > 0).sum()))
        rows.append(row(m, "all", step, g.groupby(["realization", "seed"]).train_tokens.first().mean(),
                        S.seed_request_ci(cube(g), n_boot=n_boot), g.id[g.n_rounds > 0].nunique()))
    for ds in sorted(set(cv.dataset)):
        ref = group(art, "ablation", ds, 0.0, "mtp")
        if len(ref):
            rows.append(row("mtp", "all", math.nan, math.nan, S.seed_request_ci(cube(ref), n_boot=n_boot),
                            (ref.n_rounds > 0).sum()))
    df = pd.DataFrame(rows)
    df = df.iloc[np.lexsort((df.seed == "all", df.train_tokens.fillna(-1), art.order(df.method)))]
    return save(art, "learning_curve", df.reset_index(drop=True), "Learning curve (HumanEval, T=0, natural mode)",
                "acceptance_length [lo, hi]: per-request mean incl. bonus; per seed (r<k>:<seed> with several "
                "realizations) a bootstrap 95% CI over requests, seed 'all' the hierarchical CI over realizations, "
                "seeds and requests (train_tokens: the seeds' mean). mtp: the native MTP head (no drafter budget), "
                "the reference line.")


KEYS_ZERO = ["experiment", "dataset", "temperature", "mode", "method", "realization", "seed", "id"]


def zero_rounds(art: Artifacts) -> pd.DataFrame | None:
    """tables/zero_round: every request without a verify round (its first token ended it), by experiment, dataset,
    temperature, mode, method and seed; views of another dataset (eval.subsets) are left out (their requests are
    the source's)."""
    r = art.runs
    z = r[(r.n_rounds == 0) & ~r.dataset.isin(list(art.subsets or {}))] if len(r) else r
    if z.empty:
        return None
    z = z[KEYS_ZERO].sort_values(KEYS_ZERO, key=lambda c: c.map(art.rank) if c.name == "method" else c)
    write_csv(art.tables / "zero_round.csv", z)
    return z.reset_index(drop=True)


ALL = [ablation, main_acceptance, first_token, directions, position, per_request_vs_verify, throughput, overhead,
       costmodel, open_repro, turns, pairwise, ceiling, learning_curve, curve_increments, curve_gaps, zero_rounds]


def missing(art: Artifacts) -> list[tuple]:
    """Runs a table would want but the artifacts lack (printed, and listed in REPORT.md: never dropped silently):
    the spec's baselines and main rows (those of `only`, when it names a subset); on an out-of-distribution set, its
    own runs (eval.ood_runs)."""
    sp, ood = art.spec, art.ood or {}
    main = missing_runs(art.runs[~art.runs.dataset.isin(list(ood))],
                        {"ablation": sp.selected(sp.baselines + sp.main + tuple(sp.continued))}, art.rank)
    for ds, runs in ood.items():
        have = set(art.runs[(art.runs.dataset == ds) & (art.runs["mode"] == "natural")].method)
        main += [("ablation", ds, 0.0, m) for m in sp.selected(runs) if m not in have]
    return main


def render(art: Artifacts) -> None:
    for fn in ALL:
        fn(art)
    for exp, ds, t, m in missing(art):
        print(f"[report] missing runs: {exp}/{m}/{ds}_T{t:g}.jsonl (no rows for {m} in that table)")

