"""The backward pass (fa_hw/kernels/fa2_bwd.cu) on the PTX engine: gradients against the float64
reference within the derived bound (fa_sim.reference.attention_backward, docs/backward.md
"Accuracy"), both dQ modes, the deterministic mode's dQ independent of how the CTAs are scheduled,
no hazards in the main and dQ kernels, dropped barriers caught, and the input checks; the bf16
kernels (FA_BF16) within the bf16 form of the bound; head_dim 96, 160 and 192 (their tiles and copy
passes) within the bound in both types. Problems are small (B = H = 1, at most 2 x 3 blocks): every
lane is simulated."""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

import fa_sim  # noqa: E402
from fa_sim.backward import simulate_backward  # noqa: E402
from fa_sim.contract.backward import BWD_PATH  # noqa: E402
from fa_sim.observers import HazardChecker, HazardKind  # noqa: E402
from fa_sim.reference import ROUNDOFF, attention, attention_backward, random_inputs  # noqa: E402
from fa_sim.validate import round_to_bf16  # noqa: E402


def _problem(nq, nk, d, causal, seed=1, batch=1, heads=1, dtype="fp16"):
    """q, k, v, dO standard normal in the run's type (bf16: float32 arrays of bf16 values), O and LSE
    from the forward of that type."""
    q, k, v = random_inputs(batch, heads, nq, nk, d, seed=seed, dtype=dtype)
    do = np.random.default_rng(seed + 100).standard_normal(q.shape)
    do = do.astype(np.float16) if dtype == "fp16" else round_to_bf16(do.astype(np.float32))
    fwd = fa_sim.simulate(q, k, v, causal=causal, dtype=dtype)
    return q, k, v, fwd.o, fwd.lse, do


def _assert_within_bound(res, q, k, v, do, causal, dtype="fp16", ulps=41):
    """Every gradient element within the derived bound of its type; the bound itself a few units of
    the type's roundoff u of the largest gradient (41 u: 2% for fp16, 16% for bf16), not a loose one."""
    *want, bq, bk, bv = attention_backward(q, k, v, do, causal=causal, bound=True, dtype=dtype)
    u = ROUNDOFF[dtype][0]
    for name, got, ref, bound in zip(("dq", "dk", "dv"), (res.dq, res.dk, res.dv), want, (bq, bk, bv)):
        assert got.dtype == (np.float16 if dtype == "fp16" else np.float32) and got.shape == ref.shape
        if dtype == "bf16":  # float32 holding bf16 values: the low 16 bits are zero
            assert not (got.view(np.uint32) & np.uint32(0xFFFF)).any(), name
        err = np.abs(got.astype(np.float64) - ref)
        worst = np.unravel_index(np.argmax(err / bound), err.shape)
        assert (err <= bound).all(), f"{name}: error {err[worst]:.3g} over the bound {bound[worst]:.3g} at {worst}"
        assert bound.max() < ulps * u * np.abs(ref).max(), (name, bound.max() / np.abs(ref).max() / u)


# (Nq, Nk, d, causal): one block each way; tails with Nq > Nk (causal: a CTA whose keys no query
# of a block sees); Nq < Nk with tails; three K/V blocks; head_dim 128 (Q blocks of 32 rows).
SHAPES = [(64, 64, 64, False), (70, 45, 64, True), (45, 70, 32, True), (70, 130, 64, False), (100, 37, 128, True),
          (33, 80, 128, False)]


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{a}x{b}-d{d}{'-causal' if c else ''}" for a, b, d, c in SHAPES])
def test_gradients_within_the_derived_bound_of_float64(shape, deterministic):
    nq, nk, d, causal = shape
    q, k, v, o, lse, do = _problem(nq, nk, d, causal)
    res = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic)
    _assert_within_bound(res, q, k, v, do, causal)


# bf16 (FA_BF16): one block each way, tails with Nq > Nk causal, three K/V blocks, head_dim 128.
BF16_SHAPES = [(64, 64, 64, False), (70, 45, 64, True), (45, 70, 32, True), (33, 80, 128, False)]


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("shape", BF16_SHAPES,
                         ids=[f"{a}x{b}-d{d}{'-causal' if c else ''}" for a, b, d, c in BF16_SHAPES])
def test_bf16_gradients_within_the_derived_bound_of_float64(shape, deterministic):
    """bf16 q, k, v, o, dO (float32 arrays of bf16 values): the run is bf16 by dtype=, its gradients
    bf16 values, each within the bound derived for bf16 (u = 2^-8 in place of fp16's 2^-11)."""
    nq, nk, d, causal = shape
    q, k, v, o, lse, do = _problem(nq, nk, d, causal, dtype="bf16")
    res = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic, dtype="bf16")
    assert res.dtype == "bf16" and res.config.dtype == "bf16"
    _assert_within_bound(res, q, k, v, do, causal, "bf16")


def test_bf16_deterministic_dq_is_the_atomic_modes_with_one_kv_block_and_dk_dv_in_both():
    """As for fp16: with one K/V block the dQ kernel's recomputed bf16 dS gives the atomic mode's dQ
    bit for bit, and dK, dV are the same bits in both modes (two K/V blocks with a tail)."""
    q, k, v, o, lse, do = _problem(70, 45, 64, True, dtype="bf16")
    det = simulate_backward(q, k, v, o, lse, do, causal=True, deterministic=True, dtype="bf16")
    at = simulate_backward(q, k, v, o, lse, do, causal=True, deterministic=False, dtype="bf16")
    assert np.abs(det.dq).max() > 0 and det.dq.tobytes() == at.dq.tobytes()
    q, k, v, o, lse, do = _problem(70, 90, 32, False, dtype="bf16")
    det = simulate_backward(q, k, v, o, lse, do, deterministic=True, dtype="bf16")
    at = simulate_backward(q, k, v, o, lse, do, deterministic=False, dtype="bf16")
    assert det.dk.tobytes() == at.dk.tobytes() and det.dv.tobytes() == at.dv.tobytes()


def test_bf16_types_are_checked_in_one_line():
    from fa_sim.contract.backward import BackwardConfig

    q, k, v, o, lse, do = _problem(16, 16, 32, False, dtype="bf16")
    base = dict(q=q, k=k, v=v, o=o, lse=lse, do=do)
    rough = do + np.float32(2.0 ** -12)  # not a bf16 value: bf16 holds 8 significand bits
    cases = [
        (dict(do=rough, dtype="bf16"), r"do \(float32\) holds .* values that bf16 does not represent exactly"),
        (dict(dtype="bf16", config=BackwardConfig(32)), "config.dtype is 'fp16' but dtype='bf16'"),
        (dict(dtype="fp32"), "dtype 'fp32' is not supported"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            simulate_backward(**{**base, **change})
        assert "\n" not in str(info.value)
    torch = pytest.importorskip("torch")
    t = [torch.from_numpy(x) for x in (q, k, v, o, do)]
    mixed = [t[0].bfloat16(), t[1].bfloat16(), t[2].bfloat16(), t[3].bfloat16(), t[4].half()]
    mix = r"q, k, v, o, do mix fp16 and bf16 \(q is bfloat16, .* do is float16\)"
    with pytest.raises(ValueError, match=mix) as info:
        simulate_backward(*mixed[:4], lse, mixed[4])
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="too large for the backward's fp32 accumulators"):
        simulate_backward(q, k, v, o, lse, do * np.float32(2.0 ** 120), dtype="bf16")


# head_dim 96, 160, 192 (DEFAULT_TILES: 64, 32 and 16 queries per Q block; 3, 5, 3 copy column passes):
# tails both ways, causal and not, two K/V blocks.
WIDE = [(70, 45, 96, True), (40, 70, 160, False), (33, 80, 192, True)]


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("shape", WIDE, ids=[f"{a}x{b}-d{d}{'-causal' if c else ''}" for a, b, d, c in WIDE])
def test_wide_head_dims_within_the_derived_bound(shape, deterministic):
    """fp16: the bound grows with head_dim (its d 2^-24 sums): up to 45 u of the largest gradient at
    these shapes, checked against 64 u."""
    nq, nk, d, causal = shape
    q, k, v, o, lse, do = _problem(nq, nk, d, causal)
    res = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=deterministic)
    assert (res.config.head_dim, res.config.block_m) == (d, {96: 64, 160: 32, 192: 16}[d])
    _assert_within_bound(res, q, k, v, do, causal, ulps=64)


@pytest.mark.parametrize("shape", WIDE, ids=[f"{a}x{b}-d{d}{'-causal' if c else ''}" for a, b, d, c in WIDE])
def test_wide_head_dims_in_bf16_within_the_derived_bound(shape):
    nq, nk, d, causal = shape
    q, k, v, o, lse, do = _problem(nq, nk, d, causal, dtype="bf16")
    res = simulate_backward(q, k, v, o, lse, do, causal=causal, dtype="bf16")
    _assert_within_bound(res, q, k, v, do, causal, "bf16", ulps=64)


def test_batches_and_heads_index_their_own_slices():
    """B = H = 2 (grid y = 4): each batch-head's gradients within the bound, and equal to running
    that batch-head alone, bit for bit."""
    q, k, v, o, lse, do = _problem(40, 70, 32, True, batch=2, heads=2)
    res = simulate_backward(q, k, v, o, lse, do, causal=True)
    *want, bq, bk, bv = attention_backward(q, k, v, do, causal=True, bound=True)
    for got, ref, bound in zip((res.dq, res.dk, res.dv), want, (bq, bk, bv)):
        assert (np.abs(got.astype(np.float64) - ref) <= bound).all()
    one = simulate_backward(*(x[1:, 1:] for x in (q, k, v, o, lse, do)), causal=True)
    for a, b in ((res.dq, one.dq), (res.dk, one.dk), (res.dv, one.dv)):
        assert a[1:, 1:].tobytes() == b.tobytes()


def test_reference_gradients_are_the_derivatives_of_attention():
    """Central differences of L = sum(O o dO) in float64 on a tiny causal problem with Nq != Nk."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s) for s in ((1, 5, 4), (1, 7, 4), (1, 7, 4)))
    do = rng.standard_normal((1, 5, 4))
    grads = attention_backward(q, k, v, do, causal=True, scale=0.7)
    for x, g in zip((q, k, v), grads):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + 1e-6
            hi = (attention(q, k, v, causal=True, scale=0.7)[0] * do).sum()
            x[idx] = old - 1e-6
            lo = (attention(q, k, v, causal=True, scale=0.7)[0] * do).sum()
            x[idx] = old
            num[idx] = (hi - lo) / 2e-6
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)


TAILS = [(70, 90, 32, False), (70, 90, 32, True), (70, 90, 64, False), (70, 90, 64, True)]


@pytest.mark.parametrize("shape", TAILS, ids=[f"{a}x{b}-d{d}{'-causal' if c else ''}" for a, b, d, c in TAILS])
def test_deterministic_dq_does_not_depend_on_the_schedule_and_dk_dv_not_on_the_mode(shape):
    """The dQ kernel (2 K/V blocks with a tail, 2 CTAs of 64 queries with a tail): all CTAs in one
    wave and one CTA per wave (another interleaving of the CTAs' instructions) give the same bits;
    dQ within the bound; dK, dV bit for bit those of the atomic mode (the same main kernel, less its
    dQ GEMM)."""
    nq, nk, d, causal = shape
    q, k, v, o, lse, do = _problem(nq, nk, d, causal)
    a = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=True)
    b = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=True, wave_ctas=1)
    at = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=False)
    assert list(a.instructions)[2] == "fa2_bwd_dq_kernel" and list(at.instructions)[2] == "fa2_bwd_convert_dq_kernel"
    for x, y in ((a.dq, b.dq), (a.dk, b.dk), (a.dv, b.dv)):
        assert x.view(np.uint16).tobytes() == y.view(np.uint16).tobytes()
    assert a.dk.view(np.uint16).tobytes() == at.dk.view(np.uint16).tobytes()
    assert a.dv.view(np.uint16).tobytes() == at.dv.view(np.uint16).tobytes()
    want, bound = attention_backward(q, k, v, do, causal=causal, bound=True)[::3]
    assert (np.abs(a.dq.astype(np.float64) - want) <= bound).all()


@pytest.mark.parametrize("mma_model", [None, "h200"])
def test_the_dq_kernel_recomputes_the_main_kernels_ds_bit_for_bit(mma_model):
    """One K/V block: the atomic mode's dQ is one partial dS K (from 0, the same k16 segments) added
    to 0, the dQ kernel's the same mma chain on its own recomputed dS - equal bits iff its S, P, dP
    and dS (fp16) are the main kernel's, element for element."""
    q, k, v, o, lse, do = _problem(70, 45, 64, True)
    det = simulate_backward(q, k, v, o, lse, do, causal=True, deterministic=True, mma_model=mma_model)
    at = simulate_backward(q, k, v, o, lse, do, causal=True, deterministic=False, mma_model=mma_model)
    assert np.abs(det.dq).max() > 0 and det.dq.view(np.uint16).tobytes() == at.dq.view(np.uint16).tobytes()


@pytest.mark.parametrize("shape", [(70, 45, 64, True), (33, 80, 128, False), (70, 90, 32, True), (40, 70, 160, True)],
                         ids=["causal-tails", "d128", "two-kv-blocks", "d160-copy-passes"])
def test_the_main_and_dq_kernels_are_free_of_hazards(shape):
    nq, nk, d, causal = shape
    hz, hz_dq = HazardChecker(), HazardChecker()
    simulate_backward(*_problem(nq, nk, d, causal), causal=causal, observers=[hz], dq_observers=[hz_dq])
    for checker, name in ((hz, "fa2_bwd_kernel"), (hz_dq, "fa2_bwd_dq_kernel")):
        rep = checker.report()
        assert rep.ok, (name, rep.hazards[:3])
        assert checker.launch is not None and checker.launch.kernel == name


def test_a_dropped_barrier_is_a_hazard_at_its_source_line(tmp_path):
    """BAR_DS removed from a copy of fa2_bwd.cu: warps read other warps' dS^T from sdS before it is
    written (and the next Q block's copies overwrite sQ, sdO while others still read them)."""
    text = BWD_PATH.read_text()
    line = "if (!FA_DROP_BAR_DS) __syncthreads();"
    assert text.count(line) == 1
    path = tmp_path / "fa2_bwd_no_bar_ds.cu"
    path.write_text(text.replace(line, ";"))
    hz = HazardChecker(limit=10**6)
    simulate_backward(*_problem(64, 64, 64, False), deterministic=False, observers=[hz], kernel=path)  # sdS
    rep = hz.report()
    raw = [h for h in rep.hazards if h.kind is HazardKind.RAW_NO_BARRIER]
    assert raw, rep.counts
    assert any(h.src is not None and h.src.file.endswith(path.name) for h in raw)


def test_a_dropped_load_barrier_is_a_hazard():
    hz = HazardChecker(limit=10**6)
    simulate_backward(*_problem(64, 64, 64, False), observers=[hz], macros={"FA_DROP_BAR_LOAD": 1})
    assert not hz.report().ok


@pytest.mark.parametrize("macro", ["FA_DROP_BAR_KV", "FA_DROP_BAR_FREE"])
def test_a_dropped_barrier_of_the_dq_kernel_is_a_hazard(macro):
    """BAR_KV: warps read sK, sV, sQ before the other threads' copies landed; BAR_FREE (3 K/V
    blocks): the next block's copies overwrite sK, sV while other warps still read them."""
    hz, hz_main = HazardChecker(limit=10**6), HazardChecker()
    simulate_backward(*_problem(32, 130, 32, False), observers=[hz_main], dq_observers=[hz], macros={macro: 1})
    rep = hz.report()
    assert hz.launch.kernel == "fa2_bwd_dq_kernel" and not rep.ok, rep.counts
    assert hz_main.report().ok  # the macro touches the dQ kernel only


def test_bad_inputs_are_one_line_errors():
    q, k, v, o, lse, do = _problem(16, 16, 32, False)
    bad = do.copy()
    bad[0, 0, 3, 5] = np.nan
    cases = [
        (dict(do=bad), r"do contains NaN or Inf, first at do\[0, 0, 3, 5\]"),
        (dict(lse=None), "lse is missing"),
        (dict(do=do[:, :, :8]), r"do must have q's shape"),
        (dict(lse=lse.astype(np.float64)), "lse must be float32"),
        (dict(lse=lse[:, :, :8]), r"lse must have shape \(1, 1, 16\)"),
        (dict(o=o[..., :16]), r"o must have q's shape"),
    ]
    base = dict(q=q, k=k, v=v, o=o, lse=lse, do=do)
    for change, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            simulate_backward(**{**base, **change})
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="deterministic must be True or False"):
        simulate_backward(**base, deterministic="yes")
    with pytest.raises(ValueError, match="dq_observers watch fa2_bwd_dq_kernel"):
        simulate_backward(**base, deterministic=False, dq_observers=[HazardChecker()])
