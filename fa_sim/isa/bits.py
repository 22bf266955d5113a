"""Logic, shift and bit-manipulation instructions, elementwise over lane arrays.

PTX anchors: `#logic-and-shift-instructions` (`-and -or -xor -not -cnot -lop3 -shf -shl -shr`),
`#integer-arithmetic-instructions-popc -clz -bfind -fns -brev -bfe -bfi -szext -bmsk`,
`#data-movement-and-conversion-instructions-prmt`.

Operands are unsigned or signed numpy arrays of the instruction's width; shift amounts, bit
positions and lengths are uint32 arrays (or ints). Every clamp and wrap follows the PTX semantics
pseudo-code: shl/shr clamp the amount to the width, bfe/bfi use only the low 8 bits of position
and length, shf clamps to 32 or wraps mod 32.
"""

from __future__ import annotations

import numpy as np

_BYTE_REVERSED = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint8)

# prmt modes (#data-movement-and-conversion-instructions-prmt): [mode][c & 3] -> source byte of
# d.b0, d.b1, d.b2, d.b3.
PRMT_MODES = {
    "f4e": ((0, 1, 2, 3), (1, 2, 3, 4), (2, 3, 4, 5), (3, 4, 5, 6)),
    "b4e": ((0, 7, 6, 5), (1, 0, 7, 6), (2, 1, 0, 7), (3, 2, 1, 0)),
    "rc8": ((0, 0, 0, 0), (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3)),
    "ecl": ((0, 1, 2, 3), (1, 1, 2, 3), (2, 2, 2, 3), (3, 3, 3, 3)),
    "ecr": ((0, 0, 0, 0), (0, 1, 1, 1), (0, 1, 2, 2), (0, 1, 2, 3)),
    "rc16": ((0, 1, 0, 1), (2, 3, 2, 3), (0, 1, 0, 1), (2, 3, 2, 3)),
}


def _width(x: np.ndarray) -> int:
    return x.dtype.itemsize * 8


def _u(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _u32(x) -> np.ndarray:
    return np.asarray(x).astype(np.uint32)


def shl(a: np.ndarray, n) -> np.ndarray:
    """shl.b{16,32,64}: amounts >= the width give 0."""
    w = _width(a)
    if np.ndim(n) == 0:  # an immediate amount: no per-lane clamp
        k = int(n) & 0xFFFFFFFF
        return np.zeros_like(a) if k >= w else a << a.dtype.type(k)
    n = _u32(n)
    return np.where(n >= w, 0, a << np.minimum(n, w - 1).astype(a.dtype)).astype(a.dtype)


def shr(a: np.ndarray, n) -> np.ndarray:
    """shr: arithmetic for signed dtypes (amounts >= width replicate the sign), logical otherwise."""
    w = _width(a)
    if np.ndim(n) == 0:
        k = int(n) & 0xFFFFFFFF
        if k >= w and a.dtype.kind == "u":
            return np.zeros_like(a)
        return a >> a.dtype.type(min(k, w - 1))
    n = _u32(n)
    shifted = a >> np.minimum(n, w - 1).astype(a.dtype)
    if a.dtype.kind == "i":
        return shifted  # a >> (w - 1) is already the sign fill
    return np.where(n >= w, 0, shifted).astype(a.dtype)


def shf(a, b, c, left: bool, clamp: bool) -> np.ndarray:
    """shf.{l,r}.{clamp,wrap}.b32: funnel shift of the 64-bit value b:a."""
    c = _u32(c)
    n = np.minimum(c, 32) if clamp else c & np.uint32(31)
    v = (_u32(b).astype(np.uint64) << np.uint64(32)) | _u32(a).astype(np.uint64)
    n = n.astype(np.uint64)
    out = (v << n) >> np.uint64(32) if left else v >> n
    return (out & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def cnot(a: np.ndarray) -> np.ndarray:
    """cnot: 1 where a == 0, else 0 (C logical not)."""
    return (a == 0).astype(a.dtype)


def lop3(a, b, c, lut: int) -> np.ndarray:
    """lop3.b32: the Boolean function whose truth table is immLut over (a, b, c) = (0xF0, 0xCC, 0xAA)."""
    lut &= 0xFF
    if lut == 0xFF:
        return ~np.zeros_like(a)
    out = np.zeros_like(a)
    for minterm in range(8):
        if lut >> minterm & 1:
            out |= ((a if minterm & 4 else ~a) & (b if minterm & 2 else ~b) & (c if minterm & 1 else ~c))
    return out


def popc(a: np.ndarray) -> np.ndarray:
    """popc.b{32,64} -> uint32."""
    return np.bitwise_count(_u(a)).astype(np.uint32)


def clz(a: np.ndarray) -> np.ndarray:
    """clz.b{32,64} -> uint32 (0..width)."""
    x = _u(a).copy()
    shift = 1
    while shift < _width(a):  # smear the leading one down
        x |= x >> x.dtype.type(shift)
        shift *= 2
    return (_width(a) - np.bitwise_count(x).astype(np.int64)).astype(np.uint32)


def brev(a: np.ndarray) -> np.ndarray:
    """brev.b{32,64}: bit reversal."""
    x = np.ascontiguousarray(_u(a))
    rev = _BYTE_REVERSED[x.view(np.uint8).reshape(-1, x.dtype.itemsize)[:, ::-1]]
    return np.ascontiguousarray(rev).view(x.dtype).reshape(x.shape).view(a.dtype)


def bfind(a: np.ndarray, shiftamt: bool = False) -> np.ndarray:
    """bfind{.shiftamt}.{u,s}{32,64}: position of the most significant non-sign bit, 0xffffffff
    if none; .shiftamt: the left shift that brings it to the msb."""
    x = np.where(a < 0, ~a, a) if a.dtype.kind == "i" else a
    lead = clz(x).astype(np.int64)
    found = lead < _width(a)
    d = lead if shiftamt else _width(a) - 1 - lead
    return np.where(found, d, 0xFFFFFFFF).astype(np.uint32)


def _low_mask(k: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Masks of the k lowest bits (0 <= k <= width) in an unsigned dtype."""
    w = dtype.itemsize * 8
    one = dtype.type(1)
    part = (one << np.minimum(k, w - 1).astype(dtype)) - one
    return np.where(k >= w, ~dtype.type(0), part).astype(dtype)


def bfe(a: np.ndarray, pos, length) -> np.ndarray:
    """bfe.{u,s}{32,64}: extract length bits from pos, zero- or sign-extended (8-bit pos/len)."""
    w, ud = _width(a), np.dtype(f"u{a.dtype.itemsize}")
    pos, length = (_u32(pos) & 0xFF).astype(np.int64), (_u32(length) & 0xFF).astype(np.int64)
    ua = _u(a)
    inside = np.clip(np.minimum(length, w - pos), 0, w)  # field bits that come from a
    field = (ua >> np.minimum(pos, w - 1).astype(ud)) & _low_mask(inside, ud)
    field = np.where(pos >= w, 0, field).astype(ud)
    if a.dtype.kind == "u":
        return field.view(a.dtype)
    top = np.minimum(pos + length - 1, w - 1)
    sbit = (length > 0) & (((ua >> np.maximum(top, 0).astype(ud)) & ud.type(1)) == 1)
    return np.where(sbit, field | ~_low_mask(inside, ud), field).astype(ud).view(a.dtype)


def bfi(f: np.ndarray, b: np.ndarray, pos, length) -> np.ndarray:
    """bfi.b{32,64}: insert the length low bits of f into b at pos (8-bit pos/len)."""
    w, ud = _width(b), np.dtype(f"u{b.dtype.itemsize}")
    if np.ndim(pos) == 0 and np.ndim(length) == 0:  # immediates: one mask for all lanes
        p, k = int(pos) & 0xFF, int(length) & 0xFF
        if p >= w or k == 0:
            return b.copy()
        mask = ud.type(((1 << min(k, w - p)) - 1) << p)
        return ((_u(b) & ~mask) | ((_u(f) << ud.type(p)) & mask)).view(b.dtype)
    pos, length = (_u32(pos) & 0xFF).astype(np.int64), (_u32(length) & 0xFF).astype(np.int64)
    inside = np.clip(np.minimum(length, w - pos), 0, w)
    sh = np.minimum(pos, w - 1).astype(ud)
    mask = np.where(pos >= w, 0, _low_mask(inside, ud) << sh).astype(ud)
    return ((_u(b) & ~mask) | ((_u(f) << sh) & mask)).view(b.dtype)


def prmt(a, b, c, mode: str | None = None) -> np.ndarray:
    """prmt.b32{.mode}: pick four bytes of b:a (bytes 0-3 from a, 4-7 from b)."""
    src = ((_u32(b).astype(np.uint64) << np.uint64(32)) | _u32(a)).view(np.uint8).reshape(-1, 8)
    c = _u32(c).reshape(-1)
    if mode is None:
        sel = (c[:, None] >> (4 * np.arange(4, dtype=np.uint32))) & np.uint32(0xF)  # [n, 4]
        picked = np.take_along_axis(src, (sel & np.uint32(7)).astype(np.intp), axis=1)
        picked = np.where(sel & np.uint32(8), np.where(picked & 0x80, 0xFF, 0), picked).astype(np.uint8)
    else:
        table = np.array(PRMT_MODES[mode], np.intp)  # [4 selectors, 4 bytes]
        picked = np.take_along_axis(src, table[c & np.uint32(3)], axis=1)
    return np.ascontiguousarray(picked).view(np.uint32).reshape(np.shape(a))


def fns(mask, base, offset) -> np.ndarray:
    """fns.b32: position of the |offset|-th set bit of mask counting from base, upward for
    offset > 0 and downward for offset < 0 (offset 0: base itself if set); 0xffffffff if none.
    A base above 31 (PTX: undefined) finds nothing, as PTX's pseudo-code reads (its loop runs
    while 0 <= pos < 32) and as the H200 answers: 0xffffffff for every base in 32..70 with
    offsets 0..70 (fa_sim/calibrate/alu_probe.py)."""
    base_in = _u32(base).reshape(-1)
    mask, base = _u32(mask).reshape(-1), (base_in & 31).astype(np.int64)
    offset = np.broadcast_to(np.asarray(offset).astype(np.int64).reshape(-1), base.shape)
    pos = np.arange(32)
    bit = ((mask[:, None] >> pos.astype(np.uint32)) & 1).astype(bool)  # [n, 32]
    up = offset[:, None] > 0
    eligible = bit & np.where(up, pos >= base[:, None], pos <= base[:, None])
    count = np.where(up, np.cumsum(eligible, axis=1), np.cumsum(eligible[:, ::-1], axis=1)[:, ::-1])
    hit = eligible & (count == np.abs(offset)[:, None])
    out = np.where(hit.any(axis=1), np.argmax(hit, axis=1), 0xFFFFFFFF)  # at most one hit
    zero = offset == 0
    at_base = bit[np.arange(bit.shape[0]), base]
    out = np.where(zero, np.where(at_base, base, 0xFFFFFFFF), out)
    return np.where(base_in > 31, 0xFFFFFFFF, out).astype(np.uint32)


def szext(a, n, clamp: bool, signed: bool) -> np.ndarray:
    """szext.{clamp,wrap}.{s32,u32}: sign- or zero-extend the low n bits of a."""
    n = _u32(n)
    n1 = (n & np.uint32(31)).astype(np.int64)
    too_large = (n >= 32) & clamp
    keep = np.where(too_large, ~np.uint32(0), _low_mask(n1, np.dtype(np.uint32)))
    ua = _u32(np.asarray(a).view(np.uint32))
    sign = signed & (n1 > 0) & ~too_large & (((ua >> ((n1 - 1) & 31).astype(np.uint32)) & 1) == 1)
    out = np.where(sign, ua | ~keep, ua & keep).astype(np.uint32)
    return out.view(np.int32) if signed else out


def bmsk(a, b, clamp: bool) -> np.ndarray:
    """bmsk.{clamp,wrap}.b32: b ones starting at bit a."""
    a, b = _u32(a), _u32(b)
    a1, b1 = (a & 31).astype(np.int64), (b & 31).astype(np.int64)
    ones = ~np.uint32(0)
    mask0 = np.where(clamp & (a >= 32), 0, ones << a1.astype(np.uint32)).astype(np.uint32)
    total = a1 + b1
    zero_mask1 = (total >= 32) | (clamp & ((a >= 32) | (b >= 32)))
    mask1 = np.where(zero_mask1, 0, np.where(b1 == 0, ones, ones << np.minimum(total, 31).astype(np.uint32)))
    return (mask0 & ~mask1.astype(np.uint32)).astype(np.uint32)
