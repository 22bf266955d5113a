"""SASS with its scheduling control information: what the timing model reads from a cubin.

Since Volta every SASS instruction is 128 bits. Beside the opcode and operands, the compiler
(ptxas) writes into each instruction how the warp scheduler must treat it; the hardware does no
dependency checking of its own for fixed-latency results. Bits 105-125 of the instruction (bits
41-61 of its upper 64-bit word) hold, low to high (Jia et al., "Dissecting the NVIDIA Volta GPU
Architecture via Microbenchmarking", arXiv:1804.06826, section 2.1; the same layout on Turing,
Ampere and Hopper, as CuAssembler and the sm_80/sm_90 cubins this module reads show):

    bits 105-108  stall      cycles the scheduler waits before issuing this warp's next instruction
    bit  109      yield      clear = the yield hint: the scheduler need not keep to this warp next
                             (maxas and CuAssembler print `Y` when the bit is clear, `-` when set)
    bits 110-112  write SB   scoreboard (0-5) released when this instruction's result is written;
                             7 = none (fixed-latency results are covered by the stall count)
    bits 113-115  read SB    scoreboard (0-5) released once the source registers have been read
                             (a store's data, say), so a later write of them must wait; 7 = none
    bits 116-121  wait mask  scoreboards this instruction waits on before it may issue
    bits 122-125  reuse      operand reuse-cache flags for source slots a, b, c, d

`parse` reads nvdisasm's `-hex` listing (optionally with `-g` source lines), `control_words`
the raw `.text` section of the cubin (fa_sim.contract.cubin.kernel_code), so each decode can be checked against an independent read
of the same bytes (tests/test_timing_sass.py). docs/sass_control.md documents the fields with
examples from the seed kernel.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from ..contract.cubin import kernel_code

NO_BARRIER = 7  # the 3-bit scoreboard index meaning "none"
N_SCOREBOARDS = 6
_CONTROL_SHIFT = 41  # bit 105 of the instruction = bit 41 of its upper 64-bit word

# '        /*0010*/                   S2R R0, SR_TID.X ;        /* 0x0000000000007919 */'
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:(@!?U?P(?:T|\d))\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;"
                    r"\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")
_HIGH = re.compile(r"^\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")
_LINE = re.compile(r'^\s*//## File "([^"]+)", line (\d+)')
_LABEL = re.compile(r"^\s*([.$\w]+):\s*$")


class SassFormatError(ValueError):
    """The text is not an nvdisasm -hex listing this module understands."""


@dataclass(frozen=True)
class Control:
    """The scheduling fields of one instruction (see the module docstring)."""

    stall: int  # 0..15 cycles
    yield_hint: bool  # bit 109 clear
    write_barrier: int | None  # 0..5, or None
    read_barrier: int | None  # 0..5, or None
    wait_mask: int  # 6 bits: bit b = waits on scoreboard b
    reuse: int  # 4 bits: bit i = operand slot i (a, b, c, d) goes to the reuse cache

    @classmethod
    def decode(cls, high: int) -> "Control":
        """Fields from the upper 64-bit word of the instruction."""
        c = (int(high) >> _CONTROL_SHIFT) & ((1 << 21) - 1)
        wb, rb = (c >> 5) & 7, (c >> 8) & 7
        return cls(stall=c & 0xF, yield_hint=not (c >> 4) & 1,
                   write_barrier=None if wb == NO_BARRIER else wb, read_barrier=None if rb == NO_BARRIER else rb,
                   wait_mask=(c >> 11) & 0x3F, reuse=(c >> 17) & 0xF)

    @property
    def waits_on(self) -> tuple[int, ...]:
        return tuple(b for b in range(N_SCOREBOARDS) if self.wait_mask >> b & 1)

    def __str__(self) -> str:
        """CuAssembler's notation, e.g. `[B-1----:R-:W2:Y:S04]`."""
        wait = "".join(str(b) if self.wait_mask >> b & 1 else "-" for b in range(N_SCOREBOARDS))
        rd = "-" if self.read_barrier is None else self.read_barrier
        wr = "-" if self.write_barrier is None else self.write_barrier
        return f"[B{wait}:R{rd}:W{wr}:{'Y' if self.yield_hint else '-'}:S{self.stall:02d}]"


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int


@dataclass(frozen=True)
class SassInstruction:
    addr: int  # byte offset in the kernel's .text
    guard: str  # '' when unguarded, else e.g. '@!P0'
    opcode: str  # with modifiers, e.g. 'HMMA.16816.F32'
    operands: str
    low: int  # the two 64-bit words of the encoding
    high: int
    source: SourceLine | None  # from nvdisasm -g (a cubin compiled with -lineinfo)
    label: str = ""  # the label in front of it ('' when none): a branch target starts a block

    @property
    def control(self) -> Control:
        return Control.decode(self.high)


def parse(text: str) -> tuple[SassInstruction, ...]:
    """Instructions of an `nvdisasm -hex [-g] -c` listing, in address order, each with its encoding
    (the listing prints the low word beside the instruction and the high word on the next line)."""
    out: list[SassInstruction] = []
    lines = text.splitlines()
    source: SourceLine | None = None
    label = ""
    i = 0
    while i < len(lines):
        if m := _LINE.match(lines[i]):
            source = SourceLine(m.group(1), int(m.group(2)))
        elif (m := _LABEL.match(lines[i])) and out:  # labels before the first instruction name the kernel
            label = m.group(1)
        elif m := _INSTR.match(lines[i]):
            hi = _HIGH.match(lines[i + 1]) if i + 1 < len(lines) else None
            if hi is None:
                raise SassFormatError(f"line {i + 2}: expected the upper encoding word after {lines[i].strip()!r}")
            addr, guard, opcode, operands, low = m.groups()
            out.append(SassInstruction(int(addr, 16), guard or "", opcode, operands, int(low, 16),
                                       int(hi.group(1), 16), source, label))
            label = ""
            i += 1
        i += 1
    if not out:
        raise SassFormatError("no instruction with an encoding found: disassemble with nvdisasm -hex -c")
    return tuple(out)


def control_words(cubin: bytes, kernel: str) -> list[tuple[int, int]]:
    """(low, high) 64-bit words of every 16-byte instruction of the kernel, straight from the ELF."""
    text = kernel_code(cubin, kernel)
    if len(text) % 16:
        raise SassFormatError(f".text.{kernel} is {len(text)} bytes, not a whole number of 128-bit instructions")
    return [struct.unpack_from("<QQ", text, i) for i in range(0, len(text), 16)]
