"""FSDP2 drafter training (dmtp/dist.py, `TrainConfig.fsdp`) on the CPU in fp32 with gloo: 2 ranks follow one process on
the same global batch (loss curve, gradient norms and final weights, the frozen target's layers sharded too); a run
stopped mid-way on 2 ranks resumes to the uninterrupted result on 2 ranks and on 1 (`dmtp train` under torchrun);
activation checkpointing gives the same loss and gradients; FSDP2 on one process (a process group of one) follows
the plain step, eager and with its layers compiled; the sharded clip is clip_grad_norm_.

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

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import token_seqs

from dmtp import dist as ddist
from dmtp.config import TrainConfig
from dmtp.models import tiny
from dmtp.training import drafters as train_mod
from dmtp.training.drafters import block_loss, drafter_loss, extract, new_drafters, sample_anchors, train_drafters

VARIANTS = ["dflash", "zero_init_residual", "mtp_context"]  # block layouts with and without A, a bypassed weight
STEPS = 4
W_ATOL = 1e-5


def _base(tgt):
    return dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1)


def _cfg(**kw):
    return TrainConfig(**{**dict(steps=STEPS, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1,
                                 save_every=100, clip=0.5, compile="off"), **kw})


def _run(out, names=VARIANTS, **kw):
    """train_drafters on the tiny qwen3_5 target in this process (under whatever process group exists)."""
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    ds = new_drafters(tgt, names, _base(tgt))
    return train_drafters(tgt, mtp, ds, token_seqs(), _cfg(**kw), out, log=lambda *_: None)


def _rank(rank, world, store, out, kw):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        _run(out, **kw)
    finally:
        dist.destroy_process_group()


def _weights(d):
    from safetensors.torch import load_file

    return load_file(str(d / "drafter" / "model.safetensors"))


def _history(d):
    return json.loads((d / "history.json").read_text())


def _assert_same_run(run, ref, names=VARIANTS, steps=True):
    for v in names:
        h, h_ref = _history(run / v), _history(ref / v)
        if steps:
            assert [r["step"] for r in h] == [r["step"] for r in h_ref]
        for key in ("loss", "grad_norm"):  # (acc: rank 0's rows only)
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
    _run(out)
    return out


def test_two_ranks_follow_one_process(one, tmp_path):
    """2 gloo ranks (FSDP2: each drafter per layer then as a whole; the target's layers sharded too) follow the
    plain 1-process run on the same global batch step by step; the bypassed weight of mtp_context stays frozen."""
    out = tmp_path / "two"
    mp.spawn(_rank, args=(2, tmp_path / "store", out, {"shard_target": "on"}), nprocs=2, join=True)
    assert "2 rank(s)" in (out / "dflash" / "DONE").read_text()
    assert [r["step"] for r in _history(out / "dflash")] == list(range(1, STEPS + 1))
    _assert_same_run(out, one)
    tgt, _ = tiny.build("qwen3_5", seed=0)
    init = new_drafters(tgt, ["mtp_context"], _base(tgt))["mtp_context"]
    w = _weights(out / "mtp_context")
    assert torch.equal(w["fc.weight"], init.fc.weight)
    assert not torch.equal(w["injection.fc.weight"], init.injection.fc.weight)


def test_fsdp_on_one_process_follows_the_plain_step(one, tmp_path):
    """`fsdp="on"` without torchrun: FSDP2 in a process group of one (started and ended by the call), with activation
    checkpointing: the plain run's losses and weights; the group is gone afterwards."""
    _run(tmp_path / "on", fsdp="on", activation_checkpointing=True)
    assert not dist.is_initialized()
    _assert_same_run(tmp_path / "on", one)


def test_sharded_compiled_layers_follow_eager(one, tmp_path, monkeypatch):
    """The compiled path under FSDP2: each decoder layer's forward compiled (AOTAutograd's eager backend here: the
    same graphs as Inductor's without a C++ build), FSDP2's hooks outside the graphs: the eager run's results."""
    orig = train_mod.compile_forwards
    monkeypatch.setattr(train_mod, "compile_forwards", lambda layers: orig(layers, backend="aot_eager"))
    _run(tmp_path / "c", fsdp="on", compile="on")
    for v in VARIANTS:  # padded to max_len on the compiled path: the same loss, other reduction shapes
        h, h_ref = _history(tmp_path / "c" / v), _history(one / v)
        assert [r["loss"] for r in h] == pytest.approx([r["loss"] for r in h_ref], rel=1e-5), v


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


# --- `dmtp train` under torchrun: stopped on 2 ranks, resumed on 2 and on 1 ------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cli_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_cli")
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tiny.save(tgt, mtp, root / "target")
    with open(root / "data.jsonl", "w") as f:
        for s in token_seqs(16, seed=1):
            f.write(json.dumps({"ids": s}) + "\n")
    return root


def _train(root, out, nproc, extra=()):
    args = ["-m", "dmtp.cli.main", "train", "--target", str(root / "target"), "--data", str(root / "data.jsonl"),
            "--variants", ",".join(VARIANTS), "--out", str(out), "--steps", str(STEPS), "--batch-size", "4",
            "--max-len", "40", "--mask-token-id", "2", *extra]
    launch = [sys.executable] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={_free_port()}"]
    p = subprocess.run(launch + args, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_stopped_run_resumes_on_two_ranks_and_on_one(cli_setup):
    """`dmtp train` on 2 ranks stopped after step 2 (`--stop-after`: the checkpoint a killed run leaves, gathered and
    written by rank 0), resumed on 2 ranks and, from a copy, on one process: both end at the uninterrupted 1-process
    run's loss and weights."""
    root = cli_setup
    _train(root, root / "one", 1)
    _train(root, root / "split", 2, ["--stop-after", "2"])
    for v in VARIANTS:
        assert (root / "split" / v / "trainer_state.pt").exists() and not (root / "split" / v / "DONE").exists()
    shutil.copytree(root / "split", root / "split1")
    _train(root, root / "split", 2)
    _train(root, root / "split1", 1)
    for run in ("split", "split1"):
        _assert_same_run(root / run, root / "one")
        assert not (root / run / "dflash" / "trainer_state.pt").exists()
