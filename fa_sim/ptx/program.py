"""A parsed kernel made ready to run: each instruction's SASS class, phase label and source text,
the main loop, and the layout of its shared variables.

Phases come from the CUDA source when it is available: a comment line `// phase: NAME` in the
kernel's body starts a section, and an instruction belongs to the section of the kernel-body line
it comes from (for code inlined from a helper, the line of the outermost call). fa2_fwd.cu marks
Q load, K load, V load, QK, mask, softmax, PV and epilogue this way, the phases of the hand-written
program. Without markers (or without the source) the phase is the inlined function the
instruction comes from, or the kernel's name. The label is the CUDA source line itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from ..machine import Instr
from .blocks import Compiled, Loop, main_loop
from .inline import inline_calls
from .debuginfo import short_name
from .optable import sass_class
from .ir import Instruction, Kernel, Module

PHASE_MARK = re.compile(r"^\s*//\s*phase:\s*(?P<name>\S.*?)\s*$")


@dataclass(frozen=True, eq=False)
class Program:
    """One kernel of a module, with everything static the engine needs."""

    module: Module
    kernel: Kernel
    instrs: tuple[Instr, ...]
    loop: Loop | None
    static_smem: dict  # shared variable -> byte offset in the CTA's window
    static_smem_bytes: int  # bytes of the static shared variables (extern arrays start there)
    local_vars: dict  # .local variable -> byte offset in each thread's local window
    local_bytes: int  # local memory per thread

    @property
    def dynamic_smem_offset(self) -> int:
        """Where the extern shared arrays (the dynamic shared memory) start in the CTA's window: after
        the static shared variables, at the largest alignment an extern array asks for (16 at least,
        as CUDA aligns dynamic shared memory). A CTA's shared memory is this plus its dynamic bytes."""
        align = max([16] + [v.align for v in (*self.module.variables, *self.kernel.variables)
                            if v.space == "shared" and v.extern])
        return -(-self.static_smem_bytes // align) * align

    @cached_property
    def compiled(self) -> Compiled:
        """The kernel's stretches and steps (fa_sim/ptx/blocks.py), compiled as waves need them and
        kept with the program, so every wave and launch of it reuses them."""
        return Compiled(self.kernel, self.instrs)


def _body_line(ins: Instruction, source_file: str | None) -> int | None:
    """The kernel-body line an instruction comes from: its own, or its outermost call site."""
    loc = ins.loc
    if loc is None or loc.line == 0:
        return None
    if loc.inlined_at:
        return loc.inlined_at[-1][1]
    return loc.line


def phase_sections(source: str) -> list[tuple[int, str]]:
    """(line, name) of every `// phase: NAME` marker, in order."""
    return [(i, m["name"]) for i, text in enumerate(source.splitlines(), start=1)
            if (m := PHASE_MARK.match(text))]


def _section(ins: Instruction, sections: list[tuple[int, str]]) -> str | None:
    """The marked section of the kernel-body line an instruction comes from (None: unmarked)."""
    line = _body_line(ins, None)
    name = None
    if line is not None:
        for start, label in sections:
            if start > line:
                break
            name = label
    return name


def _phases(kernel: Kernel, sections: list[tuple[int, str]]) -> list[str]:
    """Each instruction's phase: its section; code the compiler placed without a usable line
    (line 0, or an inlined line it did not attribute) takes the section of the code before it."""
    out, last = [], None
    for ins in kernel.instructions:
        name = _section(ins, sections) if sections else None
        if name is None and sections and last is not None:
            name = last
        if name is None:
            name = short_name(ins.loc.function) if ins.loc is not None and ins.loc.function else kernel.name
        last = name if sections else last
        out.append(name)
    return out


def _label(ins: Instruction, lines: list[str] | None) -> str:
    """The CUDA line an instruction stands for: its own line, or - when that line is an inline-asm
    wrapper - the line that called the wrapper (`ldsm_x4(tCrQ[mi], ...)`, not `asm volatile(...)`)."""
    loc = ins.loc
    if lines is None or loc is None:
        return ins.text
    chain = [loc.line] + [line for _, line, _ in loc.inlined_at]
    texts = [lines[n - 1].strip() for n in chain if 0 < n <= len(lines)]
    if not texts:
        return ins.text
    own = texts[0]
    if (own.startswith("asm") or own.startswith(":")) and len(texts) > 1:
        return texts[1]
    return own


def build_program(module: Module, kernel_name: str | None = None, source: str | None = None) -> Program:
    """Annotate `kernel_name` (the only kernel when None) of a parsed module."""
    kernel = inline_calls(module, module.kernel(kernel_name))  # __noinline__ functions, run in place
    lines = source.splitlines() if source is not None else None
    sections = phase_sections(source) if source is not None else []
    instrs = []
    for ins, phase in zip(kernel.instructions, _phases(kernel, sections)):
        label = _label(ins, lines)
        instrs.append(Instr(ins.pc, sass_class(ins), phase, ins.text, label, src=ins.loc, ptx_line=ins.ptx_line))
    variables = (*module.variables, *kernel.variables)
    smem, smem_bytes = _place(v for v in variables if v.space == "shared" and not v.extern)
    local, local_bytes = _place(v for v in variables if v.space == "local")
    return Program(module, kernel, tuple(instrs), main_loop(kernel), smem, smem_bytes, local, local_bytes)


def _place(variables) -> tuple[dict, int]:
    """Offsets of variables laid out one after the other at their alignment, and the total."""
    offsets, size = {}, 0
    for var in variables:
        size = -(-size // var.align) * var.align
        offsets[var.name] = size
        size += var.size
    return offsets, size
