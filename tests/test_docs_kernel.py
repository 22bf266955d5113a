"""docs/kernel.md against the code: its marked tables, `fa explain` excerpts and measured
numbers, recomputed from fa_sim (the parsers and the list of checked tables are in test_docs.py)."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import numpy as np

from fa_sim.config import KernelConfig, SmemLayout
from fa_sim.isa.mma import a_coords, b_coords, c_coords
from fa_sim.isa.shfl import shfl_bfly
from fa_sim.kernels.plan import kernel_plan
from fa_sim.layout import (
    Gemm, Ldsm, Operand, TiledMma, acc_as_a_operand, acc_rowcol_coords, copy_tv, ldsm_view, size,
    smem_layout,
)
from test_docs import KERNEL, KT, ROOT, SEED, _cells, config_of, dims, ints, pairs, read_outputs

# == kernel.md: command output =========================================================================
def test_explain_excerpts_are_real_output(capsys):
    from fa_sim.cli import main

    blocks = read_outputs(KERNEL)
    assert len(blocks) == 5
    for command, lines in blocks:
        argv = command.split()
        assert argv[:2] == ["fa", "explain"]
        assert main(argv[1:]) == 0
        out = capsys.readouterr().out.splitlines()
        n = len(lines)
        assert any(out[i:i + n] == lines for i in range(len(out) - n + 1)), f"`{command}` no longer prints:\n" + "\n".join(lines)


def test_example_inputs():
    from fa_sim.reference import SPEC_EXAMPLE

    table = KT["example-inputs"]
    for name, matrix in (("Q", SPEC_EXAMPLE.q), ("K", SPEC_EXAMPLE.k), ("V", SPEC_EXAMPLE.v)):
        col = next(c for c in table[0] if c.startswith(name + " "))
        assert [ints(r[col].replace(" ", ", ")) for r in table if r[col]] == [list(row) for row in matrix]


def test_expf_speed_numbers_match_the_benchmark_table():
    rows = [_cells(line) for line in (ROOT / "experiments" / "bench_hw_h200_numerics.md").read_text().splitlines()
            if line.startswith("| (4, 16, 4096, 64) | False |")]
    tflops = {(r[2], r[3]): float(r[5]) for r in rows if r[2].startswith("fa_hw")}  # the per-backend table
    exp2 = tflops[("fa_hw", "m64n64d64w4-swizzled")]
    expf = tflops[("fa_hw-diag", "m64n64d64w4-swizzled accurate-expf")]
    text = " ".join(KERNEL.read_text().split())
    assert f"reaches {expf} TFLOP/s against {exp2} for the exp2 form" in text
    assert f"{expf / exp2:.2f} times the speed" in text and f"{exp2 / expf:.2f} times the `expf` build" in text


# == kernel.md: tiles, warps, lanes ====================================================================
def _warp_rows(cfg: KernelConfig, gemm: Gemm, w: int) -> tuple[set, set]:
    mma = TiledMma(cfg, gemm)
    thr = np.arange(32 * w, 32 * w + 32)[:, None]
    r, c = mma.tv(Operand.C)(thr, np.arange(size(mma.fragment(Operand.C)))[None, :])
    return set(r.ravel().tolist()), set(c.ravel().tolist())


def test_warps():
    for row in KT["warps"]:
        w = int(row["warp"])
        assert ints(row["threads"]) == list(range(32 * w, 32 * w + 32))
        rows, keys = _warp_rows(SEED, Gemm.QK, w)
        assert rows == set(ints(row["query rows of S and O"])) and keys == set(range(SEED.block_n))
        assert row["keys of S in round t"] == f"{SEED.block_n}t..{SEED.block_n}t+{SEED.block_n - 1}"
        assert _warp_rows(SEED, Gemm.PV, w) == (rows, set(ints(row["columns of O"])))
    cfg = KernelConfig(block_m=128)
    for row in KT["warps-m128"]:
        rows, _ = _warp_rows(cfg, Gemm.QK, int(row["warp"]))
        assert rows == set(ints(row["query rows (block_m = 128, 4 warps)"]))


def test_lane_fragments():
    (ar, ac), (bk, bn), (cr, cc) = a_coords(), b_coords(), c_coords()
    for row in KT["lanes"]:
        ln = int(row["lane"])
        assert (int(row["g"]), int(row["a"])) == (ln // 4, ln % 4)
        assert ints(row["A = Q: rows"]) == sorted(set(ar[ln].tolist()))
        assert ints(row["A = Q: d"]) == sorted(set(ac[ln].tolist()))
        assert ints(row["B = K: key"]) == sorted(set(bn[ln].tolist()))
        assert ints(row["B = K: d"]) == sorted(bk[ln].tolist())
        assert pairs(row["C = S: (row, key)"]) == list(zip(cr[ln].tolist(), cc[ln].tolist()))


def test_tiledmma_levels_and_family():
    mma = TiledMma(SEED)
    want = {"one round of QK": mma.mnk, "TiledMMA base cover": mma.tile_mnk,
            "one warp's share": (16 * mma.mma_m, mma.mnk[1], mma.mnk[2]), "one mma.m16n8k16": (16, 8, 16)}
    assert {r["level"]: dims(r["M × N × K"]) for r in KT["tiledmma-levels"]} == want
    assert mma.repeats == (1, 4, 4)
    for row in KT["tiledmma-family"]:
        cfg = config_of(row["config"])
        qk, pv = TiledMma(cfg, Gemm.QK), TiledMma(cfg, Gemm.PV)
        got = [cfg.m_repeats, qk.mma_n, qk.k_segments, qk.mmas_per_warp, pv.mma_n, pv.k_segments, pv.mmas_per_warp]
        assert [int(v) for k, v in row.items() if k != "config"] == got, row["config"]


# == kernel.md: causal, reductions, softmax ============================================================
def test_causal_rounds():
    from fa_sim.kernels.fa2_fwd import Problem

    for row in KT["causal-rounds"]:
        nq, nk, mb = int(row["Nq"]), int(row["Nk"]), int(row["m_block"])
        assert ints(row["query rows"]) == list(range(64 * mb, min(nq, 64 * mb + 64)))
        for causal, col in ((True, "rounds, causal"), (False, "rounds, non-causal")):
            prob = Problem(1, 1, nq, nk, causal, 0.125, SEED)
            assert int(prob.n_block_max(np.array([mb]))[0]) == int(row[col]), row


def test_diagonal_mask_of_quad_0():
    q, k = acc_rowcol_coords(SEED, np.arange(4))  # [lane, row, col]: rows 0 and 8 of warp 0
    for row in KT["diag-lanes"]:
        ln = int(row["lane"])
        held = sorted(k[ln, 0].tolist())
        head, _, tail = row["keys held (rows 0 and 8)"].partition("…")
        assert held[:len(ints(head))] == ints(head) and held[-len(ints(tail)):] == ints(tail)
        assert np.array_equal(k[ln, 0], k[ln, 1])
        for r, col in ((0, "query 0 keeps"), (1, "query 8 keeps")):
            assert sorted(k[ln, r][k[ln, r] <= q[ln, r]].tolist()) == ints(row[col])


def test_quads_and_their_keys():
    q, k = acc_rowcol_coords(SEED, np.arange(32))
    for row in KT["quads"]:
        g, lanes = int(row["quad g"]), ints(row["lanes"])
        assert lanes == list(range(4 * g, 4 * g + 4))
        assert set(q[lanes, 0].ravel().tolist()) == {int(row["first row (g)"])}
        assert set(q[lanes, 1].ravel().tolist()) == {int(row["second row (g + 8)"])}
    for row in KT["lane-keys"]:
        keys = sorted(k[int(row["lane"]), 0].tolist())
        assert ints(row["keys among 0..31"]) == [x for x in keys if x < 32]
        assert ints(row["keys among 32..63"]) == [x for x in keys if x >= 32]


def _quad_reduce(x: np.ndarray, op) -> list[np.ndarray]:
    """x [32] -> [x, after XOR 2, after XOR 1] through the simulator's shfl.sync.bfly."""
    steps = [x]
    for mask in (2, 1):
        y, _ = shfl_bfly(steps[-1], mask, lane_axis=0)
        steps.append(op(steps[-1], y))
    return steps


def test_quad_max_and_sum_examples():
    _, k = acc_rowcol_coords(SEED, np.arange(32))
    scores = np.full(64, -5.0, np.float32)
    scores[:8] = np.arange(-4, 4)
    local = scores[k[:, 0]].max(axis=1)  # [32]: each lane's own 16 keys of the row
    got = _quad_reduce(local, np.maximum)
    cols = ("max of own 16 keys", "after XOR 2", "after XOR 1")
    for row in KT["quad-max"]:
        assert [int(s[int(row["lane"])]) for s in got] == [int(row[c]) for c in cols]
    table = KT["quad-sum"]
    local = np.tile(np.array([Fraction(r["local sum"]) for r in table], np.float32), 8)
    got = _quad_reduce(local, np.add)
    for row in table:
        assert [Fraction(float(s[int(row["lane"])])) for s in got] == [
            Fraction(row[c]) for c in ("local sum", "after XOR 2", "after XOR 1")]


def test_softmax_steps_are_the_program_order():
    sites = kernel_plan(SEED).sites.softmax
    labels = [step.value for step, _ in sorted(sites.items(), key=lambda kv: kv[1].pc)]
    assert [r["trace label"] for r in KT["softmax-steps"]] == labels
    assert [int(r["step"]) for r in KT["softmax-steps"]] == list(range(1, len(labels) + 1))


def test_pv_operand_of_lane_0_is_its_s_registers():
    qk = TiledMma(SEED, Gemm.QK)
    a_view = acc_as_a_operand(qk.fragment(Operand.C))  # the S registers read as PV's A operand
    per_seg = size(a_view[0])
    for row in KT["pv-lane0"]:
        h = int(row["key segment h"])
        slots = a_view(np.arange(per_seg * h, per_seg * (h + 1)))
        _, keys = qk.tv(Operand.C)(0, slots)
        assert sorted(set(keys.tolist())) == ints(row["keys of lane 0's A operand (rows 0 and 8)"])


# == kernel.md: shared memory, copy, fragments, pipeline ===============================================
def test_swizzle_offsets():
    sw, plain = smem_layout(SEED, 64), smem_layout(KernelConfig(smem="plain"), 64)
    for row in KT["swizzle-offsets"]:
        (r, c), = pairs(row["(r, c)"])
        assert (int(plain(r, c)), int(sw(r, c))) == (int(row["row-major 64r + c"]), int(row["swizzled"]))


def test_ldmatrix_banks_of_the_three_layouts():
    addr = {s: kernel_plan(KernelConfig(smem=s)).ldsm_q[0] for s in SmemLayout}
    for row in KT["ldsm-banks"]:
        ln = int(row["lane"])
        assert int(addr[SmemLayout.SWIZZLED].row[0, ln, 0]) == int(row["Q row"])
        for s in SmemLayout:
            byte = int(addr[s].smem.addr[0, ln, 0])
            bank = byte // 4 % 32
            assert (byte, f"{bank}-{bank + 3}") == (int(row[f"{s.value}: byte"]), row[f"{s.value}: banks"])


def test_swizzle_family():
    for row in KT["swizzle-family"]:
        cfg = KernelConfig(head_dim=int(row["head_dim"]))
        assert int(row["row bytes"]) == 2 * cfg.head_dim
        assert row["swizzle"] == "Swizzle<{},{},{}>".format(*cfg.swizzle_bms)
        formula = row["chunk index XOR"].replace("mod", "%").replace("/", "//")
        n_chunks = cfg.head_dim // 8
        for r in range(32):
            chunk = int(cfg.smem_offset(r, 0)) // 8 % n_chunks
            assert chunk == eval(formula, {"r": r}), (row, r)


def test_smem_budget():
    for row in KT["smem-budget"]:
        cfg = config_of(row["config"])
        got = (cfg.row_pitch, cfg.sk_offset_bytes, cfg.sv_offset_bytes - cfg.sk_offset_bytes,
               cfg.smem_bytes - cfg.sv_offset_bytes, cfg.smem_bytes)
        assert tuple(int(v) for k, v in row.items() if k != "config") == got, row["config"]


def test_copy_threads_and_family():
    tv = copy_tv(SEED, 64)
    for row in KT["copy-threads"]:
        r, c = tv(int(row["thread"]), (np.arange(8)[:, None], np.arange(4)[None, :]))
        assert ints(row["rows"]) == sorted(set(r.ravel().tolist()))
        assert ints(row["halves"]) == sorted(set(c.ravel().tolist()))
    for row in KT["copy-family"]:
        for w, col in ((4, "rows per pass, 4 warps"), (8, "rows per pass, 8 warps")):
            cfg = KernelConfig(head_dim=int(row["head_dim"]), block_m=128, block_n=128, n_warps=w)
            assert (cfg.copy_threads_per_row, cfg.copy_rows_per_pass) == (int(row["threads per row"]), int(row[col]))


def test_fragment_shapes():
    mma = TiledMma(SEED)
    frag = {"tCrQ": mma.fragment(Operand.A), "tCrK": mma.fragment(Operand.B), "tCrS": mma.fragment(Operand.C)}
    frag["tXrQ"], frag["tXrK"] = ldsm_view(frag["tCrQ"], Operand.A), ldsm_view(frag["tCrK"], Operand.B)
    for row in KT["fragments"]:
        f = frag[row["view"]]
        assert dims(row["CuTe top-level shape"]) == tuple(size(f[i]) for i in range(len(f))), row["view"]
        per = dims(row["per thread"])
        assert per == () or per == (size(f),), row["view"]
        assert size(f) == size(frag[row["view"].replace("tX", "tC")])


def test_ldmatrix_lane_addresses():
    plan = kernel_plan(SEED)
    lanes = {"tCrQ": plan.ldsm_q[0], "tCrK": plan.ldsm_k[0], "tCrV": plan.ldsm_v[0]}
    assert [ldsm.trans for ldsm in Ldsm] == [False, False, True]
    for row in KT["ldsm-lanes"]:
        ln = int(row["lane"])
        for name, sl in lanes.items():
            assert pairs(row[f"{name}: (row, col)"]) == [(int(sl.row[0, ln, 0]), int(sl.col[0, ln, 0]))]


def test_per_round_instruction_counts():
    from fa_sim import simulate
    from fa_sim.reference import random_inputs

    res = simulate(*random_inputs(1, 1, 64, 192, 64, 0))  # one CTA, three rounds
    per: dict = defaultdict(lambda: defaultdict(int))
    for (op, _, rnd), n in res.counts.items():
        per[rnd][op.value] += n // SEED.n_warps
    assert per[0] == per[1]
    cols = {"prologue": -1, "round (not the last)": 0, "last round": 2, "epilogue": -2}
    for row in KT["per-round-counts"]:
        for col, rnd in cols.items():
            assert per[rnd][row["class"]] == int(row[col]), (row["class"], col)
