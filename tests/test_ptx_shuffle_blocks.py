"""shfl.sync inside lane blocks (fa_sim/ptx/fused.py, machine_ops.shuffle_lanes): a block gathers
its shuffles itself when the whole wave runs it with static operands - set by movs of immediates
in the block, or by registers the block does not write - and the values, predicates and counts are
those of the shuffles one at a time (what the block runs when that is not so: operands that
differ between threads, exited threads, an observer)."""

import numpy as np
import pytest

from fa_sim.ptx import fused, launch

# The loop's block: movs of the first shuffle's offset, clamp and mask; the second shuffle's offset
# and clamp come from before the loop (read when the block starts); its predicate picks the value.
STATIC = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry shuffles(.param .u64 pout, .param .u32 ptrips)
{
    .reg .pred %p<4>;
    .reg .b32 %r<30>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [pout];
    ld.param.u32 %r1, [ptrips];
    mov.u32 %r10, %tid.x;
    mov.u32 %r11, %ctaid.x;
    mad.lo.s32 %r2, %r11, 64, %r10;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd1, %rd3;
    mov.u32 %r3, 0;
    mov.u32 %r5, %r2;
    mov.u32 %r15, 3;
    mov.u32 %r16, 31;
LOOP:
    mov.u32 %r6, 5;
    mov.u32 %r7, 31;
    mov.u32 %r8, -1;
    mul.lo.s32 %r12, %r5, 7;
    shfl.sync.bfly.b32 %r9|%p1, %r12, %r6, %r7, %r8;
    shfl.sync.down.b32 %r13|%p3, %r9, %r15, %r16, %r8;
    selp.b32 %r14, %r13, %r12, %p3;
    add.s32 %r5, %r14, %r3;
    add.s32 %r3, %r3, 1;
    setp.lt.s32 %p2, %r3, %r1;
    @%p2 bra LOOP;
    st.global.u32 [%rd4], %r5;
    ret;
}
"""

# The same with the second shuffle's offset per thread (lane & 3): not static, one at a time.
PER_LANE = STATIC.replace("mov.u32 %r15, 3;", "and.b32 %r15, %r10, 3;")

# The second shuffle's offset computed in the loop before it (1 + the turn's index mod 4): the
# block cannot take it before it runs, so the shuffles stand apart from the lane math around them.
COMPUTED = STATIC.replace("    mul.lo.s32 %r12, %r5, 7;\n", "    mul.lo.s32 %r12, %r5, 7;\n    and.b32 %r17, %r3, 3;\n"
                          "    add.s32 %r15, %r17, 1;\n", 1)

# Each CTA's second warp exits before the loop: the block takes only a wave without exited threads
# (one at a time here).
EXITED = STATIC.replace("    mov.u32 %r3, 0;\n", "    setp.ge.u32 %p0, %r10, 32;\n    @%p0 ret;\n    mov.u32 %r3, 0;\n", 1)

TRIPS = 6


class Watcher:
    def on_instr(self, ev):
        pass


def run(ptx, observers=()):
    out = np.zeros(128, np.uint32)
    res = launch(ptx, grid=(2,), block=(64,), args=[out, np.uint32(TRIPS)], observers=observers)
    return out, res


@pytest.fixture
def gathered(monkeypatch):
    """How often a block gathered its shuffles (shuffle_lanes found them static)."""
    hits = []
    original = fused.shuffle_lanes
    def counted(eng, group, shuffles):
        lanes = original(eng, group, shuffles)
        hits.append(lanes is not None)
        return lanes
    monkeypatch.setattr(fused, "shuffle_lanes", counted)
    return hits


def one_at_a_time(monkeypatch, ptx):
    monkeypatch.setattr(fused, "shuffle_lanes", lambda eng, group, shuffles: None)
    return run(ptx)


@pytest.mark.parametrize("ptx, fast", [(STATIC, True), (PER_LANE, False), (EXITED, False), (COMPUTED, False)],
                         ids=["static", "per-lane", "exited", "computed"])
def test_a_block_gathers_its_shuffles_as_they_run_one_at_a_time(monkeypatch, gathered, ptx, fast):
    out, res = run(ptx)
    assert any(gathered) == fast
    assert out.any()
    single, res_single = one_at_a_time(monkeypatch, ptx)
    np.testing.assert_array_equal(out, single)
    assert res.counts == res_single.counts
    watched, res_watched = run(ptx, [Watcher()])
    np.testing.assert_array_equal(out, watched)
    assert res.counts == res_watched.counts


def test_shuffles_in_a_block_compute_the_warp_reduction():
    """The static kernel against numpy: bfly 5 then down 3 (clamp 31: lanes 29..31 keep their own)."""
    out, _ = run(STATIC)
    v = np.arange(128, dtype=np.int64).reshape(4, 32)  # per warp
    lane = np.arange(32)
    for t in range(TRIPS):
        x = (v * 7) & 0xFFFFFFFF
        y = x[:, lane ^ 5]
        down = lane + 3
        z = np.where(down < 32, y[:, np.minimum(down, 31)], x)
        v = (z + t) & 0xFFFFFFFF
    np.testing.assert_array_equal(out, v.reshape(-1).astype(np.uint32))
