"""Figures: each renderer reads an Artifacts bundle, writes figures/<name>_T<temp>.png (one per temperature) and
returns the paths written ([] with a printed note when its data is absent). Agg backend, object API only. Methods
are ordered and coloured by their place in the experiment's ablation spec (`art.spec`)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from dmtp.analysis import metrics as M  # noqa: E402
from dmtp.analysis import reference as R  # noqa: E402
from dmtp.analysis.report import tables as T  # noqa: E402
from dmtp.analysis import stats as S  # noqa: E402
from dmtp.analysis.report.data import Artifacts, cube, group, paired_runs, select  # noqa: E402
from dmtp.io import write_figure  # noqa: E402

# by position in the spec's run order (the Code ablation: ar grey, mtp blue, dflash orange, ...), then the methods
# it does not name, by name
PALETTE = ["#7f7f7f", "#1f77b4", "#ff7f0e", "#bcbd22", "#2ca02c", "#9467bd", "#17becf", "#d62728", "#ff9896",
           "#8c564b", "#e377c2", "#aec7e8", "#ffbb78", "#393b79", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2",
           "#dbdb8d", "#9edae5"]


def colors(art: Artifacts) -> dict[str, str]:
    """method -> colour, for every method of the spec and of the artifacts (runs, throughput)."""
    found = set(art.runs.method) | (set(art.throughput.method) if art.throughput is not None else set())
    names = list(art.spec.runs()) + sorted(found - set(art.spec.runs()))
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(names)}


def caveat_title(fig: Figure, caveat: str) -> None:
    """A series' short caveat (`Artifacts.caveat_short`) first in the figure's title."""
    if caveat:
        old, cap = fig.get_suptitle(), caveat[:1].upper() + caveat[1:]
        fig.suptitle(f"{cap}\n{old}" if old else cap, **({} if old else {"fontsize": 9}))


def _save(art: Artifacts, fig: Figure, name: str) -> Path:
    path = art.figures / f"{name}.png"
    caveat_title(fig, art.caveat_short)
    write_figure(path, fig, dpi=120)
    return path


def links(art: Artifacts, *patterns: str) -> list[str]:
    """REPORT.md's lines showing figures/<pattern>.png, each pattern's in temperature order, each image followed by
    an empty line."""
    return [x for pat in patterns for p in sorted(art.figures.glob(f"{pat}.png"), key=T.by_temperature)
            for x in (f"![{p.stem}](figures/{p.name})", "")]


def _per_temp(s):
    """Yield (temperature, summary rows, panels): {(experiment, dataset): its label} in the rows' order, the
    experiment named only where several share the figure."""
    for t, g in s.groupby("temperature"):
        multi = g.experiment.nunique() > 1
        yield t, g, {(e, d): f"{e}/{d}" if multi else d for e, d in zip(g.experiment, g.dataset)}


def _bars(g: pd.DataFrame, panels: dict, value) -> dict:
    """{(panel label, method): value(row)} over the summary rows g (`grouped_bars`' values)."""
    return {(panels[r.experiment, r.dataset], r.method): value(r) for r in g.itertuples()}


def _ranked(art: Artifacts, g: pd.DataFrame) -> list:
    """The rows of g (as tuples) in report order of their methods."""
    return sorted(g.itertuples(), key=lambda r: art.rank(r.method))


def _main_and_rest(art: Artifacts, s: pd.DataFrame):
    """Yield (part, temperature, rows, panels) (`_per_temp`) of a figure's two parts: "" the main rows
    (`main_methods`), "_supplementary" the other variants."""
    main = s.method.isin(main_methods(art))
    for part, rows in (("", s[main]), ("_supplementary", s[~main])):
        yield from ((part, *x) for x in _per_temp(rows))


def grouped_bars(ax, groups: list[str], methods: list[str], ours: dict, color: dict, blog: dict | None = None,
                 labels: dict | None = None) -> dict:
    """One packed group of bars per group name; ours[(group, method)] = (value, lo, hi) drawn with its CI, in
    color[method]. With `blog`, a hatched bar labelled with the blog's value stands right of ours wherever
    blog[(group, method)] exists. Returns {(group, method): x} of our bars."""
    blog, labels, xs, x, ticks, seen = blog or {}, labels or {}, {}, 0.0, [], set()
    for g in groups:
        start = x
        for m in methods:
            if (g, m) not in ours:
                continue
            v, lo, hi = ours[(g, m)]
            err = None if math.isnan(lo) else [[v - lo], [hi - v]]
            ax.bar(x, v, 1, color=color[m], yerr=err, capsize=2, label=None if m in seen else labels.get(m, m))
            seen.add(m)
            xs[(g, m)], x = x, x + 1
            if (g, m) in blog:
                b = blog[(g, m)]
                ax.bar(x, b, 1, color=color[m], alpha=0.35, hatch="//", edgecolor="k", linewidth=0.5)
                ax.text(x, b, f"{b:.2f}", ha="center", va="bottom", fontsize=6, rotation=90)
                x += 1
        ticks.append((start + x - 1) / 2)
        x += 1  # gap between groups
    ax.set_xticks(ticks, groups)
    ax.margins(y=0.12)  # room for the value labels
    if blog:
        ax.bar(0, 0, 0, facecolor="white", hatch="//", edgecolor="k", label="blog")  # legend entry only
    return xs


def _legend(fig: Figure, *axes, loc: str = "outside right upper", **kw):
    """One figure legend of the labelled artists of `axes` (a label once, with its last panel's handle)."""
    handles = {lab: h for ax in axes for h, lab in zip(*ax.get_legend_handles_labels())}
    fig.legend(list(handles.values()), list(handles.keys()), loc=loc, fontsize=7, **kw)


def _interval(r, col: str) -> tuple[float, float, float, str]:
    """(value, lo, hi, kind) of a summary row's column: the t-interval over realizations where there are several,
    else the hierarchical bootstrap (one realization: its t would be over 1-3 seeds)."""
    if getattr(r, "t_level", "") == "realization" and not pd.isna(getattr(r, f"{col}_tlo", math.nan)):
        return getattr(r, col), getattr(r, f"{col}_tlo"), getattr(r, f"{col}_thi"), "t-interval over realizations"
    return getattr(r, col), getattr(r, f"{col}_lo"), getattr(r, f"{col}_hi"), "bootstrap 95% CI"


def main_acceptance(art: Artifacts) -> list[Path]:
    """Two panels per temperature. Left: acceptance length of DFlash, native MTP, the blog's DMTP model and the main
    method per dataset, with the t-interval over realizations (one realization: the bootstrap). Right: each one's gain
    over DFlash (%), ours with the paired difference's t-interval (one realization: bootstrap) over DFlash's mean,
    the blog's own relative gain beside (hatched; 27B open reproduction at T = 0, 35B at T = 1) — relative gains, so
    the blog's larger models do not share an axis of absolute lengths with ours."""
    s, cols = art.natural, T.main_columns(art)
    if s.empty or "dmtp" not in cols or not s.method.isin(cols.values()).any():
        return T.skip("main acceptance figure", empty=[])
    base, dmtp = cols["dflash"], cols["dmtp"]
    labels = {dmtp: f"{dmtp} (blog's DMTP model)", **({cols["main"]: f"{cols['main']} (main method)"}
                                                      if "main" in cols else {})}
    methods, color, paths = list(cols.values()), colors(art), []
    for t, g, panels in _per_temp(s[s.method.isin(methods)]):
        groups, present = list(panels.values()), [m for m in methods if m in set(g.method)]
        ours = _bars(g, panels, lambda r: _interval(r, "acceptance_length"))
        kinds, gain, blog = {v[3] for v in ours.values()}, {}, {}
        for (e, d), gd in g.groupby(["experiment", "dataset"], sort=False):
            by = gd.set_index("method").acceptance_length
            for m in (m for m in present if base in by and m != base and m in by):
                q = paired_runs(art, (e, d, t), m, base)
                lo, hi = (q["t_lo"], q["t_hi"]) if q.get("t_level") == "realization" else (q["lo"], q["hi"])
                gain[(panels[e, d], m)] = tuple(100 * x / by[base] for x in (q["diff"], lo, hi))
                col = T.blog_name(art, m) if m != cols.get("main") else ""
                b = T.pct(T.blog_acceptance(d, t, col), T.blog_acceptance(d, t, "dflash")) if col else math.nan
                if not math.isnan(b):
                    blog[(panels[e, d], m)] = b
        fig = Figure(figsize=(max(10.5, 0.3 * (len(ours) + len(gain) + len(blog) + 2 * len(groups)) + 3), 3.8),
                     layout="constrained")
        left, right = fig.subplots(1, 2)
        grouped_bars(left, groups, present, {k: v[:3] for k, v in ours.items()}, color, labels=labels)
        left.set(ylabel="acceptance length (incl. bonus)", title=f"Ours (T={t:g}): " + ", ".join(sorted(kinds)))
        grouped_bars(right, groups, [m for m in present if m != base], gain, color, blog, labels)
        right.axhline(0, color="k", lw=0.8)
        right.set(ylabel=f"gain over {base} (%)", title="Gain over DFlash; the blog's hatched")
        for ax in (left, right):
            ax.tick_params(axis="x", labelsize=7)
        _legend(fig, left, right)
        paths.append(_save(art, fig, f"main_acceptance_T{t:g}"))
    return paths


def open_repro(art: Artifacts) -> list[Path]:
    """Blog figure 8 layout: MTP415, DFlash, DMTP(D), DFlash2, DMTP(D2) per dataset."""
    s, cols = art.natural, T.open_columns(art)
    if s.empty or not s.method.isin([cols.get("dflash2"), cols.get("dmtp_d2")]).any():
        return T.skip("open-reproduction figure", "no DFlash2 runs of the drafter baseline or main method", [])
    labels = {m: T.OPEN_LABEL[c] for c, m in cols.items()}
    blog_col = {m: ("dmtp" if c == "dmtp_d" else c) for c, m in cols.items()}
    methods, paths = list(cols.values()), []
    for t, g, panels in _per_temp(s[s.method.isin(methods)]):
        ours = _bars(g, panels, lambda r: (r.acceptance_length, r.acceptance_length_lo, r.acceptance_length_hi))
        blog = _bars(g, panels, lambda r: R.blog_value("open_repro", r.dataset, blog_col[r.method])) if t == 0 else {}
        blog = {k: v for k, v in blog.items() if not math.isnan(v)}  # the blog's layout is at T = 0
        fig = Figure(figsize=(max(5, 0.35 * (len(ours) + len(blog) + len(panels))), 3.6), layout="constrained")
        ax = fig.subplots()
        present = [m for m in methods if m in set(g.method)]
        grouped_bars(ax, list(panels.values()), present, ours, colors(art), blog, labels)
        _legend(fig, ax)
        ax.set(ylabel="per-request acceptance length", title=f"Open-reproduction layout (T={t:g})")
        paths.append(_save(art, fig, f"open_repro_T{t:g}"))
    return paths


def first_token(art: Artifacts) -> list[Path]:
    """First-token acceptance (%) per dataset and method with bootstrap CI; blog values as black diamonds. The main
    rows (`main_methods`) in first_token_T<t>.png, the other variants in first_token_supplementary_T<t>.png."""
    s = art.drafting
    if s.empty:
        return T.skip("first-token figure", empty=[])
    color, paths = {**colors(art), **{c: CONTROL_COLOR for c in art.spec.controls}}, []
    for part, t, g, panels in _main_and_rest(art, s):
        ours = _bars(g, panels, lambda r: (100 * r.first_token, 100 * r.first_token_lo, 100 * r.first_token_hi))
        fig = Figure(figsize=(max(5, 0.35 * (len(ours) + len(panels)) + 2), 3.6), layout="constrained")
        ax = fig.subplots()
        xs = grouped_bars(ax, list(panels.values()), sorted(set(g.method), key=art.rank), ours, color)
        blog = [(xs[panels[r.experiment, r.dataset], r.method],
                 T.blog_first_token(r.dataset, t, T.blog_name(art, r.method))) for r in g.itertuples()]
        blog = np.array([b for b in blog if not math.isnan(b[1])]).reshape(-1, 2)
        if len(blog):
            ax.plot(blog[:, 0], blog[:, 1], "kD", ms=4, label="blog (27B at T=0, 35B at T=1)")
        _legend(fig, ax)
        ax.set(ylabel="first-token acceptance (%)", ylim=(0, 105),
               title=f"P(L>=1) per verify round (T={t:g})" + (": other variants" if part else ""))
        paths.append(_save(art, fig, f"first_token{part}_T{t:g}"))
    return paths


def main_methods(art: Artifacts) -> list[str]:
    """The rows a reader compares first: native MTP, the drafter baseline, the blog's DMTP model, the main method and
    the controls (the rest go to the supplementary figures)."""
    sp = art.spec
    return list(dict.fromkeys(m for m in ("mtp", sp.drafter_baseline, sp.blog_run, sp.main_method, *sp.controls) if m))


CONTROL_COLOR = "#9467bd"  # a control beside the main rows: apart from every main row's colour
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]


def _position_ci(art: Artifacts, e: str, d: str, t: float, m: str, kind: str, K: int = 7, n_boot: int = 1000):
    """[(lo, hi)] per position k = 1..K (percent): hierarchical bootstrap of the pooled ratio (rounds with L >= k
    over rounds; conditional: over rounds with L >= k - 1)."""
    g = group(art, e, d, t, m)
    h = np.array([(list(x) + [0] * (K + 1))[:K + 1] for x in g["hist"]], float)  # [requests x units, K + 1]
    tail = np.cumsum(h[:, ::-1], 1)[:, ::-1]  # tail[:, j] = rounds accepting >= j
    out = []
    for k in range(1, K + 1):
        num, den = (cube(g.assign(_x=x), "_x") for x in (tail[:, k], tail[:, 0 if kind == "cumulative" else k - 1]))
        _, lo, hi = S.ratio_ci(num, np.where(den > 0, den, np.nan), n_boot=n_boot)
        out.append((100 * lo, 100 * hi))
    return out


def position(art: Artifacts, kind: str = "cumulative") -> list[Path]:
    """Per-position acceptance, k = 1..K, one panel per dataset: kind 'cumulative' P(L>=k) or 'conditional'
    P(L>=k | L>=k-1). The main rows (`main_methods`) each in its own colour and marker with the hierarchical
    bootstrap band; the other variants in `<kind>_supplementary_T<t>.png`. Blog curves (dashed, 35B T=1) are derived
    from its conditional rows where they exist."""
    s = art.drafting
    if s.empty:
        return T.skip(f"{kind} figure", empty=[])
    fn = M.cumulative if kind == "cumulative" else M.conditional
    color, paths = colors(art), []
    blog_methods = [m for m in (art.spec.drafter_baseline, art.spec.blog_run) if m]
    for part, t, g, panels in _main_and_rest(art, s):
        ncol, nrow = min(3, len(panels)), math.ceil(len(panels) / 3)
        fig = Figure(figsize=(3.6 * ncol + 2.2, 3.1 * nrow + 0.5), layout="constrained")
        axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
        for ax, ((e, d), label) in zip(axes, panels.items()):
            for i, r in enumerate(_ranked(art, select(g, experiment=e, dataset=d))):
                y = 100 * np.array(fn(r.hist))
                x = np.arange(1, len(y) + 1)
                c = CONTROL_COLOR if r.method in art.spec.controls and not part else color[r.method]
                ax.plot(x, y, marker=MARKERS[i % len(MARKERS)], ms=3.5, lw=1.2, color=c, label=r.method)
                if not part:
                    band = np.array(_position_ci(art, e, d, t, r.method, kind, len(y)))
                    ax.fill_between(x, band[:, 0], band[:, 1], color=c, alpha=0.18, lw=0)
            for m in blog_methods if not part and t == 1 else ():  # the blog's rows are T = 1
                row = R.conditional_row(d, T.blog_name(art, m))
                if row:
                    c = np.array(row[0]) / 100
                    y = 100 * (np.cumprod(c) if kind == "cumulative" else c)
                    ax.plot(range(1, 8), y, "--", color=color[m], alpha=0.6,
                            label=f"blog {T.blog_name(art, m)} (35B, T=1)")
            ax.set(title=f"{label} (T={t:g})", xlabel="k", ylim=(0, 100), xticks=range(1, 8))
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        for ax in axes[::ncol]:
            ax.set_ylabel("cumulative P(L>=k) (%)" if kind == "cumulative" else "conditional P(L>=k | L>=k-1) (%)")
        _legend(fig, *axes)
        fig.suptitle("Supplementary: the other variants (main rows in the figure without this suffix)" if part
                     else "Main rows, bands: hierarchical bootstrap 95% CI", fontsize=9)
        paths.append(_save(art, fig, f"{kind}{part}_T{t:g}"))
    return paths


def conditional(art: Artifacts) -> list[Path]:
    return position(art, "conditional")


def throughput(art: Artifacts) -> list[Path]:
    """Speed-up over AR (tok/s ratio, same server, same repeat) per realization, one panel per batch cap (B1 and B32
    apart: different workloads, no curve between them), the plain methods grouped by realization in their colours,
    whiskers the timing repeats' [min, max] (one trained pair each: timer noise, not model variation), a line at 1
    (AR), the main method's value written on its bar. One figure per temperature; the title names each realization's
    card. Server variants (`@`) are left to the table."""
    tp = T.throughput_table(art)
    if tp is None:
        return T.skip("throughput figure", "no bench/throughput.csv", [])
    tp = tp[(tp.realization != "all") & ~tp.method.astype(str).str.contains("[@:+-]", regex=True)
            & (tp.method != "ar")]
    color, main, paths = colors(art), art.spec.main_method, []
    for t, g in tp.groupby("temperature"):
        caps = sorted(set(g.batch_cap))
        reals = sorted(set(g.realization), key=lambda r: T.realization_number(r) or 0)
        methods = sorted(set(g.method), key=art.rank)
        fig = Figure(figsize=(max(4.5, 0.32 * len(methods) * len(reals) + 1.5) * len(caps) + 2.5, 4.0),
                     layout="constrained")
        axes = fig.subplots(1, len(caps), squeeze=False, sharey=True).ravel()
        for ax, cap in zip(axes, caps):
            ours = {(r.realization, r.method): (r.speedup, r.speedup_lo, r.speedup_hi)
                    for r in g[g.batch_cap == cap].itertuples()}
            xs = grouped_bars(ax, reals, methods, ours, color)
            for key, x in xs.items():
                if key[1] == main:
                    ax.text(x, ours[key][2], f"{ours[key][0]:.2f}x", ha="center", va="bottom", fontsize=7)
            ax.axhline(1, color="k", lw=0.8, ls="--")
            ax.set(title=f"B{int(cap)}", ylim=(0, None))
        axes[0].set_ylabel("speed-up over AR (x)")
        _legend(fig, axes[0])
        dev = {r.realization: r.device for r in g.itertuples() if isinstance(getattr(r, "device", ""), str)}
        cards = "; ".join(f"{k}: {dev.get(k) or 'card not recorded'}" for k in reals)
        fig.suptitle(f"End-to-end speed-up over AR (T={t:g})\nwhiskers: min-max of the timing repeats within one "
                     f"realization\n{cards}", fontsize=9)
        paths.append(_save(art, fig, f"throughput_T{t:g}"))
    return paths


OVERHEAD_STAGES = ["verify", "drafter", "drafter_ctx", "mtp", "mtp_chain", "t1_prep", "accept", "advance"]
STAGE_NAMES = {"verify": "target verify pass", "drafter": "drafter forward", "drafter_ctx": "drafter context update",
               "mtp": "MTP head (T1)", "mtp_chain": "MTP chain (given T1..Tg)", "t1_prep": "T1 embedding prep",
               "accept": "acceptance", "advance": "cache advance",
               "unattributed": "round - timed stages (host, launches)",
               "blog_rest": "verify and the rest (the blog does not break it out)"}
STAGE_COLORS = {"verify": "#7f7f7f", "drafter": "#ff7f0e", "drafter_ctx": "#bcbd22", "mtp": "#1f77b4",
                "mtp_chain": "#17becf", "t1_prep": "#d62728", "accept": "#9467bd", "advance": "#8c564b",
                "unattributed": "#dddddd", "blog_rest": "#c7c7c7"}


def _stack(ax, df: pd.DataFrame, rows: list[str], stages, rest: str, scale: float, prefix: str = ""):
    """Horizontal stacked bars, one per method of `rows` (ms per round by stage: `df`, columns `stages` and "round"):
    its stages and the rest of its round (segment `rest`), each / scale in its colour and named, the round's total
    written at its end."""
    for i, m in enumerate(rows):
        timed = {st: float(df.loc[m].get(st, math.nan)) for st in stages}
        left = 0.0
        for st, v in {**timed, rest: float(df.loc[m, "round"]) - np.nansum(list(timed.values()))}.items():
            if not np.isfinite(v) or v <= 0:
                continue
            ax.barh(i, v / scale, left=left, color=STAGE_COLORS[st], label=STAGE_NAMES[st])
            left += v / scale
        ax.text(left, i, f" {float(df.loc[m, 'round']) / scale:.3f}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [prefix + m for m in rows], fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.18)


def overhead(art: Artifacts) -> list[Path]:
    """Per-round time of the trained models by stage, in units of the AR step of the same realization, card and batch
    (a dashed line at 1), one panel per (card, batch): median over the realizations on that card; every segment named,
    the remainder of the round (host work, launches) as its own segment. The blog's §6.5 rows (batch 8, no AR step
    published) in ms in the last panel."""
    ov = art.overhead
    if ov is None or ov.empty:
        return T.skip("overhead figure", "no bench/overhead.csv", [])
    trained = ov[(ov.realization >= 0) & ov.method.isin(art.spec.runs())] if "realization" in ov else ov.iloc[:0]
    dev = trained.device.fillna("") if "device" in trained else pd.Series("", index=trained.index)
    panels = []
    for (d, batch), g in trained.assign(device=dev).groupby(["device", "batch"], sort=True):
        df = g.pivot_table(index="method", columns="stage", values="ms_per_round", aggfunc="median")
        if "ar" not in df.index or "round" not in df:
            continue
        reals = ", ".join(f"r{k}" for k in sorted(set(g.realization)))
        panels.append((f"B{int(batch)}, {d or 'card not recorded'} ({reals})", df, float(df.loc["ar", "round"])))
    blog = R.table("overhead")
    blog = blog[blog.workload == "Code"].pivot_table(index="method", columns="stage", values="ms_per_round")
    n = len(panels) + 1
    fig = Figure(figsize=(4.0 * n, 3.2), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False).ravel()
    for ax, (title, df, ar_ms) in zip(axes, panels):
        _stack(ax, df, sorted(df.index, key=art.rank), OVERHEAD_STAGES, "unattributed", ar_ms)
        ax.axvline(1, color="k", ls="--", lw=0.8)
        ax.set(title=title, xlabel=f"AR steps per round (1 = {ar_ms:.2f} ms)")
    _stack(axes[-1], blog, [m for m in ("dflash", "dmtp") if m in blog.index], ("drafter", "mtp", "t1_prep"),
           "blog_rest", 1.0, "blog ")
    axes[-1].set(title="blog Code, batch 8 (35B, 4xH200)", xlabel="ms per round (no AR step published)")
    _legend(fig, *axes, loc="outside lower center", ncol=4)
    fig.suptitle("Per-round time by stage against an AR step (trained models, median over realizations per card)",
                 fontsize=9)
    return [_save(art, fig, "overhead")]


def ceiling(art: Artifacts) -> list[Path]:
    """Per T > 0: measured P(L>=j) per draft position for each run (seeds pooled) and the oracle ceiling C_j along
    the `ar` trajectory (black, dashed), one panel per dataset with a ceiling file."""
    color, paths = colors(art), []
    for t in sorted({t for _, t in (art.oracle or {}) if t > 0}):
        recs = sorted((ds, r) for (ds, tt), r in art.oracle.items() if tt == t)
        fig = Figure(figsize=(4.2 * len(recs) + 1.8, 3.4), layout="constrained")
        axes = fig.subplots(1, len(recs), squeeze=False).ravel()
        for ax, (ds, rec) in zip(axes, recs):
            g = select(art.drafting, experiment="ablation", dataset=ds, temperature=t)
            for r in _ranked(art, g):
                y = 100 * np.array(M.cumulative(r.hist))
                ax.plot(range(1, len(y) + 1), y, "o-", ms=3, color=color[r.method], label=r.method)
            C = 100 * np.array(rec["cumulative"], float)
            ax.plot(range(1, len(C) + 1), C, "k--", lw=2,
                    label=f"oracle C_j (ar path), 1 + sum C = {float(rec['acceptance_length']):.2f}")
            ax.set(title=f"{ds} (T={t:g})", xlabel="draft position j", ylabel="P(L >= j) (%)", ylim=(0, 100),
                   xticks=range(1, len(C) + 1))
        _legend(fig, axes[0])
        paths.append(_save(art, fig, f"ceiling_T{t:g}"))
    return paths or T.skip("ceiling figure", "no oracle file at T > 0", [])


def learning_curve(art: Artifacts) -> list[Path]:
    """Acceptance length (T = 0, natural) vs drafter training tokens (log x): one line per method through its pooled
    points with the seed x request 95% band, seeds as faint dots, native MTP as a horizontal line with its CI."""
    path = art.tables / "learning_curve.csv"
    if not path.exists() and T.learning_curve(art) is None:
        return T.skip("learning-curve figure", "no curve/", [])
    df = pd.read_csv(path, dtype={"seed": str})
    color = colors(art)
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.subplots()
    for m in sorted(set(df.method) - {"mtp"}, key=art.rank):
        g = df[df.method == m]
        pooled = g[g.seed == "all"].sort_values("train_tokens")
        seeds = g[g.seed != "all"]
        ax.plot(seeds.train_tokens, seeds.acceptance_length, ".", color=color[m], alpha=0.35)
        ax.plot(pooled.train_tokens, pooled.acceptance_length, "o-", ms=4, color=color[m], label=m)
        ax.fill_between(pooled.train_tokens, pooled.lo, pooled.hi, color=color[m], alpha=0.2, lw=0)
    for r in df[df.method == "mtp"].itertuples():
        ax.axhline(r.acceptance_length, color=color.get("mtp", "k"), ls="--", label="MTP415 (native MTP)")
        ax.axhspan(r.lo, r.hi, color=color.get("mtp", "k"), alpha=0.12, lw=0)
    ax.set_xscale("log")
    pooled_rows = df[df.seed.astype(str) == "all"]  # one tick per budget (the seeds' token counts differ a little)
    ticks = sorted(set((pooled_rows if len(pooled_rows) else df).train_tokens.dropna().round(-4)))
    ax.set_xticks(ticks, [f"{t / 1e6:.3g}M" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="drafter training tokens", ylabel="acceptance length (incl. bonus)",
           title="Learning curve: HumanEval, T=0, natural mode")
    ax.legend(fontsize=7, loc="lower right")
    return [_save(art, fig, "learning_curve")]


def directions(art: Artifacts) -> list[Path]:
    """The closing directions at a glance, one figure per temperature: per dataset, the cumulative acceptance
    P(L >= k) by position k (top) and the share of rounds accepting exactly k drafts (bottom, the histogram behind the
    acceptance length), the direction runs (solid) beside MTP415, DFlash and the main method (dashed), pooled over
    realizations (exploratory: no test)."""
    mine, refs = T.direction_runs(art)
    if not mine:
        return []
    s = art.natural[art.natural.method.isin(mine + refs)]
    color, paths = colors(art), []
    for t, g, panels in _per_temp(s):
        fig = Figure(figsize=(3.8 * len(panels) + 2.4, 6.0), layout="constrained")
        axes = fig.subplots(2, len(panels), squeeze=False)
        for j, ((e, d), label) in enumerate(panels.items()):
            for i, r in enumerate(_ranked(art, select(g, experiment=e, dataset=d))):
                h = np.asarray(r.hist, float)
                style = dict(marker=MARKERS[i % len(MARKERS)], ms=3.5, lw=1.2, color=color[r.method],
                             ls="--" if r.method in refs else "-", label=r.method)
                y = 100 * np.array(M.cumulative(list(r.hist)))
                axes[0, j].plot(np.arange(1, len(y) + 1), y, **style)
                axes[1, j].plot(np.arange(len(h)), 100 * h / max(h.sum(), 1), **style)
            axes[0, j].set(title=f"{label} (T={t:g})", xlabel="position k", ylim=(0, 100))
            axes[1, j].set(xlabel="drafts accepted in a round (k)", ylim=(0, None))
        axes[0, 0].set_ylabel("cumulative P(L>=k) (%)")
        axes[1, 0].set_ylabel("rounds accepting exactly k (%)")
        _legend(fig, *axes[0])
        fig.suptitle("The blog's closing directions (solid) beside MTP415, DFlash and DMTP (dashed); exploratory",
                     fontsize=9)
        paths.append(_save(art, fig, f"directions_T{t:g}"))
    return paths


ALL = [main_acceptance, first_token, position, conditional, directions, throughput, overhead, open_repro, ceiling,
       learning_curve]


def render(art: Artifacts) -> list[Path]:
    return [p for fn in ALL for p in fn(art)]
