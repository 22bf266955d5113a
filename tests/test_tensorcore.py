"""fa_sim.tensorcore: the tensor-core accumulation model family and its fitting."""

import numpy as np
import pytest

from fa_sim.tensorcore import EXACT, FusedDotModel, Rounding, candidates, fit


def _spread(rng, shape, lo, hi, dtype):
    mant = rng.uniform(1.0, 2.0, size=shape)
    return (rng.choice([-1.0, 1.0], size=shape) * np.ldexp(mant, rng.integers(lo, hi, size=shape))).astype(dtype)


def _inputs(n=512, seed=0):
    rng = np.random.default_rng(seed)
    return (_spread(rng, (n, 16), -8, 8, np.float16), _spread(rng, (n, 16), -8, 8, np.float16),
            _spread(rng, (n,), -6, 12, np.float32))


def test_exact_model_is_one_rounding_of_the_exact_sum():
    a, b, c = _inputs()
    exact = c.astype(np.float64) + np.sum(a.astype(np.float64) * b.astype(np.float64), axis=-1)
    np.testing.assert_array_equal(EXACT.dot_add(a, b, c), exact.astype(np.float32))


def test_small_integers_are_exact_in_every_model():
    rng = np.random.default_rng(1)
    a = rng.integers(-8, 9, size=(64, 16)).astype(np.float16)
    b = rng.integers(-8, 9, size=(64, 16)).astype(np.float16)
    c = rng.integers(-100, 100, size=64).astype(np.float32)
    want = (c + np.sum(a.astype(np.float32) * b.astype(np.float32), axis=-1)).astype(np.float32)
    for model in candidates():
        np.testing.assert_array_equal(model.dot_add(a, b, c), want, err_msg=str(model))


def test_truncation_rounds_toward_zero_below_the_kept_bits():
    # c = 1, one product 2^-30: below 24+3 bits of the largest term it is cut off entirely
    a = np.zeros((1, 16), np.float16); b = np.zeros((1, 16), np.float16)
    a[0, 0], b[0, 0] = 2.0 ** -15, 2.0 ** -15
    c = np.array([1.0], np.float32)
    assert FusedDotModel(16, 3, Rounding.TOWARD_ZERO).dot_add(a, b, c)[0] == 1.0
    # a negative tiny product: cut toward zero it vanishes; cut toward -inf (two's complement) it
    # takes one quantum, and the final round toward zero then lands one fp32 ulp below 1
    a[0, 0] = -a[0, 0]
    below_one = np.nextafter(np.float32(1), np.float32(0))
    assert FusedDotModel(16, 3, Rounding.TOWARD_ZERO).dot_add(a, b, c)[0] == 1.0
    assert FusedDotModel(16, 3, Rounding.TOWARD_ZERO, align=Rounding.DOWN).dot_add(a, b, c)[0] == below_one
    assert EXACT.dot_add(a, b, c)[0] == 1.0


@pytest.mark.parametrize("truth", [FusedDotModel(16, 3, Rounding.TOWARD_ZERO), FusedDotModel(8, 1, Rounding.NEAREST_EVEN), EXACT])
def test_fit_recovers_the_model_that_produced_the_data(truth):
    a, b, c = _inputs(2048, seed=2)
    best = fit(a, b, c, truth.dot_add(a, b, c))
    assert best[0].mismatches == 0
    assert best[0].model == truth
    assert best[1].mismatches > 0  # the data tells the family's members apart
