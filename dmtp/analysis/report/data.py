"""Load the artifacts of one profile (and nothing else) into tidy DataFrames.

A profile's results are one or more *realizations* (independent replications of the whole experiment, each with
its own target, on-policy data and drafter seeds: `Profile.realization`):

    results/<profile>/r<k>/                  realization k >= 1: a complete results folder (the layout below)
    results/<profile>/                       with runs/ of its own: realization 0 (the flat layout, e.g. tiny)

Realizations are pooled only when they are one series: their experiments match (experiment.json without
`realization` and run control: `experiment_key`) and so does the revision of the code that made their records
(experiment.json `records_revision`, `dmtp.RECORDS_REVISION`; realizations written before revisions were declared
are a group of their own). The pre-registered primary family's series (`registered.PRIMARY`) is pooled wherever a
realization of it exists; otherwise the largest series (ties: the one holding the newest realization). The others
are left out by name with the fields that differ (`Artifacts.left_out`). Tables, figures and REPORT.md go to
results/<profile>/. Inside each realization:

    experiment.json                          the resolved experiment (written by the pipeline): its `ablation` spec
                                             orders, groups and compares the rows (dmtp/ablation.py)
    runs/<experiment>/<method>/<dataset>_T<temp>[_fixed][_s<seed>].jsonl (+ .meta.json)   one JSON record per
                                             request; `_fixed`: mode fixed (none: natural), `_s<seed>`: drafter seed
                                             (none: 0); a record's own `mode` / `seed` fields win
    curve/<method>/humaneval_T0_s<seed>_step<step>.jsonl (+ .meta.json: config.train_tokens)
                                             learning-curve snapshots (T = 0, natural mode)
    oracle/<dataset>_T<temp>.json            acceptance ceilings at T > 0 (dmtp.analysis.oracle)
    bench/throughput.csv                     one row per timed run of the trained models (dmtp.cli.bench): method,
                                             temperature, batch_cap, repeat, output_tokens, wall_s, tok_per_s,
                                             per_verify, groups, admit_s, ...
    bench/overhead.csv                       method, stage, ms_per_round, batch (the trained models at batches 1, 8,
                                             32; "<setup>:<method>" rows: random-weight shape timings)
    bench/meta.json, bench/ratios.json       the bench's settings and commit; its typed ratio records

Every method found in runs/ is reported, named by the spec or not (then in row group "other", after the others).
Realizations, seeds and requests are pooled: a run's acceptance length is the mean over its realization x seed x
request cube, with a hierarchical bootstrap interval and a t-interval at the top level (dmtp.analysis.stats);
comparisons are paired by realization, seed and request.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dmtp.analysis import metrics as M
from dmtp.analysis import stats as S
from dmtp.config import EVAL_MODES, AblationSpec
from dmtp.config.engine import records_key_of
from dmtp.config.experiment import drafter_key
from dmtp.config.training import pretrain_key
from dmtp.engine.stops import cut_rounds
from dmtp.experiment import records_revision
from dmtp.io import RECORDS, check_finished, iter_jsonl, read_json, record_meta, record_stem
from dmtp.schema import from_dict

CONTRAST_BOOT = 4000  # bootstrap draws of every paired contrast a report prints (one interval per contrast: the
# pairwise, acceptance and claims tables draw the same cells with the same seed and count)
DEFAULT_K = {"ar": 0, "mtp": 4}  # candidates per round when a record has no n_candidates; everything else: 7
KEYS = ["experiment", "dataset", "temperature", "mode", "method"]
MODES = EVAL_MODES  # natural: the acceptance tables; fixed: fixed length, end-of-text ignored
REALIZATION = re.compile(r"^r(?P<k>[0-9]+)$")  # results/<profile>/r<k>
# experiment.json fields that say how a realization was run, not what it is (dmtp.cli.stages.RUN_CONTROL and the
# subset a command selected)
RUN_CONTROL = ("stop_after", "save_every", "log_every", "compile", "fused_ce", "ce_chunk", "fsdp", "shard_target",
               "activation_checkpointing", "micro_batch", "grad_sync", "only", "only_seeds", "kernels")
RUN_NAME = re.compile(r"^(?P<dataset>.+?)_T(?P<temp>[0-9]+(?:\.[0-9]+)?)(?P<fixed>_fixed)?(?:_s(?P<seed>[0-9]+))?$")
CURVE_NAME = re.compile(r"^(?P<dataset>.+?)_T(?P<temp>[0-9]+(?:\.[0-9]+)?)_s(?P<seed>[0-9]+)_step(?P<step>[0-9]+)$")


def read_spec(root: Path) -> AblationSpec:
    """The ablation spec of results/<profile>/experiment.json; without the file an empty spec (rows ungrouped)."""
    path = Path(root, "experiment.json")
    if not path.exists():
        print(f"[report] {path} absent (written by `dmtp pipeline`): rows ungrouped, no reference row")
        return AblationSpec()
    exp = read_json(path)
    if not isinstance(exp, dict) or not isinstance(exp.get("ablation"), dict):
        raise ValueError(f"{path}: expected a JSON object with an `ablation` section (written by `dmtp pipeline`)")
    return from_dict(AblationSpec, exp["ablation"], "experiment.ablation")


def read_optional(*parts) -> dict:
    """The JSON object at Path(*parts) ({} when the file is absent): experiment.json, stages.json, a meta file."""
    path = Path(*parts)
    return read_json(path) if path.exists() else {}


def read_subsets(root: Path) -> dict[str, str]:
    """Derived datasets of experiment.json's eval.subsets: name -> the dataset it is the first records of."""
    ev = read_optional(root, "experiment.json").get("eval", {})
    return {name: src for name, (src, _) in (ev.get("subsets") or {}).items()}


def read_ood(root: Path) -> dict[str, tuple[str, ...]]:
    """Out-of-distribution sets of experiment.json's eval.ood -> the runs decoded on them (eval.ood_runs)."""
    ev = read_optional(root, "experiment.json").get("eval", {})
    return {name: tuple(ev.get("ood_runs") or ()) for name in ev.get("ood") or {}}


def read_caveat(root: Path, short: bool = False) -> str:
    """`registered.caveat` of a realization: its experiment.json `name` (a smoke series?) and its stages.json
    `random_weights` (`dmtp reproduce` on a random-weight stand-in target); short: a figure title's words."""
    from dmtp.analysis.report.registered import caveat

    return caveat(str(read_optional(root, "experiment.json").get("name", "")),
                  bool(read_optional(root, "stages.json").get("random_weights")), short)


def method_key(spec: AblationSpec, method: str) -> tuple[str, int, str]:
    """Sort key of a method: its run's place in the spec, then the name (methods the spec does not name come last,
    by name). A bench label "<setup>:<run>+<extra>" sorts after the plain labels, by setup, then as its run."""
    setup, _, label = method.rpartition(":")
    return setup, spec.rank(label.partition("+")[0]), method


@dataclass(frozen=True)
class Realization:
    """One independent replication of the experiment, as found on disk, with its provenance (its meta files)."""
    k: int  # 0: the flat layout results/<profile>; k >= 1: results/<profile>/r<k>
    root: Path
    commits: tuple[tuple[str, int], ...] = ()  # (git_sha, number of meta files written at it), most frequent first
    devices: tuple[str, ...] = ()  # the devices its meta files name
    written: tuple[str, str] = ("", "")  # first and last `written` stamp of its meta files
    bench_commit: str = ""  # the commit bench/meta.json records ("": no bench)
    corpus: str = ""  # the digest of the target's pretraining documents (target/meta.json corpus.train_digest)
    bench_device: str = ""  # the device bench/meta.json records ("": no bench, or none recorded)
    revision: str | None = None  # the records revision experiment.json names (None: written before revisions)

    @property
    def name(self) -> str:
        return f"r{self.k}"


@dataclass
class Artifacts:
    root: Path  # results/<profile>: where tables/, figures/ and REPORT.md go
    spec: AblationSpec  # from experiment.json: row order, groups, reference row, main method
    runs: pd.DataFrame  # one row per request: KEYS + realization, seed, id, k, accepted, hist, n_rounds, ...
    summary: pd.DataFrame  # one row per KEYS group, realizations and seeds pooled (see summarize)
    throughput: pd.DataFrame | None  # bench/throughput.csv of every realization (+ realization), None when absent
    overhead: pd.DataFrame | None  # bench/overhead.csv rows (+ realization; -1: shape timings), None when absent
    curve: pd.DataFrame | None = None  # learning-curve requests (read_curve), None when absent
    oracle: dict | None = None  # (dataset, temperature) -> oracle ceiling, pooled (read_oracle_pooled)
    subsets: dict | None = None  # derived dataset -> source dataset (experiment.json eval.subsets)
    realizations: list[Realization] = field(default_factory=list)  # the pooled ones, in order
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (realization, why) of those not pooled
    ood: dict | None = None  # out-of-distribution set -> its runs (experiment.json eval.ood, eval.ood_runs)
    caveat: str = ""  # what the series cannot show (`registered.caveat`), said at the top of the report and tables
    caveat_short: str = ""  # the same in a few words, atop every figure
    registered: list[str] = field(default_factory=list)  # realizations found of `registered.PRIMARY`'s series

    @property
    def on_registered(self) -> bool:
        """Whether the pooled realizations are the registered series."""
        return bool(self.realizations) and [r.name for r in self.realizations] == self.registered

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

    @property
    def drafting(self) -> pd.DataFrame:
        """The natural-mode summary rows of the runs that draft (k > 0): the first-token and per-position views."""
        s = self.natural
        return s[s.k > 0] if len(s) else s

    def ablation(self, dataset: str, temperature: float | None = None) -> pd.DataFrame:
        """The natural-mode summary rows of the ablation on one dataset (at one temperature when given)."""
        s = self.natural
        s = s[(s.experiment == "ablation") & (s.dataset == dataset)]
        return s if temperature is None else s[s.temperature == temperature]

    def rank(self, method: str) -> tuple[str, int, str]:
        return method_key(self.spec, method)

    def order(self, methods: pd.Series) -> pd.Series:
        """Each method's place in report order (`rank`): a sort key for table rows."""
        return methods.map({m: i for i, m in enumerate(sorted(set(methods), key=self.rank))})

    @property
    def methods(self) -> list[str]:
        """Every method with runs, in report order."""
        return sorted(set(self.runs.method), key=self.rank)


def _request_row(path: Path, line: int, r: dict, method: str) -> dict:
    """One record's row: acceptance counts checked, its loop statistics (metrics.loop_stats) computed."""
    acc = r.get("accepted", [])
    if "id" not in r or not isinstance(acc, list) or not all(isinstance(a, int) and a >= 0 for a in acc):
        raise ValueError(f"{path}:{line}: expected a record with `id` and `accepted` (a list of counts >= 0)")
    k = int(r.get("n_candidates") or DEFAULT_K.get(method, 7))
    if acc and max(acc) > k:
        raise ValueError(f"{path}:{line}: accepted count {max(acc)} exceeds the {k} candidates of a round")
    out = r.get("output_ids", [])
    if "output_ids" in r:  # counts past the record's end dropped (records of earlier versions kept them)
        acc = cut_rounds(acc, len(out))
    lp = M.loop_stats({"output_ids": out, "accepted": acc})
    return {"method": method, "id": r["id"], "k": k, "accepted": acc, "hist": M.histogram(acc, k),
            "n_rounds": len(acc), "first_hits": sum(a > 0 for a in acc), "acceptance_length": M.acceptance_length(acc),
            "output_tokens": len(out), "wall_s": float(r.get("wall_s", np.nan)),
            "stop_reason": r.get("stop_reason") or "",
            **{c: lp[c] for c in ("repeat_rate", "loop_tokens", "acceptance_length_loopfree")}}


RUN_COLS = KEYS + ["seed", "id", "k", "accepted", "hist", "n_rounds", "first_hits", "acceptance_length",
                   "output_tokens", "wall_s", "stop_reason", "repeat_rate", "loop_tokens", "acceptance_length_loopfree"]


def record_files(root: Path, pattern: str) -> list[Path]:
    """The record files (.jsonl, or .jsonl.gz after `compact`) at root/<pattern>, sorted."""
    return sorted(p for x in RECORDS for p in root.glob(pattern + "*" + x))


def check_complete(path: Path) -> None:
    """A run file the report may pool: not marked unfinished by its meta (`finished: false`: `dmtp generate` was
    stopped half-way) and holding records; otherwise an error naming it."""
    check_finished(path)
    if next(iter_jsonl(path), None) is None:
        raise ValueError(f"{path}: holds no records (an empty run file): rerun it, or remove it")


def read_runs(root: Path) -> pd.DataFrame:
    """Every record under root/runs (file names `RUN_NAME`: mode and seed from the suffixes unless the record says);
    a malformed, half-written or empty file and a request of one run met twice are errors naming the file and line."""
    rows, seen = [], {}
    for path in record_files(Path(root, "runs"), "*/*/"):
        experiment, method = path.parent.parent.name, path.parent.name
        m = RUN_NAME.match(record_stem(path))
        if not m:
            raise ValueError(f"{path}: expected a file name <dataset>_T<temperature>[_fixed][_s<seed>].jsonl")
        check_complete(path)
        mode, seed = ("fixed" if m["fixed"] else "natural"), int(m["seed"] or 0)
        for line, r in iter_jsonl(path):
            row = _request_row(path, line, r, method)
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
    for path in record_files(Path(root, "curve"), "*/"):
        m = CURVE_NAME.match(record_stem(path))
        meta_path = record_meta(path)
        if not m:
            raise ValueError(f"{path}: expected a file name <dataset>_T<t>_s<seed>_step<step>.jsonl")
        if not meta_path.exists():
            raise ValueError(f"{path}: no {meta_path.name} beside it (its training tokens)")
        meta = read_json(meta_path)
        meta = meta.get("config", meta)  # dmtp.io.write_meta nests the run's fields under "config"
        if meta.get("train_tokens") is None:
            raise ValueError(f"{meta_path}: expected `train_tokens` (drafter training tokens up to the snapshot)")
        check_complete(path)
        for line, r in iter_jsonl(path):
            row = _request_row(path, line, r, path.parent.name)
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


def per_unit(g: pd.DataFrame, col: str = "acceptance_length") -> dict[tuple[int, int], dict]:
    """{(realization, seed): {request id: value}} of one run's requests (a request without rounds: nan, kept)."""
    return {(int(r), int(s)): dict(zip(gs.id, gs[col].astype(float)))
            for (r, s), gs in g.groupby(["realization", "seed"], sort=True)}


def cube(g: pd.DataFrame, col: str = "acceptance_length") -> np.ndarray:
    """One run's [realizations, seeds, requests] cube of `col` over the requests present in every unit (nan: no
    rounds; a realization with fewer seeds: rows of nan)."""
    d = per_unit(g, col)
    return S.matrices({"run": d})[0]["run"] if d else np.full((0, 0, 0), np.nan)


def pooled_hist(g: pd.DataFrame) -> tuple[int, np.ndarray]:
    """(K, hist): the most candidates of a round among the records `g` (rows of `read_runs`) and their histograms
    summed, hist[j] = rounds accepting j of them, j = 0..K."""
    K = int(g.k.max())
    return K, np.array([h + [0] * (K + 1 - len(h)) for h in g["hist"]], float).sum(0)  # [records, K+1] summed


def summarize(runs: pd.DataFrame, n_boot: int = 2000, spec: AblationSpec | None = None) -> pd.DataFrame:
    """One row per (experiment, dataset, temperature, mode, method), the method's realizations and seeds pooled:
    acceptance_length = mean of the realization x seed x request cube of per-request acceptance lengths (requests
    present in every unit; requests without rounds skipped; every realization weighs the same) with its hierarchical
    bootstrap 95% CI and the t-interval at the top level (_tlo, _thi); per-verify tau from the pooled histogram;
    first-token acceptance = rounds accepting >= 1 draft / rounds over the same cube; the loop columns as
    metrics.loop_summary; length_frac: records stopped by the length cap. Rows in KEYS order, methods the spec's."""
    out = []
    for key, g in runs.groupby(KEYS, sort=True):
        K, hist = pooled_hist(g)
        X = cube(g)
        al = S.seed_request_ci(X, n_boot=n_boot) if X.size else (np.nan,) * 3
        level, units = S.top_level(X) if X.size else ("", [])
        t = S.t_test(units)
        # no candidates (ar): undefined, not 0
        ft = S.ratio_ci(cube(g, "first_hits"), cube(g, "n_rounds"), n_boot) if K > 0 else (np.nan,) * 3
        zero = g[g.n_rounds == 0]
        rates, free = g.repeat_rate.dropna(), g.acceptance_length_loopfree.dropna()
        reasons = g.stop_reason[g.stop_reason != ""]
        out.append(dict(zip(KEYS, key), k=K, n_realizations=int(g.realization.nunique()),
                        n_seeds=int(g.groupby("realization").seed.nunique().max()), seeds=sorted(set(g.seed)),
                        n_requests=int(g.id[g.n_rounds > 0].nunique()), n_zero_round=len(zero),
                        zero_round_ids=sorted(set(zero.id), key=str), n_rounds=int(hist.sum()),
                        hist=[int(x) for x in hist], per_verify=M.per_verify(hist),
                        **dict(zip(["acceptance_length", "acceptance_length_lo", "acceptance_length_hi"], al)),
                        acceptance_length_tlo=t["lo"], acceptance_length_thi=t["hi"], t_level=level,
                        n_units=t["n"], **dict(zip(["first_token", "first_token_lo", "first_token_hi"], ft)),
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


# --- realizations: which folders, pooled or not, made where ---------------------------------------------------------
def discover(top: Path) -> list[tuple[int, Path]]:
    """(k, folder) of every realization under results/<profile>: its r<k>/ folders holding experiment.json, and the
    profile folder itself when it holds runs/ of its own or has no r<k>/ (the flat layout: realization 0, or the
    `realization` its experiment.json names, e.g. when the pipeline renders results/<profile>/r<k> alone)."""
    out = [(int(m["k"]), p) for p in sorted(top.iterdir()) if p.is_dir() and (m := REALIZATION.match(p.name))
           and (p / "experiment.json").exists()] if top.is_dir() else []
    if (top / "runs").is_dir() or not out:
        out.append((int(read_optional(top, "experiment.json").get("realization") or 0), top))
    return sorted(out)


def require_artifacts(top: Path, hint: str = "") -> list[tuple[int, Path]]:
    """`discover(top)`, refused when none of its realizations holds runs/ or bench/ (`hint`: what to check)."""
    found = discover(top)
    if not any((r / "runs").is_dir() or (r / "bench").is_dir() for _, r in found):
        raise FileNotFoundError(f"{top} holds no artifacts (runs/<experiment>/<method>/<dataset>_T<t>.jsonl or "
                                f"bench/*.csv, itself or in realization folders r<k>/){hint}")
    return found


# experiment.json sections -> their part that is the experiment
SECTION_KEYS = {"engine": records_key_of,  # a server-only setting: the records are the same
                "pretrain": pretrain_key,  # no unlikelihood step: its settings are no part of the experiment
                "drafter": drafter_key}  # the anchor rule: the attention settings are no part of it either


def experiment_key(exp: dict) -> dict:
    """What makes two realizations the same experiment: experiment.json without `realization`, the records revision
    (`series_key` adds it) and run control (RUN_CONTROL, at any depth), each section as far as it is the experiment
    (SECTION_KEYS)."""
    def drop(v):
        if isinstance(v, dict):
            return {k: drop(x) for k, x in v.items() if k not in RUN_CONTROL}
        return [drop(x) for x in v] if isinstance(v, list) else v
    key = {k: v for k, v in exp.items() if k not in ("realization", "records_revision")}
    key.update({k: fn(key[k]) for k, fn in SECTION_KEYS.items() if isinstance(key.get(k), dict)})
    return drop(key)


def differences(a, b, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two experiment keys."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [x for k in dict.fromkeys(list(a) + list(b))
                for x in differences(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)]
    return [] if a == b else [prefix or "value"]


def series_key(root: Path) -> tuple[dict, str | None] | None:
    """(experiment key, records revision) of a realization folder: the series it belongs to; None without
    experiment.json."""
    path = Path(root, "experiment.json")
    if not path.exists():
        return None
    exp = read_json(path)
    return experiment_key(exp), records_revision(exp)


def registered_of(found: list[tuple[int, Path]]) -> list[int]:
    """The realizations of `found` that are of the primary family's registered series."""
    from dmtp.analysis.report import registered

    return [k for k, p in found if (s := series_key(p)) and registered.PRIMARY.registered_on(*s)]


def _name(k: int) -> str:
    """How a realization found on disk is named where it is left out."""
    return f"r{k}" if k else "r0 (the flat layout)"


def revision_words(r: str | None) -> str:
    return f"records revision {r}" if r is not None else "records made before revisions were declared"


def first_of(names: list[str], n: int) -> str:
    """The first n of `names`, comma-separated, with how many more there are."""
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def match(found: list[tuple[int, Path]]) -> tuple[list[tuple[int, Path]], list[tuple[str, str]]]:
    """(pooled, left out with why): the realizations of one series (module docstring; ties: the newest target, then
    the highest number). A folder without experiment.json counts as a series of its own."""
    keys = {k: series_key(p) for k, p in found}
    groups: dict[str, list[int]] = {}
    for k in sorted(keys):
        groups.setdefault(json.dumps(keys[k], sort_keys=True), []).append(k)
    paths = dict(found)
    reg = registered_of(found)
    best = reg or max(groups.values(), key=lambda ks: (len(ks), max(_written(paths[k]) for k in ks), max(ks)))
    top, out = best[-1], []
    for k in (k for k, _ in found if k not in best):
        if keys[k] is None:
            why = "no experiment.json"
        elif diff := differences(keys[top][0], keys[k][0]):
            why = f"experiment differs from {_name(top)} in {first_of(diff, 4)}"
        else:
            why = (f"the same experiment as {_name(top)}, made by other record-making code "
                   f"({revision_words(keys[k][1])}; {_name(top)}: {revision_words(keys[top][1])}): a series of its "
                   "own (docs/DESIGN.md, \"The records revision\")")
        out.append((_name(k), why))
    return [(k, p) for k, p in found if k in best], out


def finished_runs(root: Path) -> list[Path]:
    """The run files of a realization that its stage finished (records present; no meta saying `finished: false`)."""
    out = []
    for path in record_files(Path(root, "runs"), "*/*/"):
        with suppress(ValueError):
            check_complete(path)
            out.append(path)
    return out


def without_runs(found: list[tuple[int, Path]]) -> tuple[list[tuple[int, Path]], list[tuple[str, str]]]:
    """(realizations, left out with why): a realization folder without a finished run (experiment.json alone: what an
    evaluation stopped before its first run leaves) is no realization: not counted, named. When no folder has a
    finished run (a bench-only profile, or a single half-written run: `read_runs` names it), all are kept."""
    have = [(k, p) for k, p in found if finished_runs(p)]
    if not have:
        return found, []
    why = ("no finished run (runs/ holds no complete record file: an evaluation stopped before its first run "
           "finished); not counted as a realization")
    return have, [(_name(k), why) for k, p in found if (k, p) not in have]


def record_digest(root: Path) -> str:
    """sha256 (16 hex digits) of a realization's records: every run file's path under runs/ and its records as JSON
    (so a compressed copy of the same records has the same digest)."""
    h = hashlib.sha256()
    for path in record_files(Path(root, "runs"), "*/*/"):
        rel = path.relative_to(root).as_posix()
        h.update(f"{rel[: len(rel) - len(path.name)]}{record_stem(path)}\0".encode())
        for _, r in iter_jsonl(path):
            h.update(json.dumps(r, sort_keys=True).encode() + b"\n")
    return h.hexdigest()[:16]


def refuse_copies(pooled: list[tuple[int, Path]]) -> None:
    """Refuses two pooled realizations holding the same records (a copy) or recording the same seeds (experiment.json
    `realization`, else the folder's number), naming both: a copy would count twice."""
    seen_digest: dict[str, Path] = {}
    seen_seeds: dict[int, Path] = {}
    for k, p in pooled:
        named = read_optional(p, "experiment.json").get("realization")
        rec = k if named is None else int(named)
        d = record_digest(p) if record_files(Path(p, "runs"), "*/*/") else None
        if d is not None and d in seen_digest:
            raise ValueError(f"{seen_digest[d]} and {p} hold the same records (digest {d}): one realization in two "
                             "folders (a copy?) is not two independent ones; remove the copy")
        if rec in seen_seeds:
            raise ValueError(f"{seen_seeds[rec]} and {p} record the same seeds (experiment.json realization {rec}): "
                             "not independent realizations (a copy?); remove one, or rerun it as its own realization "
                             "(--set realization=K)")
        seen_seeds[rec] = p
        if d is not None:
            seen_digest[d] = p


def _written(root: Path) -> str:
    """When a realization's target was written (ISO time, sortable as text; "" when it has none)."""
    return str(read_optional(root, "target", "meta.json").get("written", ""))


def read_metas(paths) -> tuple[Counter, set[str], list[str]]:
    """(commit -> meta files written at it, the devices they name, their `written` stamps) of the meta files at
    `paths` (one that cannot be read is skipped)."""
    commits, devices, stamps = Counter(), set(), []
    for m in paths:
        try:
            meta = read_json(m)
        except (OSError, ValueError):
            continue
        env = meta.get("env") or {}
        commits[str(env.get("git_sha", "unknown"))] += 1
        if env.get("device"):
            devices.add(str(env["device"]))
        if meta.get("written"):
            stamps.append(str(meta["written"]))
    return commits, devices, stamps


def provenance(k: int, root: Path) -> Realization:
    """A realization with the commits, devices and dates its meta files record (runs/, bench/, target/,
    drafters/; the flat layout: its own folders, never another realization's)."""
    commits, devices, stamps = read_metas(
        [m for d in ("runs", "curve") for m in Path(root, d).glob("**/*.meta.json")]
        + [m for d in ("bench", "target", "drafters") for m in Path(root, d).glob("meta*.json")])
    bench = Path(root, "bench", "meta.json")
    benv = read_optional(bench).get("env") or {}
    sha = benv.get("git_sha", "unknown") if bench.exists() else ""
    corpus = (read_optional(root, "target", "meta.json").get("corpus") or {}).get("train_digest", "")
    s = series_key(root)
    return Realization(k, root, tuple(commits.most_common()), tuple(sorted(devices)),
                       (min(stamps), max(stamps)) if stamps else ("", ""), sha, corpus, str(benv.get("device") or ""),
                       s[1] if s else None)


def read_oracle_pooled(roots: list[tuple[int, Path]]) -> dict:
    """(dataset, temperature) -> the ceiling pooled over realizations: C_j and 1 + sum C_j averaged with the
    realizations' window counts as weights (each realization's own `ar` trajectory)."""
    per: dict[tuple, list[dict]] = {}
    for _, root in roots:
        for key, rec in read_oracle(root).items():
            per.setdefault(key, []).append(rec)
    out = {}
    for key, recs in per.items():
        w = np.array([float(r.get("windows") or 1) for r in recs])
        K = min(len(r["cumulative"]) for r in recs)
        cum = (np.array([r["cumulative"][:K] for r in recs], float) * w[:, None]).sum(0) / w.sum()
        out[key] = dict(recs[0], cumulative=cum.tolist(), acceptance_length=float(1 + cum.sum()),
                        windows=int(w.sum()), n_realizations=len(recs))
    return out


def _bench(roots: list[tuple[int, Path]], top: Path, name: str) -> pd.DataFrame | None:
    """bench/<name>.csv of every pooled realization (+ realization); overhead: also the random-weight shape timings
    ("<setup>:<method>" rows, realization -1) of results/<profile>/bench when that is no pooled realization."""
    parts = [_with_prompt_pass(pd.read_csv(p), r / "bench" / "meta.json").assign(realization=k)
             for k, r in roots if (p := r / "bench" / f"{name}.csv").exists()]
    shape = top / "bench" / f"{name}.csv"
    if name == "overhead" and shape.exists() and all(r != top for _, r in roots):
        ov = pd.read_csv(shape)
        parts.append(ov[ov.method.str.contains(":")].assign(realization=-1))
    return pd.concat(parts, ignore_index=True) if parts else None


def _with_prompt_pass(df: pd.DataFrame, meta: Path) -> pd.DataFrame:
    """A bench CSV with its `prefill` column (the prompt pass its servers admitted with), from its meta file's engine
    where a bench of before the column lacks it ("" when unknown)."""
    if "prefill" in df:
        return df
    engine = read_optional(meta).get("engine") or {}
    return df.assign(prefill=engine.get("prefill", ""))


def find_results(results: str | Path = "results") -> Path:
    """`results` where it exists as given; a relative path missing here is looked for in the folders above the
    working directory, nearest first (a notebook's kernel runs in notebooks/, the results lie at the repository's
    root); as given when found nowhere (the error then names it)."""
    p = Path(results)
    if p.is_absolute() or p.exists():
        return p
    return next((d / p for d in Path.cwd().resolve().parents if (d / p).is_dir()), p)


def load(profile: str, results: str | Path = "results", n_boot: int = 2000) -> Artifacts:
    """Every pooled realization of results/<profile> (module docstring) into one bundle (`results`: `find_results`)."""
    top = find_results(results) / profile
    found, empty = without_runs(require_artifacts(top))
    pooled, left_out = match(found)
    left_out = empty + left_out
    refuse_copies(pooled)
    for name, why in left_out:
        print(f"[report] realization {name} left out: {why}")
    newest = pooled[-1][1]  # the spec, subsets and out-of-distribution sets come from the newest pooled one
    spec = read_spec(newest)
    runs = pd.concat([read_runs(r).assign(realization=k) for k, r in pooled], ignore_index=True)
    curves = [c.assign(realization=k) for k, r in pooled if (c := read_curve(r)) is not None]
    return Artifacts(top, spec, runs, summarize(runs, n_boot, spec), _bench(pooled, top, "throughput"),
                     _bench(pooled, top, "overhead"), pd.concat(curves, ignore_index=True) if curves else None,
                     read_oracle_pooled(pooled), read_subsets(newest), [provenance(k, r) for k, r in pooled], left_out,
                     read_ood(newest), read_caveat(newest), read_caveat(newest, short=True),
                     [f"r{k}" for k in registered_of(found)])


def select(df: pd.DataFrame, **eq) -> pd.DataFrame:
    """The rows of `df` whose columns hold the given values (a list, tuple or set: any of its values)."""
    keep = np.ones(len(df), bool)
    for col, v in eq.items():
        keep &= (df[col].isin(v) if isinstance(v, (list, tuple, set)) else df[col] == v).to_numpy()
    return df[keep]


def group(art: Artifacts, experiment: str, dataset: str, temperature: float, method: str,
          mode: str = "natural") -> pd.DataFrame:
    """The request rows of one run (every seed)."""
    return select(art.runs, experiment=experiment, dataset=dataset, temperature=temperature, mode=mode, method=method)


def paired_runs(art: Artifacts, key: tuple, a: str, b: str, n_boot: int = CONTRAST_BOOT,
                margin: float | None = None) -> dict:
    """Paired a - b of per-request acceptance length for key = (experiment, dataset, temperature[, mode]):
    stats.paired over the realizations and seeds both runs have and the requests both ran (a run with a single seed
    in a realization, e.g. a baseline without a drafter, is set beside every seed of the other); `stats.paired`'s
    fields (nan when either run is absent)."""
    ga, gb = (group(art, *key[:3], m, *key[3:]) for m in (a, b))
    if ga.empty or gb.empty or a == b:
        return {**dict.fromkeys(("diff", "lo", "hi", "p", "t_lo", "t_hi", "t_p"), np.nan), "signs": [], "n_seeds": 0,
                "n_requests": 0}
    mats = S.matrices({a: per_unit(ga), b: per_unit(gb)})[0]
    return S.paired(mats[a], mats[b], n_boot=n_boot, margin=margin)
