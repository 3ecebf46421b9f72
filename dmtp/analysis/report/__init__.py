"""Render tables, figures and REPORT.md for one profile from its artifacts only (see data.py for the layout).

    python -m dmtp.cli.report report --profile tiny            # tables + figures + results/tiny/REPORT.md
    from dmtp.analysis.report import load, tables, figures     # notebooks: art = load("tiny"); figures.position(art)
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from dmtp.analysis.ratios import read as read_ratios
from dmtp.analysis.report import figures, summary, tables
from dmtp.analysis.report import verify as verify_study
from dmtp.analysis.report.data import Artifacts, load

__all__ = ["Artifacts", "load", "tables", "figures", "summary", "render_tables", "render_figures", "render_report"]

# REPORT.md sections: (title, table files, figure-name prefixes)
SECTIONS = [
    ("Code ablation", ["ablation_*"], []),
    ("Pairwise tests (Holm-corrected)", ["pairwise_T*"], []),
    ("Learning curve: acceptance vs drafter training tokens", ["learning_curve"], ["learning_curve"]),
    ("Acceptance vs its ceiling at T > 0", ["ceiling_T*"], ["ceiling_T*"]),
    ("Acceptance length: DFlash vs native MTP vs DMTP", ["main_acceptance"], ["main_acceptance_T*"]),
    ("First-token acceptance", ["first_token"], ["first_token_T*"]),
    ("Acceptance per position", ["cumulative", "conditional"], ["cumulative_T*", "conditional_T*"]),
    ("Per-request vs per-verify acceptance length", ["per_request_vs_verify"], []),
    ("Throughput and per-round overhead", ["throughput", "overhead"], ["throughput_T*", "overhead"]),
    ("Open-reproduction layout", ["open_repro"], ["open_repro_T*"]),
]


def by_temperature(path: Path) -> tuple:
    """Sort key of a table / figure file: its name with the temperature after _T read as a number (T0 < T0.6 < T1)."""
    stem, _, rest = path.stem.partition("_T")
    num = re.match(r"[0-9.]*[0-9]", rest)
    return stem, float(num.group()) if num else -1.0, rest


def render_tables(profile: str, results: str | Path = "results", art: Artifacts | None = None) -> Artifacts:
    art = art or load(profile, results)
    tables.render(art)
    return art


def render_figures(profile: str, results: str | Path = "results", art: Artifacts | None = None) -> Artifacts:
    art = art or load(profile, results)
    figures.render(art)
    return art


def render_report(profile: str, results: str | Path = "results", art: Artifacts | None = None) -> Path:
    """Render every table and figure, then write results/<profile>/REPORT.md embedding them (relative paths)."""
    art = render_figures(profile, results, render_tables(profile, results, art))
    s = art.summary
    out = [f"# DMTP report — profile `{profile}`", "",
           f"Rendered from `{art.root}` by `python -m dmtp.cli.report report --profile {profile}`. "
           "Acceptance lengths include the bonus token; CIs are 95% percentile bootstraps over drafter seeds and "
           "requests (over requests alone where a run has one seed).", ""]
    notes = art.root / "NOTES.md"  # hand-written provenance and caveats of the run, if any: shown as written
    if notes.exists():
        out += ["## How this run was made (NOTES.md)", "", notes.read_text().strip(), ""]
    out += summary.summary(art)
    if len(s):
        cols = ["experiment", "dataset", "temperature", "mode", "method", "k", "n_seeds", "n_requests",
                "n_zero_round", "n_rounds", "output_tokens"]
        out += ["## Artifacts", "", tables.to_markdown(s[cols])]
    else:
        out += ["No run artifacts found.", ""]
    gone = tables.missing(art)
    if gone:
        out += ["## Missing runs", "", "These runs are absent, so their rows are missing from the tables below:", "",
                *[f"- `runs/{e}/{m}/{d}_T{t:g}.jsonl`" for e, d, t, m in gone], ""]
    out += summary.zero_round_lines(art)
    lossless = art.tables / "lossless_T0.csv"  # written by the pipeline: T=0 outputs identical to `ar`
    if lossless.exists():
        out += ["## Losslessness at T=0 (every method's outputs vs the target alone)", "",
                tables.to_markdown(pd.read_csv(lossless).fillna(""))]
    for title, tabs, figs in SECTIONS:
        mds = [p for pat in tabs for p in sorted(art.tables.glob(f"{pat}.md"), key=by_temperature)]
        pngs = [p for pat in figs for p in sorted(art.figures.glob(f"{pat}.png"), key=by_temperature)]
        if not mds and not pngs:
            continue
        out += [f"## {title}", ""]
        out += [f"![{p.stem}](figures/{p.name})\n" for p in pngs]
        out += [p.read_text() for p in mds]
    out += verify_study.render(art.root)  # the verification-mode study, when results/<profile>/verify exists
    ratios = read_ratios(art.root / "bench" / "ratios.json")  # by `dmtp.cli.bench`: each engine target, met or not
    if ratios:
        r = pd.DataFrame([{"target": x.target, "value": x.value, "goal": x.goal_text, "met": x.met, "note": x.note}
                          for x in ratios])
        out += ["## Engine targets (bench/ratios.json; misses explained in LOG.md)", "", tables.to_markdown(r)]
    path = art.root / "REPORT.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))
    print(f"[report] wrote {path}")
    return path
