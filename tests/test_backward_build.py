"""fa2_bwd.cu compiles to a cubin for sm_90 with NVRTC on the CPU, each of its three kernels in
registers alone (no local memory), for every head_dim's default tiles (32 to 192), causal or not,
both dQ modes (the atomic mode's convert kernel, the deterministic mode's dQ kernel), fp16 and bf16
(FA_BF16: the mma and cvt of bf16 in its PTX); registers are read from the cubin
(fa_sim.contract.cubin) and printed with -s. head_dim 256 is refused (its dV, dK would spill)."""

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="compiling needs NVRTC (the hw extra)")

from fa_sim.contract.backward import (CONVERT_KERNEL, DQ_KERNEL, HEAD_DIMS, BackwardBuild,  # noqa: E402
                                      BackwardConfig, compile_backward)
from fa_sim.isa.sm80 import SMEM_OPT_IN_BYTES  # noqa: E402


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 160, 192])
def test_compiles_for_sm90_without_spills(head_dim, causal, deterministic, dtype):
    build = BackwardBuild(BackwardConfig(head_dim, dtype=dtype), causal, deterministic, "sm_90")
    compiled = compile_backward(build)
    assert list(compiled.usage) == list(build.kernels)
    assert (DQ_KERNEL in build.kernels) == deterministic and (CONVERT_KERNEL in build.kernels) != deterministic
    print(build.describe(), {k: (u.registers, u.stack_bytes) for k, u in compiled.usage.items()})
    for name, usage in compiled.usage.items():
        assert usage.stack_bytes == 0, f"{name} spills ({usage.stack_bytes} bytes of local memory)"
        assert 0 < usage.registers <= 255


def test_bf16_builds_run_bf16_mma_and_conversions():
    """FA_BF16 in the macros, and in the PTX: mma .bf16 and cvt.rn.bf16x2.f32 only (no f16 forms)."""
    from fa_sim.contract.nvrtc import compile_ptx

    for dtype, half in (("fp16", "f16"), ("bf16", "bf16")):
        build = BackwardBuild(BackwardConfig(64, dtype=dtype), True, False, "sm_80")
        assert build.macros()["FA_BF16"] == int(dtype == "bf16")
        ptx = compile_ptx(build.source(), name="fa2_bwd.cu", arch="sm_80", macros=build.macros())
        other = "bf16" if half == "f16" else "f16"
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{half}.{half}.f32" in ptx
        assert f"cvt.rn.{half}x2.f32" in ptx
        assert f".f32.{other}.{other}.f32" not in ptx and f"cvt.rn.{other}x2.f32" not in ptx


def test_configs_that_do_not_tile_or_fit_are_refused():
    with pytest.raises(ValueError, match="does not tile"):
        BackwardConfig(64, block_m=48)
    with pytest.raises(ValueError, match="does not tile"):  # 160 / (8 * 4) = 5 n8 tiles per dQ warp column: odd
        BackwardConfig(160, block_m=16)
    with pytest.raises(ValueError, match=r"head_dim 256 is not supported .*over the 255 a thread has"):
        BackwardConfig(256)
    with pytest.raises(ValueError, match="dtype 'fp32' is not supported by the backward pass"):
        BackwardConfig(64, dtype="fp32")
    with pytest.raises(ValueError, match=f"bytes of shared memory, over SM80's {SMEM_OPT_IN_BYTES}"):
        BackwardConfig(192, block_m=128, n_warps=8)
    assert BackwardConfig(128).block_m == 32 and BackwardConfig(64).block_n == 64
    assert {d: BackwardConfig(d).block_m for d in (96, 160, 192)} == {96: 64, 160: 32, 192: 16}


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_default_tiles_fit_the_shared_memory_of_sm80(head_dim):
    """smem_bytes (sQ, sdO [block_m][d + 8], sK, sV [block_n][d + 8] halves, sdS [block_n][block_m + 8]
    halves, sLSE, sD [block_m] fp32) and dq_smem_bytes (block_m -> dq_block_m, no sdS), as fa2_bwd.cu's
    static_asserts check them, under 163 KiB."""
    cfg = BackwardConfig(head_dim)
    p = head_dim + 8
    assert cfg.smem_bytes == (4 * cfg.block_m * p + 4 * cfg.block_n * p + 2 * cfg.block_n * (cfg.block_m + 8)
                              + 8 * cfg.block_m)
    assert cfg.dq_smem_bytes == 4 * cfg.dq_block_m * p + 4 * cfg.block_n * p + 8 * cfg.dq_block_m
    assert max(cfg.smem_bytes, cfg.dq_smem_bytes) <= SMEM_OPT_IN_BYTES


def test_fa_hw_backward_checks_its_inputs_before_any_gpu_work():
    import numpy as np

    import fa_hw

    q = np.zeros((1, 1, 16, 32), np.float16)
    bad = q.copy()
    bad[0, 0, 2, 3] = np.inf
    with pytest.raises(ValueError, match=r"do contains NaN or Inf, first at do\[0, 0, 2, 3\]"):
        fa_hw.backward(q, q, q, q, np.zeros((1, 1, 16), np.float32), bad)
    with pytest.raises(ValueError, match="lse is missing"):
        fa_hw.backward(q, q, q, q, None, q)
    rough = np.full((1, 1, 16, 32), 1 + 2.0 ** -10, np.float32)  # fp16 holds it, bf16 does not
    with pytest.raises(ValueError, match="q \\(float32\\) holds 512 values that bf16 does not represent exactly"):
        fa_hw.backward(rough, q, q, q, np.zeros((1, 1, 16), np.float32), q, dtype="bf16")
