"""The kernel options of issue 11 built and simulated, without a GPU.

- Compile: NVRTC cubins for sm_80 and sm_90, causal and not, for options alone and combined over
  head dims, layouts and warps; no local memory except the builds listed as spilling; the seed's
  SASS is byte for byte the kernel before the options (tests/data/seed_sass_sha256.json, NVRTC 13.0);
  a PV mutation of a pipelined build is a compile error naming why.
- SASS per round (fa_hw.sass_counts, per warp): one barrier and one wait per round with
  kv_stages > 1, Q's ldmatrix in round 0 only with q_in_regs, PV's MMAs one round late with defer_pv.
- The PTX engine (fa_sim.simulate(engine="ptx")) runs every option: hazard-free, O within 1e-3 of
  float64, O, LSE and the whole checkpoint buffer bit for bit those of the spec-schedule twin,
  the same shared-memory bank counts (fewer Q ldmatrix with q_in_regs), simulator and SASS counts
  per round equal; synchronisation mutations are reported as hazards. The engine runs every build
  here: an instruction it does not support (fa_sim.ptx.ops.Unsupported) fails these tests, it never
  turns them into skips.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.core")

from fa_sim.contract.cubins import _nvrtc, compile_build  # noqa: E402
from fa_sim.contract import SEED_PATH, KernelBuild  # noqa: E402
from fa_sim.contract.cubin import _sections  # noqa: E402
from fa_hw.errors import CompileError  # noqa: E402
from fa_hw.sass_counts import analyze, per_warp_table, sass_round_counts  # noqa: E402
from fa_sim import simulate  # noqa: E402
from fa_sim.checkpoints import CHECKPOINTS  # noqa: E402
from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.crosscheck import CheckpointRecorder  # noqa: E402
from fa_sim.observers.banks import BankCounter, SmemClass  # noqa: E402
from fa_sim.observers.hazards import HazardChecker, HazardKind, format_hazards  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402
from fa_sim.contract.nvrtc import nvrtc_version  # noqa: E402
from fa_sim.reference import attention  # noqa: E402
from nvrtc_ahead import Kind  # noqa: E402

GOLDEN = json.loads((Path(__file__).parent / "data" / "seed_sass_sha256.json").read_text())
OPTIONS = ["m64n64d64w4-swizzled-s2", "m64n64d64w4-swizzled-s3", "m64n64d64w4-swizzled-qr", "m64n64d64w4-swizzled-hf",
           "m64n64d64w4-swizzled-s2-dp", "m64n64d64w4-swizzled-s3-qr-dp", "m64n32d32w4-padded-s3-qr-dp",
           "m128n64d32w8-plain-s2-hf-dp", "m128n32d128w4-padded-s2-dp", "m128n64d64w4-swizzled-s2-qr-hf-dp",
           "m256n64d64w8-swizzled-s2-pp", "m256n64d32w8-padded-s3-qr-hf-pp"]
SPILLING = {"m128n64d128w4-swizzled-s2", "m128n64d128w4-swizzled-s2-dp"}  # FlashAttention-2's d=128 tile, 255 regs
NO_SPILL = ["m128n64d64w4-swizzled-s2-dp", "m128n64d64w4-swizzled-s2-qr-dp", "m128n32d128w4-swizzled-s2-dp",
            "m128n32d128w4-swizzled-s3-dp", "m128n128d64w4-swizzled-s2", "m64n64d128w4-swizzled-s2-qr"]


def twin(cfg: KernelConfig) -> KernelConfig:
    return replace(cfg, kv_stages=1, q_in_regs=False, heavy_first=False, defer_pv=False, pingpong=False, min_blocks=0)


# ---- compile ----------------------------------------------------------------------------------------
def _text_sha(cubin: bytes) -> str:
    sec = next(s for s in _sections(cubin) if s.name == ".text.fa2_fwd_kernel")
    return hashlib.sha256(cubin[sec.offset: sec.offset + sec.size]).hexdigest()


@pytest.mark.parametrize("key", sorted(GOLDEN["sha256"]))
def test_seed_sass_is_the_kernel_before_the_options(key):
    if "{}.{}".format(*nvrtc_version()) != GOLDEN["nvrtc"]:
        pytest.skip(f"the golden SASS is NVRTC {GOLDEN['nvrtc']}'s")
    causal, arch, ck = key.split()
    build = KernelBuild(KernelConfig(), causal == "causal=True", arch, ck == "checkpoints=True")
    assert _text_sha(compile_build(build).cubin) == GOLDEN["sha256"][key]  # the cache key is source + NVRTC


@pytest.mark.nvrtc_ahead(Kind.CUBIN, lambda tag, arch, causal: KernelBuild(KernelConfig.from_tag(tag), causal, arch))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("tag", OPTIONS + NO_SPILL + sorted(SPILLING))
def test_options_compile(tag, arch, causal):
    ck = compile_build(KernelBuild(KernelConfig.from_tag(tag), causal, arch))
    assert 0 < ck.usage.registers <= 255
    assert (ck.usage.stack_bytes > 0) == (tag in SPILLING), ck.usage


@pytest.mark.parametrize("tag", ["m64n64d64w4-swizzled-s2-qr-dp", "m128n32d128w4-padded-s3-hf-dp"])
def test_options_debug_build_compiles(tag):
    for arch in ("sm_80", "sm_90"):
        assert compile_build(KernelBuild(KernelConfig.from_tag(tag), True, arch, True)).usage.registers <= 255


@pytest.mark.parametrize("macro", ["FA_DROP_WAIT_PV", "FA_DROP_BAR_PV", "FA_LATE_WAIT_PV"])
def test_pv_mutations_of_a_pipelined_build_are_compile_errors(macro):
    build = KernelBuild(KernelConfig(kv_stages=2), arch="sm_90")
    with pytest.raises(CompileError, match="FA_KV_STAGES > 1 waits and synchronises once per round"):
        _nvrtc(f"#define {macro} 1\n" + SEED_PATH.read_text(), build)


# ---- SASS per round -----------------------------------------------------------------------------------
@pytest.mark.parametrize("tag", ["m64n64d64w4-swizzled-s2", "m128n64d64w4-swizzled-s3-qr-dp", "m128n32d128w4-swizzled-s2-dp"])
def test_sass_rounds_follow_the_schedule(tag):
    cfg = KernelConfig.from_tag(tag)
    prob = Problem(1, 1, cfg.block_m, 4 * cfg.block_n, False, 0.125, cfg)
    sass = sass_round_counts(analyze(compile_build(KernelBuild(cfg, False, "sm_90")).sass()), prob)
    w = cfg.n_warps
    qk = cfg.m_repeats * cfg.s_n_tiles * cfg.qk_k_segments
    pv = cfg.m_repeats * cfg.o_n_tiles * cfg.pv_k_segments
    for t in range(4):
        c = {k: n // w for k, n in sass[t].items()}
        assert (c["BAR"], c["DEPBAR"], c["LDGDEPBAR"]) == (1, 1, 1)
        q_ldsm = cfg.m_repeats * cfg.qk_k_segments * (t == 0 or not cfg.q_in_regs)
        assert c["LDSM.M88"] == q_ldsm + cfg.qk_k_segments * cfg.s_n_tiles // 2
        assert c["HMMA"] == qk + pv * (t > 0 or not cfg.defer_pv)
        assert c.get("LDSM.MT88", 0) == cfg.pv_k_segments * cfg.o_n_tiles // 2 * (t > 0 or not cfg.defer_pv)


# ---- the PTX engine ----------------------------------------------------------------------------------
def ptx(q, k, v, **kw):
    return simulate(q, k, v, engine="ptx", progress=False, **kw)


def _inputs(cfg, seed=1, heads=2, nq=None, nk=None):
    rng = np.random.default_rng(seed)
    nq = nq or cfg.block_m + cfg.block_n + 7
    nk = nk or 3 * cfg.block_n + 5
    q = rng.standard_normal((1, heads, nq, cfg.head_dim)).astype(np.float16)
    return (q, *(rng.standard_normal((1, heads, nk, cfg.head_dim)).astype(np.float16) for _ in range(2)))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tag", OPTIONS)
def test_ptx_engine_runs_every_option_like_its_twin(tag, causal):
    cfg = KernelConfig.from_tag(tag)
    q, k, v = _inputs(cfg)
    n_ctas = 2 * -(-q.shape[2] // cfg.block_m)
    runs = []
    for c in (cfg, twin(cfg)):
        hz, banks, rec = HazardChecker(), BankCounter(), CheckpointRecorder(range(n_ctas))
        runs.append((ptx(q, k, v, causal=causal, config=c, observers=[hz, banks, rec]), hz.report(), banks, rec))
    (res, rep, banks, rec), (res0, _, banks0, rec0) = runs
    assert rep.ok, format_hazards(rep)
    o_ref, lse_ref = attention(q, k, v, causal)
    assert np.linalg.norm(res.o - o_ref) / np.linalg.norm(o_ref) <= 1e-3
    assert np.array_equal(res.o.view(np.uint16), res0.o.view(np.uint16))
    assert np.array_equal(res.lse.view(np.uint32), res0.lse.view(np.uint32))
    assert rec.buffer.any() and np.array_equal(rec.buffer, rec0.buffer), [
        ck.name for i, ck in enumerate(CHECKPOINTS) if not np.array_equal(rec.buffer[:, i], rec0.buffer[:, i])]
    mine, spec = banks.report().by_class(), banks0.report().by_class()
    # the debug build zeroes a padded layout's shared memory first (st.shared.b32, one wavefront per
    # warp instruction): kv_stages > 1 has more of it
    zeroed = (cfg.smem_bytes - twin(cfg).smem_bytes) // 4 // 32 * n_ctas if cfg.smem.value == "padded" else 0
    assert (mine[SmemClass.STS].instructions - spec[SmemClass.STS].instructions,
            mine[SmemClass.STS].wavefronts - spec[SmemClass.STS].wavefronts) == (zeroed, zeroed)
    for cls in SmemClass:
        assert mine[cls].conflicts == spec[cls].conflicts, cls
        if cls not in (SmemClass.STS, SmemClass.LDSM) or (cls is SmemClass.LDSM and not cfg.q_in_regs):
            assert (mine[cls].instructions, mine[cls].wavefronts) == (spec[cls].instructions, spec[cls].wavefronts), cls
    if cfg.q_in_regs:  # Q's ldmatrix once per CTA instead of once per round
        prob = Problem(1, 2, q.shape[2], k.shape[2], causal, res.scale, cfg)
        rounds = prob.n_block_max(np.arange(prob.n_m_blocks)).sum() * 2
        saved = (rounds - prob.n_ctas) * cfg.n_warps * cfg.m_repeats * cfg.qk_k_segments
        assert spec[SmemClass.LDSM].instructions - mine[SmemClass.LDSM].instructions == saved


@pytest.mark.parametrize("tag", ["m64n64d64w4-swizzled-s2", "m128n64d64w4-swizzled-s3-qr-dp"])
def test_simulator_and_sass_counts_agree(tag):
    table = per_warp_table(KernelConfig.from_tag(tag), False, "sm_90")
    assert "sim / SASS agree" in table, table


K = HazardKind
MUTATIONS = {  # macro -> (hazard kinds it must produce in a pipelined build, kinds it may add)
    "FA_DROP_WAIT_QK": ({K.RAW_ASYNC}, {K.WAW}),  # a stage refilled while its last copy never retired
    "FA_DROP_BAR_QK": ({K.RAW_NO_BARRIER, K.WAR}, set()),
    "FA_LATE_WAIT_QK": ({K.RAW_ASYNC, K.RAW_NO_BARRIER}, set()),
    "FA_DROP_BAR_EPILOGUE": ({K.RAW_NO_BARRIER}, set()),
}


@pytest.mark.parametrize("macro", sorted(MUTATIONS))
@pytest.mark.parametrize("tag", ["m64n64d64w4-swizzled-s2-dp", "m64n64d64w4-swizzled-s3-qr"])
def test_mutations_of_pipelined_builds_are_hazards(tag, macro, tmp_path):
    path = tmp_path / "fa2_mutated.cu"
    path.write_text(f"#define {macro} 1\n" + SEED_PATH.read_text())
    cfg = KernelConfig.from_tag(tag)
    q, k, v = _inputs(cfg, heads=1, nq=64, nk=256)
    hz = HazardChecker()
    ptx(q, k, v, config=cfg, kernel=path, observers=[hz])
    rep = hz.report()
    must, may = MUTATIONS[macro]
    assert must <= {kind for kind, _ in rep.kinds()} <= must | may, format_hazards(rep)
    if macro == "FA_DROP_BAR_EPILOGUE":
        assert {str(where) for _, where in rep.kinds()} == {"sO"}
