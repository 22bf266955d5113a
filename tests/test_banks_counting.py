"""Bank-conflict counting by the Nsight Compute rules of docs/hardware_facts.md, on hand-built
instructions (no simulator needed)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fa_sim.config import KernelConfig
from fa_sim.events import Op
from fa_sim.kernels import Problem, launch_info
from fa_sim.kernels.labels import Phase, Tile
import synthetic  # tests/synthetic.py: the memory instructions from the spec's closed forms
from fa_sim.observers.bank_tables import format_compare, format_report
from fa_sim.observers.banks import (BankCounter, SmemClass, bank_of, instruction_cost, phase_wavefronts,
                                    phase_words, word_wavefront)


def wavefronts_oracle(addr, mask, op, width):
    """Per-lane reference: split into phases, count distinct words per bank, take the max."""
    lpp = 8 if op is Op.LDSM else {4: 32, 8: 16, 16: 8}[width]
    out = []
    for p in range(32 // lpp):
        banks = {}
        for lane in range(p * lpp, (p + 1) * lpp):
            if mask[lane]:
                for w in range(addr[lane] // 4, addr[lane] // 4 + width // 4):
                    banks.setdefault(w % 32, set()).add(w)
        out.append(max((len(s) for s in banks.values()), default=0))
    return out


def cost(ev):
    return instruction_cost(ev.op, ev.smem, ev.active)


def test_bank_of_is_word_mod_32():
    assert bank_of([0, 4, 124, 128, 130]).tolist() == [0, 1, 31, 0, 0]


def test_ldmatrix_x4_plain_tile_costs_32_wavefronts_swizzled_4():
    """docs/hardware_facts.md: a 64x64 fp16 tile with 128-byte rows puts the 8 rows of an 8x8 matrix in the
    same 4 banks, so ldmatrix.x4 costs 32 wavefronts; Swizzle<3,3,3> brings it to the ideal 4."""
    for smem, expect in (("plain", 32), ("swizzled", 4), ("padded", 4)):
        cfg = KernelConfig(smem=smem)
        for ev in (synthetic.ldsm_q(cfg, 0), synthetic.ldsm_k(cfg, 1), synthetic.ldsm_v(cfg, 2)):
            c = cost(ev)
            assert (c.wavefronts == expect).all(), (smem, ev.label)
            assert (c.ideal == 4).all()


def test_o_stores_plain_are_8_way():
    """st.shared.b32 of the f16x2 O pairs: lanes g = 0..7 with the same t hit one bank (plain)."""
    assert (cost(synthetic.sts_o(KernelConfig(smem="plain"))).wavefronts == 8).all()
    assert (cost(synthetic.sts_o(KernelConfig(smem="swizzled"))).wavefronts == 1).all()
    assert (cost(synthetic.sts_o(KernelConfig(smem="padded"))).wavefronts == 1).all()


def test_phase_rules_by_width():
    lane = np.arange(32)
    on = np.ones(32, bool)
    # 4 bytes: one phase of 32 lanes; all on one word -> broadcast, 1 wavefront
    assert phase_wavefronts(phase_words(np.zeros(32, np.int64), on, Op.LDS, 4)).tolist() == [1]
    # 4 bytes, stride 128 B: 32 distinct words in bank 0 -> 32 wavefronts
    assert phase_wavefronts(phase_words(128 * lane, on, Op.LDS, 4)).tolist() == [32]
    # 8 bytes contiguous: 2 phases of 16 lanes, each 128 B -> 1 wavefront each
    assert phase_wavefronts(phase_words(8 * lane, on, Op.LDS, 8)).tolist() == [1, 1]
    # 16 bytes contiguous: 4 quarter-warp phases of 128 B each
    assert phase_wavefronts(phase_words(16 * lane, on, Op.STS, 16)).tolist() == [1, 1, 1, 1]
    # 16 bytes, every lane at the same 16 B: broadcast
    assert phase_wavefronts(phase_words(np.zeros(32, np.int64), on, Op.LDS, 16)).tolist() == [1, 1, 1, 1]
    # masked-off lanes do not count; a phase with no lane costs nothing
    half = lane < 8
    assert phase_wavefronts(phase_words(128 * lane, half, Op.LDS, 16)).tolist() == [8, 0, 0, 0]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(Op.LDS, 4), (Op.LDS, 8), (Op.STS, 16), (Op.LDSM, 16)]),
       st.lists(st.integers(0, 255), min_size=32, max_size=32),
       st.lists(st.booleans(), min_size=32, max_size=32))
def test_vectorised_count_matches_per_lane_oracle(kind, slots, mask):
    op, width = kind
    addr = np.asarray(slots, np.int64) * width
    mask = np.asarray(mask)
    words = phase_words(addr, mask, op, width)
    assert phase_wavefronts(words).tolist() == wavefronts_oracle(addr.tolist(), mask.tolist(), op, width)
    # the picture's wavefront index of each word stays below the phase's wavefront count
    wf = word_wavefront(words)
    assert ((wf.max(axis=-1) + 1) == np.where((words >= 0).any(-1), phase_wavefronts(words), 0)).all()


def run_counter(cfg, seqlen=128):
    counter = BankCounter()
    counter.on_launch(launch_info(Problem(1, 1, seqlen, seqlen, False, 0.125, cfg)))
    for ev in synthetic.memory_program(cfg, seqlen):
        if counter.wants(ev.op, ev.phase, ev.round):
            counter.on_instr(ev)
    return counter.report()


def test_counter_totals_for_the_three_layouts():
    reps = {s: run_counter(KernelConfig(smem=s)) for s in ("swizzled", "plain", "padded")}
    for s in ("swizzled", "padded"):
        assert reps[s].total().conflicts == 0
    plain = reps["plain"].by_class()
    # two rounds x (4 Q + 16 K + 16 V) ldmatrix per warp x 4 warps, 28 conflicts each
    assert plain[SmemClass.LDSM].instructions == 2 * 36 * 4
    assert plain[SmemClass.LDSM].conflicts == 28 * plain[SmemClass.LDSM].instructions
    assert reps["plain"].per_instruction[SmemClass.LDSM] == {32: 288}
    assert plain[SmemClass.STS].instructions == 16 * 4 and reps["plain"].per_instruction[SmemClass.STS] == {8: 64}
    assert plain[SmemClass.LDS].conflicts == 0
    assert plain[SmemClass.LDGSTS].conflicts == 0  # reported, not part of the total
    js = reps["plain"].to_json()
    assert js["classes"]["LDSM"] == {"instructions": 288, "wavefronts": 288 * 32, "ideal": 288 * 4,
                                     "conflicts": 288 * 28}
    assert js["phases"]["epilogue"]["STS"]["conflicts"] == 64 * 7
    assert js["total"]["conflicts"] == 288 * 28 + 64 * 7


def test_per_round_and_phase_groups_add_up():
    rep = run_counter(KernelConfig(smem="plain"), 192)
    total = rep.by_class()[SmemClass.LDSM]
    by_round = rep.group("round", "cls")
    assert sum(v.wavefronts for (r, c), v in by_round.items() if c is SmemClass.LDSM) == total.wavefronts
    assert {r for (r, c) in by_round if c is SmemClass.LDSM} == {0, 1, 2}
    assert rep.group("phase")[Phase.QK].instructions == 3 * 20 * 4


def test_inactive_warps_are_not_counted():
    cfg = KernelConfig(smem="plain")
    ev = synthetic.ldsm_k(cfg, 0)
    active = ev.active.copy()
    active[0, 1:] = False  # only warp 0 runs
    c = instruction_cost(ev.op, ev.smem, active)
    assert c.executed.sum() == 4 and c.wavefronts.sum() == 4 * 32


def test_tables_render():
    reps = {s: run_counter(KernelConfig(smem=s)) for s in ("swizzled", "plain")}
    text = format_compare(reps)
    assert "LDSM" in text and "plain" in text and str(288 * 28) in text
    assert "tCrK <- sK (h=0)" in format_report(reps["plain"])


def test_word_wavefront_of_plain_ldmatrix_stacks_rows():
    """The bank x wavefront picture: in the plain layout rows 0..7 of matrix 0 share banks 0-3, so
    row r is served in wavefront r."""
    ev = synthetic.ldsm_k(KernelConfig(smem="plain"), 0)
    addr = ev.smem.addr[0, 0, 0]
    wf = word_wavefront(phase_words(addr, np.ones(32, bool), Op.LDSM, 16))
    assert wf[0].reshape(8, 4)[:, 0].tolist() == list(range(8))
    sw = synthetic.ldsm_k(KernelConfig(smem="swizzled"), 0).smem.addr[0, 0, 0]
    assert word_wavefront(phase_words(sw, np.ones(32, bool), Op.LDSM, 16)).max() == 0


def test_tile_of_rows():
    rep = run_counter(KernelConfig())
    assert {r.region for r in rep.rows} == {Tile.SQ, Tile.SK, Tile.SV, Tile.SO}
    with pytest.raises(ValueError):  # no access is 3 bytes wide
        phase_words(np.zeros(32, np.int64), np.ones(32, bool), Op.LDS, 3)
    # 1- and 2-byte accesses are one phase of 32 lanes, like 4-byte ones
    assert phase_words(4 * np.arange(32), np.ones(32, bool), Op.LDS, 2).shape == (1, 32)


def test_ldgsts_rule_reproduces_the_h200_probe():
    """banks.ldgsts_wavefronts against Nsight Compute on the H200 (fa_sim/calibrate/ldgsts_probe.py):
    every pattern the kernel can issue agrees; the one scattered pattern it never issues is the
    known exception named in the docstring."""
    import json
    from pathlib import Path

    from fa_sim.observers.banks import ldgsts_wavefronts

    data = json.loads((Path(__file__).parent / "data" / "h200" / "ldgsts_probe.json").read_text())
    metric = "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts_cache_bypass.sum"
    src = 16 * np.arange(32)  # lane l copies global bytes [16 l, 16 l + 16)
    off = []
    for name, offsets in data["patterns"].items():
        o = np.asarray(offsets)
        got = int(ldgsts_wavefronts(np.where(o >= 0, o, 0)[None], src[None], (o >= 0)[None]).sum())
        if got != data["ncu"][name][metric]:
            off.append(name)
    assert off == ["stride 32B"]
    assert len(data["patterns"]) == 35
