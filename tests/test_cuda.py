"""The engine on a GPU (skipped without CUDA): CUDA-graphed rounds are lossless and equal the eager loop, the steady
state never synchronises with the host, hybrid targets decode losslessly, and the flex-attention drafter backend
proposes what the dense-mask backend proposes."""
import pytest
import torch
from conftest import make_drafter

from dmtp.engine.decode import Batch, Server, build_method, generate, serve
from dmtp.models import tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
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
    if name in ("ar", "mtp"):
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
def test_graphed_rounds_are_lossless(gpu_models, name, monkeypatch):
    tgt, mtp = gpu_models
    ref = [hf(tgt, p, 37) for p in PROMPTS]
    m = method(name, tgt, mtp)
    res = generate(tgt, m, PROMPTS, 0.0, 37)
    assert [r.output_ids for r in res] == ref
    monkeypatch.setenv("DMTP_CUDA_GRAPHS", "0")
    eager = generate(tgt, m, PROMPTS, 0.0, 37)
    assert [r.accepted for r in eager] == [r.accepted for r in res]
    eos = ref[0][5]
    for cap in (1, 3):
        monkeypatch.setenv("DMTP_CUDA_GRAPHS", "1")
        got = serve(tgt, m, PROMPTS + [[7, 7, 7], [60]], cap, 0.0, 25, eos_ids=[eos])
        assert [r.output_ids for r in got] == [hf(tgt, p, 25, eos) for p in PROMPTS + [[7, 7, 7], [60]]]


@pytest.mark.parametrize("name", ["mtp", "dflash", "zero_init_residual", "dmtp_d2"])
def test_sampling_graphed_equals_eager(gpu_models, name, monkeypatch):
    """T = 1: sampling stays outside the graphs on the batch's generator, so graphed and eager loops draw the same
    tokens from the same seed."""
    tgt, mtp = gpu_models
    m = method(name, tgt, mtp)
    res = generate(tgt, m, PROMPTS * 3, 1.0, 30, seed=7)
    monkeypatch.setenv("DMTP_CUDA_GRAPHS", "0")
    eager = generate(tgt, m, PROMPTS * 3, 1.0, 30, seed=7)
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
    for backend in ("sdpa", "flex"):
        m = method("zero_init_residual", tgt, mtp, attn_backend=backend)
        res = generate(tgt, m, PROMPTS, 0.0, 30)
        runs.append(([r.output_ids for r in res], [r.accepted for r in res]))
    assert runs[0] == runs[1]
    assert runs[0][0] == [hf(tgt, p, 30) for p in PROMPTS]


def test_server_captures_once(gpu_models):
    tgt, mtp = gpu_models
    srv = Server(tgt, method("zero_init_residual", tgt, mtp), cap=2, capacity=80, max_new_tokens=30)
    srv.run(PROMPTS[:2])
    graphs = dict(srv.batch.graphs.graphs)
    assert set(graphs) == {"t1_prep", "drafter", "verify", "mtp", "drafter_ctx"}
    got = srv.run(PROMPTS)
    assert [r.output_ids for r in got] == [hf(tgt, p, 30) for p in PROMPTS]
    assert all(srv.batch.graphs.graphs[k] is graphs[k] for k in graphs)


@pytest.mark.parametrize("name", ["ar", "mtp", "dflash", "zero_init_residual"])
def test_fused_graphed_rounds_are_lossless(name, monkeypatch):
    """dmtp.engine.fuse's Triton kernels captured in the decode loop's CUDA graphs: fp32 outputs equal HF greedy, and
    graphed equals eager (accept counts included) with the fusion on."""
    from dmtp.engine.fuse import fuse

    tgt, mtp = on_cuda("qwen3")
    ref = [hf(tgt, p, 37) for p in PROMPTS]
    m = method(name, tgt, mtp)
    with fuse(tgt, mtp, getattr(m, "drafter", None)):
        res = generate(tgt, m, PROMPTS, 0.0, 37)
        monkeypatch.setenv("DMTP_CUDA_GRAPHS", "0")
        eager = generate(tgt, m, PROMPTS, 0.0, 37)
    assert [r.output_ids for r in res] == ref
    assert [r.accepted for r in eager] == [r.accepted for r in res]


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
