"""Models: the frozen target adapter and its caches, the native MTP head, the DFlash drafter (layers, DFlash2 backbone,
injection variants), the screened T1 head, and tiny same-format checkpoints for tests. Imports only `dmtp.io` and
`dmtp.config`; `torch_dtype` is the one map from a config's precision name (`dmtp.config.DTYPES`) to torch's."""
import torch

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]
