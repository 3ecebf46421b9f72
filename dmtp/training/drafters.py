"""Drafter training (SPEC §5): frozen target + MTP features, anchor blocks per variant, position-decayed CE.

Several variants train side by side on the SAME batches, anchors and seed (one target/MTP pass per step feeds all of
them), which is what "identical data, hyper-parameters and budget" means for the ablation.

Two paths, one loss (`TrainConfig.compile`): eager (batches padded to their longest sequence, the dense block mask of
`attention.dense_mask`, per drafter its loss, AdamW and clip: the reference) and compiled (batches padded to `max_len`,
so every step has the same shapes; the block attention as a flex-attention block mask). The compiled step is ONE
torch.compile'd region for all drafters at that step (`drafters_loss`: block inputs, context, layers, LM head and loss
of every drafter, summed), one backward, per-drafter clipping on the device and one AdamW step with a param group per
drafter (`TrainConfig.one_region`; off: one compiled `block_loss` region, AdamW and clip per drafter). Neither reads a
value back to the host between log steps: the loss is masked, not indexed, and normalised by the weight mass of the
global batch computed on the host.

    dmtp train --target runs/tiny/target --data runs/tiny/data/train.jsonl --variants dflash,zero_init_residual \
        --out runs/tiny/drafters --steps 200          # tiny CPU run: a few minutes
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from dmtp.compiling import announce
from dmtp.config import TrainConfig
from dmtp.dist import all_sum, barrier, data_parallel, rank_world
from dmtp.io import atomic_dir, atomic_path, iter_jsonl, load_state, save_state, write_json, write_text
from dmtp.models.attention import layer_masks
from dmtp.models.dflash2 import selector_loss
from dmtp.models.drafter import Drafter, DrafterConfig
from dmtp.training.common import compiled, to_device


# --- data -------------------------------------------------------------------------------------------------------
def load_sequences(path: str | Path, max_len: int, vocab_size: int | None = None) -> list[list[int]]:
    """Token file: JSONL, one object per line with `prompt_ids` + `output_ids` (the `dmtp generate` schema) or `ids`.
    A line without them, or with ids outside [0, vocab_size), is an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training token file {path} does not exist")
    seqs = []
    for i, r in iter_jsonl(path):
        if "ids" in r:
            ids = r["ids"]
        elif "prompt_ids" in r and "output_ids" in r:
            ids = list(r["prompt_ids"]) + list(r["output_ids"])
        else:
            raise ValueError(f"{path}:{i}: expected `ids`, or `prompt_ids` and `output_ids` (token id lists)")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"{path}:{i}: token ids must be a list of integers")
        bad = [t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            raise ValueError(f"{path}:{i}: token id {bad[0]} outside the target's vocabulary [0, {vocab_size})")
        if len(ids) >= 4:
            seqs.append(ids[:max_len])
    if not seqs:
        raise ValueError(f"{path} holds no sequence of at least 4 tokens")
    return seqs


def batches(seqs, batch_size, seed):
    """Endless shuffled epochs of padded [B, T] batches (pad 0) with lengths [B]."""
    rng = random.Random(seed)
    order = list(range(len(seqs)))
    while True:
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1 if len(order) >= batch_size else 1, batch_size):
            chunk = [seqs[j] for j in order[i: i + batch_size]]
            T = max(len(s) for s in chunk)
            ids = torch.zeros(len(chunk), T, dtype=torch.long)
            for b, s in enumerate(chunk):
                ids[b, : len(s)] = torch.tensor(s)
            yield ids, torch.tensor([len(s) for s in chunk])


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


@torch.no_grad()
def extract(target, mtp, ids, lengths, taps, need_g: bool) -> Features:
    out = target.features(ids, taps, logits=False)
    g = None
    if need_g:
        g = mtp.teacher_forced(ids, out.hidden)
        g = torch.cat([g, torch.zeros_like(g[:, :1])], 1)
    return Features(ids, lengths, out.taps, g)


def drafter_features(feats: Features, taps: list[int], drafter: Drafter) -> Features:
    """The features of one drafter: its own target layers out of `feats.taps`, which holds the layers `taps`."""
    H = feats.taps.shape[-1] // len(taps)
    cols = [feats.taps[..., i * H:(i + 1) * H] for i in map(taps.index, drafter.config.target_layer_ids)]
    return Features(feats.ids, feats.lengths, torch.cat(cols, -1), feats.g)


_CONST: dict = {}


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
    slot (candidate T_k at offset k) of a valid anchor whose label lies inside its sequence, 0 elsewhere."""
    dev = anchors.device
    offs = _const(("offs", layout, dev), lambda: torch.tensor(layout.offsets, device=dev))
    decay = _const(("decay", layout, gamma, dev), lambda: torch.tensor(
        [math.exp(-(k - 1) / gamma) if i in layout.predict else 0.0 for i, k in enumerate(layout.offsets)],
        device=dev))
    pos = anchors[..., None] + offs  # [B, N, S]
    ok = valid[..., None] & (pos < lengths.to(dev)[:, None, None])
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
    h = None
    if var.t1:
        h = torch.gather(feats.g, 1, (anchors - 1)[..., None].expand(B, N, feats.g.shape[-1]))
    mask_id = _const(("mask", c.mask_token_id, dev), lambda: torch.tensor([c.mask_token_id], device=dev))
    e_mask = target.embed(mask_id)[0]
    block = drafter.block(e(A), e(T1) if var.t1 else None, h, e_mask)  # [B, N, S, H]
    pos, w = loss_weights(lay, anchors, valid, feats.lengths, gamma)
    labels = take(ids, pos.reshape(B, -1)).reshape(B, N, S)
    labels = torch.where(w > 0, labels, torch.full_like(labels, -100))
    return block.reshape(B, N * S, -1), pos.reshape(B, N * S), labels.reshape(B, N * S), w.reshape(B, N * S)


def block_loss(drafter: Drafter, target, block, pos, f, ends, labels, w, norm, prev=None, mask=None):
    """The part of a drafter step every variant of a backbone shares (compiled on its own once per backbone and block
    size where each drafter has its region, `compiled_block_loss`; else traced inside `drafters_loss`):
    context K/V of f [B, T, H], the drafter's layers over the blocks, the target's LM head, and the position-decayed
    CE  sum_slots w * CE / norm  over all N*S slots (labels -100 and w = 0 where there is no loss: masked, not
    indexed, so no shape depends on the data). DFlash2 adds its selector's top-k CE (prev: each slot's previous data
    token). Returns (loss, statistics as 0-d device tensors)."""
    B, T = f.shape[:2]
    ctx_kv = drafter.context_kv(f, torch.arange(T, device=f.device)[None].expand(B, T))
    hid = drafter(block, pos, ctx_kv, ends, mask)
    logits = drafter.logits(target.lm_head(hid)).flatten(0, 1)  # [B*Q, V] fp32
    labels, w = labels.flatten(), w.flatten()
    ce = F.cross_entropy(logits, labels, reduction="none")  # 0 at label -100
    loss = (ce * w).sum() / norm
    sel = labels >= 0
    stats = {"acc": ((logits.argmax(-1) == labels) & sel).sum() / sel.sum().clamp(min=1)}
    if drafter.selector is not None:  # DFlash2: + CE over the top-k set, teacher-forced previous token
        sl, st = selector_loss(drafter.selector, logits, hid.flatten(0, 1), prev.flatten(), labels, w)
        loss = loss + drafter.config.selector_loss_weight * sl
        stats.update(st)
    stats["loss"] = loss.detach()
    return loss, stats


def drafter_loss(drafter: Drafter, target, feats: Features, anchors, valid, gamma: float, norm=None, mask=None,
                 core=block_loss):
    """Position-decayed CE of one drafter on a batch; returns (loss, statistics as 0-d tensors).

    norm: the loss normaliser. Default: this batch's weight mass. Under data parallelism the training loop passes
    the weight mass of the GLOBAL batch divided by the number of ranks (computed on the host from the global anchors,
    which every rank holds), so DDP's mean over ranks of sum_rank(w * CE) / norm is exactly the 1-rank loss of the
    same global batch, and so is its gradient. mask: the block mask(s) (`attention.layer_masks`) or None (dense,
    built by the drafter); core: `block_loss` or its compiled version."""
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
    return core(drafter, target, block, pos, f, anchors, labels, w, norm, prev, mask)


_COMPILED: list = []


def compiled_block_loss():
    """`block_loss` through torch.compile, one per process (the compiled path with a region per drafter): its graphs
    (one per backbone and block size; every variant's drafter is an input, not a constant) serve every later call."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(block_loss, dynamic=False))
    return _COMPILED[0]


class DrafterLoss(nn.Module):
    """One drafter's training loss as a module, what DistributedDataParallel wraps. The frozen target is held outside
    the module, so DDP neither broadcasts nor reduces it."""

    def __init__(self, drafter: Drafter, target, core=block_loss):
        super().__init__()
        self.drafter = drafter
        self._target = [target]
        self.core = core

    def forward(self, feats, anchors, valid, gamma, norm, mask=None):
        return drafter_loss(self.drafter, self._target[0], feats, anchors, valid, gamma, norm, mask, self.core)


def drafters_loss(drafters: nn.ModuleDict, target, feats: Features, taps: list[int], anchors, valid, gamma: float,
                  norms: tuple, masks: tuple):
    """The compiled path's step for every drafter at once: sum_i L_i over the drafters i on this batch, and each one's
    statistics ({name: {stat: 0-d tensor}}). norms[i], masks[i]: drafter i's loss normaliser (`drafter_loss`) and block
    mask (None: dense, built in the graph). The drafters share no trainable weight (the target and its features are
    frozen), so d(sum_j L_j)/d theta_i = dL_i/d theta_i: one backward of the sum gives every drafter exactly the
    gradient of its own loss."""
    total, stats = 0, {}
    for (name, d), norm, mask in zip(drafters.items(), norms, masks):
        loss, stats[name] = drafter_loss(d, target, drafter_features(feats, taps, d), anchors, valid, gamma, norm, mask)
        total = total + loss
    return total, stats


_JOINT: list = []
RECOMPILE_LIMIT = 64  # graphs of `drafters_loss` a process may hold: one per set of drafters trained together


def compiled_drafters_loss():
    """`drafters_loss` through torch.compile (one region, static shapes), one per process: one graph per set of
    drafters at a step (their variants, backbones and shapes; the drafters are inputs, not constants)."""
    if not _JOINT:
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        _JOINT.append(torch.compile(drafters_loss, dynamic=False, fullgraph=True))
    return _JOINT[0]


class DraftersLoss(nn.Module):
    """The drafters of one step as one module, what DistributedDataParallel wraps on the compiled path: one backward
    of the summed loss, and DDP averages every drafter's gradients over ranks in it. The target is held outside."""

    def __init__(self, drafters: dict[str, Drafter], target):
        super().__init__()
        self.drafters = nn.ModuleDict(drafters)
        self._target = [target]

    def forward(self, feats, taps, anchors, valid, gamma, norms, masks):
        return compiled_drafters_loss()(self.drafters, self._target[0], feats, taps, anchors, valid, gamma, norms,
                                        masks)


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
    """Per drafter a loss module (under torchrun in DDP), an AdamW and a clip_grad_norm_: the eager path (the
    reference) and the compiled path with one region per drafter (`TrainConfig.one_region = False`)."""

    def __init__(self, drafters, target, params, adamw, states, core):
        self.drafters, self.params = drafters, params
        self.nets = {n: data_parallel(DrafterLoss(d, target, core)) for n, d in drafters.items()}
        self.opts = {n: torch.optim.AdamW(ps, **adamw) for n, ps in params.items()}
        for n, sd in states.items():
            self.opts[n].load_state_dict(sd)

    def step(self, names, lr, cfg, amp, feats, taps, anchors, valid, norms, masks):
        out = {}
        for name in names:
            d, opt = self.drafters[name], self.opts[name]
            for gp in opt.param_groups:
                gp["lr"] = lr
            with torch.autocast(**amp):
                loss, stats = self.nets[name](drafter_features(feats, taps, d), anchors, valid, cfg.gamma,
                                              norms[d.layout], masks.get(d.layout))
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP averages the gradients over ranks here
            gn = torch.nn.utils.clip_grad_norm_(self.params[name], cfg.clip)
            opt.step()
            out[name] = {**stats, "grad_norm": gn}
        return out

    def opt_state(self, name):
        return self.opts[name].state_dict()


class _OneRegion:
    """The compiled path's step: every drafter at the step in one compiled region (`drafters_loss`; under torchrun
    one DDP module over them), one backward of the summed loss, per-drafter clipping on the device and one AdamW step
    over a param group per drafter (its own lr entry and state; fused on CUDA). Drafters at other steps (resumed
    apart) take no part: their parameters get no gradient, which AdamW skips."""

    def __init__(self, drafters, target, params, adamw, states):
        self.drafters, self.target, self.params = drafters, target, params
        self.names = list(drafters)
        self.key = self.net = None  # the drafters at the step and their module (the set only grows: resumed drafters
        # join at their step)
        self.opt = torch.optim.AdamW([{"params": ps} for ps in params.values()], **adamw,
                                     foreach=not adamw["fused"])
        load_group_states(self.opt, {self.names.index(n): sd for n, sd in states.items()})

    def step(self, names, lr, cfg, amp, feats, taps, anchors, valid, norms, masks):
        if tuple(names) != self.key:  # the old module (its DDP hooks and buckets) goes before the new one is made
            self.key, self.net = tuple(names), None
            self.net = data_parallel(DraftersLoss({n: self.drafters[n] for n in names}, self.target))
        for n in names:
            self.opt.param_groups[self.names.index(n)]["lr"] = lr
        lays = [self.drafters[n].layout for n in names]
        with torch.autocast(**amp):
            loss, stats = self.net(feats, taps, anchors, valid, cfg.gamma, tuple(norms[lay] for lay in lays),
                                   tuple(masks.get(lay) for lay in lays))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # each drafter's own gradient (see drafters_loss); DDP averages them over ranks here
        gn = clip_grad_norms_([self.params[n] for n in names], cfg.clip)
        self.opt.step()
        return {n: {**stats[n], "grad_norm": g} for n, g in zip(names, gn.unbind())}

    def opt_state(self, name):
        return group_state(self.opt, self.names.index(name))


def read_back(out: dict[str, dict[str, torch.Tensor]], world: int) -> dict[str, dict[str, float]]:
    """A log step's statistics as numbers, in one copy to the host for every drafter; "loss" becomes the global
    batch's loss (the sum over ranks of each rank's share, one all-reduce)."""
    names = list(out)
    losses = all_sum(torch.stack([out[n]["loss"] for n in names])) / world
    vals = [{**out[n], "loss": x} for n, x in zip(names, losses.unbind())]
    flat = iter(torch.stack([x.float() for v in vals for x in v.values()]).tolist())
    return {n: {k: next(flat) for k in v} for n, v in zip(names, vals)}


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
    """Train every drafter in `drafters` on the same batches; checkpoints under out_dir/<name>/ (resumable).
    `cfg.snapshots`: the weights after those steps also go to out_dir/<name>/step<k>/ (for the drafters named in
    `snapshot_runs`; None: all), with the training tokens consumed so far (snapshot.json). `branches` (budget ->
    branch step, for the same drafters): the full training state after the branch step goes to
    branch_dir(out_dir, budget)/<name>/trainer_state.pt, from which `train_branch` trains the annealed curve
    point. `schedule`: step -> learning rate (default `lr_at`).

    Under torchrun each rank takes rows rank::world of every global batch and the trained modules are wrapped in DDP
    (`dist.data_parallel`: each drafter, or on the compiled path the drafters of a step as one module); the loss
    normaliser is the global batch's weight mass (`drafter_loss`), so N ranks take the 1-rank step. History records
    (every `log_every` steps, the only host syncs) carry `elapsed_s`, measured after the values were read back:
    differences between records give the steady step rate. A checkpoint holds one drafter's weights, its own AdamW
    state, step and history, whichever path wrote it: either path resumes it."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    dev = target.device
    rank, world = rank_world()  # under torchrun each rank trains on rows rank::world of every global batch
    if cfg.batch_size % world:
        raise ValueError(f"global batch {cfg.batch_size} is not divisible by {world} data-parallel ranks")
    main = rank == 0
    static = compiled(cfg.compile, dev)  # the compiled path: fixed shapes, flex block masks, compiled losses
    start, hist, states = {}, {}, {}
    for name, d in drafters.items():
        d.train()
        for n, p in d.named_parameters():  # what the variant bypasses gets no gradient (DDP wants none unused)
            if d.injection.bypassed and n.startswith(d.injection.bypassed):
                p.requires_grad_(False)
        state = out_dir / name / "trainer_state.pt"
        start[name], hist[name] = 0, []
        if (out_dir / name / "DONE").exists():
            start[name] = cfg.steps
        elif state.exists():
            s = load_state(state, dev)
            if s["step"] > cfg.steps:
                raise ValueError(f"{state} is at step {s['step']}, beyond the {cfg.steps} steps requested")
            d.load_state_dict(s["model"])
            states[name], start[name], hist[name] = s["opt"], s["step"], s["history"]
            log(f"[train] {name}: resumed at step {s['step']}")
            if s["step"] == cfg.steps and main:  # killed between the final checkpoint and DONE: finish it now
                _finish(out_dir / name, hist[name], f"{cfg.steps} steps (marked done on a rerun)")
    todo = {n: d for n, d in drafters.items() if start[n] < cfg.steps}
    if not todo:
        return hist
    need_g = any(d.injection.needs_mtp for d in todo.values())
    taps = sorted({t for d in todo.values() for t in d.config.target_layer_ids})
    params = {n: [p for p in d.parameters() if p.requires_grad] for n, d in todo.items()}
    adamw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95), fused=dev.type == "cuda")
    states = {n: sd for n, sd in states.items() if n in todo}
    if static and cfg.one_region:
        trainer = _OneRegion(todo, target, params, adamw, states)
    else:
        trainer = _PerDrafter(todo, target, params, adamw, states, compiled_block_loss() if static else block_loss)
    layouts = sorted({d.layout for d in todo.values()}, key=lambda lay: lay.kinds)
    rules = {d.config.rules() for d in todo.values()}  # per layer, what a block slot sees
    if static and len(rules) > 1:
        raise ValueError(f"drafters trained side by side on the compiled path share one attention rule per layer, "
                         f"got {sorted(map(str, rules))}")
    amp = dict(device_type="cuda", dtype=torch.bfloat16, enabled=cfg.amp_bf16 and dev.type == "cuda")
    it = batches(seqs, cfg.batch_size, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    first = min(start[n] for n in todo)
    seen = 0  # training tokens consumed so far (the sequences' lengths, global batch): the learning curves' x axis
    for _ in range(first):  # replay the data stream to the resume point (cheap: no model work)
        _, lengths = next(it)
        seen += int(lengths.sum())
        sample_anchors(lengths, cfg.anchors_per_seq, gen)
    t0 = time.time()
    bar = tqdm(range(first, cfg.steps), desc=f"train {','.join(todo)}"[:60], dynamic_ncols=True, disable=not main)
    for step in bar:
        ids, lengths = next(it)
        seen += int(lengths.sum())
        anchors, valid = sample_anchors(lengths, cfg.anchors_per_seq, gen)  # of the global batch, on every rank
        if static:  # every batch [B, max_len]: one set of shapes for the compiled graphs
            if ids.shape[1] > cfg.max_len:
                raise ValueError(f"a training sequence of {ids.shape[1]} tokens exceeds max_len {cfg.max_len}")
            ids = F.pad(ids, (0, cfg.max_len - ids.shape[1]))
        # loss normaliser per block layout: the weight mass of the global batch / world (see drafter_loss)
        norms = torch.stack([loss_weights(lay, anchors, valid, lengths, cfg.gamma)[1].sum().clamp(min=1e-6) / world
                             for lay in layouts])
        ids, lengths, anchors, valid = (to_device(x[rank::world], dev) for x in (ids, lengths, anchors, valid))
        norms = dict(zip(layouts, to_device(norms, dev).unbind()))
        with torch.autocast(**amp):
            feats = extract(target, mtp, ids, lengths, taps, need_g)
        # the flex block mask on GPUs (flex attention has no backward pass on CPU: the compiled CPU path compiles
        # the dense mask into the graph instead)
        flex = static and dev.type == "cuda"
        T = ids.shape[1]
        masks = {lay: layer_masks(next(iter(rules)), anchors, lay.slots, T, "flex", lay.offsets[0])
                 for lay in layouts} if flex else {}
        names = [n for n in todo if step >= start[n]]  # drafters resumed at a later step join there
        lr = schedule(step) if schedule else lr_at(step, cfg)
        with announce(f"the training step of {','.join(todo)} (batch {cfg.batch_size} x {cfg.max_len})",
                      active=static and main and step == first):  # the first step compiles forward and backward
            out = trainer.step(names, lr, cfg, amp, feats, taps, anchors, valid, norms, masks)
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:  # the only reads back to the host
            for name, rec in read_back(out, world).items():
                hist[name].append({**rec, "step": step + 1, "lr": lr, "elapsed_s": time.time() - t0,
                                   "tokens": seen})
            bar.set_postfix({n: f"{hist[n][-1]['loss']:.3f}" for n in names})
        stop = cfg.stop_after and step + 1 == cfg.stop_after and step + 1 < cfg.steps
        for name in names:
            d = todo[name]
            if (step + 1 in cfg.snapshots and main and (snapshot_runs is None or name in snapshot_runs)
                    and not (out_dir / name / f"step{step + 1}" / "DONE").exists()):
                snap = out_dir / name / f"step{step + 1}"
                with atomic_dir(snap) as tmp:  # a learning-curve point: the weights as they are after this step
                    d.save(tmp / "drafter")
                    write_json(tmp / "snapshot.json", {"step": step + 1, "train_tokens": seen})
                    (tmp / "DONE").write_text("ok\n")
            for budget, at in (branches or {}).items():  # an annealed curve point leaves the run here
                where = branch_dir(out_dir, budget) / name
                if (step + 1 == at and main and (snapshot_runs is None or name in snapshot_runs)
                        and not (where / "DONE").exists()):
                    where.mkdir(parents=True, exist_ok=True)
                    with atomic_path(where / "trainer_state.pt") as tmp:
                        save_state({"model": d.state_dict(), "opt": trainer.opt_state(name), "step": step + 1,
                                    "history": list(hist[name])}, tmp)
            if ((step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps or stop) and main:
                d.save(out_dir / name / "drafter")  # world-size free: resumes on any number of ranks
                with atomic_path(out_dir / name / "trainer_state.pt") as tmp:
                    save_state({"model": d.state_dict(), "opt": trainer.opt_state(name), "step": step + 1,
                                "history": hist[name]}, tmp)
                if step + 1 == cfg.steps:  # the final checkpoint, then at once DONE (a rerun completes a kill here)
                    _finish(out_dir / name, hist[name], f"{cfg.steps} steps, {time.time() - t0:.1f}s, {world} rank(s)")
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
