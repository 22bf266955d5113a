"""Occupancy arithmetic of SM80: how many CTAs of a kernel an SM holds at once, and the
`__launch_bounds__` minimum the kernel is compiled with.

- `min_blocks_per_sm(config)`: the FA_MIN_BLOCKS heuristic (KernelBuild.min_blocks when the config
  sets none). A compile-time target, so it is part of every kernel build: changing it changes the
  cubins and the PTX.
- `resident_ctas(registers, smem_bytes, threads)`: CTAs resident per SM for a compiled kernel,
  with the CUDA occupancy calculator's rules for compute capability 8.0 (what a timing model needs):
  threads (2048 per SM), CTAs (32 per SM), registers (allocated per warp in units of 256 within
  each of 4 sub-partitions of 16384) and shared memory (164 KB per SM; each CTA's dynamic bytes plus
  the driver's 1 KB reservation, in units of 128 bytes).
"""

from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass

from ..config import KernelConfig
from ..isa.sm80 import (
    MAX_CTAS_PER_SM,
    MAX_REGISTERS_PER_THREAD,
    MAX_THREADS_PER_CTA,
    MAX_THREADS_PER_SM,
    REGISTER_ALLOC_UNIT,
    REGISTER_FILE,
    SM_SUB_PARTITIONS,
    SMEM_ALLOC_UNIT,
    SMEM_OPT_IN_BYTES,
    SMEM_PER_SM_BYTES,
    SMEM_RESERVED_BYTES,
    WARP_SIZE,
)

SMEM_PER_SM = SMEM_PER_SM_BYTES
FRAGMENT_REGISTERS = 64  # per thread beyond the accumulators: fragments, addresses, softmax temporaries


def min_blocks_per_sm(config: KernelConfig) -> int:
    """__launch_bounds__ occupancy target: CTAs per SM that still leave each thread the registers
    for its accumulators (tCrS + tCrO, 4 per m16n8 atom) plus 64 for fragments, addresses and
    softmax temporaries, capped by shared memory. Seed config: 64 + 64 = 128 registers, 4 CTAs."""
    accumulators = 4 * config.m_repeats * (config.s_n_tiles + config.o_n_tiles)
    by_regs = REGISTER_FILE // (config.n_threads * (accumulators + FRAGMENT_REGISTERS))
    by_smem = SMEM_PER_SM // (config.smem_bytes + SMEM_RESERVED_BYTES)
    return max(1, min(by_regs, by_smem))


class Limit(enum.Enum):
    """The resource that bounds the CTAs an SM holds."""

    THREADS = "threads"
    CTAS = "CTAs"
    REGISTERS = "registers"
    SHARED_MEMORY = "shared memory"


@dataclass(frozen=True)
class Occupancy:
    """CTAs per SM as each resource allows, and the least of them."""

    by_limit: dict  # Limit -> CTAs that resource allows

    @property
    def ctas(self) -> int:
        return min(self.by_limit.values())

    @property
    def limited_by(self) -> Limit:
        """The first resource (in Limit's order) that allows no more than `ctas`."""
        return next(limit for limit in Limit if self.by_limit[limit] == self.ctas)

    def warps(self, threads: int) -> int:
        """Resident warps per SM for CTAs of `threads` threads."""
        return self.ctas * _ceil_div(threads, WARP_SIZE)


def resident_ctas(registers: int, smem_bytes: int, threads: int) -> Occupancy:
    """CTAs of a kernel resident on one SM at once (module docstring). registers: per thread (the
    cubin's, fa_sim.contract.cubin.ResourceUsage); smem_bytes: dynamic shared memory per CTA."""
    _check(registers, 0, MAX_REGISTERS_PER_THREAD, "registers per thread")
    _check(smem_bytes, 0, SMEM_OPT_IN_BYTES, "shared memory bytes per CTA")
    _check(threads, 1, MAX_THREADS_PER_CTA, "threads per CTA")
    registers, smem_bytes, threads = int(registers), int(smem_bytes), int(threads)
    warps = _ceil_div(threads, WARP_SIZE)
    per_warp = _round_up(registers * WARP_SIZE, REGISTER_ALLOC_UNIT)
    if per_warp * _round_up(warps, SM_SUB_PARTITIONS) > REGISTER_FILE:
        by_regs = 0  # the launch check assumes every sub-partition holds a share of the CTA's warps
    elif per_warp:
        by_regs = (REGISTER_FILE // SM_SUB_PARTITIONS // per_warp) * SM_SUB_PARTITIONS // warps
    else:
        by_regs = MAX_CTAS_PER_SM
    smem = _round_up(smem_bytes + SMEM_RESERVED_BYTES, SMEM_ALLOC_UNIT)
    return Occupancy({Limit.THREADS: MAX_THREADS_PER_SM // (warps * WARP_SIZE), Limit.CTAS: MAX_CTAS_PER_SM,
                      Limit.REGISTERS: by_regs, Limit.SHARED_MEMORY: SMEM_PER_SM // smem})


def _check(value, lo: int, hi: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise ValueError(f"{what} must be an integer in {lo}..{hi} (SM80), got {value!r}")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, unit: int) -> int:
    return _ceil_div(a, unit) * unit
