"""isa.convert: cvt's rounding, clamping and NaN rules (#data-movement-and-conversion-instructions-cvt)
against Python integers and fractions.Fraction (tests/fp_oracle.py)."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fp_oracle as ref
from fa_sim.isa import convert as C
from fa_sim.isa.rounding import BF16, F16, F32, F64, TF32, Rnd

FIXED = settings(derandomize=True, database=None, deadline=None, max_examples=120)
RND = {"rn": Rnd.RN, "rz": Rnd.RZ, "rm": Rnd.RM, "rp": Rnd.RP}
INT_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


def f32_values():
    bits = st.integers(0, 2 ** 32 - 1).map(lambda b: float(np.array(b, np.uint32).view(np.float32)))
    return st.one_of(bits, st.floats(width=32), st.sampled_from([0.5, 1.5, 2.5, -2.5, -0.5, 2.0 ** 31,
                                                                 -(2.0 ** 31), 2.0 ** 32, 2.0 ** 63, 2.0 ** 64]))


def f64_values():
    bits = st.integers(0, 2 ** 64 - 1).map(lambda b: float(np.array(b, np.uint64).view(np.float64)))
    return st.one_of(bits, st.floats(), st.floats(-2.0 ** 66, 2.0 ** 66))


def round_int(x: float, mode: str) -> int:
    q = Fraction(x)
    if mode == "rn":
        return round(q)  # Python rounds half to even
    return {"rz": math.trunc, "rm": math.floor, "rp": math.ceil}[mode](q)


@pytest.mark.parametrize("dt", INT_TYPES)
@FIXED
@given(data=st.data())
def test_float_to_int_rounds_clamps_and_maps_nan(dt, data):
    src = data.draw(st.sampled_from([F32, F64]))
    xs = data.draw(st.lists(f32_values() if src is F32 else f64_values(), min_size=1, max_size=24))
    mode = data.draw(st.sampled_from(list(RND)))
    info = np.iinfo(dt)
    got = C.float_to_int(np.array(xs), src, dt, RND[mode])
    for x, g in zip(xs, got.tolist()):
        if math.isnan(x):  # 0, or 1 << (w - 1) for an .f64 source or a 64-bit destination
            w = np.dtype(dt).itemsize * 8
            want = (1 << (w - 1)) if (src is F64 or w == 64) else 0
            assert g == (want - (1 << w) if info.min < 0 and want else want)
        elif math.isinf(x):
            assert g == (info.max if x > 0 else info.min)
        else:
            assert g == min(max(round_int(x, mode), int(info.min)), int(info.max))


@pytest.mark.parametrize("dt", [np.int32, np.uint32, np.int64, np.uint64])
@FIXED
@given(data=st.data())
def test_int_to_float_rounds_correctly(dt, data):
    info = np.iinfo(dt)
    edges = [v for v in (int(info.max), int(info.min), 2 ** 24 + 1, 2 ** 53 + 1, 2 ** 63 + 2 ** 40 + 1)
             if info.min <= v <= info.max]
    xs = data.draw(st.lists(st.integers(int(info.min), int(info.max)) | st.sampled_from(edges),
                            min_size=1, max_size=24))
    mode = data.draw(st.sampled_from(list(RND)))
    a = np.array(xs, dt)
    if np.dtype(dt).itemsize < 8 and mode == "rn":
        assert np.array_equal(C.int_to_f32_rn(a), C.int_to_float(a, F32, Rnd.RN).astype(np.float32))
    for fmt, rfmt in ((F32, ref.F32), (F64, ref.F64), (F16, ref.F16), (BF16, ref.BF16)):
        got = C.int_to_float(a, fmt, RND[mode])
        for x, g in zip(xs, got.tolist()):
            assert ref.same(g, ref.round_rational(Fraction(x), rfmt, mode)), (x, fmt.name, mode)


@pytest.mark.parametrize("src", INT_TYPES)
@pytest.mark.parametrize("dst", INT_TYPES)
def test_int_to_int_extends_truncates_and_saturates(src, dst):
    si, di = np.iinfo(src), np.iinfo(dst)
    candidates = {0, 1, -1, 2, 300, -300, 70000, -70000, 2 ** 40, int(si.min), int(si.max)}
    xs = sorted(x for x in candidates if si.min <= x <= si.max)
    a = np.array(xs, src)
    w = np.dtype(dst).itemsize * 8
    for x, g, s in zip(xs, C.int_to_int(a, dst).tolist(), C.int_to_int(a, dst, sat=True).tolist()):
        m = x & ((1 << w) - 1)
        assert g == (m - (1 << w) if di.min < 0 and m >> (w - 1) else m)
        assert s == min(max(x, int(di.min)), int(di.max))


def _f16_tie_cases():
    """f32 values around every f16 rounding boundary: ties, just above, just below, all exponents."""
    out = []
    for e in range(-30, 18):
        for m in (0x1000, 0x1001, 0x0FFF, 0x3000, 0x2000, 0x7FFFFF, 0):
            bits = ((e + 127) << 23) | m
            out += [np.array(bits, np.uint32).view(np.float32), -np.array(bits, np.uint32).view(np.float32)]
    return np.array(out, np.float32)


def test_f32_to_f16_fast_path_matches_the_exact_path():
    x = np.concatenate([_f16_tie_cases(), np.float32([np.inf, -np.inf, 65520.0, 65519.99, 2.0 ** -25])])
    fast = C.f32_to_f16_rn(x)
    exact = C.encode(C.float_to_float(C.decode(x, F32), F32, F16, Rnd.RN), F16).view(np.uint16)
    assert (fast == exact).all()
    for xi, bits in zip(x.tolist(), fast.tolist()):
        want = ref.round_rational(Fraction(xi), ref.F16, "rn") if math.isfinite(xi) else xi
        got = float(np.array(bits, np.uint16).view(np.float16))
        assert got == want or (want == 0 and got == 0), xi
    assert C.f32_to_f16_rn(np.float32([np.nan]))[0] == 0x7FFF


def test_f32_to_f16_values_are_the_cast_bit_for_bit():
    """The float32-arithmetic rounding (the program's P~ before the PV GEMM) against the f16 cast:
    every tie and boundary case, both signs, every 97th bit pattern below 2^17, overflow, zeros."""
    wide = np.arange(0, 0x48000000, 97, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([_f16_tie_cases(), wide.view(np.float32), (wide | 0x80000000).view(np.float32),
                        np.float32([np.inf, -np.inf, 65520.0, -65520.0, 65519.99, 65504.0, 3e38, -3e38,
                                    0.0, -0.0, 2.0 ** -25, -2.0 ** -25, 2.0 ** -24 * 1.5, 2.0 ** -126])])
    for part in (x, np.abs(x)):  # with signs, and the non-negative path
        got = C.f32_to_f16_values(part)
        want = C.f32_to_f16_rn(part).view(np.float16).astype(np.float32)
        assert got.dtype == np.float32 and (got.view(np.uint32) == want.view(np.uint32)).all()
    assert C.f32_to_f16_values(np.float32([1.0, np.nan])) is None  # NaN: the caller needs the bits


@FIXED
@given(st.lists(f64_values(), min_size=1, max_size=24), st.sampled_from(list(RND)),
       st.sampled_from([(F32, ref.F32), (F16, ref.F16), (BF16, ref.BF16)]))
def test_narrowing_float_conversions(xs, mode, fmts):
    fmt, rfmt = fmts
    got = C.float_to_float(np.array(xs), F64, fmt, RND[mode])
    for x, g in zip(xs, got.tolist()):
        if not math.isfinite(x):
            assert ref.same(g, x)
        else:
            want = ref.round_rational(Fraction(x), rfmt, mode)
            assert ref.same(g, math.copysign(want, x) if want == 0 else want), (x, mode)


def test_same_size_integral_rounding_and_modifiers():
    x = C.decode(np.float32([2.5, -2.5, 1.5, -0.3, 2.0 ** -130, np.nan]), F32)
    assert C.float_to_float(x, F32, F32, Rnd.RN, integral=True).tolist()[:4] == [2.0, -2.0, 2.0, -0.0]
    assert C.float_to_float(x, F32, F32, Rnd.RM, integral=True).tolist()[:4] == [2.0, -3.0, 1.0, -1.0]
    # .ftz (#data-movement-and-conversion-instructions-cvt): f32 subnormal inputs -> signed zero.
    assert C.float_to_float(x, F32, F32, Rnd.RP, integral=True, ftz=True)[4] == 0
    assert C.float_to_float(x, F32, F32, Rnd.RP, integral=True)[4] == 1
    # .sat: [0, 1], NaN -> +0.
    assert C.float_to_float(x, F32, F32, sat=True).tolist() == [1.0, 0.0, 1.0, 0.0, 2.0 ** -130, 0.0]


def test_relu_and_satfinite():
    x = C.decode(np.float32([-1.0, 70000.0, -np.inf, np.nan, 0.5]), F32)
    relu = C.encode(C.float_to_float(x, F32, F16, Rnd.RN, relu=True), F16)
    assert relu.tolist()[:3] == [0.0, np.inf, 0.0] and relu.view(np.uint16)[3] == 0x7FFF
    sf = C.float_to_float(x, F32, F16, Rnd.RN, satfinite=True)
    assert sf.tolist()[:3] == [-1.0, 65504.0, -65504.0] and math.isnan(sf[3])


def test_tf32_round_to_nearest_away():
    # cvt.rna.tf32.f32: 10 explicit mantissa bits, ties away from zero; low 13 bits zero.
    one = 0x3F800000
    x = np.array([one | 0x1000, one | 0x3000, one | 0x0FFF], np.uint32).view(np.float32)
    v = C.float_to_float(C.decode(x, F32), F32, TF32, Rnd.RNA)
    bits = C.encode(v, TF32)
    assert bits.tolist() == [one | 0x2000, one | 0x4000, one]


def test_widening_is_exact_and_canonicalizes_nan():
    h = np.array([0x0001, 0x7BFF, 0x7E00], np.uint16).view(np.float16)
    v = C.float_to_float(C.decode(h, F16), F16, F32)
    out = C.encode(v, F32)
    assert out.tolist()[:2] == [2.0 ** -24, 65504.0] and out.view(np.uint32)[2] == 0x7FFFFFFF


def test_relu_turns_minus_zero_into_plus_zero():
    # H200 (tests/data/h200/alu_probe.npz): cvt.rn.relu.f16x2.f32 of -0.0 writes 0x0000.
    x = C.decode(np.float32([-0.0, -(2.0 ** -30), 0.0]), F32)
    out = C.encode(C.float_to_float(x, F32, F16, Rnd.RN, relu=True), F16)
    assert out.view(np.uint16).tolist() == [0, 0, 0]


# NaN conversions that keep the payload, rows of the H200 recording (source bits -> GPU bits).
NAN_ROWS = [
    (F64, F32, Rnd.RN, np.uint64, [0x7FF8000000001234, 0xFFF38C18A0788691, 0x7FF0000000000001],
     np.uint32, [0x7FC00000, 0xFFDC60C5, 0x7FC00000]),
    (F64, F32, Rnd.RZ, np.uint64, [0xFFF8000000000001, 0xFFF1A65C0D482E1B], np.uint32, [0xFFC00000, 0xFFCD32E0]),
    (F32, F64, None, np.uint32, [0x7F800001, 0xFFD0F16B], np.uint64, [0x7FF8000020000000, 0xFFFA1E2D60000000]),
    (BF16, F32, None, np.uint16, [0x7FFF, 0xFF8F], np.uint32, [0x7FFF0000, 0xFF8F0000]),  # sNaN kept
    (F32, TF32, Rnd.RNA, np.uint32, [0x7FA59277, 0x7F800001, 0xFFC00001], np.uint32, [0x7FA58000, 0x7F800000, 0xFFC00000]),
    (F16, F32, None, np.uint16, [0x7C01, 0xFE00], np.uint32, [0x7FFFFFFF, 0x7FFFFFFF]),  # canonical
]


@pytest.mark.parametrize("src, dst, rnd, sdt, sbits, ddt, want", NAN_ROWS)
def test_nan_conversion_follows_the_h200(src, dst, rnd, sdt, sbits, ddt, want):
    reg = {F64: np.float64, F32: np.float32, F16: np.float16}
    a = np.array(sbits, sdt)
    a = a.view(reg[src]) if src in reg else a
    with np.errstate(invalid="ignore"):
        out = C.nan_payload(C.encode(C.float_to_float(C.decode(a, src), src, dst, rnd), dst), a, src, dst, rnd)
    assert np.asarray(out).view(ddt).tolist() == want


def test_nan_payload_leaves_sat_results_alone():
    # .sat turns NaN into +0 (#data-movement-and-conversion-instructions-cvt): no NaN lane to patch.
    a = np.array([0x7FF8000000001234], np.uint64).view(np.float64)
    out = C.nan_payload(C.encode(C.float_to_float(C.decode(a, F64), F64, F32, Rnd.RN, sat=True), F32),
                        a, F64, F32, Rnd.RN)
    assert out.view(np.uint32).tolist() == [0]
