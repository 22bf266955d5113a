"""Operands of the PTX engine's GEMM regions (fa_sim/ptx/chains.py, chain_operands.py) taken
without registers: an A operand that cvt.rn.f16x2.f32 packs from f32 registers for the mmas alone
(P~ of O += P~ V), which the GEMM rounds itself, and a B operand that every CTA of the wave holds
in the same shared-memory bytes (one head's K or V tile), read from CTA 0 once. They must give the
bits, counts and faults of the instructions one at a time (an observer of instruction events
makes the engine run them so)."""

import numpy as np
import pytest

from fa_sim.errors import KernelFault
from fa_sim.events import Op
from fa_sim.ptx import chains, launch

MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
LDSM = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"

# One warp: 16 f32 per lane packed into the A fragments of two k16 steps, B from global memory,
# two n8 columns from +0 accumulators; LOAD (an ldmatrix) goes between the steps.
PACK_PTX = f"""
.version 7.8
.target sm_80
.address_size 64

.visible .entry pack(.param .u64 pa, .param .u64 pb, .param .u64 pd, .param .u32 poff)
{{
    .reg .b32 %r<32>;
    .reg .f32 %f<32>;
    .reg .b64 %rd<12>;
    .shared .align 16 .b8 buf[2048];
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pd];
    ld.param.u32 %r30, [poff];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd5, %r0, 64;
    add.s64 %rd6, %rd1, %rd5;
    ld.global.v4.f32 {{%f1, %f2, %f3, %f4}}, [%rd6];
    ld.global.v4.f32 {{%f5, %f6, %f7, %f8}}, [%rd6+16];
    ld.global.v4.f32 {{%f9, %f10, %f11, %f12}}, [%rd6+32];
    ld.global.v4.f32 {{%f13, %f14, %f15, %f16}}, [%rd6+48];
    mul.wide.u32 %rd7, %r0, 32;
    add.s64 %rd8, %rd2, %rd7;
    ld.global.v4.b32 {{%r9, %r10, %r11, %r12}}, [%rd8];
    ld.global.v4.b32 {{%r13, %r14, %r15, %r16}}, [%rd8+16];
    mov.u32 %r17, buf;
    add.s32 %r18, %r17, %r30;
    mov.f32 %f20, 0f00000000;
    mov.f32 %f21, %f20;
    mov.f32 %f22, %f20;
    mov.f32 %f23, %f20;
    mov.f32 %f24, %f20;
    mov.f32 %f25, %f20;
    mov.f32 %f26, %f20;
    mov.f32 %f27, %f20;
    cvt.rn.f16x2.f32 %r1, %f2, %f1;
    cvt.rn.f16x2.f32 %r2, %f4, %f3;
    cvt.rn.f16x2.f32 %r3, %f6, %f5;
    cvt.rn.f16x2.f32 %r4, %f8, %f7;
    cvt.rn.f16x2.f32 %r5, %f10, %f9;
    cvt.rn.f16x2.f32 %r6, %f12, %f11;
    cvt.rn.f16x2.f32 %r7, %f14, %f13;
    cvt.rn.f16x2.f32 %r8, %f16, %f15;
    {MMA} {{%f20, %f21, %f22, %f23}}, {{%r1, %r2, %r3, %r4}}, {{%r9, %r10}}, {{%f20, %f21, %f22, %f23}};
    {MMA} {{%f24, %f25, %f26, %f27}}, {{%r1, %r2, %r3, %r4}}, {{%r11, %r12}}, {{%f24, %f25, %f26, %f27}};
    LOAD
    {MMA} {{%f20, %f21, %f22, %f23}}, {{%r5, %r6, %r7, %r8}}, {{%r13, %r14}}, {{%f20, %f21, %f22, %f23}};
    {MMA} {{%f24, %f25, %f26, %f27}}, {{%r5, %r6, %r7, %r8}}, {{%r15, %r16}}, {{%f24, %f25, %f26, %f27}};
    mul.wide.u32 %rd9, %r0, 32;
    add.s64 %rd10, %rd3, %rd9;
    st.global.v4.f32 [%rd10], {{%f20, %f21, %f22, %f23}};
    st.global.v4.f32 [%rd10+16], {{%f24, %f25, %f26, %f27}};
    ret;
}}
"""
LOAD = f"{LDSM} {{%r19, %r20, %r21, %r22}}, [%r18];"

# f32 values where rounding to f16 is delicate: ties, subnormals, overflow, signed zeros, inf
EDGES = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 65504.0, 65519.99, 65520.0, -70000.0, 2.0**-24,
                  2.0**-25, 3 * 2.0**-26, 1e-8, -0.0, 0.0, np.inf, -np.inf, -1 - 2.0**-11, 2.0**-14 * 1.5],
                 np.float32)


class Watcher:
    """An observer of instruction events: the engine then runs every instruction by itself."""

    def on_instr(self, ev):
        pass


def a_values(nan: bool) -> np.ndarray:
    """A's f32 values; with a NaN the GEMM rounds them as f16 bits (f32_to_f16_values gives None)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(32 * 16).astype(np.float32)
    x[::5] = np.resize(EDGES, x[::5].shape)
    if nan:
        x[37] = np.float32(np.nan)
    return x


def run_pack(nan: bool, load: str = "", offset: int = 0, observers=(), model: str = "exact"):
    rng = np.random.default_rng(8)
    b = (rng.standard_normal(32 * 16) / 4).astype(np.float16).view(np.uint32)
    out = np.zeros(32 * 8, np.float32)
    res = launch(PACK_PTX.replace("LOAD", load), grid=(1,), block=(32,),
                 args=[a_values(nan), b, out, np.uint32(offset)], observers=observers, mma_model=model)
    return out.reshape(32, 8), res


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("load, model", [("", "exact"), (LOAD, "exact"), ("", "h200")])
def test_packed_a_gives_the_bits_and_counts_of_single_instructions(monkeypatch, nan, load, model):
    packs = []
    run_grid = chains.Grid.run
    monkeypatch.setattr(chains.Grid, "run", lambda self, eng, loads: packs.append(self.a_packs) or
                        run_grid(self, eng, loads))
    chained, res = run_pack(nan, load, model=model)
    assert packs and all(p is not None for p in packs)
    assert packs[0][:4] == ("%f1", "%f2", "%f3", "%f4")  # each register's low (cvt's b) then high half
    packs.clear()
    single, res_single = run_pack(nan, load, observers=[Watcher()], model=model)
    assert not packs
    np.testing.assert_array_equal(chained.view(np.uint32), single.view(np.uint32))
    assert res.counts == res_single.counts and res.instructions[Op.HMMA] == 4


def test_a_fault_after_packs_is_that_of_single_instructions():
    errors = []
    for observers in ((), [Watcher()]):
        with pytest.raises(KernelFault) as info:
            run_pack(False, LOAD, 4096, observers)
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "ldmatrix" in errors[0] and "outside" in errors[0]


@pytest.mark.parametrize("load, packed", [("", True), ("mov.b32 %r23, %r5;", False), ("mov.f32 %f9, 0f3F800000;", False)])
def test_a_pack_is_fed_only_when_only_the_mmas_read_it_and_its_sources_stay(load, packed):
    # %r5 read besides the mmas, or a source of its pack (%f9) written before the region ends
    from fa_sim.ptx.parser import parse
    from fa_sim.ptx.program import build_program
    prog = build_program(parse(PACK_PTX.replace("LOAD", load)))
    steps = prog.compiled.steps(0, prog.compiled.stop[0])
    gemms = [s for s in steps if isinstance(s, chains.Gemm)]
    assert len(gemms) == 1 and [g.a_packs is not None for g in gemms[0].grids] == [packed]
    # the movs of +0 into the accumulators: the GEMM's D write overwrites them before any read
    assert [i.opcode for i in gemms[0].deferred].count("mov") == 8


@pytest.mark.parametrize("heads, shared, model", [(1, True, "exact"), (1, True, "h200"), (2, False, "exact")])
def test_a_b_tile_every_cta_holds_is_read_once_with_the_bits_of_single_instructions(monkeypatch, heads, shared,
                                                                                    model):
    import fa_sim
    from fa_sim.ptx import chain_operands
    same = []
    check = chain_operands._same_in_every_cta
    monkeypatch.setattr(chain_operands, "_same_in_every_cta", lambda *a: same.append(check(*a)) or same[-1])
    rng = np.random.default_rng(heads)
    q, k, v = (rng.standard_normal((1, heads, 256, 64)).astype(np.float16) for _ in range(3))
    chained = fa_sim.simulate(q, k, v, False, engine="ptx", mma_model=model)
    assert same and all(same) == shared and any(same) == shared  # a wave of two heads: two K tiles
    single = fa_sim.simulate(q, k, v, False, engine="ptx", mma_model=model, observers=[Watcher()])
    np.testing.assert_array_equal(chained.o.view(np.uint16), single.o.view(np.uint16))
    np.testing.assert_array_equal(chained.lse.view(np.uint32), single.lse.view(np.uint32))
    assert chained.counts == single.counts


def test_a_zeroing_mov_whose_register_the_region_reads_still_executes():
    # %f21 read by lane math in the region: its mov stays, and so does that of %f20 (its source)
    ptx = PACK_PTX.replace("LOAD", "").replace("    cvt.rn.f16x2.f32 %r1,", "    add.f32 %f28, %f21, %f21;\n"
                                               "    cvt.rn.f16x2.f32 %r1,")
    from fa_sim.ptx.parser import parse
    from fa_sim.ptx.program import build_program
    prog = build_program(parse(ptx))
    steps = prog.compiled.steps(0, prog.compiled.stop[0])
    gemm = next(s for s in steps if isinstance(s, chains.Gemm))
    movs = {i.operands[0].name for i in gemm.deferred if i.opcode == "mov"}
    assert movs == {f"%f{r}" for r in range(22, 28)}
    outs = []
    for observers in ((), [Watcher()]):
        rng = np.random.default_rng(8)
        b = (rng.standard_normal(32 * 16) / 4).astype(np.float16).view(np.uint32)
        out = np.zeros(32 * 8, np.float32)
        launch(ptx, grid=(1,), block=(32,), args=[a_values(False), b, out, np.uint32(0)], observers=observers)
        outs.append(out)
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("idx, view", [([5, 4, 3, 2, 1, 0], True), ([0, 2, 4], True), ([49, 48], True),
                                       ([7], False), ([3, 1, 8], False), ([10, 10], False)])
def test_pack_sources_are_read_in_place_when_evenly_spaced(idx, view):
    from fa_sim.ptx.chain_operands import _rows
    file = np.arange(50 * 3, dtype=np.uint32).reshape(50, 3)
    rows = _rows(file, np.array(idx))
    np.testing.assert_array_equal(rows, file[idx])
    assert np.shares_memory(rows, file) == view


@pytest.mark.parametrize("idx, runs", [
    ([1601, 1600, 1599, 1598, 1606, 1607, 1640, 1641, 1642], 3),  # O += P~ V's accumulator
    (list((570 + 8 * np.arange(8)[:, None] + np.arange(4)).ravel()), 8),  # S = Q K^T's
    ([5, 4, 3, 2, 1, 0], 1), ([7], 1), ([0, 2, 4, 9], 2), ([1999, 0], 1),
    (list(range(0, 36, 4)) + list(range(1, 37, 2)), 2),
    (list(range(0, 40, 4)) + [1, 9, 41, 2, 3], 4), (list((np.arange(10)[:, None] + [0, 100]).ravel()), None),
    ([10, 10], None)])
def test_accumulators_are_copied_by_runs_of_evenly_spaced_registers(idx, runs):
    """chain_regs.row_runs: the runs of rows the GEMM copies C from and D to, file[idx] exactly;
    None (one fancy index) for more than MAX_RUNS runs or a repeated register."""
    from fa_sim.ptx.chain_regs import MAX_RUNS, row_runs
    file = np.arange(2000 * 3, dtype=np.uint32).reshape(2000, 3)
    got = row_runs(np.array(idx))
    assert (got is None) == (runs is None) and (got is None or len(got) == runs <= MAX_RUNS)
    if got is not None:
        rows = np.empty((len(idx), 3), np.uint32)
        for first, end, sl in got:
            rows[first:end] = file[sl]
        np.testing.assert_array_equal(rows, file[idx])
