"""Registers of every thread of a wave, and how instructions read and write operands.

PTX anchors: `#register-state-space` (registers are typed storage of a declared width),
`#operand-size-exceeding-instruction-type-size` (reading a wider register truncates it; writing a
narrower value into a wider register zero- or sign-extends it by the instruction's type),
`#special-registers`, `#state-spaces-param`.

Storage: each declared register prefix ('%r', '%f', '%rd', '%p', ...) is one array
[count, N] of unsigned words of its width (bool for predicates), N = threads of the wave (CTA-major:
thread n = cta * T + tid). Arrays are allocated lazily (np.zeros), so registers never written cost
no memory. An instruction reads an operand as an array over the threads of its group, viewed as the
instruction's type; special registers and immediates are computed or broadcast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .ir import Imm, Kernel, Reg, Sink, Sym
from .ops import Unsupported
from .types import DTYPES, STORAGE, bits

_NAME = re.compile(r"^(%[A-Za-z_$][A-Za-z_$]*?)(\d+)$")
SIGNED = frozenset({"s8", "s16", "s32", "s64"})


@dataclass(frozen=True)
class Geometry:
    """The wave's threads: grid and block shapes, the wave's CTA ids, threads per CTA.

    The engine holds `slots` threads per CTA, the block's threads rounded up to whole warps (the
    machine's lane arrays are [C, warps, 32]); the slots past `threads` belong to no thread: a
    partial warp's missing lanes, exited from the start (WaveState), as the hardware never launches
    them."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    ctas: np.ndarray  # [C] linear CTA ids

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def slots(self) -> int:
        return -(-self.threads // 32) * 32

    @property
    def n(self) -> int:
        return len(self.ctas) * self.slots

    def absent(self) -> np.ndarray:
        """[n] bool: the slots that hold no thread (a partial warp's missing lanes)."""
        return np.tile(np.arange(self.slots) >= self.threads, len(self.ctas))


SPECIAL = ("%tid.x", "%tid.y", "%tid.z", "%ctaid.x", "%ctaid.y", "%ctaid.z", "%laneid", "%warpid", "%nwarpid",
           "%smid", "%nsmid", "%gridid", "%dynamic_smem_size", "%ntid.x", "%ntid.y", "%ntid.z", "%nctaid.x",
           "%nctaid.y", "%nctaid.z", "%lanemask_eq", "%lanemask_lt", "%lanemask_le", "%lanemask_ge", "%lanemask_gt")
# the special registers the engine provides, in the order of special_registers' rows


def special_registers(g: Geometry, dynamic_smem: int) -> np.ndarray:
    """[len(SPECIAL), N] uint32: the values of every special register the engine provides, a row
    each (one array, so a wave's parts slice and join them at once: fa_sim/ptx/waves.py)."""
    t = np.tile(np.arange(g.slots, dtype=np.int64), len(g.ctas))  # [N] linear thread id (slot)
    c = np.repeat(g.ctas, g.slots)  # [N] linear CTA id
    bx, by, _ = g.block
    gx, gy, _ = g.grid
    lane = t % 32
    out = {"%tid.x": t % bx, "%tid.y": (t // bx) % by, "%tid.z": t // (bx * by),
           "%ctaid.x": c % gx, "%ctaid.y": (c // gx) % gy, "%ctaid.z": c // (gx * gy),
           "%laneid": lane, "%warpid": t // 32, "%nwarpid": np.full_like(t, -(-g.threads // 32)),
           "%smid": np.zeros_like(t), "%nsmid": np.ones_like(t), "%gridid": np.zeros_like(t),
           "%dynamic_smem_size": np.full_like(t, dynamic_smem)}
    for axis, size in zip("xyz", g.block):
        out[f"%ntid.{axis}"] = np.full_like(t, size)
    for axis, size in zip("xyz", g.grid):
        out[f"%nctaid.{axis}"] = np.full_like(t, size)
    one = np.int64(1)
    for name, mask in (("eq", one << lane), ("lt", (one << lane) - 1), ("le", (one << (lane + 1)) - 1)):
        out[f"%lanemask_{name}"] = mask & 0xFFFFFFFF
    out["%lanemask_ge"] = (~out["%lanemask_lt"]) & 0xFFFFFFFF
    out["%lanemask_gt"] = (~out["%lanemask_le"]) & 0xFFFFFFFF
    return np.stack([out[name] for name in SPECIAL]).astype(np.uint32)


class RegisterFile:
    """Every register of every thread of the wave (see module docstring)."""

    def __init__(self, kernel: Kernel, n: int):
        self.n = n
        self._files: dict[str, np.ndarray] = {}
        self._slot: dict[str, tuple[str, int, int]] = {}  # name -> (prefix, row, bits)
        self._word_rows: dict = {}  # names -> (prefix, rows) or None (words)
        for prefix, (ptype, count) in kernel.regs.items():  # %r<N>: %r0 .. %r{N-1}
            self._files[prefix] = np.zeros((count, n), STORAGE[bits(ptype)])
        for name, ptype in getattr(kernel, "named_regs", {}).items():  # declared one by one
            self._files[name] = np.zeros((1, n), STORAGE[bits(ptype)])
            self._slot[name] = (name, 0, bits(ptype))

    def of_ctas(self, pos: np.ndarray | slice, threads: int, live: frozenset[str], reuse: bool = False) -> RegisterFile:
        """The registers `live` of the CTAs at wave positions `pos` (sorted; `threads` threads each)
        as a register file of their own: copied into new storage where every other register is
        zero, or with `reuse` moved to the front of this file's rows, whose first threads it then
        views (this file is spent; the other registers hold stale values, and no path reads them
        before writing them). `pos` a slice (consecutive CTAs): every row's range of their threads,
        viewed (their registers as they are; the parts of a spent file hold disjoint CTAs)."""
        if isinstance(pos, slice):
            out = self._sibling((pos.stop - pos.start) * threads)
            lo = pos.start * threads
            out._files = {prefix: f[:, lo:lo + out.n] for prefix, f in self._files.items()}
            return out
        out = self._sibling(len(pos) * threads)
        rows = self._rows(live)
        out._files = {}
        for prefix, f in self._files.items():
            g = out._files[prefix] = f[:, :out.n] if reuse else np.zeros((f.shape[0], out.n), f.dtype)
            r = rows.get(prefix)
            if r:
                g[r] = f[r].reshape(len(r), -1, threads)[:, pos].reshape(len(r), -1)
        return out

    def viewing(self, files: dict[str, np.ndarray], n: int) -> RegisterFile:
        """A register file of n threads of this kernel whose storage is `files` (arrays of this
        file's shapes but the thread axis: register files joined as views, fa_sim/ptx/waves.py)."""
        out = self._sibling(n)
        out._files = files
        return out

    @staticmethod
    def joined(files: list[RegisterFile], live: frozenset[str]) -> RegisterFile:
        """The registers `live` of register files of one kernel (of_ctas' parts) as one file of all
        their threads, in order; every other register of it is zero."""
        first = files[0]
        out = first._sibling(sum(f.n for f in files))
        out._files = {prefix: np.zeros((f.shape[0], out.n), f.dtype) for prefix, f in first._files.items()}
        for prefix, r in first._rows(live).items():
            out._files[prefix][r] = np.concatenate([f._files[prefix][r] for f in files], axis=1)
        return out

    def _sibling(self, n: int) -> RegisterFile:
        """A register file of n threads of the same kernel, without storage yet (the caller's):
        it shares where registers live and the GEMM word rows."""
        out = object.__new__(RegisterFile)
        out.n, out._slot, out._word_rows = n, self._slot, self._word_rows
        return out

    @property
    def files(self) -> dict[str, np.ndarray]:
        """The storage: file name (a register prefix, or a register declared by name) -> [rows, N]."""
        return self._files

    def place(self, name: str) -> tuple[str, int]:
        """(file, row) of a declared register: where every register file of the kernel keeps it."""
        self.slot(name)
        prefix, row, _ = self._slot[name]
        return prefix, row

    def _rows(self, names: frozenset[str]) -> dict[str, list[int]]:
        """The storage rows of registers, by file (special registers have none)."""
        rows: dict[str, list[int]] = {}
        for name in names:
            try:
                self.slot(name)  # fills self._slot[name]
            except Unsupported:  # a special register
                continue
            prefix, row, _ = self._slot[name]
            rows.setdefault(prefix, []).append(row)
        return rows

    def slot(self, name: str) -> tuple[np.ndarray, int]:
        """(storage row [N], register width in bits) of a register name."""
        hit = self._slot.get(name)
        if hit is None:
            m = _NAME.match(name)
            if m is None or m.group(1) not in self._files:
                raise Unsupported(f"register {name} is not declared")
            prefix, row = m.group(1), int(m.group(2))
            if row >= self._files[prefix].shape[0]:
                raise Unsupported(f"register {name} is outside its declaration {prefix}<{self._files[prefix].shape[0]}>")
            width = 1 if self._files[prefix].dtype == bool else self._files[prefix].dtype.itemsize * 8
            hit = self._slot[name] = (prefix, row, width)
        prefix, row, width = hit
        return self._files[prefix][row], width

    def lane_major(self, names: tuple[str, ...], shape: tuple[int, int]) -> np.ndarray:
        """The registers `names` of every thread as one array [C, T, len(names)] (storage dtype)."""
        return np.stack([self.slot(name)[0] for name in names], axis=-1).reshape(*shape, len(names))

    def set_lane_major(self, names: tuple[str, ...], values: np.ndarray) -> None:
        """Store values [C, T, len(names)] (storage dtype) into the registers `names`, in order."""
        cols = values.reshape(self.n, len(names))
        for j, name in enumerate(names):
            self.slot(name)[0][:] = cols[:, j]

    def row(self, op, width: int) -> np.ndarray | None:
        """The storage row of a declared register operand of `width` bits, for a write of the whole
        register (None: a sink, a negated, special or undeclared register, another width)."""
        if not isinstance(op, Reg) or op.negate or op.special:
            return None
        try:
            raw, have = self.slot(op.name)
        except Unsupported:
            return None
        return raw if have == width else None

    def words(self, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        """(storage [count, N], rows) when the registers `names` are rows of one file of 32-bit
        registers - what a GEMM's operands are - so that one fancy index reads or writes them all
        (None otherwise: the caller takes the one-at-a-time path). The rows are cached by names for
        every register file of the kernel."""
        hit = self._word_rows.get(names, False)
        if hit is False:
            try:
                slots = [self.slot(name) for name in names]  # declared (raises Unsupported otherwise)
            except Unsupported:
                slots = None
            prefixes = {self._slot[name][0] for name in names} if slots else set()
            ok = len(prefixes) == 1 and all(width == 32 for _, width in slots)
            hit = self._word_rows[names] = (prefixes.pop(), np.array([self._slot[n][1] for n in names])) if ok else None
        return None if hit is None else (self._files[hit[0]], hit[1])


def to_type(raw: np.ndarray, width: int, ptype: str) -> np.ndarray:
    """Register bits (storage dtype of `width`) seen as `ptype`: same width reinterprets, a wider
    register is truncated, a narrower one extended (sign by its own value for signed types)."""
    want = bits(ptype)
    if ptype == "pred" or width == 1:
        if ptype != "pred" or width != 1:
            raise Unsupported(f"a predicate register read as .{ptype} (or the other way round)")
        return raw
    if want == width:
        return raw.view(DTYPES[ptype])
    storage = STORAGE[want]
    if want < width:
        return raw.astype(storage).view(DTYPES[ptype])
    if ptype in SIGNED:
        signed = raw.view(np.dtype(f"int{width}"))
        return signed.astype(DTYPES[ptype])
    return raw.astype(storage).view(DTYPES[ptype])


def from_type(value: np.ndarray, ptype: str, width: int) -> np.ndarray:
    """A value of `ptype` as the bits a `width`-bit register stores (extended or truncated)."""
    if ptype == "pred":
        return np.asarray(value, dtype=bool)
    v = np.asarray(value).astype(DTYPES[ptype], copy=False)
    have = bits(ptype)
    raw = v.view(STORAGE[have]) if v.dtype != bool else v.astype(STORAGE[have])
    if have == width:
        return raw
    if have > width:
        return raw.astype(STORAGE[width])
    if ptype in SIGNED:
        return v.astype(np.dtype(f"int{width}")).view(STORAGE[width])
    return raw.astype(STORAGE[width])


def immediate(op: Imm, ptype: str):
    """An immediate as a numpy scalar of `ptype` (hex floats keep their bit pattern)."""
    dtype = DTYPES[ptype]
    if op.bits is not None:  # 0fXXXXXXXX / 0dXXXXXXXXXXXXXXXX: a bit pattern
        raw = np.uint32(op.bits) if op.width == 32 else np.uint64(op.bits)
        if dtype.kind == "f" and dtype.itemsize * 8 != op.width:  # e.g. 0d... used as .f32: the value
            return raw.view(np.float32 if op.width == 32 else np.float64).astype(dtype)
        if ptype == "pred":
            return np.bool_(raw != 0)
        width = dtype.itemsize * 8  # same width: the bits as they are; other widths: truncated / extended
        return np.array(int(raw) & ((1 << width) - 1), dtype=STORAGE[width]).view(dtype)[()]
    if ptype == "pred":
        return np.bool_(op.value)
    if dtype.kind == "f":
        return dtype.type(op.value)
    width = dtype.itemsize * 8  # integers wrap to the type's width, as PTX immediates do
    return np.array(int(op.value) & ((1 << width) - 1), dtype=STORAGE[width]).view(dtype)[()]


__all__ = ["SPECIAL", "Geometry", "RegisterFile", "Sink", "Sym", "Reg", "from_type", "immediate", "special_registers",
           "to_type"]
