"""The PTX engine's fused lane blocks (fa_sim/ptx/fused.py): a run of register-only instructions
compiled into one function gives the bits of the instructions executed one by one (the engine's
reference path: a block's first runs in a wave, part of the wave, an observer), stores only the registers
something outside the block reads, and names the failing instruction in an error."""

import re

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


# Chains of one instruction (the adds of a softmax row's sum, the maxes of its maximum) run as one
# call of a fold (fa_sim/ptx/packs.py fold_chains), and a pack whose members only store their values
# stores its rows at once (the muls that rescale %f11 .. %f13): an add chain with the earlier sum as either
# operand and an operand computed inside the block, its last sum stored for the next turn; a max
# chain that a neg between its members cuts (it stores %f7, which a member before it read from the
# register file); a min chain cut where a sub reads one of its sums, and a min whose other operand
# comes from the chain (not a member). The inputs hold NaNs, zeros of both signs, infinities and
# subnormals, and %f1 changes sign every turn.
CHAINS = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry chains(.param .u64 pin, .param .u64 pout, .param .u32 ptrips)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .f32 %f<40>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    ld.param.u32 %r1, [ptrips];
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd3, %r2, 32;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd4];
    ld.global.v4.f32 {%f5, %f6, %f7, %f8}, [%rd4+16];
    mov.f32 %f11, %f5;
    mov.f32 %f12, %f6;
    mov.f32 %f13, %f8;
    mov.u32 %r3, 0;
LOOP:
    add.rn.f32 %f20, %f1, %f2;
    add.rn.f32 %f21, %f3, %f20;
    add.rn.f32 %f22, %f21, %f4;
    mul.rn.f32 %f30, %f5, %f6;
    add.rn.f32 %f23, %f22, %f30;
    add.rn.f32 %f24, %f23, %f7;
    add.rn.f32 %f2, %f24, %f8;
    max.f32 %f25, %f1, %f3;
    max.f32 %f26, %f4, %f25;
    max.f32 %f27, %f26, %f5;
    max.f32 %f28, %f27, %f6;
    max.f32 %f29, %f28, %f7;
    neg.f32 %f7, %f8;
    max.f32 %f31, %f29, %f2;
    max.f32 %f32, %f31, %f8;
    min.f32 %f34, %f1, %f4;
    min.f32 %f35, %f34, %f5;
    min.f32 %f36, %f35, %f6;
    min.f32 %f37, %f36, %f3;
    sub.rn.f32 %f38, %f35, %f1;
    min.f32 %f39, %f37, %f8;
    min.f32 %f9, %f39, %f38;
    mul.rn.f32 %f11, %f11, %f36;
    mul.rn.f32 %f12, %f12, %f36;
    mul.rn.f32 %f13, %f13, %f36;
    mul.rn.f32 %f1, %f1, 0fBF400000;
    add.s32 %r3, %r3, 1;
    setp.lt.s32 %p1, %r3, %r1;
    @%p1 bra LOOP;
    mul.wide.u32 %rd5, %r2, 48;
    add.s64 %rd6, %rd2, %rd5;
    st.global.v4.f32 [%rd6], {%f2, %f32, %f9, %f38};
    st.global.v4.f32 [%rd6+16], {%f29, %f36, %f37, %f7};
    st.global.v4.f32 [%rd6+32], {%f11, %f12, %f13, %f13};
    ret;
}
"""


def test_chains_give_the_bits_of_single_instructions(monkeypatch):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(8 * 64) * 3).astype(np.float32)
    special = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1e-45, -3e-39, 3e38], np.float32)
    pick = rng.random(x.size) < 0.3
    x[pick] = rng.choice(special, size=int(pick.sum()))
    rows = x.reshape(64, 8)  # threads whose operands are all NaN, all zeros, mostly NaN with zeros
    rows[0], rows[1], rows[2] = np.nan, [0.0, -0.0, -0.0, 0.0, -0.0, 0.0, 0.0, -0.0], -0.0
    rows[3] = [np.nan, np.nan, -0.0, np.nan, 0.0, np.nan, -np.inf, np.nan]
    def chains_run():
        out = np.zeros(12 * 64, np.uint32)
        launch(CHAINS, grid=(2,), block=(32,), args=[x, out, np.uint32(5)])
        return out
    monkeypatch.setattr(fused, "COMPILE_AT_RUN", 10 ** 9)
    single = chains_run()
    monkeypatch.setattr(fused, "COMPILE_AT_RUN", 1)
    np.testing.assert_array_equal(chains_run(), single)
    prog = build_program(parse(CHAINS))
    head = prog.kernel.labels["LOOP"]
    bra = next(i.pc for i in prog.kernel.instructions if i.opcode == "bra")
    (block,) = [s for s in prog.compiled.steps(head, bra) if isinstance(s, fused.LaneBlock)]
    source = block._compile().source
    folds = [line.split("ASM(")[1].split("(")[0] for line in source.splitlines() if line.lstrip().startswith("R")]
    assert len(folds) == 3, source  # the adds (6), the maxes up to the neg (5), the mins up to the sub (4)
    assert ", 6, n)" in source and ", 5, n)" in source and ", 4, n)" in source
    # the three muls that rescale %f11 %f12 %f13 (read after the loop) store their pack at once
    assert re.search(r"^ *V\[\d+\]\(P\d+\)$", source, re.MULTILINE), source
