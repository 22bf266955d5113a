"""mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (and .f32.bf16.bf16.f32) on lane arrays.

PTX anchor: `#warp-level-matrix-fragment-mma-16816-float` (docs/hardware_facts.md). With g = lane >> 2,
t = lane & 3:
  A (16x16, 4 regs f16x2 = a0..a7): row g (a0,a1,a4,a5) or g+8 (a2,a3,a6,a7), col 2t + (i & 1),
    plus 8 for a4..a7.
  B (16x8 as k x n, 2 regs = b0..b3): k = 2t + (i & 1), plus 8 for b2, b3; n = g.
  C/D (16x8, 4 f32): row g (c0, c1) or g+8 (c2, c3); col 2t + (i & 1).

The lane -> matrix maps are closed forms; one warp instruction gathers the fragments of its 32
lanes into matrices, multiplies, and scatters D back. `mma_tiles` executes the MI x NJ independent
MMAs of one k16 step of a warp-level GEMM at once (the same arithmetic per instruction).

Arithmetic: `accumulate` is the only place the tensor core's accumulation is modelled, by a
fa_sim.tensorcore.FusedDotModel. The default, EXACT, sums the exact fp16 products and C in float64
and rounds once to nearest (fast: one batched matmul). H200 is the fitted hardware model (one
fused 16-term step, exponents ea + eb, 24 + 2 bits kept, truncation and result toward zero),
bit-exact on the H200 but about 50 times slower, since it needs every product separately.

The operand type is the model's (`FusedDotModel.operand`, "f16" or "bf16": `model.for_operand`): the
fragments hold two 16-bit patterns per register either way, and bf16 operands become their float32
values (the pattern shifted up 16 bits: exact) where f16 ones are viewed as float16.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .sm80 import MMA_K, MMA_M, MMA_N, WARP_SIZE
from ..tensorcore import EXACT, FusedDotModel
from .lanes import GROUP, IN_GROUP, check_lane_axis

A_REGS, B_REGS, C_REGS = 4, 2, 4  # 32-bit registers per lane


def a_coords() -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of A element a_i held by each lane: two [32, 8] int64 arrays."""
    i = np.arange(2 * A_REGS)[None, :]
    row = GROUP[:, None] + 8 * ((i >> 1) & 1)
    col = 2 * IN_GROUP[:, None] + (i & 1) + 8 * (i >> 2)
    return row, col


def b_coords() -> tuple[np.ndarray, np.ndarray]:
    """(k, n) of B element b_i held by each lane: two [32, 4] int64 arrays."""
    i = np.arange(2 * B_REGS)[None, :]
    k = 2 * IN_GROUP[:, None] + (i & 1) + 8 * (i >> 1)
    n = np.broadcast_to(GROUP[:, None], k.shape)
    return k, n


def c_coords() -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of C/D element c_i held by each lane: two [32, 4] int64 arrays."""
    i = np.arange(C_REGS)[None, :]
    return GROUP[:, None] + 8 * (i >> 1), 2 * IN_GROUP[:, None] + (i & 1)


def accumulate(c: np.ndarray, a: np.ndarray, b: np.ndarray, model: FusedDotModel = EXACT) -> np.ndarray:
    """D = C + A @ B for one k16 step: c [..., M, N] f32, a [..., M, 16] f16, b [..., 16, N] f16,
    with the accumulation of `model` (EXACT: float64 sum rounded once to nearest even)."""
    return model.matmul_add(c, a, b)


@lru_cache(maxsize=None)
def _tile_maps(mi: int, nj: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Flat gather tables between lane fragments and the matrices of an MI x NJ block of atoms.

    a_src [16*MI, 16]: index into the flattened [32, MI, 8] f16 A fragments;
    b_src [16, 8*NJ]: index into the flattened [32, NJ, 4] f16 B fragments;
    c_pos [32, NJ, MI, 4]: flat position in the [16*MI, 8*NJ] matrix of each C element;
    c_src [16*MI, 8*NJ]: its inverse, the flat lane-fragment index of each matrix element.
    """
    ar, ac = a_coords()  # [32, 8]
    a_src = np.empty((MMA_M * mi, MMA_K), dtype=np.int64)
    lane_i = np.arange(WARP_SIZE)[:, None] * (mi * 8) + np.arange(8)[None, :]
    for m in range(mi):
        a_src[MMA_M * m + ar, ac] = lane_i + 8 * m
    bk, bn = b_coords()  # [32, 4]
    b_src = np.empty((MMA_K, MMA_N * nj), dtype=np.int64)
    lane_i = np.arange(WARP_SIZE)[:, None] * (nj * 4) + np.arange(4)[None, :]
    for n in range(nj):
        b_src[bk, MMA_N * n + bn] = lane_i + 4 * n
    cr, cc = c_coords()  # [32, 4]
    m_idx = np.arange(mi)[None, None, :, None]
    n_idx = np.arange(nj)[None, :, None, None]
    c_pos = (MMA_M * m_idx + cr[:, None, None, :]) * (MMA_N * nj) + MMA_N * n_idx + cc[:, None, None, :]
    c_src = np.empty(c_pos.size, dtype=np.int64)
    c_src[c_pos.reshape(-1)] = np.arange(c_pos.size)
    return a_src, b_src, c_pos, c_src.reshape(MMA_M * mi, MMA_N * nj)


def _check(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[int, int]:
    """The operand shapes of one k16 step -> (MI, NJ)."""
    check_lane_axis(a, -3, "mma A")
    check_lane_axis(b, -3, "mma B")
    check_lane_axis(c, -4, "mma C")
    mi, nj = a.shape[-2], b.shape[-2]
    if c.shape[-3:] != (nj, mi, C_REGS) or a.shape[-1] != A_REGS or b.shape[-1] != B_REGS:
        raise ValueError(f"mma operand shapes disagree: a {a.shape}, b {b.shape}, c {c.shape}")
    return mi, nj


def halves_of(words: np.ndarray, operand: str = "f16") -> np.ndarray:
    """Registers of two packed 16-bit operands (uint32 [..., n]) -> their values [..., 2n]: float16
    for "f16", float32 (exact) for "bf16"."""
    h = np.ascontiguousarray(words).view(np.uint16)
    if operand == "f16":
        return h.view(np.float16)
    if operand != "bf16":
        raise ValueError(f"mma operand type {operand!r} is not one of f16, bf16")
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


def a_matrix(a: np.ndarray, operand: str = "f16") -> np.ndarray:
    """A fragments [..., 32, MI, 4] uint32 -> A [..., 16MI, 16] f16 (bf16: float32 values)."""
    a16 = halves_of(a, operand).reshape(*a.shape[:-3], -1)  # [..., 32*MI*8]
    return np.take(a16, _tile_maps(a.shape[-2], 1)[0], axis=-1)


def b_matrix(b: np.ndarray, operand: str = "f16") -> np.ndarray:
    """B fragments [..., 32, NJ, 2] uint32 -> B [..., 16, 8NJ] f16 (bf16: float32). When every index of the axis
    before the lanes (the warps of a CTA) holds the same fragments - the warps of a warp-level
    GEMM that all multiply by one tile - that axis is kept at length 1 (it broadcasts)."""
    if b.ndim > 3 and b.shape[-4] > 1 and np.array_equal(b, np.broadcast_to(b[..., :1, :, :, :], b.shape)):
        b = b[..., :1, :, :, :]
    b16 = halves_of(b, operand).reshape(*b.shape[:-3], -1)  # [..., 32*NJ*4]
    return np.take(b16, _tile_maps(1, b.shape[-2])[1], axis=-1)


def a_fragments(mat: np.ndarray) -> np.ndarray:
    """The inverse of `a_matrix`: A [..., 16MI, 16] f16 (or uint16 patterns: bf16) -> fragments
    [..., 32, MI, 4] uint32."""
    mi = mat.shape[-2] // MMA_M
    a_src = _tile_maps(mi, 1)[0]
    pos = np.empty(a_src.size, np.intp)
    pos[a_src.reshape(-1)] = np.arange(a_src.size)  # matrix element of each fragment half
    src = mat if mat.dtype == np.uint16 else np.asarray(mat, np.float16)
    halves = np.take(np.ascontiguousarray(src).reshape(*mat.shape[:-2], -1), pos, axis=-1)
    return halves.view(np.uint32).reshape(*mat.shape[:-2], WARP_SIZE, mi, A_REGS)


def a_matrix_map(halves: np.ndarray) -> np.ndarray:
    """`a_matrix` applied to a map instead of registers: halves [..., 32, MI, 8] (what each half of
    each A fragment is, e.g. its shared-memory half offset) -> [..., 16MI, 16]."""
    return np.take(halves.reshape(*halves.shape[:-3], -1), _tile_maps(halves.shape[-2], 1)[0], axis=-1)


def b_matrix_map(halves: np.ndarray) -> np.ndarray:
    """`b_matrix` (without the sharing) applied to a map: halves [..., 32, NJ, 4] -> [..., 16, 8NJ]."""
    return np.take(halves.reshape(*halves.shape[:-3], -1), _tile_maps(1, halves.shape[-2])[1], axis=-1)


def fragments_to_matrices(a: np.ndarray, b: np.ndarray, c: np.ndarray, operand: str = "f16"):
    """Lane fragments -> (C [..., 16MI, 8NJ] f32, A [..., 16MI, 16] f16, B [..., 16, 8NJ] f16;
    bf16 operands as float32 values).

    a: [..., 32, MI, 4] uint32, b: [..., 32, NJ, 2] uint32, c: [..., 32, NJ, MI, 4] float32.
    """
    mi, nj = a.shape[-2], b.shape[-2]
    a_src, b_src, _, c_src = _tile_maps(mi, nj)
    lead = a.shape[:-3]
    a16 = halves_of(a, operand).reshape(*lead, -1)  # [..., 32*MI*8]
    b16 = halves_of(b, operand).reshape(*lead, -1)  # [..., 32*NJ*4]
    c32 = c.reshape(*lead, -1)  # [..., 32*NJ*MI*4] f32
    return np.take(c32, c_src, axis=-1), np.take(a16, a_src, axis=-1), np.take(b16, b_src, axis=-1)


def mma_tiles(a: np.ndarray, b: np.ndarray, c: np.ndarray, model: FusedDotModel = EXACT) -> np.ndarray:
    """The MI x NJ independent m16n8k16 MMAs of one k16 step: D(mi, nj) = A(mi) B(nj) + C(mi, nj).

    a: [..., 32, MI, 4] uint32 (f16x2; bf16x2 with a model of operand "bf16"), b: [..., 32, NJ, 2]
    uint32 (likewise), c: [..., 32, NJ, MI, 4] float32 -> d: [..., 32, NJ, MI, 4] float32.
    """
    return mma_chain((a,), (b,), c, model)


def mma_chain(a_steps, b_steps, c: np.ndarray, model: FusedDotModel = EXACT) -> np.ndarray:
    """The k16 steps of a warp-level GEMM, one after another: d = mma_tiles(a[n-1], b[n-1], ...
    mma_tiles(a[0], b[0], c)) bit for bit. Shapes as `mma_tiles`; every step has the same MI, NJ."""
    shapes = {_check(a, b, c) for a, b in zip(a_steps, b_steps, strict=True)}
    if len(shapes) > 1:
        raise ValueError(f"mma_chain: the steps' MI x NJ differ: {sorted(shapes)}")
    return gemm_chain([a_matrix(a, model.operand) for a in a_steps], [b_matrix(b, model.operand) for b in b_steps],
                      c, model)


CHUNK_ELEMENTS = 1 << 15  # accumulator elements per pass of the chain: its float64 temporaries stay in
# cache (measured: 8 CTAs of the seed config per pass, 1.9x faster than one pass over 64)


def gemm_chain(a_mats, b_mats, c: np.ndarray, model: FusedDotModel = EXACT, *, c_is_zero: bool = False,
               out: np.ndarray | None = None) -> np.ndarray:
    """`mma_chain` on operand matrices: a_mats [..., 16MI, 16] f16 (or their f16 values as f32;
    with the EXACT model also a view in blocked axes, `_batch_a`), b_mats [..., 16, 8NJ] f16 (lead
    axes broadcast), c [..., 32, NJ, MI, 4] f32 fragments -> d like c. Each step rounds its
    results to fp32 elementwise, so the accumulator stays in matrix form between steps (two
    gathers per GEMM, not per step); the leading axis is cut into chunks of about CHUNK_ELEMENTS.
    `c_is_zero`: the caller vouches that c is +0 everywhere, so it is not gathered. `out`: a
    C-contiguous float32 array like c (c itself allowed) that receives d, which is returned. EXACT
    runs `exact_chain`; the other models (every product separately) `model.matmul_chain`."""
    if out is not None and (out.shape != c.shape or out.dtype != np.float32 or not out.flags.c_contiguous):
        raise ValueError(f"gemm_chain: out must be C-contiguous float32 of shape {c.shape}")
    if model.float64_sum:
        return exact_chain(a_mats, b_mats, c, c_is_zero=c_is_zero, out=out)
    if out is not None:
        out[...] = gemm_chain(a_mats, b_mats, c, model, c_is_zero=c_is_zero)
        return out
    nj, mi = c.shape[-3], c.shape[-2]
    per = int(np.prod(c.shape[1:-4], dtype=np.int64)) * 32 * nj * mi * C_REGS
    n = c.shape[0] if c.ndim < 5 else max(1, CHUNK_ELEMENTS // max(per, 1))
    if c.ndim < 5 or n >= c.shape[0]:
        return _gemm_chain(a_mats, b_mats, c, model, c_is_zero=c_is_zero)
    out = np.empty(c.shape, np.float32)
    for i in range(0, c.shape[0], n):
        rows = slice(i, i + n)
        def part(x):
            return x[rows] if x.ndim == c.ndim - 2 and x.shape[0] == c.shape[0] else x
        _gemm_chain([part(a) for a in a_mats], [part(b) for b in b_mats], c[rows], model, out[rows], c_is_zero)
    return out


def exact_chain(a_mats, b_mats, c: np.ndarray, *, c_is_zero: bool = False, out: np.ndarray | None = None,
                lanes_last: bool = False) -> np.ndarray:
    """`gemm_chain` with the EXACT model: per chunk of the leading axis, the operands of every step
    are converted to float64 into one buffer each and multiplied by one batched matmul (the
    products of all k16 steps at once), then the steps are summed in order, each sum rounded to
    fp32 (P[s] += acc; acc = fp32(P[s]): the float64 sum of the exact products and C, rounded once,
    as tensorcore.EXACT.matmul_chain). When B is the same for every index of the axis before the
    lanes (the warps of a CTA multiply by one tile), that axis joins A's rows; when consecutive
    CTAs also share B (a wave of one head reads one K or V tile), `group` of them share one matmul.
    `out` (gemm_chain's): written chunk by chunk after that chunk's C is read, so it may be c.
    `lanes_last`: c and d are [..., NJ, MI, 4, 32] - each register's 32 lanes side by side, the
    axes of a register file whose rows are registers (the PTX engine's), from and to which they
    then move in runs of 32 words, not word by word; gathered a word at a time, not in pairs."""
    nj, mi = (c.shape[-4], c.shape[-3]) if lanes_last else (c.shape[-3], c.shape[-2])
    c_pos, c_src = _lane_maps(mi, nj) if lanes_last else _pair_maps(mi, nj)
    word = np.uint32 if lanes_last else np.uint64
    lead, steps = c.shape[:-4], len(a_mats)
    rows, cols = MMA_M * mi, MMA_N * nj
    join = len(lead) >= 1 and all(b.ndim < 3 or b.shape[-3] == 1 for b in b_mats)
    batch = lead[:-1] if join else lead  # matmul batch axes, flattened; cut into chunks
    m_rows = rows * (lead[-1] if join else 1)
    flat = int(np.prod(batch, dtype=np.int64))
    a3 = [_batch_a(a, lead, len(batch), flat) for a in a_mats]
    b3 = [_batch_b(b, lead, join).reshape(-1, MMA_K, cols) for b in b_mats]
    c3 = None if c_is_zero else _words(c, word).reshape(flat, -1, c_src.size)  # [batch, W or 1, fragment pairs]
    out = np.empty(c.shape, np.float32) if out is None else out
    o3 = _words(out, word).reshape(flat, -1, *c_pos.shape)
    n = min(flat, max(1, CHUNK_ELEMENTS // (m_rows * cols)))
    group = _group(b3, flat, n, max(1, BLAS_SERIAL_MNK // (m_rows * cols * MMA_K)))
    # B row-major whatever its source's order: OpenBLAS's dgemm is about 1.5x faster with K = 16 and
    # B not transposed; A column by column when its source's columns are not contiguous (P~ by
    # column: a copy several times faster, a matmul as fast). The same sums in the same order
    # either way, bit for bit (tests/test_isa_mma.py).
    by_column = a3[0].strides[-1] != a3[0].itemsize
    b_once = all(b.strides[0] == 0 for b in b3)  # one B for the whole batch: converted by the first chunk
    a_buf = (steps, n // group, MMA_K, group * m_rows) if by_column else (steps, n, m_rows, MMA_K)
    bufs = (np.empty(a_buf), np.empty((steps, n // group, MMA_K, cols)),
            np.empty((steps, n, m_rows, cols)), np.empty((n, m_rows, cols), np.float32))
    with np.errstate(invalid="ignore", over="ignore"):  # inf and NaN operands give inf and NaN, silently
        for i in range(0, flat, n):
            k = min(n, flat - i)
            _exact_part(a3, b3, c3, (c_pos, c_src), (i, k, group, by_column, b_once and i > 0), bufs, o3)
    return out


BLAS_SERIAL_MNK = 1 << 18  # OpenBLAS runs a gemm with M*N*K up to this on one thread; more threads on
# a few shared cores cost far more than they give (measured: 8x the CPU time)


def _group(b3, flat: int, n: int, most: int) -> int:
    """How many consecutive matrices of the batch share each matmul: the largest power of two up to
    `most` that divides the chunk size n and the batch, where every group's B are equal; else 1."""
    group = 1
    while 2 * group <= most and n % (2 * group) == 0 and flat % (2 * group) == 0:
        group *= 2
    while group > 1 and not all(_same_in_groups(b, group) for b in b3):
        group //= 2
    return group


def _same_in_groups(b: np.ndarray, group: int) -> bool:
    """Whether every matrix of b [batch, 16, N] equals the first of its group of `group` (bit for bit)."""
    if b.strides[0] == 0:
        return True
    dense = b if b.strides[-1] <= b.strides[-2] else np.swapaxes(b, -1, -2)
    if dense.flags.c_contiguous and dense[0].nbytes % 8 == 0:  # compare 8-byte words
        words = dense.reshape(b.shape[0] // group, group, -1).view(np.uint64)
    else:
        words = np.ascontiguousarray(dense).reshape(b.shape[0] // group, group, -1).view(np.uint8)
    return bool((words == words[:, :1]).all())


@lru_cache(maxsize=None)
def _pair_maps(mi: int, nj: int) -> tuple[np.ndarray, np.ndarray]:
    """`_tile_maps`' c_pos and c_src on pairs of f32: C elements 2j, 2j + 1 of a lane are columns
    2j', 2j' + 1 of one matrix row, so each pair moves as one 8-byte word (half the gathers)."""
    _, _, c_pos, c_src = _tile_maps(mi, nj)
    return c_pos[..., 0::2] // 2, c_src[:, 0::2] // 2


@lru_cache(maxsize=None)
def _lane_maps(mi: int, nj: int) -> tuple[np.ndarray, np.ndarray]:
    """`_tile_maps`' c_pos and c_src for fragments with the lanes last ([NJ, MI, 4, 32]): c_pos
    [NJ * MI * 4, 32], c_src indices into the flattened [NJ * MI * 4, 32] fragments."""
    _, _, c_pos, c_src = _tile_maps(mi, nj)
    regs = nj * mi * C_REGS
    return np.ascontiguousarray(c_pos.reshape(WARP_SIZE, regs).T), c_src % regs * WARP_SIZE + c_src // regs


def _words(x: np.ndarray, word: type) -> np.ndarray:
    """f32 [..., even] -> the same bytes as words of `word` (np.uint64: pairs, half as many)."""
    return np.ascontiguousarray(x).view(word)


def _batch_a(a: np.ndarray, lead: tuple, n_batch: int, flat: int) -> np.ndarray:
    """A broadcast to the chain's lead axes, its batch axes flattened: [flat, ...] whose other axes
    flatten in C order to the matmul's m_rows x 16. A is [..., 16MI, 16], or a view with every
    lead axis whose row axes and column axes each flatten in C order to 16MI and 16 (values in a
    front end's own layout, copied straight into the chain's buffer)."""
    tail = a.shape[len(lead):] if a.ndim > len(lead) + 2 else a.shape[-2:]
    return np.broadcast_to(a, (*lead, *tail)).reshape(flat, *lead[n_batch:], *tail)


def _batch_b(b: np.ndarray, lead: tuple, join: bool) -> np.ndarray:
    """B broadcast to the matmul batch: lead without its last axis when that axis joins A's rows."""
    if join:
        b = b.reshape(*b.shape[:-3], *b.shape[-2:]) if b.ndim >= 3 else b
        return np.broadcast_to(b, (*lead[:-1], *b.shape[-2:]))
    return np.broadcast_to(b, (*lead, *b.shape[-2:]))


def _exact_part(a3, b3, c3, maps, part, bufs, o3) -> None:
    """One chunk of `exact_chain`: batch indices part = (first, count, group, A by column, B already
    in its buffer) into the buffers."""
    (c_pos, c_src), (i, k, group, by_column, b_ready) = maps, part
    b64, prods, acc = bufs[1][:, :k // group], bufs[2][:, :k], bufs[3][:k]
    steps, m_rows, cols = prods.shape[0], prods.shape[2] * group, prods.shape[3]
    if by_column:
        a64 = bufs[0][:, :k // group]  # [steps, k / group, 16, m_rows]
        for s, a in enumerate(a3):
            _fill_by_column(a64[s], a[i:i + k], group)  # exact: f16 values
        a64 = np.swapaxes(a64, -1, -2)
    else:
        a64 = bufs[0][:, :k]  # [steps, k, rows, 16]
        for s, a in enumerate(a3):
            np.copyto(a64[s].reshape(k, *a.shape[1:]), a[i:i + k])  # exact: f16 values
        a64 = a64.reshape(steps, -1, m_rows, MMA_K)
    for s, b in enumerate(() if b_ready else b3):
        np.copyto(b64[s], b[i:i + k:group])
    np.matmul(a64, b64, out=prods.reshape(steps, -1, m_rows, cols))
    if c3 is None:
        prods[0] += 0.0  # the +0 accumulator: a -0 sum becomes +0 as with any C
        np.copyto(acc, prods[0], casting="same_kind")  # the first step's fp32 result
    else:  # C gathered into acc (no temporary, no bounds checks), added to P[0] in float64
        np.take(c3[i:i + k], c_src, axis=-1, out=acc.view(c3.dtype).reshape(k, c3.shape[1], *c_src.shape),
                mode="wrap")
        prods[0] += acc
        np.copyto(acc, prods[0], casting="same_kind")
    for s in range(1, len(a3)):
        prods[s] += acc
        np.copyto(acc, prods[s], casting="same_kind")  # the step's fp32 result
    np.take(acc.view(o3.dtype).reshape(k, o3.shape[1], -1), c_pos, axis=-1, out=o3[i:i + k], mode="wrap")


def _fill_by_column(dst: np.ndarray, src: np.ndarray, group: int) -> None:
    """dst [k / group, 16, group * rows] <- src [k, *row axes, *column axes] (`_batch_a`'s view): the
    A matrix of each group of consecutive batch indices stored column by column."""
    k = src.shape[0]
    shape, order = _by_column_layout(src.shape[1:], k // group, group)
    np.copyto(dst.reshape(shape).transpose(order), src.reshape(k // group, group, *src.shape[1:]))


@lru_cache(maxsize=64)
def _by_column_layout(tail: tuple, n_groups: int, group: int) -> tuple[tuple, tuple]:
    """`_fill_by_column`'s view of dst, [k / group, *column axes, group, *row axes], and the axis
    order that makes it [k / group, group, *row axes, *column axes] like src."""
    n_cols, size = 0, 1
    while size < MMA_K:
        n_cols += 1
        size *= tail[-n_cols]
    rows, cols = tail[:len(tail) - n_cols], tail[len(tail) - n_cols:]
    shape = (n_groups, *cols, group, *rows)
    return shape, (0, 1 + n_cols, *range(2 + n_cols, len(shape)), *range(1, 1 + n_cols))


def _gemm_chain(a_mats, b_mats, c: np.ndarray, model: FusedDotModel, out: np.ndarray | None = None,
                c_is_zero: bool = False) -> np.ndarray:
    nj, mi = c.shape[-3], c.shape[-2]
    _, _, c_pos, c_src = _tile_maps(mi, nj)
    if c_is_zero:  # the same +0s the gather would give
        acc = np.zeros((*c.shape[:-4], *c_src.shape), np.float32)
    else:
        acc = np.take(c.reshape(*c.shape[:-4], -1), c_src, axis=-1)  # [..., 16MI, 8NJ] f32
    acc = model.matmul_chain(acc, zip(a_mats, b_mats))
    lead = acc.shape[:-2]
    if out is None or out.shape[:-4] != lead:
        d = np.take(acc.reshape(*lead, -1), c_pos, axis=-1)
        if out is None:
            return d
        out[...] = d
        return out
    np.take(acc.reshape(*lead, -1), c_pos, axis=-1, out=out.reshape(*lead, *c_pos.shape), mode="wrap")
    return out


def mma_m16n8k16(a: np.ndarray, b: np.ndarray, c: np.ndarray, model: FusedDotModel = EXACT) -> np.ndarray:
    """One warp instruction: a [..., 32, 4] u32, b [..., 32, 2] u32, c [..., 32, 4] f32 -> d f32."""
    d = mma_tiles(a[..., None, :], b[..., None, :], c[..., None, None, :], model)
    return d[..., 0, 0, :]
