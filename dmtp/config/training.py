"""The training settings (torch-free): the embedded target's shape and its pretraining with the native MTP head
(dmtp/training/pretrain.py), and drafter training (dmtp/training/drafters.py).

    PretrainConfig(tokens=40_000, seq_len=64, batch_size=8)   # a profile's `pretrain` section
    TrainConfig(steps=6, batch_size=4, max_len=96)            # its `train` section (every drafter of the ablation)
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from dmtp.checks import at_least, check, fraction, non_negative, one_of, positive, require

COMPILE = ("auto", "on", "off")  # values of PretrainConfig.compile / .fused_ce and TrainConfig.compile
SWITCH = ("auto", "on", "off")  # values of TrainConfig.fsdp and .shard_target
KERNEL_CHOICES = ("default", "fixed")  # values of PretrainConfig.kernels and TrainConfig.kernels
GRAD_SYNC = ("auto", "last", "every")  # values of TrainConfig.grad_sync
NEGATIVES = ("ngram", "loop")  # values of PretrainConfig.unloop_negatives (training/unloop.py)
CHUNK = 8192  # tokens per chunk of the fused LM-head loss: a chunk's bf16 logits at vocab 8192 take 128 MiB, its
# gradient as much (dmtp/training/losses.py)


@dataclass
class TargetArch:
    """The embedded target: a Qwen3.5-architecture decoder, every layer full attention, with one native MTP layer."""
    hidden_size: int = 128  # model width (the drafter shares it)
    num_hidden_layers: int = 4  # decoder layers (the drafter taps some of them)
    num_attention_heads: int = 4  # query heads
    num_key_value_heads: int = 2  # key/value heads (grouped-query attention)
    head_dim: int = 32  # attention head size (a quarter of it rotated)
    intermediate_size: int = 384  # FFN width
    max_position_embeddings: int = 4096  # positions the target takes (prompt + generated tokens)
    tie_word_embeddings: bool = True  # small Qwen3.5 models tie them; halves the hand-off checkpoint

    def __post_init__(self):
        check(self, hidden_size=at_least(1), num_hidden_layers=at_least(1), num_attention_heads=at_least(1),
              num_key_value_heads=at_least(1), head_dim=at_least(8), intermediate_size=at_least(1),
              max_position_embeddings=at_least(2))
        require(self.num_attention_heads % self.num_key_value_heads == 0, f"num_attention_heads="
                f"{self.num_attention_heads} is not a multiple of num_key_value_heads={self.num_key_value_heads}")
        require(self.head_dim % 8 == 0, f"head_dim={self.head_dim}: expected a multiple of 8 (a quarter of it is "
                "rotated, split into three mrope sections)")


@dataclass
class PretrainConfig:
    """Target + MTP pretraining (joint loss, DeepSeek-V3 style)."""
    tokens: int = 2_000_000  # training tokens (mini: >= 100M)
    seq_len: int = 256  # tokens per training sequence (windows cut from the token stream)
    batch_size: int = 16  # sequences per step
    lr: float = 2e-3  # AdamW peak learning rate (warm-up, then cosine to 0.1 x)
    warmup_frac: float = 0.02  # linear warm-up fraction of the steps
    weight_decay: float = 0.1  # AdamW weight decay (matrices only)
    mtp_lambda: float = 0.3  # DeepSeek-V3: 0.3 early (0.1 late)
    mtp_lambda_late: float = 0.1  # used for the last `late_frac` of training
    late_frac: float = 0.3  # last fraction of the steps trained with mtp_lambda_late
    clip: float = 1.0  # gradient-norm clip
    seed: int = 0  # the initial weights (the pipeline seeds them with it) and the order of the training windows
    bf16: bool = True  # autocast on CUDA
    eval_tokens: int = 200_000  # held-out tokens for the report
    log_every: int = 20  # a history record (loss averaged over ranks) every N steps
    save_every: int = 0  # resumable state every N steps (0: max(50, steps // 10))
    stop_after: int = 0  # write the resumable state and stop after this step (0: run to the end)
    compile: str = "auto"  # "auto": torch.compile the step on CUDA (CPU eager); "on": also on CPU; "off": eager
    kernels: str = "fixed"  # the compiled step's kernel choices on CUDA: "fixed" (Inductor's deterministic mode: each
    # choice a fixed function of the shape, so a run's weights do not depend on what else runs on the card) |
    # "default" (Inductor times a reduction's launch settings and a matmul's padding on the device and keeps the
    # fastest: the card's load can pick another summation order)
    # "auto": both heads' loss through the fused chunked linear + CE (`losses.linear_cross_entropy`) on CUDA, where the
    # materialised fp32 [tokens, vocab] logits and their gradient make the step memory-bound; "on": also on CPU;
    # "off": `F.cross_entropy(lm_head(h).float(), y)` (the same loss, its logits materialised)
    fused_ce: str = "auto"
    ce_chunk: int = CHUNK  # tokens per chunk of the fused loss: its logits take ce_chunk x vocab at a time
    # sequence-level unlikelihood fine-tuning after pretraining (dmtp/training/unloop.py; 0 steps: none): each step the
    # pretraining loss of a corpus batch plus unloop_alpha x -log(1 - p) of the tokens that repeat an n-gram in the
    # target's own greedy continuations of corpus prompts (a pool of unloop_prompts, unloop_prompt_len prompt tokens
    # + unloop_new decoded ones, refreshed every unloop_every steps; unloop_batch of them per step)
    unloop_steps: int = 0
    unloop_alpha: float = 1.0
    unloop_lr: float = 0.0  # constant after a short warm-up; 0: the pretraining schedule's last, 0.1 x lr
    unloop_every: int = 25
    unloop_prompts: int = 256
    unloop_prompt_len: int = 128
    unloop_new: int = 128
    unloop_batch: int = 16
    unloop_ngram: int = 4
    # the negatives: "ngram" (every token of a repeated unloop_ngram-gram, Welleck et al.) or "loop" (the tokens of the
    # exact loop a continuation ends in, past its first copy: what the evaluation's loop_frac counts)
    unloop_negatives: str = "ngram"

    def __post_init__(self):
        # seq_len >= 3: the MTP term predicts x_{i+2}
        check(self, tokens=at_least(1), seq_len=at_least(3), batch_size=at_least(1), lr=positive,
              warmup_frac=fraction, weight_decay=non_negative, mtp_lambda=non_negative,
              mtp_lambda_late=non_negative, late_frac=fraction, clip=positive, seed=at_least(0),
              log_every=at_least(1), save_every=at_least(0), stop_after=at_least(0), compile=one_of(*COMPILE),
              kernels=one_of(*KERNEL_CHOICES),
              fused_ce=one_of(*COMPILE), ce_chunk=at_least(1), unloop_steps=at_least(0),
              unloop_alpha=non_negative, unloop_lr=non_negative, unloop_every=at_least(1),
              unloop_prompts=at_least(1), unloop_prompt_len=at_least(1), unloop_new=at_least(1),
              unloop_batch=at_least(1), unloop_ngram=at_least(1),
              unloop_negatives=one_of(*NEGATIVES))
        step = self.seq_len * self.batch_size
        require(self.tokens >= step, f"tokens={self.tokens}: expected at least one step's worth, seq_len x batch_size"
                f" = {self.seq_len} x {self.batch_size} = {step}")
        require(self.eval_tokens >= self.seq_len, f"eval_tokens={self.eval_tokens}: expected at least one held-out "
                f"sequence, seq_len = {self.seq_len}")


@dataclass
class TrainConfig:
    """Drafter training: every drafter of the ablation on the same batches, anchors and seed."""
    steps: int = 200  # optimizer steps per drafter
    batch_size: int = 8  # sequences per optimizer step: the global batch, over every rank and micro-batch
    # sequences per rank per forward/backward (gradient accumulation: batch_size / (ranks x micro_batch) micro-batches
    # per step, their gradients summed, the loss normalised by the global batch's weight mass: the same step as the
    # whole batch at once); 0: the memory model's choice where the fit check runs (`dmtp train`, the pipeline's
    # drafters stage, `dmtp reproduce` on CUDA), else each rank's whole share at once
    micro_batch: int = 0
    max_len: int = 512  # sequences are cut to this many tokens
    anchors_per_seq: int = 64  # anchors sampled per sequence (cap; uniform over valid positions)
    lr: float = 6e-4  # AdamW peak learning rate (SpecForge DFlash recipe)
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_frac: float = 0.04  # linear warm-up fraction, then cosine to 0
    clip: float = 1.0  # gradient-norm clip
    gamma: float = 4.0  # loss weight of candidate T_k: exp(-(k-1)/gamma); 4 for 7 candidates, 7 for 15
    seed: int = 0  # initialisation, data order and anchors
    save_every: int = 100  # checkpoint (weights + optimizer) every N steps; resumable
    log_every: int = 10  # a history record (loss, accuracy) every N steps
    amp_bf16: bool = False  # autocast the drafters and the frozen target's feature pass in bf16 on GPU
    compile: str = "auto"  # "auto": the compiled path on CUDA, eager on CPU; "on": compiled everywhere; "off": eager
    kernels: str = "fixed"  # the compiled path's kernel choices on CUDA: "fixed" | "default" (PretrainConfig.kernels)
    one_region: bool = True  # compiled path: every drafter of a step in one compiled region with one AdamW step;
    # False: a compiled region, an AdamW and a clip per drafter (what `bench_train` compares it with)
    stop_after: int = 0  # checkpoint and stop after this step (0: run to the end) - splits a run into time slices
    snapshots: tuple[int, ...] = ()  # also keep the weights after these steps (<name>/step<k>/): learning curves
    # the drafters' LM-head loss through the fused chunked linear + CE (`losses.linear_cross_entropy`), the [rows,
    # vocab] logits never held whole: "auto" where the plain path's fp32 logits of one rank's step would exceed
    # dmtp.memory.FUSE_ABOVE_BYTES (paper scale: tens of GB; the tiny and mini profiles stay plain), "on", "off".
    # The same loss and gradients either way (fp32 rounding); DFlash2 and soft-capped drafters keep the plain loss
    fused_ce: str = "auto"
    ce_chunk: int = 0  # rows per chunk of the fused loss; 0: as many as make 0.5 GiB of fp32 logits (memory.py)
    # data parallelism (dmtp/dist.py): "auto": FSDP2 whenever a process group of more than one rank exists (torchrun),
    # else the plain single-process step; "on": FSDP2 also on one process (a process group of one: the sharded step
    # measured on one GPU); "off": the plain step (refused under more than one rank). Under FSDP2 each drafter's
    # parameters, gradients and AdamW state are sharded per decoder layer, then the rest of the drafter; fp32 master
    # weights; with amp_bf16 on CUDA bf16 compute and fp32 gradient reduction
    fsdp: str = "auto"
    # under FSDP2, the frozen target: "on": its decoder layers sharded too (gathered layer by layer for the feature
    # pass; embedding, LM head and final norm replicated: the drafters use them outside its forward); "off":
    # replicated on every rank; "auto": chosen by the memory model before training (unresolved: replicated)
    shard_target: str = "auto"
    activation_checkpointing: bool = False  # recompute each drafter layer's activations in the backward pass
    # (less memory, one more forward of the layers; the same loss and gradients)
    # under FSDP2 with more than one micro-batch, when the gradients are reduce-scattered: "last": once, after the
    # last micro-batch (each drafter's full fp32 gradient held unsharded between micro-batches, 4 bytes a parameter);
    # "every": after each micro-batch (the gradients stay sharded; one reduce-scatter per micro-batch); "auto": the
    # memory model's choice where the fit check runs ("last" where it fits), else "last"
    grad_sync: str = "auto"

    def __post_init__(self):
        # max_len >= 4: an anchor needs A, T1 and at least one label (1 <= a <= len - 3)
        check(self, steps=at_least(1), batch_size=at_least(1), max_len=at_least(4), anchors_per_seq=at_least(1),
              lr=positive, weight_decay=non_negative, warmup_frac=fraction, clip=positive, gamma=positive,
              seed=at_least(0), save_every=at_least(1), log_every=at_least(1), stop_after=at_least(0),
              compile=one_of(*COMPILE), fused_ce=one_of(*COMPILE), ce_chunk=at_least(0), fsdp=one_of(*SWITCH),
              shard_target=one_of(*SWITCH), micro_batch=at_least(0), grad_sync=one_of(*GRAD_SYNC),
              kernels=one_of(*KERNEL_CHOICES))
        require(not (self.fsdp == "off" and self.shard_target == "on"), "train.shard_target='on' shards the target "
                "under FSDP2, and train.fsdp='off' runs the plain step: give train.fsdp on (or auto under torchrun), or "
                "train.shard_target off")
        require(not self.micro_batch or self.batch_size % self.micro_batch == 0, f"train.micro_batch="
                f"{self.micro_batch}: expected a divisor of train.batch_size={self.batch_size} (0: chosen)")
        self.snapshots = tuple(int(k) for k in self.snapshots)
        bad = [k for k in self.snapshots if not 1 <= k <= self.steps]
        if bad:
            raise ValueError(f"train.snapshots: steps {bad} outside 1..steps={self.steps}")


UNLOOP_KEYS = tuple(f.name for f in fields(PretrainConfig) if f.name.startswith("unloop_"))


def pretrain_key(pretrain: dict) -> dict:
    """A pretraining section as fingerprints and experiment keys read it: without the unlikelihood settings when no
    unlikelihood step runs (a target pretrained before they existed is the same experiment)."""
    if pretrain.get("unloop_steps", 0):
        return dict(pretrain)
    return {k: v for k, v in pretrain.items() if k not in UNLOOP_KEYS}
