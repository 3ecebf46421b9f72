"""The numbers a profile's hand-written NOTES.md quotes, generated from its tables: the block between `BEGIN` and
`END` is rewritten by every report render (`fill`), so the prose around it never quotes a number the committed
tables do not hold.

    python -m dmtp.cli.report report --profile tiny   # rewrites results/tiny/NOTES.md's block from tables/
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dmtp.analysis.report.data import read_spec
from dmtp.io import write_text

BEGIN = "<!-- acceptance: generated from tables/ablation_*.csv by the report; do not edit -->"
END = "<!-- end of the generated acceptance -->"


def t1_runs(spec) -> list[str]:
    """The runs whose drafter takes T1 from the MTP head: every trained run but those of the drafter baseline's
    variant (plain DFlash on either backbone)."""
    variant = {**{r: r for r in spec.main + spec.supplementary + spec.controls},
               **{r: v for r, (v, _) in {**spec.continued, **spec.backbones}.items()}}
    return [r for r in spec.runs() if r in variant and variant[r] != spec.drafter_baseline]


def block(root: Path) -> str:
    """The acceptance table NOTES.md quotes, from tables/ablation_*.csv (natural mode): per table and temperature the
    drafter baseline, MTP415 and the lowest and highest of the runs that take T1 from the MTP head."""
    spec = read_spec(root)
    runs, base = t1_runs(spec), spec.drafter_baseline
    rows = ["Per-request acceptance length (incl. the bonus token), natural mode, as the committed tables hold it:", "",
            f"| table | T | `{base}` | `mtp` (MTP415) | the {len(runs)} runs that take T1 from the MTP head: lowest, "
            "highest |", "|---|---|---|---|---|"]
    for path in sorted(Path(root, "tables").glob("ablation_*.csv")):
        if path.stem.endswith("_fixed"):
            continue
        df = pd.read_csv(path)
        for t, g in df.groupby("temperature", sort=True):
            at = g.set_index("method").acceptance_length
            t1 = at[at.index.isin(runs)].sort_values()
            val = lambda m: f"{at[m]:.3f}" if m in at else "—"  # noqa: E731
            ends = f"{t1.iloc[0]:.3f} (`{t1.index[0]}`), {t1.iloc[-1]:.3f} (`{t1.index[-1]}`)" if len(t1) else "—"
            rows.append(f"| {path.stem} | {t:g} | {val(base)} | {val('mtp')} | {ends} |")
    return "\n".join(rows)


def fill(root: Path) -> bool:
    """Rewrite the generated block of root/NOTES.md from root's tables; False where the file or its markers are
    absent (nothing written)."""
    path = Path(root, "NOTES.md")
    text = path.read_text() if path.exists() else ""
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    new = f"{head}{BEGIN}\n{block(root)}\n{END}{rest.split(END, 1)[1]}"
    if new != text:
        write_text(path, new)
    return True
