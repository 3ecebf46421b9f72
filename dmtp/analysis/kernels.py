"""Where device time goes: a profiler's kernels grouped by kind, so a missed speed goal comes with the share of time
each kind of work takes (`bench --kernel-profile`, `bench_train --kernel-profile`).

Kinds: Inductor's Triton kernels by prefix (flex attention templates, other templates = GEMM, reductions,
pointwise), every other kernel by name in this order (the first match wins): attention (flash / flex / fmha kernels),
GEMM (cuBLAS, CUTLASS, nvjet, Triton matmul templates, aten::mm), optimizer (fused / foreach Adam), copy (memcpy,
memset, copies, cat), reduction (Triton reduction and persistent-reduction kernels, norms, softmax), pointwise (Triton
pointwise kernels, elementwise), other. On a machine without a GPU the CPU operators stand in (self CPU time)."""
from __future__ import annotations

KINDS: list[tuple[str, tuple[str, ...]]] = [  # every kernel not from Inductor (Triton's `triton_*`: `kind_of`)
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("gemm", ("gemm", "gemv", "splitkreduce", "matmul", "cutlass", "nvjet", "xmma", "cublas", "aten::mm",
              "aten::addmm", "aten::bmm", "aten::linear")),
    ("optimizer", ("adam", "multi_tensor_apply", "foreach")),
    ("copy", ("memcpy", "memset", "copy", "aten::cat", "catarraybatched", "index_put", "index_elementwise",
              "scatter")),
    ("reduction", ("reduce", "norm", "softmax", "sum", "mean", "argmax", "max")),
    ("pointwise", ("elementwise", "vectorized", "aten::add", "aten::mul", "aten::div", "aten::sub",
                   "aten::silu", "aten::exp", "aten::where", "aten::pow", "aten::rsqrt", "aten::neg")),
]


def kind_of(name: str) -> str:
    n = name.lower()
    if n.startswith("triton_"):  # Inductor's kernels name the ops they fuse ("_to_copy" in most): prefix first
        if "attention" in n or "flex_decoding" in n:
            return "attention"
        for prefix, kind in (("triton_tem", "gemm"), ("triton_red", "reduction"), ("triton_per", "reduction"),
                             ("triton_poi", "pointwise")):
            if n.startswith(prefix):
                return kind
    for kind, keys in KINDS:
        if any(k in n for k in keys):
            return kind
    return "other"


def device_times(avg) -> list[tuple[str, float]]:
    """(name, µs) per entry of a profiler's `key_averages()`: the GPU kernels with their device time when any ran,
    else every CPU operator with its self CPU time (a CPU-only run)."""
    from torch.autograd import DeviceType

    def dev_us(e):
        return float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0) or 0.0)

    gpu = [(e.key, dev_us(e)) for e in avg if getattr(e, "device_type", None) == DeviceType.CUDA]
    if any(t > 0 for _, t in gpu):
        return gpu
    return [(e.key, float(e.self_cpu_time_total)) for e in avg]


def shares(pairs: list[tuple[str, float]]) -> list[dict]:
    """Per kind: total ms, share of all time, number of distinct kernels, and the kind's largest kernel; sorted by
    time (largest first)."""
    total = sum(t for _, t in pairs) or 1.0
    by: dict[str, dict] = {}
    for name, t in pairs:
        kind = kind_of(name)
        k = by.setdefault(kind, {"kind": kind, "us": 0.0, "kernels": 0, "top": ("", -1.0)})
        k["us"] += t
        k["kernels"] += 1
        if t > k["top"][1]:
            k["top"] = (name, t)
    rows = [{"kind": k["kind"], "ms": k["us"] / 1e3, "share": k["us"] / total, "kernels": k["kernels"],
             "largest": k["top"][0]} for k in by.values()]
    return sorted(rows, key=lambda r: -r["ms"])


def summary(avg, title: str, row_limit: int = 30) -> str:
    """A profile file's text: `title`, the time by kind, then the profiler's own table of the largest entries."""
    rows = shares(device_times(avg))
    lines = [title, "", f"{'kind':<10} {'ms':>10} {'share':>7} {'kernels':>8}  largest"]
    lines += [f"{r['kind']:<10} {r['ms']:>10.3f} {r['share']:>7.1%} {r['kernels']:>8}  {r['largest'][:90]}"
              for r in rows]
    try:
        table = avg.table(sort_by="device_time_total", row_limit=row_limit)
    except (AttributeError, KeyError, ValueError):
        try:
            table = avg.table(sort_by="cuda_time_total", row_limit=row_limit)
        except (AttributeError, KeyError, ValueError):
            table = avg.table(sort_by="self_cpu_time_total", row_limit=row_limit)
    return "\n".join(lines) + "\n\n" + table + "\n"
