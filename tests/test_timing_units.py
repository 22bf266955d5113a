"""The timing model's parts one by one, each against numbers worked out by hand (issue 36, item 2:
a behavioural check for each mutant of the timing model that a mutation run left alive or caught
only by a crash; issue 35's unit tests of the pipes, the barrier and the GPU table):

- dispatch: the first wave's fixed cost (Rates.first_fixed) charged to exactly the first k x SMs
  CTAs, on grids of k x SMs and k x SMs + 1 CTAs with hand-built Rates;
- launch order: heavy_first with causal reverses the Q blocks, and the dispatch makespan of a causal
  grid changes as worked out by hand;
- occupancy: the driver's 1 KB per CTA (GpuModel.smem_reserved) costs a CTA where the shared memory
  fits exactly k CTAs without it;
- fa_sim.timing.program.step: every opcode family's pipe, its cycles from the GpuModel field of that
  pipe, its latency, its shared-memory wavefronts and its synchronisation role;
- fa_sim.timing.sm.run_sm: a barrier releases every warp bar_latency cycles after the last arrival;
- the GPU table (fa_sim.timing.gpus): each field against its source (the CUDA C++ Programming Guide's
  table as fa_sim.isa.sm80 writes it, the H200's recorded CTA traces and Nsight Compute's occupancy
  limits).

Nothing here compiles a kernel: the Rates, the streams and the occupancy inputs are built by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.isa import sm80
from fa_sim.problem import Problem
from fa_sim.timing import gpus
from fa_sim.timing.gpus import A100, GPUS, H200
from fa_sim.timing.predict import Rates, dispatch, launch_order, occupancy
from fa_sim.timing.program import Pipe, Sync, step
from fa_sim.timing.sass import Control
from fa_sim.timing.sm import run_sm

DATA = Path(__file__).parent / "data" / "h200"
SEED = KernelConfig()  # block_m = block_n = 64


def _problem(n_m_blocks: int, rounds: int, causal: bool = False, batch: int = 1, config=SEED) -> Problem:
    """n_m_blocks Q blocks per head; non-causal: every CTA runs `rounds` K/V rounds."""
    return Problem(batch, 1, n_m_blocks * config.block_m, rounds * config.block_n, causal, 1.0, config)


def _makespan(prob: Problem, rates: Rates, sms: int) -> float:
    return dispatch(prob, rates, sms, np.zeros(prob.n_m_blocks))[0]


# ---- dispatch: the first wave's fixed cost ----------------------------------------------------------
# k = 2 CTAs per SM: a round takes c_1 = 1 cycle alone, c_2 = 2 cycles each when two share the SM.
# The steady fixed cost o_2 = 2 cycles (1 round's worth at c_2); the first wave's CTAs, started
# together, pay first_fixed o_2 = 6 cycles (3 rounds' worth) instead. first_fixed[0] = 0: a CTA that
# started alone on its SM would pay nothing.
FIRST_WAVE = Rates(per_round=(1.0, 2.0), fixed=(0.0, 2.0), first_fixed=(0.0, 6.0), masked=0.0, run=None)


def test_the_first_wave_is_k_times_the_sms_ctas():
    """2 SMs x k = 2: the grid of 4 CTAs of 2 rounds is one full first wave. Each CTA's work is
    2 rounds + first_fixed o_2 / c_2 = 3 rounds = 5 rounds; two share each SM at c_2 = 2 cycles a
    round: all end at 5 x 2 = 10 cycles. (Charged to only the first (k - 1) x SMs = 2 CTAs, as one
    wave of one CTA per SM, those would pay first_fixed[0] = 0 and end at 2 x 2 = 4, and the SM's
    other CTA, 2 + 1 = 3 rounds, would run its last round alone: 5 cycles.)"""
    assert _makespan(_problem(4, 2), FIRST_WAVE, sms=2) == pytest.approx(10.0)


def test_the_ctas_after_the_first_wave_pay_the_steady_fixed_cost():
    """5 CTAs on 2 SMs x k = 2: the first 4 end together at 10 cycles (above); the fifth, on the
    first SM freed (SM 0), is alone there: 2 rounds + o_2 / c_2 = 1 round = 3 rounds at c_1 = 1
    cycle: it ends at 13. SM 1 runs nothing more."""
    cycles, ran = dispatch(_problem(5, 2), FIRST_WAVE, 2, np.zeros(5))
    assert cycles == pytest.approx(13.0)
    assert ran == [[0, 2, 4], [1, 3]]  # the first wave round-robin over the SMs, the tail on SM 0


def test_a_partial_first_wave_charges_each_ctas_own_share():
    """3 CTAs on 2 SMs x k = 2: SM 0 gets CTAs 0 and 2 (two started together: first_fixed o_2, 3
    rounds' worth at c_2: 2 + 3 = 5 rounds each, 10 cycles), SM 1 CTA 1 alone (first_fixed o_1 = 0:
    2 rounds at c_1 = 1: 2 cycles)."""
    trace: list = []
    cycles, ran = dispatch(_problem(3, 2), FIRST_WAVE, 2, np.zeros(3), trace=trace)
    assert cycles == pytest.approx(10.0) and ran == [[0, 2], [1]]
    assert sorted((i, s, end) for i, s, _, end in trace) == [(0, 0, 10.0), (1, 1, 2.0), (2, 0, 10.0)]


# ---- launch order: heavy_first ---------------------------------------------------------------------
HEAVY = KernelConfig(heavy_first=True)
ONE_AT_A_TIME = Rates(per_round=(1.0,), fixed=(0.0,), first_fixed=(0.0,), masked=0.0, run=None)


def test_heavy_first_reverses_the_q_blocks_of_a_causal_grid():
    causal = _problem(4, 4, causal=True, batch=2, config=HEAVY)
    assert launch_order(causal).tolist() == [3, 2, 1, 0, 3, 2, 1, 0]  # blockIdx.x fastest, per (b, h)
    plain = _problem(4, 4, causal=True, batch=2)
    assert launch_order(plain).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert launch_order(_problem(4, 4, causal=False, batch=2, config=HEAVY)).tolist() == [0, 1, 2, 3] * 2


def test_heavy_first_shortens_a_causal_grids_tail():
    """4 causal Q blocks of 1, 2, 3, 4 rounds on 2 SMs, one CTA each at 1 cycle a round. In
    blockIdx order: SM 0 runs 1 then 3 rounds (ends at 4), SM 1 2 then 4 (ends at 6). Heaviest
    first: SM 0 4 then 1 (5), SM 1 3 then 2 (5)."""
    plain = dispatch(_problem(4, 4, causal=True), ONE_AT_A_TIME, 2, np.zeros(4))
    heavy = dispatch(_problem(4, 4, causal=True, config=HEAVY), ONE_AT_A_TIME, 2, np.zeros(4))
    assert plain == (pytest.approx(6.0), [[0, 2], [1, 3]])
    assert heavy == (pytest.approx(5.0), [[3, 0], [2, 1]])


# ---- occupancy: the driver's shared-memory reservation ------------------------------------------------
def _occupancy(config: KernelConfig, gpu, registers: int = 64) -> int:
    """fa_sim.timing.predict.occupancy of a kernel with `registers` per thread: it reads the
    model's config, register count and shared memory per CTA only."""
    return occupancy(SimpleNamespace(config=config, registers=registers, cta_smem=config.smem_bytes), gpu)


def test_the_reserved_kilobyte_per_cta_costs_a_cta_where_the_tiles_fit_exactly():
    """m128n64d64w4 (32 KB of tiles): 7 x 32 KB fit the H200's 228 KB, 7 x 33 KB do not (6); 64
    registers a thread leave room for 8 CTAs, 128 threads for 16. On an SM of exactly 4 x 24 KB the
    seed's 24 KB CTAs fit 4 times without the reservation, 3 times with it."""
    cfg = KernelConfig(block_m=128)
    assert cfg.smem_bytes == 32768 and H200.smem_per_sm // cfg.smem_bytes == 7
    assert _occupancy(cfg, H200) == 6
    assert _occupancy(SEED, H200.with_(smem_per_sm=4 * SEED.smem_bytes)) == 3
    assert _occupancy(SEED, H200.with_(smem_per_sm=4 * SEED.smem_bytes, smem_reserved=0)) == 4


# ---- program.step: each opcode family's pipe, cycles and latency ----------------------------------------
# Every field distinct, so that each value names the field it came from.
DISTINCT = H200.with_(hmma_cycles=5.5, fma_cycles=3, alu_cycles=7, xu_cycles=11, mufu_latency=101,
                      smem_latency=102, shfl_latency=103, s2r_latency=104, const_latency=105, fchk_latency=106)


def _control(stall=2, write=None, read=None, wait=0, yield_hint=False) -> Control:
    return Control(stall=stall, yield_hint=yield_hint, write_barrier=write, read_barrier=read, wait_mask=wait, reuse=0)


def _step(opcode: str, operands: str = "R0, R1, R2", guard: str = "", wavefronts=None, **control):
    return step(opcode, operands, guard, _control(**control), DISTINCT, wavefronts or {})


# opcode -> (pipe, cycles in the pipe, latency, the pipe slot it occupies, MIO)
PIPES = {
    "HMMA.16816.F32": (Pipe.TENSOR, 5.5, 101, Pipe.TENSOR, False),  # hmma_cycles
    "FFMA": (Pipe.FMA, 3, 101, Pipe.FMA, False),  # fma_cycles
    "FADD.FTZ": (Pipe.FMA, 3, 101, Pipe.FMA, False),
    "FMUL": (Pipe.FMA, 3, 101, Pipe.FMA, False),
    "IMAD.WIDE.U32": (Pipe.FMA_HEAVY, 6, 101, Pipe.FMA, False),  # the fma pipe's heavy half: 2 x fma_cycles
    "IMUL": (Pipe.FMA_HEAVY, 6, 101, Pipe.FMA, False),
    "IADD3": (Pipe.ALU, 7, 101, Pipe.ALU, False),  # alu_cycles: integer, logic and anything unlisted
    "LOP3.LUT": (Pipe.ALU, 7, 101, Pipe.ALU, False),
    "FMNMX": (Pipe.ALU, 7, 101, Pipe.ALU, False),
    "MUFU.EX2": (Pipe.XU, 11, 101, Pipe.XU, False),  # xu_cycles, mufu_latency
    "I2F.F16": (Pipe.XU, 11, 101, Pipe.XU, False),
    "F2I.TRUNC": (Pipe.XU, 11, 101, Pipe.XU, False),
    "FCHK": (Pipe.XU, 11, 106, Pipe.XU, False),  # div.rn's range check: fchk_latency
    "UIADD3": (Pipe.UNIFORM, 1, 101, Pipe.UNIFORM, False),  # the uniform datapath: U* and R2UR, S2UR
    "R2UR": (Pipe.UNIFORM, 1, 101, Pipe.UNIFORM, False),
    "S2UR": (Pipe.UNIFORM, 1, 101, Pipe.UNIFORM, False),
    "BRA": (Pipe.CBU, 1, 101, Pipe.CBU, False),
    "BSYNC": (Pipe.CBU, 1, 101, Pipe.CBU, False),
    "EXIT": (Pipe.CBU, 1, 101, Pipe.CBU, False),
    "LDSM.16.M88.4": (Pipe.MIO, 1, 102, Pipe.MIO, True),  # smem_latency after its wavefronts
    "LDS.U.128": (Pipe.MIO, 1, 102, Pipe.MIO, True),
    "STS.64": (Pipe.MIO, 1, 102, Pipe.MIO, True),
    "SHFL.BFLY": (Pipe.MIO, 1, 103, Pipe.MIO, True),  # shfl_latency
    "S2R": (Pipe.MIO, 1, 104, Pipe.MIO, True),  # s2r_latency
    "CS2R": (Pipe.MIO, 1, 104, Pipe.MIO, True),
    "LDC.64": (Pipe.MIO, 1, 105, Pipe.MIO, True),  # const_latency
    "LDGSTS.E.BYPASS.128": (Pipe.MIO, 1, 102, Pipe.MIO, True),
    "BAR.SYNC.DEFER_BLOCKING": (Pipe.MIO, 1, 102, Pipe.MIO, True),
    "REDG.E.ADD.F32.FTZ.RN.STRONG.GPU": (Pipe.MIO, 1, 102, Pipe.MIO, True),  # a global reduction (sm_90)
    "ATOMG.E.ADD.STRONG.GPU": (Pipe.MIO, 1, 0, Pipe.MIO, True),  # answers when its data arrive (sm.py)
}


@pytest.mark.parametrize("opcode", PIPES)
def test_each_opcode_family_takes_its_pipe_its_cycles_and_its_latency(opcode):
    pipe, cycles, latency, slot, mio = PIPES[opcode]
    st = _step(opcode)
    assert (st.pipe, st.cycles, st.latency, st.slot, st.is_mio) == (pipe, cycles, latency, slot, mio)
    assert st.name == opcode.split(".")[0]


def test_each_pipes_cycles_follow_its_gpu_field():
    """Doubling a GpuModel field doubles the cycles of exactly its pipe."""
    ops = {"hmma_cycles": "HMMA.16816.F32", "fma_cycles": "FFMA", "alu_cycles": "IADD3", "xu_cycles": "MUFU.EX2"}
    base = {name: _step(op).cycles for name, op in ops.items()}
    for name in ops:
        gpu = DISTINCT.with_(**{name: 2 * getattr(DISTINCT, name)})
        now = {n: step(op, "R0, R1, R2", "", _control(), gpu, {}).cycles for n, op in ops.items()}
        assert now == {n: 2 * c if n == name else c for n, c in base.items()}, name
    heavy = step("IMAD", "R0, R1, R2, R3", "", _control(), DISTINCT.with_(fma_cycles=4), {})
    assert heavy.cycles == 8  # the heavy half: 2 x fma_cycles


def test_the_scheduling_fields_come_from_the_control_bits():
    st = _step("MUFU.EX2", stall=9, write=3, read=1, wait=0b100101, yield_hint=True)
    assert (st.stall, st.write_sb, st.read_sb, st.wait_mask, st.switch) == (9, 3, 1, 0b100101, True)
    none = _step("FFMA")
    assert (none.write_sb, none.read_sb, none.switch) == (-1, -1, False)


def test_shared_memory_classes_cost_the_bank_models_wavefronts():
    """LDSM / LDS / STS / LDGSTS: the config's average wavefronts of the class, rounded; SHFL one;
    other MIO instructions none; a local-memory spill one wavefront per 128 bytes of the warp."""
    wf = {"LDSM": 4.4, "LDS": 2.0, "STS": 1.6, "LDGSTS": 10.5}
    got = {op: _step(op, wavefronts=wf).wavefronts for op in
           ("LDSM.16.M88.4", "LDS.U.128", "STS.64", "LDGSTS.E.BYPASS.128", "SHFL.IDX", "S2R", "LDC", "BAR.SYNC")}
    assert got == {"LDSM.16.M88.4": 4, "LDS.U.128": 2, "STS.64": 2, "LDGSTS.E.BYPASS.128": 10, "SHFL.IDX": 1,
                   "S2R": 0, "LDC": 0, "BAR.SYNC": 0}
    assert _step("LDSM.16.M88.4").wavefronts == 1  # a class the bank model did not see: one
    assert [_step(op).wavefronts for op in ("LDL", "STL.64", "LDL.128")] == [1, 2, 4]
    assert all(_step(op).pipe is Pipe.MIO for op in ("LDL", "STL.64"))


def test_synchronisation_roles():
    """BAR, LDGDEPBAR, DEPBAR.LE n, EXIT; an LDGSTS copies 32 lanes x its width from global memory;
    a never-executing LDGSTS (@!PT) copies nothing."""
    assert _step("BAR.SYNC.DEFER_BLOCKING", "0x0").sync is Sync.BAR
    assert _step("LDGDEPBAR", "").sync is Sync.LDGDEPBAR
    depbar = _step("DEPBAR.LE", "SB0, 0x2")
    assert (depbar.sync, depbar.depbar_n) == (Sync.DEPBAR, 2)
    assert _step("DEPBAR.LE", "SB0, 1").depbar_n == 1
    assert _step("EXIT", "").sync is Sync.EXIT
    copy = _step("LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]")
    assert (copy.sync, copy.bytes) == (Sync.GLOBAL_COPY, 32 * 16)
    assert _step("LDGSTS.E.64", "[R1], desc[UR4][R2.64]").bytes == 32 * 8
    assert _step("LDGSTS.E", "[R1], desc[UR4][R2.64]").bytes == 32 * 4
    never = _step("LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]", guard="@!PT")
    assert (never.sync, never.bytes) == (Sync.NONE, 0)
    assert _step("FFMA").sync is Sync.NONE and _step("FFMA").bytes == 0


# ---- the SM model: a barrier ------------------------------------------------------------------------
def test_a_barrier_releases_every_warp_bar_latency_after_the_last_arrival():
    """5 warps of one CTA: warps 0-3 alone on sub-partitions 0-3, warp 4 beside warp 0. Four FFMAs of
    stall 3, then BAR.SYNC: warps 0-3 issue at 0, 3, 6, 9 and arrive at 12, warp 4 (one cycle behind,
    its sub-partition's issue slot taken at 0) arrives at 13. The barrier releases at 13 + 37: every
    warp's next instruction issues at 50 (warp 0, beside warp 4, at 51), nothing in between."""
    gpu = H200.with_(bar_latency=37)
    ffma = step("FFMA", "R0, R1, R2, R3", "", _control(stall=3), gpu, {})
    bar = step("BAR.SYNC.DEFER_BLOCKING", "0x0", "", _control(stall=1), gpu, {})
    done = step("EXIT", "", "", _control(stall=1), gpu, {})
    timeline: list = []
    run = run_sm([[ffma] * 4 + [bar, ffma, done]], 5, gpu, account=False, timeline=timeline)
    arrivals = {warp: t for t, _, warp, _, name, _ in timeline if name == "BAR"}
    assert arrivals == {0: 12, 1: 12, 2: 12, 3: 12, 4: 13}
    after = {}
    for t, _, warp, _, name, _ in timeline:
        if name == "FFMA" and t > arrivals[warp]:
            after.setdefault(warp, t)
    assert after == {0: 51, 1: 50, 2: 50, 3: 50, 4: 50}
    assert not [t for t, *_ in timeline if 13 < t < 50]
    assert run.cycles == 55  # EXIT at 53 (warp 0 at 54), done the cycle after
    slower = run_sm([[ffma] * 4 + [bar, ffma, done]], 5, gpu.with_(bar_latency=47), account=False)
    assert slower.cycles == run.cycles + 10


# ---- the GPU table against its sources ----------------------------------------------------------------
def test_occupancy_limits_are_the_cuda_guides_compute_capability_table():
    """fa_sim.isa.sm80 writes down the CUDA C++ Programming Guide's table (compute capability 8.0;
    9.0 has the same register file, threads, CTAs and reservation, and 228 KB of shared memory)."""
    for gpu in (H200, A100):
        assert (gpu.regs_per_sm, gpu.threads_per_sm, gpu.ctas_per_sm, gpu.smem_reserved) == (
            sm80.REGISTER_FILE, sm80.MAX_THREADS_PER_SM, sm80.MAX_CTAS_PER_SM, sm80.SMEM_RESERVED_BYTES)
        assert (gpu.regs_per_sm, gpu.threads_per_sm, gpu.ctas_per_sm, gpu.smem_reserved) == (65536, 2048, 32, 1024)
    assert A100.smem_per_sm == sm80.SMEM_PER_SM_BYTES == 164 * 1024  # sm_80: 164 KB per SM
    assert H200.smem_per_sm == 228 * 1024  # sm_90: 228 KB per SM
    assert (H200.arch, A100.arch) == ("sm_90", "sm_80")
    assert GPUS == {"h200": H200, "a100": A100}


def test_the_h200s_sm_count_and_clock_are_its_recorded_ctas():
    """tests/data/h200/timing_dispatch.npz (experiments/timing_dispatch.py on the H200): the CTAs
    ran on SMs 0..131, and a CTA's clock64 cycles over its globaltimer nanoseconds (CTAs of at least
    20 us) is 1.76 GHz in the median, below the 1.98 GHz maximum clock (nvidia-smi); the table's
    effective clock, fitted on the measured kernel times, lies within 2 % of it."""
    rec = np.load(DATA / "timing_dispatch.npz")
    assert H200.sms == 132 == len(np.unique(rec["sm"])) == int(rec["sm"].max()) + 1
    ns = (rec["end_ns"] - rec["start_ns"]).astype(float)
    long = ns >= 20_000
    clock = float(np.median(rec["cycles"][long] / ns[long]))
    assert 1.7 < clock < 1.98
    assert H200.clock_ghz == 1.7399 and abs(H200.clock_ghz / clock - 1) < 0.02
    assert json.loads(str(rec["meta"]))["gpu"] == H200.marketing_name == "NVIDIA H200"


def test_the_register_and_thread_limits_are_nsight_computes():
    """Nsight Compute's launch__occupancy_limit_{registers,warps,blocks} of every profiled H200 kernel
    (tests/data/h200/timing_ncu.json) from the table's registers, threads and CTAs per SM: registers
    allocated per warp in units of 256 within each of 4 sub-partitions."""
    kernels = json.loads((DATA / "timing_ncu.json").read_text())["kernels"]
    assert kernels
    for k in kernels:
        threads, regs = int(k["launch__block_size"]), int(k["launch__registers_per_thread"])
        warps = threads // 32
        per_warp = -(-regs * 32 // 256) * 256
        by_regs = H200.regs_per_sm // 4 // per_warp * 4 // warps
        assert by_regs == k["launch__occupancy_limit_registers"], k["key"]
        assert H200.threads_per_sm // threads == k["launch__occupancy_limit_warps"], k["key"]
        assert H200.ctas_per_sm == k["launch__occupancy_limit_blocks"], k["key"]


def test_the_a100_is_public_figures_and_marked_so():
    """NVIDIA's A100 white paper: 108 SMs, 1410 MHz boost; FP32 at 16 lanes per sub-partition per
    clock (2 cycles a warp instruction, the H200's 1)."""
    assert (A100.sms, A100.clock_ghz, A100.fma_cycles, H200.fma_cycles) == (108, 1.41, 2, 1)
    assert not A100.validated and H200.validated
    assert A100.marketing_name == "NVIDIA A100-SXM4-80GB"
    # the fill is paid by a launch that refills a CTA slot, all of it, and by no launch of one wave
    assert (gpus.fill_fraction(108 * 2, A100.sms, 4), gpus.fill_fraction(108 * 4, A100.sms, 4),
            gpus.fill_fraction(108 * 4 + 1, A100.sms, 4)) == (0.0, 0.0, 1.0)
