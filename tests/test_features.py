"""Issue 38's grouped-query attention (heads_k), sliding window and softcap (docs/features.md).

CPU: the hand-written program and the PTX engine (fa2_fwd.cu as compiled) agree bit for bit on
GQA and windows, causal and not, on shapes with tails; softcap runs on the PTX engine only (the
program refuses it, naming engine='ptx'); every run is within the documented bounds against
float64 (fa_sim.accuracy: O's relative error 1e-3, LSE's lse_error_bound, with softcap plus its
tanh's 2 C TANH_ABS_ERR), rows a window leaves empty are O = 0, LSE = +inf as float64 says; whole
K/V tiles outside the window are skipped (fewer MMAs, in proportion to Problem.cta_rounds); the
runs are hazard-free; bad inputs are one line each; the builds without the features are the
kernel as it was (no new macro). The softcap tanh's accuracy against float64 is measured on the
simulator's own models of its instructions.
GPU (marked gpu, skipped here): fa_hw.forward with each feature bit-identical to
fa_sim.simulate(engine="ptx", mma_model="h200").
"""

from __future__ import annotations

import numpy as np
import pytest

from fa_sim import KernelConfig, Problem, simulate
from fa_sim.accuracy import measure
from fa_sim.cli import main
from fa_sim.contract import KernelBuild
from fa_sim.events import Op
from fa_sim.isa.mufu import ex2, rcp
from fa_sim.observers.hazards import HazardChecker, format_hazards
from fa_sim.problem import attention_pairs
from fa_sim.reference import TANH_ABS_ERR, attention, visible

SEED = KernelConfig()


def _inputs(b, h, hk, nq, nk, d=64, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((b, h, nq, d)) * scale).astype(np.float16)
    k = (rng.standard_normal((b, hk, nk, d)) * scale).astype(np.float16)
    v = rng.standard_normal((b, hk, nk, d)).astype(np.float16)
    return q, k, v


def _same(a, b) -> bool:
    return (np.array_equal(a.o.view(np.uint16), b.o.view(np.uint16))
            and np.array_equal(a.lse.view(np.uint32), b.lse.view(np.uint32)))


def _check_accuracy(res, q, k, v, window=None, softcap=0.0):
    acc = measure(res.o, res.lse, q, k, v, res.causal, res.scale, res.config, window=window, softcap=softcap)
    assert acc.ok, acc.failures()
    return acc


# -- the program and the PTX engine, bit for bit --------------------------------------------------------
CASES = [  # (B, H, H_k, Nq, Nk, causal, window)
    (1, 4, 2, 100, 90, False, None),  # GQA with tails
    (2, 3, 1, 70, 130, True, None),  # MQA, causal, Nk > Nq
    (1, 2, 2, 150, 150, False, (20, 5)),  # window, tails
    (1, 2, 1, 150, 110, True, (30, -1)),  # causal window + MQA
    (1, 2, 2, 200, 70, False, (10, 0)),  # Nq > Nk: rows past the keys' window are empty
    (1, 1, 1, 130, 200, False, (-1, 40)),  # right side only
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}h{c[2]}-{c[3]}x{c[4]}{'-causal' if c[5] else ''}-w{c[6]}"
                                             for c in CASES])
def test_program_and_ptx_engine_agree_and_match_float64(case):
    b, h, hk, nq, nk, causal, window = case
    q, k, v = _inputs(b, h, hk, nq, nk, seed=nq + nk)
    prog = simulate(q, k, v, causal=causal, window=window, engine="program")
    ptx = simulate(q, k, v, causal=causal, window=window, engine="ptx")
    assert _same(prog, ptx)
    _check_accuracy(ptx, q, k, v, window)
    ref_o, ref_lse = attention(q, k, v, causal, window=window)
    empty = np.isinf(ref_lse)
    assert np.array_equal(np.isinf(ptx.lse), empty)  # rows without keys: +inf exactly there
    assert np.all(ptx.o[empty] == 0)


def test_other_configs_with_window_and_gqa():
    q, k, v = _inputs(1, 4, 2, 140, 170, seed=5)
    for cfg in (KernelConfig(block_m=128, n_warps=8, block_n=32), KernelConfig(block_n=128, smem="padded")):
        prog = simulate(q, k, v, causal=True, window=(50, -1), config=cfg, engine="program")
        ptx = simulate(q, k, v, causal=True, window=(50, -1), config=cfg, engine="ptx")
        assert _same(prog, ptx), cfg.tag
        _check_accuracy(ptx, q, k, v, (50, -1))


def test_schedule_options_run_the_window_on_the_ptx_engine():
    """kv_stages / pingpong / defer_pv loops start at n_block_min too: same bits as the program."""
    q, k, v = _inputs(1, 2, 1, 300, 300, seed=7)
    base = simulate(q, k, v, causal=True, window=(70, -1), engine="program")
    for cfg in (KernelConfig(kv_stages=2, q_in_regs=True), KernelConfig(kv_stages=3, defer_pv=True),
                KernelConfig(block_m=128, n_warps=8, kv_stages=2, pingpong=True)):
        assert _same(base, simulate(q, k, v, causal=True, window=(70, -1), config=cfg)), cfg.tag


# -- softcap: PTX engine only ------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("cap", [0.5, 5.0, 50.0])
def test_softcap_matches_float64(cap, causal):
    q, k, v = _inputs(1, 2, 2, 90, 110, seed=int(cap * 10), scale=2.0)
    res = simulate(q, k, v, causal=causal, softcap=cap)  # engine=None picks the PTX engine
    _check_accuracy(res, q, k, v, softcap=cap)
    plain = simulate(q, k, v, causal=causal, engine="ptx")
    assert not _same(res, plain)  # the cap changed the result (scores reach |s| ~ 30)


def test_softcap_with_gqa_and_window():
    q, k, v = _inputs(2, 4, 1, 77, 140, seed=3)
    res = simulate(q, k, v, causal=False, window=(16, 16), softcap=3.0)
    _check_accuracy(res, q, k, v, window=(16, 16), softcap=3.0)


#: The fp32 argument x of tanh_ex2 with the largest error of all 2^32 (experiments/softcap_tanh_exhaustive.py:
#: 2.319e-7 = 0.973 x 2^-22 at x = -5.829131, y = -2.0202229)
ARGMAX = np.uint32(0xC0BA883E).view(np.float32)


def test_softcap_tanh_accuracy_on_the_simulators_models():
    """fa2_fwd.cu's tanh_ex2, replayed with the simulator's ex2.approx.ftz and rcp.approx.ftz models and
    an fp32 fma, against float64 tanh(x / (2 log2 e)) of its fp32 argument x: within TANH_ABS_ERR
    (experiments/softcap_tanh_exhaustive.py measures all 2^32 x: at most ARGMAX's error), exact +-1
    far out, NaN kept."""
    two_log2e = 2.0 / np.log(2.0)
    ys = np.concatenate([np.linspace(-50, 50, 400_001, dtype=np.float32), np.float32(2.0) ** -np.arange(1, 40),
                         np.random.default_rng(0).standard_normal(200_000) * 3]).astype(np.float32)
    xs = np.concatenate([(ys * np.float32(two_log2e)).astype(np.float32), [ARGMAX, np.float32(np.nan)]]).astype(np.float32)
    with np.errstate(all="ignore"):
        r = rcp(np.float32(1) + ex2(xs))
        got = (np.float64(-2) * r.astype(np.float64) + 1.0).astype(np.float32)  # fma.rn: one rounding
    assert np.isnan(got[-1])
    got, xs = got[:-1].astype(np.float64), xs[:-1]
    err = np.abs(got - np.tanh(xs.astype(np.float64) / two_log2e))
    assert err.max() <= TANH_ABS_ERR
    assert err[-1] == err.max() > 0.97 * TANH_ABS_ERR  # the exhaustive maximum: the bound is tight
    assert np.all(np.abs(got[np.abs(xs) > 45 * two_log2e]) == 1.0)


# -- tile skipping, hazards, builds --------------------------------------------------------------------
def test_whole_tiles_outside_the_window_are_skipped():
    q, k, v = _inputs(1, 1, 1, 512, 512, seed=1)
    full = simulate(q, k, v, engine="ptx")
    win = simulate(q, k, v, window=(64, 0), engine="ptx")
    prob_full = Problem(1, 1, 512, 512, False, 0.125, SEED)
    prob_win = Problem(1, 1, 512, 512, False, 0.125, SEED, window=(64, 0))
    assert prob_win.cta_rounds == 8 * 2 - 1 + 0 and prob_full.cta_rounds == 64  # block 0: 1 round, others 2
    ratio = win.instructions[Op.HMMA] / full.instructions[Op.HMMA]
    assert ratio == pytest.approx(prob_win.cta_rounds / prob_full.cta_rounds)
    prog = simulate(q, k, v, window=(64, 0), engine="program")
    assert prog.instructions[Op.HMMA] == win.instructions[Op.HMMA] and _same(prog, win)


def test_rounds_and_pairs_agree_with_the_mask():
    for nq, nk, causal, window in [(300, 200, False, (70, 3)), (100, 400, True, (0, -1)), (257, 257, False, (-1, 0)),
                                   (1000, 50, False, (5, 5)), (64, 64, True, (1000, 1000))]:
        prob = Problem(2, 3, nq, nk, causal, 0.1, SEED, window=window)
        assert prob.cta_rounds == int(prob.rounds_per_cta(np.arange(prob.n_ctas)).sum())
        assert attention_pairs(nq, nk, causal, (prob.window_left, prob.window_right)) == \
            int(visible(range(nq), nk, causal, window).sum())
        for m in range(prob.n_m_blocks):  # every visible key of the block lies in its K/V blocks
            keys = np.flatnonzero(visible(range(m * 64, min(nq, m * 64 + 64)), nk, causal, window).any(axis=0))
            lo, hi = int(prob.n_block_min(m)), int(prob.n_block_max(m))
            assert hi - lo >= 1
            assert keys.size == 0 or (keys.min() >= lo * 64 and keys.max() < hi * 64)


def test_hazard_free_on_both_front_ends():
    q, k, v = _inputs(1, 4, 2, 150, 150, seed=9)
    for engine, kw in (("program", dict(window=(40, 10))), ("ptx", dict(window=(40, 10), softcap=4.0)),
                       ("program", dict(causal=True, window=(20, -1)))):
        checker = HazardChecker()
        simulate(q, k, v, observers=[checker], engine=engine, **kw)
        rep = checker.report()
        assert rep.ok, format_hazards(rep)


def test_builds_without_features_are_unchanged():
    for causal in (False, True):
        plain = KernelBuild(SEED, causal, "sm_80")
        same = KernelBuild.of(Problem(1, 4, 100, 100, causal, 0.125, SEED, window=(200, 500)), "sm_80")
        assert same.macros() == plain.macros()  # a window wider than the sequences is none
    feat = KernelBuild.of(Problem(1, 4, 100, 100, True, 0.125, SEED, heads_k=2, window=(20, 3), softcap=30.0),
                          "sm_80").macros()
    assert feat["FA_KV_GROUP"] == 2 and feat["FA_WINDOW_LEFT"] == 20 and "FA_WINDOW_RIGHT" not in feat  # causal
    assert feat["FA_SOFTCAP"] == int(np.float32(30.0).view(np.uint32))


# -- bad inputs, one line each -----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, fragment", [
    (dict(heads_k=3), "heads_k must be a positive integer that divides heads=4"),
    (dict(heads_k=0), "heads_k must be"),
    (dict(window=(-2, 3)), "window must be (left, right), each -1 (unbounded) or an integer >= 0"),
    (dict(window=(1,)), "window must be (left, right)"),
    (dict(window=(1.5, 2)), "window must be"),
    (dict(softcap=-1.0), "softcap must be a positive finite number"),
    (dict(softcap=float("nan")), "softcap must be"),
    (dict(softcap=1e39), "softcap must be"),
])
def test_problem_refuses_bad_features(kwargs, fragment):
    with pytest.raises(ValueError) as exc:
        Problem(1, 4, 64, 64, False, 0.125, SEED, **kwargs)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_simulate_refuses_bad_features():
    q, k, v = _inputs(1, 4, 3, 32, 32)
    with pytest.raises(ValueError, match=r"k and v have 3 heads, which does not divide q's 4"):
        simulate(q, k, v)
    q, k, v = _inputs(1, 2, 2, 32, 32)
    with pytest.raises(ValueError, match=r"softcap=2 .* run it with engine='ptx'"):
        simulate(q, k, v, softcap=2.0, engine="program")
    with pytest.raises(ValueError, match=r"softcap must be"):
        simulate(q, k, v, softcap=0.0 - 1)
    assert Problem(1, 2, 32, 32, False, 0.1, SEED, window=(40, 40)).features() == []  # wider than the sequence


def _cli(argv, capsys):
    status = main(argv)
    return status, capsys.readouterr().err.strip()


@pytest.mark.parametrize("argv, fragment", [
    (["sim", "--heads", "4", "--heads-k", "3"], "--heads-k 3 does not divide --heads 4"),
    (["sim", "--window", "5"], "--window takes LEFT,RIGHT"),
    (["sim", "--window", "-2,1"], "--window takes LEFT,RIGHT"),
    (["sim", "--softcap", "0"], "--softcap 0 is out of range"),
    (["sim", "--softcap", "2", "--engine", "program"], "run it with --engine ptx"),
    (["time", "--heads", "4", "--heads-k", "3"], "--heads-k 3 does not divide --heads 4"),
    (["hw", "--window", "1,1", "--softcap", "-3"], "--softcap"),
    *[([cmd, "--backward", "--heads", "2", *opt], f"{opt[0]} does not apply with --backward: fa2_bwd.cu has no "
                                                   f"grouped-query attention")
      for cmd in ("sim", "trace", "banks", "hw", "compare")
      for opt in (["--heads-k", "1"], ["--window", "4,4"], ["--softcap", "20"])],
])
def test_cli_refuses_in_one_line(argv, fragment, capsys):
    status, err = _cli(argv, capsys)
    assert status == 2 and fragment in err and len(err.splitlines()) == 1, err


def test_bf16_runs_the_features():
    """bf16 (KernelConfig.dtype) with GQA and a window: both front ends bit for bit; with softcap too
    (the PTX engine): O and LSE within their bf16 bounds against float64."""
    from fa_sim.reference import random_inputs

    q, k, v = random_inputs(1, 4, 70, 90, 64, seed=1, heads_k=2, dtype="bf16")
    runs = [simulate(q, k, v, causal=True, dtype="bf16", engine=e, window=(20, 5), workers=1) for e in ("ptx", "program")]
    assert runs[0].config.dtype == "bf16" and runs[0].o.dtype == np.float32
    assert np.array_equal(runs[0].o.view(np.uint32), runs[1].o.view(np.uint32))
    assert np.array_equal(runs[0].lse.view(np.uint32), runs[1].lse.view(np.uint32))
    res = simulate(q, k, v, dtype="bf16", window=(20, 5), softcap=15.0, workers=1)
    acc = measure(res.o, res.lse, q, k, v, False, res.scale, res.config, window=(20, 5), softcap=15.0)
    assert acc.ok and acc.rel_err_o > 1e-3  # held to the bf16 bound (fp16's 1e-3 would fail)


def test_cli_runs_the_features(capsys):
    status = main(["sim", "--heads", "2", "--heads-k", "1", "--seqlen", "70", "--window", "-1,0", "--softcap", "20",
                   "--workers", "1", "--json"])
    out = capsys.readouterr().out
    assert status == 0 and '"engine": "ptx"' in out


# -- GPU: fa_hw.forward against the PTX engine -------------------------------------------------------------
GPU_CASES = [  # (B, H, H_k, Nq, Nk, causal, window, softcap)
    (1, 4, 2, 100, 90, False, None, None),
    (2, 4, 1, 130, 200, True, None, None),
    (1, 2, 2, 300, 300, False, (40, 7), None),
    (1, 2, 1, 260, 170, True, (100, -1), None),
    (1, 2, 2, 200, 70, False, (10, 0), None),
    (1, 2, 2, 90, 110, False, None, 5.0),
    (1, 2, 2, 90, 110, True, None, 0.5),
    (1, 4, 2, 150, 190, True, (33, -1), 30.0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[str(i) for i in range(len(GPU_CASES))])
@pytest.mark.parametrize("config", [SEED, KernelConfig(block_m=128, n_warps=8, kv_stages=2, pingpong=True)],
                         ids=["seed", "pingpong"])
def test_gpu_bit_identical_to_the_ptx_engine(case, config):
    import fa_hw

    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    b, h, hk, nq, nk, causal, window, cap = case
    q, k, v = _inputs(b, h, hk, nq, nk, seed=nq)
    out = fa_hw.forward(q, k, v, causal=causal, config=config, window=window, softcap=cap)
    sim = simulate(q, k, v, causal=causal, config=config, window=window, softcap=cap, engine="ptx",
                   mma_model="h200")
    from fa_hw import check

    o, lse = check.to_numpy(out.o), check.to_numpy(out.lse)
    assert np.array_equal(o.view(np.uint16), sim.o.view(np.uint16))
    assert np.array_equal(lse.view(np.uint32), sim.lse.view(np.uint32))
    acc = measure(o, lse, q, k, v, causal, out.scale, config, window=window, softcap=cap or 0.0)
    assert acc.ok, acc.failures()


def test_checkpoints_of_both_front_ends_agree_with_a_window():
    """fa compare's contract with a window: round t of a CTA is its K/V block n_block_min + t in the
    program and in fa2_fwd.cu's debug build, checkpoint for checkpoint."""
    from fa_sim.checkpoints import CheckpointLayout
    from fa_sim.crosscheck import compare_checkpoints, rounds_per_cta, simulate_with_checkpoints

    q, k, v = _inputs(1, 2, 1, 200, 180, seed=11)
    ctas = [0, 3, 5]  # Q blocks 0, 3, 1: K/V blocks 0..1, 1..2, 0..2
    runs = [simulate_with_checkpoints(q, k, v, False, None, SEED, ctas, mma_model="exact", engine=e, window=(70, 20))
            for e in ("program", "ptx")]
    rounds = rounds_per_cta(ctas, SEED, 200, 180, False, (70, 20))
    assert list(rounds) == [2, 2, 3]
    prob = Problem(1, 2, 200, 180, False, 0.1, SEED, window=(70, 20))
    assert list(prob.n_block_min(np.array([0, 3, 1]))) == [0, 1, 0]
    stats = compare_checkpoints(runs[0][1], runs[1][1], CheckpointLayout(SEED, 3), ctas, rounds)
    assert all(s.identical == s.values for s in stats), [(s.checkpoint, s.values - s.identical) for s in stats]
    assert _same(runs[0][0], runs[1][0])


def test_parallel_workers_give_the_serial_bits():
    """fa_sim.parallel's shards build K/V buffers of H_k heads and run the window's rounds alike."""
    q, k, v = _inputs(2, 4, 2, 150, 130, seed=2)
    for kw in (dict(window=(30, 10)), dict(softcap=3.0, causal=True)):
        serial = simulate(q, k, v, wave_ctas=4, **kw)
        assert _same(serial, simulate(q, k, v, wave_ctas=4, workers=2, **kw)), kw
