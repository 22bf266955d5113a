"""The held-out GPU benchmark's method (experiments/hw_sets.py, issue 19), without a GPU: the test
shapes are disjoint from the training shapes and every tuned key they need was trained on; the
round-robin timing interleaves backends run by run after one unrecorded pass; ratios pair runs;
the shipped table was tuned on training shapes only and answers every test row from its own key."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from fa_hw.tuned import TUNED_DIR, Table, size_class

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "hw_sets.py"


@pytest.fixture(scope="module")
def sets():
    spec = importlib.util.spec_from_file_location("hw_sets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["hw_sets"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_test_set_is_held_out_and_covered(sets):
    sets.check_sets()
    assert not set(sets.TRAIN) & set(sets.TEST)
    assert {(b, h, n) for b, h, n, _ in sets.TRAIN}.isdisjoint({(b, h, n) for b, h, n, _ in sets.TEST})
    assert {c[3] for c in sets.TEST} == {32, 64, 128} and any(c[2] & (c[2] - 1) for c in sets.TEST)
    assert sets.keys(sets.TEST) <= sets.keys(sets.TRAIN)


def test_check_sets_names_an_overlap(sets, monkeypatch):
    monkeypatch.setattr(sets, "TEST", sets.TEST + [sets.TRAIN[0]])
    with pytest.raises(ValueError, match="in both"):
        sets.check_sets()


def test_round_robin_warms_up_then_interleaves(sets):
    calls = []
    timers = {name: (lambda name=name: calls.append(name) or float(len(calls))) for name in ("flash", "ours")}
    runs = sets.round_robin(timers, 3)
    assert calls == ["flash", "ours"] * 4  # one unrecorded pass, then three runs
    assert runs == {"flash": [3.0, 5.0, 7.0], "ours": [4.0, 6.0, 8.0]}
    spread = sets.ratios(runs["flash"], runs["ours"])
    assert (spread.lo, spread.median, spread.hi) == (3 / 4, 5 / 6, 7 / 8)


def test_shipped_table_comes_from_training_shapes_and_answers_each_test_row(sets):
    table = Table.load(TUNED_DIR / "h200.json")
    train = {tuple(c) for c in sets.TRAIN}
    for e in table.entries:
        assert e.shapes and {tuple(s) for s in e.shapes} <= train, e.key
    for b, h, n, d in sets.TEST:
        for causal in (False, True):
            entry = table.lookup(d, causal, size_class(n))
            assert entry is not None and entry.size == size_class(n), (b, h, n, d, causal)


def test_recorded_benchmark_is_the_test_set(sets):
    data = json.loads((SCRIPT.parent / "bench_hw_h200.json").read_text())
    assert data["set"] == "test" and data["runs"] >= 3
    assert {tuple(r["case"]) for r in data["rows"]} == set(sets.TEST)
    auto = [r for r in data["rows"] if r["backend"] == "fa_hw-auto"]
    assert len(auto) == 2 * len(sets.TEST) and all(len(r["runs_ms"]) == data["runs"] for r in auto)
    assert all(r["vs_flash_min"] <= r["vs_flash"] <= r["vs_flash_max"] and r["rel_err_fp64"] <= 1e-3 for r in auto)
