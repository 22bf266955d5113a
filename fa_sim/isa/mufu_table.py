"""The interpolator inside the H200's MUFU: tables, the truncated squarer, truncation to 24 bits.

Shared by fa_sim/isa/mufu.py (the ops) and fa_sim/calibrate/sfu_fit.py (which fits the tables from the
run-1 measurements, issue 10). One table per function: a 23-bit fraction f = [s | xl] selects
segment s (its top bits) and the unit computes the integer

    Q = C0[s] + C1[s] * xl + C2[s] * sq(xl)          (value Q * 2^-sum_bits)

exactly, where sq is a folded squarer of xl that sums only the top SQ_KEEP of its 2 * xl_bits
columns (Oberman and Siu, ARITH-17 2005: table lookup, quadratic interpolation, truncated
squarer). Q is then truncated, never rounded (`rz24`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA = Path(__file__).with_name("mufu_data") / "mufu_tables.json"
FRAC_BITS = 23
MASK23 = (1 << FRAC_BITS) - 1
SQ_KEEP = 15  # squarer columns that reach the sum (measured: the dropped cross terms of ex2/rcp/rsqrt/lg2/sin)


def squarer(nx: int) -> np.ndarray:
    """sq(xl) for every nx-bit xl: the folded partial-product array of xl * xl (x_i at column 2i,
    x_i x_j for i < j at column i + j + 1) summed over its top SQ_KEEP columns only, in units of
    the lowest kept column."""
    xl = np.arange(1 << nx, dtype=np.int64)
    cut = 2 * nx - SQ_KEEP
    bits = [(xl >> i) & 1 for i in range(nx)]
    acc = np.zeros_like(xl)
    for i in range(nx):
        if 2 * i >= cut:
            acc += bits[i] << (2 * i)
        for j in range(max(i + 1, cut - i - 1), nx):
            acc += (bits[i] & bits[j]) << (i + j + 1)
    return acc >> cut


@functools.cache
def squarer_table(nx: int) -> np.ndarray:
    return squarer(nx)


@dataclass(frozen=True)
class Table:
    """One function's interpolator: rows of (C0, C1, C2), Q at 2^-sum_bits."""
    op: str
    xl_bits: int
    sum_bits: int
    c0: np.ndarray  # [segments] int64
    c1: np.ndarray  # [segments] int64
    c2: np.ndarray  # [segments] int64

    def fixed(self, seg: np.ndarray, xl: np.ndarray) -> np.ndarray:
        """Q for segment indices and xl values (int64 arrays of one shape)."""
        return self.c0[seg] + self.c1[seg] * xl + self.c2[seg] * squarer_table(self.xl_bits)[xl]

    def at(self, f: np.ndarray, extra: np.ndarray | int = 0) -> np.ndarray:
        """Q for 23-bit fractions f; `extra` selects a second bank of segments (rsqrt/sqrt octave)."""
        seg = (f >> self.xl_bits) + (np.asarray(extra, dtype=np.int64) << (FRAC_BITS - self.xl_bits))
        return self.fixed(seg, f & ((1 << self.xl_bits) - 1))

    def rows(self) -> list[list[int]]:
        return np.stack([self.c0, self.c1, self.c2], axis=1).tolist()


def load(path: Path = DATA) -> dict[str, Table]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: MUFU tables missing (written by fa_sim/calibrate/sfu_fit.py)")
    doc = json.loads(path.read_text())
    out = {}
    for op, t in doc["tables"].items():
        rows = np.asarray(t["rows"], dtype=np.int64).reshape(-1, 3)
        out[op] = Table(op, int(t["xl_bits"]), int(t["sum_bits"]),
                        *(np.ascontiguousarray(rows[:, k]) for k in range(3)))
    return out


@functools.cache
def tables() -> dict[str, Table]:
    """The shipped tables (mufu_data/mufu_tables.json)."""
    return load()


def bit_length(q: np.ndarray) -> np.ndarray:
    """Bit length of non-negative int64 values (0 for 0), exact for q < 2^62."""
    top = np.frexp(q.astype(np.float64))[1].astype(np.int64)
    # float64 rounds q just below a power of two up to it: frexp then reports one bit too many
    return top - ((q >> np.maximum(top - 1, 0)) == 0) * (q > 0)


def rz24(q: np.ndarray) -> np.ndarray:
    """Non-negative int64 values truncated toward zero to 24 significant bits (same scale)."""
    shift = np.maximum(bit_length(q) - 24, 0)
    return (q >> shift) << shift


def pack(sig: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """fp32 bits (int64) of sig * 2^(exp - 23) for sig in [2^23, 2^24] (2^24 carries into the
    exponent): +0 below 2^-126 (flush to zero), +inf above the largest finite value."""
    bits = ((exp + 127) << 23) + (sig - (1 << 23))
    bits = np.where(bits < 0x00800000, 0, bits)
    return np.minimum(bits, 0x7F800000)
