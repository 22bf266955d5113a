"""Comparison and Boolean combination for setp, set, and friends.

PTX anchors: `#comparison-and-selection-instructions-setp` (CmpOp, BoolOp, `p|q` destinations),
`#comparison-and-selection-instructions-set`, `#half-precision-comparison-instructions-setp`.

Integer comparisons take the signedness of the operands' dtype; `lo ls hi hs` always compare
unsigned. Float comparisons: the ordered operators are false when either operand is NaN, the
unordered ones (`equ` ...) true; `num` and `nan` test for NaN.
"""

from __future__ import annotations

import enum
import operator

import numpy as np


class CmpOp(enum.Enum):
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LO = "lo"
    LS = "ls"
    HI = "hi"
    HS = "hs"
    EQU = "equ"
    NEU = "neu"
    LTU = "ltu"
    LEU = "leu"
    GTU = "gtu"
    GEU = "geu"
    NUM = "num"
    NAN = "nan"


class BoolOp(enum.Enum):
    AND = "and"
    OR = "or"
    XOR = "xor"


_ORDERED = {CmpOp.EQ: operator.eq, CmpOp.NE: operator.ne, CmpOp.LT: operator.lt,
            CmpOp.LE: operator.le, CmpOp.GT: operator.gt, CmpOp.GE: operator.ge}
_UNSIGNED = {CmpOp.LO: CmpOp.LT, CmpOp.LS: CmpOp.LE, CmpOp.HI: CmpOp.GT, CmpOp.HS: CmpOp.GE}
_UNORDERED = {CmpOp.EQU: CmpOp.EQ, CmpOp.NEU: CmpOp.NE, CmpOp.LTU: CmpOp.LT, CmpOp.LEU: CmpOp.LE,
              CmpOp.GTU: CmpOp.GT, CmpOp.GEU: CmpOp.GE}
FLOAT_ONLY = frozenset(_UNORDERED) | {CmpOp.NUM, CmpOp.NAN}
INTEGER_ONLY = frozenset(_UNSIGNED)


def _unsigned(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype.kind == "i" else x


def compare_int(op: CmpOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[n] bool: a CmpOp b for integer arrays of one dtype."""
    if op in _UNSIGNED:
        return _ORDERED[_UNSIGNED[op]](_unsigned(a), _unsigned(b))
    if op not in _ORDERED:
        raise ValueError(f"comparison .{op.value} applies to floating-point operands only")
    return _ORDERED[op](a, b)


def compare_float(op: CmpOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[n] bool: a CmpOp b for float arrays (NaN rules of PTX)."""
    if op in INTEGER_ONLY:
        raise ValueError(f"comparison .{op.value} applies to unsigned integers only")
    with np.errstate(invalid="ignore"):
        if op is CmpOp.NUM:
            return ~(np.isnan(a) | np.isnan(b))
        if op is CmpOp.NAN:
            return np.isnan(a) | np.isnan(b)
        if op in _UNORDERED:
            return _ORDERED[_UNORDERED[op]](a, b) | np.isnan(a) | np.isnan(b)
        t = _ORDERED[op](a, b)
        return t & ~(np.isnan(a) | np.isnan(b)) if op is CmpOp.NE else t


def combine(t: np.ndarray, op: BoolOp | None, c: np.ndarray | None) -> np.ndarray:
    """BoolOp(t, c) (setp's fourth operand); t unchanged without a BoolOp."""
    if op is None:
        return t
    if op is BoolOp.AND:
        return t & c
    if op is BoolOp.OR:
        return t | c
    return t ^ c


def select(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.where(mask, a, b) for arrays of one dtype, bits copied unchanged. Done with bit
    operations: np.where with an irregular mask is about ten times slower (branch misses)."""
    a = np.asarray(a)
    b = np.asarray(b, a.dtype)
    u = np.dtype(f"u{a.dtype.itemsize}")
    ones = u.type(0) - np.asarray(mask, bool).view(np.uint8).astype(u)  # 0 or all ones
    ua, ub = a.view(u), b.view(u)
    return (ub ^ ((ua ^ ub) & ones)).view(a.dtype)
