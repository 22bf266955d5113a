"""Issue 19's arithmetic options built and simulated, without a GPU: lazy_sum (the quad adds its
lanes' partial row sums once, in the epilogue) and poly_exp (eighths of the exponentials by a
degree-4 polynomial on the FMA pipe).

- Compile: sm_80 and sm_90, causal and not, no local memory on the tiles that do not spill without
  the option; the program (engine="program") refuses both options and names the PTX engine.
- SASS: lazy_sum issues fewer SHFL per round (two per row and round less), poly_exp fewer MUFU.EX2
  (an eighth of the scores each) and a FADD.RM (floor) per polynomial exponential instead.
- The PTX engine runs each option hazard-free, O within 1e-3 and LSE within 1e-5 of float64, and
  equal to the hand-written program where the program models the option's values: every checkpoint
  the option leaves alone (S before and after the mask, the row maxima, the shared-memory images,
  with lazy_sum also P and O's accumulators) is bit for bit the program's, and a schedule option on
  top (kv_stages) leaves every bit as it was.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("cuda.core")

from fa_hw.sass_counts import analyze, sass_round_counts  # noqa: E402
from fa_sim import simulate  # noqa: E402
from fa_sim.checkpoints import CHECKPOINTS, Checkpoint  # noqa: E402
from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.contract import KernelBuild  # noqa: E402
from fa_sim.contract.cubins import compile_build  # noqa: E402
from fa_sim.crosscheck import CheckpointRecorder  # noqa: E402
from fa_sim.observers.hazards import HazardChecker, format_hazards  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402
from fa_sim.reference import attention  # noqa: E402
from nvrtc_ahead import Kind  # noqa: E402

NO_SPILL = ["m64n64d64w4-swizzled-ls", "m64n64d64w4-swizzled-e4", "m128n128d64w4-swizzled-s2-ls-e1",
            "m128n128d64w4-swizzled-s2-e2", "m128n128d32w4-swizzled-s2-ls-e1", "m128n32d128w4-swizzled-s2-ls-e1"]
SIM = ["m64n64d64w4-swizzled-ls", "m64n64d64w4-swizzled-e4", "m64n32d32w4-padded-ls-e2",
       "m128n64d64w4-swizzled-ls-e1", "m64n64d128w4-plain-ls-e3"]
# What each option leaves alone (the program models these values) and what it changes.
UNCHANGED = {"lazy_sum": {Checkpoint.S_ACC, Checkpoint.S_MASKED, Checkpoint.ROW_MAX, Checkpoint.P_F16,
                          Checkpoint.O_ACC, Checkpoint.SQ, Checkpoint.SK, Checkpoint.SV},
             "poly_exp": {Checkpoint.S_ACC, Checkpoint.S_MASKED, Checkpoint.ROW_MAX, Checkpoint.SQ, Checkpoint.SK,
                          Checkpoint.SV}}


def spec(cfg: KernelConfig) -> KernelConfig:
    """The same tiles without any option: what the program runs."""
    return replace(cfg, kv_stages=1, q_in_regs=False, heavy_first=False, defer_pv=False, pingpong=False, min_blocks=0,
                   lazy_sum=False, poly_exp=0)


@pytest.mark.nvrtc_ahead(Kind.CUBIN, lambda tag, arch, causal: KernelBuild(KernelConfig.from_tag(tag), causal, arch))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("tag", NO_SPILL)
def test_options_compile_without_local_memory(tag, arch, causal):
    usage = compile_build(KernelBuild(KernelConfig.from_tag(tag), causal, arch)).usage
    assert usage.stack_bytes == 0 and usage.registers <= 255, usage


def test_tags_and_the_program_refusal():
    cfg = KernelConfig.from_tag("m128n64d64w4-swizzled-s2-ls-e2")
    assert (cfg.lazy_sum, cfg.poly_exp, cfg.kv_stages) == (True, 2, 2) and cfg.tag == "m128n64d64w4-swizzled-s2-ls-e2"
    assert cfg.schedule_options() == ["kv_stages=2", "lazy_sum=True", "poly_exp=2"]
    with pytest.raises(ValueError, match="poly_exp"):
        KernelConfig(poly_exp=5)
    q = np.zeros((1, 1, 16, 64), np.float16)
    for opt in (dict(lazy_sum=True), dict(poly_exp=1)):
        with pytest.raises(ValueError, match="engine='ptx'"):
            simulate(q, q, q, config=KernelConfig(**opt), engine="program")


def _round_counts(tag: str) -> dict:
    cfg = KernelConfig.from_tag(tag)
    ks = analyze(compile_build(KernelBuild(cfg, False, "sm_90")).sass())
    counts = sass_round_counts(ks, Problem(1, 1, cfg.block_m, 4 * cfg.block_n, False, 0.125, cfg))[1]
    return {k: v // cfg.n_warps for k, v in counts.items()}


def test_sass_per_round():
    base, lazy, poly = (_round_counts(t) for t in ("m128n64d64w4-swizzled", "m128n64d64w4-swizzled-ls",
                                                   "m128n64d64w4-swizzled-e2"))
    cfg = KernelConfig.from_tag("m128n64d64w4-swizzled")
    assert base["SHFL"] - lazy["SHFL"] == 2 * cfg.rows_per_thread  # the row sum's two shuffles per row
    assert base["HMMA"] == lazy["HMMA"] == poly["HMMA"]
    sass = compile_build(KernelBuild(KernelConfig.from_tag("m128n64d64w4-swizzled-e2"), False, "sm_90")).sass()
    seed_sass = compile_build(KernelBuild(cfg, False, "sm_90")).sass()
    assert "FADD.RM" in sass and "FMNMX.NAN" in sass and "FADD.RM" not in seed_sass
    mufu = sass.count("MUFU.EX2"), seed_sass.count("MUFU.EX2")
    assert mufu[0] < mufu[1], mufu


def _inputs(cfg: KernelConfig, seed: int = 0):
    rng = np.random.default_rng(seed)
    nq, nk = cfg.block_m + 19, 3 * cfg.block_n + 5  # tails in both
    q = rng.standard_normal((1, 2, nq, cfg.head_dim)).astype(np.float16)
    return (q, *(rng.standard_normal((1, 2, nk, cfg.head_dim)).astype(np.float16) for _ in range(2)))


def _run(q, k, v, causal, cfg, engine, n_ctas):
    hz, rec = HazardChecker(), CheckpointRecorder(range(n_ctas))
    res = simulate(q, k, v, causal=causal, config=cfg, engine=engine, observers=[hz, rec])
    return res, hz.report(), rec.buffer


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tag", SIM)
def test_ptx_engine_runs_the_option_hazard_free_and_like_the_program(tag, causal):
    cfg = KernelConfig.from_tag(tag)
    q, k, v = _inputs(cfg)
    n_ctas = 2 * -(-q.shape[2] // cfg.block_m)
    res, rep, buf = _run(q, k, v, causal, cfg, "ptx", n_ctas)
    ref, _, ref_buf = _run(q, k, v, causal, spec(cfg), "program", n_ctas)
    assert rep.ok, format_hazards(rep)
    o64, lse64 = attention(q, k, v, causal)
    assert np.linalg.norm(res.o - o64) / np.linalg.norm(o64) <= 1e-3
    assert np.max(np.abs(res.lse - lse64)) <= 1e-5
    unchanged = set.intersection(*[UNCHANGED[o] for o in ("lazy_sum", "poly_exp") if getattr(cfg, o)])
    same = {ck: np.array_equal(buf[:, i], ref_buf[:, i]) for i, ck in enumerate(CHECKPOINTS)}
    assert buf.any() and all(same[ck] for ck in unchanged), [ck.name for ck in unchanged if not same[ck]]
    assert not same[Checkpoint.ROW_SUM]  # both options change the row sums' bits
    staged, _, staged_buf = _run(q, k, v, causal, replace(cfg, kv_stages=2), "ptx", n_ctas)
    assert np.array_equal(staged.o.view(np.uint16), res.o.view(np.uint16))
    assert np.array_equal(staged.lse.view(np.uint32), res.lse.view(np.uint32))
