"""The embedded default end to end: corpus -> tokenizer -> target+MTP -> on-policy data -> drafters -> eval -> tables.

    dmtp pipeline --profile tiny                  # 2-core CPU, <= 15 min; what `make ablation-code` runs
    dmtp pipeline --profile mini --stage target   # one H200 (then `--stage all` for the rest)
    dmtp pipeline --profile smoke --work /tmp/w --results /tmp/r     # CI smoke, seconds

Every stage writes into `work/<profile>/<stage>` (checkpoints, data) or `results/<profile>/` (artifacts) atomically
and is skipped when its output exists (evaluation runs: and is newer than the checkpoint they measure, so results
checked out from another run are redone), so a re-run resumes where a killed one stopped.

Under torchrun (`make target|data|drafters NGPU=2`) the stages target, data and drafters run data-parallel, one
process per GPU; rank 0 alone writes. `--set pretrain.tokens=20000000` (repeatable) overrides a profile field.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ablations.code import BACKBONES, BASELINES, CONTINUED, MAIN_TABLE, VARIANTS
from dmtp import dist
from dmtp.analysis.lossless import compare, top2_gap
from dmtp.analysis.report import tables as T
from dmtp.data.corpus import build_corpus
from dmtp.data.humaneval import humaneval_prompts
from dmtp.data.prompts import code_prompts
from dmtp.data.tokenizer import encode_corpus, load_tokenizer, train_tokenizer
from dmtp.dist import barrier, is_main, rank_world
from dmtp.engine.decode import build_method, load_method
from dmtp.engine.runner import run_generate
from dmtp.io import atomic_dir, read_jsonl, write_json, write_jsonl, write_meta, write_text
from dmtp.models.mtp import MTPHead, save_target_with_mtp
from dmtp.models.target import Target
from dmtp.training.drafters import load_sequences, new_drafters, train_drafters
from dmtp.training.pretrain import build_target, evaluate, pretrain
from experiments.profiles import get_profile, override

STAGES = ["corpus", "tokenizer", "target", "data", "drafters", "eval", "tables"]
PARALLEL = ["target", "data", "drafters"]  # the stages that run under torchrun (the others: one process)


class Ctx:
    def __init__(self, a):
        name = a.profile or ("mini" if torch.cuda.is_available() else "tiny")
        self.p = override(get_profile(name), getattr(a, "set", None) or [])
        self.work = Path(a.work) / name
        self.res = Path(a.results) / name
        self.dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[self.p.target_dtype]

    def log(self, msg):
        if is_main():
            print(f"[{self.p.name}] {msg}", flush=True)

    def done(self, path: Path) -> bool:
        return (path / "DONE").exists() if path.is_dir() or not path.suffix else path.exists()

    @property
    def tok(self):
        return load_tokenizer(self.work / "tokenizer")

    def target(self):
        t = Target.load(self.work / "target", dtype=self.dtype, device=self.dev)
        return t, MTPHead.load(t, self.work / "target")


def st_corpus(c: Ctx):
    info = build_corpus(c.work / "corpus", max_bytes=c.p.corpus_bytes)
    c.log(f"corpus: {json.dumps(info, default=str)[:300]}")


def st_tokenizer(c: Ctx):
    out = c.work / "tokenizer"
    if not (out / "tokenizer.json").exists():
        train_tokenizer(c.work / "corpus" / "train.jsonl", out, vocab_size=c.p.vocab_size,
                        max_bytes=c.p.tokenizer_bytes)
    tok = load_tokenizer(out)
    for split in ("train", "heldout"):
        npy = c.work / "tokens" / f"{split}.npy"
        if not npy.exists():
            encode_corpus(c.work / "corpus" / f"{split}.jsonl", tok, npy)


def st_target(c: Ctx):
    """Pretrain target + MTP (data-parallel under torchrun); rank 0 evaluates and writes the checkpoint. Returns
    False when `pretrain.stop_after` stopped it (resumable, on any number of ranks)."""
    import numpy as np

    out = c.work / "target"
    if (out / "DONE").exists():
        return
    tok = c.tok
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(c.p.pretrain.seed)  # the same initial weights on every rank
    tgt, mtp = build_target(c.p.arch, len(tok), eos)
    tgt.model.to(c.dev)
    mtp.to(c.dev)
    n_params = sum(p.numel() for p in tgt.model.parameters())
    c.log(f"target: {n_params / 1e6:.1f} M parameters (+ MTP {sum(p.numel() for p in mtp.parameters()) / 1e6:.1f} M)")
    train = np.load(c.work / "tokens" / "train.npy", mmap_mode="r")
    held = np.load(c.work / "tokens" / "heldout.npy", mmap_mode="r")
    t0 = time.time()
    hist, info = pretrain(tgt, mtp, train, c.p.pretrain, c.work / "target_state", log=c.log)
    if not info["finished"]:
        return False
    wall = time.time() - t0
    if is_main():
        ev = evaluate(tgt, mtp, np.asarray(held), c.p.pretrain.seq_len, c.p.pretrain.eval_tokens)
        ev.update(parameters=n_params, mtp_parameters=sum(p.numel() for p in mtp.parameters()),
                  train_tokens=hist[-1]["tokens"] if hist else 0, wall_s=wall, world=info["world"],
                  tokens_per_s=info["tokens_trained"] / info["train_s"] if info["train_s"] > 0 else None)
        c.log(f"target held-out: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in ev.items()})}")
        tgt.model.to(torch.bfloat16 if c.p.name == "mini" else torch.float32)
        mtp.to(torch.bfloat16 if c.p.name == "mini" else torch.float32)
        with atomic_dir(out) as tmp:
            save_target_with_mtp(tgt.model, mtp, tmp)
            tok.save_pretrained(tmp)
            (tmp / "DONE").write_text("ok\n")
        write_json(c.res / "target" / "pretrain_history.json", hist)
        write_json(c.res / "target" / "heldout.json", ev)
        write_meta(c.res / "target" / "meta.json", {"arch": asdict(c.p.arch), "pretrain": asdict(c.p.pretrain)},
                   wall_s=wall, world=info["world"], resumed_at_step=info["start_step"])
    barrier()  # the next stage reads the checkpoint


def st_data(c: Ctx):
    """On-policy data: the target answers the corpus prompts. Under torchrun whole generation batches (of
    `data_batch` prompts, each seeded by its offset) are dealt to the ranks, so every prompt is decoded in the same
    batch with the same seed as on one process: the file is the same for any number of ranks, at any temperature
    (up to the kernels' determinism)."""
    out = c.work / "data" / "train.jsonl"
    if out.exists():
        return
    tgt, _ = c.target()
    tok = c.tok
    prompts = code_prompts(c.work / "corpus" / "train.jsonl", tok, c.p.data_prompts,
                           max_prompt_tokens=c.p.data_prompt_tokens, seed=0)
    rows = [{"id": p["id"], "prompt_ids": tok(p["prompt"], add_special_tokens=False)["input_ids"]} for p in prompts]
    rows = [r for r in rows if r["prompt_ids"]]
    t0 = time.time()
    recs = run_generate(tgt, build_method("ar", tgt), rows, c.p.data_temperature, c.p.data_new_tokens,
                        [tok.eos_token_id], c.p.data_batch, seed=1, desc="on-policy data", shard=True)
    world = rank_world()[1]
    if is_main():
        for r, p in zip(recs, rows):
            r["prompt_ids"] = p["prompt_ids"]
        write_jsonl(out, recs)
        write_meta(out.with_suffix(".meta.json"), {"n": len(recs), "temperature": c.p.data_temperature,
                                                    "batch": c.p.data_batch, "seed": "1 + the batch's offset"},
                   wall_s=time.time() - t0, world=world)
        c.log(f"data: {len(recs)} sequences, {sum(len(r['output_ids']) for r in recs)} generated tokens "
              f"({world} rank(s))")
    barrier()


def _drafter_base(c: Ctx, tgt, tok):
    return dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=c.p.drafter_layers, num_attention_heads=c.p.drafter_heads,
                num_key_value_heads=c.p.drafter_kv_heads, head_dim=c.p.arch.head_dim,
                intermediate_size=c.p.drafter_intermediate, mask_token_id=tok.convert_tokens_to_ids("<|mask|>"),
                attn_backend="sdpa", seed=c.p.train.seed)


def st_drafters(c: Ctx):
    from dataclasses import replace

    out = c.work / "drafters"
    tgt, mtp = c.target()
    tok = c.tok
    seqs = load_sequences(c.work / "data" / "train.jsonl", c.p.train.max_len)
    base = _drafter_base(c, tgt, tok)
    cfg = replace(c.p.train, amp_bf16=c.dev == "cuda")
    t0 = time.time()
    todo = [v for v in VARIANTS + list(BACKBONES) if not (out / v / "DONE").exists()]
    if todo:
        train_drafters(tgt, mtp, new_drafters(tgt, todo, base, backbones=BACKBONES), seqs, cfg, out, log=c.log)
    for name, (variant, src) in CONTINUED.items():
        if not (out / name / "DONE").exists():
            d = new_drafters(tgt, [variant], base, {variant: out / src / "drafter"})
            ccfg = replace(cfg, steps=c.p.continue_steps, seed=cfg.seed + 1)
            train_drafters(tgt, mtp, {name: d[variant]}, seqs, ccfg, out, log=c.log)

    if not is_main():
        return
    write_meta(c.res / "drafters" / "meta.json", {"train": asdict(c.p.train), "drafter": base,
                                                  "continue_steps": c.p.continue_steps}, wall_s=time.time() - t0)
    hist = {n.name: json.loads((n / "history.json").read_text()) for n in sorted(out.iterdir())
            if (n / "history.json").exists()}

    write_json(c.res / "drafters" / "train_history.json", hist)


def fresh(path: Path, dep: Path) -> bool:
    """`path` exists and was written after `dep` (the checkpoint or run it is derived from)."""
    return path.exists() and (not dep.exists() or path.stat().st_mtime >= dep.stat().st_mtime)


def eval_plan(c: Ctx):

    every = BASELINES + VARIANTS + list(CONTINUED) + list(BACKBONES)
    for ds, n in c.p.eval_sets.items():
        methods = every if ds in c.p.eval_all_methods_on else MAIN_TABLE + list(BACKBONES)
        for temp in c.p.eval_temperatures:
            for m in methods:
                yield ds, n, temp, m


def st_eval(c: Ctx):

    tgt, mtp = c.target()
    tok = c.tok
    drafters_dir = c.work / "drafters"
    cache = {}
    hp = humaneval_prompts()
    for ds, n, temp, m in eval_plan(c):
        path = c.res / "runs" / "ablation" / m / f"{ds}_T{temp:g}.jsonl"
        dep = (c.work / "target" / "DONE") if m in ("ar", "mtp") else (drafters_dir / m / "DONE")
        if fresh(path, dep):  # done after the model it measures (a checked-out result of another run is redone)
            continue
        if m not in cache:  # a method object is reusable: each decode batch works on a copy
            cache[m] = load_method(m, tgt, mtp, drafters_dir, c.p.mtp_steps)
        method = cache[m]
        rows = [{"id": p["id"], "prompt_ids": tok(p["prompt"], add_special_tokens=False)["input_ids"]}
                for p in hp[:n]]
        t0 = time.time()
        recs = run_generate(tgt, method, rows, temp, c.p.eval_new_tokens, [tok.eos_token_id], c.p.eval_batch,
                            seed=0, desc=f"{m} {ds} T{temp:g}", extra={"dataset": ds})
        wall = time.time() - t0
        write_jsonl(path, recs)
        write_meta(path.with_suffix(".meta.json"), {"method": m, "dataset": ds, "temperature": temp,
                                                     "max_new_tokens": c.p.eval_new_tokens,
                                                     "batch": c.p.eval_batch, "target_dtype": c.p.target_dtype},
                   wall_s=wall)
        acc = [x for r in recs for x in r["accepted"]]
        tau = 1 + sum(acc) / max(1, len(acc))
        c.log(f"eval {m:<32} {ds:<10} T={temp:g}  per-verify tau {tau:.3f}  ({len(acc)} rounds, {wall:.1f}s)")
    write_subsets(c)


def write_subsets(c: Ctx):
    """`humaneval8` = the first 8 records of the `humaneval` run (same prompts, decoded in the same batch)."""
    runs = c.res / "runs" / "ablation"
    for name, (src, n) in c.p.eval_subsets.items():
        for mdir in sorted(p for p in runs.iterdir() if p.is_dir()):
            for f in sorted(mdir.glob(f"{src}_T*.jsonl")):
                out = mdir / f.name.replace(src, name, 1)
                if fresh(out, f):
                    continue
                recs = [dict(r, dataset=name) for r in read_jsonl(f)[:n]]
                write_jsonl(out, recs)
                meta = json.loads(f.with_suffix(".meta.json").read_text())
                meta["derived_from"] = {"file": f.name, "first": n}
                write_json(out.with_suffix(".meta.json"), meta)


def lossless_check(c: Ctx):
    """At T = 0 every method's output must equal `ar`'s; report divergences with the target's top-2 gap."""
    rows, flips, refs = [], [], {}
    runs = c.res / "runs" / "ablation"
    for ds in c.p.eval_sets:
        ref_path = runs / "ar" / f"{ds}_T0.jsonl"
        if not ref_path.exists():
            continue
        ref = refs[ds] = {r["id"]: r["output_ids"] for r in read_jsonl(ref_path)}
        for mdir in sorted(runs.iterdir()):
            p = mdir / f"{ds}_T0.jsonl"
            if mdir.name == "ar" or not p.exists():
                continue
            row, f = compare(ref, read_jsonl(p), mdir.name, ds)
            rows.append(row)
            flips += f
    import pandas as pd

    write_text(c.res / "tables" / "lossless_T0.csv",
               pd.DataFrame(rows, columns=["method", "dataset", "n", "identical", "divergent"]).to_csv(index=False))
    if flips:  # how near a tie each flip was (HumanEval prompt ids; other sets have no top-2 gap here)
        tgt, _ = c.target()
        prompts = {p["id"]: c.tok(p["prompt"], add_special_tokens=False)["input_ids"] for p in humaneval_prompts()}
        for f in flips:
            if f["id"] in prompts:
                f["top2_gap"] = top2_gap(tgt, prompts[f["id"]] + refs[f["dataset"]][f["id"]][: f["position"]])
        write_text(c.res / "tables" / "lossless_divergences.csv", pd.DataFrame(flips).to_csv(index=False))
    bad = [r for r in rows if r["identical"] != r["n"]]
    c.log(f"lossless at T=0: {len(rows) - len(bad)}/{len(rows)} method x dataset runs identical to ar"
          + (f"; divergent: {bad}" if bad else ""))
    return rows


def st_tables(c: Ctx):
    write_subsets(c)
    lossless_check(c)

    T.render_all(c.res) if hasattr(T, "render_all") else None


RUN = {"corpus": st_corpus, "tokenizer": st_tokenizer, "target": st_target, "data": st_data,
       "drafters": st_drafters, "eval": st_eval, "tables": st_tables}


def main(a):
    stages = STAGES if a.stage == "all" else a.stage.split(",")
    for s in stages:
        if s not in RUN:
            raise KeyError(f"unknown stage {s!r}; stages: {', '.join(STAGES)}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not set(stages) <= set(PARALLEL):
        raise ValueError(f"under torchrun only the stages {','.join(PARALLEL)} run (data-parallel); run "
                         f"{','.join(s for s in stages if s not in PARALLEL)} in one process (no torchrun)")
    rank, world, rank_dev = dist.init()
    c = Ctx(a)
    if rank_dev:
        c.dev = rank_dev
    if world > 1:
        c.log(f"{world} data-parallel ranks ({'nccl' if rank_dev.startswith('cuda') else 'gloo'})")
    for s in stages:
        t0 = time.time()
        c.log(f"stage {s} ...")
        if RUN[s](c) is False:
            c.log(f"stage {s} stopped early (resumable); later stages not run")
            break
        c.log(f"stage {s} done in {time.time() - t0:.1f}s")
    dist.destroy()
