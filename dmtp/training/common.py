"""What both training loops share: when to compile, how a batch reaches the GPU, and the FLOP count behind MFU."""
from __future__ import annotations

import contextlib
import math
import os

import torch

from dmtp.config import COMPILE, KERNEL_CHOICES

# dense bf16 tensor-core peak (FLOP/s, datasheet, no sparsity) by device-name fragment: the MFU denominator
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}


def compiled(flag: str, device) -> bool:
    """The compiled path? "auto": on CUDA only (on CPU, inductor's C++ compile would cost more than the short runs
    it speeds up); "on": everywhere (the CPU tests of the compiled path); "off": eager (the benchmarks' baseline)."""
    if flag not in COMPILE:
        raise ValueError(f"compile={flag!r}: expected one of {', '.join(COMPILE)}")
    return flag == "on" or (flag == "auto" and torch.device(device).type == "cuda")


CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's fixed workspace: its results then do not depend on the streams in use


def deterministic_cublas() -> None:
    """Give cuBLAS the fixed workspace deterministic algorithms need (`CUBLAS_WORKSPACE_CONFIG`), unless the user
    set one: read when cuBLAS first starts in the process, so the entry points call this before any CUDA work."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def kernel_choices(flag: str, device):
    """The context a training loop compiles and runs in (`TrainConfig.kernels`, `PretrainConfig.kernels`). "fixed" on
    CUDA: Inductor's deterministic mode (no on-device timing of a choice that can change numerics: a reduction's
    launch settings, a matmul's padding) and PyTorch's deterministic algorithms (no atomic adds in a backward pass:
    an embedding's or a scatter's gradient summed in a fixed order), so a run's weights are a function of its inputs
    alone, whatever else runs on the card. In the forward passes an op without a deterministic form warns; the
    backward passes (`backward`) are strict. cuDNN attention is off: scaled-dot-product attention chooses its kernel
    in the forward pass, and warn-only mode lets it choose cuDNN's (its first choice on sm90/sm100 with cuDNN 9.15.1
    or later), whose backward sums in arrival order and is not checked when the backward runs; strict mode excludes it
    at that choice alone. "default" (and any CPU run) changes nothing."""
    if flag not in KERNEL_CHOICES:
        raise ValueError(f"kernels={flag!r}: expected one of {', '.join(KERNEL_CHOICES)}")
    if flag != "fixed" or torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    return _deterministic()


@contextlib.contextmanager
def _deterministic():
    deterministic_cublas()
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn_attention = torch.backends.cuda.cudnn_sdp_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        with torch._inductor.config.patch(deterministic=True):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)


def backward(loss: torch.Tensor) -> None:
    """`loss.backward()`, strictly deterministic inside the fixed kernel choices (`kernel_choices`). PyTorch's
    warn-only mode leaves flash and memory-efficient attention's backward on their atomic-add algorithms, which sum a
    query block's gradient over its key blocks in arrival order: with three or more key blocks (`mini`'s 512-token
    windows) two identical processes trained different targets. Strict mode gives both their deterministic algorithm;
    an op of a backward pass without one raises, naming itself, rather than training unreproducibly. Elsewhere (no
    deterministic mode, or it is already strict) a plain backward."""
    if not (torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()):
        loss.backward()
        return
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        loss.backward()
    finally:
        torch.use_deterministic_algorithms(True, warn_only=True)


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """Host batch -> device without a synchronisation: from pinned memory, asynchronously (a copy from pageable memory
    waits for the GPU to drain, so the host could not run ahead by a step)."""
    if torch.device(device).type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def peak_flops(device) -> float | None:
    """Dense bf16 peak of the device (None where unknown, e.g. CPU)."""
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def checkpoint_layers(layers) -> None:
    """Activation checkpointing: each layer's forward (in place) keeps only its inputs and recomputes its activations
    in the backward pass (non-reentrant `torch.utils.checkpoint`: the same operations, so the same loss and
    gradients). Under FSDP2 the layer's weights are gathered again for the backward, and the recomputation uses them."""
    for layer in layers:
        layer.forward = _recomputed(layer.forward)


def _recomputed(forward):
    """`forward` under non-reentrant checkpointing; a plain function, so torch.compile traces the checkpoint into
    its graph (`compile_forwards` after `checkpoint_layers`)."""
    from torch.utils.checkpoint import checkpoint

    def recomputed(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return recomputed


RECOMPILE_LIMIT = 64  # graphs a compiled function may hold (Dynamo's default is 8)


def compile_forwards(layers, backend: str = "inductor") -> None:
    """Regional compilation of each layer's forward (in place), static shapes; the module's hooks (FSDP2's gathers
    and reduce-scatters) stay outside the graph. The layers share their graphs (the same code, weights as inputs):
    one per layer class, block layout (slots per block) and whether the layer's input needs a gradient (a drafter's
    first layer over a frozen block embedding does not), with activation checkpointing one function for every class."""
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, backend=backend, dynamic=False)
def watch_finite(flag: torch.Tensor | None, *losses: torch.Tensor) -> torch.Tensor:
    """`flag` | any of `losses` not finite: a device-side boolean kept over the steps between two log steps (no host
    synchronisation; `check_finite_loss` reads it with the logged values)."""
    bad = ~torch.isfinite(torch.stack([x.detach().float().reshape(()) for x in losses])).all()
    return bad if flag is None else flag | bad


def check_finite_loss(what: str, step: int, flag: float, values: dict, lr: float, target=None) -> None:
    """Refuse a training whose loss went non-finite (NaN or infinity) at any step up to `step` (`flag`, read back
    with the logged `values`), naming the run, the step and the likely cause: the target's forward (its RoPE
    settings, its dtype) or the learning rate. Checked before anything of that step is saved."""
    from dmtp.models.finite import likely_cause

    shown = {k: v for k, v in values.items() if isinstance(v, float) and ("loss" in k or k == "ul")}
    if not flag and all(map(math.isfinite, shown.values())):
        return
    logged = ", ".join(f"{k} {v:.4g}" for k, v in shown.items())
    cause = (f"the target's forward ({likely_cause(target)}), " if target is not None else "") + \
        f"or a learning rate too high (lr {lr:g})"
    raise ValueError(f"{what}: the training loss is not finite (NaN or infinity) by step {step} (logged: {logged});"
                     f" likely cause: {cause}")
