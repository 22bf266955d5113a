"""Local memory (spills, local arrays) in the L1 and the L2: what the SM model charges an LDL / STL
(issue 35, item 4; docs/timing.md, "Memory requests: sectors, lines and local memory").

Three facts and one derivation, no fitted share:

- **The L1 left beside the shared memory.** sm_90 has 256 KB of L1 and shared memory per SM, sm_80
  192 KB; the driver configures the shared memory as one of a few capacities (sm_90: 0, 8, 16, 32,
  64, 100, 132, 164, 196, 228 KB; CUDA C++ Programming Guide, compute capability 9.0, and NVIDIA's
  Hopper tuning guide), the rest is L1. Which one: the smallest that holds the resident CTAs (1 KB
  of the driver's own each), except that a CTA of little shared memory gets the next one up:
  Nsight Compute's launch__occupancy_limit_shared_mem on the 12 profiled H200 kernels
  (tests/data/h200/timing_ncu.json) implies, for each, the configured capacity (`carveout`); the
  five with at most 25 KB a CTA (the seed config among them: 5 CTAs of 25 KB, so 132 KB, not 100)
  sit one capacity above the smallest, the seven with 40 KB or more on it.
- **Stores write through.** Every STL sector goes on to the L2 whether its line is in the L1 or
  not: on the H100 (tests/data/h100/ncu_layouts_edits.json) the L2's sectors from the L1 grow over
  the seed's by the local store sectors plus the local load misses (qk_rolled: 293.4 M against
  268.4 M + 22.0 M; pv_rolled: 16.4 M against 16.8 M, its loads all hits).
- **A miss goes to the L2**: its bytes through the L2's share of bandwidth (`GpuModel.l2_bytes_per_cycle`,
  the rate every SM streaming at once gets) and the copy latency after them.
- **The hit rate** (`hit_rate`): the local working set F (stack bytes x threads of the resident
  CTAs) is re-read cyclically (a rolled loop re-reads its spilled fragments each iteration, a
  spill is reloaded each round). With random replacement in an L1 of C bytes, a line survives
  the (1 - h) F / line misses between its two uses, each evicting one of C / line lines at random,
  with probability exp(-(1 - h) F / C); the steady state is the fixed point h = exp(-(1 - h) F / C):
  1 while F <= C, 0.94 at F = 1.03 C, 0.69 at 1.2 C, 0.12 at 2.4 C. (LRU would give 0 past C;
  the GPU's 90.7 % of load and 94.7 % of store sectors hit for qk_rolled at F = 1.03 C.)
"""

from __future__ import annotations

import math

# `gpu` below is a fa_sim.timing.gpus.GpuModel (not imported: gpus.py imports this module)


def carveout(gpu, cta_smem: int, slots: int) -> int:
    """Bytes of shared memory the driver configures for `slots` CTAs of `cta_smem` bytes each: the
    smallest of the GPU's capacities that holds them with the driver's reservation, one capacity
    up where a CTA takes at most `gpu.carveout_up_below` bytes, at most the largest."""
    sizes = [kb * 1024 for kb in gpu.smem_carveouts_kb]
    need = slots * (cta_smem + gpu.smem_reserved)
    i = next((i for i, s in enumerate(sizes) if s >= need), len(sizes) - 1)
    if slots and cta_smem + gpu.smem_reserved <= gpu.carveout_up_below:
        i = min(i + 1, len(sizes) - 1)
    return sizes[i]


def hit_rate(footprint: float, capacity: float) -> float:
    """The steady share of a cyclically re-read working set of `footprint` bytes that a randomly
    replaced cache of `capacity` bytes serves: the largest root of h = exp(-(1 - h) F / C)."""
    if footprint <= 0:
        return 1.0
    if capacity <= 0:
        return 0.0
    r = footprint / capacity
    if r <= 1.0:
        return 1.0
    lo, hi = 1e-12, 1.0  # x = 1 - h: g(x) = 1 - x - exp(-r x) is > 0 just above 0 (r > 1), < 0 at 1
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if 1.0 - mid - math.exp(-r * mid) > 0:
            lo = mid
        else:
            hi = mid
    return 1.0 - 0.5 * (lo + hi)


def local_hit(gpu, stack_bytes: int, threads: int, cta_smem: int, resident: int, slots: int) -> float:
    """The share of local requests the L1 serves on an SM with `resident` CTAs of `threads` threads
    and `stack_bytes` of local memory each, its carveout fixed by the `slots` CTAs it holds."""
    return hit_rate(resident * threads * stack_bytes, gpu.l1_free(cta_smem, slots))


def l2_leg(state: dict, st, t: float, done: float, gpu, store: bool) -> float:
    """The L2's part of an LDL / STL issued at `t` whose L1 part ends at `done`: a store's bytes all
    (write-through), a load's missing share, through the SM's L2 queue (`state["global_free"]`) at
    `l2_bytes_per_cycle`; a load waits, in the missing share, for its bytes' turn and the copy
    latency (`store`: an STL). Returns when the request's data is there."""
    miss = 1.0 - gpu.local_hit
    nbytes = st.bytes if store else miss * st.bytes
    if nbytes <= 0:
        return done
    state["global_free"] = max(state["global_free"], t) + nbytes / gpu.l2_bytes_per_cycle
    if store:
        return done
    return done + miss * (state["global_free"] - t + gpu.global_latency)
