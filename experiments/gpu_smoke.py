"""Does the compiled engine decode as HF's greedy `generate` does, on tiny Qwen3.5 and Qwen3 targets (the compiled
Qwen3 target can diverge where Qwen3.5 does not), for `ar`, `mtp` and a DMTP variant? Run it before timing the
engine: nothing is worth timing otherwise (exit 1 on the first difference).

    python -m experiments.gpu_smoke            # one GPU, ~1-2 min (compiles); on a CPU the engine's default is "hf"
"""
from __future__ import annotations

import sys
import time

import torch
import transformers

from dmtp.engine.decode import generate
from dmtp.engine.methods import build_method, method_class
from dmtp.models import tiny

PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60, 70, 80, 90], [33]]
METHODS = ("ar", "mtp", "zero_init_residual")


def main() -> int:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(torch.__version__, transformers.__version__, torch.cuda.get_device_name() if dev == "cuda" else dev)
    for arch in ("qwen3_5", "qwen3"):
        tgt, mtp = tiny.build(arch, seed=0)
        tgt.model.to(dev)
        mtp.to(dev)
        ref = [tgt.model.generate(torch.tensor([p], device=dev), max_new_tokens=20, do_sample=False,
                                  pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
        for name in METHODS:
            t0 = time.time()
            d = tiny.drafter(tgt, name).to(dev) if method_class(name).needs_drafter else None
            got = [r.output_ids for r in generate(tgt, build_method(name, tgt, drafter=d, mtp=mtp), PROMPTS, 0.0, 20)]
            print("[smoke]", arch, name, f"{time.time() - t0:.1f}s",
                  "identical to HF greedy" if got == ref else f"DIFFERS: {got}", flush=True)
            if got != ref:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
