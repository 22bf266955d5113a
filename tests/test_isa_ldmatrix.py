"""isa.ldmatrix against docs/hardware_facts.md (PTX `#warp-level-matrix-instructions-ldmatrix`),
with shared memory filled with each half's own index."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fa_sim.isa import ldmatrix, ldmatrix_index

FIXED = settings(derandomize=True, database=None, max_examples=30, deadline=None)
HALVES = 4096


def _smem_ids(ctas=1):
    ids = np.arange(HALVES, dtype=np.uint16)
    return np.stack([ids + 5000 * c for c in range(ctas)]).view(np.uint8)  # [C, 8192] bytes


def _oracle(addr, num, trans):
    """What lane l receives in register m, half j, one lane at a time."""
    out = np.zeros((32, num, 2), dtype=np.int64)
    for lane in range(32):
        for m in range(num):
            for j in range(2):
                if trans:
                    row, col = 2 * (lane % 4) + j, lane // 4
                else:
                    row, col = lane // 4, 2 * (lane % 4) + j
                out[lane, m, j] = addr[8 * m + row] // 2 + col
    return out


@FIXED
@given(num=st.sampled_from([1, 2, 4]), trans=st.booleans(),
       rows=st.lists(st.integers(0, HALVES // 8 - 1), min_size=32, max_size=32))
def test_every_lane_receives_what_the_ptx_rules_say(num, trans, rows):
    addr = np.array(rows, dtype=np.int64) * 16
    regs = ldmatrix(_smem_ids(), ldmatrix_index(addr, num, trans))  # [1, 32, num] u32
    got = regs[0].view(np.uint16).reshape(32, num, 2)
    np.testing.assert_array_equal(got, _oracle(addr, num, trans))


def test_x4_of_a_row_major_tile_gives_lane0_the_a_fragment():
    # A operand from a row-major 16x16 tile (row pitch 16 halves): lane l points at row l & 15,
    # k offset 8 (l >> 4); lane 0 then holds (0,0),(0,1) | (8,0),(8,1) | (0,8),(0,9) | (8,8),(8,9).
    lane = np.arange(32)
    addr = 2 * (16 * (lane & 15) + 8 * (lane >> 4))
    got = ldmatrix(_smem_ids(), ldmatrix_index(addr, 4, False))[0].view(np.uint16).reshape(32, 8)
    assert got[0].tolist() == [0, 1, 128, 129, 8, 9, 136, 137]


def test_unused_lanes_addresses_are_ignored_and_ctas_are_independent():
    addr = np.arange(32, dtype=np.int64) * 16
    odd = addr.copy()
    odd[8:] = 3  # misaligned, but x1 only reads lanes 0..7
    smem = _smem_ids(ctas=2)
    a = ldmatrix(smem, ldmatrix_index(addr, 1, False))
    b = ldmatrix(smem, ldmatrix_index(odd, 1, False))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[1].view(np.uint16), a[0].view(np.uint16) + 5000)


def test_preconditions():
    addr = np.arange(32, dtype=np.int64) * 16
    with pytest.raises(ValueError, match="16-byte aligned"):
        ldmatrix_index(addr + 4, 4, False)
    with pytest.raises(ValueError, match="x3"):
        ldmatrix_index(addr, 3, False)
    with pytest.raises(ValueError, match="32 lanes"):
        ldmatrix_index(addr[:16], 2, False)


def test_index_moved_keeps_the_gather():
    addr = (np.arange(3 * 32).reshape(3, 32) % 200) * 16  # [R, 32]
    idx = ldmatrix_index(addr, 4, True)
    moved = idx.moved(0, 1)  # [32, R, ...]
    np.testing.assert_array_equal(ldmatrix(_smem_ids(), moved), np.moveaxis(ldmatrix(_smem_ids(), idx), 1, 2))
