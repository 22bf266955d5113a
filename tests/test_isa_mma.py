"""isa.mma: m16n8k16 lane maps and arithmetic against docs/hardware_facts.md
(PTX `#warp-level-matrix-fragment-mma-16816-float`). Per-lane loops here are test oracles."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fa_sim.isa import mma

FIXED = settings(derandomize=True, database=None, max_examples=25, deadline=None)


def test_lane0_coordinates_match_hardware_facts():
    ar, ac = mma.a_coords()
    assert ar[0].tolist() == [0, 0, 8, 8, 0, 0, 8, 8]
    assert ac[0].tolist() == [0, 1, 0, 1, 8, 9, 8, 9]
    bk, bn = mma.b_coords()
    assert bk[0].tolist() == [0, 1, 8, 9] and bn[0].tolist() == [0, 0, 0, 0]
    cr, cc = mma.c_coords()
    assert cr[0].tolist() == [0, 0, 8, 8] and cc[0].tolist() == [0, 1, 0, 1]
    # spec: lane 1 -> d 2,3,10,11; lane 4 -> queries 1, 9
    assert ac[1].tolist() == [2, 3, 2, 3, 10, 11, 10, 11]
    assert cr[4].tolist() == [1, 1, 9, 9]


def test_each_matrix_element_is_held_by_exactly_one_lane_value():
    for (r, c), shape in ((mma.a_coords(), (16, 16)), (mma.b_coords(), (16, 8)), (mma.c_coords(), (16, 8))):
        seen = np.zeros(shape, dtype=int)
        np.add.at(seen, (r.ravel(), c.ravel()), 1)
        assert (seen == 1).all()


def _pack(matrix, coords, dtype):
    """Oracle: lane fragments from a matrix, one lane at a time."""
    rows, cols = coords
    out = np.zeros(rows.shape, dtype=dtype)
    for lane in range(32):
        for i in range(rows.shape[1]):
            out[lane, i] = matrix[rows[lane, i], cols[lane, i]]
    return out


def _unpack(frag, coords, shape):
    rows, cols = coords
    out = np.zeros(shape, dtype=frag.dtype)
    for lane in range(32):
        for i in range(rows.shape[1]):
            out[rows[lane, i], cols[lane, i]] = frag[lane, i]
    return out


def _run(a_mat, b_mat, c_mat):
    a = _pack(a_mat, mma.a_coords(), np.float16).view(np.uint32)  # [32, 4]
    b = _pack(b_mat, mma.b_coords(), np.float16).view(np.uint32)  # [32, 2]
    c = _pack(c_mat, mma.c_coords(), np.float32)  # [32, 4]
    return _unpack(mma.mma_m16n8k16(a, b, c), mma.c_coords(), (16, 8))


def test_integer_operands_give_the_exact_product():
    rng = np.random.default_rng(0)
    a = rng.integers(-8, 9, (16, 16)).astype(np.float16)
    b = rng.integers(-8, 9, (16, 8)).astype(np.float16)
    c = rng.integers(-50, 50, (16, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(a, b, c), a.astype(np.int64) @ b.astype(np.int64) + c.astype(np.int64))


def test_element_ids_land_where_the_lane_maps_say():
    # A = one-hot row selector, B = column ids: D(r, n) = id of B(k = r, n), so each lane's D
    # element (g or g+8, 2t+b) must carry exactly B's value at k = its row.
    a = np.eye(16, dtype=np.float16)
    b = (np.arange(16)[:, None] * 8 + np.arange(8)[None, :]).astype(np.float16)
    d = _run(a, b, np.zeros((16, 8), np.float32))
    np.testing.assert_array_equal(d, b.astype(np.float32))


def test_accumulation_rounds_to_fp32_once_per_instruction():
    # 16 products of 2^-25 added to 1: one rounding keeps 1 + 2^-21; fp32 adds one at a time
    # would stay at 1.
    a = np.full((16, 16), 2.0 ** -12, np.float16)
    b = np.full((16, 8), 2.0 ** -13, np.float16)
    c = np.ones((16, 8), np.float32)
    d = _run(a, b, c)
    assert (d == np.float32(1 + 2.0 ** -21)).all()
    assert mma.accumulate(c, a, b)[0, 0] == np.float32(1 + 2.0 ** -21)


@FIXED
@given(mi=st.integers(1, 2), nj=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_tiles_equal_independent_instructions(mi, nj, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((3, 32, mi, 8)).astype(np.float16).view(np.uint32)  # [3, 32, MI, 4]
    b = rng.standard_normal((3, 32, nj, 4)).astype(np.float16).view(np.uint32)  # [3, 32, NJ, 2]
    c = rng.standard_normal((3, 32, nj, mi, 4)).astype(np.float32)
    d = mma.mma_tiles(a, b, c)
    for i in range(mi):
        for j in range(nj):
            np.testing.assert_array_equal(d[:, :, j, i], mma.mma_m16n8k16(a[:, :, i], b[:, :, j], c[:, :, j, i]))


@FIXED
@given(seed=st.integers(0, 2**16))
def test_result_is_one_rounding_of_the_float64_sum(seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 8)).astype(np.float16)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    exact = (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float32)
    np.testing.assert_array_equal(_run(a, b, c), exact)


@FIXED
@given(ctas=st.sampled_from([1, 3, 8, 16]), share=st.sampled_from(["none", "cta", "pairs", "all"]),
       zero=st.booleans(), seed=st.integers(0, 2**16), lanes_last=st.booleans(), mi=st.sampled_from([1, 2]))
def test_exact_chain_equals_its_steps_one_after_another(ctas, share, zero, seed, lanes_last, mi):
    """gemm_chain's matrix form (B shared by a CTA's warps, by groups of CTAs, or by none) against
    the k16 steps as independent instructions, each rounded to fp32; also exact_chain with C and
    D in the lanes-last layout [..., NJ, MI, 4, 32] (the PTX engine's register file order)."""
    rng = np.random.default_rng(seed)
    steps, w, nj = 3, 2, 4
    a = [rng.standard_normal((ctas, w, 16 * mi, 16)).astype(np.float16) for _ in range(steps)]
    b_shape = {"none": (ctas, w), "cta": (ctas, 1), "pairs": (ctas, 1), "all": (1, 1)}[share]
    b = [rng.standard_normal((*b_shape, 16, 8 * nj)).astype(np.float16) for _ in range(steps)]
    if share == "pairs":
        b = [np.repeat(x[::2], 2, axis=0)[:ctas] for x in b]
    c = np.zeros((ctas, w, 32, nj, mi, 4), np.float32) if zero else \
        rng.standard_normal((ctas, w, 32, nj, mi, 4)).astype(np.float32)
    _, _, c_pos, c_src = mma._tile_maps(mi, nj)
    want = np.take(c.reshape(ctas, w, -1), c_src, axis=-1)
    for x, y in zip(a, b):
        want = (x.astype(np.float64) @ y.astype(np.float64) + want).astype(np.float32)
    want = np.take(want.reshape(ctas, w, -1), c_pos, axis=-1)
    if lanes_last:
        c_ll = np.ascontiguousarray(np.moveaxis(c, 2, -1))
        got = np.moveaxis(mma.exact_chain(a, b, c_ll, c_is_zero=zero, lanes_last=True), -1, 2)
    else:
        got = mma.gemm_chain(a, b, c, c_is_zero=zero)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@FIXED
@given(a_by_column=st.booleans(), zero=st.booleans(), seed=st.integers(0, 2**16))
def test_exact_chain_sums_column_major_operands_as_a_matmul_of_them_does(a_by_column, zero, seed):
    """gemm_chain copies every B into a row-major buffer and an A whose columns are not contiguous
    column by column (dgemm and the copies are faster so): its sums, in their order, are still
    those of a float64 matmul of the operands as given - here B column-major, as sK^T reaches the
    QK GEMM, and A row- or column-major - with operands over fp16's whole exponent range, so that
    float64 sums round."""
    rng = np.random.default_rng(seed)
    ctas, w, mi, nj, steps = 8, 4, 1, 8, 4

    def wide(shape):
        return (rng.standard_normal(shape) * 2.0 ** rng.integers(-24, 12, shape)).astype(np.float16)

    a = [np.swapaxes(wide((ctas, w, 16, 16 * mi)), -1, -2) if a_by_column else wide((ctas, w, 16 * mi, 16))
         for _ in range(steps)]
    b = [np.swapaxes(wide((ctas, 1, 8 * nj, 16)), -1, -2) for _ in range(steps)]  # [ctas, 1, 16, 8NJ] column-major
    c = np.zeros((ctas, w, 32, nj, mi, 4), np.float32) if zero else \
        rng.standard_normal((ctas, w, 32, nj, mi, 4)).astype(np.float32)
    _, _, c_pos, c_src = mma._tile_maps(mi, nj)
    want = np.take(c.reshape(ctas, w, -1), c_src, axis=-1)
    for x, y in zip(a, b):
        want = (x.astype(np.float64) @ y.astype(np.float64) + want).astype(np.float32)  # y stays column-major
    want = np.take(want.reshape(ctas, w, -1), c_pos, axis=-1)
    np.testing.assert_array_equal(mma.gemm_chain(a, b, c, c_is_zero=zero).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("a_by_column", [False, True])
@pytest.mark.parametrize("share", ["pairs", "all"])
@pytest.mark.parametrize("lanes_last", [False, True])
def test_exact_chain_across_many_chunks(a_by_column, share, lanes_last, monkeypatch):
    """Small chunks (CHUNK_ELEMENTS), so that the chain runs many, with B shared by groups of CTAs
    or by all of them (then converted once, by the first chunk) and A in either order: the same
    bits as the steps one after another."""
    monkeypatch.setattr(mma, "CHUNK_ELEMENTS", 4 * 64 * 64)
    rng = np.random.default_rng(7)
    ctas, w, mi, nj, steps = 40, 4, 1, 8, 4
    a = [rng.standard_normal((ctas, w, 16, 16 * mi)).astype(np.float16) for _ in range(steps)]
    a = [np.swapaxes(x, -1, -2) if a_by_column else np.ascontiguousarray(np.swapaxes(x, -1, -2)) for x in a]
    b = [rng.standard_normal((ctas if share == "pairs" else 1, 1, 16, 8 * nj)).astype(np.float16) for _ in range(steps)]
    if share == "pairs":
        b = [np.repeat(x[::2], 2, axis=0) for x in b]
    c = rng.standard_normal((ctas, w, 32, nj, mi, 4)).astype(np.float32)
    _, _, c_pos, c_src = mma._tile_maps(mi, nj)
    want = np.take(c.reshape(ctas, w, -1), c_src, axis=-1)
    for x, y in zip(a, b):
        want = (x.astype(np.float64) @ y.astype(np.float64) + want).astype(np.float32)
    want = np.take(want.reshape(ctas, w, -1), c_pos, axis=-1)
    if lanes_last:  # C and D [..., NJ, MI, 4, 32]
        got = np.moveaxis(mma.exact_chain(a, b, np.ascontiguousarray(np.moveaxis(c, 2, -1)), lanes_last=True), -1, 2)
    else:
        got = mma.gemm_chain(a, b, c)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
