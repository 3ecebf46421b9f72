"""Render tables, figures and REPORT.md for one profile from its artifacts only (see data.py for the layout).

    python -m dmtp.cli.report report --profile tiny            # tables + figures + results/tiny/REPORT.md
    from dmtp.analysis.report import load, tables, figures     # notebooks: art = load("tiny"); figures.position(art)
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dmtp.analysis.ratios import read as read_ratios
from dmtp.analysis.report import blog_gap, figures, notes, summary, tables
from dmtp.analysis.report import verify as verify_study
from dmtp.analysis.report.data import Artifacts, find_results, load, read_optional
from dmtp.io import write_text

__all__ = ["Artifacts", "find_results", "load", "tables", "figures", "summary", "render_tables", "render_figures",
           "render_report"]

# REPORT.md's detailed sections: (title, table files, figure-name prefixes)
SECTIONS = [
    ("Code ablation", ["ablation_*"], []),
    ("Pairwise tests (Holm over each dataset's family)", ["pairwise_T*"], []),
    ("Learning curve: acceptance vs drafter training tokens", ["learning_curve"], ["learning_curve"]),
    ("Acceptance vs its ceiling at T > 0", ["ceiling_T*"], ["ceiling_T*"]),
    ("Acceptance length: DFlash vs native MTP vs DMTP", ["main_acceptance"], ["main_acceptance_T*"]),
    ("First-token acceptance", ["first_token"], ["first_token_T*", "first_token_supplementary_T*"]),
    ("Acceptance per position", ["cumulative", "conditional"],
     ["cumulative_T*", "conditional_T*", "cumulative_supplementary_T*", "conditional_supplementary_T*"]),
    ("The blog's closing directions: adaptive multi-step MTP, the MTP head trained with the drafter (exploratory)",
     ["directions"], ["directions_T*"]),
    ("Per-request vs per-verify acceptance length", ["per_request_vs_verify"], []),
    ("Per-round overhead", ["overhead"], ["overhead"]),
    ("Open-reproduction layout", ["open_repro"], ["open_repro_T*"]),
    ("Per turn (multi-turn sets)", ["turns"], []),
]


def render_tables(profile: str, results: str | Path = "results", art: Artifacts | None = None) -> Artifacts:
    art = art or load(profile, results)
    tables.render(art)
    return art


def render_figures(profile: str, results: str | Path = "results", art: Artifacts | None = None) -> Artifacts:
    art = art or load(profile, results)
    figures.render(art)
    return art


def _section(art: Artifacts, title: str, tabs: list[str], figs: list[str]) -> list[str]:
    mds = [p for pat in tabs for p in sorted(art.tables.glob(f"{pat}.md"), key=tables.by_temperature)]
    pngs = figures.links(art, *figs)
    if not mds and not pngs:
        return []
    said = tables.caveat_line(art)  # said once, at the report's top
    return [f"## {title}", "", *pngs, *[p.read_text().replace(said + "\n", "") if said else p.read_text() for p in mds]]


def scope(art: Artifacts) -> list[str]:
    """The hand-written scope of what the folder holds (the first paragraph of results/<profile>/NOTES.md, headed
    "Scope:"), first: what a reader must know before any number (e.g. a run made with a reduced budget)."""
    path = art.root / "NOTES.md"
    if not path.exists():
        return []
    first = path.read_text().strip().split("\n\n")[0]
    return [f"> {line}" for line in first.splitlines()] + [""] if first.startswith("Scope:") else []


def corpus_lines(art: Artifacts) -> list[str]:
    """Whether each realization's corpus is the one its profile pins (`data.corpus_digest` in experiment.json: the
    digest of the committed runs' corpus where the profile pins one)."""
    pinned = (read_optional(art.root, "experiment.json").get("data") or {}).get("corpus_digest") or ""
    have = [r for r in art.realizations if r.corpus]
    if not have:
        return []
    if not pinned:
        return ["", "The profile pinned no corpus digest when these ran: whether their corpus equals another run's is "
                "read from the digests above."]
    same = [r.name for r in have if r.corpus == pinned]
    other = [f"{r.name} ({r.corpus})" for r in have if r.corpus != pinned]
    return ["", f"Corpus against the profile's pinned digest {pinned}: "
            + "; ".join(x for x in (f"equal in {', '.join(same)}" if same else "",
                                    f"**different** in {', '.join(other)}" if other else "") if x) + "."]


def how(art: Artifacts) -> list[str]:
    """The short 'how the runs were made': the realizations pooled (folder, commits, devices, dates, corpus, records
    revision), those left out, and where the history is."""
    rows = ["| realization | folder | commits (meta files) | devices | written | corpus | records revision |",
            "|---|---|---|---|---|---|---|"]
    for r in art.realizations:
        commits = ", ".join(f"{c} ({n})" for c, n in r.commits) or "—"
        rows.append(f"| {r.name} | `{r.root}` | {commits} | {', '.join(r.devices) or '—'} | "
                    f"{' … '.join(x for x in r.written if x) or '—'} | {r.corpus or '—'} | "
                    f"{r.revision if r.revision is not None else 'before revisions'} |")
    corpora = {r.corpus for r in art.realizations if r.corpus}
    rows += corpus_lines(art)
    if len(corpora) > 1:  # another Python installation: other files, so other targets and other `pytests` prompts
        rows += ["", f"**The pooled realizations' corpora differ** ({', '.join(sorted(corpora))}): their targets "
                 "pretrained on different files and an out-of-distribution set has different prompts in each."]
    made = ("Each realization is one `dmtp reproduce` run on a local target (on-policy regeneration, drafter "
            "training, the blog's evaluation protocol; each stage's wall time in stages.json)"
            if (art.root / "stages.json").exists() else
            "Each realization is one `dmtp pipeline` run of the profile (its own target, on-policy data and drafter "
            "seeds: `Profile.realization`), then `python -m dmtp.cli.bench` on its trained models")
    out = ["## How the runs were made", "",
           made + ". The run history, negative results included, is in LOG.md"
           + (", this profile's hand-written notes in [NOTES.md](NOTES.md)" if (art.root / "NOTES.md").exists() else "")
           + ".", "", *rows, ""]
    if art.left_out:
        out += ["Left out (not the pooled experiment):", "", *[f"- {n}: {why}" for n, why in art.left_out], ""]
    return out


def _clear_rendered(art: Artifacts) -> None:
    """Remove what an earlier rendering of this folder wrote (its tables and figures; the pipeline's own
    `lossless_*.csv` stay), so a table or figure the data no longer supports is gone rather than left stale."""
    for p in [*art.tables.glob("*.csv"), *art.tables.glob("*.md"), *art.figures.glob("*.png")]:
        if not p.name.startswith("lossless_"):
            p.unlink()


def render_report(profile: str, results: str | Path = "results", art: Artifacts | None = None,
                  name: str | None = None, command: str | None = None) -> Path:
    """Render every table and figure, then write results/<profile>/REPORT.md: what was found (the claims table, the
    headline figure, the acceptance tables and rankings), throughput, the cost model, the detailed tables, and last
    how the runs were made. `name` / `command`: the profile and the command named in its heading when the folder is
    not results/<profile> (default: the folder's name, `python -m dmtp.cli.report report`)."""
    art = art or load(profile, results)
    _clear_rendered(art)
    art = render_figures(profile, results, render_tables(profile, results, art))
    notes.fill(art.root)  # NOTES.md's generated numbers, from the tables just written
    s = art.summary
    reals = ", ".join(r.name for r in art.realizations)
    command = command or f"python -m dmtp.cli.report report --profile {profile}"
    out = [f"# DMTP report — profile `{name or profile}`", "",
           f"Rendered from `{art.root}` ({len(art.realizations)} realization(s): {reals}) by `{command}`. "
           "Acceptance lengths include the bonus token. Intervals are "
           "95 %: t [t-interval over the top level's units: realizations when there are several, else seeds] first, "
           "bootstrap [hierarchical bootstrap over realizations, drafter seeds and requests] beside it." + (
               f" Left out: {', '.join(n for n, _ in art.left_out)} (see the end)." if art.left_out else ""), ""]
    out += [tables.caveat_line(art)] if art.caveat else []
    out += scope(art)
    out += summary.findings(art)
    tp = art.tables / "throughput.md"
    if tp.exists():
        out += ["## Throughput", "", *summary.throughput_lines(art), "",
                *figures.links(art, "throughput_T*"), tp.read_text()]
    out += blog_gap.lines(art)
    cm = art.tables / "costmodel.md"
    if cm.exists():
        out += ["## Cost model", "", *summary.costmodel_lines(art), "", cm.read_text()]
    if not len(s):
        out += ["No run artifacts found.", ""]
    gone = tables.missing(art)
    if gone:
        out += ["## Missing runs", "", tables.made_by(art), "",
                "These runs are absent, so their rows are missing from the tables below:", "",
                *[f"- `runs/{e}/{m}/{d}_T{t:g}.jsonl`" for e, d, t, m in gone], ""]
    out += summary.zero_round_lines(art)
    lossless = [pd.read_csv(p).assign(realization=r.name) for r in art.realizations
                if (p := r.root / "tables" / "lossless_T0.csv").exists()]  # by the pipeline: T=0 outputs vs `ar`
    if lossless:
        out += ["## Losslessness at T=0 (every method's outputs vs the target alone)", "", tables.made_by(art), "",
                tables.to_markdown(pd.concat(lossless, ignore_index=True).fillna(""))]
    for title, tabs, figs in SECTIONS:
        out += _section(art, title, tabs, figs)
    for r in art.realizations:  # the verification-mode study, where a realization has one
        study = verify_study.render(r.root, href=str((r.root / "figures").relative_to(art.root))
                                    if r.root != art.root else "figures")
        if study and r.root != art.root:
            study[0] += f" ({r.name})"
        out += study
    for r in art.realizations:
        ratios = read_ratios(r.root / "bench" / "ratios.json")  # by `dmtp.cli.bench`: each engine target, met or not
        if ratios:
            df = pd.DataFrame([{"target": x.target, "value": x.value, "goal": x.goal_text, "met": x.met,
                                "note": x.note} for x in ratios])
            out += [f"## Engine targets ({r.name}: bench/ratios.json at {r.bench_commit or 'no recorded commit'}; "
                    "misses explained in LOG.md)", "", tables.to_markdown(df)]
    out += how(art)
    if len(s):
        cols = ["experiment", "dataset", "temperature", "mode", "method", "k", "n_realizations", "n_seeds",
                "n_requests", "n_zero_round", "n_rounds", "output_tokens"]
        out += ["## Artifacts", "", tables.made_by(art), "", tables.to_markdown(s[cols])]
    path = art.root / "REPORT.md"
    write_text(path, "\n".join(out))
    print(f"[report] wrote {path}" + (f" ({art.caveat_short})" if art.caveat_short else ""))
    return path
