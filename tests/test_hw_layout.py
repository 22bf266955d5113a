"""The address arithmetic of fa_hw/kernels/fa2_fwd.cu, mirrored in Python and checked against
KernelConfig.smem_offset (the layout contract) for every config, lane and register of the family.

The kernel computes each lane's ldmatrix/copy offset once (`smem_off`) and reaches the other
rows/columns with `shift_off` (an XOR of the column step for swizzled tiles, an add otherwise):
these tests prove that shortcut equals the contract's offset everywhere it is used.
"""

from __future__ import annotations

import numpy as np
import pytest

from fa_sim.contract import KernelBuild, min_blocks_per_sm
from fa_sim.config import HEAD_DIMS, KernelConfig, SmemLayout

FAMILY = KernelConfig.family(HEAD_DIMS)  # head_dim 96-256 too (their swizzle atoms and column passes)
LANES = np.arange(32)


def smem_off(cfg: KernelConfig, r, c):  # fa2_fwd.cu smem_off, in bytes
    return 2 * cfg.smem_offset(r, c)


def shift_off(cfg: KernelConfig, base, dr: int, dc: int):  # fa2_fwd.cu shift_off
    w = cfg.swizzle_atom_cols  # kAtomW: head_dim 96, 160, 192's atoms are narrower than the row
    if w != cfg.row_pitch:
        return (base ^ (2 * (dc % w))) + 2 * ((dc // w) * 8 * w + dr * cfg.row_pitch)
    if cfg.smem is SmemLayout.SWIZZLED:
        return (base ^ (2 * dc)) + 2 * dr * cfg.row_pitch
    return base + 2 * (dr * cfg.row_pitch + dc)


@pytest.mark.parametrize("cfg", FAMILY, ids=lambda c: c.tag)
def test_ldmatrix_offsets_match_the_layout(cfg):
    w = np.arange(cfg.n_warps)[:, None]
    row_q, col_q = 16 * w + LANES % 16, 8 * (LANES // 16)  # tCrQ(mi=0, h=0), spec table 10/12
    row_k, col_k = LANES % 8 + 8 * (LANES // 16), 8 * ((LANES // 8) % 2)  # tCrK(p=0, h=0)
    row_v, col_v = LANES % 8 + 8 * ((LANES // 8) % 2), 8 * (LANES // 16)  # tCrV(p=0, h=0) .trans
    for h in range(cfg.qk_k_segments):
        for mi in range(cfg.m_repeats):
            dr = 16 * cfg.n_warps * mi
            got = shift_off(cfg, smem_off(cfg, row_q, col_q), dr, 16 * h)
            assert np.array_equal(got, smem_off(cfg, row_q + dr, col_q + 16 * h))
        for p in range(cfg.block_n // 16):
            got = shift_off(cfg, smem_off(cfg, row_k, col_k), 16 * p, 16 * h)
            assert np.array_equal(got, smem_off(cfg, row_k + 16 * p, col_k + 16 * h))
    for h in range(cfg.pv_k_segments):
        for p in range(cfg.head_dim // 16):
            got = shift_off(cfg, smem_off(cfg, row_v, col_v), 16 * h, 16 * p)
            assert np.array_equal(got, smem_off(cfg, row_v + 16 * h, col_v + 16 * p))


@pytest.mark.parametrize("cfg", FAMILY, ids=lambda c: c.tag)
def test_copy_offsets_match_the_layout(cfg):
    t = np.arange(cfg.n_threads)
    r_in, c = t // cfg.copy_threads_per_row, 8 * (t % cfg.copy_threads_per_row)
    assert cfg.copy_rows_per_pass % 8 == 0  # the kernel's static_assert
    step = 8 * cfg.copy_threads_per_row  # halves between a thread's column passes (copy_dst)
    for rows in (cfg.block_m, cfg.block_n):
        for i in range(rows // cfg.copy_rows_per_pass):
            dr = cfg.copy_rows_per_pass * i
            if cfg.copy_col_passes == 1:
                got = smem_off(cfg, r_in, c) + 2 * dr * cfg.row_pitch
                assert np.array_equal(got, smem_off(cfg, r_in + dr, c))
            for j in range(cfg.copy_col_passes):
                got = shift_off(cfg, smem_off(cfg, r_in, c), dr, step * j)
                assert np.array_equal(got, smem_off(cfg, r_in + dr, c + step * j))


def test_macros_follow_the_config():
    cfg = KernelConfig(block_m=128, block_n=32, head_dim=128, n_warps=8, smem="padded")
    m = KernelBuild(cfg, causal=True, arch="sm_80", checkpoints=True).macros()
    assert (m["FA_BLOCK_M"], m["FA_BLOCK_N"], m["FA_HEAD_DIM"], m["FA_N_WARPS"]) == (128, 32, 128, 8)
    assert (m["FA_ROW_PITCH"], m["FA_SWZ_B"], m["FA_CAUSAL"], m["FA_CHECKPOINTS"]) == (136, 0, 1, 1)
    assert (m["FA_SK_OFFSET"], m["FA_SV_OFFSET"], m["FA_SMEM_BYTES"]) == (
        cfg.sk_offset_bytes, cfg.sv_offset_bytes, cfg.smem_bytes)
    assert m["FA_CK_S_ACC"] == 0 and m["FA_CK_SO"] == 10 and m["FA_CK_COUNT"] == 11
    seed = KernelBuild().macros()
    assert (seed["FA_SWZ_B"], seed["FA_SWZ_M"], seed["FA_SWZ_S"], seed["FA_MIN_BLOCKS"]) == (3, 3, 3, 4)
    assert "FA_DIAG_ACCURATE_EXP" not in seed  # the exp2 form unless a benchmark diagnostic asks
    assert KernelBuild(diag_accurate_exp=True, min_blocks_override=5).macros()["FA_MIN_BLOCKS"] == 5


@pytest.mark.parametrize("cfg", FAMILY, ids=lambda c: c.tag)
def test_occupancy_target_fits_the_sm(cfg):
    blocks = min_blocks_per_sm(cfg)
    assert 1 <= blocks and (blocks == 1 or blocks * (cfg.smem_bytes + 1024) <= 164 * 1024)
