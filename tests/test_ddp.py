"""Data-parallel drafter training under torchrun (gloo on CPU, DistributedDataParallel): 2 ranks follow 1 rank at the
same global batch to float rounding (fp32), a variant that bypasses a drafter weight included (mtp_context)."""
import json
import os
import random
import socket
import subprocess
import sys

import pytest
import torch

from dmtp.models import tiny
from dmtp.models.target import Target
from dmtp.training.drafters import new_drafters

VARIANTS = ["dflash", "zero_init_residual", "mtp_context"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tiny.save(tgt, mtp, root / "target")
    rng = random.Random(0)
    with open(root / "data.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"ids": [rng.randrange(3, 96) for _ in range(rng.randrange(20, 40))]}) + "\n")
    return root


def _train(root, out, nproc, steps, extra=()):
    args = ["-m", "dmtp.cli.main", "train", "--target", str(root / "target"), "--data", str(root / "data.jsonl"),
            "--variants", ",".join(VARIANTS), "--out", str(out), "--steps", str(steps),
            "--batch-size", "4", "--max-len", "40", "--mask-token-id", "2", *extra]
    if nproc == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               f"--master_port={_free_port()}", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]


def test_two_ranks_match_one(setup):
    root = setup
    _train(root, root / "one", 1, 4)
    _train(root, root / "two", 2, 4)
    for v in VARIANTS:
        h1 = json.loads((root / "one" / v / "history.json").read_text())
        h2 = json.loads((root / "two" / v / "history.json").read_text())
        assert [h["loss"] for h in h2] == pytest.approx([h["loss"] for h in h1], rel=1e-6)
        assert "2 rank(s)" in (root / "two" / v / "DONE").read_text()
        w1, w2 = _weights(root / "one" / v), _weights(root / "two" / v)
        assert w1.keys() == w2.keys()
        for k in w1:  # Adam divides by sqrt(v): a near-zero gradient's rounding moves its weight by up to ~lr/100
            torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-5, msg=k)
    # mtp_context bypasses the drafter's fc: frozen (DDP wants no unused trainable weight), so never updated
    tgt = Target.load(root / "target")
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, mask_token_id=2, seed=0)  # `dmtp train`'s defaults
    init = new_drafters(tgt, ["mtp_context"], base)["mtp_context"]
    for run in ("one", "two"):
        w = _weights(root / run / "mtp_context")
        assert torch.equal(w["fc.weight"], init.fc.weight)
        assert not torch.equal(w["injection.fc.weight"], init.injection.fc.weight)


def _weights(d):
    from safetensors.torch import load_file

    return load_file(str(d / "drafter" / "model.safetensors"))


def test_resume_on_another_world_size(setup):
    """Stopped after step 2 on 2 ranks, finished on 1 rank: the same losses as an uninterrupted 1-rank run."""
    root = setup
    if not (root / "one" / "dflash" / "history.json").exists():
        _train(root, root / "one", 1, 4)
    _train(root, root / "split", 2, 4, ["--stop-after", "2"])
    assert (root / "split" / "dflash" / "trainer_state.pt").exists()
    assert not (root / "split" / "dflash" / "DONE").exists()
    _train(root, root / "split", 1, 4)
    for v in VARIANTS:
        h1 = json.loads((root / "one" / v / "history.json").read_text())
        h2 = json.loads((root / "split" / v / "history.json").read_text())
        assert [h["step"] for h in h2] == [h["step"] for h in h1]
        assert [h["loss"] for h in h2] == pytest.approx([h["loss"] for h in h1], rel=1e-6)
