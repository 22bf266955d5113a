"""fa_hw.backward on a real GPU (marked `gpu`; skips cleanly where there is none): gradients
against the float64 reference within the derived bound (docs/backward.md "Accuracy") over shapes
with tails, causal and not, Nq != Nk, d = 32/64/128, both dQ modes; the deterministic mode (its dQ
kernel) bit for bit equal to the PTX engine (fa_sim.simulate_backward with the H200 tensor-core
model) and to itself on shapes with tails for every head_dim; the atomic mode's dK, dV equal to the
deterministic mode's; the driver's registers in both modes. The same bit identity for bf16 (FA_BF16,
d = 32/64/128) and for head_dim 96, 160, 192 in fp16 and bf16, their gradients within the bound of
their type (attention_backward(..., dtype=)). Every backward tuning candidate (fa_hw.tuned_backward)
gives the PTX engine's default bits; the swizzled ones (smem_swizzle) also the same tiles' padded bits."""

from __future__ import annotations

import numpy as np
import pytest

import fa_hw
from fa_sim.reference import attention_backward, random_inputs
from fa_sim.validate import round_to_bf16

pytestmark = pytest.mark.gpu
SHAPES = [(1, 2, 200, 200, 64, False), (1, 2, 77, 300, 64, True), (2, 1, 300, 77, 32, True),
          (1, 1, 333, 129, 128, False), (1, 2, 130, 100, 128, True), (1, 1, 1, 1, 64, False)]


@pytest.fixture(scope="module")
def gpu():
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    return fa_hw.device_arch()


def _problem(b, h, nq, nk, d, causal, seed=0, dtype="fp16"):
    q, k, v = random_inputs(b, h, nq, nk, d, seed=seed, dtype=dtype)
    do = np.random.default_rng(seed + 100).standard_normal(q.shape)
    do = do.astype(np.float16) if dtype == "fp16" else round_to_bf16(do.astype(np.float32))
    fwd = fa_hw.forward(q, k, v, causal=causal, dtype=dtype)
    return q, k, v, np.asarray(fwd.o), np.asarray(fwd.lse), do


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{h}x{nq}x{nk}-d{d}{'-causal' if c else ''}"
                                               for b, h, nq, nk, d, c in SHAPES])
def test_gradients_within_the_derived_bound_of_float64(gpu, shape, deterministic):
    *dims, causal = shape
    q, k, v, o, lse, do = _problem(*dims, causal)
    res = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic)
    *want, bq, bk, bv = attention_backward(q, k, v, do, causal=causal, bound=True)
    for name, got, ref, bound in zip(("dq", "dk", "dv"), (res.dq, res.dk, res.dv), want, (bq, bk, bv)):
        err = np.abs(got.astype(np.float64) - ref)
        worst = np.unravel_index(np.argmax(err / bound), err.shape)
        assert (err <= bound).all(), f"{name}: error {err[worst]:.3g} over the bound {bound[worst]:.3g} at {worst}"


# (B, H, Nq, Nk, d): tails both ways, 2-3 K/V blocks and 2-3 dQ CTAs, every head_dim (d = 128: the
# dQ kernel's 70,144 B of shared memory over the default 48 KB), B*H > 1.
BITS = [(1, 1, 130, 100, 64), (2, 1, 70, 90, 32), (1, 2, 100, 150, 128)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", BITS, ids=[f"{b}x{h}x{nq}x{nk}-d{d}" for b, h, nq, nk, d in BITS])
def test_deterministic_mode_equals_the_simulator_bit_for_bit(gpu, shape, causal):
    import fa_sim

    q, k, v, o, lse, do = _problem(*shape, causal, seed=2)
    hw = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=True)
    again = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=True)
    sim = fa_sim.simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=True, mma_model="h200")
    atomic = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=False)
    for name in ("dq", "dk", "dv"):
        a, b, s = (getattr(r, name).view(np.uint16) for r in (hw, again, sim))
        assert np.array_equal(a, b), f"{name}: two deterministic GPU runs differ"
        assert np.array_equal(a, s), f"{name}: GPU and simulator differ in {int((a != s).sum())} elements"
    assert np.array_equal(hw.dk.view(np.uint16), atomic.dk.view(np.uint16))
    assert np.array_equal(hw.dv.view(np.uint16), atomic.dv.view(np.uint16))


def _bits(x):
    """16-bit patterns of a gradient: float16, or float32 holding bf16 values (their upper halves)."""
    return x.view(np.uint16) if x.dtype == np.float16 else (x.view(np.uint32) >> 16).astype(np.uint16)


# (B, H, Nq, Nk, d, dtype): bf16 at the spec's head dims; 96, 160, 192 (DEFAULT_TILES 64, 32, 16 query
# rows; 3, 5, 3 copy column passes; the dQ kernel's 53,760 / 86,528 / 102,912 B of shared memory) in
# both types; tails both ways, 2-3 K/V blocks and dQ CTAs, B*H > 1.
TYPED = [(1, 1, 130, 100, 64, "bf16"), (2, 1, 70, 90, 32, "bf16"), (1, 2, 100, 150, 128, "bf16"),
         (1, 2, 130, 100, 96, "fp16"), (2, 1, 70, 150, 160, "fp16"), (1, 1, 100, 77, 192, "fp16"),
         (1, 2, 130, 100, 96, "bf16"), (2, 1, 70, 150, 160, "bf16"), (1, 1, 100, 77, 192, "bf16")]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", TYPED, ids=[f"{b}x{h}x{nq}x{nk}-d{d}-{t}" for b, h, nq, nk, d, t in TYPED])
def test_bf16_and_wide_head_dims_equal_the_simulator_bit_for_bit(gpu, shape, causal):
    """The deterministic mode on the GPU: dQ, dK, dV the PTX engine's bits (mma model h200) and the
    same on a second run; the atomic mode's dK, dV the same bits; both modes within the bound of
    the run's type."""
    import fa_sim

    *dims, dtype = shape
    q, k, v, o, lse, do = _problem(*dims, causal, seed=2, dtype=dtype)
    hw = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=True, dtype=dtype)
    again = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=True, dtype=dtype)
    sim = fa_sim.simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=True, mma_model="h200",
                                   dtype=dtype)
    atomic = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=False, dtype=dtype)
    assert hw.config.dtype == sim.config.dtype == dtype
    for name in ("dq", "dk", "dv"):
        a, b, s = (_bits(getattr(r, name)) for r in (hw, again, sim))
        assert np.array_equal(a, b), f"{name}: two deterministic GPU runs differ"
        assert np.array_equal(a, s), f"{name}: GPU and simulator differ in {int((a != s).sum())} elements"
    assert np.array_equal(_bits(hw.dk), _bits(atomic.dk)) and np.array_equal(_bits(hw.dv), _bits(atomic.dv))
    *want, bq, bk, bv = attention_backward(q, k, v, do, causal=causal, bound=True, dtype=dtype)
    for res in (hw, atomic):
        for name, ref, bound in zip(("dq", "dk", "dv"), want, (bq, bk, bv)):
            err = np.abs(getattr(res, name).astype(np.float64) - ref)
            assert (err <= bound).all(), f"{name}: error {err.max():.3g} over the bound"


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_the_driver_reports_the_cubins_registers(gpu, deterministic):
    from fa_sim.contract.backward import BackwardBuild, BackwardConfig, compile_backward

    q, k, v, o, lse, do = _problem(1, 1, 64, 64, 64, False)
    res = fa_hw.backward(q, k, v, o, lse, do, deterministic=deterministic)
    cubin = compile_backward(BackwardBuild(BackwardConfig(64), False, deterministic, gpu))
    assert res.registers == {name: u.registers for name, u in cubin.usage.items()}
    assert all(ms > 0 for ms in res.kernel_ms)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_checkpoint_buffer_equals_the_engines_bit_for_bit(gpu, causal, deterministic):
    """The debug build (FA_BWD_CHECKPOINTS) on the GPU against the PTX engine's (mma model h200),
    Nq = 70, Nk = 90, d = 64, both dQ modes, every CTA: the buffer word for word (no checkpoint
    depends on the mode), the checkpointed run's gradients equal to the plain run's and the
    engine's (the atomic mode's dQ aside: the GPU's order of its additions varies)."""
    import fa_sim
    from fa_sim.crosscheck import backward_checkpoint_stats

    q, k, v, o, lse, do = _problem(1, 1, 70, 90, 64, causal, seed=1)
    ctas = [0, 1]
    hw = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic, checkpoint_ctas=ctas)
    plain = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic)
    sim = fa_sim.simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic,
                                   mma_model="h200", checkpoint_ctas=ctas)
    stats = backward_checkpoint_stats(sim.checkpoints, hw.checkpoints, sim.config, ctas, 1, 70, 90, causal)
    assert all(s.ok for s in stats), "; ".join(str(s.first) for s in stats if not s.ok)
    assert hw.checkpoints.tobytes() == sim.checkpoints.tobytes()
    for name in ("dq", "dk", "dv") if deterministic else ("dk", "dv"):
        assert getattr(hw, name).tobytes() == getattr(plain, name).tobytes(), name
        assert getattr(hw, name).tobytes() == getattr(sim, name).tobytes(), name


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
def test_every_tuning_candidate_computes_the_simulators_bits_on_the_gpu(gpu, head_dim):
    """fa_hw.tuned_backward's candidates (what experiments/tune_bwd.py times and fa_hw.attention may
    run): deterministic mode bit for bit the PTX engine's run of the default tiles with the candidate's
    softmax form (the tiles and Q stages change no bit: docs/backward.md section 2; softmax "ffma"
    computes P by fma.rn, other bits that the engine models), the atomic mode's dK, dV too, and its dQ
    within the derived bound of float64 (the vector reductions of dq_red 2, 4 on sm_90 among them);
    config="auto" runs a candidate."""
    import fa_sim
    from fa_hw.tuned_backward import candidates
    from fa_sim.contract.backward import SOFTMAX_FORMS, BackwardConfig

    q, k, v, o, lse, do = _problem(1, 2, 70, 90, head_dim, True, seed=3)
    sims = {sm: fa_sim.simulate_backward(q, k, v, o, lse, do, causal=True, deterministic=True, mma_model="h200",
                                         config=BackwardConfig(head_dim, softmax=sm)) for sm in SOFTMAX_FORMS}
    dq_ref, _, _, bq, _, _ = attention_backward(q, k, v, do, causal=True, bound=True)
    cands = candidates(head_dim, arch=fa_hw.runtime.device_arch())  # dq_red 2, 4 where they compile (sm_90)
    for cfg in cands:
        sim = sims[cfg.softmax]
        for det in (True, False):
            hw = fa_hw.backward(q, k, v, o, lse, do, causal=True, deterministic=det, config=cfg)
            assert hw.config == cfg
            for name in ("dq", "dk", "dv") if det else ("dk", "dv"):
                a, s = _bits(getattr(hw, name)), _bits(getattr(sim, name))
                assert np.array_equal(a, s), f"{cfg.describe()} {name}: {int((a != s).sum())} elements differ"
            if not det:
                err = np.abs(hw.dq.astype(np.float64) - dq_ref)
                assert (err <= bq).all(), f"{cfg.describe()} atomic dQ: error {err.max():.3g} over the bound"
    auto = fa_hw.backward(q, k, v, o, lse, do, causal=True, config="auto")
    assert auto.config in cands


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_queued_kernel_times_leave_out_the_host_launch_call(gpu, deterministic):
    """fa_hw.backward's time_backward_kernels (experiments/timing_backward.py --measure): each
    kernel's reps, launches queued back to back, positive and no longer than the single-launch
    times of fa_hw.backward (which include the host's launch call): the preprocess kernel's median
    below its single launch's."""
    import importlib
    import statistics

    time_kernels = importlib.import_module("fa_hw.backward").time_backward_kernels
    q, k, v, o, lse, do = _problem(1, 8, 1024, 1024, 64, False)
    times = time_kernels(q, k, v, o, lse, do, deterministic=deterministic, warmup=3, reps=10)
    assert len(times) == 3 and all(len(t) == 10 and min(t) > 0 for t in times)
    single = [statistics.median(x) for x in zip(*(fa_hw.backward(q, k, v, o, lse, do, deterministic=deterministic)
                                                  .kernel_ms for _ in range(5)))]
    assert statistics.median(times[0]) < single[0]
    with pytest.raises(ValueError, match="reps >= 1"):
        time_kernels(q, k, v, o, lse, do, reps=0)


def _swizzled_candidates():
    from fa_hw.tuned_backward import CANDIDATES, candidates

    return [(d, c.label) for d in CANDIDATES for c in candidates(d) if c.smem_swizzle]


@pytest.mark.parametrize("head_dim, label", _swizzled_candidates(), ids=[f"d{d}-{x}" for d, x in _swizzled_candidates()])
def test_swizzled_candidates_compute_the_padded_tiles_bits_on_the_gpu(gpu, head_dim, label):
    """Each smem_swizzle candidate (label suffix z: fa2_bwd.cu's FA_SMEM_SWIZZLE tiles) against the same tiles
    padded on the GPU, causal (70 x 90: tails both ways) and not (333 x 129), both dQ modes: dQ, dK, dV bit
    for bit in the deterministic mode, dK, dV in the atomic mode and its dQ within the derived bound of
    float64; the deterministic bits are also the PTX engine's of the default tiles (same softmax form)."""
    import dataclasses

    import fa_sim
    from fa_sim.contract.backward import BackwardConfig, vector_reductions_ok

    cfg = BackwardConfig.from_label(label, head_dim)
    padded = dataclasses.replace(cfg, smem_swizzle=False)
    if cfg.dq_red != 1 and not vector_reductions_ok(fa_hw.runtime.device_arch()):
        pytest.skip(f"{label}: dq_red {cfg.dq_red} needs sm_90")
    for b, h, nq, nk, causal in ((1, 2, 70, 90, True), (1, 1, 333, 129, False)):
        q, k, v, o, lse, do = _problem(b, h, nq, nk, head_dim, causal, seed=5)
        dq_ref, _, _, bq, _, _ = attention_backward(q, k, v, do, causal=causal, bound=True)
        sim = fa_sim.simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=True, mma_model="h200",
                                       config=BackwardConfig(head_dim, softmax=cfg.softmax))
        for det in (True, False):
            got = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=det, config=cfg)
            want = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=det, config=padded)
            assert got.config == cfg
            for name in ("dq", "dk", "dv") if det else ("dk", "dv"):
                a, p, s = _bits(getattr(got, name)), _bits(getattr(want, name)), _bits(getattr(sim, name))
                assert np.array_equal(a, p), f"{label} {name} (causal={causal}, det={det}): {int((a != p).sum())} differ"
                assert np.array_equal(a, s), f"{label} {name} vs the engine: {int((a != s).sum())} differ"
            if not det:
                err = np.abs(got.dq.astype(np.float64) - dq_ref)
                assert (err <= bq).all(), f"{label} atomic dQ: error {err.max():.3g} over the bound"
