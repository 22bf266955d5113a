"""isa.shared, isa.global_mem, isa.barrier: ld/st.shared of 4, 8, 16 bytes, predicated global
accesses, bar.sync (PTX `#data-movement-and-conversion-instructions-ld`, `...-st`,
`#parallel-synchronization-and-communication-instructions-bar`)."""

import numpy as np
import pytest

from fa_sim.isa import bar_sync, ld_global, ld_shared, shared_words, st_global, st_shared


@pytest.mark.parametrize("width", [4, 8, 16])
def test_store_then_load_round_trips_element_ids(width):
    smem = np.zeros((2, 4096), np.uint8)
    addr = np.arange(32, dtype=np.int64)[::-1] * width + 64  # [32], lanes in reverse order
    words = shared_words(addr, width)  # [32, width/4]
    ids = np.arange(2 * 32 * (width // 4), dtype=np.uint32).reshape(2, 32, width // 4)
    st_shared(smem, words, ids)
    np.testing.assert_array_equal(ld_shared(smem, words), ids)
    flat = smem.view(np.uint32)
    lane = 7
    np.testing.assert_array_equal(flat[1, addr[lane] // 4: addr[lane] // 4 + width // 4], ids[1, lane])


def test_masked_store_skips_lanes():
    smem = np.zeros((1, 256), np.uint8)
    words = shared_words(np.arange(32) * 4, 4)
    mask = np.zeros((1, 32), bool)
    mask[0, ::3] = True
    st_shared(smem, words, np.full((1, 32, 1), 9, np.uint32), mask)
    assert (smem.view(np.uint32)[0, :32] == np.where(mask[0], 9, 0)).all()


def test_shared_preconditions():
    with pytest.raises(ValueError, match="aligned"):
        shared_words(np.arange(32) * 16 + 8, 16)
    with pytest.raises(ValueError, match="width"):
        shared_words(np.arange(32) * 4, 12)


def test_global_predication():
    mem = np.arange(100, dtype=np.uint32)
    words = np.array([[3, 4], [50, 51], [98, 99]])
    pred = np.array([True, False, True])
    np.testing.assert_array_equal(ld_global(mem, words, pred), [[3, 4], [0, 0], [98, 99]])
    st_global(mem, words, np.full((3, 2), 7, np.uint32), pred)
    assert mem[3] == 7 and mem[50] == 50 and mem[99] == 7


def test_barrier_needs_the_whole_cta():
    active = np.ones((3, 4, 32), bool)
    active[1] = False
    assert bar_sync(active).tolist() == [True, False, True]
    active[2, 0, 0] = False
    with pytest.raises(ValueError, match="part of a CTA"):
        bar_sync(active)
