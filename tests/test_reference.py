"""fa_sim.reference: the spec's two-round worked example exactly (figures 4-10, table 1), its causal
variant (figure 12), the float64 reference against the naive formula, and the exact online
walk-through against both the direct exact formula and the float64 reference."""

from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fa_sim.reference import (
    NEG_INF, SPEC_EXAMPLE, Ln, attention, attention_blocks, attention_exact, block_rows, causal_mask, exact_scale,
    walkthrough,
)

INF = NEG_INF


@pytest.fixture(scope="module")
def example():
    return SPEC_EXAMPLE.walkthrough()


@pytest.fixture(scope="module")
def rounds(example):
    (block,) = example.blocks
    return block.rounds


def test_figures_1_to_4_inputs_and_scores(example):
    """Figures 1-3 (Q, K, V) and figure 4: S = Q K^T = [[0,1,2,0],[1,0,1,2]], e.g. S(0,2) = 2."""
    assert SPEC_EXAMPLE.q == ((1, 0), (0, 1)) and SPEC_EXAMPLE.k[2] == (2, 1) and SPEC_EXAMPLE.v[3] == (2, 0)
    assert example.s == ((0, 1, 2, 0), (1, 0, 1, 2))
    assert example.s[0][2] == 2
    assert example.scale == Ln(2) and float(example.scale) == math.log(2)


def test_round_1_figures_5_6_and_table_1(rounds):
    """Round 1 (keys 0, 1): m = 1 for both rows; P~(1) = [[1/2,1],[1,1/2]] (figure 5); l(1) = 3/2;
    O(1) = P~(1) V[0:2] = [[1/2,1],[1,1/2]] (figure 6); table 1 for query 0: m 1, l 3/2, O (1/2, 1)."""
    r1 = rounds[0]
    assert r1.t == 0 and r1.keys == (0, 1)
    assert r1.s == ((0, 1), (1, 0))
    assert r1.m_prev == (INF, INF) and r1.m == (1, 1)
    assert r1.alpha == (0, 0)  # "the first round is equivalent to alpha = 0"
    assert r1.p == ((F(1, 2), 1), (1, F(1, 2)))
    assert r1.rowsum == r1.l == (F(3, 2), F(3, 2))
    assert r1.pv == r1.o == ((F(1, 2), 1), (1, F(1, 2)))
    assert (r1.m[0], r1.l[0], r1.o[0]) == (1, F(3, 2), (F(1, 2), 1))  # table 1


def test_round_2_figures_7_8_9(rounds):
    """Round 2 (keys 2, 3): m 1 -> 2, alpha = 2^(1-2) = 1/2; the old weights of query 0 become
    (1/4, 1/2), the old l 3/4; P~(2) = [[1,1/4],[1/2,1]] (figure 7), rowsums 5/4, 3/2;
    l(2) = (2, 9/4); P~(2) V2 = [[3/2,1],[5/2,1/2]] (figure 8); O(2) = [[7/4,3/2],[3,3/4]] (figure 9)."""
    r1, r2 = rounds
    assert r2.t == 1 and r2.keys == (2, 3)
    assert r2.s == ((2, 0), (1, 2))
    assert r2.m_prev == (1, 1) and r2.m == (2, 2)
    assert r2.alpha == (F(1, 2), F(1, 2))
    assert tuple(r2.alpha[0] * x for x in r1.p[0]) == (F(1, 4), F(1, 2))
    assert r2.alpha[0] * r1.l[0] == F(3, 4)
    assert tuple(r2.alpha[0] * x for x in r1.o[0]) == (F(1, 4), F(1, 2))
    assert r2.p == ((1, F(1, 4)), (F(1, 2), 1))
    assert r2.rowsum == (F(5, 4), F(3, 2))
    assert r2.l == (2, F(9, 4))
    assert r2.pv == ((F(3, 2), 1), (F(5, 2), F(1, 2)))
    assert r2.o == ((F(7, 4), F(3, 2)), (3, F(3, 4)))


def test_figure_10_final_output_and_lse(example):
    """Figure 10: O = O(2) / l(2) = [[7/8,3/4],[4/3,1/3]], e.g. O(1,0) = 3 / (9/4) = 4/3;
    LSE = s m + log l = ln 8 and ln 9, equal to log(sum(exp(s S)))."""
    assert example.o == ((F(7, 8), F(3, 4)), (F(4, 3), F(1, 3)))
    assert example.lse == (Ln(8), Ln(9))
    assert [str(x) for x in example.lse] == ["ln(8)", "ln(9)"]
    direct = [math.log(sum(2.0 ** x for x in row)) for row in example.s]
    assert [float(x) for x in example.lse] == pytest.approx(direct, rel=1e-15)
    o, lse = attention(SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, scale=math.log(2))
    assert np.allclose(o, [[7 / 8, 3 / 4], [4 / 3, 1 / 3]], rtol=1e-14, atol=0)
    assert np.allclose(lse, [math.log(8), math.log(9)], rtol=1e-14, atol=0)


def test_figure_12_causal_variant_both_ways():
    """Figure 12: masked scores [[0,-inf,-inf,-inf],[1,0,-inf,-inf]]; the second K/V tile is skipped,
    (query 0, key 1) is masked inside the first. O = [[1,0],[2/3,1/3]], LSE ln 1 and ln 3 --
    by the online walk-through, by the direct exact formula, and by the float64 reference."""
    w = SPEC_EXAMPLE.walkthrough(causal=True)
    assert w.s_masked == ((0, INF, INF, INF), (1, 0, INF, INF))
    (block,) = w.blocks
    (r1,) = block.rounds  # keys 2, 3 are in the future of both queries: no second round
    assert r1.s_masked == ((0, INF), (1, 0))
    assert r1.m == (0, 1) and r1.p == ((1, 0), (1, F(1, 2))) and r1.l == (1, F(3, 2))
    assert w.o == ((1, 0), (F(2, 3), F(1, 3)))
    assert w.lse == (Ln(1), Ln(3))
    o_exact, lse_exact = attention_exact(SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, causal=True)
    assert (o_exact, lse_exact) == (w.o, w.lse)
    o, lse = attention(SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, causal=True, scale=math.log(2))
    assert np.allclose(o, [[1, 0], [2 / 3, 1 / 3]], rtol=1e-14, atol=1e-15)
    assert np.allclose(lse, [0, math.log(3)], rtol=1e-14, atol=1e-15)


def test_causal_mask_is_top_left():
    """Spec figure 12 / table 4: key k is visible to query q iff k <= q, also when Nq != Nk."""
    assert causal_mask(2, 4).tolist() == [[True, False, False, False], [True, True, False, False]]
    assert causal_mask(3, 2).tolist() == [[True, False], [True, True], [True, True]]


# == float64 reference against the naive formula =====================================================
def _naive(q, k, v, causal, scale):
    """softmax_row(s Q K^T) V written out one row at a time (test oracle)."""
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    lse = np.zeros(q.shape[:-1])
    for idx in np.ndindex(q.shape[:-1]):
        *batch, i = idx
        keys = range(k.shape[-2] if not causal else min(i + 1, k.shape[-2]))
        scores = [scale * float(np.dot(q[idx], k[(*batch, j)])) for j in keys]
        weights = [math.exp(x) for x in scores]
        out[idx] = sum(w * v[(*batch, j)] for w, j in zip(weights, keys)) / sum(weights)
        lse[idx] = math.log(sum(weights))
    return out, lse


@settings(max_examples=60, deadline=None)
@given(st.data(), st.tuples(st.integers(1, 2), st.integers(1, 2)), st.integers(1, 9), st.integers(1, 9),
       st.integers(1, 8), st.integers(1, 5), st.booleans(), st.one_of(st.none(), st.floats(0.05, 2.0)))
def test_float64_reference_matches_the_naive_formula(data, batch, n_q, n_k, d, dv, causal, scale):
    floats = st.floats(-3, 3, allow_nan=False, width=64)
    q = data.draw(hnp.arrays(np.float64, batch + (n_q, d), elements=floats))
    k = data.draw(hnp.arrays(np.float64, batch + (n_k, d), elements=floats))
    v = data.draw(hnp.arrays(np.float64, batch + (n_k, dv), elements=floats))
    o, lse = attention(q, k, v, causal=causal, scale=scale)
    o_ref, lse_ref = _naive(q, k, v, causal, 1 / math.sqrt(d) if scale is None else scale)
    assert o.shape == batch + (n_q, dv) and lse.shape == batch + (n_q,)
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-12, atol=1e-12)


def _unblocked(q, k, v, causal, scale):
    """The definition over whole arrays at once (test oracle for the blocked reference)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = scale * (q @ np.swapaxes(k, -1, -2))
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    return (p @ v) / p.sum(axis=-1, keepdims=True), (m + np.log(p.sum(axis=-1, keepdims=True)))[..., 0]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 70), st.integers(1, 70), st.booleans(), st.integers(1, 9),
       st.integers(0, 2**16))
def test_blocked_reference_equals_the_unblocked_one(heads, n_q, n_k, causal, rows, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, heads, n, 16)).astype(np.float16) for n in (n_q, n_k, n_k))
    o, lse = attention(q, k, v, causal=causal, block_bytes=rows * 16 * n_k)  # `rows` query rows per block
    o_ref, lse_ref = _unblocked(q, k, v, causal, 0.25)
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-14, atol=1e-14)


def test_blocks_cover_every_row_once_within_the_budget():
    q = np.ones((1, 2, 1000, 8), np.float16)
    budget = 16 * 300 * 37
    blocks = list(attention_blocks(q, q[:, :, :300], q[:, :, :300], block_bytes=budget))
    assert block_rows(300, budget) == 37 and {b.rows.stop - b.rows.start for b in blocks} == {37, 1000 % 37}
    seen = np.zeros((2, 1000), int)
    for b in blocks:
        seen[b.index, b.rows] += 1
    assert np.all(seen == 1)


def test_float64_reference_is_stable_for_large_scores():
    """s S = 4e5 everywhere: the max is subtracted before exp, so nothing overflows."""
    q = np.full((1, 3, 4), 100.0)
    v = np.eye(3, 4)[None]
    o, lse = attention(q, q, v, scale=10.0)
    assert np.allclose(o, v.mean(axis=-2, keepdims=True), rtol=1e-14)
    assert np.allclose(lse, 10.0 * 4e4 + math.log(3), rtol=1e-14)


@pytest.mark.parametrize("args, kwargs, match", [
    ((np.ones(4), np.ones((4, 2)), np.ones((4, 2))), {}, "ranks"),
    ((np.ones((3, 2)), np.ones((4, 3)), np.ones((4, 2))), {}, "do not match"),
    ((np.ones((3, 2)), np.ones((4, 2)), np.ones((5, 2))), {}, "do not match"),
    ((np.ones((0, 2)), np.ones((4, 2)), np.ones((4, 2))), {}, "empty"),
    ((np.full((3, 2), np.nan), np.ones((4, 2)), np.ones((4, 2))), {}, "NaN"),
    ((np.ones((3, 2)), np.ones((4, 2)), np.ones((4, 2))), {"scale": -1.0}, "positive"),
])
def test_float64_reference_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        attention(*args, **kwargs)


# == the exact walk-through ==========================================================================
SCALES = st.sampled_from([Ln(2), Ln(3), Ln(F(3, 2)), math.log(2), math.log(5)])


@settings(max_examples=80, deadline=None)
@given(st.data(), st.integers(1, 6), st.integers(1, 7), st.integers(1, 3), st.integers(1, 3), SCALES,
       st.booleans())
def test_walkthrough_is_exact_attention_for_any_blocks(data, n_q, n_k, d, dv, scale, causal):
    """For random integer inputs and any block sizes: the online walk-through equals the direct
    exact formula as fractions, and the float64 reference to rounding."""
    ints = st.integers(-2, 2)
    q = data.draw(hnp.arrays(np.int64, (n_q, d), elements=ints))
    k = data.draw(hnp.arrays(np.int64, (n_k, d), elements=ints))
    v = data.draw(hnp.arrays(np.int64, (n_k, dv), elements=st.integers(-3, 3)))
    block_m, block_n = data.draw(st.integers(1, n_q)), data.draw(st.integers(1, n_k))
    w = walkthrough(q, k, v, scale=scale, block_m=block_m, block_n=block_n, causal=causal)
    assert (w.o, w.lse) == attention_exact(q, k, v, scale=scale, causal=causal)
    s = float(exact_scale(scale))
    o, lse = attention(q, k, v, causal=causal, scale=s)
    np.testing.assert_allclose(np.array(w.o, dtype=float), o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose([float(x) for x in w.lse], lse, rtol=1e-12, atol=1e-12)
    assert len(w.blocks) == -(-n_q // block_m)
    for blk in w.blocks:
        last_key = min(n_k, blk.rows[0] + block_m) if causal else n_k
        assert len(blk.rounds) == -(-last_key // block_n)  # n_block_max: future blocks skipped


@settings(max_examples=40, deadline=None)
@given(st.data(), st.integers(1, 5), st.integers(2, 8), st.integers(1, 4), st.booleans())
def test_every_round_state_is_softmax_over_the_keys_seen(data, n_q, n_k, block_n, causal):
    """The recurrence's invariant: after round j, m is the max over the visible keys seen so far,
    l = sum b^(S - m) over them, and O = sum b^(S - m) V over them."""
    ints = st.integers(-2, 2)
    q = data.draw(hnp.arrays(np.int64, (n_q, 2), elements=ints))
    k = data.draw(hnp.arrays(np.int64, (n_k, 2), elements=ints))
    v = data.draw(hnp.arrays(np.int64, (n_k, 2), elements=ints))
    w = walkthrough(q, k, v, scale=Ln(2), block_n=block_n, causal=causal)
    s = np.array(w.s, dtype=object)
    for r in w.blocks[0].rounds:
        for i in range(n_q):
            seen = [j for j in range(r.keys[-1] + 1) if not (causal and j > i)]
            m = max(s[i, j] for j in seen)
            assert r.m[i] == m
            weights = {j: F(2) ** int(s[i, j] - m) for j in seen}
            assert r.l[i] == sum(weights.values())
            assert r.o[i] == tuple(sum(weights[j] * int(v[j, c]) for j in seen) for c in range(2))


@pytest.mark.parametrize("scale, match", [
    (0.125, "not ln"), (1 / math.sqrt(64), "not ln"), (Ln(1), "not positive"), (Ln(F(1, 2)), "not positive"),
    (float("nan"), "not ln"),
])
def test_walkthrough_rejects_inexact_scales(scale, match):
    with pytest.raises(ValueError, match=match):
        walkthrough(SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, scale=scale)


def test_exact_scale_recognises_ln_of_a_rational():
    assert exact_scale(math.log(2)) == Ln(2)
    assert exact_scale(math.log(1.5)) == Ln(F(3, 2))
    assert exact_scale(Ln(3)) == Ln(3)


def test_walkthrough_rejects_non_integer_scores_and_bad_blocks():
    with pytest.raises(ValueError, match="not an integer"):
        walkthrough([[F(1, 2), 0]], [[1, 0]], [[1, 0]])
    with pytest.raises(ValueError, match="block sizes"):
        walkthrough([[1, 0]], [[1, 0]], [[1, 0]], block_n=0)
    with pytest.raises(ValueError, match="rational"):
        walkthrough([[float("inf"), 0]], [[1, 0]], [[1, 0]])
    with pytest.raises(ValueError, match="2-D"):
        walkthrough([1, 0], [[1, 0]], [[1, 0]])
    # non-integer values and fractional Q/K whose products are integers are fine
    w = walkthrough([[F(1, 2), 0]], [[2, 0]], [[F(1, 3), 0.5]])
    assert w.o == ((F(1, 3), F(1, 2)),)


def test_a_round_that_hides_every_key_of_a_row_changes_nothing():
    """Causal, one key per round: in round 2 query 0 sees no key (table 4's -inf), so its m stays,
    alpha = 2^0 = 1, its P~ row is 0 and l, O are unchanged."""
    w = walkthrough([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]], block_n=1, causal=True)
    r1, r2 = w.blocks[0].rounds
    assert r2.s_masked[0] == (INF,) and r2.m[0] == r1.m[0] == 1
    assert r2.alpha[0] == 1 and r2.p[0] == (0,) and r2.l[0] == r1.l[0] and r2.o[0] == r1.o[0]
    assert w.o[0] == (1, 0) and w.lse[0] == Ln(2)
