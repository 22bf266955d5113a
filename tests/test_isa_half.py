"""isa.half: f16 / bf16 arithmetic on raw 16-bit patterns (#half-precision-floating-point-
instructions). Oracles: numpy float16 arithmetic for f16 add/sub/mul (numpy computes them in
float32 and rounds once more, which is exact rounding since 24 >= 2 * 11 + 2), fractions.Fraction
(tests/fp_oracle.py) for fma and for bf16."""

import math

import numpy as np
from hypothesis import given, settings, strategies as st

import fp_oracle as ref
from fa_sim.isa import half as H
from fa_sim.isa.rounding import BF16, F16

FIXED = settings(derandomize=True, database=None, deadline=None, max_examples=150)
HALF_SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
                0x7C00, 0xFC00, 0x7E00, 0x3555, 0x7F80, 0xFF80, 0x0080, 0x007F, 0x3F80]


def bits16():
    return st.one_of(st.sampled_from(HALF_SPECIAL), st.integers(0, 0xFFFF))


def rows(n=3):
    return st.lists(st.tuples(*[bits16()] * n), min_size=1, max_size=32)


def cols(rs):
    return [np.array([r[i] for r in rs], np.uint16) for i in range(len(rs[0]))]


def value(b: int, fmt) -> float:
    return float(H.to_f64(np.array([b], np.uint16), fmt)[0])


def check(got_bits, want_values, fmt, what):
    got = H.to_f64(got_bits, fmt)
    for i, (g, w) in enumerate(zip(got.tolist(), want_values)):
        assert ref.same(g, w), f"{what} lane {i}: got {g!r}, want {w!r}"
        if math.isnan(g):
            assert int(got_bits[i]) == 0x7FFF, f"{what}: NaN results are the canonical 0x7fff"


@FIXED
@given(rows(2))
def test_f16_add_sub_mul_match_numpy_float16(rs):
    a, b = cols(rs)
    fa, fb = a.view(np.float16), b.view(np.float16)
    with np.errstate(all="ignore"):
        for name, got, want in (("add", H.add(a, b, F16), fa + fb), ("sub", H.sub(a, b, F16), fa - fb),
                                ("mul", H.mul(a, b, F16), fa * fb)):
            check(got, want.astype(np.float64).tolist(), F16, f"{name}.f16")


@FIXED
@given(rows(3), st.sampled_from([F16, BF16]))
def test_fma_and_bf16_round_once(rs, fmt):
    a, b, c = cols(rs)
    rfmt = ref.F16 if fmt is F16 else ref.BF16
    vals = [[value(x, fmt) for x in r] for r in rs]
    check(H.fma(a, b, c, fmt), [ref.fma(x, y, z, rfmt, "rn") for x, y, z in vals], fmt, "fma.rn")
    check(H.add(a, b, fmt), [ref.add(x, y, rfmt, "rn") for x, y, _ in vals], fmt, "add.rn")
    check(H.mul(a, b, fmt), [ref.mul(x, y, rfmt, "rn") for x, y, _ in vals], fmt, "mul.rn")


@FIXED
@given(rows(3))
def test_f16_ftz_sat_relu(rs):
    a, b, c = cols(rs)
    vals = [[ref.flush(value(x, F16), ref.F16) for x in r] for r in rs]
    want = [ref.flush(ref.fma(x, y, z, ref.F16, "rn"), ref.F16) for x, y, z in vals]
    check(H.fma(a, b, c, F16, ftz=True), want, F16, "fma.rn.ftz.f16")
    sat = [0.0 if math.isnan(w) else min(max(w, 0.0), 1.0) for w in want]
    check(H.fma(a, b, c, F16, ftz=True, sat=True), [abs(s) for s in sat], F16, "fma.rn.ftz.sat.f16")
    # .relu: negatives and -0 -> +0 (H200: fma.rn.ftz.relu.f16x2, tests/data/h200/alu_probe.npz)
    relu = [w if math.isnan(w) or w > 0 else 0.0 for w in want]
    check(H.fma(a, b, c, F16, ftz=True, relu=True), relu, F16, "fma.rn.ftz.relu.f16")


def test_min_max_table():
    # #half-precision-floating-point-instructions-min: a NaN operand gives the other one, two NaNs
    # (or any NaN with .NaN) the canonical NaN; +0.0 > -0.0.
    nan, one, two, pz, nz = 0x7E00, 0x3C00, 0x4000, 0x0000, 0x8000
    a = np.array([one, nan, nan, pz, nz, 0xC000], np.uint16)
    b = np.array([two, two, nan, nz, pz, one], np.uint16)
    assert H.min_(a, b, F16).tolist() == [one, two, 0x7FFF, nz, nz, 0xC000]
    assert H.max_(a, b, F16).tolist() == [two, two, 0x7FFF, pz, pz, one]
    assert H.min_(a, b, F16, propagate_nan=True).tolist()[:3] == [one, 0x7FFF, 0x7FFF]
    # .xorsign.abs: |min| with the XOR of the signs: min(|-2|, |1|) = 1, sign negative.
    assert H.min_(a[5:], b[5:], F16, xorsign_abs=True).tolist() == [0xBC00]
    assert H.max_(np.array([0xC000], np.uint16), np.array([0x3F80], np.uint16), BF16).tolist() == [0x3F80]


def test_neg_abs_flip_the_sign_bit_and_canonicalize_nan():
    # A NaN becomes 0x7fff: the H200 (neg.f16x2, abs.ftz.f16x2, neg.bf16x2 in alu_probe.npz).
    a = np.array([0x3C00, 0x8000, 0x7E01, 0x0001, 0xFC01], np.uint16)
    assert H.neg(a, F16).tolist() == [0xBC00, 0x0000, 0x7FFF, 0x8001, 0x7FFF]
    assert H.abs_(np.array([0xBC00, 0x8001, 0xFFC1], np.uint16), F16).tolist() == [0x3C00, 0x0001, 0x7FFF]
    assert H.neg(np.array([0x3F80, 0xFF81], np.uint16), BF16).tolist() == [0xBF80, 0x7FFF]
    assert H.neg(a, F16, ftz=True).tolist()[3] == 0x8000  # the subnormal flushed, then negated


def test_pack_order():
    # #packed-floating-point-data-types: element 0 of an x2 register is bits 0..15.
    lo, hi = H.unpack_x2(np.array([0xBC003C00], np.uint32))
    assert (int(lo[0]), int(hi[0])) == (0x3C00, 0xBC00)
    assert int(H.pack_x2(lo, hi)[0]) == 0xBC003C00
