"""dmtp.engine.fuse: the layers' small pure pieces compiled in place; decoding stays token-identical in fp32 and undo
restores the eager modules. (CPU: Inductor's C++ backend; the GPU tests run the Triton one under CUDA graphs.)"""
import pytest
import torch
from conftest import make_drafter

from dmtp.engine.decode import build_method, generate
from dmtp.engine.fuse import fuse
from dmtp.models import tiny
from ablations.code import code

PROMPTS = [[5, 7, 9, 11], [4, 8, 1, 2, 3, 6, 9]]
METHODS = ["ar", "mtp", "dflash", "zero_init_residual"]


def _decode(tgt, mtp, drafters):
    return {n: [r.output_ids for r in generate(tgt, build_method(n, tgt, drafter=drafters.get(n), mtp=mtp),
                                               PROMPTS, 0.0, 24, eos_ids=())] for n in METHODS}


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5_moe"])
def test_fused_decoding_is_token_identical(arch):
    import transformers.models.qwen3.modeling_qwen3 as mq

    tgt, mtp = tiny.build(arch, seed=0)
    drafters = {v: make_drafter(tgt, v) for v in ("dflash", "zero_init_residual")}
    ref = _decode(tgt, mtp, drafters)
    rope = mq.apply_rotary_pos_emb
    with fuse(tgt, mtp, *drafters.values()) as f:
        kinds = {type(m).__name__ for m in f.modules}
        assert {"RMSNorm", "MLP"} <= kinds  # the drafter's own pieces
        assert any(k.endswith("RMSNorm") and k != "RMSNorm" for k in kinds)  # the target's
        assert all(m._compiled_call_impl is not None for m in f.modules)
        names = {f"{m.__name__}.{n}" for m, n, _ in f.functions}
        assert "dmtp.models.layers.apply_rope" in names and any(n.endswith(".apply_rotary_pos_emb") for n in names)
        # every module counted once although the MTP head shares the target's classes
        assert len(f.modules) == len({id(m) for m in f.modules})
        assert _decode(tgt, mtp, drafters) == ref
        fused = list(f.modules)
    assert all(m._compiled_call_impl is None for m in fused)
    import dmtp.models.layers as dd

    assert not hasattr(dd.apply_rope, "_torchdynamo_orig_callable") and mq.apply_rotary_pos_emb is rope


def test_nothing_to_fuse_is_an_error():
    with pytest.raises(ValueError, match="nothing to fuse"):
        fuse(torch.nn.Linear(2, 2), None)


def test_bench_fuse_compare_rows_and_ratios():
    """bench's side-by-side: unfused then fused stage times of the same method objects, '+fused' rows, ratios."""
    from dmtp.cli.bench import fuse_compare, stage_times

    tgt, mtp = tiny.build("qwen3", seed=0)
    drafters = {v: make_drafter(tgt, v) for v in ("dflash", "zero_init_residual")}
    built = {n: build_method(n, tgt, drafter=drafters.get(n), mtp=mtp) for n in ("dflash", "zero_init_residual")}
    eager = {}
    for n, m in built.items():
        ms, res = stage_times(tgt, m, PROMPTS, 20)
        eager[n] = (ms, [r.output_ids for r in res])
    rows, ratios = fuse_compare(tgt, [mtp, *drafters.values()], built, eager, PROMPTS, 20, "tiny", code())
    assert {r["method"] for r in rows} == {"dflash+fused", "zero_init_residual+fused"}
    assert {"round", "verify", "drafter"} <= {r["stage"] for r in rows}
    by = {r.target: r for r in ratios}
    assert by["tiny dflash fused round / unfused round (batch 2)"].note.endswith("outputs identical")
    assert by["tiny zero_init_residual fused round / unfused round (batch 2)"].note.endswith("outputs identical")
    assert "tiny fused zero_init_residual round / fused dflash round (batch 2)" in by
    assert all(m._compiled_call_impl is None for m in tgt.modules())  # undone after the comparison
