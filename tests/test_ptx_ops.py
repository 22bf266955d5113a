"""fa_sim.ptx.ops: the arithmetic, logic, compare/select, move, convert and MUFU handlers, run
through FakeLanes (fa_sim/calibrate/lanes.py); and every such form in the PTX NVRTC emits for
fa2_fwd.cu has a handler."""

import functools
import re

import numpy as np
import pytest

from fa_sim.calibrate.lanes import FakeLanes, ins
from fa_sim.isa import floating, fp32, sfu
from fa_sim.isa.rounding import Rnd
from fa_sim.ptx.ops import Unsupported
from fa_sim.ptx.optable import OPCODES, Unit, compile_form, execute_lanes

N = 64


def run(lanes, text):
    i = ins(text)
    execute_lanes(lanes, i)


def lanes_with(**regs):
    """FakeLanes(N) with registers given as name=(values, ptype)."""
    lanes = FakeLanes(N)
    for name, (values, ptype) in regs.items():
        lanes.set(f"%{name}", values, ptype)
    return lanes


RNG = np.random.default_rng(3)
A = RNG.standard_normal(N).astype(np.float32) * 8
B = RNG.standard_normal(N).astype(np.float32)
C = RNG.standard_normal(N).astype(np.float32)


def test_f32_forms_call_the_exact_semantics():
    lanes = lanes_with(f1=(A, "f32"), f2=(B, "f32"), f3=(C, "f32"))
    run(lanes, "fma.rn.f32 %f4, %f1, %f2, %f3;")
    assert np.array_equal(lanes.get("%f4", "f32"), fp32.fma_rn(A, B, C))
    run(lanes, "add.rz.ftz.sat.f32 %f5, %f1, %f2;")
    assert np.array_equal(lanes.get("%f5", "f32"), floating.add(A, B, Rnd.RZ, ftz=True, sat=True))
    run(lanes, "mul.rn.f32 %f6, %f1, 0f3FB8AA3B;")  # hex immediate: log2(e)
    assert np.array_equal(lanes.get("%f6", "f32"), A * fp32.LOG2E)
    run(lanes, "max.f32 %f7, %f1, %f2;")
    assert np.array_equal(lanes.get("%f7", "f32"), np.maximum(A, B))
    run(lanes, "rcp.rn.f32 %f8, %f1;")
    assert np.array_equal(lanes.get("%f8", "f32"), (1 / A.astype(np.float64)).astype(np.float32))
    run(lanes, "ex2.approx.ftz.f32 %f9, %f1;")
    assert np.array_equal(lanes.get("%f9", "f32"), fp32.ex2_approx_ftz(A))
    run(lanes, "neg.f32 %f10, %f1;")
    assert np.array_equal(lanes.get("%f10", "f32"), -A)
    run(lanes, "div.approx.f32 %f11, %f1, %f2;")
    assert np.array_equal(lanes.get("%f11", "f32"), sfu.div_approx(A, B))


def test_f64_forms():
    a, b = A.astype(np.float64) / 3, B.astype(np.float64)
    lanes = lanes_with(fd1=(a, "f64"), fd2=(b, "f64"))
    run(lanes, "fma.rn.f64 %fd3, %fd1, %fd2, %fd1;")
    assert np.array_equal(lanes.get("%fd3", "f64"), floating.fma(a, b, a))
    run(lanes, "div.rz.f64 %fd4, %fd1, %fd2;")
    assert np.array_equal(lanes.get("%fd4", "f64"), floating.div(a, b, Rnd.RZ))
    run(lanes, "rsqrt.approx.ftz.f64 %fd5, %fd2;")
    assert np.array_equal(lanes.get("%fd5", "f64"), sfu.rsqrt_approx_ftz_f64(b), equal_nan=True)


def test_integer_forms_and_widths():
    x = RNG.integers(-2 ** 31, 2 ** 31, N).astype(np.int32)
    y = RNG.integers(-2 ** 31, 2 ** 31, N).astype(np.int32)
    lanes = lanes_with(r1=(x, "s32"), r2=(y, "s32"))
    run(lanes, "mul.wide.s32 %rd1, %r1, %r2;")
    assert lanes.get("%rd1", "s64").tolist() == [int(p) * int(q) for p, q in zip(x, y)]
    run(lanes, "mad.lo.s32 %r3, %r1, %r2, 7;")
    assert np.array_equal(lanes.get("%r3", "s32"), x * y + 7)
    run(lanes, "mul.hi.u32 %r4, %r1, -1431655765;")
    assert lanes.get("%r4", "u32").tolist() == [(int(v) * 0xAAAAAAAB) >> 32 for v in x.view(np.uint32)]
    run(lanes, "shl.b32 %r5, %r1, 40;")  # clamped to 32: zero
    assert not lanes.get("%r5", "b32").any()
    run(lanes, "shr.s32 %r6, %r1, 40;")
    assert np.array_equal(lanes.get("%r6", "s32"), x >> 31)
    run(lanes, "bfi.b32 %r7, %r1, %r2, 4, 28;")
    mask = np.uint32(0xFFFFFFF0)
    assert np.array_equal(lanes.get("%r7", "b32"), (y.view(np.uint32) & ~mask) | ((x.view(np.uint32) << np.uint32(4)) & mask))
    run(lanes, "lop3.b32 %r8, %r1, %r2, %r1, 0x96;")  # a ^ b ^ c
    assert np.array_equal(lanes.get("%r8", "b32"), y.view(np.uint32))
    run(lanes, "div.s32 %r9, %r1, 0;")
    assert (lanes.get("%r9", "s32") == -1).all()
    run(lanes, "popc.b32 %r10, %r1;")
    assert lanes.get("%r10", "u32").tolist() == [bin(int(v)).count("1") for v in x.view(np.uint32)]


def test_setp_combinations_and_destinations():
    # #comparison-and-selection-instructions-setp: p = BoolOp(t, c), q = BoolOp(!t, c).
    x = np.arange(N, dtype=np.int32) - N // 2
    c = (np.arange(N) % 3) == 0
    lanes = lanes_with(r1=(x, "s32"), p9=(c, "pred"))
    run(lanes, "setp.lt.s32 %p1, %r1, 0;")
    assert np.array_equal(lanes.get("%p1", "pred"), x < 0)
    run(lanes, "setp.ge.and.s32 %p2|%p3, %r1, 4, !%p9;")
    assert np.array_equal(lanes.get("%p2", "pred"), (x >= 4) & ~c)
    assert np.array_equal(lanes.get("%p3", "pred"), (x < 4) & ~c)
    run(lanes, "setp.lt.u32 %p4, %r1, 2139095040;")  # unsigned view of a signed register
    assert np.array_equal(lanes.get("%p4", "pred"), x.view(np.uint32) < 2139095040)
    run(lanes, "setp.eq.xor.s32 %p5|_, %r1, 0, %p9;")
    assert np.array_equal(lanes.get("%p5", "pred"), (x == 0) ^ c)


def test_setp_float_nan_rules_and_x2_halves():
    f = np.array([1.0, np.nan, 0.0, -0.0] * (N // 4), np.float32)
    lanes = lanes_with(f1=(f, "f32"))
    run(lanes, "setp.equ.f32 %p1, %f1, 0f00000000;")
    assert np.array_equal(lanes.get("%p1", "pred"), np.isnan(f) | (f == 0))
    run(lanes, "setp.ne.f32 %p2, %f1, 0f3F800000;")
    assert np.array_equal(lanes.get("%p2", "pred"), ~np.isnan(f) & (f != 1))
    # #half-precision-comparison-instructions-setp: p from the low halves, q from the high ones.
    h = np.array([0x3C00_4000, 0x4000_3C00] * (N // 2), np.uint32)  # (hi, lo) = (1, 2), (2, 1)
    lanes = lanes_with(r1=(h, "b32"))
    run(lanes, "setp.gt.f16x2 %p1|%p2, %r1, 0x3E003E00;")  # vs (1.5, 1.5)
    assert lanes.get("%p1", "pred")[:2].tolist() == [True, False]
    assert lanes.get("%p2", "pred")[:2].tolist() == [False, True]


def test_set_selp_slct_copy_bits():
    nan_bits = np.full(N, 0x7FC00123, np.uint32)  # a NaN with a payload: selp copies it unchanged
    c = np.arange(N) % 2 == 0
    lanes = lanes_with(r1=(nan_bits, "b32"), p1=(c, "pred"), f2=(np.full(N, -0.0, np.float32), "f32"))
    run(lanes, "selp.f32 %f1, %r1, 0f3F800000, %p1;")
    got = lanes.get("%f1", "b32")
    assert (got[c] == 0x7FC00123).all() and (got[~c] == 0x3F800000).all()
    run(lanes, "slct.b32.f32 %r2, 5, 6, %f2;")  # c = -0 >= 0
    assert (lanes.get("%r2", "b32") == 5).all()
    run(lanes, "set.lt.u32.s32 %r3, %r1, 0;")  # 0x7fc00123 as s32 is positive
    assert (lanes.get("%r3", "u32") == 0).all()
    run(lanes, "set.eq.or.f32.s32 %r4, %r1, 0, %p1;")
    assert np.array_equal(lanes.get("%r4", "f32"), np.where(c, 1.0, 0.0).astype(np.float32))


def test_select_is_where_bit_for_bit():
    from fa_sim.isa.compare import select
    m = RNG.integers(0, 2, N).astype(bool)
    for a, b in ((A, B), (A.astype(np.float64), B.astype(np.float64)), (np.arange(N, dtype=np.int16), -np.arange(N, dtype=np.int16))):
        assert np.array_equal(select(m, a, b).view(np.uint8), np.where(m, a, b).view(np.uint8))


def test_logic_on_predicates_and_bits():
    p, q = np.arange(N) % 2 == 0, np.arange(N) % 3 == 0
    lanes = lanes_with(p1=(p, "pred"), p2=(q, "pred"), r1=(np.arange(N, dtype=np.uint32), "b32"))
    run(lanes, "and.pred %p3, %p1, %p2;")
    run(lanes, "or.pred %p4, %p1, %p2;")
    run(lanes, "not.pred %p5, %p1;")
    run(lanes, "xor.b32 %r2, %r1, 255;")
    assert np.array_equal(lanes.get("%p3", "pred"), p & q) and np.array_equal(lanes.get("%p4", "pred"), p | q)
    assert np.array_equal(lanes.get("%p5", "pred"), ~p)
    assert np.array_equal(lanes.get("%r2", "b32"), np.arange(N, dtype=np.uint32) ^ 255)


def test_mov_pack_unpack_special_registers_and_symbols():
    # #data-movement-and-conversion-instructions-mov: element 0 is the least significant.
    lanes = FakeLanes(N, symbols={"_ZN2fa4smemE": 0x1000})
    lanes.set("%r1", 0x11112222, "b32")
    lanes.set("%r2", 0x33334444, "b32")
    run(lanes, "mov.b64 %rd1, {%r1, %r2};")
    assert (lanes.get("%rd1", "b64") == 0x3333444411112222).all()
    run(lanes, "mov.b64 {%r3, _}, %rd1;")
    assert (lanes.get("%r3", "b32") == 0x11112222).all()
    run(lanes, "mov.b32 {%rs1, %rs2}, %r1;")
    assert (lanes.get("%rs1", "b16") == 0x2222).all() and (lanes.get("%rs2", "b16") == 0x1111).all()
    run(lanes, "mov.u32 %r4, %tid.x;")
    assert np.array_equal(lanes.get("%r4", "u32"), np.arange(N, dtype=np.uint32))
    run(lanes, "mov.u64 %rd2, _ZN2fa4smemE;")
    assert (lanes.get("%rd2", "u64") == 0x1000).all()
    run(lanes, "mov.f32 %f1, 0f34000000;")
    assert (lanes.get("%f1", "f32") == 2.0 ** -23).all()
    run(lanes, "mov.b32 %f2, %r1;")
    assert (lanes.get("%f2", "b32") == 0x11112222).all()


def test_cvt_forms():
    lanes = lanes_with(f1=(A, "f32"), f2=(B, "f32"), r1=(np.arange(N, dtype=np.int32) - 3, "s32"))
    # #data-movement-and-conversion-instructions-cvt: a goes to the upper half.
    run(lanes, "cvt.rn.f16x2.f32 %r2, %f1, %f2;")
    got = lanes.get("%r2", "b32")
    assert np.array_equal(got >> np.uint32(16), A.astype(np.float16).view(np.uint16))
    assert np.array_equal(got & np.uint32(0xFFFF), B.astype(np.float16).view(np.uint16))
    run(lanes, "cvt.rn.f32.s32 %f3, %r1;")
    assert np.array_equal(lanes.get("%f3", "f32"), (np.arange(N) - 3).astype(np.float32))
    run(lanes, "cvt.s64.s32 %rd1, %r1;")
    assert np.array_equal(lanes.get("%rd1", "s64"), np.arange(N) - 3)
    run(lanes, "cvt.u32.u64 %r3, %rd1;")
    assert np.array_equal(lanes.get("%r3", "s32"), np.arange(N) - 3)
    run(lanes, "cvt.rzi.s32.f32 %r4, %f1;")
    assert np.array_equal(lanes.get("%r4", "s32"), np.trunc(A).astype(np.int32))
    run(lanes, "cvt.u8.u32 %rs1, %r1;")  # 8-bit result, zero-extended into the 16-bit register
    assert np.array_equal(lanes.get("%rs1", "u16"), ((np.arange(N) - 3) & 0xFF).astype(np.uint16))
    run(lanes, "cvt.s8.s32 %rs2, %r1;")  # sign-extended
    assert lanes.get("%rs2", "s16")[0] == -3
    run(lanes, "cvt.rn.f16.f32 %rs3, %f1;")
    assert np.array_equal(lanes.get("%rs3", "f16"), A.astype(np.float16))
    run(lanes, "cvt.f32.f16 %f4, %rs3;")
    assert np.array_equal(lanes.get("%f4", "f32"), A.astype(np.float16).astype(np.float32))
    run(lanes, "cvt.rn.bf16x2.f32 %r5, %f1, %f2;")
    hi = lanes.get("%r5", "b32") >> np.uint32(16)
    assert np.array_equal((hi << np.uint32(16)).view(np.float32), _bf16_rn(A))


def _bf16_rn(x):
    b = x.view(np.uint32).astype(np.uint64)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16  # round to nearest even on the bits (finite inputs)
    return (r.astype(np.uint32) << np.uint32(16)).view(np.float32)


def test_half_x2_forms_run_both_halves():
    h = np.array([0x3C00_4000] * N, np.uint32)  # (hi, lo) = (1, 2)
    lanes = lanes_with(r1=(h, "b32"))
    run(lanes, "fma.rn.f16x2 %r2, %r1, %r1, %r1;")  # x*x + x: (2, 6)
    assert (lanes.get("%r2", "b32") == ((0x4000 << 16) | 0x4600)).all()
    run(lanes, "ex2.approx.f16x2 %r3, %r1;")  # (2, 4)
    assert (lanes.get("%r3", "b32") == ((0x4000 << 16) | 0x4400)).all()
    run(lanes, "neg.bf16x2 %r4, %r1;")
    assert (lanes.get("%r4", "b32") == (0xBC00C000)).all()


UNSUPPORTED = [
    ("add.cc.u32 %r1, %r2, %r3;", "add.cc.u32"),
    ("addc.u32 %r1, %r2, %r3;", "addc.u32"),
    ("fma.f32 %f1, %f2, %f3, %f4;", "rounding modifier"),
    ("div.f32 %f1, %f2, %f3;", "rounding modifier"),
    ("add.f32x2 %rd1, %rd2, %rd3;", "add.f32x2"),
    ("cvt.rs.f16x2.f32 %r1, %f1, %f2, %r2;", ".rs"),
    ("cvt.rn.satfinite.e4m3x2.f32 %rs1, %f1, %f2;", "e4m3x2"),
    ("mov.b128 %rd1, %rd2;", "b128"),
    ("sin.f32 %f1, %f2;", ".approx"),
    ("setp.lo.f32 %p1, %f1, %f2;", "lo"),
    ("mul.wide.s64 %rd1, %rd2, %rd3;", ".wide"),
    ("lop3.or.b32 %r1|%p1, %r2, %r3, %r4, 0x80, %p2;", "lop3.or.b32"),
]


@pytest.mark.parametrize("text,needle", UNSUPPORTED)
def test_unknown_forms_are_named_errors(text, needle):
    lanes = FakeLanes(N, seed=0)
    with pytest.raises(Unsupported) as err:
        run(lanes, text)
    assert needle in str(err.value) and ins(text).mnemonic in str(err.value)


def test_operand_count_is_checked():
    with pytest.raises(Unsupported, match="expects 3 operands"):
        run(FakeLanes(N, seed=0), "add.s32 %r1, %r2;")


# --- every arithmetic-family form of the real kernel has a handler ----------------------------------

ENGINE_OPCODES = {"ld", "st", "cp", "ldmatrix", "mma", "shfl", "bar", "bra", "ret", "exit", "call", "cvta",
                  "membar", "fence", "atom", "red", "ldu", "prefetch", "vote", "activemask", "barrier"}
INSTRUCTION = re.compile(r"^\s*(@!?%\w+\s+)?([a-z][\w.]*)(\s+[^;]*)?;", re.M)


@functools.cache
def fa2_ptx(causal: bool, checkpoints: bool, config_index: int) -> str:
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    from fa_sim.contract import SEED_PATH, KernelBuild
    from fa_sim.config import KernelConfig

    config = KernelConfig.family()[config_index]
    macros = KernelBuild(config, causal, "sm_80", checkpoints).macros()
    opts = [b"-arch=compute_80", b"-std=c++17"] + [f"-D{k}={v}".encode() for k, v in macros.items()]
    err, prog = nvrtc.nvrtcCreateProgram(SEED_PATH.read_bytes(), b"fa2_fwd.cu", 0, [], [])
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"NVRTC failed on {config.describe()}"
    err, size = nvrtc.nvrtcGetPTXSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetPTX(prog, buf)
    return buf.decode().rstrip("\x00")


BUILDS = [(False, False, 0), (True, False, 0), (True, True, 0), (False, True, 5), (True, False, -1)]


@pytest.mark.parametrize("causal,checkpoints,config_index", BUILDS)
def test_every_alu_form_of_fa2_fwd_has_a_handler_and_runs(causal, checkpoints, config_index):
    text = fa2_ptx(causal, checkpoints, config_index)
    forms = {}
    for m in INSTRUCTION.finditer(text):
        mnemonic, ops = m.group(2), (m.group(3) or "").strip()
        if mnemonic.split(".")[0] not in ENGINE_OPCODES:
            forms.setdefault(mnemonic, f"{mnemonic} {ops};")
    assert {"fma.rn.f32", "ex2.approx.ftz.f32", "cvt.rn.f16x2.f32", "setp.lt.s32", "selp.f32"} <= set(forms)
    lanes = FakeLanes(N, seed=1, symbols={})
    for mnemonic, line in sorted(forms.items()):
        i = ins(line)
        assert i.opcode in OPCODES and OPCODES[i.opcode].unit is Unit.LANES, f"no handler for {mnemonic}"
        compile_form(i.opcode, i.mods)  # raises Unsupported naming the form
        for op in i.operands:  # symbols (mov.u64 %rd, smem) read as some address
            if type(op).__name__ == "Sym":
                lanes.symbols[op.name] = 0x400
        execute_lanes(lanes, i)
        assert lanes.writes and lanes.writes[-1][0].startswith("%"), mnemonic


def test_the_gpu_probe_compiles_and_every_form_runs_here():
    """fa_sim/calibrate/alu_probe.py: its kernels are valid PTX for the H200 (sm_90) and each of its
    forms runs through the handlers (the GPU comparison itself is tests/test_alu_gpu.py)."""
    core = pytest.importorskip("cuda.core")
    from fa_sim.calibrate import alu_probe

    prog = core.Program(alu_probe.kernel_source(), code_type="c++",
                        options=core.ProgramOptions(arch="sm_90", std="c++17"))
    assert len(prog.compile("cubin").code) > 0
    for k, form in enumerate(alu_probe.FORMS):
        assert alu_probe.run_on_simulator(k).shape == (alu_probe.N,), form.ptx
