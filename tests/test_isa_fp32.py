"""fa_sim.isa.fp32: fma.rn.f32 rounds once; ex2.approx.ftz's flush-to-zero behaviour."""

from fractions import Fraction

import numpy as np
from hypothesis import given, settings, strategies as st

from fa_sim.isa.fp32 import LOG2E, ex2_approx_ftz, fma_rn, scale_log2

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False, min_value=-2.0 ** 60, max_value=2.0 ** 60)


def _round_f32_exact(x: Fraction) -> np.float32:
    """Correct round-to-nearest-even of a rational to fp32, by bracketing with float32 neighbours."""
    lo = np.float32(float(x))  # within an ulp or two; walk to the bracketing pair
    while Fraction(float(lo)) > x:
        lo = np.nextafter(lo, np.float32(-np.inf))
    while Fraction(float(np.nextafter(lo, np.float32(np.inf)))) <= x:
        lo = np.nextafter(lo, np.float32(np.inf))
    hi = np.nextafter(lo, np.float32(np.inf))
    dl, dh = x - Fraction(float(lo)), Fraction(float(hi)) - x
    if dl != dh:
        return lo if dl < dh else hi
    return lo if (lo.view(np.int32) & 1) == 0 else hi


@settings(max_examples=400, deadline=None, derandomize=True)
@given(f32, f32, f32)
def test_fma_rounds_once(a, b, c):
    a, b, c = np.float32(a), np.float32(b), np.float32(c)
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    got = fma_rn(a, b, c)
    if not np.isfinite(got):
        return
    want = _round_f32_exact(exact)
    assert got.view(np.uint32) == want.view(np.uint32) or (got == 0 and want == 0)


def test_fma_is_not_fooled_by_double_rounding():
    # a*b = 1 + 2^-11 + 2^-24 is exactly the midpoint of two fp32 neighbours; c = 2^-80 tips it up.
    # A float64 sum rounds the tip away and then ties to even (down); one rounding goes up.
    a = b = np.float32(1 + 2.0 ** -12)
    c = np.float32(2.0 ** -80)
    up = np.float32(1 + 2.0 ** -11 + 2.0 ** -23)
    assert np.float32(a.astype(np.float64) * b + c) != up  # the naive emulation is wrong here
    assert fma_rn(a, b, c) == up
    assert fma_rn(a, b, -c) == np.float32(1 + 2.0 ** -11)


def test_ex2_flushes_subnormals():
    assert ex2_approx_ftz(np.float32(-127.5)) == 0  # 2^-127.5 is subnormal -> +0
    assert ex2_approx_ftz(np.float32(1e-40)) == 1  # subnormal input reads as 0
    assert ex2_approx_ftz(np.float32(-np.inf)) == 0
    assert ex2_approx_ftz(np.float32(3)) == 8
    np.testing.assert_array_equal(ex2_approx_ftz(np.array([0, -1, -2], np.float32)), [1, 0.5, 0.25])


def test_scale_log2_is_the_kernels_fp32_product():
    assert LOG2E.view(np.uint32) == 0x3FB8AA3B
    assert scale_log2(0.125) == np.float32(np.float32(0.125) * LOG2E)
