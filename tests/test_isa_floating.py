"""isa.floating: f32 / f64 arithmetic rounds correctly in every mode, with PTX's .ftz, .sat,
NaN and signed-zero rules (#floating-point-instructions). Oracle: fractions.Fraction
(tests/fp_oracle.py), one value at a time."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fp_oracle as ref
from fa_sim.isa import floating as F
from fa_sim.isa.floating import FpClass
from fa_sim.isa.rounding import Rnd

FIXED = settings(derandomize=True, database=None, deadline=None, max_examples=150)
RND = {"rn": Rnd.RN, "rz": Rnd.RZ, "rm": Rnd.RM, "rp": Rnd.RP}
CANON32 = 0x7FFFFFFF

F32_SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 2.0 ** -149, -(2.0 ** -149),
               2.0 ** -126, 2.0 ** -126 - 2.0 ** -149, 3.4028234663852886e38, -3.4028234663852886e38,
               1.5, 0.1, 2.0 ** 100, 2.0 ** -100]
F64_SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 5e-324, -5e-324, 2.0 ** -1022,
               1.7976931348623157e308, -1.7976931348623157e308, 2.0 ** -537, 2.0 ** 511, 0.1, 3.0]


def _from_bits(width):
    dt = np.uint32 if width == 32 else np.uint64
    ft = np.float32 if width == 32 else np.float64
    return st.integers(0, 2 ** width - 1).map(lambda b: float(np.array(b, dt).view(ft)))


def values(width):
    special = F32_SPECIAL if width == 32 else F64_SPECIAL
    return st.one_of(st.sampled_from(special), _from_bits(width), st.floats(width=width))


def near(width):
    """Pairs (x, y) with y close to -x or to x: cancellation and ties."""
    dt = np.uint32 if width == 32 else np.uint64
    ft = np.float32 if width == 32 else np.float64

    def build(x, delta, flip):
        bits = np.array(x, ft).view(dt)
        y = float((bits + dt(delta) if delta >= 0 else bits - dt(-delta)).view(ft))
        return x, -y if flip else y
    return st.builds(build, values(width), st.integers(-3, 3), st.booleans())


def triples(width):
    pair = st.one_of(st.tuples(values(width), values(width)), near(width))
    return st.lists(st.tuples(pair, values(width)).map(lambda t: (*t[0], t[1])), min_size=1, max_size=24)


def _arrays(rows, dtype):
    return [np.array([r[i] for r in rows], dtype) for i in range(3)]


def _check(got, want, width, what):
    for i, (g, w) in enumerate(zip(got.tolist(), want)):
        assert ref.same(g, w), f"{what} lane {i}: got {g!r}, want {w!r}"
    if width == 32:
        nan = np.isnan(got)
        assert (got.view(np.uint32)[nan] == CANON32).all(), f"{what}: f32 NaN results are 0x7fffffff"


def _f32_ref(fn, args, mode, ftz):
    if ftz:
        args = [ref.flush(x, ref.F32) for x in args]
    r = fn(*args, ref.F32, mode)
    return ref.flush(r, ref.F32) if ftz else r


@FIXED
@given(triples(32), st.sampled_from(ref.MODES), st.booleans())
def test_f32_add_sub_mul_fma_div_sqrt_round_correctly(rows, mode, ftz):
    a, b, c = _arrays(rows, np.float32)
    rnd = RND[mode]
    cases = [("add", F.add(a, b, rnd, ftz), ref.add, (a, b)),
             ("sub", F.sub(a, b, rnd, ftz), lambda x, y, f, m: ref.add(x, -y, f, m), (a, b)),
             ("mul", F.mul(a, b, rnd, ftz), ref.mul, (a, b)),
             ("fma", F.fma(a, b, c, rnd, ftz), ref.fma, (a, b, c)),
             ("div", F.div(a, b, rnd, ftz), ref.div, (a, b)),
             ("sqrt", F.sqrt(a, rnd, ftz), ref.sqrt, (a,)),
             ("rcp", F.rcp(a, rnd, ftz), lambda x, f, m: ref.div(1.0, x, f, m), (a,))]
    for name, got, fn, args in cases:
        assert got.dtype == np.float32
        want = [_f32_ref(fn, [float(x[i]) for x in args], mode, ftz) for i in range(len(a))]
        _check(got, want, 32, f"{name}.{mode}{'.ftz' if ftz else ''}.f32")


@FIXED
@given(triples(64), st.sampled_from(ref.MODES))
def test_f64_add_sub_mul_fma_div_sqrt_round_correctly(rows, mode):
    a, b, c = _arrays(rows, np.float64)
    rnd = RND[mode]
    cases = [("add", F.add(a, b, rnd), ref.add, (a, b)),
             ("sub", F.sub(a, b, rnd), lambda x, y, f, m: ref.add(x, -y, f, m), (a, b)),
             ("mul", F.mul(a, b, rnd), ref.mul, (a, b)),
             ("fma", F.fma(a, b, c, rnd), ref.fma, (a, b, c)),
             ("div", F.div(a, b, rnd), ref.div, (a, b)),
             ("sqrt", F.sqrt(a, rnd), ref.sqrt, (a,))]
    for name, got, fn, args in cases:
        assert got.dtype == np.float64
        want = [fn(*[float(x[i]) for x in args], ref.F64, mode) for i in range(len(a))]
        _check(got, want, 64, f"{name}.{mode}.f64")


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(st.lists(st.tuples(st.floats(-2.0 ** 60, 2.0 ** 60, width=64), st.floats(-2.0 ** 60, 2.0 ** 60, width=64),
                          st.floats(width=64, allow_nan=False)), min_size=1, max_size=24))
def test_fma_rn_f64_fast_path_on_ordinary_operands(rows):
    # The error-free-transform path (Boldo-Melquiond) handles these; extreme lanes go to the exact path.
    a, b, c = _arrays(rows, np.float64)
    want = [ref.fma(x, y, z, ref.F64, "rn") for x, y, z in rows]
    _check(F.fma(a, b, c), want, 64, "fma.rn.f64")


def test_fma_rn_f64_double_rounding_trap():
    # a*b = 2^-53 + 2^-107 exactly, c = 1: the exact sum 1 + 2^-53 + 2^-107 rounds up to 1 + 2^-52,
    # but rounding the low parts 2^-53 + 2^-107 to nearest first leaves a tie that rounds to 1.
    # Boldo-Melquiond's round-to-odd step is what gets this right.
    a = np.array([2.0 ** -53 * (1 + 2.0 ** -18)])
    b = np.array([1 - 2.0 ** -18 + 2.0 ** -36])
    c = np.array([1.0])
    assert ref.fma(float(a[0]), float(b[0]), 1.0, ref.F64, "rn") == 1 + 2.0 ** -52
    assert F.fma(a, b, c)[0] == 1 + 2.0 ** -52


def test_fma_rn_f32_double_rounding_in_the_subnormal_range():
    # (2^36 + 1) = 1774001 * 38737, so a * b = 2^-150 + 2^-186 exactly; with c = 2^-127 the float64
    # sum drops 2^-186 and lands on the f32 midpoint 2^-127 + 2^-150, which ties down to even;
    # the exact sum lies above it and rounds up.
    a = np.float32([1774001 * 2.0 ** -93])
    b = np.float32([38737 * 2.0 ** -93])
    c = np.float32([2.0 ** -127])
    want = ref.fma(float(a[0]), float(b[0]), float(c[0]), ref.F32, "rn")
    assert want == 2.0 ** -127 + 2.0 ** -149
    assert F.fma(a, b, c)[0] == want


def test_fma_broadcasts_its_operands():
    # The program calls fma_rn(s[..., k], scale, -m[..., None]); the midpoint lanes are patched in place.
    a = np.float32([[1 + 2.0 ** -12], [3.0]])  # a*a = 1 + 2^-11 + 2^-24: an f32 midpoint
    c = np.float32([2.0 ** -80, -(2.0 ** -80), 0.0])
    got = F.fma(a, a, c)
    assert got.shape == (2, 3)
    want = [[ref.fma(float(x), float(x), float(z), ref.F32, "rn") for z in c] for x in a[:, 0]]
    assert got.tolist() == want


def test_ftz_flushes_after_rounding_and_keeps_the_sign():
    # #floating-point-instructions-add: .ftz flushes subnormal inputs and results to sign-preserving zero.
    tiny = np.float32([2.0 ** -127])  # subnormal; tiny + tiny is the smallest normal
    assert F.add(tiny, tiny)[0] == 2.0 ** -126 and F.add(tiny, tiny, ftz=True)[0] == 0
    assert F.mul(np.float32([2.0 ** -63]), np.float32([-(2.0 ** -64)]), ftz=True).view(np.uint32)[0] == 0x80000000
    # 2^-126 - 2^-150 rounds up to the smallest normal under .rn: not flushed.
    x = np.float32([2.0 ** -126])
    assert F.fma(x, np.float32([1 - 2.0 ** -24]), np.float32([0.0]), ftz=True)[0] == x[0]


def test_sat_clamps_and_flushes_nan_to_plus_zero():
    # #floating-point-instructions-add: .sat clamps to [0.0, 1.0]; NaN results -> +0.0.
    a = np.float32([0.75, -3.0, np.inf, np.nan, -0.0, 0.25])
    got = F.add(a, np.float32([0.5, 1.0, -np.inf, 1.0, 0.0, 0.0]), sat=True)
    assert got.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.25]
    assert not np.signbit(got).any()


# #floating-point-instructions-min / -max: a NaN gives the other operand, two NaNs (or .NaN with
# any NaN) the canonical NaN; "If values of both inputs are 0.0, then +0.0 > -0.0".
NAN = float("nan")
MIN_MAX_TABLE = [  # a, b, min, max
    (1.0, 2.0, 1.0, 2.0),
    (NAN, 2.0, 2.0, 2.0),
    (-3.0, NAN, -3.0, -3.0),
    (NAN, NAN, NAN, NAN),
    (0.0, -0.0, -0.0, 0.0),
    (-0.0, 0.0, -0.0, 0.0),
    (-math.inf, math.inf, -math.inf, math.inf),
]


def test_min_max_nan_and_signed_zero_table():
    a = np.float32([r[0] for r in MIN_MAX_TABLE])
    b = np.float32([r[1] for r in MIN_MAX_TABLE])
    _check(F.min_(a, b), [r[2] for r in MIN_MAX_TABLE], 32, "min.f32")
    _check(F.max_(a, b), [r[3] for r in MIN_MAX_TABLE], 32, "max.f32")
    _check(F.min_(a.astype(np.float64), b.astype(np.float64)), [r[2] for r in MIN_MAX_TABLE], 64, "min.f64")


def test_min_max_nan_modifier_and_xorsign_abs():
    a, b = np.float32([NAN, -2.0, 3.0]), np.float32([1.0, 5.0, -4.0])
    got = F.min_(a, b, propagate_nan=True)
    assert np.isnan(got[0]) and got.view(np.uint32)[0] == CANON32 and got[1:].tolist() == [-2.0, -4.0]
    # .xorsign.abs: magnitude min(|a|, |b|), sign a XOR b.
    assert F.min_(a[1:], b[1:], xorsign_abs=True).tolist() == [-2.0, -3.0]
    assert F.max_(a[1:], b[1:], xorsign_abs=True).tolist() == [-5.0, -4.0]


def test_min_ftz_flushes_operands():
    sub = np.float32(2.0 ** -140)
    assert F.max_(np.float32([sub]), np.float32([0.0]), ftz=True)[0] == 0


def test_abs_neg_copysign_bits():
    a = np.float32([1.5, -0.0, -np.inf, 2.0 ** -140])
    assert F.abs_(a).tolist() == [1.5, 0.0, np.inf, 2.0 ** -140] and not np.signbit(F.abs_(a)).any()
    assert np.signbit(F.neg(a)).tolist() == [True, False, False, True]
    assert F.abs_(a, ftz=True)[3] == 0 and np.signbit(F.neg(a, ftz=True))[3]
    # #floating-point-instructions-copysign: sign of a, the rest of b.
    got = F.copysign(np.float32([-1.0, 2.0]), np.float32([3.0, -4.0]))
    assert got.tolist() == [-3.0, 4.0]


def test_testp_table():
    # #floating-point-instructions-testp: zeros count as normal numbers.
    x = np.float32([0.0, -0.0, 1.0, 2.0 ** -140, np.inf, np.nan])
    assert F.testp(FpClass.FINITE, x).tolist() == [1, 1, 1, 1, 0, 0]
    assert F.testp(FpClass.INFINITE, x).tolist() == [0, 0, 0, 0, 1, 0]
    assert F.testp(FpClass.NUMBER, x).tolist() == [1, 1, 1, 1, 1, 0]
    assert F.testp(FpClass.NOTANUMBER, x).tolist() == [0, 0, 0, 0, 0, 1]
    assert F.testp(FpClass.NORMAL, x).tolist() == [1, 1, 1, 0, 0, 0]
    assert F.testp(FpClass.SUBNORMAL, x).tolist() == [0, 0, 0, 1, 0, 0]


# f64 NaN results (fa_sim.isa.nans): golden rows of the H200 recording tests/data/h200/alu_probe.npz
# (inputs -> GPU output, bits). QNAN_P is a quiet NaN with a payload, SNAN a signalling one.
QNAN, QNAN_P, NQNAN, SNAN = 0x7FF8000000000000, 0x7FF8000000001234, 0xFFF8000000000001, 0x7FF0000000000001
F64_NAN_ROWS = [  # op, a, b, GPU
    ("add", QNAN_P, QNAN, QNAN), ("add", QNAN, SNAN, 0x7FF8000000000001), ("add", SNAN, 1.0, 0x7FF8000000000001),
    ("mul", 0xFFF6256E9337238E, 0x7FF6256E93372391, 0x7FFE256E93372391),
    ("sub", NQNAN, QNAN, QNAN), ("sub", 0x0, NQNAN, NQNAN),  # b's NaN wins, not negated
    ("min", QNAN, QNAN_P, QNAN_P), ("max", QNAN, SNAN, 0x7FF8000000000001), ("min", SNAN, 1.0, 1.0),
    ("div", QNAN, SNAN, QNAN), ("div", SNAN, QNAN, 0x7FF8000000000001),  # a's NaN first
    ("add", math.inf, -math.inf, 0xFFF8000000000000), ("mul", 0.0, math.inf, 0xFFF8000000000000),
]


def _f64(x):
    return np.array([x], np.float64) if isinstance(x, float) else np.array([x], np.uint64).view(np.float64)


@pytest.mark.parametrize("rnd", list(Rnd)[:4])
@pytest.mark.parametrize("op, a, b, gpu", F64_NAN_ROWS)
def test_f64_nan_results_follow_the_h200(op, a, b, gpu, rnd):
    fn = {"add": F.add, "sub": F.sub, "mul": F.mul, "div": F.div, "min": F.min_, "max": F.max_}[op]
    args = (_f64(a), _f64(b)) + (() if op in ("min", "max") else (rnd,))
    with np.errstate(invalid="ignore"):
        got = fn(*args)
    assert hex(int(got.view(np.uint64)[0])) == hex(int(_f64(gpu).view(np.uint64)[0]))


def test_f64_fma_nan_precedence_b_then_c_then_a():
    # H200: DFMA with NaNs in a, b and c returns b's (0x7ffc71e372ed3549 0xfffc71e372ed3547
    # 0xfffc71e372ed354c -> 0xfffc71e372ed3547); with NaNs in a and c, c's (fma.rn.f64 $d, $a, $c, $b
    # of 0x7ff8000000001234, 0x7ff8000000000000, 0 -> 0x7ff8000000000000).
    a, b, c = (_f64(x) for x in (0x7FFC71E372ED3549, 0xFFFC71E372ED3547, 0xFFFC71E372ED354C))
    for rnd in list(Rnd)[:4]:
        assert int(F.fma(a, b, c, rnd).view(np.uint64)[0]) == 0xFFFC71E372ED3547
        assert int(F.fma(a, _f64(2.0), c, rnd).view(np.uint64)[0]) == 0xFFFC71E372ED354C
    a, c = _f64(0x7FF8000000001234), _f64(0x7FF8000000000000)
    assert int(F.fma(a, _f64(0.0), c).view(np.uint64)[0]) == 0x7FF8000000000000


def test_abs_neg_nan_f32_canonical_f64_quieted_with_sign():
    # H200: abs/neg.f32 (FADD |a|, -RZ) write 0x7fffffff; abs/neg.f64 (DADD -RZ, |a|) quiet the
    # NaN and keep its sign (0xfff5e3663d997400 -> 0xfffde3663d997400).
    x = np.array([0x7FC00000, 0xFFC00001, 0x7F800001], np.uint32).view(np.float32)
    for fn in (F.abs_, F.neg):
        assert (fn(x).view(np.uint32) == CANON32).all() and (fn(x, ftz=True).view(np.uint32) == CANON32).all()
    d = np.array([0xFFF5E3663D997400, 0x7FF0000000000001, 0xFFF8000000000001], np.uint64).view(np.float64)
    want = [0xFFFDE3663D997400, 0x7FF8000000000001, 0xFFF8000000000001]
    assert F.abs_(d).view(np.uint64).tolist() == want and F.neg(d).view(np.uint64).tolist() == want


@pytest.mark.parametrize("density", [0.0, 0.05, 0.3, 0.8])
@pytest.mark.parametrize("name", ["add", "max", "min"])
def test_a_chain_as_one_call_gives_the_bits_of_its_steps(name, density):
    """add_chain / max_chain / min_chain (what the PTX engine's lane blocks run for a chain of one
    instruction) against the steps one by one, the earlier result as either operand, on columns
    with NaNs (signalling, negative), signed zeros, infinities and subnormals, or zeros only."""
    step, chain = {"add": (F.add, F.add_chain), "max": (F.max_, F.max_chain), "min": (F.min_, F.min_chain)}[name]
    rng = np.random.default_rng(7)
    nans = np.array([0x7F800001, 0xFFC00001], np.uint32).view(np.float32)  # signalling, negative quiet
    special = np.concatenate([np.array(F32_SPECIAL, np.float32), nans])
    for m in (1, 2, 5, 16):
        scale = rng.choice([1e-38, 1.0, 1e38], (m + 1, 301))
        with np.errstate(over="ignore"):  # infinities and subnormals among the f32 operands
            x = (rng.standard_normal((m + 1, 301)) * scale).astype(np.float32)
        pick = rng.random(x.shape) < density
        x[pick] = rng.choice(special, int(pick.sum()))
        x[:, :3] = [[0.0, -0.0, np.nan]] * (m + 1)  # every step's operands zeros of one sign, or NaNs
        x[1::2, 3] = -0.0
        got = chain(x)
        r = x[0]
        for i in range(1, m + 1):
            r = step(r, x[i]) if i % 2 else step(x[i], r)
            np.testing.assert_array_equal(np.asarray(r, np.float32).view(np.uint32), got[i - 1].view(np.uint32))


def test_sub_rn_f32_is_the_add_of_the_negation_bit_for_bit():
    """sub.rn.f32's numpy path (a - b) against add(a, -b) on 10^6 random bit patterns and every
    pair of the specials: IEEE 754 defines the difference as that sum, signed zeros included."""
    rng = np.random.default_rng(7)
    special = np.array(F32_SPECIAL, np.float32)
    a = np.concatenate([rng.integers(0, 2 ** 32, 10 ** 6, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.repeat(special, special.size)])
    b = np.concatenate([rng.integers(0, 2 ** 32, 10 ** 6, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.tile(special, special.size)])
    got = F.sub(a, b)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), F.add(a, -b).view(np.uint32))
