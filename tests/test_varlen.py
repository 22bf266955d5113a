"""Issue 38 item 5: packed variable-length batches (fa_sim.varlen, FA_VARLEN; docs/features.md).

CPU: the PTX engine on a packed batch of 3 sequences with tails (Nq 5, 70, 33: with block_m 64, the
CTAs of Q block 1 of sequences 0 and 2 exit at once), causal and not, with GQA, equals per-sequence
runs of the dense kernel bit for bit (O and LSE) and float64 within the documented bounds
(fa_sim.accuracy, per sequence); its MMAs are those of the per-sequence runs (the CTAs past a
sequence do nothing); hazard-free; a schedule option (kv_stages, heavy_first) and a window the same;
bad inputs one line each before any work.
GPU (marked gpu): fa_hw.forward packed, bit-identical to the engine and to per-sequence fa_hw runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from fa_sim import KernelConfig, Problem, simulate
from fa_sim.accuracy import measure
from fa_sim.events import Op
from fa_sim.observers.hazards import HazardChecker, format_hazards
from fa_sim.varlen import cu_seqlens_of

from packed_inputs import dense_sequence, packed_inputs

SEED32 = KernelConfig(head_dim=32)
LQ, LK = [5, 70, 33], [9, 64, 40]


def _packed(lq=LQ, lk=LK, h=2, hk=1, d=32, seed=0):
    return packed_inputs(lq, lk, h, hk, d, seed)


_seq = dense_sequence


def _check_per_sequence(res, q, k, v, cq, ck, causal, config, window=None):
    """res (packed) equals each sequence's dense PTX run bit for bit and float64 within the bounds;
    returns the dense runs' MMA count."""
    hmma = 0
    for b in range(len(cq) - 1):
        if cq[b + 1] == cq[b]:
            continue
        qs, ks, vs = _seq(q, cq, b), _seq(k, ck, b), _seq(v, ck, b)
        dense = simulate(qs, ks, vs, causal=causal, config=config, window=window, engine="ptx")
        o_b = _seq(res.o, cq, b)
        lse_b = res.lse[:, cq[b]:cq[b + 1]][None]
        assert np.array_equal(o_b.view(np.uint16), dense.o.view(np.uint16)), f"sequence {b}: O"
        assert np.array_equal(lse_b.view(np.uint32), dense.lse.view(np.uint32)), f"sequence {b}: LSE"
        acc = measure(o_b, lse_b, qs, ks, vs, causal, res.scale, config, window=window)
        assert acc.ok, (b, acc.failures())
        hmma += dense.instructions[Op.HMMA]
    return hmma


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_equals_per_sequence_runs_and_float64(causal):
    q, k, v, cq, ck = _packed()
    res = simulate(q, k, v, causal=causal, config=SEED32, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert res.o.shape == (108, 2, 32) and res.lse.shape == (2, 108)
    hmma = _check_per_sequence(res, q, k, v, cq, ck, causal, SEED32)
    assert res.instructions[Op.HMMA] == hmma  # the CTAs past a sequence's end run no MMA
    prob = Problem(3, 2, 70, 64, causal, res.scale, SEED32, heads_k=1,
                   cu_seqlens=(tuple(map(int, cq)), tuple(map(int, ck))))
    assert prob.launch_grid == (2, 2, 3) and prob.cta_rounds == int(prob.rounds_per_cta(np.arange(prob.n_ctas)).sum())
    r1 = int(prob.sequence(1).n_rounds_of(1))  # Q block 1 of sequence 1 (70 queries)
    assert list(prob.rounds_per_cta(np.arange(1, prob.n_ctas, 2))) == [0, 0, r1, r1, 0, 0]  # Q block 1 of each (b, h)


def test_schedule_options_and_window_packed():
    """kv_stages / q_in_regs / heavy_first (causal: Q blocks reversed, the early exit on the other
    side) and a window, with an empty sequence in the middle (Nq = Nk = 0)."""
    q, k, v, cq, ck = _packed([33, 0, 70], [40, 0, 64], h=2, hk=2, seed=3)
    cfg = KernelConfig(head_dim=32, kv_stages=2, q_in_regs=True, heavy_first=True)
    res = simulate(q, k, v, causal=True, config=cfg, cu_seqlens_q=cq, cu_seqlens_k=ck)
    _check_per_sequence(res, q, k, v, cq, ck, True, cfg)
    res = simulate(q, k, v, config=SEED32, window=(20, 3), cu_seqlens_q=cq, cu_seqlens_k=ck)
    _check_per_sequence(res, q, k, v, cq, ck, False, SEED32, window=(20, 3))


def test_packed_run_is_hazard_free():
    q, k, v, cq, ck = _packed()
    checker = HazardChecker()
    simulate(q, k, v, causal=True, config=SEED32, cu_seqlens_q=cq, cu_seqlens_k=ck, observers=[checker])
    rep = checker.report()
    assert rep.ok, format_hazards(rep)


# -- bad input: one line each, before any work --------------------------------------------------------
def _bad(**over):
    q, k, v, cq, ck = _packed()
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, config=SEED32)
    kw.update(over)
    return q, k, v, kw


@pytest.mark.parametrize("over, fragment", [
    (dict(cu_seqlens_q=np.array([0, 5, 75, 108], np.int64)), "cu_seqlens_q must be a 1-D int32 array"),
    (dict(cu_seqlens_q=np.array([0, 75, 5, 108], np.int32)), "it decreases at cu_seqlens_q[1] = 75 > cu_seqlens_q[2] = 5"),
    (dict(cu_seqlens_q=np.array([1, 5, 75, 108], np.int32)), "got cu_seqlens_q[0] = 1"),
    (dict(cu_seqlens_k=np.array([0, 9, 73, 100], np.int32)), "ending at 113 (the packed rows); got cu_seqlens_k[-1] = 100"),
    (dict(cu_seqlens_k=np.array([0, 9, 113], np.int32)), "both have batch + 1 offsets, got 4 and 3"),
    (dict(cu_seqlens_q=np.array([[0, 108]], np.int32)), "got shape (1, 2)"),
    (dict(cu_seqlens_k=np.array([0, 0, 73, 113], np.int32)), "sequence 0 has 5 queries but no key"),
    (dict(cu_seqlens_k=None), "needs both cu_seqlens_q and cu_seqlens_k"),
    (dict(engine="program"), "run it with engine='ptx'"),
    (dict(workers=2), "a packed batch (cu_seqlens) runs in this process"),
    (dict(observers=[HazardChecker()], cu_seqlens_q=np.array([0, 5, 75], np.int32)), "ending at 108"),
])
def test_bad_packed_input_is_one_line(over, fragment):
    q, k, v, kw = _bad(**over)
    with pytest.raises(ValueError) as exc:
        simulate(q, k, v, **kw)
    msg = str(exc.value)
    assert fragment in msg and "\n" not in msg, msg


def test_packed_inputs_need_rank_3():
    q, k, v, cq, ck = _packed()
    with pytest.raises(ValueError, match=r"q of a packed batch \(cu_seqlens\) must have rank 3 \[total_q, heads, "):
        simulate(q[None], k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)


# -- GPU: fa_hw.forward packed --------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", [KernelConfig(), KernelConfig(block_m=128, n_warps=8, kv_stages=2, pingpong=True)],
                         ids=["seed", "pingpong"])
def test_gpu_packed_bit_identical_to_the_engine_and_per_sequence(causal, config):
    import fa_hw
    from fa_hw import check

    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    lq, lk = [5, 150, 0, 97, 64], [9, 130, 7, 97, 200]
    q, k, v, cq, ck = _packed(lq, lk, h=4, hk=2, d=64, seed=7)
    out = fa_hw.forward(q, k, v, causal=causal, config=config, cu_seqlens_q=cq, cu_seqlens_k=ck)
    o, lse = check.to_numpy(out.o), check.to_numpy(out.lse)
    assert o.shape == q.shape and lse.shape == (4, q.shape[0])
    sim = simulate(q, k, v, causal=causal, config=config, cu_seqlens_q=cq, cu_seqlens_k=ck, mma_model="h200")
    assert np.array_equal(o.view(np.uint16), sim.o.view(np.uint16))
    assert np.array_equal(lse.view(np.uint32), sim.lse.view(np.uint32))
    for b in range(len(lq)):
        if not lq[b]:
            continue
        dense = fa_hw.forward(_seq(q, cq, b), _seq(k, ck, b), _seq(v, ck, b), causal=causal, config=config)
        assert np.array_equal(_seq(o, cq, b).view(np.uint16), check.to_numpy(dense.o).view(np.uint16)), b
        assert np.array_equal(lse[:, cq[b]:cq[b + 1]][None].view(np.uint32),
                              check.to_numpy(dense.lse).view(np.uint32)), b


# -- the command line: --npz with cu_seqlens_q / cu_seqlens_k ------------------------------------------------
def _npz(tmp_path, **over):
    q, k, v, cq, ck = _packed()
    arrays = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    arrays.update(over)
    path = tmp_path / "packed.npz"
    np.savez(path, **{n: a for n, a in arrays.items() if a is not None})
    return str(path)


def test_cli_sim_runs_a_packed_file(tmp_path, capsys):
    import json

    from fa_sim.cli import main

    status = main(["sim", "--npz", _npz(tmp_path), "--causal", "--check-hazards", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and out["engine"] == "ptx" and out["hazards"]["total"] == 0
    assert out["rel_err_o"] < 1e-3 and not out["above_bound"]
    q, k, v, cq, ck = _packed()
    res = simulate(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert out["instructions"]["HMMA"] == res.instructions[Op.HMMA]


@pytest.mark.parametrize("argv, over, fragment", [
    (["sim"], dict(cu_seqlens_k=None), "lacks array cu_seqlens_k"),
    (["sim"], dict(cu_seqlens_q=np.array([0, 5, 75, 100], np.int32)), "got cu_seqlens_q[-1] = 100"),
    (["sim"], dict(q=np.zeros((1, 108, 2, 32), np.float16)), "q of a packed batch (cu_seqlens) must have rank 3"),
    (["sim", "--engine", "program"], {}, "--engine program does not run a packed batch"),
    (["trace", "--engine", "program"], {}, "--engine program does not run a packed batch"),
    (["banks", "--seqlen", "9"], {}, "--seqlen does not apply with --npz"),
    (["compare", "--config", "auto"], {}, "--config auto does not apply to a packed batch in fa compare"),
])
def test_cli_refuses_bad_packed_files_in_one_line(tmp_path, capsys, argv, over, fragment):
    from fa_sim.cli import main

    status = main([*argv, "--npz", _npz(tmp_path, **over)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and fragment in err and len(err.splitlines()) == 1, err


def test_cli_sim_seqlens_makes_a_random_packed_batch(capsys):
    import json

    from fa_sim.cli import main
    from fa_sim.reference import random_inputs

    argv = ["sim", "--seqlens", "5,70,0,33", "--heads", "2", "--heads-k", "1", "--head-dim", "32", "--causal"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "ptx" and out["rel_err_o"] < 1e-3 and not out["above_bound"]
    q, k, v = (np.ascontiguousarray(x[0].transpose(1, 0, 2)) for x in random_inputs(1, 2, 108, 108, 32, 0, heads_k=1))
    cu = cu_seqlens_of([5, 70, 0, 33])
    res = simulate(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert out["instructions"]["HMMA"] == res.instructions[Op.HMMA]
    for bad, fragment in ((["--seqlens", "0,0"], "--seqlens takes comma-separated sequence lengths"),
                          (["--seqlens", "5,7", "--seqlen", "9"], "--seqlen does not apply with --seqlens"),
                          (["--seqlens", "5,7", "--backward"], "--seqlens does not apply with --backward")):
        assert main(["sim", *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and len(err.splitlines()) == 1, err
