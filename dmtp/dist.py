"""Data parallelism under torchrun (one process per GPU; nccl on CUDA, gloo on CPU). Training (target pretraining,
drafters) takes interleaved rows of every global batch and wraps each trained module in PyTorch's
DistributedDataParallel (`data_parallel`), which averages the gradients over ranks during the backward pass, so N
ranks follow the 1-rank run at the same global batch; generation deals whole batches of prompts to the ranks and
gathers the records in prompt order.

    torchrun --nproc_per_node=2 -m dmtp.cli train --target T --data D --variants dflash --out O --batch-size 32
    torchrun --nproc_per_node=2 -m dmtp.cli pipeline --profile mini --stage target,data,drafters
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def init() -> tuple[int, int, str | None]:
    """(rank, world, device) — starts the process group when launched by torchrun (WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, None
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    return dist.get_rank(), dist.get_world_size(), dev


def rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def is_main() -> bool:
    return rank_world()[0] == 0


def barrier():
    if dist.is_initialized():
        dist.barrier()


def destroy():
    if dist.is_initialized():
        dist.destroy_process_group()


def all_gather_objects(obj) -> list:
    """Every rank's `obj` (picklable), in rank order, on every rank ([obj] on one process)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_sum(x: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x)
    return x


def data_parallel(module: torch.nn.Module) -> torch.nn.Module:
    """`module` wrapped in DistributedDataParallel under torchrun (itself on one process). DDP averages the gradients
    of its trainable parameters over ranks in bucketed all-reduces overlapping the backward pass; every trainable
    parameter must take part in the forward (freeze the ones a model bypasses). Buffers are not broadcast: the models
    here hold only constant ones (rotary frequencies). The wrapper shares the module's parameters, so optimizers and
    checkpoints keep using the plain module.

    Where the model's optimizer state does not fit beside the frozen target on every GPU (paper-scale drafters
    trained side by side), FSDP2's `fully_shard` would take this wrapper's place; DESIGN.md says when."""
    if not dist.is_initialized():
        return module
    dev = next(module.parameters()).device
    return DistributedDataParallel(module, device_ids=[dev] if dev.type == "cuda" else None, broadcast_buffers=False)
