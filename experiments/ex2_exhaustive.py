"""MUFU.EX2's numpy kernel (fa_sim.isa.mufu.ex2, ftz) against the interpolator's integer formula
(fa_sim.isa.mufu_table) on all 2^32 fp32 inputs, bit for bit.

    python experiments/ex2_exhaustive.py            # about 6 CPU minutes on the development machine

tests/test_mufu.py checks the same on the first octave and 200,000 random inputs; this is the
exhaustive form for a change to the kernel. The reference: x's fixed point |x| 2^23 truncated
(saturated beyond 255), ones' complement of the fraction for negative x (an exact power of two
when the fraction is 0), Q = C0 + C1 xl + C2 sq(xl) truncated to 24 bits, the exponent packed
with flush to zero and saturation to inf; NaN gives 0x7fffffff.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fa_sim.isa import mufu, mufu_table as mt  # noqa: E402

BLOCK = 1 << 22


def reference(x: np.ndarray) -> np.ndarray:
    """ex2.approx.ftz.f32 bits from the integer formula (the kernel's specification)."""
    fix = (np.minimum(np.abs(x), np.float32(255)).astype(np.float64) * 2.0**23).astype(np.int64)
    fix = np.where(x < 0, ~fix + ((fix & mt.MASK23) == 0), fix)
    bits = mt.pack(mt.tables()["ex2"].at(fix & mt.MASK23) >> 15, fix >> 23)
    return np.where(np.isnan(x), 0x7FFFFFFF, bits).astype(np.uint32)


def main() -> int:
    t0, bad = time.time(), 0
    with np.errstate(all="ignore"):
        for start in range(0, 1 << 32, BLOCK):
            x = np.arange(start, start + BLOCK, dtype=np.uint64).astype(np.uint32).view(np.float32)
            diff = np.flatnonzero(mufu.ex2(x).view(np.uint32) != reference(x))
            if diff.size:
                bad += diff.size
                print(f"{diff.size} differ in block {start:#010x}, first input {int(x.view(np.uint32)[diff[0]]):#010x}")
    print(f"all 2^32 inputs: {bad} differ ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
