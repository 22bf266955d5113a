"""The hazard checker on the simulated kernel: the unmodified program is race-free in every
configuration; each synchronisation mutation (fa_sim.kernels.fa2_fwd.Mutation) is reported as
the exact hazard it creates (docs/hardware_facts.md: cp.async visibility, bar.sync)."""

import pytest

from fa_sim.config import KernelConfig
from fa_sim.events import Op
from fa_sim.kernels.labels import Site, Tile
from fa_sim.kernels.fa2_fwd import Mutation
from fa_sim.observers.hazards import HazardChecker, HazardKind, format_hazards
from fa_sim.observers.runs import Problem, run_hazards, simulate

K = HazardKind


def test_every_config_is_hazard_free():
    """All 78 configurations, with a tail block, causal and not, seqlen_k != seqlen_q for a third."""
    bad = []
    for i, cfg in enumerate(KernelConfig.family()):
        n = cfg.block_m + cfg.block_n + 7
        nk = n + cfg.block_n // 2 + 3 if i % 3 == 2 else None
        rep = run_hazards(cfg, Problem(seqlen=n, seqlen_k=nk, head_dim=cfg.head_dim, seed=i), causal=bool(i % 2))
        if not rep.ok:
            bad.append(f"{cfg.tag}: {format_hazards(rep)[:400]}")
    assert not bad, "\n".join(bad)


def test_batch_heads_and_several_waves():
    rep = run_hazards(KernelConfig(), Problem(batch=2, heads=3, seqlen=200, seed=3), causal=True)
    assert rep.ok, format_hazards(rep)


MUTATIONS = {
    Mutation(drop=frozenset({Site.WAIT_QK})): {(K.RAW_ASYNC, Tile.SQ), (K.RAW_ASYNC, Tile.SK)},
    Mutation(drop=frozenset({Site.BAR_QK})): {(K.RAW_NO_BARRIER, Tile.SQ), (K.RAW_NO_BARRIER, Tile.SK),
                                              (K.WAR, Tile.SV)},
    Mutation(drop=frozenset({Site.WAIT_PV})): {(K.RAW_ASYNC, Tile.SV)},
    Mutation(drop=frozenset({Site.BAR_PV})): {(K.RAW_NO_BARRIER, Tile.SV), (K.WAR, Tile.SK), (K.WAR, Tile.SO)},
    Mutation(drop=frozenset({Site.BAR_EPILOGUE})): {(K.RAW_NO_BARRIER, Tile.SO)},
    Mutation(late_wait=frozenset({Site.WAIT_QK})): {(K.RAW_ASYNC, Tile.SQ), (K.RAW_NO_BARRIER, Tile.SQ),
                                                    (K.RAW_NO_BARRIER, Tile.SK)},
    Mutation(late_wait=frozenset({Site.WAIT_PV})): {(K.RAW_ASYNC, Tile.SV), (K.RAW_NO_BARRIER, Tile.SV)},
}

# the first instruction each mutation breaks, as (op, tile of the access, label prefix)
FIRST = {
    Site.WAIT_QK: (K.RAW_ASYNC, Op.LDSM, "tCrQ"),
    Site.BAR_QK: (K.RAW_NO_BARRIER, Op.LDSM, "tCrQ"),
    Site.WAIT_PV: (K.RAW_ASYNC, Op.LDSM, "tCrV"),
    Site.BAR_PV: (K.WAR, Op.LDGSTS, "sK"),  # K[t+1] overwrites sK that QK read, before V is read
    Site.BAR_EPILOGUE: (K.RAW_NO_BARRIER, Op.LDS, "tOrO"),
}


def _name(m: Mutation) -> str:
    return "+".join([f"drop-{s.name}" for s in m.drop] + [f"late-{s.name}" for s in m.late_wait])


@pytest.mark.parametrize("mutation", list(MUTATIONS), ids=_name)
def test_mutation_reports_the_exact_hazard(mutation):
    rep = run_hazards(KernelConfig(), Problem(seqlen=128), mutation=mutation)
    assert rep.kinds() == MUTATIONS[mutation], format_hazards(rep)
    (site,) = mutation.drop | mutation.late_wait
    kind, op, label = FIRST[site]
    first = rep.hazards[0]
    assert (first.kind, first.op, first.cta, first.warp) == (kind, op, 0, 0)
    assert first.label.startswith(label) and first.other_thread is not None
    assert first.round == (-2 if site is Site.BAR_EPILOGUE else 0)


def test_mutation_on_another_config_with_tail():
    cfg = KernelConfig(block_m=128, block_n=32, head_dim=128, n_warps=8, smem="padded")
    rep = run_hazards(cfg, Problem(seqlen=150, head_dim=128), causal=True,
                      mutation=Mutation(drop=frozenset({Site.BAR_PV})))
    assert rep.kinds() == {(K.RAW_NO_BARRIER, Tile.SV), (K.WAR, Tile.SK), (K.WAR, Tile.SO)}


def test_checker_with_other_observers_and_report_text():
    from fa_sim.observers.banks import BankCounter

    checker, counter = HazardChecker(), BankCounter()
    simulate(*Problem(seqlen=96).inputs(), causal=False, config=KernelConfig(), observers=[checker, counter],
             mutation=Mutation(drop=frozenset({Site.BAR_EPILOGUE})))
    text = format_hazards(checker.report())
    assert "RAW_NO_BARRIER" in text and "ld.shared" in text and "vs thread" in text
    assert counter.report().total().conflicts == 0
