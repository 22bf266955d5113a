"""The hazard checker's exact reports (kind, byte address, CTA, warp, lane, the other thread) on a
hand-written PTX kernel run by fa_sim.ptx.launch: one race of each kind between chosen threads,
and a barrier-ordered pair that is no race. In particular a WAR where the writer was the first to
read the byte and only the second reader is unordered: a checker that remembered one reader per
byte would report nothing there.
"""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="fa_sim.ptx.launch loads the engine's NVRTC front end")

from fa_sim.observers import HazardChecker, HazardKind  # noqa: E402
from fa_sim.ptx import launch  # noqa: E402

K = HazardKind


def _if(tid: int, ins: str) -> str:
    return f"  setp.eq.u32 %p1, %r1, {tid};\n  @%p1 {ins};\n"


RACES = "".join([
    # WAR, second reader only: thread 0 reads s[0] first, thread 33 (warp 1) next, thread 0 writes it
    _if(0, "ld.shared.u32 %r5, [s]"), _if(33, "ld.shared.u32 %r5, [s]"), _if(0, "st.shared.u32 [s], %r1"),
    # RAW without a barrier: thread 5 writes s[8..11], thread 40 reads it
    _if(5, "st.shared.u32 [s+8], %r1"), _if(40, "ld.shared.u32 %r5, [s+8]"),
    # WAW: thread 1 then thread 2 write s[16..19]
    _if(1, "st.shared.u32 [s+16], %r1"), _if(2, "st.shared.u32 [s+16], %r1"),
    # WAR, first reader: thread 7 reads s[64..67], thread 9 writes it
    _if(7, "ld.shared.u32 %r5, [s+64]"), _if(9, "st.shared.u32 [s+64], %r1"),
    # RAW of cp.async data before the wait: thread 3 copies 16 bytes to s[128..143], reads s[132]
    _if(3, "cp.async.ca.shared.global [s+128], [%rd2], 16"), _if(3, "cp.async.commit_group"),
    _if(3, "ld.shared.u32 %r5, [s+132]"),
    # ordered by the barrier: no race
    _if(10, "st.shared.u32 [s+192], %r1"), "  cp.async.wait_all;\n  bar.sync 0;\n",
    _if(50, "ld.shared.u32 %r5, [s+192]"),
])

KERNEL = f""".version 7.8
.target sm_80
.address_size 64

.visible .entry races(.param .u64 races_g)
{{
  .reg .pred %p<4>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<4>;
  .shared .align 16 .b8 s[256];
  ld.param.u64 %rd1, [races_g];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, s;
  shl.b32 %r3, %r1, 2;
  add.u32 %r4, %r2, %r3;
  st.shared.u32 [%r4], %r1;     // each thread writes its own word, then a barrier: all initialised
  bar.sync 0;
{RACES}  ret;
}}
"""

# (kind, byte address, warp, lane, other thread), in the order the instructions run
WANT = [(K.WAR, 0, 0, 0, 33), (K.RAW_NO_BARRIER, 8, 1, 8, 5), (K.WAW, 16, 0, 2, 1), (K.WAR, 64, 0, 9, 7),
        (K.RAW_ASYNC, 132, 0, 3, 3)]


@pytest.mark.parametrize("ctas", [1, 2])
def test_each_race_is_reported_exactly_once_per_cta(ctas):
    hz = HazardChecker()
    launch(KERNEL, grid=ctas, block=64, args=[np.zeros(16, np.int32)], observers=[hz])
    rep = hz.report()
    got = [(h.kind, h.addr, h.cta, h.warp, h.lane, h.other_thread) for h in rep.hazards]
    want = [(k, a, c, w, lane, o) for k, a, w, lane, o in WANT for c in range(ctas)]
    assert got == want
    assert rep.total == len(want)
    war = rep.hazards[0]  # the writer's instruction, and the second reader's
    assert war.ptx == "st.shared.u32 [s], %r1;" and war.other_pc < war.pc


def test_the_second_reader_alone_makes_the_war():
    """Without thread 33's read the same write is no race (the writer read the byte itself)."""
    hz = HazardChecker()
    alone = KERNEL.replace(_if(33, "ld.shared.u32 %r5, [s]"), "")
    launch(alone, grid=1, block=64, args=[np.zeros(16, np.int32)], observers=[hz])
    got = [(h.kind, h.addr, h.warp, h.lane, h.other_thread) for h in hz.report().hazards]
    assert got == WANT[1:]
