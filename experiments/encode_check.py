"""The corpus encoding in one process against `--workers` spawned ones (`dmtp.data.tokenizer.encode_corpus`), side by
side in interleaved repeats on one corpus JSONL and tokenizer: seconds of each repeat, the median ratio, and whether
the two token streams are equal (they must be).

    python -m experiments.encode_check --corpus work/mini/corpus/train.jsonl --tokenizer work/mini/tokenizer
"""
import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from dmtp.data.tokenizer import encode_corpus, load_tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="a corpus JSONL (the corpus stage's train.jsonl)")
    ap.add_argument("--tokenizer", required=True, help="a tokenizer folder (the tokenizer stage's)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    for p in (Path(a.corpus), Path(a.tokenizer)):
        if not p.exists():
            raise SystemExit(f"encode_check: {p}: no such file or folder")
    if a.workers < 2 or a.repeats < 1:
        raise SystemExit(f"encode_check: expected --workers >= 2 and --repeats >= 1, got {a.workers}, {a.repeats}")
    tok = load_tokenizer(a.tokenizer)
    times = {1: [], a.workers: []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.repeats):
            for w in times:
                out = Path(d, f"w{w}_{r}.npy")
                t0 = time.perf_counter()
                encode_corpus(a.corpus, tok, out, progress=False, workers=w)
                times[w].append(time.perf_counter() - t0)
        one, many = (np.load(Path(d, f"w{w}_0.npy"), allow_pickle=False) for w in times)
    for w, t in times.items():
        print(f"workers {w}: " + ", ".join(f"{x:.2f}" for x in t) + " s")
    ratio = statistics.median(times[1]) / statistics.median(times[a.workers])
    print(f"{len(one):,} tokens; streams equal: {np.array_equal(one, many)}; one process / {a.workers} workers: "
          f"{ratio:.2f}x (median of {a.repeats} repeats)")


if __name__ == "__main__":
    main()
