"""`fa compare` on a packed variable-length batch (issue 38: every feature bit-identical in `fa
compare` on shapes with tails): fa2_fwd.cu's FA_VARLEN debug build records each CTA's checkpoints
at its sequence's coordinates, the buffer indexed by the packed grid's linear CTA id.

CPU: the PTX engine's run of the packed checkpoint build (--seqlens 70,130,5, d 64: block_m 64,
so sequence 0's Q block 2 and sequence 2's Q blocks 1 and 2 exit at once; tails in every
sequence), causal and not, with GQA: each recorded CTA's checkpoints equal those of the hand-written
program's dense run of its sequence alone (an independent simulator), the exiting CTAs record
nothing, and O and LSE equal the normal packed build's. `fa compare --seqlens` with the GPU stood in
for by the engine passes, and fails on one spoiled word. Refusals are one line.
`fa compare --seqlens --banks` / `--timing` with the GPU and Nsight Compute stood in for: the
simulator's side is `fa banks --seqlens`' count, the model's `fa time --seqlens`' prediction.
GPU (marked gpu): `fa compare --seqlens ...` on a real GPU, every checkpoint, O and LSE bit-identical;
with `--banks` (needs ncu) every class's instructions, wavefronts and conflicts equal Nsight Compute's.
"""

from __future__ import annotations

import numpy as np
import pytest

from fa_sim import KernelConfig, simulate
from fa_sim.cli import main
from fa_sim.crosscheck import simulate_with_checkpoints
from fa_sim.varlen import cu_seqlens_of

from cli_helpers import (banks_match_nsight_compute, cli_json as _json, ok_json, refused_line as _refused,
                         sim_side_is_fa_banks, stand_in_ncu)
from packed_inputs import dense_sequence, packed_inputs

LENS = (70, 130, 5)
D64 = KernelConfig(head_dim=64)  # block_m 64, block_n 64: grid (3, H, 3), up to 3 rounds


def _packed(lq, lk, h, hk, d=64, seed=0):
    return packed_inputs(lq, lk, h, hk, d, seed)


_seq = dense_sequence


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_checkpoints_are_each_sequences_dense_checkpoints(causal):
    """Packed lengths (70, 130, 5) for q and (70, 130, 9) for k, H 2 over H_k 1 (GQA)."""
    lq, lk, h = LENS, (70, 130, 9), 2
    q, k, v, cq, ck = _packed(lq, lk, h, 1, seed=1 + causal)
    n_m = 3
    # CTA id x + n_m (head + H b): seq 0 head 1 Q block 1 (tail), seq 0 Q block 2 (exits), seq 1 head 0
    # Q blocks 0 and 2 (tail), seq 2 head 1 Q block 0 (5 rows) and its Q block 1 (exits)
    ctas = [1 + n_m * 1, 2, 0 + n_m * 2, 2 + n_m * 2, 0 + n_m * 5, 1 + n_m * 5]
    res, buf = simulate_with_checkpoints(q, k, v, causal, None, D64, ctas, cu_seqlens_q=cq, cu_seqlens_k=ck)
    plain = simulate(q, k, v, causal=causal, config=D64, cu_seqlens_q=cq, cu_seqlens_k=ck, mma_model="h200")
    assert np.array_equal(res.o.view(np.uint16), plain.o.view(np.uint16))
    assert np.array_equal(res.lse.view(np.uint32), plain.lse.view(np.uint32))
    assert buf.shape[2] == 3  # rounds of the longest sequence's keys
    for slot, cta in enumerate(ctas):
        m_block, rest = cta % n_m, cta // n_m
        head, b = rest % h, rest // h
        if m_block * D64.block_m >= lq[b]:
            assert not buf[slot].any(), f"CTA {cta} exits at once but recorded checkpoints"
            continue
        qs, ks, vs = _seq(q, cq, b), _seq(k, ck, b), _seq(v, ck, b)
        dense_cta = m_block + (-(-lq[b] // D64.block_m)) * head
        _, dense = simulate_with_checkpoints(qs, ks, vs, causal, None, D64, [dense_cta], engine="program")
        n_rounds = dense.shape[2]
        assert np.array_equal(buf[slot, :, :n_rounds], dense[0]), f"CTA {cta} (sequence {b}) differs"
        assert not buf[slot, :, n_rounds:].any()


@pytest.fixture
def gpu_on_the_engine(monkeypatch):
    """fa_hw.forward replaced by the PTX engine's run of the same packed debug build (what
    fa_hw.forward returns on a GPU, bit for bit: the GPU test below); `spoil` flips one checkpoint word."""
    import fa_hw
    from fa_hw import runtime

    state = {"calls": [], "spoil": False}

    class Out:
        pass

    def forward(q, k, v, *, causal, scale, config, checkpoint_ctas, kernel, window, softcap, cu_seqlens_q,
                cu_seqlens_k, **kw):
        state["calls"].append((np.shape(q), list(cu_seqlens_q), list(checkpoint_ctas)))
        res, buf = simulate_with_checkpoints(q, k, v, causal, scale, config, checkpoint_ctas, engine="ptx",
                                             window=window, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                                             cu_seqlens_k=cu_seqlens_k)
        if state["spoil"]:
            buf[-1, 0, 0, 5, 1] ^= 1  # S_ACC of the last CTA, round 0, thread 5
        out = Out()
        out.o, out.lse, out.checkpoints, out.scale = res.o, res.lse, buf, res.scale
        return out

    monkeypatch.setattr(fa_hw, "forward", forward)
    monkeypatch.setattr(runtime, "check_launch", lambda *a, **k: None)
    return state


def test_compare_a_packed_batch(gpu_on_the_engine, capsys):
    argv = ["compare", "--seqlens", ",".join(map(str, LENS)), "--head-dim", "64", "--heads", "1", "--json"]
    status, report = _json(argv)
    (q_shape, cu, ctas), = gpu_on_the_engine["calls"]
    assert status == 0 and report["ok"] and q_shape == (205, 1, 64) and cu == [0, 70, 200, 205]
    # default: the first and the last CTA that run (CTA 8, sequence 2's Q block 2, exits at once)
    assert ctas == report["ctas"] == [0, 6]
    assert report["features"] == ["varlen(total_q=205, total_k=205)"]
    assert report["shape"] == [3, 1, 130, 130, 64]
    assert all(c["values"] > 0 and c["fraction_identical"] == 1.0 for c in report["checkpoints"].values())
    gpu_on_the_engine["spoil"] = True
    status, report = _json(argv)
    assert status == 1 and not report["checkpoints"]["s_acc"]["ok"]
    assert report["checkpoints"]["s_acc"]["first_mismatch"]["cta"] == 6


@pytest.mark.parametrize("extra, message", [
    (["--engine", "program"], "--engine program does not run a packed batch"),
    (["--config", "auto"], "--config auto does not apply to a packed batch in fa compare"),
    (["--seqlen", "40"], "--seqlen does not apply with --seqlens"),
    (["--gpu-npz", "x.npz"], "--seqlens does not apply with --gpu-npz"),
])
def test_packed_refusals_are_one_line(gpu_on_the_engine, tmp_path, capsys, extra, message):
    extra = [str(tmp_path / e) if e.endswith(".npz") else e for e in extra]
    assert message in _refused(["compare", "--seqlens", "5,70", "--head-dim", "32", *extra], capsys)
    assert not gpu_on_the_engine["calls"]


# -- --banks / --timing --------------------------------------------------------------------------------------
BANKS_SHAPE = ["--seqlens", "5,70", "--head-dim", "32", "--heads", "2", "--heads-k", "1", "--causal"]


def test_compare_banks_of_a_packed_batch_is_fa_banks_count(gpu_on_the_engine, monkeypatch, capsys):
    """--banks on a packed batch: the simulator's side is `fa banks --seqlens`' count of the FA_VARLEN
    launch, and Nsight Compute is asked for that launch (the offsets reach the profiled process);
    the GPU and ncu are stood in for (the GPU test below runs both)."""
    profiled = stand_in_ncu(monkeypatch)
    status, out = _json(["compare", *BANKS_SHAPE, "--banks", "--json"])
    assert status == 0 and out["ok"]
    (launch,) = profiled
    assert set(launch) == {"cu_seqlens_q", "cu_seqlens_k"}
    assert list(launch["cu_seqlens_q"]) == list(launch["cu_seqlens_k"]) == [0, 5, 75]
    assert out["banks"]["launch"] == "packed batch: the FA_VARLEN launch over the packed grid (sequences 5,70)"
    sim_side_is_fa_banks(out["banks"], BANKS_SHAPE)
    assert not any(cls["match"] for cls in out["banks"]["classes"].values())  # ncu stood in for by nothing
    assert out["banks"]["classes"]["LDSM"]["sim"]["instructions"] > 0
    assert main(["compare", *BANKS_SHAPE, "--banks"]) == 0
    text = capsys.readouterr().out
    assert "shared memory, simulator vs Nsight Compute (m64n64d32w4-swizzled)\n  packed batch: the FA_VARLEN" in text


def test_compare_timing_of_a_packed_batch_is_fa_times_prediction(gpu_on_the_engine, monkeypatch, capsys):
    """--timing on a packed batch: the model's side is `fa time --seqlens`' prediction of the same
    launch, beside the measured time (stood in for: 0.01 ms) and Nsight Compute's profile of it."""
    profiled = stand_in_ncu(monkeypatch, measured_ms=0.01)
    status, out = _json(["compare", *BANKS_SHAPE, "--timing", "--json"])
    assert status == 0 and out["ok"] and list(profiled[0]["cu_seqlens_q"]) == [0, 5, 75]
    want = ok_json(["time", *BANKS_SHAPE, "--json"])
    got = out["timing"]
    assert got["predicted"]["kernel_ms"] == want["kernel_ms"] and got["predicted"]["feature"] == "packed"
    assert got["measured_ms"] == 0.01 and got["error"] == want["kernel_ms"] / 0.01 - 1
    assert main(["compare", *BANKS_SHAPE, "--timing"]) == 0
    assert "kernel time, measured vs the timing model (m64n64d32w4-swizzled)\n  packed batch" in capsys.readouterr().out


def test_compare_timing_of_a_packed_batch_refuses_a_kernel_variant(gpu_on_the_engine, tmp_path, capsys):
    from fa_sim.contract import seed_source

    variant = tmp_path / "variant.cu"
    variant.write_text(seed_source().text)
    err = _refused(["compare", *BANKS_SHAPE, "--timing", "--kernel", str(variant)], capsys)
    assert "--timing of a packed batch times fa2_fwd.cu's own FA_VARLEN build" in err
    assert not gpu_on_the_engine["calls"]


# -- GPU ---------------------------------------------------------------------------------------------------
GPU_CASES = [
    ["--seqlens", "70,130,5", "--head-dim", "64", "--heads", "2"],
    ["--seqlens", "70,130,5", "--head-dim", "64", "--heads", "2", "--causal"],
    ["--seqlens", "70,130,5", "--head-dim", "64", "--heads", "4", "--heads-k", "2", "--causal", "--kv-stages", "2"],
    ["--seqlens", "33,0,200", "--head-dim", "128", "--heads", "2", "--heads-k", "1", "--window", "40,8",
     "--softcap", "5", "--dtype", "bf16"],
]


@pytest.mark.gpu
@pytest.mark.parametrize("options", GPU_CASES, ids=lambda o: " ".join(o[1:]))
def test_gpu_compare_a_packed_batch(options):
    import fa_hw

    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    from fa_sim.commands.common import packed_seqlens
    from fa_sim.problem import Problem

    lens = packed_seqlens(options[1])
    cu = tuple(int(x) for x in cu_seqlens_of(lens))
    d = int(options[options.index("--head-dim") + 1])
    h = int(options[options.index("--heads") + 1])
    cfg = KernelConfig(head_dim=d)
    if "--kv-stages" in options:
        cfg = KernelConfig(head_dim=d, kv_stages=2)
    prob = Problem(len(lens), h, max(lens), max(lens), "--causal" in options, 1.0, cfg, cu_seqlens=(cu, cu))
    every = ",".join(map(str, range(prob.n_ctas)))  # every CTA, the exiting ones among them
    status, report = _json(["compare", *options, "--ctas", every, "--json"])
    assert status == 0 and report["ok"], report
    assert all(c["fraction_identical"] == 1.0 for c in report["checkpoints"].values())
    assert report["o"]["fraction_identical"] == 1.0 and report["lse"]["fraction_identical"] == 1.0


BANKS_GPU_CASES = [
    ["--seqlens", "70,130,5", "--head-dim", "64", "--heads", "2"],
    ["--seqlens", "70,0,130,5", "--head-dim", "64", "--heads", "4", "--heads-k", "2", "--causal", "--window", "32,-1"],
    ["--seqlens", "33,200", "--head-dim", "128", "--heads", "2", "--softcap", "5", "--dtype", "bf16"],
]


@pytest.mark.gpu
@pytest.mark.parametrize("options", BANKS_GPU_CASES, ids=lambda o: " ".join(o[1:]))
def test_gpu_compare_banks_of_a_packed_batch_match_nsight_compute(options):
    """fa compare --banks on a packed batch: Nsight Compute profiles the FA_VARLEN launch over the
    packed grid; every class's instructions (as the SASS issues them), wavefronts and conflicts equal
    the simulator's (`fa banks --seqlens`' count of the same launch)."""
    banks_match_nsight_compute(options, "packed batch: the FA_VARLEN launch")
