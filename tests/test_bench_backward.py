"""experiments/bench_hw_backward.py (bench_hw.py --backward) on the CPU: its float64 gradients equal
torch autograd's, its FLOP counts, its table and goal line from given rows, the refused options."""

from __future__ import annotations

import pytest

from experiment_scripts import load


@pytest.fixture(scope="module")
def bb():
    load("hw_sets")
    return load("bench_hw_backward")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp64_grads_are_autograds(bb, causal):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn((2, 1, 9, 16), generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn((2, 1, 5, 16), generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    do = torch.randn((2, 1, 9, 16), generator=gen, dtype=torch.float64)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    want = torch.autograd.grad(o, (q, k, v), do)
    got = bb.fp64_grads(q, k, v, do, causal, chunk=4)  # chunks of rows: a tail chunk too
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_flops(bb):
    assert bb.flops(2, 3, 100, 64, False) == (4.0 * 2 * 3 * 100 * 100 * 64, 10.0 * 2 * 3 * 100 * 100 * 64)
    assert bb.flops(2, 3, 100, 64, True) == (2.0 * 2 * 3 * 100 * 100 * 64, 5.0 * 2 * 3 * 100 * 100 * 64)


def _m(ms, vs):
    return dict(runs_ms=[ms], ms=ms, ms_min=ms, ms_max=ms, tflops=1.0, vs_flash=vs, vs_flash_min=vs, vs_flash_max=vs)


def test_table_and_goal_line(bb):
    rows = [dict(case=[1, 2, 100, 64], causal=False, backend="sdpa-flash", rel_err_fp64=1e-3, note=None,
                 **{"fwd+bwd": _m(2.0, 1.0), "bwd": _m(1.5, 1.0)}),
            dict(case=[1, 2, 100, 64], causal=False, backend="fa_hw", rel_err_fp64=2e-3, note=None,
                 **{"fwd+bwd": _m(2.5, 0.8), "bwd": _m(1.6, 0.9375)}),
            dict(case=[1, 2, 100, 64], causal=False, backend="fa_hw-kernels", rel_err_fp64=2e-3, note=None,
                 **{"fwd+bwd": None, "bwd": _m(1.2, 1.25)}),
            dict(case=[1, 2, 100, 64], causal=True, backend="fa_hw", rel_err_fp64=2e-3, note=None,
                 **{"fwd+bwd": _m(1.0, 1.2), "bwd": _m(0.5, 1.2)})]
    text = bb.markdown(rows, "GPU X", 3, "test")
    assert "| (1, 2, 100, 64) | False | fa_hw | 2.500 [2.500, 2.500] | 1.0 | 0.800 [0.800, 0.800] |" in text
    assert "| fa_hw-kernels | n/a | n/a | n/a | 1.200" in text
    assert "NOT MET (min 0.938x, median 1.069x over 2 rows; >= 1.00x in 1, >= 1.15x in 1)" in text
    assert "fa_hw-kernels): median 1.250x, >= 1.00x in 1 of 1" in text


def test_kernels_row_is_timed_and_reported_where_fa_hw_ran(bb):
    # run_case keys its timers "<backend>/<what>"; the fa_hw-kernels timer once looked for a key "fa_hw"
    # that never exists, so every GPU table lacked the row and its goal line read "median nanx ... of 0"
    timers = {f"{name}/{what}": None for name in bb.BACKENDS for what in ("fwd+bwd", "bwd")}
    bb.add_kernels_timer(timers, lambda: "kernels")
    assert timers["fa_hw-kernels/bwd"] == "kernels"
    without = {k: v for k, v in timers.items() if not k.startswith("fa_hw")}  # fa_hw refused the shape
    bb.add_kernels_timer(without, lambda: pytest.fail("no kernels timer without fa_hw's backward"))
    assert "fa_hw-kernels/bwd" not in without
    runs = {"sdpa-flash/fwd+bwd": [2.0, 2.2], "sdpa-flash/bwd": [1.5, 1.5], "fa_hw/fwd+bwd": [2.5, 2.5],
            "fa_hw/bwd": [1.6, 1.5], "fa_hw-kernels/bwd": [1.2, 1.25]}
    rows = bb.rows_of([1, 2, 100, 64], False, runs, {"sdpa-flash": 1e-3, "fa_hw": 2e-3}, {}, 1e9, 2.5e9)
    assert [r["backend"] for r in rows] == ["sdpa-flash", "fa_hw", "fa_hw-kernels"]
    kern = rows[-1]
    assert kern["fwd+bwd"] is None and kern["rel_err_fp64"] == 2e-3
    assert kern["bwd"]["vs_flash_min"] == 1.2 and kern["bwd"]["vs_flash_max"] == 1.25
    assert "the kernels alone (fa_hw-kernels): median 1.225x, >= 1.00x in 1 of 1" in bb.markdown(rows, "GPU X", 2,
                                                                                                "test")
    assert "fa_hw-kernels): no rows (not measured)" in bb.markdown(rows[:2], "GPU X", 2, "test")


def test_forward_options_are_refused_with_backward():
    bench = load("bench_hw")
    with pytest.raises(SystemExit, match="forward options"):
        bench.main(["--backward", "--extra", "m64n64d64w4-swizzled"])
