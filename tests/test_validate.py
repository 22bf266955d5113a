"""fa_sim.validate: the one input policy of both backends (fp16, or values fp16 holds exactly;
nothing rounded or overflowed silently), and the same words from fa_sim.simulate and fa_hw.forward.

bfloat16 is tested through torch where torch is installed, and everywhere through an emulation
that needs no extra package: a bf16 value is a float32 whose low 16 bits are zero, so float32
arrays with those bit patterns hold exactly the values a bf16 tensor would."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fa_hw
import fa_sim
from fa_sim import validate
from fa_sim.validate import host_fp16, max_scale, to_fp16

RNG = np.random.default_rng(1)
Q16 = RNG.standard_normal((1, 2, 16, 32)).astype(np.float16)


def bf16(x) -> np.ndarray:
    """float32 holding the bfloat16 rounding (to nearest even) of x: the emulated bf16 tensor."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


# ---- what is accepted ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_values_fp16_holds_exactly_are_accepted_in_any_real_dtype(dtype):
    x = Q16 if np.dtype(dtype).kind == "f" else np.round(Q16 * 20).astype(np.float16)
    x = np.abs(x) if np.dtype(dtype).kind == "u" else x
    got = to_fp16(x.astype(dtype), "q")
    assert got.dtype == np.float16 and got.flags.c_contiguous
    if np.dtype(dtype).kind == "f":
        assert np.array_equal(got.view(np.uint16), x.view(np.uint16))  # bit for bit, signed zeros too
    else:
        assert np.array_equal(got, x)


def test_fp16_is_used_as_it_is():
    assert to_fp16(Q16, "q") is Q16
    strided = np.asfortranarray(Q16)
    assert np.array_equal(to_fp16(strided, "q"), Q16) and to_fp16(strided, "q").flags.c_contiguous


def _normal_bf16() -> np.ndarray:
    x = bf16(RNG.standard_normal(Q16.shape) * 100)
    return np.where(np.abs(x) < 2.0 ** -14, np.float32(1), x)  # inside fp16's normal range


def test_bf16_values_inside_the_fp16_normal_range_convert_exactly():
    x = _normal_bf16()
    assert np.array_equal(to_fp16(x, "k").astype(np.float32), x)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.floats(-65504, 65504, width=32, allow_subnormal=False))
def test_a_value_is_accepted_iff_fp16_holds_it(value):
    x = np.full((1, 1, 1, 32), value, np.float32)
    exact = float(np.float16(value)) == float(np.float32(value))
    if exact:
        assert to_fp16(x, "v")[0, 0, 0, 0] == np.float32(value)
    else:
        assert "does not represent exactly" in _message(to_fp16, x, "v")


# ---- what is refused, with the fix ---------------------------------------------------------------
def test_rounding_is_refused_naming_dtype_count_example_and_fix():
    x = Q16.astype(np.float32)
    x[0, 1, 2, 3] = 0.1
    x[0, 1, 5, 0] = 1 / 3
    msg = _message(to_fp16, x, "q")
    assert msg == ("q (float32) holds 2 values that fp16 does not represent exactly, e.g. q[0, 1, 2, 3] = "
                   "0.100000001 -> 0.0999755859; the kernel reads fp16: convert explicitly "
                   "(q.astype(np.float16)) to accept the rounding")


@pytest.mark.parametrize("x, where, message", [
    (bf16(np.full((1, 1, 2, 32), 1e5)), "[0, 0, 0, 0]", "beyond the fp16 range (|x| > 65504)"),  # bf16 past 65504
    (bf16(np.full((1, 1, 2, 32), 1e-8)), "[0, 0, 0, 0]", "does not represent exactly"),  # below fp16's spacing
    (np.full((1, 1, 2, 32), 65520.0), "[0, 0, 0, 0]", "beyond the fp16 range"),  # would round to inf
    (np.full((1, 1, 2, 32), 65505.0), "[0, 0, 0, 0]", "does not represent exactly"),  # would round to 65504
    (np.full((1, 1, 2, 32), 2049, np.int32), "[0, 0, 0, 0]", "does not represent exactly"),  # 11 bits + 1
    (np.full((1, 1, 2, 32), 70000, np.int64), "[0, 0, 0, 0]", "beyond the fp16 range"),
])
def test_overflow_and_rounding_are_refused(x, where, message):
    msg = _message(to_fp16, x, "k")
    assert message in msg and f"k{where}" in msg and "\n" not in msg


@pytest.mark.parametrize("bad, message", [
    (np.nan, "k contains NaN or Inf, first at k[0, 0, 1, 2]"), (np.inf, "k contains NaN or Inf"),
    (-np.inf, "k contains NaN or Inf"),
])
def test_nan_and_inf_are_refused_with_their_place(bad, message):
    for dtype in (np.float16, np.float32, np.float64):
        x = Q16.astype(dtype)
        x[0, 0, 1, 2] = bad
        assert message in _message(to_fp16, x, "k")


@pytest.mark.parametrize("x, message", [
    (Q16.astype(np.complex64), "dtype complex64, which does not convert to fp16"),
    (Q16 > 0, "dtype bool, which does not convert to fp16"),
    (Q16.astype(str), "does not convert to fp16"),
    (Q16[0], "rank 4"), (Q16[:, :, :0], "empty"), ("abc", "must be a numpy array"),
])
def test_other_dtypes_and_shapes_are_refused(x, message):
    assert message in _message(to_fp16, x, "q")


# ---- scale -----------------------------------------------------------------------------------------
def test_the_scale_bound_keeps_every_score_finite_in_fp32():
    for d in (32, 64, 128):
        worst = np.float32(d * 65504.0 ** 2)  # |q.k| of fp16 inputs, exact in fp32
        sl2 = np.float32(np.float32(max_scale(d)) * np.float32(math.log2(math.e)))
        assert np.isfinite(np.float32(worst * sl2)) and np.isfinite(np.float32(worst * np.float32(max_scale(d))))
        assert validate.check_scale(max_scale(d), d) == max_scale(d)
        assert "too large" in _message(validate.check_scale, max_scale(d) * 1.01, d)


# ---- both backends say the same --------------------------------------------------------------------
CASES = {
    "rounds": (Q16.astype(np.float32) + np.float32(1e-4), Q16, Q16),
    "bf16 overflow": (bf16(np.full(Q16.shape, 7e4)), Q16, Q16),
    "int overflow": (np.full(Q16.shape, 1 << 20, np.int64), Q16, Q16),
    "nan": (np.where(Q16 > 1, np.float16(np.nan), Q16), Q16, Q16),
    "bool": (Q16 > 0, Q16, Q16),
    "list": (Q16.tolist(), Q16, Q16),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_simulate_and_forward_say_the_same(case):
    args = CASES[case]
    assert _message(fa_hw.forward, *args) == _message(fa_sim.simulate, *args)


def test_scale_past_the_bound_is_refused_by_both():
    big = 2 * max_scale(32)
    assert _message(fa_hw.forward, Q16, Q16, Q16, scale=big) == _message(fa_sim.simulate, Q16, Q16, Q16, scale=big)


# ---- torch, where installed --------------------------------------------------------------------------
def test_torch_tensors_follow_the_same_policy():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(Q16.astype(np.float32))
    assert np.array_equal(host_fp16(x, "q"), Q16)
    big = torch.full(Q16.shape, 1e5, dtype=torch.bfloat16)
    assert "k (bfloat16)" not in _message(host_fp16, big, "k") and "beyond the fp16 range" in _message(host_fp16, big, "k")
    values = _normal_bf16()
    exact = torch.from_numpy(values).to(torch.bfloat16)
    assert np.array_equal(host_fp16(exact, "k").astype(np.float32), values)
    tiny = torch.full(Q16.shape, 1e-8, dtype=torch.bfloat16)
    assert "k (bfloat16) holds 1,024 values that fp16 does not represent exactly" in _message(host_fp16, tiny, "k")
    assert "convert explicitly (q.half())" in _message(host_fp16, x + 1e-4, "q")
    assert _message(fa_sim.simulate, x + 1e-4, x, x) == _message(fa_hw.forward, x + 1e-4, x, x)


# ---- shapes before values ----------------------------------------------------------------------------
def test_check_input_sizes_an_input_without_reading_its_values():
    """check_input gives the shape (what fa_sim.estimate needs) after the checks that read no values,
    with to_fp16's words; a huge broadcast view is not copied until fp16() is asked for."""
    huge = np.broadcast_to(np.float32(0.5), (1, 64, 4_000_000, 128))
    checked = validate.check_input(huge, "q")
    assert checked.shape == (1, 64, 4_000_000, 128) and checked.array.base is not None  # still the view
    for bad in (Q16[0], Q16[:, :, :0], Q16 > 0, "abc"):
        assert _message(validate.check_input, bad, "q") == _message(to_fp16, bad, "q")
    nan = Q16.astype(np.float32)
    nan[0, 1, 2, 3] = np.nan
    assert validate.check_input(nan, "k").shape == Q16.shape  # values are fp16()'s business
    assert "k contains NaN or Inf, first at k[0, 1, 2, 3]" in _message(validate.check_input(nan, "k").fp16)
    assert np.array_equal(validate.check_input(Q16.astype(np.float64), "q").host_fp16(), Q16)


def test_the_blocked_finiteness_scan_finds_a_bad_value_in_any_block(monkeypatch):
    """_Xp.all_finite scans a large fp16 array in blocks of FINITE_BLOCK values through one buffer:
    a NaN or Inf in the last, partial block is found, and the error names its position."""
    import fa_sim.validate as val

    monkeypatch.setattr(val, "FINITE_BLOCK", 64)
    x = np.zeros((1, 3, 7, 11), np.float16)  # 231 values: 3 whole blocks and a partial one
    lib = val._Xp(np, "")
    assert lib.all_finite(x)
    for bad, at in ((np.nan, (0, 2, 6, 10)), (np.inf, (0, 2, 0, 0)), (-np.inf, (0, 0, 5, 9))):
        y = x.copy()
        y[at] = bad
        assert not lib.all_finite(y)
        with pytest.raises(ValueError, match=rf"q contains NaN or Inf, first at q\[{at[0]}, {at[1]}, {at[2]}, {at[3]}\]"):
            val.check_input(y, "q").half("fp16")
    assert lib.all_finite(np.full(231, 65504, np.float16))  # the largest finite fp16
