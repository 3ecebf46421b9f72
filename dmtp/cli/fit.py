"""The fit check of the training stage (`dmtp train`, the pipeline's drafters stage): before any weight is loaded,
the memory model (`dmtp.memory`) on the target's config and the drafters' shapes (built on the meta device) says
whether the loop's setting fits the GPUs, resolves `TrainConfig.shard_target="auto"`, and refuses a setting that
cannot fit in one line with the numbers and what would fit."""
from __future__ import annotations

from dataclasses import replace

import torch

from dmtp.config import TrainConfig
from dmtp.memory import GIB, DrafterSpec, check_training, plan_training
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.training.drafters import fused_ce_applies


def spec_of(configs: list[DrafterConfig]) -> DrafterSpec:
    """The largest of these drafters as the memory model reads it (built on the meta device: exact parameter counts,
    the variant's block slots), the fused LM-head loss counted only where it applies to every one of them (the
    drafters step one after another: the peak is the largest one's)."""
    best = None
    for c in configs:
        with torch.device("meta"):
            d = Drafter(c)
        s = DrafterSpec(hidden=c.hidden_size, vocab=c.vocab_size, layers=c.num_hidden_layers,
                        heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                        intermediate=c.intermediate_size, taps=len(c.target_layer_ids), slots=d.layout.slots)
        s = replace(s, injection=sum(p.numel() for p in d.parameters()) - s.params)  # what the formula leaves out
        s = replace(s, fusable=fused_ce_applies(d))
        fusable = s.fusable if best is None else best.fusable and s.fusable
        best = s if best is None or (s.params, s.slots) > (best.params, best.slots) else best
        best = replace(best, fusable=fusable)
    return best


def fit_training(target_config: dict, configs: list[DrafterConfig], cfg: TrainConfig, world: int,
                 gpu_bytes: int) -> tuple[TrainConfig, str]:
    """(cfg with shard_target resolved, the plan's line) for training `configs` side by side on `world` GPUs of
    `gpu_bytes` each; a ValueError in one line (the numbers, and the setting the model says would fit) where the
    setting cannot fit."""
    d = spec_of(configs)
    gb = gpu_bytes / GIB
    kw = dict(seq_len=cfg.max_len, anchors=cfg.anchors_per_seq, fused_ce=cfg.fused_ce, ce_chunk=cfg.ce_chunk)
    plan = check_training(target_config, d, world=world, gpu_gb=gb, batch_size=cfg.batch_size, fsdp=cfg.fsdp,
                          shard_target=cfg.shard_target, checkpointing=cfg.activation_checkpointing,
                          drafters=len(configs), **kw)
    if plan.fits:
        shard = "on" if plan.setting.shard_target else "off"
        return (replace(cfg, shard_target=shard) if cfg.shard_target == "auto" else cfg), plan.line()
    per_rank = cfg.batch_size // world
    hint = plan_training(target_config, d, gpus=world, gpu_gb=gb, global_batch=cfg.batch_size, micro_batch=per_rank,
                         drafters=len(configs), **kw)
    if hint.fits:
        s = hint.setting
        fix = (f"the model fits it with --shard-target {'on' if s.shard_target else 'off'}"
               f"{' --activation-checkpointing' if s.checkpointing else ''}")
    else:
        best = plan_training(target_config, d, gpus=world, gpu_gb=gb, global_batch=cfg.batch_size,
                             drafters=len(configs), **kw)
        fix = (f"no setting fits {per_rank} sequences per GPU; the model fits {best.setting.micro_batch} per GPU "
               f"(--batch-size {best.setting.micro_batch * world}, or more GPUs)" if best.fits else
               "nothing fits even one sequence per GPU: more or larger GPUs, a shorter --max-len or fewer anchors")
    raise ValueError(f"training {len(configs)} drafter(s) on {world} GPU(s) of {gb:.0f} GiB {plan.line()}; {fix}")
