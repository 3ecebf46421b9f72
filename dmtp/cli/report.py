"""Render tables / figures / REPORT.md of one profile from its artifacts (CPU only, no torch needed).

    python -m dmtp.cli.report tables  --profile tiny [--results results]   # results/tiny/tables/*.csv + *.md
    python -m dmtp.cli.report figures --profile tiny [--results results]   # results/tiny/figures/*.png
    python -m dmtp.cli.report report  --profile tiny [--results results]   # both + results/tiny/REPORT.md
    python -m dmtp.cli.report report  --profile mini     # pools the realizations results/mini/r<k> of one experiment
    python -m dmtp.cli.report demo    --profile demo                       # synthetic artifacts, then the report
    python -m dmtp.cli.report verify  --profile mini [--results results]   # the verification-mode study alone

The rows' order and groups come from results/<profile>/experiment.json (written by the pipeline); `demo` writes
synthetic runs of the Code ablation (ablations/code.py) and of the verification-mode study.
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from ablations.code import code  # noqa: E402
from dmtp.analysis.report import render_figures, render_report, render_tables  # noqa: E402
from dmtp.analysis.report.data import require_artifacts  # noqa: E402
from dmtp.analysis.report import verify as verify_study  # noqa: E402
from dmtp.analysis.report.synthetic import write_synthetic, write_synthetic_verify  # noqa: E402
from dmtp.cli.args import guard  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dmtp.cli.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tables", "figures", "report", "demo", "verify"])
    ap.add_argument("--profile", required=True, help="results/<profile> holds the artifacts")
    ap.add_argument("--results", default="results", help="results root folder")
    a = ap.parse_args(argv)
    guard(f"python -m dmtp.cli.report {a.what}", run, a)


def run(a):
    root = Path(a.results) / a.profile
    if a.what == "demo":
        write_synthetic(code(), a.results, a.profile, temps=(0, 0.6, 1), ood=True)
        write_synthetic_verify(a.results, a.profile)  # and a verification-mode study
    elif a.what == "verify":  # the verification-mode study alone (results/<profile>/verify)
        if not (root / "verify" / "runs").is_dir():
            raise FileNotFoundError(f"{root / 'verify'} holds no verify-study runs: run `dmtp pipeline --profile "
                                    f"{a.profile} --stage verify` first")
        verify_study.render(root)
        return
    else:
        require_artifacts(root, f": check --profile {a.profile} and --results {a.results}")
    {"tables": render_tables, "figures": render_figures}.get(a.what, render_report)(a.profile, a.results)


if __name__ == "__main__":
    main()
