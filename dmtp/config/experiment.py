"""The experiment's schema (torch-free): a `Profile` nests the data / model / pretrain / drafter / train / eval
sections, the verification-mode study, the engine, the paper-scale extras and the `AblationSpec` it runs. Every
field has a comment; each section checks its own fields, `check_profile` the rules across sections. Named profiles
are functions deriving from a base in `dmtp/profiles.py`; `dmtp/experiment.py` writes and reads a profile as
`experiment.json`.

    Profile(name="x", ablation=AblationSpec(baselines=("ar",), main=("dflash",)))
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from dmtp.checks import at_least, check, each, number, one_of, require, sampling_temperature, temperature
from dmtp.config.ablation import AblationSpec
from dmtp.config.engine import DTYPES, EVAL_MODES, VERIFY_MODES, EngineConfig
from dmtp.config.training import PretrainConfig, TargetArch, TrainConfig


DRAFTER_ATTENTION = ("anchor", "public")  # values of DrafterShape.attention
OOD_SETS = ("pytests",)  # out-of-distribution sets: module-level test functions of the corpus's train split
# (`code_prompts(tests=True)`): the target is pretrained on them, the drafters' on-policy prompts never hold them


@dataclass
class DataConfig:
    """The embedded default's corpus, tokenizer and on-policy drafter data."""
    corpus_bytes: int = 8_000_000  # at most this many bytes of Python source, taken from corpus_sources in order
    corpus_sources: tuple[str, ...] = ("stdlib",)  # where the corpus's *.py files come from, in order: "stdlib" (the
    # interpreter's standard library) or a distribution's name, each optionally pinned ("sympy==1.14.0"); a pinned
    # source is read where it is installed at that version, else from its pure-Python wheel (`make wheels`), else
    # refused (`dmtp.data.corpus`)
    corpus_digest: str = ""  # the train digest the pinned sources give (16 hex digits), checked before the corpus is
    # written; "": not checked
    corpus_max_repeat: float = 0.3  # leave out files with more than this share of characters in repeated lines
    # (`corpus.repeated_fraction`: generated tables, vendored data; 8 % of a site-packages' bytes); 1: keep every file
    tokenizer_bytes: int = 8_000_000  # text used to train the tokenizer
    vocab_size: int = 4096  # byte-level BPE vocabulary (incl. <|endoftext|> and <|mask|>)
    prompts: int = 256  # on-policy prompts cut from the corpus
    prompt_tokens: int = 96  # prompt budget in tokens
    new_tokens: int = 128  # tokens the target generates per prompt (the drafters' training data)
    temperature: float = 0.8  # sampling temperature of the on-policy responses
    batch: int = 64  # prompts per generation batch
    prompts_per_doc: int = 2  # at most this many prompts (functions) cut from one corpus file
    samples: int = 1  # responses sampled per prompt (at `temperature`): the data holds prompts x samples sequences

    def __post_init__(self):  # vocab_size >= 258: the byte-level BPE holds the 256 bytes, <|endoftext|>, <|mask|>
        if not 0 < self.corpus_max_repeat <= 1:
            raise ValueError(f"data.corpus_max_repeat = {self.corpus_max_repeat!r}: expected a fraction in (0, 1]")
        require(bool(self.corpus_sources) and all(isinstance(x, str) and x.strip() for x in self.corpus_sources),
                f"data.corpus_sources = {self.corpus_sources!r}: expected source names (stdlib, a distribution)")
        require(self.corpus_digest == "" or (len(self.corpus_digest) == 16 and all(
            ch in "0123456789abcdef" for ch in self.corpus_digest)), f"data.corpus_digest = {self.corpus_digest!r}: "
                "expected 16 hex digits or \"\"")
        check(self, corpus_bytes=at_least(1), tokenizer_bytes=at_least(1), vocab_size=at_least(258),
              prompts=at_least(1), prompt_tokens=at_least(1), new_tokens=at_least(1), temperature=temperature,
              batch=at_least(1), prompts_per_doc=at_least(1), samples=at_least(1))


@dataclass
class ModelConfig:
    """The target (+ native MTP head): its shape and precisions."""
    arch: TargetArch = field(default_factory=TargetArch)  # the embedded target's shape
    checkpoint_dtype: str = "fp32"  # precision the pretrained target + MTP checkpoint is saved in (the precision it
    # decodes in, for on-policy data and evaluation, is `engine.dtype`)

    def __post_init__(self):
        check(self, checkpoint_dtype=one_of(*DTYPES))


@dataclass
class DrafterShape:
    """Every drafter of the profile (widths not listed here are the target's)."""
    layers: int = 1  # drafter depth (blog: 5 on a 64-layer target)
    heads: int = 4  # attention heads
    kv_heads: int = 2  # key/value heads
    intermediate: int = 384  # FFN width
    head_dim: int = 0  # attention head size; 0: the target's
    block_size: int = 8  # DFlash block: 7 candidates + the anchor
    window: int = 4096  # context positions visible before the anchor (METHOD.md, "One round"), under attention "anchor"
    # the drafter's attention: "anchor" (the method's: every layer sees the `window` positions before the anchor, the
    # same rows for every slot; saved as `anchor_window_attention`, which public readers refuse) | "public" (the rule
    # of z-lab's Qwen3.6 DFlash drafters, which the public reference and the serving engines compute: every layer but
    # the last `sliding_attention` over the `sliding_window` positions before each slot's own position with a causal
    # block, the last `full_attention` with a bidirectional one; a one-layer drafter: that full-attention layer)
    attention: str = "anchor"
    sliding_window: int = 2048  # attention "public": the window of its sliding layers (z-lab's Qwen3.6 drafters)
    rope_theta: float = 1_000_000.0  # RoPE base of the drafter's positions; 0: the target's
    mask_token_id: int = -1  # token whose target embedding fills MASK slots; -1: the tokenizer's <|mask|>
    variants: dict[str, dict] = field(default_factory=dict)  # variant -> its own settings (fields of its Config)

    def __post_init__(self):
        check(self, layers=at_least(1), heads=at_least(1), kv_heads=at_least(1), intermediate=at_least(1),
              head_dim=at_least(0), block_size=at_least(2), window=at_least(0), rope_theta=number(0),
              mask_token_id=at_least(-1), attention=one_of(*DRAFTER_ATTENTION), sliding_window=at_least(1))
        require(self.heads % self.kv_heads == 0, f"drafter.heads={self.heads} is not a multiple of "
                f"drafter.kv_heads={self.kv_heads}")

    def attention_fields(self) -> dict:
        """The `DrafterConfig` fields of this attention rule: `window`, `layer_types`, `sliding_window`."""
        if self.attention == "anchor":
            return dict(window=self.window, layer_types=[], sliding_window=0)
        types = ["sliding_attention"] * (self.layers - 1) + ["full_attention"]
        return dict(window=0, layer_types=types, sliding_window=self.sliding_window if self.layers > 1 else 0)


def drafter_key(drafter: dict) -> dict:
    """A drafter section as fingerprints and experiment keys read it: without the attention settings under the
    anchor rule (a drafter trained before the rule was a setting is the same experiment)."""
    if drafter.get("attention", "anchor") == "anchor":
        return {k: v for k, v in drafter.items() if k not in ("attention", "sliding_window")}
    return dict(drafter)


@dataclass
class EvalConfig:
    """What every run is evaluated on."""
    sets: dict[str, int] = field(default_factory=lambda: {"humaneval": 164})  # dataset -> #prompts (the first n)
    all_methods_on: tuple[str, ...] = ("humaneval",)  # every run here; ablation.main_table runs everywhere
    # views written from a run's first n records (same prompts, same batch): name -> (dataset, n)
    subsets: dict[str, tuple[str, int]] = field(default_factory=lambda: {"humaneval8": ("humaneval", 8)})
    temperatures: tuple[float, ...] = (0.0, 1.0)  # sampling temperatures (0: greedy)
    modes: tuple[str, ...] = ("natural",)  # EVAL_MODES: natural (every run, every seed: the acceptance tables),
    # fixed (the runs of ablation.main_table, first seed: the blog's fixed-length throughput setting)
    stops: tuple[str, ...] = ("humaneval",)  # natural mode's stop strings; "humaneval": its standard five
    new_tokens: int = 128  # generated tokens per request (at most)
    batch: int = 32  # requests per decode batch
    mtp_steps: int = 4  # MTP415 baseline: 4 chained steps, 4 candidates
    ood: dict[str, int] = field(default_factory=dict)  # out-of-distribution set (OOD_SETS) -> #prompts: decoded
    # for `ood_runs` only, at T = 0, natural mode (the stop strings of `stops`), the first drafter seed
    ood_runs: tuple[str, ...] = ()  # the runs of the ablation decoded on the `ood` sets

    def __post_init__(self):
        check(self, temperatures=each(temperature), new_tokens=at_least(1), batch=at_least(1), mtp_steps=at_least(1),
              modes=each(one_of(*EVAL_MODES)))
        for ds, n in self.ood.items():
            require(ds in OOD_SETS and ds not in self.sets and isinstance(n, int) and not isinstance(n, bool)
                    and n >= 1, f"eval.ood={self.ood}: expected a set of {list(OOD_SETS)} (not in eval.sets) -> "
                    "number of prompts >= 1")
        require(all(isinstance(r, str) and r for r in self.ood_runs) and (self.ood_runs or not self.ood),
                f"eval.ood_runs={list(self.ood_runs)}: expected run names (at least one when eval.ood names a set)")
        require(all(isinstance(x, str) and x for x in self.stops),
                f"eval.stops={list(self.stops)}: expected non-empty stop strings (or 'humaneval')")
        require(bool(self.sets), "eval.sets={}: expected at least one dataset (an evaluation of no prompts makes "
                "empty tables)")
        for ds, n in self.sets.items():
            require(isinstance(n, int) and not isinstance(n, bool) and n >= 1,
                    f"eval.sets={self.sets}: expected dataset name -> number of prompts >= 1")
        for name, (src, n) in self.subsets.items():
            require(src in self.sets and 1 <= n <= self.sets[src],
                    f"eval.subsets[{name!r}]={[src, n]}: expected [dataset of eval.sets, n <= its prompts]")


@dataclass
class VerifyConfig:
    """The verification-mode study (`dmtp pipeline --stage verify`, opt-in; dmtp/cli/verify.py): every method x verify
    mode x temperature on HumanEval, decoded with dynamic batching at each batch cap."""
    methods: tuple[str, ...] = ()  # runs of the ablation to decode; (): the spec's `study_runs` (`Profile.study`)
    modes: tuple[str, ...] = VERIFY_MODES  # verify modes (dmtp/engine/verify.py): target | sample | block
    temperatures: tuple[float, ...] = (0.6, 1.0)  # sampling temperatures (> 0: at 0 every mode is greedy)
    caps: tuple[int, ...] = (1, 32)  # batch caps timed with dynamic batching; the largest cap's records give acceptance
    prompts: int = 164  # HumanEval prompts decoded at the largest cap
    small_cap_prompts: int = 16  # the first prompts timed at the other caps (batch 1 over 164 prompts: minutes)
    repeats: int = 2  # timed runs per cap after the warm-up run; each draws fresh samples
    max_new_tokens: int = 256  # generated tokens per request (at most)
    eval_mode: str = "natural"  # EVAL_MODES: natural = end-of-text or one of `eval.stops` ends a request (the eval
    # stage's protocol); fixed = every request decodes exactly max_new_tokens
    seed: int = 0  # the servers' generator seed

    def __post_init__(self):
        runs = (lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) and x for x in v),
                "a list of run names ((): the ablation's study runs)")
        check(self, methods=runs,
              modes=each(one_of(*VERIFY_MODES)), temperatures=each(sampling_temperature), caps=each(at_least(1)),
              prompts=at_least(1), small_cap_prompts=at_least(1), repeats=at_least(1), max_new_tokens=at_least(1),
              eval_mode=one_of(*EVAL_MODES), seed=at_least(0))
        for key in ("methods", "modes", "temperatures", "caps"):
            v = getattr(self, key)
            require(len(set(v)) == len(v), f"verify.{key}={list(v)}: named twice")


@dataclass
class PaperScale:
    """Paper-scale settings: an external target checkpoint instead of the embedded default (empty for tiny/mini)."""
    target_env: str = ""  # env var holding the target checkpoint path (`--target` overrides)
    target_config: dict = field(default_factory=dict)  # the target's HF text config (what `dmtp dryrun` builds)
    assumptions: tuple[str, ...] = ()  # target_config keys NOT stated by the model card (guesses; checked on load)
    max_seq_len: int = 2048  # training sequences are cut here (open reproduction: dynamic length up to 2K)
    global_batch: int = 128  # sequences per optimizer step over all GPUs (per-GPU batch x GPUs x accumulation)
    epochs: int = 3  # passes over the on-policy training set
    train_set: str = "openperfectblend"  # training prompts; responses regenerated on-policy by the target
    train_prompts: int = 0  # prompts in train_set (sets train.steps = ceil(epochs * n / global_batch))

    def __post_init__(self):  # epochs 0 would still train (a step count is at least 1): refused instead
        check(self, max_seq_len=at_least(4), global_batch=at_least(1), epochs=at_least(1), train_prompts=at_least(0))


@dataclass
class Profile:
    """One experiment: its sections, the engine every decode runs on, and the ablation it runs."""
    name: str  # the folder under work/ and results/
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)  # target + MTP pretraining
    drafter: DrafterShape = field(default_factory=DrafterShape)
    train: TrainConfig = field(default_factory=TrainConfig)  # drafter training (every run of the ablation)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ablation: AblationSpec = field(default_factory=AblationSpec)  # the runs and how they are reported
    verify: VerifyConfig = field(default_factory=VerifyConfig)  # the verification-mode study (`--stage verify`)
    engine: EngineConfig = field(default_factory=EngineConfig)  # how every decode runs (data, eval, verify, bench)
    scale: PaperScale = field(default_factory=PaperScale)  # paper-scale target/training (empty: embedded)
    realization: int = 0  # an independent replication of the whole experiment: k >= 1 shifts the target's, the
    # on-policy data's and every drafter's seed by 1000 k (`stream`) and lives in <work|results>/<name>/r<k>; 0: the
    # profile's own seeds, <work|results>/<name> (the report pools the realizations r<k> of one experiment)

    def __post_init__(self):
        check(self, realization=at_least(0))
        check_profile(self)

    def stream(self, seed: int) -> int:
        """`seed` in this realization's stream of seeds."""
        return seed + 1000 * self.realization

    @property
    def study(self) -> VerifyConfig:
        """The verification-mode study's settings with its runs resolved: `verify.methods`, else the ablation's
        `study_runs` (the baselines, the drafter baseline, the blog's run and the main method)."""
        return replace(self.verify, methods=self.verify.methods or self.ablation.study_runs)

    @property
    def folder(self) -> str:
        """Where this realization lives under work/ and results/: <name> or <name>/r<k>."""
        return self.name if not self.realization else f"{self.name}/r{self.realization}"


def check_profile(p: Profile) -> None:
    """Rules across sections (each section checks its own fields): the out-of-distribution runs are runs of the
    ablation, the embedded target fits its pretraining sequences. The rules that read the models' registries
    (variants and their settings, backbones, the drafter's taps) are `dmtp.experiment.check_models`'s: describing,
    writing and reading an experiment needs no torch."""
    a = p.ablation
    bad = [r for r in p.eval.ood_runs if r not in a.runs()]
    require(not bad, f"eval.ood_runs: {bad} are not runs of ablation {a.name!r}")
    arch = p.model.arch
    require(p.pretrain.seq_len <= arch.max_position_embeddings, f"pretrain.seq_len={p.pretrain.seq_len} exceeds "
            f"model.arch.max_position_embeddings={arch.max_position_embeddings}")
