"""Predicated instructions (`@p op` / `@!p op`) on the PTX engine, hand-written PTX through
fa_sim.ptx.launch: every opcode the engine's dispatch handles itself (memory in every state space,
cp.async and its groups, ldmatrix, mma, shfl, barriers, fences, atomics, control) and one of each
register family has a case where the guard is false for some threads, and those threads must be
left exactly as they were - registers, memory, counters - while the others execute. (NVRTC's
kernels guard only branches, so nothing else in the suite sees a guard on a store.)

Each case runs 2 CTAs of 64 threads. %p1: even threads; %p2: warp 0 (warp-collective forms need
whole warps); %p3: CTA 0. %r10 starts at the sentinel 7 and is stored to out[thread] at the end
unless the case stores itself; out starts at -1.
"""

import re

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="fa_sim.ptx.launch loads the engine's NVRTC front end")

from fa_sim.events import Op  # noqa: E402
from fa_sim.ptx import launch  # noqa: E402
from fa_sim.ptx.optable import CONTROL, OPCODES, Unit  # noqa: E402

CTAS, THREADS = 2, 64
SENTINEL = 7
IN = (np.arange(CTAS * THREADS, dtype=np.int32) * 37 + 1000)

HEAD = """.version 7.8
.target sm_80
.address_size 64
.global .align 4 .u32 gval = 5;
.const .align 4 .b8 cst[8] = {42, 0, 0, 0, 43, 0, 0, 0};

.visible .entry k(.param .u64 k_in, .param .u64 k_out, .param .u64 k_cnt, .param .u32 k_n)
{
  .reg .pred %p<8>;
  .reg .b32 %r<40>;
  .reg .b64 %rd<20>;
  .reg .f32 %f<16>;
  .local .align 16 .b8 loc[16];
  .shared .align 16 .b8 smem[1024];
  ld.param.u64 %rd1, [k_in];
  ld.param.u64 %rd2, [k_out];
  ld.param.u64 %rd3, [k_cnt];
  mov.u32 %r1, %tid.x;
  mov.u32 %r7, %ctaid.x;
  mad.lo.s32 %r8, %r7, 64, %r1;          // global thread index
  and.b32 %r2, %r1, 1;
  setp.eq.s32 %p1, %r2, 0;               // even threads
  setp.lt.u32 %p2, %r1, 32;              // warp 0
  setp.eq.u32 %p3, %r7, 0;               // CTA 0
  mul.wide.u32 %rd4, %r8, 4;
  add.s64 %rd5, %rd1, %rd4;              // &in[thread]
  add.s64 %rd6, %rd2, %rd4;              // &out[thread]
  selp.b64 %rd7, %rd5, 0, %p1;           // &in[thread] where p1, else an illegal address
  selp.b64 %rd9, %rd6, 0, %p1;           // &out[thread] where p1, else an illegal address
  shl.b32 %r3, %r1, 2;
  mov.u32 %r4, smem;
  add.u32 %r5, %r4, %r3;                 // &smem[tid] (shared window)
  selp.b32 %r6, %r5, 100000, %p1;        // &smem[tid] where p1, else outside shared memory
  mov.u32 %r10, 7;
"""
TAIL_STORE = "  st.global.u32 [%rd6], %r10;\n"


def ptx(body: str, store: bool = True) -> str:
    return HEAD + body + (TAIL_STORE if store else "") + "  ret;\n}\n"


T = np.arange(CTAS * THREADS)
TID = T % THREADS
EVEN, WARP0, CTA0 = TID % 2 == 0, TID < 32, T < THREADS


def f32_bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.int32)


def pick(cond, yes, no=SENTINEL) -> np.ndarray:
    return np.where(cond, yes, no).astype(np.int64).astype(np.int32)


# name: (body, stores itself, expected out[thread]) - expected is an array or f(counter) -> array
CASES = {
    # -- memory ----------------------------------------------------------------------------------
    "st.global": ("  @%p1 st.global.u32 [%rd9], %r8;\n", False, pick(EVEN, T, -1)),
    "st (generic)": ("  @%p1 st.u32 [%rd9], %r8;\n", False, pick(EVEN, T, -1)),
    "ld.global": ("  @%p1 ld.global.u32 %r10, [%rd7];\n", True, pick(EVEN, IN)),
    "ld (generic)": ("  @%p1 ld.u32 %r10, [%rd7];\n", True, pick(EVEN, IN)),
    "ld.global of a variable": ("  @%p1 ld.global.u32 %r10, [gval];\n", True, pick(EVEN, 5)),
    "ld.const": ("  @%p1 ld.const.u32 %r10, [cst+4];\n", True, pick(EVEN, 43)),
    "ld.param": ("  @%p1 ld.param.u32 %r10, [k_n];\n", True, pick(EVEN, 99)),
    "st.shared": ("  st.shared.u32 [%r5], %r10;\n  bar.sync 0;\n  @%p1 st.shared.u32 [%r6], %r8;\n"
                  "  bar.sync 0;\n  ld.shared.u32 %r10, [%r5];\n", True, pick(EVEN, T)),
    "ld.shared": ("  st.shared.u32 [%r5], %r8;\n  bar.sync 0;\n  @%p1 ld.shared.u32 %r10, [%r6];\n",
                  True, pick(EVEN, T)),
    "st.local": ("  mov.u32 %r11, loc;\n  st.local.u32 [%r11], %r10;\n  @%p1 st.local.u32 [%r11], %r8;\n"
                 "  ld.local.u32 %r10, [%r11];\n", True, pick(EVEN, T)),
    "ld.local": ("  st.local.u32 [loc+4], %r8;\n  @%p1 ld.local.u32 %r10, [loc+4];\n", True, pick(EVEN, T)),
    "cvta": ("  cvt.u64.u32 %rd10, %r5;\n  cvta.shared.u64 %rd11, %rd10;\n  mov.u64 %rd12, 7;\n"
             "  @%p1 cvta.to.shared.u64 %rd12, %rd11;\n  cvt.u32.u64 %r10, %rd12;\n", True, pick(EVEN, 4 * TID)),
    # -- cp.async ---------------------------------------------------------------------------------
    "cp.async": ("  mov.u32 %r12, -1;\n  st.shared.u32 [%r5], %r12;\n  bar.sync 0;\n"
                 "  @%p1 cp.async.ca.shared.global [%r6], [%rd7], 4;\n  cp.async.wait_all;\n  bar.sync 0;\n"
                 "  ld.shared.u32 %r10, [%r5];\n", True, pick(EVEN, IN, -1)),
    # threads that skip the commit (or the wait) have not waited for their copy: it has not landed
    "cp.async.commit_group": ("  mov.u32 %r12, -1;\n  st.shared.u32 [%r5], %r12;\n"
                              "  cp.async.ca.shared.global [%r5], [%rd5], 4;\n  @%p1 cp.async.commit_group;\n"
                              "  cp.async.wait_group 0;\n  ld.shared.u32 %r10, [%r5];\n", True, pick(EVEN, IN, -1)),
    "cp.async.wait_group": ("  mov.u32 %r12, -1;\n  st.shared.u32 [%r5], %r12;\n"
                            "  cp.async.ca.shared.global [%r5], [%rd5], 4;\n  cp.async.commit_group;\n"
                            "  @%p1 cp.async.wait_group 0;\n  ld.shared.u32 %r10, [%r5];\n", True, pick(EVEN, IN, -1)),
    "cp.async.wait_all": ("  mov.u32 %r12, -1;\n  st.shared.u32 [%r5], %r12;\n"
                          "  cp.async.ca.shared.global [%r5], [%rd5], 4;\n"
                          "  @%p1 cp.async.wait_all;\n  ld.shared.u32 %r10, [%r5];\n", True, pick(EVEN, IN, -1)),
    # -- warp collectives (a whole warp skips) ----------------------------------------------------
    # ldmatrix.x1: lane l receives 32-bit word l of the row-major 8 x 8 b16 matrix (rows from lanes 0..7)
    "ldmatrix": ("  ld.global.u32 %r12, [%rd5];\n  st.shared.u32 [%r5], %r12;\n  bar.sync 0;\n"
                 "  and.b32 %r13, %r1, 7;\n  shl.b32 %r13, %r13, 4;\n  add.u32 %r13, %r4, %r13;\n"
                 "  @%p2 ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r10}, [%r13];\n", True,
                 pick(WARP0, IN[(T // THREADS) * THREADS + TID % 32])),
    "mma": ("  mov.b32 %r20, 0;\n  mov.f32 %f1, 0f40E00000;\n  mov.f32 %f5, 0f3FC00000;\n"
            "  @%p2 mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, "
            "{%r20, %r20, %r20, %r20}, {%r20, %r20}, {%f5, %f5, %f5, %f5};\n  mov.b32 %r10, %f1;\n", True,
            pick(WARP0, f32_bits(1.5), f32_bits(7.0))),
    "shfl (a warp skips)": ("  @%p2 shfl.sync.bfly.b32 %r10, %r8, 1, 31, -1;\n", True, pick(WARP0, T ^ 1)),
    "shfl (lanes skip, membermask)": ("  @%p1 shfl.sync.bfly.b32 %r10, %r8, 2, 31, 0x55555555;\n", True,
                                      pick(EVEN, T ^ 2)),
    "vote (a warp skips)": ("  setp.ne.u32 %p5, %r2, 0;\n  @%p2 vote.sync.ballot.b32 %r10, %p5, -1;\n", True,
                            pick(WARP0, 0xAAAAAAAA)),  # the odd lanes' bits
    # -- synchronisation: CTA 1 skips its barrier (counted below), fences order nothing here -------
    "bar": ("  @%p3 bar.sync 0;\n", True, pick(T >= 0, SENTINEL)),
    "barrier": ("  @%p3 barrier.sync 0;\n", True, pick(T >= 0, SENTINEL)),
    "membar": ("  @%p1 membar.gl;\n", True, pick(T >= 0, SENTINEL)),
    "fence": ("  @%p1 fence.acq_rel.gpu;\n", True, pick(T >= 0, SENTINEL)),
    # -- atomics: even threads in thread order get 0, 1, 2, ... --------------------------------------
    "atom.global": ("  @%p1 atom.global.add.u32 %r10, [%rd3], 1;\n", True, pick(EVEN, T // 2)),
    "red.global": ("  @%p1 red.global.add.u32 [%rd3], 1;\n", True, pick(T >= 0, SENTINEL)),
    "atom.shared": ("  mov.u32 %r12, 0;\n  st.shared.u32 [smem+512], %r12;\n  bar.sync 0;\n"
                    "  @%p1 atom.shared.add.u32 %r10, [smem+512], 1;\n", True, pick(EVEN, TID // 2)),
    # -- control ---------------------------------------------------------------------------------
    "ret": ("  @%p1 ret;\n", True, pick(EVEN, -1)),
    "exit": ("  @!%p1 exit;\n", True, pick(EVEN, SENTINEL, -1)),
    "bra": ("  @%p1 bra SKIP;\n  mov.u32 %r10, 9;\nSKIP:\n", True, pick(EVEN, SENTINEL, 9)),
    # -- one register instruction of each family -----------------------------------------------------
    "integer add": ("  @%p1 add.s32 %r10, %r8, 100;\n", True, pick(EVEN, T + 100)),
    "logic xor": ("  @%p1 xor.b32 %r10, %r8, 255;\n", True, pick(EVEN, T ^ 255)),
    "move mov": ("  @%p1 mov.u32 %r10, %r8;\n", True, pick(EVEN, T)),
    "compare setp": ("  setp.eq.u32 %p4, %r1, %r1;\n  @%p1 setp.gt.u32 %p4, %r1, 10;\n"
                     "  selp.b32 %r10, 1, 0, %p4;\n", True, pick(EVEN, TID > 10, 1)),
    "compare selp": ("  @%p1 selp.b32 %r10, 3, 4, %p2;\n", True, pick(EVEN, pick(WARP0, 3, 4))),
    "convert cvt": ("  mov.f32 %f1, 0f40E00000;\n  @%p1 cvt.rn.f32.u32 %f1, %r8;\n  mov.b32 %r10, %f1;\n", True,
                    pick(EVEN, f32_bits(T), f32_bits(7.0))),
    "floating fma": ("  mov.f32 %f1, 0f40E00000;\n  cvt.rn.f32.u32 %f2, %r8;\n"
                     "  @%p1 fma.rn.f32 %f1, %f2, %f2, %f2;\n  mov.b32 %r10, %f1;\n", True,
                     pick(EVEN, f32_bits(T * T + T), f32_bits(7.0))),
    "half add.f16x2": ("  mov.b32 %r12, 0x3C003C00;\n  @%p1 add.rn.f16x2 %r10, %r12, %r12;\n", True,
                       pick(EVEN, 0x40004000)),
    "sfu ex2": ("  mov.f32 %f1, 0f40E00000;\n  cvt.rn.f32.u32 %f2, %r1;\n  @%p1 ex2.approx.ftz.f32 %f1, %f2;\n"
                "  mov.b32 %r10, %f1;\n", True, pick(EVEN, f32_bits(2.0 ** TID), f32_bits(7.0))),
}


def _run(name):
    body, store, _ = CASES[name]
    out, cnt = np.full(CTAS * THREADS, -1, np.int32), np.zeros(4, np.int32)
    res = launch(ptx(body, store), grid=CTAS, block=THREADS, args=[IN.copy(), out, cnt, np.int32(99)])
    return out, cnt, res


@pytest.mark.parametrize("name", list(CASES))
def test_a_false_guard_leaves_the_thread_as_it_was(name):
    out, cnt, res = _run(name)
    np.testing.assert_array_equal(out, CASES[name][2], err_msg=name)
    if name in ("atom.global", "red.global"):
        assert cnt[0] == EVEN.sum(), name  # only the even threads added
    if name in ("bar", "barrier"):
        assert res.instructions[Op.BAR] == 2  # the 2 warps of CTA 0; CTA 1's guard is false
    if name == "st.global":
        assert sum(n for (op, _, _), n in res.counts.items() if op is Op.STG) == 4  # every warp, half its lanes


def _predicated_opcodes() -> set[str]:
    return {re.match(r"\s*@!?%p\d+\s+([a-z][a-z0-9]*)", line)[1] for body, _, _ in CASES.values()
            for line in body.splitlines() if re.match(r"\s*@", line)}


def test_every_opcode_the_engine_dispatches_and_every_register_family_has_a_predicated_case():
    """The opcode table (fa_sim.ptx.optable): every machine and control opcode, and one opcode of
    every register-only family, appear under a guard."""
    covered = _predicated_opcodes()
    machine = {op for op, row in OPCODES.items() if row.unit is Unit.MACHINE}
    engine = machine | (set(CONTROL) - {"brx"})  # brx (indirect branches) is refused
    assert engine <= covered, sorted(engine - covered)
    lanes = {f for op, row in OPCODES.items() if row.unit is Unit.LANES for f in row.families}
    assert lanes == {f for op in covered if op in OPCODES and OPCODES[op].unit is Unit.LANES
                     for f in OPCODES[op].families}
