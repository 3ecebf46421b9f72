"""Named profiles of the embedded-default pipeline. Each derives from a base by overriding fields; unknown keys fail.

    dmtp pipeline --profile tiny     # 2-core CPU, <= 15 min
    dmtp pipeline --profile mini     # one H200, ~15-20 min (two device commands: `--stage target`, then the rest)
    dmtp pipeline --profile smoke    # CI: the same stages, seconds
    dmtp dryrun --profile qwen3.6-27b  # paper scale: target (config only), MTP head, every drafter on the meta device
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, is_dataclass, replace

from dmtp.checks import BadValue, at_least, check, each, number, one_of, require
from dmtp.engine.verify import MODES as VERIFY_MODES
from dmtp.models.drafter import default_target_layer_ids
from dmtp.training.drafters import TrainConfig
from dmtp.training.pretrain import PretrainConfig, TargetArch


@dataclass
class PaperScale:
    """Paper-scale settings: an external target checkpoint instead of the embedded default (empty for tiny/mini)."""
    target_env: str = ""  # env var holding the target checkpoint path (`--target` overrides)
    target_config: dict = field(default_factory=dict)  # the target's HF text config (what `dmtp dryrun` builds)
    assumptions: tuple = ()  # target_config keys NOT stated by the model card (documented guesses; checked on load)
    mask_token_id: int = -1  # token whose target embedding fills MASK slots (model family, see MASK_TOKENS)
    drafter_head_dim: int = 128  # drafter attention head size
    window: int = 4096  # context positions visible before the anchor (SPEC 3.3)
    block_size: int = 8  # DFlash block: 7 candidates + the anchor
    max_seq_len: int = 2048  # training sequences are cut here (open reproduction: dynamic length up to 2K)
    global_batch: int = 128  # sequences per optimizer step over all GPUs (per-GPU batch x GPUs x accumulation)
    epochs: int = 3  # passes over the on-policy training set
    dtype: str = "bf16"  # target + drafter precision (training autocast, evaluation weights)
    train_set: str = "openperfectblend"  # training prompts; responses regenerated on-policy by the target
    train_prompts: int = 0  # prompts in train_set (sets train.steps = ceil(epochs * n / global_batch))


@dataclass
class VerifyStudy:
    """Verification modes at T > 0 (`dmtp pipeline --stage verify`, not part of `all`; dmtp/cli/verify.py)."""
    methods: tuple = ("ar", "mtp", "dflash", "fusion", "zero_init_residual")  # run names (`<drafters>/<name>`)
    modes: tuple = ("target", "sample", "block")  # dmtp/engine/verify.py
    temperatures: tuple = (0.6, 1.0)
    caps: tuple = (1, 32)  # batch caps timed with dynamic batching; the largest cap's records give acceptance
    prompts: int = 164  # HumanEval prompts decoded at the largest cap
    small_cap_prompts: int = 16  # the first prompts timed at the other caps (batch 1 over 164 prompts: minutes)
    repeats: int = 2  # timed runs per cap after the warm-up run; each draws fresh samples
    max_new_tokens: int = 256  # natural EOS otherwise
    seed: int = 0  # the servers' generator seed

    def __post_init__(self):
        check(self, methods=each((lambda v: isinstance(v, str) and v != "", "a method name")),
              modes=each(one_of(*VERIFY_MODES)), temperatures=each(number(0)), caps=each(at_least(1)),
              prompts=at_least(1), small_cap_prompts=at_least(1), repeats=at_least(1), max_new_tokens=at_least(1),
              seed=at_least(0))


@dataclass
class Profile:
    name: str
    corpus_bytes: int = 8_000_000  # Python source collected from the interpreter's stdlib + site-packages
    vocab_size: int = 4096  # byte-level BPE vocabulary (incl. <|endoftext|> and <|mask|>)
    tokenizer_bytes: int = 8_000_000  # text used to train the tokenizer
    arch: TargetArch = field(default_factory=TargetArch)  # the target's shape
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    target_dtype: str = "fp32"  # target precision for data generation and evaluation (fp32: exact losslessness)
    data_prompts: int = 256  # on-policy prompts cut from the corpus
    data_prompt_tokens: int = 96  # prompt budget in tokens
    data_new_tokens: int = 128  # tokens the target generates per prompt (the drafters' training data)
    data_temperature: float = 0.8  # sampling temperature of the on-policy responses
    data_batch: int = 64
    drafter_layers: int = 1  # drafter depth (blog: 5 on a 64-layer target)
    drafter_heads: int = 4
    drafter_kv_heads: int = 2
    drafter_intermediate: int = 384
    train: TrainConfig = field(default_factory=TrainConfig)
    continue_steps: int = 100  # zero_init_residual continued from the trained dflash drafter
    eval_sets: dict = field(default_factory=lambda: {"humaneval": 164})  # dataset -> #prompts (first n)
    eval_all_methods_on: tuple = ("humaneval",)  # every method here; the main methods everywhere
    # views written from a run's first n records (same prompts, same batch): name -> (dataset, n)
    eval_subsets: dict = field(default_factory=lambda: {"humaneval8": ("humaneval", 8)})
    eval_temperatures: tuple = (0.0, 1.0)
    eval_new_tokens: int = 128
    eval_batch: int = 32
    mtp_steps: int = 4  # MTP415 baseline: 4 chained steps, 4 candidates
    verify: VerifyStudy = field(default_factory=VerifyStudy)  # the verification-mode study (`--stage verify`)
    scale: PaperScale = field(default_factory=PaperScale)  # paper-scale target/drafter/training (empty: embedded)

    def __post_init__(self):
        for f in fields(self):
            if f.name not in {"name"} and getattr(self, f.name) is None:
                raise ValueError(f"profile {self.name}: field {f.name} is None")
        temperature = number(0)
        check(self, corpus_bytes=at_least(1), vocab_size=at_least(258), tokenizer_bytes=at_least(1),
              target_dtype=one_of("fp32", "bf16"), data_prompts=at_least(1), data_prompt_tokens=at_least(1),
              data_new_tokens=at_least(1), data_temperature=temperature, data_batch=at_least(1),
              drafter_layers=at_least(1), drafter_heads=at_least(1), drafter_kv_heads=at_least(1),
              drafter_intermediate=at_least(1), continue_steps=at_least(0), eval_temperatures=each(temperature),
              eval_new_tokens=at_least(1), eval_batch=at_least(1), mtp_steps=at_least(1))
        # vocab_size >= 258: the byte-level BPE holds the 256 bytes and <|endoftext|>, <|mask|>
        require(self.drafter_heads % self.drafter_kv_heads == 0, f"drafter_heads={self.drafter_heads} is not a "
                f"multiple of drafter_kv_heads={self.drafter_kv_heads}")
        for ds, n in self.eval_sets.items():
            require(isinstance(ds, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 1,
                    f"eval_sets={self.eval_sets}: expected dataset name -> number of prompts >= 1")
        for name, sub in self.eval_subsets.items():
            ok = isinstance(sub, (list, tuple)) and len(sub) == 2 and sub[0] in self.eval_sets and \
                isinstance(sub[1], int) and 1 <= sub[1] <= self.eval_sets[sub[0]]
            require(ok, f"eval_subsets[{name!r}]={sub}: expected [dataset of eval_sets, n <= its prompts]")
        require(self.pretrain.seq_len <= self.arch.max_position_embeddings, f"pretrain.seq_len="
                f"{self.pretrain.seq_len} exceeds arch.max_position_embeddings={self.arch.max_position_embeddings}")
        if not self.scale.target_config:  # the embedded target: the drafter taps must exist
            taps = default_target_layer_ids(self.arch.num_hidden_layers, self.drafter_layers)
            require(max(taps) < self.arch.num_hidden_layers - 1 and min(taps) >= 0,
                    f"drafter_layers={self.drafter_layers} taps target layers {taps}: expected layers below the last "
                    f"of arch.num_hidden_layers={self.arch.num_hidden_layers}")


def derive(base: Profile, name: str, **over) -> Profile:
    known = {f.name for f in fields(Profile)}
    bad = set(over) - known
    if bad:
        raise KeyError(f"profile {name}: unknown keys {sorted(bad)}")
    return replace(base, name=name, **over)


def tiny() -> Profile:
    """2-core CPU: a 4-layer 128-wide target, 1-layer drafters, 8 + 24 HumanEval prompts."""
    return Profile(
        name="tiny",
        arch=TargetArch(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, intermediate_size=384),
        pretrain=PretrainConfig(tokens=1_500_000, seq_len=256, batch_size=16, lr=3e-3),
        train=TrainConfig(steps=150, batch_size=8, max_len=224, anchors_per_seq=32, save_every=50),
        continue_steps=50,
        eval_sets={"humaneval": 24},
        eval_new_tokens=64,
        verify=VerifyStudy(caps=(1, 8), prompts=24, small_cap_prompts=4, repeats=1, max_new_tokens=64),
    )


def smoke() -> Profile:
    """CI: every stage of the pipeline in well under a minute of compute; numbers are meaningless."""
    return derive(
        tiny(), "smoke", corpus_bytes=600_000, tokenizer_bytes=600_000, vocab_size=512,
        arch=TargetArch(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=32, intermediate_size=128),
        pretrain=PretrainConfig(tokens=40_000, seq_len=64, batch_size=8),
        data_prompts=16, data_new_tokens=24, data_batch=16,
        train=TrainConfig(steps=6, batch_size=4, max_len=96, anchors_per_seq=8, save_every=3, log_every=2),
        continue_steps=3, eval_sets={"humaneval": 4}, eval_subsets={"humaneval8": ("humaneval", 3)},
        eval_new_tokens=12, eval_batch=8,
        verify=VerifyStudy(caps=(1, 4), prompts=4, small_cap_prompts=2, repeats=1, max_new_tokens=12),
        drafter_intermediate=128,
    )


def mini() -> Profile:
    """One H200: 21.5 M-parameter target + 3.4 M MTP head on 100 M tokens, 2-layer drafters."""
    return derive(
        tiny(), "mini", corpus_bytes=250_000_000, tokenizer_bytes=30_000_000, vocab_size=8192,
        arch=TargetArch(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                        head_dim=64, intermediate_size=1280),
        pretrain=PretrainConfig(tokens=100_000_000, seq_len=512, batch_size=96, lr=2e-3),
        data_prompts=6144, data_prompt_tokens=128, data_new_tokens=256, data_batch=2048,
        drafter_layers=2, drafter_heads=8, drafter_kv_heads=2, drafter_intermediate=1408,
        train=TrainConfig(steps=1000, batch_size=32, max_len=384, anchors_per_seq=64, save_every=500,
                          log_every=25),
        continue_steps=300,
        eval_sets={"humaneval": 164},
        eval_new_tokens=256, eval_batch=164,
        verify=VerifyStudy(),
    )


PROFILES = {"tiny": tiny, "mini": mini, "smoke": smoke}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]()


def override(p: Profile, assignments: list[str]) -> Profile:
    """`KEY=VALUE` assignments (`pretrain.tokens=20000000`, `data_batch=4`) applied to a profile. A value is read as
    its field's current type (bool: true/false; tuple and dict: JSON), so a typo fails instead of training on a
    string; the name stays, so the work and results folders are the profile's."""
    for a in assignments:
        key, eq, raw = a.partition("=")
        if not eq or not key:
            raise ValueError(f"--set {a!r}: expected KEY=VALUE, e.g. pretrain.tokens=20000000")
        try:
            p = _assign(p, key.split("."), raw, key)
        except BadValue as e:  # the field's own check (dmtp.checks), or a cross-field rule
            raise ValueError(f"--set {key}={raw}: expected {e.expected}" if e.name == key.split(".")[-1]
                             else f"--set {key}={raw}: {e}") from None
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith("--set ") else f"--set {key}={raw}: {e}") from None
    return p


def _assign(obj, path: list[str], raw: str, key: str):
    names = {f.name for f in fields(obj)} if is_dataclass(obj) else set()
    if path[0] not in names or path[0] == "name":
        raise KeyError(f"--set {key}: {type(obj).__name__} has no field {path[0]!r}"
                       + (f" (fields: {', '.join(sorted(names - {'name'}))})" if names else ""))
    cur = getattr(obj, path[0])
    if len(path) > 1:
        return replace(obj, **{path[0]: _assign(cur, path[1:], raw, key)})
    try:
        if isinstance(cur, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            val = raw.lower() in ("true", "1")
        elif isinstance(cur, (int, float, str)):
            val = type(cur)(raw)
        else:
            val = json.loads(raw)
            val = tuple(val) if isinstance(cur, tuple) else val
            if not isinstance(val, type(cur)):
                raise ValueError(f"expected JSON for a {type(cur).__name__}")
    except ValueError as e:
        raise ValueError(f"--set {key}={raw}: {e}") from None
    return replace(obj, **{path[0]: val})


# --- paper scale (SPEC 8, open reproduction) -----------------------------------------------------------------------
# MASK token per model family: the id the public DFlash drafters of that family use. Qwen3.5/3.6 (vocab 248320,
# padded): 248070, as in z-lab's Qwen3.6 DFlash drafters' `dflash_config.mask_token_id`; Qwen3 (vocab 151936):
# 151669, the `<|MASK|>` token DFlash adds to the tokenizer. Both ids lie inside the target's embedding matrix.
MASK_TOKENS = {"qwen3": 151669, "qwen3_5": 248070}

# OpenPerfectBlend (mlabonne/open-perfectblend) conversations: the training prompt count used to size `train.steps`
# (assumption: ~1.42 M rows; re-derive from the real count with `PaperScale.train_prompts`).
OPEN_PERFECTBLEND_ROWS = 1_420_909


def _paper_steps(epochs: int, n: int, global_batch: int) -> int:
    return -(-epochs * n // global_batch)


def qwen3_6_27b() -> Profile:
    """Qwen3.6-27B target (dense hybrid: 48 Gated DeltaNet + 16 full-attention layers), 5-layer drafters.

    Target config from the model card (hidden 5120, 64 layers as 16 x (3 GDN + 1 attention), attention 24 q / 4 kv
    heads of 256, rotary dim 64, GDN 48 v / 16 qk heads of 128, FFN 17408, vocab 248320 padded, native 262144
    context, MTP) and its config.json (rope_theta 1e7); `assumptions` lists what is neither. Drafter width follows
    z-lab's Qwen3.6-27B DFlash drafter (32 heads of 128, 8 kv heads, FFN 17408), at the paper's 5 layers.
    The target checkpoint: $DMTP_TARGET_QWEN3_6_27B or --target. Global batch 128 = e.g. 8 GPUs x 16."""
    scale = PaperScale(
        target_env="DMTP_TARGET_QWEN3_6_27B",
        target_config=dict(
            model_type="qwen3_5_text", vocab_size=248320, hidden_size=5120, num_hidden_layers=64,
            layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)],
            num_attention_heads=24, num_key_value_heads=4, head_dim=256, intermediate_size=17408,
            linear_num_value_heads=48, linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [11, 11, 10], "mrope_interleaved": True},
            mtp_num_hidden_layers=1),
        assumptions=("linear_conv_kernel_dim=4 (transformers' Qwen3.5 default)", "rms_norm_eps=1e-6",
                     "mrope_section=[11, 11, 10] (Qwen3.5 release configs)",
                     "mtp_num_hidden_layers=1 (card: 'MTP: trained with multi-steps')"),
        mask_token_id=MASK_TOKENS["qwen3_5"], train_prompts=OPEN_PERFECTBLEND_ROWS)
    return derive(
        Profile(name="paper"), "qwen3.6-27b",
        drafter_layers=5, drafter_heads=32, drafter_kv_heads=8, drafter_intermediate=17408,
        train=TrainConfig(steps=_paper_steps(scale.epochs, scale.train_prompts, scale.global_batch), batch_size=16,
                          max_len=scale.max_seq_len, anchors_per_seq=512, lr=6e-4, warmup_frac=0.04, clip=1.0,
                          gamma=4.0, save_every=1000, log_every=50, amp_bf16=True),
        continue_steps=0, target_dtype="bf16",
        # first n rows of each set (alpaca: the spec gives no count; 500 of its 52K rows)
        eval_sets={"gsm8k": 1319, "math500": 500, "humaneval": 164, "alpaca": 500, "mtbench": 80},
        eval_all_methods_on=("gsm8k", "humaneval", "math500", "alpaca", "mtbench"), eval_subsets={},
        eval_temperatures=(0.0,), eval_new_tokens=2048, eval_batch=32, mtp_steps=4, scale=scale,
    )


def qwen3_6_35b_a3b() -> Profile:
    """Qwen3.6-35B-A3B target (hybrid MoE: 30 GDN + 10 full-attention layers, 256 experts, 8 routed + 1 shared),
    the blog's main model; 5-layer drafters at its width 2048 (heads as z-lab's Qwen3.6-35B-A3B DFlash drafter:
    32 of 128, 4 kv, FFN 6144). Model card: hidden 2048, 40 layers as 10 x (3 GDN + 1 attention), attention 16 q /
    2 kv heads of 256, rotary dim 64, GDN 32 v / 16 qk heads of 128, experts of 512. $DMTP_TARGET_QWEN3_6_35B_A3B."""
    base = qwen3_6_27b()
    scale = replace(
        base.scale, target_env="DMTP_TARGET_QWEN3_6_35B_A3B",
        target_config=dict(
            model_type="qwen3_5_moe_text", vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
            layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(40)],
            num_attention_heads=16, num_key_value_heads=2, head_dim=256,
            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
            linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [11, 11, 10], "mrope_interleaved": True},
            mtp_num_hidden_layers=1),
        assumptions=base.scale.assumptions + ("rope_theta=1e7 (as Qwen3.6-27B)",))
    return derive(base, "qwen3.6-35b-a3b", drafter_heads=32, drafter_kv_heads=4, drafter_intermediate=6144,
                  scale=scale)


PROFILES.update({"qwen3.6-27b": qwen3_6_27b, "qwen3.6-35b-a3b": qwen3_6_35b_a3b})
