"""The engine on a GPU (skipped without CUDA): CUDA-graphed rounds of the compiled engine (the default on CUDA) are
lossless and equal the eager loop, the steady state never synchronises with the host, bf16 decoding differs from the
engine's own bf16 AR only at top-2 ties, hybrid targets decode losslessly (HF layers), the flex-attention drafter
backend proposes what the dense-mask backend proposes, and the verify modes (sampled drafts, speculative sampling,
block verification) run inside the graphs without a sync and keep the target's law. Training on a GPU: the compiled
pretraining and drafter-training paths (flex block mask with its backward pass) follow the eager ones; the fused
chunked LM-head loss (compiled chunk step) gives the materialised logits' loss and gradients, in fp32 and bf16; FSDP2
drafter training in a process group of one (nccl) follows the single-process path, its bf16 policy computing in bf16
on fp32 master weights and AdamW state."""
import dataclasses

import numpy as np
import pytest
import torch
from conftest import compiled_graphs, make_drafter

from dmtp.config.ablation import code
from dmtp.config import EngineConfig as LibraryEngine
from dmtp.engine import decode, server
from dmtp.engine.decode import Batch
from dmtp.engine.slots import capacity_for
from dmtp.engine.methods import build_method, method_class
from dmtp.models import fast, tiny
from dmtp.models.attention import flex_mask
from dmtp.training.drafters import (
    TrainConfig,
    block_loss,
    drafter_loss,
    drafters_loss,
    extract,
    new_drafters,
    sample_anchors,
    train_drafters,
)
from dmtp.training.pretrain import PretrainConfig, TargetArch, build_target, pretrain

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# These tests decode on the library's default kernel choices (`tuning = "fixed"`); autotuning costs 25-75 s of
# compilation per method and shape on these models, and test_autotuned_kernels_are_lossless covers it.
@dataclasses.dataclass(frozen=True)
class EngineConfig(LibraryEngine):
    tuning: str = "fixed"


def untuned(engine):
    """An engine argument (None, an engine name or a config) with the fixed kernel choices unless it names others."""
    return EngineConfig(engine=engine or "auto") if engine is None or isinstance(engine, str) else engine


def generate(*args, engine=None, **kw):
    return decode.generate(*args, engine=untuned(engine), **kw)


def serve(*args, engine=None, **kw):
    return server.serve(*args, engine=untuned(engine), **kw)


def Server(*args, engine=None, **kw):
    return server.Server(*args, engine=untuned(engine), **kw)


PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60, 70, 80, 90], [33]]
METHODS = ["ar", "mtp", "dflash", "zero_init_residual", "token_only", "mtp_context", "dflash2", "dmtp_d2"]


def on_cuda(arch):
    tgt, mtp = tiny.build(arch, seed=0)
    tgt.model.cuda()
    mtp.cuda()
    return tgt, mtp


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3"])
def gpu_models(request):
    return on_cuda(request.param)


def method(name, tgt, mtp, **kw):
    if not method_class(name).needs_drafter:
        return build_method(name, tgt, mtp=mtp)
    variant, backbone = {"dflash2": ("dflash", "dflash2"), "dmtp_d2": ("zero_init_residual", "dflash2")}.get(
        name, (name, "dflash"))
    d = make_drafter(tgt, variant, backbone=backbone, **kw).cuda()
    return build_method(variant, tgt, drafter=d, mtp=mtp)


def hf(tgt, p, n, eos=None):
    out = tgt.model.generate(torch.tensor([p], device="cuda"), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=0)
    return out[0, len(p):].tolist()


@pytest.mark.parametrize("name", METHODS)
def test_graphed_rounds_are_lossless(gpu_models, name):
    tgt, mtp = gpu_models
    ref = [hf(tgt, p, 37) for p in PROMPTS]
    m = method(name, tgt, mtp)
    b = Batch(tgt, m, PROMPTS, 0.0, 4, set(), None)
    drafter = getattr(m, "drafter", None)  # DFlash drafters compile only where fast.drafter_problem allows
    assert b.engine == "compiled" and b.cache.fast
    assert b.compile == (drafter is None or fast.drafter_problem(drafter) is None) and b.compile == m.compiles(b.eng)
    res = generate(tgt, m, PROMPTS, 0.0, 37)
    assert [r.output_ids for r in res] == ref
    assert [r.output_ids for r in generate(tgt, m, PROMPTS, 0.0, 37, engine="hf")] == ref
    eager = generate(tgt, m, PROMPTS, 0.0, 37, engine=EngineConfig(graphs=False))
    assert [r.accepted for r in eager] == [r.accepted for r in res]
    eos = ref[0][5]
    for cap in (1, 3):
        got = serve(tgt, m, PROMPTS + [[7, 7, 7], [60]], cap, 0.0, 25, eos_ids=[eos])
        assert [r.output_ids for r in got] == [hf(tgt, p, 25, eos) for p in PROMPTS + [[7, 7, 7], [60]]]


@pytest.mark.parametrize("write", ["eager", "auto"])
@pytest.mark.parametrize("name", ["ar", "mtp", "dflash", "zero_init_residual"])
def test_dense_kernel_rounds_are_lossless(gpu_models, name, write):
    """The dense attention kernel (bench's "+dense" rows), with the K/V write outside the graphs ("eager") and inside
    them ("auto" with this kernel: exact in the H200 repro, wrong with flex attention), the prompt pass on fast.py's
    compiled layers too: graphed rounds equal HF greedy and the eager loop's accept counts, through `generate` and
    `serve` (newcomers admitted in groups of two)."""
    tgt, mtp = gpu_models
    ref = [hf(tgt, p, 37) for p in PROMPTS]
    m = method(name, tgt, mtp)
    eng = EngineConfig(attention="dense", cache_write=write, prefill="compiled", admit=2)
    res = generate(tgt, m, PROMPTS, 0.0, 37, engine=eng)
    assert [r.output_ids for r in res] == ref
    got = serve(tgt, m, PROMPTS + [[7, 7, 7], [60]], 3, 0.0, 25, engine=eng)
    assert [r.output_ids for r in got] == [hf(tgt, p, 25) for p in PROMPTS + [[7, 7, 7], [60]]]
    eager = generate(tgt, m, PROMPTS, 0.0, 37, engine=eng.with_(graphs=False))
    assert [r.accepted for r in eager] == [r.accepted for r in res]


@pytest.mark.parametrize("name", ["ar", "mtp", "zero_init_residual"])
def test_graphed_prompt_pass_is_lossless(gpu_models, name):
    """`EngineConfig.prefill = "graphed"`: a server's newcomers prefilled from CUDA graphs of their (group, length)
    bucket decode as HF greedy does (fp32), the graphs are captured (no fallback) and replayed by a second group."""
    tgt, mtp = gpu_models
    prompts = PROMPTS + [[7, 7, 7], [60], list(range(3, 80)), [12, 13, 14, 15]]
    ref = [hf(tgt, p, 25) for p in prompts]
    eng = EngineConfig(attention="dense", prefill="graphed", admit=2)
    srv = Server(tgt, method(name, tgt, mtp), 3, capacity_for(prompts, 25, 7), 0.0, 25, engine=eng)
    for _ in range(2):
        assert [r.output_ids for r in srv.run(prompts)] == ref
    pp = srv.prompt_pass
    assert pp.failed is None and pp.captured == len(pp.met) >= 2 and srv.groups >= 4
    ready = Server(tgt, method(name, tgt, mtp), 3, capacity_for(prompts, 25, 7), 0.0, 25, engine=eng)
    n = ready.prepare(max(len(p) for p in prompts))  # every bucket captured at start-up: none while serving
    assert n == len(ready.prompt_pass.met) >= 6  # groups 1, 2, 3 x lengths 64, 128
    got = ready.run(prompts)
    assert [r.output_ids for r in got] == ref and ready.prompt_pass.captured == n
    # the method's prefill from its bucket graph leaves the state its own prefill leaves: the same drafts (accept
    # counts) as a server on the compiled prompt pass, up to fp32 near-ties that the padded shapes may move
    comp = serve(tgt, method(name, tgt, mtp), prompts, 3, 0.0, 25, engine=eng.with_(prefill="compiled"))
    same = sum(a.accepted == b.accepted for a, b in zip(got, comp))
    assert same >= len(prompts) - 1, (same, len(prompts))


@pytest.mark.parametrize("beside, flight", [(0, 2), (2, 2), (2, 1)])
@pytest.mark.parametrize("name", ["ar", "mtp", "zero_init_residual"])
def test_a_ready_server_serves_without_a_sync(gpu_models, name, beside, flight):
    """Dynamic batching in steady state (a server whose round graphs and graphed prompt pass are captured) issues no
    synchronising CUDA call while it serves: newcomers are admitted (pinned non-blocking copies, their first tokens
    queued to the host like a round's), finished records are copied out without waiting, and copies about a slot's
    former occupant are skipped by generation. Only the group's end waits, on events. The outputs stay HF greedy's,
    the next newcomers prefilled beside the decode on a second stream (`admit_beside`) and one round copy in flight
    (`in_flight`) included."""
    tgt, mtp = gpu_models
    prompts = PROMPTS + [[7, 7, 7], [60], list(range(3, 80)), [12, 13, 14, 15]]
    eos = hf(tgt, PROMPTS[0], 25)[5]  # some requests end early: slots freed at different rounds
    ref = [hf(tgt, p, 25, eos) for p in prompts]
    eng = EngineConfig(attention="dense", prefill="graphed", admit=2, admit_beside=beside, in_flight=flight)
    srv = Server(tgt, method(name, tgt, mtp), 3, capacity_for(prompts, 25, 7), 0.0, 25, eos_ids=[eos], engine=eng)
    if beside:  # the round graphs, the prompt pass's graphs and the stream it replays on: three CUDA streams (cuBLAS
        # workspaces, `graphs.py`)
        from dmtp.engine.graphs import capture_stream
        streams = (capture_stream(tgt.device), srv.prompt_pass.graphs.stream, srv.side)
        assert len({s.cuda_stream for s in streams}) == 3
    srv.prepare(max(len(p) for p in prompts))
    assert [r.output_ids for r in srv.run(prompts)] == ref  # the round graphs captured
    groups = srv.groups
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = srv.run(prompts[::-1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [r.output_ids for r in got] == ref[::-1]
    assert srv.groups - groups >= 3 and srv.admit_s > 0 and (srv.beside_s > 0) == bool(beside)


def test_newcomers_beside_the_decode_keep_the_target_law():
    """T = 2 through a ready server whose newcomers are prefilled on a second stream (`admit_beside`) in groups while
    the others decode: 2000 samples of the first 3 tokens, chi-square of every position's marginal against the exact
    law. (Which round a group joins at follows when the host sees requests finish, which depends on timing: a
    server's draws are not the same from run to run, each of them is a draw of the target's law.)"""
    from test_verify import chi2_pvalue, position_laws

    tgt, mtp = on_cuda("qwen3")
    marg, _ = position_laws(tgt, [5, 7, 9], 2.0)
    m = method("zero_init_residual", tgt, mtp)
    prompts = [[5, 7, 9]] * 2000
    eng = EngineConfig(attention="dense", prefill="graphed", admit=4, admit_beside=2)
    srv = Server(tgt, m, 16, capacity_for(prompts, 3, m.k), 2.0, 3, seed=5, engine=eng)
    srv.prepare(3)
    seqs = np.array([r.output_ids for r in srv.run(prompts)])
    assert srv.beside_s > 0 and srv.groups > 100
    for pos in range(3):
        pv = chi2_pvalue(np.bincount(seqs[:, pos], minlength=tgt.vocab_size), marg[pos] * len(seqs))
        assert pv > 1e-4, (pos, pv)


@pytest.mark.parametrize("kernel", ["flex", "dense"])
@pytest.mark.parametrize("name", ["ar", "zero_init_residual"])
def test_autotuned_kernels_are_lossless(gpu_models, name, kernel):
    """Inductor's autotuned kernels (`EngineConfig.tuning = "autotune"`, bench's "+tuned" rows: 1.22x the default engine
    at the 8B shape, batch 1) keep fp32 graphed rounds equal to HF greedy through `generate` and `serve`."""
    tgt, mtp = gpu_models
    ref = [hf(tgt, p, 37) for p in PROMPTS]
    m = method(name, tgt, mtp)
    eng = EngineConfig(attention=kernel, tuning="autotune")
    assert [r.output_ids for r in generate(tgt, m, PROMPTS, 0.0, 37, engine=eng)] == ref
    got = serve(tgt, m, PROMPTS + [[7, 7, 7], [60]], 3, 0.0, 25, engine=eng)
    assert [r.output_ids for r in got] == [hf(tgt, p, 25) for p in PROMPTS + [[7, 7, 7], [60]]]


@pytest.mark.parametrize("name", ["mtp", "dflash", "zero_init_residual", "dmtp_d2"])
def test_sampling_graphed_equals_eager(gpu_models, name):
    """T = 1: sampling stays outside the graphs on the batch's generator, so graphed and eager loops draw the same
    tokens from the same seed."""
    tgt, mtp = gpu_models
    m = method(name, tgt, mtp)
    res = generate(tgt, m, PROMPTS * 3, 1.0, 30, seed=7)
    eager = generate(tgt, m, PROMPTS * 3, 1.0, 30, seed=7, engine=EngineConfig(graphs=False))
    assert [r.output_ids for r in res] == [r.output_ids for r in eager]


@pytest.mark.parametrize("name", ["ar", "mtp", "dflash", "zero_init_residual"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_steady_state_never_syncs(gpu_models, name, temperature):
    """After the first round (prefill, capture), a round issues no synchronising CUDA call: the host reads the done
    flags from pinned copies of earlier rounds (`Batch.poll`)."""
    tgt, mtp = gpu_models
    b = Batch(tgt, method(name, tgt, mtp), PROMPTS, temperature, 200, set(), torch.Generator("cuda").manual_seed(0))
    b.step()
    assert b.graphs.enabled and "verify" in b.graphs.graphs
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(6):
            b.step()
            b.poll()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(len(r.output_ids) >= 7 for r in b.results)


@pytest.mark.parametrize("arch", ["qwen3_5_hybrid", "qwen3_5_moe"])
def test_hybrid_targets_on_gpu(arch):
    tgt, mtp = on_cuda(arch)
    ref = [hf(tgt, p, 20) for p in PROMPTS]
    for name in ("ar", "mtp", "dflash", "zero_init_residual"):
        m = method(name, tgt, mtp)
        assert [r.output_ids for r in generate(tgt, m, PROMPTS, 0.0, 20)] == ref, name
        got = serve(tgt, m, PROMPTS, 2, 0.0, 20)
        assert [r.output_ids for r in got] == ref, name


def test_flex_backend_proposes_what_sdpa_proposes(gpu_models):
    tgt, mtp = gpu_models
    runs = []
    for backend in ("sdpa", "flex"):  # the drafter's own backends: the loop on the HF layers (the compiled engine
        m = method("zero_init_residual", tgt, mtp, attn_backend=backend)  # has its own drafter attention)
        res = generate(tgt, m, PROMPTS, 0.0, 30, engine="hf")
        runs.append(([r.output_ids for r in res], [r.accepted for r in res]))
    assert runs[0] == runs[1]
    assert runs[0][0] == [hf(tgt, p, 30) for p in PROMPTS]


def test_server_captures_once(gpu_models):
    tgt, mtp = gpu_models
    srv = Server(tgt, method("zero_init_residual", tgt, mtp), cap=2, capacity=80, max_new_tokens=30)
    srv.run(PROMPTS[:2])
    graphs = dict(srv.batch.graphs.graphs)
    assert set(graphs) == {"t1_prep", "drafter", "verify", "accept", "mtp", "drafter_ctx", "advance"}
    got = srv.run(PROMPTS)
    assert [r.output_ids for r in got] == [hf(tgt, p, 30) for p in PROMPTS]
    assert all(srv.batch.graphs.graphs[k] is graphs[k] for k in graphs)


@pytest.mark.parametrize("name", ["mtp", "dflash", "zero_init_residual", "dmtp_d2"])
@pytest.mark.parametrize("verify", ["sample", "block"])
def test_verify_modes_graphed_equal_eager(gpu_models, name, verify):
    """Sampled drafts and their acceptance run inside the CUDA graphs on randomness drawn before the round: graphed and
    eager loops emit the same tokens and accept counts from the same seed; at T = 0 the mode is greedy."""
    tgt, mtp = gpu_models
    m = method(name, tgt, mtp)
    res = generate(tgt, m, PROMPTS * 3, 1.0, 30, seed=7, verify=verify)
    eager = generate(tgt, m, PROMPTS * 3, 1.0, 30, seed=7, verify=verify, engine=EngineConfig(graphs=False))
    assert [r.output_ids for r in res] == [r.output_ids for r in eager]
    assert [r.accepted for r in res] == [r.accepted for r in eager]
    greedy = generate(tgt, m, PROMPTS, 0.0, 37, verify=verify)
    assert [r.output_ids for r in greedy] == [hf(tgt, p, 37) for p in PROMPTS]
    got = serve(tgt, m, PROMPTS + [[7, 7, 7], [60]], 2, 1.0, 25, seed=3, verify=verify)
    assert all(1 <= len(r.output_ids) <= 25 for r in got)


@pytest.mark.parametrize("name", ["mtp", "dflash", "zero_init_residual", "dmtp_d2"])
@pytest.mark.parametrize("verify", ["sample", "block"])
def test_verify_modes_never_sync(gpu_models, name, verify):
    """Steady-state rounds with sampled drafts and speculative / block acceptance issue no synchronising CUDA call,
    also while the host matches stop strings on each round's tokens (a stop that never occurs)."""
    from test_stops import TABLE

    from dmtp.engine.stops import StopStrings

    tgt, mtp = gpu_models
    b = Batch(tgt, method(name, tgt, mtp), PROMPTS, 1.0, 200, set(), torch.Generator("cuda").manual_seed(0),
              stop=StopStrings(["\n#"], TABLE), verify=verify)
    b.step()
    assert b.graphs.enabled and {"verify", "accept", "drafter"} <= set(b.graphs.graphs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(6):
            b.step()
            b.poll()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(len(r.output_ids) >= 7 for r in b.results)


@pytest.mark.parametrize("name", ["mtp", "zero_init_residual", "dmtp_d2"])
def test_verify_modes_keep_the_target_law_on_gpu(name):
    """Through the graphed engine: 4000 samples of the first 3 tokens at T = 2 per mode, chi-square of every
    position's marginal against the exact law (as tests/test_verify.py does on CPU)."""
    from test_verify import chi2_pvalue, position_laws

    tgt, mtp = on_cuda("qwen3_5")
    marg, _ = position_laws(tgt, [5, 7, 9], 2.0)
    m = method(name, tgt, mtp)
    for verify in ("sample", "block"):
        res = generate(tgt, m, [[5, 7, 9]] * 4000, 2.0, 3, seed=5, verify=verify)
        seqs = np.array([r.output_ids for r in res])
        for pos in range(3):
            pv = chi2_pvalue(np.bincount(seqs[:, pos], minlength=tgt.vocab_size), marg[pos] * len(seqs))
            assert pv > 1e-4, (name, verify, pos, pv)


MINI_ENGINE = EngineConfig(attention="dense", prefill="compiled", admit=2, dtype="bf16")  # `mini`'s settings


@pytest.mark.parametrize("engine", ["compiled", "hf", MINI_ENGINE], ids=["compiled", "hf", "mini"])
def test_bf16_divergences_are_top2_ties(engine):
    """bf16: every method's output equals the engine's own bf16 AR, or first differs where the target's two best
    logits (an uncached pass over the shared prefix) are within bf16 rounding of each other (`lossless.TIE`); `mini`'s
    engine (dense kernel, K/V written in the graphs, compiled prompt pass) too."""
    from dmtp.analysis.lossless import first_divergence

    tgt, mtp = tiny.build("qwen3", seed=0, dtype=torch.bfloat16)
    tgt.model.cuda()
    mtp.cuda()
    prompts = [[i, (3 * i + 1) % tgt.vocab_size, 7] for i in range(5, 37)]  # ids inside the tiny vocabulary
    ar = generate(tgt, build_method("ar", tgt), prompts, 0.0, 40, engine=engine)
    same = 0
    for name in ("mtp", "dflash", "zero_init_residual"):
        d = make_drafter(tgt, name).to("cuda", torch.bfloat16) if name != "mtp" else None
        res = generate(tgt, build_method(name, tgt, drafter=d, mtp=mtp), prompts, 0.0, 40, engine=engine)
        for p, a, r in zip(prompts, ar, res):
            i = first_divergence(a.output_ids, r.output_ids)
            same += i is None
            if i is not None:
                top = tgt.features(torch.tensor([p + a.output_ids[:i]], device="cuda")).logits[0, -1].topk(2).values
                assert float(top[0] - top[1]) <= 2 ** -5 * max(1.0, float(top[0].abs())), (name, p, i, top)
    assert same >= len(prompts) * 3 // 2


def test_compiled_engine_large_batch_sampling():
    """The data stage's kind of work (one large batch, T > 0) on the compiled engine: graphed equals eager from the
    same seed, and greedy outputs inside a large batch equal HF's."""
    tgt, mtp = on_cuda("qwen3_5")
    prompts = [[i % 90 + 3, (7 * i) % 90 + 3] for i in range(256)]
    m = build_method("ar", tgt)
    res = generate(tgt, m, prompts, 0.8, 24, seed=3)
    greedy = generate(tgt, m, prompts, 0.0, 24)
    eager = generate(tgt, m, prompts, 0.8, 24, seed=3, engine=EngineConfig(graphs=False))
    assert [r.output_ids for r in res] == [r.output_ids for r in eager]
    assert [r.output_ids for r in greedy[:4]] == [hf(tgt, p, 24) for p in prompts[:4]]


# --- compiled training (dmtp.training): the GPU paths against the eager ones ---------------------------------------
def _train_drafters(tgt, mtp, names, flag, out, one_region=True, prepare=None, **kw):
    """4 logged steps of tiny drafters side by side on 12 random sequences (fp32 unless `kw` says otherwise;
    `prepare`: called with the drafters before they train)."""
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1, selector_topk=8, selector_dim=16)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 96, (int(n),), generator=g).tolist() for n in torch.randint(14, 40, (12,), generator=g)]
    cfg = TrainConfig(**{**dict(steps=4, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1, save_every=100,
                                compile=flag, one_region=one_region), **kw})
    ds = new_drafters(tgt, names, base, backbones=code().backbones)
    if prepare is not None:
        prepare(ds)
    return train_drafters(tgt, mtp, ds, seqs, cfg, out, log=lambda *_: None)


@pytest.mark.parametrize("flag", ["off", "on"])
def test_fsdp_on_one_gpu_follows_the_single_process_path(tmp_path, flag):
    """FSDP2 at world size 1 (`fsdp="on"`: a process group of one, nccl), eager and with its layers compiled (flex
    block masks). In fp32: the single-process path's losses (rel 1e-4: one device, the same math, other kernel
    boundaries). With amp_bf16: its MixedPrecisionPolicy runs every layer with bf16 weights and bf16 output while the
    parameters and the AdamW state (the checkpoint of a run stopped after step 2) stay fp32, and the resumed run's
    losses follow the single-process bf16-autocast path within bf16 rounding (rel 2e-2: FSDP2 rounds the weights
    themselves to bf16, the norms' scales included, where autocast keeps elementwise weights fp32; 2^-8 = 0.4 % a
    rounding, a few of them carried through 4 steps)."""
    tgt, mtp = on_cuda("qwen3_5")
    names = ["dflash", "zero_init_residual", "dmtp_d2"]
    ref = _train_drafters(tgt, mtp, names, flag, tmp_path / "ref")
    run = _train_drafters(tgt, mtp, names, flag, tmp_path / "fsdp", fsdp="on")
    for n in names:
        assert [h["loss"] for h in run[n]] == pytest.approx([h["loss"] for h in ref[n]], rel=1e-4), n
    seen = []

    def watch(ds):  # each layer's weight and output dtypes inside its forward
        for d in ds.values():
            for layer in d.layers:
                layer.register_forward_hook(lambda m, a, out: seen.append((m.mlp.gate_proj.weight.dtype, out.dtype)))

    ref = _train_drafters(tgt, mtp, names, flag, tmp_path / "ref16", amp_bf16=True)
    _train_drafters(tgt, mtp, names, flag, tmp_path / "fsdp16", prepare=watch, amp_bf16=True, fsdp="on",
                    stop_after=2)
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}
    for n in names:
        state = torch.load(tmp_path / "fsdp16" / n / "trainer_state.pt", weights_only=True)
        assert state["step"] == 2 and all(v.dtype == torch.float32 for v in state["model"].values())
        moments = [v for st in state["opt"]["state"].values() for k, v in st.items() if k != "step"]
        assert moments and all(v.dtype == torch.float32 for v in moments)
    run = _train_drafters(tgt, mtp, names, flag, tmp_path / "fsdp16", amp_bf16=True, fsdp="on")
    for n in names:
        assert [h["step"] for h in run[n]] == [1, 2, 3, 4]
        assert [h["loss"] for h in run[n]] == pytest.approx([h["loss"] for h in ref[n]], rel=2e-2), n


@pytest.mark.parametrize("one_region", [True, False])
def test_compiled_drafter_training_follows_eager_on_gpu(tmp_path, one_region):
    """Both block layouts (8 slots from A, 7 from T1) and DMTP(D2) through the GPU's compiled path (flex block masks
    with their backward pass, fused AdamW) follow the eager dense-mask path in fp32 step by step: every drafter in one
    compiled graph with one AdamW step, or (one_region=False) a compiled block_loss per drafter, one graph per
    backbone and block size."""
    tgt, mtp = on_cuda("qwen3_5")
    names = ["dflash", "zero_init_residual", "token_only", "t1_residual", "dmtp_d2"]
    eager = _train_drafters(tgt, mtp, names, "off", tmp_path / "off")
    fn = drafters_loss if one_region else block_loss
    graphs = compiled_graphs(fn)
    comp = _train_drafters(tgt, mtp, names, "on", tmp_path / "on", one_region)
    assert compiled_graphs(fn) - graphs == (1 if one_region else 3)
    for n in names:
        assert [h["loss"] for h in comp[n]] == pytest.approx([h["loss"] for h in eager[n]], rel=1e-3), n
        assert [h["acc"] for h in comp[n]] == pytest.approx([h["acc"] for h in eager[n]], abs=0.02), n


def test_flex_training_mask_gives_the_dense_gradients():
    """One drafter step: the loss and every gradient through the flex block mask (flex attention's backward pass)
    equal the dense mask's, in fp32, for both block layouts and a window shorter than the context."""
    tgt, mtp = on_cuda("qwen3_5")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, tgt.vocab_size, (2, 40), generator=g)
    lengths = torch.tensor([40, 31])
    anchors, valid = sample_anchors(lengths, 6, g)
    ids, lengths, anchors, valid = (x.cuda() for x in (ids, lengths, anchors, valid))
    for name, window in [("zero_init_residual", 4096), ("token_only", 9)]:
        d = make_drafter(tgt, name, window=window).cuda().train()
        feats = extract(tgt, mtp, ids, lengths, d.config.target_layer_ids, True)
        runs = []
        for mask in (None, flex_mask(anchors, d.layout.slots, ids.shape[1], window)):
            d.zero_grad(set_to_none=True)
            loss, _ = drafter_loss(d, tgt, feats, anchors, valid, 4.0, mask=mask)
            loss.backward()
            runs.append((loss.detach(), {k: p.grad.clone() for k, p in d.named_parameters() if p.grad is not None}))
        (l0, g0), (l1, g1) = runs
        torch.testing.assert_close(l1, l0, rtol=1e-4, atol=1e-6)
        assert g0.keys() == g1.keys()
        for k in g0:
            torch.testing.assert_close(g1[k], g0[k], rtol=1e-3, atol=1e-5, msg=f"{name} {k}")


def test_compiled_pretraining_follows_eager_on_gpu(tmp_path):
    """The compiled pretraining step (SDPA is_causal, fused AdamW, pinned batches) follows the eager one in fp32."""
    arch = TargetArch(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, intermediate_size=256)
    tokens = np.random.default_rng(0).integers(1, 256, 50_000).astype(np.int64)
    runs = {}
    for flag in ("off", "on"):
        torch.manual_seed(0)
        tgt, mtp = build_target(arch, vocab_size=256, eos_id=0)
        tgt.model.cuda()
        mtp.cuda()
        cfg = PretrainConfig(tokens=6 * 8 * 64, seq_len=64, batch_size=8, log_every=1, bf16=False, compile=flag)
        hist, info = pretrain(tgt, mtp, tokens, cfg, tmp_path / flag, log=lambda *_: None)
        assert info["compiled"] == (flag == "on")
        runs[flag] = hist
    for key in ("loss", "mtp_loss"):
        assert [h[key] for h in runs["on"]] == pytest.approx([h[key] for h in runs["off"]], rel=1e-4), key


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_loss_on_gpu(autocast):
    """The fused chunked loss through its Inductor-compiled chunk step (the pretraining shape's width and vocabulary,
    a short last chunk) against the materialised logits: fp32 to float rounding; under bf16 autocast the loss within
    1e-3 and the gradients within 1e-2 (relative), as on the CPU (test_losses.py)."""
    import torch.nn.functional as F

    from dmtp.training.losses import linear_cross_entropy

    g = torch.Generator("cuda").manual_seed(0)
    h = torch.randn(3000, 384, device="cuda", generator=g).requires_grad_()
    w = (0.05 * torch.randn(8192, 384, device="cuda", generator=g)).requires_grad_()
    y = torch.randint(0, 8192, (3000,), device="cuda", generator=g)
    runs = []
    for fused in (False, True):
        h.grad = w.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            if fused:
                loss, acc = linear_cross_entropy(h, w, y, chunk=1024)
            else:
                z = F.linear(h, w).float()
                loss, acc = F.cross_entropy(z, y), (z.argmax(-1) == y).float().mean()
        loss.backward()
        runs.append((loss.item(), acc.item(), h.grad.clone(), w.grad.clone()))
    (l0, a0, gh0, gw0), (l1, a1, gh1, gw1) = runs
    tol = (1e-3, 1e-2) if autocast else (1e-5, 1e-4)
    assert l1 == pytest.approx(l0, rel=tol[0]) and a1 == pytest.approx(a0, abs=2 / 3000)
    for got, ref in ((gh1, gh0), (gw1, gw0)):
        assert ((got - ref).norm() / ref.norm()).item() < tol[1]


def test_fused_loss_pretraining_on_gpu(tmp_path):
    """The compiled bf16 step with the fused loss follows the compiled bf16 step with the materialised logits."""
    arch = TargetArch(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, intermediate_size=256)
    tokens = np.random.default_rng(0).integers(1, 2048, 50_000).astype(np.int64)
    runs = {}
    for fused in ("off", "on"):
        torch.manual_seed(0)
        tgt, mtp = build_target(arch, vocab_size=2048, eos_id=0)
        tgt.model.cuda()
        mtp.cuda()
        cfg = PretrainConfig(tokens=6 * 8 * 64, seq_len=64, batch_size=8, log_every=1, compile="on", fused_ce=fused,
                             ce_chunk=200)  # 504 tokens a head: chunks 200, 200, 104
        hist, info = pretrain(tgt, mtp, tokens, cfg, tmp_path / fused, log=lambda *_: None)
        assert info["fused_ce"] == (fused == "on")
        runs[fused] = hist
    for key in ("loss", "mtp_loss"):
        assert [h[key] for h in runs["on"]] == pytest.approx([h[key] for h in runs["off"]], rel=1e-2), key


@pytest.mark.parametrize("name", ["ar", "mtp", "dflash", "zero_init_residual"])
def test_stop_strings_on_gpu(gpu_models, name):
    """Stop strings matched on the host from the pinned copies of each round's tokens: records cut exactly (graphed
    generate, serve), and rounds during which stops are found and rows ended never synchronise."""
    from test_stops import TABLE, reference_cut

    from dmtp.engine.stops import StopStrings

    tgt, mtp = gpu_models
    refs = [hf(tgt, p, 40) for p in PROMPTS]
    text = b"".join(TABLE[t] for t in refs[0]).decode()
    stops = [text[21:23], "zz"]  # straddles output tokens 10 and 11 of the first request
    keeps = [reference_cut(r, stops) for r in refs]
    m = method(name, tgt, mtp)
    for res in (generate(tgt, m, PROMPTS, 0.0, 40, stop=StopStrings(stops, TABLE)),
                serve(tgt, m, PROMPTS, 2, 0.0, 40, stop=StopStrings(stops, TABLE))):
        assert [(r.output_ids, r.stop_reason) for r in res] == [
            (ref[:keep], "stop") if keep else (ref, "length") for ref, keep in zip(refs, keeps)]
    b = Batch(tgt, m, PROMPTS, 0.0, 40, set(), torch.Generator("cuda").manual_seed(0), stop=StopStrings(stops, TABLE))
    b.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        while not b.finished:
            b.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [r.output_ids for r in b.results] == [ref[:keep] if keep else ref for ref, keep in zip(refs, keeps)]


class _Recording:
    """Mixin for a DrafterMethod: keeps every round's proposal (a copy of the graph's output, taken after the
    stage; no host sync)."""

    def propose(self, st):
        c = super().propose(st)
        self.log.append(c.clone())
        return c


PUBLIC_RULE = dict(window=0, layer_types=["sliding_attention", "full_attention"], sliding_window=5)  # the paper
# profiles' rule (causal sliding layers, then a full-attention one), its window cutting into the context


@pytest.mark.parametrize("name,rule", [("dflash", {}), ("zero_init_residual", {}),
                                       ("zero_init_residual", PUBLIC_RULE)])
def test_fast_drafter_proposes_what_hf_proposes(gpu_models, name, rule):
    """The compiled engine's drafter (`fast.drafter_forward`, the default on CUDA; `EngineConfig.drafter = "hf"`
    switches it off) against the HF drafter path, round by round on the same greedy trajectory: the same drafts, under
    the anchor window and the public rule. On the trained mini drafters the compiled drafter once proposed other drafts
    (DFlash first-token acceptance 0.21 vs 0.86) while the outputs stayed lossless; this is the check that keeps it
    the default."""
    from dmtp.engine.methods import DrafterMethod

    tgt, mtp = gpu_models
    logs = {}
    for engine, path in (("hf", "hf"), ("compiled", "compiled")):
        m = method(name, tgt, mtp, **rule)
        assert type(m) is DrafterMethod
        m.__class__ = type("Rec", (_Recording, DrafterMethod), {})
        m.log = []
        generate(tgt, m, PROMPTS, 0.0, 24, engine=EngineConfig(engine=engine, drafter=path))
        logs[engine] = torch.cat(m.log)
    a, b = logs["hf"], logs["compiled"]
    assert a.shape == b.shape
    assert (a != b).float().mean().item() <= 0.02, f"{int((a != b).sum())} of {a.numel()} drafts differ"


def test_switched_off_compiled_drafter_keeps_drafters_on_hf_and_captures(gpu_models):
    """With `EngineConfig.drafter = "hf"` the compiled engine decodes DFlash drafters on the HF drafter path (and their MTP on
    the HF layer): graphed, lossless, no capture error (a non-compilable method's fast-path MTP once failed to
    capture)."""
    tgt, mtp = gpu_models
    eng = EngineConfig(engine="compiled", drafter="hf")
    for name in ("dflash", "zero_init_residual", "dmtp_d2"):
        m = method(name, tgt, mtp)
        assert fast.drafter_problem(m.drafter, eng) is not None
        ref = [hf(tgt, p, 12) for p in PROMPTS]
        assert [r.output_ids for r in generate(tgt, m, PROMPTS, 0.0, 12, engine=eng)] == ref


def _nan_on_cuda(bad: int = 77):
    """A full-attention tiny target on CUDA whose forward is NaN on prompts holding token `bad` (its embedding row
    NaN), finite on the others."""
    tgt, mtp = on_cuda("qwen3")
    with torch.no_grad():
        tgt.body.embed_tokens.weight[bad] = float("nan")
    return tgt, mtp


@pytest.mark.parametrize("engine", ["compiled", "fast-eager", "hf"])
def test_first_forward_not_finite_is_refused_on_gpu(engine):
    """Every engine on CUDA: a decode whose first forward is NaN is one error, for AR and the MTP method."""
    tgt, mtp = _nan_on_cuda()
    for name in ("ar", "mtp"):
        with pytest.raises(ValueError, match="first forward of a decode .* non-finite logits"):
            generate(tgt, method(name, tgt, mtp), [[5, 77, 9], [4, 8]], 0.0, 12, engine=EngineConfig(engine=engine))


@pytest.mark.parametrize("name", ["ar", "zero_init_residual"])
def test_first_forward_check_adds_no_sync(name):
    """The first-forward check rides on the copies the host already reads: a ready server (graphs captured) admits
    newcomers without a synchronising CUDA call when they are finite, and refuses a NaN newcomer group from the host
    side, still without one (`set_sync_debug_mode("error")` would raise on any)."""
    tgt, mtp = _nan_on_cuda()
    good = PROMPTS + [[7, 7, 7], [60], list(range(3, 70)), [12, 13, 14, 15]]
    eng = EngineConfig(attention="dense", prefill="graphed", admit=2)
    m = method(name, tgt, mtp)
    srv = Server(tgt, m, 3, capacity_for(good + [[77] * 8], 25, 7), 0.0, 25, engine=eng)
    srv.prepare(max(len(p) for p in good))
    ref = [r.output_ids for r in srv.run(good)]  # the round graphs captured
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert [r.output_ids for r in srv.run(good)] == ref
        with pytest.raises(ValueError, match="non-finite logits"):
            srv.run(good[:4] + [[5, 77, 9, 77]] + good[4:])
    finally:
        torch.cuda.set_sync_debug_mode("default")
@pytest.mark.parametrize("flag", ["off", "on"])
def test_accumulation_on_one_gpu_takes_the_whole_batch_step(tmp_path, flag):
    """Gradient accumulation on the GPU paths in fp32 (eager; compiled: the one-region step, and FSDP2 in a group of
    one with its layers compiled and flex masks), 2 micro-batches of 2 against the whole batch of 4 at once: the same
    losses and gradient norms (rel 1e-4, as the FSDP check above: other kernel boundaries); under FSDP2 the
    reduce-scatter after the last micro-batch and after every one alike. DFlash2's selector term is normalised per
    micro-batch (close to, not exactly, the whole batch's), so the exact check takes the plain-CE drafters."""
    tgt, mtp = on_cuda("qwen3_5")
    names = ["dflash", "zero_init_residual"]
    ref = _train_drafters(tgt, mtp, names, flag, tmp_path / "whole")
    runs = {"micro": dict(micro_batch=2), "last": dict(micro_batch=2, fsdp="on", grad_sync="last"),
            "every": dict(micro_batch=2, fsdp="on", grad_sync="every")}
    for key, kw in runs.items():
        run = _train_drafters(tgt, mtp, names, flag, tmp_path / key, **kw)
        for n in names:
            for stat in ("loss", "grad_norm"):
                assert [h[stat] for h in run[n]] == pytest.approx([h[stat] for h in ref[n]], rel=1e-4), (key, n)
