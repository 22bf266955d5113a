"""fa_sim.contract.nvrtc: PTX from CUDA C++ through cuda.bindings.nvrtc, with -lineinfo, macros, a
clear error carrying NVRTC's log, and the on-disk cache shared with fa_hw (fa_sim/cache.py)."""

from __future__ import annotations

import re

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
    assert opts == ["--gpu-architecture=compute_86", "-lineinfo", "-std=c++17", "-DA=1", "-DB=x", "-I/inc"]
    with pytest.raises(ValueError, match="CUDA C\\+\\+ text"):
        compile_ptx(b"bytes")


def test_fa_kernel_ptx_is_sm80_whatever_the_cubin_arch(cache_dir):
    build = KernelBuild(KernelConfig(), causal=True, arch="sm_90", checkpoints=True)
    ptx = kernel_ptx(build)
    assert re.search(r"^\.target sm_80$", ptx, re.M) and f".entry {KERNEL_NAME}(" in ptx
    assert f'"{SEED_PATH}"' in ptx  # locations point at fa_hw's own kernel source
    assert ptx.count(f"{KERNEL_NAME}_param_") >= 11
    assert ptx == kernel_ptx(KernelBuild(KernelConfig(), causal=True, arch="sm_80", checkpoints=True))
