"""`fa time --backward` against the H100's tuned backward timings (issue 37 item 6, issue 35):
the recorded predictions of experiments/timing_backward_tuned.py (tests/data/h100/
timing_backward_tuned.json: per row the H100's measured median, the model's prediction under
"h200" (the GPU's CTA dispatch as a list schedule over the SM timed), under "h200_static" the model's
before it (CTA i on SM i mod 132), and under "h200_dispatch" those of round 41's experiment that timed
the dispatch's busiest SM with the SM model, not kept: docs/backward.md, "Against the H100's tuned
timings") held to the accuracy docs/backward.md reports.

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
    every row predicted by the model, the static assignment before it and the dispatch experiment,
    the halves on disjoint shapes."""
    fresh = {tuned.row_key(r): r for r in tuned.select_rows()}
    assert {tuned.row_key(r) for r in rows} == set(fresh)
    for r in rows:
        assert r["measured_ms"] == fresh[tuned.row_key(r)]["measured_ms"]
        assert {"h200", "h200_static", "h200_dispatch"} <= set(r["predicted"]), tuned.row_key(r)
    fit = {tuple(r["shape"]) for r in _half(rows, "fit")}
    assert fit and not fit & {tuple(r["shape"]) for r in _half(rows, "validate")}


# (half, model) -> the reported accuracy (docs/backward.md, "Timed"): MAPE at most, Spearman at least,
# pairs named right at least (of those 3 % apart)
REPORTED = {
    ("fit", "h200"): (7.3, 0.994, 24),  # 7.2 %, 0.995, 24 of 24 (round 45: a one-wave launch pays no fill; the
    ("validate", "h200"): (5.8, 0.978, 12),  # 5.7 %, 0.979, 12 of 12   preprocess and dQ conversion lose it)
    ("fit", "h200_r44"): (7.0, 0.994, 24),  # 6.9 %, 0.995, 24 of 24 (round 44: shared memory's wavefronts)
    ("validate", "h200_r44"): (5.7, 0.978, 12),  # 5.6 %, 0.979, 12 of 12
    ("fit", "h200_r43"): (10.4, 0.996, 24),  # 10.3 %, 0.997, 24 of 24 (the model before round 44)
    ("validate", "h200_r43"): (10.3, 0.987, 12),  # 10.2 %, 0.988, 12 of 12
    ("fit", "h200_static"): (8.3, 0.994, 23),  # 8.2 %, 0.995, 23 of 24
    ("validate", "h200_static"): (10.5, 0.942, 12),  # 10.4 %, 0.942, 12 of 12
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


def test_the_dispatch_leaves_one_common_bias(rows):
    """What dispatching the CTAs as the GPU does changes (docs/backward.md, "Against the H100's tuned
    timings"): with CTA i on SM i mod 132 (h200_static) the causal rows came out up to 26 % slow and
    the rest fast, errors that cancel in the MAPE; dispatched, every causal row is fast, so the
    validation half ranks better (Spearman 0.942 -> 0.988, the model; 0.989 round 41's experiment,
    which timed the dispatch's busiest SM with the SM model at 6x the CPU) at no worse a MAPE, and
    one factor fitted on the fitting half leaves about 3 % of MAPE on the validation half (9.2 % for
    the static assignment). The list schedule is within 1 % of the experiment on 80 of 96 rows, and
    every causal row but (4, 8, 5000, 128) 32x4s1 (+8.0 %) is fast. These are the predictions of
    that round's model (`h200_r43`: before round 44 charged shared memory its wavefronts), the
    generation the static and experiment keys were predicted with."""
    val = _half(rows, "validate")
    new, static = tuned.metrics(val, "h200_r43"), tuned.metrics(val, "h200_static")
    assert new["spearman"] > static["spearman"] + 0.04 and new["mape"] <= static["mape"], (new, static)
    for model, most in (("h200_r43", 3.2), ("h200_dispatch", 3.1)):
        assert _common_factor_mape(rows, model)["mape"] <= most, model
    assert _common_factor_mape(rows, "h200_static")["mape"] >= 9.0
    assert all(r["predicted"]["h200_dispatch"]["total_ms"] < r["measured_ms"] for r in rows if r["causal"])
    slow = [tuned.row_key(r) for r in rows if r["causal"] and r["predicted"]["h200_r43"]["total_ms"] > r["measured_ms"]]
    assert slow == [("base", (4, 8, 5000, 128), True, "32x4s1")], slow
    assert max(r["predicted"]["h200_static"]["total_ms"] / r["measured_ms"] for r in rows if r["causal"]) > 1.2
    ratio = [r["predicted"]["h200_r43"]["total_ms"] / r["predicted"]["h200_dispatch"]["total_ms"] for r in rows]
    assert sum(abs(x - 1) < 0.01 for x in ratio) >= 80 and 0.93 < min(ratio) and max(ratio) < 1.10


@pytest.mark.slow
def test_a_recorded_prediction_is_what_the_model_predicts_now(rows):
    """One small causal row predicted now equals its record: the file is the model's (a change of
    the model that moves it must record the predictions again: --predict --redo)."""
    row = next(r for r in rows if r["shape"] == [6, 8, 700, 64] and r["causal"] and r["label"] == "128x8s1r2")
    got = tuned._predict_one((tuple(row["shape"]), True, row["label"], "h200"))
    assert got["total_ms"] == pytest.approx(row["predicted"]["h200"]["total_ms"], rel=1e-9)


def test_the_main_kernel_timed_apart_is_within_its_reported_accuracy(rows):
    """tests/data/h100/timing_backward_tuned_kernels.json (the H100, each row's three kernels timed
    apart, round 44): the main kernel's prediction has MAPE 6.1 % (median error +1.4 %); the
    preprocess and dQ-conversion kernels are the ones left fast (median -28 % and -17 %)."""
    import json
    import statistics

    data = json.loads((tuned.ROOT / "tests" / "data" / "h100" / "timing_backward_tuned_kernels.json").read_text())
    by = {(tuple(r["shape"]), r["causal"], r["label"]): r for r in rows}
    err = {name: [] for name in tuned.KERNEL_NAMES}
    for m in data["rows"]:
        r = by[(tuple(m["shape"]), m["causal"], m["label"])]
        for name in tuned.KERNEL_NAMES:
            err[name].append(r["predicted"]["h200"]["kernels_ms"][name] / m["kernels_ms"][name] - 1)
    assert len(err["fa2_bwd_kernel"]) == 96
    main = err["fa2_bwd_kernel"]
    assert statistics.mean(map(abs, main)) <= 0.062 and abs(statistics.median(main)) <= 0.02, statistics.mean(map(abs, main))
    assert statistics.median(err["fa2_bwd_preprocess_kernel"]) < -0.2 and statistics.median(err["fa2_bwd_convert_dq_kernel"]) < -0.1
