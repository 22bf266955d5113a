"""fa_sim.Problem: the one place the grid and the rounds per CTA are computed (SCHEDULE.md,
"Problem and grid"), checked against the schedule written out one CTA at a time (test oracle)."""

import pytest
from hypothesis import given, settings, strategies as st

from fa_sim import KernelConfig, Problem

FAMILY = KernelConfig.family()


def _rounds_oracle(p: Problem, cta: int) -> int:
    m_block = cta % -(-p.seqlen_q // p.config.block_m)
    keys = min(p.seqlen_k, (m_block + 1) * p.config.block_m) if p.causal else p.seqlen_k
    return -(-keys // p.config.block_n)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 700), st.integers(1, 700), st.booleans(),
       st.integers(0, len(FAMILY) - 1))
def test_grid_and_rounds_follow_the_schedule(b, h, nq, nk, causal, pick):
    p = Problem(b, h, nq, nk, causal, 0.125, FAMILY[pick])
    assert p.grid == (-(-nq // p.config.block_m), b * h) and p.n_ctas == p.grid[0] * p.grid[1]
    assert p.n_rounds == -(-nk // p.config.block_n)
    rounds = [_rounds_oracle(p, c) for c in range(p.n_ctas)]
    assert p.rounds_per_cta(range(p.n_ctas)).tolist() == rounds
    assert p.cta_rounds == sum(rounds)  # closed form
    assert p.flops == 4.0 * b * h * nq * nk * p.head_dim / (2 if causal else 1)


def test_sizes_far_past_memory_cost_nothing():
    p = Problem(1, 16, 10 ** 20, 10 ** 20, True, 0.125, KernelConfig())
    assert p.cta_rounds > 10 ** 30 and p.n_ctas == 16 * -(-10 ** 20 // 64)


@pytest.mark.parametrize("kw, message", [
    (dict(batch=0), "batch must be an integer >= 1"), (dict(seqlen_q=2.5), "seqlen_q must be an integer"),
    (dict(heads=True), "heads must be an integer"), (dict(config="seed"), "config must be a KernelConfig"),
])
def test_bad_fields_are_value_errors(kw, message):
    args = dict(batch=1, heads=1, seqlen_q=8, seqlen_k=8, causal=False, scale=1.0, config=KernelConfig())
    with pytest.raises(ValueError, match=message):
        Problem(**{**args, **kw})


def test_check_cta_names_the_grid():
    p = Problem(1, 2, 100, 100, False, 1.0, KernelConfig())
    assert p.check_cta(3) == 3
    with pytest.raises(ValueError, match=r"--cta 4 is outside the grid of 4 CTAs \(2 x 2\)"):
        p.check_cta(4, "--cta")


def test_cta_spans_name_runs_of_ids():
    from fa_sim.problem import cta_spans

    assert cta_spans([5, 4]) == "4..5" and cta_spans([7]) == "7"
    assert cta_spans([*range(8, 12), *range(4), 30]) == "0..3, 8..11, 30"
    assert cta_spans([0, 2, 4, 6]) == "0, 2, 4, ..."
