"""The backward pass (fa_hw/kernels/fa2_bwd.cu) on the PTX engine: gradients against the float64
reference within the derived bound (fa_sim.reference.attention_backward, docs/backward.md
"Accuracy"), both dQ modes, the deterministic mode's dQ independent of how the CTAs are scheduled,
no hazards in the main and dQ kernels, dropped barriers caught, and the input checks. Problems are
small (B = H = 1, at most 2 x 3 blocks): every lane is simulated."""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

import fa_sim  # noqa: E402
from fa_sim.backward import simulate_backward  # noqa: E402
from fa_sim.contract.backward import BWD_PATH  # noqa: E402
from fa_sim.observers import HazardChecker, HazardKind  # noqa: E402
from fa_sim.reference import attention, attention_backward, random_inputs  # noqa: E402


def _problem(nq, nk, d, causal, seed=1, batch=1, heads=1):
    q, k, v = random_inputs(batch, heads, nq, nk, d, seed=seed)
    do = np.random.default_rng(seed + 100).standard_normal(q.shape).astype(np.float16)
    fwd = fa_sim.simulate(q, k, v, causal=causal)
    return q, k, v, fwd.o, fwd.lse, do


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
    *want, bq, bk, bv = attention_backward(q, k, v, do, causal=causal, bound=True)
    for name, got, ref, bound in zip(("dq", "dk", "dv"), (res.dq, res.dk, res.dv), want, (bq, bk, bv)):
        assert got.dtype == np.float16 and got.shape == ref.shape
        err = np.abs(got.astype(np.float64) - ref)
        worst = np.unravel_index(np.argmax(err / bound), err.shape)
        assert (err <= bound).all(), f"{name}: error {err[worst]:.3g} over the bound {bound[worst]:.3g} at {worst}"
        assert bound.max() < 0.02 * np.abs(ref).max()  # the bound is a few fp16 ulps, not a loose one


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


@pytest.mark.parametrize("shape", [(70, 45, 64, True), (33, 80, 128, False), (70, 90, 32, True)],
                         ids=["causal-tails", "d128", "two-kv-blocks"])
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
