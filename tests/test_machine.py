"""fa_sim.machine: counting, masks, cp.async landing at wait_group, observer plumbing."""

import numpy as np
import pytest

import fa_sim
from fa_sim import machine as machine_mod
from fa_sim.config import KernelConfig
from fa_sim.checkpoints import Checkpoint
from fa_sim.events import Op
from fa_sim.errors import KernelFault
from fa_sim.hub import Hub
from fa_sim.kernels.fa2_fwd import load_tile
from fa_sim.kernels.labels import Phase, Tile, tile_base
from fa_sim.kernels.plan import kernel_plan
from fa_sim.machine import Machine
from fa_sim.memory import GlobalMemory

CFG = KernelConfig()


def _machine(n_ctas=2, seqlen=64, observers=()):
    """A machine with one CTA per batch-head; q (= k) in global memory as [C, seqlen, 64]."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((n_ctas, seqlen, 64)).astype(np.float16).view(np.uint16)
    gm = GlobalMemory()
    m = Machine(CFG.n_warps, CFG.smem_bytes, gm, np.arange(n_ctas), Hub(observers))
    m.q_base, m.k_base = gm.alloc("q", q).base, gm.alloc("k", q.copy()).base
    return m, q


def _load(m, instr, lanes, base, row0, seqlen=64):
    load_tile(m, instr, lanes, base, np.arange(m.n_ctas), np.asarray(row0), seqlen, 64)


def _sq_image(m):
    return m.smem_halves(tile_base(CFG, Tile.SQ), CFG.tile_halves(64))


def _logical(image):
    """Undo the swizzle: [C, 64*64] physical halves -> [C, 64, 64] logical tile."""
    r, c = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    return image[:, CFG.smem_offset(r, c)]


def test_cp_async_bytes_land_at_the_wait_not_before():
    m, q = _machine()
    plan = kernel_plan(CFG)
    _load(m, plan.sites.cp_q, plan.copy_q, m.q_base, np.zeros(2, np.int64))
    assert (_sq_image(m) == 0).all()  # issued, not visible
    m.commit_group(plan.sites.commit_prologue)
    m.wait_group(plan.sites.wait_qk, 0)
    np.testing.assert_array_equal(_logical(_sq_image(m)), q)


def test_wait_group_1_leaves_the_most_recent_group_pending():
    m, q = _machine()
    plan = kernel_plan(CFG)
    s = plan.sites
    _load(m, s.cp_q, plan.copy_q, m.q_base, np.zeros(2, np.int64))
    m.commit_group(s.commit_prologue)
    _load(m, s.cp_k0, plan.copy_kv[0], m.k_base, np.zeros(2, np.int64))
    m.commit_group(s.commit_prologue)
    m.wait_group(s.wait_qk, 1)
    np.testing.assert_array_equal(_logical(_sq_image(m)), q)
    sk = m.smem_halves(CFG.sk_offset_bytes, CFG.tile_halves(64))
    assert (sk == 0).all()
    m.wait_group(s.wait_qk, 0)
    assert (sk != 0).any()


def test_rows_past_the_sequence_are_zero_filled():
    m, q = _machine(seqlen=64)
    plan = kernel_plan(CFG)
    _load(m, plan.sites.cp_q, plan.copy_q, m.q_base, np.array([0, 40]))  # CTA 1: rows 40..103
    m.commit_group(plan.sites.commit_prologue)
    m.wait_group(plan.sites.wait_qk, 0)
    tile = _logical(_sq_image(m))
    np.testing.assert_array_equal(tile[1, :24], q[1, 40:])
    assert (tile[1, 24:] == 0).all()


def test_counts_are_repeat_times_warps_with_an_active_lane():
    m, _ = _machine(n_ctas=3)
    plan = kernel_plan(CFG)
    m.round = 0
    m.set_live(2)  # CTA 2 has left the loop
    m.ldmatrix(plan.sites.ldsm_k[0], plan.ldsm_k[0].smem, 4, False, "tCrK")  # R = 4
    assert m.hub.counts[(Op.LDSM, Phase.QK, 0)] == 4 * 4 * 2
    lane_mask = np.zeros((2, 4, 32), bool)
    lane_mask[0, 1, 3] = True  # one lane of one warp
    with m.branch(lane_mask) as taken:
        assert taken
        m.commit_group(plan.sites.commit_v)
    assert m.hub.counts[(Op.LDGDEPBAR, Phase.V_LOAD, 0)] == 1
    with m.branch(np.zeros(2, bool)) as taken:
        assert not taken
        m.commit_group(plan.sites.commit_v)
    assert m.hub.counts[(Op.LDGDEPBAR, Phase.V_LOAD, 0)] == 1
    m.reg(plan.sites.mask, {}, {})
    assert all(op is not Op.REG for op, _, _ in m.hub.counts)


def test_partially_arrived_barrier_is_rejected():
    m, _ = _machine()
    lanes = np.ones((2, 4, 32), bool)
    lanes[0, 0, 0] = False
    with m.branch(lanes), pytest.raises(KernelFault, match="bar.sync"):
        m.bar_sync(kernel_plan(CFG).sites.bar_qk)


class _Recorder:
    def __init__(self, ops=None, checkpoints=()):
        self.ops, self.cks = ops, set(checkpoints)
        self.events, self.checkpoints, self.calls = [], [], []

    def wants(self, op, phase, round):
        return self.ops is None or op in self.ops

    def wants_checkpoint(self, ck, round):
        return ck in self.cks

    def on_launch(self, info):
        self.calls.append("launch")

    def on_instr(self, ev):
        self.events.append(ev)

    def on_checkpoint(self, ev):
        self.checkpoints.append(ev)

    def on_finish(self):
        self.calls.append("finish")


def _qkv(n=128, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 1, n, 64)).astype(np.float16) for _ in range(3)]


def test_no_event_is_built_without_an_interested_observer(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("an InstrEvent was built")
    monkeypatch.setattr(machine_mod, "InstrEvent", boom)
    fa_sim.simulate(*_qkv())
    fa_sim.simulate(*_qkv(), observers=[_Recorder(ops=set())])


def test_filters_and_hooks():
    rec = _Recorder(ops={Op.HMMA}, checkpoints={Checkpoint.ROW_MAX})
    fa_sim.simulate(*_qkv(), observers=[rec])
    assert rec.calls == ["launch", "finish"]
    assert {e.op for e in rec.events} == {Op.HMMA}
    assert len(rec.events) == 2 * 8  # one wave of 2 CTAs, 2 rounds x (4 QK + 4 PV) call sites
    assert {c.checkpoint for c in rec.checkpoints} == {Checkpoint.ROW_MAX}
    ev = rec.events[0]
    assert ev.regs_in["a"].shape == (8, 2, 4, 32, 4) and ev.regs_out["d"].shape == (8, 2, 4, 32, 4)
    assert ev.repeat == 8 and ev.cta.tolist() == [0, 1]


def test_finished_ctas_are_inactive_in_events():
    rec = _Recorder(ops={Op.LDSM})
    q, k, v = _qkv(n=128)
    fa_sim.simulate(q, k, v, causal=True, observers=[rec])
    last = [e for e in rec.events if e.round == 1]
    assert last, "round 1 runs for the second Q block"
    for e in last:
        ctas = e.cta.tolist()
        assert e.active[ctas.index(1)].all() and not e.active[ctas.index(0)].any()
        assert not e.smem.mask[:, ctas.index(0)].any()


def test_a_joined_machine_lands_the_copies_of_the_ctas_that_issued_them():
    """A wave joined from parts (fa_sim/ptx/waves.py) where only some parts have copies in flight:
    the wait lands those CTAs' bytes (each CTA whole: the static pattern, in those CTAs) and
    leaves the others' shared memory as it was."""
    plan = kernel_plan(CFG)
    m, q = _machine(n_ctas=2)
    other, _ = _machine(n_ctas=1)
    other.smem[...] = 7
    _load(m, plan.sites.cp_q, plan.copy_q, m.q_base, np.zeros(2, np.int64))
    m.commit_group(plan.sites.commit_prologue)
    joined = Machine.joined([m, other])
    joined.wait_group(plan.sites.wait_qk, 0)
    np.testing.assert_array_equal(_logical(_sq_image(joined))[:2], q)
    assert (joined.smem[2] == 7).all()
    assert not joined._flights
