"""The PTX engine's compiled stretches (fa_sim/ptx/blocks.py): where a stretch stops, which
mma.sync form a batched run, and that a batched run gives the bits and counts of single
instructions (an observer of instruction events makes the engine run them one at a time)."""

import numpy as np
import pytest
from ptx_snippets import STAGE_2KB  # tests/ptx_snippets.py

from fa_sim import isa
from fa_sim.errors import KernelFault
from fa_sim.events import Op
from fa_sim.ptx import blocks, chains, launch, parse
from fa_sim.ptx.ops import Unsupported
from fa_sim.ptx.program import build_program

MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"

# One warp: A (4 words), three B fragments (2 words each) and three C fragments (4 floats each)
# per lane from global memory; mma 1 and 2 share A and are independent, mma 3 reads mma 1's D as
# its C; every D is stored.
PTX = f"""
.version 7.8
.target sm_80
.address_size 64

.visible .entry mmas(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd)
{{
    .reg .b32 %r<12>;
    .reg .f32 %f<13>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u64 %rd4, [pd];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd5, %r0, 16;
    add.s64 %rd6, %rd1, %rd5;
    ld.global.v4.b32 {{%r1, %r2, %r3, %r4}}, [%rd6];
    mul.wide.u32 %rd7, %r0, 24;
    add.s64 %rd8, %rd2, %rd7;
    ld.global.v2.b32 {{%r5, %r6}}, [%rd8];
    ld.global.v2.b32 {{%r7, %r8}}, [%rd8+8];
    ld.global.v2.b32 {{%r9, %r10}}, [%rd8+16];
    mul.wide.u32 %rd9, %r0, 48;
    add.s64 %rd10, %rd3, %rd9;
    ld.global.v4.f32 {{%f1, %f2, %f3, %f4}}, [%rd10];
    ld.global.v4.f32 {{%f5, %f6, %f7, %f8}}, [%rd10+16];
    ld.global.v4.f32 {{%f9, %f10, %f11, %f12}}, [%rd10+32];
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r1, %r2, %r3, %r4}}, {{%r5, %r6}}, {{%f1, %f2, %f3, %f4}};
    {MMA} {{%f5, %f6, %f7, %f8}}, {{%r1, %r2, %r3, %r4}}, {{%r7, %r8}}, {{%f5, %f6, %f7, %f8}};
    {MMA} {{%f9, %f10, %f11, %f12}}, {{%r1, %r2, %r3, %r4}}, {{%r9, %r10}}, {{%f1, %f2, %f3, %f4}};
    add.s64 %rd11, %rd4, %rd9;
    st.global.v4.f32 [%rd11], {{%f1, %f2, %f3, %f4}};
    st.global.v4.f32 [%rd11+16], {{%f5, %f6, %f7, %f8}};
    st.global.v4.f32 [%rd11+32], {{%f9, %f10, %f11, %f12}};
    ret;
}}
"""


def operands(seed: int = 0):
    rng = np.random.default_rng(seed)
    halves = lambda n: rng.standard_normal(32 * n).astype(np.float16).view(np.uint32)  # noqa: E731
    return halves(8), halves(12), rng.standard_normal(32 * 12).astype(np.float32)


def reference(a, b, c) -> np.ndarray:
    """The three MMAs one instruction at a time (fa_sim.isa), [32 lanes, 12] f32."""
    a, b, c = a.reshape(32, 4), b.reshape(32, 3, 2), c.reshape(32, 3, 4)
    d1 = isa.mma_m16n8k16(a, b[:, 0], c[:, 0])
    d2 = isa.mma_m16n8k16(a, b[:, 1], c[:, 1])
    d3 = isa.mma_m16n8k16(a, b[:, 2], d1)
    return np.concatenate([d1, d2, d3], axis=1)


class Watcher:
    """An observer of instruction events: the engine then runs every instruction by itself."""

    def __init__(self):
        self.hmma = 0

    def on_instr(self, ev):
        self.hmma += ev.op is Op.HMMA


def run(observers=()):
    a, b, c = operands()
    out = np.zeros(32 * 12, np.float32)
    res = launch(PTX, grid=(1,), block=(32,), args=[a, b, c, out], observers=observers)
    return out.reshape(32, 12), res


def test_batched_mma_gives_the_bits_and_counts_of_single_instructions(monkeypatch):
    calls = []
    batch = blocks.mma_batch
    monkeypatch.setattr(blocks, "mma_batch", lambda eng, group, r: calls.append(len(r.inss)) or batch(eng, group, r))
    batched, res = run()
    assert calls == [2]  # mma 1 and 2 in one machine call, mma 3 alone
    watcher = Watcher()
    single, res_single = run([watcher])
    assert calls == [2]  # observed: no batch
    np.testing.assert_array_equal(batched.view(np.uint32), reference(*operands()).view(np.uint32))
    np.testing.assert_array_equal(single.view(np.uint32), batched.view(np.uint32))
    assert watcher.hmma == 3  # one event per mma, as single instructions
    assert res.counts == res_single.counts and res.instructions[Op.HMMA] == 3


def program():
    return build_program(parse(PTX))


def test_a_stretch_runs_to_the_next_control_instruction():
    prog = program()
    code = prog.kernel.instructions
    ret = next(i.pc for i in code if i.opcode == "ret")
    assert blocks.stops(prog.kernel)[:ret + 1] == (ret,) * (ret + 1)


def test_a_run_holds_independent_mmas_sharing_a_and_stops_at_a_dependence(monkeypatch):
    monkeypatch.setattr(blocks, "MAX_MMA_RUN", 64)
    prog = program()
    mmas = [i.pc for i in prog.kernel.instructions if i.opcode == "mma"]
    steps = blocks.Compiled(prog.kernel, prog.instrs).steps(mmas[0], mmas[-1] + 1)
    assert [type(s) for s in steps] == [blocks.MmaRun, blocks.One]
    assert [i.pc for i in steps[0].inss] == mmas[:2] and steps[0].instr.repeat == 2
    assert steps[1].ins.pc == mmas[2]  # it reads the first one's D


@pytest.mark.parametrize("length", [1, 2, 3])
def test_runs_are_at_most_max_mma_run_long(monkeypatch, length):
    monkeypatch.setattr(blocks, "MAX_MMA_RUN", length)
    prog = program()
    mmas = [i.pc for i in prog.kernel.instructions if i.opcode == "mma"]
    steps = blocks.Compiled(prog.kernel, prog.instrs).steps(mmas[0], mmas[1] + 1)
    assert [len(getattr(s, "inss", (s,))) for s in steps] == ([1, 1] if length == 1 else [2])


# One warp stores 2 KB into shared memory, then loads two ldmatrix.x4 (one batched run) and
# stores the registers.
LDSM = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
LDSM_PTX = f"""
.version 7.8
.target sm_80
.address_size 64

.visible .entry ldsm(.param .u64 psrc, .param .u64 pout)
{{
    .reg .b32 %r<24>;
    .reg .b64 %rd<8>;
    .shared .align 16 .b8 buf[2048];
    ld.param.u64 %rd1, [psrc];
    ld.param.u64 %rd2, [pout];
    mov.u32 %r0, %tid.x;
{STAGE_2KB}
    shl.b32 %r8, %r0, 4;
    add.s32 %r9, %r1, %r8;
    add.s32 %r10, %r9, 512;
    {LDSM} {{%r11, %r12, %r13, %r14}}, [%r9];
    {LDSM} {{%r15, %r16, %r17, %r18}}, [%r10];
    mul.wide.u32 %rd5, %r0, 32;
    add.s64 %rd6, %rd2, %rd5;
    st.global.v4.b32 [%rd6], {{%r11, %r12, %r13, %r14}};
    st.global.v4.b32 [%rd6+16], {{%r15, %r16, %r17, %r18}};
    ret;
}}
"""


def ldsm_reference(src: np.ndarray) -> np.ndarray:
    """ldmatrix.x4 by its definition: lane t's register i is the 32-bit word t % 4 of row t // 4
    of matrix i, whose row address lane 8i + t // 4 supplies (row l at byte 16 l, plus 512)."""
    words = src.view(np.uint32)
    t = np.arange(32)[:, None]
    out = []
    for base in (0, 512):
        row = 8 * np.arange(4)[None, :] + t // 4
        out.append(words[(base + 16 * row + 4 * (t % 4)) // 4])
    return np.concatenate(out, axis=1)  # [32, 8]


def run_ldsm(observers=()):
    src = np.random.default_rng(1).integers(0, 2**32, 512, dtype=np.uint32)
    out = np.zeros(32 * 8, np.uint32)
    res = launch(LDSM_PTX, grid=(1,), block=(32,), args=[src, out], observers=observers)
    return src, out.reshape(32, 8), res


def test_batched_ldmatrix_gives_the_registers_and_counts_of_single_instructions(monkeypatch):
    calls = []
    batch = blocks.ldmatrix_batch
    monkeypatch.setattr(blocks, "ldmatrix_batch",
                        lambda eng, group, r: calls.append(len(r.inss)) or batch(eng, group, r))
    src, batched, res = run_ldsm()
    assert calls == [2]
    _, single, res_single = run_ldsm([Watcher()])
    assert calls == [2]  # observed: no batch
    np.testing.assert_array_equal(batched, ldsm_reference(src))
    np.testing.assert_array_equal(single, batched)
    assert res.counts == res_single.counts and res.instructions[Op.LDSM] == 2


def test_an_ldmatrix_whose_address_an_earlier_one_loads_is_not_in_its_run():
    ptx = LDSM_PTX.replace("[%r10];", "[%r12];")  # the second address comes from the first's registers
    prog = build_program(parse(ptx))
    loads = [i.pc for i in prog.kernel.instructions if i.opcode == "ldmatrix"]
    steps = blocks.Compiled(prog.kernel, prog.instrs).steps(loads[0], loads[1] + 1)
    assert [type(s) for s in steps] == [blocks.One, blocks.One]
    steps = build_program(parse(LDSM_PTX)).compiled.steps(loads[0], loads[1] + 1)
    assert [type(s) for s in steps] == [blocks.LdsmRun]


# GEMM chains (fa_sim/ptx/chains.py): one warp, five mma.sync accumulating into %f1..%f4 with the
# same A and five B fragments; INSERT goes right after the first mma.
CHAIN_PTX = f"""
.version 7.8
.target sm_80
.address_size 64

.visible .entry chain(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd)
{{
    .reg .b32 %r<24>;
    .reg .f32 %f<24>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u64 %rd4, [pd];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd5, %r0, 16;
    add.s64 %rd6, %rd1, %rd5;
    ld.global.v4.b32 {{%r1, %r2, %r3, %r4}}, [%rd6];
    mul.wide.u32 %rd7, %r0, 40;
    add.s64 %rd8, %rd2, %rd7;
    ld.global.v2.b32 {{%r5, %r6}}, [%rd8];
    ld.global.v2.b32 {{%r7, %r8}}, [%rd8+8];
    ld.global.v2.b32 {{%r9, %r10}}, [%rd8+16];
    ld.global.v2.b32 {{%r11, %r12}}, [%rd8+24];
    ld.global.v2.b32 {{%r13, %r14}}, [%rd8+32];
    add.s64 %rd10, %rd3, %rd5;
    ld.global.v4.f32 {{%f1, %f2, %f3, %f4}}, [%rd10];
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r1, %r2, %r3, %r4}}, {{%r5, %r6}}, {{%f1, %f2, %f3, %f4}};
    INSERT
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r1, %r2, %r3, %r4}}, {{%r7, %r8}}, {{%f1, %f2, %f3, %f4}};
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r1, %r2, %r3, %r4}}, {{%r9, %r10}}, {{%f1, %f2, %f3, %f4}};
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r1, %r2, %r3, %r4}}, {{%r11, %r12}}, {{%f1, %f2, %f3, %f4}};
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r1, %r2, %r3, %r4}}, {{%r13, %r14}}, {{%f1, %f2, %f3, %f4}};
    mul.wide.u32 %rd9, %r0, 32;
    add.s64 %rd11, %rd4, %rd9;
    st.global.v4.f32 [%rd11], {{%f1, %f2, %f3, %f4}};
    st.global.v4.f32 [%rd11+16], {{%f20, %f21, %f22, %f23}};
    ret;
}}
"""

# (instruction after the first mma, whether the five mmas form one chain): a write of a register
# the first mma reads, or a read of its D, must stay after it - the chain then starts at mma 2.
INSERTS = {
    "mov.b32 %r20, %r1;": True,  # registers no mma names
    "mov.b32 %r5, %r1;": False,  # overwrites the first mma's B
    "add.f32 %f20, %f1, %f2;": False,  # reads the first mma's D
    "mov.f32 %f4, 0f00000000;": False,  # overwrites the accumulator
    # an mma of another chain that overwrites the first mma's B (its D and C: %r5, %r6, %r15, %r16)
    f"{MMA} {{%r5, %r6, %r15, %r16}}, {{%r1, %r2, %r3, %r4}}, {{%r7, %r8}}, {{%r5, %r6, %r15, %r16}};": False,
}


def chain_operands(seed: int = 3):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(32 * 8).astype(np.float16).view(np.uint32)
    b = rng.standard_normal(32 * 20).astype(np.float16).view(np.uint32)
    return a, b, rng.standard_normal(32 * 4).astype(np.float32)


def chain_reference(insert: str) -> np.ndarray:
    """The five mmas and the inserted instruction one at a time (fa_sim.isa), [32, 8] f32 (an
    inserted mma changes no stored value)."""
    a, b, c = chain_operands()
    a, b, d = a.reshape(32, 4), b.reshape(32, 5, 2).copy(), c.reshape(32, 4)
    extra = np.zeros((32, 4), np.float32)
    for i in range(5):
        d = isa.mma_m16n8k16(a, b[:, i], d)
        if i == 0 and insert.startswith("mov.b32 %r5"):
            b[:, 0, 0] = a[:, 0]
        elif i == 0 and insert.startswith("add.f32"):
            extra[:, 0] = d[:, 0] + d[:, 1]
        elif i == 0 and insert.startswith("mov.f32"):
            d = d.copy()
            d[:, 3] = 0
    return np.concatenate([d, extra], axis=1)


@pytest.mark.parametrize("insert", list(INSERTS))
def test_a_chain_is_one_gemm_only_where_the_registers_allow_the_reorder(insert):
    ptx = CHAIN_PTX.replace("INSERT", insert)
    prog = build_program(parse(ptx))
    code = prog.kernel.instructions
    mmas = [i.pc for i in code if i.opcode == "mma"]
    steps = prog.compiled.steps(0, prog.compiled.stop[0])
    gemms = [s for s in steps if isinstance(s, chains.Gemm)]
    assert len(gemms) == 1
    assert [i.pc for i in gemms[0].mmas] == (mmas if INSERTS[insert] else mmas[1:])
    outs = []
    for observers in ((), [Watcher()]):
        out = np.zeros(32 * 8, np.float32)
        res = launch(ptx, grid=(1,), block=(32,), args=[*chain_operands(), out], observers=observers)
        outs.append((out.reshape(32, 8), res))
    (chained, res), (single, res_single) = outs
    np.testing.assert_array_equal(chained.view(np.uint32), chain_reference(insert).view(np.uint32))
    np.testing.assert_array_equal(single.view(np.uint32), chained.view(np.uint32))
    assert res.counts == res_single.counts and res.instructions[Op.HMMA] == len(mmas)


def test_no_chain_across_a_store_or_a_guarded_instruction():
    for insert in ("st.global.f32 [%rd4], %f20;", "setp.eq.s32 %p1, %r0, 0;\n@%p1 mov.b32 %r20, %r1;"):
        ptx = CHAIN_PTX.replace("INSERT", insert).replace(".reg .b64 %rd<12>;", ".reg .b64 %rd<12>;\n.reg .pred %p<2>;")
        prog = build_program(parse(ptx))
        steps = prog.compiled.steps(0, prog.compiled.stop[0])
        gemms = [s for s in steps if isinstance(s, chains.Gemm)]
        assert [len(g.mmas) for g in gemms] == [4]  # mma 2 .. 5 only


CHAIN_CASES = [  # (config fields, causal, seqlen, tensor-core model)
    ({"head_dim": 64}, False, 192, "exact"),
    ({"head_dim": 32}, True, 160, "exact"),
    ({"head_dim": 128}, False, 100, "exact"),
    ({"block_m": 128, "head_dim": 64}, True, 200, "exact"),  # MI = 2 rows of A per warp
    ({"head_dim": 64}, True, 136, "h200"),
    ({"block_m": 128, "head_dim": 32}, False, 96, "h200"),
    ({"q_in_regs": True}, True, 150, "exact"),  # A of QK^T from registers loaded in round 0
    ({"kv_stages": 2, "defer_pv": True}, False, 200, "exact"),  # PV beside the next round's softmax
]


@pytest.mark.parametrize("fields, causal, seqlen, model", CHAIN_CASES)
def test_attention_chains_give_the_bits_and_counts_of_single_instructions(monkeypatch, fields, causal, seqlen, model):
    import fa_sim
    from fa_sim.config import KernelConfig
    grids = []
    run_grid = chains.Grid.run
    def spy(self, eng, loads):
        grids.append((self.mi, self.a_fed is not None, self.b_fed is not None, self.a_packs is not None))
        return run_grid(self, eng, loads)
    monkeypatch.setattr(chains.Grid, "run", spy)
    rng = np.random.default_rng(seqlen)
    cfg = KernelConfig(**fields)
    q, k, v = (rng.standard_normal((1, 2, seqlen, cfg.head_dim)).astype(np.float16) for _ in range(3))
    chained = fa_sim.simulate(q, k, v, causal, config=cfg, engine="ptx", mma_model=model)
    assert grids and all(b for _, _, b, _ in grids)  # B (K, V) from shared memory
    assert any(a for _, a, _, _ in grids) != cfg.q_in_regs  # QK^T's A too, unless Q stays in registers
    # PV's A (P~) from the f32 registers its cvt packs, unless the pack is the round before (defer_pv)
    assert any(p for _, _, _, p in grids) != cfg.defer_pv
    assert {mi for mi, _, _, _ in grids} == {cfg.block_m // 16 // cfg.n_warps}
    grids.clear()
    single = fa_sim.simulate(q, k, v, causal, config=cfg, engine="ptx", mma_model=model, observers=[Watcher()])
    assert not grids  # observed: one instruction at a time
    np.testing.assert_array_equal(chained.o.view(np.uint16), single.o.view(np.uint16))
    np.testing.assert_array_equal(chained.lse.view(np.uint32), single.lse.view(np.uint32))
    assert chained.counts == single.counts


# A GEMM whose operands ldmatrix loads for its mmas alone (fed from shared memory): one warp,
# two k16 steps of two n8 columns; the last B load's offset is a parameter (1536: in bounds).
FED_PTX = f"""
.version 7.8
.target sm_80
.address_size 64

.visible .entry fed(.param .u64 psrc, .param .u64 pout, .param .u32 poff)
{{
    .reg .b32 %r<32>;
    .reg .f32 %f<9>;
    .reg .b64 %rd<8>;
    .shared .align 16 .b8 buf[2048];
    ld.param.u64 %rd1, [psrc];
    ld.param.u64 %rd2, [pout];
    ld.param.u32 %r30, [poff];
    mov.u32 %r0, %tid.x;
{STAGE_2KB}
    shl.b32 %r8, %r0, 4;
    add.s32 %r9, %r1, %r8;
    add.s32 %r10, %r9, 512;
    add.s32 %r11, %r9, 1024;
    add.s32 %r12, %r9, %r30;
    mov.f32 %f1, 0f00000000;
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
    {LDSM}.trans {{%r25, %r26, %r27, %r28}}, [%r12];
    {MMA} {{%f1, %f2, %f3, %f4}}, {{%r21, %r22, %r23, %r24}}, {{%r25, %r26}}, {{%f1, %f2, %f3, %f4}};
    {MMA} {{%f5, %f6, %f7, %f8}}, {{%r21, %r22, %r23, %r24}}, {{%r27, %r28}}, {{%f5, %f6, %f7, %f8}};
    mul.wide.u32 %rd5, %r0, 32;
    add.s64 %rd6, %rd2, %rd5;
    st.global.v4.f32 [%rd6], {{%f1, %f2, %f3, %f4}};
    st.global.v4.f32 [%rd6+16], {{%f5, %f6, %f7, %f8}};
    ret;
}}
""".replace(f"{LDSM}.trans", LDSM.replace(".shared", ".trans.shared"))


def run_fed(offset: int, observers=()):
    src = np.random.default_rng(5).standard_normal(1024).astype(np.float16).view(np.uint32)
    out = np.zeros(32 * 8, np.float32)
    res = launch(FED_PTX, grid=(1,), block=(32,), args=[src, out, np.uint32(offset)], observers=observers)
    return out.reshape(32, 8), res


def test_fed_operands_give_the_bits_counts_and_faults_of_single_instructions(monkeypatch):
    fed = []
    matrices = chains.fed_matrices
    monkeypatch.setattr(chains, "fed_matrices", lambda *a: fed.append(a[4]) or matrices(*a))
    chained, res = run_fed(1536)
    assert sorted(fed) == [False, True]  # A and B from shared memory
    single, res_single = run_fed(1536, [Watcher()])
    np.testing.assert_array_equal(chained.view(np.uint32), single.view(np.uint32))
    assert res.counts == res_single.counts and res.instructions[Op.LDSM] == 4
    errors = []
    for observers in ((), [Watcher()]):
        with pytest.raises(KernelFault) as info:
            run_fed(4096, observers)
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "ldmatrix" in errors[0] and "outside" in errors[0]


# FED_PTX with the address math between the fed loads, a write of the first load's address
# register after it (the loads before it then issue first), and RAISE before the mmas of the
# second step: nothing, or a read of %clock (not provided: the engine raises).
FED_LANES_PTX = FED_PTX.replace("""    add.s32 %r10, %r9, 512;
    add.s32 %r11, %r9, 1024;
    add.s32 %r12, %r9, %r30;
""", "").replace(f"""    {LDSM} {{%r13, %r14, %r15, %r16}}, [%r9];
    {LDSM} {{%r17, %r18, %r19, %r20}}, [%r10];
""", f"""    {LDSM} {{%r13, %r14, %r15, %r16}}, [%r9];
    add.s32 %r10, %r9, 512;
    {LDSM} {{%r17, %r18, %r19, %r20}}, [%r10];
    add.s32 %r11, %r9, 1024;
    add.s32 %r12, %r9, %r30;
    add.s32 %r9, %r9, 0;
""").replace(f"""    {LDSM} {{%r21, %r22, %r23, %r24}}, [%r11];
""", f"""    {LDSM} {{%r21, %r22, %r23, %r24}}, [%r11];
    mov.u32 %r29, %r11;
""").replace(f"""{{%r25, %r26, %r27, %r28}}, [%r12];
""", """{%r25, %r26, %r27, %r28}, [%r12];
    RAISE
""")


@pytest.mark.parametrize("offset, raise_", [(1536, ""), (4096, ""), (4096, "mov.u32 %r31, %clock;"),
                                            (1536, "mov.u32 %r31, %clock;")],
                         ids=["in-bounds", "fault", "fault-before-raise", "raise"])
def test_fed_loads_wait_for_the_lane_math_between_them(monkeypatch, offset, raise_):
    """Fed ldmatrix of one form issue together after the lane math between them (or before an
    instruction that writes an address they read): the bits, counts and first error of single
    instructions - a load's fault before a lane instruction's error."""
    issued = []
    load = chains.load
    monkeypatch.setattr(chains, "load", lambda eng, group, inss, instr: issued.append(len(inss)) or
                        load(eng, group, inss, instr))
    ptx = FED_LANES_PTX.replace("RAISE", raise_)
    def run(observers=()):
        src = np.random.default_rng(5).standard_normal(1024).astype(np.float16).view(np.uint32)
        out = np.zeros(32 * 8, np.float32)
        res = launch(ptx, grid=(1,), block=(32,), args=[src, out, np.uint32(offset)], observers=observers)
        return out, res
    if offset == 1536 and not raise_:
        chained, res = run()
        assert issued == [2, 1, 1]  # the first two together; the write of %r9 issues them before it
        single, res_single = run([Watcher()])
        np.testing.assert_array_equal(chained.view(np.uint32), single.view(np.uint32))
        assert res.counts == res_single.counts and res.instructions[Op.LDSM] == 4
        return
    errors = []
    for observers in ((), [Watcher()]):
        with pytest.raises((KernelFault, Unsupported)) as info:
            run(observers)
        errors.append(f"{type(info.value).__name__}: {info.value}")
    assert errors[0] == errors[1]
    assert ("ldmatrix" in errors[0] and "outside" in errors[0]) if offset == 4096 else "clock" in errors[0]
