"""Sequence-level unlikelihood fine-tuning of the pretrained target (Welleck et al., "Neural Text Generation with
Unlikelihood Training", ICLR 2020, section 5.2): the target's own greedy continuations of corpus prompts are decoded,
every token that completes an n-gram already present earlier in the sequence (prompt or continuation) is a negative
candidate (`pretrain.unloop_negatives="ngram"`; "loop": only the tokens of the trailing loop past its first copy, what
the evaluation's loop_frac counts), and the step adds

    L_UL = - mean over the candidates of log(1 - p(x_t | x_<t))

to the pretraining loss of a corpus batch (target + MTP, `pretrain.joint_terms`), so the model keeps its likelihood
while the probability of repeating itself falls. Greedy decoding of a small code model collapses into repeated
statement blocks (`metrics.loop_summary`); this is the standard remedy that trains against exactly that.

The continuations are decoded in pools (`PretrainConfig.unloop_prompts` at a time, with the weights of that moment)
and reused for `unloop_every` steps: the pool is slightly off-policy between refreshes, as in the paper's batched
decoding.

    unloop(tgt, mtp, train_tokens, PretrainConfig(..., unloop_steps=200), eos_id, log=print)   # after pretrain()
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
import torch.nn.functional as F

from dmtp.analysis.metrics import loop_span, loop_summary, trailing_loop
from dmtp.training.common import backward, check_finite_loss, compiled, kernel_choices, to_device, watch_finite


def repeat_candidates(ids: torch.Tensor, start: int, n: int = 4) -> torch.Tensor:
    """Boolean [B, T]: position t >= start is a candidate when the n-gram ids[t-n+1 .. t] occurs earlier in its row
    (ending before t; the prompt counts). Every token of such a repeated n-gram that lies at or after `start` is
    marked (Welleck's "x_t is part of a repeating n-gram")."""
    B, T = ids.shape
    mark = np.zeros((B, T), dtype=bool)
    rows = ids.tolist()
    for b, row in enumerate(rows):
        seen = set()
        for t in range(n - 1, T):
            g = tuple(row[t - n + 1: t + 1])
            if t >= start and g in seen:
                mark[b, max(start, t - n + 1): t + 1] = True
            seen.add(g)
    return torch.from_numpy(mark)


def loop_candidates(ids: torch.Tensor, start: int) -> torch.Tensor:
    """Boolean [B, T]: the tokens of the exact loop a row's continuation (ids[:, start:]) ends in, past the loop's
    first copy (`metrics.loop_span`: >= 2 copies, >= 16 tokens): the tokens that copy a statement block already
    written, and nothing else. Narrower than `repeat_candidates`: code repeats short n-grams legitimately
    (indentation, `self.`), while the evaluation's loop_frac counts only such trailing loops."""
    B, T = ids.shape
    mark = torch.zeros((B, T), dtype=torch.bool)
    for b, row in enumerate(ids[:, start:].tolist()):
        s, p = loop_span(row)
        if p:
            mark[b, start + s + p:] = True
    return mark


def negatives(ids: torch.Tensor, start: int, kind: str, n: int) -> torch.Tensor:
    """The unlikelihood candidates of `pretrain.unloop_negatives`: "ngram" (`repeat_candidates`, n-grams) or "loop"
    (`loop_candidates`)."""
    if kind == "loop":
        return loop_candidates(ids, start)
    return repeat_candidates(ids, start, n)


def pool_loop_frac(cont: torch.Tensor) -> float:
    """Tokens inside trailing loops / all tokens of the continuations [N, G] (`metrics.trailing_loop`, the evaluation's
    loop_frac over a pool)."""
    rows = cont.tolist()
    return sum(len(r) - trailing_loop(r) for r in rows) / max(1, sum(len(r) for r in rows))


def unlikelihood(logits: torch.Tensor, ids: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """-mean log(1 - p(ids[:, t] | < t)) over the candidate positions t (cand[:, t]); logits[:, t - 1] predicts
    ids[:, t]. Zero (with a gradient path) when there is no candidate."""
    lp = F.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    m = cand[:, 1:].to(lp.device)
    one_minus = (-torch.expm1(lp)).clamp_min(1e-5)  # 1 - p, stable near p = 1
    return -(torch.log(one_minus) * m).sum() / m.sum().clamp_min(1)


@contextlib.contextmanager
def eager_layers(tgt):
    """The target in eval mode with its regionally compiled layers (pretraining's, static shapes) bypassed: decoding
    would recompile them for every cache length. Restores both on exit."""
    was = tgt.model.training
    tgt.model.eval()
    layers = list(tgt.body.layers)
    stash = [m.__dict__.pop("_compiled_call_impl", None) for m in layers]
    try:
        yield tgt
    finally:
        for m, c in zip(layers, stash):
            if c is not None:
                m._compiled_call_impl = c
        tgt.model.train(was)


@torch.no_grad()
def greedy_pool(tgt, prompts: torch.Tensor, new: int, batch: int, eos_id: int | None) -> torch.Tensor:
    """The target's greedy continuations [N, P + new] of prompts [N, P] (equal lengths: no padding), decoded with
    HF's KV cache, `batch` rows at a time, bf16 autocast on CUDA. A row that emits end-of-text keeps emitting it
    (its tail then holds no new n-gram but the repeated eos, which `repeat_candidates` must not punish: the caller
    masks eos out)."""
    out = []
    with eager_layers(tgt):
        for i in range(0, len(prompts), batch):
            x = prompts[i: i + batch].to(tgt.device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
                y = tgt.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                       min_new_tokens=new, do_sample=False, pad_token_id=eos_id, eos_token_id=None)
            out.append(y.cpu())
    return torch.cat(out)


@torch.no_grad()
def loop_check(tgt, rows: list[dict], new: int, eos_id: int, tok=None) -> dict:
    """AR at T = 0 on prompt rows (id + prompt_ids), natural mode with HumanEval's stops, `new` tokens, on the HF
    engine with the weights as they are (fp32 during the target stage; the evaluation decodes the saved checkpoint in
    its own dtype, so its outputs may differ at near-ties): {loop_frac, repeat_rate, ended, n}."""
    from dmtp.config import EngineConfig
    from dmtp.engine.methods import AR
    from dmtp.engine.runner import run_generate
    from dmtp.engine.stops import HUMANEVAL_STOPS

    with eager_layers(tgt):
        recs = run_generate(tgt, AR(), rows, 0.0, new, [eos_id], len(rows), tok=tok, mode="natural",
                            stop_strings=HUMANEVAL_STOPS, engine=EngineConfig(engine="hf"), desc="loop check")
    ls = loop_summary(recs)
    return {"loop_frac": ls["loop_frac"], "repeat_rate": ls["repeat_rate"],
            "ended": sum(r["stop_reason"] != "length" for r in recs), "n": len(recs), "new_tokens": new}


def unloop(tgt, mtp, train_tokens: np.ndarray, cfg, eos_id: int | None = None, log=print) -> list[dict]:
    """`_unloop` inside the kernel choices `cfg.kernels` asks for (`common.kernel_choices`)."""
    with kernel_choices(cfg.kernels, next(tgt.parameters()).device):
        return _unloop(tgt, mtp, train_tokens, cfg, eos_id, log)


def _unloop(tgt, mtp, train_tokens: np.ndarray, cfg, eos_id: int | None = None, log=print) -> list[dict]:
    """Fine-tune target + MTP for `cfg.unloop_steps` steps (`cfg`: the `PretrainConfig`): each step the pretraining
    loss of a corpus batch (its shape, the late MTP weight; lr `unloop_lr`, default the pretraining schedule's last,
    constant after a warm-up of a tenth of the steps) plus `unloop_alpha` x the unlikelihood loss of `unloop_batch`
    continuations from the current pool. One process (under torchrun: rank 0 alone). Returns the history (loss, ul,
    the candidates' share of the pool's continuation tokens: the repetition of the model's greedy decoding)."""
    from dmtp.training.pretrain import NO_MASK, joint_terms, window_batches

    dev = tgt.device
    params = list({id(p): p for p in list(tgt.model.parameters()) + list(mtp.parameters())}.values())
    for p in params:
        p.requires_grad_(True)
    steps = cfg.unloop_steps
    lr = cfg.unloop_lr or 0.1 * cfg.lr
    warm = max(1, steps // 10)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0, fused=dev.type == "cuda")
    rng = np.random.default_rng(cfg.seed + 1)  # not the pretraining windows' stream
    P, G = cfg.unloop_prompt_len, cfg.unloop_new
    if len(train_tokens) < max(P, cfg.seq_len) + 2:
        raise ValueError(f"unloop: {len(train_tokens)} training tokens, fewer than a prompt of "
                         f"pretrain.unloop_prompt_len={P} or a sequence of seq_len={cfg.seq_len} needs")
    windows = window_batches(train_tokens, cfg.seq_len, cfg.batch_size, rng)  # the corpus batches, from the same stream
    hist, pool, cand = [], None, None
    fused = compiled(cfg.fused_ce, dev)  # the fused loss where pretraining uses it
    t0 = time.time()
    bad = None  # a non-finite loss since the last log step (a device-side flag)
    tgt.model.train()
    mtp.train()
    for step in range(steps):
        if step % cfg.unloop_every == 0:  # a fresh pool, decoded by the weights of this step
            starts = rng.integers(0, len(train_tokens) - P - 1, size=cfg.unloop_prompts)
            prompts = torch.from_numpy(np.stack([train_tokens[s: s + P] for s in starts]).astype(np.int64))
            pool = greedy_pool(tgt, prompts, G, cfg.unloop_prompts, eos_id)
            cand = negatives(pool, P, cfg.unloop_negatives, cfg.unloop_ngram)
            if eos_id is not None:
                cand &= pool != eos_id
            share = float(cand[:, P:].float().mean())
            looped = pool_loop_frac(pool[:, P:])
        for gp in opt.param_groups:
            gp["lr"] = lr * min(1.0, (step + 1) / warm)
        x = to_device(next(windows), dev)
        rows = torch.from_numpy(rng.integers(0, len(pool), size=cfg.unloop_batch))
        u, c = pool[rows].to(dev), cand[rows]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.bf16 and x.is_cuda):
            ce, ce_m, acc, acc_m = joint_terms(tgt, mtp, x, cfg.ce_chunk if fused else None)
            h = tgt.body(input_ids=u, attention_mask=NO_MASK if tgt.mask_free else None, use_cache=False)
            logits = tgt.model.lm_head(h.last_hidden_state)
            ul = unlikelihood(logits, u, c)
            loss = ce + cfg.mtp_lambda_late * ce_m + cfg.unloop_alpha * ul
        opt.zero_grad(set_to_none=True)
        backward(loss)
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        bad = watch_finite(bad, ce, ce_m, ul)  # read back with the next log step's values
        if step % cfg.log_every == 0 or step == steps - 1:
            rec = {"step": step, "loss": float(ce.detach()), "mtp_loss": float(ce_m.detach()), "ul": float(ul.detach()),
                   "acc": float(acc), "pool_repeat_share": share, "pool_loop_frac": looped, "elapsed_s": time.time() - t0}
            check_finite_loss("unlikelihood fine-tuning of the target", step + 1, float(bad), rec,
                              opt.param_groups[0]["lr"], tgt)
            bad = None
            hist.append(rec)
            log(f"[unloop] step {step}: loss {rec['loss']:.3f} ul {rec['ul']:.3f} pool repeats {share:.3f} "
                f"loop_frac {looped:.3f}")
    tgt.model.eval().requires_grad_(False)
    mtp.eval().requires_grad_(False)
    return hist
