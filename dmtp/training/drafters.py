"""Drafter training (docs/METHOD.md, "Training"): frozen target + MTP features, anchor blocks per variant,
position-decayed CE.

Several variants train side by side on the SAME batches, anchors and seed (one target/MTP pass per step feeds all of
them), which is what "identical data, hyper-parameters and budget" means for the ablation.

Two paths, one loss (`TrainConfig.compile`): eager (batches padded to their longest sequence, the dense block mask of
`attention.dense_mask`, per drafter its loss, AdamW and clip: the reference) and compiled (batches padded to `max_len`,
so every step has the same shapes; the block attention as a flex-attention block mask). The compiled step is ONE
torch.compile'd region for all drafters at that step (`drafters_loss`: block inputs, context, layers, LM head and loss
of every drafter, summed), one backward, per-drafter clipping on the device and one AdamW step with a param group per
drafter (`TrainConfig.one_region`; off: one compiled `block_loss` region, AdamW and clip per drafter). Neither reads a
value back to the host between log steps: the loss is masked, not indexed, and normalised by the weight mass of the
global batch computed on the host. Under torchrun (`TrainConfig.fsdp`) each drafter is sharded with FSDP2 and the
drafters step one after another (`_Sharded`; compiled: each decoder layer's forward); the paths above are the
single-process step, unchanged. Gradient accumulation (`TrainConfig.micro_batch`): a rank's rows of the global batch
in micro-batches, the target's features made per micro-batch, every drafter's forward and backward on it, the
gradients summed; the loss normaliser stays the global batch's weight mass, so the summed gradients are the whole
batch's and one optimizer step follows (under FSDP2 one reduce-scatter after the last micro-batch, or one per
micro-batch: `TrainConfig.grad_sync`).

    dmtp train --target runs/tiny/target --data runs/tiny/data/train.jsonl --variants dflash,zero_init_residual \
        --out runs/tiny/drafters --steps 200          # tiny CPU run: a few minutes
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import time
import types
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from dmtp.compiling import announce
from dmtp.config import TrainConfig
from dmtp.data.tokens import TokenSequences, as_sequences, is_store, open_store, sequence_ids
from dmtp.dist import (all_sum, barrier, clip_sharded_, full_optimizer_state, full_state, group_of_one, is_sharded,
                       main_says, precision, rank_world, shard, shard_optimizer_state, use_fsdp)
from dmtp.io import (atomic_dir, atomic_path, check_decoded, iter_jsonl, load_state, read_json, save_state,
                     write_json, write_text)
from dmtp.memory import DrafterSpec, drafter_ce_chunk
from dmtp.models.attention import layer_masks
from dmtp.models.dflash2 import selector_loss
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.models.variants.base import given_counts
from dmtp.training.common import (backward, check_finite_loss, checkpoint_layers, compile_forwards, compiled,
                                  kernel_choices, to_device, watch_finite)
from dmtp.training.losses import linear_cross_entropy


def run_key(folder: Path) -> str | None:
    """A digest of the configuration recorded in `folder`/fingerprint.json (None without one): saved in each
    trainer_state.pt, so a state copied from a training of other settings is refused on resume, not continued."""
    rec = folder / "fingerprint.json"
    if not rec.exists():
        return None
    fp = read_json(rec).get("fingerprint")
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


# --- data -------------------------------------------------------------------------------------------------------
def load_sequences(path: str | Path, max_len: int, vocab_size: int | None = None):
    """Training sequences of at least 4 tokens, each cut to max_len. A token store (`dmtp.data.tokens`: a folder,
    memory-mapped, each batch's ids read when asked) or a JSONL, one object per line with `prompt_ids` + `output_ids`
    (the `dmtp generate` schema) or `ids`, read whole into lists. A line without them, or with ids outside
    [0, vocab_size), is an error naming the file and line. A decode's output is read only once its stage finished:
    refused when its meta says `finished: false`, or when its records (they hold `accepted`) have no meta beside them
    to say so."""
    path = Path(path)
    if is_store(path):
        seqs = TokenSequences(open_store(path, vocab_size), max_len)
        if not len(seqs):
            name = seqs.store.meta["source"].get("name", "?")
            raise ValueError(f"token store {path} (from {name}) holds no sequence of at least 4 tokens")
        return seqs
    if not path.exists():
        raise FileNotFoundError(f"training token file {path} does not exist")
    check_decoded(path)
    seqs = []
    for i, r in iter_jsonl(path):
        ids = sequence_ids(path, i, r, vocab_size)
        if len(ids) >= 4:
            seqs.append(ids[:max_len])
    if not seqs:
        raise ValueError(f"{path} holds no sequence of at least 4 tokens")
    return seqs


def _row(s) -> torch.Tensor:
    return torch.tensor(s) if isinstance(s, list) else torch.from_numpy(np.asarray(s, dtype=np.int64))


def batches(seqs, batch_size, seed, rank: int = 0, world: int = 1, skip: int = 0):
    """Endless shuffled epochs of padded batches (pad 0): (ids [B / world, T] of this rank's rows rank::world,
    lengths [B] of the whole global batch), T the global batch's longest sequence. The first `skip` batches come as
    (None, lengths) (a resumed run replays the stream without reading their ids). seqs: token lists, or
    `load_sequences`' view of a token store (its ids read from the map for this rank's rows only)."""
    seqs = as_sequences(seqs)
    every = seqs.lengths()
    rng = random.Random(seed)
    order = list(range(len(seqs)))
    n = 0
    while True:
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1 if len(order) >= batch_size else 1, batch_size):
            chunk = order[i: i + batch_size]
            lengths = torch.from_numpy(every[chunk].astype(np.int64))
            n += 1
            if n <= skip:
                yield None, lengths
                continue
            ids = torch.zeros(len(chunk[rank::world]), int(lengths.max()), dtype=torch.long)
            for b, s in enumerate(seqs.rows(chunk[rank::world])):
                ids[b, : len(s)] = _row(s)
            yield ids, lengths


def sample_anchors(lengths: torch.Tensor, n_max: int, gen: torch.Generator):
    """Anchor positions a, uniform without replacement over 1 <= a <= len-3 (A and T1 known, >= 1 label);
    returns anchors [B, N] and valid [B, N] (rows with fewer positions are padded with invalid anchors)."""
    B = lengths.shape[0]
    out = torch.ones(B, n_max, dtype=torch.long)
    valid = torch.zeros(B, n_max, dtype=torch.bool)
    for b, L in enumerate(lengths.tolist()):
        cand = torch.arange(1, max(L - 2, 1))
        if len(cand) == 0:
            continue
        pick = cand[torch.randperm(len(cand), generator=gen)[:n_max]].sort().values
        out[b, : len(pick)] = pick
        valid[b, : len(pick)] = True
    return out, valid


@dataclass
class Features:
    ids: torch.Tensor  # [B, T]
    lengths: torch.Tensor  # [B]
    taps: torch.Tensor  # [B, T, K*H]
    g: torch.Tensor | None  # [B, T, H]: g_i = MTP hidden at i (predicts x_{i+2}); zero at T-1
    hidden: torch.Tensor | None = None  # [B, T, H]: h^L, kept for a drafter that trains its own MTP head


@torch.no_grad()
def extract(target, mtp, ids, lengths, taps, need_g: bool, keep_hidden: bool = False) -> Features:
    out = target.features(ids, taps, logits=False)
    g = None
    if need_g:
        g = mtp.teacher_forced(ids, out.hidden)
        g = torch.cat([g, torch.zeros_like(g[:, :1])], 1)
    return Features(ids, lengths, out.taps, g, out.hidden if keep_hidden else None)


def drafter_features(feats: Features, taps: list[int], drafter: Drafter) -> Features:
    """The features of one drafter: its own target layers out of `feats.taps`, which holds the layers `taps`."""
    H = feats.taps.shape[-1] // len(taps)
    cols = [feats.taps[..., i * H:(i + 1) * H] for i in map(taps.index, drafter.config.target_layer_ids)]
    return Features(feats.ids, feats.lengths, torch.cat(cols, -1), feats.g, feats.hidden)


def attach_head(drafter: Drafter, mtp) -> Drafter:
    """A trainable fp32 copy of the frozen MTP head `mtp` on a drafter whose variant trains one
    (`Variant.trains_mtp`), as `drafter.mtp_head` (its parameters train and save with the drafter's); others as
    they are."""
    if not drafter.injection.trains_mtp or drafter.mtp_head is not None:
        return drafter
    if mtp is None:
        raise ValueError(f"variant {drafter.config.variant!r} trains a copy of the target's MTP head: the target has "
                         "none")
    head = type(mtp)(mtp.target)
    head.load_state_dict(mtp.state_dict())
    drafter.mtp_head = head.float().requires_grad_(True).train()
    return drafter


def head_loss(drafter: Drafter, target, feats: Features, norm=None):
    """A trained MTP head's own next-token loss on the batch, CE(LMHead(g_i), x_{i+2}) summed over every position
    inside its sequence / norm (default: their count; under data parallelism the global batch's count / world, as
    `drafter_loss`'s norm), and the features with g from that head, stop-gradiented (what the drafter reads)."""
    ids = feats.ids.to(feats.hidden.device)
    g = drafter.mtp_head.teacher_forced(ids, feats.hidden.to(drafter.mtp_head.fc.weight.dtype))  # [B, T-1, H]
    T = ids.shape[1]
    ok = (torch.arange(2, T, device=ids.device)[None] < feats.lengths.to(ids.device)[:, None]).flatten()
    logits = target.lm_head(g[:, :-1].to(target.dtype)).float().flatten(0, 1)  # g_i predicts x_{i+2}
    ce = F.cross_entropy(logits, ids[:, 2:].flatten(), reduction="none") * ok
    loss = ce.sum() / (ok.sum().clamp(min=1) if norm is None else norm)
    g = torch.cat([g.detach(), torch.zeros_like(g[:, :1])], 1)
    return replace(feats, g=g), loss


def head_norm(lengths: torch.Tensor, world: int) -> torch.Tensor:
    """The head loss's normaliser of a global batch (`head_loss`): its positions with a label, / world."""
    return (lengths - 2).clamp(min=0).sum().clamp(min=1) / world


_CONST: dict = {}
HEAD_NORM = "mtp_head"  # the step's `norms` entry of the trained MTP heads' loss normaliser (`head_norm`)


def _const(key, make):
    """Small per-layout constants, built once per device (a host->device copy every step would synchronise); inside a
    compiled region built in the graph (Inductor inlines them: no copy at run time, no guard on this cache)."""
    if torch.compiler.is_compiling():
        return make()
    if key not in _CONST:
        _CONST[key] = make()
    return _CONST[key]


def loss_weights(layout, anchors, valid, lengths, gamma: float):
    """Per block slot [B, N, S]: absolute position a + offset, and the loss weight exp(-(k-1)/gamma) of a predicting
    slot (candidate T_k at offset k) of a valid anchor whose label lies inside its sequence, 0 elsewhere; a layout
    with given slots ("G"): predicting only past the block's given count (`given_counts` of its anchor)."""
    dev = anchors.device
    offs = _const(("offs", layout, dev), lambda: torch.tensor(layout.offsets, device=dev))
    decay = _const(("decay", layout, gamma, dev), lambda: torch.tensor(
        [math.exp(-(k - 1) / gamma) if i in layout.predict else 0.0 for i, k in enumerate(layout.offsets)],
        device=dev))
    pos = anchors[..., None] + offs  # [B, N, S]
    ok = valid[..., None] & (pos < lengths.to(dev)[:, None, None])
    if layout.given:  # the slots after the given tokens (offsets past g)
        ok = ok & (offs > given_counts(anchors, layout.given)[..., None])
    return pos, decay * ok


def block_inputs(drafter: Drafter, target, feats: Features, anchors, valid, gamma: float):
    """Build every anchor's block. Returns block embeddings [B, N*S, H], positions [B, N*S], labels [B, N*S]
    (-100 where no loss) and loss weights [B, N*S]. T1 = data token x_{a+1}; h_MTP = g_{a-1} (predicts x_{a+1})."""
    c, var = drafter.config, drafter.injection
    lay = var.layout(c.num_candidates)
    B, N = anchors.shape
    S = lay.slots
    ids, dev = feats.ids.to(anchors.device), anchors.device
    T = ids.shape[1]
    take = lambda t, idx: torch.gather(t, 1, idx.clamp(0, T - 1))  # noqa: E731
    e = lambda t: target.embed(t)  # noqa: E731
    A = take(ids, anchors)
    T1 = take(ids, anchors + 1)
    h, given = None, None
    if var.t1:
        h = torch.gather(feats.g, 1, (anchors - 1)[..., None].expand(B, N, feats.g.shape[-1]))
    if lay.given:  # the chain's tokens teacher-forced, x_{a+1..a+G}, and each block's count g of them
        G = lay.given
        T1 = take(ids, (anchors[..., None] + 1 + torch.arange(G, device=dev)).reshape(B, N * G)).reshape(B, N, G)
        given = given_counts(anchors, G)
    mask_id = _const(("mask", c.mask_token_id, dev), lambda: torch.tensor([c.mask_token_id], device=dev))
    e_mask = target.embed(mask_id)[0]
    block = drafter.block(e(A), e(T1) if var.t1 else None, h, e_mask, given)  # [B, N, S, H]
    pos, w = loss_weights(lay, anchors, valid, feats.lengths, gamma)
    labels = take(ids, pos.reshape(B, -1)).reshape(B, N, S)
    labels = torch.where(w > 0, labels, torch.full_like(labels, -100))
    return block.reshape(B, N * S, -1), pos.reshape(B, N * S), labels.reshape(B, N * S), w.reshape(B, N * S)


def fused_ce_applies(drafter: Drafter) -> bool:
    """Whether `block_loss` can take the fused chunked LM-head loss for this drafter: its logits feed nothing but the
    CE, its accuracy and DFlash2's selector (which reads each row's top-k logits, made chunk by chunk in the fused
    loss); a soft cap bends them: that keeps the plain path."""
    return not drafter.config.final_logit_softcapping


def block_loss(drafter: Drafter, target, block, pos, f, ends, labels, w, norm, prev=None, mask=None, ce_chunk=0):
    """The part of a drafter step every variant of a backbone shares (compiled on its own once per backbone and block
    size where each drafter has its region, `compiled_block_loss`; else traced inside `drafters_loss`):
    context K/V of f [B, T, H], the drafter's layers over the blocks, the target's LM head, and the position-decayed
    CE  sum_slots w * CE / norm  over all N*S slots (labels -100 and w = 0 where there is no loss: masked, not
    indexed, so no shape depends on the data). DFlash2 adds its selector's top-k CE over the same normaliser (prev:
    each slot's previous data token; `dflash2.selector_loss`), so the whole loss adds over micro-batches and ranks.
    ce_chunk > 0 (and `fused_ce_applies`): the LM head and CE through `losses.linear_cross_entropy`, ce_chunk rows
    at a time, the [B*Q, V] logits never held whole (the same loss, accuracy and gradients; the output multiplier
    scales the hidden states instead of the logits). Returns (loss, statistics as 0-d device tensors, each adding
    over micro-batches and ranks: "loss" and "sel_loss" this part's share, "hits" and "labelled" the top-1 correct
    and labelled slots, DFlash2's counts; `rates` makes the logged ratios of their sums)."""
    B, T = f.shape[:2]
    ctx_kv = drafter.context_kv(f, torch.arange(T, device=f.device)[None].expand(B, T))
    hid = drafter(block, pos, ctx_kv, ends, mask)
    labels, w = labels.flatten(), w.flatten()
    if ce_chunk and fused_ce_applies(drafter):
        h = hid.flatten(0, 1)
        if drafter.config.output_multiplier != 1.0:
            h = h * drafter.config.output_multiplier
        head = target.model.lm_head.weight  # as `target.lm_head`: the hidden states in the target's dtype
        sel = drafter.selector
        k = min(sel.k, head.shape[0]) if sel is not None else 0
        wce, acc, *top = linear_cross_entropy(h.to(head.dtype), head, labels, ce_chunk, row_weight=w, topk=k)
        n = (labels >= 0).sum().float()
        loss, stats = wce / norm, {"hits": (acc * n.clamp(min=1)).round(), "labelled": n}  # acc: hits / max(n, 1)
        if sel is not None:  # DFlash2: the selector rescores the top-k logits the chunks kept (as the plain path's)
            sl, st = selector_loss(sel, None, hid.flatten(0, 1), prev.flatten(), labels, w, norm, topk=top)
            loss = loss + drafter.config.selector_loss_weight * sl
            stats.update(st)
        stats["loss"] = loss.detach()
        return loss, stats
    logits = drafter.logits(target.lm_head(hid)).flatten(0, 1)  # [B*Q, V] fp32
    ce = F.cross_entropy(logits, labels, reduction="none")  # 0 at label -100
    loss = (ce * w).sum() / norm
    stats = {"hits": (logits.argmax(-1) == labels).sum().float(), "labelled": (labels >= 0).sum().float()}
    if drafter.selector is not None:  # DFlash2: + CE over the top-k set, teacher-forced previous token
        sl, st = selector_loss(drafter.selector, logits, hid.flatten(0, 1), prev.flatten(), labels, w, norm)
        loss = loss + drafter.config.selector_loss_weight * sl
        stats.update(st)
    stats["loss"] = loss.detach()
    return loss, stats


def drafter_loss(drafter: Drafter, target, feats: Features, anchors, valid, gamma: float, norm=None, mask=None,
                 core=block_loss, ce_chunk=0, head_norm=None):
    """Position-decayed CE of one drafter on a batch; returns (loss, statistics as 0-d tensors).

    norm: the loss normaliser. Default: this batch's weight mass. Under data parallelism the training loop passes
    the weight mass of the GLOBAL batch divided by the number of ranks (computed on the host from the global anchors,
    which every rank holds), so FSDP2's mean over ranks of sum_rank(w * CE) / norm is exactly the 1-rank loss of the
    same global batch, and so is its gradient. mask: the block mask(s) (`attention.layer_masks`) or None (dense,
    built by the drafter); core: `block_loss` or its compiled version; ce_chunk: `block_loss`'s (0: the plain
    LM-head loss). With gradient accumulation each micro-batch takes the same norm (the global batch's), so the
    summed micro-batch gradients are the whole batch's (DFlash2's selector term too: it takes the same norm). A drafter training its own MTP head
    (`attach_head`) adds `mtp_weight` x that head's loss (`head_loss`, normalised by `head_norm`) and reads its g."""
    extra = None
    if drafter.mtp_head is not None:
        feats, extra = head_loss(drafter, target, feats, head_norm)
    block, pos, labels, w = block_inputs(drafter, target, feats, anchors, valid, gamma)
    if core is not block_loss and not block.requires_grad:  # compiled: one graph whether the block is trained or not
        block = block.detach().requires_grad_()
    f = drafter.context(feats.taps, feats.g)
    if norm is None:
        norm = w.sum().clamp(min=1e-6)
    prev = None
    if drafter.selector is not None:
        ids = feats.ids.to(pos.device)
        prev = torch.gather(ids, 1, (pos - 1).clamp(0, ids.shape[1] - 1))
    loss, stats = core(drafter, target, block, pos, f, anchors, labels, w, norm, prev, mask, ce_chunk)
    if extra is not None:
        loss = loss + drafter.injection.config.mtp_weight * extra
        stats = dict(stats, loss=loss.detach(), mtp_loss=extra.detach())
    return loss, stats


_COMPILED: list = []


def compiled_block_loss():
    """`block_loss` through torch.compile, one per process (the compiled path with a region per drafter): its graphs
    (one per backbone and block size; every variant's drafter is an input, not a constant) serve every later call."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(block_loss, dynamic=False))
    return _COMPILED[0]


class DrafterLoss(nn.Module):
    """One drafter's training loss as a module: under FSDP2 the root of the drafter's sharding (its forward gathers
    the weights outside the decoder layers: context fc and norms, injection, selector). The frozen target is held
    outside the module, so it is not part of the drafter's shards."""

    def __init__(self, drafter: Drafter, target, core=block_loss):
        super().__init__()
        self.drafter = drafter
        self._target = [target]
        self.core = core

    def forward(self, feats, anchors, valid, gamma, norm, mask=None, ce_chunk=0, head_norm=None):
        return drafter_loss(self.drafter, self._target[0], feats, anchors, valid, gamma, norm, mask, self.core,
                            ce_chunk, head_norm)


def drafters_loss(drafters: nn.ModuleDict, target, feats: Features, taps: list[int], anchors, valid, gamma: float,
                  norms: tuple, masks: tuple, ce_chunk: int = 0, head_norm=None):
    """The compiled path's step for every drafter at once: sum_i L_i over the drafters i on this batch, and each one's
    statistics ({name: {stat: 0-d tensor}}). norms[i], masks[i]: drafter i's loss normaliser (`drafter_loss`) and block
    mask (None: dense, built in the graph). The drafters share no trainable weight (the target and its features are
    frozen), so d(sum_j L_j)/d theta_i = dL_i/d theta_i: one backward of the sum gives every drafter exactly the
    gradient of its own loss."""
    total, stats = 0, {}
    for (name, d), norm, mask in zip(drafters.items(), norms, masks):
        loss, stats[name] = drafter_loss(d, target, drafter_features(feats, taps, d), anchors, valid, gamma, norm, mask,
                                         ce_chunk=ce_chunk, head_norm=head_norm)
        total = total + loss
    return total, stats


def _own_copy(fn, name: str):
    """`fn` as a function with a code object of its own (the same body, another name)."""
    return types.FunctionType(fn.__code__.replace(co_name=name), fn.__globals__, name, fn.__defaults__, fn.__closure__)


# `drafters_loss` for the fused LM-head loss. The fused loss is a graph break inside the loop over drafters, where
# torch.compile cannot resume, so it marks the looping frame's code object to run eagerly (each drafter's step compiled
# as its own frames). Every torch.compile of a function shares that mark: had the fused path compiled `drafters_loss`
# itself, a later plain one-region step in the same process would run in pieces, silently, even under fullgraph=True.
drafters_loss_fused = _own_copy(drafters_loss, "drafters_loss_fused")


_JOINT: list = []
_JOINT_FUSED: list = []
RECOMPILE_LIMIT = 64  # graphs of `drafters_loss` a process may hold: one per set of drafters trained together


def compiled_drafters_loss(fused: bool = False):
    """`drafters_loss` through torch.compile (one region, static shapes), one per process: one graph per set of
    drafters at a step (their variants, backbones and shapes; the drafters are inputs, not constants). fused: the
    version for the fused LM-head loss, which runs eagerly (`losses.linear_cross_entropy` is a graph break), so the
    region is compiled in pieces around it rather than as one full graph (`drafters_loss_fused`)."""
    cache = _JOINT_FUSED if fused else _JOINT
    if not cache:
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        fn = drafters_loss_fused if fused else drafters_loss
        cache.append(torch.compile(fn, dynamic=False, fullgraph=not fused))
    return cache[0]


class DraftersLoss(nn.Module):
    """The drafters of one step as one module, the compiled one-region step's: one backward of the summed loss. The
    target is held outside."""

    def __init__(self, drafters: dict[str, Drafter], target):
        super().__init__()
        self.drafters = nn.ModuleDict(drafters)
        self._target = [target]

    def forward(self, feats, taps, anchors, valid, gamma, norms, masks, ce_chunk=0, head_norm=None):
        return compiled_drafters_loss(bool(ce_chunk))(self.drafters, self._target[0], feats, taps, anchors, valid,
                                                      gamma, norms, masks, ce_chunk, head_norm)


def clip_grad_norms_(groups: list[list[torch.Tensor]], max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_(group, max_norm)` for every group of parameters at once, on the device (no host sync): each
    group's gradients times min(1, max_norm / (||g|| + 1e-6)), ||g|| the 2-norm over the whole group. Returns the
    norms [G]. ||g|| = ||(||g_1||, ..., ||g_k||)||: the norm of the group's per-tensor norms, as clip_grad_norm_."""
    grads = [[p.grad for p in ps if p.grad is not None] for ps in groups]
    per_tensor = torch.stack(torch._foreach_norm([g for gs in grads for g in gs]))
    norms = torch.stack(torch._foreach_norm(list(per_tensor.split([len(gs) for gs in grads]))))
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for gs, c in zip(grads, coef.unbind()):
        torch._foreach_mul_(gs, c)
    return norms


def group_state(opt: torch.optim.Optimizer, g: int) -> dict:
    """Param group g of `opt` as the state dict of an optimizer holding that group alone (what a drafter's own AdamW
    saves: its checkpoint does not depend on the drafters it trained beside)."""
    sd = opt.state_dict()
    group = sd["param_groups"][g]
    ids = group["params"]
    return {"state": {j: sd["state"][i] for j, i in enumerate(ids) if i in sd["state"]},
            "param_groups": [{**group, "params": list(range(len(ids)))}]}


def load_group_states(opt: torch.optim.Optimizer, states: dict[int, dict]) -> None:
    """The inverse of `group_state`: states[g], the state dict of a one-group optimizer, into param group g."""
    if not states:
        return
    sd = opt.state_dict()
    for g, one in states.items():
        ids, (saved,) = sd["param_groups"][g]["params"], one["param_groups"]
        if len(saved["params"]) != len(ids):
            raise ValueError(f"optimizer state of {len(saved['params'])} parameters for a group of {len(ids)}")
        sd["param_groups"][g] = {**saved, "params": ids}
        sd["state"].update({ids[j]: v for j, v in one["state"].items()})
    opt.load_state_dict(sd)


class _PerDrafter:
    """Per drafter a loss module, an AdamW and a clip_grad_norm_, on one process: the eager path (the reference) and
    the compiled path with one region per drafter (`TrainConfig.one_region = False`)."""
    ce_chunk = 0  # rows per chunk of the fused LM-head loss (0: the plain loss); train_drafters sets it

    def __init__(self, drafters, target, params, adamw, states, core):
        self.drafters, self.params = drafters, params
        self.nets = {n: DrafterLoss(d, target, core) for n, d in drafters.items()}
        self.opts = {n: torch.optim.AdamW(ps, **adamw) for n, ps in params.items()}
        for n, sd in states.items():
            self.opts[n].load_state_dict(sd)

    def step(self, names, lr, cfg, amp, parts, n_parts, taps, norms):
        """One optimizer step of the drafters `names` over the step's micro-batches (`parts`: `Micro`s, made one at
        a time): per micro-batch the target's features once, then every drafter's forward and backward (gradients
        summed over the micro-batches); then per drafter its clip and AdamW step."""
        for name in names:
            for gp in self.opts[name].param_groups:
                gp["lr"] = lr
            self.opts[name].zero_grad(set_to_none=True)
        got = {n: [] for n in names}
        for j, mb in enumerate(parts):
            for name in names:
                d = self.drafters[name]
                self.sync(name, j == n_parts - 1)
                with torch.autocast(**amp):
                    loss, stats = self.nets[name](drafter_features(mb.feats, taps, d), mb.anchors, mb.valid,
                                                  cfg.gamma, norms[d.layout], mb.masks.get(d.layout), self.ce_chunk,
                                                  norms.get(HEAD_NORM))
                backward(loss)
                got[name].append(stats)
                del loss
            del mb
        out = {}
        for name in names:
            gn = self.clip(self.params[name], cfg.clip)
            self.opts[name].step()
            out[name] = {**combine_stats(got[name]), "grad_norm": gn}
        return out

    def sync(self, name, last: bool) -> None:
        """Before drafter `name`'s backward of a micro-batch: nothing to reduce on one process."""

    @staticmethod
    def clip(params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def state(self, name):
        """(weights, AdamW state) of drafter `name`, as its checkpoint holds them."""
        return self.drafters[name].state_dict(), self.opts[name].state_dict()


class _Sharded(_PerDrafter):
    """FSDP2 (`dist.shard`): per drafter its loss module sharded over the ranks, each decoder layer on its own (its
    context K/V too), then the rest of the drafter as the root; the frozen target outside it. An AdamW over the
    drafter's shards (fp32 master weights and state), a clip at the norm of the full gradient (`dist.clip_sharded_`).
    The drafters of a step run one after another (one drafter's activations at a time). The compiled path compiles
    each decoder layer's forward (`compile_forwards`; the gathers and reduce-scatters stay outside the graphs) and
    gives the blocks the flex block mask on CUDA: fullgraph regions over a whole drafter cannot hold FSDP2's hooks.
    Checkpoints hold the gathered, full tensors (`state`), the same as `_PerDrafter`'s."""

    def __init__(self, drafters, target, adamw, states, mp, static: bool, every: bool = False):
        self.drafters, self.params, self.opts, self.nets = drafters, {}, {}, {}
        self.every = every  # reduce-scatter the gradients after every micro-batch (`TrainConfig.grad_sync`)
        for n, d in drafters.items():
            if static:
                compile_forwards(d.layers)
            self.nets[n] = shard(DrafterLoss(d, target), d.layers, mp, methods=("context_kv",))
            self.params[n] = [p for p in d.parameters() if p.requires_grad]  # the shards, fully_shard's new params
            self.opts[n] = torch.optim.AdamW(self.params[n], **adamw)
            if n in states:
                self.opts[n].load_state_dict(shard_optimizer_state(states[n], self.opts[n]))

    def sync(self, name, last: bool) -> None:
        """Gradient accumulation under FSDP2: the reduce-scatter of drafter `name`'s gradients only after the last
        micro-batch's backward (before it, FSDP2 sums them unsharded in fp32), or after every one (`every`: they stay
        sharded, summed shard by shard)."""
        self.nets[name].set_requires_gradient_sync(last or self.every)

    @staticmethod
    def clip(params, max_norm):
        return clip_sharded_([params], max_norm)[0]

    def state(self, name):
        """Gathered by every rank (collective), tensor by tensor, onto rank 0's host (None on the others)."""
        return full_state(self.drafters[name]), full_optimizer_state(self.opts[name])


class _OneRegion:
    """The compiled path's step on one process: every drafter at the step in one compiled region (`drafters_loss`),
    one backward of the summed loss, per-drafter clipping on the device and one AdamW step over a param group per
    drafter (its own lr entry and state; fused on CUDA). Drafters at other steps (resumed apart) take no part: their
    parameters get no gradient, which AdamW skips."""
    ce_chunk = 0  # rows per chunk of the fused LM-head loss (0: the plain loss); train_drafters sets it

    def __init__(self, drafters, target, params, adamw, states):
        self.drafters, self.target, self.params = drafters, target, params
        self.names = list(drafters)
        self.key = self.net = None  # the drafters at the step and their module (the set only grows: resumed drafters
        # join at their step)
        self.opt = torch.optim.AdamW([{"params": ps} for ps in params.values()], **adamw,
                                     foreach=not adamw["fused"])
        load_group_states(self.opt, {self.names.index(n): sd for n, sd in states.items()})

    def step(self, names, lr, cfg, amp, parts, n_parts, taps, norms):
        if tuple(names) != self.key:
            self.key, self.net = tuple(names), DraftersLoss({n: self.drafters[n] for n in names}, self.target)
        for n in names:
            self.opt.param_groups[self.names.index(n)]["lr"] = lr
        lays = [self.drafters[n].layout for n in names]
        self.opt.zero_grad(set_to_none=True)
        got = {n: [] for n in names}
        for mb in parts:  # gradient accumulation: one region call and one backward per micro-batch
            with torch.autocast(**amp):
                loss, stats = self.net(mb.feats, taps, mb.anchors, mb.valid, cfg.gamma,
                                       tuple(norms[lay] for lay in lays), tuple(mb.masks.get(lay) for lay in lays),
                                       self.ce_chunk, norms.get(HEAD_NORM))
            backward(loss)  # each drafter's own gradient (see drafters_loss)
            for n in names:
                got[n].append(stats[n])
            del loss, mb
        gn = clip_grad_norms_([self.params[n] for n in names], cfg.clip)
        self.opt.step()
        return {n: {**combine_stats(got[n]), "grad_norm": g} for n, g in zip(names, gn.unbind())}

    def state(self, name):
        """(weights, AdamW state) of drafter `name`: its param group as a one-group optimizer's state."""
        return self.drafters[name].state_dict(), group_state(self.opt, self.names.index(name))


@dataclass
class Micro:
    """One micro-batch of a step on this rank: its rows' features, anchors [b, N] and valid [b, N] on the device, and
    the block masks per layout (compiled path on CUDA; else empty)."""
    feats: Features
    anchors: torch.Tensor
    valid: torch.Tensor
    masks: dict


def combine_stats(parts: list[dict]) -> dict:
    """A step's statistics from its micro-batches': each adds (`block_loss`: loss shares of the global batch, counts),
    so summed. One micro-batch: its own, untouched."""
    if len(parts) == 1:
        return parts[0]
    return {k: sum(s[k] for s in parts) for k in parts[0]}


SHARES = ("loss", "sel_loss")  # statistics that are a rank's share of the global loss times the world size


def rates(rec: dict[str, float]) -> dict[str, float]:
    """A step's record from its statistics summed over micro-batches and ranks (`block_loss`'s): the counts become the
    ratios logged, acc (top-1 correct of the labelled slots) and, for DFlash2, sel_cover (labelled slots whose label
    is among the top-k) and sel_acc (of those, the selector's pick is the label)."""
    rec = dict(rec)
    n = rec.pop("labelled", 0.0)
    if "hits" in rec:
        rec["acc"] = rec.pop("hits") / max(n, 1.0)
    if "sel_covered" in rec:
        covered = rec.pop("sel_covered")
        rec["sel_cover"], rec["sel_acc"] = covered / max(n, 1.0), rec.pop("sel_hits") / max(covered, 1.0)
    return rec


def read_back(out: dict[str, dict[str, torch.Tensor]], world: int) -> dict[str, dict[str, float]]:
    """A log step's statistics as numbers of the global batch, in one all-reduce and one copy to the host for every
    drafter: each statistic but the gradient norm (the full gradient's already) summed over the ranks, the loss
    shares (`SHARES`) divided by the world size, then `rates`."""
    names = list(out)
    keys = {n: [k for k in out[n] if k != "grad_norm"] for n in names}
    summed = all_sum(torch.stack([out[n][k].float() for n in names for k in keys[n]]))
    flat = iter(torch.cat([summed, torch.stack([out[n]["grad_norm"].float() for n in names])]).tolist())
    recs = {n: {k: next(flat) / (world if k in SHARES else 1) for k in keys[n]} for n in names}
    return {n: rates({**recs[n], "grad_norm": next(flat)}) for n in names}


def micro_batches(target, mtp, ids, lengths, anchors, valid, micro: int, taps, need_g: bool, amp: dict, layouts,
                  rule, gamma: float, keep_hidden: bool = False):
    """This rank's rows of a step (ids [b, T] on the host, its lengths, anchors and valid) as micro-batches of `micro`
    rows, made one at a time (`Micro`: the target's features of those rows; `rule`: the flex block masks' attention
    rule, None for no masks). Every micro-batch keeps the global batch's padded length T (the compiled path's fixed
    shapes)."""
    dev, n, T = target.device, ids.shape[0] // micro, ids.shape[1]
    for j in range(n):
        rows = slice(j * micro, (j + 1) * micro)
        x, ln, a, v = (to_device(t[rows], dev) for t in (ids, lengths, anchors, valid))
        with torch.autocast(**amp):
            feats = extract(target, mtp, x, ln, taps, need_g, keep_hidden)
        masks = {lay: layer_masks(rule, a, lay.slots, T, "flex", lay.offsets[0]) for lay in layouts} \
            if rule is not None else {}
        yield Micro(feats, a, v, masks)
        del feats, masks  # the next micro-batch's features are made once this one's are dropped


def lr_at(step, cfg: TrainConfig):
    warm = max(1, int(cfg.warmup_frac * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    p = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def decayed(cfg: TrainConfig, start: int, end: int):
    """The learning rate of an annealed branch: the run's own (`lr_at`) at step `start`, decayed linearly to
    1 / (end - start) of it at the last step, end - 1."""
    top = lr_at(start, cfg)
    return lambda step: top * (end - step) / (end - start)


def branch_dir(out_dir: str | Path, budget: int) -> Path:
    """Where the annealed branches to `budget` are trained: out_dir/anneal<budget>/ (run <name>'s under <name>/
    there, as train_drafters lays runs out)."""
    return Path(out_dir) / f"anneal{budget}"


def train_drafters(target, mtp, drafters: dict[str, Drafter], seqs, cfg: TrainConfig, out_dir: str | Path,
                   log=print, snapshot_runs=None, branches: dict[int, int] | None = None,
                   schedule=None) -> dict[str, list[dict]]:
    """`_train_drafters` inside the kernel choices `cfg.kernels` asks for (`common.kernel_choices`)."""
    with kernel_choices(cfg.kernels, target.device):
        return _train_drafters(target, mtp, drafters, seqs, cfg, out_dir, log, snapshot_runs, branches, schedule)


def _train_drafters(target, mtp, drafters: dict[str, Drafter], seqs, cfg: TrainConfig, out_dir: str | Path,
                    log=print, snapshot_runs=None, branches: dict[int, int] | None = None,
                    schedule=None) -> dict[str, list[dict]]:
    """Train every drafter in `drafters` on the same batches; checkpoints under out_dir/<name>/ (resumable).
    `cfg.snapshots`: the weights after those steps also go to out_dir/<name>/step<k>/ (for the drafters named in
    `snapshot_runs`; None: all), with the training tokens consumed so far (snapshot.json). `branches` (budget ->
    branch step, for the same drafters): the full training state after the branch step goes to
    branch_dir(out_dir, budget)/<name>/trainer_state.pt, from which `train_branch` trains the annealed curve
    point. `schedule`: step -> learning rate (default `lr_at`).

    Under torchrun (`cfg.fsdp`, `dist.use_fsdp`) each rank takes rows rank::world of every global batch and every
    drafter is sharded with FSDP2 (`_Sharded`; with `cfg.fsdp = "on"` also on one process, in a process group of
    one that ends with the call); the loss normaliser is the global batch's weight mass (`drafter_loss`), so N ranks
    take the 1-rank step. `cfg.micro_batch` (0: a rank's whole share at once): each rank takes its rows in
    micro-batches of that many sequences and sums their gradients before the step (the same normaliser, so the same
    step; `cfg.grad_sync` under FSDP2: reduce-scatter after the last micro-batch or every one); the micro-batch is
    run control, a checkpoint resumes with any. Sharded drafters stay sharded after the call: their checkpoints hold
    the full weights.
    `cfg.shard_target = "on"` shards the frozen target's decoder layers too (under more than one rank), and they stay
    so. `cfg.activation_checkpointing`: every drafter layer recomputed in the backward pass. History records (every
    `log_every` steps, the only host syncs) carry `elapsed_s`, measured after the values were read back: differences
    between records give the steady step rate. A checkpoint holds one drafter's full weights, its own AdamW state,
    step and history, whichever path and number of ranks wrote it: any of them resumes it."""
    sharded = use_fsdp(cfg.fsdp, rank_world()[1])
    with group_of_one(target.device) if sharded else contextlib.nullcontext():
        return _train(target, mtp, drafters, seqs, cfg, Path(out_dir), log, snapshot_runs, branches, schedule,
                      sharded)


def micro_split(cfg: TrainConfig, world: int) -> tuple[int, int]:
    """(sequences per micro-batch, micro-batches per step) of each of `world` ranks: `cfg.micro_batch` (0: a rank's
    whole share of the global batch at once); one line naming the field where it does not divide the share."""
    per_rank = cfg.batch_size // world
    micro = cfg.micro_batch or per_rank
    if per_rank % micro:
        raise ValueError(f"train.micro_batch={cfg.micro_batch} does not divide the {per_rank} sequences of each of "
                         f"{world} rank(s) (train.batch_size={cfg.batch_size})")
    return micro, per_rank // micro


def _train(target, mtp, drafters, seqs, cfg, out_dir, log, snapshot_runs, branches, schedule, sharded):
    from tqdm import tqdm

    dev = target.device
    rank, world = rank_world()  # under torchrun each rank trains on rows rank::world of every global batch
    if cfg.batch_size % world:
        raise ValueError(f"global batch {cfg.batch_size} is not divisible by {world} data-parallel ranks")
    micro, n_parts = micro_split(cfg, world)  # gradient accumulation: n_parts micro-batches of `micro` rows a rank
    n_seqs = len(as_sequences(seqs))  # every step is a whole global batch of distinct sequences
    if n_seqs < cfg.batch_size:
        raise ValueError(f"the training data holds {n_seqs} sequence(s), fewer than one batch of "
                         f"train.batch_size={cfg.batch_size}: give more data or a batch size of at most {n_seqs}")
    main = rank == 0
    static = compiled(cfg.compile, dev)  # the compiled path: fixed shapes, flex block masks, compiled losses
    start, hist, states, keys = {}, {}, {}, {}
    for name, d in drafters.items():
        attach_head(d, mtp)  # a variant that trains the MTP head: its copy, before a resumed state is loaded into it
        d.train()
        for n, p in d.named_parameters():  # what the variant bypasses gets no gradient and no optimizer state
            if d.injection.bypassed and n.startswith(d.injection.bypassed):
                p.requires_grad_(False)
        state = out_dir / name / "trainer_state.pt"
        start[name], hist[name], keys[name] = 0, [], run_key(out_dir / name)
        if (out_dir / name / "DONE").exists():
            start[name] = cfg.steps
        elif state.exists():
            s = load_state(state, dev, required=("model", "opt", "step", "history"))
            if s["step"] > cfg.steps:
                raise ValueError(f"{state} is at step {s['step']}, beyond the {cfg.steps} steps requested")
            if s.get("run") and keys[name] and s["run"] != keys[name]:
                raise ValueError(f"{state}: saved by a training of another configuration (run key {s['run']}; "
                                 f"{out_dir / name / 'fingerprint.json'} gives {keys[name]}): remove it to restart "
                                 "that training from step 0")
            d.load_state_dict(s["model"])
            states[name], start[name], hist[name] = s["opt"], s["step"], s["history"]
            log(f"[train] {name}: resumed at step {s['step']}")
            if s["step"] == cfg.steps and main:  # killed between the final checkpoint and DONE: finish it now
                _finish(out_dir / name, hist[name], f"{cfg.steps} steps (marked done on a rerun)")
    todo = {n: d for n, d in drafters.items() if start[n] < cfg.steps}
    if not todo:
        return hist
    need_g = any(d.injection.needs_mtp for d in todo.values())
    joint = any(d.mtp_head is not None for d in todo.values())  # a head trains: h^L kept for it
    taps = sorted({t for d in todo.values() for t in d.config.target_layer_ids})
    params = {n: [p for p in d.parameters() if p.requires_grad] for n, d in todo.items()}
    adamw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95), fused=dev.type == "cuda")
    states = {n: sd for n, sd in states.items() if n in todo}
    if cfg.activation_checkpointing:
        for d in todo.values():
            checkpoint_layers(d.layers)
    if sharded:
        if cfg.shard_target == "on" and world > 1 and not is_sharded(target.body):  # "auto": the memory model's
            # choice, resolved before training; unresolved, replicated as "off"
            shard(target.body, target.body.layers, frozen=True)
        trainer = _Sharded(todo, target, adamw, states, precision(cfg.amp_bf16 and dev.type == "cuda"), static,
                           every=cfg.grad_sync == "every")
    elif static and cfg.one_region:
        trainer = _OneRegion(todo, target, params, adamw, states)
    else:
        trainer = _PerDrafter(todo, target, params, adamw, states, compiled_block_loss() if static else block_loss)
    # the LM-head loss fused and chunked where the plain path's fp32 logits of a step would be large (memory.py)
    rows = micro * cfg.anchors_per_seq * max(d.layout.slots for d in todo.values())
    trainer.ce_chunk = drafter_ce_chunk(cfg.fused_ce, cfg.ce_chunk, rows, target.vocab_size)
    layouts = sorted({d.layout for d in todo.values()}, key=lambda lay: lay.kinds)
    rules = {d.config.rules() for d in todo.values()}  # per layer, what a block slot sees
    if static and len(rules) > 1:
        raise ValueError(f"drafters trained side by side on the compiled path share one attention rule per layer, "
                         f"got {sorted(map(str, rules))}")
    amp = dict(device_type="cuda", dtype=torch.bfloat16, enabled=cfg.amp_bf16 and dev.type == "cuda")
    first = min(start[n] for n in todo)
    it = batches(seqs, cfg.batch_size, cfg.seed, rank, world, skip=first)  # this rank's rows of each global batch
    gen = torch.Generator().manual_seed(cfg.seed)
    seen = 0  # training tokens consumed so far (the sequences' lengths, global batch): the learning curves' x axis
    for _ in range(first):  # replay the data stream to the resume point (cheap: no model work)
        _, lengths = next(it)
        seen += int(lengths.sum())
        sample_anchors(lengths, cfg.anchors_per_seq, gen)
    t0 = time.time()
    bad: dict[str, torch.Tensor] = {}  # per drafter: a non-finite loss since the last log step (on the device)
    bar = tqdm(range(first, cfg.steps), desc=f"train {','.join(todo)}"[:60], dynamic_ncols=True, disable=not main)
    for step in bar:
        ids, lengths = next(it)
        seen += int(lengths.sum())
        anchors, valid = sample_anchors(lengths, cfg.anchors_per_seq, gen)  # of the global batch, on every rank
        if static:  # every batch [B, max_len]: one set of shapes for the compiled graphs
            if ids.shape[1] > cfg.max_len:
                raise ValueError(f"a training sequence of {ids.shape[1]} tokens exceeds max_len {cfg.max_len}")
            ids = F.pad(ids, (0, cfg.max_len - ids.shape[1]))
        # loss normaliser per block layout: the weight mass of the global batch / world (see drafter_loss), the same
        # for every micro-batch
        norms = torch.stack([loss_weights(lay, anchors, valid, lengths, cfg.gamma)[1].sum().clamp(min=1e-6) / world
                             for lay in layouts])
        norms = dict(zip(layouts, to_device(norms, dev).unbind()))
        if joint:
            norms[HEAD_NORM] = to_device(head_norm(lengths, world), dev)
        # the flex block mask on GPUs (flex attention has no backward pass on CPU: the compiled CPU path compiles
        # the dense mask into the graph instead)
        flex = static and dev.type == "cuda"
        parts = micro_batches(target, mtp, ids, *(x[rank::world] for x in (lengths, anchors, valid)), micro, taps,
                              need_g, amp, layouts, next(iter(rules)) if flex else None, cfg.gamma, joint)
        names = [n for n in todo if step >= start[n]]  # drafters resumed at a later step join there
        lr = schedule(step) if schedule else lr_at(step, cfg)
        with announce(f"the training step of {','.join(todo)} (batch {cfg.batch_size} x {cfg.max_len})",
                      active=static and main and step == first):  # the first step compiles forward and backward
            out = trainer.step(names, lr, cfg, amp, parts, n_parts, taps, norms)
        for name in names:  # a non-finite loss at any step, read back with the next log step's values
            bad[name] = watch_finite(bad.get(name), out[name]["loss"])
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:  # the only reads back to the host
            for name in names:
                out[name]["nonfinite"] = bad.pop(name)
            for name, rec in read_back(out, world).items():
                check_finite_loss(f"drafter training {out_dir / name}", step + 1, rec.pop("nonfinite"), rec, lr,
                                  target)
                hist[name].append({**rec, "step": step + 1, "lr": lr, "elapsed_s": time.time() - t0,
                                   "tokens": seen})
            bar.set_postfix({n: f"{hist[n][-1]['loss']:.3f}" for n in names})
        stop = cfg.stop_after and step + 1 == cfg.stop_after and step + 1 < cfg.steps
        # checkpoints: the state is gathered on every rank under FSDP2 (so every rank takes the same decisions: those
        # read from the file system are rank 0's), rank 0 writes it
        for name in names:
            d = todo[name]
            snap = out_dir / name / f"step{step + 1}"
            if (step + 1 in cfg.snapshots and (snapshot_runs is None or name in snapshot_runs)
                    and main_says(not (snap / "DONE").exists())):
                weights, _ = trainer.state(name)
                if main:
                    with atomic_dir(snap) as tmp:  # a learning-curve point: the weights as they are after this step
                        d.save(tmp / "drafter", weights)
                        write_json(tmp / "snapshot.json", {"step": step + 1, "train_tokens": seen})
                        (tmp / "DONE").write_text("ok\n")
            for budget, at in (branches or {}).items():  # an annealed curve point leaves the run here
                where = branch_dir(out_dir, budget) / name
                if (step + 1 == at and (snapshot_runs is None or name in snapshot_runs)
                        and main_says(not (where / "DONE").exists())):
                    weights, opt = trainer.state(name)
                    if main:
                        where.mkdir(parents=True, exist_ok=True)
                        with atomic_path(where / "trainer_state.pt") as tmp:
                            save_state({"model": weights, "opt": opt, "step": step + 1, "history": list(hist[name]),
                                        "run": keys[name]}, tmp)
            if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps or stop:
                weights, opt = trainer.state(name)
                if main:
                    d.save(out_dir / name / "drafter", weights)  # world-size free: resumes on any number of ranks
                    with atomic_path(out_dir / name / "trainer_state.pt") as tmp:
                        save_state({"model": weights, "opt": opt, "step": step + 1, "history": hist[name],
                                    "run": keys[name]}, tmp)
                    if step + 1 == cfg.steps:  # the final checkpoint, then at once DONE (a rerun completes a kill here)
                        _finish(out_dir / name, hist[name],
                                f"{cfg.steps} steps, {time.time() - t0:.1f}s, {world} rank(s)")
        if stop:
            barrier()
            log(f"[train] stopped after step {step + 1} (resumable)")
            return hist
    barrier()
    return hist


def train_branch(target, mtp, drafters: dict[str, Drafter], seqs, cfg: TrainConfig, out_dir: str | Path, budget: int,
                 at: int, log=print) -> Path:
    """The annealed learning-curve points at `budget` steps of the runs in `drafters` (fresh drafters of their
    variants: the weights come from the states the runs saved after step `at`, train_drafters' `branches`): the
    same batches on to `budget`, side by side, with the learning rate `decayed` from the runs' own at `at`. Returns
    branch_dir(out_dir, budget), holding <name>/ with drafter/, history.json and DONE per run (resumable)."""
    where = branch_dir(out_dir, budget)
    for name in drafters:
        if not (where / name / "DONE").exists() and not (where / name / "trainer_state.pt").exists():
            raise ValueError(f"{where / name}: no branch state (the run {name} saves it after step {at} while it "
                             f"trains; a run trained without this budget: retrain it with --force)")
    bcfg = replace(cfg, steps=budget, snapshots=(), stop_after=0, save_every=budget)
    train_drafters(target, mtp, drafters, seqs, bcfg, where, log=log, schedule=decayed(cfg, at, budget))
    return where


def _finish(path: Path, hist: list[dict], note: str):
    """A drafter whose final checkpoint is written: its history, then DONE (atomic), then the trainer state goes."""
    write_json(path / "history.json", hist)
    write_text(path / "DONE", note + "\n")
    (path / "trainer_state.pt").unlink(missing_ok=True)


def new_drafters(target, variants: list[str], base: dict, init_from: dict | None = None,
                 backbones: dict | None = None, variant_configs: dict | None = None) -> dict[str, Drafter]:
    """Fresh drafters (same seed for every variant) or continued from a DFlash-format checkpoint. `backbones` maps
    further names to (variant, backbone), e.g. {"dmtp_d2": ("zero_init_residual", "dflash2")}; other names use
    base["backbone"] (default: the config's). `variant_configs`: variant -> its own settings (default: its Config's
    defaults)."""
    out = {}
    for v in variants:
        name = v
        variant, backbone = (backbones or {}).get(v, (v, base.get("backbone")))
        over = dict(variant=variant, variant_config=(variant_configs or {}).get(variant, {}),
                    **({"backbone": backbone} if backbone else {}))
        src = (init_from or {}).get(v)
        if src:
            d = Drafter.load(src, device=target.device, dtype=torch.float32, **over)
        else:
            torch.manual_seed(base.get("seed", 0))
            cfg = DrafterConfig(**{k: x for k, x in base.items()
                                   if k in DrafterConfig.__dataclass_fields__ and k not in over}, **over)
            d = Drafter(cfg).to(target.device)
        out[name] = d
    return out


def spec_of(configs: list[DrafterConfig]) -> DrafterSpec:
    """The largest of these drafters as the memory model reads it (built on the meta device: exact parameter counts,
    the variant's block slots), the fused LM-head loss counted only where it applies to every one of them (the
    drafters step one after another: the peak is the largest one's)."""
    best = None
    for c in configs:
        with torch.device("meta"):
            d = Drafter(c)
        s = DrafterSpec(hidden=c.hidden_size, vocab=c.vocab_size, layers=c.num_hidden_layers,
                        heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                        intermediate=c.intermediate_size, taps=len(c.target_layer_ids), slots=d.layout.slots)
        s = replace(s, injection=sum(p.numel() for p in d.parameters()) - s.params)  # what the formula leaves out
        s = replace(s, fusable=fused_ce_applies(d))
        fusable = s.fusable if best is None else best.fusable and s.fusable
        best = s if best is None or (s.params, s.slots) > (best.params, best.slots) else best
        best = replace(best, fusable=fusable)
    return best
