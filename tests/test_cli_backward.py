"""The backward pass in the `fa` command: `fa explain --backward` (exact fractions against the
float64 reference), `fa sim --backward` (errors against the derived bound, bad input, hazards),
`fa banks --backward` and `fa trace --backward` (one lane's S, P, dP, dS, dV, dK at their
coordinates against float64). Shapes are small: every lane of the PTX engine is simulated."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from fa_sim.cli import main
from fa_sim.reference import SPEC_EXAMPLE, Ln, attention_backward, walkthrough_backward


def _floats(m) -> np.ndarray:
    return np.array([[float(Fraction(x)) for x in row] for row in m], dtype=np.float64)


# -- fa explain --backward ------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("block_n", [1, 2, 4])
def test_exact_backward_walkthrough_equals_float64(causal, block_n):
    w = SPEC_EXAMPLE.walkthrough_backward(causal=causal, block_n=block_n)
    q, k, v, do = (_floats(x) for x in (SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, SPEC_EXAMPLE.do))
    dq, dk, dv = attention_backward(q, k, v, do, causal=causal, scale=math.log(2))
    s = math.log(2)
    np.testing.assert_allclose(s * _floats(w.dq_over_s), dq, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(s * _floats(w.dk_over_s), dk, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(_floats(w.dv), dv, rtol=1e-14, atol=1e-15)
    # every intermediate is an exact Fraction (2^S with integer S keeps them rational)
    for blk in w.blocks:
        for m in (blk.p, blk.dp, blk.ds, blk.dv, blk.dk_over_s, blk.dq_over_s):
            assert all(isinstance(x, Fraction) for row in m for x in row)
    assert all(sum((sum(b.ds[i]) for b in w.blocks), Fraction(0)) == 0 for i in range(len(w.o)))
    assert w.dq_over_s == w.blocks[-1].dq_sum_over_s


def test_exact_backward_known_values():
    """Hand-checkable values of the default example (dO = [[1, -1], [2, 1]]): D = rowsum(dO o O) with
    O = [[7/8, 3/4], [4/3, 1/3]] is (7/8 - 3/4, 8/3 + 1/3) = (1/8, 3); P of block 0 row 0 is
    2^0 / 8, 2^1 / 8."""
    w = SPEC_EXAMPLE.walkthrough_backward()
    assert w.d == (Fraction(1, 8), Fraction(3))
    assert w.blocks[0].p[0] == (Fraction(1, 8), Fraction(1, 4))
    assert w.blocks[0].ds[0] == (Fraction(7, 64), Fraction(-9, 32))  # 1/8 (1 - 1/8), 1/4 (-1 - 1/8)
    assert w.dq_over_s == ((Fraction(-13, 32), Fraction(33, 64)), (Fraction(-2, 9), Fraction(2, 3)))


def test_exact_backward_refuses_bad_inputs():
    with pytest.raises(ValueError, match=r"do must have shape \[Nq, dv\]"):
        walkthrough_backward(SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, ((1, 2),), scale=Ln(2))
    with pytest.raises(ValueError, match="not ln"):
        walkthrough_backward(SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, SPEC_EXAMPLE.do, scale=0.5)


def test_fa_explain_backward_prints_the_exact_tables(capsys):
    assert main(["explain", "--backward"]) == 0
    out = capsys.readouterr().out
    assert "D = rowsum(dO o O)" in out and "K/V block 1: keys 2, 3" in out
    assert "-13/32  33/64" in out  # dQ / s row 0
    assert "Check: each row of dS sums to 0, 0" in out
    assert main(["explain", "--backward", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["d"] == ["1/8", "3"] and data["dq_over_s"][0] == ["-13/32", "33/64"]
    assert [b["keys"] for b in data["blocks"]] == [[0, 1], [2, 3]]
