"""Does a second `dmtp generate` on the same machine start in seconds? Two consecutive `dmtp generate` processes on a
small random target (and a random drafter of the method) with a fresh `--compile-cache`: the first compiles cold, the
second reads the cache. Each run's time to its first record, wall time, phase lines and compile lines are written to
OUT/compile_cache.json and printed.

    python -m experiments.compile_cache_check --out /tmp/cc                       # GPU: ~5 min (the first run cold)
    python -m experiments.compile_cache_check --out /tmp/cc --hidden 64 --layers 4 --prompts 2 --max-new-tokens 4 \
        --engine engine=compiled                                                 # CPU (Inductor's C++): ~1 min
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from dmtp.io import environment, write_json, write_jsonl
from dmtp.models import tiny


def build(out: Path, a) -> tuple[Path, Path]:
    """A random Qwen3 target of the given shape with its MTP head, and a random drafter of the method."""
    cfg = dict(vocab=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
               head_dim=a.hidden // a.heads, intermediate=4 * a.hidden)
    tgt, mtp = tiny.build("qwen3", seed=0, **cfg)
    target = tiny.save(tgt, mtp, out / "target")
    drafter = out / "drafter"
    tiny.drafter(tgt, a.method if a.method not in ("ar", "mtp") else "dflash", layers=2).save(drafter)
    g = torch.Generator().manual_seed(0)
    write_jsonl(out / "prompts.jsonl", [{"id": str(i), "prompt_ids": torch.randint(
        3, a.vocab, (int(torch.randint(a.prompt_len // 2, a.prompt_len + 1, (1,), generator=g)),),
        generator=g).tolist()} for i in range(a.prompts)])
    return target, drafter


def run_once(out: Path, k: int, target: Path, drafter: Path, cache: Path, a) -> dict:
    """One `dmtp generate` process: time to its first record, total wall time, its compile lines."""
    rec = out / f"run{k}.jsonl"
    for p in (rec, rec.with_suffix(".jsonl.meta.json")):
        p.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "dmtp.cli", "generate", "--target", str(target), "--method", a.method,
            "--prompts", str(out / "prompts.jsonl"), "--batch-size", str(a.prompts), "--max-new-tokens",
            str(a.max_new_tokens), "--eos", "none", "--dtype", a.dtype, "--compile-cache", str(cache),
            "--out", str(rec)] + (["--drafter", str(drafter)] if a.method not in ("ar", "mtp") else []) \
        + (["--temperature", str(a.temperature)] if getattr(a, "temperature", 0) else [])
    for e in a.engine:
        argv += ["--engine", e]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    first = None
    while proc.poll() is None:
        if first is None and rec.exists() and rec.stat().st_size:
            first = time.perf_counter() - t0
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    err = proc.stderr.read()
    if proc.returncode:
        raise SystemExit(f"run {k}: dmtp generate exited {proc.returncode}:\n{err[-3000:]}")
    if first is None:
        first = wall
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith(("compiling ", "compiled "))]
    phases = re.findall(r"\[dmtp generate +[0-9.]+s\] [^\r\n]*", err)  # what it did before its first record, when
    return {"run": k, "first_record_s": round(first, 2), "wall_s": round(wall, 2), "compile_lines": lines,
            "phase_lines": phases}


SHAPE = {"prompts": 12, "prompt-len": 128, "max-new-tokens": 64, "vocab": 32000, "hidden": 1024, "layers": 8,
         "heads": 16, "kv-heads": 4}  # the random-weight target and the decode (`build`, `run_once`)


def shape_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags `build` and `run_once` read (this check's and `determinism_check`'s)."""
    ap.add_argument("--method", default="zero_init_residual", help="ar | mtp | a variant (default: the main one)")
    for flag, default in SHAPE.items():
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--dtype", default="bf16" if torch.cuda.is_available() else "fp32")
    ap.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE", help="passed to dmtp generate")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the checkpoints, records and compile_cache.json")
    ap.add_argument("--cache", help="the --compile-cache directory (default OUT/cache), emptied first")
    shape_arguments(ap)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(a.cache) if a.cache else out / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    target, drafter = build(out, a)
    runs = [run_once(out, k, target, drafter, cache, a) for k in (1, 2)]
    same = [json.loads(x)["output_ids"] for x in (out / "run1.jsonl").read_text().splitlines()] == \
        [json.loads(x)["output_ids"] for x in (out / "run2.jsonl").read_text().splitlines()]
    res = {"config": vars(a), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "environment": {**environment(), "compile_cache": str(cache)}, "runs": runs, "same_outputs": same}
    write_json(out / "compile_cache.json", res)
    for r in runs:
        print(f"run {r['run']}: first record after {r['first_record_s']:.1f} s, wall {r['wall_s']:.1f} s")
        for ln in r["phase_lines"] + r["compile_lines"]:
            print(f"    {ln}")
    print(f"same outputs: {same}; written {out / 'compile_cache.json'}")


if __name__ == "__main__":
    main()
