"""fa_hw compiles without a GPU: NVRTC (cuda.core) -> cubin for sm_80 and sm_90, SASS by nvdisasm.

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
"""

from __future__ import annotations

import re

import pytest

from fa_hw import CompileError, compile_kernel
from fa_hw.compile import KERNEL_NAME, KernelBuild, _nvrtc
from fa_hw.sass import opcode_counts
from fa_sim.config import KernelConfig

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


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("cfg", FAMILY, ids=lambda c: c.tag)
@pytest.mark.parametrize("arch", ARCHS)
def test_family_compiles(arch, cfg, causal, record_property):
    ck = compile_kernel(cfg, causal=causal, arch=arch)
    assert _elf_sm(ck.cubin) == int(arch[3:])
    assert KERNEL_NAME.encode() in ck.cubin
    assert 0 < ck.usage.registers <= 255
    record_property("registers", ck.usage.registers)
    record_property("spill_stores", ck.usage.spill_stores)


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
    assert re.search(r"Used \d+ registers", ck.log)


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
              f"{ck.usage.spill_stores} B spill stores, HMMA {ops['HMMA.16816.F32']}, "
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
