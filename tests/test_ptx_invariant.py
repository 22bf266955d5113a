"""Loop-invariant lane math (fa_sim/ptx/invariant.py): a step of the main loop made of invariant
instructions skips its runs by the whole wave while nothing it reads has changed, and the results,
counts and events are those of running it every time - also when its producer comes later in the
loop than it, when the last turns run for part of the wave, and under an observer."""

import numpy as np
import pytest

from fa_sim.events import Op
from fa_sim.ptx import invariant, launch, parse
from fa_sim.ptx.program import build_program

# Each thread loops tid % 8 + trips times. A (%r20, %r22) reads %r21, which B writes later in the
# loop: A's first turn reads the value from before the loop, its second B's, and only then may it
# skip. The stores between split the loop into steps; the turn's index (%r3) and the store
# address (%rd6) change every turn, so their math is not invariant.
PTX = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry inv(.param .u64 pout, .param .u64 pside, .param .u32 ptrips)
{
    .reg .pred %p<3>;
    .reg .b32 %r<30>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pside];
    ld.param.u32 %r1, [ptrips];
    mov.u32 %r10, %tid.x;
    mov.u32 %r11, %ctaid.x;
    mad.lo.s32 %r2, %r11, 32, %r10;
    and.b32 %r4, %r2, 7;
    add.s32 %r1, %r1, %r4;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd6, %rd1, %rd3;
    add.s64 %rd7, %rd2, %rd3;
    mov.u32 %r3, 0;
    mov.u32 %r21, 100;
LOOP:
    add.s32 %r20, %r21, %r2;
    shl.b32 %r22, %r20, 1;
    st.global.u32 [%rd6], %r22;
    mul.lo.s32 %r21, %r4, 3;
    xor.b32 %r24, %r21, 9;
    st.global.u32 [%rd7], %r24;
    add.s64 %rd6, %rd6, 256;
    add.s32 %r3, %r3, 1;
    setp.lt.s32 %p2, %r3, %r1;
    @%p2 bra LOOP;
    ret;
}
"""
TRIPS = 5
TURNS = TRIPS + 7


class Watcher:
    """An observer of instruction events: every instruction then runs by itself."""

    def __init__(self):
        self.reg = 0

    def on_instr(self, ev):
        self.reg += ev.op is Op.REG


def run(observers=()):
    out = np.zeros(TURNS * 64, np.uint32)
    side = np.zeros(64, np.uint32)
    res = launch(PTX, grid=(2,), block=(32,), args=[out, side, np.uint32(TRIPS)], observers=observers)
    return out, side, res


def expected():
    tid = np.arange(64)
    trips = TRIPS + tid % 8
    b = 3 * (tid % 8)
    out = np.zeros((TURNS, 64), np.int64)
    out[0] = 2 * (100 + tid)
    out[1:] = 2 * (b + tid)
    out[np.arange(TURNS)[:, None] >= trips[None, :]] = 0  # turns a thread does not run
    return out.reshape(-1).astype(np.uint32), (b ^ 9).astype(np.uint32)


def test_the_invariant_instructions_are_the_math_on_registers_the_loop_does_not_change():
    prog = build_program(parse(PTX))
    code = prog.kernel.instructions
    inv = prog.compiled.invariants
    by_text = {code[p].text.split()[0] + " " + code[p].text.split()[1] for p in inv.pcs}
    # A and B, and the turn's counter, its test and the store address (a step that reads what it
    # writes itself never skips, nor one that reads what such a step writes: each runs after its
    # producer's run); a store's address names a register it does not write
    assert by_text == {"add.s32 %r20,", "shl.b32 %r22,", "mul.lo.s32 %r21,", "xor.b32 %r24,", "add.s32 %r3,",
                       "setp.lt.s32 %p2,", "add.s64 %rd6,"}
    head = prog.kernel.labels["LOOP"]
    counter = inv.kept((next(i for i in code if i.text.startswith("add.s32 %r3")),))
    assert counter.whole and counter.pcs[0] in counter.producers
    a = inv.kept(code[head: head + 2])
    assert a.whole and a.producers == (head + 3,)  # B's mul


def test_skipped_steps_give_the_bits_and_counts_of_running_them(monkeypatch):
    skipped = []
    original = invariant.Kept.skips
    def counted(self, eng):
        hit = original(self, eng)
        skipped.append(hit)
        return hit
    monkeypatch.setattr(invariant.Kept, "skips", counted)
    out, side, res = run()
    assert any(skipped)
    want_out, want_side = expected()
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(side, want_side)
    monkeypatch.setattr(invariant.Kept, "skips", lambda self, eng: False)
    every, every_side, res_every = run()
    np.testing.assert_array_equal(out, every)
    np.testing.assert_array_equal(side, every_side)
    assert res.counts == res_every.counts
    watcher = Watcher()
    watched, watched_side, _ = run([watcher])
    np.testing.assert_array_equal(watched, every)
    np.testing.assert_array_equal(watched_side, every_side)
    assert watcher.reg > 0


def test_without_a_loop_or_when_control_can_enter_it_again_nothing_is_invariant(monkeypatch):
    prog = build_program(parse(PTX))
    assert invariant.invariants(prog.kernel, None).pcs == frozenset()
    monkeypatch.setattr(invariant, "loop_written", lambda kernel, loop: None)
    assert invariant.invariants(prog.kernel, prog.loop).pcs == frozenset()


# A shuffle in the loop whose lane offset and membermask are registers set by movs of immediates
# in the loop (as fa2_fwd's): read once per engine while the movs ran for the whole wave since the
# engine last forgot its stamps. The second CTA runs two turns more (a wave of its own).
SHFL = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry shuffles(.param .u64 pout, .param .u32 ptrips)
{
    .reg .pred %p<3>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [pout];
    ld.param.u32 %r1, [ptrips];
    mov.u32 %r10, %tid.x;
    mov.u32 %r11, %ctaid.x;
    mad.lo.s32 %r2, %r11, 32, %r10;
    shl.b32 %r4, %r11, 1;
    add.s32 %r1, %r1, %r4;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd1, %rd3;
    mov.u32 %r3, 0;
    mov.u32 %r5, %r2;
LOOP:
    mov.u32 %r6, 1;
    mov.u32 %r7, 31;
    mov.u32 %r8, -1;
    shfl.sync.bfly.b32 %r9|%p1, %r5, %r6, %r7, %r8;
    add.s32 %r5, %r9, %r3;
    add.s32 %r3, %r3, 1;
    setp.lt.s32 %p2, %r3, %r1;
    @%p2 bra LOOP;
    st.global.u32 [%rd4], %r5;
    ret;
}
"""


def test_shuffle_operands_that_hold_a_constant_are_read_once(monkeypatch):
    def shuffles():
        out = np.zeros(64, np.uint32)
        launch(SHFL, grid=(2,), block=(32,), args=[out, np.uint32(TRIPS)])
        return out
    held = []
    original = invariant.Invariants.holds_constant
    def counted(self, eng, name, pc):
        held.append(original(self, eng, name, pc))
        return held[-1]
    monkeypatch.setattr(invariant.Invariants, "holds_constant", counted)
    out = shuffles()
    assert any(held)
    monkeypatch.setattr(invariant.Invariants, "holds_constant", lambda self, eng, name, pc: False)
    np.testing.assert_array_equal(out, shuffles())
    assert out.any()
