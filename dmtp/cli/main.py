"""`dmtp` command line.

    dmtp variants
    dmtp generate --target PATH [--drafter PATH] --method NAME --prompts FILE.jsonl --temperature 0 \\
        --max-new-tokens 128 --out out.jsonl
    dmtp generate --target T --method zero_init_residual --drafter DIR/zero_init_residual/drafter ...  # trained
    dmtp generate --target T --method zero_init_residual --drafter DIR/dmtp_d2/drafter ...   # DFlash2: by variant
    dmtp generate --target PATH --method mtp --dataset gsm8k [--data-path FILE] --out gsm8k.jsonl
    dmtp generate ... --temperature 1 --verify block   # drafts sampled, block verification (target | sample | block)
    dmtp generate --target PATH --method ar --prompts he.jsonl --mode natural --stop humaneval --out out.jsonl
    dmtp train --target PATH --data tokens.jsonl --variants dflash,zero_init_residual --out DIR --steps 200
    dmtp train --profile qwen3.6-27b --target PATH --data train.jsonl --variants dflash,zero_init_residual --out DIR
    dmtp train --target PATH --data train.jsonl --variants dflash,dmtp_d2 --attention public --out DIR
    dmtp train --target PATH --data train.jsonl --variants dmtp_d2 --init-from dmtp_d2=PUBLIC_DFLASH2 --out DIR
    dmtp pipeline --profile tiny            # the embedded default end to end (what `make ablation-code` runs)
    dmtp pipeline --profile mini --deadline 3300 --archive mini.tgz   # within a job's time limit; rerun resumes
    dmtp land mini.tgz                      # on another machine: the packed results into results/
    dmtp dryrun --profile qwen3.6-27b       # paper scale on the meta device: shapes and parameter counts
    dmtp dryrun --profile qwen3.6-27b --target CKPT --gpus 8 --gpu-mem 80   # its config, and the per-GPU plan
    dmtp dryrun --profile qwen3.6-27b --gpus 8 --rates results/qwen3.6-27b/rates/h200/rates.json   # + the time
    dmtp reproduce --profile qwen3.6-27b --target CKPT --data-path gsm8k=PATH ...   # the blog's open reproduction
    dmtp reproduce --profile open-tiny --target TINY_CKPT ...   # the same protocol at toy size (a CPU rehearsal)

Inputs are checked before any work; a bad one stops with one line naming it (exit 2). `dmtp generate` appends its
records batch by batch and a rerun resumes; an output or drafter made with another configuration is refused
(naming the fields) unless `--force` redoes it.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from dmtp import checks, dist, preflight
from dmtp.analysis.metrics import acceptance_length
from dmtp.checks import MIN_TEMPERATURE, require
from dmtp.cli import args, stages
from dmtp.cli.args import eos_ids
from dmtp.cli.args import modified as _modified
from dmtp.config import EVAL_MODES, VERIFY_MODES, DrafterShape, EngineConfig, TrainConfig
from dmtp.config.ablation import code
from dmtp.config.experiment import DRAFTER_ATTENTION
from dmtp.data.datasets import encode, load_prompts, spec
from dmtp.data.tokenizer import find_tokenizer
from dmtp.engine.methods import build_method, method_class, run_of, split_drafts
from dmtp.engine.runner import mtbench_generate, run_generate
from dmtp.engine.slots import engine_for
from dmtp.engine.stops import HUMANEVAL_STOPS
from dmtp.experiment import drafter_config
from dmtp.io import (append_jsonl, check_decoded, drop_cut_line, file_sha256, iter_jsonl, one_writer, read_jsonl,
                     write_meta)
from dmtp.models import torch_dtype
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target, read_config, target_checks
from dmtp.models.variants import REGISTRY, get_variant
from dmtp.profiles import check_made_for, family_mask_token, resolve
from dmtp.schema import override


def cmd_variants(a):
    w = max(map(len, REGISTRY))
    for name, cls in sorted(REGISTRY.items()):
        print(f"{name:<{w}}  {cls.description}")
    print("\nruns on another backbone (`dmtp train --variants` takes the run's name; `dmtp generate --method` the "
          "variant's):")
    for run, (variant, backbone) in code().backbones.items():
        print(f"{run:<{w}}  {variant} on the {backbone} backbone")


def load_models(target_path, drafter_path, method, device, dtype):
    """(target, mtp or None, drafter or None) for a method; each piece only when the method needs it."""
    tgt = Target.load(target_path, dtype=dtype, device=device)
    drafter = Drafter.load(drafter_path, device=device, dtype=dtype) if drafter_path else None
    mtp = MTPHead.load(tgt, target_path) if method_class(method).needs_mtp(drafter) else None
    return tgt, mtp, drafter


def read_prompts(path, tok=None, vocab_size=None):
    """Prompt dicts {id, prompt_ids} from a JSONL of `id` + `prompt` (text) or `prompt_ids`, every line checked (an
    error names the file and line). Without any `id` the line order numbers them."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    rows = list(iter_jsonl(path))
    with_id = [i for i, r in rows if "id" in r]
    if with_id and len(with_id) < len(rows):
        line = next(i for i, r in rows if "id" not in r)
        raise ValueError(f"{path}:{line}: no `id` while other lines have one (give every line an id, or none)")
    out, seen = [], {}
    for n, (i, r) in enumerate(rows):
        rid = r.get("id", n)
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
            raise ValueError(f"{path}:{i}: `id` must be a non-empty string or an integer, got {rid!r}")
        rid = str(rid)
        if rid in seen:
            raise ValueError(f"{path}:{i}: id {rid!r} already used on line {seen[rid]}")
        seen[rid] = i
        if "prompt_ids" in r:
            ids = r["prompt_ids"]
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise ValueError(f"{path}:{i}: `prompt_ids` must be a list of integer token ids")
            bad = [t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)]
            if bad:
                raise ValueError(f"{path}:{i}: token id {bad[0]} outside the target's vocabulary [0, {vocab_size})")
        elif "prompt" in r:
            require(isinstance(r["prompt"], str), f"{path}:{i}: `prompt` must be a string")
            checks.text(r["prompt"], f"{path}:{i}: `prompt`")
            require(tok is not None, f"{path}:{i}: a text prompt, but the target has no tokenizer files (give "
                                     "`prompt_ids`)")
            ids = encode(tok, r["prompt"])
        else:
            raise ValueError(f"{path}:{i}: needs `prompt` (text) or `prompt_ids`")
        require(ids, f"{path}:{i}: empty prompt (every prompt needs at least one token)")
        out.append({"id": rid, "prompt_ids": list(ids), "line": i})
    require(out, f"{path} holds no prompts")
    return out


def prompts_digest(prompts: list[dict]) -> str:
    """sha256 of the prompts as decoded: in an output's fingerprint, an edited prompt file is another configuration."""
    body = [{k: v for k, v in p.items() if k != "line"} for p in prompts]
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def resume_records(out: Path, meta: Path, want: dict, force: bool) -> dict[str, dict]:
    """Records already in `out` by id, when its meta says they come from the requested configuration (a line cut by
    a kill dropped). Another configuration, an unreadable record or a repeated id: refused, or with force afresh."""
    if not out.exists() or out.stat().st_size == 0:
        return {}
    try:
        old = stages.recorded(stages.Unit(str(out), want, meta, [out]))
        why = None if old == want else \
            f"made with another configuration ({', '.join(stages.differences(old, want)[:6])})" if old else \
            f"exists without a record of how it was made (in {meta.name})"
    except ValueError as e:
        why = f"its record cannot be read ({e})"
    if why is None:
        drop_cut_line(out)  # a line cut by a kill
        done, line = {}, {}
        try:
            for i, r in iter_jsonl(out):
                if r.get("id") in done:
                    raise ValueError(f"id {r['id']!r} is on lines {line[r['id']]} and {i}")
                if "id" in r:
                    done[r["id"]], line[r["id"]] = r, i
            return done
        except ValueError as e:
            why = str(e)
    if not force:
        raise stages.StageMismatch(f"--out {out}: {why}; pass --force to start it afresh, or another --out")
    out.unlink()
    return {}


def cmd_generate(a):
    require(bool(a.prompts) != bool(a.dataset), "give exactly one of --prompts FILE and --dataset NAME")
    out = args.out_file(a.out).resolve()  # the file itself: its meta beside it, whatever path reaches it
    if a.prompts and Path(a.prompts).resolve() == out:
        raise ValueError(f"--out {a.out}: is the --prompts file ({a.prompts}); choose another --out")
    with one_writer(out):  # a second `dmtp generate` on this --out is refused while this one runs
        generate_into(a, out)


def generate_into(a, out: Path):
    # --- everything checked before any model is loaded ---
    meta = Path(str(out) + ".meta.json")
    dev = args.device(a.device)
    args.checkpoint(a.target, "--target", "target checkpoint")
    cls = method_class(a.method)
    _check_drafter(a, cls)
    dataset = spec(a.dataset)[0] if a.dataset else None
    cfg = read_config(a.target)
    needs_mtp = get_variant(split_drafts(a.method)[0]).needs_mtp if cls.needs_drafter else cls.needs_mtp()
    preflight.run(target_checks(a.target, mtp=needs_mtp))  # the weights against config.json, before any is loaded
    tok = find_tokenizer(a.target)
    eos = eos_ids(a.eos, cfg, tok, cfg.vocab_size, a.target)
    stops = _stop_strings(a, tok, dataset)
    prompts = _generate_prompts(a, cfg, tok, dataset)
    eng = override(EngineConfig(dtype=a.dtype), a.engine, "--engine")  # every setting checked before a model loads
    want = stages.fingerprint(dict(
        target=str(Path(a.target).resolve()), target_modified=_modified(a.target), method=a.method,
        drafter=str(Path(a.drafter).resolve()) if a.drafter else None,
        drafter_modified=_modified(a.drafter) if a.drafter else None, temperature=a.temperature,
        max_new_tokens=a.max_new_tokens, mtp_steps=a.mtp_steps if cls.uses_mtp_steps else None,
        batch_size=a.batch_size, seed=a.seed, eos=eos, dtype=a.dtype, dataset=dataset, mode=a.mode, stop=stops,
        prompts_sha256=prompts_digest(prompts),
        **({"verify": a.verify} if a.verify != "target" else {}),  # (target: outputs of earlier versions resume)
        **({"engine": stages.fingerprint(eng)} if eng != EngineConfig(dtype=a.dtype) else {})))
    done = resume_records(out, meta, want, a.force)
    config = {k: v for k, v in vars(a).items() if k != "fn"}
    mtbench = dataset == "mtbench"  # two turns, the second on the model's own first answer
    ids = lambda p: [f"{p['id']}:t{t + 1}" for t in range(len(p["turns"]))] if mtbench else [p["id"]]  # noqa: E731
    todo = [i for i in range(0, len(prompts), a.batch_size)
            if any(x not in done for p in prompts[i: i + a.batch_size] for x in ids(p))]
    if not todo:  # (a kill after the last batch: the meta is marked finished now)
        write_meta(meta, config, fingerprint=want, finished=True, records=len(done))
        print(f"{a.method}: all {len(prompts)} prompts already in {out}")
        return
    # --- the work: batch i (prompts i..i+B-1, seeded seed + i) is appended as soon as it is decoded ---
    say = functools.partial(args.phase, "dmtp generate")
    say(f"inputs checked: {len(prompts)} prompts, {len(todo)} batch(es) of at most {a.batch_size} to decode; loading "
        f"the models ({a.dtype}, {dev})")
    t1 = time.monotonic()
    tgt, mtp, drafter = load_models(a.target, a.drafter, a.method, dev, torch_dtype(a.dtype))
    method = build_method(a.method, tgt, drafter=drafter, mtp=mtp, mtp_steps=a.mtp_steps)
    say(f"loaded the target{' and the MTP head' if mtp is not None else ''}{' and the drafter' if drafter else ''} "
        f"in {time.monotonic() - t1:.1f} s")
    write_meta(meta, config, fingerprint=want, finished=False, engine=eng)  # before the first record
    t0 = time.time()
    _decode_batches(a, out, tgt, method, tok, prompts, todo, done, dict(eos=eos, stops=stops, dataset=dataset,
                                                                         engine=eng), say)
    recs = read_jsonl(out)
    write_meta(meta, config, wall_s=time.time() - t0, fingerprint=want, finished=True, records=len(recs), engine=eng)
    acc = [x for r in recs for x in r["accepted"]]
    if acc:
        print(f"{a.method}: {len(recs)} requests, {len(acc)} rounds, per-verify tau {acceptance_length(acc):.3f}")
    torch.cuda.empty_cache() if torch.cuda.is_available() else None


def _check_drafter(a, cls) -> None:
    """`--method` and `--drafter` together: a drafter checkpoint for the methods that need one, none for others."""
    require(cls.needs_drafter or not a.drafter, f"--method {a.method} uses no drafter; drop --drafter")
    if not cls.needs_drafter:
        return
    base = run_of(a.method)
    if base in code().backbones:  # a run name of the ablation (dmtp_d2: a variant on another backbone)
        variant, backbone = code().backbones[base]
        raise ValueError(f"--method {a.method}: a run of the ablation ({variant} on the {backbone} backbone), not "
                         f"a method: give --method {variant + a.method[len(base):]} and that run's drafter (its "
                         "checkpoint holds the backbone)")
    get_variant(base)  # an unknown name fails with the known ones ("-k<n>": a limit; "-p<t>", "-g<n>": a rule)
    require(a.drafter, f"--method {a.method} needs --drafter (a trained drafter checkpoint folder)")
    args.checkpoint(a.drafter, "--drafter", "drafter checkpoint")


def _stop_strings(a, tok, dataset) -> list[str]:
    """`--stop`'s strings ('humaneval': the standard HumanEval set), checked against the other flags."""
    stops = [s for x in a.stop or [] for s in (HUMANEVAL_STOPS if x == "humaneval" else [x])]
    if stops and a.mode == "fixed":
        raise ValueError("--stop takes --mode natural (--mode fixed decodes exactly --max-new-tokens)")
    require(not (stops and tok is None), f"--stop needs the target's tokenizer files beside {a.target}/config.json")
    require(not (stops and dataset == "mtbench"), "--stop is not supported with --dataset mtbench (two turns)")
    require("" not in stops, "--stop '': a stop string must not be empty")
    for x in stops:
        checks.text(x, f"--stop {x!r}")
    return stops


def _generate_prompts(a, cfg, tok, dataset) -> list[dict]:
    """The prompts of `--prompts` or `--dataset` (the first `--n`), each short enough for the target's positions."""
    if dataset:  # a benchmark / training prompt set in its own format, chat template applied (data/datasets.py)
        require(tok is not None, f"--dataset needs the target's tokenizer files beside {a.target}/config.json")
        prompts = load_prompts(dataset, tok, a.n, a.data_path)
    else:
        prompts = read_prompts(args.in_file(a.prompts, "--prompts"), tok, cfg.vocab_size)[: a.n]
    limit = cfg.max_position_embeddings
    for p in prompts:
        if len(p["prompt_ids"]) + a.max_new_tokens > limit:
            where = f"{a.prompts}:{p['line']}" if "line" in p else f"{dataset} prompt {p['id']}"
            raise ValueError(f"{where}: {len(p['prompt_ids'])} prompt tokens + --max-new-tokens {a.max_new_tokens} "
                             f"exceed the target's {limit} positions (max_position_embeddings)")
    return prompts


def _decode_batches(a, out: Path, tgt, method, tok, prompts, todo, done, run: dict, say) -> None:
    """Decode the batches `todo` (prompt offsets), appending each one's records to `out` (`run`: eos, stops, dataset,
    engine)."""
    kind = engine_for(tgt, run["engine"])
    say(f"decoding batch 1 of {len(todo)} on the {kind} engine" + (
        ": the first batch compiles each stage (or reads it from the compile cache) and captures it"
        if kind == "compiled" else ""))
    bar = tqdm(total=len(prompts), initial=len(prompts) - sum(len(prompts[i: i + a.batch_size]) for i in todo),
               desc=f"generate {a.method}", dynamic_ncols=True)
    for i in todo:
        chunk = prompts[i: i + a.batch_size]
        if run["dataset"] == "mtbench":
            recs = mtbench_generate(tgt, method, tok, chunk, a.temperature, a.max_new_tokens, run["eos"],
                                    a.batch_size, a.seed + i, mode=a.mode, verify=a.verify, engine=run["engine"])
        else:
            recs = run_generate(tgt, method, chunk, a.temperature, a.max_new_tokens, run["eos"], a.batch_size,
                                a.seed + i, tok, mode=a.mode, stop_strings=run["stops"], verify=a.verify,
                                engine=run["engine"])
            for r, p in zip(recs, chunk):  # prompt + output: a training sequence for `dmtp train --data`
                r.update(prompt_ids=p["prompt_ids"], **({"dataset": p["dataset"]} if run["dataset"] else {}))
        append_jsonl(out, [r for r in recs if r["id"] not in done])
        if i == todo[0]:
            say(f"first {len(chunk)} records written to {out}")
        bar.update(len(chunk))
    bar.close()


def cmd_train(a):
    from dmtp.cli.fit import fit_training, modelled
    from dmtp.data.tokens import is_store, store_of
    from dmtp.training.drafters import load_sequences, new_drafters, train_drafters

    mask_flag = a.mask_token_id is not None
    prof = _train_profile(a)
    variants = a.variants  # variant names, or the ablation's backbone runs (dflash2, dmtp_d2: a variant on a backbone)
    backbones = _backbone_runs(a, prof)
    run_variant = lambda r: backbones.get(r, (r,))[0]  # noqa: E731
    # --- everything checked before the target is loaded ---
    args.checkpoint(a.target, "--target", "target checkpoint")
    cfg_t = read_config(a.target)
    preflight.run(target_checks(a.target, mtp=any(get_variant(run_variant(v)).needs_mtp for v in variants)))
    out = args.out_dir(a.out)
    _check_shape(a, prof, cfg_t, mask_flag)
    init = args.init_from(a.init_from, a.variants, cfg_t)
    where = "--mask-token-id" if mask_flag else f"profile {a.profile}'s drafter.mask_token_id" if a.profile and \
        prof.drafter.mask_token_id >= 0 else "the default --mask-token-id"
    require(0 <= a.mask_token_id < cfg_t.vocab_size, f"{where} {a.mask_token_id}: expected a token id in "
            f"[0, {cfg_t.vocab_size}) (the target's vocabulary)")
    cfg = replace(prof.train if prof else TrainConfig(), steps=a.steps, batch_size=a.batch_size, max_len=a.max_len,
                  lr=a.lr, gamma=a.gamma, seed=a.seed, stop_after=a.stop_after, compile=a.compile)
    cfg = replace(cfg, **{k: getattr(a, k) for k in ("fsdp", "shard_target", "activation_checkpointing", "micro_batch",
                                                     "grad_sync") if getattr(a, k) is not None})
    data_path, data_sha = _train_data(a.data, cfg_t.vocab_size)
    base, configs, units = _drafter_units(a, prof, cfg_t, backbones, init, cfg, data_sha, out)
    if not a.force:
        stages.preflight(units)  # a finished or half-trained drafter of another configuration: refused, all at once
    _, _, rank_dev = dist.init()  # torchrun: one process per GPU, data-parallel over the global batch
    dev = rank_dev or args.device(a.device)
    todo = [v for v in variants if not (out / v / "DONE").exists()]
    if todo and torch.device(dev).type == "cuda" and modelled(cfg_t):  # the fit check, before any weight loads
        cfg, line = fit_training(cfg_t.to_dict(), [configs[v] for v in todo], cfg, dist.rank_world()[1],
                                 torch.cuda.get_device_properties(torch.device(dev)).total_memory)
        if dist.is_main():
            print(f"memory model: {line}")
    if not is_store(data_path):  # the JSONL as a token store in --out, converted once (rank 0), reused on reruns
        data_path = store_of(data_path, out / f"tokens-{data_sha[:16]}", cfg_t.vocab_size, sha256=data_sha)
    seqs = load_sequences(data_path, cfg.max_len, vocab_size=cfg_t.vocab_size)
    with contextlib.ExitStack() as held:
        if dist.is_main():  # (rank 0 writes): a second `dmtp train` on one of these drafters is refused
            for u in units:
                held.enter_context(one_writer(u.outputs[0]))
        for u in units:
            if not stages.check(u, a.force):
                stages.record(u)  # before training: a half-trained drafter is checked like a finished one
        dist.barrier()
        todo = [v for v in variants if not (out / v / "DONE").exists()]
        if not todo:
            print(f"nothing to train: {', '.join(variants)} already finished in {out} with this configuration")
            dist.destroy()
            return
        # --- the work ---
        tgt = Target.load(a.target, dtype=torch_dtype(a.dtype), device=dev)
        need_mtp = any(get_variant(run_variant(v)).needs_mtp for v in todo)  # dflash alone needs no MTP head
        mtp = MTPHead.load(tgt, a.target) if need_mtp else None
        drafters = new_drafters(tgt, todo, base, {v: p for v, p in init.items() if v in todo}, backbones=backbones,
                                variant_configs=prof.drafter.variants if prof is not None else {})
        train_drafters(tgt, mtp, drafters, seqs, cfg, out)
    dist.destroy()  # every rank closes its group together (left to interpreter exit, gloo can abort a rank)


def _backbone_runs(a, prof) -> dict[str, tuple[str, str]]:
    """`--variants`' runs on another backbone (run -> (variant, backbone)), each name checked against `--backbone`."""
    runs = {r: tuple(vb) for r, vb in (prof.ablation if prof else code()).backbones.items()}
    backbones = {r: vb for r, vb in runs.items() if r in a.variants}
    for v in a.variants:
        require(v in REGISTRY or v in backbones, f"--variants: unknown variant or run {v!r}; variants: "
                f"{', '.join(sorted(REGISTRY))}; runs on another backbone: "
                + ", ".join(f"{r} ({vb[0]} on {vb[1]})" for r, vb in runs.items()))
        if v in backbones and a.backbone not in (None, backbones[v][1]):
            raise ValueError(f"--backbone {a.backbone}: run {v!r} is {backbones[v][0]} on the {backbones[v][1]} "
                             "backbone")
    return backbones


def _check_shape(a, prof, cfg_t, mask_flag: bool) -> None:
    """The MASK token where neither flag nor profile gives one: the target family's (else 1); a profile's recipe only
    for the target it is made for."""
    if not mask_flag and not (prof is not None and prof.drafter.mask_token_id >= 0):
        a.mask_token_id = family_mask_token(cfg_t.model_type, cfg_t.vocab_size) or a.mask_token_id
    if prof is not None:
        check_made_for(prof, cfg_t, f"--target {a.target}", ": give this target's drafter shape by flags, without "
                       "--profile")


def _drafter_units(a, prof, cfg_t, backbones, init, cfg, data_sha: str, out: Path):
    """The drafter settings every run shares (`base`), each run's `DrafterConfig`, and each run's stage unit."""
    base = drafter_config(prof, cfg_t, a.mask_token_id) if prof is not None else \
        dict(hidden_size=cfg_t.hidden_size, vocab_size=cfg_t.vocab_size, num_target_layers=cfg_t.num_hidden_layers)
    shape = replace(prof.drafter if prof is not None else DrafterShape(), layers=a.layers, attention=a.attention,
                    sliding_window=a.sliding_window)  # the attention rule (a one-line error for a bad window)
    base.update(num_hidden_layers=a.layers, mask_token_id=a.mask_token_id, seed=a.seed, **shape.attention_fields(),
                **({"backbone": a.backbone} if a.backbone else {}))
    settings = prof.drafter.variants if prof is not None else {}
    data = {"sha256": data_sha}  # what the data holds, not where it lies (a store: its JSONL's digest)
    units, configs = [], {}
    for v in a.variants:
        variant = backbones.get(v, (v,))[0]
        over = dict(variant=variant, variant_config=settings.get(variant, {}),
                    **({"backbone": backbones[v][1]} if v in backbones else {}))
        configs[v] = dc = DrafterConfig(**{k: x for k, x in base.items() if k in DrafterConfig.__dataclass_fields__
                                           and k not in over}, **over)
        require(max(dc.target_layer_ids) < cfg_t.num_hidden_layers - 1, f"--layers {a.layers}: the drafter taps "
                f"target layers {dc.target_layer_ids}, the target has {cfg_t.num_hidden_layers}")
        init_id = {"init_modified": _modified(init[v])} if v in init else {}  # the file it names, as it is now
        want = stages.fingerprint(dict(train=cfg, drafter=dc, init_from=init.get(v), **init_id, dtype=a.dtype,
                                       data=data, target=str(Path(a.target).resolve()),
                                       target_modified=_modified(a.target)))
        units.append(stages.Unit(str(out / v), want, out / v / "fingerprint.json", [out / v]))
    return base, configs, units


def _train_data(path, vocab_size: int) -> tuple[Path, str]:
    """`dmtp train --data`: (path, sha256 of the data) of a token JSONL or a token store (whose digest is its source
    JSONL's, so either names the same data)."""
    from dmtp.data.tokens import is_store, open_store

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"--data {p}: no such file")
    if is_store(p):
        return p, open_store(p, vocab_size).meta["source"]["sha256"]
    require(not p.is_dir(), f"--data {p}: a folder that is not a token store (no store.json); expected a token JSONL "
                            "or a store made by `python -m dmtp.data.tokens`")
    check_decoded(p)
    return p, file_sha256(p)


_TRAIN_DEFAULTS = dict(steps=200, batch_size=8, max_len=512, layers=1, lr=6e-4, gamma=4.0, mask_token_id=1,
                       dtype="fp32", attention=DrafterShape.attention, sliding_window=DrafterShape.sliding_window)


def _train_profile(a):
    """`dmtp train --profile NAME`: the profile's recipe fills every flag not given explicitly."""
    prof = None
    d = dict(_TRAIN_DEFAULTS)
    if a.profile:
        prof = resolve(a.profile)
        t = prof.train
        d.update(steps=t.steps, batch_size=t.batch_size, max_len=t.max_len, layers=prof.drafter.layers, lr=t.lr,
                 gamma=t.gamma, dtype=prof.engine.dtype, attention=prof.drafter.attention,
                 sliding_window=prof.drafter.sliding_window)
        if prof.drafter.mask_token_id >= 0:
            d.update(mask_token_id=prof.drafter.mask_token_id)
    for k, v in d.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return prof


def command(module: str, name: str = "main"):
    """`dmtp.cli.<module>.<name>`, imported only when the subcommand runs."""
    def run(*a, **kw):
        return getattr(importlib.import_module(f"dmtp.cli.{module}"), name)(*a, **kw)
    return run


def generate_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--target", required=True)
    s.add_argument("--drafter")
    s.add_argument("--method", required=True, help="ar | mtp | a variant name (see `dmtp variants`)")
    s.add_argument("--prompts", help="JSONL with `id` and `prompt` (text) or `prompt_ids`")
    s.add_argument("--dataset", help="instead of --prompts: gsm8k | math500 | humaneval | alpaca | mtbench (two turns) "
                   "| openperfectblend, chat template applied")
    s.add_argument("--data-path", help="local copy of --dataset (default $DMTP_DATA_<NAME>, else the HF cache)")
    s.add_argument("--n", type=args.at_least(1), help="only the first N prompts")
    s.add_argument("--temperature", type=args.temperature, default=0.0,
                   help=f"0: greedy; >= {MIN_TEMPERATURE:g}: sampling")
    s.add_argument("--verify", default="target", choices=list(VERIFY_MODES), help="target: argmax drafts "
                   "(default); sample: token-wise speculative sampling; block: block verification")
    s.add_argument("--max-new-tokens", type=args.at_least(1), default=128)
    s.add_argument("--mtp-steps", type=args.at_least(1), default=4, help="chained MTP steps for method mtp")
    s.add_argument("--batch-size", type=args.at_least(1), default=16)
    s.add_argument("--eos", help="comma-separated EOS ids, or `none` (default: the target's config, generation "
                   "config and tokenizer ids)")
    s.add_argument("--mode", default="natural", choices=EVAL_MODES, help="natural: stop at EOS / --stop / length; "
                   "fixed: decode exactly --max-new-tokens")
    s.add_argument("--stop", action="append", metavar="TEXT", help="stop string, repeatable; 'humaneval' = the "
                   "standard HumanEval stop sequences")
    s.add_argument("--seed", type=args.SEED, default=0)
    s.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    s.add_argument("--engine", action="append", metavar="KEY=VALUE", default=[],
                   help="a decode-engine setting (EngineConfig, dmtp/config/engine.py), repeatable: "
                   "engine=hf|fast-eager|compiled, attention=flex|dense, cache_write=auto|graph|eager, "
                   "tuning=fixed|default|autotune, drafter=compiled|hf, graphs=true|false")
    s.add_argument("--device", help=DEVICE_HELP)
    s.add_argument("--out", required=True, help="records JSONL, appended batch by batch: a rerun resumes it")
    s.add_argument("--force", action="store_true", help="start --out afresh if made with another configuration")
    args.compile_cache_flag(s)


DEVICE_HELP = "cpu, cuda, cuda:N (default: cuda when available)"
AUTO_ON_OFF = ["auto", "on", "off"]


def train_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--target", required=True)
    s.add_argument("--data", required=True, help="token JSONL (`dmtp generate` output or lines with `ids`) or a "
                   "token store (`python -m dmtp.data.tokens`)")
    s.add_argument("--variants", type=args.names, default=["dflash"], help="comma-separated (see `dmtp variants`), "
                   "or the ablation's runs on another backbone (dflash2, dmtp_d2); each trained into --out/<name>")
    s.add_argument("--out", required=True)
    s.add_argument("--profile", help="drafter shape and training recipe of a profile; explicit flags override it")
    s.add_argument("--steps", type=args.at_least(1), help="optimizer steps (default 200)")
    s.add_argument("--batch-size", type=args.at_least(1), help="global batch over all GPUs (default 8)")
    s.add_argument("--max-len", type=args.at_least(4), help="sequences cut to this many tokens (default 512)")
    s.add_argument("--layers", type=args.at_least(1), help="drafter layers (default 1)")
    s.add_argument("--backbone", choices=["dflash", "dflash2"], help="drafter backbone (default: dflash)")
    s.add_argument("--attention", choices=list(DRAFTER_ATTENTION), help="anchor: the method's anchor window; public: "
                   "the public Qwen3.6 DFlash drafters' sliding + full layers (default: the profile's, else anchor)")
    s.add_argument("--sliding-window", type=args.at_least(1), help="sliding window under --attention public "
                   "(default: the profile's, else 2048)")
    s.add_argument("--lr", type=args.number(0, open_lo=True), help="peak learning rate (default 6e-4)")
    s.add_argument("--gamma", type=args.number(0, open_lo=True), help="loss decay over candidates (default 4)")
    s.add_argument("--mask-token-id", type=args.at_least(0), help="MASK slot token (default: the profile's, else "
                   "the target family's public DFlash id, else 1)")
    s.add_argument("--init-from", action="append", help="NAME=PATH,... continue a --variants entry from a "
                   "DFlash-format checkpoint (keeps its attention); repeatable")
    s.add_argument("--seed", type=args.SEED, default=0)
    s.add_argument("--stop-after", type=args.at_least(0), default=0,
                   help="checkpoint and stop after this step (resume later)")
    s.add_argument("--compile", choices=AUTO_ON_OFF, default="auto", help="compiled training (auto: on CUDA only)")
    s.add_argument("--fsdp", choices=AUTO_ON_OFF, help="FSDP2 sharding of the drafters (auto: under torchrun with "
                   "more than one rank)")
    s.add_argument("--shard-target", choices=AUTO_ON_OFF, help="under FSDP2, shard the frozen target too (auto: as "
                   "the memory model decides)")
    s.add_argument("--activation-checkpointing", action="store_true", default=None,
                   help="recompute each drafter layer in the backward pass (less memory, more time)")
    s.add_argument("--micro-batch", type=args.at_least(1), help="sequences per GPU per forward/backward; gradient "
                   "accumulation reaches --batch-size (default: the memory model's choice on CUDA)")
    s.add_argument("--grad-sync", choices=["auto", "last", "every"], help="under FSDP2 with accumulation, reduce "
                   "after the last micro-batch or every one (less memory) (auto: as the memory model decides)")
    s.add_argument("--dtype", choices=["fp32", "bf16"], help="target precision (default fp32)")
    s.add_argument("--device", help=DEVICE_HELP)
    s.add_argument("--force", action="store_true", help="retrain drafters in --out started with another "
                   "configuration")
    args.compile_cache_flag(s)


def pipeline_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--profile", default=None, help="tiny | mini (default: mini with CUDA, else tiny)")
    s.add_argument("--stage", default="all")
    s.add_argument("--work", default="work", help="where checkpoints and intermediate data go")
    s.add_argument("--results", default="results")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a profile field, e.g. pretrain.tokens=20000000 (repeatable)")
    s.add_argument("--force", action="store_true", help="redo stages recorded with another configuration "
                   "(default: refuse, naming the fields)")
    s.add_argument("--deadline", type=args.number(0, open_lo=True), metavar="SECONDS",
                   help="finish within SECONDS of wall time: optional stages that would not finish are left out, "
                        "the running one stops at the deadline less --reserve; rerun to resume (exit 3)")
    s.add_argument("--reserve", type=args.number(0), default=30.0, metavar="SECONDS",
                   help="with --deadline: seconds kept for packing the results (default 30)")
    s.add_argument("--costs", metavar="FILE", help="with --deadline: JSON stage -> seconds (default: the times "
                   "measured in work/<profile>/stage_times.json)")
    s.add_argument("--archive", metavar="FILE.tgz", help="pack results/<profile> into this archive after each "
                   "stage; `dmtp land FILE.tgz` lands it elsewhere")
    args.compile_cache_flag(s)


def land_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("archive", help="the .tgz written by `dmtp pipeline --archive`")
    s.add_argument("--results", default="results")
    s.add_argument("--partial", action="store_true", help="land an unfinished run apart, as "
                   "<profile>/partial/... (the pooled report never reads it)")
    s.add_argument("--no-report", action="store_true", help="do not render the landed run's REPORT.md")


def dryrun_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--profile", required=True, help="qwen3.6-27b | qwen3.6-35b-a3b")
    s.add_argument("--target", help="checkpoint whose config.json to check (default: the profile's env var, else "
                   "its config)")
    s.add_argument("--gpus", type=args.at_least(1), help="GPUs to train on: whether training and evaluation fit "
                   "(dmtp/memory.py) (default with --gpu-mem: 1)")
    s.add_argument("--gpu-mem", type=args.number(0, open_lo=True), help="GiB per GPU as sold: 80 (H100), 141 "
                   "(H200) (default with --gpus: 80)")
    s.add_argument("--seq-len", type=args.at_least(4), help="tokens per training sequence (default: the profile's "
                   "scale.max_seq_len)")
    s.add_argument("--rates", action="append", default=[], metavar="FILE", help="a rates file "
                   "(experiments/paper_rates.py; repeatable): each stage's projected wall time on --gpus (default 8)")


def reproduce_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--profile", required=True, help="qwen3.6-27b | qwen3.6-35b-a3b | open-tiny (CPU, toy size)")
    s.add_argument("--target", required=True, help="local target checkpoint (HF layout, mtp.* weights, tokenizer)")
    s.add_argument("--work", help="where everything goes (default runs/<profile>)")
    s.add_argument("--data-path", action="append", metavar="SET=PATH", default=[], help="local copy of a set, "
                   "repeatable: openperfectblend, gsm8k, math500, humaneval, alpaca, mtbench")
    s.add_argument("--prompts", help="training prompts instead of OpenPerfectBlend (.jsonl / .parquet)")
    s.add_argument("--init-from", action="append", metavar="[RUN=]PATH", default=[],
                   help="continue a drafter run from a public DFlash checkpoint (bare PATH: zero_init_residual)")
    s.add_argument("--train-group", type=args.at_least(0), default=0, help="drafters trained side by side per pass "
                   "(default 0: on GPUs the largest groups that fit, else all; 1: least memory)")
    s.add_argument("--stage", default="all", help="regen,train,eval,report or all (default)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a profile field, e.g. eval.new_tokens=128 (repeatable)")
    s.add_argument("--device", help=DEVICE_HELP + "; under torchrun: the rank's")
    s.add_argument("--force", action="store_true", help="redo outputs made with another configuration")
    args.compile_cache_flag(s)


def _land(a):
    return command("archive", "land")(a.archive, a.results, partial=a.partial, report=not a.no_report)


def _dryrun(a):
    sys.exit(command("dryrun")(a))


COMMANDS = {  # `dmtp NAME`: (help, the arguments it takes, what it runs)
    "variants": ("list the injection variants", None, cmd_variants),
    "generate": ("decode prompts with one method through the single decode loop", generate_arguments, cmd_generate),
    "train": ("train drafters (several variants on identical batches)", train_arguments, cmd_train),
    "pipeline": ("embedded default end to end (corpus -> target -> drafters -> tables)", pipeline_arguments,
                 command("pipeline")),
    "land": ("land a packed run (`dmtp pipeline --archive`) into results/", land_arguments, _land),
    "dryrun": ("paper-scale profile on the meta device: shape checks and a parameter summary, no weights",
               dryrun_arguments, _dryrun),
    "reproduce": ("the blog's open reproduction on a local target: regen -> train -> eval -> report, resumable",
                  reproduce_arguments, command("reproduce")),
}


def parser() -> argparse.ArgumentParser:
    """Every `dmtp` command's arguments: one subcommand a row of `COMMANDS` (README's commands are checked against
    it)."""
    p = argparse.ArgumentParser(prog="dmtp", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, (help_, arguments, run) in COMMANDS.items():
        s = sub.add_parser(name, help=help_)
        if arguments is not None:
            arguments(s)
        s.set_defaults(fn=run)
    return p


def main(argv=None):
    a = parser().parse_args(argv)
    args.guard(f"dmtp {a.cmd}", _run, a)


def _run(a):
    """The command, its compile caches pointed at `--compile-cache` first (before anything compiles)."""
    args.use_compile_cache(getattr(a, "compile_cache", None))
    return a.fn(a)


def run_as_command() -> None:
    """`main()` as `python -m dmtp.cli[.main]` runs it. A rank of a torchrun launch (WORLD_SIZE > 1) leaves with the
    command's exit status but without the interpreter's finalization: freeing gloo's finished work objects then aborts
    the rank (SIGABRT) after its work is done. An uncaught exception still ends with its traceback."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        main()
        return
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code or 0
    if not isinstance(code, int):  # SystemExit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_as_command()
