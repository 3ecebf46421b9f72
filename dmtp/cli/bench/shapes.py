"""Random-weight timing runs at a model's shape (timing only: every round accepts about nothing): `paper_shape` (a
Qwen3-8B-sized target, 5-layer drafters) and `mini_shape` (the profile's embedded target), their rounds against
DFlash's and AR's, the draft side's share of verify, the host time of admitting newcomers. Each hands what it has
measured to `save(rows, ratios, **csv_rows)` after every part (a run cut short keeps it)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from dmtp.analysis.ratios import Ratio
from dmtp.cli.bench.baselines import batch1_baselines, kernel_sweep, regeneration, regeneration_ratio
from dmtp.cli.bench.common import (DRAFT_SHARE_GOAL, DRAFT_STAGES, KINDS, ROUND_AR_GOAL, b1_engines, device_name,
                                   engine_setting, label_of, label_words, ratio, round_floor, round_goal, stage_times,
                                   timed)
from dmtp.cli.bench.profiling import kernel_profile
from dmtp.config import AblationSpec, EngineConfig
from dmtp.engine.slots import capacity_for
from dmtp.engine.methods import AR, build_method
from dmtp.engine.server import Server
from dmtp.experiment import drafter_config
from dmtp.models import torch_dtype
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.mtp import MTPHead
from dmtp.models.screen import T1Screen
from dmtp.models.target import Target
from dmtp.training.pretrain import build_target


def stage_rows(tgt, m, prompts, tokens, eng, tag: str, head: str | None = None, **extra) -> list[dict]:
    """overhead.csv rows of method `m`'s stage times (`stage_times`) under method name `tag`, printed after `head`."""
    ms, _ = stage_times(tgt, m, prompts, tokens, engine=eng)
    if head:
        print(f"[bench] {head}: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    return [{"method": tag, "stage": s, "ms_per_round": v, "batch": len(prompts), "rounds": tokens,
             "device": device_name(tgt.device), **extra} for s, v in ms.items()]


def by_stage(rows: list[dict]) -> dict:
    """(method, stage) -> ms per round."""
    return {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}


def paper_shape(a, dev, spec: AblationSpec, save):
    """Timing only: a Qwen3-8B-sized dense target (random bf16 weights), one MTP layer, 5-layer drafters of the
    drafter baseline and the main method, batch `--batch`, with both attention kernels of the compiled engine
    (`KINDS`): every round emits about one token, the time per stage is what counts. Then the batch-1 baselines and
    verify of `--batch` x 8 rows against an AR step."""
    torch.manual_seed(0)
    shape = dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, vocab_size=151936)
    cfg = Qwen3Config(num_hidden_layers=36, max_position_embeddings=40960, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **shape)
    with torch.device(dev):
        tgt = Target(AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa"))
        mtp = MTPHead(tgt).eval()
    prompts = torch.randint(1000, 100000, (a.batch, 256), generator=torch.Generator().manual_seed(0)).tolist()
    rows, ratios, setup, batch = [], [], "8b-shape", f"batch {a.batch}"
    screen = T1Screen(tgt, rank=a.screen_rank, topk=a.screen_topk)
    dflash, dmtp = spec.drafter_baseline, spec.main_method
    drafters = {v: Drafter(DrafterConfig(num_hidden_layers=5, num_target_layers=36, variant=v, mask_token_id=151669,
                                         **shape)).to(device=dev, dtype=torch.bfloat16).eval() for v in (dflash, dmtp)}

    def method(name):
        variant = name.split("+")[0]
        return build_method(variant, tgt, drafter=drafters.get(variant), mtp=mtp,
                            screen=screen if "+screen" in name else None)

    names = [dflash, dmtp, dmtp + "+screen"]  # AR: at batch 1 below; the screen with flex attention only
    runs = [(name, sfx) for sfx in KINDS.values() for name in (names if not sfx else names[:2])]
    for name, sfx in runs:
        rows += stage_rows(tgt, method(name), prompts, a.tokens, engine_setting("compiled" + sfx),
                           f"{setup}:{name}{sfx}", f"{setup} {name}{sfx}")
    by = by_stage(rows)
    for name, sfx in runs:
        if name != dflash:
            q = by[(f"{setup}:{name}{sfx}", "round")] / by[(f"{setup}:{dflash}{sfx}", "round")]
            ratios.append(ratio(setup, f"{name} round / {dflash} round{label_words(sfx)}", q, "<=", round_goal(setup),
                                batch))
    ratios.append(round_floor(tgt, mtp, by[(f"{setup}:{dflash}", "round")], a.bandwidth, setup,
                              f"{dmtp} round / {dflash} round", batch))
    save(rows, ratios)
    b1_rows, b1_ratios = batch1_baselines(tgt, prompts[0], a.tokens, a.bandwidth, setup, hf_loop=False,
                                          engines=b1_engines(), repeats=a.repeats)
    ratios += b1_ratios
    save(rows, ratios, baselines=b1_rows)
    if a.kernel_sweep:
        k_rows, k_ratios = kernel_sweep(tgt, a.kernel_sweep, a.tokens, setup)
        ratios += k_ratios
        save(rows, ratios, kernels=k_rows)
    for sfx in KINDS.values():  # the same cache size as the baselines': no recompilation
        tag = f"{setup}:{AR.name}@batch1{sfx}"
        rows += stage_rows(tgt, AR(), prompts[:1], a.tokens, engine_setting("compiled" + sfx), tag)
        v, step = by[(f"{setup}:{dflash}{sfx}", "verify")], by_stage(rows)[(tag, "verify")]
        ratios.append(ratio(setup, f"verify of {a.batch}x8 rows / AR step{label_words(sfx)}", v / step, "<=", 1.2,
                            "AR at batch 1", f"{v:.3f} ms vs {step:.3f} ms"))
    save(rows, ratios)
    if a.kernel_profile:
        for name, m, reqs, sfx in ((AR.name, AR(), prompts[:1], ""), (AR.name, AR(), prompts[:1], "+dense"),
                                   (dflash, method(dflash), prompts, ""), (dmtp, method(dmtp), prompts, "")):
            kernel_profile(tgt, m, reqs, a.tokens, Path(a.out) / f"profile_{setup}_{name}{sfx}.txt",
                           engine=engine_setting("compiled" + sfx))


def mini_shape(a, dev, p, save):
    """Timing only: the profile's embedded target shape (its `engine.dtype` unless `--dtype`), MTP head and drafters
    of the drafter baseline and the main method, random weights: stage times at batch `--batch` (`shape_rounds`), then
    the `--shape-parts` admission, baselines (batch 1) and regen (the data stage's batch-`--regen-batch`
    regeneration). Setup "<profile>-shape"."""
    d, setup, dmtp = p.data, f"{p.name}-shape", p.ablation.main_method
    tgt, mtp, drafters = _shape_models(p, dev, torch_dtype(a.dtype or p.engine.dtype),
                                       (p.ablation.drafter_baseline, dmtp))
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, d.vocab_size - 1, (max(a.batch, a.regen_batch), d.prompt_tokens), generator=g)
    prompts = prompts.tolist()
    own, parts = p.engine.with_(engine="compiled"), set(a.shape_parts)

    def method(name):
        return build_method(name, tgt, drafter=drafters.get(name), mtp=mtp)

    rows, ratios = shape_rounds(a, p, tgt, mtp, method, prompts[: a.batch], own)
    save(rows, ratios)
    if "admission" in parts:
        save(rows, ratios, admission=admission(tgt, {n: method(n) for n in (AR.name, dmtp)}, prompts, 16, setup, own))
    if a.kernel_profile:  # where the profile engine's round goes, before anything else is compiled
        for name in (dmtp, AR.name):
            kernel_profile(tgt, method(name), prompts[: a.batch], a.tokens,
                           Path(a.out) / f"profile_{setup}_{name}.txt", engine=own)
    if "baselines" in parts:
        b1_rows, b1 = batch1_baselines(tgt, prompts[0], a.tokens, a.bandwidth, setup, engines=b1_engines(own),
                                       repeats=a.repeats)
        ratios += b1
        save(rows, ratios, baselines=b1_rows)
    if a.kernel_sweep:
        k_rows, k_ratios = kernel_sweep(tgt, a.kernel_sweep, a.tokens, setup, low=2)
        ratios += k_ratios
        save(rows, ratios, kernels=k_rows)
    if a.regen_batch and "regen" in parts:
        reqs = prompts[: a.regen_batch]
        row = regeneration(tgt, reqs, d.temperature, d.new_tokens, setup, engine=own, label=label_of(own))
        ratios.append(regeneration_ratio(row, setup, label_words(label_of(own))))
        save(rows, ratios, regen=[row])
        if a.kernel_profile:  # the data stage's decode: AR over the whole batch (32 tokens: the kernels repeat)
            kernel_profile(tgt, AR(), reqs, 32, Path(a.out) / f"profile_{setup}_regen.txt", d.temperature, engine=own)


def shape_rounds(a, p, tgt, mtp, method, prompts, own: EngineConfig) -> tuple[list[dict], list[Ratio]]:
    """Stage times of AR and both methods (`--shape-methods`) on the profile's engine `own` and beside it
    (`shape_engines`): overhead rows and ratios (DMTP round / DFlash's, the draft side's, each engine against `own`)."""
    setup, dflash, dmtp = f"{p.name}-shape", p.ablation.drafter_baseline, p.ablation.main_method
    methods = tuple(n for n in (AR.name, dflash, dmtp) if n in (a.shape_methods or (n,)))
    engines = shape_engines(own, a.shape_engines, "engines" in a.shape_parts)
    both = dflash in methods and dmtp in methods  # the round ratios need both
    rows, ratios, cond = [], [], f"batch {a.batch}"
    for tail, eng in engines.items():
        for name in methods:
            tag = f"{setup}:{name}{tail}"
            rows += stage_rows(tgt, method(name), prompts, a.tokens, eng, tag, f"{tag} ({label_of(eng)})",
                               engine=label_of(eng))
    by = by_stage(rows)
    for tail, eng in engines.items():
        if both:
            q = by[(f"{setup}:{dmtp}{tail}", "round")] / by[(f"{setup}:{dflash}{tail}", "round")]
            goal = {"direction": "<=", "goal": round_goal(p.name)} if not tail else {}
            ratios.append(ratio(setup, f"{dmtp} round / {dflash} round{tail and f', {label_of(eng)}'}", q, **goal,
                                condition=cond))
        if not tail:
            ratios += draft_side_ratios(by, methods, lambda n: f"{setup}:{n}", setup, a.batch)
        elif a.shape_engines:  # each method's steady round on this engine against the profile's
            for name in methods:
                mine, base = by[(f"{setup}:{name}{tail}", "round")], by[(f"{setup}:{name}", "round")]
                ratios.append(ratio(setup, f"{name} round, {label_of(eng)} / {label_of(own)}", mine / base,
                                    condition=cond, note=f"{mine:.3f} vs {base:.3f} ms per round, the first 16 "
                                    "rounds excluded"))
    if both:
        ratios.append(round_floor(tgt, mtp, by[(f"{setup}:{dflash}", "round")], a.bandwidth, setup,
                                  f"{dmtp} round / {dflash} round", cond))
    return rows, ratios


def _shape_models(p, dev, dtype, variants) -> tuple:
    """Random weights (seed 0) at the profile's shape: the target (decoding every token: no end-of-text), its MTP
    head and a drafter of each of `variants`."""
    d = p.data
    torch.manual_seed(0)
    with torch.device(dev):
        tgt, mtp = build_target(p.model.arch, d.vocab_size, eos_id=1, dtype=dtype)
    tgt.model.eval().requires_grad_(False)
    tgt.model.generation_config.eos_token_id = None  # random weights: every system decodes all `--tokens`
    mtp = mtp.eval().requires_grad_(False)
    base = drafter_config(p, tgt.config, mask_token_id=d.vocab_size - 1)
    drafters = {v: Drafter(DrafterConfig(**base, variant=v, variant_config=p.drafter.variants.get(v, {})))
                .to(device=dev, dtype=dtype).eval() for v in variants}
    return tgt, mtp, drafters


def shape_engines(own: EngineConfig, labels: list[str] | None, side_by_side: bool) -> dict[str, EngineConfig]:
    """The engines `mini_shape` times every method on, tag suffix -> config: the profile's own first (""); with
    `side_by_side` (part `engines`), the engine labels `labels` derived from `own` (`engine_setting`), or by default
    the compiled engine's defaults (where the profile's differs) and the HF layers."""
    engines = {"": own}
    if not side_by_side:
        return engines
    if labels:
        for label in labels:
            eng = engine_setting(label, own)
            if label_of(eng) != label_of(own):  # the same settings as the profile's: timed once
                engines[f"@{label}"] = eng
        return engines
    if label_of(own) != "compiled":
        engines["@compiled"] = engine_setting("compiled")
    engines["@hf"] = own.with_(engine="hf")
    return engines


def draft_side_ratios(by: dict, methods, tag, setup: str, batch: int, note: str = "") -> list[Ratio]:
    """DMTP round / AR step (goal <= 1.5) and the draft side (`DRAFT_STAGES`) / verify (goal <= 0.15) at one shape and
    batch; `by` maps (method tag, stage) to ms, `tag(name)` names a method's rows."""
    out, cond = [], f"batch {batch}"
    for name in methods:
        rnd, ver = by.get((tag(name), "round")), by.get((tag(name), "verify"))
        side = [by[(tag(name), st)] for st in DRAFT_STAGES if (tag(name), st) in by]
        if rnd is None or ver is None or not side:  # no draft side: the target alone
            continue
        draft = sum(side)
        out.append(ratio(setup, f"{name} draft side / verify{note}", draft / ver, "<=", DRAFT_SHARE_GOAL, cond,
                         f"{draft:.3f} ms (t1_prep + drafter + mtp + drafter_ctx) vs verify {ver:.3f} ms"))
        ar = by.get((tag(AR.name), "round"))
        if ar:
            out.append(ratio(setup, f"{name} round / AR step{note}", rnd / ar, "<=", ROUND_AR_GOAL, cond,
                             f"{rnd:.3f} vs {ar:.3f} ms"))
    return out


def admission(tgt, methods: dict, prompts: list[list[int]], tokens: int, setup: str, eng: EngineConfig,
              groups=(1, 8)) -> list[dict]:
    """The host time a `Server` spends admitting a group of newcomers (`Server.admit_s`), per method and group size,
    on `eng`'s prompt pass, the compiled one and the HF one."""
    rows = []
    for prefill in dict.fromkeys([eng.prefill, "compiled", "hf"]):
        e = eng.with_(prefill=prefill, admit=1)
        for name, m in methods.items():
            for g in groups:  # g slots: requests of one length finish together, g newcomers join at once
                srv = Server(tgt, m, g, capacity_for(prompts, tokens, m.k), 0.0, tokens, engine=e)
                srv.run(prompts[:g])  # start-up: graphs captured
                srv.run(prompts[g: 2 * g])  # the first admitted group: its prompt pass compiled
                srv.admit_s, srv.groups = 0.0, 0
                _, wall = timed(tgt.device, srv.run, prompts[: 4 * g])
                srv.close()
                rows.append({"setup": setup, "method": name, "prefill": prefill, "group": g, "groups": srv.groups,
                             "ms_per_group": 1e3 * srv.admit_s / max(srv.groups, 1), "wall_s": wall})
                print(f"[bench] {setup} admission {name} ({prefill} prompt pass), groups of {g}: "
                      f"{rows[-1]['ms_per_group']:.2f} ms per group ({srv.groups} groups)")
    return rows
