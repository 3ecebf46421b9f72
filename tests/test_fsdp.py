"""FSDP2 training (dmtp/dist.py, `TrainConfig.fsdp`) on the CPU in fp32 with gloo: 2 ranks follow one process on the
same global batch (drafters' loss curve, gradient norms, final weights, snapshots and branch states, the frozen
target's layers sharded too; target pretraining); a run stopped mid-way on 2 ranks resumes to the uninterrupted
result on 2 ranks and on 1; activation checkpointing gives the same loss and gradients; FSDP2 on one process (a
process group of one) follows the plain step, eager and with its layers compiled, drafters joining at other steps;
the sharded clip is clip_grad_norm_; 3 ranks, whose shards are padded, follow one process too; `dmtp train` under
torchrun.

Tolerances (fp32): a rank sums the loss of its rows, and FSDP2 averages the two ranks' gradients in a reduce-scatter,
where one process sums every row in one reduction: the same terms added in another order, ~1e-7 relative per sum.
Losses and gradient norms agree to rel 1e-5 (measured: <= 2e-7, a few roundings carried through 4 AdamW steps).
Weights agree to atol 1e-5 at lr 6e-4 (measured: <= 2.8e-6): Adam's update lr * m / (sqrt(v) + eps) has size ~lr
whatever the gradient's size, so an element whose gradient is a cancellation near rounding level can move its weight
by a part of lr when the rounding differs; 1e-5 is 1.7 % of one step, far below a real discrepancy (a missing or
doubled gradient moves whole tensors by ~lr)."""
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import compiled_graphs, gloo_ranks, token_seqs

from dmtp import dist as ddist
from dmtp.config import TrainConfig
from dmtp.models import tiny
from dmtp.models.layers import Layer
from dmtp.training import drafters as train_mod
from dmtp.training.common import _recomputed
from dmtp.training.drafters import block_loss, drafter_loss, extract, new_drafters, sample_anchors, train_drafters

VARIANTS = ["dflash", "zero_init_residual", "mtp_context"]  # block layouts with and without A, a bypassed weight
STEPS = 4
W_ATOL = 1e-5


BACKBONES = {"dmtp_d2": ("zero_init_residual", "dflash2")}  # a DFlash2 drafter where a run names it


def _base(tgt):
    return dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1, selector_topk=8, selector_dim=16)


def _cfg(**kw):
    return TrainConfig(**{**dict(steps=STEPS, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1,
                                 save_every=100, clip=0.5, compile="off"), **kw})


SIDE = dict(snapshots=(1, 3), branches={4: 2})  # learning-curve snapshots and an annealed branch's state: more
# checkpoints gathered and written by rank 0 (before the stop after step 2 and after the resume)


def _run(out, names=VARIANTS, branches=None, models=None, **kw):
    """train_drafters on the tiny qwen3_5 target (`models`, default a fresh one) in this process (under whatever
    process group exists)."""
    tgt, mtp = models or tiny.build("qwen3_5", seed=0)
    ds = new_drafters(tgt, names, _base(tgt), backbones=BACKBONES)
    return train_drafters(tgt, mtp, ds, token_seqs(), _cfg(**kw), out, log=lambda *_: None, branches=branches)


def _pretrain(out, compile_flag):
    """5 steps of target + MTP pretraining (fp32, materialised logits) -> (losses, the caller's target weights)."""
    from dmtp.training.pretrain import PretrainConfig, TargetArch, build_target, pretrain

    torch.manual_seed(0)
    arch = TargetArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      intermediate_size=128)
    tgt, mtp = build_target(arch, vocab_size=128, eos_id=0)
    tokens = np.random.default_rng(0).integers(1, 128, 20_000).astype(np.int64)
    cfg = PretrainConfig(tokens=5 * 4 * 32, seq_len=32, batch_size=4, log_every=1, bf16=False, compile=compile_flag,
                         warmup_frac=0.5, fused_ce="off")
    hist, _ = pretrain(tgt, mtp, tokens, cfg, out, log=lambda *_: None)
    return [h["loss"] for h in hist], {k: v.clone() for k, v in tgt.model.state_dict().items()}


def _ranks(rank, world, root):
    """A rank of the 2-rank runs: drafters (the target's layers sharded too, activation checkpointing) stopped after
    step 2 (the checkpoint a killed run leaves), copied by rank 0, and resumed to the end; target pretraining."""
    run = _pretrain(root / "pretrain_two", "off")
    if rank == 0:
        torch.save(run, root / "pretrain_two.pt")
    kw = dict(shard_target="on", activation_checkpointing=True, **SIDE)
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    _run(root / "split", stop_after=2, models=(tgt, mtp), **kw)
    if rank == 0:  # the target's layers after their forwards: their shards alone, nothing gathered left behind
        types = {type(p).__name__ for p in tgt.body.layers.parameters()}
        (root / "target_params.json").write_text(json.dumps(sorted(types)))
        shutil.copytree(root / "split", root / "split1")
    dist.barrier()
    _run(root / "split", **kw)


def _weights(d):
    from safetensors.torch import load_file

    return load_file(str(d / "drafter" / "model.safetensors"))


def _history(d):
    return json.loads((d / "history.json").read_text())


def _assert_same_run(run, ref, names=VARIANTS):
    """Step by step the same logged values (losses, gradient norms, accuracies: each the global batch's), and the same
    final weights (tolerances: the docstring)."""
    for v in names:
        h, h_ref = _history(run / v), _history(ref / v)
        assert [r["step"] for r in h] == [r["step"] for r in h_ref]
        assert [r.keys() for r in h] == [r.keys() for r in h_ref]
        for key in set(h_ref[0]) - {"step", "lr", "elapsed_s", "tokens"}:
            assert [r[key] for r in h] == pytest.approx([r[key] for r in h_ref], rel=1e-5), (v, key)
        w, w_ref = _weights(run / v), _weights(ref / v)
        assert w.keys() == w_ref.keys()
        for k in w:
            assert w[k].dtype == torch.float32
            torch.testing.assert_close(w[k], w_ref[k], rtol=0, atol=W_ATOL, msg=f"{v} {k}")


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The reference: one process, no process group, the plain eager step (`fsdp="auto"` with one rank)."""
    out = tmp_path_factory.mktemp("fsdp") / "one"
    _run(out, **SIDE)
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The 2-rank runs (`_ranks`, one spawn), and the stopped run's copy resumed on one process."""
    root = tmp_path_factory.mktemp("fsdp2")
    gloo_ranks(_ranks, 2, root)
    _run(root / "split1")
    return root


def test_pretraining_on_two_ranks_follows_one_process(two, tmp_path):
    """Target + MTP pretraining on 2 ranks (a copy sharded with FSDP2) follows one process (losses rel 1e-5; weights
    atol 1e-5 at lr 2e-3, the Adam argument above), and the caller's modules hold the trained weights as plain
    tensors afterwards (rank 0 evaluates and saves them)."""
    losses, weights = _pretrain(tmp_path / "one", "off")
    losses2, weights2 = torch.load(two / "pretrain_two.pt", weights_only=True)
    assert losses2 == pytest.approx(losses, rel=1e-5) and len(losses) == 5
    assert weights2.keys() == weights.keys()
    for k, w in weights.items():
        assert type(weights2[k]) is torch.Tensor
        torch.testing.assert_close(weights2[k], w, rtol=0, atol=1e-5, msg=k)


def test_two_ranks_follow_one_process(one, two):
    """2 gloo ranks (FSDP2: each drafter per layer then as a whole; the target's layers sharded too) follow the
    plain 1-process run on the same global batch step by step (steps 1-2 before the stop, 3-4 after the resume);
    the bypassed weight of mtp_context stays frozen."""
    out = two / "split"
    assert "2 rank(s)" in (out / "dflash" / "DONE").read_text()
    assert json.loads((two / "target_params.json").read_text()) == ["DTensor"]
    assert [r["step"] for r in _history(out / "dflash")] == list(range(1, STEPS + 1))
    _assert_same_run(out, one)
    tgt, _ = tiny.build("qwen3_5", seed=0)
    init = new_drafters(tgt, ["mtp_context"], _base(tgt))["mtp_context"]
    w = _weights(out / "mtp_context")
    assert torch.equal(w["fc.weight"], init.fc.weight)
    assert not torch.equal(w["injection.fc.weight"], init.injection.fc.weight)


def _three(rank, world, root):
    """A rank of the 3-rank run: every width of the tiny drafters and target (64, 32, 16, ...) splits unevenly over
    3 ranks, so FSDP2 pads its shards; the gathered checkpoint, the sharded clip and the loss normaliser must see
    through the padding."""
    _run(root / "three", batch_size=6, shard_target="on")


def test_three_ranks_with_uneven_shards_follow_one_process(tmp_path):
    """Global batch 6 on 3 ranks (2 rows each, shards padded) against one process on the same 6 rows."""
    gloo_ranks(_three, 3, tmp_path)
    _run(tmp_path / "one", batch_size=6)
    _assert_same_run(tmp_path / "three", tmp_path / "one")


def test_stopped_run_resumes_on_two_ranks_and_on_one(one, two):
    """Stopped after step 2 on 2 ranks (its checkpoint gathered and written by rank 0, full tensors), resumed on 2
    ranks and, from a copy, on one process (the plain step): both end at the uninterrupted run's losses and
    weights."""
    for run in ("split", "split1"):
        for v in VARIANTS:
            assert not (two / run / v / "trainer_state.pt").exists() and (two / run / v / "DONE").exists()
        _assert_same_run(two / run, one)
    assert "2 rank(s)" in (two / "split" / "dflash" / "DONE").read_text()
    assert "1 rank(s)" in (two / "split1" / "dflash" / "DONE").read_text()
    for v in VARIANTS:  # the side checkpoints of the 2-rank pieces: full tensors, the 1-process run's
        for k in (1, 3):
            snap = two / "split" / v / f"step{k}"
            assert json.loads((snap / "snapshot.json").read_text())["step"] == k
            w, w_ref = _weights(snap), _weights(one / v / f"step{k}")
            for key in w_ref:
                torch.testing.assert_close(w[key], w_ref[key], rtol=0, atol=W_ATOL, msg=f"{v} step{k} {key}")
        st, st_ref = (torch.load(r / "anneal4" / v / "trainer_state.pt", weights_only=True)
                      for r in (two / "split", one))
        assert st["step"] == st_ref["step"] == 2
        for key, x in st_ref["model"].items():
            torch.testing.assert_close(st["model"][key], x, rtol=0, atol=W_ATOL, msg=f"{v} branch {key}")
        for i, moments in st_ref["opt"]["state"].items():  # Adam's moments at full shapes; per tensor, in norm (an
            # element near 0 is a cancellation's rounding)
            for key, x in moments.items():
                assert st["opt"]["state"][i][key].shape == x.shape
                assert (st["opt"]["state"][i][key] - x).norm() <= 1e-5 * x.norm(), (v, i, key)


def test_fsdp_on_one_process_follows_the_plain_step(one, tmp_path):
    """`fsdp="on"` without torchrun: FSDP2 in a process group of one (started and ended by the call), with activation
    checkpointing: the plain run's losses and weights; the group is gone afterwards."""
    _run(tmp_path / "on", fsdp="on", activation_checkpointing=True)
    assert not dist.is_initialized()
    _assert_same_run(tmp_path / "on", one)


def test_sharded_drafters_joining_at_other_steps(tmp_path):
    """FSDP2 on one process: token_only stopped alone after step 2, then trained on beside a fresh DMTP(D2) drafter
    (DFlash2 layers and selector sharded: the selector in the root), which joins at step 1 while token_only resumes
    at step 3: both follow their plain uninterrupted runs."""
    names = ["token_only", "dmtp_d2"]
    _run(tmp_path / "plain", names)
    _run(tmp_path / "fsdp", ["token_only"], fsdp="on", stop_after=2)
    _run(tmp_path / "fsdp", names, fsdp="on")
    _assert_same_run(tmp_path / "fsdp", tmp_path / "plain", names)


def test_sharded_compiled_layers_follow_eager(one, tmp_path, monkeypatch):
    """The compiled path under FSDP2: each decoder layer's forward compiled (AOTAutograd's eager backend here: the
    same graphs as Inductor's without a C++ build), FSDP2's hooks outside the graphs, with and without activation
    checkpointing: the eager run's results."""
    orig = train_mod.compile_forwards
    monkeypatch.setattr(train_mod, "compile_forwards", lambda layers: orig(layers, backend="aot_eager"))
    for ac in (False, True):  # with activation checkpointing: the recomputation traced into the layers' graphs
        traced = _recomputed(Layer.forward) if ac else Layer.forward  # the function each layer's graph starts at
        graphs = compiled_graphs(traced)
        _run(tmp_path / f"c{ac}", fsdp="on", compile="on", activation_checkpointing=ac)
        assert compiled_graphs(traced) > graphs
        for v in VARIANTS:  # padded to max_len on the compiled path: the same loss, other reduction shapes
            h, h_ref = _history(tmp_path / f"c{ac}" / v), _history(one / v)
            assert [r["loss"] for r in h] == pytest.approx([r["loss"] for r in h_ref], rel=1e-5), (v, ac)


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    """One drafter's loss and every gradient with its layers recomputed in the backward pass equal those without."""
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    seqs = token_seqs(4, seed=3)
    T = max(len(s) for s in seqs)
    ids = torch.zeros(4, T, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    anchors, valid = sample_anchors(lengths, 5, torch.Generator().manual_seed(0))
    out = {}
    for ac in (False, True):
        d = new_drafters(tgt, ["zero_init_residual"], _base(tgt))["zero_init_residual"]
        if ac:
            train_mod.checkpoint_layers(d.layers)
        feats = extract(tgt, mtp, ids, lengths, sorted(d.config.target_layer_ids), True)
        feats = train_mod.drafter_features(feats, sorted(d.config.target_layer_ids), d)
        loss, _ = drafter_loss(d, tgt, feats, anchors, valid, 4.0, core=block_loss)
        loss.backward()
        out[ac] = loss.detach(), {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}
    assert torch.equal(out[True][0], out[False][0])
    assert out[True][1].keys() == out[False][1].keys() and len(out[False][1]) > 10
    for n, g in out[False][1].items():
        assert torch.equal(out[True][1][n], g), n


def test_sharded_clip_is_clip_grad_norm():
    """`dist.clip_sharded_` (plain tensors, no group) equals clip_grad_norm_ per group: one above the limit is scaled
    to it, one below untouched."""
    torch.manual_seed(0)
    big = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(2)]
    small = [torch.nn.Parameter(torch.randn(4)) for _ in range(2)]
    for p in big:
        p.grad = torch.randn_like(p) * 3
    for p in small:
        p.grad = torch.randn_like(p) * 0.01
    twins = [[torch.nn.Parameter(p.detach().clone()) for p in ps] for ps in (big, small)]
    for ps, ts in zip((big, small), twins):
        for p, t in zip(ps, ts):
            t.grad = p.grad.clone()
    want = torch.stack([torch.nn.utils.clip_grad_norm_(ts, 1.0) for ts in twins])
    norms = ddist.clip_sharded_([big, small], 1.0)
    assert norms[0] > 1 > norms[1]
    torch.testing.assert_close(norms, want)
    for p, t in zip(big + small, twins[0] + twins[1]):
        torch.testing.assert_close(p.grad, t.grad)


def test_fsdp_switch():
    assert ddist.use_fsdp("auto", 1) is False and ddist.use_fsdp("auto", 2) is True
    assert ddist.use_fsdp("on", 1) is True and ddist.use_fsdp("off", 1) is False
    with pytest.raises(ValueError, match="train.fsdp='off' under 2 ranks"):
        ddist.use_fsdp("off", 2)
    for field in ("fsdp", "shard_target"):
        with pytest.raises(ValueError, match=field):
            TrainConfig(**{field: "yes"})


# --- `dmtp train` under torchrun ------------------------------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_under_torchrun(tmp_path):
    """`dmtp train` launched by torchrun on 2 ranks takes the FSDP2 path (the flags reach TrainConfig) and writes the
    public checkpoint layout once, from rank 0."""
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tiny.save(tgt, mtp, tmp_path / "target")
    with open(tmp_path / "data.jsonl", "w") as f:
        for seq in token_seqs(16, seed=1):
            f.write(json.dumps({"ids": seq}) + "\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
           "-m", "dmtp.cli.main", "train", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "data.jsonl"),
           "--variants", "dflash,zero_init_residual", "--out", str(out), "--steps", "2", "--batch-size", "4",
           "--max-len", "40", "--mask-token-id", "2", "--fsdp", "auto", "--shard-target", "on",
           "--activation-checkpointing"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    for v in ("dflash", "zero_init_residual"):
        assert "2 steps" in (out / v / "DONE").read_text() and "2 rank(s)" in (out / v / "DONE").read_text()
        assert sorted(x.name for x in (out / v / "drafter").iterdir()) == ["config.json", "model.safetensors"]
        assert json.loads((out / v / "drafter" / "config.json").read_text())["dmtp_config"]["variant"] == v


def test_a_rank_leaves_with_the_commands_status_and_all_its_output(tmp_path):
    """Under torchrun (WORLD_SIZE > 1) `python -m dmtp.cli` leaves without the interpreter's teardown (where gloo can
    abort a finished rank): the command's exit status and everything it printed still come out."""
    env = dict(os.environ, WORLD_SIZE="2")
    ok = subprocess.run([sys.executable, "-m", "dmtp.cli", "land", "--help"], capture_output=True, text=True, env=env,
                        timeout=120)
    assert ok.returncode == 0 and "--partial" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "dmtp.cli.main", "land", str(tmp_path / "none.tgz")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("dmtp land: error:")
