"""`fa compare --timing` on a real GPU (marked `gpu`; skipped cleanly where there is none): the
measured kernel time and Nsight Compute's warp states beside the timing model's prediction."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import fa_hw
from fa_sim.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_alone]  # it measures the GPU beside the model


@pytest.fixture(scope="module")
def gpu():
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    if shutil.which("ncu") is None and not os.path.exists("/usr/local/cuda/bin/ncu"):
        pytest.skip("Nsight Compute (ncu) is not installed")
    return fa_hw.device_arch()


def test_compare_timing_sets_measured_beside_predicted(gpu, capsys):
    assert main(["compare", "--seqlen", "512", "--heads", "8", "--timing", "--json"]) == 0
    timing = json.loads(capsys.readouterr().out)["timing"]
    assert timing["measured_ms"] > 0 and len(timing["batch_ms"]) == 3
    assert timing["predicted"]["kernel_ms"] > 0 and abs(timing["error"]) < 0.5  # the same kernel, roughly its time
    ncu = timing["ncu"]
    # the model's dynamic SASS stream issues what the GPU executed (docs/timing.md: never fewer, at
    # most 0.02 % more: warps whose rows all lie past N_q leave before the last LSE store)
    assert ncu["inst_executed"] <= timing["predicted"]["instructions"] <= ncu["inst_executed"] * (1 + 2e-4)
    assert ncu["stalls"]["selected"] == pytest.approx(1.0, abs=0.01) and ncu["stalls"]["wait"] > 0
    assert main(["compare", "--seqlen", "256", "--heads", "2", "--timing"]) == 0
    out = capsys.readouterr().out
    assert "kernel time, measured vs the timing model" in out and "stall reason" in out


@pytest.mark.parametrize("options, feature", [
    (["--seqlens", "70,130,5", "--heads", "4", "--head-dim", "64", "--causal"], "packed"),
    (["--batch", "2", "--heads", "4", "--heads-k", "1", "--seqlen", "1", "--seqlen-k", "2000", "--cache-seqlens",
      "2000,700", "--head-dim", "64", "--splits", "4"], "split-KV"),
], ids=["packed", "split-kv"])
def test_compare_timing_of_a_packed_batch_and_of_split_kv(gpu, capsys, options, feature):
    """--timing on a packed batch (its FA_VARLEN launch) and on split-KV decoding (both launches timed
    and predicted, the split launch profiled): the measured time beside `fa time`'s prediction; the
    model's SASS stream of the profiled launch issues at least what the GPU executed."""
    assert main(["compare", *options, "--timing", "--json"]) == 0
    timing = json.loads(capsys.readouterr().out)["timing"]
    assert timing["measured_ms"] > 0 and len(timing["batch_ms"]) == 3
    pred = timing["predicted"]
    assert pred["feature"] == feature and pred["kernel_ms"] > 0
    if feature == "packed":  # split-KV: test_split_kv_timing_issues_what_the_gpu_executed
        assert timing["ncu"]["inst_executed"] <= pred["kernels"]["fa2_fwd_kernel"]["instructions"]
    assert timing["ncu"]["stalls"]["selected"] == pytest.approx(1.0, abs=0.01)
    assert main(["compare", *options, "--timing"]) == 0
    assert "kernel time, measured vs the timing model" in capsys.readouterr().out


def test_split_kv_timing_issues_what_the_gpu_executed(gpu, capsys):
    """The model's SASS stream of split-KV's split launch issues what the GPU executed, as a dense
    launch's does (test_compare_timing_sets_measured_beside_predicted): 84,924 warp instructions on
    the H100 (tests/data/h100/timing_ncu_splitkv.json, replayed on the CPU by
    tests/test_timing_launches.py), each divergent branch's BSYNC issued once per lane group."""
    assert main(["compare", "--batch", "2", "--heads", "4", "--heads-k", "1", "--seqlen", "1", "--seqlen-k", "2000",
                 "--cache-seqlens", "2000,700", "--head-dim", "64", "--splits", "4", "--timing", "--json"]) == 0
    timing = json.loads(capsys.readouterr().out)["timing"]
    executed, issued = timing["ncu"]["inst_executed"], timing["predicted"]["kernels"]["fa2_fwd_kernel"]["instructions"]
    assert executed <= issued <= executed * (1 + 2e-4)
