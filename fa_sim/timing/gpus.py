"""The parameters of each GPU the timing model knows, in one small table, each with its source.

Every latency and throughput the SM model (fa_sim.timing.sm) uses is a named field here, in the
GPGPU-Sim tradition of one config per GPU. Sources: NVIDIA's architecture white papers (SM
counts, clocks, per-SM unit counts), the CUDA C++ Programming Guide's "Compute Capabilities" table
(occupancy limits, arithmetic throughput per SM per clock), microbenchmarks recorded on the H200
(fa_sim.calibrate.timing_microbench, tests/data/h200/timing_microbench.json: the model runs their
SASS within 6 % of the recorded cycles), Nsight Compute measurements on the H200
(tests/data/h200/timing_ncu.json) and the fit of `experiments/timing_validate.py` on the
fitting half of the measured cases (tests/data/h200/timing_cases.json), marked "fitted".
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuModel:
    name: str
    marketing_name: str  # as the driver names it (fa_hw.tuned's tables are keyed by it)
    arch: str  # the cubin the model reads
    validated: bool  # measured against this GPU (tests/data/<gpu>/timing_cases.json)
    sms: int
    clock_ghz: float  # effective SM clock during the measured runs (fitted: boost varies with load)
    # occupancy (CUDA C++ Programming Guide, compute capability table)
    regs_per_sm: int = 65536
    smem_per_sm: int = 233472  # bytes a CTA may use summed over the SM (sm_90: 228 KB)
    smem_reserved: int = 1024  # per CTA, reserved by the driver
    threads_per_sm: int = 2048
    ctas_per_sm: int = 32
    # issue: cycles one warp instruction occupies its pipe in a sub-partition (32 lanes / lanes per clock)
    hmma_cycles: float = 6.7  # HMMA.16816.F32: 4096 FLOP at the 638 TFLOP/s mma.sync peak measured on the
    # H200 (README, "The GPU kernel") over 528 sub-partitions at 1.98 GHz
    fma_cycles: int = 1  # FP32 FFMA/FADD/FMUL: 32 lanes per sub-partition per clock on sm_90
    alu_cycles: int = 2  # integer and logic: 16 lanes per sub-partition per clock
    xu_cycles: int = 8  # MUFU (and conversions): 4 lanes per sub-partition per clock
    issue_in_turn: bool = False  # fa_sim.timing.sm: greedy-then-in-turn issue and the SM's shared queues taking
    # the sub-partitions after the last MIO issuer (False: greedy-then-oldest, the turn with the cycle number).
    # Set from the H100's microbenchmarks (tests/data/h100/timing_microbench_h100.json: tanh_hmma_16w, the
    # XU-bound warps' finishes, ex2_ldsm_16w). Off in the shipped models: with it and the clock and launch
    # overhead refitted the validation MAPE moves 5.1 -> 5.0 % but the option signs 54 -> 46 of 62 and the
    # features 2.9 -> 3.4 % (docs/timing.md, "Features", softcap)
    # latencies in cycles, from issue to the scoreboard's release
    mufu_latency: int = 18  # fits the kernel's measured times best; the dependent-chain benchmark
    # (fa_sim.calibrate.timing_microbench) measures 16.9 cycles, and 17 fits the kernel worse (8.7 % MAPE)
    smem_latency: int = 24  # LDSM / LDS / STS after the last wavefront left the shared-memory pipe
    shfl_latency: int = 24
    s2r_latency: int = 20
    const_latency: int = 12  # LDC (cached constant)
    read_latency: int = 6  # a read scoreboard: sources read
    fchk_latency: int = 18  # FCHK (div.rn's range check, xu pipe) to its predicate's release: MUFU's until
    # fa_sim.calibrate.timing_microbench's div_latency is recorded
    bar_latency: int = 20  # BAR.SYNC: last arrival to release
    # shared memory and global memory
    smem_wavefronts_per_cycle: float = 1.0  # per SM (128 bytes per clock)
    mio_queue: int = 128  # cycles of shared-memory work queued per SM before MIO instructions throttle
    global_latency: int = 300  # LDGSTS issue to data in shared memory with every CTA slot of the SM filled:
    # an L2 hit, the write, and the queueing of a loaded chip (L2 hits take 220-340 cycles on recent NVIDIA
    # GPUs, arXiv:2606.22588; the H200's value below: docs/timing.md, "The copy latency under load")
    global_latency_idle: int | None = None  # the copy latency rises with the load: linearly in the share of
    # the SM's CTA slots filled (in a full grid every SM alike), from this (extrapolated to an empty SM)
    # to global_latency with every slot filled; None: no rise (GpuModel.loaded)
    global_bytes_per_cycle: float = 96.0  # per SM, L2 -> SM (fitted)
    atomic_lanes_per_cycle: float = 128.0  # the L2's atomic units over the whole GPU: lanes of global reductions
    # and atomics (REDG, ATOMG) executed per cycle, shared by the SMs in proportion to the atomics they send.
    # Fitted on the H100's backward (tests/data/h100/timing_backward.json): the atomic mode's main kernel less
    # the deterministic one's (the same host launch time in both) at (1, 8, 1024, 64) and (2, 8, 1024, 64),
    # causal and not (96, 128, 160 tried); (1, 16, 2048, 64) held out (docs/backward.md, "Timed"). About
    # 220 G fp32 reductions/s at 1.74 GHz; NVIDIA documents no such rate. The A100's is this value, unfitted.
    atomic_share: float | None = None  # the share of that rate one SM's run gets (GpuModel.atomic_rate; set by
    # fa_sim.timing.launch from the launch's atomics); None: an equal share of every SM
    atomic_queue: int = 128  # cycles of atomic work queued per SM before the next atomic throttles (lg_throttle):
    # the MIO queue's depth (mio_queue), not fitted
    l2_bytes: int = 50 * 2**20  # a launch whose arrays are larger streams from DRAM (fa_sim.timing.launch)
    dram_bytes_per_cycle: float = 20.9  # per SM: the HBM's peak over the SMs at the effective clock
    # (H200: 4.8 TB/s / 132 SMs / 1.74 GHz)
    # the L1 and local memory (spills, local arrays): NVIDIA's Hopper and Ampere tuning guides; the rules and
    # the hit rate's derivation: fa_sim.timing.local
    l1_bytes: int = 256 * 1024  # the SM's unified L1 / shared memory (sm_90: 256 KB)
    smem_carveouts_kb: tuple = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)  # shared-memory capacities the
    # driver may configure (sm_90); it takes the smallest that holds the resident CTAs, the rest is L1
    carveout_up_below: int = 32 * 1024  # a CTA of at most this much shared memory (with the reservation) gets
    # the next capacity up (what Nsight Compute's occupancy limits imply on the H200: 25 KB and less up, 41 KB
    # and more not; fa_sim.timing.local.carveout)
    l2_bytes_per_cycle: float = 16.0  # per SM: the L2's rate when every SM streams local memory at once
    # (write-through stores, misses); fitted on the fitting half's spilling cases, docs/timing.md
    local_hit: float = 1.0  # share of local requests the L1 serves, set per SM run (with_local)
    launch_us: float = 2.0  # per kernel: the launch latency (fitted on launches of a few CTAs)
    fill_us: float = 0.0  # what a launch that refills a CTA slot takes beyond its CTAs' cycles and the launch
    # latency: the later waves' refills (a freed slot's next CTA starts about 0.5 us later on the H200) and the
    # later CTAs' fixed time the SM model lacks, on the critical path of the SMs that refill; a launch whose
    # CTAs all start in the first wave pays none of it (fill_fraction; fitted: launch + fill on the main cases,
    # every one of which refills; docs/timing.md, "The launch overhead: one wave or more")

    def with_(self, **changes) -> "GpuModel":
        return replace(self, **changes)

    @property
    def atomic_rate(self) -> float:
        """Atomic lanes per cycle the L2 executes for one SM: its share of the GPU's rate."""
        return self.atomic_lanes_per_cycle * (1.0 / self.sms if self.atomic_share is None else self.atomic_share)

    def loaded(self, resident: int, slots: int) -> "GpuModel":
        """The parameters one SM runs under with `resident` of its `slots` CTA slots filled: the copy
        latency at that load (global_latency_idle), the rest as they are."""
        if self.global_latency_idle is None:
            return self
        rise = (self.global_latency - self.global_latency_idle) * resident / slots
        return replace(self, global_latency=round(self.global_latency_idle + rise), global_latency_idle=None)

    def l1_free(self, cta_smem: int, slots: int) -> int:
        """Bytes of L1 beside the shared memory of `slots` CTAs of `cta_smem` bytes each (the
        driver's carveout, fa_sim.timing.local.carveout)."""
        from .local import carveout

        return max(0, self.l1_bytes - carveout(self, cta_smem, slots))

    def with_local(self, stack_bytes: int, threads: int, cta_smem: int, resident: int, slots: int) -> "GpuModel":
        """The parameters of an SM with `resident` CTAs of `threads` threads and `stack_bytes` of
        local memory a thread: the share of local requests the L1 serves (fa_sim.timing.local.local_hit:
        the working set resident x threads x stack_bytes re-read in an L1 of `l1_free`, fixed by the
        `slots` CTAs the SM holds)."""
        from .local import local_hit

        hit = local_hit(self, stack_bytes, threads, cta_smem, resident, slots)
        return self if hit == self.local_hit else replace(self, local_hit=hit)

    def overhead_us(self, ctas: int, resident: int) -> float:
        """What a launch takes beyond its CTAs' cycles: the launch latency, and `fill_us` where the
        grid refills a CTA slot (more CTAs than the GPU's slots, `resident` per SM: fill_fraction)."""
        return self.launch_us + self.fill_us * fill_fraction(ctas, self.sms, resident)


def fill_fraction(ctas: int, sms: int, resident: int) -> float:
    """The share of `fill_us` a launch of `ctas` CTAs pays on `sms` SMs of `resident` slots each: 1 where
    a slot is refilled (more CTAs than slots), else 0. The refill's cost is a latency on the critical
    path of the SMs that refill, whatever their number, not a share of the slots; a grid that starts
    every CTA in its first wave has none (the H200's dispatch traces, tests/data/h200/timing_dispatch.npz:
    the first wave starts within 0.2 us; its one-wave small launches take 3-5 us beyond the SM model's
    cycles whether they fill 1 % or all of the slots, tests/data/h200/timing_small.json)."""
    return 1.0 if ctas > sms * resident else 0.0


#: NVIDIA H200 SXM (GH100): 132 SMs, max SM clock 1980 MHz (nvidia-smi), 4.8 TB/s HBM3e, 50 MB L2.
H200 = GpuModel(name="h200", marketing_name="NVIDIA H200", arch="sm_90", validated=True, sms=132, clock_ghz=1.7399,
                launch_us=4.484, fill_us=4.731, global_latency=450, global_latency_idle=200)

#: NVIDIA A100 SXM (GA100) from public figures only: 108 SMs, 1410 MHz boost, 164 KB shared memory
#: per SM, FP32 at 16 lanes per sub-partition per clock. NOT validated against measurements.
A100 = GpuModel(name="a100", marketing_name="NVIDIA A100-SXM4-80GB", arch="sm_80", validated=False, sms=108, clock_ghz=1.41, smem_per_sm=167936, fma_cycles=2,
                l1_bytes=192 * 1024, smem_carveouts_kb=(0, 8, 16, 32, 64, 100, 132, 164),
                global_latency=500, global_bytes_per_cycle=48.0, l2_bytes=40 * 2**20,
                dram_bytes_per_cycle=13.4)  # 2.04 TB/s / 108 SMs / 1.41 GHz

GPUS = {g.name: g for g in (H200, A100)}


def gpu_model(gpu) -> GpuModel:
    """A GpuModel, or the key of one in GPUS; anything else is a ValueError naming the keys."""
    if isinstance(gpu, GpuModel):
        return gpu
    if not isinstance(gpu, str) or gpu not in GPUS:
        raise ValueError(f"gpu must be one of {', '.join(sorted(GPUS))} (or a fa_sim.timing.GpuModel), got {gpu!r:.60}")
    return GPUS[gpu]
