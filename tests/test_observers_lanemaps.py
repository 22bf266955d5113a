"""The spec's closed-form lane maps (fa_sim.spec_maps, on the PTX fragment formulas) against
fa_sim.layout's CuTe algebra - the one source the kernel's plan and the observers use - and the
ownership grids the figures draw (spec tables 2, 6, TiledCopy)."""

import numpy as np
import pytest

from fa_sim import layout as L
from fa_sim.config import KernelConfig
from fa_sim import spec_maps as S
from fa_sim.observers import lanemaps as M

import synthetic
from fa_sim.observers.trace import ldsm_received

CONFIGS = KernelConfig.family()[::4]


def same(got, want) -> bool:
    """Coordinate pairs equal at every point (broadcast: a map may not depend on every index)."""
    return all(np.array_equal(*np.broadcast_arrays(a, b)) for a, b in zip(got, want))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.tag)
def test_accumulator_maps_equal_tiled_mma(cfg):
    t = np.arange(cfg.n_threads)[:, None]
    for gemm, n in ((L.Gemm.QK, cfg.s_values_per_thread), (L.Gemm.PV, cfg.o_values_per_thread)):
        e = np.arange(n)[None, :]
        want = L.TiledMma(cfg, gemm).tv(L.Operand.C)(t, e)
        assert same(S.acc_coords(cfg, t, e), want)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.tag)
def test_operand_maps_equal_tiled_mma(cfg):
    t = np.arange(cfg.n_threads)[:, None, None]
    qk, pv = L.TiledMma(cfg, L.Gemm.QK), L.TiledMma(cfg, L.Gemm.PV)
    i, h = np.arange(8)[None, :, None], np.arange(cfg.qk_k_segments)[None, None, :]
    for m in range(cfg.m_repeats):
        want = qk.tv(L.Operand.A)(t, i + 8 * (m + cfg.m_repeats * h))
        assert same(S.a_fragment(cfg, t, m, h, i), want)
    i4 = np.arange(4)[None, :, None]
    for nj in range(cfg.s_n_tiles):
        want = qk.tv(L.Operand.B)(t, i4 + 4 * (nj + cfg.s_n_tiles * h))  # (key, d)
        assert same(S.qk_b_fragment(t, nj, h, i4), want)
    hv = np.arange(cfg.pv_k_segments)[None, None, :]
    for nj in range(cfg.o_n_tiles):
        d, key = pv.tv(L.Operand.B)(t, i4 + 4 * (nj + cfg.o_n_tiles * hv))  # (N, K) = (d, key)
        assert same(S.pv_b_fragment(t, nj, hv, i4), (key, d))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.tag)
def test_copy_map_equals_copy_tv(cfg):
    t = np.arange(cfg.n_threads)[:, None]
    i = np.arange(cfg.block_n // cfg.copy_rows_per_pass)[None, :]
    row, col = L.copy_tv(cfg, cfg.block_n)(t, (0, i))
    assert same(S.copy_coords(cfg, t, i), (row, col))


def test_ldmatrix_received_equals_layout_ldsm():
    cfg = KernelConfig()
    lane, value = np.arange(32)[:, None], np.arange(8)[None, :]
    for kind, ev in ((L.Ldsm.Q, synthetic.ldsm_q(cfg, 0)), (L.Ldsm.K, synthetic.ldsm_k(cfg, 0)),
                     (L.Ldsm.V_TRANS, synthetic.ldsm_v(cfg, 0))):
        rows, cols = ldsm_received(ev.smem)
        want = kind.received(lane, value)
        assert same((rows[0, 0, 0], cols[0, 0, 0]), want), kind


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.tag)
def test_every_element_has_exactly_one_owner(cfg):
    for grid, n_owned in ((M.s_ownership(cfg), cfg.n_threads * cfg.s_values_per_thread),
                          (M.o_ownership(cfg), cfg.n_threads * cfg.o_values_per_thread),
                          (M.q_ownership(cfg), cfg.n_threads * 8 * cfg.m_repeats),
                          (M.k_ownership(cfg), 32 * 4 * cfg.s_n_tiles),
                          (M.v_ownership(cfg), 32 * 4 * cfg.o_n_tiles),
                          (M.copy_ownership(cfg, cfg.block_m), cfg.block_m * cfg.copy_threads_per_row)):
        owner, value = grid
        assert (owner >= 0).all() and owner.size == n_owned
        assert len(set(zip(owner.ravel().tolist(), value.ravel().tolist()))) == owner.size


def test_seed_ownership_facts():
    cfg = KernelConfig()
    owner, slot = M.s_ownership(cfg)
    # table 2: warp w owns query rows 16w .. 16w+15
    assert (owner // 32 == np.arange(64)[:, None] // 16).all()
    # table 6: thread a of quad 0 owns keys 8j + 2a + {0,1} of query 0, slots 0,1 then 4,5, ...
    assert owner[0, :8].tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and slot[0, 8:10].tolist() == [4, 5]
    assert slot[8, :2].tolist() == [2, 3]
    # TiledCopy: threads 0, 7, 8, 32 copy rows 0/16/32/48, 0, 1, 4 (spec section 12, TiledCopy)
    cp, npass = M.copy_ownership(cfg, 64)
    assert cp[[0, 16, 32, 48], 0].tolist() == [0, 0, 0, 0] and npass[[0, 16, 32, 48], 0].tolist() == [0, 1, 2, 3]
    assert cp[0, 7] == 7 and cp[1, 0] == 8 and cp[4, 0] == 32
