"""The PTX engine's fused lane blocks (fa_sim/ptx/fused.py): a run of register-only instructions
compiled into one function gives the bits of the instructions executed one by one (the engine's
reference path: a block's first runs in a wave, part of the wave, an observer), stores only the registers
something outside the block reads, and names the failing instruction in an error."""

import numpy as np
import pytest

from fa_sim.events import Op
from fa_sim.ptx import fused, launch, parse
from fa_sim.ptx.ops import Unsupported
from fa_sim.ptx.program import build_program

# Each thread loops tid % 8 + trips times (so the last turns run for part of the wave) over lane
# math of every kind a block meets: f32 arithmetic, accumulators read before the block writes them
# (%r12 only there: the next turn reads it), a register copied before the block overwrites it and
# the copy read after (%r7 of %r5), a register written four times, a 64-bit product truncated
# back, setp and unpack / pack (executors run on the block's locals), a negated predicate source.
PTX = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry lanes(.param .u64 pin, .param .u64 pout, .param .u32 ptrips)
{
    .reg .pred %p<4>;
    .reg .b16 %h<3>;
    .reg .b32 %r<16>;
    .reg .f32 %f<10>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    ld.param.u32 %r1, [ptrips];
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f32 %f1, [%rd4];
    mov.f32 %f2, 0f00000000;
    mov.u32 %r3, 0;
    and.b32 %r4, %r2, 7;
    add.s32 %r1, %r1, %r4;
    mov.b32 %r5, 0;
LOOP:
    mul.rn.f32 %f3, %f1, 0f3FC00000;
    add.rn.f32 %f4, %f3, %f2;
    max.f32 %f5, %f4, 0fC0000000;
    cvt.rn.f32.s32 %f6, %r3;
    fma.rn.f32 %f2, %f5, 0f3F000000, %f6;
    mov.b32 %r6, %f2;
    mov.b32 %r7, %r5;
    xor.b32 %r5, %r5, %r6;
    shl.b32 %r8, %r7, 1;
    add.s32 %r5, %r5, %r8;
    mul.wide.u32 %rd5, %r5, 3;
    cvt.u32.u64 %r9, %rd5;
    setp.lt.u32 %p1, %r9, 1000000000;
    setp.ne.and.u32 %p3, %r9, 0, !%p1;
    selp.b32 %r10, %r9, %r7, %p3;
    mov.b32 {%h1, %h2}, %r10;
    mov.b32 %r11, {%h2, %h1};
    add.s32 %r12, %r12, %r9;
    xor.b32 %r5, %r5, %r12;
    add.s32 %r5, %r5, %r11;
    xor.b32 %r14, %r7, %r3;
    add.s32 %r3, %r3, 1;
    setp.lt.s32 %p2, %r3, %r1;
    @%p2 bra LOOP;
    mul.wide.u32 %rd6, %r2, 16;
    add.s64 %rd7, %rd2, %rd6;
    st.global.v4.b32 [%rd7], {%r6, %r5, %r14, %r14};
    ret;
}
"""


def run(observers=(), trips: int = 5):
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    out = np.zeros(4 * 64, np.uint32)
    res = launch(PTX, grid=(2,), block=(32,), args=[x, out, np.uint32(trips)], observers=observers)
    return out, res


class Watcher:
    """An observer of instruction events: the engine then runs every instruction by itself."""

    def __init__(self):
        self.reg = 0

    def on_instr(self, ev):
        self.reg += ev.op is Op.REG


@pytest.mark.parametrize("compile_at", [1, 3])
def test_a_compiled_block_gives_the_bits_of_single_instructions(monkeypatch, compile_at):
    monkeypatch.setattr(fused, "COMPILE_AT_RUN", 10 ** 9)  # never compiled: one instruction at a time
    single, res_single = run()
    monkeypatch.setattr(fused, "COMPILE_AT_RUN", compile_at)
    fused_out, res = run()
    np.testing.assert_array_equal(fused_out, single)
    assert res.counts == res_single.counts
    watched, _ = run([Watcher()])
    np.testing.assert_array_equal(watched, single)


def loop_block():
    prog = build_program(parse(PTX))
    code = prog.kernel.instructions
    head = prog.kernel.labels["LOOP"]
    bra = next(i.pc for i in code if i.opcode == "bra")
    steps = prog.compiled.steps(head, bra)
    (block,) = [s for s in steps if isinstance(s, fused.LaneBlock)]
    return block


def test_a_block_stores_only_what_is_read_outside_it_or_on_its_next_run():
    block = loop_block()
    assert [i.opcode for i in block.inss][:3] == ["mul", "add", "max"] and block.inss[-1].opcode == "setp"
    code = block._compile()
    # %f2 %r5 %r3 %r12: the next turn reads them first; %r6 %r5 %r14: stored after the loop; %p2: the branch's
    assert code.stores == {"%f2", "%r3", "%r5", "%r6", "%r12", "%r14", "%p2"}
    assert {name for kind, name, _ in code.slots if kind == "store"} == code.stores
    assert "ENV(" in code.source  # setp.ne.and and the vector movs run their executors on the locals
    assert "copy()" in code.source  # %r5 is read (by mov %r7) before the block stores it


def test_an_error_in_a_compiled_block_names_its_instruction(monkeypatch):
    monkeypatch.setattr(fused, "COMPILE_AT_RUN", 1)
    bad = PTX.replace("mov.b32 %r7, %r5;", "mov.u32 %r7, %clock;")
    with pytest.raises(Unsupported, match=r"%clock.*in `mov.u32 %r7, %clock;` at PTX line"):
        launch(bad, grid=(1,), block=(32,), args=[np.zeros(32, np.float32), np.zeros(128, np.uint32), np.uint32(2)])



# A loop body of independent instructions with the same value function (packs, fa_sim/ptx/packs.py):
# muls, subs, ex2s and cvts side by side, shifts by different amounts (not packed: one immediate
# per call), and %f1 read from the register file (by the add) before a mul of the same level as
# the first one overwrites it - the pack must not run that mul before the add.
PACKS = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry packs(.param .u64 pin, .param .u64 pout, .param .u32 ptrips)
{
    .reg .pred %p<2>;
    .reg .b32 %r<12>;
    .reg .f32 %f<20>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    ld.param.u32 %r1, [ptrips];
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd3, %r2, 32;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd4];
    ld.global.v4.f32 {%f5, %f6, %f7, %f8}, [%rd4+16];
    mov.u32 %r3, 0;
    mov.u32 %r8, 0;
LOOP:
    mul.rn.f32 %f11, %f3, 0f40000000;
    add.rn.f32 %f10, %f1, %f2;
    mul.rn.f32 %f1, %f5, 0f3F000000;
    mul.rn.f32 %f14, %f6, %f7;
    mul.rn.f32 %f15, %f8, %f7;
    mul.rn.f32 %f12, %f10, %f11;
    sub.rn.f32 %f16, %f14, %f12;
    sub.rn.f32 %f17, %f15, %f12;
    ex2.approx.ftz.f32 %f18, %f16;
    ex2.approx.ftz.f32 %f19, %f17;
    add.rn.f32 %f2, %f18, %f19;
    cvt.rn.f16x2.f32 %r4, %f18, %f19;
    cvt.rn.f16x2.f32 %r5, %f19, %f1;
    shl.b32 %r6, %r4, 1;
    shl.b32 %r7, %r5, 2;
    xor.b32 %r8, %r8, %r6;
    xor.b32 %r8, %r8, %r7;
    add.s32 %r3, %r3, 1;
    setp.lt.s32 %p1, %r3, %r1;
    @%p1 bra LOOP;
    mul.wide.u32 %rd5, %r2, 16;
    add.s64 %rd6, %rd2, %rd5;
    mov.b32 %r9, %f1;
    mov.b32 %r10, %f2;
    st.global.v4.b32 [%rd6], {%r8, %r9, %r10, %r4};
    ret;
}
"""


def test_packs_give_the_bits_of_single_instructions(monkeypatch):
    x = (np.random.default_rng(3).standard_normal(8 * 32) * 3).astype(np.float32)
    def packs_run():
        out = np.zeros(4 * 32, np.uint32)
        launch(PACKS, grid=(2,), block=(32,), args=[x, out, np.uint32(6)])
        return out
    monkeypatch.setattr(fused, "COMPILE_AT_RUN", 10 ** 9)
    single = packs_run()
    monkeypatch.setattr(fused, "COMPILE_AT_RUN", 1)
    np.testing.assert_array_equal(packs_run(), single)
    prog = build_program(parse(PACKS))
    head = prog.kernel.labels["LOOP"]
    bra = next(i.pc for i in prog.kernel.instructions if i.opcode == "bra")
    (block,) = [s for s in prog.compiled.steps(head, bra) if isinstance(s, fused.LaneBlock)]
    source = block._compile().source
    assert source.count("ASM(") >= 4  # muls, subs, ex2s, cvts
    assert "STACK(" in source and "()" in source  # operands stacked, rows gathered from the file
