"""The timing model's memory costs (issue 35, item 4), each against numbers worked out by hand:

- fa_sim.observers.sectors.warp_sectors: the 32-byte sectors and 128-byte lines of a warp's
  request for coalesced, strided, broadcast, misaligned and partly active address patterns;
- SectorCounter on a launch of the PTX engine: a coalesced copy against a strided one; on the
  backward's main kernel, the counts and paths of an instruction-event oracle, the engine unobserved;
- fa_sim.timing.program.step: a global request charged its class's sectors and extra lines;
- fa_sim.timing.sm.run_sm: an uncoalesced request's extra lines take the shared-memory pipe, a
  local load that misses the L1 takes the L2's bandwidth and waits the copy latency, a local
  store writes through;
- GpuModel.l1_free / with_local (fa_sim.timing.local): the L1 beside the shared-memory carveout
  (checked against Nsight Compute's occupancy limits), the share of local requests it holds.
"""

from __future__ import annotations

import numpy as np
import pytest

from fa_sim.observers.sectors import MemoryCounts, SectorCounter, warp_sectors
from fa_sim.timing.gpus import A100, H200
from fa_sim.timing.program import Sync, global_cost, step
from fa_sim.timing.sass import Control
from fa_sim.timing.sm import run_sm

LANES = np.arange(32)
ALL = np.ones(32, bool)


def _control(stall=1, write=None, wait=0) -> Control:
    return Control(stall=stall, yield_hint=False, write_barrier=write, read_barrier=None, wait_mask=wait, reuse=0)


# ---- sectors and lines of one warp request ----------------------------------------------------------
@pytest.mark.parametrize("addr, width, sectors, lines", [
    (4096 + 4 * LANES, 4, 4, 1),  # 32 consecutive floats: 128 bytes, one line
    (4096 + 16 * LANES, 16, 16, 4),  # 32 x 16 bytes: 512 bytes, four lines
    (4096 + 8 * LANES, 8, 8, 2),
    (4096 + 128 * LANES, 16, 32, 32),  # a column of 128-byte rows: a sector and a line per lane
    (4096 + 64 * LANES, 4, 32, 16),  # a stride of 64 bytes: two lanes a line, each in its own sector
    (4096 + 32 * LANES, 4, 32, 8),  # a stride of one sector
    (np.full(32, 4096), 16, 1, 1),  # broadcast: every lane the same 16 bytes
    (4096 + 4 * (LANES % 8), 4, 1, 1),  # four lanes on each word of one sector
    (4096 + 16 + 4 * LANES, 4, 5, 2),  # 128 bytes from the middle of a sector: five sectors over two lines
    (np.full(32, 4096 + 120), 16, 2, 2),  # 16 bytes across a sector and a line boundary
])
def test_sectors_and_lines_of_a_warp_request(addr, width, sectors, lines):
    s, l = warp_sectors(addr, ALL, width)
    assert (int(s), int(l)) == (sectors, lines)


def test_inactive_lanes_touch_nothing():
    """Only the active lanes count: half a coalesced request is half its sectors; none active, none."""
    addr = 4096 + 16 * LANES
    assert tuple(map(int, warp_sectors(addr, LANES < 16, 16))) == (8, 2)
    assert tuple(map(int, warp_sectors(addr, np.zeros(32, bool), 16))) == (0, 0)
    # address 0 is an address like any other (inactive lanes are not marked by it)
    assert tuple(map(int, warp_sectors(np.zeros(32, np.int64), ALL, 4))) == (1, 1)


def test_leading_axes_are_warps_of_their_own():
    """[R, C, W, L]: each warp is counted on its own (no sector shared between warps)."""
    addr = np.stack([4096 + 16 * LANES, 4096 + 128 * LANES])[None, None]  # [1, 1, 2, 32]
    s, l = warp_sectors(addr, np.ones(addr.shape, bool), 16)
    assert s.shape == (1, 1, 2) and s.ravel().tolist() == [16, 32] and l.ravel().tolist() == [4, 32]


def test_width_must_be_positive():
    with pytest.raises(ValueError, match="width"):
        warp_sectors(4096 + LANES, ALL, 0)


COPY = r"""
extern "C" __global__ void copy(const float4* src, float4* dst, int stride) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  dst[i] = src[(i % 32) * stride + (i / 32) * 32 * stride];
}
"""


@pytest.mark.parametrize("stride, sectors", [(1, 16), (8, 32)])
def test_sector_counter_on_a_launch(stride, sectors):
    """A float4 copy of 64 threads: stride 1 reads 32 x 16 consecutive bytes a warp (16 sectors, 4
    lines); stride 8 puts each lane 128 bytes from the next (32 sectors, 32 lines). The stores are
    coalesced in both. Counted by SASS class, per warp request."""
    from fa_sim.ptx import launch

    src = np.arange(4 * 64 * 8, dtype=np.float32)
    dst = np.zeros(4 * 64, np.float32)
    counter = SectorCounter()
    launch(COPY, (1,), (64,), 0, [src, dst, np.int32(stride)], observers=[counter])
    got = counter.report()
    lines = 4 if stride == 1 else 32
    assert got["LDG"] == MemoryCounts(2, 2 * sectors, 2 * lines, 2 * 16, 2 * 4)
    assert got["STG"] == MemoryCounts(2, 32, 8, 32, 8)
    assert counter.report([0]) == got and counter.report([1]) == {}  # one CTA: all its requests, none of others
    # a CTA listed n times counts n times (predict_launch: a representative for each CTA of its class)
    assert counter.report([0, 0, 1, 0])["STG"] == MemoryCounts(6, 96, 24, 96, 24)


class _EventSectors:
    """The oracle: the same counts from instruction events (what SectorCounter read before it took
    `on_global`), which turn the PTX engine's fast paths off."""

    def __init__(self) -> None:
        self.counts: dict = {}

    def wants(self, op, phase, rnd) -> bool:
        return op.value in ("LDGSTS", "LDG", "STG")

    def on_instr(self, event) -> None:
        g = event.gmem
        if g is None:
            return
        mask = np.asarray(g.mask, bool) & np.asarray(event.active, bool)[None]
        sectors, lines = warp_sectors(g.addr, mask, g.width)
        lanes = mask.sum(-1)
        per = [x.sum(axis=(0, 2)) for x in (lanes > 0, sectors, lines, -(-lanes * g.width // 32), -(-lanes * g.width // 128))]
        for c, cta in enumerate(np.asarray(event.cta).tolist()):
            add = MemoryCounts(*(int(x[c]) for x in per))
            if add.requests:
                key = (cta, event.op.value)
                self.counts[key] = add if key not in self.counts else self.counts[key] + add


@pytest.mark.parametrize("causal", [False, True])
def test_sector_counter_keeps_the_engines_fast_paths(causal):
    """SectorCounter observes global requests (on_global), not instruction events: the engine stays
    unobserved (its fast paths: fused stretches, GEMM chains, batched copies) and every CTA's counts
    and every warp's path equal those of a run observed instruction by instruction, on the
    backward's main kernel (cp.async tiles, stores, a causal tail) over several CTAs."""
    from fa_sim.backward import backward_launches
    from fa_sim.hub import Hub
    from fa_sim.observers.branches import BranchRecorder
    from fa_sim.ptx import launch
    from fa_sim.timing.backward import seeded_backward_inputs

    assert not Hub([SectorCounter()])._instr and Hub([SectorCounter()]).global_listeners
    arrays = seeded_backward_inputs(1, 2, 160, 160, 64)
    main = backward_launches(*arrays, causal, None, False)[0][1]
    runs = []
    for observers in ([BranchRecorder(), SectorCounter()], [BranchRecorder(), _EventSectors()]):
        args = [a.copy() if isinstance(a, np.ndarray) else a for a in main.args]
        launch(main.source, main.grid, main.block, main.smem_bytes, args, kernel=main.kernel, macros=main.macros,
               observers=observers)
        runs.append((observers[0].paths(), observers[1].counts))
    assert runs[0][1] and runs[0] == runs[1]


# ---- what a request costs in the model ----------------------------------------------------------------
def test_a_global_request_costs_its_classes_sectors_and_extra_lines():
    """Without counts a request is 32 coalesced lanes; with them, its class's average sectors x 32
    bytes and its lines beyond those of its bytes packed."""
    assert global_cost("LDGSTS", 16, None) == (512, 0.0)
    coalesced = {"LDGSTS": MemoryCounts(10, 160, 40, 160, 40)}
    assert global_cost("LDGSTS", 16, coalesced) == (512, 0.0)
    column = {"LDGSTS": MemoryCounts(10, 160, 160, 160, 40), "LDG": MemoryCounts(4, 128, 128, 16, 4)}
    assert global_cost("LDGSTS", 16, column) == (512, 12.0)  # the same sectors, 16 lines a request, not 4
    assert global_cost("LDG", 4, column) == (32 * 32, 31.0)  # a float a lane, each in its own line
    assert global_cost("STG", 4, column) == (128, 0.0)  # a class the run did not see: coalesced
    s = step("LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]", "", _control(), H200, {"LDGSTS": 4}, column)
    assert (s.sync, s.bytes, s.tag_wavefronts, s.wavefronts) == (Sync.GLOBAL_COPY, 512, 12.0, 4)
    never = step("LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]", "@!PT", _control(), H200, {}, column)
    assert (never.bytes, never.tag_wavefronts) == (0, 0.0)


def test_local_memory_steps():
    """LDL / STL: the L1 data pipe's wavefronts (one per 128 bytes of the warp), the bytes a miss
    moves (32 lanes x the width), a load's scoreboard after the shared-memory latency."""
    ldl = step("LDL.128", "R4, [R10]", "", _control(write=2), H200, {})
    stl = step("STL.64", "[R1+0x80], R64", "", _control(), H200, {})
    assert (ldl.sync, ldl.wavefronts, ldl.bytes, ldl.latency) == (Sync.LOCAL_LOAD, 4, 512, H200.smem_latency)
    assert (stl.sync, stl.wavefronts, stl.bytes) == (Sync.LOCAL_STORE, 2, 256)


def _ldgsts_run(lines: float) -> float:
    """One warp: 8 copies of 16 sectors (one a cycle), then an LDS whose result an FFMA waits for.
    The copies' data arrives long after (their write wavefronts stay out of the way); no MIO throttle."""
    gpu = H200.with_(global_bytes_per_cycle=1e9, global_latency_idle=None, global_latency=100000, mio_queue=10**9)
    counts = {"LDGSTS": MemoryCounts(1, 16, lines, 16, 4)}
    copy = step("LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]", "", _control(), gpu, {"LDGSTS": 4}, counts)
    lds = step("LDS.128", "R4, [R10]", "", _control(write=2), gpu, {"LDS": 1})
    use = step("FFMA", "R0, R4, R5, R6", "", _control(wait=1 << 2), gpu, {})
    done = step("EXIT", "", "", _control(), gpu, {})
    return run_sm([[copy] * 8 + [lds, use, done]], 1, gpu, account=False).cycles


def test_uncoalesced_copies_cost_their_extra_lines_in_the_shared_memory_pipe():
    """Coalesced (4 lines a copy), the LDS issued at cycle 8 finds the pipe free and leaves it at 9.
    A column of 16 lines a copy: 12 extra lines each hold the pipe from its issue, 8 x 12 = 96
    cycles, so the LDS leaves it at 97 and everything after it is 88 cycles later."""
    assert _ldgsts_run(16) - _ldgsts_run(4) == 88


def _local_run(hit: float) -> float:
    """A warp loading 512 bytes of local memory and using them (LDL.128 then an FFMA on its
    scoreboard), the copy latency 400, the L2's share 64 bytes a cycle."""
    gpu = H200.with_(l2_bytes_per_cycle=64.0, global_latency_idle=None, global_latency=400, local_hit=hit)
    ldl = step("LDL.128", "R4, [R10]", "", _control(write=2), gpu, {})
    use = step("FFMA", "R0, R4, R5, R6", "", _control(wait=1 << 2), gpu, {})
    done = step("EXIT", "", "", _control(), gpu, {})
    return run_sm([[ldl, use, done]], 1, gpu, account=False).cycles


def test_a_local_load_that_misses_waits_for_the_l2():
    """All hits: the 4 wavefronts, then smem_latency. All misses: also 512 bytes at 64 a cycle (8)
    and the copy latency (400). Half: half of each: 256 bytes (4 cycles) and 200."""
    hit, miss, half = _local_run(1.0), _local_run(0.0), _local_run(0.5)
    assert miss - hit == pytest.approx(400 + 8, abs=1)
    assert half - hit == pytest.approx(0.5 * (400 + 4), abs=1)


def test_local_stores_write_through_to_the_l2():
    """Every STL's bytes go on to the L2 (write-through), hit or miss: a store waits for nothing, so
    a warp's STLs alone end as they did; a later global load waits behind their bytes, 4 x 512 at
    16 bytes a cycle, whatever the hit rate."""
    def run(hit):
        gpu = H200.with_(global_bytes_per_cycle=16.0, l2_bytes_per_cycle=16.0, global_latency_idle=None,
                         global_latency=100, local_hit=hit)
        stl = step("STL.128", "[R1], R4", "", _control(), gpu, {})
        ldg = step("LDG.E.128", "R8, desc[UR4][R2.64]", "", _control(write=1), gpu, {})
        use = step("FFMA", "R0, R8, R5, R6", "", _control(wait=1 << 1), gpu, {})
        done = step("EXIT", "", "", _control(), gpu, {})
        ldg_alone = run_sm([[ldg, use, done]], 1, gpu, account=False).cycles
        return run_sm([[stl] * 4 + [done]], 1, gpu, account=False).cycles, \
            run_sm([[stl] * 4 + [ldg, use, done]], 1, gpu, account=False).cycles - ldg_alone
    (alone_hit, behind_hit), (alone_miss, behind_miss) = run(1.0), run(0.0)
    assert alone_hit == alone_miss
    assert behind_hit == behind_miss == pytest.approx(4 * 512 / 16, abs=6)


# ---- the L1 beside the shared memory ------------------------------------------------------------------
def test_the_l1_is_what_the_carveout_leaves():
    """sm_90: 256 KB of L1 and shared memory, the carveout the smallest of 0, 8, ..., 228 KB that holds
    the resident CTAs' shared memory with the driver's 1 KB each, one size up for CTAs of at most
    32 KB. Four CTAs of 24 KB need 100 KB and get 132 (the L1 keeps 124: Nsight Compute's limit of 5
    such CTAs on the H200); two of 96 KB 196 KB (60 left), two of 102 KB the largest (28 left); four
    of 40 KB exactly 164. No CTA, the whole 256 KB. The A100: 192 KB."""
    assert H200.l1_free(24 * 1024, 4) == 124 * 1024
    assert H200.l1_free(96 * 1024, 2) == 60 * 1024
    assert H200.l1_free(102 * 1024, 2) == 28 * 1024
    assert H200.l1_free(40 * 1024, 4) == 92 * 1024
    assert H200.l1_free(18 * 1024, 4) == 124 * 1024  # 76 KB: 100, one up
    assert H200.l1_free(0, 0) == 256 * 1024 and A100.l1_free(0, 0) == 192 * 1024


def test_the_profiled_carveouts():
    """Each of the 12 H200 kernels Nsight Compute profiled: the carveout the model gives its config
    holds as many CTAs as ncu's launch__occupancy_limit_shared_mem says."""
    import json
    from pathlib import Path

    from fa_sim.config import KernelConfig
    from fa_sim.timing.local import carveout

    data = json.loads((Path(__file__).parent / "data" / "h200" / "timing_ncu.json").read_text())
    for k in data["kernels"]:
        cfg = KernelConfig.from_tag(k["key"].split("/")[0])
        slots = int(k["launch__occupancy_limit_registers"])
        carve = carveout(H200, cfg.smem_bytes, slots)
        assert carve // (cfg.smem_bytes + H200.smem_reserved) == k["launch__occupancy_limit_shared_mem"], k["key"]


def test_local_hits_follow_random_replacement():
    """A working set within the L1 hits always; past it, the fixed point h = exp(-(1 - h) F / C):
    qk_rolled's 128 KB (4 CTAs x 128 threads x 256 bytes) in the 124 KB beside 132 KB of shared
    memory 93.8 % (the H100 measured 90.7 % of load and 94.7 % of store sectors); two CTAs of 280
    bytes (70 KB) in 60 KB 73 %; one CTA (35 KB) all; no stack, all."""
    from fa_sim.timing.local import hit_rate

    assert hit_rate(1.0, 1.0) == 1.0 and hit_rate(0.5, 1.0) == 1.0 and hit_rate(1.0, 0.0) == 0.0
    for r in (1.01, 1.2, 2.0, 5.0):
        h = hit_rate(r, 1.0)
        assert h == pytest.approx(np.exp(-(1 - h) * r), abs=1e-9) and 0 < h < 1
    assert H200.with_local(256, 128, 24 * 1024, 4, 4).local_hit == pytest.approx(0.9386, abs=1e-3)
    assert H200.with_local(280, 128, 96 * 1024, 2, 2).local_hit == pytest.approx(0.7286, abs=1e-3)
    assert H200.with_local(280, 128, 96 * 1024, 1, 2).local_hit == 1.0
    assert H200.with_local(0, 128, 96 * 1024, 2, 2).local_hit == 1.0


@pytest.mark.parametrize("tag,sectors,tags", [
    ("m64n64d64w4-swizzled", 16.0, 0.0), ("m64n64d64w4-plain", 16.0, 0.0),  # whole sectors
    ("m64n64d64w4-padded", 24.0, 2.0), ("m64n64d128w4-padded", 24.0, 2.0), ("m64n32d32w4-padded", 24.0, 2.0)])
def test_padded_copies_fetch_a_source_sector_per_destination_sector_it_feeds(tag, sectors, tags):
    """The padded rows (pitch d + 8 halves) start 16 bytes off their source sectors on every odd
    row: each of their 32-byte source sectors feeds two destination sectors and is fetched for
    each (fa_sim.timing.predict.CopyPieces), 8 sectors for a row's 4 where the swizzled and plain
    rows keep them whole: 1.5x over a tile (the H100's L2 sectors of the padded m64n64d64w4, 51.1 M
    against the swizzled 30.8 M, tests/data/h100/ncu_layouts_edits.json). A copy then costs the L2
    its 24 sectors and the L1 a quarter wavefront for each of the 8 extra: 2 at issue."""
    from fa_sim.config import KernelConfig
    from fa_sim.timing.predict import global_sectors

    counts = global_sectors(KernelConfig.from_tag(tag))["LDGSTS"]
    assert counts.sectors_per_request == sectors and counts.ideal_sectors * 1.0 / counts.requests == 16.0
    assert global_cost("LDGSTS", 16, {"LDGSTS": counts}) == (round(32 * sectors), tags)
