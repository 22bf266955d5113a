"""`fa time --backward` against the H100's tuned backward timings (issue 37 item 6, issue 35):
the recorded predictions of experiments/timing_backward_tuned.py (tests/data/h100/
timing_backward_tuned.json: per row the H100's measured median, the model's prediction under
"h200", and under "h200_dispatch" those of an experiment that dispatched every CTA as the GPU does
before timing the busiest SM, not kept: docs/backward.md, "Against the H100's tuned timings") held
to the accuracy docs/backward.md reports.

`python experiments/timing_backward_tuned.py --report` prints the same numbers; a prediction of
the model as it is now is compared with its record in the slow test (one small causal row, about
10-40 s on the 2-core machine with an empty cache).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from experiment_scripts import load

DATA = Path(__file__).parent / "data" / "h100" / "timing_backward_tuned.json"
tuned = load("timing_backward_tuned")


@pytest.fixture(scope="module")
def rows():
    return json.loads(DATA.read_text())["rows"]


def _half(rows, half):
    return [r for r in rows if r["half"] == half]


def test_the_rows_are_the_scripts_and_the_measurements_the_sources(rows):
    """The file holds the rows select_rows picks, measured as the tune files recorded them,
    every row predicted by the model and by the dispatch experiment, the halves on disjoint shapes."""
    fresh = {tuned.row_key(r): r for r in tuned.select_rows()}
    assert {tuned.row_key(r) for r in rows} == set(fresh)
    for r in rows:
        assert r["measured_ms"] == fresh[tuned.row_key(r)]["measured_ms"]
        assert {"h200", "h200_dispatch"} <= set(r["predicted"]), tuned.row_key(r)
    fit = {tuple(r["shape"]) for r in _half(rows, "fit")}
    assert fit and not fit & {tuple(r["shape"]) for r in _half(rows, "validate")}


# (half, model) -> the reported accuracy (docs/backward.md, "Timed"): MAPE at most, Spearman at least,
# pairs named right at least (of those 3 % apart)
REPORTED = {
    ("fit", "h200"): (8.3, 0.994, 23),  # 8.2 %, 0.995, 23 of 24
    ("validate", "h200"): (10.5, 0.942, 12),  # 10.4 %, 0.942, 12 of 12
    ("fit", "h200_dispatch"): (10.1, 0.996, 24),  # 10.0 %, 0.997, 24 of 24
    ("validate", "h200_dispatch"): (10.3, 0.988, 12),  # 10.2 %, 0.989, 12 of 12
}


@pytest.mark.parametrize("half,model", sorted(REPORTED))
def test_the_recorded_predictions_have_the_reported_accuracy(rows, half, model):
    mape, rho, right = REPORTED[(half, model)]
    m = tuned.metrics(_half(rows, half), model)
    assert m["n"] == len(_half(rows, half))
    assert m["mape"] <= mape and m["spearman"] >= rho and m["pairs_right"] >= right, m


def _common_factor_mape(rows, model):
    """The validation half's MAPE once every prediction is scaled by the fitting half's median
    measured / predicted ratio: what is left beside one common bias."""
    k = np.median([r["measured_ms"] / r["predicted"][model]["total_ms"] for r in _half(rows, "fit")])
    return tuned.metrics(_half(rows, "validate"), model, k)


def test_the_dispatch_experiment_leaves_one_common_bias(rows):
    """What dispatching the CTAs as the GPU does would change (docs/backward.md, "Against the H100's
    tuned timings"): with CTA i on SM i mod 132, the model's, the causal rows come out up to 26 %
    slow and the rest fast, errors that cancel in the MAPE; dispatched, every row is fast, so the
    validation half ranks better (Spearman 0.942 -> 0.989) and one factor fitted on the fitting half
    leaves 3.0 % of MAPE on the validation half (9.2 % for the model). Not kept: its busiest SM's CTA
    sequence does not repeat, and the cold causal (8, 32, 8192, 128) took 393 s of CPU against 68."""
    dispatched, static = _common_factor_mape(rows, "h200_dispatch"), _common_factor_mape(rows, "h200")
    assert dispatched["mape"] <= 3.1 and static["mape"] >= 9.0, (dispatched, static)
    val = _half(rows, "validate")
    assert tuned.metrics(val, "h200_dispatch")["spearman"] > tuned.metrics(val, "h200")["spearman"]
    assert all(r["predicted"]["h200_dispatch"]["total_ms"] < r["measured_ms"] for r in rows if r["causal"])
    assert max(r["predicted"]["h200"]["total_ms"] / r["measured_ms"] for r in rows if r["causal"]) > 1.2


@pytest.mark.slow
def test_a_recorded_prediction_is_what_the_model_predicts_now(rows):
    """One small causal row predicted now equals its record: the file is the model's (a change of
    the model that moves it must record the predictions again: --predict --redo)."""
    row = next(r for r in rows if r["shape"] == [6, 8, 700, 64] and r["causal"] and r["label"] == "128x8s1r2")
    got = tuned._predict_one((tuple(row["shape"]), True, row["label"], "h200"))
    assert got["total_ms"] == pytest.approx(row["predicted"]["h200"]["total_ms"], rel=1e-9)
