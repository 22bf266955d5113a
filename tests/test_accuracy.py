"""fa_sim.accuracy: a result is held to the documented bounds - O's relative Frobenius error at most
O_BOUND (1e-3, the README's "every output within 1e-3 of float64"), each LSE row within
lse_error_bound - and one above is a failure (`ok` False) like a non-finite result, named."""

import numpy as np
import pytest

from fa_sim.accuracy import O_BOUND, lse_error_bound, measure
from fa_sim.config import KernelConfig
from fa_sim.reference import attention, random_inputs

SCALE = 0.125


@pytest.fixture(scope="module")
def problem():
    q, k, v = random_inputs(1, 2, 100, 70, 64, seed=4)
    o, lse = attention(q, k, v, causal=True, scale=SCALE)
    return q, k, v, o, lse


def _measure(problem, o, lse):
    q, k, v, _, _ = problem
    return measure(o, lse, q, k, v, True, SCALE, KernelConfig())


def test_the_float64_result_rounded_as_the_kernel_stores_it_passes(problem):
    _, _, _, o, lse = problem
    acc = _measure(problem, o.astype(np.float16), lse.astype(np.float32))
    assert acc.ok and acc.above_bound == () and acc.rel_err_o < O_BOUND


def test_a_kernel_that_writes_nothing_fails_on_both_outputs(problem):
    _, _, _, o, lse = problem
    acc = _measure(problem, np.zeros_like(o, np.float16), np.zeros_like(lse, np.float32))
    assert not acc.ok and acc.nonfinite == () and acc.rel_err_o == pytest.approx(1.0)
    o_finding, lse_finding = acc.above_bound
    assert o_finding.what == "O" and o_finding.bound == O_BOUND and "above its documented bound 1e-03" in str(o_finding)
    assert lse_finding.what == "LSE" and lse_finding.rows == 200 and lse_finding.first == (0, 0, 0)
    assert acc.failures()[0].startswith("ABOVE BOUND: O's relative Frobenius error 1.000e+00")
    assert [f["what"] for f in acc.to_json()["above_bound"]] == ["O", "LSE"]


def test_o_just_above_the_bound_fails_and_just_below_passes(problem):
    _, _, _, o, lse = problem
    noise = np.random.default_rng(0).standard_normal(o.shape)
    noise *= np.linalg.norm(o) / np.linalg.norm(noise)
    for factor, ok in ((0.5, True), (2.0, False)):
        acc = _measure(problem, o + factor * O_BOUND * noise, lse.astype(np.float32))
        assert acc.ok is ok and [f.what for f in acc.above_bound] == ([] if ok else ["O"])


def test_each_lse_row_is_held_to_lse_error_bound(problem):
    """One row off by twice its bound fails, naming that row; every row at half its bound passes."""
    q, k, _, o, lse = problem
    bound = lse_error_bound(q, k, True, SCALE, lse)
    half = _measure(problem, o.astype(np.float16), lse + 0.5 * bound)
    assert half.ok, [str(f) for f in half.above_bound]
    off = lse.copy()
    off[0, 1, 37] += 2 * bound[0, 1, 37]
    acc = _measure(problem, o.astype(np.float16), off)
    (finding,) = acc.above_bound
    assert finding.what == "LSE" and finding.rows == 1 and finding.first == (0, 1, 37)
    assert finding.bound == pytest.approx(bound[0, 1, 37], rel=1e-12)
