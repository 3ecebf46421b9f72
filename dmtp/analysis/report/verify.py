"""The verification-mode study (results/<profile>/verify, written by `dmtp pipeline --stage verify`): per method,
verify mode and temperature, per-request and per-verify acceptance length, first-token acceptance and throughput at each
batch cap, beside the target-only ceiling; paired tests of each mode against the others.

    python -m dmtp.cli.report verify --profile mini     # tables/verify*.{csv,md}, figures/verify_T*.png
    from dmtp.analysis.report import verify; verify.render(Path("results/mini"))   # notebooks

Intervals: acceptance length and first-token acceptance, 95% percentile bootstrap over requests (a request's value
pools its rounds over the timed repeats); throughput, mean over the repeats with their min and max. Paired tests:
per request (matched ids, the same prompts in every group) of `sample` and `block` against `target` and of `block`
against `sample`, two-level bootstrap p-values (`analysis.stats.paired`, one seed level), Holm-adjusted over all
comparisons of one metric.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # the object API: no pyplot, no display backend

from dmtp.analysis import metrics as M
from dmtp.analysis import stats
from dmtp.analysis.report.data import check_complete, read_caveat, read_metas, read_optional, record_files
from dmtp.analysis.report.figures import caveat_title
from dmtp.analysis.report.tables import skip, to_markdown
from dmtp.config import VERIFY_MODES
from dmtp.io import iter_jsonl, write_csv, write_figure, write_text

MODES = list(VERIFY_MODES)  # verify modes in table order when the experiment names none
HATCH = {"target": "", "sample": "//", "block": "xx"}
SHADE = {"target": "#4c72b0", "sample": "#dd8452", "block": "#55a868"}
PAIRS = [("sample", "target"), ("block", "target"), ("block", "sample")]


def order(root: Path) -> tuple[list[str], list[str]]:
    """(methods, verify modes) in the study's own order: the `verify` section of results/<profile>/experiment.json
    (the resolved profile the pipeline wrote); without one, no method order (by name) and MODES."""
    v = read_optional(root, "experiment.json").get("verify", {})
    return list(v.get("methods", [])), list(v.get("modes", MODES))


def _index(names: list[str]):
    return lambda x: names.index(x) if x in names else len(names)


def read(root: Path) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame | None]:
    """(one row per request: temperature, method, verify, id, accepted pooled over repeats, k; throughput rows or
    None; oracle rows or None) from results/<profile>/verify."""
    base = Path(root) / "verify"
    rows = []
    for path in record_files(base / "runs", "*/*/"):
        method, mode = path.parent.parent.name, path.parent.name
        check_complete(path)  # a run the verify stage finished
        by_id: dict[str, dict] = {}
        for _, r in iter_jsonl(path):
            row = by_id.setdefault(r["id"], {"temperature": float(r["temperature"]), "method": method,
                                             "verify": mode, "id": r["id"], "k": int(r["n_candidates"]),
                                             "accepted": []})
            row["accepted"] += [int(a) for a in r["accepted"]]
        rows += by_id.values()
    runs = pd.DataFrame(rows, columns=["temperature", "method", "verify", "id", "k", "accepted"])
    tp = pd.read_csv(base / "throughput.csv") if (base / "throughput.csv").exists() else None
    orc = pd.read_csv(base / "oracle.csv") if (base / "oracle.csv").exists() else None
    return runs, tp, orc


def _rank(df: pd.DataFrame, methods: list[str], modes: list[str]) -> pd.DataFrame:
    """Rows by temperature, then the study's method order (unnamed methods last, by name), then its mode order."""
    m, v = df.method.map(_index(methods)), df.verify.map(_index(modes))
    return df.iloc[np.lexsort((v, df.method, m, df.temperature))].reset_index(drop=True)


def ceiling(orc: pd.DataFrame | None, temperature: float, k: int) -> float:
    """Acceptance-length ceiling of target-only verification with k greedy drafts at T (nan when not computed)."""
    if k == 0:
        return 1.0
    if orc is None:
        return math.nan
    hit = orc[(orc.temperature == temperature) & (orc.k == k) & (orc.position == 0)]
    return float(hit.ceiling.iloc[0]) if len(hit) else math.nan


def summary(runs: pd.DataFrame, tp: pd.DataFrame | None, orc: pd.DataFrame | None, n_boot: int = 2000,
            methods: list[str] = (), modes: list[str] = MODES) -> pd.DataFrame:
    """One row per (temperature, method, verify): acceptance (per request, per verify), first-token acceptance,
    throughput per cap, the ceiling; rows in the study's order (`order`)."""
    out = []
    caps = sorted(tp.batch_cap.unique()) if tp is not None and len(tp) else []
    for (t, m, v), g in runs.groupby(["temperature", "method", "verify"]):
        k = int(g.k.max())
        H = np.array([M.histogram(a, k) for a in g.accepted], float)
        al = [M.acceptance_length(a) for a in g.accepted if len(a)]
        row = {"temperature": t, "method": m, "verify": v, "k": k, "n_requests": len(al), "n_rounds": int(H.sum()),
               **dict(zip(["acceptance_length", "acceptance_length_lo", "acceptance_length_hi"],
                          stats.seed_request_ci(al, n_boot=n_boot))),
               "per_verify": M.per_verify(H.sum(0))}
        ft = M.bootstrap_ci(H, lambda h: M.first_token(h.sum(0)), n_boot=n_boot) if k else (math.nan,) * 3
        row.update(zip(["first_token", "first_token_lo", "first_token_hi"], ft))
        for cap in caps:
            x = tp[(tp.temperature == t) & (tp.method == m) & (tp.verify == v) & (tp.batch_cap == cap)].tok_per_s
            row.update({f"tok_s_B{cap}": x.mean() if len(x) else math.nan,  # a range only over several repeats
                        f"tok_s_B{cap}_lo": x.min() if len(x) > 1 else math.nan,
                        f"tok_s_B{cap}_hi": x.max() if len(x) > 1 else math.nan})
        row["ceiling_target_only"] = ceiling(orc, t, k)
        out.append(row)
    return _rank(pd.DataFrame(out), list(methods), list(modes)) if out else pd.DataFrame()


def _per_request(runs: pd.DataFrame, t, m, v, fn) -> dict:
    g = runs[(runs.temperature == t) & (runs.method == m) & (runs.verify == v)]
    return {i: fn(a) for i, a in zip(g.id, g.accepted) if len(a)}


def _first(acc) -> float:
    return sum(a > 0 for a in acc) / len(acc)


def paired_tests(runs: pd.DataFrame, n_boot: int = 4000, methods: list[str] = ()) -> pd.DataFrame:
    """Per (temperature, method) with drafts and per metric (per-request acceptance length, first-token acceptance):
    each pair of PAIRS over the requests both modes ran; Holm over every comparison of the same metric."""
    rows = []
    for (t, m), g in runs[runs.k > 0].groupby(["temperature", "method"]):
        for metric, fn in (("acceptance_length", M.acceptance_length), ("first_token", _first)):
            for a, b in PAIRS:
                if not {a, b} <= set(g.verify):
                    continue
                xa, xb = _per_request(runs, t, m, a, fn), _per_request(runs, t, m, b, fn)
                ids = sorted(set(xa) & set(xb))
                r = stats.paired([xa[i] for i in ids], [xb[i] for i in ids], n_boot=n_boot)
                rows.append({"temperature": t, "method": m, "metric": metric, "a": a, "b": b, "diff": r["diff"],
                             "diff_lo": r["lo"], "diff_hi": r["hi"], "p": r["p"], "n": len(ids)})
    df = pd.DataFrame(rows, columns=["temperature", "method", "metric", "a", "b", "diff", "diff_lo", "diff_hi", "p",
                                     "n"])
    df["p_holm"], df["verdict"] = np.nan, ""
    for _, fam in df.groupby("metric"):
        for i, q in zip(fam.index, stats.holm(fam.p.tolist())):
            df.loc[i, "p_holm"] = q
            df.loc[i, "verdict"] = stats.verdict(df.a[i], df.b[i], df["diff"][i], q)
    if len(df):
        rank = df.method.map(_index(list(methods)))
        df = df.iloc[np.lexsort((df.index, df.method, rank, df.temperature))].reset_index(drop=True)
    return df


def findings(s: pd.DataFrame, pt: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The section's findings in words, only as far as the tests carry them: per (temperature, method) the
    acceptance-length comparisons Holm resolves (difference and interval) and those it does not; the rows whose
    lower interval bound lies above the target-only ceiling; the requests without a verify round."""
    out = []
    al = pt[pt.metric == "acceptance_length"]  # `paired_tests` keeps its columns when it has no rows
    for (t, m), g in al.groupby(["temperature", "method"], sort=False):
        won = [f"{r.verdict} ({r.a} − {r.b} {r['diff']:+.3f} [{r.diff_lo:+.3f}, {r.diff_hi:+.3f}], "
               f"p_holm {r.p_holm:.2g})"
               for _, r in g.iterrows() if "not resolved" not in r.verdict]
        open_ = [f"{r.a} vs {r.b}" for _, r in g.iterrows() if "not resolved" in r.verdict]
        out.append(f"- T={t:g}, `{m}`: " + ("; ".join(won) if won else "no difference resolved")
                   + (f"; not resolved: {', '.join(open_)}" if open_ and won else ""))
    if len(s):
        above = s[(s.k > 0) & (s.acceptance_length_lo > s.ceiling_target_only)]
        if len(above):
            out.append("- Above the target-only ceiling (lower interval bound > ceiling; no greedy drafter reaches "
                       "these under target-only verification):" + "".join(
                           f"\n  - T={r.temperature:g} `{r.method}` {r.verify} {r.acceptance_length_lo:.3f} > "
                           f"{r.ceiling_target_only:.3f}" for _, r in above.iterrows()))
    if len(runs):
        z = runs[runs.accepted.map(len) == 0]
        out.append(f"- Requests without a verify round (their first token ended them; left out of the per-request "
                   f"numbers): {len(z)}" + ("" if z.empty else " — " + "; ".join(
                       f"T={t:g} `{m}` {v}: {', '.join(sorted(map(str, set(g.id))))}"
                       for (t, m, v), g in z.groupby(["temperature", "method", "verify"]))) + ".")
    return ["Findings (acceptance length per request; Holm-corrected paired tests, tables/verify_paired.csv):", "",
            *out, ""] if out else []


def fmt(v, col: str) -> str:
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if col.startswith("tok_s"):
        return f"{v:,.0f}"
    if col == "temperature":
        return f"{v:g}"
    if col in ("p", "p_holm"):
        return f"{v:.3g}"
    if col.startswith("first_token"):
        return f"{100 * v:.1f}%"
    if isinstance(v, (int, np.integer)) or col in ("k", "n", "n_requests", "n_rounds"):
        return f"{int(v)}"
    return f"{v:.3f}" if isinstance(v, (float, np.floating)) else str(v)


def markdown(df: pd.DataFrame) -> str:
    """`tables.to_markdown` in this study's formats: "c [lo, hi]", "c" alone where the row has no interval."""
    return to_markdown(df, fmt, open_interval=False)


def figure(root: Path, s: pd.DataFrame, modes: list[str] = MODES) -> list[Path]:
    """Per temperature: acceptance length (with the target-only ceiling as a dashed line over each method), first-
    token acceptance and throughput at each cap; bars grouped by method, one per verify mode, with their intervals."""
    paths = []
    caps = sorted(int(c[7:]) for c in s.columns if c.startswith("tok_s_B") and not c.endswith(("_lo", "_hi")))
    panels = [("acceptance_length", "acceptance length (per request)"), ("first_token", "first-token acceptance")]
    panels += [(f"tok_s_B{c}", f"throughput B{c} (tok/s)") for c in caps]
    for t, g in s.groupby("temperature"):
        methods = list(dict.fromkeys(g.method))  # the summary's (the study's) order
        nrow = math.ceil(len(panels) / 2)
        fig = Figure(figsize=(10, 3.2 * nrow), layout="constrained")
        axes = np.atleast_1d(fig.subplots(nrow, 2)).ravel()
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        for ax, (col, label) in zip(axes, panels):
            for i, m in enumerate(methods):
                for j, v in enumerate(modes):
                    r = g[(g.method == m) & (g.verify == v)]
                    if not len(r) or pd.isna(r[col].iloc[0]):
                        continue
                    y, lo, hi = (float(r[c].iloc[0]) for c in (col, f"{col}_lo", f"{col}_hi"))
                    ax.bar(i + (j - (len(modes) - 1) / 2) * 0.27, y, 0.27, color=SHADE[v], hatch=HATCH[v], edgecolor="k",
                           linewidth=0.4, yerr=None if math.isnan(lo) else [[y - lo], [hi - y]], capsize=2,
                           label=v if i == 0 else None)
                if col == "acceptance_length":
                    c = g[g.method == m].ceiling_target_only.iloc[0]
                    if not pd.isna(c):
                        ax.hlines(c, i - 0.45, i + 0.45, colors="k", linestyles="--", linewidth=1,
                                  label="target-only ceiling" if i == 0 else None)
            ax.set_xticks(range(len(methods)), methods, rotation=30, fontsize=7)
            ax.set_ylabel(label, fontsize=8)
        fig.suptitle(f"Verification at T = {t:g}: target-only vs speculative sampling vs block verification")
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=8,
                   frameon=False)  # below the panels: inside one it hid bars and ceilings
        out = Path(root) / "figures" / f"verify_T{t:g}.png"
        caveat_title(fig, read_caveat(root, short=True))
        write_figure(out, fig, dpi=120)
        paths.append(out)
    return paths


def _when(stamp: str):
    """A meta file's `written` stamp as a comparable time (its own UTC offset applied); unparsable: the text."""
    from datetime import datetime, timezone

    try:
        t = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        return (1, stamp)
    return (0, t.astimezone(timezone.utc).isoformat())


def made_by(root: Path) -> str:
    """Which models and commit the study comes from: the commits its run meta files record and when they were
    written; said in bold when the runs are older than the realization's target or drafters (meta.json `written`):
    a study left from earlier models, which the pipeline's verify stage redoes."""
    commits, _, stamps = read_metas(sorted(Path(root, "verify", "runs").glob("*/*/*.meta.json")))
    if not commits:
        return "Models: no recorded commit (the study's runs have no meta files beside them)."
    shas = ", ".join(c for c, _ in commits.most_common())
    when = f", written {min(stamps, key=_when)} to {max(stamps, key=_when)}" if stamps else ""
    line = f"Models: the study's runs at {shas}{when}."
    newer = []
    for what in ("target", "drafters"):
        w = str(read_optional(root, what, "meta.json").get("written", ""))
        if w and stamps and _when(min(stamps, key=_when)) < _when(w):
            newer.append(f"its {what} (written {w})")
    if newer:
        line += (f" **Left from earlier models**: these runs predate {' and '.join(newer)}, so they measure models "
                 "that are no longer this realization's; rerun `dmtp pipeline --stage verify` to measure the current "
                 "ones.")
    return line


def render(root: Path, n_boot: int = 2000, href: str = "figures") -> list[str]:
    """Write tables/verify.{csv,md}, tables/verify_paired.{csv,md}, figures/verify_T*.png; return the REPORT.md
    section ([] when the profile has no verify study), its figures linked under `href` (relative to REPORT.md)."""
    root = Path(root)
    runs, tp, orc = read(root)
    if runs.empty:
        return skip("verification study", "no results/<profile>/verify runs", [])
    methods, modes = order(root)
    s = summary(runs, tp, orc, n_boot, methods, modes)
    pt = paired_tests(runs, 2 * n_boot, methods)
    tables = root / "tables"
    write_csv(tables / "verify.csv", s)
    write_csv(tables / "verify_paired.csv", pt)
    show, paired = markdown(s.drop(columns=["k"])), markdown(pt) if len(pt) else "no paired comparisons\n"
    n_rep = (tp.groupby(["method", "verify", "temperature", "batch_cap"]).size() if tp is not None and len(tp)
             else pd.Series(dtype=int))
    lo, hi = (int(n_rep.min()), int(n_rep.max())) if len(n_rep) else (0, 0)
    repeats = f"{lo}–{hi} timed repeats per cap" if lo != hi else f"{hi} timed repeat(s) per cap"
    write_text(tables / "verify.md", show)
    write_text(tables / "verify_paired.md", paired)
    figs = figure(root, s, modes)
    note = ("the column is empty: the study has no `ar` x `target` runs to compute it along (no verify/oracle.csv)"
            if orc is None else "acceptance length of an idealised greedy drafter accepted at the target's top-1 "
            "probability along the ar trajectory (`dmtp.analysis.oracle.oracle_ceiling`), for target-only "
            "verification with k drafts")
    models = made_by(root)
    out = ["## Verification at T > 0: target-only vs speculative sampling vs block verification", "",
           *([models, ""] if models else []),
           ("`target`: greedy drafts, the target samples its own token (the blog's rule). `sample`: drafts sampled "
            "from the drafters' tempered distributions (T1 from the MTP head), token-wise speculative sampling. "
            "`block`: the same drafts, block verification (Sun et al., ICLR 2025). All three emit the target's law "
            "(docs/DESIGN.md, tests/test_verify.py). Acceptance length and first-token acceptance with 95% request-"
            f"bootstrap intervals. Throughput: mean [min, max] over timed repeats (one repeat: its value alone; "
            f"{repeats}). Ceiling: {note}."), ""]
    out += findings(s, pt, runs)
    out += [f"![{p.stem}]({href}/{p.name})\n" for p in figs]
    out += ["### Acceptance and throughput", "", show, "### Paired tests (per request; Holm-adjusted per metric)", "",
            paired]
    print(f"[report] verification study: {len(s)} groups, {len(figs)} figures")
    return out
