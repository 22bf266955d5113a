"""Kernel-level facts about the shared-memory tiles, from whole simulated launches: the padded
layout's LDGSTS cost (and its name: excess wavefronts, not bank conflicts), and the zero fill of
tile rows past the end of the sequence in sQ, sK and sV."""

import json

import numpy as np
import pytest

from fa_sim.checkpoints import CheckpointLayout
from fa_sim.cli import main
from fa_sim.config import KernelConfig
from fa_sim.crosscheck import CheckpointRecorder
from fa_sim.checkpoints import Checkpoint
from fa_sim.kernels import Problem
from fa_sim.observers.banks import BankCounter, SmemClass
from fa_sim.observers.runs import simulate
from fa_sim.reference import random_inputs


def _banks(cfg, b, h, nq, nk):
    counter = BankCounter()
    simulate(*random_inputs(b, h, nq, nk, cfg.head_dim, 0), causal=False, config=cfg, observers=[counter])
    return counter.report()


@pytest.mark.parametrize("b, h, nq, nk, ncu", [(1, 2, 256, 256, (1152, 12096)), (1, 1, 128, 128, None),
                                                (1, 1, 100, 77, None)])
def test_padded_ldgsts_costs_10_5_wavefronts_per_instruction(b, h, nq, nk, ncu):
    """Seed tile, padded: rows shifted by 16 bytes make every cp.async cost 10 or 11 wavefronts
    (half the warps each) instead of 4. Nsight Compute on the H200 counted 1,152 LDGSTS and 12,096
    wavefronts for (1, 2, 256, 64) (README, "Bank counters against Nsight Compute"). Rows past the
    sequence are zero-filled copies and cost the same, except the copies of a K/V tail tile whose
    lanes mix copied and zero-filled rows (one per K and one per V tail tile and warp pass here):
    Nsight Compute on the H100 counted more wavefronts for those (docs/hardware_facts.md), which
    fa_sim.observers.banks.mixed_zero_fill_wavefronts adds."""
    rep = _banks(KernelConfig(smem="padded"), b, h, nq, nk)
    c = rep.by_class()[SmemClass.LDGSTS]
    per = rep.per_instruction[SmemClass.LDGSTS]
    mixed = {w: n for w, n in per.items() if w > 11}
    assert set(per) - set(mixed) <= {10, 11} and c.ideal == 4 * c.instructions
    assert sum(mixed.values()) == (4 if nk % 64 else 0)
    if not mixed:
        assert c.wavefronts == 10.5 * c.instructions and per == {10: c.instructions // 2, 11: c.instructions // 2}
    if ncu is not None:
        assert (c.instructions, c.wavefronts) == ncu
    for smem in ("swizzled", "plain"):  # whole 128-byte rows: the ideal 4, but for the mixed tail copies
        other = _banks(KernelConfig(smem=smem), b, h, nq, nk)
        o = other.by_class()[SmemClass.LDGSTS]
        extra = {w: n for w, n in other.per_instruction[SmemClass.LDGSTS].items() if w != 4}
        assert sum(extra.values()) == sum(mixed.values())
        assert o.wavefronts == 4 * o.instructions + sum((w - 4) * n for w, n in extra.items())


def test_ldgsts_excess_is_not_called_a_conflict(capsys):
    assert main(["banks", "--smem", "padded", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["classes"]["LDGSTS"] == {"instructions": 160, "wavefronts": 1680, "ideal": 640, "excess_wavefronts": 1040}
    assert "conflicts" not in json.dumps({k: v.get("LDGSTS", {}) for k, v in js["phases"].items()})
    assert js["classes"]["LDSM"]["conflicts"] == 0 and js["total"]["conflicts"] == 0
    assert main(["banks", "--compare"]) == 0
    out = capsys.readouterr().out
    ldgsts = next(ln for ln in out.splitlines() if ln.startswith("LDGSTS (*)"))
    assert ldgsts.split() == ["LDGSTS", "(*)", "160", "640", "640", "-", "|", "160", "640", "640", "-", "|",
                              "160", "1680", "640", "-"]
    assert "  padded     1040 (10.50 wavefronts per instruction, ideal 4.00)" in out
    assert "Nsight Compute counts no bank conflicts for it" in out


CONFIGS = [KernelConfig(), KernelConfig(smem="plain"), KernelConfig(smem="padded"),
           KernelConfig(block_m=128, block_n=32, head_dim=128, n_warps=8, smem="padded"),
           KernelConfig(head_dim=32, block_n=128, smem="swizzled")]


def _tiles(cfg, q, k, v, causal):
    """Logical [C, round, rows, d] images of sQ, sK, sV at their checkpoints, every CTA."""
    b, h, nq, d = q.shape
    prob = Problem(b, h, nq, k.shape[2], causal, 1.0, cfg)
    rec = CheckpointRecorder(range(prob.n_ctas))
    simulate(q, k, v, causal=causal, config=cfg, observers=[rec])
    layout = CheckpointLayout(cfg, prob.n_rounds)
    out = {}
    for ck, rows in ((Checkpoint.SQ, cfg.block_m), (Checkpoint.SK, cfg.block_n), (Checkpoint.SV, cfg.block_n)):
        slots = rec.buffer[:, CheckpointLayout.index(ck)]  # [C, round, T, words]
        phys = np.stack([layout.threads_to_tile(ck, slots[:, t]) for t in range(prob.n_rounds)], 1)
        r, c = np.indices((rows, d))
        out[ck] = phys[..., cfg.smem_offset(r, c)].view(np.float16)  # [C, round, rows, d]
    return prob, out


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.tag)
@pytest.mark.parametrize("nq, nk, causal", [(100, 77, False), (130, 200, True), (37, 45, False)])
def test_rows_past_the_sequence_land_as_zeros(cfg, nq, nk, causal):
    """Every round of every CTA: a tile row holds its Q/K/V row while it exists and zeros past
    Nq or Nk (cp.async with src-size 0; SCHEDULE.md), in every layout."""
    d = cfg.head_dim
    q, k, v = (x + np.float16(0.5) * np.sign(x) for x in random_inputs(1, 2, nq, nk, d, 3))  # no zeros
    prob, tiles = _tiles(cfg, q, k, v, causal)
    for cta in range(prob.n_ctas):
        m_block, bh = cta % prob.n_m_blocks, cta // prob.n_m_blocks
        rows = m_block * cfg.block_m + np.arange(cfg.block_m)
        want_q = np.where((rows < nq)[:, None], q[0, bh][np.minimum(rows, nq - 1)], 0)
        np.testing.assert_array_equal(tiles[Checkpoint.SQ][cta, 0], want_q)
        for t in range(int(prob.n_block_max(np.array([m_block]))[0])):
            keys = t * cfg.block_n + np.arange(cfg.block_n)
            for ck, x in ((Checkpoint.SK, k), (Checkpoint.SV, v)):
                want = np.where((keys < nk)[:, None], x[0, bh][np.minimum(keys, nk - 1)], 0)
                np.testing.assert_array_equal(tiles[ck][cta, t], want, err_msg=f"{ck} cta {cta} round {t}")
        tail = rows >= nq
        if tail.any():
            assert (tiles[Checkpoint.SQ][cta, 0][tail] == 0).all() and (tiles[Checkpoint.SQ][cta, 0][~tail] != 0).all()
