"""The three non-attention kernels of experiments/timing_kernels.py (a tiled mma.sync GEMM, a
shuffle reduction, a float4 copy): each compiles for sm_80 and sm_90 without spills, runs on the
PTX engine at a small size with the result equal to numpy's and no hazard, and the launch table
both modes share is consistent with the recorded GPU measurements (when there are some)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the kernels compile with NVRTC (the hw extra)")

from fa_sim.contract.cubin import ResourceUsage  # noqa: E402
from fa_sim.contract.nvrtc import compile_cubin  # noqa: E402
from fa_sim.observers import HazardChecker  # noqa: E402
from fa_sim.ptx import launch as ptx_launch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("timing_kernels", ROOT / "experiments" / "timing_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


tk = _script()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", list(tk.KERNELS))
def test_kernel_compiles_without_spills(name, arch):
    kernel = tk.KERNELS[name]
    cubin, _ = compile_cubin(kernel.source(), name=str(kernel.path), arch=arch)
    usage = ResourceUsage.from_cubin(cubin, name)
    assert usage.stack_bytes == 0 and 0 < usage.registers <= 128  # the GEMM: 2 CTAs of 256 threads an SM


@pytest.mark.parametrize("launch", tk.cpu_launches(), ids=lambda x: x.kernel.name)
def test_kernel_on_the_ptx_engine_equals_numpy_without_hazards(launch):
    args = launch.args(exact=True)
    out = args[launch.kernel.output]
    assert not out.any()
    hazards = HazardChecker()
    res = ptx_launch(str(launch.kernel.path), launch.grid, launch.block, launch.smem_bytes, args, observers=[hazards])
    launch.check(args, out, exact=True)
    assert hazards.report().ok, hazards.report()
    assert sum(res.counts.values()) > 0


def test_gemm_uses_the_sm80_features_it_claims():
    """cp.async into shared memory, ldmatrix (plain and .trans) and mma.sync m16n8k16 in the PTX."""
    from fa_sim.contract.nvrtc import compile_ptx

    kernel = tk.KERNELS["gemm_f16"]
    ptx = compile_ptx(kernel.source(), name=str(kernel.path))
    for op in ("cp.async.cg.shared.global", "cp.async.wait_group", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
               "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"):
        assert op in ptx, op
    reduce_ptx = compile_ptx(tk.KERNELS["reduce_sum"].source(), name=str(tk.KERNELS["reduce_sum"].path))
    assert "shfl.sync.bfly" in reduce_ptx and "shfl.sync.down" in reduce_ptx and "atom.global.add.f32" in reduce_ptx
    copy_ptx = compile_ptx(tk.KERNELS["copy_f4"].source(), name=str(tk.KERNELS["copy_f4"].path))
    assert re.search(r"ld\.global\.nc\.v4\.[fu]32", copy_ptx) and re.search(r"st\.global\.v4\.[fu]32", copy_ptx)


def test_the_gpu_launches_fill_the_h200_and_the_checks_catch_a_wrong_result():
    rows = tk.launches()
    assert {(r.kernel.name, r.size) for r in rows} == set(tk.PARAMS)
    for r in rows:
        ctas = r.grid[0] * r.grid[1] * r.grid[2]
        assert ctas >= 132 * (1 if r.size == "small" else 4), r.key  # every SM busy, the large ones in waves
    # the GPU checks fail on a result that lost one CTA's share
    small = tk.Launch(tk.KERNELS["reduce_sum"], "cpu", {"n": 1 << 16, "ctas": 64})
    args = small.args()
    good = np.array([args[0].sum(dtype=np.float64)], np.float32)
    assert small.check(args, good) < 1e-6
    with pytest.raises(AssertionError):
        small.check(args, good * (1 - 1 / 64))
    gemm = tk.Launch(tk.KERNELS["gemm_f16"], "cpu", {"M": 128, "N": 128, "K": 256})
    args = gemm.args()
    c = tk._gemm_expected(args).astype(np.float32)
    assert gemm.check(args, c) < 1e-4
    c[:16, 8:16] = 0  # one mma tile missing
    with pytest.raises(AssertionError):
        gemm.check(args, c)


def test_recorded_measurements_match_the_table():
    path = tk.DEFAULT_OUT
    if not path.exists():
        pytest.skip(f"{path.relative_to(ROOT)} not recorded yet (experiments/timing_kernels.py --measure on a GPU)")
    data = json.loads(path.read_text())
    by_key = {(r["kernel"], r["size"]): r for r in data["launches"]}
    assert set(by_key) == set(tk.PARAMS)
    for launch in tk.launches():
        row = by_key[(launch.kernel.name, launch.size)]
        assert row["params"] == launch.params and tuple(row["grid"]) == launch.grid
        assert tuple(row["block"]) == launch.block and row["smem_bytes"] == launch.smem_bytes
        assert len(row["batch_ms"]) == data["batches"] and row["ms"] > 0


@pytest.mark.gpu
def test_measure_on_the_gpu_checks_and_times_each_kernel():
    import fa_hw

    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    data = tk.measure(sizes=("small",), warmup=1, reps=2, batches=2)
    assert len(data["launches"]) == len(tk.KERNELS) and all(r["ms"] > 0 for r in data["launches"])
