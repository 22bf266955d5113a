"""`fa compare` on split-KV decoding (issue 38: every feature bit-identical in `fa compare` on shapes
with tails): fa2_fwd.cu's FA_SPLITKV debug build records each split CTA's checkpoints (round t the
split's t-th K/V block), and the comparison adds every split's partial O and LSE (the fp32
workspace o_accum, lse_accum) and the combine's O and LSE, bit for bit.

CPU: the PTX engine's run of the split checkpoint build (Nq 1-3, a cache of 200 keys holding 200
and 75 per sequence: tails in the last round of a split, and empty splits; splits 1-3; GQA packed
and not): each non-empty split CTA's checkpoints equal those of the hand-written program's dense
run of the same queries on the split's keys alone (an independent simulator; sO only with one
split), an empty split records nothing, and O, LSE and the workspace equal the normal build's.
`fa compare --splits` with the GPU stood in for by the engine passes, and fails on one spoiled
checkpoint word or workspace value. Refusals are one line. `--banks` / `--timing` with the GPU and
Nsight Compute stood in for: `fa banks --splits`' count of the split launch, `fa time --splits`' prediction.
GPU (marked gpu): `fa compare --splits ...` on a real GPU, every checkpoint, the workspace, O and
LSE bit-identical; with `--banks` (needs ncu) every class's counts equal Nsight Compute's for the
split launch.
"""

from __future__ import annotations

import numpy as np
import pytest

from fa_sim import KernelConfig
from fa_sim.checkpoints import CHECKPOINTS, ROUND0_ONLY, Checkpoint
from fa_sim.cli import main
from fa_sim.crosscheck import simulate_splitkv_with_checkpoints, simulate_with_checkpoints
from fa_sim.splitkv import check_splitkv, run_splitkv
from fa_sim.validate import check_input, make_problem

from cli_helpers import (banks_match_nsight_compute, cli_json as _json, ok_json, refused_line as _refused,
                         sim_side_is_fa_banks, stand_in_ncu)

D32 = KernelConfig(head_dim=32)  # block_m 64, block_n 64: a cache of 200 keys is 4 K/V tiles
LENS = np.array([200, 75], np.int32)  # 200 = 3 tiles + 8 keys, 75 = 1 tile + 11 keys


def _inputs(b, h, hk, nq, nk=200, d=32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, h, nq, d)).astype(np.float16),
            rng.standard_normal((b, hk, nk, d)).astype(np.float16),
            rng.standard_normal((b, hk, nk, d)).astype(np.float16))


@pytest.mark.parametrize("h, hk, nq, splits, pack", [
    (2, 1, 1, 3, True),    # MQA decoding, GQA packed: 2 rows per K/V head; split 2 empty everywhere
    (2, 1, 3, 2, False),   # GQA unpacked, Nq 3; sequence 1's split 1 empty
    (1, 1, 2, 1, None),    # one split: O and LSE stored by the split kernel (sO staged)
], ids=["mqa-packed-3", "gqa-2", "one-split"])
def test_split_checkpoints_are_the_dense_kernels_on_the_splits_keys(h, hk, nq, splits, pack):
    q, k, v = _inputs(2, h, hk, nq, seed=nq + splits)
    inputs = [check_input(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
    prob = make_problem(q.shape, k.shape, v.shape, False, None, D32)
    plan = check_splitkv(prob, splits, LENS, None, pack)
    ctas = list(range(plan.n_ctas))
    run, plan = simulate_splitkv_with_checkpoints(q, k, v, None, D32, ctas, splits, LENS, pack)
    normal, _ = run_splitkv(plan, inputs, (), "h200")
    assert np.array_equal(run.o.view(np.uint16), normal["o"].reshape(run.o.shape))
    assert np.array_equal(run.lse.view(np.uint32), normal["lse"].reshape(run.lse.shape).view(np.uint32))
    if splits > 1:
        assert np.array_equal(run.o_accum.view(np.uint32), normal["o_accum"].view(np.uint32))
        assert np.array_equal(run.lse_accum.view(np.uint32), normal["lse_accum"].view(np.uint32))
    g, bn, recorded, empty = h // hk, D32.block_n, 0, 0
    for slot, cta in enumerate(ctas):
        m_block, bh, split, first, n = plan.cta(cta)
        if n == 0:
            assert not run.checkpoints[slot].any(), f"empty split CTA {cta} recorded checkpoints"
            empty += 1
            continue
        b, head = divmod(bh, plan.problem.heads)
        if plan.unpacked is not None:  # the group's Q heads as rows of one head
            qs, kv_head = q[b, head * g:(head + 1) * g].reshape(1, 1, g * nq, -1), head
        else:
            qs, kv_head = q[b:b + 1, head:head + 1], head // g
        lo, hi = first * bn, min(int(LENS[b]), (first + n) * bn)
        ks, vs = (np.ascontiguousarray(x[b:b + 1, kv_head:kv_head + 1, lo:hi]) for x in (k, v))
        _, dense = simulate_with_checkpoints(np.ascontiguousarray(qs), ks, vs, False, None, D32, [m_block],
                                             engine="program")
        for i, ck in enumerate(CHECKPOINTS):
            if ck is Checkpoint.SO and splits > 1:  # stored from registers: no sO image
                assert not run.checkpoints[slot, i].any()
                continue
            rounds = 1 if ck in ROUND0_ONLY else n
            assert np.array_equal(run.checkpoints[slot, i, :rounds], dense[0, i, :rounds]), (cta, ck)
        recorded += 1
    assert recorded and (empty or splits == 1)


@pytest.fixture
def gpu_on_the_engine(monkeypatch):
    """fa_hw.forward replaced by the PTX engine's run of the same split debug build (what
    fa_hw.forward returns on a GPU, bit for bit: the GPU tests below); `spoil` alters one value."""
    import fa_hw
    from fa_hw import runtime

    state = {"calls": [], "spoil": None}

    class Out:
        pass

    def forward(q, k, v, *, causal, scale, config, checkpoint_ctas, window, softcap, splits, cache_seqlens,
                pack_gqa=None):
        state["calls"].append((np.shape(q), splits, list(checkpoint_ctas), pack_gqa))
        run, _ = simulate_splitkv_with_checkpoints(q, k, v, scale, config, checkpoint_ctas, splits, cache_seqlens,
                                                   pack_gqa, softcap)
        ck, oa = run.checkpoints.copy(), run.o_accum.copy()
        if state["spoil"] == "checkpoint":
            ck[0, 0, 0, 3, 0] ^= 1  # S_ACC of the first CTA, round 0, thread 3
        if state["spoil"] == "workspace":
            oa[0, 0, 0, 0] = np.nextafter(oa[0, 0, 0, 0], np.float32(np.inf))
        out = Out()
        out.o, out.lse, out.checkpoints, out.workspace = run.o, run.lse, ck, (oa, run.lse_accum)
        out.scale, out.splits = float(np.float32(scale if scale is not None else 1 / np.sqrt(q.shape[-1]))), splits
        return out

    monkeypatch.setattr(fa_hw, "forward", forward)
    monkeypatch.setattr(runtime, "check_launch", lambda *a, **k: None)
    return state


DECODE = ["--batch", "2", "--heads", "2", "--heads-k", "1", "--seqlen", "2", "--seqlen-k", "200", "--head-dim",
          "32", "--cache-seqlens", "200,75", "--splits", "3"]


def test_compare_split_kv(gpu_on_the_engine):
    status, report = _json(["compare", *DECODE, "--json"])
    (q_shape, splits, ctas, pack), = gpu_on_the_engine["calls"]
    assert status == 0 and report["ok"] and q_shape == (2, 2, 2, 32) and splits == 3
    # GQA packed (auto: g 2, Nq 2 < block_m): grid (1, B H_k = 2, 3); CTA 2 (sequence 0, split 1) is the
    # last that runs (split 2 and sequence 1's split 1 are empty)
    assert ctas == report["ctas"] == [0, 2]
    assert "splits=3" in report["features"] and "pack_gqa" in report["features"]
    assert "sO" not in report["checkpoints"]
    assert all(c["values"] > 0 and c["fraction_identical"] == 1.0 for c in report["checkpoints"].values())
    assert report["workspace"]["o_accum"]["fraction_identical"] == 1.0
    for spoil, what in (("checkpoint", "s_acc"), ("workspace", None)):
        gpu_on_the_engine["spoil"] = spoil
        status, report = _json(["compare", *DECODE, "--json"])
        assert status == 1 and not report["ok"]
        if what:
            assert not report["checkpoints"][what]["ok"]
        else:
            assert report["workspace"]["o_accum"]["max_ulps_f32"] == 1


def test_compare_one_split_compares_the_so_image(gpu_on_the_engine, capsys):
    argv = [*DECODE[:-1], "1", "--pack-gqa", "off", "--ctas", "0,3"]
    assert main(["compare", *argv]) == 0
    out = capsys.readouterr().out
    assert "splits=1" in out and "  sO " in out and "o_accum" not in out
    assert "every checkpoint, O and LSE bit-identical" in out


@pytest.mark.parametrize("extra, message", [
    (["--engine", "program"], "--engine program does not run split-KV decoding"),
    (["--config", "auto"], "run fa_hw's own kernel: without --config auto or --kernel"),
    (["--causal"], "take no --causal or --window"),
    (["--ctas", "99"], "--ctas must be distinct CTA ids in 0.."),
    (["--seqlens", "5,70"], "take a padded batch, not a packed one"),
])
def test_split_refusals_are_one_line(gpu_on_the_engine, tmp_path, capsys, extra, message):
    extra = [str(tmp_path / e) if e.endswith(".npz") else e for e in extra]
    argv = ["compare", "--seqlen", "1", "--seqlen-k", "130", "--head-dim", "32", "--splits", "3", *extra]
    if "--seqlens" in extra:
        argv = ["compare", "--head-dim", "32", "--splits", "2", *extra]
    err = _refused(argv, capsys)
    assert message in err, err
    assert not gpu_on_the_engine["calls"]


# -- --banks / --timing --------------------------------------------------------------------------------------
def test_compare_banks_of_split_kv_is_fa_banks_count_of_the_split_launch(gpu_on_the_engine, monkeypatch, capsys):
    """--banks on split-KV decoding: the simulator's side is `fa banks --splits`' count of the split
    launch, Nsight Compute is asked for the same launch (the splits and cache lengths reach the
    profiled process, whose ncu selects fa2_fwd_kernel by name: tests/test_profile.py), and the
    output says the combine uses no shared memory; the GPU and ncu are stood in for."""
    profiled = stand_in_ncu(monkeypatch)
    status, out = _json(["compare", *DECODE, "--banks", "--json"])
    assert status == 0 and out["ok"]
    (launch,) = profiled
    assert launch["splits"] == 3 and list(launch["cache_seqlens"]) == [200, 75] and "pack_gqa" not in launch
    assert out["banks"]["launch"] == ("split-KV decoding, 3 splits: the split launch (FA_SPLITKV) profiled; "
                                      "fa2_combine_kernel, launched after it, uses no shared memory (not profiled)")
    sim_side_is_fa_banks(out["banks"], DECODE)
    assert out["banks"]["classes"]["LDSM"]["sim"]["instructions"] > 0
    assert main(["compare", *DECODE[:-1], "1", "--pack-gqa", "off", "--banks"]) == 0  # one split: no combine
    text = capsys.readouterr().out
    assert "  split-KV decoding, 1 split: the split launch (FA_SPLITKV) profiled (one split: no combine launch)" in text
    assert profiled[-1]["splits"] == 1 and profiled[-1]["pack_gqa"] is False


def test_compare_timing_of_split_kv_is_fa_times_prediction(gpu_on_the_engine, monkeypatch, capsys):
    """--timing on split-KV decoding: the model's side is `fa time --splits`' prediction (both launches
    summed), beside the measured time of both launches (stood in for: 0.02 ms); the stall reasons and
    instructions are the split launch's (the one Nsight Compute profiles)."""
    profiled = stand_in_ncu(monkeypatch, measured_ms=0.02)
    status, out = _json(["compare", *DECODE, "--timing", "--json"])
    assert status == 0 and out["ok"] and profiled[0]["splits"] == 3
    want = ok_json(["time", *DECODE, "--json"])
    got = out["timing"]
    assert got["predicted"]["kernel_ms"] == want["kernel_ms"] and got["predicted"]["feature"] == "split-KV"
    assert set(got["predicted"]["kernels"]) == {"fa2_fwd_kernel", "fa2_combine_kernel"}
    assert got["launch"].startswith("split-KV decoding, 3 splits: time of the split and combine launches together")
    assert main(["compare", *DECODE, "--timing"]) == 0
    text = capsys.readouterr().out
    split_instr = want["kernels"]["fa2_fwd_kernel"]["instructions"]
    assert f"warp instructions executed: ncu -, model {split_instr:,}" in text


# -- GPU ---------------------------------------------------------------------------------------------------
GPU_CASES = [
    ["--batch", "2", "--heads", "4", "--seqlen", "1", "--seqlen-k", "300", "--cache-seqlens", "300,170",
     "--head-dim", "64", "--splits", "3"],
    ["--batch", "2", "--heads", "4", "--heads-k", "1", "--seqlen", "3", "--seqlen-k", "300", "--cache-seqlens",
     "300,70", "--head-dim", "64", "--splits", "2", "--pack-gqa", "on"],
    ["--batch", "2", "--heads", "4", "--heads-k", "2", "--seqlen", "2", "--seqlen-k", "300", "--cache-seqlens",
     "255,33", "--head-dim", "128", "--splits", "3", "--pack-gqa", "off", "--softcap", "5", "--dtype", "bf16"],
    ["--batch", "1", "--heads", "2", "--seqlen", "1", "--seqlen-k", "200", "--cache-seqlens", "199",
     "--head-dim", "64", "--splits", "1"],
]


@pytest.mark.gpu
@pytest.mark.parametrize("options", GPU_CASES, ids=lambda o: " ".join(o))
def test_gpu_compare_split_kv(options):
    import fa_hw

    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    from fa_sim.splitkv import check_splitkv as plan_of  # every CTA: the empty splits among them

    b, h = int(options[1]), int(options[3])
    hk = int(options[options.index("--heads-k") + 1]) if "--heads-k" in options else h
    nq, nk = int(options[options.index("--seqlen") + 1]), int(options[options.index("--seqlen-k") + 1])
    d = int(options[options.index("--head-dim") + 1])
    lens = np.array([int(x) for x in options[options.index("--cache-seqlens") + 1].split(",")], np.int32)
    pack = {"on": True, "off": False}.get(options[options.index("--pack-gqa") + 1]) if "--pack-gqa" in options else None
    prob = make_problem((b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d), False, None, KernelConfig(head_dim=d))
    plan = plan_of(prob, int(options[options.index("--splits") + 1]), lens, None, pack)
    every = ",".join(map(str, range(plan.n_ctas)))
    status, report = _json(["compare", *options, "--ctas", every, "--json"])
    assert status == 0 and report["ok"], report
    assert all(c["fraction_identical"] == 1.0 for c in report["checkpoints"].values())
    assert report["o"]["fraction_identical"] == 1.0 and report["lse"]["fraction_identical"] == 1.0
    if plan.splits > 1:
        assert report["workspace"]["o_accum"]["fraction_identical"] == 1.0
        assert report["workspace"]["lse_accum"]["fraction_identical"] == 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("options", GPU_CASES, ids=lambda o: " ".join(o))
def test_gpu_compare_banks_of_split_kv_match_nsight_compute(options):
    """fa compare --banks on split-KV decoding: Nsight Compute profiles the split launch (fa2_fwd_kernel
    built with FA_SPLITKV, selected by name; the combine has no shared memory); every class's
    instructions (as the SASS issues them), wavefronts and conflicts equal the simulator's (`fa
    banks --splits`' count of the split launch)."""
    banks_match_nsight_compute(options, "split-KV decoding")


def test_mixed_zero_fill_groups_of_the_h100_mismatch_are_taken_apart():
    """experiments/ldgsts_mixed_cases.py (the GPU step `ldgsts` of experiments/device_round45.sh): the
    H100 case whose LDGSTS count is 8 wavefronts above Nsight Compute's has 16 mixed copy / zero-fill
    instructions in four groups of four, and its cases split them two groups at a time."""
    from experiment_scripts import load

    cases = load("ldgsts_mixed_cases")
    groups = {name: cases.mixed_groups(cases.options(name)) for name in list(cases.CASES)[:3]}
    both, short, long_ = groups.values()
    assert both["wavefronts"] - both["ideal"] == 32 and sum(v for k, v in both.items() if k.startswith("round")) == 16
    assert set(short) - {"wavefronts", "ideal"} == {"round -1 K load", "round 0 V load"}
    assert set(long_) - {"wavefronts", "ideal"} == {"round 0 K load", "round 1 V load"}
