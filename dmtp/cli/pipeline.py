"""The embedded default end to end: corpus -> tokenizer -> target+MTP -> on-policy data -> drafters -> eval -> tables.

    dmtp pipeline --profile tiny                  # 2-core CPU, ~10 min: every stage, a smoke run of the method
    dmtp pipeline --profile mini --stage target   # one H200 (then `--stage all` for the rest)
    dmtp pipeline --profile smoke --work /tmp/w --results /tmp/r     # CI smoke, seconds
    dmtp pipeline --profile mini --stage verify   # opt-in: verification modes at T > 0 (dmtp/cli/verify.py)
    dmtp pipeline --profile mini --deadline 3300 --archive mini.tgz   # a job limit; `dmtp land mini.tgz` elsewhere

Each stage writes `work/<profile>/<stage>` or `results/<profile>/` atomically and is skipped when its output exists
(evaluation runs: and is newer than the checkpoint they measure), so a re-run resumes. Each output records the
configuration it was made with (`stages.py`); one made with another configuration is refused before any work,
naming the fields, unless `--force` redoes it.

`--deadline SECONDS` (`clock.py`) leaves out the optional stages that would not finish and interrupts the running one
at the deadline (less `--reserve`); `--archive FILE.tgz` packs results/<profile> after every stage (`archive.py`).
Under torchrun the stages target, data and drafters run data-parallel; rank 0 alone writes.
`--set pretrain.tokens=20000000` (repeatable) overrides a profile field.

The runs trained and evaluated are the experiment's `ablation.runs()` (`dmtp/experiment.py`), a subset with
`--set ablation.only=dflash,zero_init_residual`; the eval and tables stages write the resolved experiment to
`results/<profile>/experiment.json`, from which the report takes its rows.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import time
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dmtp import dist
from dmtp.analysis.lossless import add_top2_gaps, compare_runs
from dmtp.analysis.metrics import acceptance_length
from dmtp.analysis.oracle import oracle_ceiling
from dmtp.analysis.report import render_tables
from dmtp.analysis.report.synthetic import run_name
from dmtp.checks import require
from dmtp.cli import verify as verify_study
from dmtp.cli.archive import STATUS, pack
from dmtp.cli.args import failure, out_dir, out_file
from dmtp.cli.clock import OPTIONAL_UNDER_DEADLINE, Deadline, DeadlineReached, read_costs, record_cost
from dmtp.cli.fit import fit_training, run_configs
from dmtp.cli.stages import RUN_CONTROL, StageMismatch, Unit, differences, fingerprint, mismatch, preflight
from dmtp.cli.stages import check as stage_check
from dmtp.cli.stages import record as stage_record
from dmtp.config import Profile
from dmtp.config.experiment import drafter_key
from dmtp.config.training import pretrain_key
from dmtp.data.corpus import build_corpus, corpus_summary
from dmtp.data.datasets import encode_prompts, humaneval_prompts
from dmtp.data.prompts import PROMPT_CUT, code_prompts
from dmtp.data.tokenizer import PRETOKENIZER_VERSION, encode_corpus, load_tokenizer, tokenizer_version, train_tokenizer
from dmtp.data.tokens import store_of
from dmtp.dist import barrier, is_main, rank_world
from dmtp.engine.methods import AR, build_method, load_method, method_class
from dmtp.engine.runner import compiled_graphs, run_generate, stop_spec
from dmtp.engine.stops import HUMANEVAL_STOPS
from dmtp.experiment import drafter_config, write_experiment
from dmtp.io import (atomic_dir, merging, one_writer, read_json, read_jsonl, write_csv, write_json, write_jsonl,
                     write_meta)
from dmtp.models import torch_dtype
from dmtp.models.drafter import Drafter
from dmtp.models.mtp import MTPHead, save_target_with_mtp
from dmtp.models.target import Target, read_config
from dmtp.preflight import Check
from dmtp.preflight import run as run_checks
from dmtp.training.drafters import branch_dir, load_sequences, new_drafters, train_branch, train_drafters
from dmtp.training.pretrain import build_target, evaluate, pretrain
from dmtp.training.unloop import loop_check, unloop
from dmtp.profiles import resolve

STAGES = ["corpus", "tokenizer", "target", "data", "drafters", "eval", "curve", "tables"]
OPTIONAL = ["verify"]  # run only when named (`--stage verify`): verification modes at T > 0, results/<p>/verify
PARALLEL = ["target", "data", "drafters"]  # the stages that run under torchrun (the others: one process)
NEEDS_INPUTS = ["target", "data", "drafters", "eval", "curve"]  # `check_inputs` runs before the first of them


class Ctx:
    def __init__(self, a):
        name = a.profile or ("mini" if torch.cuda.is_available() else "tiny")
        self.p = resolve(name, getattr(a, "set", None) or [])
        self.work = Path(a.work) / self.p.folder  # <name>, or <name>/r<k> for realization k
        self.res = Path(a.results) / self.p.folder
        self.dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.eng = self.p.engine  # how every decode of the pipeline runs (recorded in each output's meta file)
        self.force = bool(getattr(a, "force", False))  # redo finished stages made with another configuration

    def log(self, msg):
        if is_main():
            print(f"[{self.p.name}] {msg}", flush=True)

    def check(self, u: Unit) -> bool:
        """`stages.check` under this run's --force: True: `u` is there with the requested configuration."""
        return stage_check(u, self.force, self.log)

    def start(self, stage: str) -> tuple[Unit, bool]:
        """A one-unit stage's unit and whether it is there; a new one is recorded before the work, so a half-done
        output is checked like a finished one (recomputed after the check: --force may have removed it)."""
        there = self.check(units(self, stage)[0])
        u, = units(self, stage)
        if not there:
            stage_record(u)
        return u, there

    def need(self, stage: str, runs=None) -> None:
        """Refuse to read an earlier stage's output that is missing, unfinished or of another configuration, naming
        the stage that makes it (--force never redoes inputs); `runs`: only these (run, seed) drafters."""
        for u in units(self, stage):
            if runs is not None and (u.run["run"], u.run["seed"]) not in runs:
                continue
            if not finished(stage, u):
                raise FileNotFoundError(f"{u.what} is not there or not finished: run the {stage} stage first "
                                        f"(dmtp pipeline --profile {self.p.name} --stage {stage})")
            if d := mismatch(u):
                raise StageMismatch(f"{u.what} was made with another configuration than the one requested "
                                    f"({', '.join(d[:6])}): redo it (--stage {stage} --force), or request the "
                                    "settings it was made with")

    @property
    def tok(self):
        return load_tokenizer(self.work / "tokenizer")

    def target(self):
        self.need("target")
        load_tokenizer(self.work / "target")  # a target trained on an old tokenizer is an error (StaleTokenizer)
        t = Target.load(self.work / "target", dtype=torch_dtype(self.eng.dtype), device=self.dev)
        return t, MTPHead.load(t, self.work / "target")


def st_corpus(c: Ctx):
    c.start("corpus")
    d = c.p.data
    info = build_corpus(c.work / "corpus", max_bytes=d.corpus_bytes, max_repeat=d.corpus_max_repeat,
                        sources=d.corpus_sources, expect_digest=d.corpus_digest)
    c.log(f"corpus: {info['n_train']} + {info['n_heldout']} documents, {info['train_bytes'] / 1e6:.1f} MB, train "
          f"digest {info['train_digest']} from " + ", ".join(f"{s['name']} {s['version']}" for s in info["sources"])
          + (" (the pinned digest)" if d.corpus_digest else " (no digest pinned: data.corpus_digest)"))


def encode_workers(cores: int | None = None) -> int:
    """Processes for the corpus encoding: one per core (at most 32) on 8 cores or more, else 1 (in process: on few
    cores spawned workers are slower, `experiments/encode_check.py`)."""
    cores = (os.cpu_count() or 1) if cores is None else cores
    return min(32, cores) if cores >= 8 else 1


def st_tokenizer(c: Ctx):
    out = c.work / "tokenizer"
    u, there = c.start("tokenizer")
    if there and tokenizer_version(out) not in (None, PRETOKENIZER_VERSION):  # made before fingerprints
        c.log(f"tokenizer: {out} has an old pre-tokenizer; rebuilding it and the token streams")
        shutil.rmtree(out)
        shutil.rmtree(c.work / "tokens", ignore_errors=True)
        stage_record(u)
    if not (out / "tokenizer_config.json").exists():  # written last: a kill between the two files trains it again
        c.need("corpus")
        train_tokenizer(c.work / "corpus" / "train.jsonl", out, vocab_size=c.p.data.vocab_size,
                        max_bytes=c.p.data.tokenizer_bytes)
    tok = load_tokenizer(out)
    for split in ("train", "heldout"):
        npy = c.work / "tokens" / f"{split}.npy"
        if not npy.exists():
            encode_corpus(c.work / "corpus" / f"{split}.jsonl", tok, npy, workers=encode_workers())


def st_target(c: Ctx):
    """Pretrain target + MTP (data-parallel under torchrun); rank 0 evaluates and writes the checkpoint. Returns
    False when `pretrain.stop_after` stopped it (resumable, on any number of ranks)."""
    out, state = c.work / "target", c.work / "target_state"
    u, there = c.start("target")  # the record goes into the resumable state until the target is saved
    if there and (out / "DONE").exists():
        if (out / "tokenizer.json").exists():  # StaleTokenizer when trained on an old one (made before fingerprints)
            load_tokenizer(out)
        if state.exists() and is_main():  # a kill after the target was saved left the training state
            shutil.rmtree(state, ignore_errors=True)
        return
    c.need("tokenizer")
    tok, pcfg = c.tok, c.p.pretrain
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(c.p.stream(pcfg.seed))  # the same initial weights on every rank
    tgt, mtp = build_target(c.p.model.arch, len(tok), eos)
    tgt.model.to(c.dev)
    mtp.to(c.dev)
    n_params, n_mtp = (sum(p.numel() for p in m.parameters()) for m in (tgt.model, mtp))
    c.log(f"target: {n_params / 1e6:.1f} M parameters (+ MTP {n_mtp / 1e6:.1f} M)")
    train = np.load(c.work / "tokens" / "train.npy", mmap_mode="r", allow_pickle=False)
    held = np.load(c.work / "tokens" / "heldout.npy", mmap_mode="r", allow_pickle=False)
    for name, toks, need in (("train", train, pcfg.seq_len + 2), ("heldout", held, pcfg.seq_len + 1)):
        require(len(toks) >= need, f"{c.work / 'tokens' / name}.npy holds {len(toks)} tokens, fewer than "
                f"pretrain.seq_len={pcfg.seq_len} needs ({need}); raise corpus_bytes or lower the seq_len")
    t0 = time.time()
    hist, info = pretrain(tgt, mtp, train, replace(pcfg, seed=c.p.stream(pcfg.seed)), state, log=c.log)
    if not info["finished"]:
        return False
    if is_main():
        ul_hist, before, rows = _unloop(c, (tgt, mtp, tok), train, held) if pcfg.unloop_steps else (None, None, [])
        wall = time.time() - t0
        ev = evaluate(tgt, mtp, np.asarray(held), pcfg.seq_len, pcfg.eval_tokens)
        if before is not None:
            ev["before_unloop"] = before
            ev["unloop_s"] = ul_hist[-1]["elapsed_s"] if ul_hist else 0.0
        if rows:
            ev["loops"] = loop_check(tgt, rows, c.p.eval.new_tokens, eos, tok)
            c.log("loop check (AR, T=0, HumanEval natural, fp32 weights): " + "; ".join(
                f"{k} loop_frac {v['loop_frac']:.3f}, {v['ended']}/{v['n']} ended"
                for k, v in (("before", before["loops"]), ("after", ev["loops"]))))
        ev.update(parameters=n_params, mtp_parameters=n_mtp, train_tokens=hist[-1]["tokens"] if hist else 0,
                  wall_s=wall, world=info["world"],
                  tokens_per_s=info["tokens_trained"] / info["train_s"] if info["train_s"] > 0 else None)
        c.log(f"target held-out: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in ev.items()})}")
        _save_target(c, u, (tgt, mtp, tok), (hist, ul_hist, ev), info, wall)
        shutil.rmtree(state, ignore_errors=True)  # only now: a kill before the save resumes from the final state
    barrier()  # the next stage reads the checkpoint


def _unloop(c: Ctx, models, train, held):
    """Sequence-level unlikelihood after pretraining (`training/unloop.py`; rank 0 alone, a kill in it redoes it):
    (its history, the held-out evaluation before it, the HumanEval prompts AR's loops are counted on)."""
    (tgt, mtp, tok), pcfg = models, c.p.pretrain
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    before = evaluate(tgt, mtp, np.asarray(held), pcfg.seq_len, pcfg.eval_tokens)
    c.log(f"target held-out before unlikelihood: loss {before['target_loss']:.4f}, top-1 "
          f"{before['target_top1']:.4f}, MTP top-1 {before['mtp_top1']:.4f}")
    n_he = c.p.eval.sets.get("humaneval")  # here: a run cut short still has AR's loops before and after
    rows = encode_prompts(tok, humaneval_prompts()[:n_he]) if n_he else []
    if rows:
        before["loops"] = loop_check(tgt, rows, c.p.eval.new_tokens, eos, tok)
    t1 = time.time()
    hist = unloop(tgt, mtp, train, replace(pcfg, seed=c.p.stream(pcfg.seed)), eos_id=eos, log=c.log)
    c.log(f"unlikelihood: {pcfg.unloop_steps} steps in {time.time() - t1:.1f}s")
    return hist, before, rows


def _save_target(c: Ctx, u: Unit, models, records, info: dict, wall: float) -> None:
    """The target + MTP head (checkpoint dtype), tokenizer and record into work/target; histories, held-out
    evaluation and meta into results/<profile>/target."""
    (tgt, mtp, tok), (hist, ul_hist, ev) = models, records
    tgt.model.to(torch_dtype(c.p.model.checkpoint_dtype))
    mtp.to(torch_dtype(c.p.model.checkpoint_dtype))
    with atomic_dir(c.work / "target") as tmp:
        save_target_with_mtp(tgt.model, mtp, tmp)
        tok.save_pretrained(tmp)
        if u.record.exists():
            shutil.copy(u.record, tmp / u.record.name)
        (tmp / "DONE").write_text("ok\n")
    write_json(c.res / "target" / "pretrain_history.json", hist)
    if ul_hist is not None:
        write_json(c.res / "target" / "unloop_history.json", ul_hist)
    write_json(c.res / "target" / "heldout.json", ev)
    write_meta(c.res / "target" / "meta.json", {"arch": asdict(c.p.model.arch), "pretrain": asdict(c.p.pretrain)},
               wall_s=wall, world=info["world"], resumed_at_step=info["start_step"], fingerprint=u.want,
               corpus=corpus_summary(c.work / "corpus"))


def st_data(c: Ctx):
    """On-policy data: the target answers the corpus prompts. Under torchrun whole batches (each seeded by its
    offset) are dealt to the ranks: the file is the same for any number of ranks, at any temperature."""
    out = c.work / "data" / "train.jsonl"
    u, = units(c, "data")
    if c.check(u):
        return
    tgt, _ = c.target()
    tok, d = c.tok, c.p.data
    rows = [r for r in encode_prompts(tok, data_prompts(c)) if r["prompt_ids"]]
    if d.samples > 1:  # each prompt answered `samples` times, the j-th answers of all prompts after the (j-1)-th
        rows = [dict(r, id=f"{r['id']}#{j}") for j in range(d.samples) for r in rows]
    t0 = time.time()
    recs = run_generate(tgt, AR(), rows, d.temperature, d.new_tokens, [tok.eos_token_id],
                        d.batch, seed=c.p.stream(1), desc="on-policy data", shard=True, engine=c.eng)
    world = rank_world()[1]
    if is_main():
        for r, p in zip(recs, rows):
            r["prompt_ids"] = p["prompt_ids"]
        write_meta(u.record, {"n": len(recs), "temperature": d.temperature, "batch": d.batch, "seed":
                              f"{c.p.stream(1)} + the batch's offset"}, wall_s=time.time() - t0, world=world,
                   engine=c.eng, fingerprint=u.want)  # before the data: the file never exists without its record
        write_jsonl(out, recs)
        c.log(f"data: {len(recs)} sequences, {sum(len(r['output_ids']) for r in recs)} generated tokens "
              f"({world} rank(s); {compiled_graphs()} graphs compiled)")
    barrier()


def _fit_check(c: Ctx, todo: dict[int, list[str]]) -> dict[int, dict]:
    """A paper profile on GPUs: per seed, the memory model's check of its fresh runs side by side (`fit_training`),
    before the target loads; seed -> the settings the plan resolved (micro_batch, shard_target, grad_sync)."""
    spec, cfg_t, out = c.p.ablation, read_config(c.work / "target"), {}
    for seed, runs in todo.items():
        names = [r for r in spec.variants + tuple(spec.backbones) if r in runs] or runs[:1]
        configs = list(run_configs(c.p, cfg_t, names).values())
        cfg, line = fit_training(cfg_t.to_dict(), configs, c.p.train, rank_world()[1],
                                 torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
        c.log(f"drafters, seed {seed}: memory model: {line}")
        out[seed] = {k: getattr(cfg, k) for k in ("micro_batch", "shard_target", "grad_sync")}
    return out


def drafters_dir(c: Ctx, seed: int) -> Path:
    """Where the drafters of one seed live: work/<profile>/drafters (seed 0), drafters_s<seed> (the others)."""
    return c.work / ("drafters" if seed == 0 else f"drafters_s{seed}")


def st_drafters(c: Ctx):
    """Every selected drafter run, seed by seed: the variants and backbone runs from scratch on the same batches,
    then each continued run from its source's drafter; the `ablation.curve` runs keep snapshots (or branches)."""
    spec = c.p.ablation
    todo: dict[int, list[str]] = {}
    for u in units(c, "drafters"):
        run, seed = u.run["run"], u.run["seed"]
        if not c.check(u) and is_main():
            u.outputs[0].mkdir(parents=True, exist_ok=True)
            stage_record(u)  # before training: a half-trained drafter is checked like a finished one
        if not all((f / "DONE").exists() for f in [u.outputs[0], *branches(c, run, seed).values()]):
            todo.setdefault(seed, []).append(run)
    barrier()
    for seed, runs in todo.items():  # before any training: a continued run needs its source
        for run, (_, src) in spec.continued.items():
            if run in runs and src not in runs and not (drafters_dir(c, seed) / src / "DONE").exists():
                raise ValueError(f"ablation.only: {run} continues from {src}, which is neither trained nor selected")
    if not todo:
        return
    c.need("data")
    fit = _fit_check(c, todo) if c.p.scale.target_config and c.dev == "cuda" else {}  # before any weight loads
    tgt, mtp = c.target()
    shape = drafter_config(c.p, tgt.config, c.tok.convert_tokens_to_ids("<|mask|>"))
    make = partial(new_drafters, tgt, variant_configs=c.p.drafter.variants)
    store = store_of(c.work / "data" / "train.jsonl", c.work / "data" / "train.tokens", tgt.vocab_size)
    seqs = load_sequences(store, c.p.train.max_len, vocab_size=tgt.vocab_size)
    t0 = time.time()
    for seed in sorted(todo):
        out, runs = drafters_dir(c, seed), todo[seed]
        base = dict(shape, seed=c.p.stream(seed))
        curve = [r for r in runs if snapshots(c.p, r)]
        budgets = snapshots(c.p, curve[0]) if curve and spec.anneal else ()  # annealed points: every curve run's
        cfg = replace(c.p.train, amp_bf16=c.dev == "cuda", seed=c.p.stream(seed),
                      snapshots=tuple(spec.budgets) if curve and not spec.anneal else (), **fit.get(seed, {}))
        fresh_todo = [r for r in spec.variants + tuple(spec.backbones) if r in runs]
        if fresh_todo:
            c.log(f"drafters, seed {seed}: {', '.join(fresh_todo)}")
            train_drafters(tgt, mtp, make(fresh_todo, base, backbones=spec.backbones), seqs, cfg, out, log=c.log,
                           snapshot_runs=set(curve), branches={k: spec.branch_step(k) for k in budgets} or None)
        for k in budgets:  # the annealed curve points: a short branch each, the curve runs' side by side
            c.log(f"drafters, seed {seed}: {', '.join(curve)} annealed from step {spec.branch_step(k)} to {k}")
            d = make(curve, base, backbones=spec.backbones)
            train_branch(tgt, mtp, d, seqs, cfg, out, k, spec.branch_step(k), log=c.log)
        for run, (variant, src) in spec.continued.items():
            if run in runs:
                d = make([variant], base, {variant: out / src / "drafter"})
                ccfg = replace(cfg, steps=spec.continue_steps, seed=c.p.stream(seed) + 1, snapshots=())
                train_drafters(tgt, mtp, {run: d[variant]}, seqs, ccfg, out, log=c.log)
    if not is_main():
        return
    meta, want = c.res / "drafters" / "meta.json", fingerprints(c.p)["drafters"]
    with merging(meta):  # processes sharing a GPU train parts of the runs: each adds its own to the record
        trained = {str(s): list(r) for s, r in todo.items()}
        old = read_json(meta) if meta.exists() else {}
        if old.get("fingerprint") == json.loads(json.dumps(want)):  # as JSON reads it back (tuples: lists)
            for s, r in old.get("trained", {}).items():
                trained[s] = list(dict.fromkeys(r + trained.get(s, [])))
        write_meta(meta, {"train": asdict(c.p.train), "drafter": shape, "continue_steps": spec.continue_steps,
                          "seeds": list(spec.seeds), "budgets": list(spec.budgets)}, wall_s=time.time() - t0,
            trained=dict(sorted(trained.items())), fingerprint=want)
        hist = {(h.parent.name if seed == 0 else f"{h.parent.name}@s{seed}"): read_json(h, list) for seed in spec.seeds
                for h in sorted(drafters_dir(c, seed).glob("*/history.json"), key=lambda h: h.parent)}
        write_json(c.res / "drafters" / "train_history.json", hist)


def branches(c: Ctx, run: str, seed: int) -> dict[int, Path]:
    """budget -> the folder of a curve run's annealed point (`ablation.anneal`; none without it)."""
    return {k: branch_dir(drafters_dir(c, seed), k) / run for k in snapshots(c.p, run) if c.p.ablation.anneal}


def snapshots(p: Profile, run: str) -> tuple[int, ...]:
    """The learning-curve budgets a drafter run keeps snapshots after (below its final step, the last point)."""
    return tuple(k for k in p.ablation.budgets if k < p.train.steps) if run in p.ablation.curve else ()


def fresh(path: Path, dep: Path) -> bool:
    """`path` exists and was written after `dep` (the checkpoint or run it is derived from)."""
    return path.exists() and (not dep.exists() or path.stat().st_mtime >= dep.stat().st_mtime)


def eval_plan(p: Profile):
    """(dataset, #prompts, temperature, mode, run, seed) of the selected runs and seeds: natural mode: every run on
    `eval.all_methods_on` (each seed), the main-table and backbone runs elsewhere; fixed mode: the main-table runs,
    first seed; the `eval.ood` sets: the `eval.ood_runs` at T = 0, natural mode, first seed."""
    spec = p.ablation
    for mode in p.eval.modes:
        for ds, n in p.eval.sets.items():
            natural = spec.runs() if ds in p.eval.all_methods_on else spec.main_table + tuple(spec.backbones)
            runs = spec.main_table if mode == "fixed" else natural
            for temp in p.eval.temperatures:
                for m in spec.selected(runs):
                    for seed in (spec.seeds_of(m) if mode == "natural" else spec.seeds_of(m)[:1]):
                        yield ds, n, temp, mode, m, seed
    for ds, n in p.eval.ood.items():
        for m in spec.selected(p.eval.ood_runs):
            for seed in (s for s in spec.seeds_of(m) if s == spec.seeds[0]):
                yield ds, n, 0.0, "natural", m, seed


def eval_prompts(c: Ctx, ds: str, n: int) -> list[dict]:
    """The first n prompts of an evaluation set, encoded: HumanEval's, or an out-of-distribution set's (the corpus's
    test functions, cut as the data prompts are; seed 0: the same prompts in every realization)."""
    if ds in c.p.eval.ood:
        rows = code_prompts(c.work / "corpus" / "train.jsonl", c.tok, n, seed=0, per_doc=1,
                            max_prompt_tokens=c.p.data.prompt_tokens, tests=True)
        require(rows, f"eval.ood[{ds!r}]: the corpus {c.work / 'corpus'} holds no test function to cut a prompt from "
                "(test modules under a test/tests folder or named test_*.py): a larger data.corpus_bytes, or no "
                "eval.ood")
        return encode_prompts(c.tok, rows)
    return encode_prompts(c.tok, humaneval_prompts()[:n])


MIN_PROMPT_FRAC = 0.95  # the data stage needs at least this share of the `data.prompts` the profile asks for


def data_prompts(c: Ctx) -> list[dict]:
    """The on-policy data's prompts, cut from the corpus's train split (for the preflight and the data stage)."""
    d = c.p.data
    return code_prompts(c.work / "corpus" / "train.jsonl", c.tok, d.prompts, max_prompt_tokens=d.prompt_tokens,
                        seed=c.p.stream(0), per_doc=d.prompts_per_doc)


def input_checks(c: Ctx) -> list[Check]:
    """What later stages read, checked once the corpus and tokenizer exist: the HumanEval problems asked for, each
    out-of-distribution set cut whole from the corpus, and enough data prompts."""
    p, d, out = c.p, c.p.data, []

    def count(what: str, have: int, want: int, fix: str) -> str:
        require(have >= want, f"{what}: {have} of the {want} asked for; {fix}")
        return f"{have} of {want}"

    if n := p.eval.sets.get("humaneval"):
        out.append(Check("HumanEval", lambda: count("eval.sets['humaneval']", len(humaneval_prompts()), n,
                                                    "HumanEval has no more problems")))
    for ds, n in p.eval.ood.items():
        out.append(Check(f"eval set {ds}", lambda ds=ds, n=n: count(
            f"eval.ood[{ds!r}] (test functions of {c.work / 'corpus'})", len(eval_prompts(c, ds, n)), n,
            "a corpus with more test modules (data.corpus_sources), or fewer prompts")))
    want = -(-d.prompts * int(MIN_PROMPT_FRAC * 100) // 100)
    out.append(Check("data prompts", lambda: count(
        f"data.prompts (functions of {c.work / 'corpus'} at data.prompts_per_doc={d.prompts_per_doc}; at least "
        f"{MIN_PROMPT_FRAC:.0%} are needed)", len(data_prompts(c)), want,
        "a larger corpus (data.corpus_sources, data.corpus_bytes), a larger data.prompts_per_doc, or fewer "
        "data.prompts (data.samples answers each prompt several times)") + f" (of {d.prompts} asked for)"))
    return out


def check_inputs(c: Ctx) -> None:
    """`input_checks` through the preflight (every shortfall in one line), once per configuration (kept in
    work/<profile>/preflight.json). Without a finished corpus and tokenizer there is nothing to check from yet."""
    if not all(finished(s, u) for s in ("corpus", "tokenizer") for u in units(c, s)):
        return
    want = fingerprint({"data": fingerprints(c.p)["data"], "eval.sets": c.p.eval.sets, "eval.ood": c.p.eval.ood,
                        "min_prompt_frac": MIN_PROMPT_FRAC})
    path = c.work / "preflight.json"
    if path.exists() and read_json(path).get("fingerprint") == want:
        return
    notes = run_checks(input_checks(c), log=c.log)
    if is_main():
        write_json(path, {"fingerprint": want, "notes": notes})


def run_file(res: Path, ds: str, temp: float, mode: str, run: str, seed: int) -> Path:
    """results/<profile>/runs/ablation/<run>/<dataset>_T<temp>[_fixed][_s<seed>].jsonl."""
    return res / "runs" / "ablation" / run / run_name(ds, temp, mode, seed)


def stop_strings(p: Profile, mode: str) -> tuple[str, ...]:
    """The stop strings of natural mode ("humaneval": the standard five); none in fixed mode."""
    return tuple(x for s in p.eval.stops if mode == "natural" for x in (HUMANEVAL_STOPS if s == "humaneval" else (s,)))


def experiment_settings(experiment: dict) -> dict:
    """What an experiment.json says the runs were made with: without run control, the runs and seeds one invocation
    works on (`dmtp/profiles.py` parts), the verify study (its own stage) and the records revision."""
    return {k: v for k, v in fingerprint(experiment, RUN_CONTROL + ("only", "only_seeds")).items()
            if k not in ("verify", "records_revision")}


def record_experiment(c: Ctx, verify_only: bool = False):
    """results/<profile>/experiment.json: the requested experiment (the eval stage), or only its `verify` section
    written into the recorded one (the verify stage: the rest stays what the eval runs were made with)."""
    path = c.res / "experiment.json"
    if not verify_only or not path.exists():
        write_experiment(path, c.p)
    else:
        write_json(path, dict(read_json(path), verify=asdict(c.p.study)))


def st_eval(c: Ctx):
    ev, cache = c.p.eval, {}
    # kept: done with this configuration after the model it measures (a checked-out result of another run is redone)
    todo = [(*x, u) for x, u in zip(eval_plan(c.p), units(c, "eval"))
            if not (c.check(u) and fresh(u.outputs[0], model_done(c, *x[4:])))]
    if todo:
        c.need("drafters", {(m, seed) for _, _, _, _, m, seed, _ in todo})
        (tgt, mtp), tok = c.target(), c.tok
    record_experiment(c)  # the runs' experiment: the report takes its rows from it
    failed, prompts = [], {}
    for ds, n, temp, mode, m, seed, u in todo:
        t0 = time.time()
        try:  # one run failing does not cost the others: they go on, and the stage fails at the end naming it
            if (m, seed) not in cache:  # a method object is reusable: each decode batch works on a copy
                cache[m, seed] = load_method(m, tgt, mtp, drafters_dir(c, seed), ev.mtp_steps)
            if (ds, n) not in prompts:
                prompts[ds, n] = eval_prompts(c, ds, n)
            recs = run_generate(tgt, cache[m, seed], prompts[ds, n], temp, ev.new_tokens,
                                [tok.eos_token_id], ev.batch, seed=0, tok=tok,
                                desc=f"{m} s{seed} {ds} T{temp:g} {mode}", extra={"dataset": ds, "seed": seed},
                                mode=mode, stop_strings=stop_strings(c.p, mode), engine=c.eng)
        except Exception as e:  # noqa: BLE001 - reported below, then raised
            failed.append(f"{m} s{seed} {ds} T={temp:g} {mode}: {failure(e)}")
            c.log(f"eval FAILED {failed[-1]}")
            continue
        wall = time.time() - t0
        acc = write_run(c, u, recs, wall, {"method": m, "dataset": ds, "temperature": temp, "mode": mode, "seed": seed,
                                           "max_new_tokens": ev.new_tokens, "batch": ev.batch,
                                           "stops": list(stop_strings(c.p, mode)), "target_dtype": c.p.engine.dtype})
        c.log(f"eval {m:<28} s{seed} {ds:<10} T={temp:g} {mode:<7} per-verify tau {acceptance_length(acc):.3f}  "
              f"({len(acc)} rounds, {wall:.1f}s, {compiled_graphs()} graphs compiled in this process)")
    write_subsets(c)
    oracle_ceilings(c)
    if failed:
        raise RuntimeError(f"{len(failed)} evaluation run(s) failed (the others were written):\n  "
                           + "\n  ".join(failed))


def write_run(c: Ctx, u: Unit, recs: list[dict], wall: float, config: dict) -> list[int]:
    """A run file's record, then the run file (it never exists without its record); returns its accepted counts."""
    write_meta(u.record, config, wall_s=wall, engine=c.eng, fingerprint=u.want)
    write_jsonl(u.outputs[0], recs)
    return [x for r in recs for x in r["accepted"]]


def oracle_ceilings(c: Ctx):
    """At each T > 0 the ceiling of target-only verification along the `ar` run: results/<profile>/oracle/
    <dataset>_T<temp>.json, redone when the ar run is newer."""
    todo = []
    for ds in c.p.eval.sets:
        for temp in c.p.eval.temperatures:
            src = run_file(c.res, ds, temp, "natural", AR.name, 0)
            out = c.res / "oracle" / f"{ds}_T{temp:g}.json"
            if temp > 0 and ds == "humaneval" and src.exists() and not fresh(out, src):
                todo.append((ds, temp, src, out))
    if not todo:
        return
    tgt, _ = c.target()
    prompts = {p["id"]: p["prompt_ids"] for p in encode_prompts(c.tok, humaneval_prompts())}
    for ds, temp, src, out in todo:
        t0 = time.time()
        res = oracle_ceiling(tgt, read_jsonl(src), prompts, temp, k=7)
        write_json(out, dict(res, dataset=ds, temperature=temp, source=str(src.relative_to(c.res)),
                             wall_s=round(time.time() - t0, 2)))
        c.log(f"oracle ceiling {ds} T={temp:g}: acceptance length <= {res['acceptance_length']:.3f} "
              f"(C_1 {res['cumulative'][0]:.3f})")


def curve_plan(p: Profile):
    """(run, seed, step) of every learning-curve point: the `ablation.curve` runs x their seeds x their budgets and
    final step."""
    spec = p.ablation
    for m in spec.selected(spec.curve):
        for seed in spec.seeds_of(m):
            for k in snapshots(p, m) + (p.train.steps,):
                yield m, seed, k


def st_curve(c: Ctx):
    """Learning curves: each snapshot of the `ablation.curve` runs on HumanEval at T = 0, natural mode, into
    results/<profile>/curve/<run>/humaneval_T0_s<seed>_step<k>.jsonl (the training tokens in its meta.json)."""
    spec, ev = c.p.ablation, c.p.eval
    if not spec.curve:
        return
    n = ev.sets.get("humaneval")
    require(n, "ablation.curve needs HumanEval in eval.sets")
    todo = []
    for (m, seed, k), u in zip(curve_plan(c.p), units(c, "curve")):
        src = branches(c, m, seed).get(k) or drafters_dir(c, seed) / m / (f"step{k}" if k < c.p.train.steps else "")
        require((src / "DONE").exists(), f"learning curve: {src} is not there (train with ablation.budgets = "
                                         f"{list(spec.budgets)}: the drafters stage)")
        if not (c.check(u) and fresh(u.outputs[0], src / "DONE")):
            todo.append((m, seed, k, src, u))
    if not todo:
        return
    c.need("drafters", {(m, seed) for m, seed, *_ in todo})
    (tgt, mtp), tok = c.target(), c.tok
    rows = encode_prompts(tok, humaneval_prompts()[:n])
    for m, seed, k, src, u in todo:
        d = Drafter.load(src / "drafter", device=tgt.device, dtype=tgt.dtype).eval()
        method = build_method(d.config.variant, tgt, drafter=d, mtp=mtp, label=m)
        if k < c.p.train.steps and not spec.anneal:
            tokens = read_json(src / "snapshot.json")["train_tokens"]
        else:
            tokens = read_json(src / "history.json", list)[-1].get("tokens")
            require(tokens is not None, f"{src}/history.json has no training-token count (trained before it was "
                    "recorded): retrain with --force")
        t0 = time.time()
        recs = run_generate(tgt, method, rows, 0.0, ev.new_tokens, [tok.eos_token_id], ev.batch, seed=0, tok=tok,
                            desc=f"curve {m} s{seed} step {k}", extra={"dataset": "humaneval", "seed": seed,
                                                                       "step": k},
                            stop_strings=stop_strings(c.p, "natural"), engine=c.eng)
        acc = write_run(c, u, recs, time.time() - t0, {"method": m, "seed": seed, "step": k, "train_tokens": tokens,
                                                       "dataset": "humaneval", "temperature": 0.0, "mode": "natural"})
        c.log(f"curve {m:<20} s{seed} step {k:>6} ({tokens / 1e6:.2f} M tokens): per-verify tau "
              f"{acceptance_length(acc):.3f}")


def write_subsets(c: Ctx):
    """`humaneval8` = the first 8 records of the `humaneval` run (same prompts, decoded in the same batch)."""
    runs = c.res / "runs" / "ablation"
    for name, (src, n) in c.p.eval.subsets.items():
        for mdir in sorted(p for p in runs.iterdir() if p.is_dir()):
            for f in sorted(mdir.glob(f"{src}_T*.jsonl")):
                out = mdir / f.name.replace(src, name, 1)
                if not fresh(out, f):
                    write_jsonl(out, [dict(r, dataset=name) for r in read_jsonl(f)[:n]])
                    write_json(out.with_suffix(".meta.json"), dict(read_json(f.with_suffix(".meta.json")),
                                                                   derived_from={"file": f.name, "first": n}))


def lossless_check(c: Ctx):
    """At T = 0 every method's output (each seed, each mode) must equal `ar`'s in the same mode; report divergences
    with the target's top-2 gap."""
    rows, flips, refs, runs = [], [], {}, c.res / "runs" / "ablation"
    for ds in list(c.p.eval.sets) + list(c.p.eval.ood):
        for mode in c.p.eval.modes:
            ref_path = run_file(c.res, ds, 0.0, mode, AR.name, 0)
            if not ref_path.exists():
                continue
            refs[ds, mode] = {r["id"]: r["output_ids"] for r in read_jsonl(ref_path)}
            found = {m.name + (f"@s{seed}" if seed else ""): read_jsonl(f)
                     for m in sorted(p for p in runs.iterdir() if p.is_dir() and p.name != AR.name)
                     for seed in c.p.ablation.seeds if (f := run_file(c.res, ds, 0.0, mode, m.name, seed)).exists()}
            r, f = compare_runs(refs[ds, mode], found, ds)
            rows += [dict(x, mode=mode) for x in r]
            flips += [dict(x, mode=mode) for x in f]
    write_csv(c.res / "tables" / "lossless_T0.csv",
              pd.DataFrame(rows, columns=["method", "dataset", "mode", "n", "identical", "divergent"]))
    if flips:  # how near a tie each flip was
        tgt, _ = c.target()
        prompts = {p["id"]: p["prompt_ids"] for ds, n in {**c.p.eval.sets, **c.p.eval.ood}.items()
                   for p in eval_prompts(c, ds, n)}
        for mode in c.p.eval.modes:
            mine = [x for x in flips if x["mode"] == mode]
            if mine:
                add_top2_gaps(tgt, mine, prompts, {ds: v for (ds, md), v in refs.items() if md == mode})
        write_csv(c.res / "tables" / "lossless_divergences.csv", pd.DataFrame(flips))
    bad = [r for r in rows if r["identical"] != r["n"]]
    untied = [f for f in flips if not f.get("tie")]
    c.log(f"lossless at T=0: {len(rows) - len(bad)}/{len(rows)} method x dataset x mode runs identical to ar"
          + (f"; {len(flips)} requests diverge, {len(flips) - len(untied)} of them at a top-2 tie of bf16 rounding "
             f"({sum(bool(f.get('tie_rule')) for f in flips)} by the rule, "
             f"{sum(bool(f.get('tie_measured')) for f in flips)} by the measured error)"
             + (f"; NOT at a tie: {[(f['method'], f['id'], f.get('top2_gap')) for f in untied]}" if untied else "")
             if flips else ""))
    return rows


def st_verify(c: Ctx):
    """The verification-mode study (`dmtp.cli.verify`, settings `verify.*`): every group not already made with the
    same settings after the model it measures, in the study's evaluation mode (natural: the eval stage's stops)."""
    v, out, seed = c.p.study, c.res / "verify", c.p.ablation.seeds[0]
    plan = list(zip(verify_study.groups(v), units(c, "verify")))
    todo = [g for g, u in plan if not (c.check(u) and fresh(u.outputs[0], model_done(c, g[0], seed)))]
    if not todo and (out / "throughput.csv").exists() and (out / "oracle.csv").exists():
        return
    c.need("drafters", {(m, seed) for m, _, _ in todo})
    record_experiment(c, verify_only=True)  # the report orders the study's rows by it
    tgt, mtp = c.target()
    tok, want = c.tok, {g: u.want for g, u in plan}
    verify_study.study(tgt, mtp, drafters_dir(c, seed), encode_prompts(tok, humaneval_prompts(v.prompts)),
                       v, out, [tok.eos_token_id], c.p.eval.mtp_steps,
                       stop=stop_spec(tgt, tok, v.eval_mode, stop_strings(c.p, v.eval_mode)),
                       todo=todo, want=lambda *g: want[g], log=c.log, engine=c.eng)


def model_done(c: Ctx, run: str, seed: int) -> Path:
    """The DONE marker of the checkpoint a run is measured on (results older than it are redone)."""
    return c.work / "target" / "DONE" if run in c.p.ablation.baselines else drafters_dir(c, seed) / run / "DONE"


def st_tables(c: Ctx):
    """Tables of the runs there are; a request for another experiment than the one the eval stage recorded is
    refused rather than written over it."""
    path = c.res / "experiment.json"
    if path.exists():
        d = differences(experiment_settings(read_json(path)), experiment_settings(asdict(c.p)))
        require(not d, f"{path}: the runs were made with another experiment than the one requested "
                f"({', '.join(d[:6])}); the tables show the runs there are: drop the --set, or run the eval stage "
                "with it first")
    runs = c.res / "runs" / "ablation"
    if not runs.is_dir():  # no run decoded yet: nothing to tabulate
        raise FileNotFoundError(f"{runs} is not there: run the eval stage first (dmtp pipeline --profile {c.p.name} "
                                "--stage eval)")
    write_subsets(c)
    lossless_check(c)
    render_tables(c.p.folder, c.res.parents[c.p.folder.count("/")])


# --- what each stage's output depends on -------------------------------------------------------------------------
def fingerprints(p: Profile) -> dict[str, dict]:
    """Stage -> the settings its output depends on: its own and those of every stage it reads (keys as `--set`
    names them), without run control (stop_after, save_every, log_every)."""
    d = p.data
    f = {"corpus": {"data.corpus_bytes": d.corpus_bytes, "data.corpus_sources": list(d.corpus_sources),
                    **({"data.corpus_max_repeat": d.corpus_max_repeat} if d.corpus_max_repeat < 1 else {})}}
    f["tokenizer"] = dict(f["corpus"], **{"data.vocab_size": d.vocab_size, "data.tokenizer_bytes": d.tokenizer_bytes,
                                                 "pretokenizer": PRETOKENIZER_VERSION})
    f["target"] = dict(f["tokenizer"], **{"model.arch": fingerprint(p.model.arch),
                                          "pretrain": pretrain_key(fingerprint(p.pretrain)),
                                          "model.checkpoint_dtype": p.model.checkpoint_dtype},
                       **({"realization": p.realization} if p.realization else {}))
    f["data"] = dict(f["target"], **{"engine": fingerprint(p.engine.records_key()), "prompt_cut": PROMPT_CUT},
                     **{f"data.{k}": getattr(d, k) for k in ("prompts", "prompt_tokens", "new_tokens", "temperature",
                                                             "batch", "prompts_per_doc")},
                     **({"data.samples": d.samples} if d.samples != 1 else {}))
    shape = drafter_key({k: v for k, v in fingerprint(p.drafter).items() if k != "variants"})  # variants: per run
    train = {k: v for k, v in fingerprint(p.train).items() if k != "snapshots"}  # snapshots: per run (budgets)
    f["drafters"] = dict(f["data"], train=train, drafter=shape)
    return f


def drafter_fingerprint(p: Profile, run: str, f: dict, seed: int = 0) -> dict:
    """A drafter run's: the drafters' settings, its seed, its variant's own (drafter.variants), a continued run's
    budget, the learning-curve snapshots it keeps."""
    a = p.ablation
    variant = a.continued.get(run, a.backbones.get(run, (run,)))[0]
    want = dict(f["drafters"], **{"ablation.seed": seed, "drafter.variants": p.drafter.variants.get(variant, {})})
    if snapshots(p, run):
        want["ablation.budgets"] = list(snapshots(p, run))
        if a.anneal:
            want["ablation.anneal"] = a.anneal
    if run in a.continued:
        want.update({"ablation.continued": list(a.continued[run]), "ablation.continue_steps": a.continue_steps})
    if run in a.backbones:
        want["ablation.backbones"] = list(a.backbones[run])
    return want


FINGERPRINT = "fingerprint.json"


def finished(stage: str, u: Unit) -> bool:
    """A unit's output is complete: the marker its stage writes last is there (a data or run file: written at once)."""
    out = u.outputs[0]
    if stage == "tokenizer":  # tokenizer_config.json last, then the token streams
        return (out / "tokenizer_config.json").exists() and all((u.outputs[1] / f"{s}.npy").exists()
                                                                for s in ("train", "heldout"))
    return (out / "DONE").exists() if out.suffix != ".jsonl" else out.exists()


def units(c: Ctx, stage: str) -> list[Unit]:
    """The resumable pieces of work of a stage, each with the configuration requested for it (`stages.Unit`); the
    drafter and eval stages: the runs selected by `ablation.only`."""
    f, w, a = fingerprints(c.p), c.work, c.p.ablation
    if stage in ("corpus", "tokenizer"):
        extra = [w / "tokens"] if stage == "tokenizer" else []
        return [Unit(str(w / stage), f[stage], w / stage / FINGERPRINT, [w / stage] + extra)]
    if stage == "target":  # the record lives in the finished checkpoint, or in the resumable state until then
        rec = w / ("target" if (w / "target" / "DONE").exists() else "target_state") / FINGERPRINT
        return [Unit(str(w / "target"), f["target"], rec, [w / "target", w / "target_state"])]
    if stage == "data":
        out = w / "data" / "train.jsonl"
        return [Unit(str(out), f["data"], out.with_suffix(".meta.json"), [out])]
    if stage == "drafters":
        out = []
        for r in a.selected(a.variants + tuple(a.backbones) + tuple(a.continued)):
            for seed in a.seeds_of(r):
                d = drafters_dir(c, seed) / r
                out.append(Unit(str(d), drafter_fingerprint(c.p, r, f, seed), d / FINGERPRINT, [d],
                                run={"run": r, "seed": seed}))
        return out
    ev = c.p.eval
    decode = {"engine": fingerprint(c.p.engine.records_key()), "eval.new_tokens": ev.new_tokens, "eval.batch": ev.batch}
    natural = {"eval.stops": list(stop_strings(c.p, "natural"))}

    def model(m: str, seed: int) -> dict:
        return f["target"] if m in a.baselines else drafter_fingerprint(c.p, m, f, seed)

    def file_unit(path: Path, want: dict) -> Unit:  # a run file, its record beside it
        return Unit(str(path), want, path.with_suffix(".meta.json"), [path])

    def steps(m: str) -> dict:
        return {"eval.mtp_steps": ev.mtp_steps} if method_class(m).uses_mtp_steps else {}

    if stage == "eval":
        return [file_unit(run_file(c.res, ds, temp, mode, m, seed), dict(
            model(m, seed), **decode, **steps(m), **(natural if mode == "natural" else {}),
            **({"prompt_cut": PROMPT_CUT, "data.prompt_tokens": c.p.data.prompt_tokens} if ds in ev.ood else {}),
            run={"dataset": ds, "prompts": n, "temperature": temp, "method": m, "mode": mode, "seed": seed}))
            for ds, n, temp, mode, m, seed in eval_plan(c.p)]
    if stage == "curve":
        return [file_unit(c.res / "curve" / m / f"humaneval_T0_s{seed}_step{k}.jsonl", dict(
            model(m, seed), **decode, **natural, run={"dataset": "humaneval", "prompts": ev.sets.get("humaneval", 0),
                                                      "method": m, "seed": seed, "step": k}))
            for m, seed, k in curve_plan(c.p)]
    if stage == "verify":  # one unit per (method, verify mode, temperature) group of the study, first drafter seed
        v = c.p.study
        # what makes a group's records beside its method, mode and temperature: `verify.*` minus which groups run
        study = fingerprint({k: x for k, x in vars(v).items() if k not in ("methods", "modes", "temperatures")})
        return [file_unit(verify_study.group_path(c.res / "verify", m, mode, t), dict(
            model(m, a.seeds[0]), **{"engine": fingerprint(c.p.engine), "verify": study}, **steps(m),
            **(natural if v.eval_mode == "natural" else {}), run={"method": m, "verify": mode, "temperature": t}))
            for m, mode, t in verify_study.groups(v)]
    return []


def runnable(p: Profile, stages: list[str]) -> None:
    """What the embedded pipeline can run, checked before any stage (a profile's own fields check themselves)."""
    require(not p.scale.target_config, f"profile {p.name} is paper-scale (an external target): the pipeline builds "
            "the embedded default only; run it with dmtp reproduce, or its steps with dmtp generate / dmtp train "
            "(README: 'Bringing your own model')")
    sets = p.eval.sets
    other = sorted(set(sets) - {"humaneval"})
    require(not other, f"eval.sets={sets}: the pipeline evaluates on HumanEval only (its small target has no chat "
            f"template for {', '.join(other)}); evaluate other sets with dmtp generate --dataset NAME")
    if "eval" in stages:
        total = len(humaneval_prompts())
        require(sets.get("humaneval", 0) <= total, f"eval.sets={sets}: HumanEval has {total} problems")
    if "verify" in stages:  # the study's runs must be runs of the ablation (trained by the drafters stage)
        v, total, runs = p.study, len(humaneval_prompts()), p.ablation.runs()
        require(v.prompts <= total, f"verify.prompts={v.prompts}: HumanEval has {total} problems")
        bad = [m for m in v.methods if m not in runs]
        require(not bad, f"verify.methods: {', '.join(bad)} not runs of ablation {p.ablation.name!r} "
                f"({', '.join(runs)})")
    need, arch = p.data.prompt_tokens + p.data.new_tokens + 16, p.model.arch
    require(need <= arch.max_position_embeddings, f"data.prompt_tokens + data.new_tokens (+ one verify block) = "
            f"{need} exceeds model.arch.max_position_embeddings={arch.max_position_embeddings}")
    a = p.ablation
    require(not a.budgets or a.budgets[-1] <= p.train.steps, f"ablation.budgets = {list(a.budgets)}: beyond "
            f"train.steps = {p.train.steps}")
    require("natural" in p.eval.modes, f"eval.modes = {list(p.eval.modes)}: the acceptance tables need 'natural'")


RUN = {"corpus": st_corpus, "tokenizer": st_tokenizer, "target": st_target, "data": st_data,
       "drafters": st_drafters, "eval": st_eval, "curve": st_curve, "tables": st_tables, "verify": st_verify}


def main(a):
    stages = STAGES if a.stage == "all" else a.stage.split(",")
    _check_flags(a, stages)
    archive = getattr(a, "archive", None)
    clock = Deadline(getattr(a, "deadline", None), getattr(a, "reserve", 30.0))
    rank, world, rank_dev = dist.init()
    c = Ctx(a)
    runnable(c.p, stages)
    costs = read_costs(c.work, getattr(a, "costs", None))
    if not c.force:  # every finished or half-done output with another configuration, refused before any work
        preflight([u for s in stages for u in units(c, s)])
    for path, flag in ((c.work, "--work"), (c.res, "--results")):  # a file there, or no right to write: named now
        out_dir(path, flag, create=False)
    if rank_dev:
        c.dev = rank_dev
    if world > 1:
        c.log(f"{world} data-parallel ranks ({'nccl' if rank_dev.startswith('cuda') else 'gloo'})")
    state, cut, checked = {s: "todo" for s in stages}, False, False
    cpu0 = _cpu_s()
    with contextlib.ExitStack() as held:
        if is_main():  # one writer per output: a second pipeline on any of them is refused, naming this one
            for out in dict.fromkeys(u.outputs[0] for s in stages for u in units(c, s)):
                held.enter_context(one_writer(out))
        for s in stages:
            if s in OPTIONAL_UNDER_DEADLINE and not clock.fits(costs.get(s)):
                c.log(f"stage {s} left out: it costs ~{costs[s]:.0f}s, {max(clock.left(), 0):.0f}s are left before "
                      "the deadline (the same command without --deadline runs it)")
                state[s] = "skipped"
                continue
            t0 = time.time()
            try:
                clock.arm()
                if s in NEEDS_INPUTS and not checked:  # before the first minute of a stage that reads them
                    check_inputs(c)
                    checked = True
                c.log(f"stage {s} ...")
                done = RUN[s](c) is not False
                if done and s == "tokenizer" and not checked:  # right after it: what later stages will read
                    check_inputs(c)
                    checked = True
            except DeadlineReached:
                state[s], cut = "stopped", True
                c.log(f"stage {s} stopped at the deadline after {time.time() - t0:.0f}s (resumable: the same command "
                      "resumes it)")
                break
            except BaseException:  # an error, Ctrl-C: what the finished stages wrote still goes into the archive
                state[s] = "failed"
                with contextlib.suppress(Exception):
                    _pack(c, state, archive)
                raise
            finally:
                clock.disarm()
            if not done:
                state[s] = "stopped"
                c.log(f"stage {s} stopped early (resumable); later stages not run")
                break
            state[s] = "done"
            record_cost(c.work, s, time.time() - t0)
            c.log(f"stage {s} done in {time.time() - t0:.1f}s")
            _pack(c, state, archive)
    if state[s] != "done":  # the last stage was left out or stopped: its state too
        _pack(c, state, archive)
    c.log(f"pipeline: {', '.join(f'{s} {v}' for s, v in state.items())}; CPU time {_cpu_s() - cpu0:.0f}s "
          "(this process and its children)")
    dist.destroy()
    if cut:
        raise SystemExit(3)  # the deadline cut the run: not an error of the input, not a finished run


def _check_flags(a, stages: list[str]) -> None:
    """The stages named, the ones torchrun runs, and --deadline / --archive (one process; the archive's path checked
    before any work: a run of hours must not fail at its first pack)."""
    if bad := [s for s in stages if s not in RUN]:
        raise KeyError(f"unknown stage {bad[0]!r}; stages: {', '.join(STAGES + OPTIONAL)}")
    archive, torchrun = getattr(a, "archive", None), int(os.environ.get("WORLD_SIZE", "1")) > 1
    if torchrun and not set(stages) <= set(PARALLEL):
        raise ValueError(f"under torchrun only the stages {','.join(PARALLEL)} run (data-parallel); run "
                         f"{','.join(s for s in stages if s not in PARALLEL)} in one process (no torchrun)")
    if torchrun and (getattr(a, "deadline", None) is not None or archive):
        raise ValueError("--deadline and --archive run in one process (no torchrun)")
    if archive:
        out_file(archive, "--archive")


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the corpus encoding's workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _pack(c: Ctx, state: dict, archive) -> None:
    """results/<folder>/pipeline.json (the run's state) and the archive of results/<folder> (`dmtp land` lands it),
    by rank 0 where --archive was given."""
    if not archive or not is_main():
        return
    missing = [s for s, v in state.items() if v in ("todo", "stopped", "failed")]
    # and every stage of the whole run whose outputs are not all there (one this invocation did not run too)
    missing += [s for s in STAGES if s not in missing and state.get(s) != "skipped" and s != "tables"
                and any(not finished(s, u) for u in units(c, s))]
    write_meta(c.res / STATUS, {"profile": c.p.name, "stages": state}, folder=c.p.folder, finished=not missing,
               missing=missing, skipped=[s for s, v in state.items() if v == "skipped"])
    t0 = time.time()
    pack(c.res.parents[c.p.folder.count("/")], c.p.folder, Path(archive))
    c.log(f"packed results/{c.p.folder} into {archive} ({Path(archive).stat().st_size / 1e6:.1f} MB, "
          f"{time.time() - t0:.1f}s)")
