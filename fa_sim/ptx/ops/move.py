"""Handler of mov (#data-movement-and-conversion-instructions-mov, both sections).

- `mov.type d, a`: a register, an immediate, a special register (%tid.x ...) or a variable's
  address; Lanes.read evaluates all of them.
- pack `mov.b{16,32,64} d, {a, b, ...}` and unpack `mov.b{16,32,64} {a, b, ...}, d`: element 0
  is the least significant; '_' discards an unpacked element. .b128 is not supported (no 128-bit
  registers in the engine).
"""

from __future__ import annotations

import numpy as np

from ..ir import Sink, Vec
from ..types import DTYPES, bits
from .common import Exec, Form, Simple, arity


class Mov(Simple):
    """mov: the identity of one operand (a Simple the fused lane blocks inline), or a pack or
    unpack when an operand is a vector."""

    def __call__(self, lanes, ops: tuple) -> None:
        arity(self.form, ops, 2)
        d, a = ops
        width = bits(self.out)
        if isinstance(a, Vec):
            lanes.write(d, _pack(self.form, lanes, a.items, width), f"b{width}")
        elif isinstance(d, Vec):
            _unpack(self.form, lanes, d.items, lanes.read(a, f"b{width}"), width)
        else:
            lanes.write(d, lanes.read(a, self.out), self.out)

    def spec(self, ops: tuple) -> Simple | None:
        return None if len(ops) != 2 or any(isinstance(x, Vec) for x in ops) else self


def mov(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    ptype = form.type()
    if ptype == "b128":
        raise form.unsupported(".b128 registers are not supported")
    if ptype not in DTYPES:
        raise form.unsupported(f"type .{ptype} is not a register type")
    return Mov(form, None, ((1, ptype),), ptype, 2)


def _element_width(form: Form, n: int, width: int) -> int:
    w = width // n if n else 0
    if n < 2 or w * n != width or w not in (8, 16, 32):
        raise form.unsupported(f"cannot split .b{width} into {n} elements")
    return w


def _pack(form: Form, lanes, items: tuple, width: int) -> np.ndarray:
    w = _element_width(form, len(items), width)
    udt = np.dtype(f"u{width // 8}")
    acc = np.zeros(lanes.n, udt)
    for i, item in enumerate(items):
        if isinstance(item, Sink):
            raise form.unsupported("'_' cannot be a source element")
        acc |= lanes.read(item, f"b{w}").astype(udt) << udt.type(i * w)
    return acc


def _unpack(form: Form, lanes, items: tuple, x: np.ndarray, width: int) -> None:
    w = _element_width(form, len(items), width)
    mask = np.array((1 << w) - 1).astype(x.dtype)
    out = np.dtype(f"u{w // 8}")
    for i, item in enumerate(items):
        if not isinstance(item, Sink):
            lanes.write(item, ((x >> x.dtype.type(i * w)) & mask).astype(out), f"b{w}")
