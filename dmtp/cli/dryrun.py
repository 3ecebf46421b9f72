"""Paper-scale dry run: the target (from its config only), the native MTP head and a drafter of every variant and
backbone built on the meta device (no weights, no memory); shape checks and a parameter summary.

    dmtp dryrun --profile qwen3.6-27b                       # the profile's config (model card values)
    dmtp dryrun --profile qwen3.6-35b-a3b --target /ckpt    # the checkpoint's own config.json, compared to the profile
    dmtp dryrun --profile qwen3.6-27b --gpus 8 --gpu-mem 80 --seq-len 32768   # + whether training and evaluation fit
    dmtp dryrun --profile qwen3.6-27b --gpus 8 --rates results/qwen3.6-27b/rates/h200/rates.json   # + the time

With --gpus / --gpu-mem, the memory model (`dmtp.memory`) says whether training one drafter fits and with which
setting, how the training stage would train the ablation's drafters (side by side, or the groups `dmtp reproduce`
trains one after another), and whether evaluation fits; where one does not, what would (the fewest `CARDS`).
With --rates FILE (rates measured at the paper's depth, `experiments/paper_rates.py`), the projected wall time of
each stage on --gpus such cards (`analysis.projection.project_rates`), labelled a projection.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from dmtp import preflight
from dmtp.analysis.projection import project_rates, read_rates, render_rates
from dmtp.checks import gist, require
from dmtp.cli.fit import fit_groups, plan_for, run_configs
from dmtp.experiment import drafter_config
from dmtp.memory import GIB, capacity, plan_eval, plan_training
from dmtp.models import torch_dtype
from dmtp.models.drafter import BACKBONES, Drafter, DrafterConfig, check_compatible
from dmtp.models.mtp import MTPHead, mtp_num_layers
from dmtp.models.target import Target, read_config, target_checks
from dmtp.models.variants import REGISTRY
from dmtp.training.drafters import spec_of
from dmtp.profiles import check_made_for, resolve


def _text_config(path: str | None, prof, flag: str = "--target"):
    """(HF text config, source, mismatches vs the profile). A checkpoint's config.json wins over the profile's; a
    checkpoint named without one is an error."""
    want = dict(prof.scale.target_config)
    if path:
        if not (Path(path) / "config.json").exists():
            raise FileNotFoundError(f"{flag} {path}: no config.json there (expected the target checkpoint's folder)")
        cfg = read_config(path)
        if any(Path(path).glob("*.safetensors")):  # a checkpoint with its weights: they must be what config.json says
            preflight.run(target_checks(path, mtp=mtp_num_layers(cfg) >= 1, flag=flag))
        got = cfg.to_dict()
        bad = {k: (v, got.get(k)) for k, v in want.items() if k in got and k != "model_type" and got.get(k) != v}
        return cfg, str(Path(path) / "config.json"), bad
    kw = dict(want)
    return AutoConfig.for_model(kw.pop("model_type"), **kw), f"profile {prof.name} (model card values)", {}


def _n(module) -> int:
    return sum(p.numel() for p in module.parameters())


def dryrun(profile: str, target: str | None = None, backbones=None, gpus: int | None = None,
           gpu_mem: float | None = None, seq_len: int | None = None) -> dict:
    """{"checks": [(name, ok, detail)], "params": {...}, "fit": {...} or None, ...}; a failed check raises nothing.
    gpus / gpu_mem (GiB per card): the fit section, at seq_len tokens per sequence (default: the profile's)."""
    prof = resolve(profile)
    sc = prof.scale
    require(sc.target_config, f"profile {profile!r} has no paper-scale target config (dry runs are for paper-scale "
                              "profiles)")
    flag = "--target" if target else f"${sc.target_env}"
    target = target or (os.environ.get(sc.target_env) if sc.target_env else None)
    cfg, source, mismatch = _text_config(target, prof, flag)
    check_made_for(prof, cfg, f"{flag} {target}")
    dtype = torch_dtype(prof.engine.dtype)
    checks = []

    def check(name, ok, detail=""):
        checks.append((name, bool(ok), detail))

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
            tgt = Target(model)
            mtp = MTPHead(tgt)
    except Exception as e:  # a config its model class cannot build: named, not a traceback
        raise ValueError(f"{source}: the target and its MTP head cannot be built from it ({type(e).__name__}: "
                         f"{gist(e)})") from None
    H = tgt.hidden_size
    check("config matches profile", not mismatch, ", ".join(f"{k}: {_differ(a, b)}" for k, (a, b) in
                                                              mismatch.items()))
    check("layer types known", set(tgt.layer_types) <= {"full_attention", "linear_attention"},
          f"{tgt.layer_types.count('linear_attention')} linear + {tgt.layer_types.count('full_attention')} full")
    check("native MTP declared", mtp_num_layers(cfg) >= 1, f"mtp layers {mtp_num_layers(cfg)}")
    check("MTP fc [H, 2H]", tuple(mtp.fc.weight.shape) == (H, 2 * H), str(tuple(mtp.fc.weight.shape)))
    check("MTP layer is full attention", hasattr(mtp.layers[0], "self_attn"))
    mask = prof.drafter.mask_token_id
    check("mask token inside the vocabulary", 0 <= mask < tgt.vocab_size, str(mask))

    drafters = _drafter_checks(prof, tgt, backbones or BACKBONES, dtype, check)
    body = tgt.body
    layers = lambda kind: sum(_n(la) for la, t in zip(body.layers, tgt.layer_types) if t == kind)  # noqa: E731
    params = {"target": _n(model), "target_embedding": body.embed_tokens.weight.numel(),
              "target_lm_head": model.lm_head.weight.numel(),
              "target_linear_attention_layers": layers("linear_attention"),
              "target_full_attention_layers": layers("full_attention"),
              "mtp": _n(mtp), "drafters": {k: _n(d) for k, d in drafters.items()}}
    fit = fit_section(prof, cfg, [d.config for d in drafters.values()], gpus or 1, gpu_mem or 80,
                      seq_len or sc.max_seq_len) if gpus is not None or gpu_mem is not None else None
    return {"profile": prof, "source": source, "target_path": target, "config": cfg, "checks": checks,
            "params": params, "taps": next(iter(drafters.values())).config.target_layer_ids, "fit": fit,
            "ok": all(ok for _, ok, _ in checks) and (fit is None or fit["train"].fits)}


def _drafter_checks(prof, tgt, backbones, dtype, check) -> dict:
    """Every variant on every backbone built on the meta device ("backbone/variant" -> drafter), checked against
    `tgt` through `check`."""
    H, L = tgt.hidden_size, tgt.num_layers
    drafters = {}
    base = drafter_config(prof, tgt.config)
    for bb in backbones:
        for v in sorted(REGISTRY):
            c = DrafterConfig(**base, variant=v, backbone=bb, variant_config=prof.drafter.variants.get(v, {}))
            with torch.device("meta"):
                d = Drafter(c).to(dtype)
            name = f"{bb}/{v}"
            drafters[name] = d
            K = len(c.target_layer_ids)
            try:
                check_compatible(d, tgt)
                check(f"{name}: drafter hidden == target hidden", d.config.hidden_size == H)
            except ValueError as e:
                check(f"{name}: compatible with the target", False, str(e))
            check(f"{name}: taps < L-1", all(0 <= t < L - 1 for t in c.target_layer_ids), str(c.target_layer_ids))
            check(f"{name}: fc in = K*H", tuple(d.fc.weight.shape) == (H, K * H), f"{tuple(d.fc.weight.shape)}, K={K}")
            check(f"{name}: layers", len(d.layers) == prof.drafter.layers, str(len(d.layers)))
    return drafters


CARDS = (80, 141)  # the cards the suite plans for, GiB as sold: H100 / A100 80 GB, H200 141 GB
COUNTS = (1, 2, 4, 8, 16)  # card counts searched for the fewest that fit (one node, then two)


def fewest_cards(target_config: dict, one, t, seq_len: int) -> list[tuple[float, object]]:
    """For each card of `CARDS`: (GiB, the plan on the fewest cards of `COUNTS` that trains the drafter `one`, or
    None)."""
    out = []
    for gb in CARDS:
        plan = next((p for n in COUNTS if t.batch_size % n == 0 and (p := plan_training(
            target_config, one, gpus=n, gpu_gb=gb, global_batch=t.batch_size, seq_len=seq_len,
            anchors=t.anchors_per_seq, fused_ce=t.fused_ce, ce_chunk=t.ce_chunk)).fits), None)
        out.append((gb, plan))
    return out


def would_fit(f: dict) -> list[str]:
    """The lines naming what would fit, for a fit section where training or evaluation does not."""
    out = []
    if not f["train"].fits:
        said = [f"{p.setting.world} x {gb} GiB (micro-batch {p.setting.micro_batch} x {p.accumulation} accumulation, "
                f"target {'sharded' if p.setting.shard_target else 'replicated'}, activation checkpointing "
                f"{'on' if p.setting.checkpointing else 'off'})" if p else f"no count up to {COUNTS[-1]} of {gb} GiB"
                for gb, p in f["fewest"]]
        out.append("  what would fit training one drafter, the fewest cards of each kind: " + "; ".join(said))
    if not f["eval_ok"]:
        fits = [gb for gb, ok in f["eval_cards"] if ok]
        out.append(f"  what would fit evaluation at batch {f['eval_batch']}: "
                   + (f"a card of {' or '.join(f'{gb} GiB' for gb in fits)}" if fits else
                      f"no card of {' or '.join(f'{gb} GiB' for gb in CARDS)} (a smaller batch or shorter sequences)"))
    return out


def fit_section(prof, target, configs, gpus: int, gpu_mem: float, seq_len: int) -> dict:
    """The memory model's answers on `gpus` cards of `gpu_mem` GiB: the best training setting for one dflash drafter
    (`plan_training`), the training stage's plan for the ablation's runs side by side (`cli.fit.plan_for`) or, where
    they do not fit, its groups (`cli.fit.fit_groups`), and evaluation over seq_len + new tokens. configs: every
    drafter built."""
    t, target_config = replace(prof.train, max_len=seq_len), target.to_dict()
    one = spec_of([c for c in configs if c.backbone == "dflash"] or configs)  # the paper's drafter
    kw = dict(gpus=gpus, gpu_gb=gpu_mem, seq_len=seq_len, anchors=t.anchors_per_seq, fused_ce=t.fused_ce,
              ce_chunk=t.ce_chunk)
    train = plan_training(target_config, one, global_batch=t.batch_size, **kw)
    a = prof.ablation
    runs = run_configs(prof, target, a.selected(a.variants) + a.selected(tuple(a.backbones)))
    loop = groups = refused = None
    if t.batch_size % gpus == 0 and runs:
        loop = plan_for(target_config, list(runs.values()), t, gpus, gpu_mem * GIB)
        if not loop.fits:
            try:
                groups = fit_groups(target_config, runs, t, gpus, gpu_mem * GIB)
            except ValueError as e:  # not even one run alone: the training stage's one-line refusal
                refused = str(e)
    length = seq_len + prof.eval.new_tokens
    ok, ev = plan_eval(target_config, one, gpu_gb=gpu_mem, batch=prof.eval.batch, length=length)
    most = next((b for b in range(prof.eval.batch, 0, -1)
                 if plan_eval(target_config, one, gpu_gb=gpu_mem, batch=b, length=length)[0]), 0)
    fewest = fewest_cards(target_config, one, t, seq_len) if not train.fits else []
    eval_cards = [(gb, plan_eval(target_config, one, gpu_gb=gb, batch=prof.eval.batch, length=length)[0])
                  for gb in CARDS] if not ok else []
    return {"gpus": gpus, "gpu_mem": gpu_mem, "seq_len": seq_len, "global_batch": t.batch_size, "train": train,
            "loop": loop, "loop_drafters": len(runs), "groups": groups, "refused": refused, "eval_ok": ok, "eval": ev,
            "eval_length": length, "eval_batch": prof.eval.batch, "eval_most": most, "capacity": capacity(gpu_mem),
            "fewest": fewest, "eval_cards": eval_cards}


def render(r: dict) -> str:
    p, sc, cfg, P = r["profile"], r["profile"].scale, r["config"], r["params"]
    d = p.drafter
    b = lambda n: f"{n / 1e9:7.3f} B"  # noqa: E731
    types = cfg.layer_types if getattr(cfg, "layer_types", None) else ["full_attention"] * cfg.num_hidden_layers
    lines = [
        f"profile {p.name}: target {cfg.model_type} from {r['source']} (meta device, no weights)",
        f"  target path: {r['target_path'] or f'${sc.target_env} (unset) or --target'}",
        f"  hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers ({types.count('linear_attention')} linear "
        f"attention + {types.count('full_attention')} full attention), {cfg.num_attention_heads} q / "
        f"{cfg.num_key_value_heads} kv heads x {cfg.head_dim}, vocab {cfg.vocab_size}"
        + (f", {cfg.num_experts} experts (top {cfg.num_experts_per_tok})" if hasattr(cfg, "num_experts") else ""),
        "",
        "parameters",
        f"  target              {b(P['target'])}   (embedding {b(P['target_embedding']).strip()}, LM head "
        f"{b(P['target_lm_head']).strip()}, GDN-layer blocks {b(P['target_linear_attention_layers']).strip()}, "
        f"attention-layer blocks {b(P['target_full_attention_layers']).strip()})",
        f"  native MTP head     {b(P['mtp'])}   (frozen)",
        f"  drafters ({d.layers} layers, {d.heads}/{d.kv_heads} heads x {d.head_dim}, FFN {d.intermediate}, "
        f"taps {r['taps']}, block {d.block_size}, window {d.window}, mask {d.mask_token_id}), trained:",
    ]
    lines += [f"    {k:<34}{b(v)}" for k, v in P["drafters"].items()]
    t = p.train
    lines += ["", f"training: {sc.train_set}, {sc.epochs} epochs x {sc.train_prompts} prompts / global batch "
                  f"{sc.global_batch} = {t.steps} steps; sequences <= {sc.max_seq_len}; {p.engine.dtype}; "
                  f"AdamW lr {t.lr}, warmup {t.warmup_frac:.0%}, cosine, clip {t.clip}; gamma {t.gamma}",
              f"evaluation: {', '.join(f'{k} ({n})' for k, n in p.eval.sets.items())}; T = "
              f"{', '.join(map(str, p.eval.temperatures))}; {p.eval.new_tokens} new tokens", ""]
    bad = [c for c in r["checks"] if not c[1]]
    lines.append(f"checks: {len(r['checks']) - len(bad)}/{len(r['checks'])} ok")
    lines += [f"  FAILED {n}: {d}" for n, _, d in bad]
    if sc.assumptions:
        lines.append("assumptions (not stated by the model card): " + "; ".join(sc.assumptions))
    f = r.get("fit")
    if f:
        gb = lambda x: f"{x / 1e9:.1f}"  # noqa: E731
        lines += ["", f"fit on {f['gpus']} GPU(s) of {f['gpu_mem']:g} GiB ({gb(f['capacity'])} GB planned per GPU), "
                      f"sequences of {f['seq_len']:,} tokens, {t.anchors_per_seq} anchors each, global batch "
                      f"{f['global_batch']} (dmtp/memory.py):",
                  f"  training, one drafter: {f['train'].line()}"]
        if f["loop"] is not None:
            lines.append(f"  training the ablation's {f['loop_drafters']} drafters side by side (the training stage's "
                         f"plan: micro-batch chosen, checkpointing {'on' if t.activation_checkpointing else 'off'} "
                         f"as the profile sets it): {f['loop'].line()}")
            if f["groups"]:
                lines.append(f"  in groups of {len(f['groups'][0][0])} (what `dmtp reproduce` trains one after "
                             "another; --train-group overrides):")
                lines += [f"    {','.join(g)}: {line}" for g, _, line in f["groups"]]
            elif f["refused"]:
                lines.append(f"  not even one of them alone: {f['refused']}")
        else:
            lines.append(f"  training as the training stage runs it: global batch {t.batch_size} does not divide "
                         f"over {f['gpus']} GPUs")
        ev = f["eval"]
        lines.append(f"  evaluation (batch {f['eval_batch']}, {f['eval_length']:,} positions): "
                     f"{'fits' if f['eval_ok'] else 'does NOT fit'}: {gb(ev['total'])} GB of {gb(f['capacity'])} "
                     f"GB per GPU (" + ", ".join(f"{k} {gb(v)}" for k, v in ev.items() if k != "total") + "); "
                     + (f"the largest batch that fits: {f['eval_most']}" if f["eval_most"] else
                        "not even one sequence fits"))
        lines += would_fit(f)
    return "\n".join(lines)


def _differ(a, b) -> str:
    """A profile value against the checkpoint's, in words; a long list by its length or first differing entry."""
    if isinstance(a, list) and isinstance(b, list) and max(len(a), len(b)) > 8:
        if len(a) != len(b):
            return f"profile {len(a)} entries != {len(b)}"
        i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        return f"profile [{i}] {a[i]!r} != {b[i]!r}"
    return f"profile {a} != {b}"


def read_rates_files(paths, profile: str) -> list[tuple[str, dict]]:
    """The --rates files, checked before any work (`projection.read_rates`); one of another profile is refused."""
    out = []
    for p in paths:
        try:
            r = read_rates(p)
        except ValueError as e:
            raise ValueError(f"--rates {e}") from None
        if r.get("profile") != profile:
            raise ValueError(f"--rates {p}: measured on a stand-in of {r.get('profile')!r}, not --profile {profile}")
        out.append((str(p), r))
    return out


def projections(rates: list[tuple[str, dict]], gpus: int) -> str:
    return "\n\n".join(render_rates(project_rates(r, gpus=gpus), source=p) for p, r in rates)


def main(a) -> int:
    rates = read_rates_files(getattr(a, "rates", None) or [], a.profile)
    r = dryrun(a.profile, a.target, gpus=a.gpus, gpu_mem=a.gpu_mem, seq_len=a.seq_len)
    print(render(r))
    if rates:
        print("\n" + projections(rates, a.gpus or 8))
    return 0 if r["ok"] else 1
