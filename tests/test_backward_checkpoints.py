"""Checkpoints of the backward pass (fa2_bwd.cu's debug build FA_BWD_CHECKPOINTS, the buffer of
fa_sim.checkpoints.BackwardCheckpointLayout) on the PTX engine: the debug build compiles for the
GPU, the engine fills the buffer, every checkpoint decodes to what float64 predicts within the
fp32 roundings between them, the checkpointed run's gradients are the plain run's bit for bit, the
comparison names the first differing word, and a recorded GPU buffer (tests/data/h200, written by
experiments/record_backward_checkpoints.py) replays bit for bit."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

import fa_sim  # noqa: E402
from fa_sim.backward import simulate_backward  # noqa: E402
from fa_sim.checkpoints import BACKWARD_CHECKPOINTS, BackwardCheckpoint as C, BackwardCheckpointLayout  # noqa: E402
from fa_sim.contract.backward import BackwardBuild, BackwardConfig, compile_backward  # noqa: E402
from fa_sim.crosscheck import backward_checkpoint_stats  # noqa: E402
from fa_sim.reference import random_inputs  # noqa: E402

U32 = 2.0**-24
LOG2E = np.float64(np.float32(1.4426950408889634))
DATA = Path(__file__).parent / "data" / "h100"
#: written on an H100 (its `device` field) by `experiments/record_backward_checkpoints.py --out
#: tests/data/h100` (the replay test skips without them)
RECORDINGS = [DATA / f"bwd_checkpoints_70x90_d64{'_causal' if c else ''}.npz" for c in (False, True)]


def _problem(nq, nk, d, causal, seed=1):
    q, k, v = random_inputs(1, 1, nq, nk, d, seed=seed)
    do = np.random.default_rng(seed + 100).standard_normal(q.shape).astype(np.float16)
    fwd = fa_sim.simulate(q, k, v, causal=causal)
    return q, k, v, fwd.o, fwd.lse, do


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_the_debug_build_compiles_for_the_gpu(head_dim, deterministic):
    """NVRTC builds the checkpoint build for sm_90 in both dQ modes (the layout's slot width is
    static_asserted in the kernel against fa_sim.checkpoints), with the mode's three kernels."""
    build = BackwardBuild(BackwardConfig(head_dim), True, deterministic, "sm_90", checkpoints=True)
    assert build.macros()["FA_BWD_CK_WORDS"] == BackwardCheckpointLayout(BackwardConfig(head_dim), 1).words
    out = compile_backward(build, use_cache=False)
    third = "fa2_bwd_dq_kernel" if deterministic else "fa2_bwd_convert_dq_kernel"
    assert out.cubin and set(out.usage) == {"fa2_bwd_preprocess_kernel", "fa2_bwd_kernel", third}
    assert "FA_BWD_CHECKPOINTS" not in BackwardBuild(BackwardConfig(head_dim)).macros()


def _fp16_rows(x, row0, rows, n):
    """Rows row0 .. row0 + rows of x [n, d] as fp16, zero past n, padded to d + 8 columns."""
    out = np.zeros((rows, x.shape[1] + 8), np.float16)
    take = max(0, min(rows, n - row0))
    out[:take, : x.shape[1]] = x[row0: row0 + take]
    return out


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_checkpoints_decode_to_what_float64_predicts(causal):
    """Nq = 70, Nk = 90, d = 64 (two K/V blocks, two Q blocks, tails both ways), every CTA recorded.
    Per round: the tiles are the inputs' rows as stored; S = K Q^T and dP = V dO^T within the fp32
    accumulation; P = exp(s S - LSE) within the roundings of the exp2 argument and ex2.approx; dS =
    P (dP - D) from the round's own P and dP; dV, dK the sums of fp16(P)^T dO and fp16(dS)^T Q over
    the rounds so far; masked and padded entries exactly 0; after the last round fp16(dV) and
    fp16(s dK) are the engine's gradients bit for bit; rounds a CTA does not run stay 0."""
    nq, nk, d = 70, 90, 64
    q, k, v, o, lse, do = _problem(nq, nk, d, causal)
    res = simulate_backward(q, k, v, o, lse, do, causal=causal, checkpoint_ctas=[0, 1])
    cfg = res.config
    layout = BackwardCheckpointLayout(cfg, cfg.n_q_blocks(nq))
    assert res.checkpoints.shape == layout.shape(2) and res.checkpoint_ctas == (0, 1)
    scale = res.scale
    q64, k64, v64, do64, o64 = (x[0, 0].astype(np.float64) for x in (q, k, v, do, o))
    lse32 = lse[0, 0].astype(np.float64)
    d64 = (do64 * o64).sum(-1)
    e_d = d * U32 * (np.abs(do64) * np.abs(o64)).sum(-1)
    rounds = layout.rounds_per_cta([0, 1], cfg.n_kv_blocks(nk), nq, causal)
    assert rounds.tolist() == ([2, 2] if not causal else [2, 1])
    for cta in (0, 1):
        key0 = cta * cfg.block_n
        keys = key0 + np.arange(cfg.block_n)
        m_min = key0 // cfg.block_m if causal else 0
        dv_sum = np.zeros((cfg.block_n, d)), np.zeros((cfg.block_n, d))  # value, absolute sum
        dk_sum = np.zeros((cfg.block_n, d)), np.zeros((cfg.block_n, d))
        for r in range(layout.n_rounds):
            slot = lambda ck: res.checkpoints[cta, layout.index(ck), r]  # noqa: E731
            if r >= rounds[cta]:
                assert not res.checkpoints[cta, :, r].any(), f"CTA {cta} round {r} ran no loop but has data"
                continue
            row0 = (m_min + r) * cfg.block_m
            queries = row0 + np.arange(cfg.block_m)
            tiles = ((C.SQ, q, row0, nq), (C.SDO, do, row0, nq), (C.SK, k, key0, nk), (C.SV, v, key0, nk))
            for ck, x, rows0, n in tiles:
                want = _fp16_rows(x[0, 0], rows0, layout.tile_rows(ck), n)
                assert layout.tile_matrix(ck, slot(ck)).view(np.uint16).tobytes() == want.view(np.uint16).tobytes(), ck
            live = (keys[:, None] < nk) & (queries[None, :] < nq)
            kq = np.zeros((cfg.block_n, cfg.block_m)), np.zeros((cfg.block_n, cfg.block_m))
            vdo = np.zeros_like(kq[0]), np.zeros_like(kq[0])
            kr, qr = keys[keys < nk], queries[queries < nq]
            sub = np.ix_(keys < nk, queries < nq)
            kq[0][sub], kq[1][sub] = k64[kr] @ q64[qr].T, np.abs(k64[kr]) @ np.abs(q64[qr]).T
            vdo[0][sub], vdo[1][sub] = v64[kr] @ do64[qr].T, np.abs(v64[kr]) @ np.abs(do64[qr]).T
            s_ck, p_ck, dp_ck, ds_ck = (layout.fragment_matrix(ck, slot(ck)).astype(np.float64)
                                        for ck in (C.S, C.P, C.DP, C.DS))
            assert (np.abs(s_ck - kq[0]) <= d * U32 * kq[1]).all() and not s_ck[~live].any()
            assert (np.abs(dp_ck - vdo[0]) <= d * U32 * vdo[1]).all() and not dp_ck[~live].any()
            # P: the exp2 argument x = fl(fl(S fl(s log2e)) - fl(LSE log2e)) off by dx, then ex2.approx (2^-22)
            visible = live & ((keys[:, None] <= queries[None, :]) if causal else True)
            lse_q = np.where(queries < nq, lse32[np.minimum(queries, nq - 1)], np.inf)[None, :]
            a, b = scale * LOG2E * kq[0], LOG2E * lse_q
            dx = U32 * (3 * np.abs(a) + 2 * np.abs(np.where(visible, b, 0)) + np.abs(np.where(visible, a - b, 0))) \
                + scale * LOG2E * (1 + 2 * U32) * d * U32 * kq[1]
            with np.errstate(invalid="ignore", over="ignore"):
                p_ref = np.where(visible, np.exp(scale * kq[0] - np.where(visible, lse_q, 0)), 0.0)
            eta = np.log(2) * dx * (1 + dx) + 2.0**-22
            assert (np.abs(p_ck - p_ref) <= eta * p_ref + 2.0**-126).all()
            assert not p_ck[~visible].any()
            dq_ = np.where(queries < nq, d64[np.minimum(queries, nq - 1)], 0.0)[None, :]
            ed = np.where(queries < nq, e_d[np.minimum(queries, nq - 1)], 0.0)[None, :]
            ds_ref = p_ck * (dp_ck - dq_)
            # fl(P fl(dP - D32)) with |D32 - D| <= e_D: the subtraction's and the product's roundings
            err = p_ck * ed + U32 * p_ck * (np.abs(dp_ck - dq_) + ed) + U32 * (1 + U32) * np.abs(ds_ck)
            assert (np.abs(ds_ck - ds_ref) <= err).all()
            # dV, dK: this round's fp16 A operands times the tiles, accumulated in fp32
            p16, ds16 = p_ck.astype(np.float16).astype(np.float64), ds_ck.astype(np.float16).astype(np.float64)
            qt, dot = (_fp16_rows(x[0, 0], row0, cfg.block_m, nq)[:, :d].astype(np.float64) for x in (q, do))
            for acc, a_op, bt in ((dv_sum, p16, dot), (dk_sum, ds16, qt)):
                acc[0][:] += a_op @ bt
                acc[1][:] += np.abs(a_op) @ np.abs(bt)
            n_sum = (r + 1) * cfg.block_m
            for ck, acc in ((C.DV, dv_sum), (C.DK, dk_sum)):
                got = layout.fragment_matrix(ck, slot(ck)).astype(np.float64)
                assert (np.abs(got - acc[0]) <= n_sum * U32 * acc[1]).all(), (ck, cta, r)
        last = rounds[cta] - 1
        dv_last = layout.fragment_matrix(C.DV, res.checkpoints[cta, layout.index(C.DV), last])
        dk_last = layout.fragment_matrix(C.DK, res.checkpoints[cta, layout.index(C.DK), last])
        n = max(0, min(cfg.block_n, nk - key0))
        assert dv_last[:n].astype(np.float16).tobytes() == res.dv[0, 0, key0: key0 + n].tobytes()
        dk16 = (dk_last[:n] * np.float32(scale)).astype(np.float32).astype(np.float16)
        assert dk16.tobytes() == res.dk[0, 0, key0: key0 + n].tobytes()


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
def test_the_checkpointed_run_computes_the_plain_runs_gradients(deterministic):
    q, k, v, o, lse, do = _problem(45, 70, 32, True, seed=3)
    plain = simulate_backward(q, k, v, o, lse, do, causal=True, deterministic=deterministic)
    debug = simulate_backward(q, k, v, o, lse, do, causal=True, deterministic=deterministic, checkpoint_ctas=[1])
    assert plain.checkpoints is None and debug.checkpoints.shape[0] == 1
    for name in ("dq", "dk", "dv"):
        assert getattr(plain, name).tobytes() == getattr(debug, name).tobytes(), name


def test_the_checkpoints_do_not_depend_on_the_dq_mode():
    """The deterministic mode's main kernel skips sdS and the dQ GEMM but still computes dS (for dK):
    every checkpoint of the two modes' debug builds is the same bit for bit."""
    q, k, v, o, lse, do = _problem(45, 70, 32, True, seed=3)
    det, atomic = (simulate_backward(q, k, v, o, lse, do, causal=True, deterministic=m, checkpoint_ctas=[0, 1])
                   for m in (True, False))
    assert det.checkpoints.any() and det.checkpoints.tobytes() == atomic.checkpoints.tobytes()


def test_the_comparison_names_the_first_differing_word():
    """backward_checkpoint_stats (fa compare --backward): one flipped bit in dS of CTA 1 is found at
    its (round, warp, lane, word) with both values; a word of a round the CTA does not run, or past
    a checkpoint's used words, is not compared."""
    nq, nk = 70, 90
    q, k, v, o, lse, do = _problem(nq, nk, 64, True)
    res = simulate_backward(q, k, v, o, lse, do, causal=True, checkpoint_ctas=[0, 1])
    cfg, ctas = res.config, [0, 1]
    same = backward_checkpoint_stats(res.checkpoints, res.checkpoints.copy(), cfg, ctas, 1, nq, nk, True)
    assert [s.checkpoint for s in same] == list(BACKWARD_CHECKPOINTS)
    assert all(s.ok and s.fraction_identical == 1.0 and s.first is None for s in same)
    layout = BackwardCheckpointLayout(cfg, cfg.n_q_blocks(nq))
    gpu = res.checkpoints.copy()
    gpu[1, layout.index(C.DS), 0, 37, 5] ^= 1
    gpu[1, layout.index(C.DV), 1, 0, 0] ^= 1  # CTA 1 runs one round (causal): not compared
    gpu[0, layout.index(C.SQ), 0, 0, layout.used_words(C.SQ)] ^= 1  # past sQ's 18 words of 32: not compared
    stats = {s.checkpoint: s for s in backward_checkpoint_stats(res.checkpoints, gpu, cfg, ctas, 1, nq, nk, True)}
    bad = stats[C.DS]
    assert not bad.ok and bad.values - bad.identical == 1 and bad.max_ulps == 1
    f = bad.first
    assert (f.cta, f.round, f.warp, f.lane, f.register) == (1, 0, 1, 5, 5)
    assert np.float32(f.sim).view(np.uint32) ^ np.float32(f.gpu).view(np.uint32) == 1
    assert all(s.ok for ck, s in stats.items() if ck is not C.DS)
    assert stats[C.S].values == 128 * 32 * 3  # CTA 0: two rounds, CTA 1: one


def test_checkpoint_ctas_are_checked_before_any_kernel_runs():
    q, k, v, o, lse, do = _problem(45, 70, 32, False)
    for bad in ([2], [0, 0], [True], [0.0], 1, []):
        with pytest.raises(ValueError, match=r"^checkpoint_ctas must be .*CTA ids in 0\.\.1") as exc:
            simulate_backward(q, k, v, o, lse, do, checkpoint_ctas=bad)
        assert "\n" not in str(exc.value)


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_a_recorded_gpu_buffer_replays_bit_for_bit(path):
    """The H100's checkpoint buffer and gradients (deterministic mode) against the engine's from the
    recorded inputs and the GPU forward's O and LSE (mma model h200: the sm_90 tensor core's)."""
    if not path.exists():
        pytest.skip(f"{path.name} not recorded yet: python experiments/record_backward_checkpoints.py "
                    "--out tests/data/h100 on an H100")
    rec = np.load(path)
    causal, det = bool(rec["causal"]), bool(rec["deterministic"])
    ctas = [int(c) for c in rec["ctas"]]
    sim = simulate_backward(rec["q"], rec["k"], rec["v"], rec["o"], rec["lse"], rec["do"], causal=causal,
                            scale=float(rec["scale"]), deterministic=det, mma_model="h200", checkpoint_ctas=ctas)
    nq, nk = rec["q"].shape[2], rec["k"].shape[2]
    b, h = rec["q"].shape[:2]
    stats = backward_checkpoint_stats(sim.checkpoints, rec["checkpoints"], sim.config, ctas, b * h, nq, nk, causal)
    assert all(s.ok for s in stats), [str(s.first) for s in stats if not s.ok]
    assert sim.checkpoints.tobytes() == rec["checkpoints"].tobytes()
    for name in ("dq", "dk", "dv"):
        assert getattr(sim, name).tobytes() == rec[name].tobytes(), name
