"""fa2_fwd.cu's softcap tanh (tanh_ex2) on the simulator's models against float64 tanh, on all
2^32 fp32 arguments: the measurement behind fa_sim.reference.TANH_ABS_ERR.

    python experiments/softcap_tanh_exhaustive.py      # about 7 CPU minutes on the development machine

The kernel's argument is x = 2 log2(e) y (softcap_mul carries the factor), and tanh y is
1 - 2 / (1 + e) with e = ex2.approx.ftz(x), rcp.approx.ftz and one fma.rn. Its reference is
float64 tanh(x / (2 log2 e)) of the fp32 x. Prints the largest absolute error, where it is,
and checks the far ends (+-1 exactly for |y| > 45) and NaN; exit status 1 when the error exceeds
TANH_ABS_ERR or an end is wrong. tests/test_features.py checks a sample that holds the arg-max.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fa_sim.isa import mufu  # noqa: E402
from fa_sim.reference import TANH_ABS_ERR  # noqa: E402

BLOCK = 1 << 22
TWO_LOG2E = 2.0 / np.log(2.0)  # the float64 factor that takes y to x


def tanh_ex2(x: np.ndarray) -> np.ndarray:
    """The kernel's tanh_ex2 on float32 x: fma.rn(-2, rcp.approx.ftz(1 + ex2.approx.ftz(x)), 1)."""
    r = mufu.rcp(np.float32(1) + mufu.ex2(x))
    return (np.float64(-2) * r.astype(np.float64) + 1.0).astype(np.float32)  # the product is exact: one rounding


def main() -> int:
    t0, worst, at, bad_ends = time.time(), 0.0, 0, 0
    with np.errstate(all="ignore"):
        for start in range(0, 1 << 32, BLOCK):
            x = np.arange(start, start + BLOCK, dtype=np.uint64).astype(np.uint32).view(np.float32)
            got = tanh_ex2(x)
            y = x.astype(np.float64) / TWO_LOG2E
            nan = np.isnan(x)
            bad_ends += int(np.count_nonzero(nan & ~np.isnan(got)))
            far = ~nan & (np.abs(y) > 45)
            bad_ends += int(np.count_nonzero(far & (got != np.sign(y))))
            err = np.where(nan, 0.0, np.abs(got.astype(np.float64) - np.tanh(y)))
            i = int(err.argmax())
            if err[i] > worst:
                worst, at = float(err[i]), start + i
    xa = np.uint32(at).view(np.float32)
    print(f"all 2^32 inputs: max abs error {worst:.4g} ({worst / 2.0**-22:.3f} x 2^-22) at x = {xa!r} "
          f"(bits {at:#010x}, y = {xa / TWO_LOG2E:.9g}); {bad_ends} wrong at NaN or |y| > 45 ({time.time() - t0:.0f} s)")
    return 1 if worst > TANH_ABS_ERR or bad_ends else 0


if __name__ == "__main__":
    sys.exit(main())
