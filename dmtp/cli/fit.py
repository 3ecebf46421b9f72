"""The fit check of drafter training (`dmtp train`, the pipeline's drafters stage, `dmtp reproduce`): before any
weight loads, the memory model (`dmtp.memory`) plans the training on the GPUs from the target's config and the
drafters' shapes. It chooses what the configuration leaves to it (`micro_batch` 0, `shard_target` and `grad_sync`
"auto", the drafter groups of `dmtp reproduce`) and refuses, in one line with the numbers and what would fit, a
setting that cannot fit."""
from __future__ import annotations

from dataclasses import replace

from dmtp.config import Profile, TrainConfig
from dmtp.experiment import drafter_config
from dmtp.memory import GIB, check_training, plan_training
from dmtp.models.drafter import DrafterConfig
from dmtp.training.drafters import spec_of


def modelled(target_config) -> bool:
    """Whether the memory model describes this target (its HF config: the Qwen3 / Qwen3.5 / Qwen3.6 families)."""
    return str(getattr(target_config, "model_type", "")).startswith("qwen3")


def fit_training(target_config: dict, configs: list[DrafterConfig], cfg: TrainConfig, world: int,
                 gpu_bytes: int) -> tuple[TrainConfig, str]:
    """(cfg resolved, the plan's line) for training `configs` side by side on `world` GPUs of `gpu_bytes` each: what
    the user left to the model is chosen (`micro_batch` 0: the largest that fits, the rest by accumulation), what
    they set is kept; a ValueError in one line naming what would fit where that cannot fit."""
    plan = plan_for(target_config, configs, cfg, world, gpu_bytes)
    if plan.fits:
        s = plan.setting
        chosen = {"shard_target": "on" if s.shard_target else "off", "grad_sync": s.grad_sync}
        auto = {k: v for k, v in chosen.items() if getattr(cfg, k) == "auto"}
        return replace(cfg, micro_batch=s.micro_batch, **auto), plan.line()
    d, gb = spec_of(configs), gpu_bytes / GIB
    best = plan_training(target_config, d, gpus=world, gpu_gb=gb, global_batch=cfg.batch_size, drafters=len(configs),
                         seq_len=cfg.max_len, anchors=cfg.anchors_per_seq, fused_ce=cfg.fused_ce,
                         ce_chunk=cfg.ce_chunk, shard_drafters=plan.setting.shard_drafters)
    if best.fits:
        s = best.setting
        fix = (f"the model fits it with --micro-batch {s.micro_batch} (x {best.accumulation} accumulation) "
               f"--shard-target {'on' if s.shard_target else 'off'}"
               f"{' --activation-checkpointing' if s.checkpointing else ''}"
               f"{' --grad-sync every' if not s.defer_sync and best.accumulation > 1 else ''}")
    else:
        fix = ("nothing fits even one sequence per GPU: more or larger GPUs, fewer drafters side by side, a shorter "
               "--max-len or fewer anchors")
    raise ValueError(f"training {len(configs)} drafter(s) on {world} GPU(s) of {gb:.0f} GiB {plan.line()}; {fix}")


def plan_for(target_config: dict, configs: list[DrafterConfig], cfg: TrainConfig, world: int, gpu_bytes: int):
    """The memory model's plan (`memory.Plan`) for `cfg` as set; what it leaves to the model is searched."""
    return check_training(target_config, spec_of(configs), world=world, gpu_gb=gpu_bytes / GIB,
                          batch_size=cfg.batch_size, seq_len=cfg.max_len, anchors=cfg.anchors_per_seq, fsdp=cfg.fsdp,
                          shard_target=cfg.shard_target, checkpointing=cfg.activation_checkpointing,
                          fused_ce=cfg.fused_ce, ce_chunk=cfg.ce_chunk, drafters=len(configs),
                          micro_batch=cfg.micro_batch, grad_sync=cfg.grad_sync)


def fit_groups(target_config: dict, configs: dict[str, DrafterConfig], cfg: TrainConfig, world: int,
               gpu_bytes: int, size: int = 0) -> list[tuple[list[str], TrainConfig, str]]:
    """The runs `configs` (name -> config, in training order) in groups trained side by side, each with its
    resolved config and plan line (`fit_training`): `size` runs a group, else the largest size at which every group
    fits (all at once first: the target's features computed once). A ValueError where one run alone cannot fit."""
    names = list(configs)
    sizes = [size] if size else range(len(names), 0, -1)
    err = None
    for k in sizes:
        groups = [names[i: i + k] for i in range(0, len(names), k)]
        try:
            return [(g, *fit_training(target_config, [configs[n] for n in g], cfg, world, gpu_bytes)) for g in groups]
        except ValueError as e:  # the smallest size's refusal is the one reported
            err = e
    raise err


def run_configs(p: Profile, target_config, runs) -> dict[str, DrafterConfig]:
    """The DrafterConfig of each run of `p`'s ablation on a target (its HF text config), as trained: a backbone
    run's from `ablation.backbones`, a continued run's its source's, the others their name's variant."""
    spec = p.ablation
    base = {k: v for k, v in drafter_config(p, target_config, 0).items() if k in DrafterConfig.__dataclass_fields__}
    out = {}
    for r in runs:
        variant, backbone = spec.backbones.get(r, (r, base.get("backbone", "dflash")))
        if r in spec.continued and r not in spec.variants and r not in spec.backbones:
            variant = spec.continued[r][0]
        out[r] = DrafterConfig(**{**base, "backbone": backbone}, variant=variant,
                               variant_config=p.drafter.variants.get(variant, {}))
    return out
