"""Kernels grouped by kind (`dmtp.analysis.kernels`): names as the H200 profiles print them land in the right kind,
shares add up, and the decode bench's kernel profile writes the kinds above the profiler's table."""
import pytest

from dmtp.analysis.kernels import kind_of, shares

NAMES = {  # names from results/mini/bench/profile_*.txt (torch 2.11, H200) and common CUDA libraries
    "triton_tem_fused__to_copy_add_arange_clamp_flex_attention_0": "attention",
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel": "gemm",
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>(cutlass_80_simt_sgemm_64x64_8x5_tn_align1::Params)":
        "gemm",
    "nvjet_tst_128x64_64x8_2x1_v_bz_coopB_TNT": "gemm",
    "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>": "gemm",
    "triton_tem_fused_mm_3": "gemm",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...>>": "copy",
    "Memcpy HtoD (Pageable -> Device)": "copy",
    "triton_poi_fused__to_copy_add_mul_rsqrt_0": "pointwise",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1": "reduction",
    "triton_per_fused__softmax_2": "reduction",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...FusedAdamMathFunctor...>": "optimizer",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "pointwise",
    "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4>>": "attention",
    "aten::mm": "gemm",
    "something_unheard_of": "other",
}


@pytest.mark.parametrize("name,kind", NAMES.items())
def test_kind_of_real_kernel_names(name, kind):
    assert kind_of(name) == kind


def test_shares_add_up_and_name_the_largest_kernel():
    rows = shares([("aten::mm", 600.0), ("triton_tem_fused_mm_0", 200.0), ("triton_poi_fused_add_0", 150.0),
                   ("Memset (Device)", 50.0)])
    assert [r["kind"] for r in rows] == ["gemm", "pointwise", "copy"]
    assert rows[0]["ms"] == pytest.approx(0.8) and rows[0]["share"] == pytest.approx(0.8)
    assert rows[0]["kernels"] == 2 and rows[0]["largest"] == "aten::mm"
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert shares([]) == []


def test_decode_kernel_profile_writes_kinds_then_the_table(models, tmp_path):
    from dmtp.cli.bench.profiling import kernel_profile
    from dmtp.engine.methods import build_method

    tgt, _ = models
    path = tmp_path / "p.txt"
    kernel_profile(tgt, build_method("ar", tgt), [[5, 7, 9], [4, 8]], 6, path, temperature=0.8)
    title, head, table = path.read_text().split("\n\n", 2)
    assert title == "ar, batch 2, 6 tokens, T = 0.8, CUDA graphs off"
    assert "gemm" in [line.split()[0] for line in head.splitlines()[1:]]
    assert "Self CPU time total" in table
