"""The hazard checker on the kernel's memory skeleton built from closed-form maps (synthetic.py),
and on hand-made faulty instructions (docs/hardware_facts.md: cp.async visibility, bar.sync)."""

import dataclasses

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.errors import KernelFault
from fa_sim.events import Op
from fa_sim.kernels import Problem, launch_info
from fa_sim.kernels.labels import Phase, Site, Tile
from fa_sim.memory import GlobalMemory
import synthetic  # tests/synthetic.py: the memory instructions from the spec's closed forms
from fa_sim.observers.hazards import HazardChecker, HazardKind, format_hazards

K = HazardKind


def check(cfg, events, seqlen=128):
    hc = HazardChecker()
    hc.on_launch(launch_info(Problem(1, 1, seqlen, seqlen, False, 0.125, cfg)))
    for ev in events:
        if hc.wants(ev.op, ev.phase, ev.round):
            hc.on_instr(ev)
    return hc.report()


@pytest.mark.parametrize("cfg", KernelConfig.family()[::5], ids=lambda c: c.tag)
def test_clean_skeleton_has_no_hazard(cfg):
    rep = check(cfg, synthetic.memory_program(cfg, 3 * cfg.block_n - 5), 3 * cfg.block_n - 5)
    assert rep.ok, format_hazards(rep)


# Each mutation of the synchronisation (SCHEDULE.md sites) and the exact hazards it must produce.
MUTATIONS = {
    ("drop", Site.BAR_QK): {(K.RAW_NO_BARRIER, Tile.SQ), (K.RAW_NO_BARRIER, Tile.SK), (K.WAR, Tile.SV)},
    ("drop", Site.BAR_PV): {(K.RAW_NO_BARRIER, Tile.SV), (K.WAR, Tile.SK), (K.WAR, Tile.SO)},
    ("drop", Site.BAR_EPILOGUE): {(K.RAW_NO_BARRIER, Tile.SO)},
    ("late", Site.WAIT_QK): {(K.RAW_ASYNC, Tile.SQ), (K.RAW_NO_BARRIER, Tile.SQ), (K.RAW_NO_BARRIER, Tile.SK)},
    ("late", Site.WAIT_PV): {(K.RAW_ASYNC, Tile.SV), (K.RAW_NO_BARRIER, Tile.SV)},
}


@pytest.mark.parametrize("how,site", list(MUTATIONS), ids=lambda x: getattr(x, "name", x))
def test_mutation_reports_the_exact_hazard(how, site):
    cfg = KernelConfig()
    kw = {"drop": frozenset({site})} if how == "drop" else {"late_wait": frozenset({site})}
    rep = check(cfg, synthetic.memory_program(cfg, 128, **kw))
    assert rep.kinds() == MUTATIONS[(how, site)], format_hazards(rep)


def test_first_hazard_names_instruction_lane_and_writer():
    """Dropping the barrier before QK: warp 0 lane 0's first ldmatrix of sQ reads row 0, which
    thread 0 copied (it is its own), so the first report is about a row another thread wrote."""
    cfg = KernelConfig()
    rep = check(cfg, synthetic.memory_program(cfg, 128, drop=frozenset({Site.BAR_QK})))
    h = rep.hazards[0]
    assert (h.kind, h.op, h.round, h.cta, h.warp, h.region) == (K.RAW_NO_BARRIER, Op.LDSM, 0, 0, 0, Tile.SQ)
    # lane h.lane points at tile row h.row, col h.col; the copy map says thread 8*row + col/8 wrote it
    assert h.other_thread == 8 * (h.row % 16) + h.col // 8 and h.other_thread != h.lane
    assert h.addr == 2 * cfg.smem_offset(h.row, h.col)
    text = format_hazards(rep)
    assert f"lane {h.lane:>2}" in text and "RAW_NO_BARRIER" in text and "ldmatrix" in text


def test_writer_reading_its_own_cp_async_before_wait():
    cfg = KernelConfig()
    cp = synthetic.copy_tile(cfg, Tile.SQ, 64, Phase.Q_LOAD)
    commit = synthetic.sync_event(cfg, Op.LDGDEPBAR, Phase.Q_LOAD, -1, 1)
    # thread 0 copies sQ row 0 chunk 0 and reads it back itself (ld.shared) before waiting
    rd = synthetic.lds_o(cfg)
    rd = dataclasses.replace(rd, smem=dataclasses.replace(rd.smem, region=Tile.SQ))
    rep = check(cfg, [cp, commit, rd])
    assert (K.RAW_ASYNC, Tile.SQ) in rep.kinds()
    own = [h for h in rep.hazards if h.warp == 0 and h.lane == 0]
    assert own and own[0].other_thread == 0
    wait = synthetic.sync_event(cfg, Op.DEPBAR, Phase.Q_LOAD, -1, 2, wait_n=0)
    bar = synthetic.sync_event(cfg, Op.BAR, Phase.Q_LOAD, -1, 3)
    assert check(cfg, [cp, commit, wait, bar, rd]).ok
    # wait_group 1 with one group in flight does not retire it
    wait1 = dataclasses.replace(wait, wait_n=1)
    assert (K.RAW_ASYNC, Tile.SQ) in check(cfg, [cp, commit, wait1, bar, rd]).kinds()


def test_out_of_bounds_and_misaligned_shared():
    cfg = KernelConfig()
    ev = synthetic.ldsm_k(cfg, 0)
    addr = np.array(ev.smem.addr)
    addr[0, 0, 0, 3] = cfg.smem_bytes  # one row past the allocation
    addr[0, 0, 1, 5] += 8  # not 16-byte aligned
    ev = dataclasses.replace(ev, smem=dataclasses.replace(ev.smem, addr=addr))
    setup = list(synthetic.memory_program(cfg, 64))[:11]  # copies, commit, wait, barrier, V copy...
    rep = check(cfg, setup + [ev])
    oob = [h for h in rep.hazards if h.kind is K.OOB_SHARED]
    mis = [h for h in rep.hazards if h.kind is K.MISALIGNED]
    assert [(h.warp, h.lane, h.addr) for h in oob] == [(0, 3, cfg.smem_bytes)]
    assert [(h.warp, h.lane) for h in mis] == [(1, 5)]


def test_global_access_outside_every_buffer_is_a_fault():
    """Global addresses are checked by the machine's memory (an illegal address on hardware)."""
    mem = GlobalMemory()
    k = mem.alloc("k", np.zeros((40, 64), np.uint16))
    inside = k.base + 128 * np.arange(40)
    assert mem.gather(inside, 16, np.ones(40, bool)).shape == (40, 16)
    with pytest.raises(KernelFault, match="outside every buffer.*'k'"):
        mem.gather(k.base + 128 * np.arange(41), 16, np.ones(41, bool))
    with pytest.raises(KernelFault, match="misaligned"):
        mem.gather(inside + 8, 16, np.ones(40, bool))
    # predicated-off lanes are not checked (cp.async with src-size 0 reads nothing)
    off = np.arange(41) < 40
    assert not mem.gather(k.base + 128 * np.arange(41), 16, off)[40].any()


def test_waw_between_threads_without_barrier():
    cfg = KernelConfig()
    a = synthetic.sts_o(cfg)
    b = synthetic.sts_o(cfg)
    addr = np.array(b.smem.addr)
    addr[:, :, 0, :] = np.roll(addr[:, :, 0, :], 1, axis=-1)  # warp 0 lanes write their neighbour's word
    b = dataclasses.replace(b, smem=dataclasses.replace(b.smem, addr=addr))
    assert {k for k, _ in check(cfg, [a, b]).kinds()} == {K.WAW}
    bar = synthetic.sync_event(cfg, Op.BAR, Phase.EPILOGUE, -2, 1)
    assert check(cfg, [a, bar, b]).ok


def test_counts_all_but_keeps_limit():
    cfg = KernelConfig()
    hc = HazardChecker(limit=5)
    hc.on_launch(launch_info(Problem(1, 1, 128, 128, False, 0.125, cfg)))
    for ev in synthetic.memory_program(cfg, 128, drop=frozenset({Site.BAR_EPILOGUE})):
        hc.on_instr(ev)
    rep = hc.report()
    assert len(rep.hazards) == 5 and rep.total > 5
    assert sum(rep.counts.values()) == rep.total
    assert rep.to_json()["total"] == rep.total


def test_cp_async_alignment_is_its_copy_size():
    """cp.async's shared destination is aligned to its cp-size (the event's width: 4, 8 or 16 bytes;
    PTX ISA, cp.async), not always to 16: a 16-byte copy 8 bytes off is misaligned, a 4-byte one
    (fa2_bwd.cu's lse_async copies of LSE and D) 4 bytes off is not."""
    cfg = KernelConfig()
    prog = list(synthetic.memory_program(cfg, 64))
    i = next(j for j, e in enumerate(prog) if e.op is Op.LDGSTS)
    cp = prog[i]

    def shifted(ev, by, width=None):
        addr = np.array(ev.smem.addr)
        addr[0, 0, 0, 5] += by
        smem = dataclasses.replace(ev.smem, addr=addr, **({} if width is None else {"width": width}))
        return dataclasses.replace(ev, smem=smem)

    def misaligned(ev):
        return [(h.warp, h.lane) for h in check(cfg, prog[:i] + [ev]).hazards if h.kind is K.MISALIGNED]

    assert misaligned(cp) == []
    assert misaligned(shifted(cp, 8)) == [(0, 5)]
    assert misaligned(shifted(cp, 4, width=4)) == []
    assert misaligned(shifted(cp, 2, width=4)) == [(0, 5)]
