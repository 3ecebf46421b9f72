"""Verification modes at T > 0 (`dmtp/engine/verify.py`): speculative sampling and block verification are exact.

Two layers: `accept` alone on hand-made target/draft tables (the joint law of the emitted tokens, the expected
accepted count against an exact enumeration and the paper's worked example), then the whole decode loop on a tiny
target (every mode, the methods ar, mtp, dflash, a DMTP variant and a DMTP(D2) variant: each position's law is the
target's; at T = 0 every mode is the target's greedy output).
"""
import itertools

import numpy as np
import pytest
import torch
from conftest import hf_greedy, make_drafter

from dmtp.config import EngineConfig
from dmtp.engine import verify as V
from dmtp.engine.decode import Batch, generate
from dmtp.engine.slots import capacity_for
from dmtp.engine.methods import build_method, method_class, split_drafts, split_rule
from dmtp.engine.runner import run_generate
from dmtp.engine.server import Server, serve
from dmtp.models import tiny

MODES = ["target", "sample", "block"]
METHODS = ["ar", "mtp", "dflash", "zero_init_residual", "dmtp_d2",  # dmtp_d2: zero_init_residual x dflash2
           "zero_init_residual-k2", "dmtp_d2-k2",  # -k2: the first 2 of 7 drafts verified (`Method.limit`)
           "given-p0.3"]  # T1..Tg from the MTP chain, g per request (the tiny head's top probabilities straddle 0.3)


def method(name, tgt, mtp, k=3):
    if not method_class(name).needs_drafter:
        return build_method(name, tgt, mtp=mtp, mtp_steps=k)
    base, drafts = split_drafts(name)  # "<variant>-k<n>": its first n drafts verified
    variant, backbone = split_rule(base)[0], "dflash"  # "given-p<threshold>": its count rule
    if variant == "dmtp_d2":  # the variant on the DFlash2 backbone
        variant, backbone = "zero_init_residual", "dflash2"
        name = variant + (f"-k{drafts}" if drafts else "")
    return build_method(name, tgt, drafter=make_drafter(tgt, variant, backbone=backbone), mtp=mtp)


# --- accept() on tables ------------------------------------------------------------------------------------------
def tables(V_, k, seed, chained=True, sharp=2.0):
    """Target tables P[i][code(prefix of length i)] -> [V] for i = 0..k and draft tables Q[i] for i = 0..k-1;
    chained: q depends on the whole drafted prefix (MTP chain, DFlash2 walk), else on nothing drawn in the block
    (a DFlash parallel pass)."""
    g = torch.Generator().manual_seed(seed)
    P = [torch.softmax(sharp * torch.randn(V_ ** i, V_, generator=g), -1) for i in range(k + 1)]
    Q = [torch.softmax(sharp * torch.randn(V_ ** i if chained else 1, V_, generator=g), -1) for i in range(k)]
    return P, Q


def code(x, V_):  # x [B, i] -> index of the prefix in base V
    c = torch.zeros(x.shape[0], dtype=torch.long)
    for j in range(x.shape[1]):
        c = c * V_ + x[:, j]
    return c


def run_accept(mode, P, Q, B, seed):
    """Draft B blocks from Q, verify them with `accept`, continue each emitted prefix with the target's samples to
    k+1 tokens. Returns (sequences [B, k+1], accepted n [B])."""
    g = torch.Generator().manual_seed(seed)
    k, V_ = len(Q), P[0].shape[1]
    x = torch.zeros(B, k, dtype=torch.long)
    q = torch.zeros(B, k, V_)
    for i in range(k):
        qi = Q[i][code(x[:, :i], V_)] if Q[i].shape[0] > 1 else Q[i].expand(B, V_)
        q[:, i] = qi
        x[:, i] = torch.multinomial(qi, 1, generator=g)[:, 0]
    p = torch.stack([P[i][code(x[:, :i], V_)] for i in range(k + 1)], 1)
    u = torch.rand(B, k, generator=g)
    noise = torch.empty(B, V_).exponential_(generator=g)
    y, n = V.accept(mode, p, q, x, u, noise)
    assert (y[:, :k][torch.arange(k)[None] < n[:, None]] == x[torch.arange(k)[None] < n[:, None]]).all()
    seq = y.clone()
    for t in range(1, k + 1):  # positions past n: the target's own samples given the sequence so far
        nxt = torch.multinomial(P[t][code(seq[:, :t], V_)], 1, generator=g)[:, 0]
        seq[:, t] = torch.where(n < t, nxt, seq[:, t])
    return seq, n


def expected_accepts(mode, P, Q):
    """E[n] by enumeration over the drafts (independent of `accept`): E[n] = sum_i E[P(n >= i | x_<=i)], with
    P(n >= i | x_<=i) = prod_j min(1, ratio_j) (token-wise) or b_i (block)."""
    k, V_ = len(Q), P[0].shape[1]
    tot = 0.0
    for i in range(1, k + 1):  # sum over prefixes of length i of Q(prefix) * P(n >= i | prefix)
        for x in itertools.product(range(V_), repeat=i):
            qx, acc, b, c = 1.0, 1.0, 1.0, 0
            for j in range(i):
                qj = Q[j][c if Q[j].shape[0] > 1 else 0]
                r = float(P[j][c][x[j]] / qj[x[j]])
                qx, acc, b = qx * float(qj[x[j]]), acc * min(1.0, r), min(1.0, b * r)
                c = c * V_ + x[j]
            tot += qx * (acc if mode == "sample" else b)
    return tot


def seq_law(P, k, V_):
    """Exact target law of k+1 tokens, indexed by code(sequence)."""
    law = np.zeros(V_ ** (k + 1))
    for s in itertools.product(range(V_), repeat=k + 1):
        pr, c = 1.0, 0
        for i, t in enumerate(s):
            pr *= float(P[i][c][t])
            c = c * V_ + t
        law[c] = pr
    return law


def chi2_pvalue(obs, exp, min_expected=5.0):
    """Pearson chi-square of counts against expected counts; cells expected below `min_expected` are pooled."""
    from scipy.stats import chisquare

    obs, exp = np.asarray(obs, float), np.asarray(exp, float)
    keep = exp >= min_expected
    o = np.append(obs[keep], obs[~keep].sum())
    e = np.append(exp[keep], exp[~keep].sum())
    if e[-1] == 0:
        o, e = o[:-1], e[:-1]
    e = e * o.sum() / e.sum()
    return float(chisquare(o, e).pvalue)


@pytest.mark.parametrize("mode", ["sample", "block"])
@pytest.mark.parametrize("chained", [True, False])
def test_accept_emits_the_target_law(mode, chained):
    """k = 3 drafts over a 3-token vocabulary: the 4 emitted-and-continued tokens follow the target's joint law
    (81 cells), and the mean accepted count equals an exact enumeration."""
    V_, k, B = 3, 3, 60000
    P, Q = tables(V_, k, seed=1 if chained else 2, chained=chained)
    seq, n = run_accept(mode, P, Q, B, seed=3)
    obs = np.bincount(code(seq, V_).numpy(), minlength=V_ ** (k + 1))
    p = chi2_pvalue(obs, seq_law(P, k, V_) * B)
    assert p > 1e-4, p
    want = expected_accepts(mode, P, Q)
    se = float(n.float().std()) / B ** 0.5
    assert abs(float(n.float().mean()) - want) < 4 * se + 1e-3, (float(n.float().mean()), want)
    assert set(n.tolist()) == set(range(k + 1))  # every accept count, the residual and the bonus exercised


def test_block_is_never_worse_and_matches_the_paper_example():
    """Sun et al.'s example (vocab {a, b}, context-free p = (1/3, 2/3), q = (2/3, 1/3), k = 2): E[n] = 10/9 token-wise,
    11/9 block. And on random tables block's exact E[n] >= token-wise's."""
    p, q = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    P = [p[None].expand(2 ** i, 2) for i in range(3)]
    Q = [q[None].expand(2 ** i, 2) for i in range(2)]
    assert expected_accepts("sample", P, Q) == pytest.approx(10 / 9)
    assert expected_accepts("block", P, Q) == pytest.approx(11 / 9)
    for mode, want in (("sample", 10 / 9), ("block", 11 / 9)):
        _, n = run_accept(mode, P, Q, 200000, seed=5)
        assert float(n.float().mean()) == pytest.approx(want, abs=0.01)
    for seed in range(6):
        P, Q = tables(4, 3, seed=10 + seed, chained=seed % 2 == 0, sharp=3.0)
        assert expected_accepts("block", P, Q) >= expected_accepts("sample", P, Q) - 1e-12


def test_accept_edge_cases():
    """k = 0 draws the bonus from p_0; p = q accepts every draft; a draft the target never emits is rejected."""
    g = torch.Generator().manual_seed(0)
    p0 = torch.tensor([[[0.0, 1.0, 0.0]]])
    y, n = V.accept("block", p0, torch.zeros(1, 0, 3), torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0),
                    torch.ones(1, 3))
    assert y.tolist() == [[1]] and n.tolist() == [0]
    probs = torch.softmax(torch.randn(4, 3, 5, generator=g), -1)
    x = torch.multinomial(probs[:, :2].reshape(-1, 5), 1, generator=g).view(4, 2)
    for mode in ("sample", "block"):
        u = torch.rand(4, 2, generator=g) * 0.999
        y, n = V.accept(mode, probs, probs[:, :2], x, u, torch.ones(4, 5))
        assert n.tolist() == [2] * 4 and (y[:, :2] == x).all()
    p = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])  # the target always emits token 0 first
    for mode in ("sample", "block"):
        y, n = V.accept(mode, p, torch.tensor([[[0.0, 1.0]]]), torch.tensor([[1]]), torch.zeros(1, 1),
                        torch.ones(1, 2))
        assert n.tolist() == [0] and y[0, 0] == 0
    with pytest.raises(ValueError, match="unknown verify mode 'greedy'"):
        V.check("greedy")


# --- the decode loop on a tiny target -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models5():
    return tiny.build("qwen3_5", seed=0)


PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60, 70, 80, 90], [33]]


@pytest.mark.parametrize("name", METHODS)
def test_every_mode_is_greedy_at_t0(models5, name):
    tgt, mtp = models5
    ref = [hf_greedy(tgt, p, 19) for p in PROMPTS]
    m = method(name, tgt, mtp, k=4)
    for mode in MODES:
        assert [r.output_ids for r in generate(tgt, m, PROMPTS, 0.0, 19, verify=mode)] == ref, mode
    assert [r.output_ids for r in serve(tgt, m, PROMPTS, 2, 0.0, 19, verify="block")] == ref


def position_laws(tgt, prompt, temperature, n=3):
    """Exact marginal law of each of the first n generated tokens (n <= 3, enumerated over every prefix), and the
    joint law of tokens 2 and 3 ([V, V])."""
    Vs = tgt.vocab_size

    def dist(prefixes):
        ids = torch.tensor([prompt + list(s) for s in prefixes], device=tgt.device)
        with torch.no_grad():
            out = torch.cat([tgt.model(c).logits[:, -1] for c in ids.split(2048)])
        return torch.softmax(out.double() / temperature, -1).cpu()

    p1 = dist([()])[0]  # [V]
    p2 = dist([(a,) for a in range(Vs)])  # [V(t1), V(t2)]
    p3 = dist([(a, b) for a in range(Vs) for b in range(Vs)]).view(Vs, Vs, Vs)
    j12 = p1[:, None] * p2
    j123 = j12[..., None] * p3
    return [p1.numpy(), j12.sum(0).numpy(), j123.sum((0, 1)).numpy()][:n], j123.sum(0).numpy()


@pytest.fixture(scope="module")
def laws(models5):
    return position_laws(models5[0], [5, 7, 9], 2.0)


@pytest.mark.parametrize("name", METHODS)
def test_every_mode_follows_the_target_law(models5, laws, name):
    """T = 2 (flat enough that drafts are often accepted: every accept count occurs): 1500 seeded samples of the
    first 3 tokens per mode; chi-square of each position's marginal and of the joint of tokens 2-3 (produced in
    one round from drafts, residuals and bonuses) against the exact laws. (Calibration: over other seeds and at
    N = 6000 these p-values spread uniformly; a residual replaced by p_n fails them.)"""
    tgt, mtp = models5
    marg, j23 = laws
    N, Vs = 1500, tgt.vocab_size
    m = method(name, tgt, mtp, k=3)
    for mode in MODES:
        res = generate(tgt, m, [[5, 7, 9]] * N, 2.0, 3, seed=7, verify=mode)
        seqs = np.array([r.output_ids for r in res])
        assert seqs.shape == (N, 3)
        for pos in range(3):
            pv = chi2_pvalue(np.bincount(seqs[:, pos], minlength=Vs), marg[pos] * N)
            assert pv > 1e-4, (name, mode, pos, pv)
        pv = chi2_pvalue(np.bincount(seqs[:, 1] * Vs + seqs[:, 2], minlength=Vs * Vs), j23.reshape(-1) * N)
        assert pv > 1e-4, (name, mode, "joint 2-3", pv)
        acc = [a for r in res for a in r.accepted]
        if mode != "target" and m.k:
            # accepted drafts, not only residuals, produced these laws (a record's counts are cut at its end: token 0
            # is the prefill's, so the first round's 2 tokens inside 3 count at most 1 accepted draft)
            assert max(acc) == 1 and sum(acc) > N // 10, (name, mode, sum(acc))


def test_dynamic_batching_with_newcomers_beside_the_decode_follows_the_target_law(models5, laws):
    """A server at T = 2 whose newcomers join in groups, prefilled beside the running requests (`admit_beside`):
    each request's first 3 tokens follow the target's law in every mode, whichever slot and round it joined at."""
    tgt, mtp = models5
    marg, _ = laws
    N, Vs = 1500, tgt.vocab_size
    m = method("zero_init_residual", tgt, mtp, k=3)
    prompts = [[5, 7, 9]] * N
    for mode in MODES:
        srv = Server(tgt, m, 16, capacity_for(prompts, 3, m.k), 2.0, 3, seed=11, verify=mode,
                     engine=EngineConfig(admit=4, admit_beside=2))
        seqs = np.array([r.output_ids for r in srv.run(prompts)])
        assert seqs.shape == (N, 3) and srv.groups >= (N - 16) // 16
        for pos in range(3):
            pv = chi2_pvalue(np.bincount(seqs[:, pos], minlength=Vs), marg[pos] * N)
            assert pv > 1e-4, (mode, pos, pv)


def test_records_carry_verify_and_bad_input_is_one_clear_error(models5):
    tgt, mtp = models5
    m = method("zero_init_residual", tgt, mtp)
    recs = run_generate(tgt, m, [{"id": "a", "prompt_ids": [5, 7]}], 1.0, 6, [], 4, verify="block")
    assert recs[0]["verify"] == "block" and recs[0]["method"] == "zero_init_residual"
    assert run_generate(tgt, m, [{"id": "a", "prompt_ids": [5, 7]}], 0.0, 6, [], 4)[0]["verify"] == "target"
    with pytest.raises(ValueError, match="unknown verify mode 'blocks'"):
        generate(tgt, m, [[5, 7]], 1.0, 4, verify="blocks")
    from dmtp.models.screen import T1Screen

    screened = build_method("mtp", tgt, mtp=mtp, screen=T1Screen(tgt, rank=8, topk=8))
    with pytest.raises(ValueError, match="screened T1 head"):
        Batch(tgt, screened, [[5, 7]], 1.0, 4, set(), torch.Generator().manual_seed(0), verify="sample")
