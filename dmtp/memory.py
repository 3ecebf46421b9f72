"""Memory model of drafter training and evaluation, per GPU (torch-free: the target's HF config dict and the
drafter's shape in, bytes out), and the fit check built on it (`plan_training`, `plan_eval`).

Training, per rank, as `dmtp/training/drafters.py` computes a step (b sequences of T tokens on the rank, N anchors
per sequence, S slots per block, so R = b N S block rows and C = b T context rows; bf16 autocast, fp32 master
weights):

    target      frozen bf16 weights (+ the native MTP head): P_t x 2; sharded (FSDP2, `TrainConfig.shard_target`)
                its decoder layers / world, the embedding, LM head, norm and MTP head replicated (the drafters read
                them outside its forward), plus the gathered layers in flight (the largest, twice: one used, one
                prefetched)
    drafters    each trained drafter's fp32 weights, gradients and AdamW moments: P_d x 16 (/ world under FSDP),
                plus its bf16 compute copy (autocast's weight cache; under FSDP the gathered bf16 unit and its fp32
                gradient before the reduce-scatter, two units in flight: a decoder layer, or the root's fc and norms)
    grad_accum  gradient accumulation under FSDP with the reduce-scatter after the last micro-batch only
                (`TrainConfig.grad_sync="last"`): FSDP2 sums each drafter's gradients unsharded in fp32 between
                micro-batches, P_d x 4 per drafter trained side by side (0 with one micro-batch, one process without
                FSDP, or a reduce-scatter after every micro-batch)
    features    the target's tapped layers, C x K H x 2 (bf16), and one drafter's context input made of them:
                its column copy (x 2) and fp32 cast (x 4), the MTP hiddens g (C x H x 2)
    pass        the feature pass's largest transient (no autograd graph: one layer at a time), C x W x 2 with W the
                widest per-token width of a layer's working set (3 FFN projections or the Gated DeltaNet's 4
                projected streams)
    layers      what the drafter's backward keeps per block row and layer: the fp32 residual at both norms (2 x 4H),
                the bf16 normed inputs of the projections (2 x 2H), q and the attention output (2 x 2A, A = heads x
                head_dim), the FFN's gate, up and product (3 x 2I): 12 H + 4 A + 6 I bytes; plus per layer the
                context keys/values, C x 2 Akv x 2 (the block's own are in A's share). With activation
                checkpointing only the layer inputs stay (4H per row and layer) and one layer's full set is rebuilt
    logits      the LM-head loss. Plain (the logits materialised): R x V x 12 at its peak, the fp32 log-probs kept
                for the backward (4), their gradient (4) and the input gradient made from it (4); the bf16 logits
                and their fp32 cast (2 + 4) are freed by then. Fused (`losses.linear_cross_entropy`): the stored
                input gradient R x H x 2 and one chunk's working set, c x V x 16 (bf16 logits, fp32 copy, softmax,
                fp32 and bf16 gradient), c = `ce_chunk_rows`

Evaluation, per GPU (every GPU holds the whole model; prompts are dealt to them): the target, MTP head and one
drafter in bf16; the caches of `batch` sequences of `length` positions: full-attention K/V (2 x kv heads x
head_dim x 2 bytes per position and layer; the MTP layer and the drafter's layers likewise), the Gated DeltaNet
layers' fixed-size state (fp32 [v heads, k dim, v dim] plus the conv window); the verify pass's fp32 logits (batch x
block x V x 4) and a prefill's largest transient (`prefill` sequences at a time, as the feature pass).

Sizes are in GB = 1e9 bytes. A card's capacity is given as sold ("80", "141": GiB), of which USABLE is planned on
(the CUDA context, NCCL's buffers and the caching allocator's fragmentation take the rest).

    >>> from dmtp.profiles import get_profile
    >>> p = get_profile("qwen3.6-27b")
    >>> plan = plan_training(p.scale.target_config, drafter_spec(p.scale.target_config, layers=5, heads=32,
    ...     kv_heads=8, head_dim=128, intermediate=17408, block_size=8), gpus=8, gpu_gb=80, seq_len=2048,
    ...     anchors=512, global_batch=128)
"""
from __future__ import annotations

from dataclasses import dataclass, field

GB = 1e9
SWITCH = ("auto", "on", "off")  # values of plan_training's shard_target and checkpointing
GIB = 2 ** 30
USABLE = 0.93  # share of a card's capacity the plan may fill
FUSE_ABOVE_BYTES = 2 * GIB  # TrainConfig.fused_ce="auto": fused where the plain path's fp32 logits exceed this
CE_CHUNK_BYTES = GIB // 2  # fp32 logits of one chunk of the fused loss when TrainConfig.ce_chunk = 0
PLAIN_LOGIT_BYTES = 12  # per block row and vocabulary entry at the plain loss's peak (see the module docstring)
FUSED_CHUNK_BYTES = 16  # per chunk row and vocabulary entry of the fused loss's working set
ROW_LAYER = (12, 4, 6)  # bytes per block row and drafter layer kept for the backward: x H, x A, x I
PREFILL = 8  # sequences a decode server prefills at once (EngineConfig.admit of the paper profiles' base)


def ce_chunk_rows(vocab: int, ce_chunk: int = 0) -> int:
    """Rows per chunk of the fused LM-head loss: `ce_chunk`, or as many as make CE_CHUNK_BYTES of fp32 logits."""
    return ce_chunk or max(1, CE_CHUNK_BYTES // (4 * vocab))


def drafter_ce_chunk(fused_ce: str, ce_chunk: int, rows: int, vocab: int) -> int:
    """TrainConfig.fused_ce resolved for a step of `rows` block rows per rank: the fused loss's rows per chunk, or 0
    for the plain loss ("auto": fused where the plain fp32 logits, rows x vocab x 4 bytes, exceed FUSE_ABOVE_BYTES)."""
    if fused_ce not in ("auto", "on", "off"):
        raise ValueError(f"fused_ce={fused_ce!r}: expected 'auto', 'on' or 'off'")
    on = fused_ce == "on" or (fused_ce == "auto" and rows * vocab * 4 > FUSE_ABOVE_BYTES)
    return ce_chunk_rows(vocab, ce_chunk) if on else 0


# --- parameters -----------------------------------------------------------------------------------------------------
def _types(cfg: dict) -> list[str]:
    return list(cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"])


GATED = ("qwen3_5", "qwen3_next")  # model types whose attention q_proj also makes the output gate


def _attention(cfg: dict) -> int:
    """A full-attention block: q (Qwen3.5/3.6 and Qwen3-Next: q and the output gate, 2 x heads x head_dim), k, v, o
    projections and the q/k norms."""
    H = cfg["hidden_size"]
    D = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
    gate = 2 if str(cfg.get("model_type", "")).startswith(GATED) else 1
    return H * gate * q + 2 * H * kv + q * H + 2 * D


def _gdn(cfg: dict) -> int:
    """A Gated DeltaNet block: q, k, v and z projections, the per-head beta and decay inputs, the causal conv over
    q, k, v, dt bias and A, the gated norm, the output projection."""
    H = cfg["hidden_size"]
    kd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    vd = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
    nv = cfg["linear_num_value_heads"]
    return (H * (2 * kd + vd) + H * vd + 2 * H * nv + (2 * kd + vd) * cfg["linear_conv_kernel_dim"] + 2 * nv
            + cfg["linear_value_head_dim"] + vd * H)


def _ffn(cfg: dict) -> int:
    """The FFN of a layer: dense (3 H I), or MoE (router, experts' gate/up/down, the shared expert and its gate)."""
    H = cfg["hidden_size"]
    if cfg.get("num_experts"):
        E, I, S = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        return H * E + E * 3 * H * I + 3 * H * S + H
    return 3 * H * cfg["intermediate_size"]


def target_params(cfg: dict) -> dict[str, int]:
    """Parameter counts of a Qwen3.5/3.6 text target from its HF config dict: embedding, LM head (0 when tied),
    decoder layers, final norm, the native MTP head (two pre-fc norms, fc 2H -> H, one full-attention layer, norm)
    and their total."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    norms = 2 * H
    layers = sum((_attention(cfg) if t == "full_attention" else _gdn(cfg)) + _ffn(cfg) + norms for t in _types(cfg))
    mtp = (2 * H + 2 * H * H + _attention(cfg) + _ffn(cfg) + norms + H) if cfg.get("mtp_num_hidden_layers") else 0
    out = dict(embedding=V * H, lm_head=0 if cfg.get("tie_word_embeddings") else V * H, layers=layers, norm=H,
               mtp=mtp)
    out["total"] = sum(out.values())
    return out


def largest_layer(cfg: dict) -> int:
    """Parameters of the target's largest decoder layer: what a sharded target gathers at once."""
    return max((_attention(cfg) if t == "full_attention" else _gdn(cfg)) + _ffn(cfg) + 2 * cfg["hidden_size"]
               for t in set(_types(cfg)))


@dataclass(frozen=True)
class DrafterSpec:
    """The shape of a drafter as the memory model reads it."""
    hidden: int  # width (the target's)
    vocab: int  # the target's vocabulary (its LM head scores the drafter's rows)
    layers: int  # decoder layers
    heads: int  # query heads
    kv_heads: int  # key/value heads
    head_dim: int  # head size
    intermediate: int  # FFN width
    taps: int  # target layers tapped (K): the context input is K x hidden wide
    slots: int  # block slots per anchor (S: the block size, or one less for the variants that give T1)
    injection: int = 0  # the variant's own parameters (0 for dflash; 2H^2 + 2H at most, the fusion variants)
    fusable: bool = True  # the fused LM-head loss applies (False: DFlash2's selector or a soft cap reads the logits)

    @property
    def layer_params(self) -> int:
        H, A, Akv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * H * A + 2 * H * Akv + 2 * self.head_dim + 3 * H * self.intermediate + 2 * H

    @property
    def root_params(self) -> int:
        """What FSDP2 shards as the drafter's root, besides its layers: fc, the two norms, the injection."""
        return self.taps * self.hidden * self.hidden + 2 * self.hidden + self.injection

    @property
    def params(self) -> int:
        """Layers, fc (K H -> H), hidden_norm and norm, and the injection's."""
        return self.layers * self.layer_params + self.taps * self.hidden * self.hidden + 2 * self.hidden + \
            self.injection


def drafter_spec(cfg: dict, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                 block_size: int, taps: int | None = None, injection: int | None = None) -> DrafterSpec:
    """A paper drafter on the target `cfg`: K = layers taps, S = block_size slots, and the largest injection
    (2 H^2 + 2 H, the fusion variants) unless given."""
    H = cfg["hidden_size"]
    return DrafterSpec(hidden=H, vocab=cfg["vocab_size"], layers=layers, heads=heads, kv_heads=kv_heads,
                       head_dim=head_dim, intermediate=intermediate, taps=layers if taps is None else taps,
                       slots=block_size, injection=2 * H * H + 2 * H if injection is None else injection)


# --- training -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainSetting:
    """One way to run a training step on one rank."""
    world: int  # data-parallel ranks (GPUs)
    micro_batch: int  # sequences per rank per forward/backward
    seq_len: int  # tokens per sequence (the compiled path pads every batch to it)
    anchors: int  # anchors per sequence
    shard_target: bool = False  # the frozen target sharded over the ranks (FSDP2) instead of replicated
    shard_drafters: bool = True  # FSDP2: the drafters' weights, gradients and AdamW state sharded over the ranks
    checkpointing: bool = False  # activation checkpointing of every drafter layer
    ce_chunk: int = 0  # rows per chunk of the fused LM-head loss; 0: the plain loss
    drafters: int = 1  # drafters trained side by side (each its own state; their steps run one after another)
    target_bytes: int = 2  # bytes per target weight (bf16)
    accumulation: int = 1  # micro-batches per optimizer step (gradient accumulation)
    defer_sync: bool = True  # FSDP with accumulation: gradients reduce-scattered after the last micro-batch only
    # (held unsharded in fp32 until then); False: after every micro-batch (they stay sharded)

    @property
    def grad_sync(self) -> str:
        """`TrainConfig.grad_sync` for this setting."""
        return "last" if self.defer_sync else "every"


def train_terms(cfg: dict, d: DrafterSpec, s: TrainSetting) -> dict[str, float]:
    """Per-rank bytes of one training step by term (the module docstring defines them), and their sum `total`."""
    H, V, K = d.hidden, d.vocab, d.taps
    A, Akv, I = d.heads * d.head_dim, d.kv_heads * d.head_dim, d.intermediate
    b, T = s.micro_batch, s.seq_len
    R, C = b * s.anchors * d.slots, b * T
    P = target_params(cfg)
    shard_t = s.shard_target and s.world > 1
    t = {}
    t["target"] = (P["total"] - P["layers"] + P["layers"] / (s.world if shard_t else 1)) * s.target_bytes
    t["target_gathered"] = 2 * largest_layer(cfg) * s.target_bytes if shard_t else 0
    t["drafter_state"] = s.drafters * d.params * 16 / (s.world if s.shard_drafters else 1)
    t["drafter_compute"] = 2 * max(d.layer_params, d.root_params) * (2 + 4) if s.shard_drafters else d.params * 2
    t["grad_accum"] = s.drafters * d.params * 4 if s.shard_drafters and s.accumulation > 1 and s.defer_sync else 0
    t["features"] = C * K * H * 2 + C * K * H * (2 + 4) + C * H * 2
    if cfg.get("num_experts"):
        ffn_w = 3 * max(cfg["shared_expert_intermediate_size"],
                        cfg["num_experts_per_tok"] * cfg["moe_intermediate_size"])
    else:
        ffn_w = 3 * cfg["intermediate_size"]
    gdn_w = 0
    if "linear_attention" in _types(cfg):
        gdn_w = 4 * (2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
                     + 2 * cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"])
    t["feature_pass"] = C * max(ffn_w, gdn_w, 4 * H) * 2
    per_row = ROW_LAYER[0] * H + ROW_LAYER[1] * A + ROW_LAYER[2] * I
    kv_ctx = d.layers * C * 2 * Akv * 2
    if s.checkpointing:
        t["layers"] = R * d.layers * 4 * H + R * per_row + kv_ctx
    else:
        t["layers"] = R * d.layers * per_row + kv_ctx
    t["block"] = R * H * 4 * 2  # the block's input embeddings (fp32) and the normed output
    if s.ce_chunk and d.fusable:
        t["logits"] = R * H * 2 + min(s.ce_chunk, R) * V * FUSED_CHUNK_BYTES
    else:
        t["logits"] = R * V * PLAIN_LOGIT_BYTES
    t["total"] = sum(t.values())
    return t


def capacity(gpu_gb: float) -> float:
    """Bytes the plan may fill on a card sold as `gpu_gb` (GiB)."""
    return gpu_gb * GIB * USABLE


@dataclass
class Plan:
    """A fit check's answer: the setting (or the smallest one tried when none fits) and its per-rank terms."""
    fits: bool
    setting: TrainSetting | None
    accumulation: int  # micro-steps per optimizer step: global batch / (world x micro_batch)
    terms: dict[str, float]
    capacity: float  # bytes the plan may fill per GPU
    tried: list = field(default_factory=list)  # (setting, total bytes) of every setting checked, in order

    def line(self) -> str:
        """The plan in one line, GB per rank."""
        s, gb = self.setting, lambda x: f"{x / GB:.1f}"
        head = "fits" if self.fits else "does NOT fit"
        sync = f", gradients reduced {'once a step' if s.defer_sync else 'every micro-batch'}" \
            if s.shard_drafters and self.accumulation > 1 else ""
        what = (f"target {'sharded' if s.shard_target else 'replicated'}, activation checkpointing "
                f"{'on' if s.checkpointing else 'off'}, LM-head loss {'fused' if s.ce_chunk else 'plain'}, "
                f"micro-batch {s.micro_batch} x {self.accumulation} accumulation x {s.world} GPU(s){sync}")
        parts = ", ".join(f"{k} {gb(v)}" for k, v in self.terms.items() if k != "total" and v)
        return f"{head}: {what}: {gb(self.terms['total'])} GB of {gb(self.capacity)} GB per GPU ({parts})"


def _chunk(d: DrafterSpec, fused_ce: str, ce_chunk: int, rows: int) -> int:
    """The fused loss's rows per chunk for drafter d at `rows` block rows, 0 where it takes the plain loss."""
    return drafter_ce_chunk(fused_ce, ce_chunk, rows, d.vocab) if d.fusable else 0


def _divisors_desc(n: int) -> list[int]:
    return [k for k in range(n, 0, -1) if n % k == 0]


def plan_training(cfg: dict, d: DrafterSpec, *, gpus: int, gpu_gb: float, seq_len: int, anchors: int,
                  global_batch: int, drafters: int = 1, shard_target: str = "auto", checkpointing: str = "auto",
                  fused_ce: str = "auto", ce_chunk: int = 0, micro_batch: int | None = None,
                  shard_drafters: bool | None = None, grad_sync: str = "auto") -> Plan:
    """The first setting that fits, in order of cost: the target replicated before sharded (no all-gather of its
    weights every step), no activation checkpointing before checkpointing (no recomputed forward), the largest
    micro-batch (fewest accumulation steps), under FSDP with accumulation one reduce-scatter a step before one per
    micro-batch. shard_target / checkpointing: "auto" (searched), "on", "off"; micro_batch: fixed (None: searched
    over the divisors of global_batch / gpus); shard_drafters: FSDP2 on the drafters (None: on more than one GPU, as
    TrainConfig.fsdp="auto"); grad_sync: TrainConfig.grad_sync ("auto": searched). A sharded target needs more than
    one GPU. When nothing fits, the plan of the cheapest-in-memory setting tried, with fits=False."""
    if global_batch % gpus:
        raise ValueError(f"global batch {global_batch} is not divisible by {gpus} GPUs")
    for name, v, ok in (("shard_target", shard_target, SWITCH), ("checkpointing", checkpointing, SWITCH),
                        ("grad_sync", grad_sync, ("auto", "last", "every"))):
        if v not in ok:
            raise ValueError(f"{name}={v!r}: expected one of {', '.join(map(repr, ok))}")
    per_rank = global_batch // gpus
    if micro_batch and per_rank % micro_batch:
        raise ValueError(f"micro-batch {micro_batch} does not divide the {per_rank} sequences per GPU")
    shards = {"auto": (False, True) if gpus > 1 else (False,), "on": (True,), "off": (False,)}[shard_target]
    shard_drafters = gpus > 1 if shard_drafters is None else shard_drafters
    ckpts = {"auto": (False, True), "on": (True,), "off": (False,)}[checkpointing]
    micros = [micro_batch] if micro_batch else _divisors_desc(per_rank)
    cap = capacity(gpu_gb)
    tried = []
    for shard in shards:
        for ck in ckpts:
            for m in micros:
                rows, acc = m * anchors * d.slots, per_rank // m
                syncs = {"auto": (True, False), "last": (True,), "every": (False,)}[grad_sync] \
                    if shard_drafters and acc > 1 else (grad_sync != "every",)
                for defer in syncs:
                    s = TrainSetting(world=gpus, micro_batch=m, seq_len=seq_len, anchors=anchors, shard_target=shard,
                                     shard_drafters=shard_drafters, checkpointing=ck,
                                     ce_chunk=_chunk(d, fused_ce, ce_chunk, rows), drafters=drafters,
                                     accumulation=acc, defer_sync=defer)
                    terms = train_terms(cfg, d, s)
                    tried.append((s, terms["total"]))
                    if terms["total"] <= cap:
                        return Plan(True, s, acc, terms, cap, tried)
    s, _ = min(tried, key=lambda x: x[1])
    return Plan(False, s, s.accumulation, train_terms(cfg, d, s), cap, tried)


def check_training(cfg: dict, d: DrafterSpec, *, world: int, gpu_gb: float, batch_size: int, seq_len: int,
                   anchors: int, fsdp: str, shard_target: str, checkpointing: bool, fused_ce: str, ce_chunk: int,
                   drafters: int = 1, micro_batch: int = 0, grad_sync: str = "auto") -> Plan:
    """The training loop's setting (`dmtp/training/drafters.py`, `TrainConfig`) planned: the global batch_size over
    `world` ranks in micro-batches of `micro_batch` (0: searched, the largest that fits), activation checkpointing as
    given, `shard_target` and `grad_sync` "auto" searched (replicated before sharded; one reduce-scatter a step
    before one per micro-batch). fsdp: TrainConfig.fsdp ("auto": FSDP2 on more than one rank; "on": also on one)."""
    shard_d = fsdp == "on" or (fsdp == "auto" and world > 1)
    shard_t = shard_target if shard_d and world > 1 else "on" if shard_target == "on" else "off"
    return plan_training(cfg, d, gpus=world, gpu_gb=gpu_gb, seq_len=seq_len, anchors=anchors,
                         global_batch=batch_size, drafters=drafters, shard_target=shard_t,
                         checkpointing="on" if checkpointing else "off", fused_ce=fused_ce, ce_chunk=ce_chunk,
                         micro_batch=micro_batch or None, shard_drafters=shard_d, grad_sync=grad_sync)


# --- evaluation -----------------------------------------------------------------------------------------------------
def eval_terms(cfg: dict, d: DrafterSpec, *, batch: int, length: int, block: int | None = None,
               prefill: int = PREFILL) -> dict[str, float]:
    """Per-GPU bytes of evaluation: weights (target, MTP, drafter; bf16), caches of `batch` sequences of `length`
    positions, the verify pass's fp32 logits over `block` rows per sequence (default: the drafter's slots) and a
    prefill's transient (`prefill` sequences of `length` tokens, as the feature pass)."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    types = _types(cfg)
    D = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    kv_pos = 2 * cfg["num_key_value_heads"] * D * 2  # bytes per position and full-attention layer
    t = {"weights": (target_params(cfg)["total"] + d.params) * 2}
    full = types.count("full_attention") + (1 if cfg.get("mtp_num_hidden_layers") else 0)
    t["kv_cache"] = batch * length * (full * kv_pos + d.layers * 2 * d.kv_heads * d.head_dim * 2)
    gdn = types.count("linear_attention")
    if gdn:
        kd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
        vd = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
        state = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"] * 4
        conv = (2 * kd + vd) * (cfg["linear_conv_kernel_dim"] - 1) * 2
        t["linear_state"] = batch * gdn * (state + conv)
    t["verify_logits"] = batch * (block or d.slots) * V * 4
    probe = TrainSetting(world=1, micro_batch=min(prefill, batch), seq_len=length, anchors=1)
    t["prefill"] = train_terms(cfg, d, probe)["feature_pass"] + min(prefill, batch) * length * H * 2 * 2
    t["total"] = sum(t.values())
    return t


def plan_eval(cfg: dict, d: DrafterSpec, *, gpu_gb: float, batch: int, length: int) -> tuple[bool, dict]:
    """(fits, terms) of evaluation on one card sold as `gpu_gb`."""
    t = eval_terms(cfg, d, batch=batch, length=length)
    return t["total"] <= capacity(gpu_gb), t


# --- tables -----------------------------------------------------------------------------------------------------------
def render_tables(models: dict[str, tuple[dict, DrafterSpec]], *, gpus=(1, 2, 4, 8), cards=(80, 141),
                  lengths=(2048, 32768), anchors: int = 512, global_batch: int = 128, eval_batch: int = 32) -> str:
    """Markdown: per model, the training plan (GB per rank) for every GPU count, card and sequence length, and
    evaluation per card and length. models: name -> (target HF config dict, drafter spec)."""
    gb = lambda x: f"{x / GB:.1f}"  # noqa: E731
    out = []
    for name, (cfg, d) in models.items():
        P = target_params(cfg)
        out += [f"### {name}", "",
                f"target {P['total'] / 1e9:.2f} B parameters ({gb(P['total'] * 2)} GB in bf16, MTP head "
                f"{P['mtp'] / 1e9:.2f} B); drafter {d.params / 1e9:.3f} B ({d.layers} layers, width {d.hidden}, "
                f"{d.slots} slots, {d.taps} taps; fp32 weights + grads + AdamW = {gb(d.params * 16)} GB); "
                f"{anchors} anchors per sequence, global batch {global_batch}.", "",
                "Training, per GPU (GB; `micro x acc`: sequences per forward x accumulation steps; `reduce`: under "
                "FSDP with accumulation, the gradients reduce-scattered once a step, held unsharded in fp32 between "
                "micro-batches (`grad GB`), or after every micro-batch):", "",
                "| GPUs | card | tokens | fits | target | ckpt | CE | micro x acc | reduce | target GB | drafter GB | "
                "grad GB | activations GB | of which logits | total GB |",
                "|---:|---:|---:|:--|:--|:--|:--|:--|:--|---:|---:|---:|---:|---:|---:|"]
        for n in gpus:
            for card in cards:
                for T in lengths:
                    p = plan_training(cfg, d, gpus=n, gpu_gb=card, seq_len=T, anchors=anchors,
                                      global_batch=global_batch)
                    s, t = p.setting, p.terms
                    reduce = ("once" if s.defer_sync else "every") if s.shard_drafters and p.accumulation > 1 else "-"
                    act = t["features"] + t["feature_pass"] + t["layers"] + t["block"] + t["logits"]
                    out.append(f"| {n} | {card} | {T:,} | {'yes' if p.fits else '**no**'} | "
                               f"{'sharded' if s.shard_target else 'replicated'} | "
                               f"{'on' if s.checkpointing else 'off'} | {'fused' if s.ce_chunk else 'plain'} | "
                               f"{s.micro_batch} x {p.accumulation} | "
                               f"{reduce} | {gb(t['target'] + t['target_gathered'])} | "
                               f"{gb(t['drafter_state'] + t['drafter_compute'])} | {gb(t['grad_accum'])} | {gb(act)} | "
                               f"{gb(t['logits'])} | {gb(t['total'])} |")
        out += ["", f"Evaluation, per GPU (batch {eval_batch}; target + MTP + drafter in bf16):", "",
                "| card | tokens | fits | weights GB | KV cache GB | GDN state GB | verify logits GB | prefill GB | "
                "total GB |", "|---:|---:|:--|---:|---:|---:|---:|---:|---:|"]
        for card in cards:
            for T in lengths:
                ok, t = plan_eval(cfg, d, gpu_gb=card, batch=eval_batch, length=T)
                out.append(f"| {card} | {T:,} | {'yes' if ok else '**no**'} | {gb(t['weights'])} | "
                           f"{gb(t['kv_cache'])} | {gb(t.get('linear_state', 0))} | {gb(t['verify_logits'])} | "
                           f"{gb(t['prefill'])} | {gb(t['total'])} |")
        out.append("")
    return "\n".join(out)


def with_layers(cfg: dict, layers: int) -> dict:
    """The target config cut to its first `layers` decoder layers (the hybrid pattern kept)."""
    out = dict(cfg, num_hidden_layers=layers)
    if cfg.get("layer_types"):
        out["layer_types"] = list(cfg["layer_types"][:layers])
    return out


__all__ = ["DrafterSpec", "Plan", "TrainSetting", "capacity", "ce_chunk_rows", "check_training", "drafter_ce_chunk",
           "drafter_spec", "eval_terms", "plan_eval", "plan_training", "render_tables", "target_params", "train_terms",
           "with_layers"]
