"""experiments/bench_features.py on the CPU: its float64 reference equals fa_sim.reference's on GQA,
windows, softcap and causal masks, its FLOP count of a window, its table and goal line from given rows."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from experiment_scripts import load
from fa_sim import reference


@pytest.fixture(scope="module")
def bf():
    load("hw_sets")
    load("bench_hw")
    return load("bench_features")


@pytest.mark.parametrize("causal,window,softcap", [(False, None, None), (True, None, None), (False, (5, 0), None),
                                                   (False, (3, 2), 2.5), (True, (-1, -1), 1.5)])
def test_reference_is_fa_sims(bf, causal, window, softcap):
    torch = pytest.importorskip("torch")
    q, k, v = reference.random_inputs(2, 4, 19, 19, 32, seed=3, heads_k=2)  # GQA: two Q heads per K/V head
    want, _ = reference.attention(q, k, v, causal, window=window, softcap=softcap or 0.0)
    got = bf.reference(*(torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v)), causal, window, softcap,
                       chunk=7)  # chunks of rows: a tail chunk too
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_flops_count_visible_pairs(bf):
    n = 50
    for causal, window in [(False, None), (True, None), (False, (7, 0)), (False, (4, 3)), (False, (-1, 2))]:
        vis = reference.visible(range(n), n, causal, window or (-1, -1))
        assert bf.flops(2, 3, n, 8, causal, window) == 4.0 * 2 * 3 * int(vis.sum()) * 8


def _row(backend, ms, vs=None, peer=None, err=1e-4, dtype="fp16", **kw):
    return dict(row="bf16", case=[1, 2, 3, 64], heads_k=2, dtype=dtype, causal=False, window=None, softcap=None,
                backend=backend, config="", runs_ms=[ms], ms=ms, ms_min=ms, ms_max=ms, tflops=1.0, peer=peer,
                vs_peer=vs, vs_peer_min=vs, vs_peer_max=vs, rel_err_fp64=err, note=None) | kw


def test_table_and_goal_line(bf):
    args = argparse.Namespace(runs=3, reps=20)
    rows = [_row("sdpa-flash", 1.0), _row("fa_hw-auto", 0.9, 1.11, "sdpa-flash", dtype="bf16", err=5e-3),
            _row("fa_hw-auto", 2.0, 0.98, "sdpa-flash"), _row("fa_hw-auto", 1.0, 1.5, "fa_hw-full", window=[8, 0])]
    md = bf.markdown(rows, "GPU", args)
    assert "NOT MET (1 of 2; min 0.980x" in md and "within its dtype's error bar: yes" in md
    assert "window (8, 0)" in md and "(fa_hw-full)" in md
    md = bf.markdown(rows[:2] + [_row("fa_hw-auto", 2.0, 1.02, "sdpa-flash", err=2e-3)], "GPU", args)
    assert "MET (2 of 2; min 1.020x" in md and "error bar: NO" in md and "2.0e-03 OVER" in md


def test_configs_are_parsed_before_any_gpu_work(bf):
    with pytest.raises(SystemExit, match="bad config tag: 'm128x'"):
        bf.main(["--configs", "m128x"])
