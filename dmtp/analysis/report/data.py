"""Load the artifacts of one profile (and nothing else) into tidy DataFrames.

    results/<profile>/experiment.json        the resolved experiment (written by the pipeline): its `ablation` spec
                                             orders, groups and compares the rows (dmtp/ablation.py)
    results/<profile>/runs/<experiment>/<method>/<dataset>_T<temp>[_fixed][_s<seed>].jsonl   one JSON record per
                                             request; `_fixed`: mode fixed (none: natural), `_s<seed>`: drafter seed
                                             (none: 0); a record's own `mode` / `seed` fields win
    results/<profile>/curve/<method>/humaneval_T0_s<seed>_step<step>.jsonl (+ .meta.json: config.train_tokens)
                                             learning-curve snapshots (T = 0, natural mode)
    results/<profile>/oracle/<dataset>_T<temp>.json   acceptance ceilings at T > 0 (dmtp.analysis.oracle)
    results/<profile>/bench/throughput.csv   method, temperature, batch_cap, dataset, output_tokens, wall_s, tok_per_s
    results/<profile>/bench/overhead.csv     method, stage, ms_per_round   (stages drafter, mtp, t1_prep, verify, round)

Every method found in runs/ is reported, named by the spec or not (then in row group "other", after the others).
Seeds are pooled: a run's acceptance length is the mean over its seed x request matrix, with a two-level bootstrap
interval over seeds and requests (dmtp.analysis.stats); comparisons are paired by seed and request.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dmtp.ablation import AblationSpec
from dmtp.analysis import metrics as M
from dmtp.analysis import stats as S
from dmtp.engine.stops import cut_rounds
from dmtp.io import iter_jsonl, read_json
from dmtp.schema import from_dict

DEFAULT_K = {"ar": 0, "mtp": 4}  # candidates per round when a record has no n_candidates; everything else: 7
KEYS = ["experiment", "dataset", "temperature", "mode", "method"]
MODES = ("natural", "fixed")  # natural: the acceptance tables; fixed: fixed length, end-of-text ignored
# <dataset>_T<temp>[_fixed][_s<seed>]
RUN_NAME = re.compile(r"^(?P<dataset>.+?)_T(?P<temp>[0-9]+(?:\.[0-9]+)?)(?P<fixed>_fixed)?(?:_s(?P<seed>[0-9]+))?$")
CURVE_NAME = re.compile(r"^(?P<dataset>.+?)_T(?P<temp>[0-9]+(?:\.[0-9]+)?)_s(?P<seed>[0-9]+)_step(?P<step>[0-9]+)$")


def read_spec(root: Path) -> AblationSpec:
    """The ablation spec of results/<profile>/experiment.json; without the file an empty spec (every method in row
    group "other", in name order; no reference row, no main method: the tables that need one are skipped)."""
    path = Path(root, "experiment.json")
    if not path.exists():
        print(f"[report] {path} absent (written by `dmtp pipeline`): rows ungrouped, no reference row")
        return AblationSpec()
    exp = read_json(path)
    if not isinstance(exp, dict) or not isinstance(exp.get("ablation"), dict):
        raise ValueError(f"{path}: expected a JSON object with an `ablation` section (written by `dmtp pipeline`)")
    return from_dict(AblationSpec, exp["ablation"], "experiment.ablation")


def read_subsets(root: Path) -> dict[str, str]:
    """Derived datasets of experiment.json's eval.subsets: name -> the dataset it is the first records of."""
    path = Path(root, "experiment.json")
    ev = read_json(path).get("eval", {}) if path.exists() else {}
    return {name: src for name, (src, _) in (ev.get("subsets") or {}).items()}


def method_key(spec: AblationSpec, method: str) -> tuple[str, int, str]:
    """Sort key of a method: its run's place in the spec, then the name (methods the spec does not name come last,
    by name). A bench label "<setup>:<run>+<extra>" sorts after the plain labels, by setup, then as its run."""
    setup, _, label = method.rpartition(":")
    return setup, spec.rank(label.partition("+")[0]), method


@dataclass
class Artifacts:
    root: Path  # results/<profile>
    spec: AblationSpec  # from experiment.json: row order, groups, reference row, main method
    runs: pd.DataFrame  # one row per request: KEYS + seed, id, k, accepted, hist, n_rounds, acceptance_length, ...
    summary: pd.DataFrame  # one row per KEYS group, seeds pooled (see summarize)
    throughput: pd.DataFrame | None  # bench/throughput.csv, None when absent
    overhead: pd.DataFrame | None  # bench/overhead.csv, None when absent
    curve: pd.DataFrame | None = None  # learning-curve requests (read_curve), None when absent
    oracle: dict | None = None  # (dataset, temperature) -> oracle ceiling record (read_oracle)
    subsets: dict | None = None  # derived dataset -> source dataset (experiment.json eval.subsets)

    @property
    def tables(self) -> Path:
        return self.root / "tables"

    @property
    def figures(self) -> Path:
        return self.root / "figures"

    @property
    def natural(self) -> pd.DataFrame:
        """The summary rows of mode natural: what the acceptance tables and figures show."""
        s = self.summary
        return s[s["mode"] == "natural"].reset_index(drop=True) if len(s) else s

    def rank(self, method: str) -> tuple[str, int, str]:
        """Sort key of a method (`method_key`)."""
        return method_key(self.spec, method)

    @property
    def methods(self) -> list[str]:
        """Every method with runs, in report order."""
        return sorted(set(self.runs.method), key=self.rank)


def _request_row(path: Path, line: int, r: dict, method: str, k_default: int) -> dict:
    """One record's row: acceptance counts checked, its loop statistics (metrics.loop_stats) computed."""
    acc = r.get("accepted", [])
    if "id" not in r or not isinstance(acc, list) or not all(isinstance(a, int) and a >= 0 for a in acc):
        raise ValueError(f"{path}:{line}: expected a record with `id` and `accepted` (a list of counts >= 0)")
    k = int(r.get("n_candidates") or k_default)
    if acc and max(acc) > k:
        raise ValueError(f"{path}:{line}: accepted count {max(acc)} exceeds the {k} candidates of a round")
    out = r.get("output_ids", [])
    if "output_ids" in r:  # counts past the record's end dropped (records of earlier versions kept them)
        acc = cut_rounds(acc, len(out))
    lp = M.loop_stats({"output_ids": out, "accepted": acc})
    return {"method": method, "id": r["id"], "k": k, "accepted": acc, "hist": M.histogram(acc, k),
            "n_rounds": len(acc), "acceptance_length": M.acceptance_length(acc), "output_tokens": len(out),
            "wall_s": float(r.get("wall_s", np.nan)), "stop_reason": r.get("stop_reason") or "",
            "repeat_rate": lp["repeat_rate"], "loop_tokens": lp["loop_tokens"],
            "acceptance_length_loopfree": lp["acceptance_length_loopfree"]}


RUN_COLS = KEYS + ["seed", "id", "k", "accepted", "hist", "n_rounds", "acceptance_length", "output_tokens", "wall_s",
                   "stop_reason", "repeat_rate", "loop_tokens", "acceptance_length_loopfree"]


def check_complete(path: Path) -> None:
    """A run file the report may pool: not marked unfinished by its meta (`finished: false`: `dmtp generate` was
    stopped half-way) and holding records; otherwise an error naming it."""
    meta = path.with_suffix(".meta.json")
    m = read_json(meta) if meta.exists() else {}
    if isinstance(m, dict) and m.get("finished") is False:
        raise ValueError(f"{path}: half-written ({meta.name} says finished: false): finish it with the command that "
                         "made it (it resumes), or remove it")
    if not any(line.strip() for line in path.open("rb")):
        raise ValueError(f"{path}: holds no records (an empty run file): rerun it, or remove it")


def read_runs(root: Path) -> pd.DataFrame:
    """Every record under root/runs (file names `RUN_NAME`: mode and seed from the suffixes unless the record says);
    a malformed file (bad name, not JSON, no `id`, `accepted` not a list of counts, a temperature the name does not
    carry), a half-written or empty one, and a request of one run met twice (the same id in one seed, in one file or
    two) are errors naming the file and line."""
    rows, seen = [], {}
    for path in sorted(Path(root, "runs").glob("*/*/*.jsonl")):
        experiment, method = path.parent.parent.name, path.parent.name
        m = RUN_NAME.match(path.stem)
        if not m:
            raise ValueError(f"{path}: expected a file name <dataset>_T<temperature>[_fixed][_s<seed>].jsonl")
        check_complete(path)
        mode, seed = ("fixed" if m["fixed"] else "natural"), int(m["seed"] or 0)
        for line, r in iter_jsonl(path):
            row = _request_row(path, line, r, method, DEFAULT_K.get(method, 7))
            row.update(experiment=experiment, dataset=r.get("dataset", m["dataset"]),
                       temperature=float(r.get("temperature", m["temp"])), mode=r.get("mode") or mode,
                       seed=int(r.get("seed", seed) or 0))
            key = tuple(row[k] for k in KEYS) + (row["seed"], str(row["id"]))
            if key in seen:
                raise ValueError(f"{path}:{line}: request {row['id']!r} of this run is already on {seen[key]} (a "
                                 "record written twice would count twice): remove the duplicate")
            seen[key] = f"{path}:{line}"
            rows.append(row)
    return pd.DataFrame(rows, columns=RUN_COLS)


def read_curve(root: Path) -> pd.DataFrame | None:
    """Learning-curve requests: root/curve/<method>/<dataset>_T<t>_s<seed>_step<step>.jsonl, with train_tokens
    (and seed, step) from the sibling .meta.json (written by the pipeline's curve stage). None without curve/."""
    rows = []
    for path in sorted(Path(root, "curve").glob("*/*.jsonl")):
        m = CURVE_NAME.match(path.stem)
        meta_path = path.with_suffix(".meta.json")
        if not m:
            raise ValueError(f"{path}: expected a file name <dataset>_T<t>_s<seed>_step<step>.jsonl")
        if not meta_path.exists():
            raise ValueError(f"{path}: no {meta_path.name} beside it (its training tokens)")
        meta = read_json(meta_path)
        meta = meta.get("config", meta)  # dmtp.io.write_meta nests the run's fields under "config"
        if meta.get("train_tokens") is None:
            raise ValueError(f"{meta_path}: expected `train_tokens` (drafter training tokens up to the snapshot)")
        method = path.parent.name
        for line, r in iter_jsonl(path):
            row = _request_row(path, line, r, method, DEFAULT_K.get(method, 7))
            row.update(dataset=m["dataset"], temperature=float(m["temp"]), seed=int(meta.get("seed", m["seed"])),
                       step=int(meta.get("step", m["step"])), train_tokens=float(meta["train_tokens"]))
            rows.append(row)
    return pd.DataFrame(rows) if rows else None


def read_oracle(root: Path) -> dict:
    """(dataset, temperature) -> the ceiling record of root/oracle/<dataset>_T<temp>.json (`cumulative` C_1..C_k,
    `acceptance_length` = 1 + sum C_j, `windows`)."""
    out = {}
    for path in sorted(Path(root, "oracle").glob("*.json")):
        ds, _, temp = path.stem.rpartition("_T")
        rec = read_json(path)
        if not isinstance(rec.get("cumulative"), list) or "acceptance_length" not in rec:
            raise ValueError(f"{path}: expected an oracle ceiling with `cumulative` and `acceptance_length`")
        out[rec.get("dataset", ds), float(rec.get("temperature", temp))] = rec
    return out


def missing_runs(runs: pd.DataFrame, expected: dict[str, list[str]] | None = None, key=None) -> list[tuple]:
    """(experiment, dataset, temperature, method) of natural-mode runs that are absent although that experiment and
    dataset hold the temperature for other methods and the method at another temperature, or the method is
    `expected` there (methods in `key` order)."""
    out = []
    runs = runs[runs["mode"] == "natural"]
    for (exp, ds), g in runs.groupby(["experiment", "dataset"], sort=True):
        have = set(zip(g.method, g.temperature))
        methods = sorted(set(g.method) | set((expected or {}).get(exp, ())), key=key)
        out += [(exp, ds, t, m) for m in methods for t in sorted(set(g.temperature)) if (m, t) not in have]
    return out


def per_seed(g: pd.DataFrame, col: str = "acceptance_length") -> dict[int, dict]:
    """{seed: {request id: value}} of one run's requests (a request without rounds: nan, kept)."""
    return {int(s): dict(zip(gs.id, gs[col].astype(float))) for s, gs in g.groupby("seed", sort=True)}


def seed_matrix(g: pd.DataFrame, col: str = "acceptance_length") -> tuple[np.ndarray, list[int], list]:
    """One run's [seeds, requests] matrix of `col` over the requests present in every seed (nan: no rounds)."""
    d = per_seed(g, col)
    seeds = sorted(d)
    ids = sorted(set.intersection(*(set(v) for v in d.values())), key=str) if d else []
    return np.array([[d[s][i] for i in ids] for s in seeds], float).reshape(len(seeds), len(ids)), seeds, ids


def summarize(runs: pd.DataFrame, n_boot: int = 2000, spec: AblationSpec | None = None) -> pd.DataFrame:
    """One row per (experiment, dataset, temperature, mode, method), the method's seeds pooled:
    acceptance_length = mean of the seed x request matrix of per-request acceptance lengths (requests present in
    every seed; requests without rounds skipped) with its two-level bootstrap 95% CI over seeds and requests
    (stats.seed_request_ci; one seed: over requests); per-verify tau and first-token acceptance from the pooled
    histogram `hist` (first token: bootstrap CI over requests); n_seeds, seeds, n_requests (ids with >= 1 round),
    n_zero_round (seed x request records without a verify round) and their ids `zero_round_ids`; the loop columns
    (as metrics.loop_summary over all the run's records): repeat_rate, loop_frac, acceptance_length_loopfree,
    n_loops; length_frac (records stopped by the length cap; nan without stop reasons); n_rounds, output_tokens.
    Rows in (experiment, dataset, temperature, mode, the spec's method order)."""
    out = []
    for key, g in runs.groupby(KEYS, sort=True):
        K = int(g.k.max())
        H = np.array([h + [0] * (K + 1 - len(h)) for h in g["hist"]], float)  # [records, K+1]
        hist = H.sum(0)
        X, seeds, _ = seed_matrix(g)
        al = S.seed_request_ci(X, n_boot=n_boot) if X.size else (np.nan,) * 3
        # first token per request id (its seeds' rounds pooled); no candidates (ar): undefined, not 0
        Hr = pd.DataFrame(H).groupby(g.id.to_numpy()).sum().to_numpy()
        ft = M.bootstrap_ci(Hr, lambda h: M.first_token(h.sum(0)), n_boot=n_boot) if K > 0 else (np.nan,) * 3
        zero = g[g.n_rounds == 0]
        rates, free = g.repeat_rate.dropna(), g.acceptance_length_loopfree.dropna()
        reasons = g.stop_reason[g.stop_reason != ""]
        out.append(dict(zip(KEYS, key), k=K, n_seeds=len(seeds), seeds=seeds,
                        n_requests=int(g.id[g.n_rounds > 0].nunique()), n_zero_round=len(zero),
                        zero_round_ids=sorted(set(zero.id), key=str), n_rounds=int(hist.sum()),
                        hist=[int(x) for x in hist], per_verify=M.per_verify(hist),
                        **dict(zip(["acceptance_length", "acceptance_length_lo", "acceptance_length_hi"], al)),
                        **dict(zip(["first_token", "first_token_lo", "first_token_hi"], ft)),
                        repeat_rate=float(rates.mean()) if len(rates) else np.nan,
                        loop_frac=g.loop_tokens.sum() / g.output_tokens.sum() if g.output_tokens.sum() else np.nan,
                        acceptance_length_loopfree=float(free.mean()) if len(free) else np.nan,
                        n_loops=int((g.loop_tokens > 0).sum()),
                        length_frac=float((reasons == "length").mean()) if len(reasons) else np.nan,
                        output_tokens=int(g.output_tokens.sum())))
    df = pd.DataFrame(out)
    if len(df):
        spec = spec or AblationSpec()
        order = {m: i for i, m in enumerate(sorted(set(df.method), key=lambda m: method_key(spec, m)))}
        mode = df["mode"].map(lambda m: MODES.index(m) if m in MODES else len(MODES))
        df = df.iloc[np.lexsort((df.method.map(order), mode, df.temperature, df.dataset, df.experiment))]
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
    if not (root / "runs").is_dir() and all(v is None for v in bench.values()):
        raise FileNotFoundError(f"{root} holds no artifacts (runs/<experiment>/<method>/<dataset>_T<t>.jsonl or "
                                f"bench/*.csv): check the profile {profile!r} and the results folder {results}, or "
                                f"make them (make ablation-code PROFILE={profile})")
    return Artifacts(root, spec, runs, summarize(runs, n_boot, spec), bench["throughput"], bench["overhead"],
                     read_curve(root), read_oracle(root), read_subsets(root))


def group(art: Artifacts, experiment: str, dataset: str, temperature: float, method: str,
          mode: str = "natural") -> pd.DataFrame:
    """The request rows of one run (every seed)."""
    r = art.runs
    return r[(r.experiment == experiment) & (r.dataset == dataset) & (r.temperature == temperature)
             & (r["mode"] == mode) & (r.method == method)]


def records(art: Artifacts, experiment: str, dataset: str, temperature: float, method: str,
            mode: str = "natural") -> list[dict]:
    """The per-request records of one run (every seed), as dicts."""
    return group(art, experiment, dataset, temperature, method, mode).to_dict("records")


def paired_runs(art: Artifacts, key: tuple, a: str, b: str, n_boot: int = 2000) -> dict:
    """Paired a - b of per-request acceptance length for key = (experiment, dataset, temperature[, mode]):
    stats.paired over the seeds both runs have and the requests both ran (a run with a single seed, e.g. a
    baseline without a drafter, is set beside every seed of the other). {diff, lo, hi, p, n_seeds, n_requests}."""
    ga, gb = (group(art, *key, m) if len(key) == 3 else group(art, *key[:3], m, key[3]) for m in (a, b))
    da, db = per_seed(ga), per_seed(gb)
    if not da or not db or a == b:
        return {"diff": np.nan, "lo": np.nan, "hi": np.nan, "p": np.nan, "n_seeds": 0, "n_requests": 0}
    common = sorted(set(da) & set(db))
    if len(da) == 1 and len(db) > 1 or len(db) == 1 and len(da) > 1 or not common:
        mats, _, _ = S.matrices({a: da, b: db})  # one side broadcast over the other's seeds
    else:
        mats, _, _ = S.matrices({a: {s: da[s] for s in common}, b: {s: db[s] for s in common}})
    return S.paired(mats[a], mats[b], n_boot=n_boot)
