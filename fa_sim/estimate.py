"""Time and memory of a simulation and of its float64 reference, estimated before either starts.

    est = estimate(Problem(1, 16, 65536, 65536, False, 0.125, KernelConfig()))
    print(est.describe())       # about 3.6 h and 1.0 GiB for the simulation ...
    est.check(reference=True)   # ValueError past the memory this machine has (machine_bytes)

Both backends' unit of work is the CTA-round (Problem.cta_rounds). The coefficients below were
measured on the development machine (2 shared cores, numpy 2.4, `experiments/bench_sim.py` and a
sweep over the family with tracemalloc): times hold to about +-50 % at the load they were fitted
under, memory to about +-25 %. The machine's own speed moves more: the same (1, 4, 4096, 64) run took
12.6 s when they were fitted and 7.0 s later, so the estimate errs on the long side (1.3-1.9x).
- simulation time per CTA-round: A * block_m * block_n + B * block_m * block_n * head_dim
  (exact-sum tensor core; the H200 model adds H * block_m * block_n * head_dim: every product
  separately);
- simulation memory: the fp16 inputs and outputs, plus per CTA of a wave about
  32 * block_m * (block_n + head_dim) bytes of registers and temporaries (H200 model:
  850 * block_m * max(block_n, head_dim), its products);
- reference (fa_sim.reference.attention_blocks, streamed by fa_sim.accuracy): per score
  R0 + R1 * head_dim seconds; memory one block (reference.BLOCK_BYTES) plus one head of k and v
  in float64.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .problem import Problem
from .reference import BLOCK_BYTES
from .tensorcore import EXACT, resolve

A_S = 1.5e-7  # s per (block_m * block_n) and CTA-round
B_S = 7.0e-10  # s per (block_m * block_n * head_dim) and CTA-round, exact-sum MMA
H_S = 1.2e-7  # s per (block_m * block_n * head_dim) and CTA-round, added by the H200 MMA model
R0_S, R1_S = 4.0e-8, 3.0e-10  # s per score, and per score and head_dim element, of the reference
WAVE_BYTES_EXACT = 32  # * block_m * (block_n + head_dim) per CTA of a wave
WAVE_BYTES_H200 = 850  # * block_m * max(block_n, head_dim) per CTA of a wave
GIB = 1 << 30


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_bytes() -> int:
    """The memory this process can have at most: physical memory (MemTotal, else sysconf), or the
    container's limit (cgroup v2 memory.max) if lower. Refusals compare against this, not against
    what happens to be free now, which other processes move from second to second."""
    total = _meminfo("MemTotal")
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 1 << 62  # unknown: refuse nothing
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def available_bytes() -> int:
    """Memory free for new work now (MemAvailable), for the estimate's report."""
    free = _meminfo("MemAvailable")
    return machine_bytes() if free is None else min(free, machine_bytes())


@dataclass(frozen=True)
class Estimate:
    problem: Problem
    wave_ctas: int
    sim_seconds: float
    sim_bytes: int
    reference_seconds: float
    reference_bytes: int
    machine: int  # machine_bytes(): what a run may need at most
    available: int  # available_bytes() when estimated: reported, not enforced

    def needed(self, reference: bool = False) -> int:
        return self.sim_bytes + (self.reference_bytes if reference else 0)

    def check(self, reference: bool = False) -> None:
        """ValueError when the run (and the reference) would need more memory than the machine has."""
        need = self.needed(reference)
        if need > self.machine:
            what = "simulation and float64 reference" if reference else "simulation"
            raise ValueError(f"{self.problem.describe()}: the {what} need about {_size(need)}, more than the "
                             f"{_size(self.machine)} of memory this machine has; choose a smaller problem")

    def describe(self, *, simulation: bool = True, reference: bool = True, runs: int = 1) -> str:
        """One line: the simulation (`runs` of it, e.g. one per smem layout) and/or the reference."""
        parts = []
        if simulation:
            each = "" if runs == 1 else f" each, {runs} runs"
            parts.append(f"about {_duration(self.sim_seconds)} and {_size(self.sim_bytes)} for the simulation "
                         f"({self.problem.cta_rounds:,} CTA-rounds{each})")
        if reference:
            parts.append(f"about {_duration(self.reference_seconds)} and {_size(self.reference_bytes)} for the "
                         "float64 reference")
        return f"estimate: {', '.join(parts)}; {_size(self.available)} of {_size(self.machine)} available"

    def to_json(self) -> dict:
        return {"cta_rounds": self.problem.cta_rounds, "sim_seconds": self.sim_seconds, "sim_bytes": self.sim_bytes,
                "reference_seconds": self.reference_seconds, "reference_bytes": self.reference_bytes,
                "machine_bytes": self.machine, "available_bytes": self.available}


def estimate(problem: Problem, mma_model=None, wave_ctas: int = 256) -> Estimate:
    """Time and memory of simulating `problem` (fa_sim.simulate) and of its float64 reference."""
    cfg, p = problem.config, problem
    tile = cfg.block_m * cfg.block_n
    h200 = resolve(mma_model) != EXACT  # the fitted models take every product separately
    per_round = A_S * tile + (B_S + (H_S if h200 else 0.0)) * tile * cfg.head_dim
    wave = min(wave_ctas, p.n_ctas)
    per_cta = WAVE_BYTES_EXACT * cfg.block_m * (cfg.block_n + cfg.head_dim)
    if h200:
        per_cta += WAVE_BYTES_H200 * cfg.block_m * max(cfg.block_n, cfg.head_dim)
    rows = p.batch * p.heads
    io = rows * (2 * p.seqlen_q * cfg.head_dim * 2 + 2 * p.seqlen_k * cfg.head_dim * 2 + 4 * p.seqlen_q)
    scores = rows * p.seqlen_q * p.seqlen_k
    return Estimate(problem, wave_ctas, p.cta_rounds * per_round, io + wave * per_cta,
                    scores * (R0_S + R1_S * cfg.head_dim), min(BLOCK_BYTES, 16 * p.seqlen_q * p.seqlen_k)
                    + 2 * 8 * p.seqlen_k * cfg.head_dim, machine_bytes(), available_bytes())


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / (1 << 20):.0f} MiB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
