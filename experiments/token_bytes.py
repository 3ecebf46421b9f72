"""Bytes of RAM per training token: JSONL read into Python lists (`load_sequences`) against the memory-mapped token
store (`dmtp.data.tokens`), on random ids over Qwen3.6's 248,320-token vocabulary, each side in its own process,
measured by tracemalloc after loading. Prints one JSON line.

    python -m experiments.token_bytes --sequences 2000 --tokens 1000 --out /tmp/token_bytes   # CPU, ~30 s
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from dmtp.data.tokens import convert
from dmtp.io import atomic_path, write_json

PROBE = """
import sys, tracemalloc
from dmtp.training.drafters import batches, load_sequences
tracemalloc.start()
seqs = load_sequences(sys.argv[1], 1 << 30)
next(batches(seqs, 8, 0))
print(tracemalloc.get_traced_memory()[0])
"""


def held(path: Path) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=1000, help="tokens per sequence")
    ap.add_argument("--out", required=True, help="folder for the JSONL and its store")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    src = out / "data.jsonl"
    rng = np.random.default_rng(0)
    with atomic_path(src) as tmp, open(tmp, "w") as f:
        for _ in range(a.sequences):
            f.write(json.dumps({"ids": rng.integers(0, 248320, a.tokens).tolist()}) + "\n")
    store = convert(src, out / "data.tokens", vocab_size=248320)
    n = a.sequences * a.tokens
    rec = {"sequences": a.sequences, "tokens_per_sequence": a.tokens, "lists_bytes_per_token": held(src) / n,
           "store_bytes_per_token": held(store) / n, "store_file_bytes_per_token":
           ((store / "tokens.bin").stat().st_size + (store / "offsets.npy").stat().st_size) / n}
    write_json(out / "token_bytes.json", rec)
    print(json.dumps(rec))


if __name__ == "__main__":
    main()
