"""The spec's layout checks, for any config of the family (what `fa layout` runs).

The spec closes with a layout-check program: load coordinates, the shared-memory swizzle
addresses, MMA A/B/C coverage, the QK registers reused as PV's A operand, causal-mask coordinates,
the four-lane reductions and the online-softmax state across rounds, checked on the host. Here
each check is a computation over the maps the simulator executes - kernels/plan.py's lane
addresses and accumulator coordinates, and the kernel's own gemm, mask and reduction code run on
a one-CTA probe machine with crafted shared memory and registers - held against a second
derivation: CuTe's algebra (fa_sim/layout.py), the spec's closed formulas
(fa_sim/spec_maps.py, built on the PTX ISA's fragment formulas), or the definition (a partition,
a product, the mask formula).

Every check can fail: each comparison is elementwise over the whole tile, and a failure names the
first element that disagrees (tests/test_layout_checks.py breaks maps on purpose).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import layout as L
from .config import CHUNK_HALVES, KernelConfig, SmemLayout
from .hub import Hub
from .isa.sm80 import WARP_SIZE
from .kernels import Problem, fa2_fwd, plan as kplan, softmax
from .kernels.labels import Tile, tile_base
from .kernels.plan import kernel_plan
from .kernels.sites import Step
from .machine import Machine
from .memory import GlobalMemory
from . import spec_maps
from .reference import SPEC_EXAMPLE, attention_exact

AX3 = ("warp", "lane", "instr")  # [W, L, R] lane arrays of the plan
AX5 = ("warp", "lane", "nj", "mi", "v")  # accumulator registers [W, L, NJ, MI, 4]
AXF = ("warp", "lane", "instr", "reg", "half")  # ldmatrix halves [W, L, R, 4, 2]
SHOWN = 3  # failures listed per check


@dataclass(frozen=True)
class CheckResult:
    name: str
    spec: str  # where the spec states it
    what: str  # what was verified, one line
    elements: int
    unit: str
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict:
        return {"name": self.name, "spec": self.spec, "what": self.what, "elements": self.elements,
                "unit": self.unit, "ok": self.ok, "failures": list(self.failures)}


class _Tally:
    """One check's elements and first failures."""

    def __init__(self) -> None:
        self.elements, self.failures = 0, []

    def require(self, ok, message: str) -> None:
        if not bool(np.all(ok)) and len(self.failures) < SHOWN:
            self.failures.append(message)

    def equal(self, what: str, got: tuple, want: tuple, axes: tuple[str, ...]) -> None:
        """Elementwise got == want over broadcast coordinate arrays; names the first difference."""
        arrays = np.broadcast_arrays(*got, *want)
        g, w = np.stack(arrays[: len(got)], -1), np.stack(arrays[len(got):], -1)
        bad = (g != w).any(-1)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            at = ", ".join(f"{a} {i}" for a, i in zip(axes[-bad.ndim:], idx))
            self.require(False, f"{what}: {int(bad.sum())} of {bad.size} differ; first at {at}: "
                                f"{tuple(g[idx].tolist())} instead of {tuple(w[idx].tolist())}")

    def result(self, name: str, spec: str, what: str, unit: str) -> CheckResult:
        return CheckResult(name, spec, what, self.elements, unit, tuple(self.failures))


def _probe(cfg: KernelConfig) -> Machine:
    """The simulator's machine with one CTA and no observers: the kernel's own gemm, mask and
    reduction code runs on it over crafted shared memory."""
    return Machine(cfg.n_warps, cfg.smem_bytes, GlobalMemory(), np.zeros(1, np.int64), Hub())


def _put(m: Machine, cfg: KernelConfig, tile: Tile, values: np.ndarray) -> None:
    """Store a [rows, d] fp16 tile where the CuTe layout says its elements live."""
    r, c = np.indices(values.shape)
    off = tile_base(cfg, tile) // 2 + L.smem_layout(cfg, values.shape[0])(r, c)
    m.smem.view(np.uint16)[0, off] = values.astype(np.float16).view(np.uint16)


def _threads(cfg: KernelConfig, extra: int) -> np.ndarray:
    """Thread ids 32 w + l shaped [W, L, 1 x extra]."""
    t = WARP_SIZE * np.arange(cfg.n_warps)[:, None] + np.arange(WARP_SIZE)[None, :]
    return t.reshape(t.shape + (1,) * extra)


def _tiles(cfg: KernelConfig):
    plan = kernel_plan(cfg)
    return (("sQ", Tile.SQ, cfg.block_m, plan.copy_q), ("sK", Tile.SK, cfg.block_n, plan.copy_kv[0]),
            ("sV", Tile.SV, cfg.block_n, plan.copy_kv[1]))


def _ints(shape, seed: int, lo: int = -3, hi: int = 4) -> np.ndarray:
    """Small integers: every product and sum of the checks is exact in fp16 inputs and fp32 sums."""
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(np.float16)


# -- the checks ---------------------------------------------------------------------------------------
def check_copy(cfg: KernelConfig) -> CheckResult:
    tally, cpr = _Tally(), cfg.head_dim // CHUNK_HALVES  # chunks per row
    for name, _, rows, wp in _tiles(cfg):
        row, col = wp.row, wp.col  # [W, L, R] int64
        t, i = _threads(cfg, 1), np.arange(row.shape[-1])
        tally.equal(f"{name}: plan vs CuTe copy_tv", (row, col), L.copy_tv(cfg, rows)(t, (0, i)), AX3)
        tally.equal(f"{name}: plan vs closed form", (row, col), spec_maps.copy_coords(cfg, t, i), AX3)
        inside = (row >= 0) & (row < rows) & (col >= 0) & (col < cfg.head_dim) & (col % CHUNK_HALVES == 0)
        tally.require(inside, f"{name}: chunks outside the {rows}x{cfg.head_dim} tile or not 16-byte aligned")
        counts = np.bincount((row * cpr + col // CHUNK_HALVES)[inside], minlength=rows * cpr)
        tally.require(counts == 1, f"{name}: {int(np.sum(counts == 0))} chunks never copied, "
                                   f"{int(np.sum(counts > 1))} copied more than once")
        tally.elements += rows * cfg.head_dim
    return tally.result("copy", "TiledCopy", "cp.async writes each 16-byte chunk of sQ, sK, sV once, where "
                        "TiledCopy says", "halves")


def check_smem_addresses(cfg: KernelConfig) -> CheckResult:
    tally, d = _Tally(), cfg.head_dim
    for name, tile, rows, wp in _tiles(cfg):
        layout = L.smem_layout(cfg, rows)
        r, c = np.indices((rows, d))
        off = layout(r, c)
        tally.equal(f"{name}: KernelConfig.smem_offset vs CuTe {layout}", (cfg.smem_offset(r, c),), (off,), ("row", "col"))
        want = tile_base(cfg, tile) + 2 * layout(wp.row, wp.col)
        tally.equal(f"{name}: plan's cp.async byte addresses vs CuTe", (wp.smem.addr,), (want,), AX3)
        tally.require(np.unique(off).size == off.size, f"{name}: two elements share a shared-memory half")
        tally.require((off >= 0) & (off < cfg.tile_halves(rows)), f"{name}: offsets outside the tile's allocation")
        chunk = off.reshape(rows, d // CHUNK_HALVES, CHUNK_HALVES)
        tally.require((chunk[..., 0] % CHUNK_HALVES == 0) & (np.diff(chunk, axis=-1) == 1).all(-1),
                      f"{name}: a 16-byte chunk is not contiguous and aligned (cp.async, ldmatrix need it)")
        group = 1 if cfg.swizzle_atom_cols == cfg.row_pitch else 8  # rows of a block (8: head_dim 96, 160, 192's atoms)
        tally.require(chunk[..., 0] // (group * cfg.row_pitch) == r[:, ::CHUNK_HALVES] // group,
                      f"{name}: a chunk leaves its row (its 8-row group of swizzle atoms)")
        if cfg.smem is SmemLayout.SWIZZLED:  # the point of the swizzle: 8 ldmatrix rows, 8 bank groups
            group = (2 * (tile_base(cfg, tile) // 2 + chunk[..., 0]) // 16) % 8  # [rows, chunks]
            spread = np.sort(group.reshape(rows // 8, 8, -1), axis=1)
            tally.require(spread == np.arange(8)[:, None], f"{name}: 8 consecutive rows of one chunk column share "
                                                           f"a 4-bank group, so ldmatrix would conflict")
            if d == 64:  # spec table 11, verbatim
                tally.equal(f"{name}: CuTe vs the spec's 64 r + (c XOR 8 (r mod 8))", (off,),
                            (64 * r + (c ^ (8 * (r % 8))),), ("row", "col"))
        tally.elements += rows * d
    return tally.result("smem", "table 11", "smem offsets = CuTe's layout, one-to-one, chunks whole" + (
        "; 8 ldmatrix rows, 8 bank groups" if cfg.smem is SmemLayout.SWIZZLED else ""), "halves")


def _inverse(cfg: KernelConfig, tile: Tile, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """[smem halves] tile row and col stored at each half (-1 elsewhere), by the CuTe layout."""
    inv_r, inv_c = np.full(cfg.smem_bytes // 2, -1), np.full(cfg.smem_bytes // 2, -1)
    r, c = np.indices((rows, cfg.head_dim))
    off = tile_base(cfg, tile) // 2 + L.smem_layout(cfg, rows)(r, c)
    inv_r[off], inv_c[off] = r, c
    return inv_r, inv_c


def check_ldmatrix(cfg: KernelConfig) -> CheckResult:
    tally, plan = _Tally(), kernel_plan(cfg)
    qk, pv = L.TiledMma(cfg, L.Gemm.QK), L.TiledMma(cfg, L.Gemm.PV)
    t = _threads(cfg, 3)  # [W, L, 1, 1, 1]
    m, j = np.arange(4)[:, None], np.arange(2)[None, :]  # register (matrix) m, half j
    inv = {tile: _inverse(cfg, tile, rows) for _, tile, rows, _ in _tiles(cfg)}
    for h, lanes in enumerate(plan.ldsm_q):
        ld = lanes.smem.ldsm_index(4, False)
        got = tuple(x[ld.halves] for x in inv[Tile.SQ])  # (query row, d)
        mi, i = np.arange(cfg.m_repeats)[:, None, None], 2 * m + j
        tally.equal(f"tCrQ(h={h}) vs CuTe A fragment", got, qk.tv(L.Operand.A)(t, (i, mi, h)), AXF)
        tally.equal(f"tCrQ(h={h}) vs closed form", got, spec_maps.a_fragment(cfg, t, mi, h, i), AXF)
        tally.elements += ld.halves.size
    for name, tile, plans, mma in (("tCrK", Tile.SK, plan.ldsm_k, qk), ("tCrV", Tile.SV, plan.ldsm_v, pv)):
        for h, lanes in enumerate(plans):
            ld = lanes.smem.ldsm_index(4, tile is Tile.SV)
            key, dim = (x[ld.halves] for x in inv[tile])
            p = np.arange(ld.halves.shape[2])[:, None, None]
            nj, i = 2 * p + m // 2, 2 * (m % 2) + j  # x4 register m = b-register m % 2 of n8 atom 2p + m // 2
            n, k = mma.tv(L.Operand.B)(t, (i, nj, h))  # QK: (key, d); PV: (d, key)
            want = (n, k) if tile is Tile.SK else (k, n)
            closed = (spec_maps.qk_b_fragment if tile is Tile.SK else spec_maps.pv_b_fragment)(t, nj, h, i)
            tally.equal(f"{name}(h={h}) vs CuTe B fragment", (key, dim), want, AXF)
            tally.equal(f"{name}(h={h}) vs closed form", (key, dim), closed, AXF)
            tally.elements += ld.halves.size
    return tally.result("ldmatrix", "tables 10, 12", "ldmatrix.x4 hands each lane its A/B fragment of Q, K, V",
                        "halves")


def _acc(cfg: KernelConfig, n_tiles: int):
    """(threads [W,L,1,1,1], CuTe element index e = v + 4 (mi + MI nj) [NJ, MI, 4])."""
    nj, mi, v = np.indices((n_tiles, cfg.m_repeats, 4))
    return _threads(cfg, 3), v + 4 * (mi + cfg.m_repeats * nj)


def check_mma(cfg: KernelConfig) -> CheckResult:
    tally, plan = _Tally(), kernel_plan(cfg)
    for gemm in L.Gemm:
        mma = L.TiledMma(cfg, gemm)
        for op in L.Operand:
            tv = mma.tv(op)
            r, c = tv(np.arange(cfg.n_threads)[:, None], np.arange(L.size(mma.fragment(op)))[None, :])
            copies = cfg.n_warps if op is L.Operand.B else 1  # every warp holds all of B
            counts = np.bincount((r * tv.tile[1] + c).ravel(), minlength=tv.tile[0] * tv.tile[1])
            tally.require(counts == copies, f"{gemm.value} {op.value}: not every element held {copies} time(s)")
            tally.elements += r.size
    for gemm, n_tiles, (row, col) in ((L.Gemm.QK, cfg.s_n_tiles, (plan.s_row, plan.s_col)),
                                      (L.Gemm.PV, cfg.o_n_tiles, kplan.acc_coords(cfg, cfg.o_n_tiles))):
        t, e = _acc(cfg, n_tiles)
        tally.equal(f"{gemm.value} accumulators: plan vs CuTe C", (row, col), L.TiledMma(cfg, gemm).tv(L.Operand.C)(t, e), AX5)
        tally.equal(f"{gemm.value} accumulators: plan vs closed form", (row, col), spec_maps.acc_coords(cfg, t, e), AX5)
    probe = _probe(cfg)
    q, k = _ints((cfg.block_m, cfg.head_dim), 1), _ints((cfg.block_n, cfg.head_dim), 2)
    _put(probe, cfg, Tile.SQ, q)
    _put(probe, cfg, Tile.SK, k)
    s = np.zeros((1, *plan.s_row.shape), np.float32)
    s = fa2_fwd.gemm_smem(probe, plan, s, None)[0]  # [W, L, NJ, MI, 4] f32
    want = (q.astype(np.float32) @ k.astype(np.float32).T)[plan.s_row, plan.s_col]
    tally.equal("S from the kernel's gemm_smem vs Q K^T at the plan's coordinates", (s,), (want,), AX5)
    return tally.result("mma", "tables 2, 3, 12", "A/B/C fragments cover their tiles; QK puts S(q, key) where "
                        "mask and softmax look", "slots")


def check_p_operand(cfg: KernelConfig) -> CheckResult:
    tally, plan = _Tally(), kernel_plan(cfg)
    qk, pv = L.TiledMma(cfg, L.Gemm.QK), L.TiledMma(cfg, L.Gemm.PV)
    a_view = L.acc_as_a_operand(qk.fragment(L.Operand.C))
    t, f = np.arange(cfg.n_threads)[:, None], np.arange(L.size(a_view))[None, :]
    tally.equal("CuTe: tCrS regrouped (table 9) vs PV's A fragment", qk.tv(L.Operand.C)(t, a_view(f)),
                pv.tv(L.Operand.A)(t, f), ("thread", "value"))
    probe = _probe(cfg)
    p, v = _ints((cfg.block_m, cfg.block_n), 3, 0, 4), _ints((cfg.block_n, cfg.head_dim), 4)
    _put(probe, cfg, Tile.SV, v)
    tCrP = p[plan.s_row, plan.s_col].view(np.uint32)[None]  # [1, W, L, NJ, MI, 2] f16x2, as the kernel packs P
    o_row, o_col = kplan.acc_coords(cfg, cfg.o_n_tiles)
    o = np.zeros((1, *o_row.shape), np.float32)
    o = fa2_fwd.gemm_A_in_regs(probe, plan, np.ascontiguousarray(tCrP), o, None)[0]
    want = (p.astype(np.float32) @ v.astype(np.float32))[o_row, o_col]
    tally.equal("O from the kernel's gemm_A_in_regs vs P V", (o,), (want,), AX5)
    tally.elements = cfg.block_m * cfg.block_n
    return tally.result("p-as-a", "table 9", "S registers reused as PV's A operand: the kernel's PV gives O = P V",
                        "values")


def _mask_shapes(cfg: KernelConfig) -> tuple[tuple[int, int], ...]:
    """(Nq, Nk) with tails in both, Nk > Nq and Nk < Nq."""
    nq = 2 * cfg.block_m + 5
    return (nq, 3 * cfg.block_n + 7), (nq, cfg.block_n + 3)


def check_masks(cfg: KernelConfig) -> CheckResult:
    tally, plan = _Tally(), kernel_plan(cfg)
    t, e = _acc(cfg, cfg.s_n_tiles)
    row, col = L.TiledMma(cfg).tv(L.Operand.C)(t, e)  # [W, L, NJ, MI, 4], independent of the plan
    for (nq, nk), causal in ((s, c) for s in _mask_shapes(cfg) for c in (False, True)):
        prob = Problem(1, 1, nq, nk, causal, 1.0, cfg)
        for mb in range(prob.n_m_blocks):
            n_run = int(prob.n_block_max(np.array([mb]))[0])
            q = mb * cfg.block_m + row
            for rnd in range(prob.n_rounds):
                key = rnd * cfg.block_n + col
                visible = (key < nk) & ((key <= q) if causal else True)
                where = f"Nq={nq} Nk={nk} {'causal' if causal else 'non-causal'} m_block {mb} round {rnd}"
                if rnd < n_run:
                    s = np.zeros((1, *row.shape), np.float32)
                    key0 = np.array([rnd * cfg.block_n])
                    s = fa2_fwd.mask_within_nblock(_probe(cfg), prob, plan, key0, np.array([mb]), s)[0]
                    tally.equal(f"{where}: kernel's -inf vs key >= Nk or key > query", (np.isneginf(s),),
                                (~visible,), AX5)
                else:
                    lost = visible & (q < nq)
                    tally.require(~lost, f"{where}: skipped, yet query {int(q[lost].flat[0]) if lost.any() else 0} "
                                         f"sees a key of it")
                tally.elements += visible.size
    return tally.result("masks", "table 4", "-inf exactly where key >= Nk or (causal) key > query; skipped "
                        "rounds hide no key", "slots")


def check_quad_reductions(cfg: KernelConfig) -> CheckResult:
    tally, plan = _Tally(), kernel_plan(cfg)
    w, lanes, mi, bn = cfg.n_warps, WARP_SIZE, cfg.m_repeats, cfg.block_n
    slot = np.arange(2)[None, None, None, :] + 2 * np.arange(mi)[None, None, :, None]  # [1, 1, MI, 2]
    tally.equal("rRowMax slot rows: plan vs closed form", (plan.slot_row,),
                (spec_maps.row_slot_rows(cfg, _threads(cfg, 2), slot),), ("warp", "lane", "mi", "half"))
    rows6 = plan.s_row.reshape(w, lanes, -1, mi, 2, 2)  # [W, L, NJ, MI, half, b]
    tally.equal("tCrS rows vs their slot's row", (rows6,), (plan.slot_row[:, :, None, :, :, None],),
                ("warp", "lane", "nj", "mi", "half", "b"))
    cols = plan.s_col.reshape(w, lanes, -1, mi, 2, 2).transpose(0, 1, 3, 4, 2, 5).reshape(w, lanes, mi, 2, -1)
    held = np.zeros((1, w, lanes, mi, 2, bn), bool)  # [1, W, L, MI, 2, block_n]: columns a slot holds
    np.put_along_axis(held[0], cols, True, axis=-1)
    quads = held[0].reshape(w, 8, 4, mi, 2, bn).sum(axis=2)
    tally.require(quads == 1, "the four lanes of a quad do not hold disjoint columns covering the row")
    for name, sites, regs in (("max", plan.sites.shfl_max, (Step.MAX_XOR2, Step.MAX_XOR1)),
                              ("sum", plan.sites.shfl_sum, (Step.SUM_XOR2, Step.SUM_XOR1))):
        regs = tuple(plan.sites.softmax[s] for s in regs)
        got = softmax.quad_allreduce(_probe(cfg), sites, regs, held, np.logical_or, "cols")[0]
        tally.require(got, f"{name}: after the XOR-2 and XOR-1 shuffles a lane misses columns of its row")
        for op in (np.maximum, np.minimum):
            row = softmax.quad_allreduce(_probe(cfg), sites, regs, plan.slot_row[None].astype(np.int32), op, "row")
            tally.equal(f"{name}: shuffle partners hold the same row", (row[0],), (plan.slot_row,),
                        ("warp", "lane", "mi", "half"))
    tally.elements = held.size
    return tally.result("quad", "tables 5-7", "a row's columns lie in one quad; XOR 2, XOR 1 shuffles give each "
                        "lane all of them", "pairs")


def check_o_staging(cfg: KernelConfig) -> CheckResult:
    tally, plan, d = _Tally(), kernel_plan(cfg), cfg.head_dim
    probe = _probe(cfg)
    row, col = kplan.acc_coords(cfg, cfg.o_n_tiles)  # [W, L, NJo, MI, 4]
    ident = (row * d + col).astype(np.uint32)  # the O element each f32 register becomes
    words = (ident[..., 0::2] | (ident[..., 1::2] << 16)).reshape(1, cfg.n_warps, WARP_SIZE, -1, 1)
    probe.st_shared(plan.sites.sts_o, plan.sts_o.smem, words, "rO")  # sO <- rO, as the epilogue stores it
    r, c = np.indices((cfg.block_m, d))
    stored = probe.smem.view(np.uint16)[0, tile_base(cfg, Tile.SO) // 2 + L.smem_layout(cfg, cfg.block_m)(r, c)]
    tally.equal("sO after the st.shared of rO vs its CuTe layout", (stored,), (r * d + c,), ("row", "col"))
    back = probe.ld_shared(plan.sites.lds_o, plan.lds_o.smem, "tOrO")[0].view(np.uint16)  # [W, L, R, 8]
    lr, lc = plan.lds_o.row[..., None], plan.lds_o.col[..., None] + np.arange(CHUNK_HALVES)
    tally.equal("tOrO after ld.shared vs the copy layout's (row, col)", (back,), (lr * d + lc,), AX3 + ("half",))
    tally.elements = cfg.block_m * d
    return tally.result("o-staging", "output via sO", "O: MMA layout -> sO -> copy layout, each element once",
                        "halves")


def check_online_softmax(cfg: KernelConfig) -> CheckResult:
    """The spec's worked example in exact fractions: state carried across rounds of any width
    gives the direct attention (config-independent; widths 1..4 keys per round)."""
    tally, ex = _Tally(), SPEC_EXAMPLE
    for causal in (False, True):
        o, lse = attention_exact(ex.q, ex.k, ex.v, scale=ex.scale, causal=causal)
        for bn in range(1, len(ex.k) + 1):
            w = ex.walkthrough(causal=causal, block_n=bn)
            tally.require(w.o == o and w.lse == lse, f"causal={causal}, {bn} key(s) per round: O or LSE differs "
                                                     f"from the direct computation")
            tally.elements += len(o) * len(o[0]) + len(lse)
    return tally.result("online-softmax", "figures 4-10", "m, l, O over rounds of 1-4 keys = direct O, LSE "
                        "(exact)", "values")


CHECKS = {"copy": check_copy, "smem": check_smem_addresses, "ldmatrix": check_ldmatrix, "mma": check_mma,
          "p-as-a": check_p_operand, "masks": check_masks, "quad": check_quad_reductions,
          "o-staging": check_o_staging, "online-softmax": check_online_softmax}


def _run(name: str, config: KernelConfig) -> CheckResult:
    """A check whose maps break the simulator's own preconditions (misaligned addresses, lanes
    outside a tile) has failed too: the error becomes its failure."""
    try:
        return CHECKS[name](config)
    except (ValueError, IndexError) as exc:
        return CheckResult(name, "", "could not run", 0, "", (f"raised {type(exc).__name__}: {exc}",))


def run_checks(config: KernelConfig) -> tuple[CheckResult, ...]:
    """Every check, in the order of the spec's walk-through."""
    return tuple(_run(name, config) for name in CHECKS)


def format_results(config: KernelConfig, results) -> str:
    lines = [f"fa layout: {config.tag} ({config.describe()})"]
    for r in results:
        lines.append(f"  {'ok' if r.ok else 'FAILED':<7}{r.name:<15}{r.elements:>8,} {r.unit:<7} {r.what} ({r.spec})")
        lines += [f"           {f}" for f in r.failures]
    bad = [r.name for r in results if not r.ok]
    lines.append(f"all {len(results)} checks passed" if not bad else f"{len(bad)} of {len(results)} checks FAILED: "
                 f"{', '.join(bad)}")
    return "\n".join(lines)


def results_json(config: KernelConfig, results) -> dict:
    return {"config": config.to_json(), "tag": config.tag, "ok": all(r.ok for r in results),
            "checks": [r.to_json() for r in results]}
