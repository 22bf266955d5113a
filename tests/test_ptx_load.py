"""fa_sim.ptx.load: CUDA source, PTX text or a path -> parsed Module, through NVRTC's PTX cache,
a pickle cache of parsed modules keyed by the PTX and the parser's own source, and an in-process
memo. Measured on the 2-core development machine for fa2_fwd.cu (seed, causal): cold (NVRTC +
parse + store) about 0.2 s, warm from disk about 6 ms once NVRTC is loaded (loading
cuda.bindings.nvrtc itself, needed for the NVRTC version in the cache key, costs about 45 ms
once per process), from the memo under 1 ms."""

from __future__ import annotations

import pickle
import time

import pytest

pytest.importorskip("cuda.bindings")

from fa_sim import cache  # noqa: E402
from fa_sim.contract import KERNEL_NAME, KernelBuild  # noqa: E402
from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.ptx import load  # noqa: E402
from fa_sim.ptx.ir import Module  # noqa: E402
from fa_sim.ptx.load import clear_memo, kernel_module, load_module  # noqa: E402

CU = 'extern "C" __global__ void scale(float* x, float s) { x[threadIdx.x] *= s; }\n'


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
    clear_memo()
    yield tmp_path / "cache"
    clear_memo()


def _forbid_parse(monkeypatch):
    def no_parse(text):
        raise AssertionError("parsed again although the module was cached")

    monkeypatch.setattr(load, "parse", no_parse)


def test_sources_text_and_paths(cache_root, tmp_path):
    m = load_module(CU)
    assert isinstance(m, Module) and list(m.kernels) == ["scale"]
    assert m.kernel().instructions[0].loc.file.endswith("kernel.cu")
    cu = tmp_path / "scale.cu"
    cu.write_text(CU)
    by_path = load_module(cu)
    assert by_path.kernel().instructions[0].loc.file == str(cu)
    assert load_module(str(cu)) is by_path  # the same PTX: the memo's module
    ptx = tmp_path / "scale.ptx"
    ptx.write_text(by_path.text)
    assert load_module(ptx) is by_path and load_module(by_path.text) is by_path


def test_disk_cache_survives_the_process_memo(cache_root, monkeypatch):
    first = load_module(CU)
    assert len(list((cache_root / "ptx-parsed").glob("*.pickle"))) == 1
    clear_memo()
    _forbid_parse(monkeypatch)
    again = load_module(CU)
    assert again == first and again is not first


def test_a_damaged_or_foreign_entry_is_parsed_again(cache_root):
    first = load_module(CU)
    (entry,) = (cache_root / "ptx-parsed").glob("*.pickle")
    for junk in (b"not a pickle", pickle.dumps({"a": 1})):
        entry.write_bytes(junk)
        clear_memo()
        assert load_module(CU) == first
        assert pickle.loads(entry.read_bytes()) == first  # rewritten


def test_key_includes_the_parser_source(cache_root, monkeypatch):
    load_module(CU)
    clear_memo()
    monkeypatch.setattr(load, "parser_fingerprint", lambda: "0" * 16)
    load_module(CU)
    assert len(list((cache_root / "ptx-parsed").glob("*.pickle"))) == 2


def test_use_cache_false_writes_nothing(cache_root):
    m = load_module(CU, use_cache=False)
    assert list(m.kernels) == ["scale"] and not cache_root.exists()


def test_bad_inputs(cache_root, tmp_path):
    with pytest.raises(ValueError, match="expected CUDA source"):
        load_module(42)
    with pytest.raises(ValueError, match="cannot read"):
        load_module(tmp_path / "missing.cu")


def test_fa_kernel_cold_and_warm(cache_root, capsys):
    build = KernelBuild(KernelConfig(), causal=True, arch="sm_80")
    cold = _cpu(kernel_module, build)
    warm_disk = []
    for _ in range(3):
        clear_memo()
        warm_disk.append(_cpu(kernel_module, build))
    memo = _cpu(kernel_module, build)
    assert kernel_module(build).kernel(KERNEL_NAME).instructions
    with capsys.disabled():
        print(f"\n  fa2_fwd.cu seed causal: cold {cold * 1e3:.0f} ms, warm from disk "
              f"{min(warm_disk) * 1e3:.1f} ms, memo {memo * 1e3:.2f} ms (CPU time)")
    assert min(warm_disk) < 0.05 and memo < min(warm_disk) < cold


def _cpu(f, *args) -> float:
    t = time.process_time()
    f(*args)
    return time.process_time() - t


@pytest.mark.parametrize("junk", [b"\x80\xff not utf-8", b"// damaged\n.version 7.0\n.target sm_80\n.entry x(\n"])
def test_a_damaged_cached_ptx_is_compiled_again_and_replaced(cache_root, junk):
    first = load_module(CU)
    (entry,) = (cache_root / "ptx").glob("*.ptx")
    good = entry.read_bytes()
    entry.write_bytes(junk)
    clear_memo()
    assert load_module(CU) == first
    assert entry.read_bytes() == good  # rewritten by the fresh compile


def test_a_cache_root_that_cannot_be_a_directory_is_no_cache(monkeypatch):
    monkeypatch.setenv("FLASHSIM_CACHE", "/proc/nocache")
    clear_memo()
    assert list(load_module(CU).kernels) == ["scale"]
    path = cache.stored_file("recorded_kernels", "k.cu", b"// a recorded kernel\n")
    assert path.read_bytes() == b"// a recorded kernel\n" and not str(path).startswith("/proc")
