"""bf16 inputs (issue 38, item 1) on the CPU: KernelConfig.dtype "bf16", fa2_fwd.cu's FA_BF16.

- the hand-written program and the PTX engine (the kernel's own PTX) agree bit for bit on O, LSE and
  every checkpoint, on shapes with tails, causal and not, observed or not, hazard-free;
- O and LSE against float64 within the documented bf16 bounds (fa_sim.accuracy.O_BOUND_BF16), and O
  really is bf16 (not an fp16 run in disguise);
- the bf16 pieces against independent oracles: mma.sync .bf16 per element in float64, cvt.rn.bf16
  against the exact rounding of isa.rounding, the fused-dot models on bf16 values;
- the input policy: dtype from the keyword, the inputs or the config; fp16 and bf16 mixed, a config
  of the other type, inexact or out-of-range values each one clear line; the CLI's --dtype.
The GPU side (fa_hw.forward bf16 against the PTX engine) is tests/test_hw_bf16_gpu.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import fa_sim
from fa_sim import validate
from fa_sim.accuracy import O_BOUND, O_BOUND_BF16, measure
from fa_sim.config import KernelConfig
from fa_sim.contract import KernelBuild
from fa_sim.crosscheck import CheckpointRecorder
from fa_sim.isa import mma as isa_mma
from fa_sim.isa.convert import encode, f32_to_bf16_rn, f32_to_bf16_values, float_to_float
from fa_sim.isa.rounding import BF16, F32, F64, Rnd
from fa_sim.observers.hazards import HazardChecker, format_hazards
from fa_sim.reference import random_inputs
from fa_sim.tensorcore import EXACT, H200

BF = KernelConfig(dtype="bf16")
CONFIGS = [BF, KernelConfig(block_m=128, block_n=64, head_dim=32, n_warps=8, dtype="bf16"),
           KernelConfig(block_n=32, head_dim=128, smem="padded", dtype="bf16")]


def _inputs(b, h, nq, nk, d, seed, sigma=1.0):
    """bf16 q, k, v (float32 arrays of bf16 values) with standard deviation sigma."""
    rng = np.random.default_rng(seed)
    return tuple(validate.round_to_bf16((sigma * rng.standard_normal((b, h, n, d))).astype(np.float32))
                 for n in (nq, nk, nk))


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint32)


# ---- the two engines, bit for bit ----------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("i", range(len(CONFIGS)), ids=[c.tag for c in CONFIGS])
def test_program_and_ptx_engine_agree_bit_for_bit(i, causal):
    cfg = CONFIGS[i]
    nq, nk = cfg.block_m + 37, cfg.block_n * 2 + 5  # tails in both, Nq != Nk
    q, k, v = _inputs(2, 1, nq, nk, cfg.head_dim, seed=i, sigma=2.0)
    runs = {}
    for engine in ("program", "ptx"):
        rec = CheckpointRecorder([0, 1, 3])
        runs[engine] = (fa_sim.simulate(q, k, v, causal=causal, config=cfg, engine=engine, observers=[rec]), rec.buffer)
    (p, p_ck), (x, x_ck) = runs["program"], runs["ptx"]
    assert p.o.dtype == np.float32 and p.config.dtype == "bf16"
    assert np.array_equal(_bits(p.o), _bits(x.o)) and np.array_equal(_bits(p.lse), _bits(x.lse))
    assert np.array_equal(p_ck, x_ck)  # every checkpoint: S, row max and sum, P~ (bf16x2), O, the tiles


@pytest.mark.parametrize("engine", ["program", "ptx"])
def test_hazard_free_and_observing_changes_nothing(engine):
    q, k, v = _inputs(1, 2, 100, 77, 64, seed=5)
    checker = HazardChecker()
    seen = fa_sim.simulate(q, k, v, causal=True, dtype="bf16", engine=engine, observers=[checker])
    rep = checker.report()
    assert rep.ok, format_hazards(rep)
    plain = fa_sim.simulate(q, k, v, causal=True, dtype="bf16", engine=engine)
    assert np.array_equal(_bits(seen.o), _bits(plain.o)) and np.array_equal(_bits(seen.lse), _bits(plain.lse))


def test_the_h200_model_runs_bf16_alike_on_both_engines():
    q, k, v = _inputs(1, 1, 70, 70, 32, seed=9)
    cfg = KernelConfig(head_dim=32, dtype="bf16")
    a, b = (fa_sim.simulate(q, k, v, config=cfg, engine=e, mma_model="h200") for e in ("program", "ptx"))
    assert np.array_equal(_bits(a.o), _bits(b.o)) and np.array_equal(_bits(a.lse), _bits(b.lse))


def test_the_kernel_is_built_with_bf16_instructions():
    from fa_sim.contract.nvrtc import kernel_ptx

    assert KernelBuild(BF).macros()["FA_BF16"] == 1 and KernelBuild(KernelConfig()).macros()["FA_BF16"] == 0
    ptx = kernel_ptx(KernelBuild(BF))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx and "cvt.rn.bf16x2.f32" in ptx
    assert ".f32.f16.f16.f32" not in ptx and "cvt.rn.f16x2.f32" not in ptx


# ---- against float64 -------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_within_the_bf16_bounds_of_float64_and_really_bf16(causal):
    q, k, v = _inputs(1, 2, 130, 97, 64, seed=2)
    res = fa_sim.simulate(q, k, v, causal=causal, dtype="bf16")
    acc = measure(res.o, res.lse, q, k, v, causal, res.scale, res.config)
    assert acc.ok, acc.failures()
    assert acc.rel_err_o < O_BOUND_BF16 and acc.above_bound == ()
    assert not (_bits(res.o) & np.uint32(0xFFFF)).any()  # every O element is a bf16 value
    # the same values through the fp16 kernel (bf16 values of this size are fp16 values): the fp16
    # run rounds P~ and O to 11 bits, 8 times finer - O differs and its error is below fp16's bound
    f16 = fa_sim.simulate(*(x.astype(np.float16) for x in (q, k, v)), causal=causal)
    acc16 = measure(f16.o, f16.lse, q, k, v, causal, f16.scale, f16.config)
    assert acc16.rel_err_o < O_BOUND < acc.rel_err_o
    assert np.array_equal(f16.lse, res.lse)  # LSE reads fp32 P~ only: the type does not reach it


def test_o_bound_is_held_for_bf16_runs():
    q, k, v = _inputs(1, 1, 64, 64, 64, seed=3)
    res = fa_sim.simulate(q, k, v, dtype="bf16")
    noise = np.random.default_rng(0).standard_normal(res.o.shape)
    scale = np.linalg.norm(res.o) / np.linalg.norm(noise)
    for factor, ok in ((0.5, True), (1.5, False)):
        acc = measure(res.o + factor * O_BOUND_BF16 * scale * noise, res.lse, q, k, v, False, res.scale, res.config)
        assert acc.ok is ok, acc.failures()
    assert "O_BOUND_BF16" in str(measure(0 * res.o, res.lse, q, k, v, False, res.scale, res.config).above_bound[0])


# ---- the bf16 pieces against oracles -----------------------------------------------------------------
def test_cvt_rn_bf16_matches_the_exact_rounding():
    rng = np.random.default_rng(1)
    with np.errstate(over="ignore"):  # some reach inf: rounded as inf
        x = np.ldexp(rng.standard_normal(20000), rng.integers(-140, 128, 20000)).astype(np.float32)
    ties = np.arange(0x3F800000, 0x3F800000 + (1 << 20), 0x8000, dtype=np.uint32).view(np.float32)  # halfway cases
    edge = np.array([3.3895314e38, 3.3961775e38, -3.4e38, 1e-40, -1e-45, 0.0, -0.0, np.inf, -np.inf], np.float32)
    x = np.concatenate([x, ties, edge])
    exact = float_to_float(x.astype(np.float64), F32, BF16, Rnd.RN)  # float64 values, rounded exactly
    assert np.array_equal(f32_to_bf16_rn(x), encode(exact, BF16))
    values = f32_to_bf16_values(x)
    assert np.array_equal(_bits(values) >> np.uint32(16), f32_to_bf16_rn(x)) and not (_bits(values) & 0xFFFF).any()
    assert f32_to_bf16_rn(np.array([np.nan], np.float32))[0] == 0x7FFF and f32_to_bf16_values([np.nan]) is None


def test_bf16_mma_against_a_per_element_float64_oracle():
    rng = np.random.default_rng(4)
    a_val = validate.round_to_bf16(rng.standard_normal((16, 16)).astype(np.float32) * 8)
    b_val = validate.round_to_bf16(rng.standard_normal((16, 8)).astype(np.float32) * 8)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    bits = lambda x: (_bits(x) >> np.uint32(16)).astype(np.uint16)  # noqa: E731
    a = isa_mma.a_fragments(bits(a_val))  # [32, 1, 4]
    b_words = np.empty((32, 2), np.uint32)
    bk, bn = isa_mma.b_coords()
    halves = bits(b_val)[bk, bn]  # [32, 4]: b0..b3 of each lane
    b_words[:] = np.ascontiguousarray(halves).view(np.uint32)
    cr, cc = isa_mma.c_coords()
    d = isa_mma.mma_m16n8k16(a[:, 0], b_words, c[cr, cc], EXACT.for_operand("bf16"))
    for lane in range(32):  # the oracle: each element's float64 sum, rounded once
        for i in range(4):
            r, col = cr[lane, i], cc[lane, i]
            want = np.float32(sum(float(a_val[r, t]) * float(b_val[t, col]) for t in range(16)) + float(c[r, col]))
            assert d[lane, i] == want


def test_fused_dot_models_read_bf16_exponents():
    """Values exact in fp16 and bf16 (8 significand bits, normal fp16 exponents) have the same
    exponent fields in both, so every model gives the same sums on them."""
    rng = np.random.default_rng(6)
    a = validate.round_to_bf16(rng.standard_normal((64, 16)).astype(np.float32) * 2.0 ** rng.integers(-10, 10, (64, 1)))
    b = validate.round_to_bf16(rng.standard_normal((64, 16)).astype(np.float32) * 2.0 ** rng.integers(-10, 10, (64, 1)))
    c = rng.standard_normal(64).astype(np.float32)
    for model in (EXACT, H200):
        assert np.array_equal(model.for_operand("bf16").dot_add(a, b, c), model.dot_add(a.astype(np.float16),
                                                                                        b.astype(np.float16), c))
    # beyond fp16's range the bf16 model still sums exactly what EXACT sums when nothing is cut
    big = a * np.float32(2.0 ** 100)
    assert np.array_equal(EXACT.for_operand("bf16").dot_add(big, b, c), (big.astype(np.float64) * b).sum(-1)
                          .__add__(c.astype(np.float64)).astype(np.float32))
    assert H200.for_operand("bf16") != H200 and H200.for_operand("bf16").for_operand("f16") == H200
    assert EXACT.for_operand("bf16").float64_sum and not H200.for_operand("bf16").float64_sum


# ---- the input policy ----------------------------------------------------------------------------------
def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


class _Bf16Lib(type(validate._library(validate.NUMPY))):
    """numpy's checks, with the array typed bfloat16 (what torch.bfloat16 or ml_dtypes report)."""

    def dtype(self, a) -> str:
        return "bfloat16"


def test_mixed_fp16_and_bf16_inputs_are_one_line():
    q = validate.check_input(np.zeros((1, 1, 8, 32), np.float16), "q")
    k = validate.Input("k", np.zeros((1, 1, 8, 32), np.float32), _Bf16Lib(np, ""), (1, 1, 8, 32))
    msg = _message(validate.resolve_dtype, [q, k, k], None, None)
    assert msg.startswith("q, k and v mix fp16 and bf16 (q is float16, k is bfloat16, k is bfloat16)")
    _message(validate.resolve_dtype, [q, k, k], "bf16", None)  # whatever the keyword
    assert validate.resolve_dtype([k, k, k]) == "bf16" and validate.resolve_dtype([q, q, q]) == "fp16"


def test_the_run_type_from_keyword_inputs_and_config():
    q, k, v = _inputs(1, 1, 64, 64, 32, seed=0)
    assert fa_sim.simulate(q, k, v, config=KernelConfig(head_dim=32, dtype="bf16")).config.dtype == "bf16"
    assert fa_sim.simulate(q, k, v, dtype="BF16").config.tag == "m64n64d32w4-swizzled-bf16"
    msg = _message(fa_sim.simulate, q, k, v, dtype="bf16", config=KernelConfig(head_dim=32))
    assert msg == ("config.dtype is 'fp16' but dtype='bf16'; pass a config with dtype='bf16' "
                   "(dataclasses.replace(config, dtype='bf16')) or dtype='fp16'")
    assert _message(fa_sim.simulate, q, k, v, dtype="fp32") == "dtype 'fp32' is not supported; choose fp16 or bf16"
    h = np.float16(1) + np.float16(2.0 ** -10)  # 11 significant bits: fp16, not bf16
    assert "does not represent exactly" in _message(fa_sim.simulate, q + np.float32(h), k, v, dtype="bf16")


def test_values_bf16_does_not_hold_are_refused_with_the_fix():
    q, k, v = _inputs(1, 1, 16, 16, 32, seed=1)
    q2 = q.copy()
    q2[0, 0, 3, 4] = np.float32(1.0 + 2.0 ** -12)
    msg = _message(fa_sim.simulate, q2, k, v, dtype="bf16")
    assert msg == ("q (float32) holds 1 values that bf16 does not represent exactly, e.g. q[0, 0, 3, 4] = "
                   "1.00024414 -> 1; the kernel reads bf16: convert explicitly (fa_sim.validate.round_to_bf16(q)) "
                   "to accept the rounding")
    q2[0, 0, 3, 4] = 3.4e38
    assert "beyond the bf16 range (|x| > 3.39e38), e.g. q[0, 0, 3, 4]" in _message(fa_sim.simulate, q2, k, v, dtype="bf16")
    assert np.array_equal(fa_sim.simulate(q.astype(np.float64), k, v, dtype="bf16").o,
                          fa_sim.simulate(q, k, v, dtype="bf16").o)  # float64 holding bf16 values: taken as they are


def test_bf16_magnitudes_that_would_overflow_fp32_are_refused():
    q, k, v = _inputs(1, 1, 16, 16, 32, seed=1)
    big = validate.round_to_bf16(np.full_like(q, 1e20))
    assert _message(fa_sim.simulate, big, big, v, dtype="bf16").startswith("bf16 q and k too large for fp32 scores")
    assert _message(fa_sim.simulate, q, k, validate.round_to_bf16(np.full_like(v, 3e37)), dtype="bf16").startswith(
        "bf16 v too large for the fp32 O accumulator: Nk*max|v|")
    fa_sim.simulate(q * np.float32(2.0 ** 14), k * np.float32(2.0 ** 14), v, dtype="bf16")  # beyond fp16, fine in bf16


def test_predict_time_refuses_a_dtype_its_config_contradicts_in_one_line():
    """bf16 is predicted (tests/test_timing_features.py); a config of the other dtype is one line."""
    msg = _message(fa_sim.predict_time, 1, 1, 128, dtype="bf16", config=KernelConfig())
    assert msg == "config.dtype is 'fp16' but dtype='bf16'; pass a config with dtype='bf16'"
    assert _message(fa_sim.predict_time, 1, 1, 128, dtype="fp32").startswith("dtype")


def test_config_tag_and_json():
    assert BF.tag == "m64n64d64w4-swizzled-bf16" and KernelConfig.from_tag(BF.tag) == BF
    assert KernelConfig.from_json(BF.to_json()) == BF and KernelConfig.from_json({}).dtype == "fp16"
    assert "dtype='fp32' is not one of ('fp16', 'bf16')" in _message(KernelConfig, dtype="fp32")
    assert dataclasses.replace(KernelConfig(kv_stages=2), dtype="bf16").tag == "m64n64d64w4-swizzled-s2-bf16"


# ---- the command line ----------------------------------------------------------------------------------
def test_fa_sim_dtype_bf16(capsys):
    from fa_sim import cli

    assert cli.main(["sim", "--dtype", "bf16", "--seqlen", "70", "--seqlen-k", "45", "--causal", "--json",
                     "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["above_bound"] == [] and 1e-4 < out["rel_err_o"] < O_BOUND_BF16


@pytest.mark.parametrize("argv, message", [
    (["sim", "--dtype", "fp32"], "--dtype fp32: dtype='fp32' is not one of (fp16, bf16)"),
])
def test_fa_dtype_refusals_are_one_line(capsys, argv, message):
    from fa_sim import cli

    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_random_inputs_in_bf16_are_the_fp16_draws_rounded():
    q16 = random_inputs(1, 1, 8, 8, 32, seed=3)[0]
    qb = random_inputs(1, 1, 8, 8, 32, seed=3, dtype="bf16")[0]
    assert qb.dtype == np.float32 and not (_bits(qb) & 0xFFFF).any()
    assert np.max(np.abs(qb - q16.astype(np.float32)) / np.maximum(np.abs(qb), 1e-3)) < 2.0 ** -7


def test_schedule_options_keep_the_bf16_values():
    """kv_stages, q_in_regs, defer_pv change the schedule, not O's arithmetic: the PTX engine's bf16 run
    of such a config gives the program's bits of the spec's config (SCHEDULE.md, "Kernel options")."""
    q, k, v = _inputs(1, 2, 150, 170, 64, seed=8)
    want = fa_sim.simulate(q, k, v, causal=True, config=KernelConfig(block_m=128, dtype="bf16"), engine="program")
    for opts in (dict(kv_stages=2, q_in_regs=True), dict(kv_stages=3, defer_pv=True)):
        got = fa_sim.simulate(q, k, v, causal=True, config=KernelConfig(block_m=128, dtype="bf16", **opts))
        assert np.array_equal(_bits(got.o), _bits(want.o)) and np.array_equal(_bits(got.lse), _bits(want.lse)), opts


def test_the_mma_probe_fits_models_applied_to_bf16():
    """fa_sim.calibrate.mma_probe --dtype bf16 (what measures the H200's bf16 MMA on a GPU): its inputs
    are bf16 values, and `fit` picks out the model that made the outputs among the bf16 candidates;
    the EXACT and H200 models differ on them, so the recording can tell them apart."""
    from fa_sim.calibrate import mma_probe
    from fa_sim.tensorcore import fit

    a, b, c = mma_probe.make_inputs(16, 0, "bf16")
    assert a.dtype == np.float32 and not (_bits(a) & 0xFFFF).any() and not (_bits(b) & 0xFFFF).any()
    av, bv, cc = mma_probe.dot_operands(a, b, c)
    d = H200.for_operand("bf16").dot_add(av, bv, cc)
    best = fit(av, bv, cc, d, "bf16")[0]
    assert best.mismatches == 0 and best.model.operand == "bf16"
    assert (EXACT.for_operand("bf16").dot_add(av, bv, cc) != d).sum() > d.size // 10
    assert ".f32.bf16.bf16.f32" in mma_probe.probe_source("bf16") and ".bf16" not in mma_probe.probe_source()


@pytest.mark.parametrize("model", ["exact", "h200"])
def test_the_ptx_engines_bf16_mma_is_the_model_element_by_element(model):
    """The bf16 probe kernel (mma .bf16 from PTX NVRTC emits) on the PTX engine gives, for every output,
    the tensor-core model applied to bf16 (per element, fa_sim.tensorcore.dot_add)."""
    from fa_sim.calibrate import mma_probe
    from fa_sim.ptx import launch
    from fa_sim.tensorcore import resolve

    a, b, c = mma_probe.make_inputs(24, 1, "bf16")
    n = a.shape[0]
    out = np.zeros((n, 16, 8), np.float32)
    bits = lambda x: (_bits(x) >> np.uint32(16)).astype(np.uint16)  # noqa: E731
    launch(mma_probe.probe_source("bf16"), grid=(n + 3) // 4, block=128, mma_model=model,
           args=[bits(a), bits(b), c, out, np.int32(n)])
    want = resolve(model).for_operand("bf16").dot_add(*mma_probe.dot_operands(a, b, c))
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_round_to_bf16_rounds_once():
    """float64 values are rounded to bf16 directly, not through a float32 rounding that could land on
    a bf16 tie: 1 + 2^-8 + 2^-40 is above the tie between 1 and 1 + 2^-7, so it rounds up."""
    x = np.array([1 + 2.0 ** -8 + 2.0 ** -40, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8 + 2.0 ** -40), np.nan])
    got = validate.round_to_bf16(x)
    assert got[:4].tolist() == [1 + 2.0 ** -7, 1.0, 1 + 2 * 2.0 ** -7, -(1 + 2.0 ** -7)] and np.isnan(got[4])
    rng = np.random.default_rng(2)
    y = rng.standard_normal(10000)
    want = float_to_float(y, F64, BF16, Rnd.RN)
    assert np.array_equal(validate.round_to_bf16(y).astype(np.float64), want)


def test_fa_hw_forward_refuses_bad_bf16_input_with_the_simulators_words():
    """fa_hw.forward checks bf16 inputs before it needs a GPU, in the simulator's words."""
    import fa_hw

    q, k, v = _inputs(1, 1, 16, 16, 32, seed=1)
    bad = q.copy()
    bad[0, 0, 0, 0] = np.float32(1 + 2.0 ** -12)
    cases = [((bad, k, v), {"dtype": "bf16"}), ((q, k, v), {"dtype": "bf16", "config": KernelConfig(head_dim=32)}),
             ((q, k, v), {"dtype": "fp8"}), ((q * np.float32(2.0 ** 70), k * np.float32(2.0 ** 70), v), {"dtype": "bf16"})]
    for args, kw in cases:
        with pytest.raises(ValueError) as hw:
            fa_hw.forward(*args, **kw)
        with pytest.raises(ValueError) as sim:
            fa_sim.simulate(*args, **kw)
        assert str(hw.value) == str(sim.value)
