"""Pretrain the embedded default target (Qwen3.5 text architecture, full attention) WITH its native MTP head.

DeepSeek-V3-style joint loss, embedding and LM head shared:  L = CE(main logits_i, x_{i+1}) + lambda * CE(MTP_i, x_{i+2})
The result is an HF checkpoint whose safetensors carry the `mtp.*` keys, loaded back through `Target` / `MTPHead`.

The step: target + MTP as one module (`JointLM`; under torchrun a copy of it sharded with FSDP2, `dist.shard`), its
decoder layers torch.compile'd one by one on CUDA (`PretrainConfig.compile`; regional compilation: one graph the
layers share), bf16 autocast, causal attention through SDPA's `is_causal` (no mask materialised, grouped-query
attention without repeating K/V), the LM-head loss of both heads fused and chunked on CUDA
(`losses.linear_cross_entropy`: no [tokens, vocab] logits stored), fused AdamW, batches copied from pinned memory; the
host reads values back only every `log_every` steps.

    python -m dmtp.training.pretrain  # not a CLI of its own: `dmtp pipeline --profile tiny --stage target` runs it
"""
from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from dmtp.compiling import announce
from dmtp.config import PretrainConfig, TargetArch
from dmtp.dist import (all_sum, barrier, clip_sharded_, full_optimizer_state, full_state, precision, rank_world, shard,
                       shard_optimizer_state)
from dmtp.io import atomic_path, load_state, save_state
from dmtp.models.mtp import MTPHead
from dmtp.models.target import Target
from dmtp.training.common import (backward, check_finite_loss, compile_forwards, compiled, kernel_choices,
                                  to_device, watch_finite)
from dmtp.training.losses import linear_cross_entropy


def build_target(arch: TargetArch, vocab_size: int, eos_id: int, dtype=torch.float32):
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    rot = int(arch.head_dim * 0.25) // 2
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers, num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads, head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings, tie_word_embeddings=arch.tie_word_embeddings,
        layer_types=["full_attention"] * arch.num_hidden_layers, mtp_num_hidden_layers=1,
        eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [rot - 2 * (rot // 3), rot // 3, rot // 3], "mrope_interleaved": True})
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    tgt = Target(model)
    tgt.model.requires_grad_(True).train()
    mtp = MTPHead(tgt)
    return tgt, mtp


NO_MASK = {"full_attention": None, "linear_attention": None}  # HF then calls SDPA with is_causal=True


def head_terms(head: nn.Linear, h, y, ce_chunk: int | None = None):
    """(mean CE, top-1 accuracy) of the LM head's logits of h [B, T, H] against y [B, T]: `ce_chunk` tokens at a time
    through the fused loss (`losses.linear_cross_entropy`), or with the logits materialised in fp32 (None)."""
    if ce_chunk is not None:
        return linear_cross_entropy(h, head.weight, y, ce_chunk)
    logits = head(h).float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return ce, (logits.argmax(-1) == y).float().mean()


def joint_terms(tgt, mtp, x, ce_chunk: int | None = None):
    """x [B, T] -> (main CE, MTP CE, main acc, MTP acc); `ce_chunk`: the fused loss (`head_terms`). The body gets an
    explicit empty mask mapping: HF would otherwise materialise a causal mask whenever it runs under torch.compile
    (and lose the flash kernels). Both heads' inputs come before either loss: under torch.compile the fused loss is a
    graph break, and the body and MTP layer stay one graph."""
    h = tgt.body(input_ids=x, attention_mask=NO_MASK if tgt.mask_free else None, use_cache=False).last_hidden_state
    g = mtp.teacher_forced(x, h)  # [B, T-1, H], g_i predicts x_{i+2}
    ce_main, acc = head_terms(tgt.model.lm_head, h[:, :-1], x[:, 1:], ce_chunk)
    ce_mtp, acc_m = head_terms(tgt.model.lm_head, g[:, :-1], x[:, 2:], ce_chunk)
    return ce_main, ce_mtp, acc, acc_m


class JointLM(nn.Module):
    """Target + MTP head as one module (the root FSDP2 shards under torchrun): forward(x) = `joint_terms`."""

    def __init__(self, tgt, mtp, ce_chunk: int | None = None):
        super().__init__()
        self.model, self.mtp = tgt.model, mtp  # the MTP head reaches the embedding through the target
        self._tgt = [tgt]
        self.ce_chunk = ce_chunk

    def forward(self, x):
        return joint_terms(self._tgt[0], self.mtp, x, self.ce_chunk)


def train_flops_per_token(tgt, mtp, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3 x forward), the MFU numerator:
        6 N + 6 A d_q (T + 1)
    N = weights multiplied per token: the decoder layers' and the MTP head's matrices plus the LM head twice (main
    and MTP logits; a tied LM head counts, the embedding lookup does not); A = attention layers (target + MTP),
    d_q = query heads x head dim, T = sequence length. Causal attention: a query attends to (T + 1) / 2 keys on
    average, 2 d_q FLOPs per key each for QK^T and for AV, x 3 for the backward pass (the half of the score matrix
    above the diagonal is not counted: flash kernels skip it)."""
    c = tgt.config

    def mats(m):
        return sum(p.numel() for p in m.parameters() if p.dim() == 2)

    N = mats(tgt.body.layers) + mats(mtp) + 2 * c.vocab_size * c.hidden_size
    A = tgt.layer_types.count("full_attention") + 1
    return 6.0 * N + 6.0 * A * c.num_attention_heads * c.head_dim * (seq_len + 1)


def compile_layers(tgt, mtp) -> None:
    """Regional compilation: each decoder layer (and the MTP layer) compiled on its own, in place; the layers share one
    graph (the same code, parameters as its inputs), so the compile time does not grow with depth (a whole-model graph
    of a 32-layer target took minutes); the glue between them (embedding, rotary, final norm) and the fused loss run
    eagerly. `unloop.eager_layers` bypasses them while decoding."""
    for layer in list(tgt.body.layers) + list(mtp.layers):
        layer.compile(dynamic=False)


def window_batches(tokens: np.ndarray, seq_len: int, batch: int, rng: np.random.Generator, rank: int = 0,
                   world: int = 1):
    """Endless [batch / world, seq_len] batches: every rank draws the starts of the whole global batch from the same
    RNG stream (so the stream does not depend on the world size) and keeps rows rank::world."""
    n = len(tokens) - seq_len - 1
    while True:
        starts = rng.integers(0, n, size=batch)[rank::world]
        yield torch.from_numpy(np.stack([tokens[s: s + seq_len] for s in starts]).astype(np.int64))


@torch.no_grad()
def evaluate(tgt, mtp, tokens: np.ndarray, seq_len: int, max_tokens: int, batch: int = 16) -> dict:
    tgt.model.eval()
    dev = tgt.device
    n = min(len(tokens) - 1, max_tokens) // seq_len
    sums = np.zeros(4)
    count = 0
    for i in range(0, n, batch):
        x = torch.from_numpy(np.stack([tokens[j * seq_len: (j + 1) * seq_len]
                                       for j in range(i, min(n, i + batch))]).astype(np.int64)).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            terms = torch.stack(joint_terms(tgt, mtp, x)).tolist()  # materialised logits: no gradient to make
        sums += np.array(terms) * x.shape[0]
        count += x.shape[0]
    m = sums / max(count, 1)
    return {"heldout_tokens": count * seq_len, "target_loss": m[0], "mtp_loss": m[1], "target_top1": m[2],
            "mtp_top1": m[3]}


def pretrain(tgt, mtp, train_tokens: np.ndarray, cfg: PretrainConfig, out: str | Path, log=print) \
        -> tuple[list[dict], dict]:
    """`_pretrain` inside the kernel choices `cfg.kernels` asks for (`common.kernel_choices`)."""
    with kernel_choices(cfg.kernels, next(tgt.parameters()).device):
        return _pretrain(tgt, mtp, train_tokens, cfg, out, log)


def _pretrain(tgt, mtp, train_tokens: np.ndarray, cfg: PretrainConfig, out: str | Path, log=print) \
        -> tuple[list[dict], dict]:
    """Train target + MTP jointly; resumable from out/pretrain_state.pt, which is kept after the last step (remove it
    once the trained model is saved: a rerun after a kill in between resumes at the end). Returns (history, info).

    Under torchrun each rank takes rows rank::world of every global batch and trains a copy of target + MTP sharded
    with FSDP2 (per decoder layer, then the rest; bf16 compute and fp32 reductions with `bf16` on CUDA), whose
    gradients are averaged over the ranks, so N ranks compute the 1-rank gradient of the same global batch (every rank
    holds the same number of rows: the mean of the rank means is the batch mean); when the call ends (finished or
    stopped) the trained weights are gathered back into `tgt` and `mtp` on every rank, plain modules again (the
    embedded target is small: the copy costs little). The resumable state (model, MTP, optimizer, step, history, the
    data RNG's state; full tensors, gathered) holds nothing rank-specific and only rank 0 writes it, so a run stopped
    on N ranks (`stop_after`) resumes on any number of ranks. History records carry `elapsed_s`, taken after the
    logged values were read back (a sync): differences between records give the steady rate, compile time excluded."""
    from tqdm import tqdm

    out = Path(out)
    dev = tgt.device
    rank, world = rank_world()
    if cfg.batch_size % world:
        raise ValueError(f"pretraining batch {cfg.batch_size} is not divisible by {world} data-parallel ranks")
    main = rank == 0
    for p in list(tgt.model.parameters()) + list(mtp.parameters()):
        p.requires_grad_(True)
    step_tokens = cfg.seq_len * cfg.batch_size
    steps = max(1, cfg.tokens // step_tokens)
    warm = max(1, int(cfg.warmup_frac * steps))
    state_path = out / "pretrain_state.pt"
    start, hist = 0, []
    rng = np.random.default_rng(cfg.seed)  # window starts: the only randomness of a step
    s = load_state(state_path, dev, required=("model", "mtp", "opt", "step", "history")) \
        if state_path.exists() else None
    if s is not None:
        tgt.model.load_state_dict(s["model"])
        mtp.load_state_dict(s["mtp"])
    fused = compiled(cfg.fused_ce, dev)  # the same "auto" | "on" | "off" rule
    sharded = world > 1
    if sharded:  # a copy of target + MTP (JointLM's references to both copied alike) sharded in place; `tgt` and `mtp`
        # get its weights back at the end
        net = copy.deepcopy(JointLM(tgt, mtp, cfg.ce_chunk if fused else None))
        t_tgt, t_mtp = net._tgt[0], net.mtp
        shard(net, list(t_tgt.body.layers) + list(t_mtp.layers), precision(cfg.bf16 and dev.type == "cuda"))
    else:
        net, t_tgt, t_mtp = JointLM(tgt, mtp, cfg.ce_chunk if fused else None), tgt, mtp
    params = list({id(p): p for p in list(t_tgt.model.parameters()) + list(t_mtp.parameters())}.values())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95),
                            fused=dev.type == "cuda")
    if s is not None:
        opt.load_state_dict(shard_optimizer_state(s["opt"], opt) if sharded else s["opt"])
        start, hist = s["step"], s["history"]
        if "rng" in s:
            rng.bit_generator.state = s["rng"]
        else:  # a state written before the RNG was saved
            rng = np.random.default_rng(cfg.seed + start)
        if main:
            log(f"[pretrain] resumed at step {start}/{steps} (state written by {s.get('world', 1)} rank(s), "
                f"now {world})")
    it = window_batches(train_tokens, cfg.seq_len, cfg.batch_size, rng, rank, world)
    t_tgt.model.train()
    t_mtp.train()
    fast = compiled(cfg.compile, dev)
    if fast and sharded:  # each layer's forward alone: FSDP2's gathers and reduce-scatters stay outside the graphs
        compile_forwards(list(t_tgt.body.layers) + list(t_mtp.layers))
    elif fast:
        compile_layers(t_tgt, t_mtp)
    step_terms = net
    t0 = time.time()
    bad = None  # a non-finite loss since the last log step (a device-side flag)
    bar = tqdm(range(start, steps), desc="pretrain target+MTP", dynamic_ncols=True, disable=not main)
    save_every = cfg.save_every or max(50, steps // 10)
    info = {"start_step": start, "steps": steps, "world": world, "finished": True, "step": steps, "compiled": fast,
            "fused_ce": fused}
    for step in bar:
        lr = cfg.lr * (step + 1) / warm if step < warm else \
            cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))
        for gp in opt.param_groups:
            gp["lr"] = lr
        lam = cfg.mtp_lambda if step < (1 - cfg.late_frac) * steps else cfg.mtp_lambda_late
        x = to_device(next(it), dev)
        with announce(f"the pretraining step (batch {cfg.batch_size} x {cfg.seq_len})", active=fast and main and
                      step == start):  # the first step compiles the layers' forward and backward
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.bf16 and x.is_cuda):
                ce, ce_m, acc, acc_m = step_terms(x)
                loss = ce + lam * ce_m
            opt.zero_grad(set_to_none=True)
            backward(loss)  # FSDP2 averages the gradients over ranks here
            if sharded:  # after the average: the global norm, over every rank's shards
                clip_sharded_([params], cfg.clip)
            else:
                torch.nn.utils.clip_grad_norm_(params, cfg.clip)
            opt.step()
        bad = watch_finite(bad, ce, ce_m)  # read back with the next log step's values (no synchronisation here)
        if step % cfg.log_every == 0 or step == steps - 1:
            m = (all_sum(torch.stack([ce, ce_m, acc, acc_m, bad.float()]).detach().float()) / world).tolist()
            rec = {"step": step, "lr": lr, "loss": m[0], "mtp_loss": m[1], "acc": m[2], "mtp_acc": m[3],
                   "tokens": (step + 1) * step_tokens, "elapsed_s": time.time() - t0}
            check_finite_loss(f"target pretraining {out}", step + 1, m[4], rec, lr, tgt)
            bad = None
            hist.append(rec)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", mtp=f"{rec['mtp_loss']:.3f}")
        stop = cfg.stop_after and step + 1 == cfg.stop_after and step + 1 < steps
        # the last step too: the state outlives training until the caller has saved the finished target
        if (step + 1) % save_every == 0 or step + 1 == steps or stop:
            # full tensors, gathered on every rank under FSDP2 (collective), written by rank 0
            model, head, opt_state = (full_state(t_tgt.model), full_state(t_mtp), full_optimizer_state(opt)) \
                if sharded else (tgt.model.state_dict(), mtp.state_dict(), opt.state_dict())
            if main:
                with atomic_path(state_path) as tmp:
                    save_state({"model": model, "mtp": head, "opt": opt_state, "step": step + 1, "history": hist,
                                "rng": rng.bit_generator.state, "world": world}, tmp)
            if stop:
                barrier()
                info.update(finished=False, step=step + 1)
                break
    info.update(train_s=time.time() - t0, tokens_trained=(info["step"] - start) * step_tokens)
    if sharded:  # the trained weights into the caller's plain modules, on every rank
        tgt.model.load_state_dict(full_state(t_tgt.model, everywhere=True))
        mtp.load_state_dict(full_state(t_mtp, everywhere=True))
    if not info["finished"]:
        if main:
            log(f"[pretrain] stopped after step {info['step']}/{steps} (resumable from {state_path})")
    else:  # the state at the last step stays: the caller removes it once the target is saved
        tgt.model.eval().requires_grad_(False)
        mtp.eval().requires_grad_(False)
        barrier()
    return hist, info
