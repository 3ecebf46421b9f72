"""The compiled engine's forwards (`dmtp.models.fast`) against the HF path they replace: the same outputs from the same
caches, lossless decoding for every method (also with many accepted candidates, which moves the drafter's block rows
and rolls caches back), unsupported models left on the HF path, and the compiled (Inductor C++) path on CPU: lossless
and compiled once for every batch. CPU flex attention is slow (eager), so these decode few tokens."""
import pytest
import torch
from conftest import Oracle, hf_greedy, make_drafter

from dmtp.config import EngineConfig
from dmtp.engine.decode import Batch, generate
from dmtp.engine.slots import engine_for
from dmtp.engine.methods import build_method, method_class
from dmtp.models import fast, tiny
from dmtp.models.cache import KVCache

PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60, 70, 80, 90]]


def _prefilled(tgt, B=3, T=9, cap=128):
    ids = torch.randint(3, tgt.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    plen = torch.tensor([T, 4, 7][:B])
    cache = KVCache(B, cap, fast=True)
    tgt.forward(ids, torch.arange(T)[None].expand(B, T), cache, lengths=plen, logits_at=plen - 1)
    return cache, plen


@pytest.mark.parametrize("kind", ["flex", "dense"])
def test_target_forward_equals_hf(models, kind):
    tgt, _ = models
    cache, plen = _prefilled(tgt)
    ids = torch.randint(3, tgt.vocab_size, (3, 5), generator=torch.Generator().manual_seed(1))
    pos = plen[:, None] + torch.arange(5)
    ref_cache, _ = _prefilled(tgt)
    ref = tgt.forward(ids, pos, ref_cache, taps=[0, 2])
    got = fast.target_forward(tgt, ids, pos, cache, taps=[0, 2], eng=EngineConfig(attention=kind))
    for a, b in ((got.logits, ref.logits), (got.hidden, ref.hidden), (got.taps, ref.taps)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for i in ref_cache.k:  # the same rows written
        torch.testing.assert_close(cache.k[i], ref_cache.k[i], rtol=1e-5, atol=1e-5)


PUBLIC = dict(window=0, layer_types=["sliding_attention", "full_attention"], sliding_window=5)  # the public rule:
# a causal sliding layer whose window cuts into the context, then a bidirectional full-attention layer


@pytest.mark.parametrize("kind", ["flex", "dense"])
@pytest.mark.parametrize("variant,rule", [("dflash", "anchor"), ("t1_residual", "anchor"),  # double-, single-anchor
                                          ("dflash", "public"), ("t1_residual", "public")])
@torch.no_grad()
def test_mtp_and_drafter_forwards_equal_hf(models, variant, rule, kind):
    _mtp_and_drafter_forwards_equal_hf(models, variant, EngineConfig(attention=kind), **(PUBLIC if rule == "public"
                                                                                         else {}))


def _mtp_and_drafter_forwards_equal_hf(models, variant, eng, **rule):
    tgt, mtp = models
    B, cap, H = 2, 128, tgt.hidden_size
    g = torch.Generator().manual_seed(2)
    mc, mref = KVCache(B, cap, fast=True), KVCache(B, cap)
    emb, hid = torch.randn(B, 9, H, generator=g), torch.randn(B, 9, H, generator=g)
    pre = torch.arange(6)[None].expand(B, 6)
    for c in (mc, mref):
        mtp(emb[:, :6], hid[:, :6], pre, c)
    pos = torch.tensor([[6, 7, 8], [3, 4, 5]])
    torch.testing.assert_close(fast.mtp_forward(mtp, emb[:, 6:], hid[:, 6:], pos, mc, eng),
                               mtp(emb[:, 6:], hid[:, 6:], pos, mref), rtol=1e-4, atol=1e-4)

    d = make_drafter(tgt, variant, **rule)
    if not rule:
        d.config.window = 5  # the anchor window cuts into the context
    assert fast.drafter_problem(d, eng) is None
    lay = d.layout
    ctx = KVCache(B, cap, fast=True)
    f = torch.randn(B, 40, H, generator=g)
    ctx.write_pos = torch.arange(40)[None].expand(B, 40)
    for i, (k, v) in enumerate(d.context_kv(f, ctx.write_pos)):
        ctx.update(k, v, i)
    kv = [(ctx.k[i].clone(), ctx.v[i].clone()) for i in range(len(d.layers))]
    anchor = torch.tensor([17, 9])
    bpos = anchor[:, None] + torch.tensor(lay.offsets)
    block = torch.randn(B, lay.slots, H, generator=g)
    ref = d(block, bpos, kv, anchor[:, None])
    torch.testing.assert_close(fast.drafter_forward(d, block, bpos, ctx, anchor, eng), ref, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def qwen35():
    return tiny.build("qwen3_5", seed=0)  # gated attention, partial multi-axis rotary: the harder layer


@pytest.mark.parametrize("name", ["mtp", "zero_init_residual", "t1_residual"])
def test_flex_engine_is_lossless_with_many_accepts(qwen35, name):
    """The oracle makes rounds accept 0..k candidates: rollbacks, block rows in the drafter's context cache (double-
    and single-anchor blocks), MTP rows; without it the fast-eager engine accepts exactly what the HF engine accepts."""
    tgt, mtp = qwen35
    truth = [hf_greedy(tgt, p, 16) for p in PROMPTS]
    d = make_drafter(tgt, name) if name != "mtp" else None
    inner = build_method(name, tgt, drafter=d, mtp=mtp)
    res = generate(tgt, Oracle(inner, truth), PROMPTS, 0.0, 16, engine="fast-eager")
    assert [r.output_ids for r in res] == truth
    assert len({a for r in res for a in r.accepted}) >= 3
    got = generate(tgt, inner, PROMPTS, 0.0, 16, engine="fast-eager")
    assert [r.accepted for r in got] == [r.accepted for r in generate(tgt, inner, PROMPTS, 0.0, 16, engine="hf")]
    dense = EngineConfig(engine="fast-eager", attention="dense")
    assert [r.output_ids for r in generate(tgt, Oracle(inner, truth), PROMPTS, 0.0, 16, engine=dense)] == truth


def test_compiled_engine_on_cpu_compiles_once():
    """Inductor's C++ backend: every stage compiled, lossless, and a second batch (another prompt set, same shapes)
    reuses the compiled code: no new graphs."""
    from torch._dynamo.utils import counters

    tgt, mtp = tiny.build("qwen3_5", seed=0)
    m = build_method("zero_init_residual", tgt, drafter=make_drafter(tgt, "zero_init_residual"), mtp=mtp)
    ref = [hf_greedy(tgt, p, 10) for p in PROMPTS]
    assert [r.output_ids for r in generate(tgt, m, PROMPTS, 0.0, 10, engine="compiled")] == ref
    graphs = counters["stats"]["unique_graphs"]
    other = [[6, 1, 2], [9, 9, 9, 9, 4], [3]]
    assert [r.output_ids for r in generate(tgt, m, other, 0.0, 10, engine="compiled")] == [
        hf_greedy(tgt, p, 10) for p in other]
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("verify", ["sample", "block"])
def test_compiled_engine_verify_modes_follow_the_hf_path(verify):
    """Sampled drafts and speculative / block acceptance inside the compiled stages (sampling from randomness drawn
    before the round): from the same seed the compiled engine emits the HF path's tokens with its accept counts (on
    CUDA, tests/test_cuda.py adds the CUDA graphs)."""
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    m = build_method("zero_init_residual", tgt, drafter=make_drafter(tgt, "zero_init_residual"), mtp=mtp)
    hf, comp = (generate(tgt, m, PROMPTS, 1.0, 10, seed=7, verify=verify, engine=e) for e in ("hf", "compiled"))
    assert [r.output_ids for r in comp] == [r.output_ids for r in hf]
    assert [r.accepted for r in comp] == [r.accepted for r in hf]
    assert any(sum(r.accepted) for r in hf)  # drafts were accepted: the acceptance path ran, not only rejections


def test_unsupported_models_stay_on_hf():
    tgt, mtp = tiny.build("qwen3_5_hybrid", seed=0)
    assert fast.target_problem(tgt) == "hybrid target (Gated DeltaNet layers)"
    assert engine_for(tgt, "compiled") == "hf"
    dense, dmtp = tiny.build("qwen3", seed=0)
    assert fast.target_problem(dense) is None and engine_for(dense) == "hf"  # CPU default
    assert engine_for(dense, EngineConfig(engine="fast-eager")) == engine_for(dense, "fast-eager") == "fast-eager"
    d2 = make_drafter(dense, "dflash", backbone="dflash2")
    assert fast.drafter_problem(d2) == "dflash2 backbone"
    b = Batch(dense, build_method("dflash", dense, drafter=d2), PROMPTS, 0.0, 8, set(), None, engine="fast-eager")
    assert b.cache.fast and not b.method.ctx.fast and b.st.capacity % fast.BLOCK == 0


@pytest.mark.parametrize("field, value", [("engine", "fast"), ("attention", "sdpa"), ("cache_write", "inside"),
                                          ("tuning", "max"), ("drafter", "jit"), ("prefill", "eager"), ("admit", 0),
                                          ("graphs", "yes")])
def test_engine_settings_are_checked(field, value):
    """Every engine setting is a typed field checked where it is set (a profile, `--set engine.*`, a constructor)."""
    with pytest.raises(ValueError, match=f"{field}="):
        EngineConfig(**{field: value})
    with pytest.raises(TypeError, match="expected an EngineConfig"):
        EngineConfig.of(3)


def test_engine_settings_resolve_per_device():
    """"auto" resolves per device: the compiled engine on CUDA, the HF layers on CPU; the K/V write outside the graphs
    only where flex attention reads the cache on CUDA. What ran is what the meta files record."""
    e = EngineConfig()
    assert (e.kind("cuda"), e.kind("cpu"), e.write("cuda"), e.write("cpu")) == ("compiled", "hf", "eager", "graph")
    d = EngineConfig(attention="dense")
    assert d.write("cuda") == "graph" and d.resolved("cuda")["cache_write"] == "graph"
    assert EngineConfig.of("fast-eager") == EngineConfig(engine="fast-eager") and EngineConfig.of(None) == e


def test_tuning_options_apply_on_cuda_only():
    """`EngineConfig.tuning = "autotune"`: Inductor's autotuning options for CUDA compiles, CPU compiles unchanged;
    the compiled-function cache keeps the settings apart on CUDA."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert fast.compile_options(cuda) is None and fast.compile_options(cpu) == {"epilogue_fusion": False}
    assert fast.compile_options(cuda, "autotune") == {"max_autotune": True, "coordinate_descent_tuning": True}
    assert fast.compile_options(cpu, "autotune") == {"epilogue_fusion": False}
    with pytest.raises(ValueError, match="tuning='max'"):
        fast.compile_options(cuda, "max")


@pytest.mark.parametrize("write", ["graph", "eager"])
def test_cache_write_placement_keeps_the_forward(models, write):
    """`EngineConfig.cache_write`: the K/V write inside or outside the compiled graph gives the HF forward and the same
    rows, with either attention kernel."""
    tgt, _ = models
    ids = torch.randint(3, tgt.vocab_size, (3, 2), generator=torch.Generator().manual_seed(1))
    ref_cache, plen = _prefilled(tgt)
    pos = plen[:, None] + torch.arange(2)
    ref = tgt.forward(ids, pos, ref_cache)
    for kind in ("flex", "dense"):
        cache, _ = _prefilled(tgt)
        got = fast.target_forward(tgt, ids, pos, cache, compile=True, eng=EngineConfig(attention=kind, cache_write=write))
        torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-4)
        for i in ref_cache.k:
            torch.testing.assert_close(cache.k[i], ref_cache.k[i], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(cache.v[i], ref_cache.v[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["dflash", "zero_init_residual"])
def test_every_cpu_engine_proposes_the_same_drafts(name):
    """Draft for draft, not only output for output: the oracle forces the same trajectory (rounds accepting 0..k, so
    block rows and rollbacks in the drafter's context cache) and logs each round's real proposal; the HF, fast-eager
    and compiled engines must propose identical drafts. (On CUDA the compiled drafter did not: tests/test_cuda.py.)"""
    tgt, mtp = tiny.build("qwen3", seed=0)
    d = make_drafter(tgt, name)
    truth = [hf_greedy(tgt, p, 24) for p in PROMPTS]
    logs = {}
    for engine in ("hf", "fast-eager", "compiled"):
        o = Oracle(build_method(name, tgt, drafter=d, mtp=mtp), truth)
        generate(tgt, o, PROMPTS, 0.0, 24, engine=engine)
        logs[engine] = torch.cat([real for _, _, real, _ in o.log])
    assert logs["hf"].shape[0] >= 8  # rounds of every request, all logged
    assert torch.equal(logs["hf"], logs["fast-eager"]) and torch.equal(logs["hf"], logs["compiled"])


def test_public_rule_drafter_proposes_the_same_drafts_on_the_fast_path():
    """A drafter trained with the public rule (the paper profiles') decodes on the fast path, proposing the HF path's
    drafts round for round with contexts beyond its sliding window (the compiled engine on CUDA: tests/test_cuda.py)."""
    tgt, mtp = tiny.build("qwen3", seed=0)
    d = make_drafter(tgt, "zero_init_residual", **PUBLIC)
    truth = [hf_greedy(tgt, p, 24) for p in PROMPTS]
    logs = {}
    for engine in ("hf", "fast-eager"):
        o = Oracle(build_method("zero_init_residual", tgt, drafter=d, mtp=mtp), truth)
        generate(tgt, o, PROMPTS, 0.0, 24, engine=engine)
        logs[engine] = torch.cat([real for _, _, real, _ in o.log])
    assert logs["hf"].shape[0] >= 8 and torch.equal(logs["hf"], logs["fast-eager"])


def test_cache_write_outside_the_graph_proposes_the_same_drafts():
    """`EngineConfig.cache_write`: the K/V rows written inside the compiled graph (the CPU default) or outside it (a
    graph break at each write, the CUDA default with flex attention since the in-graph write gave wrong flex-attention
    outputs on the H200): the same drafts, draft for draft, and lossless."""
    tgt, mtp = tiny.build("qwen3", seed=0)
    d = make_drafter(tgt, "zero_init_residual")
    truth = [hf_greedy(tgt, p, 16) for p in PROMPTS]
    logs = {}
    for mode in ("graph", "eager"):
        o = Oracle(build_method("zero_init_residual", tgt, drafter=d, mtp=mtp), truth)
        out = generate(tgt, o, PROMPTS, 0.0, 16, engine=EngineConfig(engine="compiled", cache_write=mode))
        assert [r.output_ids for r in out] == truth
        logs[mode] = torch.cat([real for _, _, real, _ in o.log])
    assert torch.equal(logs["graph"], logs["eager"])


# zero_init_residual is slow (~20 s of CPU, compiling the drafter path too): the prompt pass and grouped admission are
# the same code for every method (`ar` covers them), and the compiled drafter path is lossless by
# test_compiled_engine_on_cpu_compiles_once; `make test-all` runs it
@pytest.mark.parametrize("name", ["ar", pytest.param("zero_init_residual", marks=pytest.mark.slow)])
def test_prefill_on_fast_layers_and_grouped_admission_are_lossless(qwen35, name):
    """The prompt pass through fast.py's layers (`EngineConfig.prefill = "compiled"`: the dense kernel, right-padded
    prompts of any lengths) leaves the caches the HF pass leaves: the same greedy outputs and accept counts as the HF
    prefill, through `generate` and a `Server` admitting newcomers in groups of two (`admit`)."""
    from dmtp.engine.slots import capacity_for
    from dmtp.engine.server import Server

    tgt, mtp = qwen35
    d = make_drafter(tgt, name) if method_class(name).needs_drafter else None
    m = build_method(name, tgt, drafter=d, mtp=mtp)
    truth = [hf_greedy(tgt, p, 12) for p in PROMPTS]
    eng = EngineConfig(engine="fast-eager", prefill="compiled", attention="dense", admit=2)
    cache, plen = _prefilled(tgt)  # the prompt pass itself: the same rows, logits and hidden states
    ids = torch.randint(3, tgt.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9)[None].expand(3, 9)
    mine = KVCache(3, 128, fast=True)
    got = fast.prefill_forward(tgt, ids, pos, mine, [0, 2], plen, compile=False)
    ref = tgt.forward(ids, pos, KVCache(3, 128, fast=True), taps=[0, 2], lengths=plen, logits_at=plen - 1)
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.taps, ref.taps, rtol=1e-4, atol=1e-4)
    for i in cache.k:
        torch.testing.assert_close(mine.k[i], cache.k[i], rtol=1e-5, atol=1e-5)
    hf_res = generate(tgt, m, PROMPTS, 0.0, 12, engine="fast-eager")
    # the fast-eager engine has no compiled prefill (the compiled engine's); "compiled" on CPU compiles every stage
    res = generate(tgt, m, PROMPTS, 0.0, 12, engine=eng.with_(engine="compiled"))
    assert [r.output_ids for r in res] == [r.output_ids for r in hf_res] == truth
    assert [r.accepted for r in res] == [r.accepted for r in hf_res]
    srv = Server(tgt, m, 2, capacity_for(PROMPTS * 2, 12, m.k), 0.0, 12, engine=eng.with_(engine="compiled"))
    out = srv.run(PROMPTS * 2)
    assert [r.output_ids for r in out] == truth * 2 and srv.groups >= 2


def test_prompt_buckets():
    """Group sizes pad to the next power of two (at most the server's cap), prompt lengths to a multiple of the
    step (at most the cache's rows); what does not fit is named."""
    from dmtp.engine.prompts import group_bucket, length_bucket

    assert [group_bucket(n, 32) for n in (1, 2, 3, 5, 8, 9, 17, 32)] == [1, 2, 4, 8, 8, 16, 32, 32]
    assert group_bucket(5, 6) == 6 and group_bucket(1, 1) == 1
    assert [length_bucket(t, 256) for t in (1, 64, 65, 200, 256)] == [64, 64, 128, 256, 256]
    assert length_bucket(130, 150) == 150 and length_bucket(5, 128, step=4) == 8
    with pytest.raises(ValueError, match="3 newcomers does not fit a server of 2"):
        group_bucket(3, 2)
    with pytest.raises(ValueError, match="300 tokens does not fit a cache of 256"):
        length_bucket(300, 256)


@pytest.mark.parametrize("name", ["ar", "mtp", "zero_init_residual"])
def test_graphed_prompt_pass_is_lossless(qwen35, name):
    """`EngineConfig.prefill = "graphed"` (`prompts.py`): the newcomers' prompt pass padded to its (group, length)
    bucket gives the unpadded pass's logits, hidden states, taps and cache rows for the real requests, and a `Server`
    admitting through it (groups of one to three, uncaptured here: CPU) decodes every request as HF greedy does."""
    from dmtp.engine.slots import capacity_for
    from dmtp.engine.prompts import PromptPass
    from dmtp.engine.server import Server

    tgt, mtp = qwen35
    ids = torch.randint(3, tgt.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    plen = torch.tensor([9, 4, 7])
    ref_cache = KVCache(3, 128, fast=True)
    ref = fast.prefill_forward(tgt, ids, torch.arange(9)[None].expand(3, 9), ref_cache, [0, 2], plen, compile=False)
    pp = PromptPass(tgt, [0, 2], cap=8, graphs=False, compile=False, step=8)
    got, view = pp(ids, plen, 128)
    assert pp.met == {(4, 16)} and got.logits.shape == ref.logits.shape and got.hidden.shape == ref.hidden.shape
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.taps, ref.taps, rtol=1e-5, atol=1e-5)
    for b, n in enumerate(plen.tolist()):
        torch.testing.assert_close(got.hidden[b, :n], ref.hidden[b, :n], rtol=1e-5, atol=1e-5)
        for i in ref_cache.k:
            torch.testing.assert_close(view.k[i][b, :, :n], ref_cache.k[i][b, :, :n], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(view.v[i][b, :, :n], ref_cache.v[i][b, :, :n], rtol=1e-5, atol=1e-5)
    d = make_drafter(tgt, name) if method_class(name).needs_drafter else None
    m = build_method(name, tgt, drafter=d, mtp=mtp)
    prompts = (PROMPTS + [[7, 7, 7], [12, 13, 14, 15], [60], list(range(3, 70))]) * 2
    eos = hf_greedy(tgt, PROMPTS[0], 14)[4]  # requests end at different rounds: groups of several sizes join
    truth = [hf_greedy(tgt, p, 14, eos=eos) for p in prompts]
    eng = EngineConfig(engine="fast-eager", prefill="graphed", attention="dense", admit=3)
    srv = Server(tgt, m, 5, capacity_for(prompts, 14, m.k), 0.0, 14, eos_ids=[eos], engine=eng)
    got = srv.run(prompts)
    assert [r.output_ids for r in got] == truth
    assert srv.groups >= 2 and srv.prompt_pass.met and srv.prompt_pass.failed is None
    assert {t for _, t in srv.prompt_pass.met} >= {64, 128}  # a short and a long group's length bucket
    assert any(g > 3 for g, _ in srv.prompt_pass.met)  # a group of 3 padded to 4 rows
    # the method's state comes from the bucket's copy of the method: the drafts (accept counts) are those of the
    # method's own prefill after the HF prompt pass
    ref = Server(tgt, m, 5, capacity_for(prompts, 14, m.k), 0.0, 14, eos_ids=[eos], engine=eng.with_(prefill="hf"))
    assert [r.accepted for r in got] == [r.accepted for r in ref.run(prompts)]
    if m.k:
        assert srv.prompt_pass.copies and srv.prompt_pass.state_attrs(next(iter(srv.prompt_pass.copies.values())))


@pytest.mark.parametrize("fails", ["method", "prompt"])
def test_a_failed_capture_falls_back_uncaptured(qwen35, fails, monkeypatch):
    """A capture that fails (a stand-in graph store raising on its first capture) warns, is recorded, and the pass
    runs uncaptured from then on: the method's prefill alone when its graph failed, everything when the prompt pass's
    did; the server decodes as HF greedy does either way."""
    from dmtp.engine.slots import capacity_for
    from dmtp.engine.server import Server

    class Failing:
        enabled, graphs = True, {}

        def __call__(self, stage, fn, *inputs):
            if stage.startswith(fails):
                raise RuntimeError("operation not permitted when stream is capturing")
            return fn(*inputs)

    tgt, mtp = qwen35
    m = build_method("zero_init_residual", tgt, drafter=make_drafter(tgt, "zero_init_residual"), mtp=mtp)
    prompts = PROMPTS * 3
    eng = EngineConfig(engine="fast-eager", prefill="graphed", attention="dense", admit=2)
    srv = Server(tgt, m, 2, capacity_for(prompts, 10, m.k), 0.0, 10, engine=eng)
    srv.prompt_pass.graphs = Failing()
    with pytest.warns(UserWarning, match="capture failed"):
        got = srv.run(prompts)
    assert [r.output_ids for r in got] == [hf_greedy(tgt, p, 10) for p in prompts]
    pp = srv.prompt_pass
    assert pp.failed.startswith(fails) and "stream is capturing" in pp.failed
    assert pp.graph_method is False if fails == "method" else not pp.graphs.enabled
