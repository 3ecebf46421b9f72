"""Random-weight timing runs at a model's shape (timing only: every round accepts about nothing): `paper_shape` (a
Qwen3-8B-sized target, 5-layer drafters) and `mini_shape` (the profile's embedded target), their rounds against
DFlash's and AR's, the draft side's share of verify, the host time of admitting newcomers."""
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


def _kind(kind: str) -> str:
    """A ratio name's suffix for the attention kernel (part of the name: flex and dense are separate records)."""
    return label_words(KINDS[kind])


def paper_shape(a, dev, spec: AblationSpec, save=lambda *parts: None) -> tuple[list[dict], list[Ratio], list[dict]]:
    """Timing only: a Qwen3-8B-sized dense target (random bf16 weights), one MTP layer, 5-layer drafters of the
    drafter baseline and the main method, batch `--batch`; every round accepts ~nothing, so each emits one token —
    what matters is the time per stage —, with both attention kernels of the compiled engine (`KINDS`). Then the
    batch-1 baselines (`batch1_baselines`) and verify of `--batch` x 8 rows against an AR step. Returns overhead rows,
    ratios and baseline rows, also handed to `save` after each part (a run cut short keeps what it measured)."""
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    with torch.device(dev):
        tgt = Target(AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa"))
        mtp = MTPHead(tgt).eval()
    prompts = torch.randint(1000, 100000, (a.batch, 256), generator=torch.Generator().manual_seed(0)).tolist()
    rows, ratios, setup, batch = [], [], "8b-shape", f"batch {a.batch}"
    screen = T1Screen(tgt, rank=a.screen_rank, topk=a.screen_topk)
    dflash, dmtp = spec.drafter_baseline, spec.main_method
    drafters = {}
    for v in (dflash, dmtp):
        c = DrafterConfig(hidden_size=4096, vocab_size=151936, num_hidden_layers=5, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, intermediate_size=12288, num_target_layers=36,
                          variant=v, mask_token_id=151669)
        drafters[v] = Drafter(c).to(device=dev, dtype=torch.bfloat16).eval()

    def method(name):
        variant = name.split("+")[0]
        return build_method(variant, tgt, drafter=drafters.get(variant), mtp=mtp,
                            screen=screen if "+screen" in name else None)
    names = [dflash, dmtp, dmtp + "+screen"]  # AR: at batch 1 below
    for kind, sfx in KINDS.items():  # the compiled engine's two attention kernels side by side (the screen: flex)
        eng = engine_setting("compiled" + sfx)
        for name in names[: 3 if kind == "flex" else 2]:
            ms, res = stage_times(tgt, method(name), prompts, a.tokens, engine=eng)
            rows += [{"method": f"{setup}:{name}{sfx}", "stage": stage, "ms_per_round": v, "batch": a.batch,
                      "rounds": a.tokens, "device": device_name(dev)} for stage, v in ms.items()]
            print(f"[bench] {setup} {name}{sfx}: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}
    for kind, sfx in KINDS.items():
        for name in names[1: 3 if kind == "flex" else 2]:
            q = by[(f"{setup}:{name}{sfx}", "round")] / by[(f"{setup}:{dflash}{sfx}", "round")]
            ratios.append(ratio(setup, f"{name} round / {dflash} round{_kind(kind)}", q, "<=", round_goal(setup),
                                batch))
    ratios.append(round_floor(tgt, mtp, by[(f"{setup}:{dflash}", "round")], a.bandwidth, setup,
                              f"{dmtp} round / {dflash} round", batch))
    save(rows, ratios)
    b1_rows, b1_ratios = batch1_baselines(tgt, prompts[0], a.tokens, a.bandwidth, setup, hf_loop=False,
                                          engines=b1_engines(), repeats=a.repeats)
    ratios += b1_ratios
    save(rows, ratios, b1_rows)
    if a.kernel_sweep:
        k_rows, k_ratios = kernel_sweep(tgt, a.kernel_sweep, a.tokens, setup)
        ratios += k_ratios
        save(rows, ratios, b1_rows, kernels=k_rows)
    for kind, sfx in KINDS.items():  # the same cache size as the baselines': no recompilation
        ar1, _ = stage_times(tgt, AR(), prompts[:1], a.tokens, engine=engine_setting("compiled" + sfx))
        rows += [{"method": f"{setup}:{AR.name}@batch1{sfx}", "stage": s, "ms_per_round": v, "batch": 1,
                  "rounds": a.tokens, "device": device_name(dev)} for s, v in ar1.items()]
        v = by[(f"{setup}:{dflash}{sfx}", "verify")]
        ratios.append(ratio(setup, f"verify of {a.batch}x8 rows / AR step{_kind(kind)}", v / ar1["verify"], "<=",
                            1.2, "AR at batch 1", f"{v:.3f} ms vs {ar1['verify']:.3f} ms"))
    save(rows, ratios, b1_rows)
    if a.kernel_profile:
        for name, m, reqs, kind in ((AR.name, AR(), prompts[:1], "flex"), (AR.name, AR(), prompts[:1], "dense"),
                                    (dflash, method(dflash), prompts, "flex"), (dmtp, method(dmtp), prompts, "flex")):
            kernel_profile(tgt, m, reqs, a.tokens, Path(a.out) / f"profile_{setup}_{name}{KINDS[kind]}.txt",
                           engine=engine_setting("compiled" + KINDS[kind]))
    return rows, ratios, b1_rows


def mini_shape(a, dev, p, save=lambda *parts: None) -> tuple[list, list[Ratio], list, list]:
    """Timing only: the profile's embedded target shape (its `engine.dtype` unless `--dtype`), MTP head and drafters
    of the drafter baseline and the main method, random weights: stage times of AR and both methods at batch
    `--batch` on the profile's engine (`Profile.engine`), on the compiled engine's defaults and on the HF layers; the
    round against AR and the draft side's share of verify; the batch-1 baselines; the data stage's
    batch-`--regen-batch` regeneration; the host time of admitting newcomers. Setup "<profile>-shape"."""
    profile = p.name
    spec, d, setup = p.ablation, p.data, f"{profile}-shape"
    dflash, dmtp = spec.drafter_baseline, spec.main_method
    tgt, mtp, drafters = _shape_models(p, dev, torch_dtype(a.dtype or p.engine.dtype), (dflash, dmtp))
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, d.vocab_size - 1, (max(a.batch, a.regen_batch), d.prompt_tokens), generator=g)
    prompts = prompts.tolist()
    rows, ratios = [], []
    own = p.engine.with_(engine="compiled")
    parts = set(a.shape_parts)
    engines = shape_engines(own, getattr(a, "shape_engines", None), "engines" in parts)
    methods = tuple(n for n in (AR.name, dflash, dmtp) if n in (getattr(a, "shape_methods", None) or (n,)))
    both = dflash in methods and dmtp in methods  # the round ratios need both
    for tail, eng in engines.items():
        for name in methods:
            m = build_method(name, tgt, drafter=drafters.get(name), mtp=mtp)
            ms, _ = stage_times(tgt, m, prompts[: a.batch], a.tokens, engine=eng)
            tag = f"{setup}:{name}{tail}"
            rows += [{"method": tag, "stage": s, "ms_per_round": v, "batch": a.batch, "rounds": a.tokens,
                      "device": device_name(dev), "engine": label_of(eng)} for s, v in ms.items()]
            print(f"[bench] {tag} ({label_of(eng)}): " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    by = {(r["method"], r["stage"]): r["ms_per_round"] for r in rows}
    for tail, eng in engines.items():
        note = "" if not tail else f", {label_of(eng)}"
        if both:
            q = by[(f"{setup}:{dmtp}{tail}", "round")] / by[(f"{setup}:{dflash}{tail}", "round")]
            goal = {"direction": "<=", "goal": round_goal(profile)} if not tail else {}
            ratios.append(ratio(setup, f"{dmtp} round / {dflash} round{note}", q, **goal,
                                condition=f"batch {a.batch}"))
        if not tail:
            ratios += draft_side_ratios(by, methods, lambda n: f"{setup}:{n}", setup, a.batch)
        elif getattr(a, "shape_engines", None):  # each method's steady round on this engine against the profile's
            for name in methods:
                mine, base = by[(f"{setup}:{name}{tail}", "round")], by[(f"{setup}:{name}", "round")]
                ratios.append(ratio(setup, f"{name} round, {label_of(eng)} / {label_of(own)}", mine / base,
                                    condition=f"batch {a.batch}", note=f"{mine:.3f} vs {base:.3f} ms per round, "
                                    "the first 16 rounds excluded"))
    if both:
        ratios.append(round_floor(tgt, mtp, by[(f"{setup}:{dflash}", "round")], a.bandwidth, setup,
                                  f"{dmtp} round / {dflash} round", f"batch {a.batch}"))
    save(rows, ratios)
    if "admission" in parts:
        adm = admission(tgt, {n: build_method(n, tgt, drafter=drafters.get(n), mtp=mtp) for n in (AR.name, dmtp)},
                        prompts, 16, setup, own)
        save(rows, ratios, admission=adm)
    if a.kernel_profile:  # where the profile engine's round goes, before anything else is compiled
        for name in (dmtp, AR.name):
            m = build_method(name, tgt, drafter=drafters.get(name), mtp=mtp)
            kernel_profile(tgt, m, prompts[: a.batch], a.tokens, Path(a.out) / f"profile_{setup}_{name}.txt",
                           engine=own)
    b1_rows = []
    if "baselines" in parts:
        b1_rows, b1 = batch1_baselines(tgt, prompts[0], a.tokens, a.bandwidth, setup, engines=b1_engines(own),
                                       repeats=a.repeats)
        ratios += b1
        save(rows, ratios, b1_rows)
    if a.kernel_sweep:
        k_rows, k_ratios = kernel_sweep(tgt, a.kernel_sweep, a.tokens, setup, low=2)
        ratios += k_ratios
        save(rows, ratios, b1_rows, kernels=k_rows)
    regen = []
    if a.regen_batch and "regen" in parts:
        reqs = prompts[: a.regen_batch]
        row = regeneration(tgt, reqs, d.temperature, d.new_tokens, setup, engine=own, label=label_of(own))
        regen.append(row)
        ratios.append(regeneration_ratio(row, setup, label_words(label_of(own))))
        save(rows, ratios, b1_rows, regen)
        if a.kernel_profile:  # the data stage's decode: AR over the whole batch (32 tokens: the kernels repeat)
            kernel_profile(tgt, AR(), reqs, 32, Path(a.out) / f"profile_{setup}_regen.txt",
                           d.temperature, engine=own)
    return rows, ratios, b1_rows, regen


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
    """The engines `mini_shape` times every method on, tag suffix -> config: the profile's own first (""); with part
    `engines`, beside it the engine labels `labels` (`engine_setting`, derived from the profile's: its dtype kept;
    e.g. "compiled+tuned": the autotuned kernels against the fixed ones), or by default the compiled engine's defaults
    (where the profile's differs) and the HF layers."""
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
    """The round against plain decoding at one shape and batch: DMTP round / AR step (goal <= 1.5) and the draft side
    (T1 head + embedding + fusion, the drafter, the MTP step, the drafter's context update) / verify (goal <= 0.15)
    — `by` maps (method tag, stage) to ms; `tag(name)` names a method's rows."""
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
    """The host time a `Server` spends admitting a group of newcomers (their prompt pass, the method's own prefill,
    the move into the slots: `Server.admit_s`), per method and group size, on `eng`'s prompt pass, the compiled one
    and the HF one."""
    rows = []
    dev = tgt.device
    for prefill in dict.fromkeys([eng.prefill, "compiled", "hf"]):
        e = eng.with_(prefill=prefill, admit=1)
        for name, m in methods.items():
            for g in groups:  # g slots: requests of one length finish together, g newcomers join at once
                srv = Server(tgt, m, g, capacity_for(prompts, tokens, m.k), 0.0, tokens, engine=e)
                srv.run(prompts[:g])  # start-up: graphs captured
                srv.run(prompts[g: 2 * g])  # the first admitted group: its prompt pass compiled
                srv.admit_s, srv.groups = 0.0, 0
                _, wall = timed(dev, srv.run, prompts[: 4 * g])
                srv.close()
                rows.append({"setup": setup, "method": name, "prefill": prefill, "group": g, "groups": srv.groups,
                             "ms_per_group": 1e3 * srv.admit_s / max(srv.groups, 1), "wall_s": wall})
                print(f"[bench] {setup} admission {name} ({prefill} prompt pass), groups of {g}: "
                      f"{rows[-1]['ms_per_group']:.2f} ms per group ({srv.groups} groups)")
    return rows
