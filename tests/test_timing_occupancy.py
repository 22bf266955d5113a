"""The timing model with the occupancy forced down (fa_sim.timing.predict's ctas_per_sm) and
experiments/timing_occupancy.py, which sets the GPU's times at each forced occupancy beside it."""

from __future__ import annotations

import itertools
import json

import experiment_scripts
import pytest

import fa_hw
from fa_sim.config import KernelConfig
from fa_sim.problem import Problem
from fa_sim.timing import predict
from fa_sim.timing.gpus import H200


@pytest.fixture(scope="module")
def to():
    return experiment_scripts.load("timing_occupancy")


SEED = Problem(2, 8, 1024, 1024, False, 1.0, KernelConfig())
FULL = Problem(8, 16, 1024, 1024, False, 1.0, KernelConfig())  # 1,024 CTAs: more than the H200's slots at 4 an SM


def test_the_kernels_own_occupancy_forced_is_the_plain_prediction():
    own = predict(SEED, "h200")
    same = predict(SEED, "h200", ctas_per_sm=own.occupancy)
    assert same.kernel_ms == own.kernel_ms and same.occupancy == own.occupancy


def test_fewer_ctas_per_sm_are_slower_on_a_full_grid():
    """(SEED's 128 CTAs are one wave at any occupancy: the SMs hold one each, and no slot refills.)"""
    own = predict(FULL, "h200")
    times = [predict(FULL, "h200", ctas_per_sm=j).kernel_ms for j in range(1, own.occupancy + 1)]
    assert all(a > b for a, b in itertools.pairwise(times)), times
    assert [predict(SEED, "h200", ctas_per_sm=j).occupancy for j in (1, 2)] == [1, 2]


@pytest.mark.parametrize("bad", [0, -1, 99, 1.5, True, "2"])
def test_a_forced_occupancy_outside_one_to_the_kernels_own_is_refused(bad):
    with pytest.raises(ValueError, match=r"ctas_per_sm must be an integer from 1 to \d+"):
        predict(SEED, "h200", ctas_per_sm=bad)


def test_the_padding_leaves_room_for_exactly_j_ctas(to):
    smem = KernelConfig.from_tag("m64n32d32w4-swizzled").smem_bytes
    for j in range(1, 8):
        pad = to.padded_smem(smem, j)
        assert pad >= smem and H200.smem_per_sm // (pad + H200.smem_reserved) == j
    assert to.padded_smem(smem, 60) is None  # the kernel's own shared memory allows fewer
    assert to.padded_smem(KernelConfig().smem_bytes, 10) is None  # 9 fit by the arithmetic, 10 do not


def test_the_padding_search_takes_the_largest_size_the_driver_gives_j_at(to):
    def carve(smem):  # a driver whose CTAs take shared memory in 8 KB steps (the carve-out's effect)
        return H200.smem_per_sm // (-(-(smem + H200.smem_reserved) // 8192) * 8192)
    own = 8192
    for j in range(1, 8):
        pad = to.driver_padding(carve, own, j)
        if pad is not None:
            assert carve(pad) == j and carve(pad + to.STEP) != j
    assert to.driver_padding(carve, own, 5) is not None and to.padded_smem(own, 5) > to.driver_padding(carve, own, 5)
    assert to.driver_padding(lambda s: 9, own, 5) is None  # the driver never gives 5


def test_the_recording_covers_every_case_from_one_cta_to_its_own_occupancy(to):
    """Every level a padding reaches (the driver's occupancy calculator confirmed each)."""
    data = json.loads(to.DATA.read_text())
    assert data["meta"]["gpu"] == "NVIDIA H200"
    rec = to.load(to.DATA)
    assert set(rec) == {c.key for c in to.CASES}
    for key, times in rec.items():
        row = next(r for r in data["rows"] if r["key"] == key)
        assert times and set(times) <= set(range(1, row["own"] + 1)) and row["own"] in times, key
        case = to.Case.from_key(key)
        assert predict(to.problem(case), "h200").occupancy == row["own"], key  # the model's occupancy is the driver's
        assert times[1] > times[row["own"]]  # one CTA per SM is slower than the kernel's own occupancy


@pytest.mark.slow
def test_the_report_sets_the_model_beside_each_recorded_point(to):
    text = to.report(to.load(to.DATA))
    for case in to.CASES:
        assert case.key in text
    assert text.count("\n| ") >= sum(len(t) for t in to.load(to.DATA).values()) + len(to.CASES)


@pytest.mark.gpu
def test_the_measurement_forces_the_occupancy_the_driver_confirms(to, tmp_path, monkeypatch):
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    pytest.importorskip("torch")
    monkeypatch.setattr(to, "CASES", (to.Case("m64n64d64w4-swizzled", (2, 8, 1024, 1024, 64), False),))
    rows = json.loads(to.measure(tmp_path, 1, 2, 1).read_text())["rows"]
    assert [r["ctas_per_sm"] for r in rows] == list(range(1, rows[0]["own"] + 1))  # 1 to 4: each one reached
    assert rows[0]["kernel_ms"] > rows[-1]["kernel_ms"] > 0


@pytest.mark.gpu
def test_the_profile_run_launches_each_forced_occupancy_once_and_names_it(to, monkeypatch, capsys):
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    pytest.importorskip("torch")
    case = to.Case("m64n64d64w4-swizzled", (2, 8, 1024, 1024, 64), False)
    monkeypatch.setattr(to, "CASES", (case,))
    to.profile()
    named = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("profiled ")]
    assert named == [["profiled", case.key, str(j)] for j in range(1, 5)]  # its own occupancy is 4
