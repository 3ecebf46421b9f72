"""Benchmarks through the one decode loop; artifacts under results/<profile>/bench/ (rendered by dmtp.report).

    python -m dmtp.bench --target work/tiny/target --drafters work/tiny/drafters --out results/tiny/bench \
        --methods ar,mtp,dflash,zero_init_residual --tokens 64 --caps 1,2,4   # tiny CPU run, ~1 min

overhead.csv   ms per round by stage (drafter, mtp, t1_prep, drafter_ctx, verify, round) at batch `--batch`,
               `--tokens` generated tokens ignoring EOS, the first 16 rounds excluded
throughput.csv total output tokens / wall time of the whole request group at each batch cap (natural EOS), with
               dynamic batching (`decode.serve`: a finished request's slot goes to the next one at once)
hf.csv         the same requests, batch 1, T = 0: our loop vs a plain HF `generate` loop (DynamicCache), tokens/s,
               whether outputs are identical, and the HBM bound of AR (weight bytes / bandwidth)
"""
from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict
from pathlib import Path

import torch


class StageTimer:
    """Times named stages per decode round (CUDA events on GPU, perf_counter on CPU)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.events = defaultdict(list)  # stage -> [(start, end)] in round order

    @contextlib.contextmanager
    def __call__(self, stage):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            yield
            b.record()
            self.events[stage].append((a, b))
        else:
            t = time.perf_counter()
            yield
            self.events[stage].append((t, time.perf_counter()))

    def ms_per_round(self, skip: int = 16) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        rounds = len(self.events.get("round", []))
        out = {}
        for stage, ev in self.events.items():
            # stages run once per round except in prefill (mtp/t1_prep/drafter_ctx once more, before round 0)
            ev = ev[len(ev) - rounds:] if len(ev) > rounds else ev
            ev = ev[skip:]
            if not ev:
                continue
            ms = [(a.elapsed_time(b) if self.cuda else (b - a) * 1e3) for a, b in ev]
            out[stage] = sum(ms) / len(ms)
        return out


def _sync(dev):
    if str(dev).startswith("cuda"):
        torch.cuda.synchronize()


def main(argv=None):
    import pandas as pd

    from .cli import load_tokenizer
    from .data.humaneval import humaneval_prompts
    from .decode import build_method, generate, serve
    from .drafter import Drafter
    from .io import write_meta, write_text
    from .mtp import MTPHead
    from .target import Target

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--drafters", help="directory of trained drafters (<name>/drafter)")
    p.add_argument("--methods", default="ar,mtp,dflash,zero_init_residual")
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--caps", default="1,2,4,8,16,32")
    p.add_argument("--prompts", type=int, default=64, help="HumanEval prompts for the throughput runs")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--hf-prompts", type=int, default=4)
    p.add_argument("--bandwidth", type=float, default=4.3e12, help="HBM bytes/s for the AR bound (H200: ~4.3e12)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    a = p.parse_args(argv)

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    tgt = Target.load(a.target, dtype=dtype, device=dev)
    mtp = MTPHead.load(tgt, a.target)
    tok = load_tokenizer(a.target)
    eos = [tok.eos_token_id] if tok is not None else []
    prompts = [tok(x["prompt"], add_special_tokens=False)["input_ids"] for x in humaneval_prompts()]

    def method(name):
        d = None
        if name not in ("ar", "mtp"):
            d = Drafter.load(Path(a.drafters) / name / "drafter", device=dev, dtype=dtype).eval()
        m = build_method(d.config.variant if d else name, tgt, drafter=d, mtp=mtp)
        m.name = name
        return m

    out = Path(a.out)
    methods = a.methods.split(",")
    # 1. per-round stage breakdown at batch `--batch`, fixed length, EOS ignored
    rows = []
    for name in methods:
        m = method(name)
        m.timer = StageTimer(dev == "cuda")
        res = generate(tgt, m, prompts[: a.batch], 0.0, a.tokens, eos_ids=(), seed=0)
        for stage, ms in m.timer.ms_per_round().items():
            rows.append({"method": name, "stage": stage, "ms_per_round": ms, "batch": a.batch,
                         "rounds": len(res[0].accepted), "device": dev})
        print(f"[bench] overhead {name}: " + ", ".join(f"{r['stage']} {r['ms_per_round']:.3f}" for r in rows
                                                        if r["method"] == name))
    write_text(out / "overhead.csv", pd.DataFrame(rows).to_csv(index=False))
    # 2. throughput at each batch cap with dynamic batching, natural EOS
    rows = []
    for temp in [float(t) for t in a.temperatures.split(",")]:
        for name in methods:
            m = method(name)
            for cap in [int(c) for c in a.caps.split(",")]:
                reqs = prompts[: a.prompts]
                _sync(dev)
                t0 = time.perf_counter()
                res = serve(tgt, m, reqs, cap, temp, a.max_new_tokens, eos, seed=0)
                n_out = sum(len(r.output_ids) for r in res)
                acc = [x for r in res for x in r.accepted]
                _sync(dev)
                wall = time.perf_counter() - t0
                rows.append({"method": name, "temperature": temp, "batch_cap": cap, "dataset": "humaneval",
                             "batching": "dynamic", "requests": len(reqs), "output_tokens": n_out, "wall_s": wall,
                             "tok_per_s": n_out / wall, "per_verify": 1 + sum(acc) / max(1, len(acc))})
                print(f"[bench] throughput {name} T={temp:g} B{cap}: {n_out / wall:.1f} tok/s")
    write_text(out / "throughput.csv", pd.DataFrame(rows).to_csv(index=False))
    # 3. our loop vs a plain HF loop, batch 1, T = 0
    rows = []
    weight_bytes = sum(p.numel() * p.element_size() for p in tgt.model.parameters())
    for i, pr in enumerate(prompts[: a.hf_prompts]):
        _sync(dev)
        t0 = time.perf_counter()
        ref = tgt.model.generate(torch.tensor([pr], device=dev), max_new_tokens=a.max_new_tokens, do_sample=False,
                                 eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)[0, len(pr):].tolist()
        _sync(dev)
        t_hf = time.perf_counter() - t0
        for name in methods:
            m = method(name)
            _sync(dev)
            t0 = time.perf_counter()
            r = generate(tgt, m, [pr], 0.0, a.max_new_tokens, eos)[0]
            _sync(dev)
            t = time.perf_counter() - t0
            rows.append({"prompt": i, "method": name, "tokens": len(r.output_ids), "ours_tok_per_s": len(r.output_ids) / t,
                         "hf_ar_tok_per_s": len(ref) / t_hf, "speedup_vs_hf_ar": t_hf / t * len(r.output_ids) / max(1, len(ref)),
                         "identical": r.output_ids == ref,
                         "ar_hbm_bound_tok_per_s": a.bandwidth / weight_bytes})
    df = pd.DataFrame(rows)
    write_text(out / "hf.csv", df.to_csv(index=False))
    print(df.groupby("method")[["ours_tok_per_s", "hf_ar_tok_per_s", "speedup_vs_hf_ar", "identical"]].mean())
    write_meta(out / "meta.json", vars(a))


if __name__ == "__main__":
    main()
