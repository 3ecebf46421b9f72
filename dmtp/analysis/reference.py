"""The blog's reference numbers (docs/METHOD.md, "The blog's numbers"), stored in reference.json beside this file,
as pandas DataFrames.

    from dmtp.analysis import reference
    reference.table("main")          # workload, dflash, mtp, dmtp, dmtp_vs_dflash_pct
    reference.blog_value("main", "humaneval", "dmtp")   # 3.847 (our dataset name -> blog workload "Code")

Tables: main, ablation, conditional, per_request_vs_verify, throughput, overhead, open_repro, first_token, and
main_method (the blog's own statements about its Nov 9 main method, which has no number of its own).
Methods are the blog's names: `dmtp` is the DMTP model its numbers were measured with, single-anchor T1 fusion (which
of our runs that is, the experiment's ablation spec says: `blog_method`); the others (dflash, mtp, dflash2, dmtp_d2,
the ablation's variants) match ours.
"""
from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import pandas as pd

PATH = Path(__file__).with_name("reference.json")

# our dataset names (normalised: lower case, alphanumerics only) -> the blog's internal workload (35B, T = 1) ...
WORKLOAD = {"humaneval": "Code", "humaneval8": "Code", "code": "Code", "mbpp": "Code", "livecodebench": "Code",
            "gsm8k": "Math", "math500": "Math", "math": "Math", "aime": "Math", "mtbench": "MT-Bench",
            "agent": "Agent", "swe": "SWE", "swebench": "SWE", "longhorizon": "Long-horizon"}
# ... and -> the open-reproduction dataset (27B, T = 0)
OPEN = {"gsm8k": "GSM8K", "humaneval": "HumanEval", "humaneval8": "HumanEval", "math500": "MATH500",
        "alpaca": "Alpaca", "mtbench": "MT-Bench"}


@functools.lru_cache(maxsize=1)
def raw() -> dict:
    return json.loads(PATH.read_text())


def table(name: str) -> pd.DataFrame:
    """One reference table as a DataFrame (columns as listed in reference.json)."""
    t = raw()[name]
    return pd.DataFrame(t["rows"], columns=t["columns"])


def setting(name: str) -> str:
    return raw()[name]["_setting"]


def _norm(dataset: str) -> str:
    return re.sub(r"[^a-z0-9]", "", dataset.lower())


def workload(dataset: str) -> str | None:
    """Blog workload (main/conditional/per-request tables) for one of our dataset names, or None."""
    return WORKLOAD.get(_norm(dataset))


def open_dataset(dataset: str) -> str | None:
    """Blog open-reproduction dataset for one of our dataset names, or None."""
    return OPEN.get(_norm(dataset))


def blog_value(name: str, dataset: str, method: str) -> float:
    """The number the blog reports for (our dataset, its method) in table `main` or `open_repro` (acceptance
    length; `method` may also name another column, e.g. dmtp_vs_dflash_pct); nan when the blog has none."""
    key = workload(dataset) if name == "main" else open_dataset(dataset)
    t, m = table(name), method
    col = t.columns[0]
    if key is None or m not in t.columns or key not in set(t[col]):
        return math.nan
    return float(t.loc[t[col] == key, m].iloc[0])


def ablation_value(method: str, column: str = "acceptance_length") -> float:
    """The blog's Code-ablation number for our method (acceptance_length or rel_to_token_only_pct), else nan (a
    method or a column the blog's table lacks: it reports every row relative to token_only)."""
    t = table("ablation").set_index("method")
    return float(t.loc[method, column]) if method in t.index and column in t else math.nan


def conditional_row(dataset: str, method: str) -> tuple[list[float], int] | None:
    """(c1..c7 in percent, n_rounds) for our dataset and the blog's method from its conditional table, or None."""
    t, w = table("conditional"), workload(dataset)
    r = t[(t.workload == w) & (t.method == method)]
    if r.empty:
        return None
    return [float(r[f"c{k}"].iloc[0]) for k in range(1, 8)], int(r.n_rounds.iloc[0])
