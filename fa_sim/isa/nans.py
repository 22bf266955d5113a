"""The NaN bit patterns the GPU writes where PTX leaves them open, as measured on the H200.

PTX anchors: `#floating-point-instructions` ("NaN payloads are supported for double-precision
instructions"; an f32 NaN result is "unspecified"), `#half-precision-floating-point-instructions`,
`#data-movement-and-conversion-instructions-cvt`.

Source of every rule: fa_sim/calibrate/alu_probe.py on the H200 (the recording is
tests/data/h200/alu_probe.npz, replayed by tests/test_alu_replay.py), read with the SASS that
ptxas 13.0 emits for sm_90 (fa_sim.contract.sass):
- f32, f16 and bf16 arithmetic, abs and neg included, writes the canonical NaN (0x7fffffff,
  0x7fff; fa_sim.isa.rounding): abs.f32 is `FADD |a|, -RZ`, neg.f16x2 `HADD2 -a, -RZ`, abs.bf16
  `HFMA2.BF16 -RZ, RZ, |a|`.
- f64 arithmetic (`DADD DMUL DFMA`, min/max as `DSETP.MIN` + `SEL`, abs/neg as `DADD -RZ, |a|`)
  returns a NaN operand with its payload and sign, quieted (bit 51 set). With several NaN
  operands the one in PTX's b slot wins, then a (`DADD R, Ra, Rb`: b's NaN). sub's b is not
  negated (`DADD Ra, -Rb` leaves a NaN's sign alone). An invalid operation on non-NaN operands
  writes 0xfff8000000000000. div, rcp and sqrt.f64 (software sequences) prefer a over b.
- fma.f64 (DFMA): b's NaN, then c's, then a's (the probe forms `fma.rn/.rm.f64 $d, $a, $c, $b`:
  with NaNs in a and c, c's is returned).
"""

from __future__ import annotations

import numpy as np

#: The NaN an invalid f64 operation writes (inf - inf, 0 * inf, sqrt(-1), 0 / 0): measured.
F64_DEFAULT_NAN = np.uint64(0xFFF8000000000000)
_QUIET_F64 = np.uint64(1 << 51)


def f64_nan(r, *by_priority) -> np.ndarray:
    """r (float64) with every NaN lane replaced by the GPU's NaN: the first NaN among the
    operands `by_priority`, quieted, sign and payload kept; F64_DEFAULT_NAN where none is NaN.

    Callers list the operands in the order of precedence measured for their instruction (see the
    module docstring). A lane whose r is a number is left alone (min/max of one NaN)."""
    r = np.asarray(r, np.float64)
    nan = np.isnan(r)
    if not nan.any():
        return r
    out = np.full(r.shape, F64_DEFAULT_NAN)
    for x in reversed(by_priority):  # the first operand is applied last and so wins
        xb = np.broadcast_to(np.asarray(x, np.float64), r.shape).view(np.uint64)
        out = np.where(np.isnan(xb.view(np.float64)), xb | _QUIET_F64, out)
    return np.where(nan, out.view(np.float64), r)
