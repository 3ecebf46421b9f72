"""Load the artifacts of one profile (and nothing else) into tidy DataFrames.

    results/<profile>/experiment.json        the resolved experiment (written by the pipeline): its `ablation` spec
                                             orders, groups and compares the rows (dmtp/ablation.py)
    results/<profile>/runs/<experiment>/<method>/<dataset>_T<temp>.jsonl   one JSON record per request
    results/<profile>/bench/throughput.csv   method, temperature, batch_cap, dataset, output_tokens, wall_s, tok_per_s
    results/<profile>/bench/overhead.csv     method, stage, ms_per_round   (stages drafter, mtp, t1_prep, verify, round)

Every method found in runs/ is reported, named by the spec or not (then in row group "other", after the others).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dmtp.ablation import AblationSpec
from dmtp.analysis import metrics as M
from dmtp.io import iter_jsonl
from dmtp.schema import from_dict

DEFAULT_K = {"ar": 0, "mtp": 4}  # candidates per round when a record has no n_candidates; everything else: 7
KEYS = ["experiment", "dataset", "temperature", "method"]


def read_spec(root: Path) -> AblationSpec:
    """The ablation spec of results/<profile>/experiment.json; without the file an empty spec (every method in row
    group "other", in name order; no reference row, no main method: the tables that need one are skipped)."""
    path = Path(root, "experiment.json")
    if not path.exists():
        print(f"[report] {path} absent (written by `dmtp pipeline`): rows ungrouped, no reference row")
        return AblationSpec()
    return from_dict(AblationSpec, json.loads(path.read_text())["ablation"], "experiment.ablation")


def method_key(spec: AblationSpec, method: str) -> tuple[str, int, str]:
    """Sort key of a method: its run's place in the spec, then the name (methods the spec does not name come last,
    by name). A bench label "<setup>:<run>+<extra>" sorts after the plain labels, by setup, then as its run."""
    setup, _, label = method.rpartition(":")
    return setup, spec.rank(label.partition("+")[0]), method


@dataclass
class Artifacts:
    root: Path  # results/<profile>
    spec: AblationSpec  # from experiment.json: row order, groups, reference row, main method
    runs: pd.DataFrame  # one row per request: KEYS + id, k, accepted, hist, n_rounds, acceptance_length, ...
    summary: pd.DataFrame  # one row per KEYS group (see summarize)
    throughput: pd.DataFrame | None  # bench/throughput.csv, None when absent
    overhead: pd.DataFrame | None  # bench/overhead.csv, None when absent

    @property
    def tables(self) -> Path:
        return self.root / "tables"

    @property
    def figures(self) -> Path:
        return self.root / "figures"

    def rank(self, method: str) -> tuple[str, int, str]:
        """Sort key of a method (`method_key`)."""
        return method_key(self.spec, method)

    @property
    def methods(self) -> list[str]:
        """Every method with runs, in report order."""
        return sorted(set(self.runs.method), key=self.rank)


def read_runs(root: Path) -> pd.DataFrame:
    """Every record under root/runs; a malformed file (not JSON, no `id`, `accepted` not a list of counts, a
    temperature the name does not carry) is an error naming the file and line."""
    rows = []
    for path in sorted(Path(root, "runs").glob("*/*/*.jsonl")):
        experiment, method = path.parent.parent.name, path.parent.name
        dataset, _, temp = path.stem.rpartition("_T")
        try:
            float(temp)
        except ValueError:
            raise ValueError(f"{path}: expected a file name <dataset>_T<temperature>.jsonl") from None
        for line, r in iter_jsonl(path):
            acc = r.get("accepted", [])
            if "id" not in r or not isinstance(acc, list) or not all(isinstance(a, int) and a >= 0 for a in acc):
                raise ValueError(f"{path}:{line}: expected a record with `id` and `accepted` (a list of counts >= 0)")
            k = int(r.get("n_candidates") or DEFAULT_K.get(method, 7))
            if acc and max(acc) > k:
                raise ValueError(f"{path}:{line}: accepted count {max(acc)} exceeds the {k} candidates of a round")
            rows.append({"experiment": experiment, "dataset": r.get("dataset", dataset),
                         "temperature": float(r.get("temperature", temp)), "method": method, "id": r["id"], "k": k,
                         "accepted": acc, "hist": M.histogram(acc, k), "n_rounds": len(acc),
                         "acceptance_length": M.acceptance_length(acc),
                         "output_tokens": len(r.get("output_ids", [])), "wall_s": float(r.get("wall_s", np.nan))})
    cols = KEYS + ["id", "k", "accepted", "hist", "n_rounds", "acceptance_length", "output_tokens", "wall_s"]
    return pd.DataFrame(rows, columns=cols)


def missing_runs(runs: pd.DataFrame, expected: dict[str, list[str]] | None = None, key=None) -> list[tuple]:
    """(experiment, dataset, temperature, method) of runs that are absent although that experiment and dataset hold
    the temperature for other methods and the method at another temperature, or the method is `expected` there
    (methods in `key` order)."""
    out = []
    for (exp, ds), g in runs.groupby(["experiment", "dataset"], sort=True):
        have = set(zip(g.method, g.temperature))
        methods = sorted(set(g.method) | set((expected or {}).get(exp, ())), key=key)
        out += [(exp, ds, t, m) for m in methods for t in sorted(set(g.temperature)) if (m, t) not in have]
    return out


def summarize(runs: pd.DataFrame, n_boot: int = 2000, spec: AblationSpec | None = None) -> pd.DataFrame:
    """One row per (experiment, dataset, temperature, method): pooled histogram `hist` (counts), per-request
    acceptance length with its bootstrap 95% CI over requests (acceptance_length_lo/_hi), per-verify tau,
    first-token acceptance with its bootstrap CI over requests (first_token_lo/_hi), n_requests (>= 1 round),
    n_rounds, output_tokens. Rows in (experiment, dataset, temperature, the spec's method order)."""
    out = []
    for key, g in runs.groupby(KEYS, sort=True):
        K = int(g.k.max())
        H = np.array([h + [0] * (K + 1 - len(h)) for h in g["hist"]], float)  # [requests, K+1]
        hist = H.sum(0)
        al = M.bootstrap_ci(g.acceptance_length.dropna().to_numpy(), n_boot=n_boot)
        # no candidates (ar): first-token acceptance is undefined, not 0
        ft = M.bootstrap_ci(H, lambda h: M.first_token(h.sum(0)), n_boot=n_boot) if K > 0 else (np.nan,) * 3
        out.append(dict(zip(KEYS, key), k=K, n_requests=int((g.n_rounds > 0).sum()), n_rounds=int(hist.sum()),
                        hist=[int(x) for x in hist], per_verify=M.per_verify(hist),
                        **dict(zip(["acceptance_length", "acceptance_length_lo", "acceptance_length_hi"], al)),
                        **dict(zip(["first_token", "first_token_lo", "first_token_hi"], ft)),
                        output_tokens=int(g.output_tokens.sum())))
    df = pd.DataFrame(out)
    if len(df):
        spec = spec or AblationSpec()
        order = {m: i for i, m in enumerate(sorted(set(df.method), key=lambda m: method_key(spec, m)))}
        df = df.iloc[np.lexsort((df.method.map(order), df.temperature, df.dataset, df.experiment))]
    return df.reset_index(drop=True)


def pooled_throughput(tp: pd.DataFrame) -> pd.DataFrame:
    """tok/s per (dataset, temperature, batch_cap, method) = total output tokens / total wall time of its rows."""
    t = tp.groupby(["dataset", "temperature", "batch_cap", "method"], as_index=False)[["output_tokens", "wall_s"]].sum()
    t["tok_per_s"] = t.output_tokens / t.wall_s
    return t


def load(profile: str, results: str | Path = "results", n_boot: int = 2000) -> Artifacts:
    root = Path(results) / profile
    spec = read_spec(root)
    runs = read_runs(root)
    bench = {n: (pd.read_csv(p) if (p := root / "bench" / f"{n}.csv").exists() else None)
             for n in ("throughput", "overhead")}
    return Artifacts(root, spec, runs, summarize(runs, n_boot, spec), bench["throughput"], bench["overhead"])


def records(art: Artifacts, experiment: str, dataset: str, temperature: float, method: str) -> list[dict]:
    """The per-request records of one group, as dicts (for metrics.paired_diff)."""
    r = art.runs
    g = r[(r.experiment == experiment) & (r.dataset == dataset) & (r.temperature == temperature) & (r.method == method)]
    return g.to_dict("records")
