"""The simulator against `fa compare` recordings of the H100 (CPU-only: the GPU side is stored in
tests/data/h100).

compare_*.npz: `fa compare --save` runs of feature builds on an H100 (saved-run format 4: inputs,
O, LSE, checkpoint buffers of the first and the last CTA, the kernel source, the features), made by
the commands of tests/data/README.md:

- compare_gqa_window.npz: GQA (4 Q heads on 2 K/V heads), window (60, 20), Nq = 200, Nk = 333;
- compare_bf16_softcap_causal.npz: bf16, softcap 15, causal, N = 333;
- compare_d256_causal.npz: head_dim 256, causal, N = 150.

`fa compare --gpu-npz` replays each on the PTX engine with the H200 tensor-core model (the H100
is sm_90 as the H200 and rounds its MMAs the same way) and must report every checkpoint, O and
LSE bit-identical, exit status 0. Each replay takes 0.6-2.9 s on a 2-core machine, from an empty
cache too (FLASHSIM_CACHE), so all the recorded CTAs are replayed.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from fa_sim.cli import main
from fa_sim.crosscheck import SavedRun

DATA = Path(__file__).parent / "data" / "h100"

# file -> (shape B, H, Nq, Nk, d; heads_k; causal; dtype; window; softcap; the recorded CTAs)
RECORDINGS = {
    "compare_gqa_window": ((1, 4, 200, 333, 64), 2, False, "fp16", (60, 20), None, (0, 15)),
    "compare_bf16_softcap_causal": ((1, 2, 333, 333, 64), 2, True, "bf16", None, 15.0, (0, 11)),
    "compare_d256_causal": ((1, 2, 150, 150, 256), 2, True, "fp16", None, None, (0, 5)),
}


def test_the_recordings_hold_the_documented_feature_runs():
    """What is replayed below is the feature build: the files hold the runs the README names."""
    for name, (shape, heads_k, causal, dtype, window, softcap, ctas) in RECORDINGS.items():
        run = SavedRun.load(DATA / f"{name}.npz")
        b, h, nq, d = run.q.shape
        assert (b, h, nq, run.k.shape[2], d) == shape, name
        assert (run.heads_k, run.causal, run.config.dtype, run.config.head_dim) == (heads_k, causal, dtype, d), name
        assert (run.window, run.softcap, run.ctas) == (window, softcap, ctas), name
        assert run.kernel_name == "fa2_fwd.cu" and run.checkpoints.size > 0, name


@pytest.mark.parametrize("name", list(RECORDINGS))
def test_the_simulator_reproduces_the_recorded_h100_run_bit_for_bit(name):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["compare", "--gpu-npz", str(DATA / f"{name}.npz"), "--json"])
    report = json.loads(out.getvalue())
    shape, heads_k, causal, dtype, window, softcap, ctas = RECORDINGS[name]
    assert status == 0 and report["ok"], name
    assert report["causal"] is causal and report["ctas"] == list(ctas) and report["o"]["dtype"] == dtype
    assert report["checkpoints"], name
    for checkpoint, row in report["checkpoints"].items():
        assert row["values"] > 0 and row["fraction_identical"] == 1.0 and row["max_ulps"] == 0, (
            checkpoint, row["first_mismatch"])
    assert report["o"]["fraction_identical"] == 1.0 and report["lse"]["fraction_identical"] == 1.0
    assert report["lse"]["max_abs_diff"] == 0.0
