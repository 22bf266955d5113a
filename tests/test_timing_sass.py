"""The SASS control-information decoder (fa_sim.timing.sass) on real cubins of every config.

No GPU: NVRTC compiles the cubins for sm_90 (the H200) and sm_80, nvdisasm lists them. Three
independent checks that the bits are sliced right:
- the encodings nvdisasm prints equal the 16-byte words of the ELF's .text section;
- the reuse flags equal the `.reuse` marks nvdisasm prints on the source operands;
- the scoreboards are a consistent dependency system: in straight-line code, every instruction that
  reads a register written by a variable-latency instruction (one that sets a write scoreboard)
  waits on that scoreboard, itself or through an instruction in between; likewise every write of
  a register that a variable-latency instruction reads (read scoreboard) waits first. A field cut
  one bit off would break these on the first kernel.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cuda.bindings")

from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.contract import KERNEL_NAME, KernelBuild  # noqa: E402
from fa_sim.contract.cubins import compile_build  # noqa: E402
from fa_sim.contract.sass import disassemble  # noqa: E402
from fa_sim.timing.sass import Control, SassFormatError, control_words, parse  # noqa: E402

FAMILY = KernelConfig.family()
_REG = re.compile(r"(?<![\w.])R(\d+)(?:\.(64|128))?")
_BLOCK_END = ("BRA", "EXIT", "RET", "CALL", "BSYNC", "BSSY", "WARPSYNC", "BAR")


def listing(cubin: bytes, lines: bool = False) -> str:
    return disassemble(cubin, encodings=True, lines=lines)


def regs(text: str) -> set[int]:
    """Registers named in operand text; R4.64 is R4, R5 (R4.128: R4..R7)."""
    out = set()
    for n, width in _REG.findall(text):
        out.update(range(int(n), int(n) + {"": 1, "64": 2, "128": 4}[width]))
    return out


def dest_and_sources(ins) -> tuple[set[int], set[int]]:
    """First register operand as the destination (stores and LDGSTS have none: their first operand
    is an address), the rest as sources."""
    parts = [p.strip() for p in ins.operands.split(",")]
    stores = ins.opcode.startswith(("ST", "LDGSTS", "RED", "BAR", "SHFL")) and not ins.opcode.startswith("SHFL")
    if not parts or stores or not _REG.match(parts[0]):
        return set(), regs(ins.operands)
    return regs(parts[0]), regs(", ".join(parts[1:]))


def check_scoreboards(program) -> list[str]:
    """Violations of the dependency rule (module docstring); straight-line code only."""
    bad = []
    for i, producer in enumerate(program):
        c = producer.control
        if producer.guard or (c.write_barrier is None and c.read_barrier is None):
            continue
        dst, src = dest_and_sources(producer)
        covered = {"w": c.write_barrier is None, "r": c.read_barrier is None}
        for consumer in program[i + 1:]:
            if consumer.label:
                break
            cc = consumer.control
            covered["w"] |= c.write_barrier in cc.waits_on
            covered["r"] |= c.read_barrier in cc.waits_on
            cdst, csrc = dest_and_sources(consumer)
            if not covered["w"] and (dst & (csrc | cdst)):
                bad.append(f"{consumer.addr:#x} {consumer.opcode} uses {producer.opcode}@{producer.addr:#x}'s result "
                           f"without waiting on SB{c.write_barrier}")
                break
            if not covered["r"] and (src & cdst):
                bad.append(f"{consumer.addr:#x} {consumer.opcode} overwrites a source of "
                           f"{producer.opcode}@{producer.addr:#x} without waiting on SB{c.read_barrier}")
                break
            if all(covered.values()) or consumer.opcode.split(".")[0] in _BLOCK_END:
                break
    return bad


def test_decode_fields():
    # S2R R0, SR_TID.X in the seed kernel: stall 7, yield bit set (no hint), result on scoreboard 1
    c = Control.decode(0x000E6E0000002100)
    assert (c.stall, c.yield_hint, c.write_barrier, c.read_barrier, c.wait_mask, c.reuse) == (7, False, 1, None, 0, 0)
    assert str(c) == "[B------:R-:W1:-:S07]"
    # every field at its extreme, set alone: bits 105-108, 109, 110-112, 113-115, 116-121, 122-125
    assert Control.decode(0xF << 41).stall == 15
    assert not Control.decode(1 << 45).yield_hint and Control.decode(0).yield_hint  # the hint is the clear bit
    assert Control.decode(5 << 46).write_barrier == 5
    assert Control.decode(4 << 49).read_barrier == 4
    assert Control.decode(0x3F << 52).waits_on == (0, 1, 2, 3, 4, 5)
    assert Control.decode(0xF << 58).reuse == 0xF
    assert str(Control.decode((0x7 << 46) | (0x7 << 49) | (0b100101 << 52))) == "[B0-2--5:R-:W-:Y:S00]"  # bit 109 clear: Y


def test_parse_refuses_a_listing_without_encodings():
    with pytest.raises(SassFormatError, match="nvdisasm -hex"):
        parse("        /*0000*/                   LDC R1, c[0x0][0x28] ;\n")


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("cfg", FAMILY, ids=lambda c: c.tag)
def test_decoder_on_every_config(cfg, arch):
    cubin = compile_build(KernelBuild(cfg, False, arch)).cubin
    program = parse(listing(cubin))
    assert [(i.low, i.high) for i in program] == control_words(cubin, KERNEL_NAME)
    assert [i.addr for i in program] == list(range(0, 16 * len(program), 16))
    for ins in program:
        assert bin(ins.control.reuse).count("1") == ins.operands.count(".reuse"), (hex(ins.addr), ins.opcode)
    assert check_scoreboards(program) == []
    # the kernel's variable-latency instructions use the scoreboards at all (a constant zero field
    # would pass the rule above vacuously)
    assert {i.control.write_barrier for i in program if i.opcode.startswith(("LDSM", "S2R", "MUFU"))} - {None}
    assert any(i.control.read_barrier is not None for i in program if i.opcode.startswith("LDGSTS"))


def test_source_lines_with_lineinfo():
    """With -lineinfo every instruction carries its CUDA source line, and the code is the same."""
    build = KernelBuild(KernelConfig(), False, "sm_90")
    plain = parse(listing(compile_build(build).cubin))
    lined = parse(listing(compile_build(KernelBuild(KernelConfig(), False, "sm_90", lineinfo=True)).cubin, lines=True))
    assert [(i.opcode, i.operands, i.high) for i in lined] == [(i.opcode, i.operands, i.high) for i in plain]
    assert all(i.source is not None and i.source.file.endswith("fa2_fwd.cu") for i in lined)
    hmma = {i.source.line for i in lined if i.opcode.startswith("HMMA")}
    assert hmma and all(line > 0 for line in hmma)
