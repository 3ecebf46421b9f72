"""Losslessness of the single decode loop, for every method, against HF `generate` as an independent reference."""
import contextlib

import pytest
import torch
from conftest import Oracle, hf_greedy, make_drafter

from dmtp.config import EngineConfig
from dmtp.engine import methods
from dmtp.engine.decode import generate
from dmtp.engine.methods import AR, DrafterMethod, MTPMethod, build_method, load_method, method_class
from dmtp.engine.server import serve
from dmtp.models.variants import NAMES

# given: its checkpoint's threshold (0.6: rarely met by the tiny random MTP head), a threshold the tiny head's top
# probabilities straddle (0.3: counts 0..3 per request), and the fixed counts 3 and 0 (the chain always / never used)
METHODS = ["ar", "mtp"] + NAMES + ["given-p0.3", "given-g3", "given-g0"]
PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60, 70, 80, 90], [33]]


def method_for(name, tgt, mtp, k=4):
    variant = methods.split_rule(methods.split_drafts(name)[0])[0]
    d = make_drafter(tgt, variant) if method_class(name).needs_drafter else None
    return build_method(name, tgt, drafter=d, mtp=mtp, mtp_steps=k)


@pytest.mark.parametrize("name", METHODS)
def test_lossless_greedy_batched(models, name):
    tgt, mtp = models
    ref = [hf_greedy(tgt, p, 19) for p in PROMPTS]  # 19: max tokens lands inside a block
    res = generate(tgt, method_for(name, tgt, mtp), PROMPTS, 0.0, 19)
    assert [r.output_ids for r in res] == ref
    for r in res:
        k = 4 if name == "mtp" else 0 if name == "ar" else 7
        assert all(0 <= a <= k for a in r.accepted)


@pytest.mark.parametrize("name, drafts", [("dflash", 3), ("zero_init_residual", 3), ("fusion", 2),
                                           ("mtp_context", 5), ("mtp", 2)])
def test_a_limited_method_verifies_a_prefix_of_its_drafts_and_stays_lossless(models, name, drafts):
    """`<run>-k<n>` (`Method.limit`): the round's drafts are the first n of the full method's, from the same state
    (one drafter pass, fewer slots read), each round accepts at most n (its k, the records' n_candidates, is n), and
    the output is still the target's own greedy one, in `generate` and in a server."""
    tgt, mtp = models
    d = make_drafter(tgt, name) if method_class(name).needs_drafter else None
    steps = 7 if name == "mtp" else 4  # MTP chained 7 steps: as many drafts as the drafter methods' block
    full = build_method(name, tgt, drafter=d, mtp=mtp, mtp_steps=steps)
    lim = build_method(f"{name}-k{drafts}", tgt, drafter=d, mtp=mtp, mtp_steps=steps)
    assert lim.k == drafts and lim.name == f"{name}-k{drafts}" and full.k == 7 and full.name == name
    ref = [hf_greedy(tgt, p, 19) for p in PROMPTS]
    firsts = []
    for m in (full, lim):
        o = Oracle(m, ref, p_keep=1.0)
        generate(tgt, o, PROMPTS, 0.0, 19)
        firsts.append(o.log[0][2])  # the first round's real drafts: the same state after the prefill
    assert firsts[1].shape[1] == drafts and torch.equal(firsts[1], firsts[0][:, :drafts])
    res = generate(tgt, lim, PROMPTS, 0.0, 19)
    assert [r.output_ids for r in res] == ref
    assert all(0 <= a <= drafts for r in res for a in r.accepted)
    assert [r.output_ids for r in serve(tgt, lim, PROMPTS, 2, 0.0, 19)] == ref


def test_limits_out_of_range_are_clear_errors(models):
    tgt, mtp = models
    d = make_drafter(tgt, "zero_init_residual")
    for bad, match in [("zero_init_residual-k8", r"in \[2, 7\]"), ("zero_init_residual-k1", r"in \[2, 7\]"),
                       ("zero_init_residual-k0", "whole number >= 1")]:
        with pytest.raises(ValueError, match=match):
            build_method(bad, tgt, drafter=d, mtp=mtp)
    with pytest.raises(ValueError, match="its run drafts nothing"):
        build_method("ar-k2", tgt)
    assert methods.split_drafts("dflash") == ("dflash", None) and methods.split_drafts("a_b-k12") == ("a_b", 12)
    assert methods.split_drafts("x-kv") == ("x-kv", None)  # not a limit: the name as it is
    assert method_class("mtp-k3") is MTPMethod and method_class("dflash-k3") is DrafterMethod


def first_drafts(tgt, method, truth):
    """The first round's drafts [B, k] of `method` on PROMPTS (the state after the prefill) and its counts g where
    the method chains the MTP (`DrafterMethod._chain`, spied on the batch's copy)."""
    counts, chain = [], DrafterMethod._chain

    def spy(self, lens):
        out = chain(self, lens)
        counts.append(out[1].clone())
        return out

    o = Oracle(method, truth, p_keep=1.0)
    DrafterMethod._chain = spy
    try:
        generate(tgt, o, PROMPTS, 0.0, 19)
    finally:
        DrafterMethod._chain = chain
    return o.log[0][2], (counts[0] if counts else None)


def test_given_drafts_the_chain_then_the_drafter_and_fixed_counts_are_thresholds(models):
    """`given`: a round's drafts are the MTP chain's first g tokens (MTP-3's drafts from the same state), then the
    drafter's pass over a block given those g; g per request is the count of leading chain steps at least as
    confident as the threshold, so threshold 0 is the fixed count 3 (`given-g3`) and a threshold above 1 the count
    0 (`given-g0`: no chain, the drafter's own block), and at 0.3 the tiny head's requests get different counts."""
    tgt, mtp = models
    d = make_drafter(tgt, "given")
    truth = [hf_greedy(tgt, p, 19) for p in PROMPTS]
    run = {n: first_drafts(tgt, build_method(n, tgt, drafter=d, mtp=mtp, mtp_steps=3), truth)
           for n in ("given-p0", "given-g3", "given-p1.5", "given-g0", "given-p0.3", "mtp")}
    assert torch.equal(run["given-p0"][0], run["given-g3"][0]) and run["given-g3"][1].tolist() == [3] * 4
    assert torch.equal(run["given-p1.5"][0], run["given-g0"][0]) and run["given-p1.5"][1].tolist() == [0] * 4
    assert run["given-g0"][1] is None  # a count of 0 runs no chain
    assert torch.equal(run["given-g3"][0][:, :3], run["mtp"][0])  # T1..T3: the MTP chain's
    drafts, count = run["given-p0.3"]
    assert len(set(count.tolist())) > 1, count  # the threshold chooses per request
    for b, g in enumerate(count.tolist()):
        assert drafts[b, :g].tolist() == run["mtp"][0][b, :g].tolist()


def test_given_count_rules_are_clear_errors(models):
    tgt, mtp = models
    d, z = make_drafter(tgt, "given"), make_drafter(tgt, "zero_init_residual")
    with pytest.raises(ValueError, match=r"a given count must be a whole number in \[0, 3\]"):
        build_method("given-g4", tgt, drafter=d, mtp=mtp)
    with pytest.raises(ValueError, match="takes no count of MTP-given tokens"):
        build_method("zero_init_residual-p0.5", tgt, drafter=z, mtp=mtp)
    with pytest.raises(ValueError, match="takes no count of MTP-given tokens"):
        build_method("mtp-g2", tgt, mtp=mtp)
    with pytest.raises(ValueError, match="whole number of MTP-given tokens"):
        build_method("given-g1.5", tgt, drafter=d, mtp=mtp)
    assert methods.split_rule("given-p0.85-x") == ("given-p0.85-x", {})  # not a rule: the name as it is
    m = build_method("given-p0.9-k5", tgt, drafter=d, mtp=mtp)
    assert (m.name, m.threshold, m.most, m.k) == ("given-p0.9-k5", 0.9, 3, 5)


@pytest.mark.parametrize("name", ["ar", "mtp", "dflash", "zero_init_residual", "mtp_context", "given-p0.3"])
def test_lossless_with_eos_inside_block(models, name):
    tgt, mtp = models
    prompt = PROMPTS[0]
    free = hf_greedy(tgt, prompt, 30)
    eos = free[6]  # first occurs at or before index 6: generation must stop right there
    ref = hf_greedy(tgt, prompt, 30, eos=eos)
    assert ref[-1] == eos and len(ref) <= 7
    res = generate(tgt, method_for(name, tgt, mtp), [prompt, PROMPTS[2]], 0.0, 30, eos_ids=[eos])
    assert res[0].output_ids == ref
    assert res[1].output_ids == hf_greedy(tgt, PROMPTS[2], 30, eos=eos)


@pytest.mark.parametrize("name", ["mtp", "dflash", "token_only", "zero_init_residual", "context_fusion",
                                  "mtp_context", "mask_residual"])
def test_state_matches_recomputation(models, name):
    """With many accepted candidates, the cached MTP hidden / T1 and the drafter's proposals at every round equal a
    from-scratch recomputation on the final sequence (the training-time feature path)."""
    from dmtp.training.drafters import extract

    tgt, mtp = models
    prompts = PROMPTS[:3]
    truth = [hf_greedy(tgt, p, 40) for p in prompts]
    inner = method_for(name, tgt, mtp)
    om = Oracle(inner, truth)
    res = generate(tgt, om, prompts, 0.0, 40)
    assert [r.output_ids for r in res] == truth
    acc = [a for r in res for a in r.accepted]
    assert max(acc) == om.k and min(acc) == 0 and len(set(acc)) >= 3  # the oracle exercised many accept counts
    for b, p in enumerate(prompts):
        seq = torch.tensor([p + truth[b]])
        d = getattr(inner, "drafter", None)
        taps = d.config.target_layer_ids if d is not None else None
        feats = extract(tgt, mtp, seq, torch.tensor([seq.shape[1]]), taps, need_g=True)
        for lens, done, real, m in om.log:
            a = int(lens[b])
            if done[b] or a + 8 > seq.shape[1]:
                continue
            g = feats.g[0, a - 1]
            if m is not None:
                torch.testing.assert_close(m[1][b], g, rtol=1e-4, atol=1e-4)
                assert int(m[0][b]) == int(tgt.lm_head(g).argmax())
            if d is None:
                continue
            var = d.injection
            t1 = m[0][b:b + 1] if var.t1 else None
            block = d.block(tgt.embed(seq[:, a]), tgt.embed(t1) if var.t1 else None,
                            g[None] if var.t1 else None, tgt.embed(torch.tensor([2]))[0])
            lay = var.layout(d.config.num_candidates)
            pos = a + torch.tensor(lay.offsets)[None]
            f = d.context(feats.taps, feats.g)
            ctx = d.context_kv(f, torch.arange(seq.shape[1])[None])
            hid = d(block, pos, ctx, torch.tensor([[a]]))
            pred = tgt.lm_head(hid[0, list(lay.predict)]).argmax(-1)
            assert pred.tolist() == real[b, (1 if var.t1 else 0):].tolist()


def test_sampling_matches_target_distribution(models):
    """T = 1: the joint law of the first 3 generated tokens matches the target's, for speculative methods (chi-square
    against exact probabilities enumerated from the target)."""
    from scipy.stats import chisquare

    tgt, mtp = models
    prompt = [5, 7, 9]
    # exact distribution over the first 3 tokens, restricted to the most likely sequences
    with torch.no_grad():
        p1 = torch.softmax(tgt.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    top1 = p1.topk(4).indices.tolist()
    exact = {}
    for t1 in top1:
        with torch.no_grad():
            p2 = torch.softmax(tgt.model(torch.tensor([prompt + [t1]])).logits[0, -1].float(), -1)
        for t2 in p2.topk(4).indices.tolist():
            with torch.no_grad():
                p3 = torch.softmax(tgt.model(torch.tensor([prompt + [t1, t2]])).logits[0, -1].float(), -1)
            for t3 in p3.topk(3).indices.tolist():
                exact[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    N = 1500
    for name in ["dflash", "mtp", "zero_init_residual"]:
        res = generate(tgt, method_for(name, tgt, mtp, k=3), [prompt] * N, 1.0, 3, seed=123)
        seqs = [tuple(r.output_ids) for r in res]
        keys = sorted(exact, key=exact.get, reverse=True)[:12]
        obs = [sum(s == k for s in seqs) for k in keys] + [sum(s not in keys for s in seqs)]
        exp = [exact[k] * N for k in keys]
        exp.append(N - sum(exp))
        stat, pval = chisquare(obs, exp)
        assert pval > 1e-3, (name, obs, [round(e) for e in exp])


def test_unknown_method_and_missing_pieces(models):
    tgt, mtp = models
    with pytest.raises(KeyError, match="unknown variant 'nope'"):
        build_method("nope", tgt)
    with pytest.raises(ValueError, match="needs --drafter"):
        build_method("dflash", tgt)
    with pytest.raises(ValueError, match="native MTP"):
        build_method("mtp", tgt, mtp=None)
    with pytest.raises(ValueError, match="not 'fusion'"):
        build_method("fusion", tgt, drafter=make_drafter(tgt, "dflash"), mtp=mtp)


def test_methods_declare_what_they_need(models, tmp_path):
    """`ar` and `mtp` sit in the registry beside the variants: a caller asks a method's class what it needs (a drafter
    checkpoint, the MTP head, the step count) instead of comparing names; a method is complete when built."""
    tgt, mtp = models
    assert sorted(methods.METHODS) == ["ar", "mtp"] and method_class("zero_init_residual_from_dflash") is DrafterMethod
    assert (AR.needs_drafter, AR.needs_mtp(), AR.uses_mtp_steps) == (False, False, False)
    assert (MTPMethod.needs_drafter, MTPMethod.needs_mtp(), MTPMethod.uses_mtp_steps) == (False, True, True)
    d, f = make_drafter(tgt, "dflash"), make_drafter(tgt, "fusion")
    assert DrafterMethod.needs_drafter and not DrafterMethod.needs_mtp(d) and DrafterMethod.needs_mtp(f)
    assert build_method("ar", tgt).k == 0 and build_method("mtp", tgt, mtp=mtp, mtp_steps=3).k == 3
    f.save(tmp_path / "fusion_run" / "drafter")
    m = load_method("fusion_run", tgt, mtp, tmp_path)  # a run's folder name; its checkpoint names the variant
    assert (type(m), m.name, m.var.name, m.k) == (DrafterMethod, "fusion_run", "fusion", 7)
    assert build_method("dflash", tgt, drafter=d, label="dflash+screen").name == "dflash+screen"


@pytest.mark.parametrize("name", ["ar", "mtp", "dflash", "zero_init_residual", "context_fusion", "given-p0.3"])
def test_dynamic_batching_is_lossless(models, name):
    """serve(): at most `cap` requests in flight, newcomers prefilled and moved into freed slots mid-flight."""
    tgt, mtp = models
    prompts = PROMPTS + [[7, 7, 7], [12, 13, 14, 15], [60]]
    eos = hf_greedy(tgt, PROMPTS[0], 30)[4]  # some requests stop early, freeing slots at different rounds
    ref = [hf_greedy(tgt, p, 25, eos=eos) for p in prompts]
    for cap in (1, 3):
        res = serve(tgt, method_for(name, tgt, mtp), prompts, cap, 0.0, 25, eos_ids=[eos])
        assert [r.output_ids for r in res] == ref
        assert all(r.wall_s > 0 for r in res)


@pytest.mark.parametrize("name", ["ar", "mtp", "zero_init_residual"])
def test_dynamic_batching_with_late_copies_is_lossless(models, name, monkeypatch):
    """As on CUDA when the host runs ahead: every copy to the host arrives two rounds late, so a server refills slots
    (admission and record copies queued without a host synchronisation) while copies about their former occupants
    are still in flight; those are skipped by slot generation, never applied to the newcomers. Requests that end at
    their first token (end-of-text) included, over two request groups of one server."""
    from test_stops import lagging

    from dmtp.engine.server import Server

    tgt, mtp = models
    prompts = PROMPTS + [[7, 7, 7], [12, 13, 14, 15], [60], [5, 7, 9, 11, 3]]
    eos_at_first = hf_greedy(tgt, [60], 3)[0]  # the request [60] ends at its first token
    ref = [hf_greedy(tgt, p, 25, eos=eos_at_first) for p in prompts]
    assert ref[prompts.index([60])] == [eos_at_first]
    batches = []
    lagging(monkeypatch, batches)
    for cap, beside, flight in ((1, 0, 2), (2, 0, 2), (3, 0, 2), (2, 1, 2), (3, 2, 2), (1, 1, 1), (3, 2, 1), (2, 0, 3)):
        eng = EngineConfig(admit_beside=beside, in_flight=flight)
        srv = Server(tgt, method_for(name, tgt, mtp), cap=cap, capacity=64, max_new_tokens=25, eos_ids=[eos_at_first],
                     engine=eng)
        for group in (prompts, prompts[::-1]):
            res = srv.run(group)
            assert [r.output_ids for r in res] == [ref[prompts.index(p)] for p in group], (cap, beside, flight)
            assert all(r.stop_reason == ("eos" if r.output_ids[-1] == eos_at_first else "length") for r in res)
        assert srv.groups > 0 and srv._joining is None
    assert any(b._pending for b in batches)


def test_fewer_copies_in_flight_free_slots_sooner(models, monkeypatch):
    """`engine.in_flight` = k: the host waits once more than k round copies are in flight, so it sees a request finish
    at most k rounds late (copies held back as when the GPU runs ahead: `lagging`). With k = 1 a finished request rides
    along for one round instead of two: the same outputs in fewer server rounds."""
    from test_stops import lagging

    from dmtp.engine.server import Server

    tgt, mtp = models
    prompts = [PROMPTS[0], [7, 7, 7], PROMPTS[2], [12, 13, 14, 15]]
    ref = [hf_greedy(tgt, p, 10) for p in prompts]
    lagging(monkeypatch, [])
    rounds = {}
    for flight in (1, 2, 3):
        srv = Server(tgt, method_for("zero_init_residual", tgt, mtp), cap=1, capacity=64, max_new_tokens=10,
                     engine=EngineConfig(in_flight=flight))
        res = srv.run(prompts)
        assert [r.output_ids for r in res] == ref
        verify = sum(len(r.accepted) for r in res)
        rounds[flight] = srv.rounds - verify  # rounds a finished request rode along
    assert rounds == {1: 1 * len(prompts), 2: 2 * len(prompts), 3: 3 * len(prompts)}
    with pytest.raises(ValueError, match="in_flight=0: expected an integer from 1 to 8"):
        EngineConfig(in_flight=0)


def test_the_next_group_is_prefilled_beside_the_decode_before_its_slots_are_free(models):
    """`engine.admit_beside` = L: the next group of newcomers is prefilled while the running requests decode, before
    its slots are free, and joins once enough slots are free and at least L rounds after its prefill began (at once
    when nothing else runs), losslessly; with L = 0 a group is prefilled when its slots are free."""
    from dmtp.engine.server import Server

    tgt, mtp = models
    prompts = [PROMPTS[0], PROMPTS[2], [7, 7, 7], [60], [12, 13, 14, 15], PROMPTS[1], [9, 9]]
    eos = hf_greedy(tgt, PROMPTS[0], 30)[4]  # some requests end early: slots free while others still run
    ref = [hf_greedy(tgt, p, 12, eos=eos) for p in prompts]
    assert len({len(r) for r in ref}) > 1
    for beside, admit in ((0, 1), (1, 1), (3, 1), (2, 2)):
        srv = Server(tgt, method_for("zero_init_residual", tgt, mtp), cap=2, capacity=64, max_new_tokens=12,
                     eos_ids=[eos], engine=EngineConfig(admit=admit, admit_beside=beside))
        begins, joins = [], []
        begin, join, step = srv._begin, srv._join, srv.batch

        def spy_begin(prompts_, t0, reqs, beside=True, srv=srv, begins=begins, begin=begin):
            if beside:  # (round, requests running, group size) at the start of its prefill
                running = 0 if srv.batch is None else int((~srv.batch.poll()).sum())
                begins.append((srv.rounds, running, len(reqs)))
            return begin(prompts_, t0, reqs, beside=beside)

        def spy_join(slots, srv=srv, joins=joins, join=join):  # (rounds still to wait, requests running)
            joins.append((srv._joining.rounds_left, int((~srv.batch.poll()).sum())))
            return join(slots)

        srv._begin, srv._join = spy_begin, spy_join
        assert [r.output_ids for r in srv.run(prompts)] == ref, (beside, admit)
        assert srv.admit_s > 0 and srv.beside_s == 0.0  # off CUDA nothing runs beside: its time is admission's
        if not beside:
            assert not begins
            continue
        assert begins and all(running > 0 for _, running, _ in begins)  # prefilled while others decode
        assert any(running == 2 for _, running, _ in begins)  # ... before any slot is free
        assert all(left <= 0 or running == 0 for left, running in joins)  # L rounds after, or nothing runs
        assert all(n >= admit for _, _, n in begins[:-1])  # groups of at least `admit` (the queue's rest last)
        assert srv.groups == len(joins) and len(begins) <= len(joins)
    assert step is None and srv._joining is None


def test_streams_that_run_beside_each_other_are_distinct_cuda_streams(monkeypatch):
    """torch hands out CUDA streams round-robin from a pool (32 per priority), so a new stream object can wrap an old
    CUDA stream; graphs captured on one CUDA stream share its cuBLAS workspace. `distinct_stream` draws until the CUDA
    stream is none of the others', and `capture_stream` is one stream per device, made once (a fake pool of 3 here)."""
    from dmtp.engine import graphs

    made = []

    class FakeStream:
        def __init__(self, device=None):
            self.cuda_stream = 1000 + len(made) % 3  # the pool's round-robin: the 4th stream is the 1st again
            made.append(self)

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda idx: contextlib.nullcontext())
    monkeypatch.setattr(graphs, "_CAPTURE", {})
    cap = graphs.capture_stream()
    assert graphs.capture_stream() is cap and graphs.capture_stream("cuda:0") is cap and len(made) == 1
    side = graphs.distinct_stream(cap)
    own = graphs.distinct_stream(cap, side, None)
    assert len({cap.cuda_stream, side.cuda_stream, own.cuda_stream}) == 3
    again = graphs.distinct_stream(cap, side)  # the pool wraps round to `cap`'s, then `side`'s, CUDA stream: skipped
    assert again.cuda_stream == own.cuda_stream and len(made) == 6
    with pytest.raises(RuntimeError, match="no stream besides 3 taken"):
        graphs.distinct_stream(cap, side, own)
    g = graphs.Graphs(False)  # off: no stream is made (the CPU engines)
    assert g.stream is None and len(made) == 6 + 2 * graphs.POOL + 1


@pytest.mark.parametrize("name", ["ar", "mtp", "zero_init_residual"])
def test_server_slots_outlive_a_request_group(models, name):
    """A Server keeps its slots (and, on CUDA, its graphs) between groups: a second group decodes losslessly in them."""
    from dmtp.engine.server import Server

    tgt, mtp = models
    groups = [PROMPTS[:3], [[7, 7, 7], [12, 13, 14, 15], [60], PROMPTS[3], PROMPTS[0]]]
    srv = Server(tgt, method_for(name, tgt, mtp), cap=2, capacity=64, max_new_tokens=20)
    for g in groups:
        assert [r.output_ids for r in srv.run(g)] == [hf_greedy(tgt, p, 20) for p in g]
    with pytest.raises(ValueError, match="capacity 64"):
        srv.run([list(range(3, 60))])


def test_generate_and_serve_decode_without_autograd(models, monkeypatch):
    """Every round of `generate` and `serve` runs with autograd off (the targets' weights may require grad)."""
    from dmtp.engine import decode, server

    tgt, _ = models
    seen = []
    step = decode.Batch.step

    def spy(self):
        seen.append(torch.is_grad_enabled())
        return step(self)
    monkeypatch.setattr(decode.Batch, "step", spy)
    with torch.enable_grad():
        decode.generate(tgt, AR(), [[5, 7]], 0.0, 3)
        server.serve(tgt, AR(), [[5, 7], [4]], 1, 0.0, 3)
    assert len(seen) >= 4 and not any(seen)


def test_generate_lets_go_of_its_batch_at_once(models):
    """A finished `generate` leaves no `Batch` behind for the garbage collector: its caches and CUDA-graph memory go
    when it returns (a reference cycle between a batch and its method copy once kept every batch of a data stage
    alive until the device ran out)."""
    import gc

    from dmtp.engine.decode import Batch

    tgt, mtp = models
    m = build_method("mtp", tgt, mtp=mtp)
    gc.collect()
    gc.disable()
    try:
        generate(tgt, m, [[5, 7, 9], [4, 8]], 0.0, 6)
        assert not [o for o in gc.get_objects() if isinstance(o, Batch)]
    finally:
        gc.enable()


def test_the_compiled_engine_lets_go_of_its_batches(models):
    """On the compiled engine dynamo's trace of a compiled stage (a bound method of the batch) holds the batch in a
    reference cycle; `generate` collects it before returning, also for a second prompt length (a recompile), so no
    batch of a data stage waits for the garbage collector with its caches."""
    import gc

    from dmtp.config import EngineConfig
    from dmtp.engine.decode import Batch

    tgt, _ = models
    eng = EngineConfig(engine="compiled")
    gc.collect()
    gc.disable()
    try:
        for prompts in ([[5, 7, 9], [4, 8]], [[5, 7, 9, 11, 3, 6]]):
            generate(tgt, build_method("ar", tgt), prompts, 0.0, 4, engine=eng)
            assert not [o for o in gc.get_objects() if type(o) is Batch]
    finally:
        gc.enable()


def test_a_closed_server_lets_go_of_its_slots(models):
    """`Server.close`: the slots go at once, and no admitted newcomer group's `Batch` is left behind for the garbage
    collector."""
    import gc

    from dmtp.engine.decode import Batch
    from dmtp.engine.server import Server

    tgt, mtp = models
    gc.collect()
    gc.disable()
    try:
        srv = Server(tgt, build_method("mtp", tgt, mtp=mtp), 2, 32, max_new_tokens=6)
        srv.run([[5, 7, 9], [4, 8], [3]])
        assert any(isinstance(o, Batch) for o in gc.get_objects())
        srv.close()
        assert not [o for o in gc.get_objects() if isinstance(o, Batch)]
    finally:
        gc.enable()


def test_a_batch_of_a_servers_shapes_compiles_nothing_the_server_needs(models):
    """`generate(capacity=...)` at a server's batch, capacity and `max_new_tokens` has the server's shapes: the
    benchmark's stage timing at a batch cap compiles each method once for the throughput runs that follow."""
    from torch._dynamo.utils import counters

    from dmtp.config import EngineConfig
    from dmtp.engine.slots import capacity_for
    from dmtp.engine.server import Server

    tgt, mtp = models
    eng = EngineConfig(engine="compiled")
    from dmtp.models import fast

    reqs = [[5, 7, 9], [4, 8], [3 + i % 90 for i in range(130)], [7]]  # the long one comes later: a larger cache
    m = build_method("mtp", tgt, mtp=mtp)
    capacity = capacity_for(reqs, 6, m.k)
    assert fast.round_capacity(capacity) != fast.round_capacity(capacity_for(reqs[:2], 6, m.k))  # shapes differ
    generate(tgt, m, reqs[:2], 0.0, 6, eos_ids=(), engine=eng, capacity=capacity)
    before = counters["stats"]["unique_graphs"]
    srv = Server(tgt, build_method("mtp", tgt, mtp=mtp), 2, capacity, max_new_tokens=6, engine=eng)
    out = srv.run(reqs)
    srv.close()
    assert counters["stats"]["unique_graphs"] == before and len(out) == 4
    assert [r.output_ids for r in out[:2]] == [r.output_ids for r in generate(tgt, m, reqs[:2], 0.0, 6, engine=eng)]


def test_stage_timing_after_a_server_compiles_nothing_new(models):
    """The benchmark's order: throughput (a server per method) first, then the stage times at the same cap
    (`stage_times`, a StageTimer on the method, `generate(capacity=...)` at the server's shapes) replay its graphs."""
    from dmtp.cli.bench.common import stage_times
    from dmtp.config import EngineConfig
    from dmtp.engine.slots import capacity_for
    from dmtp.engine.runner import compiled_graphs
    from dmtp.engine.server import Server

    tgt, mtp = models
    eng = EngineConfig(engine="compiled")
    reqs = [[5, 7, 9], [4, 8], [3 + i % 90 for i in range(130)], [7]]
    m = build_method("mtp", tgt, mtp=mtp)
    capacity = capacity_for(reqs, 20, m.k)
    srv = Server(tgt, m, 2, capacity, max_new_tokens=20, engine=eng)
    srv.run(reqs)
    srv.close()
    before = compiled_graphs()
    ms, res = stage_times(tgt, build_method("mtp", tgt, mtp=mtp), [reqs[0], reqs[1]], 20, skip=2, engine=eng,
                          capacity=capacity)
    assert compiled_graphs() == before
    assert ms["round"] > 0 and len(res) == 2
