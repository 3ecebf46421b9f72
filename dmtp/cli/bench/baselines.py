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


def hf_generate(tgt, prompt: list[int], tokens: int, static: bool = True):
    """HF transformers' `generate`, batch 1, T = 0: with `static` its own fast path (`cache_implementation="static"`,
    on CUDA the forward compiled with CUDA graphs; the first call compiles), else the plain loop (DynamicCache).
    Returns a function that decodes once: (output ids, wall seconds)."""
    ids = torch.tensor([prompt], device=tgt.device)
    kw = {"max_new_tokens": tokens, "do_sample": False, "pad_token_id": 0}
    if static:
        kw["cache_implementation"] = "static"

    def once():
        out, wall = timed(tgt.device, tgt.model.generate, ids, **kw)
        return out[0, len(prompt):].tolist(), wall
    return once


def engine_once(tgt, prompt: list[int], tokens: int, label: str):
    """A batch-1 AR server on engine label `label` (`engine_setting`), warmed up on `prompt` (its graphs captured).
    Returns a function that decodes `prompt` once: (output ids, wall seconds)."""
    srv = Server(tgt, AR(), 1, capacity_for([prompt], tokens, 0), 0.0, tokens, engine=engine_setting(label))
    srv.run([prompt])

    def once():
        (res,), wall = timed(tgt.device, srv.run, [prompt])
        return res.output_ids, wall
    return once


def other_words(label: str, first: str) -> str:
    """The name suffix of an engine timed beside the run's own (`first`; labels "engine-<label>"): its options
    (`label_words`), and ", untuned kernels" where the run's own engine is the autotuned one and it is not."""
    label, first = label.removeprefix("engine-"), first.removeprefix("engine-")
    tuned = [engine_setting(x).tuning == "autotune" for x in (label, first)]
    return label_words(label) + (", untuned kernels" if tuned[1] and not tuned[0] else "")


def batch1_baselines(tgt, prompt, tokens, bandwidth, setup, hf_loop=True,
                     engines=B1_ENGINES, repeats: int = 3) -> tuple[list[dict], list[Ratio]]:
    """Batch 1, T = 0, `tokens` new tokens after `prompt` (EOS ignored), side by side in one process: the engine on
    each label of `engines` (`engine_setting`; "hf": the same loop on the HF layers), HF's static-cache compiled
    `generate`, the plain HF loop (`hf_loop`) and AR's HBM bound. Each system is warmed up once, then timed `repeats`
    times, interleaved so that a drift of the machine reaches all alike. tok/s: the median of the repeats; a ratio:
    the median of the per-repeat ratios, their range in its note. Returns baselines.csv rows and ratios (the first
    engine against the others)."""
    nbytes = read_bytes_per_token(tgt)
    bound = bandwidth / nbytes
    tps: dict[str, list[float]] = {}
    outs: dict[str, list[int]] = {}

    def time_them(runners):
        for _ in range(repeats):
            for k, fn in runners.items():
                out, wall = fn()
                tps.setdefault(k, []).append(len(out) / wall)
                outs[k] = out
    # HF's compiled generate first, in a block of its own: its compile (CUDA graph trees) made the engine's graphs
    # captured before it replay into an illegal memory access (H200, torch 2.11); graphs captured after it are fine.
    static = hf_generate(tgt, prompt, tokens)
    static()  # compiles
    time_them({"hf-static": static})
    runners = {f"engine-{label}": engine_once(tgt, prompt, tokens, label) for label in engines}
    if hf_loop:
        runners["hf-loop"] = hf_generate(tgt, prompt, tokens, static=False)
    time_them(runners)
    systems = [k for k in runners if k != "hf-loop"] + ["hf-static"] + ["hf-loop"] * hf_loop  # the rows' order
    ref = outs["engine-hf"]
    for k in systems:
        print(f"[bench] {setup} batch 1 {k}: {spread(tps[k])} tok/s over {repeats} repeats, {len(outs[k])} tokens, "
              f"{'identical to' if outs[k] == ref else 'differs from'} the HF-layer engine")
    first = f"engine-{engines[0]}"
    ours = median(tps[first])

    def paired(a: str, b: str, name: str, direction: str = "report", goal=None) -> Ratio:
        q = [x / y for x, y in zip(tps[a], tps[b])]
        return ratio(setup, name, median(q), direction, goal, "batch 1",
                     f"{median(tps[a]):.1f} vs {median(tps[b]):.1f} tok/s; per repeat {spread(q)}, {repeats} repeats")
    out = [ratio(setup, "AR tok/s / HBM bound", ours / bound, condition="batch 1",
                 note=f"{ours:.1f} tok/s vs {bound:.1f} (weights {nbytes / 1e9:.3f} GB / {bandwidth / 1e12:.1f} "
                      "TB/s)"),
           paired(first, "hf-static", "engine AR / HF static-cache compiled generate", ">=", 1.6),
           paired(first, "engine-hf", "engine AR compiled / on the HF layers")]
    out += [paired(k, "hf-static", f"engine AR / HF static-cache compiled generate{other_words(k, first)}", ">=", 1.6)
            for k in systems if k.startswith("engine-") and k not in (first, "engine-hf")]
    if hf_loop:
        out.append(paired(first, "hf-loop", "engine AR / HF AR loop", ">=", 15))
    table = [{"setup": setup, "system": k, "batch": 1, "tokens": len(outs[k]), "tok_per_s": median(tps[k]),
              "tok_per_s_min": min(tps[k]), "tok_per_s_max": max(tps[k]), "repeats": repeats,
              "hbm_bound_tok_per_s": bound, "identical_to_engine_hf": outs[k] == ref} for k in systems]
    return table, out


def kernel_sweep(tgt, contexts: list[int], tokens: int, setup: str, engine: str = "compiled",
                 low: int = 1000) -> tuple[list[dict], list[Ratio]]:
    """AR at batch 1 on `engine` with each attention kernel (`KINDS`) at contexts of about L tokens each (a random
    prompt of L - `tokens` ids in [low, vocab), then `tokens` new ones, EOS ignored as the shape runs do), one server
    per (L, kernel), warmed up on the same request first. Returns kernels.csv rows and one ratio per L (dense / flex
    tok/s: above 1, the dense kernel is the faster one at that context)."""
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
        for kind, sfx in KINDS.items():
            ids, wall = engine_once(tgt, prompt, tokens, engine + sfx)()
            tps[kind] = len(ids) / wall
            rows.append({"setup": setup, "context": L, "capacity": cap, "kernel": kind, "batch": 1,
                         "tokens": len(ids), "tok_per_s": tps[kind], "device": device_name(tgt.device)})
            print(f"[bench] {setup} kernel sweep, context {L} (cache {cap} rows), {kind}: {tps[kind]:.1f} tok/s")
        out.append(ratio(setup, f"AR dense / flex attention, context {L}", tps["dense"] / tps["flex"],
                         condition="batch 1", note=f"{tps['dense']:.1f} vs {tps['flex']:.1f} tok/s"))
    return rows, out


def regeneration(tgt, prompts, temperature, tokens, setup, engine=None, label: str | None = None) -> dict:
    """The on-policy data stage's decode (AR, every prompt at once, T = `temperature`, EOS ignored): output tok/s over
    the whole batch (prefill and graph capture included; a warm-up batch compiles first) and the steady ms per step.
    `label`: the row's engine name (default: `engine`'s)."""
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
           "new_tokens": tokens, "temperature": temperature, "output_tokens": n, "wall_s": wall, "tok_per_s": n / wall,
           "ms_per_step": m.timer.ms_per_round(skip=min(4, tokens // 2))["round"]}
    print(f"[bench] {setup} regeneration batch {len(prompts)} ({row['engine']}): {row['tok_per_s']:.0f} tok/s, "
          f"{row['ms_per_step']:.2f} ms per step")
    return row


def regeneration_ratio(row: dict, setup: str, note: str = "") -> Ratio:
    """Regeneration tok/s against its goal (300 k tok/s); `note`: a name suffix (e.g. the attention kernel)."""
    return ratio(setup, f"regeneration tok/s{note}", row["tok_per_s"], ">=", 3e5, f"batch {row['batch']}",
                 f"{row['ms_per_step']:.2f} ms per step, T={row['temperature']:g}, {row['new_tokens']} new tokens, "
                 "prefill and capture included", unit="tok/s")
