"""The command layer (orchestration): the `dmtp` CLI (`main`), the pipeline stages, benchmarks, the paper-scale dry
run, the losslessness check and the report renderer. It imports the library; the library never imports it.

Every command runs with the hub's documented offline setting on (`HF_HUB_OFFLINE=1`, which `huggingface_hub` and
`datasets` read once, when imported: hence here, before any module of this layer imports them) unless the
environment sets it: data sets and checkpoints come from local copies or the local HF cache and nothing waits on the
network; `HF_HUB_OFFLINE=0 dmtp ...` lets a command fetch from the hub.

`STARTED` is the command's clock: the long waits before a command's first output say what they are doing, and when,
counted from it (`args.phase`).
"""
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
STARTED = time.monotonic()  # when the command layer was first imported: what `args.phase` lines count from
