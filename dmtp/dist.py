"""Data parallelism under torchrun (one process per GPU; nccl on CUDA, gloo on CPU): FSDP2. Training (target
pretraining, drafters) takes interleaved rows of every global batch; each trained model is `fully_shard`ed
(`shard`): its decoder layers one by one, then the rest as the root. A rank keeps 1/N of every parameter (fp32 master
weights), of its gradient and of its AdamW state; a layer's parameters are all-gathered just before the layer runs
(forward, and again in the backward) and freed after it; its gradients are reduce-scattered, averaged over the ranks,
so N ranks follow the 1-rank run at the same global batch. Checkpoints hold full tensors (`full_state`,
`full_optimizer_state`): gathered on every rank, written by rank 0, sharded again on load
(`shard_optimizer_state`), so a run resumes on any number of ranks. Generation deals whole batches of prompts to the
ranks and gathers the records in prompt order.

    dmtp-torchrun --nproc_per_node=2 -m dmtp.cli train --target T --data D --variants dflash --out O --batch-size 32
    dmtp-torchrun --nproc_per_node=2 -m dmtp.cli pipeline --profile mini --stage target,data,drafters
"""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager

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
    """End the process group at the end of a run that finished on every rank: a barrier first, so no rank closes its
    connections while another is still inside a collective (or its last stage's writes)."""
    if dist.is_initialized():
        dist.barrier()
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


def main_says(flag: bool) -> bool:
    """Rank 0's `flag` on every rank (itself on one process): a decision read from the file system that every rank
    must take alike (whether to gather a checkpoint)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    box = [flag]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


# --- FSDP2 --------------------------------------------------------------------------------------------------------
def use_fsdp(flag: str, world: int) -> bool:
    """FSDP2 or the plain step, from `TrainConfig.fsdp`: "auto" shards whenever more than one rank trains, "on" also
    on one (a process group of one), "off" never (refused under several ranks: there is no other data parallelism)."""
    if flag == "off" and world > 1:
        raise ValueError(f"train.fsdp='off' under {world} ranks: data-parallel training is FSDP2 "
                         "(set train.fsdp to 'auto' or 'on', or run one process)")
    return flag == "on" or (flag == "auto" and world > 1)


@contextmanager
def group_of_one(device):
    """A process group of this process alone while the block runs (FSDP2 needs a group; nccl on CUDA, gloo on CPU),
    unless one exists; the group it started ends with the block."""
    if dist.is_initialized():
        yield
        return
    cuda = torch.device(device).type == "cuda"
    if cuda and torch.device(device).index is not None:  # nccl and FSDP2 work on the current device
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def precision(bf16: bool):
    """FSDP2's mixed precision: bf16 parameters for the compute, gradients reduced in fp32 (into fp32 shards: the
    master weights stay fp32). bf16=False: None, everything fp32. The inputs are not cast: the models cast what they
    need to their weights' dtype, and the loss normaliser must stay fp32."""
    if not bf16:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)


def shard(root: torch.nn.Module, layers, mp=None, methods=(), frozen: bool = False) -> torch.nn.Module:
    """FSDP2 over the process group: `fully_shard` each module of `layers` (`methods`: their methods called outside
    their forward, e.g. a drafter layer's context K/V, registered to gather the layer too), then `root` (what is left:
    embeddings, norms, small projections) unless `frozen`. frozen: a model that is only run forward (the frozen
    target): its layers alone are sharded, each then a root of its own, told to free its gathered weights after its
    forward (FSDP2 keeps a root's gathered by default, for a backward that a frozen model never has); what the caller
    reads outside their forwards stays replicated. In place; returns root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    # a context K/V method returns transposed views, which the models only read (torch.cat), never write in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    dev = next(root.parameters()).device
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    kw = dict(mesh=mesh, **({"mp_policy": mp} if mp is not None else {}))
    for layer in layers:
        fully_shard(layer, **kw, **({"reshard_after_forward": True} if frozen else {}))
        for name in methods:
            register_fsdp_forward_method(layer, name)
    if not frozen:
        fully_shard(root, **kw)
    return root


def is_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def _full(x, keep: bool):
    """A full tensor from a DTensor shard (an all-gather: every rank calls it, in the same order), on the host where
    `keep`, else dropped at once (None)."""
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        x = x.full_tensor()
    if not keep:
        return None
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def full_state(module: torch.nn.Module, everywhere: bool = False) -> dict:
    """`module.state_dict()` with every sharded tensor gathered, on the host of rank 0 (the writer; None on the other
    ranks) or of every rank (`everywhere`); tensor by tensor: a device holds one gathered tensor at a time. A
    collective under FSDP2: every rank calls it."""
    keep = everywhere or is_main()
    return {k: _full(v, keep) for k, v in module.state_dict().items()}


def full_optimizer_state(opt: torch.optim.Optimizer) -> dict:
    """`opt.state_dict()` with every sharded state tensor gathered (exp_avg, exp_avg_sq at the parameters' full
    shapes): the state an unsharded optimizer of the same parameters holds, on rank 0. Collective, as `full_state`."""
    sd, keep = opt.state_dict(), is_main()
    return {"state": {i: {k: _full(v, keep) for k, v in st.items()} for i, st in sd["state"].items()},
            "param_groups": sd["param_groups"]}


def shard_optimizer_state(sd: dict, opt: torch.optim.Optimizer) -> dict:
    """The inverse of `full_optimizer_state` for `opt` (whose parameters may be sharded): each full state tensor of a
    sharded parameter's shape laid out as that parameter (its rows of this rank); scalars (Adam's step) as they are.
    Every rank holds the same `sd` (read from one file)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for g in opt.param_groups for p in g["params"]]
    out = {}
    for i, st in sd["state"].items():
        p = params[i]
        out[i] = {k: distribute_tensor(v.to(p.device, p.dtype), p.device_mesh, p.placements)
                  if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.shape == p.shape else v
                  for k, v in st.items()}
    return {"state": out, "param_groups": sd["param_groups"]}


@torch.no_grad()
def clip_sharded_(groups: list[list[torch.Tensor]], max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_(group, max_norm)` for every group of (possibly sharded) parameters, on the device: the
    squares of each rank's gradient shards summed per group and over the ranks (every element lies on one rank), so
    ||g|| is the full gradient's 2-norm; each group's gradients times min(1, max_norm / (||g|| + 1e-6)). Returns the
    norms [G]."""
    from torch.distributed.tensor import DTensor

    local = [[(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad) for p in ps if p.grad is not None]
             for ps in groups]
    flat = [g for gs in local for g in gs]
    sq = torch.stack(torch._foreach_norm(flat)).float() ** 2 if flat else torch.zeros(0)
    dev = flat[0].device if flat else torch.device("cpu")
    sums = torch.stack([s.sum() if len(s) else torch.zeros((), device=dev)
                        for s in sq.split([len(gs) for gs in local])])
    if dist.is_initialized():
        dist.all_reduce(sums)
    norms = sums.sqrt()
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for gs, c in zip(local, coef.unbind()):
        if gs:
            torch._foreach_mul_(gs, c.to(gs[0].dtype))
    return norms
