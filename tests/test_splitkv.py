"""Issue 38 item 6: split-KV decoding (fa_sim.splitkv, fa_hw/kernels/fa2_fwd.cu FA_SPLITKV and
fa2_combine.cu; docs/features.md "Split-KV decoding").

CPU: the PTX engine runs both launches on decode shapes (batch 2, Nq 1 and 5, a cache of 300 keys
with tails, sequences of 300 and 170 keys, 1 and 3 splits, the 170-key sequence's last split empty)
within the documented bounds against float64 (fa_sim.accuracy, each sequence on its own keys); one
split is the unsplit kernel on each sequence's keys, bit for bit; GQA, softcap and bf16 combine with
splits, and so do head_dim 96 and 256; the split launch is hazard-free, with schedule options too
(pingpong: the same bits); "auto" follows FlashAttention-2's num_splits_heuristic; bad input is one
line each, before any launch; a packed batch (cu_seqlens) with splits is refused by simulate,
fa_hw.forward, fa sim and the kernel's #error (both use blockIdx.z).
GPU (marked gpu, skipped here): fa_hw.forward with splits bit-identical to the engine with
mma_model="h200".
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from fa_sim import KernelConfig, Problem, simulate
from fa_sim.observers.hazards import HazardChecker, format_hazards
from fa_sim.splitkv import check_splitkv, measure_splitkv, num_splits_heuristic
from fa_sim.validate import round_to_bf16
from splitkv_inputs import cache_inputs, out_bits

LENS = np.array([300, 170], np.int32)


@pytest.mark.parametrize("nq", [1, 5])
def test_decode_within_bounds_and_one_split_is_the_unsplit_kernel(nq):
    q, k, v = cache_inputs(2, 2, 2, nq, 300, seed=nq)
    one = simulate(q, k, v, splits=1, cache_seqlens=LENS)
    three = simulate(q, k, v, splits=3, cache_seqlens=LENS)
    assert (one.splits, three.splits) == (1, 3)
    plan = check_splitkv(Problem(2, 2, nq, 300, False, 0.125, KernelConfig()), 3, LENS)
    assert plan.split_rounds().tolist() == [[2, 2, 1], [2, 1, 0]]  # the short sequence's last split is empty
    for res in (one, three):
        acc = measure_splitkv(res, q, k, v, LENS)
        assert acc.ok, acc.failures()
    for b, n in enumerate(LENS):
        plain = simulate(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], engine="ptx")
        got = simulate(q[b:b + 1], k[b:b + 1], v[b:b + 1], splits=1, cache_seqlens=LENS[b:b + 1])
        for a, e in zip(out_bits(got), out_bits(plain)):
            assert np.array_equal(a, e)
        for a, e in zip(out_bits(one), out_bits(plain)):
            assert np.array_equal(a[b], e[0])
    assert not np.array_equal(out_bits(three)[0], out_bits(one)[0])  # the merge really ran (other roundings)


def test_gqa_softcap_and_bf16_with_splits():
    q, k, v = cache_inputs(2, 4, 2, 3, 200, seed=5)
    lens = np.array([200, 65], np.int32)
    res = simulate(q, k, v, splits=4, cache_seqlens=lens, softcap=8.0)
    acc = measure_splitkv(res, q, k, v, lens, softcap=8.0)
    assert acc.ok, acc.failures()
    qb, kb, vb = (round_to_bf16(x.astype(np.float32)) for x in (q, k, v))  # bf16 values, as float32
    res = simulate(qb, kb, vb, splits=2, cache_seqlens=lens, dtype="bf16")
    assert res.dtype == "bf16"
    acc = measure_splitkv(res, qb, kb, vb, lens)
    assert acc.ok, acc.failures()


def test_gqa_packed_gives_the_unpacked_bits_on_fewer_ctas():
    """pack_gqa (FlashAttention-2's seqlenq_ngroups_swapped): the 4 Q heads of a K/V head as 4 x 3 rows
    of one head, the same bits as the unpacked launch with the same splits (rows do not mix), on a
    quarter of the CTAs; None decides it (g > 1 and Nq < block_m), and "auto" sees the packed grid."""
    q, k, v = cache_inputs(2, 8, 2, 3, 200, seed=7)
    lens = np.array([200, 90], np.int32)
    packed = simulate(q, k, v, splits=2, cache_seqlens=lens, softcap=6.0, pack_gqa=True)
    plain = simulate(q, k, v, splits=2, cache_seqlens=lens, softcap=6.0, pack_gqa=False)
    assert packed.o.shape == plain.o.shape == q.shape and packed.lse.shape == q.shape[:3]
    for a, e in zip(out_bits(packed), out_bits(plain)):
        assert np.array_equal(a, e)
    acc = measure_splitkv(packed, q, k, v, lens, softcap=6.0)
    assert acc.ok, acc.failures()
    prob = Problem(2, 8, 3, 200, False, 0.125, KernelConfig(), heads_k=2)
    auto, off = check_splitkv(prob, 2, lens), check_splitkv(prob, 2, lens, pack_gqa=False)
    assert auto.unpacked == prob and auto.caller == prob and off.unpacked is None
    assert (auto.problem.heads, auto.problem.seqlen_q, auto.problem.kv_group) == (2, 12, 1)
    assert auto.grid == (1, 4, 2) and off.grid == (1, 16, 2)
    assert "GQA packed: 4 Q heads x 3 rows per K/V head" in auto.describe()
    wide = Problem(2, 8, 64, 200, False, 0.125, KernelConfig(), heads_k=2)  # Nq = block_m: not packed
    assert check_splitkv(wide, 2, lens).unpacked is None and check_splitkv(wide, 2, lens, pack_gqa=True).unpacked
    assert check_splitkv(Problem(2, 2, 3, 200, False, 0.125, KernelConfig()), 2, lens, pack_gqa=True).unpacked is None
    few, many = (check_splitkv(prob, "auto", lens, num_sms=8, pack_gqa=p) for p in (True, False))
    assert few.auto_from[0] == 4 and many.auto_from[0] == 16  # the heuristic counts the launch's own CTAs
    with pytest.raises(ValueError, match="pack_gqa must be None"):
        check_splitkv(prob, 2, lens, pack_gqa="yes")
    with pytest.raises(ValueError, match="pack_gqa applies to split-KV decoding"):
        simulate(q, k, v, pack_gqa=True)


@pytest.mark.parametrize("d", [96, 256])
def test_splits_at_wide_head_dims(d):
    """head_dim 96-256 (docs/head_dims.md): the split kernel and the combine at d = 96 and 256, within
    the bounds; one split is the unsplit kernel on the sequence's keys, bit for bit."""
    q, k, v = cache_inputs(1, 1, 1, 2, 300, d=d, seed=d)
    lens = np.array([170], np.int32)
    res = simulate(q, k, v, splits=3, cache_seqlens=lens)
    acc = measure_splitkv(res, q, k, v, lens)
    assert res.splits == 3 and acc.ok, acc.failures()
    plain = simulate(q, k[:, :, :170], v[:, :, :170], engine="ptx")
    for a, e in zip(out_bits(simulate(q, k, v, splits=1, cache_seqlens=lens)), out_bits(plain)):
        assert np.array_equal(a, e)


@pytest.mark.parametrize("tag", ["m64n64d64w4-swizzled", "m128n64d64w8-swizzled-s2-pp"])
def test_split_launch_is_hazard_free_with_schedule_options(tag):
    q, k, v = cache_inputs(1, 2, 2, 5, 300, seed=3)
    lens = np.array([230], np.int32)
    checker = HazardChecker()
    res = simulate(q, k, v, config=KernelConfig.from_tag(tag), splits=3, cache_seqlens=lens, observers=[checker])
    rep = checker.report()
    assert rep.ok, format_hazards(rep)
    seed = simulate(q, k, v, splits=3, cache_seqlens=lens)  # schedule options keep the arithmetic's order
    for a, e in zip(out_bits(res), out_bits(seed)):
        assert np.array_equal(a, e)


def test_auto_follows_flash_attention_2s_heuristic():
    assert num_splits_heuristic(212, 264, 64) == 1  # the CTAs fill 80% of the GPU: no split
    # 8 CTAs on 132 slots: efficiency 8 n / 132 grows with n; of 64 tiles, 9 splits (8 per split, as
    # 8 splits) and 12 (6, as 11) are not eligible; the best eligible up to 12 is 11 (0.667), and the
    # fewest within 85% of it is 10 (0.606; 9 would be 0.545 even if it were eligible)
    assert num_splits_heuristic(8, 132, 64, max_splits=12) == 10
    # up to 9: 9 is not eligible, so the best is 8 (0.485) and the fewest within 85% of it 7 (0.424); were 9
    # eligible (0.545), 7 would fall short and 8 would be chosen
    assert num_splits_heuristic(8, 132, 64, max_splits=9) == 7
    for ctas, slots, tiles in [(8, 264, 512), (32, 264, 32), (1, 132, 3), (40, 528, 1024)]:
        n = num_splits_heuristic(ctas, slots, tiles)
        assert 1 <= n <= min(slots, tiles)
        waves = ctas * n / slots
        best = max(ctas * m / slots / np.ceil(ctas * m / slots) for m in range(1, min(slots, tiles) + 1))
        assert waves / np.ceil(waves) >= 0.85 * best - 1e-12
    q, k, v = cache_inputs(1, 2, 2, 1, 700, seed=1)
    res = simulate(q, k, v, splits="auto", num_sms=4)  # 2 CTAs on 4 SMs x 4 CTAs each: 11 tiles
    prob = Problem(1, 2, 1, 700, False, 0.125, KernelConfig())
    assert res.splits == check_splitkv(prob, "auto", None, num_sms=4).splits > 1
    acc = measure_splitkv(res, q, k, v)
    assert acc.ok, acc.failures()


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(splits=0), "splits must be an integer from 1 to 5"),
    (dict(splits=6), "splits must be an integer from 1 to 5"),
    (dict(splits="many"), "or 'auto'"),
    (dict(splits=2.0), "splits must be an integer"),
    (dict(splits=2, cache_seqlens=np.array([300, 301], np.int32)), "cache_seqlens[1] = 301 is outside 1..300"),
    (dict(splits=2, cache_seqlens=np.array([300, 0], np.int32)), "cache_seqlens[1] = 0 is outside"),
    (dict(splits=2, cache_seqlens=np.array([300, 170])), "cache_seqlens must be int32"),
    (dict(splits=2, cache_seqlens=np.array([300], np.int32)), "must have shape (2,)"),
    (dict(splits=2, causal=True), "no causal mask or window"),
    (dict(splits=2, window=(10, 10)), "no causal mask or window"),
    (dict(splits=2, engine="program"), "without engine='program'"),
])
def test_bad_input_is_one_line_before_any_launch(kwargs, fragment, monkeypatch):
    import fa_sim.ptx

    monkeypatch.setattr(fa_sim.ptx, "launch", lambda *a, **kw: pytest.fail("launched"))
    q, k, v = cache_inputs(2, 2, 2, 1, 300)
    with pytest.raises(ValueError) as err:
        simulate(q, k, v, **kwargs)
    msg = str(err.value)
    assert fragment in msg and "\n" not in msg, msg


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    (2, 2, 2, 1, 300, (300, 170), 3, None, None),
    (2, 4, 2, 5, 1000, (1000, 77), "auto", None, None),  # GQA packed (pack_gqa None decides)
    (2, 4, 2, 5, 1000, (1000, 77), 4, None, False),
    (1, 4, 1, 16, 517, (517,), 5, KernelConfig(head_dim=128), None),
    (1, 2, 2, 3, 400, (250,), 3, KernelConfig(head_dim=96), None),
    (1, 2, 1, 1, 300, (300,), 2, KernelConfig(head_dim=256), True),
])
def test_gpu_bit_identical_to_the_engine(case):
    import fa_hw

    if not fa_hw.has_gpu():
        pytest.skip("no GPU")
    b, h, hk, nq, nk, lens, splits, config, pack = case
    d = 64 if config is None else config.head_dim
    q, k, v = cache_inputs(b, h, hk, nq, nk, d=d, seed=7)
    lens = np.array(lens, np.int32)
    hw = fa_hw.forward(q, k, v, config=config, splits=splits, cache_seqlens=lens, pack_gqa=pack)
    sim = simulate(q, k, v, config=config, splits=hw.splits, cache_seqlens=lens, mma_model="h200", pack_gqa=pack)
    assert np.array_equal(np.asarray(hw.o).view(np.uint16), sim.o.view(np.uint16))
    assert np.array_equal(np.asarray(hw.lse).view(np.uint32), sim.lse.view(np.uint32))


def test_cli_runs_splits_from_flags_and_npz(tmp_path, capsys):
    import json

    from fa_sim.cli import main

    assert main(["sim", "--batch", "2", "--heads", "2", "--seqlen", "5", "--seqlen-k", "300", "--splits", "3",
                 "--cache-seqlens", "300,170", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["splits"] == 3 and out["above_bound"] == [] and out["engine"] == "ptx"
    q, k, v = cache_inputs(2, 2, 2, 1, 200, seed=4)
    np.savez(tmp_path / "d.npz", q=q, k=k, v=v, cache_seqlens=np.array([200, 90], np.int32))
    assert main(["sim", "--npz", str(tmp_path / "d.npz"), "--splits", "auto", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["splits"] >= 1


@pytest.mark.parametrize("argv, fragment", [
    (["--splits", "0"], "--splits takes an integer >= 1 or 'auto'"),
    (["--splits", "6"], "splits must be an integer from 1 to 5"),
    (["--cache-seqlens", "300,301"], "cache_seqlens[1] = 301 is outside 1..300"),
    (["--cache-seqlens", "300"], "cache_seqlens must have shape (2,)"),
    (["--cache-seqlens", "300,x"], "--cache-seqlens takes one length per batch entry"),
    (["--splits", "2", "--causal"], "take no --causal or --window"),
    (["--splits", "2", "--engine", "program"], "without --backward, --engine program"),
])
def test_cli_refuses_in_one_line(argv, fragment, capsys):
    from fa_sim.cli import main

    assert main(["sim", "--batch", "2", "--heads", "2", "--seqlen", "1", "--seqlen-k", "300", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err, err


def test_bench_decode_report_states_the_goals():
    from experiment_scripts import load

    bench = load("bench_decode")
    spread = lambda m: {"median": m, "lo": m, "hi": m}  # noqa: E731
    row = {"batch": 1, "nk": 4096, "splits_auto": 16, "splits_tuned": 8, "config_tuned": "m64n128d128w4-swizzled",
           "notes": {"tuned": "decode/gpu.json (decode-d128-fp16-q1-k4096-bh8)"},
           "rel_err": {"tuned": 2e-4, "auto": 2e-4, "splits=1": 2e-4},
           "ms": {"tuned": spread(0.02), "auto": spread(0.025), "splits=1": spread(0.1), "sdpa-flash": spread(0.03)},
           "speedup_vs_one_split": spread(5.0), "speedup_vs_flash": spread(1.5), "speedup_vs_seed_auto": spread(1.25)}
    args = type("A", (), {"heads": 8, "heads_k": 8, "head_dim": 128, "runs": 3, "reps": 20})
    md = bench.markdown([row], "GPU", args)
    assert "| 1 | 4096 | m64n128d128w4-swizzled | 8 | 0.020 [0.020, 0.020] | 16, 0.025 [0.025, 0.025] |" in md
    assert "splits=1 on every row: met" in md and "Configs from: decode/gpu.json" in md
    row["speedup_vs_flash"] = spread(0.9)
    assert "SDPA-flash: NOT met" in bench.markdown([row], "GPU", args)


def test_fa_hw_refuses_bad_splits_before_any_device_call(monkeypatch):
    import fa_hw.splitkv

    monkeypatch.setattr(fa_hw.splitkv, "to_device", lambda *a, **kw: pytest.fail("placed on the device"))
    q, k, v = cache_inputs(2, 2, 2, 1, 300)
    for kwargs, fragment in ((dict(splits=9), "splits must be an integer from 1 to 5"),
                             (dict(splits=2, cache_seqlens=np.array([1, 2], np.int64)), "cache_seqlens must be int32"),
                             (dict(splits=2, checkpoint_ctas=[0, 8]), "checkpoint_ctas must be distinct integer "
                                                                       "CTA ids in 0..7, got [0, 8]"),
                             (dict(splits=2, kernel="x.cu"), "runs fa_hw's own kernel without kernel=")):
        with pytest.raises(ValueError, match=re.escape(fragment)):
            fa_hw.forward(q, k, v, **kwargs)


def test_packed_batch_with_splits_is_refused_in_one_line(monkeypatch, capsys):
    """FA_SPLITKV and FA_VARLEN both index blockIdx.z: simulate, fa_hw.forward and fa sim refuse
    cu_seqlens with splits before any launch or device call, and the kernel refuses the pair of macros."""
    import importlib
    from dataclasses import replace

    import fa_sim.ptx
    from fa_sim.cli import main
    from fa_sim.contract.nvrtc import NvrtcError, kernel_ptx
    from fa_sim.splitkv import split_build
    from fa_sim.varlen import cu_seqlens_of

    monkeypatch.setattr(fa_sim.ptx, "launch", lambda *a, **kw: pytest.fail("launched"))
    hw = importlib.import_module("fa_hw.forward")
    monkeypatch.setattr(hw, "prepare", lambda *a, **kw: pytest.fail("placed on the device"))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((75, 2, 64)).astype(np.float16) for _ in range(3))
    cu = cu_seqlens_of((5, 70))
    for run in (simulate, hw.forward):
        for extra in (dict(splits=2), dict(cache_seqlens=np.array([5, 70], np.int32))):
            with pytest.raises(ValueError) as err:
                run(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, **extra)
            msg = str(err.value)
            assert "takes a padded batch, not a packed one" in msg and "\n" not in msg, msg
    assert main(["sim", "--seqlens", "5,70", "--splits", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "take a padded batch, not a packed one" in err and "\n" not in err, err
    build = replace(split_build(Problem(2, 2, 1, 300, False, 0.125, KernelConfig()), "sm_80"), varlen=True)
    with pytest.raises(NvrtcError, match="FA_SPLITKV and FA_VARLEN both index blockIdx.z"):
        kernel_ptx(build, use_cache=False)
