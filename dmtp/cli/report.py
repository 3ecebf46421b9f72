"""Render tables / figures / REPORT.md of one profile from its artifacts (CPU only, no torch needed).

    python -m dmtp.cli.report tables  --profile tiny [--results results]   # results/tiny/tables/*.csv + *.md
    python -m dmtp.cli.report figures --profile tiny [--results results]   # results/tiny/figures/*.png
    python -m dmtp.cli.report report  --profile tiny [--results results]   # both + results/tiny/REPORT.md
    python -m dmtp.cli.report report  --profile mini     # pools the realizations results/mini/r<k> of one experiment
    python -m dmtp.cli.report demo    --profile demo                       # synthetic artifacts, then the report
    python -m dmtp.cli.report verify  --profile mini [--results results]   # the verification-mode study alone
    python -m dmtp.cli.report compact --profile mini --realization 2       # its records as .jsonl.gz (~1/20 the size)
    python -m dmtp.cli.report recover-overhead --profile mini --realization 2   # bench/overhead.csv from its bench log

The rows' order and groups come from results/<profile>/experiment.json (written by the pipeline); `demo` writes
synthetic runs of the Code ablation and of the verification-mode study. `compact` gzips a finished realization's
records (the report reads both forms). `recover-overhead` writes bench/overhead.csv of a realization whose bench
was killed before writing it, from the stage times in logs/bench.txt; it never replaces a measured one.
"""
import argparse
from pathlib import Path

import pandas as pd

from dmtp.analysis.report import render_figures, render_report, render_tables  # sets matplotlib's Agg backend
from dmtp.analysis.report import verify as verify_study
from dmtp.analysis.report.bench import overhead_from_log
from dmtp.analysis.report.data import require_artifacts
from dmtp.analysis.report.synthetic import write_synthetic, write_synthetic_verify
from dmtp.cli.args import guard
from dmtp.config.ablation import code
from dmtp.io import compact, write_csv


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dmtp.cli.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tables", "figures", "report", "demo", "verify", "compact",
                                     "recover-overhead"])
    ap.add_argument("--profile", required=True, help="results/<profile> holds the artifacts")
    ap.add_argument("--results", default="results", help="results root folder")
    ap.add_argument("--realization", type=int, help="compact, recover-overhead: results/<profile>/r<k> (required)")
    a = ap.parse_args(argv)
    guard(f"python -m dmtp.cli.report {a.what}", run, a)


def run(a):
    root = Path(a.results) / a.profile
    if a.what in ("compact", "recover-overhead"):
        if a.realization is None:
            raise ValueError(f"{a.what}: --realization K names the finished realization (results/<profile>/r<K>)")
        folder = root / f"r{a.realization}"
        require_artifacts(folder, f": check --profile {a.profile}, --realization and --results {a.results}")
    if a.what == "recover-overhead":
        log, out = folder / "logs" / "bench.txt", folder / "bench" / "overhead.csv"
        if out.exists():
            raise FileExistsError(f"{out} exists: a measured overhead.csv is never replaced by one read from a log")
        if not log.exists():
            raise FileNotFoundError(f"{log}: no bench log to read the stage times from")
        with open(log, errors="replace") as f:
            rows = overhead_from_log(f)
        write_csv(out, pd.DataFrame(rows).assign(source="logs/bench.txt"))
        print(f"[report] {out}: {len(rows)} stage times of {len({(r['method'], r['batch']) for r in rows})} "
              f"(method, batch) pairs, read from {log}")
    elif a.what == "compact":
        plain = sorted(p for d in ("runs", "curve", "verify") for p in (folder / d).glob("**/*.jsonl"))
        before = sum(p.stat().st_size for p in plain)
        after = sum(compact(p).stat().st_size for p in plain)
        print(f"[report] compacted {len(plain)} record files of {folder}: {before / 1e6:.1f} -> {after / 1e6:.1f} MB")
    elif a.what == "verify":
        if not (root / "verify" / "runs").is_dir():
            raise FileNotFoundError(f"{root / 'verify'} holds no verify-study runs: run `dmtp pipeline --profile "
                                    f"{a.profile} --stage verify` first")
        verify_study.render(root)
    else:
        if a.what == "demo":  # synthetic runs, and a verification-mode study
            write_synthetic(code(), a.results, a.profile, temps=(0, 0.6, 1), ood=True)
            write_synthetic_verify(a.results, a.profile)
        else:
            require_artifacts(root, f": check --profile {a.profile} and --results {a.results}")
        {"tables": render_tables, "figures": render_figures}.get(a.what, render_report)(a.profile, a.results)


if __name__ == "__main__":
    main()
