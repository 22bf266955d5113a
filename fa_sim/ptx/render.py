"""Instructions back as PTX text, and one-line descriptions for traces and error messages.

`render(parse(...)...)` reproduces each statement as NVRTC wrote it up to whitespace (the tests
check every instruction of every fa2_fwd build); integers come back in decimal and hex floats in
upper case, whatever spelling the input used.
"""

from __future__ import annotations

import os

from .debuginfo import short_name
from .ir import Instruction, ParamList, SourceLoc
from .operands import render_operand


def render(ins: Instruction) -> str:
    """'@!%p3 bra $L__BB0_4;', 'mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {...}, ...;'."""
    guard = ""
    if ins.guard is not None:
        guard = f"@{'!' if ins.guard.negate else ''}{ins.guard.reg.name} "
    ops = ins.operands
    if ins.opcode == "call":  # the normalized empty return / argument lists were not written
        ops = tuple(op for op in ops if not (isinstance(op, ParamList) and not op.items))
    text = ", ".join(render_operand(op) for op in ops)
    return f"{guard}{ins.mnemonic}{' ' + text if text else ''};"


def source(loc: SourceLoc | None) -> str:
    """'fa2_fwd.cu:86 in fa::cp_async_cg16, inlined at fa2_fwd.cu:227 < fa2_fwd.cu:453'."""
    if loc is None:
        return "no source line"
    out = f"{os.path.basename(loc.file)}:{loc.line}"
    if loc.function:
        out += f" in {short_name(loc.function)}"
    if loc.inlined_at:
        out += ", inlined at " + " < ".join(f"{os.path.basename(f)}:{ln}" for f, ln, _ in loc.inlined_at)
    return out


def describe(ins: Instruction) -> str:
    """One line for traces and errors: 'PTX line 129 pc 50 (fa2_fwd.cu:86 in ...): cp.async...;'."""
    return f"PTX line {ins.ptx_line} pc {ins.pc} ({source(ins.loc)}): {render(ins)}"
