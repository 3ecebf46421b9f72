"""The engine's standing measurements beside its baselines, in one process: AR at batch 1 against HF's static-cache
compiled `generate`, the same loop on the HF layers and HF's plain loop (interleaved repeats); the attention kernels
over context lengths (`--kernel-sweep`); the data stage's regeneration (AR over a whole batch)."""
from __future__ import annotations

import torch

from dmtp.analysis.ratios import Ratio
from dmtp.cli.bench.common import (B1_ENGINES, KINDS, StageTimer, device_name, engine_setting, label_of, label_words,
                                   median, ratio, read_bytes_per_token, spread, timed)
from dmtp.config import EngineConfig
from dmtp.engine.decode import Batch, generate
from dmtp.engine.slots import capacity_for
from dmtp.engine.methods import AR
from dmtp.engine.server import Server


def hf_static_generate(tgt, prompt: list[int], tokens: int):
    """HF transformers' own fast path, batch 1: `generate(cache_implementation="static")`, which compiles the forward
    (torch.compile with CUDA graphs) on CUDA. Returns a function that decodes once: (output ids, wall seconds); the
    first call compiles (call it once before timing)."""
    dev = tgt.device
    ids = torch.tensor([prompt], device=dev)
    kw = {"max_new_tokens": tokens, "do_sample": False, "cache_implementation": "static", "pad_token_id": 0}

    def once():
        out, wall = timed(dev, tgt.model.generate, ids, **kw)
        return out[0, len(prompt):].tolist(), wall
    return once


def other_words(label: str, first: str) -> str:
    """The name suffix of an engine timed beside the run's own (`first`; labels "engine-<label>"): its options
    (`label_words`), and ", untuned kernels" where the run's own engine is the autotuned one and it is not."""
    label, first = label.removeprefix("engine-"), first.removeprefix("engine-")
    tuned = [engine_setting(x).tuning == "autotune" for x in (label, first)]
    return label_words(label) + (", untuned kernels" if tuned[1] and not tuned[0] else "")


def batch1_baselines(tgt, prompt, tokens, bandwidth, setup, hf_loop=True,
                     engines=B1_ENGINES, repeats: int = 3) -> tuple[list[dict], list[Ratio]]:
    """Batch 1, T = 0, `tokens` new tokens after `prompt` (EOS ignored), in one process side by side: the engine
    (compiled, the default on CUDA; "<engine>+dense": with the dense attention kernel; "+gw": with the K/V write
    inside the compiled graphs — `engine_setting`), the same loop on the HF
    layers (`engine="hf"`, the engine before compilation), HF's static-cache compiled `generate`, the plain HF loop
    (`hf_loop`), and AR's HBM bound. Every system is warmed up once (the engine's servers capture their graphs, HF's
    generate compiles), then timed `repeats` times in interleaved order (system by system within each repeat), so a
    drift of the machine reaches all of them alike — except HF's compiled generate, timed in a block of its own
    before the engine's graphs are captured (see below). tok/s = the median of the repeats; each ratio is the median
    of the per-repeat ratios with their range in its note. Returns baselines.csv rows and ratios (the first engine
    against the others)."""
    dev = tgt.device
    nbytes = read_bytes_per_token(tgt)
    bound = bandwidth / nbytes
    cap = capacity_for([prompt], tokens, 0)
    tps: dict[str, list[float]] = {}
    outs: dict[str, list[int]] = {}

    def time_them(runners, n):
        for _ in range(n):
            for k, fn in runners.items():
                out, wall = fn()
                tps.setdefault(k, []).append(len(out) / wall)
                outs[k] = out
    # HF's compiled generate first, in a block of its own: its compile (mode "reduce-overhead": CUDA graph trees)
    # left the engine's graphs captured before it replaying into an illegal memory access on the H200 (torch 2.11);
    # graphs captured after it replay correctly.
    static = hf_static_generate(tgt, prompt, tokens)
    static()  # compiles
    time_them({"hf-static": static}, repeats)
    runners = {}
    for label in engines:
        srv = Server(tgt, AR(), 1, cap, 0.0, tokens, engine=engine_setting(label))
        srv.run([prompt])

        def once(srv=srv):
            (res,), wall = timed(dev, srv.run, [prompt])
            return res.output_ids, wall
        runners[f"engine-{label}"] = once
    if hf_loop:
        ids = torch.tensor([prompt], device=dev)

        def loop():
            out, wall = timed(dev, tgt.model.generate, ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
            return out[0, len(prompt):].tolist(), wall
        runners["hf-loop"] = loop
    time_them(runners, repeats)
    runners = {**{k: f for k, f in runners.items() if k != "hf-loop"}, "hf-static": static,
               **{k: f for k, f in runners.items() if k == "hf-loop"}}  # the rows' order: engines, HF's two
    ref = outs["engine-hf"]
    for k in runners:
        print(f"[bench] {setup} batch 1 {k}: {spread(tps[k])} tok/s over {repeats} repeats, {len(outs[k])} tokens, "
              f"{'identical to' if outs[k] == ref else 'differs from'} the HF-layer engine")
    first = f"engine-{engines[0]}"
    ours = median(tps[first])
    b1 = "batch 1"

    def paired(a: str, b: str, name: str, direction: str = "report", goal=None) -> Ratio:
        q = [x / y for x, y in zip(tps[a], tps[b])]
        return ratio(setup, name, median(q), direction, goal, b1,
                     f"{median(tps[a]):.1f} vs {median(tps[b]):.1f} tok/s; per repeat {spread(q)}, {repeats} repeats")
    out = [ratio(setup, "AR tok/s / HBM bound", ours / bound, condition=b1,
                 note=f"{ours:.1f} tok/s vs {bound:.1f} (weights {nbytes / 1e9:.3f} GB / {bandwidth / 1e12:.1f} "
                      "TB/s)"),
           paired(first, "hf-static", "engine AR / HF static-cache compiled generate", ">=", 1.6),
           paired(first, "engine-hf", "engine AR compiled / on the HF layers")]
    for k in runners:
        if k.startswith("engine-") and k != first and k != "engine-hf":
            out.append(paired(k, "hf-static", f"engine AR / HF static-cache compiled generate{other_words(k, first)}",
                              ">=", 1.6))
    if hf_loop:
        out.append(paired(first, "hf-loop", "engine AR / HF AR loop", ">=", 15))
    table = [{"setup": setup, "system": k, "batch": 1, "tokens": len(outs[k]), "tok_per_s": median(tps[k]),
              "tok_per_s_min": min(tps[k]), "tok_per_s_max": max(tps[k]), "repeats": repeats,
              "hbm_bound_tok_per_s": bound, "identical_to_engine_hf": outs[k] == ref} for k in runners]
    return table, out


def kernel_sweep(tgt, contexts: list[int], tokens: int, setup: str, engine: str = "compiled",
                 low: int = 1000) -> tuple[list[dict], list[Ratio]]:
    """AR at batch 1 on `engine` with each attention kernel (`KINDS`) at contexts of about L tokens each (a random
    prompt of L - `tokens` ids in [low, vocab), then `tokens` new ones, EOS ignored as the shape runs do), one server
    per (L, kernel), warmed up on the same request first. Returns kernels.csv rows and one ratio per L (dense / flex
    tok/s: above 1, the dense kernel is the faster one at that context)."""
    dev = tgt.device
    g = torch.Generator().manual_seed(1)
    rows, out = [], []
    longest = tgt.config.max_position_embeddings
    if max(contexts) > longest:
        raise ValueError(f"--kernel-sweep {','.join(map(str, contexts))}: the target has {longest} positions "
                         f"(max_position_embeddings); use contexts <= {longest}")
    for L in contexts:
        prompt = torch.randint(low, tgt.vocab_size, (max(1, L - tokens),), generator=g).tolist()
        cap = capacity_for([prompt], tokens, 0)
        tps = {}
        for kind in KINDS:
            srv = Server(tgt, AR(), 1, cap, 0.0, tokens, engine=engine_setting(engine + KINDS[kind]))
            srv.run([prompt])
            (res,), wall = timed(dev, srv.run, [prompt])
            tps[kind] = len(res.output_ids) / wall
            rows.append({"setup": setup, "context": L, "capacity": cap, "kernel": kind, "batch": 1,
                         "tokens": len(res.output_ids), "tok_per_s": tps[kind], "device": device_name(dev)})
            print(f"[bench] {setup} kernel sweep, context {L} (cache {cap} rows), {kind}: {tps[kind]:.1f} tok/s")
        out.append(ratio(setup, f"AR dense / flex attention, context {L}", tps["dense"] / tps["flex"],
                         condition="batch 1", note=f"{tps['dense']:.1f} vs {tps['flex']:.1f} tok/s"))
    return rows, out


def regeneration(tgt, prompts, temperature, tokens, setup, engine=None, label: str | None = None) -> dict:
    """The on-policy data stage's decode (one `run_generate` batch: AR, every prompt at once, T = `temperature`, EOS
    ignored): output tokens per second over the whole batch (prefill and graph capture included; compilation is
    done by a warm-up batch first) and the steady-state ms per decode step. `label`: the row's engine name (default:
    `engine`)."""
    dev = tgt.device
    gen = torch.Generator(device=dev).manual_seed(1)
    warm = Batch(tgt, AR(), prompts, temperature, tokens, set(), gen, engine=engine)
    for _ in range(3):
        warm.step()
    del warm
    m = AR()
    m.timer = StageTimer(dev.type == "cuda")
    res, wall = timed(dev, generate, tgt, m, prompts, temperature, tokens, seed=1, engine=engine)
    n = sum(len(r.output_ids) for r in res)
    row = {"setup": setup, "engine": label or label_of(EngineConfig.of(engine)), "batch": len(prompts),
           "new_tokens": tokens,
           "temperature": temperature, "output_tokens": n, "wall_s": wall, "tok_per_s": n / wall,
           "ms_per_step": m.timer.ms_per_round(skip=min(4, tokens // 2))["round"]}
    print(f"[bench] {setup} regeneration batch {len(prompts)} ({row['engine']}): {row['tok_per_s']:.0f} tok/s, "
          f"{row['ms_per_step']:.2f} ms per step")
    return row


def regeneration_ratio(row: dict, setup: str, note: str = "") -> Ratio:
    """Regeneration tok/s against its goal (300 k tok/s); `note`: a name suffix (e.g. the attention kernel)."""
    return ratio(setup, f"regeneration tok/s{note}", row["tok_per_s"], ">=", 3e5, f"batch {row['batch']}",
                 f"{row['ms_per_step']:.2f} ms per step, T={row['temperature']:g}, {row['new_tokens']} new tokens, "
                 "prefill and capture included", unit="tok/s")
