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
from dmtp.analysis.report.data import Artifacts  # noqa: E402

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


def _save(art: Artifacts, fig: Figure, name: str) -> Path:
    art.figures.mkdir(parents=True, exist_ok=True)
    path = art.figures / f"{name}.png"
    fig.savefig(path, dpi=120)
    return path


def _label(exp: str, ds: str, multi: bool) -> str:
    return f"{exp}/{ds}" if multi else ds


def _per_temp(s):
    """Yield (temperature, summary rows, whether several experiments share the figure)."""
    for t, g in s.groupby("temperature"):
        yield t, g, g.experiment.nunique() > 1


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


def _legend(fig: Figure, ax):
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=7)


def _bar_figure(art, s, methods, name, title, blog_fn, ylabel, labels=None) -> list[Path]:
    paths = []
    for t, g, multi in _per_temp(s[s.method.isin(methods)]):
        groups = list(dict.fromkeys(_label(e, d, multi) for e, d in zip(g.experiment, g.dataset)))
        present = [m for m in methods if m in set(g.method)]
        ours = {(_label(r.experiment, r.dataset, multi), r.method):
                (r.acceptance_length, r.acceptance_length_lo, r.acceptance_length_hi) for r in g.itertuples()}
        blog = {(_label(r.experiment, r.dataset, multi), r.method): blog_fn(r.dataset, t, r.method)
                for r in g.itertuples()}
        blog = {k: v for k, v in blog.items() if not math.isnan(v)}
        fig = Figure(figsize=(max(5, 0.35 * (len(ours) + len(blog) + len(groups))), 3.6), layout="constrained")
        ax = fig.subplots()
        grouped_bars(ax, groups, present, ours, colors(art), blog, labels)
        _legend(fig, ax)
        ax.set(ylabel=ylabel, title=f"{title} (T={t:g})")
        paths.append(_save(art, fig, f"{name}_T{t:g}"))
    return paths


def main_acceptance(art: Artifacts) -> list[Path]:
    """Grouped bars: DFlash / native MTP / DMTP (the blog's model) / the main method per dataset, bootstrap 95% CI,
    blog values as hatched bars."""
    s, cols = art.natural, T.main_columns(art)
    if s.empty or "dmtp" not in cols or not s.method.isin(cols.values()).any():
        print("[report] skip main acceptance figure: no data")
        return []
    dmtp = cols["dmtp"]
    blog = lambda d, t, m: T.blog_acceptance(d, t, T.blog_name(art, m))  # noqa: E731
    return _bar_figure(art, s, list(cols.values()), "main_acceptance", "Acceptance length", blog,
                       "acceptance length (incl. bonus)",
                       {dmtp: f"dmtp = blog model ({dmtp})", **({cols["main"]: f"main ({cols['main']})"}
                                                                  if "main" in cols else {})})


def open_repro(art: Artifacts) -> list[Path]:
    """Blog figure 8 layout: MTP415, DFlash, DMTP(D), DFlash2, DMTP(D2) per dataset."""
    s, cols = art.natural, T.open_columns(art)
    if s.empty or not s.method.isin([cols.get("dflash2"), cols.get("dmtp_d2")]).any():
        print("[report] skip open-reproduction figure: no DFlash2 runs of the drafter baseline or main method")
        return []
    labels = {m: T.OPEN_LABEL[c] for c, m in cols.items()}
    blog_col = {m: ("dmtp" if c == "dmtp_d" else c) for c, m in cols.items()}
    blog = lambda d, t, m: R.blog_value("open_repro", d, blog_col[m]) if t == 0 else math.nan  # noqa: E731 (T=0)
    return _bar_figure(art, s, list(cols.values()), "open_repro", "Open-reproduction layout", blog,
                       "per-request acceptance length", labels)


def first_token(art: Artifacts) -> list[Path]:
    """First-token acceptance (%) per dataset and method with bootstrap CI; blog values as black diamonds."""
    s = art.natural
    s = s[s.k > 0] if len(s) else s
    if s.empty:
        print("[report] skip first-token figure: no data")
        return []
    paths = []
    for t, g, multi in _per_temp(s):
        groups = list(dict.fromkeys(_label(e, d, multi) for e, d in zip(g.experiment, g.dataset)))
        methods = sorted(set(g.method), key=art.rank)
        ours = {(_label(r.experiment, r.dataset, multi), r.method):
                (100 * r.first_token, 100 * r.first_token_lo, 100 * r.first_token_hi) for r in g.itertuples()}
        fig = Figure(figsize=(max(5, 0.35 * (len(ours) + len(groups))), 3.6), layout="constrained")
        ax = fig.subplots()
        xs = grouped_bars(ax, groups, methods, ours, colors(art))
        blog = [(xs[(_label(r.experiment, r.dataset, multi), r.method)],
                 T.blog_first_token(r.dataset, t, T.blog_name(art, r.method))) for r in g.itertuples()]
        blog = np.array([b for b in blog if not math.isnan(b[1])]).reshape(-1, 2)
        if len(blog):
            ax.plot(blog[:, 0], blog[:, 1], "kD", ms=4, label="blog")
        _legend(fig, ax)
        ax.set(ylabel="first-token acceptance (%)", title=f"P(L>=1) per verify round (T={t:g})", ylim=(0, 105))
        paths.append(_save(art, fig, f"first_token_T{t:g}"))
    return paths


def position(art: Artifacts, kind: str = "cumulative") -> list[Path]:
    """Per-position acceptance, k = 1..K, one panel per dataset: kind 'cumulative' P(L>=k) or 'conditional'
    P(L>=k | L>=k-1). Blog curves (dashed, 35B T=1) are derived from its conditional rows where they exist."""
    s = art.natural
    s = s[s.k > 0] if len(s) else s
    if s.empty:
        print(f"[report] skip {kind} figure: no data")
        return []
    fn = M.cumulative if kind == "cumulative" else M.conditional
    color = colors(art)
    blog_methods = [m for m in (art.spec.drafter_baseline, art.spec.main_method) if m]
    paths = []
    for t, g, multi in _per_temp(s):
        panels = list(dict.fromkeys(zip(g.experiment, g.dataset)))
        ncol, nrow = min(3, len(panels)), math.ceil(len(panels) / 3)
        fig = Figure(figsize=(3.4 * ncol + 1.8, 3.0 * nrow + 0.4), layout="constrained")
        axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
        legend = {}
        for ax, (e, d) in zip(axes, panels):
            for r in g[(g.experiment == e) & (g.dataset == d)].itertuples():
                y = 100 * np.array(fn(r.hist))
                ax.plot(range(1, len(y) + 1), y, "o-", ms=3, color=color[r.method], label=r.method)
            for m in blog_methods:
                row = R.conditional_row(d, T.blog_name(art, m))
                if row:
                    c = np.array(row[0]) / 100
                    y = 100 * (np.cumprod(c) if kind == "cumulative" else c)
                    ax.plot(range(1, 8), y, "--", color=color[m], alpha=0.6,
                            label=f"blog {T.blog_name(art, m)} (35B, T=1)")
            ax.set(title=f"{_label(e, d, multi)} (T={t:g})", xlabel="k", ylim=(0, 100), xticks=range(1, 8))
            legend.update(zip(*ax.get_legend_handles_labels()[::-1]))
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        for ax in axes[::ncol]:
            ax.set_ylabel("cumulative P(L>=k) (%)" if kind == "cumulative" else "conditional P(L>=k | L>=k-1) (%)")
        fig.legend(legend.values(), legend.keys(), loc="outside right upper", fontsize=7)
        paths.append(_save(art, fig, f"{kind}_T{t:g}"))
    return paths


def conditional(art: Artifacts) -> list[Path]:
    return position(art, "conditional")


def throughput(art: Artifacts) -> list[Path]:
    """Blog figure 7: median tok/s vs batch cap with the repeats' [min, max] (every realization's repeats pooled, or
    the newest realization's where their servers were set up differently or ran on different devices; the title
    names which, and the device),
    one panel per dataset (own y axis), the blog's B32 numbers as text on the T = 1 figure (theirs are T = 1)."""
    tp = T.throughput_table(art)
    if tp is None:
        print("[report] skip throughput figure: no bench/throughput.csv")
        return []
    tp = T.headline_throughput(tp)
    color = colors(art)
    blog = R.table("throughput")
    paths = []
    for t, g in tp.groupby("temperature"):
        ds = sorted(set(g.dataset))
        fig = Figure(figsize=(4 * len(ds), 3.4), layout="constrained")
        axes = fig.subplots(1, len(ds), squeeze=False).ravel()
        for ax, d in zip(axes, ds):
            for m, gm in sorted(g[g.dataset == d].groupby("method"), key=lambda x: art.rank(x[0])):
                gm = gm.sort_values("batch_cap")
                err = [gm.tok_per_s - gm.tok_per_s_lo, gm.tok_per_s_hi - gm.tok_per_s]
                ax.errorbar(gm.batch_cap, gm.tok_per_s, yerr=err, fmt="o-", capsize=2, color=color[m], label=m)
            b = blog[blog.workload == R.workload(d)].set_index("method").tok_per_s
            if len(b) == 2 and t == 1:  # the blog's end-to-end numbers are T = 1 (reference.json, throughput)
                ax.margins(y=0.25)  # headroom: the text stays above the points
                ax.text(0.02, 0.98, f"blog B32, T = 1 (4xH200): DFlash {b['dflash']:.0f}\n→ DMTP {b['dmtp']:.0f} tok/s "
                        f"({T.pct(b['dmtp'], b['dflash']):+.2f}%)", transform=ax.transAxes, va="top", fontsize=7)
            ax.set_xscale("log", base=2)
            ax.set(title=d, xlabel="batch cap Bn", xticks=sorted(set(g.batch_cap)))
            ax.set_xticklabels([f"B{int(b)}" for b in sorted(set(g.batch_cap))])
            ax.legend(fontsize=7, loc="lower right")
        axes[0].set_ylabel("tok/s (median, [min, max] over repeats)")
        which = sorted(set(g.realization))
        dev = sorted(set(g.device)) if "device" in g else []
        where = ", ".join(x for x in ["every realization" if which == ["all"] else ", ".join(which),
                                      ", ".join(d for d in dev if isinstance(d, str) and d)] if x)
        fig.suptitle(f"End-to-end throughput (T={t:g})" + (f"\n{where}" if where else ""), fontsize=10)
        paths.append(_save(art, fig, f"throughput_T{t:g}"))
    return paths


STAGES = ["drafter", "mtp", "t1_prep", "drafter_ctx", "verify"]
STAGE_COLORS = {"drafter": "#ff7f0e", "mtp": "#1f77b4", "t1_prep": "#d62728", "drafter_ctx": "#bcbd22",
                "verify": "#7f7f7f", "other": "#dddddd"}


def overhead(art: Artifacts) -> list[Path]:
    """Blog §6.5 as bars: ms per round split by stage, one panel per setup (ours: `mini`, the 8b-shape timing run;
    the blog's Code/SWE rows), DFlash beside DMTP. `other` = round minus the timed stages (acceptance,
    bookkeeping; for the blog, everything it does not break out, verification included)."""
    ov = art.overhead
    if ov is None or ov.empty:
        print("[report] skip overhead figure: no bench/overhead.csv")
        return []
    blog = R.table("overhead").assign(method=lambda b: "blog " + b.workload + ":" + b.method)
    ov = ov[ov.batch == 8] if "batch" in ov else ov  # the blog's setting; trained models: median over realizations
    df = ov.pivot_table(index="method", columns="stage", values="ms_per_round", aggfunc="median")
    df = df.combine_first(blog.pivot_table(index="method", columns="stage", values="ms_per_round"))
    setup = {m: (m.rpartition(":")[0] or "mini") for m in df.index}
    groups = sorted(set(setup.values()), key=lambda g: (g.startswith("blog"), g != "mini", g))
    fig = Figure(figsize=(4.2 * len(groups), 3.4), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False).ravel()
    for ax, grp in zip(axes, groups):
        rows = sorted([m for m in df.index if setup[m] == grp], key=art.rank)
        for i, m in enumerate(rows):
            left = 0.0
            for st in STAGES + ["other"]:
                v = df.loc[m].get(st, math.nan) if st != "other" else \
                    df.loc[m, "round"] - np.nansum([df.loc[m].get(x, math.nan) for x in STAGES])
                if v is None or not np.isfinite(v) or v <= 0:
                    continue
                ax.barh(i, v, left=left, color=STAGE_COLORS[st], label=st)
                left += v
            ax.text(left, i, f" {df.loc[m, 'round']:.2f}", va="center", fontsize=7)
        ax.set_yticks(range(len(rows)), [m.rpartition(":")[2] for m in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set(title=grp, xlabel="ms per round")
        ax.margins(x=0.15)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", ncol=6, fontsize=7)
    fig.suptitle("Per-round time by stage, batch 8 (blog §6.5 setting)")
    return [_save(art, fig, "overhead")]


def ceiling(art: Artifacts) -> list[Path]:
    """Per T > 0: measured P(L>=j) per draft position for each run (seeds pooled) and the oracle ceiling C_j along
    the `ar` trajectory (black, dashed), one panel per dataset with a ceiling file."""
    s = art.natural
    paths = []
    for t in sorted({t for _, t in (art.oracle or {}) if t > 0}):
        recs = sorted((ds, r) for (ds, tt), r in art.oracle.items() if tt == t)
        color = colors(art)
        fig = Figure(figsize=(4.2 * len(recs) + 1.8, 3.4), layout="constrained")
        axes = fig.subplots(1, len(recs), squeeze=False).ravel()
        for ax, (ds, rec) in zip(axes, recs):
            g = s[(s.experiment == "ablation") & (s.dataset == ds) & (s.temperature == t) & (s.k > 0)]
            for r in sorted(g.itertuples(), key=lambda r: art.rank(r.method)):
                y = 100 * np.array(M.cumulative(r.hist))
                ax.plot(range(1, len(y) + 1), y, "o-", ms=3, color=color[r.method], label=r.method)
            C = 100 * np.array(rec["cumulative"], float)
            ax.plot(range(1, len(C) + 1), C, "k--", lw=2,
                    label=f"oracle C_j (ar path), 1 + sum C = {float(rec['acceptance_length']):.2f}")
            ax.set(title=f"{ds} (T={t:g})", xlabel="draft position j", ylabel="P(L >= j) (%)", ylim=(0, 100),
                   xticks=range(1, len(C) + 1))
        _legend(fig, axes[0])
        paths.append(_save(art, fig, f"ceiling_T{t:g}"))
    if not paths:
        print("[report] skip ceiling figure: no oracle file at T > 0")
    return paths


def learning_curve(art: Artifacts) -> list[Path]:
    """Acceptance length (T = 0, natural) vs drafter training tokens (log x): one line per method through its pooled
    points with the seed x request 95% band, seeds as faint dots, native MTP as a horizontal line with its CI."""
    path = art.tables / "learning_curve.csv"
    if not path.exists() and T.learning_curve(art) is None:
        print("[report] skip learning-curve figure: no curve/")
        return []
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


ALL = [main_acceptance, first_token, position, conditional, throughput, overhead, open_repro, ceiling, learning_curve]


def render(art: Artifacts) -> list[Path]:
    return [p for fn in ALL for p in fn(art)]
