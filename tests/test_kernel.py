"""The FlashAttention-2 forward kernel program against the spec's golden numbers
(docs/walkthrough.md) and SCHEDULE.md, observed through the machine's events
and checkpoints. Each test names its table or figure."""

import math

import numpy as np
import pytest

import fa_sim
from fa_sim.config import KernelConfig
from fa_sim.checkpoints import Checkpoint
from fa_sim.events import Op, ROUND_EPILOGUE, ROUND_PROLOGUE, decode_f16x2
from fa_sim.kernels.labels import Phase, Site
from fa_sim.isa import mma
from fa_sim.kernels import Mutation
from fa_sim.kernels.plan import kernel_plan
from fa_sim.kernels.sites import Step
from fa_sim.kernels.softmax import rowcol

SEED = KernelConfig()


class Recorder:
    """Keeps every event and checkpoint (copied), optionally filtered by op."""

    def __init__(self, ops=None):
        self.ops, self.events, self.cks = ops, [], {}

    def wants(self, op, phase, round):
        return self.ops is None or op in self.ops

    def on_instr(self, ev):
        self.events.append(ev)

    def on_checkpoint(self, ev):
        self.cks[(ev.checkpoint, ev.round)] = (ev.cta.copy(), ev.values.copy())

    def of(self, op, round=None, label=None):
        return [e for e in self.events if e.op is op and (round is None or e.round == round)
                and (label is None or e.label.startswith(label))]

    def ck(self, checkpoint, round=0, cta=0):
        ctas, values = self.cks[(checkpoint, round)]
        return values[list(ctas).index(cta)]  # [T, words] uint32


def run(q, k, v, **kw):
    rec = Recorder(kw.pop("ops", None))
    res = fa_sim.simulate(q, k, v, observers=[rec], **kw)
    return res, rec


def bhnd(x):
    return np.asarray(x)[None, None]


def id_tensor(rows, d=64):
    """fp16 values whose bit pattern is 0x1000 + 64 r + c: finite, exact ids of (r, c)."""
    ids = 0x1000 + 64 * np.arange(rows)[:, None] + np.arange(d)[None, :]
    return ids.astype(np.uint16).view(np.float16)


def decode_ids(words):
    ids = np.asarray(words, np.uint32).view(np.uint16).astype(np.int64) - 0x1000
    return ids // 64, ids % 64


# -- counts (spec section 5: 8 x 4 = 32 MMAs per warp per QK round; table 3; SCHEDULE.md counts) -----
def test_mma_counts_per_warp_block_and_two_rounds():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 64, 64)).astype(np.float16)
    kv = rng.standard_normal((1, 1, 128, 64)).astype(np.float16)
    res, rec = run(q, kv, kv, ops={Op.HMMA})
    assert res.counts[(Op.HMMA, Phase.QK, 0)] == 128  # per block, one QK round
    assert res.counts[(Op.HMMA, Phase.PV, 0)] == 128
    assert res.instructions[Op.HMMA] == 512  # two non-causal rounds
    qk0 = rec.of(Op.HMMA, round=0)[:4]
    assert [e.phase for e in qk0] == [Phase.QK] * 4
    assert sum(e.repeat for e in qk0) == 32  # per warp: 8 n8 tiles x 4 d segments


def test_instruction_counts_per_warp_follow_schedule():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 1, 64, 64)).astype(np.float16)
    kv = rng.standard_normal((1, 1, 192, 64)).astype(np.float16)
    res, _ = run(q, kv, kv)
    per_warp = {}
    for (op, _, rnd), n in res.counts.items():
        per_warp[(op, rnd)] = per_warp.get((op, rnd), 0) + n // 4
    for t in range(3):
        last = t == 2
        assert per_warp[(Op.LDGSTS, t)] == 4 + (0 if last else 4)
        assert per_warp[(Op.LDGDEPBAR, t)] == (1 if last else 2)
        assert per_warp[(Op.DEPBAR, t)] == 2 and per_warp[(Op.BAR, t)] == 2
        assert per_warp[(Op.LDSM, t)] == 36 and per_warp[(Op.HMMA, t)] == 64 and per_warp[(Op.SHFL, t)] == 8
    assert per_warp[(Op.LDGSTS, ROUND_PROLOGUE)] == 8 and per_warp[(Op.LDGDEPBAR, ROUND_PROLOGUE)] == 1
    epi = {op: per_warp.get((op, ROUND_EPILOGUE), 0) for op in (Op.STS, Op.BAR, Op.LDS, Op.STG)}
    assert epi == {Op.STS: 16, Op.BAR: 1, Op.LDS: 4, Op.STG: 6}


# -- the copy, table 2, table 11 -------------------------------------------------------------------
def test_copy_coordinates_of_threads_0_7_8_32_and_their_swizzled_offsets():
    q = bhnd(np.random.default_rng(3).standard_normal((64, 64)).astype(np.float16))
    _, rec = run(q, q, q, ops={Op.LDGSTS})
    ev = rec.of(Op.LDGSTS, round=ROUND_PROLOGUE)[0]  # sQ <- gQ
    row, col, addr = ev.smem.row[:, 0], ev.smem.col[:, 0], ev.smem.addr[:, 0]  # [R, W, L]
    for t, rows, c in ((0, [0, 16, 32, 48], 0), (7, [0, 16, 32, 48], 56), (8, [1, 17, 33, 49], 0),
                       (32, [4, 20, 36, 52], 0)):
        assert row[:, t // 32, t % 32].tolist() == rows and (col[:, t // 32, t % 32] == c).all()
    assert addr[0, 0, 8] // 2 == 72  # spec: thread 8's Q row 1, cols 0-7 land at offsets 72-79
    table11 = {(0, 0): 0, (0, 8): 8, (1, 0): 72, (1, 8): 64, (7, 56): 448, (8, 0): 512}
    for (r, c), off in table11.items():
        hit = (row == r) & (col == c)
        assert hit.sum() == 1 and addr[hit][0] // 2 == off


def test_table2_each_warp_loads_its_16_query_rows():
    q = bhnd(np.random.default_rng(4).standard_normal((64, 64)).astype(np.float16))
    _, rec = run(q, q, q, ops={Op.LDSM})
    for ev in rec.of(Op.LDSM, round=0, label="tCrQ"):
        for w in range(4):
            assert sorted(set(ev.smem.row[0, 0, w].tolist())) == list(range(16 * w, 16 * w + 16))


# -- lane 0's operands and the general lane formulas (spec section 5, "32 lanes feed one MMA") ----
def _operand_events():
    q, k = id_tensor(64), id_tensor(64)
    _, rec = run(bhnd(q), bhnd(k), bhnd(q), ops={Op.LDSM})
    return rec


def test_lane0_operands_through_ldmatrix():
    rec = _operand_events()
    qh0 = rec.of(Op.LDSM, round=0, label="tCrQ <- sQ (h=0)")[0].regs_out["tCrQ"][0, 0, 0, 0]  # [4] words
    rows, cols = decode_ids(qh0)
    assert list(zip(rows.tolist(), cols.tolist())) == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    kh0 = rec.of(Op.LDSM, round=0, label="tCrK <- sK (h=0)")[0].regs_out["tCrK"][0, 0, 0, 0]
    keys, ds = decode_ids(kh0[:2])  # n8 atom 0: b0,b1 | b2,b3
    assert keys.tolist() == [0, 0, 0, 0] and ds.tolist() == [0, 1, 8, 9]
    q1 = decode_ids(rec.of(Op.LDSM, round=0, label="tCrQ <- sQ (h=0)")[0].regs_out["tCrQ"][0, 0, 0, 1])
    assert sorted(set(q1[1].tolist())) == [2, 3, 10, 11] and sorted(set(q1[0].tolist())) == [0, 8]


def test_general_lane_formulas_for_every_lane_j_and_h():
    rec = _operand_events()
    w = np.arange(4)[:, None, None]
    lane = np.arange(32)[None, :, None]
    g, a = lane // 4, lane % 4
    for h in range(4):
        qregs = rec.of(Op.LDSM, round=0, label=f"tCrQ <- sQ (h={h})")[0].regs_out["tCrQ"][0, 0]  # [W, L, 4]
        rows, ds = decode_ids(qregs)  # [W, L, 8]
        i = np.arange(8)[None, None, :]
        np.testing.assert_array_equal(rows, 16 * w + g + 8 * ((i >> 1) & 1))
        np.testing.assert_array_equal(ds, np.broadcast_to(16 * h + 2 * a + (i & 1) + 8 * (i >> 2), ds.shape))
        kev = rec.of(Op.LDSM, round=0, label=f"tCrK <- sK (h={h})")[0].regs_out["tCrK"]  # [4, 1, W, L, 4]
        words = np.ascontiguousarray(np.moveaxis(kev[:, 0], 0, 2)).reshape(4, 32, 8, 2)  # [W, L, j, b-reg]
        keys, kd = decode_ids(words)  # [W, L, j, 4]: b0..b3 of n8 atom j
        j = np.arange(8)[None, None, :, None]
        e = np.arange(4)[None, None, None, :]
        np.testing.assert_array_equal(keys, np.broadcast_to(8 * j + g[..., None], keys.shape))
        np.testing.assert_array_equal(kd, np.broadcast_to(16 * h + 2 * a[..., None] + (e & 1) + 8 * (e >> 1), kd.shape))


def test_lane0_scores_and_table6_columns():
    # Q[q, 0] = q + 1, K[key, 0] = key + 1 (other d = 0): S(q, key) = (q + 1)(key + 1), exactly.
    q = np.zeros((64, 64), np.float16)
    q[:, 0] = np.arange(1, 65)
    k = np.zeros((64, 64), np.float16)
    k[:, 0] = np.arange(1, 65)
    _, rec = run(bhnd(q), bhnd(k), bhnd(k), ops=set())
    s = rec.ck(Checkpoint.S_ACC).view(np.float32)  # [T, 32] CuTe order: (nj, mi, v)
    assert s[0, :4].tolist() == [1, 2, 9, 18]  # lane 0: S(0,0), S(0,1), S(8,0), S(8,1)
    assert s[1, :4].tolist() == [3, 4, 27, 36]  # lane 1: keys 2, 3 of queries 0, 8
    assert s[4, :4].tolist() == [2, 4, 10, 20]  # lane 4: queries 1, 9, keys 0, 1
    rc = rowcol(s.reshape(1, 4, 32, 8, 1, 4))[0]  # [W, L, MI, 2, 16], ascending key order
    table6 = [[0, 1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57],
              [2, 3, 10, 11, 18, 19, 26, 27, 34, 35, 42, 43, 50, 51, 58, 59],
              [4, 5, 12, 13, 20, 21, 28, 29, 36, 37, 44, 45, 52, 53, 60, 61],
              [6, 7, 14, 15, 22, 23, 30, 31, 38, 39, 46, 47, 54, 55, 62, 63]]
    for lane in range(4):
        assert (rc[0, lane, 0, 0] - 1).astype(int).tolist() == table6[lane]  # query 0
        assert (rc[0, lane, 0, 1] / 9 - 1).astype(int).tolist() == table6[lane]  # query 8


def test_table12_fragment_sizes_per_thread():
    rec = _operand_events()
    halves = {name: sum(e.repeat * e.regs_out[name].shape[-1] * 2 for e in rec.of(Op.LDSM, round=0, label=name))
              for name in ("tCrQ", "tCrK")}
    assert halves == {"tCrQ": 32, "tCrK": 128}  # (8,1,4) and (4,8,4) halves
    q = bhnd(np.random.default_rng(5).standard_normal((64, 64)).astype(np.float16))
    _, rec = run(q, q, q, ops=set())
    assert rec.ck(Checkpoint.S_ACC).shape == (128, 32)  # tCrS (4, 1, 8): 32 floats per thread
    assert rec.ck(Checkpoint.O_ACC).shape == (128, 32)  # tCrO: 32 floats per thread (spec table 10)
    assert rec.ck(Checkpoint.P_F16).shape == (128, 16)  # tCrP: 32 halves, the same registers


# -- table 4: the causal diagonal block, from the s_masked checkpoint -----------------------------
def test_table4_kept_keys_of_lanes_0_to_3():
    rng = np.random.default_rng(6)
    q, k = (bhnd(rng.standard_normal((64, 64)).astype(np.float16)) for _ in range(2))
    _, rec = run(q, k, k, causal=True, ops=set())
    s = rec.ck(Checkpoint.S_MASKED).view(np.float32)[:4].reshape(4, 8, 4)  # lanes 0-3: [L, nj, v]
    keys = 8 * np.arange(8)[:, None] + 2 * np.arange(4)[:, None, None] + (np.arange(4) & 1)  # [L, nj, v]
    kept = lambda lane, vs: sorted(keys[lane][:, vs][np.isfinite(s[lane][:, vs])].tolist())
    assert [kept(l, [0, 1]) for l in range(4)] == [[0], [], [], []]  # query 0
    assert [kept(l, [2, 3]) for l in range(4)] == [[0, 1, 8], [2, 3], [4, 5], [6, 7]]  # query 8
    acc = rec.ck(Checkpoint.S_ACC).view(np.float32)[:4].reshape(4, 8, 4)
    np.testing.assert_array_equal(s[np.isfinite(s)], acc[np.isfinite(s)])  # kept scores untouched


# -- tables 5-7: the quad max through the shuffle instruction -------------------------------------
def test_table7_reduction_in_the_kernel():
    q = np.zeros((64, 64), np.float16)
    q[:, 0] = 1
    k = np.full((64, 64), 0, np.float16)
    k[:, 0] = -5
    k[:8, 0] = np.arange(-4, 4)
    _, rec = run(bhnd(q), bhnd(k), bhnd(k), ops={Op.SHFL, Op.REG})
    x2, x1 = rec.of(Op.SHFL, round=0, label="shfl_xor(rRowMax")
    slot0 = lambda e, reg, key="rRowMax": e.regs_out[key][0, 0, 0, :4, 0] if reg else e.regs_in[key][0, 0, 0, :4, 0]
    assert slot0(x2, False).tolist() == [-3, -1, 1, 3]  # thread-local max (table 7, column 2)
    assert x2.shfl_src[0, 0, 0, :4].tolist() == [2, 3, 0, 1] and slot0(x2, True).tolist() == [1, 3, -3, -1]
    after2 = [e for e in rec.of(Op.REG, round=0) if e.label == Step.MAX_XOR2.value][0]
    after1 = [e for e in rec.of(Op.REG, round=0) if e.label == Step.MAX_XOR1.value][0]
    assert slot0(after2, True).tolist() == [1, 3, 1, 3] and x1.shfl_src[0, 0, 0, :4].tolist() == [1, 0, 3, 2]
    assert slot0(after1, True).tolist() == [3, 3, 3, 3]
    # groups never mix: lane 4's partners are 6 then 5, lane 31's are 29 then 30
    assert x2.shfl_src[0, 0, 0, [4, 31]].tolist() == [6, 29] and x1.shfl_src[0, 0, 0, [4, 31]].tolist() == [5, 30]


# -- table 8 and figures 4-10 / table 1: the two-round worked example ------------------------------
def _worked_example():
    """The spec's 2x2 example embedded in d = 32, block_n = 32: keys 0,1 in round 0, keys 32,33
    (spec keys 2,3) in round 1; keys 2..31 score -60 (weight 2^-61, nothing in fp16); Nk = 34
    masks the rest. s = ln 2 makes every weight a power of two."""
    d = 32
    q = np.zeros((2, d), np.float16)
    q[0, 0] = q[1, 1] = 1
    k = np.zeros((34, d), np.float16)
    k[:, :2] = -60
    k[[0, 1, 32, 33], :2] = [[0, 1], [1, 0], [2, 1], [0, 2]]
    v = np.zeros((34, d), np.float16)
    v[:, 2:] = 3  # columns the example does not look at
    v[[0, 1, 32, 33], :2] = [[1, 0], [0, 1], [1, 1], [2, 0]]
    cfg = KernelConfig(block_m=64, block_n=32, head_dim=d, n_warps=4)
    return run(bhnd(q), bhnd(k), bhnd(v), scale=math.log(2), config=cfg)


def test_table8_order_of_the_online_softmax_update():
    _, rec = _worked_example()
    def order(t):
        evs = [e for e in rec.events if e.round == t and e.phase in (Phase.SOFTMAX, Phase.PV)
               and e.op in (Op.REG, Op.SHFL, Op.HMMA)]
        return [Step(e.label).name if e.op is Op.REG else e.op.value for e in evs]
    body = ["MAX_LOCAL", "SHFL", "MAX_XOR2", "SHFL", "MAX_XOR1"]
    sums = ["EXP", "SUM_LOCAL", "SHFL", "SUM_XOR2", "SHFL", "SUM_XOR1", "SUM_ADD", "CONVERT_P"]
    assert order(0) == body + sums + ["HMMA"] * 2
    assert order(1) == ["M_PREV"] + body + ["ALPHA", "RESCALE"] + sums + ["HMMA"] * 2


def test_figures_4_to_10_and_table1_through_the_checkpoints():
    res, rec = _worked_example()
    def slots(ck, t):  # queries 0, 1 are rows g = 0, 1 of warp 0: lanes 0 and 4, slot 0
        return rec.ck(ck, t).view(np.float32)[[0, 4], 0].tolist()
    def o_acc(ck, t):  # d = 0, 1: lanes 0 and 4 (t = 0), element (nj = 0, mi = 0, v = 0, 1)
        return rec.ck(ck, t).view(np.float32)[[0, 4], :2].tolist()
    assert slots(Checkpoint.ROW_MAX, 0) == [1, 1] and slots(Checkpoint.ROW_SUM, 0) == [1.5, 1.5]  # table 1
    assert o_acc(Checkpoint.O_ACC, 0) == [[0.5, 1], [1, 0.5]]  # figure 6
    p0 = decode_f16x2(rec.ck(Checkpoint.P_F16, 0)[[0, 4], :1]).tolist()
    assert p0 == [[0.5, 1], [1, 0.5]]  # figure 5
    p1 = decode_f16x2(rec.ck(Checkpoint.P_F16, 1)[[0, 4], :1]).tolist()
    assert p1 == [[1, 0.25], [0.5, 1]]  # figure 7
    assert slots(Checkpoint.ROW_MAX, 1) == [2, 2] and slots(Checkpoint.ROW_SUM, 1) == [2, 2.25]
    assert o_acc(Checkpoint.O_ACC, 1) == [[1.75, 1.5], [3, 0.75]]  # figure 9
    np.testing.assert_allclose(o_acc(Checkpoint.O_FINAL, 0), [[7 / 8, 3 / 4], [4 / 3, 1 / 3]], rtol=1e-7)  # fig. 10
    np.testing.assert_allclose(res.o[0, 0, :, :2].astype(np.float64), [[7 / 8, 3 / 4], [4 / 3, 1 / 3]], rtol=1e-3)
    np.testing.assert_allclose(res.lse[0, 0], [math.log(8), math.log(9)], rtol=1e-7)


# -- table 9: the S registers, converted, are PV's A operand ---------------------------------------
def test_table9_pv_reads_the_p_registers_in_place():
    rng = np.random.default_rng(7)
    q, k, v = (bhnd(rng.standard_normal((64, 64)).astype(np.float16)) for _ in range(3))
    _, rec = run(q, k, v, ops={Op.HMMA})
    plan = kernel_plan(SEED)
    p = decode_f16x2(rec.ck(Checkpoint.P_F16, 0)).reshape(4, 32, 8, 1, 4)  # [W, L, nj, mi, v]
    P = np.zeros((64, 64), np.float16)
    P[plan.s_row, plan.s_col] = p  # the block's P~ as a matrix, from each thread's registers
    ar, ac = mma.a_coords()
    pv = [e for e in rec.of(Op.HMMA, round=0) if e.phase is Phase.PV]
    for h, ev in enumerate(pv):
        a = decode_f16x2(ev.regs_in["a"][0, 0])  # [W, L, 8] (instruction 0: mi = 0, nj = 0)
        for w in range(4):
            np.testing.assert_array_equal(a[w], P[16 * w + ar, 16 * h + ac])
        a_all = decode_f16x2(ev.regs_in["a"][:, 0])  # [R, W, L, 8]: every nj reuses the same A
        np.testing.assert_array_equal(a_all, np.broadcast_to(a_all[:1], a_all.shape))
    lane0_keys = [sorted(set((16 * h + ac[0]).tolist())) for h in range(4)]
    assert lane0_keys == [[0, 1, 8, 9], [16, 17, 24, 25], [32, 33, 40, 41], [48, 49, 56, 57]]


def test_pv_a_view_is_the_a_operand_of_the_p_registers():
    """The unobserved PV chain's A matrices, read from P~ by column (softmax.pv_a_view), are the
    matrices of the A fragments that gemm_A_in_regs takes from tCrP in registers."""
    from fa_sim.kernels.fa2_fwd import _a_operand
    from fa_sim.kernels.softmax import by_column, pv_a_view
    k, w, nj, mi = 3, 4, 8, 2
    p = np.random.default_rng(9).standard_normal((k, w, 32, nj, mi, 4)).astype(np.float16).astype(np.float32)
    words = p.astype(np.float16).view(np.uint32)  # [k, W, L, NJ, MI, 2]: (c0, c1), (c2, c3)
    for h in range(nj // 2):
        want = mma.a_matrix(_a_operand(words, h))  # [k, W, 16 MI, 16] f16
        got = pv_a_view(by_column(p), w, h).reshape(k, w, 16 * mi, 16)
        np.testing.assert_array_equal(got, want.astype(np.float32))


# -- mutations (for the hazard checker) ----------------------------------------------------------
def _random(n=128, seed=8):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 1, n, 64)).astype(np.float16) for _ in range(3)]


def test_dropping_the_qk_wait_reads_stale_shared_memory():
    q, k, v = _random()
    good = fa_sim.simulate(q, k, v)
    bad = fa_sim.simulate(q, k, v, mutation=Mutation(drop=frozenset({Site.WAIT_QK})))
    assert not np.array_equal(good.o, bad.o)


def test_late_wait_comes_right_after_the_first_dependent_ldmatrix():
    q, k, v = _random()
    for site, first in ((Site.WAIT_QK, "tCrQ <- sQ (h=0)"), (Site.WAIT_PV, "tCrV <- sVt (h=0)")):
        res, rec = run(q, k, v, mutation=Mutation(late_wait=frozenset({site})), ops={Op.LDSM, Op.DEPBAR})
        labels = [e.label for e in rec.events if e.round == 0]
        i = labels.index(first)
        assert rec.events[i + 1].op is Op.DEPBAR and rec.events[i + 1].label == f"{site.name} (late)"
        assert [e.label.split()[0] for e in rec.events if e.round == 0 and e.op is Op.DEPBAR].count(site.name) == 1
    ok = fa_sim.simulate(q, k, v)
    late_qk = fa_sim.simulate(q, k, v, mutation=Mutation(late_wait=frozenset({Site.WAIT_QK})))
    assert not np.array_equal(ok.o, late_qk.o)  # round 0 read sQ (h = 0) before it landed


def test_dropping_barriers_changes_counts_not_results():
    q, k, v = _random()
    ok = fa_sim.simulate(q, k, v)
    every = frozenset({Site.BAR_QK, Site.BAR_PV, Site.BAR_EPILOGUE})
    mut = fa_sim.simulate(q, k, v, mutation=Mutation(drop=every))
    np.testing.assert_array_equal(ok.o, mut.o)  # lockstep: only the hazard checker can tell
    assert mut.instructions[Op.BAR] == 0 and ok.instructions[Op.BAR] == 2 * 4 * (2 * 2 + 1)
    with pytest.raises(ValueError, match="wait_group sites"):
        Mutation(late_wait=frozenset({Site.BAR_QK}))


# -- checkpoints agree with the outputs -----------------------------------------------------------
def test_checkpoints_agree_with_outputs_and_shared_memory():
    q, k, v = _random(n=64)
    res, rec = run(q, k, v, ops=set())
    o_final = rec.ck(Checkpoint.O_FINAL).view(np.float32).reshape(4, 32, 8, 1, 4)
    plan = kernel_plan(SEED)
    o = np.zeros((64, 64), np.float32)
    o[plan.s_row, plan.s_col] = o_final  # tCrO shares tCrS's layout for d = block_n = 64
    np.testing.assert_array_equal(o.astype(np.float16), res.o[0, 0])
    sq = rec.ck(Checkpoint.SQ).reshape(-1)[: 64 * 64 // 2].view(np.uint16)
    r, c = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    np.testing.assert_array_equal(sq[SEED.smem_offset(r, c)], q[0, 0].view(np.uint16))
    so = rec.ck(Checkpoint.SO).reshape(-1)[: 64 * 64 // 2].view(np.uint16)
    np.testing.assert_array_equal(so[SEED.smem_offset(r, c)], res.o[0, 0].view(np.uint16))
