"""What `fa time` costs (issue 35, item 3: every problem up to (8, 32, 8192, 128) in 10 s warm and
30 s with an empty cache on the 2-core development machine). Counted, not timed: the work that is
not the dispatch - engine probes, SM runs and the cycles they simulate - must not grow with the
sequence length, batch or heads, and a second process must find the SM runs on disk and run none.
The measured times are in docs/timing.md, "How long it takes"."""

from __future__ import annotations

import importlib
import json

import pytest

pytest.importorskip("cuda.bindings")

from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402

pm = importlib.import_module("fa_sim.timing.predict")  # the module (the package's `predict` is its function)
stream_module = importlib.import_module("fa_sim.timing.stream")


def _forget() -> None:
    """Drop every in-memory cache of the timing model: what a new process starts with."""
    pm._rates.cache_clear()
    pm.kernel_model.cache_clear()
    stream_module._cached.cache_clear()


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """Counts of SM runs (and their simulated cycles) and engine probes while predicting; each
    `fresh()` points the disk cache at an empty directory and forgets the in-memory caches."""
    work = {"sm_runs": 0, "cycles": 0.0, "probes": 0}
    run_sm, run_probe = pm.run_sm, stream_module._run_probe

    def counting_run_sm(*a, **k):
        run = run_sm(*a, **k)
        work["sm_runs"] += 1
        work["cycles"] += run.cycles
        return run

    def counting_probe(*a, **k):
        work["probes"] += 1
        return run_probe(*a, **k)

    monkeypatch.setattr(pm, "run_sm", counting_run_sm)
    monkeypatch.setattr(stream_module, "_run_probe", counting_probe)
    dirs = iter(range(100))

    def fresh():
        monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / f"cache{next(dirs)}"))
        _forget()
        work.update(sm_runs=0, cycles=0.0, probes=0)
        return work

    yield fresh
    _forget()


def test_the_model_work_does_not_grow_with_the_problem(counted):
    """From empty caches, (1, 4, 1024) and (8, 32, 8192) causal run the same SM runs for the same
    simulated cycles (the representative CTAs: a steady round extrapolated by the dispatch), and the
    longer one no more engine probes than a probe's length allows (probes of at most
    stream.probe_rounds rounds, longer CTAs repeat a steady round)."""
    cfg = KernelConfig()
    work = counted()
    pm.predict_probed(Problem(1, 4, 1024, 1024, True, 1.0, cfg), progress=False)
    small = dict(work)
    work = counted()
    pm.predict_probed(Problem(8, 32, 8192, 8192, True, 1.0, cfg), progress=False)
    big = dict(work)
    assert small["sm_runs"] > 0 and small["probes"] > 0
    assert (big["sm_runs"], big["cycles"]) == (small["sm_runs"], small["cycles"])
    assert big["probes"] <= small["probes"] + 2, (small, big)


def test_a_second_process_reads_the_sm_runs_from_disk_and_predicts_the_same(counted):
    """The SM rates are cached on disk (timing-rates): with the in-memory caches forgotten, the
    same prediction runs no SM and no engine probe and gives the same numbers; a damaged entry is
    run again."""
    prob = Problem(2, 8, 2048, 2048, False, 1.0, KernelConfig())
    work = counted()
    first = pm.predict_probed(prob, progress=False)
    assert work["sm_runs"] > 0
    _forget()
    work.update(sm_runs=0, cycles=0.0, probes=0)
    again = pm.predict_probed(prob, progress=False)
    assert (work["sm_runs"], work["probes"]) == (0, 0)
    assert again == first
    from fa_sim.cache import cache_root

    entries = list((cache_root() / "timing-rates").glob("*.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["per_round"]
    entries[0].write_text("{not json")
    _forget()
    third = pm.predict_probed(prob, progress=False)
    assert work["sm_runs"] > 0 and third == first


def test_the_rates_key_changes_with_what_the_sm_runs_read(counted):
    """Another GPU model, occupancy or kernel config is another entry, never a stale one."""
    counted()
    model = pm.kernel_model(KernelConfig(), False, "sm_90", None)
    h200 = pm.GPUS["h200"]
    key = pm.rates_key(model, h200, 2)
    assert key == pm.rates_key(model, h200, 2)
    assert key != pm.rates_key(model, h200, 3)
    assert key != pm.rates_key(model, h200.with_(mufu_latency=h200.mufu_latency + 1), 2)
    other = pm.kernel_model(KernelConfig(block_m=128), False, "sm_90", None)
    assert key != pm.rates_key(other, h200, 2)
