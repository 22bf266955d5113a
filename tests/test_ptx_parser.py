"""fa_sim.ptx.parser on hand-written PTX (every directive and form the grammar names) and on the
PTX NVRTC emits for an ordinary user kernel (a .func call, printf, a by-value struct, local and
constant arrays, inline assembly with a scoped register block)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from fa_sim.ptx.debuginfo import short_name
from fa_sim.ptx.ir import Addr, Guard, Imm, ParamList, PredPair, Reg, Sink, SourceLoc, Sym, Vec
from fa_sim.ptx.parser import ParseError, parse
from fa_sim.ptx.render import describe, render

HEAD = ".version 9.0\n.target sm_80\n.address_size 64\n"


def kernel(body: str, params: str = ".param .u64 k_param_0", decls: str = "") -> str:
    """A module with one kernel `k`; without decls and with one-line params, the body's first
    line is PTX line 10."""
    return (HEAD + decls + f".visible .entry k({params})\n.maxntid 128, 1, 1\n{{\n"
            ".reg .pred %p<9>;\n.reg .b32 %r<20>; .reg .f32 %f<9>;\n.reg .b64 %rd<9>;\n"
            + body.lstrip("\n") + "\n}\n")


def test_directives_params_and_variables():
    decls = (".global .align 4 .u32 gCount = 7;\n.const .align 4 .f32 kT[4] = {1.0, 0f40200000, -3};\n"
             ".extern .shared .align 128 .b8 smem[];\n.global .align 1 .b8 msg[] = {104, 105, 0};\n"
             ".shared .align 16 .v4 .u32 quad[2];\n.global .u16 grid[2][3] = {{1}, {4, 5}};\n"
             ".global .v2 .u8 pairs[] = {{1, 2}, {3}};\n")
    params = (".param .u64 k_param_0,\n.param .u8 k_param_1,\n.param .align 8 .b8 k_param_2[12],\n"
              ".param .u64 .ptr .global .align 16 k_param_3,\n.param .f32 k_param_4")
    m = parse(kernel("ret;", params, decls).replace(".maxntid 128, 1, 1\n", ".reqntid 64\n.minnctapersm 2\n.maxnreg 96\n"))
    assert (m.version, m.target, m.address_size) == ("9.0", "sm_80", 64)
    k = m.kernel("k")
    assert [(p.name, p.type, p.size, p.align, p.offset) for p in k.params] == [
        ("k_param_0", "u64", 8, 8, 0), ("k_param_1", "u8", 1, 1, 8), ("k_param_2", "b8", 12, 8, 16),
        ("k_param_3", "u64", 8, 8, 32), ("k_param_4", "f32", 4, 4, 40)]  # the CUDA ABI: natural alignment
    assert k.param_bytes == 44
    assert (k.reqntid, k.minnctapersm, k.maxnreg, k.maxntid, k.linkage, k.entry) == ((64,), 2, 96, None, "visible", True)
    v = {x.name: x for x in m.variables}
    assert v["gCount"].init == (7).to_bytes(4, "little") and v["gCount"].space == "global"
    assert v["kT"].init == struct.pack("<4f", 1.0, 2.5, -3.0, 0.0) and v["kT"].size == 16
    assert (v["smem"].size, v["smem"].align, v["smem"].extern, v["smem"].init) == (0, 128, True, None)
    assert v["msg"].init == b"hi\0" and v["msg"].size == 3
    assert (v["quad"].size, v["quad"].type) == (32, "u32")
    assert v["grid"].init == struct.pack("<6H", 1, 0, 0, 4, 5, 0)  # a sub-list fills one row
    assert v["pairs"].init == bytes([1, 2, 3, 0]) and v["pairs"].size == 4
    assert k.reg_type("%r19") == "b32" and k.reg_type("%r20") is None and k.reg_type("%p0") == "pred"


def test_instructions_guards_and_operands():
    body = """
    mov.u32 %r1, %tid.x;
    @%p1 bra $L__BB0_2;
    @!%p2 add.s32 %r2, %r1, -4;
    setp.lt.and.s32 %p3|%p4, %r1, 0x10, !%p1;
$L__BB0_2:
    shfl.sync.bfly.b32 %r3|%p5, %r2, 2, 31, -1;
    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f1, %f2, %f3, %f4};
    ld.shared.v4.b32 {%r7, %r8, _, %r9}, [%r10+-16];
    cp.async.cg.shared.global [%r11], [%rd1+16], 16, %r12;
    mov.f32 %f5, 0fFF800000;
    ex2.approx.ftz.f32 %f6, %f5;
    bar.sync 0;
    ret;"""
    k = parse(kernel(body)).kernel()
    ins = {i.opcode + ("." + i.mods[0] if i.mods else ""): i for i in k.instructions}
    assert ins["mov.u32"].operands == (Reg("%r1"), Reg("%tid.x")) and ins["mov.u32"].ptx_line == 10
    assert ins["bra"].guard == Guard(Reg("%p1")) and ins["bra"].operands == (Sym("$L__BB0_2"),)
    assert ins["add.s32"].guard == Guard(Reg("%p2"), negate=True) and ins["add.s32"].operands[2] == Imm(-4)
    assert ins["setp.lt"].operands == (PredPair(Reg("%p3"), Reg("%p4")), Reg("%r1"), Imm(16), Reg("%p1", negate=True))
    assert k.labels == {"$L__BB0_2": 4} and k.instructions[4].opcode == "shfl"
    mma = ins["mma.sync"]
    assert mma.mods == ("sync", "aligned", "m16n8k16", "row", "col", "f32", "f16", "f16", "f32")
    assert [len(op.items) for op in mma.operands] == [4, 4, 2, 4]
    assert ins["ld.shared"].operands == (Vec((Reg("%r7"), Reg("%r8"), Sink(), Reg("%r9"))), Addr(Reg("%r10"), -16))
    assert ins["cp.async"].mods == ("async", "cg", "shared", "global")
    assert ins["mov.f32"].operands[1] == Imm(float("-inf"), 0xFF800000, 32)
    assert ins["bar.sync"].operands == (Imm(0),) and ins["ret"].operands == ()
    assert ins["add.s32"].text == "add.s32 %r2, %r1, -4;"
    assert render(ins["add.s32"]) == "@!%p2 add.s32 %r2, %r1, -4;"
    assert render(ins["setp.lt"]) == "setp.lt.and.s32 %p3|%p4, %r1, 16, !%p1;"


def test_locations_inlining_chain_and_debug_str():
    name = b"_ZN2fa8quad_maxEf"
    body = """
    .loc 1 10 3
    mov.u32 %r1, %tid.x;
    .loc 1 131 3, function_name $L__info_string0, inlined_at 1 10 3
    .loc 2 7 1, function_name $L__info_string1, inlined_at 1 131 3
    shl.b32 %r2, %r1, 1;
    .loc 2 8 1, function_name $L__info_string1+2, inlined_at 1 131 3
    shl.b32 %r3, %r1, 2;
    .loc 1 0 3
    ret;"""
    text = kernel(body) + ('.file 1 "/src/fa2_fwd.cu"\n.file 2 "/src/helpers.cuh", 1700000000, 2048\n'
                           ".section .debug_str\n{\n$L__info_string0:\n.b8 " + ",".join(map(str, name)) +
                           ",0\n$L__info_string1:\n.b8 104,101\n.b8 108,112,0\n}\n"
                           ".section .debug_abbrev\n{\n.b8 1,17,1\n.b32 .debug_info\n}\n")
    k = parse(text).kernel()
    mov, shl, shl2, ret = k.instructions
    assert mov.loc == SourceLoc("/src/fa2_fwd.cu", 10, 3, "k", ())
    assert shl.loc == SourceLoc("/src/helpers.cuh", 7, 1, "help", (("/src/fa2_fwd.cu", 131, 3), ("/src/fa2_fwd.cu", 10, 3)))
    assert shl2.loc.function == "lp"  # label+offset: a string inside the block
    assert ret.loc.line == 0 and ret.loc.function == "k"
    assert "helpers.cuh:7 in help, inlined at fa2_fwd.cu:131 < fa2_fwd.cu:10" in describe(shl)
    assert short_name(name.decode()) == "fa::quad_max"


def test_comments_keep_line_numbers_and_strings():
    body = "/* a block\n comment */ mov.u32 %r1, 1; // trailing\n  // a line /* not a block\n  mov.u32 %r2, 2;"
    text = kernel(body).replace(".maxntid 128, 1, 1", '.pragma "nounroll"; // x')
    k = parse(text + '.file 1 "/a//b/*c*/.cu"\n').kernel()
    assert [i.ptx_line for i in k.instructions] == [11, 13] and k.pragmas == ("nounroll",)


def test_nested_scopes_named_registers_and_call_sequences():
    body = """
    { .reg .b16 lo, hi;
      mov.b32 {lo, hi}, %r1;
      cvt.u32.u16 %r2, lo; }
    { // callseq 0, 0
    .reg .b32 temp_param_reg;
    .param .b32 param0;
    st.param.b32 [param0+0], %r2;
    .param .b32 retval0;
    call.uni (retval0),
    f,
    (
    param0
    );
    ld.param.b32 %r3, [retval0+0];
    }
    { .param .b64 param0;
      call.uni g, (param0);
      call.uni g;
    }
    ret;"""
    decls = (".extern .func g(.param .b64 g_param_0);\n"
             ".func (.param .b32 func_retval0) f(.param .b32 f_param_0)\n{\n.reg .b32 %r<2>;\n"
             "ld.param.b32 %r1, [f_param_0];\nst.param.b32 [func_retval0+0], %r1;\nret;\n}\n")
    m = parse(kernel(body, decls=decls))
    k = m.kernel()
    assert k.named_regs == {"lo": "b16", "hi": "b16", "temp_param_reg": "b32"}
    assert k.instructions[0].operands == (Vec((Reg("lo"), Reg("hi"))), Reg("%r1"))
    calls = [i for i in k.instructions if i.opcode == "call"]
    assert calls[0].operands == (ParamList((Sym("retval0"),)), Sym("f"), ParamList((Sym("param0"),)))
    assert calls[0].ptx_line == 26 and render(calls[0]) == "call.uni (retval0), f, (param0);"
    assert calls[1].operands == (ParamList(()), Sym("g"), ParamList((Sym("param0"),)))
    assert calls[2].operands == (ParamList(()), Sym("g"), ParamList(()))
    assert render(calls[1]) == "call.uni g, (param0);" and render(calls[2]) == "call.uni g;"
    assert {v.name: (v.space, v.size) for v in k.variables} == {"param0": ("param", 8), "retval0": ("param", 4)}
    f, g = m.functions["f"], m.functions["g"]
    assert (f.entry, [p.name for p in f.returns], len(f.instructions)) == (False, ["func_retval0"], 3)
    assert (g.linkage, g.instructions, g.params[0].type) == ("extern", (), "b64")


ERRORS = [
    ("mov.u32 %r1, %r99;", 10, "not declared"),
    ("mov.u32 %r1 %r2;", 10, "not a register"),
    ("ld.global.u32 %r1, [%rd1*4];", 10, "address"),
    ("bra $L__nowhere;", 10, "not a label, parameter, variable or function"),
    ("mov.u32 %r1, 1;\nmov.u64 %rd1, no_such_var;", 11, "not a label, parameter, variable or function"),
    ("mov.u32 %r1, 1;\n.foo .b32 x;", 11, "unknown directive"),
    ("mov.u32 %r1, 0f3F80;", 10, "not a register, immediate"),
    ("$L1:\nmov.u32 %r1, 1;\n$L1:\nret;", 12, "defined twice"),
    ("mov.u32 %r1, 1", 10, "without its terminating ';'"),
    ("/* open comment\nmov.u32 %r1, 1;", 10, "unterminated /\\* comment"),
    (".reg .b64 %r<4>;", 10, "declared again with another type"),
    (".loc 7 1 1\nret;", 10, "no .file"),
    (".loc 1 1 1, function_name $L__info_string9, inlined_at 1 1 1\nret;", 10, "not in .debug_str"),
    (".loc 1 1 1, function_name $L__info_string9 + 4, inlined_at 1 1 1\nret;", 10, "not in .debug_str"),
    ("@%r99 bra $L1;", 10, "not declared"),
    ("@%r1 bra $L1;\n$L1:\nret;", 10, "not a .pred register"),
    ("ld.shared.v2.b32 {%r1, [%rd1]}, [%rd2];", 10, "vector"),
]


@pytest.mark.parametrize("body, line, reason", ERRORS, ids=[e[2] for e in ERRORS])
def test_errors_name_the_ptx_line_and_text(body, line, reason):
    text = kernel(body) + '.file 1 "a.cu"\n'
    with pytest.raises(ParseError, match=reason) as err:
        parse(text)
    assert err.value.line == line, str(err.value)
    assert str(err.value).startswith(f"PTX line {line}: ")
    statement = text.split("\n")[line - 1].split("//")[0].strip().rstrip(";")
    assert statement[:20].replace("/* ", "") in " ".join(str(err.value).split())


@pytest.mark.parametrize("text, reason", [
    (HEAD + ".visible .entry k(.param .u64 a)\n.explicitcluster\n{\nret;\n}\n", "cluster directive"),
    (HEAD + ".visible .entry k(.param .u64 a)\n{\nret;\n", "not closed"),
    (".target sm_80\n.address_size 64\n", "no .version"),
    (HEAD + ".global .u32 x = generic(y);\n", "address initializers"),
    (HEAD + ".global .u8 x[2] = {1, 2, 3};\n", "3 initial values for 2 elements"),
    (HEAD + ".global .u8 x[2][2] = {{1, 2, 3}};\n", "3 initial values for 2 elements"),
    (HEAD + ".global .u8 x[2] = {1, {2}};\n", "mixes values and sub-lists"),
    (HEAD + ".visible .entry k(.reg .u64 a)\n{\nret;\n}\n", "only .param"),
    (HEAD + ".visible .entry k()\n.maxntid 1, 2, 3, 4\n{\nret;\n}\n", "malformed directive .maxntid"),
    (HEAD + "mov.u32 %r1, 1;\n", "unknown directive"),
    (HEAD + ".func f()\n;\n.func f()\n{\nret;\n}\n.func f()\n{\nret;\n}\n", "defined twice"),
])
def test_module_level_errors(text, reason):
    with pytest.raises(ParseError, match=reason):
        parse(text)


def test_parse_rejects_bytes():
    with pytest.raises(ValueError, match="must be text"):
        parse(b".version 9.0")


USER_CU = Path(__file__).parent / "data" / "ptx_user_kernel.cu"


@pytest.mark.parametrize("options", [(), ("-use_fast_math",), ("-G",)], ids=["default", "fast-math", "debug-G"])
def test_user_kernel_from_nvrtc(options, tmp_path, monkeypatch):
    """-G adds forward .func declarations, DWARF sections and many labels: all read or skipped."""
    pytest.importorskip("cuda.bindings")
    from fa_sim.contract.nvrtc import compile_ptx

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path))
    ptx = compile_ptx(USER_CU.read_text(), name=str(USER_CU), options=options)
    m = parse(ptx)
    k = m.kernel("user_kernel")
    lines = ptx.split("\n")
    for ins in k.instructions:  # every instruction renders back to its statement in the text
        stmt = "".join(ln.split("//")[0] for ln in lines[ins.ptx_line - 1:ins.ptx_line + 12]).split(";")[0]
        if ins.guard is None:
            stmt = re.sub(r"^\s*\{", "", stmt)  # an inline-asm scope opened on the same line
        assert re.sub(r"\s", "", render(ins)) == re.sub(r"\s", "", stmt) + ";"
        assert ins.loc.file == str(USER_CU) and ins.loc.function == "user_kernel"
        assert ins.loc.line == 0 or 5 <= ins.loc.line <= 19  # the kernel's lines in the .cu
    assert [p.size for p in k.params] == [8, 8, 16, 4] and [p.offset for p in k.params] == [0, 8, 16, 32]
    assert {"%SP", "lo", "hi"} <= set(k.named_regs)
    ops = {i.opcode for fn in (k, *m.functions.values()) for i in fn.instructions}
    assert {"call", "atom", "bar", "st", "ld", "cvta"} <= ops  # -G: atom inside __iAtomicAdd
    assert m.functions["vprintf"].linkage == "extern" and m.functions["vprintf"].instructions == ()
    twice = m.functions["_Z5twicefi"]
    assert short_name(twice.name) == "twice" and twice.returns[0].name == "func_retval0"
    var = {v.name: v for v in m.variables}
    assert struct.unpack("<4f", var["kTable"].init) == (1.0, 2.5, -3.0, 0.125)
    assert var["gCounter"].init == (7).to_bytes(4, "little") and var["$str"].init.startswith(b"n=%d")


def test_the_seed_kernel_parses():
    """The ~3,300-line seed PTX parses into one kernel. (How long that takes is a benchmark's
    business, not a test's: experiments/bench_sim.py reports the parse time; a timing assertion
    failed here under load.)"""
    pytest.importorskip("cuda.bindings")
    from fa_sim.contract import KernelBuild
    from fa_sim.config import KernelConfig
    from fa_sim.contract.nvrtc import kernel_ptx

    ptx = kernel_ptx(KernelBuild(KernelConfig(), causal=True, arch="sm_80"))
    assert 3000 < ptx.count("\n") < 3600
    module = parse(ptx)
    assert list(module.kernels) == ["fa2_fwd_kernel"]
    assert len(module.kernels["fa2_fwd_kernel"].instructions) > 1000
