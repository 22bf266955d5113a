"""isa.shared, isa.barrier and the global memory: ld/st.shared of 1 to 16 bytes, predicated global
accesses, bar.sync (PTX `#data-movement-and-conversion-instructions-ld`, `...-st`,
`#parallel-synchronization-and-communication-instructions-bar`)."""

import numpy as np
import pytest

from fa_sim.errors import KernelFault
from fa_sim.isa import bar_sync, ld_shared, shared_units, st_shared, unit_dtype
from fa_sim.memory import GlobalMemory


@pytest.mark.parametrize("width", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("per_cta", [False, True])
def test_store_then_load_round_trips_element_ids(width, per_cta):
    smem = np.zeros((2, 4096), np.uint8)
    addr = np.arange(32, dtype=np.int64)[::-1] * width + 64  # [32], lanes in reverse order
    if per_cta:  # CTA 1 uses other addresses
        addr = np.stack([addr, addr + 16 * width])
    units = shared_units(addr, width)  # [(C,) 32, k]
    k = units.shape[-1]
    ids = np.arange(2 * 32 * k).reshape(2, 32, k).astype(unit_dtype(width))
    st_shared(smem, units, ids, width, np.ones((2, 32), bool), per_cta)
    np.testing.assert_array_equal(ld_shared(smem, units, width, per_cta), ids)
    view = smem.view(unit_dtype(width))
    lane, a = 7, (addr[1] if per_cta else addr)[7]
    u = a // min(width, 4)
    np.testing.assert_array_equal(view[1, u: u + k], ids[1, lane])


def test_masked_store_skips_lanes():
    smem = np.zeros((1, 256), np.uint8)
    units = shared_units(np.arange(32) * 4, 4)
    mask = np.zeros((1, 32), bool)
    mask[0, ::3] = True
    st_shared(smem, units, np.full((1, 32, 1), 9, np.uint32), 4, mask)
    assert (smem.view(np.uint32)[0, :32] == np.where(mask[0], 9, 0)).all()


def test_shared_preconditions():
    with pytest.raises(KernelFault, match="misaligned"):
        shared_units(np.arange(32) * 16 + 8, 16)
    with pytest.raises(ValueError, match="width"):
        shared_units(np.arange(32) * 4, 12)


def test_global_predication():
    mem = GlobalMemory()
    buf = mem.alloc("x", np.arange(100, dtype=np.uint32))
    addr = buf.base + 4 * np.array([2, 50, 98])
    pred = np.array([True, False, True])
    got = mem.gather(addr, 8, pred).view(np.uint32)
    np.testing.assert_array_equal(got, [[2, 3], [0, 0], [98, 99]])
    mem.scatter(addr, np.full((3, 2), 7, np.uint32).view(np.uint8).reshape(3, 8), pred)
    assert buf.array[3] == 7 and buf.array[50] == 50 and buf.array[99] == 7
    with pytest.raises(KernelFault, match="misaligned"):
        mem.gather(buf.base + np.array([12]), 8, np.array([True]))
    with pytest.raises(KernelFault, match="outside every buffer"):
        mem.gather(buf.base + 4 * np.array([99]), 8, np.array([True]))  # 4 bytes past the end


@pytest.mark.parametrize("width", [8, 16])
def test_wide_access_to_a_buffer_of_an_odd_number_of_words(width):
    """A float2 / float4 access to an array of 4 mod 8 bytes (n % 2 == 1 floats) reads and writes
    its bytes like any other (a uint64 view of such an array does not exist)."""
    mem = GlobalMemory()
    buf = mem.alloc("x", np.arange(13, dtype=np.uint32))
    addr = buf.base + np.array([0, width])
    got = mem.gather(addr, width, np.ones(2, bool)).view(np.uint32)
    np.testing.assert_array_equal(got, np.arange(2 * width // 4).reshape(2, -1))
    mem.scatter(addr, np.full((2, width // 4), 7, np.uint32).view(np.uint8).reshape(2, width), np.ones(2, bool))
    np.testing.assert_array_equal(buf.array, [7] * (2 * width // 4) + list(range(2 * width // 4, 13)))


def test_global_access_spanning_two_buffers():
    mem = GlobalMemory()
    a = mem.alloc("a", np.arange(4, dtype=np.uint32))
    b = mem.alloc("b", np.arange(10, 14, dtype=np.uint32))
    addr = np.array([a.base + 4, b.base + 8])
    np.testing.assert_array_equal(mem.gather(addr, 4, np.ones(2, bool)).view(np.uint32)[:, 0], [1, 12])
    grid = np.array([[a.base + 12, b.base], [b.base + 12, a.base]])  # [2, 2]: masked-off lanes read zeros
    on = np.array([[True, True], [True, False]])
    np.testing.assert_array_equal(mem.gather(grid, 4, on).view(np.uint32)[..., 0], [[3, 10], [13, 0]])
    mem.scatter(addr, np.array([[7, 0, 0, 0], [9, 0, 0, 0]], np.uint8), np.ones(2, bool))
    assert a.array[1] == 7 and b.array[2] == 9


@pytest.mark.parametrize("width", [4, 8, 16])
def test_access_spanning_buffers_whose_sizes_are_not_word_multiples(width):
    """One access over several buffers reads the concatenation of all of them: a 4-byte buffer
    (a kernel's __device__ constant) before the others must not break the 8- and 16-byte paths
    (fa2_bwd.cu's copies of Q and dO in one cp.async run did)."""
    mem = GlobalMemory()
    a = mem.alloc("a", np.arange(8, dtype=np.uint32))
    mem.alloc("c", np.array([5], np.uint32))
    b = mem.alloc("b", np.arange(100, 108, dtype=np.uint32))
    got = mem.gather(np.array([a.base + 16, b.base + 16]), width, np.ones(2, bool)).view(np.uint32)
    n = width // 4
    np.testing.assert_array_equal(got, [np.arange(4, 4 + n), np.arange(104, 104 + n)])


def test_barrier_needs_the_whole_cta():
    active = np.ones((3, 4, 32), bool)
    active[1] = False
    assert bar_sync(active).tolist() == [True, False, True]
    active[2, 0, 0] = False
    with pytest.raises(ValueError, match="part of CTA 2"):
        bar_sync(active)
