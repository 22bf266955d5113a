"""PTX handlers outside the engine: FakeLanes (dict-backed registers of n threads implementing the
Lanes protocol of fa_sim.ptx.ops) and `ins(text)`, a one-line PTX instruction reader good enough for
single instructions (the real parser is fa_sim.ptx.parser). The ALU probe (alu_probe.py) runs its
forms through them on the CPU; the handler tests use them as test doubles."""

from __future__ import annotations

import re

import numpy as np

from ..ptx.ir import Imm, Instruction, PredPair, Reg, Sink, Sym, Vec
from ..ptx.types import DTYPES, bits

#: Register width by name prefix, as NVRTC declares them (%p pred, %rs b16, %r b32, %rd b64,
#: %f f32, %fd f64, %h / %hh for f16 / f16x2).
REG_WIDTH = {"p": 1, "rs": 16, "r": 32, "rd": 64, "f": 32, "fd": 64, "h": 16, "hh": 32}
SPECIAL = {"%tid.x", "%tid.y", "%ntid.x", "%ctaid.x", "%ctaid.y", "%laneid", "%warpid"}


def reg_width(name: str) -> int:
    prefix = re.match(r"%([a-z]+)", name).group(1)
    return REG_WIDTH[prefix]


class FakeLanes:
    """n threads; registers stored as their declared width's unsigned bits (bool for .pred)."""

    def __init__(self, n: int, seed: int | None = None, symbols: dict | None = None):
        self.n = n
        self.regs: dict[str, np.ndarray] = {}
        self.symbols = symbols or {}
        self.rng = None if seed is None else np.random.default_rng(seed)
        self.writes: list[tuple[str, str]] = []  # (register, ptype) in order

    def set(self, name: str, values, ptype: str) -> None:
        self.write(Reg(name), np.broadcast_to(np.asarray(values, DTYPES[ptype]), (self.n,)), ptype)

    def get(self, name: str, ptype: str) -> np.ndarray:
        return self.read(Reg(name), ptype)

    def _storage(self, name: str) -> np.ndarray:
        if name not in self.regs:
            if self.rng is None:
                raise KeyError(f"register {name} read before it was written")
            w = reg_width(name)
            if w == 1:
                self.regs[name] = self.rng.integers(0, 2, self.n).astype(bool)
            else:
                self.regs[name] = self.rng.integers(0, 2 ** w, self.n, dtype=np.dtype(f"u{w // 8}"))
        return self.regs[name]

    def read(self, operand, ptype: str) -> np.ndarray:
        if isinstance(operand, Reg):
            if operand.name in SPECIAL:
                return np.arange(self.n).astype(DTYPES[ptype])
            raw = self._storage(operand.name)
            if ptype == "pred":
                return ~raw if operand.negate else raw.copy()
            tw = bits(ptype)
            if raw.dtype.itemsize * 8 < tw:
                raise ValueError(f"{operand.name} is narrower than .{ptype}")
            return raw.astype(np.dtype(f"u{tw // 8}")).view(DTYPES[ptype])  # chop to the type's width
        if isinstance(operand, Imm):
            return self._immediate(operand, ptype)
        if isinstance(operand, Sym):
            return np.full(self.n, self.symbols[operand.name], DTYPES[ptype])
        raise TypeError(f"cannot read {operand!r}")

    def _immediate(self, imm: Imm, ptype: str) -> np.ndarray:
        dt = DTYPES[ptype]
        if imm.bits is not None:
            raw = np.full(self.n, imm.bits, np.dtype(f"u{imm.width // 8}"))
            return raw.view(dt) if raw.dtype.itemsize == dt.itemsize else raw.astype(dt)
        if ptype == "pred":
            return np.full(self.n, bool(imm.value))
        if dt.kind == "f":
            return np.full(self.n, float(imm.value), dt)
        mask = (1 << (dt.itemsize * 8)) - 1
        return np.full(self.n, int(imm.value) & mask, np.dtype(f"u{dt.itemsize}")).view(dt)

    def write(self, operand, value, ptype: str) -> None:
        if isinstance(operand, Sink):
            return
        if not isinstance(operand, Reg):
            raise TypeError(f"cannot write {operand!r}")
        value = np.asarray(value)
        if value.dtype != DTYPES[ptype]:
            raise TypeError(f"writing {value.dtype} as .{ptype} to {operand.name}")
        value = np.broadcast_to(value, (self.n,))
        self.writes.append((operand.name, ptype))
        rw = reg_width(operand.name)
        if ptype == "pred" or rw == 1:
            self.regs[operand.name] = value.astype(bool).copy()
            return
        tw = bits(ptype)
        if rw < tw:
            raise ValueError(f"{operand.name} ({rw} bits) cannot hold .{ptype}")
        if ptype.startswith("s"):  # #operand-size-exceeding-instruction-type-size: sign-extend
            stored = value.astype(np.dtype(f"i{rw // 8}")).view(np.dtype(f"u{rw // 8}"))
        else:
            stored = value.view(np.dtype(f"u{tw // 8}")).astype(np.dtype(f"u{rw // 8}"))
        self.regs[operand.name] = stored.copy()


_FLOAT_IMM = re.compile(r"^0([fd])([0-9a-fA-F]+)$")


def operand(text: str):
    text = text.strip()
    if text.startswith("{"):
        return Vec(tuple(operand(t) for t in text[1:-1].split(",")))
    if "|" in text:
        p, q = (operand(t) for t in text.split("|"))
        return PredPair(p, q)
    if text == "_":
        return Sink()
    if text.startswith("!"):
        return Reg(text[1:], negate=True)
    if text.startswith("%"):
        return Reg(text)
    m = _FLOAT_IMM.match(text)
    if m:
        width = 32 if m.group(1) == "f" else 64
        raw = int(m.group(2), 16)
        value = np.array(raw, np.dtype(f"u{width // 8}")).view(np.dtype(f"f{width // 8}"))
        return Imm(float(value), bits=raw, width=width)
    try:
        return Imm(int(text, 0))
    except ValueError:
        pass
    try:
        return Imm(float(text))
    except ValueError:
        return Sym(text)


def split_operands(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur] if cur.strip() else out


def ins(text: str, pc: int = 0, line: int = 1) -> Instruction:
    """'add.rn.f32 %f3, %f1, %f2;' -> Instruction (no guard)."""
    text = text.strip().rstrip(";").strip()
    mnemonic, _, rest = text.partition(" ")
    opcode, *mods = mnemonic.split(".")
    ops = tuple(operand(t) for t in split_operands(rest))
    return Instruction(pc=pc, opcode=opcode, mods=tuple(mods), operands=ops, guard=None, text=text, ptx_line=line)
