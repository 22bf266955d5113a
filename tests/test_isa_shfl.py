"""isa.shfl: shfl.sync.bfly.b32 (PTX `#data-movement-and-conversion-instructions-shfl-sync`)
and the quad all-reduce of spec tables 5-7."""

import numpy as np
import pytest

from fa_sim.errors import KernelFault
from hypothesis import given, settings, strategies as st

from fa_sim.isa import bfly_source, shfl_bfly

FIXED = settings(derandomize=True, database=None, max_examples=30, deadline=None)


def _table7_row():
    """One query row of 64 keys: keys 0..7 = -4..3, the rest -5; lane t of the quad owns keys
    2t, 2t+1 + 8 nj (spec table 6)."""
    row = np.full(64, -5.0, np.float32)
    row[:8] = np.arange(-4, 4)
    cols = np.array([[2 * t + b + 8 * nj for nj in range(8) for b in range(2)] for t in range(4)])
    return row, cols


def test_table7_quad_max_through_the_shuffle_instruction():
    row, cols = _table7_row()
    x = np.full(32, -np.inf, np.float32)
    x[:4] = row[cols].max(axis=1)  # thread-local max, lanes 0..3
    assert x[:4].tolist() == [-3, -1, 1, 3]
    y, src = shfl_bfly(x, 2, lane_axis=0)
    x = np.maximum(x, y)
    assert src[:4].tolist() == [2, 3, 0, 1] and x[:4].tolist() == [1, 3, 1, 3]
    y, src = shfl_bfly(x, 1, lane_axis=0)
    x = np.maximum(x, y)
    assert src[:4].tolist() == [1, 0, 3, 2] and x[:4].tolist() == [3, 3, 3, 3]


def test_sum_allreduce_of_the_spec_example():
    # spec: local sums (1/2, 1, 1/4, 1/4) -> XOR 2 (3/4, 5/4, 3/4, 5/4) -> XOR 1 (2, 2, 2, 2)
    x = np.zeros(32, np.float32)
    x[:4] = [0.5, 1, 0.25, 0.25]
    x = x + shfl_bfly(x, 2, 0)[0]
    assert x[:4].tolist() == [0.75, 1.25, 0.75, 1.25]
    x = x + shfl_bfly(x, 1, 0)[0]
    assert x[:4].tolist() == [2, 2, 2, 2]


@FIXED
@given(mask=st.integers(0, 31), seed=st.integers(0, 1000))
def test_butterfly_laws(mask, seed):
    x = np.random.default_rng(seed).integers(0, 2**31, (2, 3, 32, 2)).astype(np.uint32)
    y, src = shfl_bfly(x, mask, lane_axis=2)
    np.testing.assert_array_equal(shfl_bfly(y, mask, 2)[0], x)  # an involution
    np.testing.assert_array_equal(y, x[:, :, np.arange(32) ^ mask])
    if mask < 4:
        assert ((src >> 2) == (np.arange(32) >> 2)).all()  # XOR 1, 2 stay inside the quad


def test_preconditions():
    with pytest.raises(KernelFault, match="partially active"):
        active = np.ones((1, 32), bool)
        active[0, 5] = False
        shfl_bfly(np.zeros((1, 32), np.float32), 1, 1, active)
    with pytest.raises(ValueError, match="laneMask"):
        bfly_source(32)
    with pytest.raises(ValueError, match="32 lanes"):
        shfl_bfly(np.zeros(16), 1, 0)
