"""Issue 38's head_dim 96, 160, 192 and 256 in the forward kernel (docs/head_dims.md).

CPU: the PTX engine (fa2_fwd.cu as NVRTC compiles it) runs each new head_dim on shapes with tails,
causal and not, bit for bit equal to the hand-written program and within fa_sim.accuracy's bounds
of float64, hazard-free; both front ends' checkpoints agree (what `fa compare` checks); the layout
checks (copy, swizzle atoms, ldmatrix, O staging) pass for every layout; configs past the register
or shared-memory limits and head dims outside the family are refused in one line before any work;
the backward pass refuses 256 (docs/backward.md). Shared memory per CTA is the target's (sm_80 163 KiB,
sm_90 227 KiB): a tile that fits only sm_90 is refused for sm_80 in one line by every backend that
has a target (compile_build, fa time --gpu), and runs on the PTX engine bit for bit as the program.
GPU (marked gpu, skipped without one): fa_hw.forward at each new head_dim with tails, bit-identical
to fa_sim.simulate(engine="ptx", mma_model="h200") and within the bounds of float64; likewise the
sm_90-only tiles of fa_hw.tuned.BIG_TILES (refused in one line on a GPU whose arch they do not fit).
"""

from __future__ import annotations

import numpy as np
import pytest

from fa_hw.tuned import BIG_TILES
from fa_sim import KernelConfig, simulate
from fa_sim.accuracy import measure
from fa_sim.cli import main
from fa_sim.config import HEAD_DIMS, REGISTER_ACCUMULATORS_MAX, SMEM_LIMIT_BYTES, smem_limit_bytes
from fa_sim.layout_checks import run_checks
from fa_sim.observers.hazards import HazardChecker, format_hazards

NEW = (96, 160, 192, 256)


def _inputs(d, nq=70, nk=90, b=1, h=1, seed=0):
    rng = np.random.default_rng(seed + d)
    q = rng.standard_normal((b, h, nq, d)).astype(np.float16)
    k = rng.standard_normal((b, h, nk, d)).astype(np.float16)
    v = rng.standard_normal((b, h, nk, d)).astype(np.float16)
    return q, k, v


def _same(a, b) -> bool:
    return (np.array_equal(a.o.view(np.uint16), b.o.view(np.uint16))
            and np.array_equal(a.lse.view(np.uint32), b.lse.view(np.uint32)))


def test_the_family_accepts_the_new_head_dims():
    assert HEAD_DIMS == (32, 64, 96, 128, 160, 192, 256)
    for d in NEW:  # the seed tile at each: 16 rows per warp, 64 keys
        cfg = KernelConfig(head_dim=d)
        assert cfg.copy_threads_per_row * cfg.copy_col_passes * 8 == d and cfg.copy_rows_per_pass % 8 == 0
    got = {d: (KernelConfig(head_dim=d).swizzle_atom_cols, KernelConfig(head_dim=d).swizzle_bms) for d in NEW}
    assert got == {96: (32, (2, 3, 3)), 160: (32, (2, 3, 3)), 192: (64, (3, 3, 3)), 256: (256, (3, 3, 5))}
    assert all(KernelConfig.family((d,)) for d in NEW)


@pytest.mark.parametrize("d", NEW)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ptx_engine_equals_the_program_and_float64(d, causal):
    q, k, v = _inputs(d)  # Nq = 70, Nk = 90: a tail in both Q and K/V blocks of 64
    prog = simulate(q, k, v, causal=causal, engine="program")
    checker = HazardChecker()
    ptx = simulate(q, k, v, causal=causal, engine="ptx", observers=[checker])
    assert ptx.config.head_dim == d and _same(prog, ptx)
    rep = checker.report()
    assert rep.ok, format_hazards(rep)
    acc = measure(ptx.o, ptx.lse, q, k, v, causal, ptx.scale, ptx.config)
    assert acc.ok, acc.failures()


@pytest.mark.parametrize("tag, causal", [
    ("m128n32d160w4-swizzled", False),  # the heuristic tile of 160: two m16 atoms per warp
    ("m128n64d192w8-padded", True),  # padded rows (pitch 200), 8 warps
    ("m64n32d96w4-plain-s2", True),  # plain rows, two K/V stages (PTX engine only)
    ("m128n64d256w8-swizzled", False),  # the heuristic tile of 256
])
def test_other_tiles_of_the_new_head_dims(tag, causal):
    cfg = KernelConfig.from_tag(tag)
    q, k, v = _inputs(cfg.head_dim, nq=150, nk=90, seed=3)
    ptx = simulate(q, k, v, causal=causal, config=cfg, engine="ptx")
    if cfg.spec_schedule:
        assert _same(simulate(q, k, v, causal=causal, config=cfg, engine="program"), ptx)
    acc = measure(ptx.o, ptx.lse, q, k, v, causal, ptx.scale, cfg)
    assert acc.ok, acc.failures()


def test_with_the_other_features():
    """GQA and a window, bf16 (both front ends), softcap (PTX engine) at the new head dims."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 2, 70, 192)).astype(np.float16)
    k, v = (rng.standard_normal((1, 1, 90, 192)).astype(np.float16) for _ in range(2))
    kw = dict(window=(30, 10))
    prog, ptx = (simulate(q, k, v, engine=e, **kw) for e in ("program", "ptx"))
    assert _same(prog, ptx)
    acc = measure(ptx.o, ptx.lse, q, k, v, False, ptx.scale, ptx.config, window=(30, 10))
    assert acc.ok, acc.failures()
    q, k, v = _inputs(96, seed=9)
    res = simulate(q, k, v, causal=True, softcap=5.0, engine="ptx")
    acc = measure(res.o, res.lse, q, k, v, True, res.scale, res.config, softcap=5.0)
    assert acc.ok, acc.failures()
    from fa_sim import validate

    cfg = KernelConfig(head_dim=160, dtype="bf16")
    q, k, v = (validate.round_to_bf16(x.astype(np.float32)) for x in _inputs(160, seed=4))
    prog, ptx = (simulate(q, k, v, causal=True, config=cfg, engine=e) for e in ("program", "ptx"))
    assert ptx.config.dtype == "bf16" and ptx.o.dtype == np.float32
    assert np.array_equal(prog.o.view(np.uint32), ptx.o.view(np.uint32)) and np.array_equal(prog.lse, ptx.lse)
    acc = measure(ptx.o, ptx.lse, q, k, v, True, ptx.scale, cfg)
    assert acc.ok, acc.failures()


def test_checkpoints_of_both_front_ends_agree():
    """fa compare's contract at head_dim 160 (column passes, swizzle atoms of 32 columns)."""
    from fa_sim.checkpoints import CheckpointLayout
    from fa_sim.crosscheck import compare_checkpoints, rounds_per_cta, simulate_with_checkpoints

    cfg, ctas = KernelConfig(head_dim=160), [0, 1]
    q, k, v = _inputs(160, nq=100, nk=90, seed=5)
    runs = [simulate_with_checkpoints(q, k, v, True, None, cfg, ctas, mma_model="exact", engine=e)
            for e in ("program", "ptx")]
    rounds = rounds_per_cta(ctas, cfg, 100, 90, True)
    stats = compare_checkpoints(runs[0][1], runs[1][1], CheckpointLayout(cfg, int(max(rounds))), ctas, rounds)
    assert all(s.identical == s.values for s in stats), [(s.checkpoint, s.values - s.identical) for s in stats]
    assert _same(runs[0][0], runs[1][0])


@pytest.mark.parametrize("d", NEW)
@pytest.mark.parametrize("smem", ["swizzled", "plain", "padded"])
def test_layout_checks_pass(d, smem):
    cfg = KernelConfig(head_dim=d, smem=smem, block_m=128, n_warps=8)
    bad = [r for r in run_checks(cfg) if not r.ok]
    assert not bad, bad


def test_swizzled_ldmatrix_rows_fall_in_distinct_bank_groups():
    """The point of the atoms: the 8 row addresses of one ldmatrix phase (8 consecutive rows, one
    16-byte column) hit 8 distinct 16-byte bank groups; the plain rows of 96 and 160 do not."""
    for d in NEW:
        for smem, spread in (("swizzled", 8), ("plain", {96: 2, 160: 2, 192: 1, 256: 1}[d])):
            cfg = KernelConfig(head_dim=d, smem=smem)
            r, c = np.meshgrid(np.arange(64), np.arange(0, d, 8), indexing="ij")
            group = (cfg.smem_offset(r, c) // 8) % 8  # [rows, chunks]
            distinct = np.array([[len(set(group[8 * i:8 * i + 8, j])) for j in range(d // 8)] for i in range(8)])
            assert distinct.min() == spread, (d, smem)


@pytest.mark.parametrize("kwargs, message", [
    (dict(head_dim=256, block_m=128, n_warps=4), "holds 320 fp32 accumulator registers per thread"),
    (dict(head_dim=160, block_m=128, block_n=128, n_warps=4), "holds 288 fp32 accumulator registers"),
    (dict(head_dim=192, block_m=128, block_n=128, n_warps=8, kv_stages=2),
     f"needs 245760 bytes of shared memory, over {SMEM_LIMIT_BYTES}, the most any target allows"),
    (dict(head_dim=256, block_n=128, kv_stages=2), "needs 294912 bytes of shared memory"),
    (dict(head_dim=100), "head_dim=100 is not one of (32, 64, 96, 128, 160, 192, 256)"),
])
def test_configs_past_the_limits_are_refused(kwargs, message):
    with pytest.raises(ValueError, match="unsupported KernelConfig") as exc:
        KernelConfig(**kwargs)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    if "accumulator" in message:
        assert f"over {REGISTER_ACCUMULATORS_MAX}" in str(exc.value)


def test_bad_head_dims_and_the_backward_are_refused_before_work(capsys):
    q = np.zeros((1, 1, 8, 100), np.float16)
    with pytest.raises(ValueError, match=r"head_dim 100 is not supported; choose one of \(32, 64, 96, 128, 160, 192, 256\)"):
        simulate(q, q, q)
    from fa_sim.contract.backward import BackwardConfig

    with pytest.raises(ValueError, match="head_dim 256 is not supported by the backward pass; choose one of "
                                         r"\(32, 64, 96, 128, 160, 192\); 256: .* 256 fp32 registers per thread"):
        BackwardConfig(256)
    assert main(["sim", "--head-dim", "256", "--block-m", "128", "--seqlen", "70"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "320 fp32 accumulator registers" in err[0]


def test_cli_runs_a_new_head_dim(capsys):
    assert main(["sim", "--head-dim", "192", "--seqlen", "70", "--seqlen-k", "90", "--heads", "1", "--causal"]) == 0
    out = capsys.readouterr().out
    assert "d=192" in out and "m64n64d192w4-swizzled" in out


# -- sm_90's shared memory -------------------------------------------------------------------------------
BIG = "m128n128d256w8-swizzled"  # 196,608 bytes of shared memory: over sm_80's 166,912, within sm_90's 232,448


def test_the_shared_memory_limit_is_the_targets():
    assert (smem_limit_bytes("sm_80"), smem_limit_bytes("sm_90"), smem_limit_bytes("sm_90a")) == (166912, 232448, 232448)
    assert smem_limit_bytes("sm_86") == smem_limit_bytes("sm_89") == 101376 and SMEM_LIMIT_BYTES == 232448
    cfg = KernelConfig.from_tag(BIG)
    assert cfg.smem_bytes == 196608 and cfg.fits("sm_90") and not cfg.fits("sm_80")
    assert cfg.check_arch("sm_90") is cfg and cfg.check_arch("compute_90") is cfg
    two = KernelConfig.from_tag("m64n64d256w4-swizzled-s2")  # 163,840 bytes: sm_80 and sm_90, not sm_86 / sm_89
    assert two.check_arch("sm_80") is two
    for c, arch, limit in ((cfg, "sm_80", 166912), (cfg, "sm_86", 101376), (two, "sm_89", 101376)):
        with pytest.raises(ValueError) as exc:
            c.check_arch(arch)
        assert str(exc.value) == (f"config {c.tag} needs {c.smem_bytes} bytes of shared memory per CTA, over "
                                  f"{arch}'s limit of {limit} (sm_{'90' if c is cfg else '80'} allows "
                                  f"{232448 if c is cfg else 166912}): take fewer kv_stages or a smaller block_m / "
                                  f"block_n on {arch} (docs/head_dims.md)")
    with pytest.raises(ValueError, match="no shared-memory limit is known for sm_75: the kernel's targets are sm_80, "):
        cfg.check_arch("sm_75")
    with pytest.raises(ValueError, match="arch 'gfx90a' is not a CUDA architecture"):
        cfg.fits("gfx90a")
    sm80, sm90 = KernelConfig.family((192, 256)), KernelConfig.family((192, 256), arch="sm_90")
    assert cfg not in sm80 and cfg in sm90 and set(sm80) < set(sm90)
    assert all(c.fits("sm_80") for c in sm80) and all(not c.fits("sm_80") for c in set(sm90) - set(sm80))


def test_a_tile_too_big_for_the_target_is_refused_before_any_work(capsys):
    from fa_sim import predict_time
    from fa_sim.contract import KernelBuild
    from fa_sim.contract.cubins import compile_build

    cfg = KernelConfig.from_tag(BIG)
    with pytest.raises(ValueError, match=f"config {BIG} needs 196608 bytes .* over sm_80's limit of 166912"):
        compile_build(KernelBuild(cfg, False, "sm_80"), use_cache=False)  # before NVRTC
    with pytest.raises(ValueError, match="over sm_80's limit of 166912"):
        predict_time(1, 1, 70, 130, 256, config=BIG, gpu="a100")  # the A100 model: sm_80
    assert main(["time", "--head-dim", "256", "--batch", "1", "--heads", "1", "--seqlen", "70", "--config", BIG,
                 "--gpu", "a100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--gpu a100: config {BIG} needs 196608 bytes" in err[0] and "sm_80's limit" in err[0]


def test_the_tuned_candidates_fit_the_arch():
    """fa_hw.tuned's pools hold only configs that fit the arch; sm_90's adds BIG_TILES after sm_80's."""
    from dataclasses import replace

    from fa_hw import tuned

    for d in (192, 256):
        for causal in (False, True):
            sm80 = tuned.autotune_candidates(d, causal, 4096, arch="sm_80")
            sm90 = tuned.autotune_candidates(d, causal, 4096, arch="sm_90")
            big = [replace(KernelConfig.from_tag(t), heavy_first=causal) for t in BIG_TILES[d]]
            assert all(c.fits("sm_80") for c in sm80) and not any(c.fits("sm_80") for c in big)
            assert sm90 == sm80 + big and sm90 == tuned.autotune_candidates(d, causal, 4096)  # sm_90 by default
            timed = tuned.candidates(d, causal, "sm_80")
            assert all(c.fits("sm_80") for c in timed) and set(big) <= set(tuned.candidates(d, causal)) - set(timed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_an_sm90_tile_runs_on_the_ptx_engine_as_the_program(causal):
    """The PTX engine runs the PTX whatever the target; m128n128d256w8 (spec schedule, sm_90 only) on
    Nq = 70 (one Q block, a tail) and Nk = 130 (a full K/V round of 128 and a tail of 2)."""
    cfg = KernelConfig.from_tag(BIG)
    q, k, v = _inputs(256, nq=70, nk=130, seed=5)
    prog = simulate(q, k, v, causal=causal, config=cfg, engine="program")
    checker = HazardChecker()
    ptx = simulate(q, k, v, causal=causal, config=cfg, engine="ptx", observers=[checker])
    assert _same(prog, ptx)
    rep = checker.report()
    assert rep.ok, format_hazards(rep)
    acc = measure(ptx.o, ptx.lse, q, k, v, causal, ptx.scale, cfg)
    assert acc.ok, acc.failures()


def test_an_sm90_pipelined_tile_is_hazard_free_on_the_ptx_engine():
    """m128n64d192w8-s3-qr-dp (three K/V stages in 196,608 bytes, sm_90 only; the timing model's fastest at
    d = 192): four rounds (Nk = 200, a tail of 8), hazard-free and within float64's bounds."""
    cfg = KernelConfig.from_tag("m128n64d192w8-swizzled-s3-qr-dp")
    assert not cfg.fits("sm_80") and cfg.fits("sm_90")
    q, k, v = _inputs(192, nq=70, nk=200, seed=6)
    checker = HazardChecker()
    ptx = simulate(q, k, v, config=cfg, engine="ptx", observers=[checker])
    rep = checker.report()
    assert rep.ok, format_hazards(rep)
    acc = measure(ptx.o, ptx.lse, q, k, v, False, ptx.scale, cfg)
    assert acc.ok, acc.failures()


# -- GPU ------------------------------------------------------------------------------------------------
GPU_CASES = [(d, tag, nq, nk, causal) for d in NEW for tag, nq, nk, causal in (
    (None, 70, 90, False), (None, 70, 90, True), ("heuristic", 333, 129, True), ("heuristic", 130, 300, False))]



def _equals_the_engine(out, q, k, v, causal, config):
    """fa_hw.forward's output `out` bit-identical to the PTX engine's run and within the accuracy bounds."""
    from fa_hw import check

    sim = simulate(q, k, v, causal=causal, config=config, engine="ptx", mma_model="h200")
    o, lse = check.to_numpy(out.o), check.to_numpy(out.lse)
    assert np.array_equal(o.view(np.uint16), sim.o.view(np.uint16))
    assert np.array_equal(lse.view(np.uint32), sim.lse.view(np.uint32))
    acc = measure(o, lse, q, k, v, causal, out.scale, config)
    assert acc.ok, acc.failures()

@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"d{c[0]}-{c[1] or 'seed'}-{c[2]}x{c[3]}{'-causal' if c[4] else ''}")
def test_gpu_bit_identical_to_the_ptx_engine(case):
    import fa_hw
    from fa_hw import tuned

    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    d, which, nq, nk, causal = case
    config = KernelConfig(head_dim=d) if which is None else tuned.heuristic(d)
    q, k, v = _inputs(d, nq=nq, nk=nk, b=2, h=2, seed=nq)
    out = fa_hw.forward(q, k, v, causal=causal, config=config)
    _equals_the_engine(out, q, k, v, causal, config)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tag", [BIG] + [t for d in (192, 256) for t in BIG_TILES[d]])
def test_gpu_sm90_tiles_bit_identical_to_the_ptx_engine(tag, causal):
    """The tiles over sm_80's 163 KiB (fa_hw.tuned.BIG_TILES and m128n128d256w8) on the GPU, with tails:
    bit-identical to the PTX engine on an sm_90 GPU; refused in one line before any upload elsewhere."""
    import fa_hw
    from dataclasses import replace

    from fa_hw.device import device_arch

    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    config = replace(KernelConfig.from_tag(tag), heavy_first=causal)
    q, k, v = _inputs(config.head_dim, nq=150, nk=200, b=1, h=2, seed=7)
    arch = device_arch()
    if not config.fits(arch):
        with pytest.raises(ValueError, match=f"over {arch}'s limit of"):
            fa_hw.forward(q, k, v, causal=causal, config=config)
        return
    out = fa_hw.forward(q, k, v, causal=causal, config=config)
    _equals_the_engine(out, q, k, v, causal, config)
