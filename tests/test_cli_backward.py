"""The backward pass in the `fa` command: `fa explain --backward` (exact fractions against the
float64 reference), `fa sim --backward` (errors against the derived bound, bad input, hazards),
`fa banks --backward` and `fa trace --backward` (one lane's S, P, dP, dS, dV, dK at their
coordinates against float64). Shapes are small: every lane of the PTX engine is simulated."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from test_docs import DOCS, assert_prints, read_outputs

from fa_sim.cli import main
from fa_sim.reference import SPEC_EXAMPLE, Ln, attention_backward, walkthrough_backward


def _floats(m) -> np.ndarray:
    return np.array([[float(Fraction(x)) for x in row] for row in m], dtype=np.float64)


# -- fa explain --backward ------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("block_n", [1, 2, 4])
def test_exact_backward_walkthrough_equals_float64(causal, block_n):
    w = SPEC_EXAMPLE.walkthrough_backward(causal=causal, block_n=block_n)
    q, k, v, do = (_floats(x) for x in (SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, SPEC_EXAMPLE.do))
    dq, dk, dv = attention_backward(q, k, v, do, causal=causal, scale=math.log(2))
    s = math.log(2)
    np.testing.assert_allclose(s * _floats(w.dq_over_s), dq, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(s * _floats(w.dk_over_s), dk, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(_floats(w.dv), dv, rtol=1e-14, atol=1e-15)
    # every intermediate is an exact Fraction (2^S with integer S keeps them rational)
    for blk in w.blocks:
        for m in (blk.p, blk.dp, blk.ds, blk.dv, blk.dk_over_s, blk.dq_over_s):
            assert all(isinstance(x, Fraction) for row in m for x in row)
    assert all(sum((sum(b.ds[i]) for b in w.blocks), Fraction(0)) == 0 for i in range(len(w.o)))
    assert w.dq_over_s == w.blocks[-1].dq_sum_over_s


def test_exact_backward_known_values():
    """Hand-checkable values of the default example (dO = [[1, -1], [2, 1]]): D = rowsum(dO o O) with
    O = [[7/8, 3/4], [4/3, 1/3]] is (7/8 - 3/4, 8/3 + 1/3) = (1/8, 3); P of block 0 row 0 is
    2^0 / 8, 2^1 / 8."""
    w = SPEC_EXAMPLE.walkthrough_backward()
    assert w.d == (Fraction(1, 8), Fraction(3))
    assert w.blocks[0].p[0] == (Fraction(1, 8), Fraction(1, 4))
    assert w.blocks[0].ds[0] == (Fraction(7, 64), Fraction(-9, 32))  # 1/8 (1 - 1/8), 1/4 (-1 - 1/8)
    assert w.dq_over_s == ((Fraction(-13, 32), Fraction(33, 64)), (Fraction(-2, 9), Fraction(2, 3)))


def test_exact_backward_refuses_bad_inputs():
    with pytest.raises(ValueError, match=r"do must have shape \[Nq, dv\]"):
        walkthrough_backward(SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, ((1, 2),), scale=Ln(2))
    with pytest.raises(ValueError, match="not ln"):
        walkthrough_backward(SPEC_EXAMPLE.q, SPEC_EXAMPLE.k, SPEC_EXAMPLE.v, SPEC_EXAMPLE.do, scale=0.5)


def test_fa_explain_backward_prints_the_exact_tables(capsys):
    assert main(["explain", "--backward"]) == 0
    out = capsys.readouterr().out
    assert "D = rowsum(dO o O)" in out and "K/V block 1: keys 2, 3" in out
    assert "-13/32  33/64" in out  # dQ / s row 0
    assert "Check: each row of dS sums to 0, 0" in out
    assert main(["explain", "--backward", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["d"] == ["1/8", "3"] and data["dq_over_s"][0] == ["-13/32", "33/64"]
    assert [b["keys"] for b in data["blocks"]] == [[0, 1], [2, 3]]


def test_seeded_do_follows_the_forward_inputs():
    """--backward sees the forward commands' q, k, v for the same options, and dO the next draw."""
    from fa_sim.reference import random_inputs, random_inputs_backward
    q, k, v, do = random_inputs_backward(2, 1, 5, 7, 32, seed=3)
    for a, b in zip((q, k, v), random_inputs(2, 1, 5, 7, 32, seed=3)):
        assert a.tobytes() == b.tobytes()
    assert do.shape == q.shape and do.dtype == np.float16 and not np.array_equal(do, q)


# -- fa sim --backward -------------------------------------------------------------------------------------


def _engine():
    pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")


SMALL = ["--seqlen", "40", "--seqlen-k", "70", "--head-dim", "32", "--causal"]


@pytest.mark.parametrize("mode", ["deterministic", "atomic"])
def test_fa_sim_backward_reports_errors_within_the_bound(capsys, mode):
    _engine()
    assert main(["sim", "--backward", *SMALL, "--dq", mode, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dq_mode"] == mode and out["above_bound"] == []
    # the same numbers as measured here against the float64 reference on the same seeded inputs
    import fa_sim
    from fa_sim.reference import random_inputs_backward
    q, k, v, do = random_inputs_backward(1, 1, 40, 70, 32, seed=0)
    fwd = fa_sim.simulate(q, k, v, causal=True)
    res = fa_sim.simulate_backward(q, k, v, fwd.o, fwd.lse, do, causal=True, deterministic=mode == "deterministic")
    *want, bq, bk, bv = attention_backward(q, k, v, do, causal=True, bound=True)
    for name, got, ref, bound in zip(("dq", "dk", "dv"), (res.dq, res.dk, res.dv), want, (bq, bk, bv)):
        err = np.abs(got.astype(np.float64) - ref)
        g = out["gradients"][name]
        assert g["max_abs_err"] == pytest.approx(err.max(), rel=1e-12)
        assert g["rel_err"] == pytest.approx(err.max() / np.abs(ref).max(), rel=1e-12)
        assert g["err_over_bound"] == pytest.approx((err / bound).max(), rel=1e-12)
        assert 0 < g["err_over_bound"] <= 1 and g["nonfinite"] == 0
    main_counts = out["instructions"]["fa2_bwd_kernel"]
    # Causal, Nk = 70 > Nq = 40: CTA 1 (keys 64..69) sees no query and runs no round; CTA 0 runs one
    # Q block: 4 warps x 5 GEMMs (S, dV, dP, dK, dQ) of 16 mma each at d = 32, and 2 barriers; the
    # deterministic mode's main kernel skips dQ, and its dQ kernel (one CTA: queries 0..39, causal:
    # K/V block 0 only) runs 4 warps x 3 GEMMs (S, dP, dQ) of 16 mma and 2 barriers.
    gemms = 4 if mode == "deterministic" else 5
    assert main_counts["HMMA"] == 4 * gemms * 16 and main_counts["BAR"] == 4 * 2
    third = "fa2_bwd_dq_kernel" if mode == "deterministic" else "fa2_bwd_convert_dq_kernel"
    assert list(out["instructions"]) == ["fa2_bwd_preprocess_kernel", "fa2_bwd_kernel", third]
    if mode == "deterministic":
        assert out["instructions"][third]["HMMA"] == 4 * 3 * 16 and out["instructions"][third]["BAR"] == 4 * 2


def test_fa_sim_backward_table(capsys):
    _engine()
    assert main(["sim", "--backward", "--seqlen", "64", "--head-dim", "32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fa sim --backward: B=1 H=1 Nq=64 Nk=64 d=32 non-causal")
    for name in ("dQ", "dK", "dV"):
        assert any(line.split()[:1] == [name] for line in out.splitlines())
    assert "ABOVE BOUND" not in out and "preprocess" in out and "main" in out


def test_fa_sim_backward_bad_input_is_one_line(tmp_path, capsys):
    _engine()
    from fa_sim.reference import random_inputs_backward
    q, k, v, do = random_inputs_backward(1, 1, 16, 16, 32, seed=0)
    bad = do.copy()
    bad[0, 0, 3, 5] = np.nan
    files = {"nodo": dict(q=q, k=k, v=v), "nan": dict(q=q, k=k, v=v, do=bad),
             "shape": dict(q=q, k=k, v=v, do=do[:, :, :8]), "rank": dict(q=q, k=k, v=v, do=do[0])}
    want = {"nodo": "lacks array(s) do", "nan": r"do contains NaN or Inf, first at do[0, 0, 3, 5]",
            "shape": "do must have q's shape (1, 1, 16, 32)", "rank": "do must have rank 4"}
    for name, arrays in files.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        assert main(["sim", "--backward", "--npz", str(path)]) == 2
        err = capsys.readouterr().err
        assert want[name] in err and err.count("\n") == 1, err
    cases = [(["sim", "--backward", "--block-m", "64"], "--block-m does not apply with --backward"),
             (["sim", "--dq", "atomic"], "--dq does not apply without --backward"),
             (["sim", "--backward", "--workers", "2"], "--workers does not apply with --backward"),
             (["sim", "--backward", "--head-dim", "256"], "head_dim 256 is not supported by the backward pass"),
             (["sim", "--backward", "--kernel", str(tmp_path / "none.cu")], "takes an existing .cu file"),
             (["banks", "--backward", "--compare"], "--compare does not apply with --backward"),
             (["banks", "--instructions"], "--instructions does not apply without --backward")]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_fa_sim_backward_check_hazards(tmp_path, capsys):
    """The main kernel and the dQ kernel are race-free; a copy of fa2_bwd.cu without BAR_DS (whose
    sdS only the atomic mode writes) is reported, exit 1."""
    _engine()
    from fa_sim.contract.backward import BWD_PATH
    assert main(["sim", "--backward", "--seqlen", "64", "--head-dim", "32", "--check-hazards"]) == 0
    out = capsys.readouterr().out
    assert "main kernel (fa2_bwd_kernel) hazards: none" in out and "dQ kernel (fa2_bwd_dq_kernel) hazards: none" in out
    text = BWD_PATH.read_text()
    line = "if (!FA_DROP_BAR_DS) __syncthreads();"
    assert text.count(line) == 1
    path = tmp_path / "no_bar_ds.cu"
    path.write_text(text.replace(line, ";"))
    argv = ["sim", "--backward", "--seqlen", "64", "--head-dim", "32", "--check-hazards", "--dq", "atomic",
            "--kernel", str(path)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "RAW_NO_BARRIER" in out and "no_bar_ds.cu:" in out
    assert main([*argv, "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)["hazards"]
    assert rep["total"] > 0 and any(h["kind"] == "RAW_NO_BARRIER" for h in rep["hazards"])


# -- fa banks --backward ------------------------------------------------------------------------------------
def test_fa_banks_backward_counts_the_main_kernel(capsys):
    _engine()
    from fa_sim.backward import simulate_backward
    from fa_sim.observers.banks import BankCounter
    import fa_sim
    from fa_sim.reference import random_inputs_backward
    assert main(["banks", "--backward", "--seqlen", "64", "--head-dim", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kernel"] == "fa2_bwd_kernel"
    q, k, v, do = random_inputs_backward(1, 1, 64, 64, 32, seed=0)
    fwd = fa_sim.simulate(q, k, v)
    counter = BankCounter()
    simulate_backward(q, k, v, fwd.o, fwd.lse, do, deterministic=False, observers=[counter])  # with the dQ GEMM
    want = counter.report().to_json()
    assert out["phases"] == want["phases"] and out["rounds"] == want["rounds"]
    assert set(out["phases"]) >= {"S", "dV", "dP", "dS", "dK", "dQ"}
    assert main(["banks", "--backward", "--seqlen", "64", "--head-dim", "32"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("fa banks --backward: fa2_bwd_kernel") and "dQ        LDSM" in text


# -- fa trace --backward ------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, cta, warp, lane", [
    (["--seqlen", "100", "--seqlen-k", "70", "--causal"], 1, 0, 9),  # CTA 1 starts at Q block 1; tails both ways
    (["--seqlen", "64", "--seqlen-k", "128"], 0, 3, 30),  # two K/V blocks; warp 3 of dQ's 4 x 1 warp grid
])
def test_fa_trace_backward_values_sit_at_their_coordinates(capsys, argv, cta, warp, lane):
    """Each traced value equals float64 at the coordinates the view gives it: S = q.k, P, dP = dO.v, dS,
    dV and dK/s after the round, the dQ partial / s; masked slots P = dS = 0."""
    _engine()
    from fa_sim.reference import attention, random_inputs_backward
    assert main(["trace", "--backward", *argv, "--head-dim", "32", "--cta", str(cta), "--warp", str(warp),
                 "--lane", str(lane), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    nq, nk = int(argv[1]), int(argv[3])
    causal = "--causal" in argv
    q, k, v, do = (x[0, 0].astype(np.float64) for x in random_inputs_backward(1, 1, nq, nk, 32, seed=0))
    s = 1 / math.sqrt(32)
    o, lse = attention(q, k, v, causal=causal, scale=s)
    sc = q @ k.T
    p = np.exp(s * sc - lse[:, None])
    if causal:
        p[np.arange(nk)[None, :] > np.arange(nq)[:, None]] = 0
    dp = do @ v.T
    ds = p * (dp - (do * o).sum(-1, keepdims=True))
    assert out["round"] == 0 and out["m_block"] == (1 if causal else 0) and out["mmas"]["S"] == 16
    sco = out["scores"]
    key, query, msk = (np.array(sco[x]) for x in ("key", "query", "masked"))
    inside = (key < nk) & (query < nq)
    ki, qi = key[inside], query[inside]
    got = {x: np.array(sco[x]) for x in ("s", "p", "dp", "ds")}
    np.testing.assert_allclose(got["s"][inside], sc[qi, ki], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got["dp"][inside], dp[qi, ki], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got["p"][inside], p[qi, ki], rtol=2e-3, atol=1e-6)
    np.testing.assert_allclose(got["ds"][inside], ds[qi, ki], rtol=1e-2, atol=2e-3 * np.abs(ds).max())
    assert (got["p"][msk] == 0).all() and (got["ds"][msk] == 0).all() and msk.any() == (causal or nk % 64 != 0)
    assert (got["s"][~inside] == 0).all()  # zero-filled rows of the tiles past Nq / Nk
    # dV and dK / s after round 0: CTA's keys see only this Q block here (causal: Q block 1 is its first and
    # last; non-causal: Nq = 64 is one Q block), so the accumulators are the whole gradients
    dv_ref, dk_ref = p.T @ do, ds.T @ q
    acc = out["accumulators"]
    ak, ac = np.array(acc["key"]), np.array(acc["col"])
    ok = ak < nk
    np.testing.assert_allclose(np.array(acc["dv"])[ok], dv_ref[ak[ok], ac[ok]], rtol=1e-2,
                               atol=3e-3 * np.abs(dv_ref).max())
    np.testing.assert_allclose(np.array(acc["dk_over_s"])[ok], dk_ref[ak[ok], ac[ok]], rtol=1e-2,
                               atol=3e-3 * np.abs(dk_ref).max())
    key0 = (cta % -(-nk // 64)) * 64
    part = ds[:, key0:key0 + 64] @ k[key0:key0 + 64]
    dq = out["dq_partial"]
    dqq, dqc = np.array(dq["query"]), np.array(dq["col"])
    ok = dqq < nq
    np.testing.assert_allclose(np.array(dq["dq_over_s"])[ok], part[dqq[ok], dqc[ok]], rtol=1e-2,
                               atol=3e-3 * np.abs(part).max())


def test_fa_trace_backward_refuses_rounds_and_selections_outside_the_grid(capsys):
    cases = [(["--seqlen", "40", "--seqlen-k", "70", "--causal", "--cta", "1"],
              "--round 0 is not a round of CTA 1 (K/V block 1): it runs no round; under --causal it starts at "
              "Q block 1"),
             (["--seqlen", "64", "--cta", "1"], "--cta 1 is outside the backward grid: 1 CTAs"),
             (["--seqlen", "64", "--warp", "4"], "--warp 4 is outside the CTA: 4 warps"),
             (["--seqlen", "64", "--round", "1"], "it runs round 0 only; Nq = 64 queries in Q blocks of block_m = 64"),
             (["--seqlen", "64", "--ops", "HMMA"], "--ops does not apply with --backward")]
    for argv, message in cases:
        assert main(["trace", "--backward", "--head-dim", "32", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_fa_trace_backward_table(capsys):
    _engine()
    assert main(["trace", "--backward", "--seqlen", "64", "--head-dim", "32", "--warp", "1", "--lane", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fa trace --backward: CTA 0 (K/V block 0: keys 0..63, batch-head 0), warp 1, lane 5")
    assert "mma per phase: S 16, dV 16, dP 16, dK 16, dQ 16" in out
    assert "  [0][0]     17     2" in out  # key 16 + g = 17, query 2 tq = 2


# -- fa hw --backward, fa compare --backward ---------------------------------------------------------------
def test_match_gradients_requires_bits_or_the_bound():
    """The decision of fa compare --backward, on arrays: one ulp off in dK fails both modes; dQ one ulp
    off fails the deterministic mode and passes the atomic mode while within the bound."""
    from fa_sim.commands.backward_gpu import match_gradients
    rng = np.random.default_rng(0)
    g = {n: rng.standard_normal((1, 1, 8, 4)).astype(np.float16) for n in ("dq", "dk", "dv")}
    ref = {n: x.astype(np.float64) for n, x in g.items()}
    bound = {n: np.abs(x) * 2.0**-9 + 1e-6 for n, x in ref.items()}
    same = match_gradients(g, {n: x.copy() for n, x in g.items()}, ref, bound, True)
    assert all(m.ok and m.identical == 1.0 and m.max_ulps == 0 for m in same.values())
    for name, det, ok in (("dk", True, False), ("dk", False, False), ("dq", True, False), ("dq", False, True)):
        other = {n: x.copy() for n, x in g.items()}
        bits = other[name].view(np.uint16)
        bits[0, 0, 3, 1] += 1  # one ulp away from zero
        res = match_gradients(g, other, ref, bound, det)
        assert res[name].max_ulps == 1 and res[name].identical == 1 - 1 / 32
        assert res[name].ok is ok, (name, det)
    far = {n: x.copy() for n, x in g.items()}
    far["dq"][0, 0, 0, 0] += np.float16(1.0)
    assert not match_gradients(g, far, ref, bound, False)["dq"].ok  # atomic dQ outside the bound


def _engine_as_gpu(monkeypatch, flip=None):
    """fa_hw's forward and backward replaced by the simulator's (the backward with the H200 mma model,
    `flip` = (cta_sel, checkpoint, round, thread, word) toggles one bit of its checkpoint buffer):
    fa compare --backward's own logic on the CPU."""
    import dataclasses

    import fa_hw
    import fa_hw.runtime
    import fa_sim
    from fa_sim.backward import simulate_backward

    def backward(*a, **kw):
        res = simulate_backward(*a, mma_model="h200", **kw)
        if flip is not None:
            buf = res.checkpoints.copy()
            buf[flip] ^= 1
            res = dataclasses.replace(res, checkpoints=buf)
        return res

    monkeypatch.setattr(fa_hw.runtime, "device", lambda *a: None)
    monkeypatch.setattr(fa_hw, "forward", lambda q, k, v, causal=False, scale=None, dtype=None: fa_sim.simulate(
        q, k, v, causal=causal, scale=scale, dtype=dtype))
    monkeypatch.setattr(fa_hw, "backward", backward)


def test_fa_compare_backward_prints_each_checkpoint_and_fails_on_a_difference(capsys, monkeypatch):
    """The table of fa compare --backward (every checkpoint identical when both sides are the engine),
    --ctas in the main kernel's grid, and exit 1 naming the first differing word of a flipped bit."""
    from fa_sim.checkpoints import BackwardCheckpoint, BackwardCheckpointLayout

    shape = ["--seqlen", "70", "--seqlen-k", "90", "--head-dim", "64", "--causal"]
    _engine_as_gpu(monkeypatch)
    assert main(["compare", "--backward", *shape, "--ctas", "1"]) == 0
    out = capsys.readouterr().out
    assert "checkpoints of the main kernel's CTAs [1], per round (Q block visited):" in out
    for name in ("S", "P", "dP", "dS", "dV", "dK", "sQ", "sdO", "sK", "sV"):
        line = next(ln for ln in out.splitlines() if ln.split()[:1] == [name])
        assert "100.0000%" in line and line.rstrip().endswith("-"), line
    assert main(["compare", "--backward", *shape, "--ctas", "2"]) == 2
    assert "--ctas must be distinct CTA ids in 0..1" in capsys.readouterr().err
    at = BackwardCheckpointLayout.index(BackwardCheckpoint.DK)
    _engine_as_gpu(monkeypatch, flip=(0, at, 1, 70, 3))
    assert main(["compare", "--backward", *shape, "--json"]) == 1
    obj = json.loads(capsys.readouterr().out)
    assert obj["ctas"] == [0, 1] and not obj["ok"]
    bad = {n: c for n, c in obj["checkpoints"].items() if not c["ok"]}
    assert list(bad) == ["dK"] and bad["dK"]["first_mismatch"]["round"] == 1
    first = bad["dK"]["first_mismatch"]
    assert (first["cta"], first["warp"], first["lane"], first["register"]) == (0, 2, 6, 3)
    assert all(g["ok"] for g in obj["gradients"].values())


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["deterministic", "atomic"])
def test_fa_hw_and_fa_compare_backward_on_the_gpu(capsys, mode):
    """On a GPU: fa hw --backward within the bound; fa compare --backward: the deterministic mode bit for
    bit against the PTX engine, the atomic mode's dK, dV bit for bit and dQ within the bound."""
    import fa_hw
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    shape = ["--seqlen", "100", "--seqlen-k", "70", "--heads", "2", "--head-dim", "64", "--causal", "--dq", mode]
    assert main(["hw", "--backward", *shape, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["above_bound"] == [] and out["dq_mode"] == mode
    assert main(["compare", "--backward", *shape, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["gradients"]["dk"]["identical"] == 1.0 and out["gradients"]["dv"]["identical"] == 1.0
    assert out["ctas"] == [0, 3] and len(out["checkpoints"]) == 10  # the first and the last of 2 x 2 CTAs
    assert all(c["fraction_identical"] == 1.0 and c["values"] > 0 for c in out["checkpoints"].values())
    if mode == "deterministic":
        assert out["gradients"]["dq"]["identical"] == 1.0


# -- --dtype bf16 and the head dims 96, 160, 192 with --backward ----------------------------------------------
def test_seeded_bf16_inputs_are_the_same_draws():
    """--dtype bf16: q, k, v those of the forward commands' bf16 draw, dO the next draw, each the fp16
    run's draw rounded to bf16 instead of fp16."""
    from fa_sim.reference import random_inputs, random_inputs_backward
    got = random_inputs_backward(2, 1, 5, 7, 32, seed=3, dtype="bf16")
    for a, b in zip(got[:3], random_inputs(2, 1, 5, 7, 32, seed=3, dtype="bf16")):
        assert a.dtype == np.float32 and a.tobytes() == b.tobytes()
    half = random_inputs_backward(2, 1, 5, 7, 32, seed=3)
    for a, h in zip(got, half):
        assert not (a.view(np.uint32) & 0xFFFF).any()  # bf16 values
        np.testing.assert_allclose(a, h.astype(np.float32), rtol=2.0**-8, atol=0)  # the same draws
    assert not np.array_equal(got[3], half[3].astype(np.float32))
    with pytest.raises(ValueError, match="choose fp16 or bf16"):
        random_inputs_backward(1, 1, 4, 4, 32, dtype="fp8")


def _bf16_errors(q, k, v, do, causal, mode):
    import fa_sim
    fwd = fa_sim.simulate(q, k, v, causal=causal, dtype="bf16")
    res = fa_sim.simulate_backward(q, k, v, fwd.o, fwd.lse, do, causal=causal, deterministic=mode == "deterministic",
                                   dtype="bf16")
    assert res.dtype == "bf16"
    *want, bq, bk, bv = attention_backward(q, k, v, do, causal=causal, bound=True, dtype="bf16")
    *_, fq, fk, fv = attention_backward(q, k, v, do, causal=causal, bound=True)  # fp16's bound: 8x tighter
    out = {}
    for name, got, ref, bound, bound16 in zip(("dq", "dk", "dv"), (res.dq, res.dk, res.dv), want, (bq, bk, bv),
                                              (fq, fk, fv)):
        err = np.abs(got.astype(np.float64) - ref)
        out[name] = (err.max(), (err / bound).max(), (err / bound16).max())
    return out


@pytest.mark.parametrize("mode", ["deterministic", "atomic"])
def test_fa_sim_backward_bf16_uses_the_bf16_bound(capsys, mode):
    _engine()
    from fa_sim.reference import random_inputs_backward
    assert main(["sim", "--backward", "--dtype", "bf16", *SMALL, "--dq", mode, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == "bf16" and out["above_bound"] == [] and out["dq_mode"] == mode
    want = _bf16_errors(*random_inputs_backward(1, 1, 40, 70, 32, seed=0, dtype="bf16"), True, mode)
    for name, (mx, of_bound, of_fp16_bound) in want.items():
        g = out["gradients"][name]
        assert g["max_abs_err"] == pytest.approx(mx, rel=1e-12)
        assert g["err_over_bound"] == pytest.approx(of_bound, rel=1e-12) and 0 < of_bound <= 1
        assert of_fp16_bound > of_bound  # the line is the bf16 bound's, not fp16's
    assert any(w[2] > 1 for w in want.values())  # bf16's errors exceed fp16's bound: the bound matters
    assert main(["sim", "--backward", "--dtype", "bf16", *SMALL, "--dq", mode]) == 0
    text = capsys.readouterr().out
    assert text.startswith("fa sim --backward: B=1 H=1 Nq=40 Nk=70 d=32 causal") and " bf16 dQ " + mode in text


def test_fa_sim_backward_bf16_npz(tmp_path, capsys):
    """--npz with --dtype bf16: float32 arrays of bf16 values give the seeded run's numbers; a value
    bf16 does not hold, or an fp16 file's values, are one line naming it."""
    _engine()
    from fa_sim.reference import random_inputs_backward
    q, k, v, do = random_inputs_backward(1, 1, 16, 24, 32, seed=5, dtype="bf16")
    np.savez(tmp_path / "b.npz", q=q, k=k, v=v, do=do)
    assert main(["sim", "--backward", "--dtype", "bf16", "--npz", str(tmp_path / "b.npz"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    argv = ["sim", "--backward", "--dtype", "bf16", "--seqlen", "16", "--seqlen-k", "24", "--head-dim", "32",
            "--seed", "5", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["gradients"] == got["gradients"]
    bad = do.copy()
    bad[0, 0, 2, 3] = np.float32(1.0001)
    np.savez(tmp_path / "x.npz", q=q, k=k, v=v, do=bad)
    np.savez(tmp_path / "h.npz", **dict(zip("qkv", random_inputs_backward(1, 1, 16, 24, 32, seed=5))),
             do=random_inputs_backward(1, 1, 16, 24, 32, seed=5)[3])
    for name, message in (("x", "do (float32) holds 1 values that bf16 does not represent exactly, e.g. "
                                 "do[0, 0, 2, 3]"), ("h", "values that bf16 does not represent exactly")):
        assert main(["sim", "--backward", "--dtype", "bf16", "--npz", str(tmp_path / f"{name}.npz")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_fa_trace_backward_bf16_values(capsys):
    """The bf16 build's lane: P and dS read as bf16 (the fp16 reading of their bits would be far off),
    S = q.k exact on the bf16 inputs, P and dS within bf16's rounding of float64."""
    _engine()
    from fa_sim.reference import attention, random_inputs_backward
    assert main(["trace", "--backward", "--dtype", "bf16", "--seqlen", "64", "--head-dim", "32", "--warp", "1",
                 "--lane", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == "bf16"
    q, k, v, do = (x[0, 0].astype(np.float64) for x in random_inputs_backward(1, 1, 64, 64, 32, seed=0,
                                                                                dtype="bf16"))
    s = 1 / math.sqrt(32)
    o, lse = attention(q, k, v, scale=s)
    p = np.exp(s * (q @ k.T) - lse[:, None])
    ds = p * (do @ v.T - (do * o).sum(-1, keepdims=True))
    sco = out["scores"]
    key, query = np.array(sco["key"]), np.array(sco["query"])
    got = {x: np.array(sco[x], np.float32) for x in ("s", "p", "ds")}
    for x in ("p", "ds"):
        assert not (got[x].view(np.uint32) & 0xFFFF).any()  # bf16 values
    np.testing.assert_allclose(got["s"], (q @ k.T)[query, key], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["p"], p[query, key], rtol=2.0**-7, atol=1e-6)
    np.testing.assert_allclose(got["ds"], ds[query, key], rtol=3e-2, atol=1e-2 * np.abs(ds).max())
    assert main(["trace", "--backward", "--dtype", "bf16", "--seqlen", "64", "--head-dim", "32"]) == 0
    assert "P (bf16)" in capsys.readouterr().out


def test_fa_banks_backward_bf16_counts_the_bf16_build(capsys):
    _engine()
    import fa_sim
    from fa_sim.backward import simulate_backward
    from fa_sim.observers.banks import BankCounter
    from fa_sim.reference import random_inputs_backward
    argv = ["banks", "--backward", "--dtype", "bf16", "--seqlen", "40", "--head-dim", "96", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == "bf16" and out["config"]["head_dim"] == 96
    q, k, v, do = random_inputs_backward(1, 1, 40, 40, 96, seed=0, dtype="bf16")
    fwd = fa_sim.simulate(q, k, v, dtype="bf16")
    counter = BankCounter()
    simulate_backward(q, k, v, fwd.o, fwd.lse, do, deterministic=False, observers=[counter], dtype="bf16")
    want = counter.report().to_json()
    assert out["phases"] == want["phases"] and out["rounds"] == want["rounds"]


def test_fa_time_backward_bf16_times_the_bf16_build(capsys):
    _engine()
    import fa_sim
    from fa_sim.reference import random_inputs_backward
    from fa_sim.timing import predict_backward
    assert main(["time", "--backward", "--dtype", "bf16", "--heads", "1", "--seqlen", "64", "--head-dim", "32",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == "bf16"
    q, k, v, do = random_inputs_backward(1, 1, 64, 64, 32, seed=0, dtype="bf16")
    fwd = fa_sim.simulate(q, k, v, dtype="bf16")
    pred = predict_backward(q, k, v, fwd.o, fwd.lse, do, deterministic=True, dtype="bf16")
    assert out["kernel_ms"] == pytest.approx(pred.kernel_ms, rel=1e-12)


@pytest.mark.parametrize("command", ["sim", "trace", "banks", "time", "hw", "compare"])
def test_head_dim_256_is_refused_with_its_reason(capsys, command):
    """Before any engine or GPU work (fa hw / fa compare: before the GPU check too)."""
    assert main([command, "--backward", "--head-dim", "256", "--dtype", "bf16", "--seqlen", "16"]) == 2
    err = capsys.readouterr().err
    assert "head_dim 256 is not supported by the backward pass; choose one of (32, 64, 96, 128, 160, 192); " \
           "256: each warp keeps dV and dK" in err and err.count("\n") == 1, err


def test_fa_explain_refuses_dtype(capsys):
    for argv in (["explain", "--backward", "--dtype", "bf16"], ["explain", "--dtype", "fp16"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--dtype does not apply to fa explain" in err and "exact fractions" in err and err.count("\n") == 1


def test_match_gradients_counts_bf16_ulps():
    from fa_sim.commands.backward_gpu import match_gradients
    from fa_sim.isa.convert import f32_to_bf16_values
    rng = np.random.default_rng(1)
    g = {n: f32_to_bf16_values(rng.standard_normal((1, 1, 8, 4)).astype(np.float32)) for n in ("dq", "dk", "dv")}
    ref = {n: x.astype(np.float64) for n, x in g.items()}
    bound = {n: np.abs(x) * 2.0**-6 + 1e-6 for n, x in ref.items()}
    assert all(m.ok and m.max_ulps == 0 for m in match_gradients(g, g, ref, bound, True, "bf16").values())
    other = {n: x.copy() for n, x in g.items()}
    words = other["dk"].view(np.uint32)
    words[0, 0, 3, 1] += 1 << 16  # one bf16 ulp away from zero
    res = match_gradients(g, other, ref, bound, False, "bf16")
    assert res["dk"].max_ulps == 1 and not res["dk"].ok and res["dq"].ok
    with pytest.raises(ValueError, match="bf16 values"):
        match_gradients(g, {**g, "dv": g["dv"] + np.float32(1e-6)}, ref, bound, True, "bf16")


def _engine_as_gpu_hw(monkeypatch):
    """_engine_as_gpu, with fa_hw.backward's result also giving kernel_ms and registers (fa hw's table)."""
    import fa_hw
    from cli_helpers import as_hw_backward

    _engine_as_gpu(monkeypatch)
    sim = fa_hw.backward

    def backward(*a, **kw):
        return as_hw_backward(sim(*a, **kw))

    monkeypatch.setattr(fa_hw, "backward", backward)


@pytest.mark.parametrize("mode", ["deterministic", "atomic"])
def test_fa_hw_and_compare_backward_bf16_with_the_engine_as_gpu(capsys, monkeypatch, mode):
    """fa hw --backward --dtype bf16 and fa compare --backward --dtype bf16, their CPU parts: the bf16
    inputs reach the forward and the backward, errors against the bf16 bound, checkpoints and
    gradients compared (d = 160: its tiles block_m = 32)."""
    _engine()
    shape = ["--seqlen", "40", "--seqlen-k", "70", "--head-dim", "160", "--causal", "--dtype", "bf16", "--dq", mode]
    _engine_as_gpu_hw(monkeypatch)
    assert main(["hw", "--backward", *shape, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == "bf16" and out["above_bound"] == [] and out["config"]["block_m"] == 32
    assert main(["hw", "--backward", *shape]) == 0
    assert "warps=4 bf16" in capsys.readouterr().out
    _engine_as_gpu(monkeypatch)
    assert main(["compare", "--backward", *shape, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["dtype"] == "bf16" and out["ctas"] == [0, 1]
    assert all(c["fraction_identical"] == 1.0 for c in out["checkpoints"].values())
    assert all(g["identical"] == 1.0 and g["max_ulps"] == 0 for g in out["gradients"].values())


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 96, 160, 192])
@pytest.mark.parametrize("mode", ["deterministic", "atomic"])
def test_fa_hw_and_fa_compare_backward_bf16_on_the_gpu(capsys, mode, d):
    """On a GPU, --dtype bf16: fa hw --backward within the bf16 bound; fa compare --backward as for fp16
    (checkpoints bit for bit; dK, dV bit for bit; dQ bit for bit in the deterministic mode)."""
    import fa_hw
    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    shape = ["--seqlen", "100", "--seqlen-k", "70", "--heads", "2", "--head-dim", str(d), "--causal", "--dq", mode,
             "--dtype", "bf16"]
    assert main(["hw", "--backward", *shape, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["above_bound"] == [] and out["dtype"] == "bf16"
    assert main(["compare", "--backward", *shape, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["dtype"] == "bf16"
    assert out["gradients"]["dk"]["identical"] == 1.0 and out["gradients"]["dv"]["identical"] == 1.0
    assert all(c["fraction_identical"] == 1.0 and c["values"] > 0 for c in out["checkpoints"].values())
    if mode == "deterministic":
        assert out["gradients"]["dq"]["identical"] == 1.0


@pytest.mark.parametrize("command, lines", read_outputs(DOCS / "backward.md"),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_backward_doc_excerpts_are_real_output(command, lines, tmp_path, capsys, monkeypatch):
    """docs/backward.md's `<!-- output: COMMAND -->` excerpts are what the command prints."""
    _engine()
    assert_prints(command, lines, "docs/backward.md", tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("d, warp, lane, dtype", [(96, 2, 13, "fp16"), (160, 3, 30, "bf16"), (192, 1, 6, "fp16")])
def test_fa_trace_backward_head_dims_at_their_coordinates(capsys, d, warp, lane, dtype):
    """The lane view at head_dim 96, 160, 192 (block_m 64, 32, 16; dQ's warp grids 4 x 1, 2 x 2, 1 x 4):
    S, P, the dV accumulator after round 0 and the dQ partial against float64 at their coordinates."""
    _engine()
    from fa_sim.reference import attention, random_inputs_backward
    nq, nk = 50, 70
    assert main(["trace", "--backward", "--seqlen", str(nq), "--seqlen-k", str(nk), "--head-dim", str(d), "--dtype",
                 dtype, "--warp", str(warp), "--lane", str(lane), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == dtype and out["m_block"] == 0
    q, k, v, do = (x[0, 0].astype(np.float64) for x in random_inputs_backward(1, 1, nq, nk, d, seed=0, dtype=dtype))
    s = 1 / math.sqrt(d)
    o, lse = attention(q, k, v, scale=s)
    p = np.exp(s * q @ k.T - lse[:, None])
    ds = p * (do @ v.T - (do * o).sum(-1, keepdims=True))
    sc = out["scores"]
    key, query = np.array(sc["key"]), np.array(sc["query"])
    inside = (key < nk) & (query < nq)
    assert inside.any()
    np.testing.assert_allclose(np.array(sc["s"])[inside], (q @ k.T)[query[inside], key[inside]], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.array(sc["p"])[inside], p[query[inside], key[inside]], rtol=2.0**-7, atol=1e-6)
    rows = slice(0, min(nq, {96: 64, 160: 32, 192: 16}[d]))  # Q block 0
    acc = out["accumulators"]
    ak, ac = np.array(acc["key"]), np.array(acc["col"])
    dv = p[rows].T @ do[rows]
    np.testing.assert_allclose(np.array(acc["dv"])[ak < nk], dv[ak[ak < nk], ac[ak < nk]], rtol=1e-2,
                               atol=3e-3 * np.abs(dv).max())
    part = ds[:, :64] @ k[:64]
    dq = out["dq_partial"]
    dqq, dqc = np.array(dq["query"]), np.array(dq["col"])
    assert dqc.max() < d and (dqq < nq).any()
    np.testing.assert_allclose(np.array(dq["dq_over_s"])[dqq < nq], part[dqq[dqq < nq], dqc[dqq < nq]], rtol=1e-2,
                               atol=3e-3 * np.abs(part).max())
