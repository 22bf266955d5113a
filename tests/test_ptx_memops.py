"""The PTX engine's shared-memory addresses and GEMM accumulators (fa_sim/ptx/shared_lanes.py,
chain_operands.py, chain_regs.py): addresses that differ between CTAs and addresses every CTA
shares give the same bytes and bits, and a chain zeroed by movs reads no C - each against the
engine running the same instructions one at a time (an observer of instruction events) or
against numpy."""

import numpy as np
import pytest
from ptx_snippets import STAGE_2KB  # tests/ptx_snippets.py

from fa_sim.machine import Machine
from fa_sim.ptx import chains, launch

MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
LDSM = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"


class Watcher:
    """An observer of instruction events: the engine then runs every instruction by itself."""

    def on_instr(self, ev):
        pass


# cp.async of two 16-byte chunks per thread into shared memory, then every chunk back out: the
# destination of thread t is chunk t ^ ctaid (per_cta) or t (the same for every CTA).
COPY = r"""
extern "C" __global__ void copy(const int4* g, int4* o, int per_cta) {
  __shared__ int4 s[256];
  int t = threadIdx.x, b = blockIdx.x;
  int slot = per_cta ? (t ^ b) : t;
  for (int i = 0; i < 2; ++i) {
    unsigned d = (unsigned)__cvta_generic_to_shared(s + slot + 128 * i);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(g + b * 256 + t + 128 * i));
  }
  asm volatile("cp.async.commit_group;");
  asm volatile("cp.async.wait_group 0;");
  __syncthreads();
  o[b * 256 + t] = s[t];
  o[b * 256 + 128 + t] = s[128 + t];
}
"""


@pytest.mark.parametrize("per_cta", [False, True])
def test_cp_async_lands_per_cta_and_shared_destinations(monkeypatch, per_cta):
    pytest.importorskip("cuda.bindings.nvrtc", reason="CUDA source compiles with NVRTC (the hw extra)")
    forms = []
    issue = Machine.cp_async
    monkeypatch.setattr(Machine, "cp_async", lambda m, instr, dst, *a: forms.append(dst.per_cta) or
                        issue(m, instr, dst, *a))
    g = np.random.default_rng(1).integers(-1 << 30, 1 << 30, (4 * 256, 4), dtype=np.int32)
    chunk = np.arange(256)
    lane, half = chunk % 128, chunk // 128
    want = np.concatenate([g[b * 256 + 128 * half + (lane ^ b if per_cta else lane)] for b in range(4)])
    for observers in ((), [Watcher()]):
        out = np.zeros_like(g)
        launch(COPY, grid=(4,), block=(128,), args=[g, out, np.int32(per_cta)], observers=observers)
        np.testing.assert_array_equal(out, want)
    assert forms and set(forms) == {per_cta}  # shared destinations: one CTA's SmemLanes


# A GEMM whose operands ldmatrix loads for its mmas alone (fed from shared memory), per CTA: each
# CTA copies its own 2 KB into shared memory; its row addresses are lane ^ XOR (XOR: ctaid, or 0);
# the accumulators start from ACC (0f00000000: +0 - C is not read - or 0f80000000: -0).
FED = f"""
.version 7.8
.target sm_80
.address_size 64

.visible .entry fed(.param .u64 psrc, .param .u64 pout)
{{
    .reg .b32 %r<40>;
    .reg .f32 %f<9>;
    .reg .b64 %rd<12>;
    .shared .align 16 .b8 buf[2048];
    ld.param.u64 %rd1, [psrc];
    ld.param.u64 %rd2, [pout];
    mov.u32 %r0, %tid.x;
    mov.u32 %r31, %ctaid.x;
    mul.wide.u32 %rd7, %r31, 2048;
    add.s64 %rd1, %rd1, %rd7;
    mul.wide.u32 %rd8, %r31, 1024;
    add.s64 %rd2, %rd2, %rd8;
{STAGE_2KB}
    XOR
    xor.b32 %r32, %r0, %r33;
    shl.b32 %r8, %r32, 4;
    add.s32 %r9, %r1, %r8;
    add.s32 %r10, %r9, 512;
    add.s32 %r11, %r9, 1024;
    add.s32 %r12, %r9, 1536;
    mov.f32 %f1, ACC;
    mov.f32 %f2, %f1;
    mov.f32 %f3, %f1;
    mov.f32 %f4, %f1;
    mov.f32 %f5, %f1;
    mov.f32 %f6, %f1;
    mov.f32 %f7, %f1;
    mov.f32 %f8, %f1;
    {LDSM} {{%r13, %r14, %r15, %r16}}, [%r9];
    {LDSM} {{%r17, %r18, %r19, %r20}}, [%r10];
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r13, %r14, %r15, %r16}}, {{%r17, %r18}}, {{%f1, %f2, %f3, %f4}};
    {MMA} {{%f5, %f6, %f7, %f8}}, {{%r13, %r14, %r15, %r16}}, {{%r19, %r20}}, {{%f5, %f6, %f7, %f8}};
    {LDSM} {{%r21, %r22, %r23, %r24}}, [%r11];
    {LDSM} {{%r25, %r26, %r27, %r28}}, [%r12];
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r21, %r22, %r23, %r24}}, {{%r25, %r26}}, {{%f1, %f2, %f3, %f4}};
    {MMA} {{%f5, %f6, %f7, %f8}}, {{%r21, %r22, %r23, %r24}}, {{%r27, %r28}}, {{%f5, %f6, %f7, %f8}};
    mul.wide.u32 %rd5, %r0, 32;
    add.s64 %rd6, %rd2, %rd5;
    st.global.v4.f32 [%rd6], {{%f1, %f2, %f3, %f4}};
    st.global.v4.f32 [%rd6+16], {{%f5, %f6, %f7, %f8}};
    ret;
}}
"""
XORS = {"ctaid": "mov.u32 %r33, %r31;", "none": "mov.u32 %r33, 0;", "one": "mov.u32 %r33, 1;"}
ACCS = {"+0": "0f00000000", "-0": "0f80000000"}


SRC = np.random.default_rng(7).standard_normal(2 * 1024).astype(np.float16).view(np.uint32)  # 2 KB per CTA


def run_fed(xor: str, acc: str, observers=(), ctas: int = 2, src=SRC):
    ptx = FED.replace("XOR", XORS[xor]).replace("ACC", ACCS[acc])
    out = np.zeros(ctas * 32 * 8, np.float32)
    res = launch(ptx, grid=(ctas,), block=(32,), args=[src, out], observers=observers)
    return out, res


@pytest.mark.parametrize("xor", ["ctaid", "none"])
@pytest.mark.parametrize("acc", sorted(ACCS))
def test_fed_operands_per_cta_and_zeroed_accumulators_give_the_bits_of_single_instructions(monkeypatch, xor, acc):
    seen = []
    run_grid, matrices = chains.Grid.run, chains.fed_matrices
    monkeypatch.setattr(chains.Grid, "run", lambda g, eng, loads: seen.append(("c_zero", g.c_zero)) or
                        run_grid(g, eng, loads))
    monkeypatch.setattr(chains, "fed_matrices", lambda eng, loads, *a: seen.append(
        ("per_cta", {lanes.per_cta for lanes, _ in loads})) or matrices(eng, loads, *a))
    chained, res = run_fed(xor, acc)
    assert ("c_zero", acc == "+0") in seen and ("per_cta", {xor == "ctaid"}) in seen
    assert ("per_cta", {xor != "ctaid"}) not in seen
    seen.clear()
    single, res_single = run_fed(xor, acc, [Watcher()])
    assert not seen  # observed: one instruction at a time
    np.testing.assert_array_equal(chained.view(np.uint32), single.view(np.uint32))
    assert res.counts == res_single.counts
    xors = ("none", "none" if xor == "none" else "one")  # each CTA's rows by itself
    alone = [run_fed(x, acc, ctas=1, src=SRC[512 * b:])[0] for b, x in enumerate(xors)]
    np.testing.assert_array_equal(chained.view(np.uint32), np.concatenate(alone).view(np.uint32))  # CTA by CTA


# One ldmatrix.x4 per iteration at the same pc, its row addresses moving by 8 rows each time: the
# engine must see that the address register changed (shared_lanes.operand_lanes).
WALK = r"""
extern "C" __global__ void walk(const int4* g, unsigned* o) {
  __shared__ int4 s[64];
  int t = threadIdx.x;
  s[t] = g[t];
  s[t + 32] = g[t + 32];
  __syncthreads();
#pragma unroll 1
  for (int i = 0; i < 4; ++i) {
    unsigned a = (unsigned)__cvta_generic_to_shared(s + ((t + 8 * i) & 63));
    unsigned r0, r1, r2, r3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
    unsigned* p = o + (i * 32 + t) * 4;
    p[0] = r0; p[1] = r1; p[2] = r2; p[3] = r3;
  }
}
"""


def test_an_ldmatrix_whose_address_register_moves_loads_from_the_new_rows():
    pytest.importorskip("cuda.bindings.nvrtc", reason="CUDA source compiles with NVRTC (the hw extra)")
    g = np.random.default_rng(3).integers(0, 1 << 32, (64, 4), dtype=np.uint32)
    lane, m, it = np.arange(32)[None, :, None], np.arange(4)[None, None, :], np.arange(4)[:, None, None]
    want = g[(8 * m + lane // 4 + 8 * it) % 64, lane % 4]  # [iteration, lane, register]: ldmatrix's rows
    for observers in ((), [Watcher()]):
        out = np.zeros((4, 32, 4), np.uint32)
        launch(WALK, grid=(2,), block=(32,), args=[g.view(np.int32), out], observers=observers)  # both CTAs alike
        np.testing.assert_array_equal(out, want)


# Two cp.async per thread (a copy run, fa_sim/ptx/copies.py): into chunks t and 128 + t, or - with
# `overlap` - into chunks t and t + 1 (mod 128), so that chunk t is written by thread t's first copy
# and then by thread t - 1's second: program order lands every first copy before any second one.
COPY_RUN = r"""
extern "C" __global__ void copy_run(const int4* g, int4* o, int overlap) {
  __shared__ int4 s[256];
  int t = threadIdx.x, b = blockIdx.x;
  for (int i = 0; i < 2; ++i) {
    int slot = ((t + i * overlap) & 127) + 128 * i * (1 - overlap);  // no branch: one stretch
    unsigned d = (unsigned)__cvta_generic_to_shared(s + slot);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(g + b * 256 + t + 128 * i));
  }
  asm volatile("cp.async.commit_group;");
  asm volatile("cp.async.wait_group 0;");
  __syncthreads();
  o[b * 128 + t] = s[t];
}
"""


@pytest.mark.parametrize("overlap", [False, True])
def test_a_copy_run_is_one_machine_call_unless_its_destinations_overlap(monkeypatch, overlap):
    pytest.importorskip("cuda.bindings.nvrtc", reason="CUDA source compiles with NVRTC (the hw extra)")
    repeats = []
    issue = Machine.cp_async
    monkeypatch.setattr(Machine, "cp_async", lambda m, instr, dst, *a: repeats.append(dst.repeat) or
                        issue(m, instr, dst, *a))
    g = np.random.default_rng(2).integers(-1 << 30, 1 << 30, (4 * 256, 4), dtype=np.int32)
    t = np.arange(128)
    want = np.concatenate([g[b * 256 + (128 + (t - 1) % 128 if overlap else t)] for b in range(4)])
    for observers in ((), [Watcher()]):
        repeats.clear()
        out = np.zeros((4 * 128, 4), np.int32)
        res = launch(COPY_RUN, grid=(4,), block=(128,), args=[g, out, np.int32(overlap)], observers=observers)
        np.testing.assert_array_equal(out, want)
        assert repeats == ([1, 1] if overlap or observers else [2])  # one call of R = 2, or the single ones
        counts = res.counts
        if observers:
            assert counts == unobserved
        unobserved = counts


# The main loop (bar.sync: the busy one) reads shared memory at %r1, written before the loop; with
# REENTER, threads leave the loop, move %r1 and jump back into it.
LOOP = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry loop(.param .u32 pn)
{
    .reg .pred %p<3>;
    .reg .b32 %r<8>;
    .shared .align 16 .b8 buf[256];
    ld.param.u32 %r5, [pn];
    mov.u32 %r1, buf;
    mov.u32 %r2, 0;
LOOP:
    bar.sync 0;
    ld.shared.b32 %r3, [%r1];
INSIDE:
    add.s32 %r2, %r2, 1;
    setp.lt.s32 %p1, %r2, %r5;
    @%p1 bra LOOP;
    add.s32 %r1, %r1, 16;
    setp.lt.s32 %p2, %r2, 8;
    @%p2 bra EXIT;
EXIT:
    ret;
}
"""


@pytest.mark.parametrize("reenter", [False, True])
def test_registers_the_main_loop_writes(reenter):
    from fa_sim.ptx import parse
    from fa_sim.ptx.program import build_program
    from fa_sim.ptx.shared_lanes import loop_written
    prog = build_program(parse(LOOP.replace("bra EXIT;", "bra INSIDE;") if reenter else LOOP))
    written = loop_written(prog.kernel, prog.loop)
    if reenter:  # control that left the loop comes back: no register is known to keep its bits
        assert written is None
    else:  # %r1, the address, is written before the loop only
        assert written == {"%r2", "%r3", "%p1"}
