"""The fused chunked linear + cross-entropy (`dmtp.training.losses`) against F.cross_entropy of the materialised
logits: loss, top-1 accuracy and both gradients in fp32 for chunk sizes that do and do not divide the token count,
ignored rows, a weight tied to the input embedding, bf16 autocast; bad inputs refused. The pretraining loop with the
fused loss on and off is in test_compiled_training.py, the CUDA path in test_cuda.py."""
import pytest
import torch
import torch.nn.functional as F

from dmtp.training.losses import _chunk_terms, linear_cross_entropy

V, H = 97, 24


def rel(a, b):
    """||a - b|| / ||b||: a relative error that does not hinge on near-zero entries (or on the thread count)."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def inputs(shape=(3, 20), seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (2 * torch.randn(*shape, H, generator=g)).requires_grad_()
    w = (0.5 * torch.randn(V, H, generator=g)).requires_grad_()
    y = torch.randint(0, V, shape, generator=g)
    y[..., ::2] = (h @ w.T).argmax(-1)[..., ::2]  # half the tokens predictable: an accuracy near 1/2, not 1/V
    return h, w, y


def plain(h, w, y):
    """The path the fused loss replaces: materialised logits, fp32 cross-entropy, argmax accuracy."""
    z = F.linear(h, w).float()
    keep = y != -100
    return F.cross_entropy(z.reshape(-1, V), y.reshape(-1)), (z.argmax(-1) == y)[keep].float().mean()


def grads(fn, h, w, y, scale=1.0):
    loss, acc = fn(h, w, y)
    h.grad = w.grad = None
    (scale * loss).backward()
    return loss.detach(), acc, h.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("chunk", [1, 7, 12, 60, 1000])  # N = 60 tokens: 7 leaves a short last chunk
@pytest.mark.parametrize("ignore", [False, True])
def test_fused_loss_and_gradients_equal_the_materialised_ones(chunk, ignore):
    h, w, y = inputs()
    if ignore:
        y[0, ::3] = -100
        y[2, 5:] = -100
    ref = grads(plain, h, w, y, 0.3)  # 0.3: the incoming gradient (mtp_lambda) scales both gradients
    got = grads(lambda *a: linear_cross_entropy(*a, chunk=chunk), h, w, y, 0.3)
    assert got[0].dtype == torch.float32 and got[0].item() == pytest.approx(ref[0].item(), rel=1e-6)
    assert got[1].item() == ref[1].item()
    assert rel(got[2], ref[2]) < 1e-5 and rel(got[3], ref[3]) < 1e-5
    if ignore:
        assert (got[2][0, ::3] == 0).all() and (got[2][2, 5:] == 0).all()


@pytest.mark.parametrize("chunk", [7, 1000])
def test_topk_logits_and_their_gradient_equal_the_materialised_ones(chunk):
    """topk > 0 (DFlash2's selector reads each row's top-k logits): the values and indices of `z.float().topk(k)`
    over the whole logits, made chunk by chunk, and the gradient that reaches h and w through the values (a
    downstream term c . values beside the CE) equals the materialised path's, within fp32 rounding."""
    h, w, y = inputs()
    y[1, ::4] = -100  # rows without a label still rank their logits (the selector masks them itself)
    c = torch.randn(3, 20, 5, generator=torch.Generator().manual_seed(1))

    def materialised(h, w, y):
        loss, acc = plain(h, w, y)
        v, i = F.linear(h, w).float().topk(5, -1)
        return loss + (c * v).sum(), acc, i

    def fused(h, w, y):
        loss, acc, v, i = linear_cross_entropy(h, w, y, chunk=chunk, topk=5)
        assert v.shape == i.shape == (3, 20, 5) and v.dtype == torch.float32
        return loss + (c * v).sum(), acc, i

    out = {}
    for name, fn in (("ref", materialised), ("got", fused)):
        loss, acc, idx = fn(h, w, y)
        h.grad = w.grad = None
        loss.backward()
        out[name] = loss.detach(), idx, h.grad.clone(), w.grad.clone()
    (l0, i0, gh0, gw0), (l1, i1, gh1, gw1) = out["ref"], out["got"]
    assert torch.equal(i1, i0) and l1.item() == pytest.approx(l0.item(), rel=1e-6)
    assert rel(gh1, gh0) < 1e-5 and rel(gw1, gw0) < 1e-5
    assert linear_cross_entropy(h, w, y, topk=0)[0].shape == () and len(linear_cross_entropy(h, w, y)) == 2


def test_tied_embedding_gradients_add_up():
    """The LM head's weight is the input embedding, read by both heads (main and MTP): its gradient is the sum of
    the lookup's and both losses', as with the materialised logits."""
    g = torch.Generator().manual_seed(1)
    emb = torch.nn.Parameter(torch.randn(V, H, generator=g))
    ids = torch.randint(0, V, (2, 33), generator=g)
    mix = torch.randn(H, H, generator=g) / H ** 0.5

    def total(loss_fn):
        h = torch.tanh(emb[ids] @ mix)
        a, _ = loss_fn(h[:, :-1], emb, ids[:, 1:])
        b, _ = loss_fn(h[:, 1:-1] @ mix, emb, ids[:, 2:])
        emb.grad = None
        (a + 0.3 * b).backward()
        return emb.grad.clone()

    ref = total(plain)
    got = total(lambda *a: linear_cross_entropy(*a, chunk=16))
    assert rel(got, ref) < 1e-5


def test_bf16_autocast():
    """Under bf16 autocast the logits are bf16 as `F.linear`'s would be (the same numbers as bf16 inputs without
    autocast), the loss fp32, the gradients in the inputs' dtype (fp32). Against the materialised bf16 logits: the
    loss within 1e-4 (relative), the gradients within 1e-2 (both round dz and dh to bf16; the plain dW is one bf16
    GEMM, the fused one per-chunk bf16 GEMMs summed in fp32)."""
    h, w, y = inputs((4, 50))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = grads(plain, h, w, y)
        got = grads(lambda *a: linear_cross_entropy(*a, chunk=64), h, w, y)
    assert got[0].dtype == torch.float32 and got[2].dtype == got[3].dtype == torch.float32
    assert got[0].item() == pytest.approx(ref[0].item(), rel=1e-4)
    assert rel(got[2], ref[2]) < 1e-2 and rel(got[3], ref[3]) < 1e-2
    assert abs(got[1].item() - ref[1].item()) <= 2 / 200  # a bf16 near-tie may round the other way: 2 of 200 tokens
    cast = linear_cross_entropy(h.detach().bfloat16(), w.detach().bfloat16(), y, chunk=64)
    assert cast[0].item() == got[0].item() and cast[1].item() == got[1].item()


def test_no_label_left():
    h, w, y = inputs((1, 10))
    loss, acc = linear_cross_entropy(h, w, torch.full_like(y, -100), chunk=4)
    loss.backward()
    assert loss.item() == 0 and acc.item() == 0 and not h.grad.any() and not w.grad.any()


def test_chunk_terms_trace_as_one_graph():
    """The helper that CUDA runs through Inductor traces without a graph break and gives the eager numbers."""
    g = torch.Generator().manual_seed(2)
    z, y = torch.randn(30, V, generator=g), torch.randint(0, V, (30,), generator=g)
    y[::4] = -100
    scale = torch.tensor(1 / 23)
    traced = torch.compile(_chunk_terms, backend="aot_eager", fullgraph=True)(z, y, scale, -100)
    for a, b in zip(traced, _chunk_terms(z, y, scale, -100)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


def test_bad_inputs():
    h, w, y = inputs((2, 5))
    for chunk in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=f"chunk={chunk!r}: expected an integer >= 1"):
            linear_cross_entropy(h, w, y, chunk=chunk)
    with pytest.raises(ValueError, match=r"weight \(97, 23\): expected \[vocab, 24\]"):
        linear_cross_entropy(h, w[:, :-1], y)
    with pytest.raises(ValueError, match=r"labels \(2, 4\) torch.int64: expected integer labels of shape \(2, 5\)"):
        linear_cross_entropy(h, w, y[:, :-1])
    with pytest.raises(ValueError, match="expected integer labels"):
        linear_cross_entropy(h, w, y.float())


def test_pretrain_config_fields():
    """fused_ce and ce_chunk are checked, and change how the loss is computed, not what a stage makes: outside the
    target stage's fingerprint, as `compile` is."""
    from dmtp.cli.stages import fingerprint
    from dmtp.training.pretrain import PretrainConfig

    with pytest.raises(ValueError, match="fused_ce='yes': expected one of 'auto', 'on', 'off'"):
        PretrainConfig(fused_ce="yes")
    with pytest.raises(ValueError, match="ce_chunk=0: expected an integer >= 1"):
        PretrainConfig(ce_chunk=0)
    assert fingerprint(PretrainConfig(fused_ce="off", ce_chunk=5)) == fingerprint(PretrainConfig())
