"""fa_sim.estimate: time and memory before a run starts, and a clear refusal past the memory the
machine has (its physical memory or container limit, not the momentary free memory). The coefficients are measurements (module docstring); these tests hold the model's
structure and the refusal, not the speed of whatever machine runs them."""

import pytest

import fa_sim.estimate as est
from fa_sim import KernelConfig, Problem
from fa_sim.estimate import estimate


def _p(b=1, h=1, nq=1024, nk=1024, causal=False, cfg=KernelConfig()):
    return Problem(b, h, nq, nk, causal, 0.125, cfg)


def test_time_follows_the_cta_rounds_and_the_model():
    one, four = estimate(_p()), estimate(_p(nq=2048, nk=2048))
    assert four.sim_seconds == pytest.approx(4 * one.sim_seconds)
    assert estimate(_p(causal=True)).sim_seconds < 0.6 * one.sim_seconds
    assert estimate(_p(), "h200").sim_seconds > 20 * one.sim_seconds  # every product separately
    assert four.reference_seconds == pytest.approx(4 * one.reference_seconds)


def test_the_issues_run_gets_a_bounded_reference():
    """--seqlen 65536 --heads 16: the old whole reference needed 512 GiB; the blocked one < 1 GiB."""
    e = estimate(_p(h=16, nq=65536, nk=65536))
    assert e.reference_bytes < (1 << 30) and e.sim_seconds > 3600
    text = e.describe()
    assert "h and" in text and "16,777,216 CTA-rounds" in text and "available" in text


def test_memory_counts_inputs_outputs_and_one_wave():
    small, big = estimate(_p(nq=64, nk=64)), estimate(_p(h=64, nq=64 * 256, nk=64))
    assert big.sim_bytes - small.sim_bytes > 64 * 64 * 256 * 64 * 2 * 2  # q and o of the big one
    assert estimate(_p(h=64, nq=64 * 256, nk=64), wave_ctas=16).sim_bytes < big.sim_bytes


@pytest.mark.parametrize("seqlen", [3_000_000_000, 99999999999999999999])
def test_huge_runs_are_refused_in_one_line(seqlen):
    e = estimate(_p(nq=seqlen, nk=seqlen))
    with pytest.raises(ValueError) as info:
        e.check()
    msg = str(info.value)
    assert "more than the" in msg and "of memory this machine has" in msg and "\n" not in msg


def test_the_reference_counts_when_asked(monkeypatch):
    e = estimate(_p())
    monkeypatch.setattr(est, "machine_bytes", lambda: e.sim_bytes + 1)
    e = estimate(_p())
    e.check()
    with pytest.raises(ValueError, match="simulation and float64 reference need about"):
        e.check(reference=True)


def test_machine_memory_is_read():
    assert est.machine_bytes() >= est.available_bytes() > 0


def test_fa_sim_prints_the_estimate_before_a_long_run(monkeypatch, capsys):
    """`fa sim` states the time and memory it expects on stderr before any run that shows progress;
    a short run stays quiet."""
    import importlib

    from fa_sim.cli import main

    simulate_module = importlib.import_module("fa_sim.simulate")  # the package re-exports the function

    assert main(["sim", "--seqlen", "64"]) == 0
    assert "estimate:" not in capsys.readouterr().err
    monkeypatch.setattr(simulate_module, "PROGRESS_MIN_SECONDS", 0.0)
    assert main(["sim", "--seqlen", "64"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("fa sim: estimate: about ") and "for the float64 reference" in err and "available" in err


def test_fa_sim_refuses_a_reference_that_cannot_fit(monkeypatch, capsys):
    from fa_sim.cli import main

    monkeypatch.setattr(est, "machine_bytes", lambda: 1000)
    assert main(["sim", "--seqlen", "64"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "simulation and float64 reference need about" in err and "choose a smaller problem" in err
