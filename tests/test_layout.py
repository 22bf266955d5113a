"""fa_sim.layout: the laws of the algebra at every point of the domain, and the kernel's maps
against the spec (docs/walkthrough.md), each test citing its table."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fa_sim.config import KernelConfig, SmemLayout
from fa_sim.cute import (
    ComposedLayout, Layout, Swizzle, blocked_product, coalesce, composition, cosize, crd2idx, flatten, idx2crd,
    product, size, tile_to_shape,
)
from fa_sim.layout import (
    LDSM_DST, MMA_A, MMA_B, MMA_C, Gemm, Ldsm, Operand, TiledMma, acc_as_a_operand, acc_rowcol, acc_rowcol_coords,
    copy_thread_layout, copy_tv, ldsm_view, smem_layout,
)

FAMILY = KernelConfig.family()
SEED = KernelConfig()
LAWS = settings(max_examples=150, deadline=None)


def _map(f, t):
    return tuple(_map(f, x) for x in t) if isinstance(t, tuple) else f(t)


@st.composite
def layouts(draw, leaf=st.integers(1, 6), stride=st.integers(0, 12)):
    shape = draw(st.recursive(leaf, lambda c: st.lists(c, min_size=1, max_size=3).map(tuple), max_leaves=5))
    return Layout(shape, _map(lambda _: draw(stride), shape))


POW2 = st.sampled_from([1, 2, 4, 8])
POW2_STRIDE = st.sampled_from([0, 1, 2, 4, 8, 16])


@st.composite
def injective_layouts(draw):
    """Power-of-two shapes, strides a permuted compact order times 1, 2 or 4: modes on disjoint bits."""
    shape = draw(st.recursive(POW2, lambda c: st.lists(c, min_size=1, max_size=3).map(tuple), max_leaves=4))
    leaves = flatten(shape)
    strides, current = [0] * len(leaves), draw(st.sampled_from([1, 2, 4]))
    for k in draw(st.permutations(range(len(leaves)))):
        strides[k], current = current, current * leaves[k]
    it = iter(strides)
    return Layout(shape, _map(lambda _: next(it), shape))


def points(layout):
    """Every flat index of the domain, as one int64 array."""
    return np.arange(size(layout))


# == the algebra: each operation's defining law at every point =======================================
@LAWS
@given(layouts())
def test_flat_index_is_the_colexicographic_coordinate(L):
    i = points(L)
    crd = idx2crd(i, L.shape)
    assert np.array_equal(L(i), L(crd))
    # colexicographic: the compact layout of the same shape numbers the coordinates 0, 1, 2, ...
    assert np.array_equal(Layout(L.shape)(crd), i)
    # vectorised evaluation equals point-by-point evaluation
    assert [L(int(k)) for k in i] == list(L(i))


@LAWS
@given(layouts())
def test_hierarchical_coordinate_is_the_inner_product(L):
    i = points(L)
    leaves = flatten(idx2crd(i, L.shape))
    expected = sum((c * d for c, d in zip(leaves, flatten(L.stride))), np.zeros_like(i))
    assert np.array_equal(L(i), expected)


@LAWS
@given(layouts())
def test_cosize_bounds_the_image(L):
    image = L(points(L))
    assert image.min() >= 0 and image.max() == cosize(L) - 1


@LAWS
@given(layouts())
def test_coalesce_is_the_same_function_with_fewest_modes(L):
    C = coalesce(L)
    assert size(C) == size(L)
    assert np.array_equal(C(points(L)), L(points(L)))
    s, d = flatten(C.shape), flatten(C.stride)
    assert all(s[k] * d[k] != d[k + 1] for k in range(len(s) - 1))


@LAWS
@given(layouts(leaf=POW2, stride=POW2_STRIDE), injective_layouts())
def test_composition_law(A, B):
    """R(i) == A(B(i)) wherever B lands in A's domain (cosize(B) <= size(A)) with modes that do not
    overlap (CuTe composes mode by mode, so B's modes must address disjoint digits of A)."""
    assume(cosize(B) <= size(A))
    try:
        R = composition(A, B)
    except ValueError:
        assume(False)
    assert size(R) == size(B)
    if isinstance(B.shape, tuple):  # B's modes are kept
        assert [size(R[k]) for k in range(len(B))] == [size(B[k]) for k in range(len(B))]
    i = points(B)
    assert np.array_equal(R(i), A(B(i)))


def test_composition_golden():
    """CuTe's layout-algebra examples: (6,2):(8,2) o (4,3):(3,1) = ((2,2),3):((24,2),8)."""
    A, B = Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1))
    R = composition(A, B)
    assert str(R) == "((2,2),3):((24,2),8)"
    assert np.array_equal(R(points(B)), A(B(points(B))))
    assert str(composition(Layout((4, 8), (8, 1)), Layout(8, 4))) == "8:1"  # a transposed read


def test_composition_rejects_what_is_not_defined():
    with pytest.raises(ValueError, match="not defined"):
        composition(Layout((3, 4), (1, 10)), Layout(2, 2))


@LAWS
@given(st.integers(0, 4), st.integers(0, 4), st.integers(0, 5), st.booleans())
def test_swizzle_is_an_involution_and_a_bijection(b, m, s, negative):
    assume(s >= b)
    sw = Swizzle(b, m, -s if negative and s else s)
    n = 1 << (sw.span_bits + 1)
    p = np.arange(n)
    q = sw(p)
    assert np.array_equal(sw(q), p)  # involution
    assert np.array_equal(np.sort(q), p)  # bijection on [0, 2**n)
    assert np.array_equal(q & ((1 << m) - 1), p & ((1 << m) - 1))  # the low M bits never move
    zzz = ((1 << b) - 1) << (m - min(0, sw.shift))
    assert np.all(((p ^ q) & ~zzz) == 0)  # only the B target bits change


def test_swizzle_333_is_the_spec_formula():
    """Spec, SmemLayoutQ: swizzle(p) = p XOR ((p & 0x1c0) >> 3)."""
    p = np.arange(1 << 14)
    assert Swizzle(3, 3, 3).yyy_mask == 0x1C0
    assert np.array_equal(Swizzle(3, 3, 3)(p), p ^ ((p & 0x1C0) >> 3))


def test_swizzle_rejects_overlapping_bit_fields():
    with pytest.raises(ValueError, match=r"\|S\| >= B"):
        Swizzle(3, 3, 2)


@LAWS
@given(layouts(leaf=st.integers(1, 8), stride=st.integers(0, 64)), st.integers(0, 3), st.integers(0, 3))
def test_composed_layout_is_swizzle_after_layout(L, b, m):
    sw = Swizzle(b, m, b + 1)
    C = composition(sw, L)
    assert isinstance(C, ComposedLayout)
    i = points(L)
    assert np.array_equal(C(i), sw(L(i)))
    assert cosize(C) == int(sw(L(i)).max()) + 1


@LAWS
@given(st.integers(1, 4), st.integers(1, 8), st.integers(1, 4), st.integers(1, 4), st.booleans())
def test_tile_to_shape_repeats_the_atom_column_major(a0, a1, r0, r1, row_major):
    atom = Layout((a0, a1), (a1, 1) if row_major else (1, a0))
    R = tile_to_shape(atom, (a0 * r0, a1 * r1))
    r, c = np.meshgrid(np.arange(a0 * r0), np.arange(a1 * r1), indexing="ij")
    tiles = Layout((r0, r1))
    assert np.array_equal(R(r, c), atom(r % a0, c % a1) + cosize(atom) * tiles(r // a0, c // a1))
    assert np.array_equal(blocked_product(atom, tiles)(((r % a0, r // a0), (c % a1, c // a1))), R(r, c))


def test_tile_to_shape_keeps_a_swizzle_outermost_and_rejects_what_cannot_tile():
    atom = composition(Swizzle(3, 3, 3), Layout((8, 64), (64, 1)))
    R = tile_to_shape(atom, (32, 64))
    r, c = np.meshgrid(np.arange(32), np.arange(64), indexing="ij")
    assert np.array_equal(R(r, c), Swizzle(3, 3, 3)(atom.layout(r % 8, c) + 512 * (r // 8)))
    with pytest.raises(ValueError, match="would not tile"):
        tile_to_shape(composition(Swizzle(3, 3, 3), Layout((4, 64), (64, 1))), (32, 64))
    with pytest.raises(ValueError, match="does not tile"):
        tile_to_shape(Layout((8, 64), (64, 1)), (12, 64))


def test_printing_and_validation():
    assert str(Layout(((2, 1), (2, 8)), ((2, 0), (1, 4)))) == "((2,1),(2,8)):((2,0),(1,4))"
    assert str(Layout((4, 1, 8))) == "(4,1,8):(1,0,4)"  # size-1 modes get stride 0, as CuTe prints
    assert str(composition(Swizzle(3, 3, 3), Layout((8, 64), (64, 1)))) == "Sw<3,3,3> o (8,64):(64,1)"
    with pytest.raises(ValueError, match="not congruent"):
        Layout((2, 4), (1, (2, 8)))
    with pytest.raises(ValueError, match="not congruent"):
        Layout((2, 4))((1, 2, 3))
    assert crd2idx((1, (1, 2)), (2, (2, 4)), (1, (2, 4))) == 1 + 2 + 8
    assert product(((2, 3), 4)) == 24


# == shared memory (spec table 11) =================================================================
@pytest.mark.parametrize("cfg", FAMILY, ids=lambda c: c.tag)
def test_smem_layout_equals_the_config_offset_everywhere(cfg):
    for rows in sorted({cfg.block_m, cfg.block_n}):
        L = smem_layout(cfg, rows)
        r, c = np.meshgrid(np.arange(rows), np.arange(cfg.head_dim), indexing="ij")
        off = L(r, c)
        assert np.array_equal(off, cfg.smem_offset(r, c))
        pad = cfg.row_pitch - cfg.head_dim  # the last row's padding is allocated but never addressed
        assert cosize(L) == cfg.tile_halves(rows) - pad
        assert len(np.unique(off)) == off.size  # no two elements share a half
        chunks = off.reshape(rows, -1, 8)  # a 16-byte chunk stays contiguous and aligned (cp.async, ldmatrix)
        assert np.all(chunks[..., 0] % 8 == 0) and np.all(np.diff(chunks, axis=-1) == 1)


def test_table11_swizzled_offsets():
    """Table 11: (0,0)->0, (0,8)->8, (1,0)->72, (1,8)->64, (7,56)->448, (8,0)->512."""
    L = smem_layout(SEED, 64)
    assert str(L) == "Sw<3,3,3> o (64,64):(64,1)"
    golden = {(0, 0): 0, (0, 8): 8, (1, 0): 72, (1, 8): 64, (7, 56): 448, (8, 0): 512}
    assert {rc: int(L(*rc)) for rc in golden} == golden
    plain = smem_layout(KernelConfig(smem=SmemLayout.PLAIN), 64)  # table 11's middle column
    assert [int(plain(*rc)) for rc in golden] == [0, 8, 64, 72, 504, 512]
    r, c = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")  # offset = 64 r + (c XOR 8 (r%8))
    assert np.array_equal(L(r, c), 64 * r + (c ^ (8 * (r % 8))))


# == the cooperative copy (spec "TiledCopy") =======================================================
def test_copy_coordinates_of_threads_0_7_8_32():
    """Spec: thread 0 rows 0,16,32,48 cols 0-7; 7: cols 56-63; 8: rows 1,17,33,49; 32: rows 4,20,36,52."""
    tv = copy_tv(SEED, 64)
    golden = {0: ([0, 16, 32, 48], range(0, 8)), 7: ([0, 16, 32, 48], range(56, 64)),
              8: ([1, 17, 33, 49], range(0, 8)), 32: ([4, 20, 36, 52], range(0, 8))}
    for tid, (rows, cols) in golden.items():
        r, c = tv(tid, (np.arange(8)[:, None], np.arange(4)[None, :]))  # [v, pass]
        assert np.array_equal(r, np.broadcast_to(rows, (8, 4)))
        assert np.array_equal(c, np.broadcast_to(np.array(cols)[:, None], (8, 4)))
    assert str(copy_thread_layout(SEED)) == "(16,8):(8,1)"  # traits: Shape<16,8>, Stride<8,1>


@pytest.mark.parametrize("cfg", FAMILY[:: max(1, len(FAMILY) // 24)], ids=lambda c: c.tag)
def test_copy_map_is_a_bijection_with_the_spec_formula(cfg):
    """row = tid/(d/8) + rows_per_pass*r, col = 8*(tid%(d/8)) + v (spec: tid/8 + 16r, 8(tid%8) + v)."""
    tpr, rpp = cfg.copy_threads_per_row, cfg.copy_rows_per_pass
    for rows in sorted({cfg.block_m, cfg.block_n}):
        tid = np.arange(cfg.n_threads)[:, None, None]
        v, i = np.arange(8)[None, :, None], np.arange(rows // rpp)[None, None, :]
        r, c = copy_tv(cfg, rows)(tid, (v, i))
        assert np.array_equal(r, np.broadcast_to(tid // tpr + rpp * i, r.shape))
        assert np.array_equal(c, np.broadcast_to(8 * (tid % tpr) + v, c.shape))
        assert len(np.unique(r * cfg.head_dim + c)) == rows * cfg.head_dim
        assert np.array_equal(copy_thread_layout(cfg)(r[:, 0, 0] % rpp, c[:, 0, 0] // 8), tid[:, 0, 0])


# == the MMA: atoms, TiledMMA and fragments (tables 2, 3, 12, lane formulas) =========================
def test_mma_atoms_match_the_ptx_fragments():
    """PTX #warp-level-matrix-fragment-mma-16816-float (docs/hardware_facts.md), g = lane>>2, t = lane&3."""
    lane = np.arange(32)[:, None]
    g, t = lane >> 2, lane & 3
    i = np.arange(8)[None, :]
    assert all(np.array_equal(x, y) for x, y in zip(
        MMA_A(lane, i), (g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2))))
    i = np.arange(4)[None, :]
    n, k = MMA_B(lane, i)
    assert np.array_equal(k, 2 * t + (i & 1) + 8 * (i >> 1)) and np.array_equal(n, g + 0 * i)
    assert all(np.array_equal(x, y) for x, y in zip(MMA_C(lane, i), (g + 8 * (i >> 1), 2 * t + (i & 1))))


@pytest.mark.parametrize("cfg", FAMILY[:: max(1, len(FAMILY) // 24)], ids=lambda c: c.tag)
@pytest.mark.parametrize("gemm", list(Gemm))
def test_fragments_partition_their_tiles(cfg, gemm):
    """A and C: each element held by exactly one thread of the CTA; B: by one lane of every warp."""
    mma = TiledMma(cfg, gemm)
    for op in Operand:
        tv = mma.tv(op)
        rows, cols = tv.tile
        thr = np.arange(cfg.n_threads)[:, None]
        r, c = tv(thr, np.arange(size(mma.fragment(op)))[None, :])
        copies = cfg.n_warps if op is Operand.B else 1
        counts = np.bincount((r * cols + c).ravel(), minlength=rows * cols)
        assert counts.size == rows * cols and np.all(counts == copies)
        if op is Operand.B:  # within one warp, exactly once
            assert len(np.unique((r * cols + c)[:32])) == rows * cols


def test_general_lane_formulas_of_the_seed():
    """Spec section 5, "Any lane's coordinates": A query 16w+{g,g+8}, d 16h+{2a,2a+1,2a+8,2a+9};
    B key 8j+g, same d; C query 16w+{g,g+8}, key 8j+{2a,2a+1}."""
    mma = TiledMma(SEED)
    tid = np.arange(128)
    w, g, a = tid // 32, (tid % 32) // 4, tid % 4
    for h in range(4):
        r, c = mma.tv(Operand.A)(tid[:, None], (np.arange(8)[None, :], 0, h))
        for x in range(128):
            assert set(zip(r[x], c[x])) == set(itertools.product(
                [16 * w[x] + g[x], 16 * w[x] + g[x] + 8], [16 * h + 2 * a[x] + e for e in (0, 1, 8, 9)]))
    for j, h in itertools.product(range(8), range(4)):
        k, d = mma.tv(Operand.B)(tid[:, None], (np.arange(4)[None, :], j, h))
        assert np.all(k == (8 * j + g)[:, None])
        assert np.array_equal(np.sort(d, axis=1), 16 * h + 2 * a[:, None] + np.array([0, 1, 8, 9]))
        q, key = mma.tv(Operand.C)(tid[:, None], (np.arange(4)[None, :], 0, j))
        assert np.array_equal(q, 16 * w[:, None] + g[:, None] + np.array([0, 0, 8, 8]))
        assert np.array_equal(key, 8 * j + 2 * a[:, None] + np.array([0, 1, 0, 1]))


def test_lane_0_1_4_operands():
    """Spec: lane 0 holds Q rows 0, 8 at d 0,1,8,9; K key 0 at d 0,1,8,9; S(0,0),S(0,1),S(8,0),S(8,1).
    Lane 1: d 2,3,10,11 and keys 2,3; lane 4: queries 1, 9 at keys 0, 1."""
    mma = TiledMma(SEED)
    qa = mma.tv(Operand.A)(0, (np.arange(8), 0, 0))
    assert sorted(zip(*qa)) == [(0, 0), (0, 1), (0, 8), (0, 9), (8, 0), (8, 1), (8, 8), (8, 9)]
    kb = mma.tv(Operand.B)(0, (np.arange(4), 0, 0))
    assert sorted(zip(*kb)) == [(0, 0), (0, 1), (0, 8), (0, 9)]
    assert list(zip(*mma.tv(Operand.C)(0, np.arange(4)))) == [(0, 0), (0, 1), (8, 0), (8, 1)]
    assert sorted(set(mma.tv(Operand.A)(1, (np.arange(8), 0, 0))[1])) == [2, 3, 10, 11]
    assert list(zip(*mma.tv(Operand.C)(1, np.arange(4)))) == [(0, 2), (0, 3), (8, 2), (8, 3)]
    assert list(zip(*mma.tv(Operand.C)(4, np.arange(4)))) == [(1, 0), (1, 1), (9, 0), (9, 1)]


def test_table2_warp_to_query_rows():
    """Table 2: warp w = threads 32w..32w+31 owns query rows 16w..16w+15 of S and O, all 64 keys of
    the round, all 64 output dims."""
    for gemm, cols in ((Gemm.QK, 64), (Gemm.PV, 64)):
        mma = TiledMma(SEED, gemm)
        for w in range(4):
            r, c = mma.tv(Operand.C)(np.arange(32 * w, 32 * w + 32)[:, None], np.arange(32)[None, :])
            assert set(r.ravel()) == set(range(16 * w, 16 * w + 16))
            assert set(c.ravel()) == set(range(cols))


def test_table3_levels_of_the_qk_tiling():
    """Table 3: round 64x64x64 (4 warps, 128 threads); TiledMMA cover 64x16x16 repeated 4x along N and
    K; one warp 16x64x64 = 8 N sub-blocks x 4 K segments = 32 MMAs; one m16n8k16 = 16x8x16."""
    mma = TiledMma(SEED)
    assert mma.mnk == (64, 64, 64) and SEED.n_threads == 128
    assert mma.tile_mnk == (64, 16, 16) and mma.repeats == (1, 4, 4)
    assert (16 * mma.mma_m, mma.mnk[1], mma.mnk[2]) == (16, 64, 64)
    assert (mma.mma_n, mma.k_segments, mma.mmas_per_warp) == (8, 4, 32)
    assert (MMA_A.tile[0], MMA_B.tile[0], MMA_A.tile[1]) == (16, 8, 16)
    assert size(MMA_A.layout[0]) == size(MMA_B.layout[0]) == size(MMA_C.layout[0]) == 32
    # MMA counts: 128 per CTA per QK round, and QK + PV over two non-causal rounds = 512
    pv = TiledMma(SEED, Gemm.PV)
    assert 4 * mma.mmas_per_warp == 128 and 2 * 4 * (mma.mmas_per_warp + pv.mmas_per_warp) == 512


def test_table12_fragment_shapes():
    """Table 12: tCrQ (8,1,4) 32 half, tCrK (4,8,4) 128 half, tCrS (4,1,8) 32 float,
    tXrQ (8,1,4), tXrK (8,4,4) sharing the storage of tCrQ / tCrK."""
    mma = TiledMma(SEED)
    top = lambda L: tuple(size(L[k]) for k in range(len(L)))  # noqa: E731
    frag = {op: mma.fragment(op) for op in Operand}
    assert [top(frag[op]) for op in Operand] == [(8, 1, 4), (4, 8, 4), (4, 1, 8)]
    assert [size(frag[op]) for op in Operand] == [32, 128, 32]
    for op, expected in ((Operand.A, (8, 1, 4)), (Operand.B, (8, 4, 4))):
        view = ldsm_view(frag[op], op)
        assert top(view) == expected
        i = np.arange(size(view))
        assert np.array_equal(np.sort(view(i)), frag[op](i))  # same registers, another view
    assert frag[Operand.C].stride == ((1, 2), 0, 4)  # CuTe order e = v + 4*(mi + MMA_M*nj)


# == ldmatrix (table 10's s2r copies) =================================================================
def test_ldmatrix_destination_maps():
    """PTX ldmatrix: without .trans lane l gets row l/4, cols 2(l%4)+j of matrix m; with .trans rows
    2(l%4)+j of column l/4."""
    lane, j, m = np.arange(32)[:, None, None], np.arange(2)[None, :, None], np.arange(4)[None, None, :]
    r, c = LDSM_DST[False](lane, (j, m))
    assert np.array_equal(r, np.broadcast_to(lane // 4, r.shape)) and np.array_equal(c, 2 * (lane % 4) + j + 8 * m)
    r, c = LDSM_DST[True](lane, (j, m))
    assert np.array_equal(r, 2 * (lane % 4) + j + 0 * m) and np.array_equal(c, lane // 4 + 8 * m + 0 * j)


@pytest.mark.parametrize("ldsm", list(Ldsm))
def test_ldmatrix_x4_delivers_the_mma_fragment(ldsm):
    """What lane l receives in half 2m+j is the fragment value the MMA expects there: Q -> a_{2m+j};
    K, V -> b_{(2m+j)%4} of n8 tile (2m+j)//4 (retile_D is the identity on storage)."""
    lane, val = np.arange(32)[:, None], np.arange(8)[None, :]
    got = ldsm.received(lane, val)
    if ldsm is Ldsm.Q:
        want = MMA_A(lane, val)
    else:
        n, k = MMA_B(lane, val % 4)
        n = n + 8 * (val // 4)
        want = (n, k) if ldsm is Ldsm.K else (k, n)  # V is stored [key][d] and read transposed
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert len(np.unique(got[0] * 16 + got[1])) == 256  # the 16x16 block, each half exactly once
    assert np.all(ldsm.addr(np.arange(32)) // 16 % 8 == 0)  # row addresses are 16-byte chunk starts


# == rowcol view, causal mask, reductions, register reuse (tables 4-9) ===============================
def test_rowcol_view_of_tcrs():
    """Spec: tCrS_rowcol = ((2,1),(2,8)):((2,0),(1,4)); slot = 2*mi + b + 4*nj."""
    rc = acc_rowcol(TiledMma(SEED).fragment(Operand.C))
    assert str(rc) == "((2,1),(2,8)):((2,0),(1,4))"
    for mi, b, nj in itertools.product(range(2), range(2), range(8)):
        assert rc((mi, 0), (b, nj)) == 2 * mi + b + 4 * nj


@pytest.mark.parametrize("cfg, expected", [
    (KernelConfig(block_m=128), "((2,2),(2,8)):((2,4),(1,8))"),
    (KernelConfig(block_n=32), "((2,1),(2,4)):((2,0),(1,4))"),
    (KernelConfig(block_m=128, block_n=128), "((2,2),(2,16)):((2,4),(1,8))"),
])
def test_rowcol_view_generalised(cfg, expected):
    """MMA_M = 2 and other MMA_N: slot = 2*half + 4*mi + b + 4*MMA_M*nj (checkpoints.py order)."""
    mma = TiledMma(cfg)
    rc = acc_rowcol(mma.fragment(Operand.C))
    assert str(rc) == expected
    for half, mi, b, nj in itertools.product(range(2), range(mma.mma_m), range(2), range(mma.mma_n)):
        assert rc((half, mi), (b, nj)) == 2 * half + 4 * mi + b + 4 * mma.mma_m * nj


@pytest.mark.parametrize("cfg", FAMILY[:: max(1, len(FAMILY) // 24)], ids=lambda c: c.tag)
def test_rowcol_global_coordinates(cfg):
    """Spec: q = 64 m_block + 16 w + lane/4 + 8 mi, k = 64 nbi + 2 (lane%4) + b + 8 nj; generally the
    m16 atom mi' of warp w sits at rows 16*n_warps*mi' + 16*w."""
    tid = np.arange(cfg.n_threads)[:, None, None]
    w, lane = tid // 32, tid % 32
    q, k = acc_rowcol_coords(cfg, tid[..., 0, 0], m_block=1, n_block=2)
    rows, cols = np.arange(q.shape[1])[None, :, None], np.arange(q.shape[2])[None, None, :]
    half, mi, b, nj = rows % 2, rows // 2, cols % 2, cols // 2
    assert np.array_equal(q, np.broadcast_to(cfg.block_m + 16 * w + lane // 4 + 8 * half + 16 * cfg.n_warps * mi, q.shape))
    assert np.array_equal(k, np.broadcast_to(2 * cfg.block_n + 2 * (lane % 4) + b + 8 * nj, k.shape))


def test_table4_causal_mask_of_lanes_0_to_3():
    """Table 4 (diagonal block, warp 0): keys held 0,1,8,9..56,57 / 2,3,10,11..58,59 / ...; query 0
    keeps key 0 (lane 0) and nothing else; query 8 keeps 0,1,8 / 2,3 / 4,5 / 6,7."""
    q, k = acc_rowcol_coords(SEED, np.arange(4))
    held = {lane: sorted(k[lane, 0]) for lane in range(4)}
    assert held[0][:4] == [0, 1, 8, 9] and held[0][-2:] == [56, 57]
    assert [held[ln][:4] for ln in (1, 2, 3)] == [[2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    assert [held[ln][-2:] for ln in (1, 2, 3)] == [[58, 59], [60, 61], [62, 63]]
    assert np.all(q[:, 0] == 0) and np.all(q[:, 1] == 8)
    keep = k <= q
    assert [sorted(k[ln, 0][keep[ln, 0]]) for ln in range(4)] == [[0], [], [], []]
    assert [sorted(k[ln, 1][keep[ln, 1]]) for ln in range(4)] == [[0, 1, 8], [2, 3], [4, 5], [6, 7]]
    assert sorted(np.concatenate([k[ln, 1][keep[ln, 1]] for ln in range(4)])) == list(range(9))


def test_table5_quad_groups_and_table6_columns():
    """Table 5: group g = lanes 4g..4g+3 holds queries g (mi=0) and g+8 (mi=1), 16 columns each,
    64 together. Table 6: lane 0..3 columns; ni=2 is key 8 for lane 0 and key 10 for lane 1."""
    q, k = acc_rowcol_coords(SEED, np.arange(32))
    for g in range(8):
        quad = slice(4 * g, 4 * g + 4)
        assert np.all(q[quad, 0] == g) and np.all(q[quad, 1] == g + 8)
        assert sorted(k[quad, 0].ravel()) == list(range(64))
        assert np.array_equal(k[quad, 0], k[quad, 1])
    table6 = {0: [0, 1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57],
              1: [2, 3, 10, 11, 18, 19, 26, 27, 34, 35, 42, 43, 50, 51, 58, 59],
              2: [4, 5, 12, 13, 20, 21, 28, 29, 36, 37, 44, 45, 52, 53, 60, 61],
              3: [6, 7, 14, 15, 22, 23, 30, 31, 38, 39, 46, 47, 54, 55, 62, 63]}
    assert {lane: list(k[lane, 0]) for lane in range(4)} == table6  # ascending in ni = b + 2 nj
    assert (k[0, 0, 2], k[1, 0, 2]) == (8, 10)
    # threads 32..35 hold queries 16, 24; threads 124..127 hold 55, 63
    q_all, _ = acc_rowcol_coords(SEED, np.array([32, 127]))
    assert list(q_all[0, :, 0]) == [16, 24] and list(q_all[1, :, 0]) == [55, 63]


@pytest.mark.parametrize("cfg", FAMILY[:: max(1, len(FAMILY) // 24)], ids=lambda c: c.tag)
def test_table9_s_registers_are_the_a_operand_of_pv(cfg):
    """Table 9: the register that held S(q, key) after QK holds P(q, key) as PV's A operand; lane 0's
    segments are keys 0,1,8,9 / 16,17,24,25 / 32,33,40,41 / 48,49,56,57."""
    qk, pv = TiledMma(cfg, Gemm.QK), TiledMma(cfg, Gemm.PV)
    a_view = acc_as_a_operand(qk.fragment(Operand.C))
    tid = np.arange(cfg.n_threads)[:, None]
    f = np.arange(size(a_view))[None, :]
    s_coords = qk.tv(Operand.C)(tid, a_view(f))
    p_coords = pv.tv(Operand.A)(tid, f)
    assert np.array_equal(s_coords[0], p_coords[0]) and np.array_equal(s_coords[1], p_coords[1])
    if cfg == SEED:
        _, key = pv.tv(Operand.A)(0, (np.arange(8)[:, None], 0, np.arange(4)[None, :]))
        assert [sorted(set(key[:, h])) for h in range(4)] == [
            [0, 1, 8, 9], [16, 17, 24, 25], [32, 33, 40, 41], [48, 49, 56, 57]]


def _same(xs, ys) -> bool:
    return all(np.array_equal(*np.broadcast_arrays(x, y)) for x, y in zip(xs, ys))


def test_agrees_with_the_closed_form_lane_maps():
    """Two derivations of one truth: the layouts here and the spec's closed forms (fa_sim.spec_maps)."""
    from fa_sim import spec_maps as lanemaps
    for cfg in (SEED, KernelConfig(block_m=128, head_dim=128, block_n=32)):
        qk, pv = TiledMma(cfg, Gemm.QK), TiledMma(cfg, Gemm.PV)
        t = np.arange(cfg.n_threads)[:, None, None, None]  # [thread, value, repeat, segment]
        e = np.arange(size(qk.fragment(Operand.C)))[None, :]
        assert _same(qk.tv(Operand.C)(t[..., 0, 0], e), lanemaps.acc_coords(cfg, t[..., 0, 0], e))
        i, mi, h = np.arange(8)[:, None, None], np.arange(qk.mma_m)[:, None], np.arange(qk.k_segments)
        assert _same(qk.tv(Operand.A)(t, (i, mi, h)), lanemaps.a_fragment(cfg, t, mi, h, i))
        i, nj = np.arange(4)[:, None, None], np.arange(qk.mma_n)[:, None]
        assert _same(qk.tv(Operand.B)(t, (i, nj, h)), lanemaps.qk_b_fragment(t, nj, h, i))
        nj, h = np.arange(pv.mma_n)[:, None], np.arange(pv.k_segments)
        d, key = pv.tv(Operand.B)(t, (i, nj, h))
        assert _same((key, d), lanemaps.pv_b_fragment(t, nj, h, i))
