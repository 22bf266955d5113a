"""The timing model's sizes are checked before any work (issue 36): `fa time --seqlen 2147483647`
grew past 20 GB and was killed; now every entry (fa time, fa_sim.predict_time, predict, config
auto's ranking, fa sweep --timing) refuses a prediction past fa_sim.timing.cost's limit or this
machine's memory in one line naming the sizes, prints an estimate of a long one and its progress."""

import importlib
import re

import pytest

import fa_sim
from fa_sim import KernelConfig, Problem
from fa_sim.cli import main
from fa_sim.timing import cost as timing_cost_module
from fa_sim.timing.cost import MAX_SECONDS, timing_cost

HUGE = 2**31 - 1


@pytest.fixture
def no_model(monkeypatch):
    """Compiling or timing the kernel fails the test: refusals come first."""
    def boom(*a, **k):
        raise AssertionError("the timing model started before the sizes were checked")

    predict_module = importlib.import_module("fa_sim.timing.predict")  # fa_sim.timing.predict is the function
    monkeypatch.setattr(predict_module, "kernel_model", boom)
    monkeypatch.setattr(predict_module, "_rates", boom)


def _run(argv, capsys):
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("argv, named", [
    (["--seqlen", str(HUGE)], "--seqlen 2147483647"),
    (["--seqlen", "64", "--heads", "1", "--seqlen-k", str(HUGE)], "--seqlen-k 2147483647"),
    (["--batch", str(HUGE), "--heads", str(HUGE)], "--batch 2147483647 --heads 2147483647"),
    (["--seqlen", "1048576", "--causal"], "--seqlen 1048576"),
])
def test_fa_time_refuses_sizes_past_the_model_in_one_line(argv, named, capsys, no_model):
    status, err = _run(["time", *argv], capsys)
    assert status == 2 and err.count("\n") == 1, err
    # past the launch limits the grid's own message says how to fix it ("split the batch")
    assert err.startswith(f"fa time: error: --batch ") and named in err, err
    assert "lower --batch" in err or "split the batch" in err, err
    assert "limit" in err or "memory" in err, err


def test_the_api_refuses_before_any_work(no_model):
    with pytest.raises(ValueError, match=r"seqlen_q=2147483647.*CTAs.*lower batch, heads"):
        fa_sim.predict_time(1, 16, HUGE)
    with pytest.raises(ValueError, match=r"seqlen_k=2147483647"):
        fa_sim.timing.predict(Problem(1, 1, 64, HUGE, False, 1.0, KernelConfig()))


def test_config_auto_refuses_a_ranking_past_the_limit(no_model):
    from fa_sim.timing.rank import family_candidates, rank

    with pytest.raises(ValueError, match=r"config auto at Nk = 1048576"):
        rank(tuple(family_candidates(64)), 1048576, True, "h200")


def test_the_cost_grows_with_what_the_model_loops_over():
    """CTAs (the dispatch) and the rounds of the CTA path classes (a causal grid has one per Q
    block): both in the estimate; a small problem is far inside the limit."""
    small = timing_cost(Problem(4, 16, 2048, 2048, False, 1.0, KernelConfig()))
    assert small.ctas == 4 * 16 * 32 and small.seconds < 10
    more_heads = timing_cost(Problem(4, 64, 2048, 2048, False, 1.0, KernelConfig()))
    assert more_heads.seconds > small.seconds and more_heads.bytes > small.bytes
    causal = timing_cost(Problem(1, 1, 65536, 65536, True, 1.0, KernelConfig()))
    assert causal.walk_rounds >= 1024 * 1025 // 2  # a class per Q block, rounds 1..1024
    assert timing_cost(Problem(1, 16, HUGE, HUGE, False, 1.0, KernelConfig())).seconds > MAX_SECONDS


def test_a_long_prediction_prints_its_estimate_and_progress(monkeypatch, capsys):
    """8192 CTAs: the dispatch tells its progress (every PROGRESS_CTAS), the class walk too."""
    monkeypatch.setattr(timing_cost_module, "PROGRESS_FIRST_S", 0.0)
    monkeypatch.setattr(timing_cost_module, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(importlib.import_module("fa_sim.simulate"), "PROGRESS_MIN_SECONDS", 0.0)
    pred = fa_sim.timing.predict(Problem(1, 128, 4096, 4096, False, 1.0, KernelConfig()), "h200")
    err = capsys.readouterr().err
    assert pred.kernel_ms > 0
    lines = err.splitlines()
    assert lines[0].startswith("fa_sim.timing: estimate: about ") and "8,192 CTAs dispatched" in lines[0], err
    assert any(re.search(r"dispatching 8,192 CTAs over 132 SMs: [1-9][\d,]* of 8,192 \(\d+%\); \d+ s since the "
                         r"prediction started, about \d+ s left in this step", line) for line in lines), err
    assert any("walking the paths of" in line for line in lines), err
    quiet = fa_sim.timing.predict(Problem(1, 128, 4096, 4096, False, 1.0, KernelConfig()), "h200", progress=False)
    assert quiet.kernel_ms == pred.kernel_ms and capsys.readouterr().err == ""


def test_sweep_estimate_counts_the_observers_and_the_timing_model():
    """fa sweep attaches a bank counter and a hazard checker to every case (a (1, 4, 1024) run: 0.33 s
    plain, 9.9 s observed) and with --timing runs the timing model: its estimate said 3.4 s for a
    sweep that took 64 s. Both are in it now, and a timing case past the model's limit is refused."""
    from fa_sim.estimate import estimate
    from fa_sim.sweep import TIMING_MODEL_S, make_cases, estimate_cases

    case = make_cases([KernelConfig()], [(1, 4, 1024, 1024)], (False,))
    est = estimate(case[0].problem())
    plain = est.sim_seconds + est.reference_seconds
    observed = estimate_cases(case).seconds
    assert observed >= 9.0 > plain
    timed = make_cases([KernelConfig()], [(1, 4, 1024, 1024)], (False,), timing="h200")
    assert estimate_cases(timed).seconds >= observed + TIMING_MODEL_S
    huge = make_cases([KernelConfig()], [(1, 1, 1048576, 1048576)], (True,), timing="h200")
    with pytest.raises(ValueError, match=r"case .*: --shape 1,1,1048576,1048576: the timing model"):
        estimate_cases(huge)


def test_compare_timing_is_refused_before_the_gpu_runs(capsys, monkeypatch, no_model):
    """fa compare --timing predicts after the GPU run: its sizes are checked before the launch."""
    def no_launch(*a, **k):
        raise AssertionError("the GPU was launched before --timing's sizes were checked")

    monkeypatch.setattr("fa_hw.forward", no_launch)
    monkeypatch.setattr("fa_hw.runtime.check_launch", no_launch)
    status, err = _run(["compare", "--timing", "--seqlen", "1048576", "--causal", "--heads", "1"], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith("fa compare: error: --timing at (B, H, Nq, Nk) = (1, 1, 1048576, 1048576): the timing model")


def test_the_sm_model_prints_progress_while_a_run_goes_on(monkeypatch, capsys):
    """time_sm's runs cannot print from inside run_sm: a heartbeat thread says, after
    PROGRESS_SECONDS and every PROGRESS_EVERY, how many runs are done; nothing once they end."""
    import time

    from fa_sim.ptx import budget
    from fa_sim.timing.launch import _Heartbeat

    monkeypatch.setattr(budget, "PROGRESS_SECONDS", 0.02)
    monkeypatch.setattr(budget, "PROGRESS_EVERY", 0.02)
    done = [0]
    with _Heartbeat("the SM model of k", lambda: f"{done[0]} of 3 SM runs done"):
        time.sleep(0.15)
        done[0] = 2
        time.sleep(0.15)
    err = capsys.readouterr().err.splitlines()
    assert err and all(re.fullmatch(r"fa_sim\.timing: the SM model of k, still running after \d+ s \(working, "
                                    r"not hung\): [02] of 3 SM runs done", line) for line in err), err
    assert any(line.endswith("0 of 3 SM runs done") for line in err) and err[-1].endswith("2 of 3 SM runs done")
    time.sleep(0.1)
    assert capsys.readouterr().err == ""  # stopped with the block
