"""`dmtp reproduce`: the blog's open reproduction on a local target checkpoint, as resumable stages.

    dmtp reproduce --profile qwen3.6-27b --target /models/Qwen3.6-27B --work runs/qwen3.6-27b \
        --data-path openperfectblend=/data/open-perfectblend --data-path gsm8k=/data/gsm8k \
        --data-path math500=/data/MATH-500/test.jsonl --data-path humaneval=/data/HumanEval.jsonl.gz \
        --data-path alpaca=/data/alpaca_data.json --data-path mtbench=/data/mt_bench/question.jsonl
    dmtp-torchrun --nproc_per_node=8 -m dmtp.cli reproduce ...  # the same, regen / train / eval over 8 GPUs
    dmtp reproduce --profile open-tiny --target TINY --work /tmp/open --data-path ...   # CPU, toy size (tests)

Stages (`--stage regen,train` runs some; each skips or resumes finished work):
  regen   on-policy training data: the target answers the training prompts (OpenPerfectBlend or `--prompts FILE`,
          thinking off) at the profile's `data.*` settings. Whole batches are dealt to the ranks, each appending to
          its own shard; the shards merge into data/train.jsonl in prompt order. Each batch is seeded by its offset,
          so the merged file does not depend on the number of ranks.
  train   every drafter run of the profile's ablation spec on the same batches, `scale.epochs` passes at the global
          batch `train.batch_size` (FSDP2 under torchrun); `--init-from [RUN=]PATH` continues a run from a public
          DFlash checkpoint; `--train-group N` trains N drafters at a time (the same batches either way). On GPUs
          the fit check of `dmtp train` runs first. Checkpoints every `train.save_every` steps: a killed run resumes.
  eval    the blog's protocol (`eval.*`): the first n prompts of each set, thinking off, T = 0, natural stop,
          `eval.new_tokens` a turn (MT-Bench's second turn on the model's own answer); every run of the spec,
          baselines included. One file a (run, set), dealt to the ranks.
  report  tables, figures and REPORT.md from the records (`dmtp.analysis.report`), beside the blog's numbers.

What it writes under --work (the report's layout):
    data/train.jsonl (+ .meta.json)                 merged on-policy sequences: id, prompt_ids, output_ids, stop_reason
    data/train.tokens/                              the same as a token store (what training reads)
    data/shards/rank<r>-of-<w>.jsonl                per-rank shards while regen runs (removed once merged)
    drafters/<run>/{drafter/,history.json,DONE,fingerprint.json}
    runs/<experiment>/<run>/<set>_T0.jsonl (+ .meta.json)   one record per request (MT-Bench: per turn)
    experiment.json, stages.json                    the resolved profile; each stage's wall time and rates
    tables/, figures/, REPORT.md
Every output records its configuration (a fingerprint: an output of another configuration is refused, naming the
fields, unless --force redoes it), the engine settings and the commit.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import time
from array import array
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as tdist

from dmtp import checks, dist
from dmtp.analysis.report import render_report
from dmtp.checks import gist, require
from dmtp.cli import args
from dmtp.cli.args import eos_ids
from dmtp.cli.fit import fit_groups, modelled, run_configs
from dmtp.cli.stages import Unit, fingerprint, preflight
from dmtp.cli.stages import check as stage_check
from dmtp.cli.stages import record as stage_record
from dmtp.config import Profile
from dmtp.data import datasets as D
from dmtp.data.tokenizer import find_tokenizer
from dmtp.data.tokens import store_of
from dmtp.engine.methods import AR, load_method, method_class
from dmtp.engine.runner import mtbench_generate, run_generate
from dmtp.experiment import drafter_config, write_experiment
from dmtp.io import (append_jsonl, atomic_path, drop_cut_line, environment, file_sha256, one_writer, read_json,
                     write_json, write_jsonl, write_meta)
from dmtp.models import torch_dtype
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target, read_config, target_checks
from dmtp.models.variants import get_variant
from dmtp.preflight import Check
from dmtp.preflight import run as run_checks
from dmtp.profiles import check_made_for, resolve
from dmtp.training.drafters import load_sequences, new_drafters, train_drafters

STAGES = ("regen", "train", "eval", "report")
TRAIN_SET = "openperfectblend"
# a rank's wait at a collective: ranks dealt whole batches / files finish hours apart at full size (torch's default,
# 10 minutes, would end a healthy run); torchrun stops every rank when one fails
COLLECTIVE_TIMEOUT_H = 12
RECORD_FIELDS = ("id", "prompt_ids", "output_ids", "stop_reason")  # no timings: the same file whatever ran it
# a target folder holding this file has random weights (`experiments.reproduce_standin`); stages.json and the report
# say so
RANDOM_WEIGHTS = "random_weights.json"


class Ctx:
    """One `dmtp reproduce` invocation: the resolved profile, where things are, the ranks."""

    def __init__(self, p: Profile, target: Path, work: Path, data_paths: dict[str, str], prompts: Path | None,
                 init_from: dict[str, str], force: bool, device: str | None):
        self.p, self.target, self.work = p, target, work
        self.data_paths, self.prompts, self.init_from, self.force = data_paths, prompts, init_from, force
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not tdist.is_initialized():  # launched by torchrun
            tdist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                     timeout=datetime.timedelta(hours=COLLECTIVE_TIMEOUT_H))
        self.rank, self.world, rank_dev = dist.init()
        self.dev = rank_dev or args.device(device)
        self.main = self.rank == 0
        self._tok = None
        self.train_group = 0  # drafters trained side by side (0: as the fit check finds on GPUs, else all)

    def log(self, msg: str) -> None:
        if self.main:
            print(f"[reproduce] {msg}", flush=True)

    @property
    def tok(self):
        if self._tok is None:
            self._tok = find_tokenizer(self.target)
            require(self._tok is not None, f"--target {self.target}: no tokenizer files beside config.json (the "
                    "prompts go through its chat template)")
            require(bool(getattr(self._tok, "chat_template", None)), f"--target {self.target}: its tokenizer has no "
                    "chat template (tokenizer_config.json `chat_template` or chat_template.jinja): the protocol "
                    "renders every prompt through it with thinking off")
        return self._tok

    @property
    def spec(self):
        return self.p.ablation

    def load_target(self) -> Target:
        return Target.load(self.target, dtype=torch_dtype(self.p.engine.dtype), device=self.dev)

    def eos(self) -> list[int]:
        cfg = read_config(self.target)
        return eos_ids(None, cfg, self.tok, cfg.vocab_size, self.target, remedy="set eos_token_id in its config.json "
                       "or generation_config.json (the protocol ends every turn at the target's end of text)")

    def runs(self) -> list[str]:
        """The drafter runs trained: the spec's variants and backbone runs (selected by `ablation.only`)."""
        a = self.spec
        return a.selected(a.variants + tuple(a.backbones))

    def variant(self, run: str) -> str:
        """The variant a drafter run trains (a backbone run's, or the run itself)."""
        return self.spec.backbones.get(run, (run,))[0]

    def needs_mtp(self, runs) -> bool:
        return any(get_variant(self.variant(r)).needs_mtp for r in runs)


# --- inputs -------------------------------------------------------------------------------------------------------
def data_paths(items: list[str]) -> dict[str, str]:
    """`--data-path SET=PATH` (repeatable) -> {set: path}; an unknown set or a missing path: one line naming it."""
    out = {}
    for item in items or []:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise ValueError(f"--data-path {item!r}: expected SET=PATH with SET one of {', '.join(D.SPECS)}")
        try:
            key = D.spec(name)[0]
        except KeyError as e:  # an unknown set: the known ones named
            raise KeyError(f"--data-path {item}: {e.args[0]}") from None
        if not Path(path).exists():
            raise FileNotFoundError(f"--data-path {key}={path}: no such file or folder")
        require(out.get(key, path) == path, f"--data-path {key} given twice ({out.get(key)}, {path}): which copy "
                "to read is ambiguous; give it once")
        out[key] = path
    return out


def read_prompt_file(path: Path, tok) -> list[dict]:
    """Training prompts from a local .jsonl / .json / .parquet: per row `conversations` or `messages` (the first
    user turn), `prompt` (text) or `prompt_ids` (used as given); ids from `id` or the row number. A bad row is an
    error naming the file and row."""
    rows = D.read_file(path) if path.is_file() else D.read_local(path, "train")
    out = []
    for i, r in enumerate(rows):
        rid, where = str(r.get("id", i)), f"{path}: row {i + 1}"
        if "prompt_ids" in r:
            ids = r["prompt_ids"]
            require(isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids),
                    f"{where}: `prompt_ids` must be a non-empty list of token ids")
        elif "conversations" in r or "messages" in r:
            ids = chat_ids(tok, r, D.first_user, where)
        else:
            require("prompt" in r, f"{where}: expected `conversations`, `messages`, `prompt` (text) or "
                    "`prompt_ids`")
            ids = chat_ids(tok, r, lambda r: [D.field_text(r, "prompt")], where)
        if ids is not None:
            out.append({"id": rid, "prompt_ids": list(ids)})
    return out


def chat_ids(tok, row: dict, turns, where: str) -> list[int] | None:
    """The token ids of `turns(row)[0]` (a set's first user turn) through the chat template; None for a row without
    one. A row not in the set's format, or text that cannot be encoded, is one line naming `where`."""
    try:
        got = turns(row)
    except ValueError as e:
        raise ValueError(f"{where}: {gist(e)}") from None
    except (TypeError, KeyError, AttributeError) as e:  # a field of another type where the format has text
        raise ValueError(f"{where}: not the set's format ({type(e).__name__}: {gist(e)})") from None
    if not got:
        return None
    checks.text(got[0], where)
    return D.encode(tok, D.chat_text(tok, [{"role": "user", "content": got[0]}]))


def training_prompts(c: Ctx) -> list[dict]:
    """The first `data.prompts` training prompts of at most `data.prompt_tokens` tokens (longer ones skipped):
    --prompts FILE, else OpenPerfectBlend's first user turns."""
    d = c.p.data
    if c.prompts is not None:
        rows = read_prompt_file(c.prompts, c.tok)
    else:
        key, s = D.spec(TRAIN_SET)
        rows = []
        try:
            raw = D.load_rows(key, c.data_paths.get(key))
        except D.DatasetUnavailable as e:
            raise D.DatasetUnavailable(f"regen: no training prompts: give --data-path {key}=PATH (its parquet folder) "
                                       f"or --prompts FILE (.jsonl / .parquet of prompts) "
                                       f"({str(e).split(': ', 1)[-1].split('. Point')[0]})") from None
        for i, r in enumerate(raw):
            ids = chat_ids(c.tok, r, s.turns, f"{c.data_paths.get(key) or key}: row {i + 1}")
            if ids is not None:
                rows.append({"id": s.id(r, i), "prompt_ids": ids})
    # token ids as compact arrays (the full set: ~1.4 M prompts; lists of ints would take ~8x the memory)
    kept = [dict(r, prompt_ids=array("i", r["prompt_ids"])) for r in rows
            if 0 < len(r["prompt_ids"]) <= d.prompt_tokens][: d.prompts]
    require(kept, f"no training prompt of 1 to {d.prompt_tokens} tokens (data.prompt_tokens) in "
            f"{c.prompts or c.data_paths.get(TRAIN_SET) or TRAIN_SET}")
    ids = [r["id"] for r in kept]
    require(len(set(ids)) == len(ids), f"{c.prompts or TRAIN_SET}: prompt ids repeat (give every row its own `id`)")
    return kept


def eval_prompts(c: Ctx, ds: str, n: int) -> list[dict]:
    """The first n prompts of an evaluation set (its chat template, thinking off); a set that is not there: one line
    naming it and the flag."""
    try:
        rows = D.load_prompts(ds, c.tok, n, c.data_paths.get(ds))
    except D.DatasetUnavailable as e:
        raise D.DatasetUnavailable(f"evaluation set {ds} is missing: give a local copy with --data-path {ds}=PATH "
                                   f"({str(e).split(': ', 1)[-1].split('. Point')[0]})") from None
    require(len(rows) >= n, f"evaluation set {ds} ({c.data_paths.get(ds, ds)}) holds {len(rows)} prompts, the "
            f"protocol takes the first {n} (eval.sets)")
    return rows


def digest(rows: list[dict]) -> str:
    """sha256 of prompts as decoded (ids, token ids, turns), row by row: what a fingerprint holds of its prompts."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps([r["id"], list(r["prompt_ids"])] + ([r["turns"]] if "turns" in r else [])).encode())
        h.update(b"\n")
    return h.hexdigest()


# --- fingerprints ---------------------------------------------------------------------------------------------------
def target_key(c: Ctx) -> dict:
    return {"target": str(c.target.resolve()), "target_modified": args.modified(c.target)}


def regen_key(c: Ctx, prompts_sha: str) -> dict:
    d = c.p.data
    return dict(target_key(c), engine=fingerprint(c.p.engine.records_key()), prompts_sha256=prompts_sha,
                realization=c.p.realization,
                **{f"data.{k}": getattr(d, k) for k in ("prompts", "prompt_tokens", "new_tokens", "temperature",
                                                        "batch")})


def train_config(c: Ctx, n_sequences: int):
    """The drafters' TrainConfig: the profile's, with `scale.epochs` passes over the regenerated sequences at the
    global batch `train.batch_size` (steps = ceil(epochs * n / batch)), bf16 autocast on CUDA only."""
    t = c.p.train
    steps = max(1, math.ceil(c.p.scale.epochs * n_sequences / t.batch_size))
    return replace(t, steps=steps, seed=c.p.stream(0), amp_bf16=t.amp_bf16 and str(c.dev).startswith("cuda"),
                   snapshots=())


def drafter_key(c: Ctx, run: str, data_key: dict, cfg) -> dict:
    bb = c.spec.backbones
    return dict(data_key, train=fingerprint(cfg), drafter={k: v for k, v in fingerprint(c.p.drafter).items()
                                                           if k != "variants"},
                variant_settings=c.p.drafter.variants.get(c.variant(run), {}), init_from=c.init_from.get(run),
                **({"backbone": list(bb[run])} if run in bb else {}))


# --- stages -------------------------------------------------------------------------------------------------------
ID_AT_START = re.compile(rb'^\{"id": ("(?:[^"\\]|\\.)*")')  # a shard line opens with its id (written first)


def shard_index(path: Path) -> dict[str, int]:
    """id -> byte offset of its line in one shard, read without parsing the token lists (a shard can hold
    gigabytes); a last line cut by a kill is left out."""
    out, pos = {}, 0
    if not path.exists():
        return out
    with open(path, "rb") as f:
        for line in f:
            if line.endswith(b"\n"):
                m = ID_AT_START.match(line)
                if not m:
                    raise ValueError(f"{path}: line at byte {pos} is not a regeneration record")
                out[json.loads(m.group(1))] = pos
            pos += len(line)
    return out


def merge_shards(shards: Path, prompts: list[dict], out: Path) -> dict:
    """data/train.jsonl from the shards in prompt order, each record cut to RECORD_FIELDS, streamed and written
    atomically. Returns the counts."""
    where = {}
    for f in sorted(shards.glob("rank*.jsonl")):  # shards of any numbers of ranks: an id's first record wins
        for rid, pos in shard_index(f).items():
            where.setdefault(rid, (f, pos))
    missing = [p["id"] for p in prompts if p["id"] not in where]
    if missing:
        raise RuntimeError(f"regen: {len(missing)} prompts have no record in {shards} (first {missing[0]!r}): "
                           "run the stage again")
    files, n_tok = {}, 0
    with atomic_path(out) as tmp, open(tmp, "w") as w:
        try:
            for p in prompts:
                f, pos = where[p["id"]]
                fh = files.get(f) or files.setdefault(f, open(f, "rb"))
                fh.seek(pos)
                try:  # a line that opens with its id, ends with a newline, and is still not a whole record
                    r = json.loads(fh.readline())
                    n_tok += len(r["output_ids"])
                    w.write(json.dumps({k: r[k] for k in RECORD_FIELDS}) + "\n")
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{f}: line at byte {pos} (id {p['id']!r}) is not a whole regeneration record "
                                     f"({type(e).__name__}: {gist(e)}): remove that line and run the stage again "
                                     "(its batch is decoded again)") from None
        finally:
            for fh in files.values():
                fh.close()
    return {"sequences": len(prompts), "generated_tokens": n_tok}


def st_regen(c: Ctx) -> dict | None:
    """On-policy regeneration (module docstring). Returns the stage's numbers (rank 0), None when it was done."""
    d = c.p.data
    out, shards = c.work / "data" / "train.jsonl", c.work / "data" / "shards"
    prompts = training_prompts(c)
    want = regen_key(c, digest(prompts))
    merged = Unit(str(out), want, out.with_suffix(".meta.json"), [out])
    part = Unit(str(shards), want, shards / "fingerprint.json", [shards])
    if stage_check(merged, c.force, c.log):
        c.log(f"regen: {out} is there ({len(prompts)} prompts)")
        return None
    if not stage_check(part, c.force, c.log):
        stage_record(part)  # before any shard: half-done shards are checked like a finished file
    dist.barrier()
    own = shards / f"rank{c.rank}-of-{c.world}.jsonl"
    if own.exists():  # a line cut by a kill: dropped (its batch is decoded again)
        drop_cut_line(own)
    done = {i for f in sorted(shards.glob("rank*.jsonl")) for i in shard_index(f)}  # shards of any number of ranks
    B = d.batch
    todo = [i for i in range(0, len(prompts), B) if any(p["id"] not in done for p in prompts[i: i + B])]
    dist.barrier()  # every rank has read the shards before any appends: one `todo`, dealt the same everywhere
    mine = todo[c.rank:: c.world]
    c.log(f"regen: {len(prompts)} prompts in {len(range(0, len(prompts), B))} batches of {B}; {len(done)} already "
          f"decoded, {len(todo)} batches to go over {c.world} rank(s)")
    tokens, wall, first = 0, 0.0, None  # first: (tokens, seconds) of this rank's first batch, which compiles
    if mine:
        tgt = c.load_target()
        eos, seed = c.eos(), c.p.stream(1)
        for i in mine:  # batch i keeps its prompts and its seed on any number of ranks
            chunk = [dict(p, prompt_ids=list(p["prompt_ids"])) for p in prompts[i: i + B]]
            t0 = time.time()
            recs = run_generate(tgt, AR(), chunk, d.temperature, d.new_tokens, eos, B, seed=seed + i,
                                desc=f"regen {i // B + 1}", engine=c.p.engine)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall += time.time() - t0
            rows = [dict(id=p["id"], prompt_ids=p["prompt_ids"], output_ids=r["output_ids"],
                         stop_reason=r["stop_reason"], wall_s=r["wall_s"])
                    for p, r in zip(chunk, recs) if p["id"] not in done]
            tokens += sum(len(r["output_ids"]) for r in rows)
            first = first or (tokens, wall)
            append_jsonl(own, rows)
        del tgt
    steady = (tokens - first[0], wall - first[1]) if first and len(mine) > 1 else (0, 0.0)
    rates = dist.all_gather_objects({"rank": c.rank, "tokens": tokens, "decode_s": round(wall, 3),
                                     "batches": len(mine), "steady_tokens": steady[0],
                                     "steady_s": round(steady[1], 3)})
    dist.barrier()
    if not c.main:
        return None
    rate = lambda n, s: round(n / s, 1) if s else None  # noqa: E731
    # tok/s per GPU over every batch, and past each rank's first batch (which compiles): the steady rate
    info = dict(world=c.world, ranks=rates, tok_per_s_per_gpu=[rate(r["tokens"], r["decode_s"]) for r in rates],
                steady_tok_per_s_per_gpu=[rate(r["steady_tokens"], r["steady_s"]) for r in rates])
    # the record first, then the file (it never exists without it): the merge goes to a temporary name till then
    tmp = out.with_name(f".{out.name}.merging")
    info.update(merge_shards(shards, prompts, tmp))
    write_meta(merged.record, {"data": asdict(d), "prompts": str(c.prompts or c.data_paths.get(TRAIN_SET) or
                                                                    TRAIN_SET),
                               "seed": f"{c.p.stream(1)} + the batch's offset"},
               engine=c.p.engine, fingerprint=want, **info)
    os.replace(tmp, out)
    shutil.rmtree(shards, ignore_errors=True)
    c.log(f"regen: {info['sequences']} sequences, {info['generated_tokens']} generated tokens -> {out}")
    return info


def st_train(c: Ctx) -> dict | None:
    data = c.work / "data" / "train.jsonl"
    require(data.exists(), f"{data} is not there: run the regen stage first (--stage regen)")
    meta = read_json(data.with_suffix(".meta.json"))
    sha = file_sha256(data)
    data_key = {"data": meta.get("fingerprint"), "data_sha256": sha}
    cfg_t = read_config(c.target)
    # the merged sequences as a memory-mapped token store, converted once and reused while train.jsonl is the same
    seqs = load_sequences(store_of(data, c.work / "data" / "train.tokens", cfg_t.vocab_size, sha256=sha),
                          c.p.train.max_len, vocab_size=cfg_t.vocab_size)
    cfg = train_config(c, len(seqs))
    out = c.work / "drafters"
    units = [Unit(str(out / r), drafter_key(c, r, data_key, cfg), out / r / "fingerprint.json", [out / r],
                  run={"run": r}) for r in c.runs()]
    if not c.force:
        preflight(units)
    for u in units:
        if not stage_check(u, c.force, c.log) and c.main:
            (out / u.run["run"]).mkdir(parents=True, exist_ok=True)
            stage_record(u)  # before training: a half-trained drafter is checked like a finished one
    dist.barrier()
    todo = [u.run["run"] for u in units if not (out / u.run["run"] / "DONE").exists()]
    if not todo:
        c.log(f"train: {', '.join(c.runs())} already trained in {out}")
        return None
    groups = train_groups(c, cfg_t, cfg, todo)  # the fit check: before any weight loads
    mask = c.tok.convert_tokens_to_ids("<|mask|>") if "<|mask|>" in c.tok.get_vocab() else None
    base = dict(drafter_config(c.p, cfg_t, mask), seed=c.p.stream(0))
    c.log(f"train: {', '.join(todo)} for {cfg.steps} steps ({c.p.scale.epochs} epochs of {len(seqs)} sequences at "
          f"global batch {cfg.batch_size}){' from ' + str(c.init_from) if c.init_from else ''}")
    t0 = time.time()
    tgt = c.load_target()
    a = c.spec
    mtp = MTPHead.load(tgt, c.target) if c.needs_mtp(todo) else None
    # runs continuing a killed run's checkpoint: their steps before it are not in this stage's time
    resumed = [r for r in todo if (out / r / "trainer_state.pt").exists()]
    train_s = 0.0
    for runs, gcfg, line in groups:  # each group on the same batches and anchors: the same drafters as together
        if line:
            c.log(f"train: {','.join(runs)}: memory model: {line}")
        drafters = new_drafters(tgt, runs, base, {r: p for r, p in c.init_from.items() if r in runs},
                                backbones=a.backbones, variant_configs=c.p.drafter.variants)
        t1 = time.time()
        train_drafters(tgt, mtp, drafters, seqs, gcfg, out, log=c.log)  # FSDP2 under torchrun (train.fsdp "auto")
        train_s += time.time() - t1  # the training loops alone (no loading): what the projection's rate reads
        del drafters
    wall = time.time() - t0
    if c.main:  # what trained them: the recipe, the drafters' shape, the groups and the environment and commit
        write_meta(out / "meta.json", {"train": asdict(cfg), "drafter": base, "runs": c.runs(),
                                       "backbones": {k: list(v) for k, v in a.backbones.items()},
                                       "init_from": c.init_from, "data": str(data),
                                       "groups": [{"runs": runs, "micro_batch": g.micro_batch,
                                                   "shard_target": g.shard_target, "grad_sync": g.grad_sync,
                                                   "plan": line} for runs, g, line in groups]},
                   wall_s=wall, world=c.world, trained=todo)
    return {"runs": todo, "steps": cfg.steps, "global_batch": cfg.batch_size, "sequences": len(seqs),
            "max_len": cfg.max_len, "train_tokens": int(seqs.lengths().sum()) * c.p.scale.epochs,
            "world": c.world, "train_s": round(train_s, 3), "resumed": resumed,
            "groups": [runs for runs, _, _ in groups]}


def train_groups(c: Ctx, cfg_t, cfg, todo: list[str]) -> list[tuple[list[str], object, str | None]]:
    """The runs `todo` in groups trained one after another, each with its TrainConfig and the memory model's line:
    on CUDA the fit check per group (`cli.fit.fit_groups`: `--train-group` or the largest groups that fit);
    elsewhere `--train-group` runs a group (default all), with the profile's settings."""
    if modelled(cfg_t) and str(c.dev).startswith("cuda"):
        gpu = torch.cuda.get_device_properties(torch.device(c.dev)).total_memory
        return fit_groups(cfg_t.to_dict(), run_configs(c.p, cfg_t, todo), cfg, c.world, gpu, size=c.train_group)
    k = c.train_group or len(todo)
    return [(todo[i: i + k], cfg, None) for i in range(0, len(todo), k)]


def run_file(c: Ctx, run: str, ds: str, temp: float) -> Path:
    """runs/<experiment>/<run>/<set>_T<t>.jsonl: the report's layout (dmtp/analysis/report/data.py)."""
    return c.work / "runs" / c.spec.name / run / f"{ds}_T{temp:g}.jsonl"


def eval_units(c: Ctx) -> tuple[list[Unit], dict[str, list[dict]]]:
    ev, a = c.p.eval, c.spec
    prompts = {ds: eval_prompts(c, ds, n) for ds, n in ev.sets.items()}
    out = []
    # run by run: one drafter in memory at a time
    for run, (ds, n), temp in itertools.product(a.selected(a.runs()), ev.sets.items(), ev.temperatures):
        path, rec = run_file(c, run, ds, temp), c.work / "drafters" / run / "fingerprint.json"
        model = target_key(c) if run in a.baselines else {
            "drafter": read_json(rec).get("fingerprint") if rec.exists() else None,
            "drafter_done": (rec.parent / "DONE").exists()}
        want = dict(model, engine=fingerprint(c.p.engine.records_key()),
                    **{"eval.new_tokens": ev.new_tokens, "eval.batch": ev.batch, "eval.stops": list(ev.stops)},
                    **({"eval.mtp_steps": ev.mtp_steps} if method_class(run).uses_mtp_steps else {}),
                    run={"dataset": ds, "prompts": n, "temperature": temp, "method": run,
                         "prompts_sha256": digest(prompts[ds])})
        out.append(Unit(str(path), want, path.with_suffix(".meta.json"), [path],
                        run={"run": run, "dataset": ds, "temperature": temp}))
    return out, prompts


def st_eval(c: Ctx) -> dict | None:
    ev, a = c.p.eval, c.spec
    for r in a.selected(a.runs()):
        require(r in a.baselines or (c.work / "drafters" / r / "DONE").exists(),
                f"eval: the drafter {c.work / 'drafters' / r} is not trained: run the train stage first")
    units, prompts = eval_units(c)
    if not c.force:
        preflight(units)
    todo = [u for u in units if not stage_check(u, c.force, c.log)]
    dist.barrier()  # every rank has its `todo` before any file is written: the files are dealt the same everywhere
    if c.main:
        write_experiment(c.work / "experiment.json", c.p)  # the report takes its rows from it
    mine = todo[c.rank:: c.world]  # whole (run, set) files dealt to the ranks
    c.log(f"eval: {len(units) - len(todo)} of {len(units)} (run, set) files done; {len(todo)} to decode")
    stats = []
    if mine:
        tgt = c.load_target()
        mtp = MTPHead.load(tgt, c.target)
        tok, eos, methods = c.tok, c.eos(), {}
        for u in mine:
            run, ds, temp = u.run["run"], u.run["dataset"], u.run["temperature"]
            if run not in methods:
                methods.clear()  # the previous run's drafter is done with (the units come run by run)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                methods[run] = load_method(run, tgt, mtp, c.work / "drafters", ev.mtp_steps)
            t0 = time.time()
            if any(len(q["turns"]) > 1 for q in prompts[ds]):  # MT-Bench: turn 2 on the model's own answer 1
                recs = mtbench_generate(tgt, methods[run], tok, prompts[ds], temp, ev.new_tokens, eos, ev.batch,
                                        seed=0, engine=c.p.engine)
            else:
                recs = run_generate(tgt, methods[run], prompts[ds], temp, ev.new_tokens, eos, ev.batch, seed=0,
                                    tok=tok, desc=f"{run} {ds}", extra={"dataset": ds},
                                    stop_strings=ev.stops, engine=c.p.engine)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.time() - t0
            write_meta(u.record, {"method": run, "dataset": ds, "temperature": temp, "prompts": ev.sets[ds],
                                  "max_new_tokens": ev.new_tokens, "batch": ev.batch, "stops": list(ev.stops),
                                  "target": str(c.target)}, wall_s=wall, engine=c.p.engine, fingerprint=u.want)
            write_jsonl(u.outputs[0], recs)
            acc = [x for r in recs for x in r["accepted"]]
            toks = sum(len(r["output_ids"]) for r in recs)
            stats.append({"run": run, "dataset": ds, "requests": len(recs), "output_tokens": toks, "wall_s":
                          round(wall, 3), "rounds": len(acc)})
            c.log(f"eval {run:<20} {ds:<10} {len(recs)} requests, {toks} tokens, {len(acc)} rounds, {wall:.1f}s")
    stats = [s for part in dist.all_gather_objects(stats) for s in part]
    dist.barrier()
    return {"files": stats, "world": c.world} if todo else None


def st_report(c: Ctx) -> dict | None:
    if not c.main:
        return None
    require(any((c.work / "runs").glob("*/*/*.jsonl")), f"{c.work}/runs holds no records: run the eval stage first "
            "(or decode into runs/<experiment>/<run>/<set>_T0.jsonl with dmtp generate)")
    if not (c.work / "experiment.json").exists():  # records decoded by hand (dmtp generate): the profile's spec
        write_experiment(c.work / "experiment.json", c.p)
    record_stage(c)  # the target's kind (random weights?), which the report states first
    path = render_report(c.work.name, c.work.parent, name=c.p.name,
                         command=f"dmtp reproduce --profile {c.p.name} --work {c.work} --stage report")
    c.log(f"report: {path}")
    return {"report": str(path)}


RUN = {"regen": st_regen, "train": st_train, "eval": st_eval, "report": st_report}


def record_stage(c: Ctx, stage: str | None = None, wall: float = 0.0, info: dict | None = None) -> None:
    """stages.json: each stage's wall time and rates (what the projection reads), the target, environment, engine
    and whether the target's weights are random (`RANDOM_WEIGHTS`); stage None: those alone."""
    path = c.work / "stages.json"
    old = read_json(path) if path.exists() else {}
    if stage is not None:
        old.setdefault("stages", {})[stage] = dict(info, wall_s=round(wall, 3))
    old.update(profile=c.p.name, target=str(c.target), env=environment(), engine=asdict(c.p.engine),
               random_weights=(Path(c.target) / RANDOM_WEIGHTS).exists())
    write_json(path, old)


def early_checks(c: Ctx, cfg, stages: list[str]) -> list:
    """What the requested stages need, checked before any work (`dmtp.preflight`): the target's weights against its
    config (and its MTP head where a stage reads it), the tokenizer (regen, eval), and the regeneration's and each
    evaluation set's lengths within the target's positions."""
    mtp = "eval" in stages or ("train" in stages and c.needs_mtp(c.runs()))
    checks = target_checks(c.target, mtp=mtp)
    if {"regen", "eval"} & set(stages):
        checks.append(Check("--target tokenizer", lambda: f"end-of-text ids {c.eos()}"))
    if "regen" in stages:
        checks.append(Check("regeneration length", lambda: regen_positions(c, cfg)))
    if "eval" in stages:
        checks += [Check(f"eval {ds}", lambda ds=ds, n=n: eval_positions(c, cfg, ds, n))
                   for ds, n in c.p.eval.sets.items()]
    return checks


def regen_positions(c: Ctx, cfg) -> str:
    """The regeneration's longest request, data.prompt_tokens + data.new_tokens, within the target's positions."""
    d, limit = c.p.data, cfg.max_position_embeddings
    require(d.prompt_tokens + d.new_tokens <= limit, f"data.prompt_tokens={d.prompt_tokens} + data.new_tokens="
            f"{d.new_tokens} exceed the target's {limit} positions (max_position_embeddings): lower them (--set)")
    return f"{d.prompt_tokens} + {d.new_tokens} of {limit} positions"


def eval_positions(c: Ctx, cfg, ds: str, n: int) -> str:
    """An evaluation set's first n prompts, each with eval.new_tokens a turn within the target's positions (a
    multi-turn prompt counts its first turn and every turn's new tokens: at least what it takes)."""
    try:
        c.tok
    except ValueError:
        return "not read (the target's tokenizer is refused)"
    rows, limit, new = eval_prompts(c, ds, n), cfg.max_position_embeddings, c.p.eval.new_tokens
    longest = max(rows, key=lambda r: len(r["prompt_ids"]) + new * len(r.get("turns") or [0]))
    need = len(longest["prompt_ids"]) + new * len(longest.get("turns") or [0])
    require(need <= limit, f"evaluation set {ds}: prompt {longest['id']!r} takes {need} positions with "
            f"eval.new_tokens={new} a turn, more than the target's {limit} (max_position_embeddings)")
    return f"{len(rows)} prompts, at most {need} of {limit} positions"


def main(a) -> None:
    stages = list(STAGES) if a.stage == "all" else [s.strip() for s in a.stage.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise ValueError(f"--stage {a.stage}: unknown stage {(bad or [''])[0]!r}; stages: {', '.join(STAGES)} (or all)")
    p = resolve(a.profile, a.set or [])
    target = args.checkpoint(a.target, "--target", "target checkpoint")
    cfg = read_config(target)
    check_made_for(p, cfg, f"--target {target}")
    sp = p.ablation
    require(not sp.continued and len(sp.seeds) == 1, f"--profile {p.name}: its ablation {sp.name!r} has "
            f"{'continued runs' if sp.continued else 'several drafter seeds'}; dmtp reproduce trains each run once "
            "from scratch (or --init-from): run it with an open-reproduction spec (dmtp/config/ablation.py)")
    prompts = Path(a.prompts) if a.prompts else None
    if prompts is not None and not prompts.exists():
        raise FileNotFoundError(f"--prompts {prompts}: no such file or folder")
    c = Ctx(p, Path(target), args.out_dir(a.work or f"runs/{p.folder}", "--work", create=False),
            data_paths(a.data_path), prompts, {}, a.force, a.device)
    c.init_from = args.init_from(a.init_from, c.runs(), cfg, bare="zero_init_residual")
    c.train_group = a.train_group
    run_checks(early_checks(c, cfg, stages), log=c.log)  # nothing written before every check passed
    c.work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as held:
        if c.main:  # a second `dmtp reproduce` on this work folder is refused while this one runs
            held.enter_context(one_writer(c.work / "stages.json"))
        for s in stages:
            t0 = time.time()
            c.log(f"stage {s} ...")
            info = RUN[s](c)
            wall = time.time() - t0
            if info is not None and c.main:
                record_stage(c, s, wall, info)
            dist.barrier()  # rank 0 writes a stage's merged files last (train.jsonl, ...): the next stage reads them
            c.log(f"stage {s} done in {wall:.1f}s")
    dist.destroy()
