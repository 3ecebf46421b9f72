"""The command layer: the `dmtp` CLI (`main`), the pipeline stages, benchmarks, the dry run, the losslessness check
and the report renderer. It imports the library; the library never imports it.

Every command runs offline (`HF_HUB_OFFLINE=1`, set here because `huggingface_hub` and `datasets` read it once, on
import) unless the environment says otherwise: `HF_HUB_OFFLINE=0 dmtp ...` lets a command fetch from the hub.
"""
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
STARTED = time.monotonic()  # when the command layer was first imported: what `args.phase` lines count from
