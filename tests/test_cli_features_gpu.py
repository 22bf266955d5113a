"""`fa compare --save` of issue 38's features on a real GPU (marked `gpu`, skipped cleanly without
one), then the recording replayed with `--gpu-npz` (the CPU path of tests/test_cli_features.py):
GQA, a sliding window, softcap and bf16, on shapes with tails, every checkpoint, O and LSE
bit-identical both times, and the recording holding the features it ran. `fa compare --banks` of
the same runs against Nsight Compute (skipped without ncu), and `fa hw` on a packed batch."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import fa_hw
from fa_sim.cli import main
from fa_sim.crosscheck import SavedRun

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu():
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    return fa_hw.device_arch()

SHAPE = ["--seqlen", "200", "--seqlen-k", "150", "--heads", "4", "--heads-k", "2"]
CASES = [
    (["--window", "40,8"], (40, 8), None, "fp16"),
    (["--causal", "--window", "64,-1", "--softcap", "7.5", "--dtype", "bf16"], (64, -1), 7.5, "bf16"),
    (["--softcap", "3", "--block-m", "128", "--kv-stages", "2"], None, 3.0, "fp16"),
]


def _json(argv) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    report = json.loads(out.getvalue())
    assert status == 0 and report["ok"], (argv, report)
    return report


@pytest.mark.parametrize("options, window, softcap, dtype", CASES)
def test_compare_save_then_replay_a_feature_run(gpu, tmp_path, options, window, softcap, dtype):
    path = str(tmp_path / "run.npz")
    live = _json(["compare", *SHAPE, *options, "--ctas", "0,5", "--save", path, "--json"])
    run = SavedRun.load(path)
    assert run.heads_k == 2 and run.softcap == softcap and run.config.dtype == dtype
    assert run.window == window
    replay = _json(["compare", "--gpu-npz", path, "--json"])
    assert replay["features"] == live["features"] and replay["o"]["fraction_identical"] == 1.0


@pytest.fixture(scope="module")
def ncu(gpu):
    import os
    import shutil

    if shutil.which("ncu") is None and not os.path.exists("/usr/local/cuda/bin/ncu"):
        pytest.skip("Nsight Compute (ncu) is not installed")


@pytest.mark.parametrize("options", [[], ["--seqlen-k", "200"], *(c[0] for c in CASES)])
def test_compare_banks_of_a_feature_run_match_nsight_compute(ncu, options):
    """fa compare --banks with GQA and each feature (bf16 among them): every class's instructions,
    wavefronts and conflicts as Nsight Compute counts them on that build. The GQA build's SASS
    issues Q's interior copy arm with a false guard in a Q-tail CTA (m64n64d64w4-swizzled, sm_90:
    4 CTAs x 4 warps x 4 = 64 LDGSTS beyond the PTX's cp.async, tests/test_banks_issued.py), which
    the simulator's instructions include; a K/V tail of 22 rows costs 64 LDGSTS wavefronts more."""
    report = _json(["compare", *SHAPE, *options, "--banks", "--json"])
    assert all(c["match"] for c in report["banks"]["classes"].values()), report["banks"]
    if not options:  # the default config: the launch the counts above were measured on (H100)
        ldgsts = report["banks"]["classes"]["LDGSTS"]
        assert (ldgsts["sim"]["ptx_instructions"], ldgsts["sim"]["sass_guard_off"]) == (1792, 64), ldgsts
        assert (ldgsts["ncu"]["instructions"], ldgsts["ncu"]["wavefronts"]) == (1856, 7232), ldgsts


def test_hw_runs_a_packed_batch(gpu):
    """fa hw --seqlens: the FA_VARLEN build on the GPU, within the documented bounds sequence by
    sequence, with GQA, a causal mask and a window, a sequence of no queries among them."""
    report = _json_hw(["hw", "--seqlens", "70,0,130,5", "--heads", "4", "--heads-k", "2", "--causal",
                       "--window", "32,-1", "--json"])
    assert report["cu_seqlens_q"] == [0, 70, 70, 200, 205] and report["rel_err_o"] < 1e-3


def _json_hw(argv) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    report = json.loads(out.getvalue())
    assert status == 0 and not report["above_bound"] and not report["nonfinite"], (argv, report)
    return report
