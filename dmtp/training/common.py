"""What both training loops share: when to compile, how a batch reaches the GPU, and the FLOP count behind MFU."""
from __future__ import annotations

import math

import torch

from dmtp.config import COMPILE

# dense bf16 tensor-core peak (FLOP/s, datasheet, no sparsity) by device-name fragment: the MFU denominator
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}


def compiled(flag: str, device) -> bool:
    """The compiled path? "auto": on CUDA only (on CPU, inductor's C++ compile would cost more than the short runs
    it speeds up); "on": everywhere (the CPU tests of the compiled path); "off": eager (the benchmarks' baseline)."""
    if flag not in COMPILE:
        raise ValueError(f"compile={flag!r}: expected one of {', '.join(COMPILE)}")
    return flag == "on" or (flag == "auto" and torch.device(device).type == "cuda")


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
