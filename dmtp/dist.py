"""Data parallelism under torchrun (one process per GPU; nccl on CUDA, gloo on CPU). Training (target pretraining,
drafters) takes interleaved rows of every global batch and averages gradients with one all-reduce per step, so N
ranks follow the 1-rank run at the same global batch; generation deals whole batches of prompts to the ranks and
gathers the records in prompt order.

    torchrun --nproc_per_node=2 -m dmtp.cli train --target T --data D --variants dflash --out O --batch-size 32
    torchrun --nproc_per_node=2 -m dmtp.cli pipeline --profile mini --stage target,data,drafters
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


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


def average_grads(params):
    """Mean of every gradient over ranks, in one flat all-reduce (parameters without a gradient count as 0)."""
    if not dist.is_initialized():
        return
    params = [p for p in params if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    i = 0
    for p in params:
        n = p.numel()
        p.grad = flat[i: i + n].view_as(p).clone()
        i += n
