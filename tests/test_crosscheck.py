"""fa_sim.crosscheck: checkpoint recording, ulp distances and first-mismatch reporting."""

import numpy as np
import pytest

from fa_sim import KernelConfig
from fa_sim.checkpoints import CHECKPOINTS, CheckpointLayout
from fa_sim.crosscheck import (BOUNDS, BoundKind, compare_checkpoints, f16_ulps, output_stats, rounds_per_cta,
                               simulate_with_checkpoints)
from fa_sim.checkpoints import Checkpoint


def _inputs(nq=130, nk=150, d=64, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, 2, nq, d)).astype(np.float16),
            rng.standard_normal((1, 2, nk, d)).astype(np.float16),
            rng.standard_normal((1, 2, nk, d)).astype(np.float16))


def test_ulp_distance_of_halves():
    one = np.float16(1)
    assert f16_ulps(np.array([one]), np.array([np.nextafter(one, np.float16(2))]))[0] == 1
    assert f16_ulps(np.array([np.float16(0)]), np.array([np.float16(-0.0)]))[0] == 0
    tiny = np.float16(2.0 ** -24)  # smallest subnormal: one ulp either side of zero
    assert f16_ulps(np.array([tiny]), np.array([-tiny]))[0] == 2


@pytest.mark.parametrize("causal", [False, True])
def test_rounds_per_cta_follow_the_schedule(causal):
    cfg = KernelConfig()
    rounds = rounds_per_cta([0, 1, 2, 3], cfg, 130, 150, causal)
    # Nq=130 -> 3 m-blocks per head; Nk=150 -> 3 key blocks
    want = [1, 2, 3, 1] if causal else [3, 3, 3, 3]
    assert rounds.tolist() == want


def test_recorder_fills_every_live_round_and_nothing_else():
    q, k, v = _inputs()
    cfg = KernelConfig()
    ctas = [0, 4]
    res, buf = simulate_with_checkpoints(q, k, v, True, None, cfg, ctas)
    layout = CheckpointLayout(cfg, 3)
    assert buf.shape == layout.shape(2)
    s_acc = buf[:, CHECKPOINTS.index(Checkpoint.S_ACC)]
    # CTA 0 (m_block 0) runs one round; CTA 4 (head 1, m_block 1) runs two
    assert s_acc[0, 0].any() and not s_acc[0, 1:].any()
    assert s_acc[1, :2].all(axis=(1, 2)).any() and not s_acc[1, 2].any()
    # the sQ image is the swizzled Q tile of the CTA: row r, col c at smem_offset(r, c)
    sq = layout.threads_to_tile(Checkpoint.SQ, buf[0:1, CHECKPOINTS.index(Checkpoint.SQ), 0]).view(np.float16)
    r, c = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    np.testing.assert_array_equal(sq[0, cfg.smem_offset(r, c)], q[0, 0, :64])


def test_compare_finds_the_exact_first_mismatch():
    q, k, v = _inputs()
    cfg = KernelConfig()
    ctas = [1, 5]
    res, buf = simulate_with_checkpoints(q, k, v, False, None, cfg, ctas)
    layout = CheckpointLayout(cfg, 3)
    rounds = rounds_per_cta(ctas, cfg, 130, 150, False)
    same = compare_checkpoints(buf, buf.copy(), layout, ctas, rounds)
    assert all(s.ok and s.fraction_identical == 1.0 and s.first is None for s in same)

    gpu = buf.copy()
    ck = CHECKPOINTS.index(Checkpoint.S_ACC)
    thread, word = 37, 5  # warp 1, lane 5
    gpu[1, ck, 2, thread, word] = (gpu[1, ck, 2, thread, word].view(np.int32) + 3).view(np.uint32)
    stats = {s.checkpoint: s for s in compare_checkpoints(buf, gpu, layout, ctas, rounds)}
    s = stats[Checkpoint.S_ACC]
    assert s.max_ulps == 3 and not s.ok and s.values - s.identical == 1
    first = s.first
    assert (first.cta, first.round, first.warp, first.lane, first.register) == (5, 2, 1, 5, 5)
    assert first.sim == float(buf[1, ck, 2, thread, word].view(np.float32))
    assert all(stats[c].ok for c in CHECKPOINTS if c is not Checkpoint.S_ACC)


def test_every_checkpoint_is_bound_to_bit_identity():
    assert set(BOUNDS) == set(CHECKPOINTS)
    assert all(BOUNDS[ck] == (BoundKind.ULPS, 0) for ck in CHECKPOINTS)


def test_output_stats():
    o = np.array([1.0, 2.0, 3.0], np.float16)
    o2 = o.copy(); o2[1] = np.nextafter(o2[1], np.float16(4))
    lse = np.array([0.5, 1.5], np.float32)
    st = output_stats(o, o2, lse, lse)
    assert st.o_max_ulps == 1 and st.o_identical == 2 / 3  # a count ratio: exact
    assert st.lse_identical == 1.0 and st.lse_max_abs == 0.0
