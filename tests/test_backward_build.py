"""fa2_bwd.cu compiles to a cubin for sm_90 with NVRTC on the CPU, each of its three kernels in
registers alone (no local memory), for every head_dim's default tiles, causal or not, both dQ
modes (the atomic mode's convert kernel, the deterministic mode's dQ kernel); registers are read
from the cubin (fa_sim.contract.cubin) and printed with -s."""

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="compiling needs NVRTC (the hw extra)")

from fa_sim.contract.backward import CONVERT_KERNEL, DQ_KERNEL, BackwardBuild, BackwardConfig, compile_backward  # noqa: E402


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_compiles_for_sm90_without_spills(head_dim, causal, deterministic):
    build = BackwardBuild(BackwardConfig(head_dim), causal, deterministic, "sm_90")
    compiled = compile_backward(build)
    assert list(compiled.usage) == list(build.kernels)
    assert (DQ_KERNEL in build.kernels) == deterministic and (CONVERT_KERNEL in build.kernels) != deterministic
    print(build.describe(), {k: (u.registers, u.stack_bytes) for k, u in compiled.usage.items()})
    for name, usage in compiled.usage.items():
        assert usage.stack_bytes == 0, f"{name} spills ({usage.stack_bytes} bytes of local memory)"
        assert 0 < usage.registers <= 255


def test_configs_that_do_not_tile_are_refused():
    with pytest.raises(ValueError, match="does not tile"):
        BackwardConfig(64, block_m=48)
    with pytest.raises(ValueError, match="head_dim 96 is not supported"):
        BackwardConfig(96)
    assert BackwardConfig(128).block_m == 32 and BackwardConfig(64).block_n == 64


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
