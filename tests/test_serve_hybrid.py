"""Dynamic batching on a hybrid (Gated DeltaNet + full attention) target: linear states move with their request."""
import pytest
from conftest import hf_greedy, make_drafter

from dmtp.engine.methods import build_method
from dmtp.engine.server import serve
from dmtp.models import tiny


@pytest.mark.parametrize("name", ["mtp", "zero_init_residual"])
def test_serve_hybrid_lossless(name):
    tgt, mtp = tiny.build("qwen3_5_hybrid", seed=0)
    prompts = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60], [33], [7, 7, 7]]
    eos = hf_greedy(tgt, prompts[0], 20)[3]
    ref = [hf_greedy(tgt, p, 16, eos=eos) for p in prompts]
    d = make_drafter(tgt, name) if name != "mtp" else None
    res = serve(tgt, build_method(name, tgt, drafter=d, mtp=mtp), prompts, 2, 0.0, 16, eos_ids=[eos])
    assert [r.output_ids for r in res] == ref
