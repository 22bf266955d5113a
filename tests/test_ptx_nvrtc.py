"""fa_sim.contract.nvrtc: PTX from CUDA C++ through cuda.bindings.nvrtc, with -lineinfo, macros, a
clear error carrying NVRTC's log, and the on-disk cache shared with fa_hw (fa_sim/cache.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings")

from fa_sim.contract import KERNEL_NAME, SEED_PATH, KernelBuild  # noqa: E402
from fa_sim import cache  # noqa: E402
from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.contract import nvrtc  # noqa: E402
from fa_sim.contract.nvrtc import NvrtcError  # noqa: E402
from fa_sim.contract.nvrtc import compile_ptx, kernel_ptx, nvrtc_options  # noqa: E402

SRC = """
#if SCALE != 3
#error SCALE must be 3
#endif
extern "C" __global__ void axpy(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += SCALE * x[i];
}
"""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "ptx"


def test_ptx_has_line_info_macros_and_an_absolute_file_name(cache_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ptx = compile_ptx(SRC, name="axpy.cu", macros={"SCALE": 3})
    assert re.search(r"^\.target sm_80$", ptx, re.M) and ".visible .entry axpy(" in ptx
    assert re.search(r"^\s*\.loc\s+1 7 \d+", ptx, re.M)  # the line of `y[i] += ...`
    assert f'.file\t1 "{tmp_path / "axpy.cu"}"' in ptx  # relative names are made absolute
    assert "mul.f32" in ptx or "fma.rn.f32" in ptx


def test_cache_hit_needs_no_nvrtc_and_keys_on_macros(cache_dir, monkeypatch):
    first = compile_ptx(SRC, name="/k/axpy.cu", macros={"SCALE": 3})
    assert len(list(cache_dir.glob("*.ptx"))) == 1

    def no_nvrtc(*args):
        raise AssertionError("NVRTC ran although the PTX was cached")

    monkeypatch.setattr(nvrtc, "run_nvrtc", no_nvrtc)
    assert compile_ptx(SRC, name="/k/axpy.cu", macros={"SCALE": 3}) == first
    with pytest.raises(AssertionError, match="NVRTC ran"):  # another name is another program
        compile_ptx(SRC, name="/k/other.cu", macros={"SCALE": 3})
    with pytest.raises(AssertionError, match="NVRTC ran"):
        compile_ptx(SRC, name="/k/axpy.cu", macros={"SCALE": 3}, options=["-use_fast_math"])


def test_unwritable_cache_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("FLASHSIM_CACHE", str(blocker / "sub"))
    assert ".entry axpy" in compile_ptx(SRC, name="/k/axpy.cu", macros={"SCALE": 3})
    assert not cache.store_atomic(blocker / "sub" / "x", b"1")
    assert list(tmp_path.iterdir()) == [blocker]  # no temporary left behind


def test_compile_error_carries_the_log(cache_dir):
    with pytest.raises(NvrtcError, match=r"axpy\.cu.*SCALE must be 3") as err:
        compile_ptx(SRC, name="/k/axpy.cu", macros={"SCALE": 4})
    assert "SCALE must be 3" in err.value.log and "error detected in the compilation" in err.value.log
    assert isinstance(err.value, ValueError)  # the CLI prints it as one line
    with pytest.raises(NvrtcError, match="NVRTC could not compile"):
        compile_ptx(SRC, name="/k/axpy.cu", macros={"SCALE": 3}, options=["--no-such-option"])


def test_an_empty_log_is_said_so():
    err = nvrtc._compile_error("/k/a.cu", ["-lineinfo"], "NVRTC_ERROR_COMPILATION", "")
    assert "NVRTC gave an empty log" in str(err) and "NVRTC_ERROR_COMPILATION" in str(err) and err.log == ""


@pytest.mark.parametrize("kwargs, message", [
    (dict(arch="sm80"), "not a CUDA architecture"),
    (dict(macros={"1BAD": 1}), "not a C identifier"),
    (dict(macros={"FLAG": True}), "must be an int or a str"),
    (dict(macros={"X": 1.5}), "must be an int or a str"),
    (dict(options=[""]), "non-empty str"),
])
def test_bad_arguments_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compile_ptx(SRC, **kwargs)


def test_options_line():
    opts = nvrtc_options("sm_86", {"B": "x", "A": 1}, ["-I/inc"])
    headers = [f"--include-path={d}" for d in nvrtc.cuda_include_dirs()]  # CUDA's own, after the caller's
    assert opts == ["--gpu-architecture=compute_86", "-lineinfo", "-std=c++17", "-DA=1", "-DB=x", "-I/inc", *headers]
    with pytest.raises(ValueError, match="CUDA C\\+\\+ text"):
        compile_ptx(b"bytes")


def test_fa_kernel_ptx_is_sm80_whatever_the_cubin_arch(cache_dir):
    build = KernelBuild(KernelConfig(), causal=True, arch="sm_90", checkpoints=True)
    ptx = kernel_ptx(build)
    assert re.search(r"^\.target sm_80$", ptx, re.M) and f".entry {KERNEL_NAME}(" in ptx
    assert f'"{SEED_PATH}"' in ptx  # locations point at fa_hw's own kernel source
    assert ptx.count(f"{KERNEL_NAME}_param_") >= 11
    assert ptx == kernel_ptx(KernelBuild(KernelConfig(), causal=True, arch="sm_80", checkpoints=True))


HEADERS_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

// y[i] = sum of the pair 2 * x[i] (half2 arithmetic), z[i] = their product rounded to bf16
extern "C" __global__ void halves(const __half2* x, float* y, __nv_bfloat16* z, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float2 f = __half22float2(__hmul2(x[i], __floats2half2_rn(2.0f, 2.0f)));
    y[i] = f.x + f.y;
    z[i] = __float2bfloat16(f.x * f.y);
  }
}

// one 16x16x16 tile through mma.h's wmma API (compiled, not simulated: the engine runs mma.sync)
extern "C" __global__ void tile(const __half* A, const __half* B, float* C) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 0.0f);
  wmma::load_matrix_sync(a, A, 16);
  wmma::load_matrix_sync(b, B, 16);
  wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(C, c, 16, wmma::mem_row_major);
}
"""


def test_cuda_headers_come_from_the_hw_extra_s_wheels():
    dirs, versions = nvrtc.cuda_headers()
    assert dirs and all((Path(d) / "cuda_fp16.h").is_file() and (Path(d) / "crt" / "mma.h").is_file() for d in dirs)
    assert {v.split("==")[0] for v in versions} == {p for p, _ in nvrtc.HEADER_PACKAGES}
    assert all(v.split("==")[1].startswith("13.0.") for v in versions)  # the pyproject's pin, NVRTC's version
    assert nvrtc.missing_cuda_headers() == ()


def test_a_kernel_with_cuda_headers_compiles_to_ptx_and_cubin(cache_dir):
    """cuda_fp16.h, cuda_bf16.h and mma.h compile as with nvcc, in PTX for the simulator (sm_80)
    and in a cubin for the GPU (sm_90)."""
    ptx = compile_ptx(HEADERS_SRC, name="/k/halves.cu")
    assert ".visible .entry halves(" in ptx and "wmma.mma.sync" in ptx
    assert "mul.rn.f16x2" in ptx or "mul.f16x2" in ptx
    for arch in ("sm_80", "sm_90"):
        cubin, _ = nvrtc.compile_cubin(HEADERS_SRC, name="halves.cu", arch=arch)
        assert cubin[:4] == b"\x7fELF"


def test_a_kernel_with_cuda_headers_runs_on_the_engine(cache_dir):
    import numpy as np

    from fa_sim.observers import HazardChecker
    from fa_sim.ptx import launch

    rng = np.random.default_rng(0)
    n = 100
    x = rng.integers(-8, 9, (n, 2)).astype(np.float16)  # small integers: every result is exact
    y, z = np.zeros(n, np.float32), np.zeros(n, np.uint16)
    hazards = HazardChecker()
    launch(HEADERS_SRC, grid=2, block=64, args=[x.view(np.uint32).ravel(), y, z, np.int32(n)], kernel="halves",
           observers=[hazards])
    twice = x.astype(np.float32) * 2
    np.testing.assert_array_equal(y, twice.sum(1))
    np.testing.assert_array_equal((z.astype(np.uint32) << 16).view(np.float32), twice[:, 0] * twice[:, 1])
    assert hazards.report().ok


def test_missing_header_wheels_are_named(cache_dir, monkeypatch):
    monkeypatch.setattr(nvrtc, "cuda_headers", lambda: ((), ()))
    with pytest.raises(nvrtc.CudaHeadersMissing, match=r'cuda_fp16\.h.*nvidia-cuda-runtime and nvidia-cuda-crt '
                       r"wheels of the 'hw' extra, not installed: pip install") as err:
        compile_ptx(HEADERS_SRC, name="/k/halves.cu")
    assert "\n" not in str(err.value) and "open source file \"cuda_fp16.h\"" in err.value.log
    assert ".entry axpy" in compile_ptx(SRC, name="/k/axpy.cu", macros={"SCALE": 3})  # no header: still compiles
