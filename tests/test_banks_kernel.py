"""Bank conflicts of the simulated kernel (docs/hardware_facts.md rules; issue acceptance numbers)."""

import json

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.events import Op
from fa_sim.kernels.labels import Phase, Tile
import synthetic  # tests/synthetic.py: the memory instructions from the spec's closed forms
from fa_sim.observers.banks import BankCounter, SmemClass
from fa_sim.observers.runs import Problem, run_banks, simulate

C = SmemClass


@pytest.fixture(scope="module")
def reports():
    return {s: run_banks(KernelConfig(smem=s)) for s in ("swizzled", "plain", "padded")}


def test_seed_swizzled_is_conflict_free(reports):
    by = reports["swizzled"].by_class()
    assert [by[c].conflicts for c in (C.LDSM, C.LDS, C.STS)] == [0, 0, 0]
    # N = 128: 2 CTAs x 4 warps; per warp and round 36 ldmatrix (SCHEDULE.md), 16 STS, 4 LDS
    assert (by[C.LDSM].instructions, by[C.STS].instructions, by[C.LDS].instructions) == (576, 128, 32)
    assert by[C.LDSM].wavefronts == 4 * 576 and by[C.STS].wavefronts == 128


def test_plain_ldmatrix_costs_32_wavefronts_and_o_stores_are_8_way(reports):
    """docs/hardware_facts.md: every ldmatrix.x4 of a 128-byte-row tile costs 32 wavefronts instead of 4;
    the f16x2 O stores (st.shared.b32) to sO hit one bank with 8 lanes (8 wavefronts for 1)."""
    rep = reports["plain"]
    assert rep.per_instruction[C.LDSM] == {32: 576}
    assert rep.per_instruction[C.STS] == {8: 128}
    assert rep.per_instruction[C.LDS] == {4: 32}  # 16-byte loads of whole rows stay ideal
    js = rep.to_json()
    assert js["classes"]["LDSM"]["conflicts"] == 576 * 28
    assert js["phases"]["epilogue"]["STS"] == {"instructions": 128, "wavefronts": 1024, "ideal": 128,
                                               "conflicts": 896}


def test_padded_measured(reports):
    """Rows padded by 16 bytes start 4 banks apart: 8 consecutive rows of one 16-byte column cover
    all 32 banks, so the seed config is conflict-free too (at 27 KB of smem instead of 24 KB)."""
    rep = reports["padded"]
    assert rep.total().conflicts == 0
    assert rep.per_instruction[C.LDSM] == {4: 576} and rep.per_instruction[C.STS] == {1: 128}


def test_padded_head_dim_32_has_2_way_conflicts():
    """With 64-byte rows the padded pitch is 80 B = 20 banks: a quarter-warp of 16-byte accesses
    spans two rows whose bank ranges overlap in 4 banks -> 2 wavefronts per phase for LDS.128.
    cp.async counts by ncu's LDGSTS rule (banks.ldgsts_wavefronts): a warp's 8 rows of 80 B start
    line-aligned every warp, and cost 15 wavefronts, as the H200 probe measured (pitch 80 pattern)."""
    cfg = KernelConfig(block_m=64, block_n=64, head_dim=32, smem="padded")
    rep = run_banks(cfg, Problem(seqlen=128, head_dim=32))
    # 32 rows per copy pass: 2 LDS per warp, 10 cp.async per warp (Q 2, K 2 + 2, V 2 x 2 rounds)
    assert rep.per_instruction[C.LDS] == {8: 16} and rep.per_instruction[C.LDGSTS] == {15: 80}
    assert rep.by_class()[C.LDSM].conflicts == 0


def test_rounds_phases_and_classes_add_up(reports):
    rep = reports["plain"]
    total = rep.by_class()[C.LDSM]
    per_round = {r: v for (r, c), v in rep.group("round", "cls").items() if c is C.LDSM}
    assert set(per_round) == {0, 1} and sum(v.wavefronts for v in per_round.values()) == total.wavefronts
    qk = rep.group("phase", "cls")[(Phase.QK, C.LDSM)]
    pv = rep.group("phase", "cls")[(Phase.PV, C.LDSM)]
    assert (qk.instructions, pv.instructions) == (320, 256)  # (4 Q + 16 K) and 16 V per warp-round
    assert {r.region for r in rep.rows if r.cls is C.LDSM} == {Tile.SQ, Tile.SK, Tile.SV}


def test_causal_skips_are_not_counted():
    causal = run_banks(KernelConfig(), Problem(seqlen=128), causal=True).by_class()
    assert causal[C.LDSM].instructions == 3 * 36 * 4  # CTA 0 runs one round, CTA 1 two


class _Ldsm:
    """Collects the machine's ldmatrix addresses of CTA 0 in round 0, per tile."""

    def __init__(self):
        self.addr = {}

    def wants(self, op, phase, rnd):
        return op is Op.LDSM and rnd == 0

    def on_instr(self, ev):
        a = np.asarray(ev.smem.addr)[:, 0]  # [R, W, L]
        self.addr.setdefault(ev.smem.region, []).extend(map(bytes, a.astype(np.int64)))


@pytest.mark.parametrize("cfg", [KernelConfig(), KernelConfig(block_m=128, block_n=32, head_dim=128, n_warps=8,
                                                                smem="plain")], ids=lambda c: c.tag)
def test_machine_addresses_match_the_closed_form_maps(cfg):
    """The ldmatrix row addresses the machine emits equal the lane maps of docs/hardware_facts.md
    (synthetic.py)."""
    obs = _Ldsm()
    simulate(*Problem(seqlen=cfg.block_m, head_dim=cfg.head_dim).inputs(), causal=False, config=cfg, observers=[obs])
    expect = {Tile.SQ: [synthetic.ldsm_q(cfg, h) for h in range(cfg.qk_k_segments)],
              Tile.SK: [synthetic.ldsm_k(cfg, h) for h in range(cfg.qk_k_segments)],
              Tile.SV: [synthetic.ldsm_v(cfg, h) for h in range(cfg.pv_k_segments)]}
    for tile, events in expect.items():
        want = [bytes(a) for ev in events for a in np.asarray(ev.smem.addr)[:, 0].astype(np.int64)]
        assert sorted(obs.addr[tile]) == sorted(want), tile


def test_fa_banks_cli(capsys):
    from fa_sim.cli import main

    assert main(["banks", "--smem", "plain", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["smem"] == "plain" and set(js["classes"]) == {"LDSM", "LDS", "STS", "LDGSTS"}
    assert js["classes"]["LDSM"] == {"instructions": 576, "wavefronts": 18432, "ideal": 2304, "conflicts": 16128}
    assert js["phases"]["QK"]["LDSM"]["conflicts"] == 320 * 28
    assert main(["banks", "--compare"]) == 0
    out = capsys.readouterr().out
    assert "swizzled" in out and "padded" in out and "16128" in out


def test_counter_is_reusable_per_launch():
    counter = BankCounter()
    simulate(*Problem(seqlen=64).inputs(), causal=False, config=KernelConfig(smem="plain"), observers=[counter])
    assert counter.report().smem == "plain"
    assert counter.report().by_class()[C.LDSM].instructions == 36 * 4
