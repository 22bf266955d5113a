"""isa.sfu: PTX's special values and error bounds for the MUFU forms. These laws hold for any
model PTX allows, so they stay valid when bit-exact hardware models replace today's
correctly rounded ones (issue 10)."""

import numpy as np
import pytest

from fa_sim.isa import fp32, sfu

INF, NAN = np.inf, np.nan
F = np.float32


def ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in units of the f32 ulp at the exact value."""
    spacing = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


def _same(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok], want[ok]) and np.array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


# Input -> result tables of the PTX ISA, one per instruction (anchor in the id).
TABLES = {
    "ex2 #floating-point-instructions-ex2": (sfu.ex2_approx, [-INF, -0.0, 0.0, INF, NAN], [0.0, 1.0, 1.0, INF, NAN]),
    "lg2 #floating-point-instructions-lg2": (sfu.lg2_approx, [-INF, -2.0, -0.0, 0.0, INF, NAN],
                                             [NAN, NAN, -INF, -INF, INF, NAN]),
    "rcp #floating-point-instructions-rcp": (sfu.rcp_approx, [-INF, -0.0, 0.0, INF, NAN], [-0.0, -INF, INF, 0.0, NAN]),
    "rsqrt #floating-point-instructions-rsqrt": (sfu.rsqrt_approx, [-INF, -2.0, -0.0, 0.0, INF, NAN],
                                                 [NAN, NAN, -INF, INF, 0.0, NAN]),
    "sqrt #floating-point-instructions-sqrt": (sfu.sqrt_approx, [-INF, -2.0, -0.0, 0.0, INF, NAN],
                                               [NAN, NAN, -0.0, 0.0, INF, NAN]),
    "sin #floating-point-instructions-sin": (sfu.sin_approx, [-INF, -0.0, 0.0, INF, NAN], [NAN, -0.0, 0.0, NAN, NAN]),
    "cos #floating-point-instructions-cos": (sfu.cos_approx, [-INF, -0.0, 0.0, INF, NAN], [NAN, 1.0, 1.0, NAN, NAN]),
}


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("ftz", [False, True])
def test_special_value_tables(name, ftz):
    fn, x, want = TABLES[name]
    got = fn(F(x), ftz=ftz)
    _same(got, want)
    assert (got.view(np.uint32)[np.isnan(got)] == 0x7FFFFFFF).all()


def test_tanh_table_and_subnormal_pass_through():
    # #floating-point-instructions-tanh: +-inf -> +-1, +-0 -> +-0; subnormals pass through.
    _same(sfu.tanh_approx(F([-INF, -0.0, 0.0, INF, NAN, 2.0 ** -140])), [-1.0, -0.0, 0.0, 1.0, NAN, 2.0 ** -140])


def test_ftz_flushes_inputs_and_results():
    sub = F(2.0 ** -130)
    assert sfu.ex2_approx(F([-130.0]), ftz=True)[0] == 0 and sfu.ex2_approx(F([-130.0]))[0] == F(2.0 ** -130)
    assert sfu.lg2_approx(F([sub]), ftz=True)[0] == -INF and sfu.lg2_approx(F([sub]))[0] == -130
    assert sfu.rcp_approx(F([-sub]), ftz=True)[0] == -INF
    assert sfu.rcp_approx(F([2.0 ** 127]), ftz=True)[0] == 0 and sfu.rcp_approx(F([2.0 ** 127]))[0] == F(2.0 ** -127)


def test_error_bounds_over_the_range():
    rng = np.random.default_rng(7)
    x = rng.uniform(-126, 127, 20000).astype(F)
    # ex2: 2 ulp from the correctly rounded result (#floating-point-instructions-ex2).
    assert ulp_error(sfu.ex2_approx(x), np.exp2(x.astype(np.float64))).max() <= 2.5
    pos = np.exp2(rng.uniform(-120, 120, 20000)).astype(F)
    # rcp: 1 ulp; rsqrt: relative 2^-22.9; sqrt: relative 2^-23.
    assert ulp_error(sfu.rcp_approx(pos), 1 / pos.astype(np.float64)).max() <= 1
    rel = lambda got, exact: np.abs(got / exact - 1).max()  # noqa: E731
    assert rel(sfu.rsqrt_approx(pos), 1 / np.sqrt(pos.astype(np.float64))) <= 2.0 ** -22.9
    assert rel(sfu.sqrt_approx(pos), np.sqrt(pos.astype(np.float64))) <= 2.0 ** -23
    # lg2: absolute 2^-22 in (0.5, 2), relative 2^-22 outside.
    mid = rng.uniform(0.5, 2, 20000).astype(F)
    assert np.abs(sfu.lg2_approx(mid) - np.log2(mid.astype(np.float64))).max() <= 2.0 ** -22
    # sin / cos: absolute 2^-20.5 on [-2 pi, 2 pi]; tanh: relative 2^-11.
    ang = rng.uniform(-2 * np.pi, 2 * np.pi, 20000).astype(F)
    assert np.abs(sfu.sin_approx(ang) - np.sin(ang.astype(np.float64))).max() <= 2.0 ** -20.5
    # cos: the H200's MUFU.COS, which sfu models bit for bit (tests/test_mufu.py; the exhaustive
    # device check of fa_sim/calibrate/sfu_probe.py verify), exceeds PTX's 2^-20.5 slightly near
    # |x| = 4.9: 7.09e-7 = 2^-20.43 at x = -4.900111 (0xc09ccdb6).
    cos_err = np.abs(sfu.cos_approx(ang) - np.cos(ang.astype(np.float64)))
    assert cos_err.max() <= 2.0 ** -20.42
    worst = np.uint32(0xC09CCDB6).view(F).reshape(1)
    assert abs(float(sfu.cos_approx(worst)[0]) - np.cos(float(worst[0]))) > 2.0 ** -20.5
    t = rng.uniform(-10, 10, 20000).astype(F)
    assert rel(sfu.tanh_approx(t), np.tanh(t.astype(np.float64))) <= 2.0 ** -11


def test_div_approx_is_a_times_the_flushed_reciprocal():
    # #floating-point-instructions-div: for 2^126 < |b| < 2^128, NaN if a is infinite, else a signed zero.
    b = F([2.0 ** 127, -(2.0 ** 127), 3.0])
    got = sfu.div_approx(F([5.0, 5.0, 6.0]), b)
    assert got[0] == 0 and np.signbit(got[1]) and got[2] == 2.0
    assert np.isnan(sfu.div_approx(F([INF]), F([2.0 ** 127])))[0]


def test_f64_upper_word_approximations():
    # #floating-point-instructions-rcp-approx-ftz-f64: 1.11.20 in and out, low word zero; NaN ->
    # 0x7fffffff00000000; subnormals flushed.
    x = np.array([3.0, -0.0, 2.0 ** -1030, np.nan, np.inf])
    r = sfu.rcp_approx_ftz_f64(x)
    assert (r.view(np.uint64)[:3] & np.uint64(0xFFFFFFFF) == 0).all()
    assert abs(r[0] * 3 - 1) < 2.0 ** -20 and r[1] == -np.inf and r[2] == np.inf and r[4] == 0
    assert r.view(np.uint64)[3] == 0x7FFFFFFF00000000
    s = sfu.rsqrt_approx_ftz_f64(np.array([4.0, -1.0]))
    assert s[0] == 0.5 and np.isnan(s[1])


def test_half_forms():
    # #half-precision-floating-point-instructions-ex2: -inf -> +0, +-0 -> 1, +inf -> +inf.
    h = np.array([-np.inf, -0.0, 0.0, np.inf, 1.0, -1.0], np.float16)
    assert sfu.ex2_approx_f16(h).tolist() == [0.0, 1.0, 1.0, np.inf, 2.0, 0.5]
    # .bf16 .ftz: subnormal inputs read as 0 -> 1.
    bf = np.array([0x0001, 0x3F80, 0xFF80], np.uint16)  # subnormal, 1.0, -inf
    assert sfu.ex2_approx_ftz_bf16(bf).tolist() == [0x3F80, 0x4000, 0x0000]
    assert sfu.tanh_approx_f16(np.array([np.inf, -0.0], np.float16)).tolist() == [1.0, -0.0]


def test_the_programs_ex2_is_the_sfu_model():
    x = np.linspace(-140, 10, 4001, dtype=F)
    assert np.array_equal(fp32.ex2_approx_ftz(x), sfu.ex2_approx(x, ftz=True))
