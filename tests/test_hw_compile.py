"""fa_hw compiles without a GPU: NVRTC (fa_sim.contract.nvrtc) -> cubin for sm_80 and sm_90, SASS by nvdisasm.

What each test covers, honestly:
- `test_family_compiles`: every KernelConfig of the family, causal and not, for sm_80 and sm_90
  (312 kernels). It goes through the on-disk cubin cache ($FLASHSIM_CACHE or ~/.cache/flashsim),
  whose key is the exact kernel source, macros, NVRTC options and NVRTC version: a hit means this
  very source compiled with this very NVRTC. A cold run compiles all 312 (about 3 minutes on a
  2-core machine, measured); later runs re-check from the cache in seconds.
- `test_representative_subset_compiles_uncached`: NVRTC runs for real every time on a subset
  spanning every axis of the family (head dims, tile sizes, warps, layouts, causal, debug build).
- `test_seed_sass`: the seed kernel's SASS holds the SM80 instructions the schedule names, and
  no local-memory spills.
- Registers and local memory are read from the cubin (fa_sim.contract.cubin), never from ptxas's log, which
  NVRTC 13 leaves empty on a compute-cache hit: the cubin's numbers equal ptxas's report (compiled
  with NVRTC's `--no-cache`, so that the report is always there), and an empty log changes nothing.
"""

from __future__ import annotations

import functools
import re

import pytest

from fa_hw import CompileError, ResourceUsage, compile_kernel
from fa_sim.contract import cubins
from fa_sim.contract.cubins import _nvrtc
from fa_sim.config import KernelConfig
from fa_sim.contract import KERNEL_NAME, SEED_PATH, KernelBuild
from fa_sim.contract.cubin import CubinError
from fa_sim.contract.sass import opcode_counts
from nvrtc_ahead import Kind

pytest.importorskip("cuda.core")

FAMILY = KernelConfig.family()
SEED = KernelConfig()
ARCHS = ("sm_80", "sm_90")
ELF_MACHINE_CUDA = 190


def _elf_sm(cubin: bytes) -> int:
    """SM version recorded in a CUDA ELF's e_flags (low byte, e.g. 90 for sm_90)."""
    assert cubin[:4] == b"\x7fELF", "not an ELF cubin"
    assert int.from_bytes(cubin[18:20], "little") == ELF_MACHINE_CUDA
    flags = int.from_bytes(cubin[48:52], "little")
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF  # ELF ABI v8 moved the SM byte


@pytest.mark.nvrtc_ahead(Kind.CUBIN, lambda arch, cfg, causal: KernelBuild(cfg, causal, arch))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("cfg", FAMILY, ids=lambda c: c.tag)
@pytest.mark.parametrize("arch", ARCHS)
def test_family_compiles(arch, cfg, causal, record_property):
    ck = compile_kernel(cfg, causal=causal, arch=arch)
    assert _elf_sm(ck.cubin) == int(arch[3:])
    assert KERNEL_NAME.encode() in ck.cubin
    assert 0 < ck.usage.registers <= 255
    record_property("registers", ck.usage.registers)
    record_property("stack_bytes", ck.usage.stack_bytes)


SUBSET = [
    (SEED, False, False), (KernelConfig(smem="plain"), True, False), (KernelConfig(smem="padded"), False, True),
    (KernelConfig(block_m=128, block_n=32, head_dim=32, n_warps=4), True, False),
    (KernelConfig(block_m=128, block_n=128, head_dim=128, n_warps=8, smem="padded"), False, False),
    (KernelConfig(block_m=128, block_n=64, head_dim=64, n_warps=8, smem="plain"), True, True),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cfg,causal,debug", SUBSET, ids=lambda x: getattr(x, "tag", str(x)))
def test_representative_subset_compiles_uncached(arch, cfg, causal, debug):
    ck = compile_kernel(cfg, causal=causal, arch=arch, checkpoints=debug, use_cache=False)
    assert _elf_sm(ck.cubin) == int(arch[3:])
    assert 0 < ck.usage.registers <= 255


@pytest.mark.parametrize("arch", ARCHS)
def test_seed_sass(arch, capsys):
    ck = compile_kernel(SEED, arch=arch)
    ops = opcode_counts(ck.sass())
    for needed in ("HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128"):
        assert ops[needed] > 0, f"{needed} missing from the seed kernel's SASS"
    assert any(op.startswith("SHFL.BFLY") for op in ops) and any(op.startswith("BAR.SYNC") for op in ops)
    local = {op: n for op, n in ops.items() if op.startswith(("LDL", "STL"))}
    assert not local, f"local-memory traffic (spills) in the seed kernel: {local}"
    assert not ck.usage.spills and ck.usage.stack_bytes == 0
    # one QK (32) and one PV (32) per round, 4 warps x 16 rows: the loop body is emitted once
    assert ops["HMMA.16816.F32"] == 64 and ops["LDSM.16.MT88.4"] == 16
    with capsys.disabled():
        print(f"\n[fa_hw] seed kernel {arch}: {ck.usage.registers} registers, "
              f"{ck.usage.stack_bytes} B stack frame, HMMA {ops['HMMA.16816.F32']}, "
              f"LDSM {ops['LDSM.16.M88.4']} + {ops['LDSM.16.MT88.4']} (.trans)")


def test_seed_is_register_bounded_for_four_ctas_per_sm():
    ck = compile_kernel(SEED, arch="sm_90")
    assert KernelBuild().min_blocks == 4 and ck.usage.registers <= 128


def test_compile_error_carries_the_log():
    with pytest.raises(CompileError) as info:
        _nvrtc("extern \"C\" __global__ void f() { undefined_name = 1; }", KernelBuild(arch="sm_90"))
    assert "undefined_name" in info.value.log and "\n" not in str(info.value)


def test_debug_build_static_checks_hold_for_the_family_sample():
    # the kernel static_asserts its checkpoint slot width against fa_sim.checkpoints
    for cfg in (SEED, KernelConfig(block_m=128, block_n=128, head_dim=32, n_warps=8)):
        assert compile_kernel(cfg, arch="sm_90", checkpoints=True).usage.registers > 0


# ---- resource usage from the cubin, whatever the log says ---------------------------------------
SPILLS = KernelConfig(block_m=128, block_n=128, head_dim=128, n_warps=4)  # > 255 registers: spills


def _ptxas_report(log: str) -> tuple[int, int, int, int] | None:
    """(registers, stack frame, spill stores, spill loads) from ptxas -v, None if the log is empty."""
    regs = re.search(r"Used (\d+) registers", log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return None if not (regs and frame) else (int(regs[1]), int(frame[1]), int(frame[2]), int(frame[3]))


@pytest.mark.parametrize("cfg,arch", [(SEED, "sm_90"), (SEED, "sm_80"), (SPILLS, "sm_90"),
                                      (KernelConfig(head_dim=32, block_n=32, smem="padded"), "sm_80")],
                         ids=lambda x: getattr(x, "tag", str(x)))
def test_cubin_usage_equals_ptxas_report(cfg, arch, monkeypatch):
    """ptxas's own report, made certain: NVRTC's `--no-cache` (ProgramOptions.no_cache) keeps its
    compute cache out of this one compile, so the log is never empty and this test never skips."""
    from fa_hw.sass_counts import local_memory_bytes

    from fa_sim.contract import nvrtc

    options = nvrtc.cubin_options
    monkeypatch.setattr(nvrtc, "cubin_options", lambda arch, macros={}: [*options(arch, macros), "--no-cache"])
    ck = compile_kernel(cfg, arch=arch, use_cache=False)
    report = _ptxas_report(ck.log)
    assert report is not None, f"NVRTC --no-cache returned no ptxas report:\n{ck.log}"
    regs, frame, stores, loads = report
    assert (ck.usage.registers, ck.usage.stack_bytes) == (regs, frame)
    assert local_memory_bytes(ck.sass()) == (stores, loads)  # spill bytes: counted from the SASS
    assert ck.usage.spills == (cfg == SPILLS)


def test_an_empty_nvrtc_log_changes_nothing(monkeypatch, tmp_path):
    """NVRTC 13 returns an empty log on a compute-cache hit: usage must not depend on it."""
    want = compile_kernel(SEED, arch="sm_90", use_cache=False).usage
    real = cubins._nvrtc
    monkeypatch.setattr(cubins, "_nvrtc", lambda source, build: (real(source, build)[0], ""))
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    fresh = compile_kernel(SEED, arch="sm_90")  # compiles (empty cache) and stores
    cached = compile_kernel(SEED, arch="sm_90")  # reads the entry back
    assert fresh.log == cached.log == "" and fresh.usage == cached.usage == want
    meta = next(tmp_path.rglob("*.json")).read_text()
    assert '"format": 2' in meta


def test_cache_entries_are_keyed_by_format(tmp_path, monkeypatch):
    build = KernelBuild(SEED, arch="sm_90")
    source = SEED_PATH.read_text()
    key = cubins._cache_key(source, build)
    monkeypatch.setattr(cubins, "CACHE_FORMAT", cubins.CACHE_FORMAT + 1)
    assert cubins._cache_key(source, build) != key


def test_a_corrupt_cache_entry_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    want = compile_kernel(SEED, arch="sm_90")
    cubin = next(tmp_path.rglob("*.cubin"))
    cubin.write_bytes(cubin.read_bytes()[:200])  # truncated by a full disk, say
    assert compile_kernel(SEED, arch="sm_90").usage == want.usage


@pytest.mark.parametrize("blob, message", [(b"not an elf", "not a 64-bit"), (b"\x7fELF\x02\x01" + bytes(10), "malformed")])
def test_bad_cubin_bytes_are_a_clear_error(blob, message):
    with pytest.raises(CubinError, match=message):
        ResourceUsage.from_cubin(blob, KERNEL_NAME)


def test_a_cubin_without_the_kernel_is_a_clear_error():
    cubin = compile_kernel(SEED, arch="sm_90").cubin
    with pytest.raises(CubinError, match="'other_kernel' is not in the cubin's symbol table"):
        ResourceUsage.from_cubin(cubin, "other_kernel")


def test_compile_many_fills_the_cache_in_parallel(tmp_path, monkeypatch):
    from fa_sim.contract.cubins import compile_many

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    builds = [KernelBuild(SEED, arch="sm_90"), KernelBuild(KernelConfig(softmax="ffma"), causal=True, arch="sm_90")]
    got = compile_many(builds, workers=2)
    assert [c.build for c in got] == builds and len(list(tmp_path.rglob("*.cubin"))) == 2
    assert [c.usage for c in got] == [compile_kernel(b.config, causal=b.causal, arch="sm_90").usage for b in builds]


@pytest.mark.parametrize("build", [KernelBuild(SEED, arch="sm_90"),
                                   KernelBuild(KernelConfig(smem="padded", head_dim=32, block_n=32), True, "sm_80", True)],
                         ids=lambda b: f"{b.config.tag}-{b.arch}")
def test_the_contract_cubin_is_cuda_core_s_cubin(build):
    """fa_sim.contract.nvrtc drives cuda.bindings.nvrtc with the options cuda.core's ProgramOptions
    writes: the cubin is byte for byte that of cuda.core.Program, the log the same report (ptxas's
    compile time aside; NVRTC's own compute cache may leave either log empty, see above)."""
    from cuda.core import Program, ProgramOptions

    from fa_sim.contract import nvrtc

    source = build.source().text
    options = ProgramOptions(name="fa2_fwd.cu", arch=build.arch, std="c++17", ptxas_options=["-v"],
                             define_macro=[(k, str(v)) for k, v in sorted(build.macros().items())],
                             include_path=list(nvrtc.cuda_include_dirs()) or None)
    logs = []
    want = Program(source, "c++", options).compile("cubin", logs=type("Log", (), {"write": lambda _, t: logs.append(t)})())
    cubin, log = _nvrtc(source, build)
    assert cubin == bytes(want.code)
    untimed = functools.partial(re.sub, r"time = [\d.]+ ms", "time = ? ms")
    want_log = "".join(logs).rstrip("\x00")
    assert not (log and want_log) or untimed(log) == untimed(want_log)
