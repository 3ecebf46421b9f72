"""Identical commands give identical records, whatever else runs on the card. On CPU: the settings ("fixed" kernels
for the engine and both training loops: Inductor's deterministic mode, and in training PyTorch's deterministic
algorithms) are typed, checked and applied only on CUDA. On a GPU (skipped without CUDA): a compiled
reduction-heavy step, a few compiled drafter-training steps, a few pretraining steps and `dmtp generate` (greedy
and sampled; cold, warm and fresh compile caches; in one process twice) give the same bits alone and while another
process keeps the card busy — the tests that say whether two realizations' chains may share one GPU.

    python -m pytest -q tests/test_load_independence.py        # on one H100/H200: about 10 min
"""
import json
import subprocess
import sys
import time

import pytest
import torch

from dmtp.cli.stages import RUN_CONTROL
from dmtp.config import EngineConfig, KERNEL_CHOICES
from dmtp.config.training import PretrainConfig, TrainConfig
from dmtp.models import fast
from dmtp.training.common import kernel_choices

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

LOAD = """
import sys, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("busy", flush=True)
while True:
    a = (a @ a).clamp_(-1, 1)
"""


def test_fixed_kernels_are_a_typed_setting_applied_on_cuda_only():
    assert KERNEL_CHOICES == ("default", "fixed") and EngineConfig(tuning="fixed").tuning == "fixed"
    assert fast.compile_options(torch.device("cuda"), "fixed") == {"deterministic": True}
    assert fast.compile_options(torch.device("cpu"), "fixed") == {"epilogue_fusion": False}
    assert TrainConfig(kernels="fixed").kernels == PretrainConfig(kernels="fixed").kernels == "fixed"
    with pytest.raises(ValueError, match="kernels"):
        TrainConfig(kernels="timed")
    with pytest.raises(ValueError, match="kernels='x': expected one of default, fixed"):
        kernel_choices("x", "cpu")
    before = torch._inductor.config.deterministic
    with kernel_choices("fixed", "cpu"):
        assert torch._inductor.config.deterministic == before  # CPU: nothing changes
    with kernel_choices("fixed", torch.device("cuda")):  # the settings themselves need no device
        assert torch._inductor.config.deterministic is True and torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert not torch.backends.cuda.cudnn_sdp_enabled()  # its backward is not checked (`kernel_choices`)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with kernel_choices("default", torch.device("cuda")):
        assert torch._inductor.config.deterministic == before and not torch.are_deterministic_algorithms_enabled()
    assert torch._inductor.config.deterministic == before and not torch.are_deterministic_algorithms_enabled()
    assert "kernels" in RUN_CONTROL  # how a run executes, not what it is: a realization with fixed kernels pools


def test_a_backward_pass_under_fixed_kernels_is_strictly_deterministic():
    """Warn-only deterministic mode leaves flash and memory-efficient attention's backward on atomic adds; the training
    loops' `backward` makes the backward pass strict (their deterministic algorithms) and restores warn-only after,
    also when the backward raises; outside deterministic mode it is a plain backward."""
    from dmtp.training.common import backward

    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append((torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled()))
            if len(seen) == 3:
                raise RuntimeError("probe")
            return g * 2

    x = torch.ones(3, requires_grad=True)
    backward(Probe.apply(x).sum())
    assert seen == [(False, False)] and torch.equal(x.grad, torch.full((3,), 2.0))
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # what kernel_choices("fixed") sets on CUDA
    try:
        backward(Probe.apply(x).sum())
        assert seen[1] == (True, False) and torch.is_deterministic_algorithms_warn_only_enabled()
        with pytest.raises(RuntimeError, match="probe"):
            backward(Probe.apply(x).sum())
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_the_strict_backward_keeps_a_compiled_step_to_one_graph():
    """The mode switch around the backward pass is invisible to torch.compile's guards (the forward always runs in
    warn-only mode): three compiled attention steps make one graph, each gradient equal to the eager step's."""
    from torch._dynamo.utils import counters

    from dmtp.training.common import backward

    torch._dynamo.reset()
    counters.clear()
    lin = torch.nn.Linear(16, 8)

    def step(x):
        q = lin(x)
        return torch.nn.functional.scaled_dot_product_attention(q, q.flip(-1), q, is_causal=True).square().mean()

    compiled = torch.compile(step)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        for i in range(3):
            x = torch.randn(2, 4, 32, 16, generator=torch.Generator().manual_seed(i))
            grads = []
            for fn in (compiled, step):
                lin.zero_grad()
                backward(fn(x))
                grads.append(lin.weight.grad.clone())
                assert torch.is_deterministic_algorithms_warn_only_enabled()
            torch.testing.assert_close(grads[0], grads[1])
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch._dynamo.reset()


def _step(x, w):
    """A reduction-heavy step of the mini drafter's widths: RMS norm, a projection, log-softmax, a row sum."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return torch.log_softmax(h @ w, -1).sum(-1)


def _compiled_out(tuning: str, shapes) -> list[torch.Tensor]:
    """`_step` compiled afresh (no cache: every timed choice made again now) under `tuning`, on fixed inputs."""
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(0)
    outs = []
    with torch._inductor.config.patch(force_disable_caches=True):
        fn = fast.compile_fn(_step, torch.device("cuda"), tuning)
        for rows, d, v in shapes:
            x = torch.randn(rows, d, device="cuda", generator=g, dtype=torch.bfloat16)
            w = torch.randn(d, v, device="cuda", generator=g, dtype=torch.bfloat16) / d ** 0.5
            outs.append(fn(x, w).float().cpu())
    return outs


class Busy:
    """Another process keeping the card busy with bf16 matmuls while the block runs."""

    def __enter__(self):
        self.p = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "busy"
        time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait()


SHAPES = [(32 * 8, 768, 4099), (512, 1024, 2048), (8, 768, 50000)]  # odd widths: several reduction configs


@cuda
def test_fixed_kernels_give_the_same_bits_under_load():
    alone = _compiled_out("fixed", SHAPES)
    with Busy():
        loaded = _compiled_out("fixed", SHAPES)
    for a, b, s in zip(alone, loaded, SHAPES):
        assert torch.equal(a, b), f"fixed kernels differ under load at shape {s}"


@cuda
@pytest.mark.parametrize("shape", [(16, 4, 256, 32), (8, 6, 512, 64)])  # mini's target; a wider one, 4 key blocks
def test_attention_under_fixed_kernels_leaves_cudnn_and_repeats_its_gradients(shape):
    """Scaled-dot-product attention chooses its kernel in the forward pass: under the fixed kernel choices not cuDNN's
    (whose backward is not checked), and three forward-backward passes give the same gradients, bit for bit. The
    choice made outside them is printed (cuDNN where this build prefers it)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    from dmtp.training.common import backward

    B, H, S, D = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

    def grads():
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        backward(F.scaled_dot_product_attention(*x, is_causal=True).float().square().sum())
        return [t.grad for t in x]

    print(f"attention {shape}: {SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True)).name} by default")
    with kernel_choices("fixed", "cuda"):
        assert SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True)) != SDPBackend.CUDNN_ATTENTION
        first, *again = [grads() for _ in range(3)]
    for other in again:
        assert all(torch.equal(a, b) for a, b in zip(first, other)), f"attention's gradients differ at {shape}"


def _drafter_weights(tmp, kernels: str, device: str = "cuda", compile: str = "on") -> dict[str, torch.Tensor]:
    """Four drafter-training steps (the tiny target, two variants; compiled by default) with `kernels`; the trained
    weights."""
    from dmtp.config.ablation import code
    from dmtp.models import tiny
    from dmtp.training.drafters import new_drafters, train_drafters

    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tgt.model.to(device)
    mtp.to(device)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 96, (int(n),), generator=g).tolist() for n in torch.randint(14, 40, (12,), generator=g)]
    cfg = TrainConfig(steps=4, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1, save_every=100,
                      compile=compile, kernels=kernels)
    torch._dynamo.reset()
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1, selector_topk=8, selector_dim=16)
    drafters = new_drafters(tgt, ["dflash", "zero_init_residual"], base, backbones=code().backbones)
    with torch._inductor.config.patch(force_disable_caches=True):
        train_drafters(tgt, mtp, drafters, seqs, cfg, tmp, log=lambda *_: None)
    return {f"{n}.{k}": v.detach().float().cpu().clone() for n, d in drafters.items()
            for k, v in d.state_dict().items()}


def test_chains_check_names_the_first_logged_step_where_two_targets_part(tmp_path):
    """Two chains' target folders: the first pretraining (then unlikelihood) step whose logged values differ, timings
    aside; else the held-out evaluation; None when all agree."""
    from experiments.chains_check import first_difference

    def chain(name, losses, ul=(0.5,), heldout=1.25):
        d = tmp_path / name
        d.mkdir()
        (d / "pretrain_history.json").write_text(json.dumps(
            [{"step": i, "loss": x, "elapsed_s": 1.0 + i + len(name)} for i, x in enumerate(losses)]))
        (d / "unloop_history.json").write_text(json.dumps([{"step": i, "ul": x} for i, x in enumerate(ul)]))
        (d / "heldout.json").write_text(json.dumps({"target_loss": heldout, "unloop_s": 9.0 + len(name),
                                                     "before_unloop": {"target_loss": 2.0}}))
        return d

    a = chain("a", [9.0, 5.0, 4.0])
    assert first_difference(a, chain("same", [9.0, 5.0, 4.0])) is None
    assert first_difference(a, chain("b", [9.0, 5.5, 4.5])) == "pretrain step 1: loss 5.0 vs 5.5"
    assert first_difference(a, chain("c", [9.0, 5.0, 4.0], ul=(0.25,))) == "unloop step 0: ul 0.5 vs 0.25"
    assert first_difference(a, chain("d", [9.0, 5.0, 4.0], heldout=1.5)) == \
        "held-out evaluation: target_loss 1.25 vs 1.5"


def test_the_training_helper_runs_and_is_bit_reproducible_on_cpu(tmp_path):
    """The GPU test's helper end to end on CPU (eager: Inductor's CPU compile is minutes here): two runs, equal bits."""
    a = _drafter_weights(tmp_path / "a", "fixed", "cpu", "off")
    b = _drafter_weights(tmp_path / "b", "fixed", "cpu", "off")
    assert len(a) > 10 and all(torch.equal(a[k], b[k]) for k in a)


@cuda
def test_drafter_training_with_fixed_kernels_is_the_same_alone_and_under_load(tmp_path):
    """Alone twice, then under load: every weight equal. Without PyTorch's deterministic algorithms (part of the fixed
    kernels) the first comparison fails on an H100: 34 of 53 tensors differ, by up to 6e-6 after four steps (atomic
    adds in a backward pass)."""
    a = _drafter_weights(tmp_path / "a", "fixed")
    b = _drafter_weights(tmp_path / "b", "fixed")
    same = [k for k in a if torch.equal(a[k], b[k])]
    assert len(same) == len(a), f"not bit-reproducible alone: {len(a) - len(same)} of {len(a)} tensors differ"
    with Busy():
        c = _drafter_weights(tmp_path / "c", "fixed")
    diff = [k for k in a if not torch.equal(a[k], c[k])]
    assert not diff, f"under load {len(diff)} of {len(a)} tensors differ, e.g. {diff[:3]}"


@cuda
def test_two_processes_pretrain_the_same_target(tmp_path):
    """`dmtp pipeline --stage target` on the same corpus and tokenizer in processes of their own: the first compiling
    into an empty cache, the second reading it alone, then two at once (`experiments/chains_check.py --k 1,2 --stages
    target`, a reduced `mini`: 2 M tokens, 10 unlikelihood steps, every step logged): the target's and MTP head's
    weights are the same bits in all four. A failure names which chains differ (the cold one alone: the compiler; all:
    the kernels), the first logged step where each parted and the ops PyTorch warned about."""
    from experiments import chains_check

    res = chains_check.main(["--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--k", "1,2",
                             "--stages", "target", "--set", "pretrain.tokens=2000000",
                             "--set", "pretrain.unloop_steps=10", "--set", "pretrain.log_every=1"])
    assert not res["failed"], res["failed"]
    assert not res["differing"], (res["first_difference"], res["warned"], res["differing"])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_identical_generate_commands_give_identical_records(tmp_path, temperature):
    """The compile-cache check's shape (random 8-layer 1024-wide target, a random drafter, 12 prompts, bf16), decoded
    by `dmtp generate` in a cold process, a warm one, a process with a fresh cache beside a busy process, and one
    process twice: every record equal, greedy and sampled (the data stage samples at 0.8)."""
    from experiments import determinism_check

    res = determinism_check.main(["--out", str(tmp_path), "--max-new-tokens", "32",
                                  "--temperature", str(temperature)])
    assert res["identical"], res["comparisons"]


def _pretrain_weights(tmp, load: bool = False) -> dict[str, torch.Tensor]:
    """Eight compiled pretraining steps of a 4-layer target of `mini`'s width and window (512 tokens: attention's
    backward sums a query block's gradient over four key blocks, where 256 tokens' two sum alike in either order) with
    fixed kernels: its weights."""
    from dmtp.config.training import TargetArch
    from dmtp.training.pretrain import build_target, pretrain

    arch = TargetArch(hidden_size=384, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                      intermediate_size=1024, max_position_embeddings=1024)
    cfg = PretrainConfig(tokens=8 * 8 * 512, seq_len=512, batch_size=8, eval_tokens=512, log_every=4,
                         kernels="fixed")
    toks = torch.randint(2, 4000, (200_000,), generator=torch.Generator().manual_seed(0)).numpy()
    torch.manual_seed(0)
    tgt, mtp = build_target(arch, 4096, 0)
    tgt.model.to("cuda")
    mtp.to("cuda")
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        pretrain(tgt, mtp, toks, cfg, tmp, log=lambda *_: None)
    return {k: v.detach().float().cpu().clone() for k, v in list(tgt.model.state_dict().items())
            + [(f"mtp.{k}", v) for k, v in mtp.state_dict().items()]}


@cuda
def test_pretraining_with_fixed_kernels_is_the_same_alone_and_under_load(tmp_path):
    """Eight pretraining steps alone twice, then under load: every weight of the target and its MTP head equal."""
    a = _pretrain_weights(tmp_path / "a")
    b = _pretrain_weights(tmp_path / "b")
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert not diff, f"not bit-reproducible alone: {len(diff)} of {len(a)} tensors differ, e.g. {diff[:3]}"
    with Busy():
        c = _pretrain_weights(tmp_path / "c")
    diff = [k for k in a if not torch.equal(a[k], c[k])]
    assert not diff, f"under load {len(diff)} of {len(a)} tensors differ, e.g. {diff[:3]}"
