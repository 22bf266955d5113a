"""`fa time`'s limiter line and stalls come from the launch being timed (fa_sim.timing.predict._report):
the SM runs at each timed occupancy weighted by the SM-time the launch spends at each residency
(predict.dispatch's `residency`), and the verdict named from those numbers and the launch's
shape. A lone CTA, a short Nq = 1 launch, a causal grid's tail and the full grid each get their
own verdict, each checked against the numbers printed beside it."""

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.problem import Problem
from fa_sim.timing import predict
from fa_sim.timing.predict import FIXED_BOUND, IDLE_NOTED, LAUNCH_BOUND, _rates, dispatch, masked_extra
from fa_sim.timing.gpus import GPUS
from fa_sim.timing.sm import REASONS

SHAPES = {"full grid": (4, 16, 2048, 2048, False), "lone CTA": (1, 1, 64, 8192, False),
          "short Nq = 1": (2, 4, 1, 128, False), "causal": (2, 16, 3000, 3000, True)}


@pytest.fixture(scope="module")
def preds():
    return {name: predict(Problem(*shape, 1.0, KernelConfig()), "h200") for name, shape in SHAPES.items()}


def _kind(p) -> str:
    """The verdict the numbers printed with it call for (the thresholds of predict._report)."""
    n = p.notes
    if n["overhead_share"] >= LAUNCH_BOUND:
        return "launch bound"
    if n["fixed_share"] >= FIXED_BOUND:
        return "start-up/epilogue bound"
    if p.issue_slots > 0.8:
        return "issue bound"
    top = max((v, k) for k, v in p.pipes.items() if k in ("tensor", "smem", "fma", "alu", "xu"))
    return "shared-memory bound" if top[1] == "smem" and top[0] > 0.6 else "latency bound"


def test_each_launch_shape_gets_its_own_verdict_backed_by_its_numbers(preds):
    assert len({p.limiter for p in preds.values()}) == len(preds)
    assert len({p.notes["limiter_kind"] for p in preds.values()}) >= 3
    for name, p in preds.items():
        kind = _kind(p)
        assert p.notes["limiter_kind"] == kind and p.limiter.startswith(kind + ":"), (name, p.limiter)
        assert f"issue slots {p.issue_slots:.0%}" in p.limiter
        idle = p.notes["idle_sms"]
        assert (f"SMs idle {idle:.0%}" in p.limiter) == (idle >= IDLE_NOTED), (name, p.limiter)
        weights = p.notes["level_weights"]
        assert abs(sum(weights.values()) - 1) < 1e-9


def test_a_lone_cta_is_timed_as_one_cta_on_its_sm(preds):
    """One CTA: the one-CTA run's stalls and pipes (not the full occupancy's), latency bound, and
    every SM but one idle."""
    lone, full = preds["lone CTA"], preds["full grid"]
    assert lone.notes["level_weights"] == {"1": 1.0} and lone.notes["resident_ctas"] == 1.0
    assert lone.notes["idle_sms"] == pytest.approx(1 - 1 / GPUS["h200"].sms)
    assert lone.notes["limiter_kind"] == "latency bound" and "one CTA per busy SM (4 warps of 64)" in lone.limiter
    rates = _rates(KernelConfig(), False, GPUS["h200"], None, lone.occupancy)
    one = rates.runs[1]
    assert lone.stalls == pytest.approx({r: one.stalls[r] / one.issued for r in REASONS if one.stalls.get(r)})
    assert lone.issue_slots == pytest.approx(one.issued / one.cycles / 4)
    assert lone.issue_slots < full.issue_slots and lone.stalls["mio_throttle"] < full.stalls["mio_throttle"] / 4
    assert full.notes["level_weights"][str(full.occupancy)] > 0.9


def test_a_short_launch_is_named_by_its_overhead(preds):
    short, full = preds["short Nq = 1"], preds["full grid"]
    assert short.notes["overhead_share"] >= LAUNCH_BOUND > full.notes["overhead_share"]
    assert short.notes["fixed_share"] > 5 * full.notes["fixed_share"]  # few rounds: start-up and epilogue weigh
    assert f"launch overhead {short.notes['overhead_share']:.0%} of the time" in short.limiter


def test_a_causal_grids_tail_weighs_the_lower_occupancies(preds):
    causal, full = preds["causal"], preds["full grid"]
    w = causal.notes["level_weights"]
    assert sum(v for k, v in w.items() if int(k) < causal.occupancy) > 0.05
    assert causal.notes["idle_sms"] > 2 * full.notes["idle_sms"] and "the last wave's tail" in causal.limiter
    assert causal.notes["resident_ctas"] < full.notes["resident_ctas"]


def test_dispatch_residency_adds_up():
    """The SM-time shares at each residency sum to one; a grid of one CTA per SM on every SM
    spends it all at one; a lone CTA leaves all but one SM idle."""
    cfg, gpu = KernelConfig(), GPUS["h200"]
    for ctas, busy in ((gpu.sms, 1.0), (1, 1 / gpu.sms)):
        prob = Problem(1, ctas, 64, 1024, False, 1.0, cfg)
        rates = _rates(cfg, False, gpu, None, 4)
        res = np.zeros(5)
        dispatch(prob, rates, gpu.sms, masked_extra(rates, prob), residency=res)
        res /= res.sum()
        assert res[1] == pytest.approx(busy) and res[2:].sum() == 0
