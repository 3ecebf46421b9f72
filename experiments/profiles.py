"""Named profiles of the embedded-default pipeline. Each derives from a base by overriding fields; unknown keys fail.

    dmtp pipeline --profile tiny     # 2-core CPU, <= 15 min
    dmtp pipeline --profile mini     # one H200, ~15-20 min (two device commands: `--stage target`, then the rest)
    dmtp pipeline --profile smoke    # CI: the same stages, seconds
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from dmtp.pretrain import PretrainConfig, TargetArch
from dmtp.train import TrainConfig


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

    def __post_init__(self):
        for f in fields(self):
            if f.name not in {"name"} and getattr(self, f.name) is None:
                raise ValueError(f"profile {self.name}: field {f.name} is None")


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
        drafter_intermediate=128,
    )


def mini() -> Profile:
    """One H200: ~26 M-parameter target on >= 100 M tokens, 2-layer drafters."""
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
    )


PROFILES = {"tiny": tiny, "mini": mini, "smoke": smoke}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]()
