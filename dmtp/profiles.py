"""Named profiles: functions deriving from `base()` by overriding fields (`dmtp.schema.derive`: a dict merges
into the base's section, unknown keys fail). The schema, with a comment per field, is `dmtp/config/`.

    dmtp pipeline --profile tiny     # 2-core CPU, <= 15 min
    dmtp pipeline --profile mini     # one H100/H200 (`bash experiments/one_gpu.sh`: its parts share the GPU)
    dmtp pipeline --profile smoke    # CI: the same stages, seconds
    dmtp dryrun --profile qwen3.6-27b  # paper scale: target (config only), MTP head, every drafter on the meta device
    python -m dmtp.profiles mini folder realization=3   # what experiments/one_gpu.sh asks (`ANSWERS`)
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from dmtp.config import PaperScale, PretrainConfig, Profile, TargetArch, TrainConfig
from dmtp.checks import require
from dmtp.config.ablation import code, open_reproduction
from dmtp.experiment import check_models
from dmtp.schema import derive, override


def base() -> Profile:
    """The schema's defaults running the Code ablation."""
    return Profile(name="base", ablation=code())


def tiny() -> Profile:
    """2-core CPU, a smoke run of the whole method: a 4-layer 128-wide target, 1-layer drafters, 8 + 24 HumanEval
    prompts. Its drafters see ~0.26 M tokens (1/40 of mini's) and stop learning at ~10 % first-token accuracy, so
    DFlash stays near 1.07 and the variants cannot differ: `mini` (one GPU) is the smallest run that shows the
    method."""
    return derive(
        base(), "tiny",
        # the standard library of CPython 3.11.7 alone (the CPU environment's Python: requirements/cpu.lock); its
        # train digest is checked before the corpus is written
        data=dict(corpus_sources=("stdlib==3.11.7",), corpus_digest="c421305be893fb21"),
        model=dict(arch=TargetArch(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=32, intermediate_size=384)),
        pretrain=PretrainConfig(tokens=1_500_000, seq_len=256, batch_size=16, lr=3e-3),
        train=TrainConfig(steps=150, batch_size=8, max_len=224, anchors_per_seq=32, save_every=50),
        ablation=dict(continue_steps=50, seeds=(0,)),  # one seed: the 2-core CPU budget
        eval=dict(sets={"humaneval": 24}, new_tokens=64,
                  ood={}, ood_runs=("ar", "mtp", "dflash", "fusion", "zero_init_residual")),  # (the standard
        # library's corpus holds no pytest-style test module to cut out-of-distribution prompts from; mini's has)
        verify=dict(caps=(1, 8), prompts=24, small_cap_prompts=4, repeats=1, max_new_tokens=64),
        # Inductor's default kernels (the library's default is autotuned): a CPU ignores the setting, and for `mini`
        # (derived from here) autotuning every method's compile at each batch shape across ~15 server start-ups and 4
        # evaluation processes would add minutes to every run (an autotuned lossless test took 25-75 s of compilation on
        # the tiny test models)
        engine=dict(tuning="default"),
    )


def smoke() -> Profile:
    """CI: every stage of the pipeline in well under a minute of compute; numbers are meaningless."""
    return derive(
        tiny(), "smoke",
        data=dict(corpus_bytes=600_000, tokenizer_bytes=600_000, vocab_size=512, prompts=16, new_tokens=24, batch=16,
                  corpus_sources=("stdlib",), corpus_digest=""),  # any Python's standard library: CI on any version
        model=dict(arch=TargetArch(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                   head_dim=32, intermediate_size=128)),
        pretrain=PretrainConfig(tokens=40_000, seq_len=64, batch_size=8),
        drafter=dict(intermediate=128),
        train=TrainConfig(steps=6, batch_size=4, max_len=96, anchors_per_seq=8, save_every=3, log_every=2),
        ablation=dict(continue_steps=3, seeds=(0, 1), budgets=(2, 4), curve=("dflash", "zero_init_residual")),
        eval=dict(sets={"humaneval": 4}, subsets={"humaneval8": ("humaneval", 3)}, new_tokens=12, batch=8,
                  temperatures=(0.0, 1.0), modes=("natural", "fixed"), ood={}),
        verify=dict(caps=(1, 4), prompts=4, small_cap_prompts=2, repeats=1, max_new_tokens=12),
    )


def mini() -> Profile:
    """One H100 or H200 (`bash experiments/one_gpu.sh`; its size and cost in one place: results/mini/NOTES.md, "The
    `mini` run: its size and cost"), in the paper's cost regime: a deep, narrow target (32 layers of width 384 and a
    native MTP head; MobileLLM's deep-and-thin shape) against 2-layer drafters and the 1-layer MTP step, so a round's
    draft side is a small part of verify as for Qwen3.6 (64 layers against 5 + 1); decoded in bf16 as the paper does,
    with the dense attention kernel (at this shape every stage is kernel-latency bound: docs/DESIGN.md, "The mini
    target"). Drafters: 1,000 steps on ~10 M on-policy tokens, 2 drafter seeds of the main and control rows; T = 0 and
    1, natural mode (HumanEval's stop strings). The target ends with the unlikelihood step against its greedy loops
    (AR's loop_frac on HumanEval 0.73-0.84 without it, 0.26 with it in the loop study). Independent repeats are
    realizations (`--set realization=k`, results/mini/r<k>); the report pools those of one experiment."""
    return derive(
        tiny(), "mini",
        # the corpus: four pure-Python distributions at pinned versions (transformers and torch's own dependencies:
        # environment.yml), read from the installed distribution or its wheel (`make wheels`), the same bytes on every
        # machine (73.2 MB of train text, pinned by digest; sympy's, networkx's and mpmath's pytest modules give the
        # `pytests` set). Its non-test files give ~24 k prompts at 20 per file, so each prompt is answered twice
        data=dict(corpus_bytes=300_000_000, tokenizer_bytes=10_000_000, vocab_size=8192, prompts=20_000,
                  prompt_tokens=128, new_tokens=256, batch=2048, prompts_per_doc=20, samples=2,
                  corpus_sources=("transformers==5.17.0", "sympy==1.14.0", "networkx==3.6.1", "mpmath==1.3.0"),
                  corpus_digest="07aacf3fa29bd752"),
        model=dict(arch=TargetArch(hidden_size=384, num_hidden_layers=32, num_attention_heads=6, num_key_value_heads=2,
                                   head_dim=64, intermediate_size=1024),
                   checkpoint_dtype="bf16"),
        # 100 M tokens, then 300 steps of sequence-level unlikelihood on the trailing loops of the target's own greedy
        # continuations (alpha 1, "loop" negatives: the loop study's arm that met both loop goals with the least
        # loss of top-1, docs/DESIGN.md "Loops and the unlikelihood step")
        pretrain=PretrainConfig(tokens=100_000_000, seq_len=512, batch_size=96, lr=2e-3,
                                unloop_steps=300, unloop_alpha=1.0, unloop_negatives="loop"),
        drafter=dict(layers=2, heads=6, kv_heads=2, intermediate=1024),
        train=TrainConfig(steps=1000, batch_size=32, max_len=384, anchors_per_seq=64, save_every=500,
                          log_every=50),
        ablation=dict(continue_steps=300, seeds=(0, 1), budgets=(), curve=()),
        eval=dict(sets={"humaneval": 164}, new_tokens=256, batch=164, temperatures=(0.0, 1.0), modes=("natural",),
                  ood={"pytests": 164}),
        verify=dict(caps=(1, 32), prompts=164, small_cap_prompts=16, repeats=2, max_new_tokens=256),
        # the servers (bench's throughput; no record of the data stage or the evaluation depends on these two): the next
        # group of newcomers prefilled beside the decode, one round copy in flight. Timed side by side with the
        # servers that wait for the newcomers' prompt pass with two round copies in flight (admit_beside 0,
        # in_flight 2), faster at the same outputs (measured: results/mini/NOTES.md, "The `mini` run")
        # kernels: the fixed choices (records independent of what else runs on the card: realizations may share one)
        engine=dict(dtype="bf16", attention="dense", prefill="graphed", admit=8, admit_beside=2, in_flight=1,
                    tuning="fixed"),
        realization=1,
    )


PROFILES = {"tiny": tiny, "mini": mini, "smoke": smoke}


def get_profile(name: str) -> Profile:
    """The named profile as written (torch-free; `resolve` checks it against the models too)."""
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]()


def resolve(name: str, sets=()) -> Profile:
    """What a command runs: the named profile with its `--set` assignments (`dmtp.schema.override`), checked against
    the models' registries (`dmtp.experiment.check_models`: variants and their settings, backbones, taps)."""
    return check_models(override(get_profile(name), list(sets)))


# --- paper scale (open reproduction) -------------------------------------------------------------------------------
# MASK token per model family: the id the public DFlash drafters of that family use. Qwen3.5/3.6 (vocab 248320,
# padded): 248070, as in z-lab's Qwen3.6 DFlash drafters' `dflash_config.mask_token_id`; Qwen3 (vocab 151936):
# 151669, the `<|MASK|>` token DFlash adds to the tokenizer. Both ids lie inside the target's embedding matrix.
MASK_TOKENS = {"qwen3": 151669, "qwen3_5": 248070}


def family_mask_token(model_type: str, vocab_size: int) -> int | None:
    """The MASK id the public DFlash drafters of a target's family use (`MASK_TOKENS`; Qwen3.5/3.6 in every layout:
    qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text), or None: another family, or an id outside its vocabulary."""
    family = "qwen3_5" if model_type.startswith("qwen3_5") else model_type
    mask = MASK_TOKENS.get(family)
    return mask if mask is not None and mask < vocab_size else None


def check_made_for(p: Profile, cfg, target: str, hint: str = "") -> None:
    """A paper-scale profile's drafter shape is made for its own target's widths (hidden, vocabulary): `cfg`, the
    config of checkpoint `target` (a flag and its value), must have them; else one line naming both."""
    if not p.scale.target_config:
        return
    made = {k: p.scale.target_config[k] for k in ("hidden_size", "vocab_size")}
    got = {k: getattr(cfg, k, None) for k in made}
    require(made == got, f"--profile {p.name} is made for a target of {made} (its config); {target} has {got}{hint}")


# OpenPerfectBlend (mlabonne/open-perfectblend) conversations: the training prompt count used to size `train.steps`
# (assumption: ~1.42 M rows; re-derive from the real count with `PaperScale.train_prompts`).
OPEN_PERFECTBLEND_ROWS = 1_420_909


# The blog's open-reproduction protocol (docs/METHOD.md): the first 80 prompts of each set, chat template with thinking
# off, T = 0, natural end-of-text stop (no stop strings), at most 1,024 new tokens a turn, MT-Bench's second turn on the
# model's own first answer, batch cap 32, MTP415 beside the drafters
OPEN_PROTOCOL = dict(sets={"gsm8k": 80, "math500": 80, "humaneval": 80, "alpaca": 80, "mtbench": 80},
                     all_methods_on=("gsm8k", "math500", "humaneval", "alpaca", "mtbench"), subsets={},
                     temperatures=(0.0,), modes=("natural",), stops=(), new_tokens=1024, batch=32, mtp_steps=4,
                     ood={}, ood_runs=())


def _paper_steps(epochs: int, n: int, global_batch: int) -> int:
    return -(-epochs * n // global_batch)


def _qwen3_6_text(model_type: str, **own) -> dict:
    """A Qwen3.6 text config: what the 27B and 35B-A3B cards share (vocabulary, a full-attention layer after every
    three GDN layers, head widths, context, rotary settings, one MTP layer) with the model's `own` sizes."""
    size = {k: own.pop(k) for k in ("hidden_size", "num_hidden_layers")}  # in the cards' order (dryrun reports in it)
    attention = {k: own.pop(k) for k in ("num_attention_heads", "num_key_value_heads")}
    gdn_v = own.pop("linear_num_value_heads")
    return dict(
        model_type=model_type, vocab_size=248320, **size,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(size["num_hidden_layers"])],
        **attention, head_dim=256, **own,  # the feed-forward: dense or the experts'
        linear_num_value_heads=gdn_v, linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        mtp_num_hidden_layers=1)


def qwen3_6_27b() -> Profile:
    """Qwen3.6-27B target (dense hybrid: 48 Gated DeltaNet + 16 full-attention layers), 5-layer drafters.

    Target config from the model card (hidden 5120, 64 layers as 16 x (3 GDN + 1 attention), attention 24 q / 4 kv
    heads of 256, rotary dim 64, GDN 48 v / 16 qk heads of 128, FFN 17408, vocab 248320 padded, native 262144
    context, MTP) and its config.json (rope_theta 1e7); `assumptions` lists what is neither. Drafter width follows
    z-lab's Qwen3.6-27B DFlash drafter (32 heads of 128, 8 kv heads, FFN 17408), at the paper's 5 layers.
    The target checkpoint: $DMTP_TARGET_QWEN3_6_27B or --target. `train.batch_size` is the global batch, 128
    sequences an optimizer step; the fit check picks the per-GPU micro-batch for the GPUs present (e.g. 2 x 8
    accumulation on 8 x 80 GB), `train.micro_batch` overrides it."""
    scale = PaperScale(
        target_env="DMTP_TARGET_QWEN3_6_27B",
        target_config=_qwen3_6_text(
            "qwen3_5_text", hidden_size=5120, num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4,
            intermediate_size=17408, linear_num_value_heads=48),
        assumptions=("linear_conv_kernel_dim=4 (transformers' Qwen3.5 default)", "rms_norm_eps=1e-6",
                     "mrope_section=[11, 11, 10] (Qwen3.5 release configs)",
                     "mtp_num_hidden_layers=1 (card: 'MTP: trained with multi-steps')"),
        train_prompts=OPEN_PERFECTBLEND_ROWS)
    return derive(
        base(), "qwen3.6-27b",
        engine=dict(dtype="bf16"),  # target + drafter precision (evaluation weights; training: train.amp_bf16)
        # on-policy regeneration (`dmtp reproduce`, stage regen): every OpenPerfectBlend prompt of at most 2,048 tokens
        # (chat template, thinking off) answered by the target in up to 2,048 tokens (the training sequences are cut
        # at scale.max_seq_len); the blog states neither the temperature nor the length: 0.8 as the embedded default
        data=dict(prompts=OPEN_PERFECTBLEND_ROWS, prompt_tokens=2048, new_tokens=2048, temperature=0.8, batch=64),
        # attention: z-lab's Qwen3.6 drafters' rule (4 causal sliding layers of window 2048, then a bidirectional
        # full-attention layer), which the public reference and the serving engines compute, instead of the method's
        # anchor window (`window`, unused under it), which they refuse to load
        drafter=dict(layers=5, heads=32, kv_heads=8, intermediate=17408, head_dim=128, block_size=8, window=4096,
                     attention="public", sliding_window=2048, rope_theta=0.0, mask_token_id=MASK_TOKENS["qwen3_5"]),
        train=TrainConfig(steps=_paper_steps(scale.epochs, scale.train_prompts, scale.global_batch),
                          batch_size=scale.global_batch,
                          max_len=scale.max_seq_len, anchors_per_seq=512, lr=6e-4, warmup_frac=0.04, clip=1.0,
                          gamma=4.0, save_every=1000, log_every=50, amp_bf16=True),
        ablation=open_reproduction(),
        eval=OPEN_PROTOCOL,
        scale=scale,
    )


def qwen3_6_35b_a3b() -> Profile:
    """Qwen3.6-35B-A3B target (hybrid MoE: 30 GDN + 10 full-attention layers, 256 experts, 8 routed + 1 shared),
    the blog's main model; 5-layer drafters at its width 2048 (heads as z-lab's Qwen3.6-35B-A3B DFlash drafter:
    32 of 128, 4 kv, FFN 6144). Model card: hidden 2048, 40 layers as 10 x (3 GDN + 1 attention), attention 16 q /
    2 kv heads of 256, rotary dim 64, GDN 32 v / 16 qk heads of 128, experts of 512. $DMTP_TARGET_QWEN3_6_35B_A3B."""
    p27 = qwen3_6_27b()
    scale = replace(
        p27.scale, target_env="DMTP_TARGET_QWEN3_6_35B_A3B",
        target_config=_qwen3_6_text(
            "qwen3_5_moe_text", hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
            linear_num_value_heads=32),
        assumptions=p27.scale.assumptions + ("rope_theta=1e7 (as Qwen3.6-27B)",))
    return derive(p27, "qwen3.6-35b-a3b", drafter=dict(heads=32, kv_heads=4, intermediate=6144), scale=scale)


def open_tiny() -> Profile:
    """The open reproduction at toy size, on any small local target (no target config of its own): 1-layer drafters,
    a few training steps, 4 prompts a set at 16 new tokens. What the CPU test of `dmtp reproduce` runs:

        dmtp reproduce --profile open-tiny --target TINY_CKPT --work /tmp/open --data-path gsm8k=... (every set)"""
    p27 = qwen3_6_27b()
    return derive(
        p27, "open-tiny",
        engine=dict(dtype="fp32"),
        data=dict(prompts=12, prompt_tokens=256, new_tokens=12, temperature=0.0, batch=4),
        drafter=dict(layers=1, heads=4, kv_heads=2, intermediate=128, head_dim=16, rope_theta=10000.0,
                     mask_token_id=2),
        train=TrainConfig(steps=1, batch_size=4, max_len=128, anchors_per_seq=8, save_every=2, log_every=1,
                          compile="off"),
        eval=dict(sets={k: 4 for k in OPEN_PROTOCOL["sets"]}, new_tokens=16, batch=4),
        scale=replace(p27.scale, target_env="", target_config={}, assumptions=(), max_seq_len=128, global_batch=4,
                      epochs=2, train_prompts=0),
    )


PROFILES.update({"qwen3.6-27b": qwen3_6_27b, "qwen3.6-35b-a3b": qwen3_6_35b_a3b, "open-tiny": open_tiny})


# --- what experiments/one_gpu.sh asks of a profile ----------------------------------------------------------------
def parts(p: Profile) -> str:
    """The runs split into processes that share one GPU, one line of --set assignments each: the baselines (no
    drafter: evaluated at once); the first seed's main, continued and control runs; its supplementary and backbone
    runs; the other seeds (main and control runs only). Each process trains its drafters, then evaluates them, so
    the shorter parts' evaluation overlaps the longest one's training. Within what `ablation.only` / `only_seeds`
    already select; empty parts dropped."""
    a = p.ablation
    seeds = [s for s in a.seeds if not a.only_seeds or s in a.only_seeds]
    first = [s for s in seeds if s == a.seeds[0]]
    rest = [s for s in seeds if s != a.seeds[0]]
    out = []
    for runs, ss in ((a.baselines, first), (a.main + tuple(a.continued) + a.controls, first),
                     (a.supplementary + tuple(a.backbones), first), (a.main + a.controls, rest)):
        runs = a.selected(runs)
        if runs and ss:
            out.append(f"ablation.only={','.join(runs)} ablation.only_seeds={','.join(map(str, ss))}")
    return "\n".join(out)


def directions(p: Profile) -> str:
    """The --set assignments of the exploratory study of the blog's closing directions (docs/DESIGN.md, "The blog's
    closing directions"), run on a finished realization's target and data into a results folder of its own: `given`
    and `zero_init_residual_joint` trained beside the registered drafters they reuse (the same fingerprints), the
    fixed counts `given-g<n>` and MTP415 on the tuned head as baselines, drafter seed 0."""
    fixed = [f"given-g{g}" for g in range(4)]  # the chain's default max_given is 3
    return " ".join([
        "ablation.supplementary=given,zero_init_residual_joint",
        "ablation.baselines=" + ",".join(["ar", "mtp", "mtp.zero_init_residual_joint", *fixed]),
        "ablation.only=" + ",".join(["ar", "mtp", "mtp.zero_init_residual_joint", *fixed, p.ablation.drafter_baseline,
                                     p.ablation.main_method, "given", "zero_init_residual_joint"]),
        "ablation.only_seeds=0",
        "eval.ood_runs=" + ",".join(["mtp", p.ablation.drafter_baseline, p.ablation.main_method, "given",
                                     "zero_init_residual_joint", "mtp.zero_init_residual_joint"])])


ANSWERS = {
    "parts": parts,
    "directions": directions,
    "wheels": lambda p: " ".join(x for x in p.data.corpus_sources if "==" in x and not x.startswith("stdlib")),  # what
    # `make wheels` downloads: the pinned distributions of the corpus
    "folder": lambda p: p.folder,  # where its realization lives under work/ and results/: <name> or <name>/r<k>
}


def main(argv=None):
    """python -m dmtp.profiles mini folder realization=K   # mini/r<K>: the answer for the profile with the
    --set assignments that follow"""
    ap = argparse.ArgumentParser(prog="python -m dmtp.profiles", description=main.__doc__)
    ap.add_argument("profile", choices=list(PROFILES))
    ap.add_argument("what", choices=list(ANSWERS))
    ap.add_argument("sets", nargs="*", metavar="KEY=VALUE", help="--set assignments, as the pipeline takes them")
    a = ap.parse_args(argv)
    print(ANSWERS[a.what](override(get_profile(a.profile), a.sets)))


if __name__ == "__main__":
    main()
