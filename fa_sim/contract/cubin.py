"""Resource usage of a kernel read from the cubin itself: registers and per-thread local memory.

Why not from ptxas's `-v` log: NVRTC 13 keeps compiled programs in the CUDA compute cache
(~/.nv/ComputeCache) and, on a hit, returns the cubin with an empty log (measured on the H200), so
the log is no source of truth. The cubin always holds the numbers the driver itself uses:

- A CUDA cubin is an ELF64 file (little endian). Its `.nv.info` section (type SHT_CUDA_INFO,
  0x70000000) is a list of attribute records `u8 format, u8 attribute, u16 size-or-value`; format
  0x04 (EIFMT_SVAL) carries `size` payload bytes, the others none. The per-kernel records hold a
  u32 symbol index (the kernel's `.symtab` entry) and a u32 value:
      0x2f EIATTR_REGCOUNT     registers per thread (what cuFuncGetAttribute NUM_REGS returns)
      0x11 EIATTR_FRAME_SIZE   stack frame bytes per thread (ptxas: "bytes stack frame"; the
                               driver's LOCAL_SIZE_BYTES), 0 when nothing lives in local memory
- Checked against ptxas's own report on every kernel of the family for sm_80 and sm_90 (the
  regular cache's logs, 314 cubins, NVRTC 13.0: all equal) and on the GPU against the loaded
  kernel's attributes (tests/test_hw_gpu.py).

Spill traffic in bytes is not stored in the cubin; `fa_hw.sass_counts.local_memory_bytes`
counts it from the SASS (equal to ptxas's spill stores / loads, tests/test_sass_counts.py).
Reading a cubin needs no GPU: fa_hw uses it for every compiled kernel, and a timing model of the
simulator can use it with occupancy.resident_ctas.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import ToolError

SHT_SYMTAB = 2
SHT_CUDA_INFO = 0x70000000
EIFMT_SVAL = 0x04
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F


class CubinError(ToolError):
    """The bytes are not a CUDA ELF cubin, or lack the kernel's resource attributes."""


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int


def _sections(cubin: bytes) -> list[_Section]:
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = raw[shstrndx][4]

    def name(offset: int) -> str:
        end = cubin.index(b"\0", names + offset)
        return cubin[names + offset: end].decode()

    return [_Section(name(r[0]), r[1], r[4], r[5], r[6]) for r in raw]


def kernel_code(cubin: bytes, kernel: str) -> bytes:
    """The machine code of `kernel`: the bytes of its `.text.<kernel>` section."""
    sec = next((s for s in _sections(cubin) if s.name == f".text.{kernel}"), None)
    if sec is None:
        raise CubinError(f"the cubin has no section .text.{kernel}")
    return cubin[sec.offset: sec.offset + sec.size]


def _symbol_index(cubin: bytes, sections: list[_Section], kernel: str) -> int:
    """Index of `kernel` in .symtab (Elf64_Sym: 24 bytes, name offset into the linked strtab)."""
    symtab = next((s for s in sections if s.type == SHT_SYMTAB), None)
    if symtab is None:
        raise CubinError("the cubin has no symbol table")
    strtab = sections[symtab.link].offset
    for i in range(symtab.size // 24):
        name_off, = struct.unpack_from("<I", cubin, symtab.offset + 24 * i)
        end = cubin.index(b"\0", strtab + name_off)
        if cubin[strtab + name_off: end].decode() == kernel:
            return i
    raise CubinError(f"kernel {kernel!r} is not in the cubin's symbol table")


def _attributes(cubin: bytes, section: _Section) -> list[tuple[int, bytes]]:
    """(attribute, payload) records of one .nv.info section."""
    out, at, end = [], section.offset, section.offset + section.size
    while at + 4 <= end:
        fmt, attr, size = struct.unpack_from("<BBH", cubin, at)
        at += 4
        payload = b""
        if fmt == EIFMT_SVAL:
            payload, at = cubin[at: at + size], at + size
        out.append((attr, payload))
    return out


@dataclass(frozen=True)
class ResourceUsage:
    """Registers and local memory per thread of one compiled kernel."""

    registers: int
    stack_bytes: int  # local memory per thread: spilled registers (and any local arrays)

    @property
    def spills(self) -> bool:
        """True when anything lives in local memory; the kernel's registers then did not suffice
        (it declares no local arrays). The exact spill bytes: sass_counts.local_memory_bytes."""
        return self.stack_bytes > 0

    @classmethod
    def from_cubin(cls, cubin: bytes, kernel: str) -> "ResourceUsage":
        """EIATTR_REGCOUNT and EIATTR_FRAME_SIZE of `kernel` (module docstring)."""
        try:
            found = _kernel_attributes(bytes(cubin), kernel)
        except (struct.error, ValueError, IndexError) as exc:  # truncated or corrupt bytes
            raise CubinError(f"malformed cubin ({exc})") from None
        if EIATTR_REGCOUNT not in found:
            raise CubinError(f"the cubin holds no register count for {kernel!r}")
        return cls(found[EIATTR_REGCOUNT], found.get(EIATTR_FRAME_SIZE, 0))

    @classmethod
    def from_kernel(cls, kernel) -> "ResourceUsage":
        """What the driver reports for a loaded cuda.core Kernel (needs a GPU)."""
        attrs = kernel.attributes
        return cls(int(attrs.num_regs), int(attrs.local_size_bytes))


def _kernel_attributes(cubin: bytes, kernel: str) -> dict[int, int]:
    """{attribute: value} of the .nv.info records that name `kernel`."""
    sections = _sections(cubin)
    index = _symbol_index(cubin, sections, kernel)
    found: dict[int, int] = {}
    for section in sections:
        if section.type != SHT_CUDA_INFO:
            continue
        for attr, payload in _attributes(cubin, section):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(payload) == 8:
                symbol, value = struct.unpack("<II", payload)
                if symbol == index:
                    found[attr] = value
    return found
