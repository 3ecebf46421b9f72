"""Paper-scale dry run: build the target (from its config only), the native MTP head and a drafter of every variant
and backbone on the meta device (no weights, no memory), check that the pieces fit, print a parameter summary.

    dmtp dryrun --profile qwen3.6-27b                       # the profile's config (model card values)
    dmtp dryrun --profile qwen3.6-35b-a3b --target /ckpt    # the checkpoint's own config.json, compared to the profile
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from dmtp.experiment import drafter_config
from dmtp.models import torch_dtype
from dmtp.models.drafter import BACKBONES, Drafter, DrafterConfig, check_compatible
from dmtp.models.mtp import MTPHead, mtp_num_layers
from dmtp.models.target import Target, read_config
from dmtp.models.variants import REGISTRY
from experiments.profiles import resolve


def _text_config(path: str | None, prof, flag: str = "--target"):
    """(HF text config, source, mismatches vs the profile). A checkpoint's config.json wins over the profile's dict;
    a checkpoint named (`flag`) without one is an error, never replaced by the profile's."""
    from transformers import AutoConfig

    want = dict(prof.scale.target_config)
    if path:
        if not (Path(path) / "config.json").exists():
            raise FileNotFoundError(f"{flag} {path}: no config.json there (expected the target checkpoint's folder)")
        cfg = read_config(path)
        got = cfg.to_dict()
        bad = {k: (v, got.get(k)) for k, v in want.items() if k in got and k != "model_type" and got.get(k) != v}
        return cfg, str(Path(path) / "config.json"), bad
    kw = dict(want)
    return AutoConfig.for_model(kw.pop("model_type"), **kw), f"profile {prof.name} (model card values)", {}


def _n(module) -> int:
    return sum(p.numel() for p in module.parameters())


def dryrun(profile: str, target: str | None = None, backbones=None) -> dict:
    """Returns {"checks": [(name, ok, detail)], "params": {...}, ...}; raises nothing on a failed check."""
    from transformers import AutoModelForCausalLM

    prof = resolve(profile)
    sc = prof.scale
    if not sc.target_config:
        raise ValueError(f"profile {profile!r} has no paper-scale target config (dry runs are for paper-scale "
                         "profiles)")
    flag = "--target" if target else f"${sc.target_env}"
    target = target or (os.environ.get(sc.target_env) if sc.target_env else None)
    cfg, source, mismatch = _text_config(target, prof, flag)
    dtype = torch_dtype(prof.engine.dtype)
    checks = []

    def check(name, ok, detail=""):
        checks.append((name, bool(ok), detail))

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        tgt = Target(model)
        mtp = MTPHead(tgt)
    H, L = tgt.hidden_size, tgt.num_layers
    check("config matches profile", not mismatch, ", ".join(f"{k}: profile {a} != {b}" for k, (a, b) in
                                                              mismatch.items()))
    check("layer types known", set(tgt.layer_types) <= {"full_attention", "linear_attention"},
          f"{tgt.layer_types.count('linear_attention')} linear + {tgt.layer_types.count('full_attention')} full")
    check("native MTP declared", mtp_num_layers(cfg) >= 1, f"mtp layers {mtp_num_layers(cfg)}")
    check("MTP fc [H, 2H]", tuple(mtp.fc.weight.shape) == (H, 2 * H), str(tuple(mtp.fc.weight.shape)))
    check("MTP layer is full attention", hasattr(mtp.layers[0], "self_attn"))
    mask = prof.drafter.mask_token_id
    check("mask token inside the vocabulary", 0 <= mask < tgt.vocab_size, str(mask))

    drafters = {}
    base = drafter_config(prof, tgt.config)
    for bb in backbones or BACKBONES:
        for v in sorted(REGISTRY):
            c = DrafterConfig(**base, variant=v, backbone=bb,
                              variant_config=prof.drafter.variants.get(v, {}))
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
    body = tgt.body
    params = {
        "target": _n(model), "target_embedding": body.embed_tokens.weight.numel(),
        "target_lm_head": model.lm_head.weight.numel(),
        "target_linear_attention_layers": sum(_n(la) for la, t in zip(body.layers, tgt.layer_types)
                                              if t == "linear_attention"),
        "target_full_attention_layers": sum(_n(la) for la, t in zip(body.layers, tgt.layer_types)
                                            if t == "full_attention"),
        "mtp": _n(mtp), "drafters": {k: _n(d) for k, d in drafters.items()},
    }
    return {"profile": prof, "source": source, "target_path": target, "config": cfg, "checks": checks,
            "params": params, "taps": next(iter(drafters.values())).config.target_layer_ids,
            "ok": all(ok for _, ok, _ in checks)}


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
                  f"AdamW lr {t.lr}, "
                  f"warmup {t.warmup_frac:.0%}, cosine, clip {t.clip}; gamma {t.gamma}",
              f"evaluation: {', '.join(f'{k} ({n})' for k, n in p.eval.sets.items())}; T = "
              f"{', '.join(map(str, p.eval.temperatures))}; {p.eval.new_tokens} new tokens", ""]
    bad = [c for c in r["checks"] if not c[1]]
    lines.append(f"checks: {len(r['checks']) - len(bad)}/{len(r['checks'])} ok")
    lines += [f"  FAILED {n}: {d}" for n, _, d in bad]
    if sc.assumptions:
        lines.append("assumptions (not stated by the model card): " + "; ".join(sc.assumptions))
    return "\n".join(lines)


def main(a) -> int:
    r = dryrun(a.profile, a.target)
    print(render(r))
    return 0 if r["ok"] else 1
